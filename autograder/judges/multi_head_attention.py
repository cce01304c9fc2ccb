"""Hidden checks for multi_head_attention, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/multi_head_attention.py, which also builds the
inputs both sides rebuild from the seeds."""
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import expect_close, expect_shape, expect_tensor, quiet
from autograder.checks.multi_head_attention import (
    COPY_CASES,
    COUNT_CASES,
    COUNT_CASES_WITHOUT_BIAS,
    DTYPE,
    GQA_INDIVISIBLE,
    GQA_SHARING,
    INDIVISIBLE,
    INDIVISIBLE_MODULES,
    MASK_SIZE,
    MERGE_SHAPE_CASES,
    MERGE_VALUE_CASES,
    MODULE_CASES,
    SHAPE_CASES,
    SPLIT_SHAPE_CASES,
    SPLIT_VALUE_CASES,
    VALUE_CASES,
    _inputs,
    _random_inputs,
    _reference_module,
    copy_from_torch_values,
    copy_from_torch_without_bias,
    copy_problem,
    cross_problem,
    gqa_sharing_problem,
    gqa_values_problem,
    mask_cases,
    merge_heads_inverts_split,
    merge_heads_shape,
    merge_problem,
    mha_cross_attention,
    mha_mask,
    mha_modules,
    mha_num_parameters_bias,
    mha_num_parameters_counts,
    mha_shapes,
    mha_values,
    no_bias_problem,
    projection_weights,
    split_heads_checks_divisibility,
    split_heads_shape,
    split_heads_values,
    stretch_gqa_sharing,
    stretch_gqa_values,
)


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


@split_heads_checks_divisibility.judge
def judge_split_heads_checks_divisibility(seeds, outcomes):
    advice = ("Check d_model % num_heads yourself and raise ValueError with a message that gives both numbers: "
              "heads must split d_model into equal parts.")
    for (d, h), outcome in zip(INDIVISIBLE, outcomes):
        expect_value_error(outcome, f"split_heads(tensor of shape {(2, 3, d)}, {h})", advice, must_mention=(d, h))


@merge_heads_shape.judge
def judge_merge_heads_shape(seeds, results):
    for (B, h, T, d_head), (merged, merged_split) in zip(MERGE_SHAPE_CASES, results):
        expect_shape(merged, (B, T, h * d_head), f"merge_heads of a {(B, h, T, d_head)} tensor",
                     "Read B, h, T and d_head from x.shape; the result is (B, T, h·d_head).")
        expect_shape(merged_split, (B, T, h * d_head), "merge_heads of split_heads' output")


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


@copy_from_torch_without_bias.judge
def judge_copy_from_torch_without_bias(seeds, output):
    torch_mha, _, x = no_bias_problem(seeds)
    expected_output, _ = _torch_attention(torch_mha, x)
    expect_close(output, expected_output, "the output after copy_from_torch with bias=False", rtol=0, atol=1e-6)


def _torch_count(d_model, num_heads, bias):
    with quiet(), torch.device("meta"):  # no memory, no initialisation: only the shapes
        return sum(p.numel() for p in nn.MultiheadAttention(d_model, num_heads, bias=bias).parameters())


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


@mha_num_parameters_counts.judge
def judge_mha_num_parameters_counts(seeds, data):
    counts, indivisible = data
    _expect_counts(counts, COUNT_CASES, bias=True)
    expect_value_error(indivisible, "mha_num_parameters(10, 4)",
                       "A layer whose d_model isn't divisible by num_heads can't be built, so it has no "
                       "parameter count: raise ValueError, as MultiHeadAttention does.")


@mha_num_parameters_bias.judge
def judge_mha_num_parameters_bias(seeds, counts):
    _expect_counts(counts, COUNT_CASES_WITHOUT_BIAS, bias=False)


TILED = ("you tiled the key/value heads with .repeat(1, g, 1, 1), so query heads read K/V heads (0, 1, 0, 1, …). "
         "Consecutive query heads share a K/V head: query head i reads K/V head i // g, which is "
         ".repeat_interleave(g, dim=1) (0, 0, 1, 1, …).")


VALUES_TILED = ("your weights are right but your values are tiled (.repeat): repeat v exactly as k, with "
                ".repeat_interleave(g, dim=1).")


UNSCALED = "your scores are not divided by √d_head = √q.shape[-1]."


UNMASKED = "your weights ignore the mask: apply it before the softmax (True means 'may attend')."


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
