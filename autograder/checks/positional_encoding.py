"""Hidden checks for 03_positional_encoding. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the inputs, call the student's code through `call`,
return what it produced as data) and a judge (in the grader: rebuild the inputs from the same seeds,
compute the oracle, compare, name the misconception). Layered as the course's tests are: shape
first, then values on sizes the visible tests never use (some drawn from the run's seeds), then
behaviour. The oracles are independent of the reference solution:
- `oracle_pe`: the formula of Vaswani et al. written pair by pair in NumPy float64, for any base
  and any (even negative) positions. It agrees with transformers' XLM/DistilBERT
  `create_sinusoidal_embeddings` to float32 precision; that import costs seconds, so the checks use
  the NumPy form (and forbid the library's version while the student's code runs).
- relative shifts are graded by the identity they must satisfy, PE[t + k] == PE[t] @ M, over many
  t, k, d and bases, with PE from `oracle_pe` (never from the student's exercise 1);
- rotary embeddings (`oracle_rope`): the rotation written pair by pair in NumPy float64, in Hugging
  Face's rotate_half layout (pairs i, i + d/2); it agrees with transformers' Llama `apply_rotary_pos_emb`
  to float32 precision (tests/test_oracles.py proves it; the notebook's visible test compares with the
  library itself while the student works, not under grading, where the import would cost 2 s). The
  relative-position and norm checks grade properties (scores unchanged when every position moves, lengths
  kept), not values;
- the learned table is compared with `torch.nn.functional.embedding` and with torch's autograd, on
  a table the check fills with seeded weights (the judge rebuilds them).
Where raising is the right answer (odd d_model, too long a sequence), the probe reports what was
raised, as data (`attempt`), and the judge decides.
"""
import importlib
import math
import sys

import numpy as np
import torch

from autograder.checks.common import attempt, call, probe, quiet


PE_NAME = "sinusoidal_positional_encoding"


SHIFT_NAME = "relative_shift_matrix"


LEARNED_NAME = "LearnedPositionalEmbedding"


LIBRARY_SHORTCUTS = ["transformers.models.xlm.modeling_xlm.create_sinusoidal_embeddings",
                     "transformers.models.distilbert.modeling_distilbert.create_sinusoidal_embeddings",
                     "transformers.models.distilbert.modeling_distilbert._create_sinusoidal_embeddings"]


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


# ---------------------------------------------------------------- exercise 1: sinusoidal_positional_encoding
def library_shortcuts(complete=False):
    """The library versions of the formula, forbidden only if already imported: patching one would
    import transformers' model code, seconds of work, for every student who never touched it
    (`complete`: all of them, for the grader's reading of the source)."""
    return [target for target in LIBRARY_SHORTCUTS if complete or target.rsplit(".", 1)[0] in sys.modules]


LIBRARY_ADVICE = "write the formula yourself: transformers' implementation is the oracle here, not the answer."


def _pe(fn, num_positions, d_model, **kwargs):
    result = call(fn, num_positions, d_model, name=PE_NAME, forbidden=library_shortcuts(),
                  forbidden_advice=LIBRARY_ADVICE, **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{PE_NAME} should return a torch tensor, but it returned "
                             f"{type(result).__name__}. Convert with torch.from_numpy(...).float() "
                             "or compute with torch from the start.")
    return result


SHAPE_CASES = [(7, 10), (50, 4), (1, 2), (3, 16)]


@probe
def sinusoidal_shape(seeds, fn):
    return [_pe(fn, num_positions, d_model) for num_positions, d_model in SHAPE_CASES]


def value_cases(seeds):
    """Fixed sizes, and one drawn for this run. float32 answers: positions up to a few hundred keep the
    angle error under 1e-4."""
    rng = seeds.random(301)
    return [(37, 12), (20, 64), (6, 6), (300, 16), (rng.randint(2, 300), 2 * rng.randint(1, 32))]


@probe
def sinusoidal_values(seeds, fn):
    return [_pe(fn, num_positions, d_model) for num_positions, d_model in value_cases(seeds)]


