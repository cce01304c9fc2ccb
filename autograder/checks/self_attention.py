"""Hidden checks for 04_self_attention. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded inputs, call the student's code, return
what it produced) and a judge (in the grader: rebuild the inputs, compute the oracle
`torch.nn.functional.scaled_dot_product_attention`, compare, name the misconception). Layered as
the course's tests are: shape first, then values on seeded random inputs, then behaviour.
The seeds come from the grader's per-run token, so they are never the visible tests' inputs.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autograder.checks.common import call, expect_close, expect_shape, expect_tensor, probe, to_numpy

ORACLE_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention",
                    "courselib.attention.scaled_dot_product_attention"]
SOFTMAX_SHORTCUTS = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                     "torch.special.softmax", "courselib.attention.masked_softmax"]


# ---------------------------------------------------------------- oracles (judge side)
def oracle_weights(q, k, mask=None, scale=None):
    """Attention weights from torch's own kernel: attending over the identity returns them."""
    identity = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    return F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=scale)


def oracle_attention(q, k, v, mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def reference_softmax(x, dim=-1):
    """Handed to the student's attention code in place of their own softmax (see common.call)."""
    return torch.softmax(x, dim=dim)


# ---------------------------------------------------------------- exercise 1: self_attention_by_hand
BY_HAND_SHAPES_CASE = (5, 6, 3, 2)  # n tokens, width of X, d_k, d_v: rectangular on purpose
BY_HAND_VALUE_CASES = [(4, 5, 3, 6), (7, 3, 8, 2), (1, 4, 4, 4)]


def random_projection_problem(g, n, d_in, d_k, d_v, scale=1.0):
    X = torch.randn(n, d_in, generator=g, dtype=torch.float64) * scale
    W_Q, W_K = (torch.randn(d_in, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    W_V = torch.randn(d_in, d_v, generator=g, dtype=torch.float64)
    return X, W_Q, W_K, W_V


def by_hand_diagnoses(Q, K, V, d_in):
    """Outputs a buggy self_attention_by_hand would give for S, keyed by the misconception."""
    logits = Q @ K.T
    return {
        "your weights match softmax(Q Kᵀ) with no scaling: divide the scores by √d_k.":
            torch.softmax(logits, dim=-1),
        "your weights are scaled by √(width of X), but the scale is √d_k, the width of Q and K.":
            torch.softmax(logits / math.sqrt(d_in), dim=-1),
        "your weights are scaled by d_k; the scale is √d_k.":
            torch.softmax(logits / K.shape[-1], dim=-1),
        "your softmax normalises columns (axis 0); each row (one query) must sum to 1.":
            torch.softmax(logits / math.sqrt(K.shape[-1]), dim=0),
        "you returned the scaled scores before the softmax; S must be the softmax of them.":
            logits / math.sqrt(K.shape[-1]),
    }


def _by_hand(fn, X, W_Q, W_K, W_V):
    result = call(fn, X.numpy(), W_Q.numpy(), W_K.numpy(), W_V.numpy(), name="self_attention_by_hand")
    if not isinstance(result, (tuple, list)) or len(result) != 5:
        raise AssertionError("self_attention_by_hand must return the tuple (Q, K, V, S, A), "
                             f"but it returned {type(result).__name__}"
                             + (f" of length {len(result)}" if hasattr(result, "__len__") else "") + ".")
    return tuple(result)


@probe
def self_attention_by_hand_shapes(seeds, fn):
    """Rectangular projections: n=5 tokens, width 6, d_k=3, d_v=2."""
    return _by_hand(fn, *random_projection_problem(seeds.generator(101), *BY_HAND_SHAPES_CASE))


@self_attention_by_hand_shapes.judge
def judge_self_attention_by_hand_shapes(seeds, QKVSA):
    n, _, d_k, d_v = BY_HAND_SHAPES_CASE
    expected = {"Q": (n, d_k), "K": (n, d_k), "V": (n, d_v), "S": (n, n), "A": (n, d_v)}
    for name, value in zip("QKVSA", QKVSA):
        expect_shape(to_numpy(value, name), expected[name], name,
                     "With X (5, 6), W_Q and W_K (6, 3) and W_V (6, 2): Q = X W_Q is (n, d_k), "
                     "S = softmax(Q Kᵀ/√d_k) is (n, n), A = S V is (n, d_v).")


@probe
def self_attention_by_hand_values(seeds, fn):
    """Random rectangular problems."""
    return [_by_hand(fn, *random_projection_problem(seeds.generator(202 + i), *case))
            for i, case in enumerate(BY_HAND_VALUE_CASES)]


@self_attention_by_hand_values.judge
def judge_self_attention_by_hand_values(seeds, results):
    for i, (case, (Q, K, V, S, A)) in enumerate(zip(BY_HAND_VALUE_CASES, results)):
        X, W_Q, W_K, W_V = random_projection_problem(seeds.generator(202 + i), *case)
        Q_ref, K_ref, V_ref = X @ W_Q, X @ W_K, X @ W_V
        expect_close(Q, Q_ref, "Q", "Q is X @ W_Q (each row of X times W_Q).")
        expect_close(K, K_ref, "K", "K is X @ W_K.")
        expect_close(V, V_ref, "V", "V is X @ W_V.")
        expect_close(S, oracle_weights(Q_ref, K_ref), "S (attention weights)",
                     diagnoses=by_hand_diagnoses(Q_ref, K_ref, V_ref, case[1]))
        expect_close(A, oracle_attention(Q_ref, K_ref, V_ref), "A (attention output)",
                     "A = S @ V: each output row is a weighted average of the rows of V.")


def _large_scores_problem(seeds):
    return random_projection_problem(seeds.generator(305), n=6, d_in=8, d_k=8, d_v=4, scale=30.0)


@probe
def self_attention_by_hand_is_stable(seeds, fn):
    """Scores in the thousands: a naive exp overflows to inf, and inf/inf is NaN."""
    return _by_hand(fn, *_large_scores_problem(seeds))


@self_attention_by_hand_is_stable.judge
def judge_self_attention_by_hand_is_stable(seeds, QKVSA):
    X, W_Q, W_K, W_V = _large_scores_problem(seeds)
    _, _, _, S, A = QKVSA
    if not np.all(np.isfinite(to_numpy(S, "S"))):
        raise AssertionError("S contains inf or NaN when the scores are large (hundreds or more): "
                             "np.exp overflows. Subtract each row's maximum before exponentiating; "
                             "softmax(x) = softmax(x - max(x)).")
    Q_ref, K_ref = X @ W_Q, X @ W_K
    expect_close(S, oracle_weights(Q_ref, K_ref), "S for large scores",
                 "Subtract each row's maximum before np.exp, and normalise each row.")
    expect_close(A, oracle_attention(Q_ref, K_ref, X @ W_V), "A for large scores")


# ---------------------------------------------------------------- exercise 2: softmax
def _softmax(fn, x, **kwargs):
    before = x.clone()
    result = call(fn, x, name="softmax", forbidden=SOFTMAX_SHORTCUTS,
                  forbidden_advice="build softmax yourself from torch.exp, a sum and a max: "
                                   "torch's softmax is the oracle here, not the answer.", **kwargs)
    if not torch.equal(x, before):
        raise AssertionError("softmax changed its input tensor in place (e.g. `x -= x.max()`); "
                             "compute into a new tensor so the caller's scores survive.")
    if not torch.is_tensor(result):
        raise AssertionError(f"softmax should return a torch tensor, but it returned {type(result).__name__}.")
    return result


def softmax_cases(seeds):
    g = seeds.generator(404)
    return [torch.randn(*shape, generator=g) * 3 for shape in [(6,), (3, 9), (2, 4, 5)]] + [
        torch.tensor([[0.0, float("-inf"), 1.0]])]


@probe
def softmax_matches_torch(seeds, fn):
    return [_softmax(fn, x) for x in softmax_cases(seeds)]


@softmax_matches_torch.judge
def judge_softmax_matches_torch(seeds, results):
    *random_cases, with_inf = softmax_cases(seeds)
    for x, result in zip(random_cases, results):
        expect_close(expect_tensor(result, "softmax"), torch.softmax(x, dim=-1),
                     f"softmax of a {tuple(x.shape)} tensor",
                     diagnoses={"you normalised by the sum of x, not of exp(x).": x / x.sum(-1, keepdim=True),
                                "you exponentiated but didn't divide by the sum.": torch.exp(x)})
    expect_close(results[-1], torch.softmax(with_inf, dim=-1), "softmax of a row containing -inf",
                 "A -inf score is a masked position: it must get weight exactly 0.")


def stable_cases(seeds):
    # float64, so that only the overflow of exp (past ~709) can fail, never rounding.
    g = seeds.generator(505)
    return [centre + torch.randn(4, 7, generator=g, dtype=torch.float64) * 5 for centre in (1e4, -1e4)]


@probe
def softmax_is_stable(seeds, fn):
    return [_softmax(fn, x) for x in stable_cases(seeds)]


@softmax_is_stable.judge
def judge_softmax_is_stable(seeds, results):
    for x, centre, result in zip(stable_cases(seeds), (1e4, -1e4), results):
        if not np.all(np.isfinite(to_numpy(result, "softmax"))):
            raise AssertionError(f"softmax returned inf or NaN for inputs around {centre:g}: exp overflows "
                                 "(or underflows to 0/0). Subtract the maximum along `dim` first; "
                                 "softmax(x) = softmax(x - max(x)).")
        expect_close(result, torch.softmax(x, dim=-1), f"softmax for inputs around {centre:g}", atol=1e-5)


DIMS = (0, 1, -2, 2)


@probe
def softmax_respects_dim(seeds, fn):
    x = torch.randn(2, 3, 4, generator=seeds.generator(606))
    return [_softmax(fn, x, dim=dim) for dim in DIMS]


@softmax_respects_dim.judge
def judge_softmax_respects_dim(seeds, results):
    x = torch.randn(2, 3, 4, generator=seeds.generator(606))
    for dim, result in zip(DIMS, results):
        expect_close(result, torch.softmax(x, dim=dim), f"softmax(x, dim={dim})",
                     diagnoses={"your softmax ignores `dim` and always normalises the last dimension.":
                                torch.softmax(x, dim=-1)},
                     hint="Take the max and the sum along `dim`, with keepdim=True so they broadcast.")


# ---------------------------------------------------------------- exercise 3: scaled_dot_product_attention
def _sdpa(fn, q, k, v, mask=None):
    kwargs = {} if mask is None else {"mask": mask}
    result = call(fn, q, k, v, name="scaled_dot_product_attention",
                  helpers={"softmax": reference_softmax}, forbidden=ORACLE_SHORTCUTS,
                  forbidden_advice="compute the scores, the softmax and the weighted sum yourself; "
                                   "torch's scaled_dot_product_attention is the oracle here.", **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("scaled_dot_product_attention must return the pair (output, weights).")
    return tuple(result)


def sdpa_problem(g, batch, t_q, t_k, d_k, d_v, scale=1.0, dtype=torch.float32):
    q = torch.randn(*batch, t_q, d_k, generator=g, dtype=dtype) * scale
    k = torch.randn(*batch, t_k, d_k, generator=g, dtype=dtype) * scale
    v = torch.randn(*batch, t_k, d_v, generator=g, dtype=dtype)
    return q, k, v


TRANSPOSE_HINT = ("For batched inputs transpose only the last two dimensions of k: "
                  "k.transpose(-2, -1) or k.mT. (k.T reverses every dimension.)")
SHAPE_BATCHES = [(), (3,), (2, 4)]


@probe
def sdpa_shapes(seeds, fn):
    return [_sdpa(fn, *sdpa_problem(seeds.generator(707 + i), batch, t_q=5, t_k=7, d_k=8, d_v=3))
            for i, batch in enumerate(SHAPE_BATCHES)]


@sdpa_shapes.judge
def judge_sdpa_shapes(seeds, results):
    for batch, (output, weights) in zip(SHAPE_BATCHES, results):
        expect_shape(output, (*batch, 5, 3), "output",
                     f"q {(*batch, 5, 8)}, k {(*batch, 7, 8)}, v {(*batch, 7, 3)} give an output "
                     f"(..., T_q, d_v). {TRANSPOSE_HINT}")
        expect_shape(weights, (*batch, 5, 7), "weights", f"weights are (..., T_q, T_k). {TRANSPOSE_HINT}")


def sdpa_diagnoses(q, k):
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1)
    return {
        "your weights match softmax(q kᵀ) without dividing by √d_k.": torch.softmax(scores, dim=-1),
        "your weights are scaled by d_k; the scale is √d_k.": torch.softmax(scores / d_k, dim=-1),
        "your softmax runs over the queries (dim -2); it must run over the keys (dim -1), so each "
        "query's weights sum to 1.": torch.softmax(scores / math.sqrt(d_k), dim=-2),
        "you returned the scores before the softmax as the weights.": scores / math.sqrt(d_k),
    }


VALUE_CASES = [((2, 3), 4, 6, 16, 5), ((), 3, 3, 4, 4)]


@probe
def sdpa_values_match_torch(seeds, fn):
    return [_sdpa(fn, *sdpa_problem(seeds.generator(808 + i), *case)) for i, case in enumerate(VALUE_CASES)]


@sdpa_values_match_torch.judge
def judge_sdpa_values_match_torch(seeds, results):
    for i, (case, (output, weights)) in enumerate(zip(VALUE_CASES, results)):
        q, k, v = sdpa_problem(seeds.generator(808 + i), *case)
        expect_close(weights, oracle_weights(q, k), "weights", diagnoses=sdpa_diagnoses(q, k))
        expect_close(output, oracle_attention(q, k, v), "output", "output = weights @ v.")


def _sharp_problem(seeds):
    return sdpa_problem(seeds.generator(909), (2,), t_q=6, t_k=6, d_k=32, d_v=4, scale=25.0, dtype=torch.float64)


@probe
def sdpa_weights_are_probabilities(seeds, fn):
    """Large scores (sharp attention) must still give finite rows of probabilities."""
    return _sdpa(fn, *_sharp_problem(seeds))


@sdpa_weights_are_probabilities.judge
def judge_sdpa_weights_are_probabilities(seeds, output_and_weights):
    q, k, v = _sharp_problem(seeds)
    output, weights = output_and_weights
    weights_np = to_numpy(weights, "weights")
    if not np.all(np.isfinite(weights_np)):
        raise AssertionError("weights contain inf or NaN for large scores: use a numerically stable softmax.")
    if weights_np.min() < -1e-6:
        raise AssertionError("some attention weights are negative: the weights must be a softmax.")
    row_sums = weights_np.sum(axis=-1)
    if not np.allclose(row_sums, 1.0, atol=1e-4):
        raise AssertionError(f"rows of your attention weights sum to {row_sums.min():.3g}..{row_sums.max():.3g}, "
                             "not 1: did you apply the softmax over the last dimension (the keys)?")
    expect_close(output, oracle_attention(q, k, v), "output for large scores")


def mask_cases(seeds):
    """A causal (T, T) mask broadcast over a batch, then a random (B, 1, T_q, T_k) padding-like mask."""
    q, k, v = sdpa_problem(seeds.generator(1010), (2, 2), t_q=5, t_k=5, d_k=8, d_v=3)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    random_mask = torch.rand(2, 1, 5, 5, generator=seeds.generator(1011)) > 0.4
    random_mask[..., 0] = True  # every query may attend somewhere
    return (q, k, v), [("a causal (T, T) mask", causal), ("a (B, 1, T_q, T_k) mask", random_mask)]


@probe
def sdpa_mask(seeds, fn):
    (q, k, v), masks = mask_cases(seeds)
    return [_sdpa(fn, q, k, v, mask=mask) for _, mask in masks]


@sdpa_mask.judge
def judge_sdpa_mask(seeds, results):
    (q, k, v), masks = mask_cases(seeds)
    for (description, mask), (output, weights) in zip(masks, results):
        weights_np = to_numpy(weights, "weights")
        expect_shape(weights_np, (2, 2, 5, 5), f"weights with {description}",
                     "The mask broadcasts against the scores; it must not change their shape.")
        if np.abs(weights_np[~mask.expand(2, 2, 5, 5).numpy()]).max() > 1e-6:
            hint = ("you attended exactly where the mask is False: True means 'may attend', as in "
                    "torch.nn.functional.scaled_dot_product_attention. Fill the scores where mask is False.")
            if np.allclose(np.nan_to_num(weights_np), oracle_weights(q, k, mask=~mask).numpy(), atol=1e-5):
                raise AssertionError(f"With {description}, {hint}")
            raise AssertionError(f"With {description}, positions where the mask is False got non-zero weight: "
                                 "set their scores to -inf before the softmax (not to 0 after it).")
        expect_close(weights, oracle_weights(q, k, mask=mask), f"weights with {description}")
        expect_close(output, oracle_attention(q, k, v, mask=mask), f"output with {description}")


# ---------------------------------------------------------------- exercise 4 (optional stretch): online_attention
class LargestTensor(TorchFunctionMode):
    """Records the largest number of elements of any tensor a torch call returns while active.
    (A function mode: a dispatch mode would import torch._dynamo, 3 s, into the kernel.)"""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in torch.utils._pytree.tree_leaves(result):
            if torch.is_tensor(value):
                self.largest = max(self.largest, value.numel())
        return result


def _online(fn, q, k, v, chunk_size):
    result = call(fn, q, k, v, chunk_size, name="online_attention", forbidden=ORACLE_SHORTCUTS,
                  forbidden_advice="build the output from running maxima and sums; torch's "
                                   "scaled_dot_product_attention is the oracle here.")
    if not torch.is_tensor(result):
        raise AssertionError(f"online_attention should return a tensor, but it returned {type(result).__name__}.")
    return result


ONLINE_CHUNKS = (1, 3, 5, 13, 40)  # T_k = 13: chunks that divide it, that don't, one past it


def online_problem(seeds):
    return sdpa_problem(seeds.generator(1212), (2, 3), t_q=4, t_k=13, d_k=6, d_v=5, scale=3.0, dtype=torch.float64)


@probe
def stretch_online_attention_values(seeds, fn):
    q, k, v = online_problem(seeds)
    return [_online(fn, q, k, v, chunk) for chunk in ONLINE_CHUNKS]


@stretch_online_attention_values.judge
def judge_stretch_online_attention_values(seeds, outputs):
    q, k, v = online_problem(seeds)
    expected = oracle_attention(q, k, v)
    t_k = k.shape[-2]
    for chunk, output in zip(ONLINE_CHUNKS, outputs):
        last_start = (t_k - 1) // chunk * chunk        # where the last chunk begins
        whole = t_k // chunk * chunk                   # the keys in whole chunks
        diagnoses = {"only the last chunk reached the output: add each chunk's sums to the running ones "
                     "(rescaled), don't replace them.": oracle_attention(q, k[..., last_start:, :], v[..., last_start:, :])}
        if 0 < whole < t_k:
            diagnoses["the last, shorter chunk was dropped: loop over range(0, T_k, chunk_size) and slice past "
                      "the end (slicing stops at T_k)."] = oracle_attention(q, k[..., :whole, :], v[..., :whole, :])
        expect_close(output, expected, f"online_attention with T_k = {t_k} and chunk_size={chunk}", rtol=1e-7,
                     atol=1e-9, diagnoses=diagnoses,
                     hint="Rescale both ℓ and o by exp(m - m') whenever the running maximum changes.")


MEMORY_PROBLEM = dict(batch=(2,), t_q=16, t_k=64, d_k=4, d_v=4)


@probe
def stretch_online_attention_memory(seeds, fn):
    q, k, v = sdpa_problem(seeds.generator(1313), **MEMORY_PROBLEM, scale=6.0)
    with LargestTensor() as measured:
        output = _online(fn, q, k, v, 8)
    return {"output": output, "largest": measured.largest}


@stretch_online_attention_memory.judge
def judge_stretch_online_attention_memory(seeds, data):
    q, k, v = sdpa_problem(seeds.generator(1313), **MEMORY_PROBLEM, scale=6.0)
    expect_close(data["output"], oracle_attention(q, k, v), "online_attention (chunk_size=8, T_k=64)")
    full = math.prod(MEMORY_PROBLEM["batch"]) * MEMORY_PROBLEM["t_q"] * MEMORY_PROBLEM["t_k"]
    if not 0 < data["largest"] < full:
        raise AssertionError(
            f"online_attention created a tensor of {data['largest']} numbers, as many as the full "
            f"(B, T_q, T_k) score matrix ({full}): compute the scores of one chunk of keys at a time.")
