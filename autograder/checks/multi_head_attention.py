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
import itertools
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import attempt, call, expect_close, expect_shape, expect_tensor, probe, quiet
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


def expect_value_error(outcome, shown, advice, must_mention=()):
    """Judge side: `outcome` (from `attempt`) must be a ValueError (not a RuntimeError from view, not
    nothing) whose message gives the numbers in `must_mention`."""
    if outcome["value_error"]:
        message = outcome["message"]
        missing = [str(n) for n in must_mention if str(n) not in message]
        if not message.strip() or missing:
            raise AssertionError(f"{shown} raised ValueError({message!r}): make the message say what is wrong "
                                 "and give both numbers, e.g. f'd_model={d_model} is not divisible by "
                                 "num_heads={num_heads}'.")
        return
    if outcome["error"] is not None:
        raise AssertionError(f"{shown} raised {outcome['error']} ({outcome['message']}), not ValueError. {advice}")
    raise AssertionError(f"{shown} did not raise ValueError. {advice}")


def oracle_split(x, num_heads):
    """(B, T, d) -> (B, h, T, d/h) without view or transpose: head i is the i-th block of features."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def oracle_merge(heads):
    """(B, h, T, d_head) -> (B, T, h * d_head): the heads' features side by side, head 0 first."""
    return torch.cat(heads.unbind(dim=1), dim=-1)


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