def base_cases(seeds):
    """Fixed bases, and one drawn for this run (log-uniform between 2 and 10⁶)."""
    rng = seeds.random(302)
    drawn_base = float(f"{math.exp(rng.uniform(math.log(2.0), math.log(1e6))):.4g}")
    return [(30, 8, 100.0), (12, 6, 2.5), (9, 10, 1e6), (rng.randint(2, 60), 2 * rng.randint(1, 16), drawn_base)]


@probe
def sinusoidal_base(seeds, fn):
    return [_pe(fn, num_positions, d_model, base=base) for num_positions, d_model, base in base_cases(seeds)]


ODD_CASES = [(4, 7), (10, 1)]


@probe
def sinusoidal_odd_d_model(seeds, fn):
    return [attempt(fn, num_positions, d_model, name=PE_NAME, forbidden=library_shortcuts(),
                    forbidden_advice=LIBRARY_ADVICE) for num_positions, d_model in ODD_CASES]


# ---------------------------------------------------------------- exercise 2: relative_shift_matrix
def _shift(fn, k, d_model, **kwargs):
    result = call(fn, k, d_model, name=SHIFT_NAME,
                  helpers={"sinusoidal_positional_encoding": reference_sinusoidal_positional_encoding},
                  **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{SHIFT_NAME} should return a torch tensor, but it returned {type(result).__name__}.")
    return result


SHIFT_SHAPE_CASES = [(3, 6), (-2, 16), (0, 2), (40, 10)]


@probe
def relative_shift_shape(seeds, fn):
    return [_shift(fn, k, d_model) for k, d_model in SHIFT_SHAPE_CASES]


def shift_cases(seeds):
    """Fixed (k, d_model, base), and one drawn for this run."""
    rng = seeds.random(303)
    drawn_base = float(f"{math.exp(rng.uniform(math.log(10.0), math.log(1e5))):.4g}")
    return [(5, 6, 10000.0), (-3, 16, 10000.0), (17, 32, 10000.0), (250, 8, 10000.0), (4, 10, 50.0),
            (rng.randint(-250, 250), 2 * rng.randint(1, 16), drawn_base)]


def _shift_kwargs(base):
    return {} if base == 10000.0 else {"base": base}


@probe
def relative_shift_moves_positions(seeds, fn):
    return [_shift(fn, k, d_model, **_shift_kwargs(base)) for k, d_model, base in shift_cases(seeds)]


ROTATION_SHIFTS = (7, 0, -7, 4, 9, 13)


@probe
def relative_shift_is_rotation(seeds, fn):
    return {k: _shift(fn, k, 12) for k in ROTATION_SHIFTS}


# ---------------------------------------------------------------- exercise 3: LearnedPositionalEmbedding
def _build(cls, max_positions, d_model):
    module = call(cls, max_positions, d_model, name=LEARNED_NAME)
    if not isinstance(module, torch.nn.Module):
        raise AssertionError(f"{LEARNED_NAME}(...) should build a torch.nn.Module, got {type(module).__name__}.")
    return module


def _forward(module, ids_or_length):
    result = call(module, ids_or_length, name=f"{LEARNED_NAME}.forward")
    if not torch.is_tensor(result):
        raise AssertionError(f"{LEARNED_NAME}.forward should return a torch tensor, but it returned "
                             f"{type(result).__name__}.")
    return result


def table_of(module, max_positions, d_model):
    """Probe side: the module's one learnable (max_positions, d_model) table, or a message saying what is
    wrong (a structural failure: the check cannot load its weights)."""
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


LEARNED_SHAPE_IDS = [(3, 5), (1, 12), (4, 1)]


LEARNED_SHAPE_LENGTHS = (7, 12, 1)


@probe
def learned_shapes(seeds, cls):
    module = _build(cls, 12, 6)
    g = seeds.generator(1303)
    by_ids = [_forward(module, torch.randint(0, 100, shape, generator=g)) for shape in LEARNED_SHAPE_IDS]
    return by_ids, [_forward(module, length) for length in LEARNED_SHAPE_LENGTHS]


def learned_values_problem(seeds, max_positions=20, d_model=6):
    """The table's weights (the check loads them into the student's module) and some (3, 9) token ids."""
    g = seeds.generator(1304)
    weights = torch.randn(max_positions, d_model, generator=g)
    return weights, torch.randint(0, max_positions, (3, 9), generator=g)


@probe
def learned_values(seeds, cls):
    max_positions, d_model = 20, 6
    module = _build(cls, max_positions, d_model)
    table = table_of(module, max_positions, d_model)
    weights, ids = learned_values_problem(seeds, max_positions, d_model)
    with torch.no_grad():
        table.copy_(weights)
    return _forward(module, ids), _forward(module, 14)


TRAINABLE_SIZE = (9, 5)  # max_positions, d_model


def _upstream(seeds):
    return torch.randn(2, 4, TRAINABLE_SIZE[1], generator=seeds.generator(1305))


@probe
def learned_is_trainable(seeds, cls):
    max_positions, d_model = TRAINABLE_SIZE
    module = _build(cls, max_positions, d_model)
    table = table_of(module, max_positions, d_model)
    if not table.requires_grad:
        raise AssertionError(f"the ({max_positions}, {d_model}) table has requires_grad=False: a learned "
                             "position embedding must be trained with the model, so don't freeze it.")
    with quiet():
        module.zero_grad()
    (_forward(module, torch.zeros(2, 4, dtype=torch.long)) * _upstream(seeds)).sum().backward()
    return table.grad  # None when no gradient reached the table


LIMIT = 10       # max_positions of the length checks; d_model is 4


FITS = [("the length 10", lambda: LIMIT, (10, 4)),
        ("ids of shape (2, 10)", lambda: torch.zeros(2, LIMIT, dtype=torch.long), (2, 10, 4))]


TOO_LONG = [("the length 11", lambda: 11, 11),
            ("ids of shape (3, 13)", lambda: torch.zeros(3, 13, dtype=torch.long), 13)]


@probe
def learned_length_limit(seeds, cls):
    module = _build(cls, LIMIT, 4)
    name = f"{LEARNED_NAME}.forward"
    return ([attempt(module, make(), name=name) for _, make, _ in FITS],
            [attempt(module, make(), name=name) for _, make, _ in TOO_LONG])


# ---------------------------------------------------------------- exercise 3: apply_rope
ROPE_NAME = "apply_rope"


# transformers' models whose code carries a rotary implementation (a copy of Llama's or GPT-J's)
ROPE_MODELS = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt_neox", "olmo",
               "cohere", "gptj", "codegen"]


