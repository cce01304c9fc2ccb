"""Hidden checks for 04_self_attention, the judge side (in the grader only, never in the sandbox):
the oracle `torch.nn.functional.scaled_dot_product_attention`, the diagnoses, and one judge per
probe of autograder/checks/self_attention.py, which also builds the inputs both sides rebuild."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, expect_tensor, to_numpy
from autograder.checks.self_attention import (
    BY_HAND_SHAPES_CASE,
    BY_HAND_VALUE_CASES,
    DIMS,
    MEMORY_PROBLEM,
    ONLINE_CHUNKS,
    SHAPE_BATCHES,
    VALUE_CASES,
    _large_scores_problem,
    _sharp_problem,
    mask_cases,
    online_problem,
    random_projection_problem,
    sdpa_mask,
    sdpa_problem,
    sdpa_shapes,
    sdpa_values_match_torch,
    sdpa_weights_are_probabilities,
    self_attention_by_hand_is_stable,
    self_attention_by_hand_shapes,
    self_attention_by_hand_values,
    softmax_cases,
    softmax_is_stable,
    softmax_matches_torch,
    softmax_respects_dim,
    stable_cases,
    stretch_online_attention_memory,
    stretch_online_attention_values,
)


# ---------------------------------------------------------------- oracles (judge side)
def oracle_weights(q, k, mask=None, scale=None):
    """Attention weights from torch's own kernel: attending over the identity returns them."""
    identity = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    return F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=scale)


def oracle_attention(q, k, v, mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


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


@self_attention_by_hand_shapes.judge
def judge_self_attention_by_hand_shapes(seeds, QKVSA):
    n, _, d_k, d_v = BY_HAND_SHAPES_CASE
    expected = {"Q": (n, d_k), "K": (n, d_k), "V": (n, d_v), "S": (n, n), "A": (n, d_v)}
    for name, value in zip("QKVSA", QKVSA):
        expect_shape(to_numpy(value, name), expected[name], name,
                     "With X (5, 6), W_Q and W_K (6, 3) and W_V (6, 2): Q = X W_Q is (n, d_k), "
                     "S = softmax(Q Kᵀ/√d_k) is (n, n), A = S V is (n, d_v).")


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


@softmax_is_stable.judge
def judge_softmax_is_stable(seeds, results):
    for x, centre, result in zip(stable_cases(seeds), (1e4, -1e4), results):
        if not np.all(np.isfinite(to_numpy(result, "softmax"))):
            raise AssertionError(f"softmax returned inf or NaN for inputs around {centre:g}: exp overflows "
                                 "(or underflows to 0/0). Subtract the maximum along `dim` first; "
                                 "softmax(x) = softmax(x - max(x)).")
        expect_close(result, torch.softmax(x, dim=-1), f"softmax for inputs around {centre:g}", atol=1e-5)


@softmax_respects_dim.judge
def judge_softmax_respects_dim(seeds, results):
    x = torch.randn(2, 3, 4, generator=seeds.generator(606))
    for dim, result in zip(DIMS, results):
        expect_close(result, torch.softmax(x, dim=dim), f"softmax(x, dim={dim})",
                     diagnoses={"your softmax ignores `dim` and always normalises the last dimension.":
                                torch.softmax(x, dim=-1)},
                     hint="Take the max and the sum along `dim`, with keepdim=True so they broadcast.")


TRANSPOSE_HINT = ("For batched inputs transpose only the last two dimensions of k: "
                  "k.transpose(-2, -1) or k.mT. (k.T reverses every dimension.)")


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


@sdpa_values_match_torch.judge
def judge_sdpa_values_match_torch(seeds, results):
    for i, (case, (output, weights)) in enumerate(zip(VALUE_CASES, results)):
        q, k, v = sdpa_problem(seeds.generator(808 + i), *case)
        expect_close(weights, oracle_weights(q, k), "weights", diagnoses=sdpa_diagnoses(q, k))
        expect_close(output, oracle_attention(q, k, v), "output", "output = weights @ v.")


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


@stretch_online_attention_memory.judge
def judge_stretch_online_attention_memory(seeds, data):
    q, k, v = sdpa_problem(seeds.generator(1313), **MEMORY_PROBLEM, scale=6.0)
    expect_close(data["output"], oracle_attention(q, k, v), "online_attention (chunk_size=8, T_k=64)")
    full = math.prod(MEMORY_PROBLEM["batch"]) * MEMORY_PROBLEM["t_q"] * MEMORY_PROBLEM["t_k"]
    if not 0 < data["largest"] < full:
        raise AssertionError(
            f"online_attention created a tensor of {data['largest']} numbers, as many as the full "
            f"(B, T_q, T_k) score matrix ({full}): compute the scores of one chunk of keys at a time.")