@split_heads_shape.judge
def judge_split_heads_shape(seeds, results):
    for (B, T, d, h), result in zip(SPLIT_SHAPE_CASES, results):
        if tuple(expect_tensor(result, "split_heads").shape) == (B, T, h, d // h) and T != h:
            raise AssertionError(f"split_heads(x of shape {(B, T, d)}, {h}) has shape (B, T, h, d_head) = "
                                 f"{tuple(result.shape)}: after the view, swap the token and head dimensions "
                                 "with .transpose(1, 2) so that each head holds all T tokens.")
        expect_shape(result, (B, h, T, d // h), f"split_heads(x of shape {(B, T, d)}, num_heads={h})",
                     "Read B, T and d_model from x.shape and use d_head = d_model // num_heads: "
                     "no sizes from the visible example.")


SPLIT_VALUE_CASES = [(3, 5, 12, 4), (2, 6, 12, 3), (2, 4, 10, 5)]


@probe
def split_heads_values(seeds, fn):
    xs = _random_inputs(seeds.generator(5102), SPLIT_VALUE_CASES)
    return [_split(fn, x, h) for x, (_, _, _, h) in zip(xs, SPLIT_VALUE_CASES)]


@split_heads_values.judge
def judge_split_heads_values(seeds, results):
    xs = _random_inputs(seeds.generator(5102), SPLIT_VALUE_CASES)
    for x, (B, T, d, h), result in zip(xs, SPLIT_VALUE_CASES, results):
        d_head = d // h
        expect_close(result, oracle_split(x, h), f"split_heads(x of shape {(B, T, d)}, {h})",
                     "Head i must hold features i·d_head … (i+1)·d_head − 1 of every token: "
                     "x.view(B, T, h, d_head).transpose(1, 2).",
                     diagnoses={
                         "you viewed (B, T, d_model) straight as (B, h, T, d_head) without a transpose, "
                         "which mixes tokens into heads: view as (B, T, h, d_head), then .transpose(1, 2).":
                             x.reshape(B, h, T, d_head),
                         "your heads take every h-th feature (interleaved); each head must get a contiguous "
                         "block of d_head features: view as (B, T, h, d_head), not (B, T, d_head, h).":
                             x.reshape(B, T, d_head, h).permute(0, 3, 1, 2),
                     })


INDIVISIBLE = [(10, 4), (12, 5), (9, 2)]  # d_model, num_heads


@probe
def split_heads_checks_divisibility(seeds, fn):
    g = seeds.generator(5103)
    return [attempt(fn, torch.randn(2, 3, d, generator=g), h, name="split_heads", forbidden=SPLIT_SHORTCUTS,
                    forbidden_advice=OWN_WORK) for d, h in INDIVISIBLE]


@split_heads_checks_divisibility.judge
def judge_split_heads_checks_divisibility(seeds, outcomes):
    advice = ("Check d_model % num_heads yourself and raise ValueError with a message that gives both numbers: "
              "heads must split d_model into equal parts.")
    for (d, h), outcome in zip(INDIVISIBLE, outcomes):
        expect_value_error(outcome, f"split_heads(tensor of shape {(2, 3, d)}, {h})", advice, must_mention=(d, h))


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


@merge_heads_shape.judge
def judge_merge_heads_shape(seeds, results):
    for (B, h, T, d_head), (merged, merged_split) in zip(MERGE_SHAPE_CASES, results):
        expect_shape(merged, (B, T, h * d_head), f"merge_heads of a {(B, h, T, d_head)} tensor",
                     "Read B, h, T and d_head from x.shape; the result is (B, T, h·d_head).")
        expect_shape(merged_split, (B, T, h * d_head), "merge_heads of split_heads' output")


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


@merge_heads_inverts_split.judge
def judge_merge_heads_inverts_split(seeds, results):
    merged, merged_contiguous = results
    xs, contiguous = merge_problem(seeds)
    for x, (B, T, d, h), result in zip(xs, MERGE_VALUE_CASES, merged):
        heads = oracle_split(x, h)
        expect_close(result, x, f"merge_heads(split_heads(x, {h})) for x of shape {(B, T, d)}",
                     "merge_heads must undo split_heads exactly: transpose back to (B, T, h, d_head), then "
                     "reshape to (B, T, h·d_head).",
                     diagnoses={
                         "heads merged in the wrong order: your features interleave the heads. Feature j of "
                         "head i must land at position i·d_head + j (all of head 0, then all of head 1, …): "
                         "transpose to (B, T, h, d_head) before reshaping.":
                             heads.permute(0, 2, 3, 1).reshape(B, T, d),
                         "you reshaped (B, h, T, d_head) to (B, T, h·d_head) without transposing back, which "
                         "mixes tokens: .transpose(1, 2) first.":
                             heads.reshape(B, T, d),
                     })
    expect_close(merged_contiguous, oracle_merge(contiguous), "merge_heads of a contiguous (2, 3, 4, 5) tensor")


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


def _torch_twin(weights, num_heads):
    """Judge side: torch.nn.MultiheadAttention holding the check's weights: in_proj stacks W_Q, W_K, W_V."""
    d_model = weights["q_proj"][0].shape[0]
    bias = weights["q_proj"][1] is not None
    twin = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([weights[name][0] for name in ("q_proj", "k_proj", "v_proj")]))
        twin.out_proj.weight.copy_(weights["out_proj"][0])
        if bias:
            twin.in_proj_bias.copy_(torch.cat([weights[name][1] for name in ("q_proj", "k_proj", "v_proj")]))
            twin.out_proj.bias.copy_(weights["out_proj"][1])
    return twin


def _torch_attention(twin, query, key=None, value=None, mask=None):
    """(output, weights per head) from torch. Our mask: True = may attend; torch's bool mask: True = blocked."""
    key = query if key is None else key
    value = key if value is None else value
    attn_mask = None
    if mask is not None:
        B, T_q, T_k, h = query.shape[0], query.shape[1], key.shape[1], twin.num_heads
        attn_mask = ~mask.expand(B, h, T_q, T_k).reshape(B * h, T_q, T_k)  # torch orders (batch, head)
    with torch.no_grad(), quiet():
        return twin(query, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)


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


def _mha_misconceptions(twin, num_heads, query, key, value):
    """Weights and outputs that known bugs would produce, computed with torch ops from the same weights."""
    d = query.shape[-1]
    B, T_q, T_k, d_head = query.shape[0], query.shape[1], key.shape[1], d // num_heads
    W = twin.in_proj_weight
    b = twin.in_proj_bias if twin.in_proj_bias is not None else torch.zeros(3 * d, dtype=DTYPE)
    q, k, v = (F.linear(t, W[i * d:(i + 1) * d], b[i * d:(i + 1) * d]) for i, t in enumerate((query, key, value)))

    def attend(q_heads, k_heads, v_heads, scale):
        weights = torch.softmax(q_heads @ k_heads.transpose(-2, -1) * scale, dim=-1)
        return weights @ v_heads, weights

    def out(merged):
        return twin.out_proj(merged)

    with torch.no_grad():
        right_o, right_w = attend(oracle_split(q, num_heads), oracle_split(k, num_heads),
                                  oracle_split(v, num_heads), 1 / math.sqrt(d_head))
        mixed = [t.reshape(B, num_heads, t.shape[1], d_head) for t in (q, k, v)]
        mixed_o, mixed_w = attend(*mixed, 1 / math.sqrt(d_head))
        weights = {
            "your weights are scaled by √d_model; each head's scores must be divided by √d_head, the width "
            "of its own queries and keys (d_head = d_model / num_heads).":
                attend(oracle_split(q, num_heads), oracle_split(k, num_heads), oracle_split(v, num_heads),
                       1 / math.sqrt(d))[1],
            "your weights have no 1/√d_head scaling.":
                attend(oracle_split(q, num_heads), oracle_split(k, num_heads), oracle_split(v, num_heads), 1.0)[1],
            "you split the projections with a view to (B, h, T, d_head) without a transpose, which mixes tokens "
            "into heads: view as (B, T, h, d_head), then .transpose(1, 2).": mixed_w,
        }
        outputs = {
            "the output skips out_proj (W_O): after merging the heads, apply self.out_proj.":
                oracle_merge(right_o),
            "heads merged in the wrong order (your features interleave the heads): transpose to "
            "(B, T_q, h, d_head) before reshaping to (B, T_q, d_model).":
                out(right_o.permute(0, 2, 3, 1).reshape(B, T_q, d)),
            "you split the projections with a view to (B, h, T, d_head) without a transpose, which mixes "
            "tokens into heads.": out(mixed_o.reshape(B, T_q, d)),
        }
    return weights, outputs


MODULE_CASES = [(12, 3, True), (12, 3, False), (20, 5, True)]  # d_model, num_heads, bias
INDIVISIBLE_MODULES = [(10, 4), (18, 4)]


@probe
def mha_modules(seeds, cls):
    counts = [sum(p.numel() for p in _build(cls, d_model, num_heads, bias).parameters())
              for d_model, num_heads, bias in MODULE_CASES]
    return counts, [attempt(cls, d, h, name="MultiHeadAttention", forbidden=MHA_SHORTCUTS, forbidden_advice=OWN_WORK)
                    for d, h in INDIVISIBLE_MODULES]


@mha_modules.judge
def judge_mha_modules(seeds, data):
    counts, outcomes = data
    for (d_model, num_heads, bias), found in zip(MODULE_CASES, counts):
        expected = _torch_count(d_model, num_heads, bias)
        if found != expected:
            raise AssertionError(
                f"MultiHeadAttention({d_model}, {num_heads}, bias={bias}) has {found} parameters; "
                f"torch.nn.MultiheadAttention has {expected}. Keep exactly q_proj, k_proj, v_proj and out_proj "
                "(no extra per-head or fused copies of the weights).")
    advice = ["Check d_model % num_heads in __init__ and raise ValueError: fail when the layer is built, "
              "not at its first forward pass.", "Check d_model % num_heads in __init__."]
    for (d, h), outcome, hint in zip(INDIVISIBLE_MODULES, outcomes, advice):
        expect_value_error(outcome, f"MultiHeadAttention({d}, {h})", hint)


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


@mha_shapes.judge
def judge_mha_shapes(seeds, data):
    self_attention, (output, weights) = data
    for (_, (B, T, d_model, num_heads)), (out, w) in zip(SHAPE_CASES, self_attention):
        label = f"with h={num_heads} and x of shape {(B, T, d_model)}"
        expect_shape(out, (B, T, d_model), f"the output {label}", "The output has the shape of the query.")
        if tuple(w.shape) == (B, T, T) and num_heads > 1:
            raise AssertionError(f"the weights {label} are (B, T_q, T_k): you averaged (or lost) the heads, as "
                                 "torch.nn.MultiheadAttention does by default. Return them per head: "
                                 "(B, h, T_q, T_k).")
        expect_shape(w, (B, num_heads, T, T), f"the weight tensor {label}", "The weights are (B, h, T_q, T_k).")
    expect_shape(output, (2, 3, 12), "the cross-attention output (query (2, 3, 12), key and value (2, 7, 12))",
                 "The output has one row per query token.")
    expect_shape(weights, (2, 4, 3, 7), "the cross-attention weights (query (2, 3, 12), key and value (2, 7, 12))",
                 "Keys and values come from `key` and `value` when they are given: T_k = key.shape[1].")


VALUE_CASES = [(5401, (2, 5, 12, 3, True)), (5402, (3, 4, 8, 2, False)), (5403, (1, 6, 16, 4, True))]


@probe
def mha_values(seeds, cls):
    results = []
    for seed, (B, T, d_model, num_heads, bias) in VALUE_CASES:
        module = _load(_build(cls, d_model, num_heads, bias), projection_weights(seeds.generator(seed), d_model, bias))
        results.append(_forward(module, _inputs(seeds.generator(seed + 50), B, T, d_model)))
    return results


@mha_values.judge
def judge_mha_values(seeds, results):
    for (seed, (B, T, d_model, num_heads, bias)), (output, weights) in zip(VALUE_CASES, results):
        twin = _torch_twin(projection_weights(seeds.generator(seed), d_model, bias), num_heads)
        x = _inputs(seeds.generator(seed + 50), B, T, d_model)
        expected_output, expected_weights = _torch_attention(twin, x)
        wrong_weights, wrong_outputs = _mha_misconceptions(twin, num_heads, x, x, x)
        label = f"(h={num_heads}, d_model={d_model}, bias={bias})"
        expect_close(weights, expected_weights, f"the weight tensor {label}",
                     "Compare with torch.nn.MultiheadAttention: softmax(q kᵀ/√d_head) per head.",
                     diagnoses=wrong_weights)
        expect_close(output, expected_output, f"the output {label}",
                     "output = out_proj(merge_heads(weights @ v)).", diagnoses=wrong_outputs)


def cross_problem(seeds):
    """(query, key, value) and the order that shuffles the key/value tokens."""
    query, key, value = (_inputs(seeds.generator(seed), 2, t, 12) for seed, t in [(5502, 4), (5503, 6), (5504, 6)])
    return (query, key, value), torch.randperm(6, generator=seeds.generator(5505))


@probe
def mha_cross_attention(seeds, cls):
    module = _load(_build(cls, 12, 3), projection_weights(seeds.generator(5501), 12))
    (query, key, value), order = cross_problem(seeds)
    return _forward(module, query, key, value), _forward(module, query, key[:, order], value[:, order])


@mha_cross_attention.judge
def judge_mha_cross_attention(seeds, data):
    (output, weights), (shuffled_output, shuffled_weights) = data
    twin = _torch_twin(projection_weights(seeds.generator(5501), 12), 3)
    (query, key, value), order = cross_problem(seeds)
    expected_output, expected_weights = _torch_attention(twin, query, key, value)
    value_from_key = _torch_attention(twin, query, key, key)
    expect_close(weights, expected_weights, "the cross-attention weight tensor",
                 "Queries come from `query` (through q_proj), keys from `key` (through k_proj).")
    expect_close(output, expected_output, "the cross-attention output",
                 "Values come from `value`, through v_proj.",
                 diagnoses={"your values come from `key`, not from `value`.": value_from_key[0]})
    # Behaviour: attention sees its keys and values as a set; shuffling them (together) changes nothing.
    expect_close(shuffled_output, output, "the output after shuffling the key/value tokens together",
                 "Without a mask or positions, attention is a weighted average over a set of tokens.")
    expect_close(shuffled_weights, weights[..., order], "the weight tensor after shuffling the key/value tokens")


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


@mha_mask.judge
def judge_mha_mask(seeds, results):
    B, T, d_model, num_heads = MASK_SIZE
    twin = _torch_twin(projection_weights(seeds.generator(5601), d_model), num_heads)
    x = _inputs(seeds.generator(5602), B, T, d_model)
    unmasked = _torch_attention(twin, x)
    for (description, mask), (output, weights) in zip(mask_cases(seeds), results):
        expected_output, expected_weights = _torch_attention(twin, x, mask=mask)
        expect_shape(weights, (B, num_heads, T, T), f"the weight tensor with {description}",
                     "The mask broadcasts over (B, h, T_q, T_k); it must not change the weights' shape.")
        expect_close(weights, expected_weights, f"the weight tensor with {description}",
                     "Pass the mask on to scaled_dot_product_attention: True means 'may attend'.",
                     diagnoses={"your module ignores the mask: pass it on to the attention.": unmasked[1]})
        expect_close(output, expected_output, f"the output with {description}")


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


def _load_wrongly(module, torch_mha, order=(0, 1, 2), transpose=False, out_proj=True, biases=True):
    chunks = torch_mha.in_proj_weight.chunk(3)
    bias_chunks = torch_mha.in_proj_bias.chunk(3) if torch_mha.in_proj_bias is not None else (None,) * 3
    with torch.no_grad():
        for name, index in zip(("q_proj", "k_proj", "v_proj"), order):
            linear = getattr(module, name)
            linear.weight.copy_(chunks[index].T if transpose else chunks[index])
            if biases and linear.bias is not None:
                linear.bias.copy_(bias_chunks[index])
        if out_proj:
            module.out_proj.weight.copy_(torch_mha.out_proj.weight.T if transpose else torch_mha.out_proj.weight)
            if biases and module.out_proj.bias is not None:
                module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module


def _copy_misconceptions(module_seed, seeds, d_model, num_heads, torch_mha, query, key, value):
    """Judge side: what the course's module gives after a wrong copy (it starts from the check's weights)."""
    def fresh():
        return _reference_module(seeds.generator(module_seed), d_model, num_heads)

    names = "qkv"
    wrong = {}
    with torch.no_grad():
        for order in itertools.permutations(range(3)):
            if order != (0, 1, 2):
                module = _load_wrongly(fresh(), torch_mha, order=order)
                loaded = ", ".join(f"{names[i]}_proj ← the {names[j].upper()} block" for i, j in enumerate(order))
                wrong[f"in_proj_weight is split in the wrong q/k/v order ({loaded}). Its rows stack W_Q (rows "
                      "0…d−1), then W_K (d…2d−1), then W_V (2d…3d−1)."] = module(query, key, value)[0]
        cases = [
            ("you transposed the weights: nn.Linear.weight and in_proj_weight are both stored as (out_features, "
             "in_features), so copy each block as it is.", {"transpose": True}),
            ("out_proj was not copied: also load torch_mha.out_proj.weight and .bias.", {"out_proj": False}),
            ("the biases were not copied: also load in_proj_bias (split like the weights) and out_proj.bias.",
             {"biases": False}),
        ]
        for message, options in cases:
            wrong[message] = _load_wrongly(fresh(), torch_mha, **options)(query, key, value)[0]
    return wrong


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


@copy_from_torch_values.judge
def judge_copy_from_torch_values(seeds, results):
    for (seed, (d_model, num_heads)), (output, weights) in zip(COPY_CASES, results):
        torch_mha, _, (query, key, value) = copy_problem(seeds, seed, d_model, num_heads)
        wrong = _copy_misconceptions(seed + 10, seeds, d_model, num_heads, torch_mha, query, key, value)
        expected_output, expected_weights = _torch_attention(torch_mha, query, key, value)
        label = f"after copy_from_torch (d_model={d_model}, h={num_heads}; query, key and value all different)"
        expect_close(output, expected_output, f"the output {label}", diagnoses=wrong, rtol=0, atol=1e-6,
                     hint="in_proj_weight is (3·d_model, d_model): W_Q, W_K, W_V stacked by rows.")
        expect_close(weights, expected_weights, f"the weight tensor {label}", rtol=0, atol=1e-6)


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


@copy_from_torch_without_bias.judge
def judge_copy_from_torch_without_bias(seeds, output):
    torch_mha, _, x = no_bias_problem(seeds)
    expected_output, _ = _torch_attention(torch_mha, x)
    expect_close(output, expected_output, "the output after copy_from_torch with bias=False", rtol=0, atol=1e-6)


# ---------------------------------------------------------------- exercise 5: mha_num_parameters
COUNT_HELPERS = {"MultiHeadAttention": reference.MultiHeadAttention}


def _torch_count(d_model, num_heads, bias):
    with quiet(), torch.device("meta"):  # no memory, no initialisation: only the shapes
        return sum(p.numel() for p in nn.MultiheadAttention(d_model, num_heads, bias=bias).parameters())


def _count(fn, d_model, num_heads, bias):
    result = call(fn, d_model, num_heads, bias=bias, name="mha_num_parameters", helpers=COUNT_HELPERS)
    if isinstance(result, bool) or not (isinstance(result, numbers.Real) or torch.is_tensor(result)):
        raise AssertionError(f"mha_num_parameters should return an int, but it returned {type(result).__name__}.")
    return float(result)


def _count_misconceptions(d, h, bias):
    b = 1 if bias else 0
    return {
        "bias is ignored: with bias=True each of the four projections also has d_model biases (4·d_model); "
        "with bias=False it has none.": 4 * d * d + (0 if bias else 4 * d),
        "out_proj (W_O) is missing: it adds d_model² weights (+ d_model biases).": 3 * d * d + 3 * d * b,
        "you counted each head's projections as d_model × d_model; they are d_model × d_model/h, so all h heads "
        "together cost 3·d_model², whatever h is.": 3 * h * d * d + d * d + (3 * h * d + d) * b,
        "you counted one head's share only (d_model²/h per projection); there are h heads.":
            (4 * d * d + 4 * d * b) / h,
    }


def _expect_counts(found_counts, cases, bias):
    for (d, h), found in zip(cases, found_counts):
        expected = _torch_count(d, h, bias)
        if found != expected:
            if len(set(found_counts)) == 1:
                raise AssertionError(f"mha_num_parameters gives {found:,.0f} whatever d_model is: it looks hard-coded. "
                                     "Compute the count from d_model and bias, not from the visible example.")
            for message, wrong in _count_misconceptions(d, h, bias).items():
                if wrong != expected and found == wrong:
                    raise AssertionError(f"mha_num_parameters({d}, {h}, bias={bias}) = {found:,.0f}: {message}")
            raise AssertionError(f"mha_num_parameters({d}, {h}, bias={bias}) = {found:,.0f}, but "
                                 f"torch.nn.MultiheadAttention({d}, {h}, bias={bias}) has {expected:,} parameters.")


COUNT_CASES = [(48, 6), (30, 5), (7, 7), (100, 1), (1024, 16)]
COUNT_CASES_WITHOUT_BIAS = [(48, 6), (30, 5), (7, 7), (1024, 16)]


@probe
def mha_num_parameters_counts(seeds, fn):
    return ([_count(fn, d, h, True) for d, h in COUNT_CASES],
            attempt(fn, 10, 4, name="mha_num_parameters", helpers=COUNT_HELPERS))


@mha_num_parameters_counts.judge
def judge_mha_num_parameters_counts(seeds, data):
    counts, indivisible = data
    _expect_counts(counts, COUNT_CASES, bias=True)
    expect_value_error(indivisible, "mha_num_parameters(10, 4)",
                       "A layer whose d_model isn't divisible by num_heads can't be built, so it has no "
                       "parameter count: raise ValueError, as MultiHeadAttention does.")


@probe
def mha_num_parameters_bias(seeds, fn):
    return [_count(fn, d, h, False) for d, h in COUNT_CASES_WITHOUT_BIAS]


@mha_num_parameters_bias.judge
def judge_mha_num_parameters_bias(seeds, counts):
    _expect_counts(counts, COUNT_CASES_WITHOUT_BIAS, bias=False)


# ---------------------------------------------------------------- exercise 6 (optional stretch): grouped_query_attention
GQA_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention.forward",
                 "torch.nn.functional.multi_head_attention_forward",
                 "courselib.attention.scaled_dot_product_attention", "courselib.attention.masked_softmax",
                 "courselib.attention.MultiHeadAttention"]
