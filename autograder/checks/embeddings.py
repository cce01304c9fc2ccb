"""Hidden checks for 02_embeddings. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded ids, tables and modules, call the
student's code, return what it produced) and a judge (in the grader: rebuild the same inputs, compute
the oracle, compare, name the misconception). Layered as the course's tests are: shape first, then
values on seeded random inputs against an independent oracle (`torch.nn.functional.one_hot`,
`torch.nn.functional.embedding`, `torch.nn.Embedding`, `torch.nn.functional.linear`,
`torch.nn.functional.cosine_similarity`), then behaviour (one_hot is really used, padding gets no
gradient, the output layer shares the embedding's parameter, ties are broken deterministically). The
optional stretch, `embedding_backward`, is judged against autograd run through `F.embedding`.
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


# ---------------------------------------------------------------- exercise 6 (optional stretch): embedding_backward
BACKWARD_SHORTCUTS = ["torch.nn.functional.embedding", "torch.embedding", "torch.nn.Embedding",
                      "torch.ops.aten.embedding_dense_backward", "torch.ops.aten.embedding_backward",
                      # autograd would compute the answer from a lookup: the probe's grad_output carries no
                      # graph, and these are the ways to run a backward pass on a lookup of one's own
                      "torch.Tensor.backward", "torch.autograd.backward", "torch.autograd.grad",
                      "torch._C._ImperativeEngine",  # the engine itself: Variable._execution_engine.run_backward(...)
                      *ours("oracle_embedding_grad")]
BACKWARD_ADVICE = ("add up the rows of grad_output yourself (index_add_, scatter_add_, a one-hot product or a "
                   "loop): F.embedding's backward, run by autograd, is the oracle here.")


def oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx=None, scale_grad_by_freq=False):
    """The gradient that autograd computes through torch.nn.functional.embedding, for the table."""
    weight = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype, requires_grad=True)
    F.embedding(ids, weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq).backward(grad_output)
    return weight.grad


def _embedding_backward(fn, ids, grad_output, vocab_size, **options):
    """The student's gradient; grad_output is a plain tensor (no graph behind it, no requires_grad)."""
    result = call(fn, ids.clone(), grad_output.clone(), vocab_size, name="embedding_backward",
                  forbidden=BACKWARD_SHORTCUTS, forbidden_advice=BACKWARD_ADVICE, **options)
    if not torch.is_tensor(result):
        raise AssertionError(f"embedding_backward should return a tensor, but it returned {type(result).__name__}.")
    return result.detach()


def backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id, dtype=torch.float64, ensure=()):
    """ids (batch, length) in 0..highest_id (stream) with `ensure` = ((b, t, id), ...) written in, and
    grad_output (batch, length, d) (stream + 50)."""
    ids = torch.randint(0, highest_id + 1, (batch, length), generator=seeds.generator(stream))
    for b, t, token in ensure:
        ids[b, t] = token
    grad_output = torch.randn(batch, length, d, generator=seeds.generator(stream + 50), dtype=dtype)
    return ids, grad_output


def _backward_shape(result, ids, grad_output, vocab_size, name):
    batch, length, d = grad_output.shape
    found = tuple(result.shape)
    hint = {(batch * length, d): "that is one row per POSITION (B·T of them): add the rows of the same token "
                                 "together into one row per vocabulary entry.",
            (batch, length, d): "that is grad_output's shape: the gradient of the TABLE has one row per "
                                "vocabulary entry.",
            (d, vocab_size): "that is the transpose: the table is (vocab_size, d), and so is its gradient."}
    if found in hint and found != (vocab_size, d):
        raise AssertionError(f"{name} has shape {found}: {hint[found]}")
    expect_shape(result, (vocab_size, d), name, "The gradient of the table has the table's shape (vocab_size, d).")


def _last_write_wins(ids, grad_output, vocab_size, padding_idx=None, first=False):
    """What `grad[ids] = grad_output` leaves: one occurrence per token (the last, or the first)."""
    grad = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    rows = list(zip(ids.reshape(-1).tolist(), grad_output.reshape(-1, grad_output.shape[-1])))
    for token, row in (reversed(rows) if first else rows):
        grad[token] = row
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad


