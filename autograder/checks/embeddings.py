"""Hidden checks for 02_embeddings. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded ids, tables and modules, call the
student's code, return what it produced) and a judge (in the grader: rebuild the same inputs, compute
the oracle, compare, name the misconception). Layered as the course's tests are: shape first, then
values on seeded random inputs against an independent oracle (`torch.nn.functional.one_hot`,
`torch.nn.functional.embedding`, `torch.nn.Embedding`, `torch.nn.functional.linear`,
`torch.nn.functional.cosine_similarity`), then behaviour (one_hot is really used, padding gets no
gradient, the output layer shares the embedding's parameter, ties are broken deterministically).
The seeds come from the grader's per-run token, so the hidden inputs change from run to run and are
never the visible tests' inputs.

The oracles are PyTorch built-ins on purpose: importing `transformers` costs about 2 s of CPU, which
this notebook's 15 s budget can't spare on a busy 2-core machine.
"""
import math
import operator

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call, expect_close, expect_shape, probe


def ours(*names):
    """This module's own reference code: the kernel imports it too, so it must not answer an exercise."""
    return [f"{__name__}.{name}" for name in names]


ONE_HOT_SHORTCUTS = ["torch.nn.functional.one_hot", *ours("reference_one_hot", "OneHotSpy")]
NEIGHBOURS_SHORTCUTS = ours("cosine_oracle", "ranked")


# ---------------------------------------------------------------- helpers
def reference_one_hot(ids, vocab_size):
    """Handed to the student's `embed` in place of their own one_hot (see common.call)."""
    return F.one_hot(ids, vocab_size).to(torch.get_default_dtype())


def random_ids(g, shape, vocab_size, ensure=()):
    """Seeded ids of `shape` in [0, vocab_size); the ids in `ensure` are written at the front."""
    ids = torch.randint(0, vocab_size, shape, generator=g)
    flat = ids.view(-1)
    for position, token in enumerate(ensure):
        flat[position] = token
    return ids


def random_table(g, vocab_size, d, dtype=torch.float32):
    return torch.randn(vocab_size, d, generator=g, dtype=dtype)


def _raised(fn, *args, **kwargs):
    """Probe side: call fn quietly and describe the exception it raised (None if it returned)."""
    def attempt():
        try:
            fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as error:  # the exception is the result under test
            return {"type": type(error).__name__, "is_value_error": isinstance(error, ValueError),
                    "message": str(error)[:300]}
        return None
    return call(attempt, name=getattr(fn, "__name__", "your function"))


# ---------------------------------------------------------------- exercise 1: one_hot
def _one_hot(fn, ids, vocab_size):
    before = ids.clone()
    result = call(fn, ids, vocab_size, name="one_hot", forbidden=ONE_HOT_SHORTCUTS,
                  forbidden_advice="build the one-hot vectors yourself (compare the ids with torch.arange, "
                                   "or scatter ones): torch.nn.functional.one_hot is the oracle here.")
    if not torch.equal(ids, before):
        raise AssertionError("one_hot changed the ids tensor in place; leave the caller's ids as they were.")
    if not torch.is_tensor(result):
        raise AssertionError(f"one_hot should return a torch tensor, but it returned {type(result).__name__}.")
    return result


SHAPE_VOCAB = 11
SHAPE_CASES = [(2101, (7,)), (2102, (3, 5)), (2103, (2, 3, 4))]  # (stream, shape of ids)


@probe
def one_hot_shape_and_dtype(seeds, fn):
    """Any shape of ids gets one more axis, the vocabulary, at the end; the values are float32."""
    return [_one_hot(fn, random_ids(seeds.generator(stream), shape, SHAPE_VOCAB), SHAPE_VOCAB)
            for stream, shape in SHAPE_CASES]


@one_hot_shape_and_dtype.judge
def judge_one_hot_shape_and_dtype(seeds, results):
    vocab_size = SHAPE_VOCAB
    for (_, shape), result in zip(SHAPE_CASES, results, strict=True):
        found = tuple(result.shape)
        if found in {(vocab_size, *shape), (*shape[:-1], vocab_size, shape[-1])} and found != (*shape, vocab_size):
            raise AssertionError(
                f"one_hot of ids {shape} has shape {found}: the vocabulary is on the wrong axis. It must be the "
                f"LAST axis, {(*shape, vocab_size)}, so that one_hot(ids, V) @ E (E is (V, d)) gives (..., d).")
        expect_shape(result, (*shape, vocab_size), f"one_hot of ids {shape}",
                     "The result has the shape of ids plus one last axis of length vocab_size.")
        if result.dtype != torch.float32:
            raise AssertionError(
                f"one_hot returned dtype {result.dtype}; it must be torch.float32. Integer or bool one-hot "
                "vectors can't be multiplied with a float embedding matrix (F.one_hot returns int64: "
                "convert with .float()).")


