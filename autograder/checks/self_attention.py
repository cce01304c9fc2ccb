"""Hidden checks for 04_self_attention. Each function is one grade cell's hidden part.

Layered as the course's tests are: shape first, then values on seeded random inputs against an
independent oracle (`torch.nn.functional.scaled_dot_product_attention`), then behaviour.
Seeds here are never used by the visible tests.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import call, expect_close, expect_shape, generator, to_numpy

ORACLE_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention"]
SOFTMAX_SHORTCUTS = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                     "torch.special.softmax"]


# ---------------------------------------------------------------- oracles
def oracle_weights(q, k, mask=None, scale=None):
    """Attention weights from torch's own kernel: attending over the identity returns them."""
    identity = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    return F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=scale)


def oracle_attention(q, k, v, mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def reference_softmax(x, dim=-1):
    """Handed to the student's attention code in place of their own softmax (see common.call)."""
    return torch.softmax(x, dim=dim)


def random_projection_problem(seed, n, d_in, d_k, d_v, scale=1.0):
    g = generator(seed)
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


# ---------------------------------------------------------------- exercise 1: self_attention_by_hand
def _by_hand(fn, X, W_Q, W_K, W_V):
    result = call(fn, X.numpy(), W_Q.numpy(), W_K.numpy(), W_V.numpy(), name="self_attention_by_hand")
    if not isinstance(result, (tuple, list)) or len(result) != 5:
        raise AssertionError("self_attention_by_hand must return the tuple (Q, K, V, S, A), "
                             f"but it returned {type(result).__name__}"
                             + (f" of length {len(result)}" if hasattr(result, "__len__") else "") + ".")
    return result


def self_attention_by_hand_shapes(fn):
    """Rectangular projections: n=5 tokens, width 6, d_k=3, d_v=2."""
    X, W_Q, W_K, W_V = random_projection_problem(101, n=5, d_in=6, d_k=3, d_v=2)
    Q, K, V, S, A = _by_hand(fn, X, W_Q, W_K, W_V)
    expected = {"Q": (5, 3), "K": (5, 3), "V": (5, 2), "S": (5, 5), "A": (5, 2)}
    for name, value in zip("QKVSA", (Q, K, V, S, A)):
        expect_shape(to_numpy(value, name), expected[name], name,
                     "With X (5, 6), W_Q and W_K (6, 3) and W_V (6, 2): Q = X W_Q is (n, d_k), "
                     "S = softmax(Q Kᵀ/√d_k) is (n, n), A = S V is (n, d_v).")


def self_attention_by_hand_values(fn):
    """Random rectangular problems against torch's attention kernel."""
    for seed, (n, d_in, d_k, d_v) in [(202, (4, 5, 3, 6)), (203, (7, 3, 8, 2)), (204, (1, 4, 4, 4))]:
        X, W_Q, W_K, W_V = random_projection_problem(seed, n, d_in, d_k, d_v)
        Q, K, V, S, A = _by_hand(fn, X, W_Q, W_K, W_V)
        Q_ref, K_ref, V_ref = X @ W_Q, X @ W_K, X @ W_V
        expect_close(Q, Q_ref, "Q", "Q is X @ W_Q (each row of X times W_Q).")
        expect_close(K, K_ref, "K", "K is X @ W_K.")
        expect_close(V, V_ref, "V", "V is X @ W_V.")
        expect_close(S, oracle_weights(Q_ref, K_ref), "S (attention weights)",
                     diagnoses=by_hand_diagnoses(Q_ref, K_ref, V_ref, d_in))
        expect_close(A, oracle_attention(Q_ref, K_ref, V_ref), "A (attention output)",
                     "A = S @ V: each output row is a weighted average of the rows of V.")


def self_attention_by_hand_is_stable(fn):
    """Scores in the thousands: a naive exp overflows to inf, and inf/inf is NaN."""
    X, W_Q, W_K, W_V = random_projection_problem(305, n=6, d_in=8, d_k=8, d_v=4, scale=30.0)
    Q, K, V, S, A = _by_hand(fn, X, W_Q, W_K, W_V)
    S_np = to_numpy(S, "S")
    if not np.all(np.isfinite(S_np)):
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


def softmax_matches_torch(fn):
    g = generator(404)
    for shape in [(6,), (3, 9), (2, 4, 5)]:
        x = torch.randn(*shape, generator=g) * 3
        expect_close(_softmax(fn, x), torch.softmax(x, dim=-1), f"softmax of a {shape} tensor",
                     diagnoses={"you normalised by the sum of x, not of exp(x).": x / x.sum(-1, keepdim=True),
                                "you exponentiated but didn't divide by the sum.": torch.exp(x)})
    x = torch.tensor([[0.0, float("-inf"), 1.0]])
    expect_close(_softmax(fn, x), torch.softmax(x, dim=-1), "softmax of a row containing -inf",
                 "A -inf score is a masked position: it must get weight exactly 0.")


def softmax_is_stable(fn):
    # float64, so that only the overflow of exp (past ~709) can fail, never rounding.
    g = generator(505)
    for centre in (1e4, -1e4):
        x = centre + torch.randn(4, 7, generator=g, dtype=torch.float64) * 5
        result = _softmax(fn, x)
        values = to_numpy(result, "softmax")
        if not np.all(np.isfinite(values)):
            raise AssertionError(f"softmax returned inf or NaN for inputs around {centre:g}: exp overflows "
                                 "(or underflows to 0/0). Subtract the maximum along `dim` first; "
                                 "softmax(x) = softmax(x - max(x)).")
        expect_close(result, torch.softmax(x, dim=-1), f"softmax for inputs around {centre:g}", atol=1e-5)


def softmax_respects_dim(fn):
    x = torch.randn(2, 3, 4, generator=generator(606))
    for dim in (0, 1, -2, 2):
        expect_close(_softmax(fn, x, dim=dim), torch.softmax(x, dim=dim), f"softmax(x, dim={dim})",
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
    return result


def sdpa_problem(seed, batch, t_q, t_k, d_k, d_v, scale=1.0, dtype=torch.float32):
    g = generator(seed)
    q = torch.randn(*batch, t_q, d_k, generator=g, dtype=dtype) * scale
    k = torch.randn(*batch, t_k, d_k, generator=g, dtype=dtype) * scale
    v = torch.randn(*batch, t_k, d_v, generator=g, dtype=dtype)
    return q, k, v


TRANSPOSE_HINT = ("For batched inputs transpose only the last two dimensions of k: "
                  "k.transpose(-2, -1) or k.mT. (k.T reverses every dimension.)")


def sdpa_shapes(fn):
    for seed, batch in [(707, ()), (708, (3,)), (709, (2, 4))]:
        q, k, v = sdpa_problem(seed, batch, t_q=5, t_k=7, d_k=8, d_v=3)
        output, weights = _sdpa(fn, q, k, v)
        expect_shape(output, (*batch, 5, 3), "output",
                     f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} give an output "
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


def sdpa_values_match_torch(fn):
    for seed, batch, t_q, t_k, d_k, d_v in [(808, (2, 3), 4, 6, 16, 5), (809, (), 3, 3, 4, 4)]:
        q, k, v = sdpa_problem(seed, batch, t_q, t_k, d_k, d_v)
        output, weights = _sdpa(fn, q, k, v)
        expect_close(weights, oracle_weights(q, k), "weights", diagnoses=sdpa_diagnoses(q, k))
        expect_close(output, oracle_attention(q, k, v), "output", "output = weights @ v.")


def sdpa_weights_are_probabilities(fn):
    """Large scores (sharp attention) must still give finite rows of probabilities."""
    q, k, v = sdpa_problem(909, (2,), t_q=6, t_k=6, d_k=32, d_v=4, scale=25.0, dtype=torch.float64)
    output, weights = _sdpa(fn, q, k, v)
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


def sdpa_mask(fn):
    # A causal (T, T) mask broadcast over a batch, then a random (B, 1, T_q, T_k) padding-like mask.
    q, k, v = sdpa_problem(1010, (2, 2), t_q=5, t_k=5, d_k=8, d_v=3)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    g = generator(1011)
    random_mask = torch.rand(2, 1, 5, 5, generator=g) > 0.4
    random_mask[..., 0] = True  # every query may attend somewhere
    for description, mask in [("a causal (T, T) mask", causal), ("a (B, 1, T_q, T_k) mask", random_mask)]:
        output, weights = _sdpa(fn, q, k, v, mask=mask)
        weights_np = to_numpy(weights, "weights")
        inverted = oracle_weights(q, k, mask=~mask)
        expect_shape(weights_np, (2, 2, 5, 5), f"weights with {description}",
                     "The mask broadcasts against the scores; it must not change their shape.")
        if np.abs(weights_np[~mask.expand(2, 2, 5, 5).numpy()]).max() > 1e-6:
            hint = ("you attended exactly where the mask is False: True means 'may attend', as in "
                    "torch.nn.functional.scaled_dot_product_attention. Fill the scores where mask is False.")
            if np.allclose(np.nan_to_num(weights_np), inverted.numpy(), atol=1e-5):
                raise AssertionError(f"With {description}, {hint}")
            raise AssertionError(f"With {description}, positions where the mask is False got non-zero weight: "
                                 "set their scores to -inf before the softmax (not to 0 after it).")
        expect_close(weights, oracle_weights(q, k, mask=mask), f"weights with {description}")
        expect_close(output, oracle_attention(q, k, v, mask=mask), f"output with {description}")