GQA_ADVICE = ("write the scores and the softmax yourself (torch.softmax is fine): torch's "
              "scaled_dot_product_attention is the oracle the tests compare with, and the course's attention "
              "functions are references, not answers.")
TILED = ("you tiled the key/value heads with .repeat(1, g, 1, 1), so query heads read K/V heads (0, 1, 0, 1, …). "
         "Consecutive query heads share a K/V head: query head i reads K/V head i // g, which is "
         ".repeat_interleave(g, dim=1) (0, 0, 1, 1, …).")
VALUES_TILED = ("your weights are right but your values are tiled (.repeat): repeat v exactly as k, with "
                ".repeat_interleave(g, dim=1).")
UNSCALED = "your scores are not divided by √d_head = √q.shape[-1]."
UNMASKED = "your weights ignore the mask: apply it before the softmax (True means 'may attend')."


def _gqa(fn, q, k, v, mask=None):
    """Probe side: the student's (output, weights), as tensors."""
    with torch.no_grad():
        result = call(fn, q, k, v, mask=mask, name="grouped_query_attention", forbidden=GQA_SHORTCUTS,
                      forbidden_advice=GQA_ADVICE)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("grouped_query_attention must return the pair (output, weights), "
                             f"but it returned {type(result).__name__}.")
    return tuple(_tensor(r, "grouped_query_attention") for r in result)