VALUE_CASES = [(2201, (9,), 6), (2202, (4, 3), 13), (2203, (2, 1), 1)]  # (stream, shape, vocab_size)


def value_ids(seeds, stream, shape, vocab_size):
    """Ids that include 0 and vocab_size - 1."""
    return random_ids(seeds.generator(stream), shape, vocab_size, ensure=(0, vocab_size - 1))


@probe
def one_hot_values(seeds, fn):
    """Exactly one 1.0 per vector, at the token's id, on ids that include 0 and vocab_size - 1."""
    return [_one_hot(fn, value_ids(seeds, *case), case[-1]) for case in VALUE_CASES]


@one_hot_values.judge
def judge_one_hot_values(seeds, results):
    for (stream, shape, vocab_size), result in zip(VALUE_CASES, results, strict=True):
        expected = F.one_hot(value_ids(seeds, stream, shape, vocab_size), vocab_size).double()
        expect_close(result, expected, f"one_hot(ids of shape {shape}, {vocab_size})",
                     "Each vector is all zeros except a 1.0 at position ids[...] (the first token is id 0).",
                     diagnoses={
                         "your ones are one position too far right: ids count from 0, so token 0 sets "
                         "position 0.": F.pad(expected, (1, 0))[..., :-1],
                         "your ones are one position too far left: ids count from 0, so token i sets "
                         "position i.": F.pad(expected, (0, 1))[..., 1:],
                     })


OUT_OF_RANGE_CASES = [([[2, 0], [7, 1]], 7), ([3, -1, 0], 5), ([12], 4)]  # (ids, vocab_size)
IN_RANGE_IDS = [0, 4, 2]  # with vocab_size 5


@probe
def one_hot_rejects_out_of_range(seeds, fn):
    """An id outside [0, vocab_size) means the tokenizer and the model disagree: fail loudly."""
    raised = [_raised(fn, torch.tensor(bad_ids), vocab_size) for bad_ids, vocab_size in OUT_OF_RANGE_CASES]
    return {"raised": raised, "in_range": _one_hot(fn, torch.tensor(IN_RANGE_IDS), 5)}


@one_hot_rejects_out_of_range.judge
def judge_one_hot_rejects_out_of_range(seeds, data):
    for (bad_ids, vocab_size), error in zip(OUT_OF_RANGE_CASES, data["raised"], strict=True):
        if error is None:
            raise AssertionError(
                f"one_hot({bad_ids}, vocab_size={vocab_size}) returned a result. An id outside "
                f"0..{vocab_size - 1} must raise ValueError: a silent all-zero (or wrapped-around) row would "
                "hide a tokenizer/model mismatch.")
        if not error["is_value_error"]:
            raise AssertionError(
                f"one_hot({bad_ids}, vocab_size={vocab_size}) raised {error['type']}: {error['message']}. "
                "Check the range yourself and raise ValueError with a message naming the bad id.")
    good = torch.tensor(IN_RANGE_IDS)
    expect_close(data["in_range"], F.one_hot(good, 5).double(), f"one_hot({IN_RANGE_IDS}, 5)",
                 "Ids from 0 to vocab_size - 1 are all valid; only ids outside that range raise.")


# ---------------------------------------------------------------- exercise 2: embed
class OneHotSpy:
    """A reference one_hot that records its calls and multiplies its output by `factor`."""

    def __init__(self, factor=1.0):
        self.factor = factor
        self.vocab_sizes = []

    def __call__(self, ids, vocab_size):
        self.vocab_sizes.append(vocab_size)
        return reference_one_hot(ids, vocab_size) * self.factor

    def recorded(self):
        """The vocab sizes it was called with, as data (an int, or what the student passed instead)."""
        def plain(size):
            try:
                return operator.index(size)
            except TypeError:
                return repr(size)
        return [plain(size) for size in self.vocab_sizes]