def _scaled_per_sequence(ids, grad_output, vocab_size, padding_idx=None):
    """scale_grad_by_freq with counts taken in each sequence, not over the batch."""
    total = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    for sequence_ids, sequence_grads in zip(ids, grad_output):
        total += oracle_embedding_grad(sequence_ids, sequence_grads, vocab_size, padding_idx, True)
    return total


# (stream, B, T, vocab_size, d, padding_idx, highest id): ids repeat (B·T positions, few ids); the padding id
# is written into the batch twice when there is one
BACKWARD_VALUE_CASES = [(3401, 3, 7, 11, 5, None, 8), (3402, 2, 9, 13, 4, 4, 12), (3403, 4, 5, 9, 3, 0, 5)]


def backward_value_problem(seeds, stream, batch, length, vocab_size, d, padding_idx, highest_id):
    ensure = () if padding_idx is None else ((0, 1, padding_idx), (batch - 1, length - 1, padding_idx))
    return backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id, ensure=ensure)


@probe
def stretch_embedding_backward_values(seeds, fn):
    """float64, repeated ids, with and without padding_idx: equal to autograd through F.embedding."""
    results = []
    for stream, batch, length, vocab_size, d, padding_idx, highest_id in BACKWARD_VALUE_CASES:
        ids, grad_output = backward_value_problem(seeds, stream, batch, length, vocab_size, d, padding_idx,
                                                  highest_id)
        options = {} if padding_idx is None else {"padding_idx": padding_idx}
        results.append(_embedding_backward(fn, ids, grad_output, vocab_size, **options))
    return results


@stretch_embedding_backward_values.judge
def judge_stretch_embedding_backward_values(seeds, results):
    for case, result in zip(BACKWARD_VALUE_CASES, results, strict=True):
        _, batch, length, vocab_size, d, padding_idx, _ = case
        ids, grad_output = backward_value_problem(seeds, *case)
        name = f"embedding_backward(ids {tuple(ids.shape)}, V={vocab_size}, padding_idx={padding_idx})"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        expected = oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx)
        diagnoses = {
            "a token that occurs several times keeps only one of its upstream gradients (grad[ids] = g: the "
            "last write wins). It must get the SUM of them: accumulate with index_add_ / scatter_add_.":
                _last_write_wins(ids, grad_output, vocab_size, padding_idx),
            "a token that occurs several times keeps only its first upstream gradient. It must get the SUM of "
            "them all.": _last_write_wins(ids, grad_output, vocab_size, padding_idx, first=True),
            "you divided by the token counts although scale_grad_by_freq=False: by default each token gets "
            "the plain SUM of its upstream gradients.":
                oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx, True),
        }
        if padding_idx is not None:
            diagnoses[f"the padding row {padding_idx} received a gradient: with padding_idx set, that row's "
                      "gradient is zero (nn.Embedding never trains it)."] = \
                oracle_embedding_grad(ids, grad_output, vocab_size)
        expect_close(result, expected, name, rtol=1e-9, atol=1e-12, diagnoses=diagnoses,
                     hint="Row i is the sum of grad_output over every position where token i occurs: Xᵀ G.")


# (stream, B, T, vocab_size, d, padding_idx, highest id): token 1 occurs twice in sequence 0 and once in
# sequence 1, so counting per sequence differs from counting over the batch; ids above highest id never occur
BACKWARD_SCALE_CASES = [(3501, 3, 6, 10, 4, None, 6), (3502, 4, 5, 12, 3, 2, 7)]
SCALE_ENSURE = ((0, 0, 1), (0, 1, 1), (1, 0, 1))
BACKWARD_DTYPE_CASE = (3503, 2, 4, 7, 3, None, 4)  # float32, and a (1, T) batch below


