"""Hidden checks for 05_multi_head_attention. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded inputs, load the check's own seeded
weights into the student's module by the sub-module names the exercise asks for, call the student's
code through `call`, return what it produced as data) and a judge (in the grader: rebuild the same
inputs and weights from the same seeds, compute the oracle, compare, name the misconception).
Layered as the course's tests are: shape first, then values, then behaviour. The oracles:
- split/merge: `torch.chunk` + `torch.stack` and `torch.unbind` + `torch.cat` (no view/transpose);
- the module: `torch.nn.MultiheadAttention` (batch_first, need_weights, average_attn_weights=False)
  holding the same weights, in float64 so that rounding never fails a correct answer;
- the parameter count: `torch.nn.MultiheadAttention(...).parameters()` built on the meta device;
- grouped-query attention (the optional stretch): `F.scaled_dot_product_attention(..., enable_gqa=True)`
  for the outputs, and the same kernel run over identity values for the weights.
Each exercise is graded on its own: `MultiHeadAttention` runs with the course's reference
`split_heads`, `merge_heads` and `scaled_dot_product_attention` swapped in, `copy_from_torch` loads
into the course's reference module, and `mha_num_parameters` sees the reference module. The course's
reference of the exercise itself (courselib.attention) is forbidden while the student's code runs.
Where raising is the right answer (heads that don't divide d_model), the probe reports what was
raised, as data, and the judge decides.
"""
import functools
import math
import numbers

import torch
from torch import nn

from autograder.checks.common import attempt, call, expect_shape, probe
from courselib import attention as reference


DTYPE = torch.float64


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


REFERENCE_HELPERS = {"split_heads": reference.split_heads, "merge_heads": reference.merge_heads,
                     "scaled_dot_product_attention": reference.scaled_dot_product_attention}


OWN_WORK = "the exercise asks you to write it yourself; the course's version is the reference here, not the answer."


SPLIT_SHORTCUTS = ["courselib.attention.split_heads"]


MERGE_SHORTCUTS = ["courselib.attention.merge_heads"]


MHA_SHORTCUTS = ["courselib.attention.MultiHeadAttention"]


TORCH_MHA = ["torch.nn.MultiheadAttention.forward", "torch.nn.functional.multi_head_attention_forward"] + MHA_SHORTCUTS


TORCH_MHA_ADVICE = ("torch.nn.MultiheadAttention is the oracle the tests compare with and the course's "
                    "MultiHeadAttention the reference; build the heads from q_proj, k_proj, v_proj and out_proj "
                    "yourself.")


NOT_CONTIGUOUS_ADVICE = ("After a transpose the tensor is no longer contiguous in memory, so .view() "
                         "cannot merge its dimensions: use .reshape(...) (or .contiguous().view(...)).")


# ---------------------------------------------------------------- shared helpers
def _tensor(result, name):
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return a torch tensor, but it returned {type(result).__name__}.")
    return result


# ---------------------------------------------------------------- exercise 1: split_heads
def _split(fn, x, num_heads):
    return _tensor(call(fn, x, num_heads, name="split_heads", forbidden=SPLIT_SHORTCUTS,
                        forbidden_advice=OWN_WORK), "split_heads")


SPLIT_SHAPE_CASES = [(3, 5, 12, 4), (2, 7, 6, 1), (1, 4, 6, 6), (2, 3, 20, 5)]  # B, T, d_model, h


def _random_inputs(g, cases):
    return [torch.randn(B, T, d, generator=g) for B, T, d, _ in cases]


@probe
def split_heads_shape(seeds, fn):
    xs = _random_inputs(seeds.generator(5101), SPLIT_SHAPE_CASES)
    return [_split(fn, x, h) for x, (_, _, _, h) in zip(xs, SPLIT_SHAPE_CASES)]


SPLIT_VALUE_CASES = [(3, 5, 12, 4), (2, 6, 12, 3), (2, 4, 10, 5)]


@probe
def split_heads_values(seeds, fn):
    xs = _random_inputs(seeds.generator(5102), SPLIT_VALUE_CASES)
    return [_split(fn, x, h) for x, (_, _, _, h) in zip(xs, SPLIT_VALUE_CASES)]


INDIVISIBLE = [(10, 4), (12, 5), (9, 2)]  # d_model, num_heads


@probe
def split_heads_checks_divisibility(seeds, fn):
    g = seeds.generator(5103)
    return [attempt(fn, torch.randn(2, 3, d, generator=g), h, name="split_heads", forbidden=SPLIT_SHORTCUTS,
                    forbidden_advice=OWN_WORK) for d, h in INDIVISIBLE]