def _embed(fn, ids, E, spy=None):
    spy = spy or OneHotSpy()
    try:
        result = call(fn, ids, E, name="embed", helpers={"one_hot": spy})
    except AssertionError as error:
        hints = []
        if spy.vocab_sizes and any(v != E.shape[0] for v in spy.vocab_sizes):
            hints.append(f"You called one_hot with vocab_size={spy.vocab_sizes[0]}, but E has "
                         f"{E.shape[0]} rows: the vocabulary size is E.shape[0], not ids.max() + 1.")
        if E.dtype != torch.float32:
            hints.append("one_hot returns float32 and E here is "
                         f"{E.dtype}: convert the one-hot vectors to E.dtype before the product.")
        raise AssertionError(" ".join([str(error)] + hints)) from None
    if not torch.is_tensor(result):
        raise AssertionError(f"embed should return a torch tensor, but it returned {type(result).__name__}.")
    return result


# (stream, shape of ids, vocab_size, d, dtype, highest id); the table is drawn on stream + 50.
# The first table has rows that no id uses: not every token occurs in every batch.
EMBED_CASES = [(2301, (3, 5), 13, 6, torch.float32, 9), (2302, (8,), 9, 4, torch.float32, 8),
               (2303, (2, 2, 3), 7, 5, torch.float32, 6), (2304, (4, 6), 10, 3, torch.float64, 9)]


def embed_problem(seeds, stream, shape, vocab_size, d, dtype, highest_id):
    ids = random_ids(seeds.generator(stream), shape, highest_id + 1, ensure=(1, 1))  # a repeated token
    return ids, random_table(seeds.generator(stream + 50), vocab_size, d, dtype)


@probe
def embed_values(seeds, fn):
    """Equal to E[ids], to torch.nn.Embedding and to F.embedding, for any shape of ids and E's dtype."""
    return [_embed(fn, *embed_problem(seeds, *case)) for case in EMBED_CASES]


@embed_values.judge
def judge_embed_values(seeds, results):
    for case, result in zip(EMBED_CASES, results, strict=True):
        ids, E = embed_problem(seeds, *case)
        shape, d = case[1], case[3]
        expect_shape(result, (*shape, d), f"embed(ids {shape}, E {tuple(E.shape)})",
                     "ids (...,) and E (V, d) give (..., d): one row of E per token.")
        if result.dtype != E.dtype:
            raise AssertionError(f"embed returned dtype {result.dtype} for an E of dtype {E.dtype}: the vectors "
                                 "are rows of E, so keep E's dtype (convert the one-hot to E.dtype, not E).")
        layer = nn.Embedding.from_pretrained(E)
        expect_close(result, layer(ids), f"embed(ids {shape}, E {tuple(E.shape)}) vs torch.nn.Embedding",
                     "Row t of the result is E[ids[t]].")
        expect_close(result, F.embedding(ids, E), "embed vs F.embedding")


def spied_problem(seeds):
    return random_ids(seeds.generator(2401), (2, 7), 9), random_table(seeds.generator(2402), 12, 5)  # ids 0..8, 12 rows


@probe
def embed_uses_one_hot(seeds, fn):
    """nbgrader's `del squares` idea: swap in a one_hot that returns 2 * one-hot; embed must follow it."""
    spy = OneHotSpy(factor=2.0)
    result = _embed(fn, *spied_problem(seeds), spy)
    return {"result": result, "vocab_sizes": spy.recorded()}


@embed_uses_one_hot.judge
def judge_embed_uses_one_hot(seeds, data):
    ids, E = spied_problem(seeds)
    vocab_sizes = data["vocab_sizes"]
    if not vocab_sizes:
        raise AssertionError("embed never called one_hot: compute the lookup as one_hot(ids, V) @ E. "
                             "(E[ids] gives the same numbers, but this exercise is about seeing the lookup "
                             "as a matrix product.)")
    if any(v != E.shape[0] for v in vocab_sizes):
        raise AssertionError(f"embed called one_hot with vocab_size={vocab_sizes[0]}, but E has "
                             f"{E.shape[0]} rows: the vocabulary size is E.shape[0].")
    expect_close(data["result"], 2.0 * E[ids], "embed with a one_hot that returns 2 × one-hot",
                 "embed called one_hot but its result doesn't come from that one-hot: return "
                 "one_hot(ids, V) @ E, not E[ids].",
                 diagnoses={"embed called one_hot but returned E[ids] anyway: the result must be the "
                            "product one_hot(ids, V) @ E.": E[ids]})