# Importing one of them while the student's function runs is taken too (the watch sees only modules imported
# before the call, and the notebook does not import them while it is graded: seconds for every student).
ROPE_MODULES = tuple(f"transformers.models.{model}.modeling_{model}" for model in ROPE_MODELS)


ROPE_FUNCTIONS = ["apply_rotary_pos_emb", "rotate_half", "rotate_every_two", "apply_rotary_pos_emb_interleave"]


ROPE_ADVICE = "write the rotation yourself: transformers' rotary code is the oracle here, not the answer."


def rope_shortcuts(complete=False):
    """transformers' rotary functions, and the constructors of its rotary-embedding classes (their cos and
    sin tables), in every model module already imported (importing them here would cost seconds for
    students who never touched them; the notebook's comparison with Llama's runs only outside grading)."""
    targets = []
    for model in ROPE_MODELS:
        name = f"transformers.models.{model}.modeling_{model}"
        module = importlib.import_module(name) if complete else sys.modules.get(name)
        if module is None:
            continue
        targets += [f"{name}.{function}" for function in ROPE_FUNCTIONS if hasattr(module, function)]
        # the class's __init__ (a plain function); its forward is wrapped by torch.no_grad, whose wrapper
        # code every no_grad function shares, so watching the whole class would flag unrelated calls
        targets += [f"{name}.{attribute}.__init__" for attribute, value in vars(module).items()
                    if attribute.endswith("RotaryEmbedding") and isinstance(value, type)
                    and value.__module__ == name]
    return targets