# ---------------------------------------------------------------- exercise 2: merge_heads
def _merge(fn, heads):
    try:
        result = call(fn, heads, name="merge_heads", forbidden=MERGE_SHORTCUTS, forbidden_advice=OWN_WORK)
    except AssertionError as error:
        if "view size is not compatible" in str(error):
            raise AssertionError(f"{error}\n{NOT_CONTIGUOUS_ADVICE}") from None
        raise
    return _tensor(result, "merge_heads")


MERGE_SHAPE_CASES = [(3, 4, 5, 3), (2, 1, 7, 6), (1, 6, 2, 2), (2, 3, 4, 5)]  # B, h, T, d_head


@probe
def merge_heads_shape(seeds, fn):
    g = seeds.generator(5201)
    results = []
    for B, h, T, d_head in MERGE_SHAPE_CASES:
        # Contiguous in (B, h, T, d_head) order, as attention's output is: after a transpose, .view fails.
        heads = torch.randn(B, h, T, d_head, generator=g)
        split_output = reference.split_heads(torch.randn(B, T, h * d_head, generator=g), h)
        results.append((_merge(fn, heads), _merge(fn, split_output)))
    return results


MERGE_VALUE_CASES = [(3, 5, 12, 4), (2, 6, 12, 3), (2, 4, 10, 5), (1, 3, 8, 1)]  # B, T, d_model, h


def merge_problem(seeds):
    g = seeds.generator(5202)
    xs = _random_inputs(g, MERGE_VALUE_CASES)
    return xs, torch.randn(2, 3, 4, 5, generator=g)


@probe
def merge_heads_inverts_split(seeds, fn):
    xs, contiguous = merge_problem(seeds)
    return ([_merge(fn, reference.split_heads(x, h)) for x, (_, _, _, h) in zip(xs, MERGE_VALUE_CASES)],
            _merge(fn, contiguous))


# ---------------------------------------------------------------- exercise 3: MultiHeadAttention
def _build(cls, d_model, num_heads, bias=True):
    """Probe side: the student's module, checked for the contract's sub-modules, in float64."""
    label = f"MultiHeadAttention({d_model}, {num_heads}, bias={bias})"
    module = call(cls, d_model, num_heads, bias=bias, name=label, forbidden=MHA_SHORTCUTS, forbidden_advice=OWN_WORK)
    if not isinstance(module, nn.Module):
        raise AssertionError(f"{label} should build an nn.Module, but it is a {type(module).__name__}.")
    for name in PROJECTIONS:
        sub = getattr(module, name, None)
        if not isinstance(sub, nn.Linear):
            raise AssertionError(f"{label} needs a sub-module `{name}`, an nn.Linear(d_model, d_model); "
                                 f"found {type(sub).__name__}. The tests load weights through these four names.")
        expect_shape(sub.weight, (d_model, d_model), f"{label}.{name}.weight",
                     "Each projection maps d_model to d_model: the h heads' d_head-wide projections side by side.")
        if bias and sub.bias is None:
            raise AssertionError(f"{label}.{name} has no bias: pass bias=bias to nn.Linear.")
        if not bias and sub.bias is not None:
            raise AssertionError(f"{label}.{name} has a bias although bias=False: pass bias=bias to nn.Linear.")
    return module.to(DTYPE)


def projection_weights(g, d_model, bias=True):
    """The weights the check chooses, {name: (weight, bias or None)}: the probe loads them into the
    student's module, the judge into torch's. torch starts biases at 0: random ones make them matter."""
    weights = {}
    for name in PROJECTIONS:
        weight = torch.randn(d_model, d_model, generator=g, dtype=DTYPE) * 1.5 / math.sqrt(d_model)
        weights[name] = (weight, torch.randn(d_model, generator=g, dtype=DTYPE) * 0.5 if bias else None)
    return weights


def _load(module, weights):
    with torch.no_grad():
        for name, (weight, bias) in weights.items():
            linear = getattr(module, name)
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)
    return module


