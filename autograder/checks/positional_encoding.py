"""Hidden checks for 03_positional_encoding. Each function is one grade cell's hidden part.

Layered as the course's tests are: shape first, then values on sizes the visible tests never use,
then behaviour. The oracles are independent of the reference solution:
- `oracle_pe`: the formula of Vaswani et al. written pair by pair in NumPy float64, for any base
  and any (even negative) positions. It agrees with transformers' XLM/DistilBERT
  `create_sinusoidal_embeddings` to float32 precision; that import costs seconds, so the checks use
  the NumPy form.
- relative shifts are graded by the identity they must satisfy, PE[t + k] == PE[t] @ M, over many
  t, k, d and bases, with PE from `oracle_pe` (never from the student's exercise 1);
- the learned table is compared with `torch.nn.functional.embedding` and with torch's autograd.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import call, expect_close, expect_shape, quiet, to_numpy

PE_NAME = "sinusoidal_positional_encoding"
SHIFT_NAME = "relative_shift_matrix"
LEARNED_NAME = "LearnedPositionalEmbedding"
LIBRARY_SHORTCUTS = ["transformers.models.xlm.modeling_xlm.create_sinusoidal_embeddings",
                     "transformers.models.distilbert.modeling_distilbert.create_sinusoidal_embeddings"]


# ---------------------------------------------------------------- oracles
def frequencies(d_model, base=10000.0):
    """ω_i = base^(-2i/d) for the pairs i = 0 .. d/2 - 1."""
    return np.array([base ** (-2.0 * i / d_model) for i in range(d_model // 2)])


def oracle_pe(positions, d_model, base=10000.0):
    """PE[t, 2i] = sin(t ω_i), PE[t, 2i+1] = cos(t ω_i), float64, one row per entry of `positions`."""
    positions = np.asarray(positions, dtype=np.float64).reshape(-1)
    pe = np.zeros((positions.size, d_model))
    for i, omega in enumerate(frequencies(d_model, base)):
        pe[:, 2 * i] = np.sin(positions * omega)
        pe[:, 2 * i + 1] = np.cos(positions * omega)
    return pe


def reference_sinusoidal_positional_encoding(num_positions, d_model, base=10000.0):
    """Handed to the student's relative_shift_matrix in place of their exercise 1 (see common.call)."""
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    return torch.tensor(oracle_pe(np.arange(num_positions), d_model, base), dtype=torch.float32)


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


# ---------------------------------------------------------------- exercise 1: sinusoidal_positional_encoding
def library_shortcuts():
    """The library versions of the formula, forbidden only if already imported: patching one would
    import transformers' model code, seconds of work, for every student who never touched it."""
    return [target for target in LIBRARY_SHORTCUTS if target.rsplit(".", 1)[0] in sys.modules]


def _pe(fn, num_positions, d_model, **kwargs):
    result = call(fn, num_positions, d_model, name=PE_NAME, forbidden=library_shortcuts(),
                  forbidden_advice="write the formula yourself: transformers' implementation is the "
                                   "oracle here, not the answer.", **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{PE_NAME} should return a torch tensor, but it returned "
                             f"{type(result).__name__}. Convert with torch.from_numpy(...).float() "
                             "or compute with torch from the start.")
    return result


def pe_shape_hint(num_positions, d_model, result):
    hint = f"The result has one row per position ({num_positions}) and one column per dimension ({d_model})."
    if tuple(result.shape) == (d_model, num_positions):
        hint += " Yours looks transposed: rows are positions, columns are dimensions."
    return hint


