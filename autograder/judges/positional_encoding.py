"""Hidden checks for positional_encoding, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/positional_encoding.py, which also builds the
inputs both sides rebuild from the seeds."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, quiet, to_numpy
from autograder.checks.positional_encoding import (
    FITS,
    LEARNED_SHAPE_IDS,
    LEARNED_SHAPE_LENGTHS,
    LIMIT,
    LLAMA3_NAME,
    ODD_CASES,
    PE_NAME,
    ROPE_NAME,
    SHAPE_CASES,
    SHIFT_NAME,
    SHIFT_SHAPE_CASES,
    TOO_LONG,
    TRAINABLE_SIZE,
    _shift_kwargs,
    _upstream,
    base_cases,
    frequencies,
    learned_is_trainable,
    learned_length_limit,
    learned_shapes,
    learned_values,
    learned_values_problem,
    llama3_band_cases,
    llama3_band_masks,
    llama3_value_cases,
    oracle_pe,
    relative_shift_is_rotation,
    relative_shift_moves_positions,
    relative_shift_shape,
    rope_inputs,
    rope_norm,
    rope_norm_problem,
    rope_relative_position,
    rope_relative_problem,
    rope_shape,
    rope_shape_cases,
    rope_value_cases,
    rope_values,
    shift_cases,
    sinusoidal_base,
    sinusoidal_odd_d_model,
    sinusoidal_shape,
    sinusoidal_values,
    stretch_llama3_inv_freq_bands,
    stretch_llama3_inv_freq_values,
    value_cases,
)


def interleave(even_columns, odd_columns):
    out = np.empty((even_columns.shape[0], 2 * even_columns.shape[1]))
    out[:, 0::2], out[:, 1::2] = even_columns, odd_columns
    return out


def pe_diagnoses(num_positions, d_model, base):
    """What the usual wrong encodings give, keyed by the misconception."""
    t = np.arange(num_positions, dtype=np.float64)[:, None]                    # (n, 1)
    pairs = np.arange(d_model // 2)                                             # (d/2,)
    angles = t * base ** (-2.0 * pairs / d_model)                               # (n, d/2)
    i_over_d = t * base ** (-1.0 * pairs / d_model)
    own_column = t * base ** (-(2.0 * pairs + 1) / d_model)
    diagnoses = {
        "sin and cos are swapped: the even columns 0, 2, 4, ... hold the sines and the odd columns "
        "the cosines, so PE[0] = [0, 1, 0, 1, ...].": interleave(np.cos(angles), np.sin(angles)),
        "your frequencies fall too slowly: the exponent is 2i/d_model, where i numbers the "
        "(sin, cos) pairs; you used i/d_model.": interleave(np.sin(i_over_d), np.cos(i_over_d)),
        "each cosine column uses its own column index in the exponent. A (sin, cos) pair shares one "
        "frequency: columns 2i and 2i+1 both use t / base^(2i/d_model).":
            interleave(np.sin(angles), np.cos(own_column)),
        "you put all the sines in the first half and all the cosines in the second half (the layout "
        "of fairseq and of Marian in transformers). This formula wants them interleaved: sin in column "
        "2i, cos in column 2i+1.": np.concatenate([np.sin(angles), np.cos(angles)], axis=1),
        "your positions start at 1. They start at 0, so the first row is PE[0] = [0, 1, 0, 1, ...].":
            interleave(np.sin(angles + base ** (-2.0 * pairs / d_model)),
                       np.cos(angles + base ** (-2.0 * pairs / d_model))),
    }
    if num_positions == d_model:
        diagnoses["your result is transposed: rows are positions and columns are dimensions."] = \
            oracle_pe(np.arange(num_positions), d_model, base).T
    if base != 10000.0:
        diagnoses[f"you used base 10000 although base={base:g} was passed: use the `base` argument."] = \
            oracle_pe(np.arange(num_positions), d_model, 10000.0)
    return diagnoses


def pe_shape_hint(num_positions, d_model, result):
    hint = f"The result has one row per position ({num_positions}) and one column per dimension ({d_model})."
    if tuple(result.shape) == (d_model, num_positions):
        hint += " Yours looks transposed: rows are positions, columns are dimensions."
    return hint


def _expect_float32(result, name, advice):
    if result.dtype != torch.float32:
        raise AssertionError(f"{name} returned {result.dtype}; {advice}")


@sinusoidal_shape.judge
def judge_sinusoidal_shape(seeds, results):
    for (num_positions, d_model), result in zip(SHAPE_CASES, results):
        expect_shape(result, (num_positions, d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     pe_shape_hint(num_positions, d_model, result))
        _expect_float32(result, PE_NAME,
                        "return float32 (torch's default). np.sin gives float64, and a float64 encoding added to "
                        "float32 embeddings turns them into float64, which nn.Linear then refuses. Use .float() "
                        "or compute in torch.")


@sinusoidal_values.judge
def judge_sinusoidal_values(seeds, results):
    for (num_positions, d_model), result in zip(value_cases(seeds), results):
        expect_shape(result, (num_positions, d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     pe_shape_hint(num_positions, d_model, result))
        expect_close(result, oracle_pe(np.arange(num_positions), d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     "PE[t, 2i] = sin(t / 10000^(2i/d_model)), PE[t, 2i+1] = cos(t / 10000^(2i/d_model)).",
                     diagnoses=pe_diagnoses(num_positions, d_model, 10000.0), atol=1e-4)


@sinusoidal_base.judge
def judge_sinusoidal_base(seeds, results):
    for (num_positions, d_model, base), result in zip(base_cases(seeds), results):
        expect_close(result, oracle_pe(np.arange(num_positions), d_model, base),
                     f"{PE_NAME}({num_positions}, {d_model}, base={base:g})",
                     "The frequencies are base^(-2i/d_model): use the `base` argument, not the constant 10000.",
                     diagnoses=pe_diagnoses(num_positions, d_model, base), atol=1e-4)


@sinusoidal_odd_d_model.judge
def judge_sinusoidal_odd_d_model(seeds, outcomes):
    for (num_positions, d_model), outcome in zip(ODD_CASES, outcomes):
        shown = f"{PE_NAME}({num_positions}, {d_model})"
        if outcome["value_error"]:
            message = outcome["message"]
            if str(d_model) not in message or "even" not in message.lower():
                raise AssertionError(
                    f"{shown} raised ValueError({message!r}). Make the message clear: say that d_model must be "
                    f"even and show the value you got ({d_model}).")
            continue
        if outcome["error"] is not None:
            raise AssertionError(
                f"{shown} raised {outcome['error']}: {outcome['message']}. With an odd d_model the last sine "
                "has no cosine partner: check d_model first and raise a ValueError that says d_model must be "
                "even.")
        raise AssertionError(
            f"{shown} returned a result of shape {outcome['shape'] or ()} instead of raising. With an odd "
            "d_model the last sine has no cosine partner: raise a ValueError that says d_model must be even.")


def rotation_matrix(k, d_model, base=10000.0, sign=1.0, omegas=None):
    """Block-diagonal M for row vectors (sign=1), or its transpose (sign=-1)."""
    omegas = frequencies(d_model, base) if omegas is None else omegas
    M = np.zeros((d_model, d_model))
    for i, omega in enumerate(omegas):
        c, s = np.cos(omega * k), np.sin(omega * k)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -sign * s], [sign * s, c]]
    return M


def shift_diagnoses(k, d_model, base, positions):
    pe = oracle_pe(positions, d_model, base)
    pairs = np.arange(d_model // 2)
    diagnoses = {
        "PE[t] @ M gives PE[t - k]: your M moves backwards. Check the sign of the sines numerically: "
        "a matrix built for column vectors (M @ x) must be transposed for row vectors (x @ M).":
            oracle_pe(positions - k, d_model, base),
        "PE[t] @ M gives PE[t] back: M must rotate each pair by the angle k ω_i.": pe,
        "your rotation angles use the exponent i/d_model; the frequencies are base^(-2i/d_model), "
        "where i numbers the (sin, cos) pairs.":
            pe @ rotation_matrix(k, d_model, omegas=base ** (-1.0 * pairs / d_model)),
    }
    if base != 10000.0:
        diagnoses[f"your M rotates with base 10000 although base={base:g} was passed: use the `base` argument."] = \
            pe @ rotation_matrix(k, d_model, 10000.0)
    return diagnoses


@relative_shift_shape.judge
def judge_relative_shift_shape(seeds, results):
    for (k, d_model), M in zip(SHIFT_SHAPE_CASES, results):
        expect_shape(M, (d_model, d_model), f"{SHIFT_NAME}({k}, {d_model})",
                     "M maps one PE row (d_model,) to another, so it is (d_model, d_model).")
        _expect_float32(M, SHIFT_NAME, "return float32 like the encoding, so that PE[t] @ M works without a "
                                       "dtype error.")


# Positions near 0 and far from it, offsets forwards, backwards and large, several bases.
SHIFT_POSITIONS = np.concatenate([np.arange(0, 40), np.arange(480, 500)])


@relative_shift_moves_positions.judge
def judge_relative_shift_moves_positions(seeds, results):
    for (k, d_model, base), M in zip(shift_cases(seeds), results):
        shown_base = f", base={base:g}" if _shift_kwargs(base) else ""
        expect_shape(M, (d_model, d_model), f"{SHIFT_NAME}({k}, {d_model})")
        moved = oracle_pe(SHIFT_POSITIONS, d_model, base) @ to_numpy(M, "M")
        expect_close(moved, oracle_pe(SHIFT_POSITIONS + k, d_model, base),
                     f"PE[t] @ {SHIFT_NAME}({k}, {d_model}{shown_base}) over t in 0..39 and 480..499",
                     "PE[t] @ M must equal PE[t + k] for every t. Use the angle-addition formulas for "
                     "sin(ω(t + k)) and cos(ω(t + k)).",
                     diagnoses=shift_diagnoses(k, d_model, base, SHIFT_POSITIONS), atol=1e-4)


@relative_shift_is_rotation.judge
def judge_relative_shift_is_rotation(seeds, matrices):
    d_model, identity = 12, np.eye(12)
    M = to_numpy(matrices[7], "M")
    expect_shape(M, (d_model, d_model), f"{SHIFT_NAME}(7, 12)")
    expect_close(M @ M.T, identity, f"M @ M.T for M = {SHIFT_NAME}(7, 12)",
                 "M only rotates each (sin, cos) pair, so it is orthogonal: M @ M.T = I.")
    off_blocks = np.ones((d_model, d_model), dtype=bool)
    for i in range(0, d_model, 2):
        off_blocks[i:i + 2, i:i + 2] = False
    if np.abs(M[off_blocks]).max() > 1e-5:
        raise AssertionError(f"{SHIFT_NAME}(7, 12) has non-zero entries outside the 2x2 blocks on its "
                             "diagonal. Each frequency's (sin, cos) pair rotates on its own; pairs never mix.")
    expect_close(matrices[0], identity, f"{SHIFT_NAME}(0, 12)", "Shifting by 0 positions is the identity.")
    expect_close(matrices[-7], M.T, f"{SHIFT_NAME}(-7, 12)",
                 "Moving back by 7 undoes moving forward by 7: M(-k) is the inverse of M(k), its transpose.")
    M_4, M_9 = to_numpy(matrices[4], "M(4)"), to_numpy(matrices[9], "M(9)")
    expect_shape(M_4, (d_model, d_model), f"{SHIFT_NAME}(4, 12)")
    expect_shape(M_9, (d_model, d_model), f"{SHIFT_NAME}(9, 12)")
    expect_close(M_4 @ M_9, to_numpy(matrices[13], "M(13)"), f"{SHIFT_NAME}(4, 12) @ {SHIFT_NAME}(9, 12)",
                 "Shifting by 4 then by 9 is shifting by 13: rotation angles add up.")


@learned_shapes.judge
def judge_learned_shapes(seeds, outputs):
    by_ids, by_length = outputs
    for (batch, length), output in zip(LEARNED_SHAPE_IDS, by_ids):
        expect_shape(output, (batch, length, 6), f"the output for ids of shape {(batch, length)}",
                     "For (B, T) token ids return (B, T, d_model): one position vector per token, ready to "
                     "add to the token embeddings.")
    for length, output in zip(LEARNED_SHAPE_LENGTHS, by_length):
        expect_shape(output, (length, 6), f"the output for the length {length}",
                     "For an int length T return the (T, d_model) rows for positions 0 .. T-1.")


@learned_values.judge
def judge_learned_values(seeds, outputs):
    by_ids, by_length = outputs
    d_model = 6
    weights, ids = learned_values_problem(seeds)
    expected = F.embedding(torch.arange(9), weights).expand(3, 9, d_model)
    expect_close(by_ids, expected, "the position embeddings of (3, 9) token ids",
                 "Row t of the table goes to position t, for every sequence in the batch.",
                 diagnoses={"you looked up the token ids. A position table is indexed by the positions "
                            "0 .. T-1, whatever the tokens are.": F.embedding(ids, weights),
                            "your positions start at 1; the first token is position 0.":
                                F.embedding(torch.arange(1, 10), weights).expand(3, 9, d_model)})
    expect_close(by_length, weights[:14], "the position embeddings for the length 14",
                 "For a length T return rows 0 .. T-1 of the table.")


@learned_is_trainable.judge
def judge_learned_is_trainable(seeds, grad):
    if grad is None:
        raise AssertionError("no gradient reached the table: build the output from the table with torch "
                             "operations (no .detach(), no torch.no_grad(), no NumPy).")
    # torch's autograd on the same lookup is the oracle for the gradient (which no table value changes)
    max_positions, d_model = TRAINABLE_SIZE
    oracle_table = torch.zeros(max_positions, d_model, requires_grad=True)
    (F.embedding(torch.arange(4), oracle_table).expand(2, 4, d_model) * _upstream(seeds)).sum().backward()
    expect_close(grad, oracle_table.grad, "the gradient of the table",
                 "Only rows 0 .. T-1 are used, so only they get a gradient (summed over the batch): rows for "
                 "positions that no training sequence reaches are never updated.")


@learned_length_limit.judge
def judge_learned_length_limit(seeds, outcomes):
    fits, too_long = outcomes
    for (what, _, shape), outcome in zip(FITS, fits):
        if outcome["error"] is not None:
            raise AssertionError(f"with max_positions=10, {what} raised {outcome['error']}: {outcome['message']}. "
                                 "A sequence of exactly max_positions tokens fits: positions 0 .. 9 all have rows. "
                                 "Reject T > max_positions, not T >= max_positions.")
        if outcome["shape"] != shape:
            found = outcome["shape"] if outcome["shape"] is not None else "no shape"
            raise AssertionError(f"the output for {what}'s shape {found} != expected shape {shape}.")
    for (what, _, length), outcome in zip(TOO_LONG, too_long):
        if outcome["error"] is None:
            raise AssertionError(
                f"with max_positions=10, {what} returned a result of shape {outcome['shape'] or ()} "
                "instead of raising. The table has no row for those positions; slicing it (weight[:T]) "
                "silently gives too few rows. Check the length and raise a ValueError.")
        if not outcome["value_error"]:
            raise AssertionError(
                f"with max_positions=10, {what} raised {outcome['error']}: {outcome['message']}. That is the "
                "unhelpful error from deep inside torch. Check the length yourself first and raise a "
                "ValueError that says the length and max_positions.")
        message = outcome["message"]
        if str(length) not in message or str(LIMIT) not in message:
            raise AssertionError(f"with max_positions=10, {what} raised ValueError({message!r}). Make it clear: "
                                 f"give the length you got ({length}) and the limit ({LIMIT}).")


def oracle_rope(x, positions, base=10000.0, layout="half", exponent=2.0, sign=1.0, minus=True):
    """RoPE written pair by pair in NumPy float64, for x of shape (..., T, d) and T positions.
    layout "half" pairs dimensions (i, i + d/2) (Hugging Face's rotate_half), "interleaved" (2i, 2i + 1).
    The other arguments build the usual wrong versions. It agrees with transformers' Llama
    `apply_rotary_pos_emb` (cos and sin from `LlamaRotaryEmbedding`) to float32 precision; the checks
    use this form, in float64, and forbid the library's while the student's code runs."""
    x = np.asarray(x, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    d = x.shape[-1]
    half = d // 2
    out = x.copy()
    for i in range(half):
        a, b = (i, i + half) if layout == "half" else (2 * i, 2 * i + 1)
        angle = positions * base ** (-exponent * i / d)                  # (T,)
        c, s = np.cos(angle), sign * np.sin(angle)
        out[..., a] = x[..., a] * c - (1 if minus else -1) * x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out


@rope_shape.judge
def judge_rope_shape(seeds, results):
    for (leading, T, d, dtype, _), (q_rot, k_rot) in zip(rope_shape_cases(seeds), results):
        shape = (*leading, T, d)
        for name, result in (("q_rotated", q_rot), ("k_rotated", k_rot)):
            expect_shape(result, shape, f"{name} for inputs of shape {shape}",
                         "Return the shapes of q and k: the (T, d/2) angles broadcast over any leading dimensions.")
            if result.dtype != dtype:
                raise AssertionError(f"{ROPE_NAME} turned {dtype} inputs into {result.dtype}: compute in the dtype "
                                     "of q (build the frequencies and angles with dtype=q.dtype).")


def rope_diagnoses(q, k, positions, base, given_positions):
    def both(**kwargs):
        return np.stack([oracle_rope(q, positions, base, **kwargs), oracle_rope(k, positions, base, **kwargs)])

    diagnoses = {
        "you paired neighbouring dimensions (2i, 2i+1), the interleaved layout. This exercise uses Hugging "
        "Face's rotate_half layout: pair i is dimensions i and i + d/2.": both(layout="interleaved"),
        "your frequencies fall too slowly: theta_i = base^(-2i/d), with i numbering the pairs; you used "
        "base^(-i/d).": both(exponent=1.0),
        "your rotation turns the wrong way: the sign of the sine is flipped. x'_i = x_i cos - x_(i+d/2) sin, "
        "x'_(i+d/2) = x_(i+d/2) cos + x_i sin.": both(sign=-1.0),
        "the minus sign is missing: x'_i = x_i cos - x_(i+d/2) sin (rotate_half(x) is cat(-x2, x1)); without "
        "it the map is not a rotation.": both(minus=False),
        "you rotated only the queries. Rotate the keys too, each by its own position, otherwise the score "
        "depends on the query's position alone.": np.stack([oracle_rope(q, positions, base), np.asarray(k)]),
    }
    if not given_positions:
        diagnoses["your positions start at 1. With positions=None they are 0, 1, ..., T - 1, so the first "
                  "row is not rotated."] = np.stack([oracle_rope(q, positions + 1, base),
                                                     oracle_rope(k, positions + 1, base)])
    if base != 10000.0:
        diagnoses[f"you used base 10000 although base={base:g} was passed: use the `base` argument."] = \
            np.stack([oracle_rope(q, positions, 10000.0), oracle_rope(k, positions, 10000.0)])
    return diagnoses


@rope_values.judge
def judge_rope_values(seeds, results):
    for n, ((leading, T, d, positions, base), (q_rot, k_rot)) in enumerate(zip(rope_value_cases(seeds), results)):
        q, k = rope_inputs(seeds, 1420 + n, leading, T, d)
        given = positions is not None
        positions = np.asarray(positions, dtype=np.float64) if given else np.arange(T, dtype=np.float64)
        shown = (f"{ROPE_NAME}(q, k{', positions' if given else ''}, base={base:g}) for q, k of shape "
                 f"{(*leading, T, d)}" + (f", positions {positions.astype(int).tolist()}" if given else ""))
        expect_shape(q_rot, (*leading, T, d), f"q_rotated of {shown}")
        expect_shape(k_rot, (*leading, T, d), f"k_rotated of {shown}")
        actual = np.stack([to_numpy(q_rot, "q_rotated"), to_numpy(k_rot, "k_rotated")])
        expected = np.stack([oracle_rope(q, positions, base), oracle_rope(k, positions, base)])
        tight = dict(rtol=1e-7, atol=1e-8)  # float64 all the way: angles in the thousands keep ~1e-12
        if not np.allclose(actual, expected, **tight) and np.allclose(actual, expected, rtol=1e-3, atol=1e-3):
            raise AssertionError(f"(q_rotated, k_rotated) of {shown} are right only to float32 precision (largest "
                                 f"difference {np.abs(actual - expected).max():.2g}). With float64 inputs compute the "
                                 "frequencies and angles in float64 too: dtype=q.dtype.")
        expect_close(actual, expected, f"(q_rotated, k_rotated) of {shown}",
                     "Pair i is dimensions (i, i + d/2): x'_i = x_i cos(p theta_i) - x_(i+d/2) sin(p theta_i), "
                     "x'_(i+d/2) = x_(i+d/2) cos(p theta_i) + x_i sin(p theta_i), theta_i = base^(-2i/d).",
                     diagnoses=rope_diagnoses(q, k, positions, base, given), **tight)


@rope_relative_position.judge
def judge_rope_relative_position(seeds, results):
    q, k, positions, shift = rope_relative_problem(seeds)
    q, k = q.numpy(), k.numpy()
    (q_near, k_near), (q_far, k_far) = [(to_numpy(a, "q_rotated"), to_numpy(b, "k_rotated")) for a, b in results]
    for rotated in (q_near, k_near, q_far, k_far):
        expect_shape(rotated, q.shape, f"the result for q, k of shape {q.shape}")
    if np.allclose(k_near, k) and not np.allclose(q_near, q):
        raise AssertionError("your keys come back unrotated: you rotated only the queries. Rotate the keys "
                             "too, each by its own position, otherwise the score depends on the query's "
                             "position alone, not on m - n.")
    if np.allclose(q_near, q) and not np.allclose(k_near, k):
        raise AssertionError("your queries come back unrotated: you rotated only the keys. Rotate both.")
    scores_near, scores_far = q_near @ k_near.T, q_far @ k_far.T            # (T, T): q'_m . k'_n
    if np.allclose(scores_near, q @ k.T):
        raise AssertionError("your scores q'_m . k'_n do not depend on the positions at all: each pair must "
                             "turn by the angle p * theta_i, with p the row's position.")
    expect_close(scores_far, scores_near,
                 f"the scores q'_m . k'_n after moving every position by {shift}",
                 "Moving every token by the same amount keeps every offset m - n, so no score may change: "
                 "rotate q and k with the same angles, each row by its own position.",
                 rtol=1e-7, atol=1e-8)


@rope_norm.judge
def judge_rope_norm(seeds, result):
    q, k, positions = rope_norm_problem(seeds)
    q_rot, k_rot = to_numpy(result[0], "q_rotated"), to_numpy(result[1], "k_rotated")
    expect_shape(q_rot, tuple(q.shape), "q_rotated")
    expect_shape(k_rot, tuple(k.shape), "k_rotated")
    q, k = q.numpy(), k.numpy()
    where = f"at positions {positions.tolist()}"
    expect_close(np.linalg.norm(q_rot, axis=-1), np.linalg.norm(q, axis=-1), f"the lengths of the rotated queries {where}",
                 "A rotation keeps lengths (cos^2 + sin^2 = 1): check the minus sign in "
                 "x'_i = x_i cos - x_(i+d/2) sin, and that each pair uses one angle for both its entries.",
                 rtol=1e-7, atol=1e-8)
    expect_close(np.linalg.norm(k_rot, axis=-1), np.linalg.norm(k, axis=-1), f"the lengths of the rotated keys {where}",
                 "Rotate the keys with the same rotation: lengths are kept.", rtol=1e-7, atol=1e-8)
    expect_close((q_rot * k_rot).sum(-1), (q * k).sum(-1), f"q'_p . k'_p {where}",
                 "A query and a key at the same position turn by the same angles, so their score is the plain "
                 "q . k.", rtol=1e-7, atol=1e-8)


LLAMA3_RTOL = 5e-5


def oracle_llama3_inv_freq(head_dim, base, factor, low_freq_factor, high_freq_factor, original_max_position):
    """transformers' llama3 frequencies (float32), as float64 NumPy. Grader side only."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    with quiet():
        config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                             max_position_embeddings=int(factor * original_max_position) + 1,
                             rope_parameters={"rope_type": "llama3", "rope_theta": float(base), "factor": float(factor),
                                              "low_freq_factor": float(low_freq_factor),
                                              "high_freq_factor": float(high_freq_factor),
                                              "original_max_position_embeddings": int(original_max_position)})
        inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, None)
    return inv_freq.double().numpy()