# ---------------------------------------------------------------- exercise 3: TokenEmbedding
def _build(cls, *args, **kwargs):
    module = call(cls, *args, name="TokenEmbedding", **kwargs)
    if not isinstance(module, nn.Module):
        raise AssertionError("TokenEmbedding must be a subclass of torch.nn.Module "
                             "(class TokenEmbedding(nn.Module), with super().__init__()).")
    table = getattr(module, "embedding", None)
    if not isinstance(table, nn.Embedding):
        raise AssertionError("TokenEmbedding keeps its table in self.embedding, an nn.Embedding(vocab_size, "
                             f"d_model, ...); found self.embedding = {type(table).__name__}.")
    return module


def _forward(module, ids):
    result = call(module, ids, name="TokenEmbedding.forward")
    if not torch.is_tensor(result):
        raise AssertionError(f"TokenEmbedding's forward should return a tensor, not {type(result).__name__}.")
    return result


SHAPES_MODULE = (17, 12)  # vocab_size, d_model
SHAPES_IDS = [(2501, (3, 5)), (2502, (6,)), (2503, (2, 1, 4))]  # (stream, shape of ids)


@probe
def token_embedding_shapes(seeds, cls):
    vocab_size, _ = SHAPES_MODULE
    module = _build(cls, *SHAPES_MODULE)
    return {"weight": module.embedding.weight.detach().clone(),
            "parameter_count": sum(p.numel() for p in module.parameters()),
            "outputs": [_forward(module, random_ids(seeds.generator(stream), shape, vocab_size))
                        for stream, shape in SHAPES_IDS]}


@token_embedding_shapes.judge
def judge_token_embedding_shapes(seeds, data):
    vocab_size, d_model = SHAPES_MODULE
    expect_shape(data["weight"], (vocab_size, d_model), "self.embedding.weight",
                 "The table has one row of width d_model per token: (vocab_size, d_model).")
    count = data["parameter_count"]
    if count != vocab_size * d_model:
        raise AssertionError(f"TokenEmbedding({vocab_size}, {d_model}) has {count} parameters; its only "
                             f"parameter is the table, vocab_size × d_model = {vocab_size * d_model}. "
                             "The √d_model factor is a constant, not a learned parameter.")
    for (_, shape), output in zip(SHAPES_IDS, data["outputs"], strict=True):
        expect_shape(output, (*shape, d_model), f"TokenEmbedding output for ids {shape}",
                     "ids (...,) become vectors (..., d_model); for a padded batch (B, T) -> (B, T, d_model).")


def _loaded(cls, table, **kwargs):
    """A student module whose table holds `table` (as loading pretrained weights would)."""
    module = _build(cls, table.shape[0], table.shape[1], **kwargs)
    with torch.no_grad():
        module.embedding.weight.copy_(table)
    return module


SCALING_CASES = [(2601, 11, 16, (2, 5)), (2602, 8, 9, (7,))]  # (stream, vocab_size, d_model, shape of ids)


def scaling_problem(seeds, stream, vocab_size, d_model, shape):
    """The table the check loads into the student's module (stream), and ids (stream + 1)."""
    return (random_table(seeds.generator(stream), vocab_size, d_model),
            random_ids(seeds.generator(stream + 1), shape, vocab_size))


@probe
def token_embedding_scaling(seeds, cls):
    """scale=True multiplies by √d_model (as fairseq, BART's `scale_embedding` and Gemma do); scale=False doesn't."""
    results = []
    for case in SCALING_CASES:
        table, ids = scaling_problem(seeds, *case)
        results.append((_forward(_loaded(cls, table, scale=True), ids),
                        _forward(_loaded(cls, table, scale=False), ids)))
    return results


@token_embedding_scaling.judge
def judge_token_embedding_scaling(seeds, results):
    for case, (scaled, unscaled) in zip(SCALING_CASES, results, strict=True):
        _, vocab_size, d_model, _ = case
        table, ids = scaling_problem(seeds, *case)
        lookup = nn.Embedding.from_pretrained(table)(ids)
        expect_close(scaled, lookup * math.sqrt(d_model), f"TokenEmbedding(scale=True) with d_model={d_model}",
                     "With scale=True, multiply the looked-up rows by √d_model in forward.",
                     diagnoses={
                         "with scale=True your vectors are the table rows unscaled: multiply them by "
                         "√d_model in forward (scaling the initial weights instead is undone as soon as "
                         "the weights are trained or loaded).": lookup,
                         "you scaled by d_model; the original Transformer scales by √d_model.": lookup * d_model,
                         "you divided by √d_model; the original Transformer multiplies by √d_model.":
                             lookup / math.sqrt(d_model),
                         "you scaled by √vocab_size; the factor is √d_model, the width of the vectors.":
                             lookup * math.sqrt(vocab_size),
                     })
        expect_close(unscaled, lookup, f"TokenEmbedding(scale=False) with d_model={d_model}",
                     "With scale=False (as in BERT and GPT-2) the vectors are the table rows, unchanged.",
                     diagnoses={"with scale=False the vectors must not be scaled (BERT doesn't scale), but "
                                "yours are multiplied by √d_model: apply the factor only when scale=True.":
                                lookup * math.sqrt(d_model)})