def sinusoidal_shape(fn):
    for num_positions, d_model in [(7, 10), (50, 4), (1, 2), (3, 16)]:
        result = _pe(fn, num_positions, d_model)
        expect_shape(result, (num_positions, d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     pe_shape_hint(num_positions, d_model, result))
        if result.dtype != torch.float32:
            raise AssertionError(
                f"{PE_NAME} returned {result.dtype}; return float32 (torch's default). np.sin gives "
                "float64, and a float64 encoding added to float32 embeddings turns them into float64, "
                "which nn.Linear then refuses. Use .float() or compute in torch.")


def sinusoidal_values(fn):
    # float32 answers: positions up to a few hundred keep the angle error under 1e-4.
    for num_positions, d_model in [(37, 12), (20, 64), (6, 6), (300, 16)]:
        result = _pe(fn, num_positions, d_model)
        expect_shape(result, (num_positions, d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     pe_shape_hint(num_positions, d_model, result))
        expect_close(result, oracle_pe(np.arange(num_positions), d_model), f"{PE_NAME}({num_positions}, {d_model})",
                     "PE[t, 2i] = sin(t / 10000^(2i/d_model)), PE[t, 2i+1] = cos(t / 10000^(2i/d_model)).",
                     diagnoses=pe_diagnoses(num_positions, d_model, 10000.0), atol=1e-4)


def sinusoidal_base(fn):
    for num_positions, d_model, base in [(30, 8, 100.0), (12, 6, 2.5), (9, 10, 1e6)]:
        result = _pe(fn, num_positions, d_model, base=base)
        expect_close(result, oracle_pe(np.arange(num_positions), d_model, base),
                     f"{PE_NAME}({num_positions}, {d_model}, base={base:g})",
                     "The frequencies are base^(-2i/d_model): use the `base` argument, not the constant 10000.",
                     diagnoses=pe_diagnoses(num_positions, d_model, base), atol=1e-4)


def sinusoidal_odd_d_model(fn):
    for num_positions, d_model in [(4, 7), (10, 1)]:
        try:
            with quiet():
                result = fn(num_positions, d_model)
        except NotImplementedError:
            raise
        except ValueError as error:
            message = str(error)
            if str(d_model) not in message or "even" not in message.lower():
                raise AssertionError(
                    f"{PE_NAME}({num_positions}, {d_model}) raised ValueError({message!r}). Make the message "
                    f"clear: say that d_model must be even and show the value you got ({d_model}).") from None
            continue
        except Exception as error:
            raise AssertionError(
                f"{PE_NAME}({num_positions}, {d_model}) raised {type(error).__name__}: {error}. With an odd "
                "d_model the last sine has no cosine partner: check d_model first and raise a ValueError "
                "that says d_model must be even.") from None
        raise AssertionError(
            f"{PE_NAME}({num_positions}, {d_model}) returned a result of shape "
            f"{tuple(getattr(result, 'shape', ()))} instead of raising. With an odd d_model the last sine "
            "has no cosine partner: raise a ValueError that says d_model must be even.")


# ---------------------------------------------------------------- exercise 2: relative_shift_matrix
def _shift(fn, k, d_model, **kwargs):
    result = call(fn, k, d_model, name=SHIFT_NAME,
                  helpers={"sinusoidal_positional_encoding": reference_sinusoidal_positional_encoding},
                  **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{SHIFT_NAME} should return a torch tensor, but it returned {type(result).__name__}.")
    return result


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


def relative_shift_shape(fn):
    for k, d_model in [(3, 6), (-2, 16), (0, 2), (40, 10)]:
        M = _shift(fn, k, d_model)
        expect_shape(M, (d_model, d_model), f"{SHIFT_NAME}({k}, {d_model})",
                     "M maps one PE row (d_model,) to another, so it is (d_model, d_model).")
        if M.dtype != torch.float32:
            raise AssertionError(f"{SHIFT_NAME} returned {M.dtype}; return float32 like the encoding, "
                                 "so that PE[t] @ M works without a dtype error.")


def relative_shift_moves_positions(fn):
    # Positions near 0 and far from it, offsets forwards, backwards and large, several bases.
    positions = np.concatenate([np.arange(0, 40), np.arange(480, 500)])
    for k, d_model, base in [(5, 6, 10000.0), (-3, 16, 10000.0), (17, 32, 10000.0), (250, 8, 10000.0),
                             (4, 10, 50.0)]:
        kwargs = {} if base == 10000.0 else {"base": base}
        M = _shift(fn, k, d_model, **kwargs)
        expect_shape(M, (d_model, d_model), f"{SHIFT_NAME}({k}, {d_model})")
        moved = oracle_pe(positions, d_model, base) @ to_numpy(M, "M")
        expect_close(moved, oracle_pe(positions + k, d_model, base),
                     f"PE[t] @ {SHIFT_NAME}({k}, {d_model}{', base=%g' % base if kwargs else ''}) over t in 0..39 and 480..499",
                     "PE[t] @ M must equal PE[t + k] for every t. Use the angle-addition formulas for "
                     "sin(ω(t + k)) and cos(ω(t + k)).",
                     diagnoses=shift_diagnoses(k, d_model, base, positions), atol=1e-4)


def relative_shift_is_rotation(fn):
    d_model, identity = 12, np.eye(12)
    M = to_numpy(_shift(fn, 7, d_model), "M")
    expect_close(M @ M.T, identity, f"M @ M.T for M = {SHIFT_NAME}(7, 12)",
                 "M only rotates each (sin, cos) pair, so it is orthogonal: M @ M.T = I.")
    off_blocks = np.ones((d_model, d_model), dtype=bool)
    for i in range(0, d_model, 2):
        off_blocks[i:i + 2, i:i + 2] = False
    if np.abs(M[off_blocks]).max() > 1e-5:
        raise AssertionError(f"{SHIFT_NAME}(7, 12) has non-zero entries outside the 2x2 blocks on its "
                             "diagonal. Each frequency's (sin, cos) pair rotates on its own; pairs never mix.")
    expect_close(_shift(fn, 0, d_model), identity, f"{SHIFT_NAME}(0, 12)", "Shifting by 0 positions is the identity.")
    expect_close(_shift(fn, -7, d_model), M.T, f"{SHIFT_NAME}(-7, 12)",
                 "Moving back by 7 undoes moving forward by 7: M(-k) is the inverse of M(k), its transpose.")
    expect_close(to_numpy(_shift(fn, 4, d_model), "M(4)") @ to_numpy(_shift(fn, 9, d_model), "M(9)"),
                 to_numpy(_shift(fn, 13, d_model), "M(13)"), f"{SHIFT_NAME}(4, 12) @ {SHIFT_NAME}(9, 12)",
                 "Shifting by 4 then by 9 is shifting by 13: rotation angles add up.")


# ---------------------------------------------------------------- exercise 3: LearnedPositionalEmbedding
def _build(cls, max_positions, d_model):
    module = call(cls, max_positions, d_model, name=LEARNED_NAME)
    if not isinstance(module, torch.nn.Module):
        raise AssertionError(f"{LEARNED_NAME}(...) should build a torch.nn.Module, got {type(module).__name__}.")
    return module


def _forward(module, ids_or_length):
    return call(module, ids_or_length, name=f"{LEARNED_NAME}.forward")


def table_of(module, max_positions, d_model):
    """The module's one learnable (max_positions, d_model) table, or a message saying what is wrong."""
    parameters = list(module.parameters())
    tables = [p for p in parameters if tuple(p.shape) == (max_positions, d_model)]
    if not tables:
        found = [tuple(p.shape) for p in parameters]
        raise AssertionError(
            f"{LEARNED_NAME}({max_positions}, {d_model}) has no learnable ({max_positions}, {d_model}) table "
            f"among its parameters (found {found or 'none'}). Keep the table in an nn.Embedding or an "
            "nn.Parameter: a plain tensor attribute is invisible to module.parameters(), so the optimiser "
            "would never train it.")
    if len(tables) > 1 or sum(p.numel() for p in parameters) != max_positions * d_model:
        raise AssertionError(f"{LEARNED_NAME}({max_positions}, {d_model}) should hold exactly one parameter, the "
                             f"({max_positions}, {d_model}) table; it has {[tuple(p.shape) for p in parameters]}.")
    return tables[0]


def learned_shapes(cls):
    module = _build(cls, 12, 6)
    g = torch.Generator().manual_seed(1303)
    for batch, length in [(3, 5), (1, 12), (4, 1)]:
        ids = torch.randint(0, 100, (batch, length), generator=g)
        expect_shape(_forward(module, ids), (batch, length, 6), f"the output for ids of shape {(batch, length)}",
                     "For (B, T) token ids return (B, T, d_model): one position vector per token, ready to "
                     "add to the token embeddings.")
    for length in (7, 12, 1):
        expect_shape(_forward(module, length), (length, 6), f"the output for the length {length}",
                     "For an int length T return the (T, d_model) rows for positions 0 .. T-1.")


def learned_values(cls):
    max_positions, d_model = 20, 6
    module = _build(cls, max_positions, d_model)
    table = table_of(module, max_positions, d_model)
    g = torch.Generator().manual_seed(1304)
    weights = torch.randn(max_positions, d_model, generator=g)
    with torch.no_grad():
        table.copy_(weights)
    ids = torch.randint(0, max_positions, (3, 9), generator=g)
    expected = F.embedding(torch.arange(9), weights).expand(3, 9, d_model)
    expect_close(_forward(module, ids), expected, "the position embeddings of (3, 9) token ids",
                 "Row t of the table goes to position t, for every sequence in the batch.",
                 diagnoses={"you looked up the token ids. A position table is indexed by the positions "
                            "0 .. T-1, whatever the tokens are.": F.embedding(ids, weights),
                            "your positions start at 1; the first token is position 0.":
                                F.embedding(torch.arange(1, 10), weights).expand(3, 9, d_model)})
    expect_close(_forward(module, 14), weights[:14], "the position embeddings for the length 14",
                 "For a length T return rows 0 .. T-1 of the table.")


def learned_is_trainable(cls):
    max_positions, d_model = 9, 5
    module = _build(cls, max_positions, d_model)
    table = table_of(module, max_positions, d_model)
    if not table.requires_grad:
        raise AssertionError(f"the ({max_positions}, {d_model}) table has requires_grad=False: a learned "
                             "position embedding must be trained with the model, so don't freeze it.")
    g = torch.Generator().manual_seed(1305)
    upstream = torch.randn(2, 4, d_model, generator=g)
    with quiet():
        module.zero_grad()
    (_forward(module, torch.zeros(2, 4, dtype=torch.long)) * upstream).sum().backward()
    # torch's autograd on the same lookup is the oracle for the gradient
    oracle_table = table.detach().clone().requires_grad_(True)
    (F.embedding(torch.arange(4), oracle_table).expand(2, 4, d_model) * upstream).sum().backward()
    if table.grad is None:
        raise AssertionError("no gradient reached the table: build the output from the table with torch "
                             "operations (no .detach(), no torch.no_grad(), no NumPy).")
    expect_close(table.grad, oracle_table.grad, "the gradient of the table",
                 "Only rows 0 .. T-1 are used, so only they get a gradient (summed over the batch): rows for "
                 "positions that no training sequence reaches are never updated.")


def _attempt(module, ids_or_length):
    """(result, None) or (None, exception): here raising is the right answer."""
    try:
        with quiet():
            return module(ids_or_length), None
    except NotImplementedError:
        raise
    except Exception as error:  # the check judges the exception itself
        return None, error


def learned_length_limit(cls):
    max_positions, d_model = 10, 4
    module = _build(cls, max_positions, d_model)
    for fits in (max_positions, torch.zeros(2, max_positions, dtype=torch.long)):
        result, error = _attempt(module, fits)
        what = "the length 10" if isinstance(fits, int) else "ids of shape (2, 10)"
        if error is not None:
            raise AssertionError(f"with max_positions=10, {what} raised {type(error).__name__}: {error}. "
                                 "A sequence of exactly max_positions tokens fits: positions 0 .. 9 all have rows. "
                                 "Reject T > max_positions, not T >= max_positions.")
        expect_shape(result, (10, 4) if isinstance(fits, int) else (2, 10, 4), f"the output for {what}")
    for too_long, length in [(11, 11), (torch.zeros(3, 13, dtype=torch.long), 13)]:
        what = f"the length {length}" if isinstance(too_long, int) else "ids of shape (3, 13)"
        result, error = _attempt(module, too_long)
        if error is None:
            raise AssertionError(
                f"with max_positions=10, {what} returned a result of shape {tuple(getattr(result, 'shape', ()))} "
                "instead of raising. The table has no row for those positions; slicing it (weight[:T]) "
                "silently gives too few rows. Check the length and raise a ValueError.")
        if not isinstance(error, ValueError):
            raise AssertionError(
                f"with max_positions=10, {what} raised {type(error).__name__}: {error}. That is the "
                "unhelpful error from deep inside torch. Check the length yourself first and raise a "
                "ValueError that says the length and max_positions.")
        message = str(error)
        if str(length) not in message or str(max_positions) not in message:
            raise AssertionError(f"with max_positions=10, {what} raised ValueError({message!r}). Make it clear: "
                                 f"give the length you got ({length}) and the limit ({max_positions}).")
