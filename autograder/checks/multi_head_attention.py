"""Hidden checks for 05_multi_head_attention. Each function is one grade cell's hidden part.

Layered as the course's tests are: shape first, then values on seeded random inputs against
independent oracles, then behaviour. The oracles:
- split/merge: `torch.chunk` + `torch.stack` and `torch.unbind` + `torch.cat` (no view/transpose);
- the module: `torch.nn.MultiheadAttention` (batch_first, need_weights, average_attn_weights=False)
  given the student's weights, in float64 so that rounding never fails a correct answer;
- the parameter count: `torch.nn.MultiheadAttention(...).parameters()` built on the meta device.
Each exercise is graded on its own: `MultiHeadAttention` runs with the course's reference
`split_heads`, `merge_heads` and `scaled_dot_product_attention` swapped in, `copy_from_torch` loads
into the course's reference module, and `mha_num_parameters` sees the reference module.
Seeds here are never used by the visible tests.
"""
import functools
import itertools
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call, expect_close, expect_shape, generator, quiet, reference_globals
from courselib import attention as reference

DTYPE = torch.float64
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
REFERENCE_HELPERS = {"split_heads": reference.split_heads, "merge_heads": reference.merge_heads,
                     "scaled_dot_product_attention": reference.scaled_dot_product_attention}
TORCH_MHA = ["torch.nn.MultiheadAttention.forward", "torch.nn.functional.multi_head_attention_forward"]
TORCH_MHA_ADVICE = ("torch.nn.MultiheadAttention is the oracle the tests compare with; "
                    "build the heads from q_proj, k_proj, v_proj and out_proj yourself.")
NOT_CONTIGUOUS_ADVICE = ("After a transpose the tensor is no longer contiguous in memory, so .view() "
                         "cannot merge its dimensions: use .reshape(...) (or .contiguous().view(...)).")


# ---------------------------------------------------------------- shared helpers
def _not_the_reference(answer, course_version, name):
    same = answer is course_version or (isinstance(answer, type) and isinstance(course_version, type)
                                        and issubclass(answer, course_version))
    if same:
        raise AssertionError(f"{name} is the course's reference from courselib.attention: this exercise "
                             "asks you to write it yourself.")


def _tensor(result, name):
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return a torch tensor, but it returned {type(result).__name__}.")
    return result


def expect_value_error(fn, args, name, advice, must_mention=(), helpers=None):
    """`fn(*args)` must raise ValueError (not a RuntimeError from view, not nothing)."""
    shown = f"{name}({', '.join(_describe(a) for a in args)})"
    try:
        with quiet(), reference_globals(fn, **(helpers or {})):
            fn(*args)
    except NotImplementedError:
        raise
    except ValueError as error:
        message = str(error)
        missing = [str(n) for n in must_mention if str(n) not in message]
        if not message.strip() or missing:
            raise AssertionError(f"{shown} raised ValueError({message!r}): make the message say what is wrong "
                                 "and give both numbers, e.g. f'd_model={d_model} is not divisible by "
                                 "num_heads={num_heads}'.") from None
        return
    except Exception as error:
        raise AssertionError(f"{shown} raised {type(error).__name__} ({error}), not ValueError. {advice}") from None
    raise AssertionError(f"{shown} did not raise ValueError. {advice}")


def _describe(value):
    return f"tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else repr(value)


def oracle_split(x, num_heads):
    """(B, T, d) -> (B, h, T, d/h) without view or transpose: head i is the i-th block of features."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def oracle_merge(heads):
    """(B, h, T, d_head) -> (B, T, h * d_head): the heads' features side by side, head 0 first."""
    return torch.cat(heads.unbind(dim=1), dim=-1)


# ---------------------------------------------------------------- exercise 1: split_heads
def _split(fn, x, num_heads):
    return _tensor(call(fn, x, num_heads, name="split_heads"), "split_heads")