def oracle_gqa(q, k, v, mask=None, scale=None):
    """Judge side: (output, weights) from torch's own grouped-query attention. torch returns no weights, so they
    come from the same kernel run over identity values: Σ_j w_ij e_j is row i of the weight matrix itself.
    torch's bool attn_mask means what ours means: True = may attend."""
    S = k.shape[-2]
    identity = torch.eye(S, dtype=k.dtype).expand(k.shape[0], k.shape[1], S, S)
    with torch.no_grad():
        output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        weights = F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=scale, enable_gqa=True)
    return output, weights


def _gqa_misconceptions(q, k, v, mask):
    """Judge side: ({message: wrong weights}, {message: wrong output}) of the known bugs, from the oracle."""
    h, h_kv = q.shape[1], k.shape[1]
    group = h // h_kv
    wrong_weights, wrong_outputs = {}, {}
    if 1 < h_kv < h:  # with one K/V head, or as many as queries, tiling and sharing agree
        tiled_output, tiled_weights = oracle_gqa(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), mask)
        wrong_weights[TILED], wrong_outputs[TILED] = tiled_weights, tiled_output
        wrong_outputs[VALUES_TILED] = oracle_gqa(q, k.repeat_interleave(group, dim=1), v.repeat(1, group, 1, 1),
                                                 mask)[0]
    wrong_outputs[UNSCALED], wrong_weights[UNSCALED] = oracle_gqa(q, k, v, mask, scale=1.0)
    if mask is not None:
        wrong_outputs[UNMASKED], wrong_weights[UNMASKED] = oracle_gqa(q, k, v)
    return wrong_weights, wrong_outputs


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