def llama3_formula(head_dim, base, factor, low, high, original, wavelength_turn=2 * math.pi, swap_bands=False,
                   multiply=False, swap_gamma=False):
    """The rescaling in NumPy float64, and (with the options) the usual wrong versions, for diagnoses."""
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelength = wavelength_turn / theta
    scaled = theta * factor if multiply else theta / factor
    gamma = (original / wavelength - low) / (high - low)
    if swap_gamma:
        gamma = 1 - gamma
    keep, stretch = wavelength < original / high, wavelength > original / low
    if swap_bands:
        return np.where(stretch, theta, np.where(keep, scaled, (1 - gamma) * scaled + gamma * theta))
    return np.where(keep, theta, np.where(stretch, scaled, (1 - gamma) * scaled + gamma * theta))


def llama3_diagnoses(case):
    head_dim, base, factor, low, high, original = case
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    return {
        "the bands are swapped: the short wavelengths (< original_max_position / high_freq_factor) keep their "
        "frequency, the long ones (> original_max_position / low_freq_factor) are divided by factor.":
            llama3_formula(*case, swap_bands=True),
        "your wavelengths lack the 2π: pair i turns a full circle (2π radians) every 2π/θ_i positions, so its "
        "wavelength is 2π/θ_i, not 1/θ_i.": llama3_formula(*case, wavelength_turn=1.0),
        "you multiplied by factor: the slow pairs are divided by it, so that they turn factor times slower and "
        "factor times more positions fit into the angles seen in training.": llama3_formula(*case, multiply=True),
        "in the band between, γ and 1 − γ are swapped: θ' = (1 − γ)·θ/factor + γ·θ, where γ = 1 at the "
        "short-wavelength edge (θ kept) and 0 at the long one (θ/factor).": llama3_formula(*case, swap_gamma=True),
        "you returned RoPE's frequencies θ_i unchanged: rescale the slow pairs.": theta,
        "you divided every frequency by factor (plain position interpolation): Llama 3.1 keeps the fast pairs "
        "and blends the ones in between.": theta / factor,
    }