def split_heads_shape(fn):
    _not_the_reference(fn, reference.split_heads, "split_heads")
    g = generator(5101)
    for B, T, d, h in [(3, 5, 12, 4), (2, 7, 6, 1), (1, 4, 6, 6), (2, 3, 20, 5)]:
        x = torch.randn(B, T, d, generator=g)
        result = _split(fn, x, h)
        if tuple(result.shape) == (B, T, h, d // h) and T != h:
            raise AssertionError(f"split_heads(x of shape {(B, T, d)}, {h}) has shape (B, T, h, d_head) = "
                                 f"{tuple(result.shape)}: after the view, swap the token and head dimensions "
                                 "with .transpose(1, 2) so that each head holds all T tokens.")
        expect_shape(result, (B, h, T, d // h), f"split_heads(x of shape {(B, T, d)}, num_heads={h})",
                     "Read B, T and d_model from x.shape and use d_head = d_model // num_heads: "
                     "no sizes from the visible example.")


def split_heads_values(fn):
    g = generator(5102)
    for B, T, d, h in [(3, 5, 12, 4), (2, 6, 12, 3), (2, 4, 10, 5)]:
        x = torch.randn(B, T, d, generator=g)
        d_head = d // h
        expect_close(_split(fn, x, h), oracle_split(x, h), f"split_heads(x of shape {(B, T, d)}, {h})",
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


def split_heads_checks_divisibility(fn):
    advice = ("Check d_model % num_heads yourself and raise ValueError with a message that gives both numbers: "
              "heads must split d_model into equal parts.")
    g = generator(5103)
    for d, h in [(10, 4), (12, 5), (9, 2)]:
        expect_value_error(fn, (torch.randn(2, 3, d, generator=g), h), "split_heads", advice, must_mention=(d, h))


# ---------------------------------------------------------------- exercise 2: merge_heads
def _merge(fn, heads):
    try:
        result = call(fn, heads, name="merge_heads")
    except AssertionError as error:
        if "view size is not compatible" in str(error):
            raise AssertionError(f"{error}\n{NOT_CONTIGUOUS_ADVICE}") from None
        raise
    return _tensor(result, "merge_heads")


def merge_heads_shape(fn):
    _not_the_reference(fn, reference.merge_heads, "merge_heads")
    g = generator(5201)
    for B, h, T, d_head in [(3, 4, 5, 3), (2, 1, 7, 6), (1, 6, 2, 2), (2, 3, 4, 5)]:
        # Contiguous in (B, h, T, d_head) order, as attention's output is: after a transpose, .view fails.
        heads = torch.randn(B, h, T, d_head, generator=g)
        expect_shape(_merge(fn, heads), (B, T, h * d_head), f"merge_heads of a {(B, h, T, d_head)} tensor",
                     "Read B, h, T and d_head from x.shape; the result is (B, T, h·d_head).")
        split_output = reference.split_heads(torch.randn(B, T, h * d_head, generator=g), h)
        expect_shape(_merge(fn, split_output), (B, T, h * d_head), "merge_heads of split_heads' output")


def merge_heads_inverts_split(fn):
    g = generator(5202)
    for B, T, d, h in [(3, 5, 12, 4), (2, 6, 12, 3), (2, 4, 10, 5), (1, 3, 8, 1)]:
        x = torch.randn(B, T, d, generator=g)
        heads = reference.split_heads(x, h)
        d_head = d // h
        expect_close(_merge(fn, heads), x, f"merge_heads(split_heads(x, {h})) for x of shape {(B, T, d)}",
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
    contiguous = torch.randn(2, 3, 4, 5, generator=g)
    expect_close(_merge(fn, contiguous), oracle_merge(contiguous), "merge_heads of a contiguous (2, 3, 4, 5) tensor")


# ---------------------------------------------------------------- exercise 3: MultiHeadAttention
def _build(cls, d_model, num_heads, bias=True):
    """The student's module, checked for the contract's sub-modules, in float64."""
    _not_the_reference(cls, reference.MultiHeadAttention, "MultiHeadAttention")
    label = f"MultiHeadAttention({d_model}, {num_heads}, bias={bias})"
    module = call(cls, d_model, num_heads, bias=bias, name=label)
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


def _randomize(module, seed):
    g = generator(seed)
    with torch.no_grad():
        for name in PROJECTIONS:
            linear = getattr(module, name)
            d_out, d_in = linear.weight.shape
            linear.weight.copy_(torch.randn(d_out, d_in, generator=g, dtype=DTYPE) * 1.5 / math.sqrt(d_in))
            if linear.bias is not None:  # torch initialises biases to 0: random ones make them matter
                linear.bias.copy_(torch.randn(d_out, generator=g, dtype=DTYPE) * 0.5)
    return module


def _torch_twin(module, num_heads):
    """torch.nn.MultiheadAttention holding the student's weights: in_proj stacks W_q, W_k, W_v."""
    d_model = module.q_proj.in_features
    bias = module.q_proj.bias is not None
    twin = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
        twin.out_proj.weight.copy_(module.out_proj.weight)
        if bias:
            twin.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
            twin.out_proj.bias.copy_(module.out_proj.bias)
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


def _inputs(seed, B, T, d_model):
    return torch.randn(B, T, d_model, generator=generator(seed), dtype=DTYPE)


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


def mha_modules(cls):
    for d_model, num_heads, bias in [(12, 3, True), (12, 3, False), (20, 5, True)]:
        module = _build(cls, d_model, num_heads, bias)
        with torch.device("meta"):
            expected = sum(p.numel() for p in nn.MultiheadAttention(d_model, num_heads, bias=bias).parameters())
        found = sum(p.numel() for p in module.parameters())
        if found != expected:
            raise AssertionError(
                f"MultiHeadAttention({d_model}, {num_heads}, bias={bias}) has {found} parameters; "
                f"torch.nn.MultiheadAttention has {expected}. Keep exactly q_proj, k_proj, v_proj and out_proj "
                "(no extra per-head or fused copies of the weights).")
    expect_value_error(cls, (10, 4), "MultiHeadAttention",
                       "Check d_model % num_heads in __init__ and raise ValueError: fail when the layer is built, "
                       "not at its first forward pass.")
    expect_value_error(cls, (18, 4), "MultiHeadAttention", "Check d_model % num_heads in __init__.")


def mha_shapes(cls):
    for seed, (B, T, d_model, num_heads) in [(5301, (3, 5, 12, 3)), (5302, (2, 4, 8, 1)), (5303, (1, 3, 6, 6))]:
        module = _randomize(_build(cls, d_model, num_heads), seed)
        x = _inputs(seed + 50, B, T, d_model)
        output, weights = _forward(module, x)
        label = f"with h={num_heads} and x of shape {(B, T, d_model)}"
        expect_shape(output, (B, T, d_model), f"the output {label}", "The output has the shape of the query.")
        if tuple(weights.shape) == (B, T, T) and num_heads > 1:
            raise AssertionError(f"the weights {label} are (B, T_q, T_k): you averaged (or lost) the heads, as "
                                 "torch.nn.MultiheadAttention does by default. Return them per head: "
                                 "(B, h, T_q, T_k).")
        expect_shape(weights, (B, num_heads, T, T), f"the weight tensor {label}", "The weights are (B, h, T_q, T_k).")
    module = _randomize(_build(cls, 12, 4), 5304)
    query, memory = _inputs(5305, 2, 3, 12), _inputs(5306, 2, 7, 12)
    output, weights = _forward(module, query, memory, memory)
    expect_shape(output, (2, 3, 12), "the cross-attention output (query (2, 3, 12), key and value (2, 7, 12))",
                 "The output has one row per query token.")
    expect_shape(weights, (2, 4, 3, 7), "the cross-attention weights (query (2, 3, 12), key and value (2, 7, 12))",
                 "Keys and values come from `key` and `value` when they are given: T_k = key.shape[1].")


def mha_values(cls):
    for seed, (B, T, d_model, num_heads, bias) in [(5401, (2, 5, 12, 3, True)), (5402, (3, 4, 8, 2, False)),
                                                  (5403, (1, 6, 16, 4, True))]:
        module = _randomize(_build(cls, d_model, num_heads, bias), seed)
        twin = _torch_twin(module, num_heads)
        x = _inputs(seed + 50, B, T, d_model)
        output, weights = _forward(module, x)
        expected_output, expected_weights = _torch_attention(twin, x)
        wrong_weights, wrong_outputs = _mha_misconceptions(twin, num_heads, x, x, x)
        label = f"(h={num_heads}, d_model={d_model}, bias={bias})"
        expect_close(weights, expected_weights, f"the weight tensor {label}",
                     "Compare with torch.nn.MultiheadAttention: softmax(q kᵀ/√d_head) per head.",
                     diagnoses=wrong_weights)
        expect_close(output, expected_output, f"the output {label}",
                     "output = out_proj(merge_heads(weights @ v)).", diagnoses=wrong_outputs)


def mha_cross_attention(cls):
    module = _randomize(_build(cls, 12, 3), 5501)
    twin = _torch_twin(module, 3)
    query, key, value = _inputs(5502, 2, 4, 12), _inputs(5503, 2, 6, 12), _inputs(5504, 2, 6, 12)
    output, weights = _forward(module, query, key, value)
    expected_output, expected_weights = _torch_attention(twin, query, key, value)
    with torch.no_grad():
        value_from_key = _torch_attention(twin, query, key, key)
    expect_close(weights, expected_weights, "the cross-attention weight tensor",
                 "Queries come from `query` (through q_proj), keys from `key` (through k_proj).")
    expect_close(output, expected_output, "the cross-attention output",
                 "Values come from `value`, through v_proj.",
                 diagnoses={"your values come from `key`, not from `value`.": value_from_key[0]})
    # Behaviour: attention sees its keys and values as a set; shuffling them (together) changes nothing.
    order = torch.randperm(6, generator=generator(5505))
    shuffled_output, shuffled_weights = _forward(module, query, key[:, order], value[:, order])
    expect_close(shuffled_output, output, "the output after shuffling the key/value tokens together",
                 "Without a mask or positions, attention is a weighted average over a set of tokens.")
    expect_close(shuffled_weights, weights[..., order], "the weight tensor after shuffling the key/value tokens")


def mha_mask(cls):
    B, T, d_model, num_heads = 2, 5, 12, 3
    module = _randomize(_build(cls, d_model, num_heads), 5601)
    twin = _torch_twin(module, num_heads)
    x = _inputs(5602, B, T, d_model)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * T, [True] * 3 + [False] * (T - 3)])[:, None, None, :]  # (B, 1, 1, T)
    per_query = torch.rand(B, 1, T, T, generator=generator(5603)) > 0.5
    per_query[..., 0] = True  # every query may attend somewhere
    for description, mask in [("a causal (T, T) mask", causal), ("a (B, 1, 1, T) padding mask", padding),
                              ("a (B, 1, T, T) mask", per_query)]:
        output, weights = _forward(module, x, mask=mask)
        expected_output, expected_weights = _torch_attention(twin, x, mask=mask)
        unmasked = _torch_attention(twin, x)
        expect_shape(weights, (B, num_heads, T, T), f"the weight tensor with {description}",
                     "The mask broadcasts over (B, h, T_q, T_k); it must not change the weights' shape.")
        expect_close(weights, expected_weights, f"the weight tensor with {description}",
                     "Pass the mask on to scaled_dot_product_attention: True means 'may attend'.",
                     diagnoses={"your module ignores the mask: pass it on to the attention.": unmasked[1]})
        expect_close(output, expected_output, f"the output with {description}")


# ---------------------------------------------------------------- exercise 4: copy_from_torch
def _torch_module(seed, d_model, num_heads, bias=True):
    torch_mha = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=DTYPE)
    g = generator(seed)
    with torch.no_grad():
        for parameter in torch_mha.parameters():  # torch's biases start at 0; random ones make them matter
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=DTYPE) / math.sqrt(d_model) * 1.5)
    return torch_mha