def _gradient(module, ids, upstream):
    module.zero_grad()
    output = _forward(module, ids)
    call(lambda: (output * upstream).sum().backward(), name="backward through TokenEmbedding")
    grad = module.embedding.weight.grad
    return torch.zeros_like(module.embedding.weight) if grad is None else grad


PADDING_MODULE = (10, 8, 3)  # vocab_size, d_model, padding id: not 0, the padding id is whatever the tokenizer says


def padding_problem(seeds):
    vocab_size, d_model, pad = PADDING_MODULE
    ids = random_ids(seeds.generator(2701), (3, 6), vocab_size, ensure=(pad, 5, pad, 0))
    return ids, torch.randn(3, 6, d_model, generator=seeds.generator(2702))


@probe
def token_embedding_padding(seeds, cls):
    """padding_idx behaves as in nn.Embedding: a zero row, zero vectors, and never a gradient."""
    vocab_size, d_model, pad = PADDING_MODULE
    ids, upstream = padding_problem(seeds)
    padded = []
    for scale in (True, False):
        module = _build(cls, vocab_size, d_model, padding_idx=pad, scale=scale)
        table = module.embedding.weight.detach().clone()  # as the student's module initialised it
        output = _forward(module, ids)
        padded.append({"table": table, "output": output, "grad": _gradient(module, ids, upstream)})
    module = _build(cls, vocab_size, d_model)
    unpadded = {"table": module.embedding.weight.detach().clone(), "grad": _gradient(module, ids, upstream)}
    return {"padded": padded, "unpadded": unpadded}


@token_embedding_padding.judge
def judge_token_embedding_padding(seeds, data):
    vocab_size, d_model, pad = PADDING_MODULE
    ids, upstream = padding_problem(seeds)
    # nn.Embedding's gradient: the sum of the upstream gradients at each token's positions, none for padding.
    oracle = nn.Embedding(vocab_size, d_model, padding_idx=pad)
    (oracle(ids) * upstream).sum().backward()
    expected = oracle.weight.grad
    for scale, result in zip((True, False), data["padded"], strict=True):
        if not torch.all(result["table"][pad] == 0):
            raise AssertionError(f"TokenEmbedding(..., padding_idx={pad}): row {pad} of the table is not zero. "
                                 "The padding row must start as zeros and stay there: pass padding_idx to "
                                 "nn.Embedding.")
        if result["output"][ids == pad].abs().max() > 0:
            raise AssertionError(f"the vectors at padding positions (id {pad}) are not zero.")
        grad = result["grad"]
        if grad[pad].abs().max() > 0:
            raise AssertionError(f"the padding row {pad} received a gradient, so one training step would "
                                 "make it non-zero. nn.Embedding(..., padding_idx=pad) never updates that row; "
                                 "zeroing it once at the start is not enough.")
        # Compare up to the constant factor, so that a wrong scale is graded by token_embedding_scaling only.
        factor = float((grad * expected).sum() / (expected * expected).sum())
        expect_close(grad, factor * expected, f"the gradient of the table (padding_idx={pad}, scale={scale})",
                     "Every row but the padding row gets the sum of the upstream gradients at the positions "
                     "of its token, as nn.Embedding's does.")
    # Without padding_idx, no row is special: token 0 is an ordinary token and is trained.
    if torch.any(data["unpadded"]["table"].abs().sum(dim=-1) == 0):
        raise AssertionError("with padding_idx=None a row of the table is zero: no token is padding unless "
                             "padding_idx says so (don't default it to 0).")
    if data["unpadded"]["grad"][0].abs().max() == 0:
        raise AssertionError("with padding_idx=None token 0 got no gradient: only the padding_idx row is frozen, "
                             "and here there is none.")


# ---------------------------------------------------------------- exercise 4: tied_lm_logits
TRANSPOSE_HINT = ("logits = hidden @ Eᵀ: E is (V, d), so use its transpose (E.T or E.mT) to go from "
                  "width d to V scores.")