def _rope(fn, q, k, positions=None, **kwargs):
    args = (q, k) if positions is None else (q, k, positions)
    result = call(fn, *args, name=ROPE_NAME, forbidden=rope_shortcuts(), forbidden_advice=ROPE_ADVICE,
                  forbidden_modules=ROPE_MODULES, **kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(map(torch.is_tensor, result))):
        raise AssertionError(f"{ROPE_NAME} should return the pair (q_rotated, k_rotated) of tensors, but it "
                             f"returned {type(result).__name__}{'' if not isinstance(result, (tuple, list)) else f' of length {len(result)}'}.")
    return tuple(result)


def rope_inputs(seeds, n, leading, T, d, dtype=torch.float64):
    g = seeds.generator(n)
    return (torch.randn(*leading, T, d, generator=g, dtype=dtype), torch.randn(*leading, T, d, generator=g, dtype=dtype))


def rope_shape_cases(seeds):
    """(leading dims, T, d, dtype, pass positions?)"""
    return [((), 3, 4, torch.float32, False), ((2,), 5, 6, torch.float64, True),
            ((1, 2), 4, 10, torch.float32, True), ((), 7, 2, torch.float64, False)]


@probe
def rope_shape(seeds, fn):
    results = []
    for n, (leading, T, d, dtype, with_positions) in enumerate(rope_shape_cases(seeds)):
        q, k = rope_inputs(seeds, 1400 + n, leading, T, d, dtype)
        positions = torch.arange(3, 3 + T) if with_positions else None
        results.append(_rope(fn, q, k, positions))
    return results


def rope_value_cases(seeds):
    """(leading dims, T, d, positions or None, base): fixed sizes and bases, positions (unsorted, in the
    thousands) and one base and d drawn for this run."""
    rng = seeds.numpy(1410)
    drawn_base = float(f"{math.exp(rng.uniform(math.log(100.0), math.log(1e6))):.4g}")
    return [((2, 3), 7, 8, None, 10000.0),
            ((), 9, 16, rng.integers(0, 5000, 9), 10000.0),
            ((4,), 5, 2, rng.integers(0, 5000, 5), 500.0),
            ((2, 1), 6, 2 * int(rng.integers(2, 17)), rng.integers(0, 5000, 6), drawn_base),
            ((3,), 11, 12, None, 123.0)]


@probe
def rope_values(seeds, fn):
    results = []
    for n, (leading, T, d, positions, base) in enumerate(rope_value_cases(seeds)):
        q, k = rope_inputs(seeds, 1420 + n, leading, T, d)
        results.append(_rope(fn, q, k, None if positions is None else torch.as_tensor(positions), base=base))
    return results


def rope_relative_problem(seeds):
    """One query and one key vector, repeated at T seeded positions, and a seeded shift of them all."""
    rng = seeds.numpy(1430)
    d, T = 2 * int(rng.integers(2, 17)), 24
    g = seeds.generator(1431)
    q, k = torch.randn(1, d, generator=g, dtype=torch.float64), torch.randn(1, d, generator=g, dtype=torch.float64)
    positions = rng.integers(0, 3000, T)
    return q.repeat(T, 1), k.repeat(T, 1), positions, int(rng.integers(1, 100_000))


@probe
def rope_relative_position(seeds, fn):
    q, k, positions, shift = rope_relative_problem(seeds)
    return (_rope(fn, q.clone(), k.clone(), torch.as_tensor(positions)),
            _rope(fn, q.clone(), k.clone(), torch.as_tensor(positions + shift)))