@stretch_gqa_values.judge
def judge_stretch_gqa_values(seeds, results):
    for (description, (B, h, h_kv, T, S, d_head), q, k, v, mask), (output, weights) in zip(
            gqa_values_problem(seeds), results):
        label = f"(h={h}, h_kv={h_kv}, T={T}, S={S}, d_head={d_head}, {description})"
        expected_output, expected_weights = oracle_gqa(q, k, v, mask)
        wrong_weights, wrong_outputs = _gqa_misconceptions(q, k, v, mask)
        expect_shape(weights, (B, h, T, S), f"the weight tensor {label}",
                     "One (T, S) matrix per QUERY head: (B, h, T, S), with h = q.shape[1].")
        expect_close(weights, expected_weights, f"the weight tensor {label}",
                     "softmax(q_i k_jᵀ / √d_head) with j = i // (h // h_kv), masked where the mask is False.",
                     diagnoses=wrong_weights, rtol=1e-7, atol=1e-9)
        expect_shape(output, (B, h, T, d_head), f"the output {label}", "The output has q's shape (B, h, T, d_head).")
        expect_close(output, expected_output, f"the output {label}", "output = weights @ (query head i's values).",
                     diagnoses=wrong_outputs, rtol=1e-7, atol=1e-9)


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


def _which_heads(found, wanted):
    """The K/V head each query head read, given what each K/V head leaves behind (positions or labels)."""
    return [int((wanted - value).abs().argmin()) for value in found]