def _forward(module, *args, mask=None):
    kwargs = {} if mask is None else {"mask": mask}
    with torch.no_grad():
        result = call(module.forward, *args, name="MultiHeadAttention.forward", helpers=REFERENCE_HELPERS,
                      forbidden=TORCH_MHA, forbidden_advice=TORCH_MHA_ADVICE, **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("MultiHeadAttention.forward must return the pair (output, weights), "
                             f"but it returned {type(result).__name__}.")
    return tuple(_tensor(r, "MultiHeadAttention.forward") for r in result)


def _inputs(g, B, T, d_model):
    return torch.randn(B, T, d_model, generator=g, dtype=DTYPE)


MODULE_CASES = [(12, 3, True), (12, 3, False), (20, 5, True)]  # d_model, num_heads, bias


INDIVISIBLE_MODULES = [(10, 4), (18, 4)]


@probe
def mha_modules(seeds, cls):
    counts = [sum(p.numel() for p in _build(cls, d_model, num_heads, bias).parameters())
              for d_model, num_heads, bias in MODULE_CASES]
    return counts, [attempt(cls, d, h, name="MultiHeadAttention", forbidden=MHA_SHORTCUTS, forbidden_advice=OWN_WORK)
                    for d, h in INDIVISIBLE_MODULES]


SHAPE_CASES = [(5301, (3, 5, 12, 3)), (5302, (2, 4, 8, 1)), (5303, (1, 3, 6, 6))]  # seed, (B, T, d_model, h)


@probe
def mha_shapes(seeds, cls):
    self_attention = []
    for seed, (B, T, d_model, num_heads) in SHAPE_CASES:
        module = _load(_build(cls, d_model, num_heads), projection_weights(seeds.generator(seed), d_model))
        self_attention.append(_forward(module, _inputs(seeds.generator(seed + 50), B, T, d_model)))
    module = _load(_build(cls, 12, 4), projection_weights(seeds.generator(5304), 12))
    memory = _inputs(seeds.generator(5306), 2, 7, 12)
    return self_attention, _forward(module, _inputs(seeds.generator(5305), 2, 3, 12), memory, memory)


VALUE_CASES = [(5401, (2, 5, 12, 3, True)), (5402, (3, 4, 8, 2, False)), (5403, (1, 6, 16, 4, True))]


@probe
def mha_values(seeds, cls):
    results = []
    for seed, (B, T, d_model, num_heads, bias) in VALUE_CASES:
        module = _load(_build(cls, d_model, num_heads, bias), projection_weights(seeds.generator(seed), d_model, bias))
        results.append(_forward(module, _inputs(seeds.generator(seed + 50), B, T, d_model)))
    return results


def cross_problem(seeds):
    """(query, key, value) and the order that shuffles the key/value tokens."""
    query, key, value = (_inputs(seeds.generator(seed), 2, t, 12) for seed, t in [(5502, 4), (5503, 6), (5504, 6)])
    return (query, key, value), torch.randperm(6, generator=seeds.generator(5505))


@probe
def mha_cross_attention(seeds, cls):
    module = _load(_build(cls, 12, 3), projection_weights(seeds.generator(5501), 12))
    (query, key, value), order = cross_problem(seeds)
    return _forward(module, query, key, value), _forward(module, query, key[:, order], value[:, order])


MASK_SIZE = (2, 5, 12, 3)  # B, T, d_model, h


def mask_cases(seeds):
    B, T, _, _ = MASK_SIZE
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * T, [True] * 3 + [False] * (T - 3)])[:, None, None, :]  # (B, 1, 1, T)
    per_query = torch.rand(B, 1, T, T, generator=seeds.generator(5603)) > 0.5
    per_query[..., 0] = True  # every query may attend somewhere
    return [("a causal (T, T) mask", causal), ("a (B, 1, 1, T) padding mask", padding),
            ("a (B, 1, T, T) mask", per_query)]


@probe
def mha_mask(seeds, cls):
    B, T, d_model, num_heads = MASK_SIZE
    module = _load(_build(cls, d_model, num_heads), projection_weights(seeds.generator(5601), d_model))
    x = _inputs(seeds.generator(5602), B, T, d_model)
    return [_forward(module, x, mask=mask) for _, mask in mask_cases(seeds)]


# ---------------------------------------------------------------- exercise 4: copy_from_torch
def _torch_module(g, d_model, num_heads, bias=True):
    torch_mha = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        for parameter in torch_mha.parameters():  # torch's biases start at 0; random ones make them matter
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=DTYPE) / math.sqrt(d_model) * 1.5)
    return torch_mha


def _reference_module(g, d_model, num_heads, bias=True):
    """The course's module, with weights the check chooses (so that the judge can rebuild it)."""
    module = reference.MultiHeadAttention(d_model, num_heads, bias=bias).to(DTYPE)
    return _load(module, projection_weights(g, d_model, bias))