def _reference_module(seed, d_model, num_heads, bias=True):
    module = reference.MultiHeadAttention(d_model, num_heads, bias=bias).to(DTYPE)
    return _randomize(module, seed)


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


def _copy_misconceptions(seed, d_model, num_heads, torch_mha, query, key, value):
    names = "qkv"
    wrong = {}
    for order in itertools.permutations(range(3)):
        if order != (0, 1, 2):
            module = _load_wrongly(_reference_module(seed, d_model, num_heads), torch_mha, order=order)
            loaded = ", ".join(f"{names[i]}_proj ← the {names[j].upper()} block" for i, j in enumerate(order))
            wrong[f"in_proj_weight is split in the wrong q/k/v order ({loaded}). Its rows stack W_q (rows "
                  "0…d−1), then W_k (d…2d−1), then W_v (2d…3d−1)."] = module(query, key, value)[0]
    cases = [
        ("you transposed the weights: nn.Linear.weight and in_proj_weight are both stored as (out_features, "
         "in_features), so copy each block as it is.", {"transpose": True}),
        ("out_proj was not copied: also load torch_mha.out_proj.weight and .bias.", {"out_proj": False}),
        ("the biases were not copied: also load in_proj_bias (split like the weights) and out_proj.bias.",
         {"biases": False}),
    ]
    for message, options in cases:
        module = _load_wrongly(_reference_module(seed, d_model, num_heads), torch_mha, **options)
        wrong[message] = module(query, key, value)[0]
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