def _tied(fn, hidden, weight):
    try:
        result = call(fn, hidden, weight, name="tied_lm_logits")
    except AssertionError as error:
        raise AssertionError(f"{error} {TRANSPOSE_HINT}") from None
    if not torch.is_tensor(result):
        raise AssertionError(f"tied_lm_logits should return a tensor, not {type(result).__name__}.")
    return result


TIED_SHAPE_TABLE = (2801, 11, 6)  # stream, vocab_size, d
TIED_SHAPE_HIDDEN = [(2802, (2, 5)), (2803, ()), (2804, (4,))]  # (stream, leading dimensions)


def tied_shape_problems(seeds):
    stream, vocab_size, d = TIED_SHAPE_TABLE
    weight = random_table(seeds.generator(stream), vocab_size, d)
    return [(torch.randn(*lead, d, generator=seeds.generator(s)), weight) for s, lead in TIED_SHAPE_HIDDEN]


@probe
def tied_lm_logits_shapes(seeds, fn):
    return [_tied(fn, hidden, weight) for hidden, weight in tied_shape_problems(seeds)]


@tied_lm_logits_shapes.judge
def judge_tied_lm_logits_shapes(seeds, results):
    _, vocab_size, d = TIED_SHAPE_TABLE
    for (_, lead), logits in zip(TIED_SHAPE_HIDDEN, results, strict=True):
        expect_shape(logits, (*lead, vocab_size), f"tied_lm_logits(hidden {(*lead, d)}, E {(vocab_size, d)})",
                     f"One score per vocabulary entry: (..., d) -> (..., V). {TRANSPOSE_HINT}")


TIED_VALUE_CASES = [(2901, (3, 4), 13, 5), (2902, (6,), 8, 8), (2903, (2, 2, 3), 4, 7)]  # (stream, lead, V, d)


def tied_value_problem(seeds, stream, lead, vocab_size, d):
    """E on stream, hidden on stream + 1, in float64."""
    weight = random_table(seeds.generator(stream), vocab_size, d, torch.float64)
    return torch.randn(*lead, d, generator=seeds.generator(stream + 1), dtype=torch.float64), weight


@probe
def tied_lm_logits_values(seeds, fn):
    return [_tied(fn, *tied_value_problem(seeds, *case)) for case in TIED_VALUE_CASES]


@tied_lm_logits_values.judge
def judge_tied_lm_logits_values(seeds, results):
    for case, result in zip(TIED_VALUE_CASES, results, strict=True):
        _, _, vocab_size, d = case
        hidden, weight = tied_value_problem(seeds, *case)
        logits = hidden @ weight.T
        diagnoses = {
            "your scores are probabilities (a softmax): return the logits; the softmax belongs to the "
            "loss or the sampler.": torch.softmax(logits, dim=-1),
            "your logits are scaled by 1/√d: tying shares E, it doesn't rescale the scores.":
                logits / math.sqrt(d),
            "your logits are scaled by √d: tying shares E, it doesn't rescale the scores.": logits * math.sqrt(d),
        }
        if vocab_size == d:  # square: hidden @ E runs, and is wrong
            diagnoses["you multiplied by E, not by its transpose: logit i is hidden · E[i], so use Eᵀ."] = \
                hidden @ weight
        expect_close(result, F.linear(hidden, weight), f"tied_lm_logits (V={vocab_size}, d={d})",
                     "Logit i is the dot product of the hidden vector with E[i]: hidden @ Eᵀ, with no bias.",
                     diagnoses=diagnoses)


def sharing_problem(seeds):
    """E (9, 4), hidden (2, 3, 4) and the upstream gradient of the logits (2, 3, 9)."""
    return (random_table(seeds.generator(3001), 9, 4), torch.randn(2, 3, 4, generator=seeds.generator(3002)),
            torch.randn(2, 3, 9, generator=seeds.generator(3003)))


@probe
def tied_lm_logits_shares_weights(seeds, fn):
    """Tying means one parameter: the output layer's gradient must flow into the embedding table."""
    weight, hidden, upstream = sharing_problem(seeds)
    weight.requires_grad_()
    logits = _tied(fn, hidden, weight)
    if logits.requires_grad:
        call(lambda: (logits * upstream).sum().backward(), name="backward through tied_lm_logits")
    return weight.grad  # None if no gradient reached the table