def _copy(fn, module, torch_mha):
    before = {name: p.detach().clone() for name, p in torch_mha.named_parameters()}
    try:
        # A partial, so that a failure message names the call instead of printing both modules.
        call(functools.partial(fn, module, torch_mha), name="copy_from_torch")
    except AssertionError as error:
        if "leaf Variable" in str(error):
            raise AssertionError(f"{error}\nCopy into parameters inside `with torch.no_grad():`, so that "
                                 "autograd doesn't record the copy.") from None
        raise
    for name, parameter in torch_mha.named_parameters():
        if not torch.equal(parameter.detach(), before[name]):
            raise AssertionError(f"copy_from_torch changed torch_mha.{name}: copy from torch_mha into mha, "
                                 "not the other way round.")


COPY_CASES = [(5701, (12, 3)), (5702, (8, 4))]  # seed, (d_model, num_heads)


def copy_problem(seeds, seed, d_model, num_heads):
    """torch's module (seed), the course's module to load into (seed + 10), and query, key, value."""
    torch_mha = _torch_module(seeds.generator(seed), d_model, num_heads)
    module = _reference_module(seeds.generator(seed + 10), d_model, num_heads)
    inputs = [_inputs(seeds.generator(seed + k), 2, t, d_model) for k, t in [(20, 4), (21, 6), (22, 6)]]
    return torch_mha, module, inputs


@probe
def copy_from_torch_values(seeds, fn):
    results = []
    for seed, (d_model, num_heads) in COPY_CASES:
        torch_mha, module, (query, key, value) = copy_problem(seeds, seed, d_model, num_heads)
        _copy(fn, module, torch_mha)
        with torch.no_grad():  # the course's module, run on what the student loaded into it
            results.append(module(query, key, value))
    return results


def no_bias_problem(seeds):
    d_model, num_heads = 12, 4
    return (_torch_module(seeds.generator(5801), d_model, num_heads, bias=False),
            _reference_module(seeds.generator(5802), d_model, num_heads, bias=False),
            _inputs(seeds.generator(5803), 2, 5, d_model))


@probe
def copy_from_torch_without_bias(seeds, fn):
    torch_mha, module, x = no_bias_problem(seeds)
    try:
        _copy(fn, module, torch_mha)
    except AssertionError as error:
        raise AssertionError(f"{error}\nWith bias=False, torch_mha.in_proj_bias and out_proj.bias are None and "
                             "mha's projections have no bias: copy biases only when they exist.") from None
    with torch.no_grad():
        return module(x)[0]


# ---------------------------------------------------------------- exercise 5: mha_num_parameters
COUNT_HELPERS = {"MultiHeadAttention": reference.MultiHeadAttention}


def _count(fn, d_model, num_heads, bias):
    result = call(fn, d_model, num_heads, bias=bias, name="mha_num_parameters", helpers=COUNT_HELPERS)
    if isinstance(result, bool) or not (isinstance(result, numbers.Real) or torch.is_tensor(result)):
        raise AssertionError(f"mha_num_parameters should return an int, but it returned {type(result).__name__}.")
    return float(result)


COUNT_CASES = [(48, 6), (30, 5), (7, 7), (100, 1), (1024, 16)]


COUNT_CASES_WITHOUT_BIAS = [(48, 6), (30, 5), (7, 7), (1024, 16)]


@probe
def mha_num_parameters_counts(seeds, fn):
    return ([_count(fn, d, h, True) for d, h in COUNT_CASES],
            attempt(fn, 10, 4, name="mha_num_parameters", helpers=COUNT_HELPERS))


@probe
def mha_num_parameters_bias(seeds, fn):
    return [_count(fn, d, h, False) for d, h in COUNT_CASES_WITHOUT_BIAS]


# ---------------------------------------------------------------- exercise 6 (optional stretch): grouped_query_attention
GQA_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention.forward",
                 "torch.nn.functional.multi_head_attention_forward",
                 "courselib.attention.scaled_dot_product_attention", "courselib.attention.masked_softmax",
                 "courselib.attention.MultiHeadAttention"]


GQA_ADVICE = ("write the scores and the softmax yourself (torch.softmax is fine): torch's "
              "scaled_dot_product_attention is the oracle the tests compare with, and the course's attention "
              "functions are references, not answers.")


def _gqa(fn, q, k, v, mask=None):
    """Probe side: the student's (output, weights), as tensors."""
    with torch.no_grad():
        result = call(fn, q, k, v, mask=mask, name="grouped_query_attention", forbidden=GQA_SHORTCUTS,
                      forbidden_advice=GQA_ADVICE)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("grouped_query_attention must return the pair (output, weights), "
                             f"but it returned {type(result).__name__}.")
    return tuple(_tensor(r, "grouped_query_attention") for r in result)