def copy_from_torch_values(fn):
    for seed, (d_model, num_heads) in [(5701, (12, 3)), (5702, (8, 4))]:
        torch_mha = _torch_module(seed, d_model, num_heads)
        module = _reference_module(seed + 10, d_model, num_heads)
        query, key, value = (_inputs(seed + k, 2, t, d_model) for k, t in [(20, 4), (21, 6), (22, 6)])
        with torch.no_grad():
            wrong = _copy_misconceptions(seed + 10, d_model, num_heads, torch_mha, query, key, value)
        _copy(fn, module, torch_mha)
        with torch.no_grad():
            expected_output, expected_weights = _torch_attention(torch_mha, query, key, value)
            output, weights = module(query, key, value)
        label = f"after copy_from_torch (d_model={d_model}, h={num_heads}; query, key and value all different)"
        expect_close(output, expected_output, f"the output {label}", diagnoses=wrong, rtol=0, atol=1e-6,
                     hint="in_proj_weight is (3·d_model, d_model): W_q, W_k, W_v stacked by rows.")
        expect_close(weights, expected_weights, f"the weight tensor {label}", rtol=0, atol=1e-6)


def copy_from_torch_without_bias(fn):
    d_model, num_heads = 12, 4
    torch_mha = _torch_module(5801, d_model, num_heads, bias=False)
    module = _reference_module(5802, d_model, num_heads, bias=False)
    try:
        _copy(fn, module, torch_mha)
    except AssertionError as error:
        raise AssertionError(f"{error}\nWith bias=False, torch_mha.in_proj_bias and out_proj.bias are None and "
                             "mha's projections have no bias: copy biases only when they exist.") from None
    x = _inputs(5803, 2, 5, d_model)
    with torch.no_grad():
        expected_output, _ = _torch_attention(torch_mha, x)
        output, _ = module(x)
    expect_close(output, expected_output, "the output after copy_from_torch with bias=False", rtol=0, atol=1e-6)


# ---------------------------------------------------------------- exercise 5: mha_num_parameters
def _torch_count(d_model, num_heads, bias):
    with quiet(), torch.device("meta"):  # no memory, no initialisation: only the shapes
        return sum(p.numel() for p in nn.MultiheadAttention(d_model, num_heads, bias=bias).parameters())


def _count(fn, d_model, num_heads, bias):
    result = call(fn, d_model, num_heads, bias=bias, name="mha_num_parameters",
                  helpers={"MultiHeadAttention": reference.MultiHeadAttention})
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


def _expect_counts(fn, cases, bias):
    found_counts = [_count(fn, d, h, bias) for d, h in cases]
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


def mha_num_parameters_counts(fn):
    _expect_counts(fn, [(48, 6), (30, 5), (7, 7), (100, 1), (1024, 16)], bias=True)
    expect_value_error(fn, (10, 4), "mha_num_parameters",
                       "A layer whose d_model isn't divisible by num_heads can't be built, so it has no "
                       "parameter count: raise ValueError, as MultiHeadAttention does.")


def mha_num_parameters_bias(fn):
    _expect_counts(fn, [(48, 6), (30, 5), (7, 7), (1024, 16)], bias=False)