@probe
def stretch_embedding_backward_options(seeds, fn):
    """scale_grad_by_freq (counts over the whole batch), absent rows exactly zero, shape and dtype."""
    scaled = []
    for stream, batch, length, vocab_size, d, padding_idx, highest_id in BACKWARD_SCALE_CASES:
        ids, grad_output = backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id,
                                            ensure=SCALE_ENSURE)
        scaled.append(_embedding_backward(fn, ids, grad_output, vocab_size, padding_idx=padding_idx,
                                          scale_grad_by_freq=True))
    stream, batch, length, vocab_size, d, _, highest_id = BACKWARD_DTYPE_CASE
    ids, grad_output = backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id, torch.float32)
    single = backward_problem(seeds, stream + 1, 1, length, vocab_size, d, highest_id, torch.float32)
    return {"scaled": scaled, "float32": _embedding_backward(fn, ids, grad_output, vocab_size),
            "one_sequence": _embedding_backward(fn, *single, vocab_size)}


@stretch_embedding_backward_options.judge
def judge_stretch_embedding_backward_options(seeds, data):
    for case, result in zip(BACKWARD_SCALE_CASES, data["scaled"], strict=True):
        stream, batch, length, vocab_size, d, padding_idx, highest_id = case
        ids, grad_output = backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id,
                                            ensure=SCALE_ENSURE)
        name = f"embedding_backward(ids {tuple(ids.shape)}, V={vocab_size}, padding_idx={padding_idx}, " \
               "scale_grad_by_freq=True)"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        if not torch.isfinite(result).all():
            raise AssertionError(f"{name} contains inf or NaN: a token absent from the batch has a count of 0, "
                                 "so don't divide its row by 0. Its gradient is exactly zero.")
        if not torch.all(result[highest_id + 1:] == 0):
            raise AssertionError(f"{name}: the rows of tokens that never occur in the batch ({highest_id + 1} to "
                                 f"{vocab_size - 1}) must be exactly zero.")
        plain = oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx)
        diagnoses = {
            "you counted each token per sequence; scale_grad_by_freq divides by the number of times the token "
            "occurs in the WHOLE batch (all B·T positions).":
                _scaled_per_sequence(ids, grad_output, vocab_size, padding_idx),
            "scale_grad_by_freq=True must divide each token's summed gradient by the number of times that token "
            "occurs in the batch; yours is the plain sum.": plain,
            "you divided every row by the number of positions B·T (a mean); divide each token's row by the "
            "number of times THAT token occurs in the batch.": plain / ids.numel(),
            "you divided every row by the vocabulary size; divide each token's row by the number of times THAT "
            "token occurs in the batch.": plain / vocab_size,
        }
        if padding_idx is not None:
            diagnoses[f"the padding row {padding_idx} received a gradient: with padding_idx set, that row's "
                      "gradient is zero, with or without scale_grad_by_freq."] = \
                oracle_embedding_grad(ids, grad_output, vocab_size, None, True)
        expect_close(result, oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx, True), name,
                     rtol=1e-9, atol=1e-12, diagnoses=diagnoses,
                     hint="Each token's row is the sum of its upstream gradients divided by how often the token "
                          "occurs in the whole batch; the padding row stays zero.")
    stream, batch, length, vocab_size, d, _, highest_id = BACKWARD_DTYPE_CASE
    for key, (ids, grad_output) in (
            ("float32", backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id, torch.float32)),
            ("one_sequence", backward_problem(seeds, stream + 1, 1, length, vocab_size, d, highest_id,
                                              torch.float32))):
        result = data[key]
        name = f"embedding_backward(ids {tuple(ids.shape)}, float32 grad_output (B, T, {d}), V={vocab_size})"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        if result.dtype != torch.float32:
            raise AssertionError(f"{name} returned {result.dtype}: the gradient has grad_output's dtype "
                                 "(create the zeros with dtype=grad_output.dtype).")
        if not torch.all(result[highest_id + 1:] == 0):
            raise AssertionError(f"{name}: the rows of tokens that never occur in the batch must be exactly zero.")
        expect_close(result, oracle_embedding_grad(ids, grad_output, vocab_size), name,
                     "Row i is the sum of grad_output over every position where token i occurs.")