def gqa_inputs(g, B, h, h_kv, T, S, d_head):
    """q (B, h, T, d_head), k and v (B, h_kv, S, d_head) in float64; q and k × 1.5 so that the scale matters."""
    q = torch.randn(B, h, T, d_head, generator=g, dtype=DTYPE) * 1.5
    k = torch.randn(B, h_kv, S, d_head, generator=g, dtype=DTYPE) * 1.5
    return q, k, torch.randn(B, h_kv, S, d_head, generator=g, dtype=DTYPE)


# seed, (B, h, h_kv, T, S, d_head): multi-query, groups of 3, multi-head, groups of 4 with one query (decoding)
GQA_CASES = [(5901, (2, 4, 1, 3, 5, 4)), (5902, (2, 6, 2, 4, 4, 3)), (5903, (1, 4, 4, 3, 6, 5)),
             (5904, (3, 8, 2, 1, 7, 4))]


GQA_MASKED = (2, 6, 3, 4, 5, 3)  # B, h, h_kv, T, S, d_head: groups of 2


def gqa_masks(seeds):
    """A (T, S) mask, a (B, 1, 1, S) padding mask and a (B, h, T, S) mask that differs per query head. Every
    query may attend somewhere (torch's kernel gives NaN for a row with nothing to attend to)."""
    B, h, _, T, S, _ = GQA_MASKED
    g = seeds.generator(5906)
    per_pair = torch.rand(T, S, generator=g) > 0.5
    per_head = torch.rand(B, h, T, S, generator=g) > 0.5
    for mask in (per_pair, per_head):
        mask[..., torch.randint(S, (), generator=g)] = True
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
    padding[1, ..., S - 2:] = False  # the second sequence's last two keys are padding
    return [("a (T, S) mask", per_pair), ("a (B, 1, 1, S) padding mask", padding),
            ("a (B, h, T, S) mask, different for each query head", per_head)]


def gqa_values_problem(seeds):
    """[(description, (B, h, h_kv, T, S, d_head), q, k, v, mask)] for the unmasked cases, then the masked ones."""
    problems = []
    for seed, size in GQA_CASES:
        problems.append(("no mask", size, *gqa_inputs(seeds.generator(seed), *size), None))
    q, k, v = gqa_inputs(seeds.generator(5905), *GQA_MASKED)
    problems += [(description, GQA_MASKED, q, k, v, mask) for description, mask in gqa_masks(seeds)]
    return problems


@probe
def stretch_gqa_values(seeds, fn):
    return [_gqa(fn, q, k, v, mask) for _, _, q, k, v, mask in gqa_values_problem(seeds)]


GQA_SHARING = [(5911, (6, 3)), (5912, (8, 2))]  # seed, (h, h_kv)


GQA_INDIVISIBLE = [(6, 4), (5, 2), (4, 3)]       # h, h_kv


def gqa_sharing_problem(seed, seeds, h, h_kv):
    """K/V heads that can be told apart: K/V head j's keys point every query at its own key position, and its
    values are all its own label (seeded), so the weights' argmax and the output say which K/V head a query
    head read."""
    g = seeds.generator(seed)
    S, d_head = h_kv + 3, 4
    positions = torch.randperm(S, generator=g)[:h_kv]                       # K/V head j's key position
    labels = torch.randperm(10 * h_kv, generator=g)[:h_kv].to(DTYPE) + 1.0  # K/V head j's value label
    q = torch.ones(1, h, 2, d_head, dtype=DTYPE)
    k = torch.zeros(1, h_kv, S, d_head, dtype=DTYPE)
    k[0, torch.arange(h_kv), positions] = 8.0                                # score 16 there, 0 elsewhere
    v = labels.view(1, h_kv, 1, 1).expand(1, h_kv, S, d_head).clone()
    return q, k, v, positions, labels


@probe
def stretch_gqa_sharing(seeds, fn):
    reads = []
    for seed, (h, h_kv) in GQA_SHARING:
        q, k, v, _, _ = gqa_sharing_problem(seed, seeds, h, h_kv)
        reads.append(_gqa(fn, q, k, v))
    g = seeds.generator(5913)
    indivisible = [attempt(fn, torch.randn(1, h, 2, 4, generator=g), torch.randn(1, h_kv, 3, 4, generator=g),
                           torch.randn(1, h_kv, 3, 4, generator=g), name="grouped_query_attention",
                           forbidden=GQA_SHORTCUTS, forbidden_advice=GQA_ADVICE)
                   for h, h_kv in GQA_INDIVISIBLE]
    return reads, indivisible