@stretch_gqa_sharing.judge
def judge_stretch_gqa_sharing(seeds, data):
    reads, indivisible = data
    for (seed, (h, h_kv)), (output, weights) in zip(GQA_SHARING, reads):
        q, k, v, positions, labels = gqa_sharing_problem(seed, seeds, h, h_kv)
        expected_output, expected_weights = oracle_gqa(q, k, v)
        expected = [i // (h // h_kv) for i in range(h)]
        expect_shape(weights, expected_weights.shape, f"the weight tensor (h={h}, h_kv={h_kv})")
        expect_shape(output, expected_output.shape, f"the output (h={h}, h_kv={h_kv})")
        for what, found in [("keys", _which_heads(expect_tensor(weights, "the weights")[0, :, 0].argmax(dim=-1),
                                                  positions)),
                            ("values", _which_heads(expect_tensor(output, "the output")[0, :, 0, 0], labels))]:
            if found != expected:
                tiled = " That is .repeat's tiling: use .repeat_interleave." if found == [i % h_kv for i in range(h)] else ""
                raise AssertionError(
                    f"with h={h} query heads and h_kv={h_kv} K/V heads, your query heads 0…{h - 1} took their {what} "
                    f"from K/V heads {found}; they should take them from {expected}: query head i reads K/V head "
                    f"i // (h // h_kv), so consecutive query heads share one.{tiled}")
        expect_close(output, expected_output, f"the output (h={h}, h_kv={h_kv})", rtol=1e-7, atol=1e-9)
    for (h, h_kv), outcome in zip(GQA_INDIVISIBLE, indivisible):
        shown = f"grouped_query_attention(q with h={h} heads, k and v with h_kv={h_kv})"
        if outcome["value_error"] and not all(str(n) in outcome["message"] for n in (h, h_kv)):
            raise AssertionError(f"{shown} raised ValueError({outcome['message']!r}): give both numbers in the "
                                 "message, e.g. f'num_heads={h} is not divisible by num_kv_heads={h_kv}'.")
        expect_value_error(outcome, shown, f"Check h % h_kv yourself: {h} query heads can't be shared out equally "
                                           f"among {h_kv} K/V heads.", must_mention=(h, h_kv))