@tied_lm_logits_shares_weights.judge
def judge_tied_lm_logits_shares_weights(seeds, grad):
    _, hidden, upstream = sharing_problem(seeds)
    if grad is None:
        raise AssertionError("no gradient reached embedding_weight through tied_lm_logits: don't detach it, "
                             "copy it (.data, .clone().detach(), torch.tensor(...)) or build a new nn.Linear "
                             "from it. Tying means the same parameter, so the output layer's gradient trains "
                             "the embedding too.")
    expected = torch.einsum("...v,...d->vd", upstream, hidden)
    expect_close(grad, expected, "the gradient reaching the embedding table through the logits",
                 "The gradient of sum(upstream * hidden @ Eᵀ) with respect to E is upstreamᵀ @ hidden.")


# ---------------------------------------------------------------- exercise 5: nearest_neighbours
def _neighbours(fn, E, index, k):
    before = E.clone()
    result = call(fn, E, index, k, name="nearest_neighbours", forbidden=NEIGHBOURS_SHORTCUTS,
                  forbidden_advice="rank the tokens yourself: the hidden tests' reference code is the oracle, "
                                   "not the answer.")
    if not torch.equal(E, before):
        raise AssertionError("nearest_neighbours changed E in place (e.g. normalising it with /=): "
                             "compute into new tensors so the embedding table survives.")
    try:
        indices = torch.as_tensor(result)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError("nearest_neighbours should return a 1-D tensor of k token indices, "
                             f"but it returned {type(result).__name__}.") from None
    if indices.is_floating_point() or indices.dtype == torch.bool:
        raise AssertionError(f"nearest_neighbours returned {indices.dtype} values: return the token indices "
                             "(integers, e.g. the .indices of torch.sort), not the similarities.")
    if indices.dim() != 1:
        raise AssertionError(f"nearest_neighbours returned a tensor of shape {tuple(indices.shape)}: return a "
                             f"1-D tensor of k={k} indices.")
    return [int(i) for i in indices]


def cosine_oracle(E, index):
    return F.cosine_similarity(E[index].unsqueeze(0), E, dim=-1)


def ranked(similarity, index, k, descending=True):
    """Indices by similarity (ties: smaller index first), the query left out."""
    order = torch.sort(similarity.double(), descending=descending, stable=True).indices.tolist()
    return [i for i in order if i != index][:k]


def scaled_rows_table(g, vocab_size, d):
    """Rows with very different lengths, so that ranking by dot product and by cosine disagree."""
    directions = torch.randn(vocab_size, d, generator=g, dtype=torch.float64)
    lengths = torch.exp(torch.randn(vocab_size, 1, generator=g, dtype=torch.float64) * 1.2)
    return directions * lengths


def _expect_indices(found, expected, name, diagnoses=()):
    if found == expected:
        return
    for misconception, wrong in diagnoses:
        if found == wrong:
            raise AssertionError(f"{name} is wrong: {misconception}")
    raise AssertionError(f"{name} returned {found}, expected {expected}: the k other tokens with the largest "
                         "cosine similarity to E[index], most similar first (ties: smaller index first).")


FORMAT_TABLE = (3101, 20, 6)  # stream, vocab_size, d
FORMAT_QUERIES = [(4, 5), (0, 1), (19, 19)]  # (index, k)


@probe
def nearest_neighbours_format(seeds, fn):
    stream, vocab_size, d = FORMAT_TABLE
    E = scaled_rows_table(seeds.generator(stream), vocab_size, d)
    return [_neighbours(fn, E, index, k) for index, k in FORMAT_QUERIES]


@nearest_neighbours_format.judge
def judge_nearest_neighbours_format(seeds, results):
    vocab_size = FORMAT_TABLE[1]
    for (index, k), found in zip(FORMAT_QUERIES, results, strict=True):
        if index in found:
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) = {found} contains the query {index} "
                                 "itself; the query itself is excluded (it is always its own best match).")
        if len(found) != k:
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) returned {len(found)} indices, not k={k}.")
        if len(set(found)) != k or not all(0 <= i < vocab_size for i in found):
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) = {found}: expected k distinct row "
                                 f"indices of E, each between 0 and {vocab_size - 1}.")


# (stream, vocab_size, d, index, k, dtype)
COSINE_CASES = [(3201, 25, 8, 7, 6, torch.float64), (3202, 12, 3, 0, 11, torch.float64),
                (3203, 30, 16, 29, 4, torch.float32)]


def cosine_table(seeds, stream, vocab_size, d, dtype):
    return scaled_rows_table(seeds.generator(stream), vocab_size, d).to(dtype)