def _expect_llama3_result(result, case):
    shown = f"{LLAMA3_NAME}{tuple(case)}"
    expect_shape(result, (case[0] // 2,), shown, "One frequency per pair: head_dim // 2 of them.")
    if result.dtype != torch.float32:
        raise AssertionError(f"{shown} returned {result.dtype}: return float32, like transformers (it computes the "
                             "frequencies in float32). If you computed in NumPy or float64, convert with .float().")
    return shown


@stretch_llama3_inv_freq_values.judge
def judge_stretch_llama3_inv_freq_values(seeds, results):
    for case, result in zip(llama3_value_cases(seeds), results):
        shown = _expect_llama3_result(result, case)
        expect_close(result, oracle_llama3_inv_freq(*case), shown,
                     "θ_i = base^(-2i/head_dim), wavelength λ_i = 2π/θ_i: keep θ_i where λ_i < original/high_freq_factor, "
                     "θ_i/factor where λ_i > original/low_freq_factor, and in between (1 − γ)·θ_i/factor + γ·θ_i with "
                     "γ = (original/λ_i − low_freq_factor)/(high_freq_factor − low_freq_factor).",
                     diagnoses=llama3_diagnoses(case), rtol=LLAMA3_RTOL, atol=0.0)


BAND_RTOL = 2e-5  # the kept and divided bands involve no blend: a float32 rounding or two of θ_i


@stretch_llama3_inv_freq_bands.judge
def judge_stretch_llama3_inv_freq_bands(seeds, results):
    for case, result in zip(llama3_band_cases(seeds), results):
        shown = _expect_llama3_result(result, case)
        head_dim, base, factor, low, high, original = case
        theta, high_band, low_band = llama3_band_masks(case)
        ratio = to_numpy(result, shown) / theta                                   # θ'_i / θ_i
        if not np.all(np.isfinite(ratio)):
            raise AssertionError(f"{shown} contains inf or NaN.")
        fast = f"the {int(high_band.sum())} pairs with wavelengths shorter than {original}/{high:g} = {original / high:.4g}"
        if not np.allclose(ratio[high_band], 1.0, rtol=BAND_RTOL, atol=0.0):
            if np.allclose(ratio[high_band], 1 / factor, rtol=BAND_RTOL, atol=0.0):
                raise AssertionError(f"{shown}: you divided {fast} by factor: the bands are swapped. Short wavelengths "
                                     "keep their frequency exactly (they encode local order and turned through every "
                                     "angle in training).")
            raise AssertionError(f"{shown}: {fast} must keep their frequency θ_i exactly; yours are θ_i times "
                                 f"{ratio[high_band].min():.6g} .. {ratio[high_band].max():.6g}.")
        slow = f"the {int(low_band.sum())} pairs with wavelengths longer than {original}/{low:g} = {original / low:.4g}"
        if not np.allclose(ratio[low_band], 1 / factor, rtol=BAND_RTOL, atol=0.0):
            if np.allclose(ratio[low_band], factor, rtol=BAND_RTOL, atol=0.0):
                raise AssertionError(f"{shown}: you multiplied {slow} by factor={factor:g}: divide them, so that they "
                                     "turn factor times slower.")
            raise AssertionError(f"{shown}: {slow} must be divided by factor={factor:g} exactly (θ_i/factor); yours "
                                 f"are θ_i times {ratio[low_band].min():.6g} .. {ratio[low_band].max():.6g}. Is the "
                                 "wavelength 2π/θ_i?")
        middle = ~high_band & ~low_band
        inside = (ratio[middle] >= (1 / factor) * (1 - BAND_RTOL)) & (ratio[middle] <= 1 + BAND_RTOL)
        if not inside.all():
            raise AssertionError(f"{shown}: in the band between, θ'_i/θ_i must lie between 1/factor and 1 (a blend of "
                                 f"θ_i/factor and θ_i); yours ranges over {ratio[middle].min():.6g} .. "
                                 f"{ratio[middle].max():.6g}.")
        rises = np.nonzero(ratio[1:] > ratio[:-1] * (1 + BAND_RTOL))[0]
        if rises.size:
            i = int(rises[0])
            raise AssertionError(f"{shown}: θ'_i/θ_i rises from pair {i} ({ratio[i]:.4g}) to pair {i + 1} "
                                 f"({ratio[i + 1]:.4g}). It must fall from 1 to 1/factor as the wavelength grows: "
                                 "γ = 1 at the short-wavelength edge and 0 at the long one, θ' = (1 − γ)·θ/factor + "
                                 "γ·θ. Did you swap γ and 1 − γ?")
