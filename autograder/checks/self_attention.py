"""Hidden checks for 04_self_attention, the probe side: what runs in the student's kernel.

Each check is one grade cell's hidden part. Its probe builds the seeded inputs, calls the student's
code and returns what it produced; its judge (autograder/judges/self_attention.py, in the grader
only) rebuilds the same inputs, computes the oracle `torch.nn.functional.scaled_dot_product_attention`,
compares and names the misconception. Layered as the course's tests are: shape first, then values on
seeded random inputs, then behaviour. The seeds come from the grader's per-run token, so they are
never the visible tests' inputs.
"""
import torch
from torch.overrides import TorchFunctionMode

from autograder.checks.common import call, probe


ORACLE_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention",
                    "courselib.attention.scaled_dot_product_attention"]

SOFTMAX_SHORTCUTS = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                     "torch.special.softmax", "courselib.attention.masked_softmax"]


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


@probe
def self_attention_by_hand_values(seeds, fn):
    """Random rectangular problems."""
    return [_by_hand(fn, *random_projection_problem(seeds.generator(202 + i), *case))
            for i, case in enumerate(BY_HAND_VALUE_CASES)]


def _large_scores_problem(seeds):
    return random_projection_problem(seeds.generator(305), n=6, d_in=8, d_k=8, d_v=4, scale=30.0)


@probe
def self_attention_by_hand_is_stable(seeds, fn):
    """Scores in the thousands: a naive exp overflows to inf, and inf/inf is NaN."""
    return _by_hand(fn, *_large_scores_problem(seeds))


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


def stable_cases(seeds):
    # float64, so that only the overflow of exp (past ~709) can fail, never rounding.
    g = seeds.generator(505)
    return [centre + torch.randn(4, 7, generator=g, dtype=torch.float64) * 5 for centre in (1e4, -1e4)]


@probe
def softmax_is_stable(seeds, fn):
    return [_softmax(fn, x) for x in stable_cases(seeds)]


DIMS = (0, 1, -2, 2)


@probe
def softmax_respects_dim(seeds, fn):
    x = torch.randn(2, 3, 4, generator=seeds.generator(606))
    return [_softmax(fn, x, dim=dim) for dim in DIMS]


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


SHAPE_BATCHES = [(), (3,), (2, 4)]


@probe
def sdpa_shapes(seeds, fn):
    return [_sdpa(fn, *sdpa_problem(seeds.generator(707 + i), batch, t_q=5, t_k=7, d_k=8, d_v=3))
            for i, batch in enumerate(SHAPE_BATCHES)]


VALUE_CASES = [((2, 3), 4, 6, 16, 5), ((), 3, 3, 4, 4)]


@probe
def sdpa_values_match_torch(seeds, fn):
    return [_sdpa(fn, *sdpa_problem(seeds.generator(808 + i), *case)) for i, case in enumerate(VALUE_CASES)]


def _sharp_problem(seeds):
    return sdpa_problem(seeds.generator(909), (2,), t_q=6, t_k=6, d_k=32, d_v=4, scale=25.0, dtype=torch.float64)


@probe
def sdpa_weights_are_probabilities(seeds, fn):
    """Large scores (sharp attention) must still give finite rows of probabilities."""
    return _sdpa(fn, *_sharp_problem(seeds))


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


MEMORY_PROBLEM = dict(batch=(2,), t_q=16, t_k=64, d_k=4, d_v=4)


@probe
def stretch_online_attention_memory(seeds, fn):
    q, k, v = sdpa_problem(seeds.generator(1313), **MEMORY_PROBLEM, scale=6.0)
    with LargestTensor() as measured:
        output = _online(fn, q, k, v, 8)
    return {"output": output, "largest": measured.largest}