@probe
def nearest_neighbours_cosine(seeds, fn):
    return [_neighbours(fn, cosine_table(seeds, stream, vocab_size, d, dtype), index, k)
            for stream, vocab_size, d, index, k, dtype in COSINE_CASES]


@nearest_neighbours_cosine.judge
def judge_nearest_neighbours_cosine(seeds, results):
    for (stream, vocab_size, d, index, k, dtype), found in zip(COSINE_CASES, results, strict=True):
        E = cosine_table(seeds, stream, vocab_size, d, dtype)
        similarity = cosine_oracle(E, index)
        dot = E @ E[index]
        distance = -(E - E[index]).norm(dim=-1)
        _expect_indices(found, ranked(similarity, index, k), f"nearest_neighbours(E {tuple(E.shape)}, {index}, {k})",
                        diagnoses=[
                            ("it matches a ranking by dot product. The dot product prefers long vectors; "
                             "cosine similarity divides by both lengths, so only the direction counts.",
                             ranked(dot, index, k)),
                            ("it lists the least similar tokens: sort by cosine similarity in decreasing order "
                             "(most similar first).", ranked(similarity, index, k, descending=False)),
                            ("it matches a ranking by Euclidean distance, which depends on the lengths; "
                             "use cosine similarity.", ranked(distance, index, k)),
                            ("it includes the query itself: the query is excluded, whatever its similarity.",
                             ranked(similarity, -1, k)),
                        ])


# Exact ties only: identical rows, or rows that mirror each other around the query's direction.
TIE_TABLE = torch.tensor([[1.0, 0.0, 0.0, 0.0],    # 0  cos 1/√2 with row 5
                          [0.0, 0.0, 3.0, 0.0],    # 1  orthogonal to row 5
                          [1.0, 1.0, 0.0, 0.0],    # 2  an exact copy of row 5
                          [0.0, 1.0, 0.0, 0.0],    # 3  cos 1/√2 with row 5: ties with row 0
                          [0.0, 0.0, 0.0, -1.0],   # 4  orthogonal to row 5: ties with row 1
                          [1.0, 1.0, 0.0, 0.0],    # 5  the usual query
                          [-1.0, -1.0, 0.0, 0.0],  # 6  opposite to row 5 (cos -1)
                          [1.0, 1.0, 0.0, 0.0]])   # 7  another exact copy of row 5
TIE_CASES = [(5, 3, [2, 7, 0]), (5, 7, [2, 7, 0, 3, 1, 4, 6]), (7, 2, [2, 5]), (0, 4, [2, 5, 7, 1])]  # index, k, answer


def tie_problem(seeds):
    """The tie table with its rows in this run's order (stream 3301), and the queries (index, k) in it.
    Which of two tied rows comes first depends on the order, so the answers change from run to run."""
    order = torch.randperm(len(TIE_TABLE), generator=seeds.generator(3301))
    row_of = {int(old): new for new, old in enumerate(order)}  # old index -> index in this run's table
    return TIE_TABLE[order], [(row_of[index], k) for index, k, _ in TIE_CASES]


@probe
def nearest_neighbours_ties(seeds, fn):
    """Exact ties, including copies of the query: order by decreasing similarity, then by smaller index."""
    E, queries = tie_problem(seeds)
    return [_neighbours(fn, E, index, k) for index, k in queries]


@nearest_neighbours_ties.judge
def judge_nearest_neighbours_ties(seeds, results):
    for index, k, expected in TIE_CASES:  # the ties are exact in torch's own cosine similarity
        if ranked(cosine_oracle(TIE_TABLE, index), index, k) != expected:
            raise RuntimeError("the tie example no longer has the intended ties")
    E, queries = tie_problem(seeds)
    for (index, k), found in zip(queries, results, strict=True):
        expected = ranked(cosine_oracle(E, index), index, k)
        if found == expected:
            continue
        if index in found:
            raise AssertionError(
                f"nearest_neighbours(E, {index}, {k}) = {found} contains the query {index}. Another token can "
                "be exactly as similar as the query to itself (a duplicate vector), so dropping the first "
                "result is not enough: exclude the query by its index (e.g. set its similarity to -inf).")
        raise AssertionError(
            f"nearest_neighbours(E, {index}, {k}) = {found}, expected {expected}. This table has exact ties "
            "(copies of a row, and rows mirrored around the query); break them by the smaller index, e.g. with torch.sort(similarity, "
            "descending=True, stable=True). (torch.topk and a plain sort leave the order of ties unspecified.)")
