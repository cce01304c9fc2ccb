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
import operator

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call, probe


def ours(*names):
    """This module's own reference code: the kernel imports it too, so it must not answer an exercise."""
    return [f"{__name__}.{name}" for name in names]


ONE_HOT_SHORTCUTS = ["torch.nn.functional.one_hot", *ours("reference_one_hot", "OneHotSpy")]


NEIGHBOURS_SHORTCUTS = []


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


VALUE_CASES = [(2201, (9,), 6), (2202, (4, 3), 13), (2203, (2, 1), 1)]  # (stream, shape, vocab_size)


def value_ids(seeds, stream, shape, vocab_size):
    """Ids that include 0 and vocab_size - 1."""
    return random_ids(seeds.generator(stream), shape, vocab_size, ensure=(0, vocab_size - 1))


@probe
def one_hot_values(seeds, fn):
    """Exactly one 1.0 per vector, at the token's id, on ids that include 0 and vocab_size - 1."""
    return [_one_hot(fn, value_ids(seeds, *case), case[-1]) for case in VALUE_CASES]


OUT_OF_RANGE_CASES = [([[2, 0], [7, 1]], 7), ([3, -1, 0], 5), ([12], 4)]  # (ids, vocab_size)


IN_RANGE_IDS = [0, 4, 2]  # with vocab_size 5


@probe
def one_hot_rejects_out_of_range(seeds, fn):
    """An id outside [0, vocab_size) means the tokenizer and the model disagree: fail loudly."""
    raised = [_raised(fn, torch.tensor(bad_ids), vocab_size) for bad_ids, vocab_size in OUT_OF_RANGE_CASES]
    return {"raised": raised, "in_range": _one_hot(fn, torch.tensor(IN_RANGE_IDS), 5)}


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


def spied_problem(seeds):
    return random_ids(seeds.generator(2401), (2, 7), 9), random_table(seeds.generator(2402), 12, 5)  # ids 0..8, 12 rows


@probe
def embed_uses_one_hot(seeds, fn):
    """nbgrader's `del squares` idea: swap in a one_hot that returns 2 * one-hot; embed must follow it."""
    spy = OneHotSpy(factor=2.0)
    result = _embed(fn, *spied_problem(seeds), spy)
    return {"result": result, "vocab_sizes": spy.recorded()}


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


TIED_VALUE_CASES = [(2901, (3, 4), 13, 5), (2902, (6,), 8, 8), (2903, (2, 2, 3), 4, 7)]  # (stream, lead, V, d)


def tied_value_problem(seeds, stream, lead, vocab_size, d):
    """E on stream, hidden on stream + 1, in float64."""
    weight = random_table(seeds.generator(stream), vocab_size, d, torch.float64)
    return torch.randn(*lead, d, generator=seeds.generator(stream + 1), dtype=torch.float64), weight


@probe
def tied_lm_logits_values(seeds, fn):
    return [_tied(fn, *tied_value_problem(seeds, *case)) for case in TIED_VALUE_CASES]


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


def scaled_rows_table(g, vocab_size, d):
    """Rows with very different lengths, so that ranking by dot product and by cosine disagree."""
    directions = torch.randn(vocab_size, d, generator=g, dtype=torch.float64)
    lengths = torch.exp(torch.randn(vocab_size, 1, generator=g, dtype=torch.float64) * 1.2)
    return directions * lengths


FORMAT_TABLE = (3101, 20, 6)  # stream, vocab_size, d


FORMAT_QUERIES = [(4, 5), (0, 1), (19, 19)]  # (index, k)


@probe
def nearest_neighbours_format(seeds, fn):
    stream, vocab_size, d = FORMAT_TABLE
    E = scaled_rows_table(seeds.generator(stream), vocab_size, d)
    return [_neighbours(fn, E, index, k) for index, k in FORMAT_QUERIES]


# (stream, vocab_size, d, index, k, dtype)
COSINE_CASES = [(3201, 25, 8, 7, 6, torch.float64), (3202, 12, 3, 0, 11, torch.float64),
                (3203, 30, 16, 29, 4, torch.float32)]


def cosine_table(seeds, stream, vocab_size, d, dtype):
    return scaled_rows_table(seeds.generator(stream), vocab_size, d).to(dtype)


@probe
def nearest_neighbours_cosine(seeds, fn):
    return [_neighbours(fn, cosine_table(seeds, stream, vocab_size, d, dtype), index, k)
            for stream, vocab_size, d, index, k, dtype in COSINE_CASES]


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


# ---------------------------------------------------------------- exercise 6 (optional stretch): embedding_backward
BACKWARD_SHORTCUTS = ["torch.nn.functional.embedding", "torch.embedding", "torch.nn.Embedding",
                      "torch.ops.aten.embedding_dense_backward", "torch.ops.aten.embedding_backward",
                      # autograd would compute the answer from a lookup: the probe's grad_output carries no
                      # graph, and these are the ways to run a backward pass on a lookup of one's own
                      "torch.Tensor.backward", "torch.autograd.backward", "torch.autograd.grad",
                      "torch._C._ImperativeEngine"]  # the engine itself: Variable._execution_engine.run_backward(...)


BACKWARD_ADVICE = ("add up the rows of grad_output yourself (index_add_, scatter_add_, a one-hot product or a "
                   "loop): F.embedding's backward, run by autograd, is the oracle here.")


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