def rope_norm_problem(seeds):
    rng = seeds.numpy(1440)
    d, T = 2 * int(rng.integers(1, 33)), 8
    g = seeds.generator(1441)
    q, k = (torch.randn(2, 3, T, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, rng.integers(0, 100_000, T)


@probe
def rope_norm(seeds, fn):
    q, k, positions = rope_norm_problem(seeds)
    return _rope(fn, q, k, torch.as_tensor(positions))


# ---------------------------------------------------------------- exercise 5 (optional stretch): llama3_inv_freq
# Oracle: transformers' own llama3 initialisation (`ROPE_INIT_FUNCTIONS["llama3"]`, that is
# `modeling_rope_utils._compute_llama3_parameters`), called with a LlamaConfig in the grader only. It works in
# float32; float32 and float64 versions of the formula differ from it by up to 6e-6 relative (measured over
# 2000 random configurations with factors up to 32: the blend amplifies the rounding of gamma by up to
# `factor`), so values are compared to 5e-5 relative, with no absolute tolerance (the frequencies go down to 1e-8).
LLAMA3_NAME = "llama3_inv_freq"


LLAMA3_ADVICE = ("write the rescaling yourself: transformers' rope initialisation functions are the oracle here, "
                 "not the answer.")


ROPE_UTILS = "transformers.modeling_rope_utils"


def llama3_shortcuts(complete=False):
    """Every rope initialisation function of transformers (the llama3 one is the oracle), if the module is
    imported (`complete`: imported here; grading does not import transformers, so a student who never
    touched it pays nothing, and one whose function imports it while it runs is flagged by `call`)."""
    module = importlib.import_module(ROPE_UTILS) if complete else sys.modules.get(ROPE_UTILS)
    if module is None:
        return []
    return sorted({f"{ROPE_UTILS}.{fn.__name__}" for fn in module.ROPE_INIT_FUNCTIONS.values()
                   if getattr(module, fn.__name__, None) is fn})


def _llama3(fn, case):
    result = call(fn, *case, name=LLAMA3_NAME, forbidden=llama3_shortcuts(), forbidden_advice=LLAMA3_ADVICE,
                  forbidden_modules=(ROPE_UTILS,))
    if not torch.is_tensor(result):
        raise AssertionError(f"{LLAMA3_NAME} should return a torch tensor, but it returned {type(result).__name__}.")
    return result


def llama3_value_cases(seeds):
    """(head_dim, base, factor, low_freq_factor, high_freq_factor, original_max_position): fixed ones (one pair
    only; factors 4 to 32; bands at other places) and two drawn for this run."""
    rng = seeds.random(1450)
    cases = [(64, 10000.0, 4.0, 1.0, 4.0, 2048), (96, 1e6, 16.0, 2.0, 8.0, 4096), (2, 10000.0, 8.0, 1.0, 4.0, 8192),
             (128, 500000.0, 32.0, 1.0, 4.0, 8192)]
    for _ in range(2):
        low = round(rng.uniform(0.5, 2.0), 2)
        cases.append((2 * rng.randint(4, 80), float(f"{math.exp(rng.uniform(math.log(1e3), math.log(2e6))):.4g}"),
                      round(rng.uniform(1.5, 32.0), 2), low, round(low * rng.uniform(1.5, 8.0), 2),
                      rng.randint(256, 32768)))
    return cases


@probe
def stretch_llama3_inv_freq_values(seeds, fn):
    return [_llama3(fn, case) for case in llama3_value_cases(seeds)]


def llama3_band_masks(case):
    head_dim, base, factor, low, high, original = case
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelength = 2 * np.pi / theta
    return theta, wavelength < original / high, wavelength > original / low


def llama3_band_cases(seeds):
    """Configurations whose three bands all hold several pairs: two fixed, one drawn for this run."""
    rng = seeds.random(1460)
    cases = [(128, 500000.0, 16.0, 1.0, 4.0, 4096), (96, 20000.0, 6.0, 0.5, 4.0, 1024)]
    while len(cases) < 3:
        low = round(rng.uniform(0.5, 2.0), 2)
        case = (2 * rng.randint(40, 90), float(f"{math.exp(rng.uniform(math.log(1e4), math.log(1e6))):.4g}"),
                round(rng.uniform(2.0, 40.0), 2), low, round(low * rng.uniform(3.0, 8.0), 2), rng.randint(256, 16384))
        _, high_band, low_band = llama3_band_masks(case)
        if min(high_band.sum(), low_band.sum(), (~high_band & ~low_band).sum()) >= 3:
            cases.append(case)
    return cases


@probe
def stretch_llama3_inv_freq_bands(seeds, fn):
    return [_llama3(fn, case) for case in llama3_band_cases(seeds)]
