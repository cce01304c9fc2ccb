"""Hidden checks for gpt, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/gpt.py, which also builds the
inputs both sides rebuild from the seeds."""
import copy
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, expect_tensor, to_numpy
from autograder.checks.gpt import (
    ADAMW_FIRST_CASES,
    ADAMW_STEP_CASES,
    ANY_SIZE_DIMS,
    BATCH_DIMS,
    LLAMA_CACHE_DIMS,
    LLAMA_CACHE_SPLITS,
    ATTENTION_STRUCTURE_CASE,
    ATTENTION_VALUE_CASES,
    BLOCK_STRUCTURE_CASE,
    BLOCK_VALUE_CASES,
    CACHE_DIMS,
    CAUSAL_CUTS,
    CHECKPOINT_AT,
    CHECKPOINT_STEPS,
    CHUNK_SPLITS,
    CONTEXT_CASES,
    EVAL_EVERY,
    GEN_DIMS,
    ReferenceGPT,
    GPT_NAMES,
    GPT_STRUCTURE_DIMS,
    LLAMA_ATTENTION_CASES,
    LLAMA_ATTENTION_STRUCTURE,
    LLAMA_STRUCTURE_DIMS,
    LOAD_DIMS,
    MATCH_SPLITS,
    OPTIMIZER_SETTINGS,
    OPTIMIZER_STEPS,
    PPL_DIMS,
    RESUME_STEPS,
    RUN_FACTOR,
    RUN_STEPS,
    SAMPLES,
    SPEC_TARGET,
    TRAIN_CLIP,
    TRAIN_DIMS,
    TRAIN_STEPS,
    adamw_problem,
    adamw_update_first_step,
    adamw_update_matches_torch,
    attention_value_problem,
    batch_cases,
    block_value_problem,
    bytes_cases,
    cache_problem,
    causal_self_attention_is_causal,
    causal_self_attention_matches_gpt2,
    causal_self_attention_structure,
    checkpoint_problem,
    checkpoint_resumes_the_optimizer_and_step,
    checkpoint_resumes_the_randomness,
    checkpoint_session,
    checkpoint_steps,
    clip_cases,
    clip_grad_norm_matches_torch,
    clip_grad_norm_values,
    configure_optimizer_groups,
    configure_optimizer_steps,
    decoder_block_matches_gpt2,
    decoder_block_structure,
    generate_batch_matches_hf,
    generate_batch_stops_at_eos,
    generate_checks_the_context,
    generate_matches_hf_greedy,
    generate_problem,
    gpt2_config,
    gpt_head_is_tied,
    gpt_matches_gpt2,
    gpt_structure,
    gpt_value_problem,
    greedy_logits,
    hf_attention_state,
    hf_block_state,
    hf_model,
    hf_state,
    kv_cache_bytes_values,
    kv_cache_chunks,
    kv_cache_matches_uncached,
    kv_cache_shapes,
    llama_attention_matches_llama,
    llama_attention_problem,
    llama_attention_structure,
    llama_cache_matches_uncached,
    llama_cache_problem,
    llama_cache_shapes,
    llama_matches_hf,
    llama_structure,
    llama_value_problem,
    lm_loss_values,
    load_gpt2_any_size,
    load_gpt2_copies_every_weight,
    load_gpt2_parity,
    load_problem,
    loss_problem,
    lr_at_matches_torch,
    lr_at_values,
    lr_torch_cases,
    lr_value_cases,
    optimizer_problem,
    perplexity_problem,
    perplexity_values,
    reference_forward_padded,
    reference_gpt,
    sample_next_distribution,
    sample_next_generator,
    sample_next_greedy_limit,
    sampling_cases,
    speculative_matches_greedy,
    speculative_problem,
    speculative_saves_target_calls,
    top_k_cases,
    top_k_filter_values,
    top_p_edge_cases,
    top_p_filter_edges,
    top_p_filter_values,
    top_p_value_cases,
    train_problem,
    train_steps_match_reference,
    train_switches_modes,
    training_run_learns,
)


EARLIER = "(This test uses reference versions of the other exercises, so only this one is graded here.)"


def hf_logits(state, dims, ids):
    with torch.no_grad():
        return hf_model(state, dims)(ids).logits


def hf_attention(state, d_model, num_heads):
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    with torch.random.fork_rng():
        attn = GPT2Attention(gpt2_config(1, d_model, 1, num_heads, 8)).double().eval()
    attn.load_state_dict(hf_attention_state(state), strict=True)
    return attn


def hf_block(state, d_model, num_heads, d_ff, eps):
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    with torch.random.fork_rng():
        block = GPT2Block(gpt2_config(1, d_model, 1, num_heads, 8, d_ff, eps)).double().eval()
    block.load_state_dict(hf_block_state(state), strict=True)
    return block


def additive_causal(T, diagonal=0):
    mask = torch.ones(T, T, dtype=torch.bool).tril(diagonal)
    return torch.zeros(T, T, dtype=torch.float64).masked_fill(~mask, float("-inf"))[None, None]


# ---------------------------------------------------------------- attention and a block by hand (diagnoses)
def attention_by_hand(state, x, num_heads, prefix="", order="qkv", heads_first=False, mask="causal", scale="head",
                      merge="transpose"):
    """GPT-2's fused attention written out with torch ops, with switches for the usual mistakes: `order` names
    what each third of c_attn's output is taken as; `heads_first` cuts the 3d features into heads before q, k, v;
    `mask` is "causal", "ahead" (sees the next token) or None; `scale` "head" (√d_head), "model" (√d) or None;
    `merge` "transpose" or "reshape" (heads merged without the transpose)."""
    B, T, d = x.shape
    d_head = d // num_heads
    fused = F.linear(x, state[f"{prefix}c_attn.weight"], state[f"{prefix}c_attn.bias"])          # (B, T, 3d)
    if heads_first:
        q, k, v = fused.view(B, T, num_heads, 3 * d_head).transpose(1, 2).split(d_head, dim=-1)
    else:
        named = dict(zip(order, fused.split(d, dim=2)))
        q, k, v = (named[c].view(B, T, num_heads, d_head).transpose(1, 2) for c in "qkv")
    scores = q @ k.transpose(-2, -1)
    if scale is not None:
        scores = scores / math.sqrt(d_head if scale == "head" else d)
    if mask is not None:
        allowed = torch.ones(T, T, dtype=torch.bool).tril(0 if mask == "causal" else 1)
        scores = scores.masked_fill(~allowed, float("-inf"))
    heads = torch.softmax(scores, dim=-1) @ v                                                      # (B, h, T, d_head)
    merged = heads.transpose(1, 2).reshape(B, T, d) if merge == "transpose" else heads.reshape(B, T, d)
    return F.linear(merged, state[f"{prefix}c_proj.weight"], state[f"{prefix}c_proj.bias"])


def attention_diagnoses(state, x, num_heads):
    def by_hand(**switches):
        return attention_by_hand(state, x, num_heads, **switches)

    found = {f"you take c_attn's output in the order {', '.join(order)}; GPT-2's order is q, k, v: the first d "
             "features are the queries, then the keys, then the values.": by_hand(order=order)
             for order in ("kqv", "qvk", "vkq", "kvq", "vqk")}
    found.update({
        "you split the 3d features of c_attn's output into heads before splitting them into q, k and v, so each "
        "head's q, k and v come from the wrong features. Split into q, k, v first (each (B, T, d)), then each into "
        "heads.": by_hand(heads_first=True),
        "there is no causal mask: every position attends to the whole sequence, future included. Mask the scores "
        "above the diagonal with -inf before the softmax.": by_hand(mask=None),
        "your mask lets position t see position t + 1 (tril(1)?): a token may attend to itself and the past only, "
        "a lower-triangular mask with the diagonal.": by_hand(mask="ahead"),
        "you scale the scores by √d_model; each head's scores are scaled by √d_head, the width of one head.":
            by_hand(scale="model"),
        "the scores are not scaled: divide q kᵀ by √d_head.": by_hand(scale=None),
        "the heads are merged without the transpose: (B, h, T, d_head) reshaped to (B, T, d) mixes positions and "
        "heads. Transpose back to (B, T, h, d_head) first.": by_hand(merge="reshape"),
    })
    return found


def block_by_hand(state, x, num_heads, eps, post_ln=False, approximate="tanh", raw_residual=True):
    """A GPT-2-style block written out with torch ops, with switches for the usual mistakes."""
    def norm(name, h):
        return F.layer_norm(h, h.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"], eps)

    def linear(name, h):
        return F.linear(h, state[f"{name}.weight"], state[f"{name}.bias"])

    def attend(h):
        return attention_by_hand(state, h, num_heads, prefix="self_attn.")

    def ffn(h):
        return linear("ffn.linear2", F.gelu(linear("ffn.linear1", h), approximate=approximate))

    if post_ln:
        x = norm("norm1", x + attend(x))
        return norm("norm2", x + ffn(x))
    h = norm("norm1", x)
    x = (x if raw_residual else h) + attend(h)
    h = norm("norm2", x)
    return (x if raw_residual else h) + ffn(h)


# ---------------------------------------------------------------- exercise 1: CausalSelfAttention
ATTENTION_NAMES = "num_heads, c_attn = nn.Linear(d_model, 3 * d_model), c_proj = nn.Linear(d_model, d_model)"


@causal_self_attention_structure.judge
def judge_causal_self_attention_structure(seeds, data):
    d_model, num_heads = ATTENTION_STRUCTURE_CASE
    for name, (d_in, d_out) in (("c_attn", (d_model, 3 * d_model)), ("c_proj", (d_model, d_model))):
        layer = data["layers"][name]
        if layer is None:
            raise AssertionError(f"CausalSelfAttention has no nn.Linear `{name}`: the exercise asks for {ATTENTION_NAMES}.")
        if layer[:2] != [d_in, d_out]:
            hint = (" c_attn makes q, k and v at once: 3 * d_model outputs, one matrix." if name == "c_attn" else "")
            raise AssertionError(f"CausalSelfAttention({d_model}, {num_heads}).{name} maps {layer[0]} -> {layer[1]} "
                                 f"features; expected {d_in} -> {d_out}.{hint}")
        if not layer[2]:
            raise AssertionError(f"GPT-2's {name} has a bias: nn.Linear(..., bias=True), the default.")
    extra = sorted(set(data["parameters"]) - {"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"})
    if extra:
        raise AssertionError(f"CausalSelfAttention has parameters GPT-2's attention doesn't: {', '.join(extra)}. One "
                             "fused c_attn replaces separate query, key and value projections.")
    if data["num_heads"] != num_heads:
        raise AssertionError(f"CausalSelfAttention({d_model}, {num_heads}).num_heads is {data['num_heads']}: store it, "
                             "self.num_heads = num_heads (the KV cache of section 6 reads it).")
    for shape, (B, T) in zip(data["shapes"], [(2, 5), (1, 1), (3, 8)]):
        if tuple(shape) != (B, T, d_model):
            raise AssertionError(f"CausalSelfAttention on a ({B}, {T}, {d_model}) input returned shape {tuple(shape)}: "
                                 "attention keeps the shape (B, T, d_model).")
    if data["refusal"] != "ValueError":
        outcome = "built it" if data["refusal"] is None else f"raised {data['refusal']}"
        raise AssertionError(f"CausalSelfAttention(10, 3) should raise ValueError (3 heads cannot share 10 features), "
                             f"but it {outcome}.")


@causal_self_attention_matches_gpt2.judge
def judge_causal_self_attention_matches_gpt2(seeds, outputs):
    for i, (case, output) in enumerate(zip(ATTENTION_VALUE_CASES, outputs)):
        state, x = attention_value_problem(seeds, i, case)
        attn = hf_attention(state, case["d_model"], case["num_heads"])
        with torch.no_grad():
            expected = attn(x, attention_mask=additive_causal(x.shape[1]))[0]
            output = expect_tensor(output, "CausalSelfAttention output")
            right = output.shape == expected.shape and torch.allclose(output.double(), expected, rtol=1e-12, atol=1e-12)
            diagnoses = {} if right else attention_diagnoses(state, x, case["num_heads"])
        expect_close(output, expected, f"CausalSelfAttention({case['d_model']}, {case['num_heads']}) output vs "
                     "transformers' GPT2Attention (float64)", diagnoses=diagnoses, rtol=1e-12, atol=1e-12,
                     hint="c_attn(x) split into q, k, v (that order), each into heads, causal softmax(q kᵀ / √d_head) "
                          "v, heads merged with a transpose, then c_proj.")


@causal_self_attention_is_causal.judge
def judge_causal_self_attention_is_causal(seeds, data):
    base, changed = data
    base = to_numpy(base, "CausalSelfAttention output")
    expect_shape(base, (2, 9, 8), "CausalSelfAttention output")
    for t, after in zip(CAUSAL_CUTS, changed):
        after = to_numpy(after, "CausalSelfAttention output")
        moved = np.abs(after - base).max(axis=(0, 2)) > 1e-9         # (T,): which positions' outputs changed
        if moved[:t].any():
            first = int(np.argmax(moved[:t]))
            if moved[:t].all() or first < t - 1:
                raise AssertionError(f"changing the tokens at positions {t}..8 changed the output at position {first}: "
                                     "the attention is not causal. Mask the scores so that query t reads keys 0..t "
                                     "only.")
            raise AssertionError(f"changing the tokens at positions {t}..8 changed the output at position {t - 1}: "
                                 "your mask lets a token see the next one (torch.ones(T, T).tril(1)?). The diagonal "
                                 "offset must be 0: a token sees itself and the past.")
        if not moved[t:].any():
            raise AssertionError(f"changing the tokens at positions {t}..8 changed no output at all: the attention "
                                 "must compute from its input.")


# ---------------------------------------------------------------- exercise 2: DecoderBlock
BLOCK_NAMES = "norm1, self_attn (CausalSelfAttention), norm2, ffn (FeedForward), dropout"


def block_parameter_shapes(d_model, d_ff):
    shapes = {f"{norm}.{p}": (d_model,) for norm in ("norm1", "norm2") for p in ("weight", "bias")}
    shapes.update({"self_attn.c_attn.weight": (3 * d_model, d_model), "self_attn.c_attn.bias": (3 * d_model,),
                   "self_attn.c_proj.weight": (d_model, d_model), "self_attn.c_proj.bias": (d_model,)})
    shapes.update({"ffn.linear1.weight": (d_ff, d_model), "ffn.linear1.bias": (d_ff,),
                   "ffn.linear2.weight": (d_model, d_ff), "ffn.linear2.bias": (d_model,)})
    return shapes


@decoder_block_structure.judge
def judge_decoder_block_structure(seeds, data):
    d_model, _, d_ff = BLOCK_STRUCTURE_CASE
    missing = [name for name, present in data["attributes"].items() if not present]
    if missing:
        raise AssertionError(f"DecoderBlock has no `{missing[0]}`: the exercise asks for {BLOCK_NAMES}.")
    expected = block_parameter_shapes(d_model, d_ff)
    found = data["parameters"]
    for name, shape in expected.items():
        if name not in found:
            raise AssertionError(f"DecoderBlock({d_model}, 3, {d_ff}) has no parameter `{name}`: use the submodule "
                                 f"names {BLOCK_NAMES}. Found: {', '.join(found) or 'none'}.")
        if found[name] != shape:
            raise AssertionError(f"DecoderBlock.{name} has shape {found[name]}, expected {shape}.")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise AssertionError(f"DecoderBlock has parameters GPT-2's block doesn't: {', '.join(extra)}.")
    if 0.25 not in data["dropouts"]:
        raise AssertionError("DecoderBlock(..., dropout=0.25) has no nn.Dropout(0.25): pass `dropout` on to "
                             "self.dropout = nn.Dropout(dropout).")
    if data["eps"] != [1e-5, 1e-5]:
        raise AssertionError(f"the LayerNorms' eps are {data['eps']}; with eps=1e-5 both must use it: "
                             "LayerNorm(d_model, eps).")
    for shape, (B, T) in zip(data["shapes"], [(2, 5), (1, 1), (3, 7)]):
        if tuple(shape) != (B, T, d_model):
            raise AssertionError(f"DecoderBlock on a ({B}, {T}, {d_model}) input returned shape {tuple(shape)}: a "
                                 "block keeps the shape (B, T, d_model), so that blocks can be stacked.")


def block_diagnoses(state, x, case):
    h, eps = case["num_heads"], case["eps"]

    def by_hand(eps=eps, **switches):
        return block_by_hand(state, x, h, eps, **switches)

    found = {
        "you used the exact GELU; GPT-2's is the tanh approximation: FeedForward(..., approximate='tanh').":
            by_hand(approximate="none"),
        "your block is post-LN (it normalises each residual sum, as BERT does); GPT-2 is pre-LN: "
        "x = x + attn(norm1(x)), x = x + ffn(norm2(x)).": by_hand(post_ln=True),
        "the skip connections add the normalised x; they must add the raw stream: x = x + attn(norm1(x)).":
            by_hand(raw_residual=False),
        "the LayerNorms ignore the eps argument (LayerNorm's default is BERT's 1e-12): LayerNorm(d_model, eps).":
            by_hand(eps=1e-12),
    }
    if eps != 1e-5:
        found["the LayerNorms use GPT-2's eps=1e-5 whatever the block is given: pass eps on, "
              "LayerNorm(d_model, eps)."] = by_hand(eps=1e-5)
    return found


@decoder_block_matches_gpt2.judge
def judge_decoder_block_matches_gpt2(seeds, outputs):
    for i, (case, output) in enumerate(zip(BLOCK_VALUE_CASES, outputs)):
        state, x = block_value_problem(seeds, i, case)
        block = hf_block(state, case["d_model"], case["num_heads"], case["d_ff"], case["eps"])
        with torch.no_grad():
            expected = block(x, attention_mask=additive_causal(x.shape[1]))
            expected = expected[0] if isinstance(expected, tuple) else expected
            output = expect_tensor(output, "DecoderBlock output")
            right = output.shape == expected.shape and torch.allclose(output.double(), expected, rtol=1e-12, atol=1e-12)
            diagnoses = {} if right else block_diagnoses(state, x, case)
        expect_close(output, expected, f"DecoderBlock output (d_model={case['d_model']}, eps={case['eps']:g}) vs "
                     "transformers' GPT2Block (float64)", diagnoses=diagnoses, rtol=1e-12, atol=1e-12,
                     hint="x + attn(norm1(x)), then + ffn(norm2(x)). " + EARLIER)


@gpt_structure.judge
def judge_gpt_structure(seeds, data):
    dims = GPT_STRUCTURE_DIMS
    missing = [name for name, present in data["attributes"].items() if not present]
    if missing:
        raise AssertionError(f"GPT has no `{missing[0]}`: the exercise asks for {GPT_NAMES}.")
    if data["blocks"] is None or len(data["blocks"]) != dims["num_layers"]:
        raise AssertionError(f"GPT(..., num_layers=2, ...).blocks should be an nn.ModuleList of 2 DecoderBlocks, "
                             f"found {data['blocks']}.")
    if data["head"] is None:
        raise AssertionError("GPT.lm_head should be nn.Linear(d_model, vocab_size, bias=False).")
    if data["head"][:2] != [dims["d_model"], dims["vocab_size"]]:
        raise AssertionError(f"lm_head maps {data['head'][0]} -> {data['head'][1]} features; it maps d_model "
                             f"({dims['d_model']}) to the vocabulary ({dims['vocab_size']}).")
    if data["head"][2]:
        raise AssertionError("GPT-2's LM head has no bias: nn.Linear(d_model, vocab_size, bias=False).")
    if 0.2 not in data["dropouts"]:
        raise AssertionError("GPT(..., dropout=0.2) has no nn.Dropout(0.2): pass `dropout` to the embeddings' dropout "
                             "and to every DecoderBlock.")
    if data["max_positions"] != dims["max_positions"]:
        raise AssertionError("GPT.max_positions must hold the context window (the given line of __init__).")
    params = data["parameters"]
    positions = params.get("position_embeddings.table.weight", params.get("position_embeddings.weight"))
    if positions != (dims["max_positions"], dims["d_model"]):
        raise AssertionError(f"the position table should be (max_positions, d_model) = "
                             f"({dims['max_positions']}, {dims['d_model']}): LearnedPositionalEmbedding(max_positions, "
                             "d_model).")
    for shape, (B, T) in zip(data["shapes"], [(2, 7), (1, 16), (3, 1)]):
        if tuple(shape) != (B, T, dims["vocab_size"]):
            raise AssertionError(f"GPT on ({B}, {T}) ids returned shape {tuple(shape)}; logits are (B, T, vocab_size).")


def gpt_parameter_count(vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None):
    d_ff = d_ff or 4 * d_model
    block = sum(math.prod(s) for s in block_parameter_shapes(d_model, d_ff).values())
    return vocab_size * d_model + max_positions * d_model + num_layers * block + 2 * d_model


@gpt_head_is_tied.judge
def judge_gpt_head_is_tied(seeds, data):
    expected = gpt_parameter_count(**GPT_STRUCTURE_DIMS)
    if not data["same_parameter"]:
        if data["count"] == expected + GPT_STRUCTURE_DIMS["vocab_size"] * GPT_STRUCTURE_DIMS["d_model"]:
            raise AssertionError("the LM head is untied: it has its own (V, d) matrix. Tie it, self.lm_head.weight = "
                                 "self.token_embeddings.weight: one Parameter, used at both ends.")
        raise AssertionError("lm_head.weight is not the token embedding table: self.lm_head.weight = "
                             "self.token_embeddings.weight (a copy drifts apart as soon as training starts).")
    if data["difference_after_a_step"] not in (0.0, None):
        raise AssertionError("after one training step the head and the embedding table differ: they must be one "
                             "Parameter.")
    if data["count"] != expected:
        raise AssertionError(f"GPT has {data['count']} parameters; with a tied head and no bias it has {expected}: "
                             "tokens, positions, the blocks and the final LayerNorm.")


def gpt_diagnoses(hf, ids):
    T, d = ids.shape[1], hf.config.n_embd
    wte, wpe = hf.transformer.wte.weight, hf.transformer.wpe.weight
    tokens, positions = wte[ids], wpe[:T]
    captured = {}
    hook = hf.transformer.ln_f.register_forward_hook(lambda m, args, out: captured.update(before=args[0]))
    hf(ids)
    hook.remove()
    found = {
        "your token embeddings are scaled by √d_model; GPT-2 doesn't scale them: TokenEmbedding(vocab_size, d_model, "
        "scale=False).": hf(inputs_embeds=tokens * math.sqrt(d)).logits,
        "the position embeddings are missing: add position_embeddings(input_ids) to the token embeddings.":
            hf(inputs_embeds=tokens - positions).logits,
        "the final LayerNorm is missing: pre-LN blocks never normalise the stream, so GPT applies final_norm before "
        "the head.": captured["before"] @ wte.T,
    }
    if T < hf.config.n_positions:
        found["the positions start at 1; the first token takes row 0 of the position table."] = hf(
            inputs_embeds=tokens + wpe[1:T + 1] - positions).logits
    return found


@gpt_matches_gpt2.judge
def judge_gpt_matches_gpt2(seeds, outputs):
    for i, output in enumerate(outputs):
        dims, state, ids = gpt_value_problem(seeds, i)
        hf = hf_model(state, dims)
        with torch.no_grad():
            expected = hf(ids).logits
            output = expect_tensor(output, "GPT logits")
            right = output.shape == expected.shape and torch.allclose(output.double(), expected, rtol=1e-12, atol=1e-12)
            diagnoses = {} if right else gpt_diagnoses(hf, ids)
        expect_close(output, expected, f"GPT logits ({dims['num_layers']} blocks) vs transformers' GPT2LMHeadModel "
                     "(float64)", diagnoses=diagnoses, rtol=1e-12, atol=1e-12,
                     hint="token + position embeddings (unscaled), dropout, the blocks in order, final_norm, the tied "
                          "head. " + EARLIER)


@lm_loss_values.judge
def judge_lm_loss_values(seeds, results):
    from transformers.loss.loss_utils import ForCausalLMLoss
    for (logits, ids), (loss, connected) in zip(loss_problem(seeds), results):
        B, T, V = logits.shape
        expect_shape(expect_tensor(loss, "lm_loss"), (), "lm_loss",
                     "One number: the mean over all B (T - 1) predictions.")
        if not connected:
            raise AssertionError("lm_loss's result has no gradient: keep it connected to the logits (no .item(), "
                                 ".detach() or NumPy), so that loss.backward() can train the model.")
        expected = ForCausalLMLoss(logits, ids, vocab_size=V)
        flat = lambda lo, ta: F.cross_entropy(lo.reshape(-1, V), ta.reshape(-1))  # noqa: E731
        diagnoses = {
            "you compare the logits at position t with the token at position t itself: the model would learn to copy "
            "its input. The logits at t predict token t + 1: logits[:, :-1] against input_ids[:, 1:].":
                flat(logits, ids),
            "the shift goes the wrong way: logits[:, 1:] against input_ids[:, :-1] asks position t + 1 for the token "
            "before it. The logits at t predict token t + 1: logits[:, :-1] against input_ids[:, 1:].":
                flat(logits[:, 1:], ids[:, :-1]),
            "you summed the cross-entropies; take their mean over the B (T - 1) predictions.": expected * B * (T - 1),
            "you averaged over B * T positions, but only B (T - 1) are predicted.": expected * (T - 1) / T,
        }
        # ForCausalLMLoss upcasts to float32: the tolerance follows the oracle's precision (a float64 answer is
        # within 2.5e-7 of it, relatively, over 300 keys; at 1e-7 about 4% of keys failed the reference solution)
        expect_close(loss, expected, f"lm_loss of ({B}, {T}, {V}) logits", diagnoses=diagnoses, rtol=1e-6, atol=1e-6,
                     hint="the mean cross-entropy of logits[:, :-1] against input_ids[:, 1:].")


@perplexity_values.judge
def judge_perplexity_values(seeds, data):
    value, seen = data
    if not seen:
        raise AssertionError("perplexity never ran the model.")
    if any(training for _, training, _ in seen):
        raise AssertionError("perplexity ran the model in train mode: call model.eval() first. With dropout on, the "
                             "measurement is random.")
    state, batches = perplexity_problem(seeds)
    hf = hf_model(state, PPL_DIMS)
    V = PPL_DIMS["vocab_size"]
    with torch.no_grad():
        sums = [F.cross_entropy(hf(b).logits[:, :-1].reshape(-1, V), b[:, 1:].reshape(-1), reduction="sum").item()
                for b in batches]
        unshifted = [F.cross_entropy(hf(b).logits.reshape(-1, V), b.reshape(-1), reduction="sum").item()
                     for b in batches]
    counts = [b[:, 1:].numel() for b in batches]
    expected = math.exp(sum(sums) / sum(counts))
    diagnoses = {
        "you averaged the per-batch perplexities: average the loss over all predicted tokens first, then take one "
        "exponential.": sum(math.exp(s / c) for s, c in zip(sums, counts)) / len(batches),
        "you averaged the per-batch mean losses, so a small batch counts as much as a large one: weight each batch by "
        "its B (T - 1) predictions (or sum the token losses).":
            math.exp(sum(s / c for s, c in zip(sums, counts)) / len(batches)),
        "you counted B * T predictions per batch; there are B (T - 1).":
            math.exp(sum(sums) / sum(b.numel() for b in batches)),
        "the predictions are not shifted: the logits at t score token t + 1.":
            math.exp(sum(unshifted) / sum(b.numel() for b in batches)),
    }
    expect_close(value, expected, "perplexity", diagnoses=diagnoses, rtol=1e-6, atol=1e-9,
                 hint="exp(sum of every predicted token's NLL / number of predicted tokens). " + EARLIER)


def describe_mismatch(name, ours, state):
    for other, value in state.items():
        if other == name or other == "lm_head.weight":
            continue
        if value.shape == ours.shape and torch.allclose(ours, value):
            return f"model.{name} holds what belongs in model.{other}."
    expected = state[name]
    if expected.dim() == 2:
        stored = expected.T.contiguous()          # GPT-2's Conv1D storage, (in, out)
        if stored.shape == ours.shape and torch.allclose(ours, stored):
            return (f"model.{name} holds GPT-2's weight as stored, untransposed: a Conv1D stores (in_features, "
                    "out_features), nn.Linear (out_features, in_features), so copy conv.weight.T. (The matrix is "
                    "square, so copy_ raised no error.)")
        if stored.numel() == ours.numel() and torch.allclose(ours, stored.reshape(ours.shape)):
            return (f"model.{name} holds GPT-2's weight reshaped to nn.Linear's shape: a reshape re-reads the stored "
                    "values row by row, a transpose swaps rows and columns. Copy conv.weight.T.")
    if name.endswith("c_attn.weight") or name.endswith("c_attn.bias"):
        return (f"model.{name} is wrong: GPT-2's c_attn is one (d, 3d) matrix with W_Q, W_K, W_V side by side; "
                "copy its transpose, (3d, d), as one matrix (the bias (3d,) as it is).")
    return f"model.{name} was not copied from GPT-2 (see the table of names)."


@load_gpt2_copies_every_weight.judge
def judge_load_gpt2_copies_every_weight(seeds, data):
    state, _ = load_problem(seeds, 970, LOAD_DIMS)
    loaded = data["state"]
    for name, expected in state.items():
        ours = loaded.get(name)
        if ours is None:
            raise AssertionError(f"the loaded model has no {name}.")
        ours = expect_tensor(ours, name).double()
        if ours.shape != expected.shape or not torch.allclose(ours, expected, rtol=0, atol=1e-12):
            raise AssertionError(describe_mismatch(name, ours, state))
    if not data["tied"]:
        raise AssertionError("after loading, lm_head.weight is no longer the token embedding table: copy into the "
                             "table in place (weight.copy_(...)), never assign a new Parameter.")


@load_gpt2_parity.judge
def judge_load_gpt2_parity(seeds, logits):
    state, ids = load_problem(seeds, 971, LOAD_DIMS)
    expect_close(logits, hf_logits(state, LOAD_DIMS, ids), "logits after loading (float64) vs GPT2LMHeadModel",
                 rtol=0, atol=1e-5, hint="Copy every weight in the table; transpose every Conv1D weight. "
                                         "(Graded on a reference GPT, so only your loader counts here.)")


@load_gpt2_any_size.judge
def judge_load_gpt2_any_size(seeds, data):
    logits, refusals = data
    state, ids = load_problem(seeds, 972, ANY_SIZE_DIMS)
    expect_close(logits, hf_logits(state, ANY_SIZE_DIMS, ids),
                 "a 3-block GPT (d_ff = 3 d_model) loaded from a GPT2Model",
                 rtol=0, atol=1e-5, hint="Loop over all the blocks, read sizes from the models, and accept a GPT2Model "
                                         "(no .transformer) as well as a GPT2LMHeadModel.")
    for label, error in refusals.items():
        if error is None:
            raise AssertionError(f"load_gpt2_weights loaded a 3-block GPT-2 with 20 positions into a model with "
                                 f"{label} without complaint: copy with tensor.copy_() (it checks shapes) and zip the "
                                 "blocks with strict=True, so that a wrong size fails loudly.")


# ---------------------------------------------------------------- exercise 7: configure_optimizer
def oracle_groups(names, shapes, rule="nanogpt"):
    """The parameter names of the decay group and of the other, by a rule: nanoGPT's (every tensor with >= 2
    dimensions decays) or one of the usual mistakes."""
    if rule == "nanogpt":
        decays = lambda name: len(shapes[name]) >= 2                                             # noqa: E731
    elif rule == "everything":
        decays = lambda name: True                                                               # noqa: E731
    elif rule == "weights":                  # every tensor called ...weight: LayerNorm gains included
        decays = lambda name: name.endswith("weight")                                            # noqa: E731
    elif rule == "no_embeddings":            # minGPT's rule: linear layers only
        decays = lambda name: len(shapes[name]) >= 2 and "embeddings" not in name                # noqa: E731
    return [n for n in names if decays(n)], [n for n in names if not decays(n)]


GROUP_MISTAKES = {
    "weights": "the LayerNorm gains are in the decay group: decay pulls them toward 0, not toward their neutral value "
               "1. Only tensors with two or more dimensions decay (p.dim() >= 2).",
    "everything": "every parameter decays, biases and LayerNorm parameters included: only tensors with two or more "
                  "dimensions decay (p.dim() >= 2).",
    "no_embeddings": "the embedding tables are not decayed: they are matrices like the linear weights (and the token "
                     "table is the head's weight too), so they decay with every tensor of two or more dimensions.",
}


@configure_optimizer_groups.judge
def judge_configure_optimizer_groups(seeds, data):
    state, names, _ = optimizer_problem(seeds)
    shapes = {name: tuple(state[name].shape) for name in names}
    if data["kind"] != "AdamW":
        raise AssertionError(f"configure_optimizer returned a torch.optim.{data['kind']}; the recipe's optimizer is "
                             "torch.optim.AdamW (weight decay decoupled from the adaptive step).")
    groups = data["groups"]
    if len(groups) != 2:
        raise AssertionError(f"configure_optimizer's AdamW has {len(groups)} parameter group(s); it needs two: the "
                             "decayed tensors (group 0), then the others (group 1).")
    listed = [name for group in groups for name in group["names"]]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if twice:
        raise AssertionError(f"{twice[0]} appears twice in the parameter groups: list each parameter once "
                             "(model.parameters() lists the tied head once).")
    missing = [name for name in names if name not in listed]
    if missing:
        raise AssertionError(f"{missing[0]} is in no parameter group: every parameter of the model is trained.")
    strangers = [name for name in listed if name not in names]
    if strangers:
        raise AssertionError(f"a group holds {strangers[0]}: only the model's own parameters belong in them.")
    decayed, kept = set(groups[0]["names"]), set(groups[1]["names"])
    expected = oracle_groups(names, shapes)
    if (decayed, kept) != (set(expected[0]), set(expected[1])):
        if (kept, decayed) == (set(expected[0]), set(expected[1])):
            raise AssertionError("the groups are in the other order: group 0 holds the decayed tensors (two or more "
                                 "dimensions), group 1 the others.")
        for rule, message in GROUP_MISTAKES.items():
            wrong = oracle_groups(names, shapes, rule)
            if (decayed, kept) == (set(wrong[0]), set(wrong[1])):
                raise AssertionError(message)
        wrong_ones = sorted((decayed - set(expected[0])) | (kept - set(expected[1])))
        raise AssertionError(f"{wrong_ones[0]} is in the wrong group: tensors with two or more dimensions decay, the "
                             "others don't.")
    settings = OPTIMIZER_SETTINGS
    if [groups[0]["weight_decay"], groups[1]["weight_decay"]] != [settings["weight_decay"], 0.0]:
        raise AssertionError(f"the groups' weight decays are {groups[0]['weight_decay']} and {groups[1]['weight_decay']}; "
                             f"with weight_decay={settings['weight_decay']} they are {settings['weight_decay']} and 0.0.")
    for group in groups:
        if group["lr"] != settings["lr"] or group["betas"] != list(settings["betas"]):
            raise AssertionError(f"a group has lr {group['lr']} and betas {group['betas']}; configure_optimizer was "
                                 f"given lr={settings['lr']} and betas={settings['betas']}: pass them on to AdamW.")


def adamw_oracle(seeds, rule="nanogpt"):
    """torch.optim.AdamW on the check's weights, with the groups of a rule and the probe's gradients."""
    state, names, grads = optimizer_problem(seeds)
    shapes = {name: tuple(state[name].shape) for name in names}
    params = {name: torch.nn.Parameter(state[name].clone()) for name in names}
    decay, keep = oracle_groups(names, shapes, rule)
    settings = OPTIMIZER_SETTINGS
    optimizer = torch.optim.AdamW([{"params": [params[n] for n in decay], "weight_decay": settings["weight_decay"]},
                                   {"params": [params[n] for n in keep], "weight_decay": 0.0}],
                                  lr=settings["lr"], betas=settings["betas"])
    for step_grads in grads:
        for name in names:
            params[name].grad = step_grads[name].clone()
        optimizer.step()
    return {name: p.detach() for name, p in params.items()}


@configure_optimizer_steps.judge
def judge_configure_optimizer_steps(seeds, found):
    expected = adamw_oracle(seeds)
    for name, value in expected.items():
        if name not in found:
            raise AssertionError(f"after the steps the model has no {name}.")
        ours = expect_tensor(found[name], name)
        if ours.shape == value.shape and torch.allclose(ours.double(), value, rtol=1e-12, atol=1e-12):
            continue
        diagnoses = {message: adamw_oracle(seeds, rule)[name] for rule, message in GROUP_MISTAKES.items()}
        expect_close(ours, value, f"{name} after {OPTIMIZER_STEPS} AdamW steps vs torch.optim.AdamW with the right "
                     "groups", diagnoses=diagnoses, rtol=1e-12, atol=1e-12,
                     hint=f"AdamW(groups, lr={OPTIMIZER_SETTINGS['lr']}, betas={OPTIMIZER_SETTINGS['betas']}), group 0 "
                          f"decaying by weight_decay={OPTIMIZER_SETTINGS['weight_decay']}, group 1 by 0.")


# ---------------------------------------------------------------- exercise 8: adamw_update
def torch_adamw(start, grads, rates, betas, eps, weight_decay):
    """torch.optim.AdamW's trajectory of one tensor, and its final moments: the oracle."""
    param = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW([param], lr=rates[0], betas=betas, eps=eps, weight_decay=weight_decay)
    trajectory = []
    for grad, lr in zip(grads, rates):
        optimizer.param_groups[0]["lr"] = lr
        param.grad = grad.clone()
        optimizer.step()
        trajectory.append(param.detach().clone())
    state = optimizer.state[param]
    return trajectory, state["exp_avg"], state["exp_avg_sq"]


def adamw_by_hand(start, grads, rates, betas, eps, weight_decay, mistake):
    """The trajectories of the usual mistakes, to name the one a wrong answer made."""
    beta1, beta2 = (0.9, 0.999) if mistake == "default betas" else betas
    param, m, v, trajectory = start.clone(), torch.zeros_like(start), torch.zeros_like(start), []
    for t, (grad, lr) in enumerate(zip(grads, rates), start=1):
        if mistake == "coupled":                       # Adam with L2: the decay joins the gradient
            grad = grad + weight_decay * param
        elif mistake != "decay after":
            param = param * (1 - lr * weight_decay)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad * grad
        m_hat, v_hat = (m, v) if mistake == "no bias correction" else (m / (1 - beta1 ** t), v / (1 - beta2 ** t))
        denominator = (v_hat + eps).sqrt() if mistake == "eps inside" else v_hat.sqrt() + eps
        param = param - lr * m_hat / denominator
        if mistake == "decay after":
            param = param * (1 - lr * weight_decay)
        trajectory.append(param)
    return trajectory


ADAMW_MISTAKES = {
    "no bias correction": "the first steps are off by the bias correction: m and v start at 0, so after t steps they "
                          "are too small by the factors 1 - beta1**t and 1 - beta2**t; divide them by those factors "
                          "(m_hat, v_hat) before the update.",
    "coupled": "the weight decay went into the gradient (Adam with L2 regularisation), where the adaptive scaling "
               "divides it away: AdamW decouples it, shrinking the parameter itself by lr * weight_decay * param.",
    "eps inside": "eps is inside the square root: the update divides by sqrt(v_hat) + eps, not sqrt(v_hat + eps) (they "
                  "differ most where gradients are tiny, as here).",
    "default betas": "the betas you were given were not used (these steps match betas (0.9, 0.999)): the averages "
                     "must forget at the rates the caller asks for, betas[0] for m and betas[1] for v.",
    "decay after": "the decay was applied after the Adam step, to the updated parameter: torch.optim.AdamW shrinks the "
                   "parameter as it was before the step, then takes the step.",
}


def judge_adamw(seeds, n, cases, results, what):
    if len(results) != len(cases):
        raise AssertionError(f"adamw_update ran {len(results)} cases of {len(cases)}.")
    for (start, grads), case, found in zip(adamw_problem(seeds, n, cases), cases, results):
        shape, _, rates, betas, eps, weight_decay = case
        setting = f"lr {rates[0]:g}, betas {betas}, eps {eps:g}, weight_decay {weight_decay:g}"
        expected, exp_avg, exp_avg_sq = torch_adamw(start, grads, rates, betas, eps, weight_decay)
        if found["step"] != len(rates):
            raise AssertionError(f"after {len(rates)} steps state['step'] is {found['step']}: count the steps taken, "
                                 "this one included (the bias correction's t).")
        for t, (ours, theirs) in enumerate(zip(found["trajectory"], expected), start=1):
            ours = expect_tensor(ours, "the parameter")
            if torch.allclose(ours.double(), theirs, rtol=1e-10, atol=1e-12):
                continue
            if torch.equal(ours, start if t == 1 else found["trajectory"][t - 2]):
                raise AssertionError(f"step {t} did not change the parameter: update param in place (param.mul_, "
                                     "param.addcdiv_, param.sub_...), since the optimizer holds that tensor.")
            diagnoses = lambda t=t: {message: adamw_by_hand(start, grads, rates, betas, eps, weight_decay, mistake)[t - 1]  # noqa: E731
                                     for mistake, message in ADAMW_MISTAKES.items()}
            expect_close(ours, theirs, f"the parameter after step {t} of {what} ({setting})", diagnoses=diagnoses,
                         rtol=1e-10, atol=1e-12,
                         hint="m and v as running averages of g and g**2, both divided by their bias corrections, "
                              "the parameter shrunk by lr * weight_decay, then moved by lr * m_hat / (sqrt(v_hat) + eps).")
        expect_close(expect_tensor(found["exp_avg"], "state['exp_avg']"), exp_avg, f"state['exp_avg'] ({setting})",
                     rtol=1e-10, atol=1e-12, hint="exp_avg keeps m, the running average of the gradient, without its "
                                                 "bias correction (torch's state does the same).")
        expect_close(expect_tensor(found["exp_avg_sq"], "state['exp_avg_sq']"), exp_avg_sq,
                     f"state['exp_avg_sq'] ({setting})", rtol=1e-10, atol=1e-12,
                     hint="exp_avg_sq keeps v, the running average of the squared gradient, without its bias "
                          "correction.")


@adamw_update_first_step.judge
def judge_adamw_update_first_step(seeds, results):
    judge_adamw(seeds, 1205, ADAMW_FIRST_CASES, results, "one step from an empty state")


@adamw_update_matches_torch.judge
def judge_adamw_update_matches_torch(seeds, results):
    judge_adamw(seeds, 1206, ADAMW_STEP_CASES, results, "torch.optim.AdamW's steps")


# ---------------------------------------------------------------- exercise 8: lr_at
def torch_schedule(max_lr, warmup, total, min_lr):
    """The learning rate of steps 0..total from PyTorch's schedulers: LinearLR for the warm-up, then
    CosineAnnealingLR, joined by SequentialLR."""
    import warnings
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=max_lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # SequentialLR steps its second scheduler with an epoch argument
        scheduler = SequentialLR(optimizer, [LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0,
                                                      total_iters=warmup - 1),
                                             CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=min_lr)],
                                 milestones=[warmup])
        rates = []
        for _ in range(total + 1):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    return rates


def schedule_mistakes(max_lr, warmup, total, min_lr, steps):
    def cosine(step, start, length, floor):
        progress = min(1.0, max(0.0, (step - start) / length))
        return floor + 0.5 * (max_lr - floor) * (1 + math.cos(math.pi * progress))

    def shape(warm, cos):
        return [warm(s) if s < warmup else cos(s) for s in range(steps)]

    return {
        "the warm-up starts at 0: step 0 already updates the weights, so its rate is max_lr * (step + 1) / "
        "warmup_steps (max_lr / warmup_steps at step 0, max_lr at step warmup_steps - 1).":
            shape(lambda s: max_lr * s / warmup, lambda s: cosine(s, warmup, total - warmup, min_lr)),
        "the cosine decays to 0, not to the floor: min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2.":
            shape(lambda s: max_lr * (s + 1) / warmup, lambda s: cosine(s, warmup, total - warmup, 0.0)),
        "the cosine's progress counts from step 0 over total_steps; it counts from the end of the warm-up: "
        "(step - warmup_steps) / (total_steps - warmup_steps).":
            shape(lambda s: max_lr * (s + 1) / warmup, lambda s: cosine(s, 0, total, min_lr)),
        "after total_steps the rate should stay at min_lr; yours follows the cosine back up.":
            shape(lambda s: max_lr * (s + 1) / warmup,
                  lambda s: min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))),
    }


def judge_schedules(cases, results):
    for (max_lr, warmup, total, min_lr), found in zip(cases, results):
        expected = torch_schedule(max_lr, warmup, total, min_lr) + [min_lr] * 3   # the floor after total_steps
        described = f"lr_at(step, max_lr={max_lr:.4g}, warmup_steps={warmup}, total_steps={total}, min_lr={min_lr:.4g})"
        expect_close(found, expected, f"{described} for steps 0..{total + 3} vs PyTorch's LinearLR + CosineAnnealingLR",
                     diagnoses=schedule_mistakes(max_lr, warmup, total, min_lr, total + 4), rtol=1e-9,
                     atol=1e-12 * max_lr, hint="warm-up max_lr * (step + 1) / warmup_steps, then the cosine from max_lr "
                                               "to min_lr between warmup_steps and total_steps, then min_lr.")


@lr_at_values.judge
def judge_lr_at_values(seeds, results):
    judge_schedules(lr_value_cases(seeds), results)


@lr_at_matches_torch.judge
def judge_lr_at_matches_torch(seeds, results):
    judge_schedules(lr_torch_cases(seeds), results)


# ---------------------------------------------------------------- exercise 9: clip_grad_norm
def torch_clipped(grads, max_norm):
    params = []
    for grad in grads:
        param = torch.nn.Parameter(torch.zeros(1 if grad is None else grad.shape,
                                               dtype=torch.float64 if grad is None else grad.dtype))
        param.grad = None if grad is None else grad.clone()
        params.append(param)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return norm, [p.grad for p in params]


def clip_mistakes(grads, max_norm):
    present = [g for g in grads if g is not None]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in present))

    def scaled(factor_of):
        return [None if g is None else g * factor_of(g) for g in grads]

    return {
        "you clip each parameter's gradient on its own; the norm is global, one length over all parameters together, "
        "and one factor scales every gradient (so the step keeps its direction).":
            (norm, scaled(lambda g: min(1.0, max_norm / (float(g.double().norm()) + 1e-6)))),
        "the gradients were scaled up to max_norm although they were shorter: the factor is min(1, max_norm / "
        "(norm + 1e-6)), never more than 1.": (norm, scaled(lambda g: max_norm / (norm + 1e-6))),
    }


def judge_clipping(cases, results):
    for i, ((grads, max_norm), (norm, clipped)) in enumerate(zip(cases, results)):
        float32 = any(g is not None and g.dtype == torch.float32 for g in grads)
        rtol = 1e-5 if float32 else 1e-10
        expected_norm, expected_grads = torch_clipped(grads, max_norm)
        described = f"case {i + 1} ({len(grads)} parameters, max_norm {max_norm:.3g})"
        squared = sum(float(g.double().pow(2).sum()) for g in grads if g is not None)
        if expected_norm > 0 and abs(norm - squared) <= rtol * squared and abs(squared - expected_norm) > 1e-6:
            raise AssertionError(f"clip_grad_norm returned the sum of squares, {norm:.6g}, in {described}: the norm is "
                                 "its square root.")
        if expected_norm > max_norm and math.isclose(norm, max_norm * expected_norm / (expected_norm + 1e-6),
                                                      rel_tol=rtol):
            raise AssertionError(f"clip_grad_norm returned the norm after clipping in {described}; return the norm "
                                 "measured before (what PyTorch returns: it tells how large the gradient was).")
        mistakes = clip_mistakes(grads, max_norm)
        for grad, ours, theirs in zip(grads, clipped, expected_grads):
            if grad is None:
                if ours is not None:
                    raise AssertionError(f"a parameter without a gradient got one in {described}: skip parameters whose "
                                         ".grad is None.")
                continue
        flat = lambda gs: torch.cat([g.double().flatten() for g in gs if g is not None])   # noqa: E731
        if any(g is None for g in clipped if g is not None) or len(clipped) != len(grads):
            raise AssertionError("clip_grad_norm changed which parameters have gradients.")
        diagnoses = {message: flat(wrong[1]) for message, wrong in mistakes.items()}
        expect_close(flat(clipped), flat(expected_grads), f"the gradients after clip_grad_norm in {described} vs "
                     "torch.nn.utils.clip_grad_norm_", diagnoses=diagnoses, rtol=rtol, atol=1e-12,
                     hint="multiply every gradient, in place, by min(1, max_norm / (norm + 1e-6)), norm taken over all "
                          "parameters together.")
        expect_close(norm, expected_norm, f"the norm clip_grad_norm returned in {described}", rtol=rtol, atol=1e-12,
                     hint="sqrt of the sum of every squared gradient entry of every parameter, before clipping.")


@clip_grad_norm_values.judge
def judge_clip_grad_norm_values(seeds, results):
    judge_clipping(clip_cases(seeds, 1220, designed=True), results)


@clip_grad_norm_matches_torch.judge
def judge_clip_grad_norm_matches_torch(seeds, results):
    judge_clipping(clip_cases(seeds, 1221, designed=False), results)


# ---------------------------------------------------------------- exercise 10: train
EVAL_AT = [[3, 6, 7], [9]]


def hand_sgd(state, batches, held_out, rates, variant="right"):
    """GPT2LMHeadModel trained by hand with the recipe (rate from the schedule, clipping, SGD): the oracle (variant
    'right') and the classic mistakes. Returns the two runs' losses and held-out losses, and the final weights."""
    hf = hf_model(state, TRAIN_DIMS)
    params = [p for p in hf.parameters()]
    V = TRAIN_DIMS["vocab_size"]
    loss_of = lambda ids: F.cross_entropy(hf(ids).logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))  # noqa: E731
    runs, accumulated, previous_rate = [], [torch.zeros_like(p) for p in params], 99.0
    for start, stop in ((0, TRAIN_STEPS), (TRAIN_STEPS, RESUME_STEPS)):
        losses, held = [], []
        for step in range(start, stop):
            loss = loss_of(batches[step])
            grads = list(torch.autograd.grad(loss, params))
            with torch.no_grad():
                if variant == "accumulate":      # no zero_grad: every step adds to the old gradients
                    accumulated = [a + g for a, g in zip(accumulated, grads)]
                    grads = [a.clone() for a in accumulated]
                if variant != "no_clip":
                    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
                    grads = [g * min(1.0, TRAIN_CLIP / (norm + 1e-6)) for g in grads]
                rate = {"rate_late": previous_rate, "restart": rates[step - start]}.get(variant, rates[step])
                previous_rate = rates[step]
                for p, g in zip(params, grads):
                    p -= rate * g
            losses.append(loss.item())
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == stop:
                with torch.no_grad():
                    held.append((step + 1, loss_of(held_out).item()))
        runs.append((losses, held))
    return runs, dict(hf.state_dict())


TRAIN_MISTAKES = {
    "accumulate": "the gradients add up from step to step: call optimizer.zero_grad() before loss.backward() in every "
                  "step.",
    "no_clip": "the gradients are not clipped: call clip_grad_norm(model.parameters(), max_grad_norm) between "
               "loss.backward() and optimizer.step().",
    "rate_late": "each step uses the previous step's learning rate: set the rate from lr_schedule(step) before "
                 "optimizer.step(), not after it.",
    "restart": "the continued run (start_step=7) took its rates from lr_schedule(0), lr_schedule(1), ...: the step "
               "counter starts at start_step, and the schedule reads it.",
}


@train_steps_match_reference.judge
def judge_train_steps_match_reference(seeds, data):
    state, batches, held_out, rates = train_problem(seeds, 980)
    expected_runs, expected_state = hand_sgd(state, batches, held_out, rates)
    if not expected_runs[0][0][-1] < expected_runs[0][0][0] + 1.0:
        raise RuntimeError("the reference run diverged on this seed: the test itself is wrong")
    runs = data["runs"]
    for (start, stop), eval_at, run in zip(((0, TRAIN_STEPS), (TRAIN_STEPS, RESUME_STEPS)), EVAL_AT, runs):
        losses, held = run["losses"], run["held_out"]
        if len(losses) != stop - start:
            raise AssertionError(f"train(..., steps={stop}, start_step={start}) returned {len(losses)} losses; it runs "
                                 f"steps {start}..{stop - 1}, one loss each.")
        if not all(type(x) is float for x in losses):
            kinds = sorted({type(x).__name__ for x in losses})
            raise AssertionError(f"the losses are {', '.join(kinds)}, not Python floats: store loss.item(). A list of "
                                 "loss tensors keeps every step's graph alive (a memory leak that grows with training).")
        steps = [pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None for pair in held]
        if steps != eval_at:
            raise AssertionError(f"train(..., steps={stop}, start_step={start}, eval_every={EVAL_EVERY}) should measure "
                                 f"after steps {eval_at} (every {EVAL_EVERY} steps done, counted from 0, and after the "
                                 f"last); found {steps}.")
        if not all(type(pair[1]) is float for pair in held):
            raise AssertionError("each held-out loss should be a Python float (loss.item()).")
    found = [x for run in runs for x in run["losses"]]
    expected = [x for run in expected_runs for x in run[0]]
    right = np.allclose(found, expected, rtol=1e-6, atol=1e-8)
    diagnoses = {} if right else {message: [x for run in hand_sgd(state, batches, held_out, rates, mistake)[0]
                                            for x in run[0]] for mistake, message in TRAIN_MISTAKES.items()}
    expect_close(found, expected, "the training losses of a run and of its continuation", diagnoses=diagnoses,
                 rtol=1e-6, atol=1e-8, hint="each step: lr from lr_schedule(step) into every group, get_batch(), "
                                            "forward, zero_grad, backward, clip_grad_norm, step. " + EARLIER)
    expect_close([v for run in runs for _, v in run["held_out"]], [v for run in expected_runs for _, v in run[1]],
                 "the held-out losses", rtol=1e-6, atol=1e-8,
                 hint="measure lm_loss(model(held_out), held_out) after the step, in eval mode.")
    trained = hf_state({**data["state"], "lm_head.weight": data["state"]["token_embeddings.embedding.weight"]},
                       TRAIN_DIMS["num_layers"])
    for name, value in expected_state.items():
        expect_close(trained[name], value, f"the trained {name}", rtol=1e-6, atol=1e-8,
                     hint="the parameters after the last step differ from the recipe's steps on lm_loss.")
    reported = data["reported"]
    if [step for step, _ in reported] != list(range(1, RESUME_STEPS + 1)):
        raise AssertionError(f"monitor.update(step, loss) should be called after every step with the steps done "
                             f"(1, 2, ..., {RESUME_STEPS} over the two runs); it was called with "
                             f"{[step for step, _ in reported]}.")
    if [step for step, _ in data["reported_held_out"]] != [s for steps in EVAL_AT for s in steps]:
        raise AssertionError("monitor.held_out(step, loss) should be called after every measurement.")


@train_switches_modes.judge
def judge_train_switches_modes(seeds, data):
    seen, still_training = data
    steps = [(training, grad) for size, training, grad in seen if size == 3]
    measurements = [(training, grad) for size, training, grad in seen if size != 3]   # held-out windows, batched or not
    if len(steps) != RESUME_STEPS:
        raise AssertionError(f"the model ran on {len(steps)} training batches for {RESUME_STEPS} steps: one forward "
                             "pass per batch.")
    if not all(training for training, _ in steps):
        first = next(i for i, (training, _) in enumerate(steps) if not training) + 1
        raise AssertionError(f"training step {first} ran in eval mode (dropout off): call model.train() before each "
                             "step; a measurement switches to eval mode, so switch back.")
    if not all(grad for _, grad in steps):
        raise AssertionError("a training step ran without gradients (inside torch.no_grad()): only the measurements "
                             "belong there.")
    expected = sum(len(at) for at in EVAL_AT)
    if len(measurements) < expected:
        raise AssertionError(f"the model ran on the held-out windows {len(measurements)} times; the loss is measured "
                             f"after steps {EVAL_AT[0]} and, in the continued run, {EVAL_AT[1]}.")
    if any(training for training, _ in measurements):
        raise AssertionError("a held-out measurement ran in train mode: call model.eval() before measuring (with "
                             "dropout on, the measurement is random).")
    if any(grad for _, grad in measurements):
        raise AssertionError("a held-out measurement built a graph: measure inside torch.no_grad() (no gradients leak "
                             "into the next step, and no memory is spent on a graph nobody uses).")
    if still_training:
        raise AssertionError("train left the model in train mode: call model.eval() before returning, so that "
                             "sampling and measuring afterwards are deterministic.")


# ---------------------------------------------------------------- exercise 11: checkpoints
def replay(seeds, n, dropout, mistake=None):
    """The run the probe made, replayed in the grader: uninterrupted (mistake None), or interrupted at
    CHECKPOINT_AT and resumed after losing one thing ("optimizer", "step", "torch_rng", "generator")."""
    state, stranger, data, (seed, generator_seed, new_seed, new_generator_seed) = checkpoint_problem(seeds, n)
    with torch.random.fork_rng():
        model, optimizer, generator = checkpoint_session(state, dropout, seed, generator_seed)
        if mistake is None:
            return checkpoint_steps(model, optimizer, generator, data, 0, CHECKPOINT_STEPS)
        checkpoint_steps(model, optimizer, generator, data, 0, CHECKPOINT_AT)
        saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                 "optimizer": copy.deepcopy(optimizer.state_dict()), "rng": torch.get_rng_state(),
                 "generator": generator.get_state()}
        model, optimizer, generator = checkpoint_session(stranger, dropout, new_seed, new_generator_seed)
        model.load_state_dict(saved["model"])
        if mistake != "optimizer":
            optimizer.load_state_dict(saved["optimizer"])
        if mistake != "torch_rng":
            torch.set_rng_state(saved["rng"])
        if mistake != "generator":
            generator.set_state(saved["generator"])
        start = 0 if mistake == "step" else CHECKPOINT_AT
        return checkpoint_steps(model, optimizer, generator, data, start, CHECKPOINT_STEPS)


CHECKPOINT_MISTAKES = {
    "optimizer": "the resumed run restarted AdamW from nothing: save optimizer.state_dict() (its running averages and "
                 "step counts) and restore it with optimizer.load_state_dict().",
    "step": "the resumed run started again at step 0 (warming up again, and running too many steps): save the step "
            "and return it from load_checkpoint.",
    "torch_rng": "the resumed run drew other dropout masks: save torch.get_rng_state() and restore it with "
                 "torch.set_rng_state().",
    "generator": "the resumed run drew other batches: save the batch generator's get_state() and restore it with "
                 "generator.set_state().",
}


def judge_checkpoint(seeds, n, dropout, data):
    uninterrupted = replay(seeds, n, dropout)
    for name, value in uninterrupted.items():       # the probe's uninterrupted run must be the real one
        expect_close(data["uninterrupted"][name], value, f"the uninterrupted run's {name}", rtol=1e-9, atol=1e-10,
                     hint="the grader's replay of the uninterrupted run differs: the training itself was changed.")
    if data["step"] != CHECKPOINT_AT and data["step"] != 0:
        raise AssertionError(f"load_checkpoint returned step {data['step']}; the checkpoint was saved at step "
                             f"{CHECKPOINT_AT}: return the step that save_checkpoint was given.")
    if data["identical"]:
        return
    found = torch.cat([data["resumed"][name].double().flatten() for name in uninterrupted])
    for mistake, message in CHECKPOINT_MISTAKES.items():
        wrong = replay(seeds, n, dropout, mistake)
        if torch.allclose(found, torch.cat([wrong[name].flatten() for name in uninterrupted]), rtol=1e-9, atol=1e-10):
            raise AssertionError(message)
    raise AssertionError("the run resumed from your checkpoint ends with other weights than the uninterrupted run. A "
                         "checkpoint holds the model's and the optimizer's state_dict(), the step, torch's random state "
                         "and the batch generator's state; load_checkpoint restores each in place.")


@checkpoint_resumes_the_optimizer_and_step.judge
def judge_checkpoint_resumes_the_optimizer_and_step(seeds, data):
    judge_checkpoint(seeds, 1230, 0.0, data)


@checkpoint_resumes_the_randomness.judge
def judge_checkpoint_resumes_the_randomness(seeds, data):
    judge_checkpoint(seeds, 1240, 0.3, data)


@training_run_learns.judge
def judge_training_run_learns(seeds, data):
    before, after, vocab = data["before"], data["after"], data["vocab_size"]
    if not abs(before - math.log(vocab)) < 0.5:
        raise AssertionError(f"your untrained GPT's held-out loss is {before:.3f}, far from ln V = {math.log(vocab):.3f}: "
                             "is gpt2_init applied at the end of GPT.__init__?")
    if not after <= RUN_FACTOR * before:
        raise AssertionError(f"a {RUN_STEPS}-step run of your recipe took the held-out loss from {before:.3f} to "
                             f"{after:.3f}; it should fall to {RUN_FACTOR:.0%} of its start or lower. Check the loop's "
                             "order (lr, zero_grad, backward, clip, step), the schedule and the optimizer's groups.")


def expect_filtered(output, logits, expected_kept, name, diagnoses=None, either=None, hint=""):
    """The output keeps the input's logits where expected_kept, -inf elsewhere (positions in `either` may go
    either way: their membership sits within rounding of the boundary)."""
    output = expect_tensor(output, name)
    expect_shape(output, tuple(logits.shape), name, "A filter returns logits of the same shape.")
    kept = torch.isfinite(output)
    if torch.isnan(output).any():
        raise AssertionError(f"{name} contains NaN.")
    if (output[~kept] > 0).any():
        raise AssertionError(f"{name}: removed tokens must be -inf, not +inf.")
    either = torch.zeros_like(kept) if either is None else either
    wrong = (kept != expected_kept) & ~either
    if wrong.any():
        for message, pattern in (diagnoses or {}).items():
            if torch.equal((kept & ~either), (pattern & ~either)):
                raise AssertionError(f"{name}: {message}")
        row = tuple(int(i) for i in wrong.nonzero()[0][:-1])
        raise AssertionError(f"{name}: in row {row} of {[round(v, 3) for v in logits[row].tolist()]} you kept "
                             f"{kept[row].int().tolist()}, expected {expected_kept[row].int().tolist()} (1 = kept). "
                             f"{hint}".strip())
    if not torch.equal(output[kept].double(), logits[kept].double()):
        raise AssertionError(f"{name}: the kept entries must keep their logits unchanged.")


@top_k_filter_values.judge
def judge_top_k_filter_values(seeds, data):
    from transformers.generation.logits_process import TopKLogitsWarper
    outputs, errors = data
    for (logits, k), output in zip(top_k_cases(seeds), outputs):
        expected = torch.isfinite(TopKLogitsWarper(top_k=k)(None, logits.clone()))
        top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
        exactly_k = torch.zeros_like(expected).scatter(-1, top.indices, True)
        kth = top.values[..., -1:]
        diagnoses = {
            "ties with the k-th largest logit must be kept too (keep every logit >= the k-th largest, as "
            "TopKLogitsWarper does), not exactly k by position.": exactly_k,
            "you removed the k-th largest itself: keep logits >= the k-th largest (remove only those strictly below).":
                logits > kth,
        }
        if k < logits.shape[-1]:
            kp1 = torch.topk(logits, k + 1, dim=-1).values[..., -1:]
            diagnoses[f"you kept k + 1 = {k + 1} tokens per row: the k-th largest is "
                      "topk(logits, k).values[..., -1]."] = logits >= kp1
        expect_filtered(output, logits, expected, f"top_k_filter(logits, k={k})", diagnoses,
                        hint="Keep every logit >= the k-th largest of its row: logits tied with it are kept too, so a "
                             "row with ties may keep more than k (as TopKLogitsWarper does).")
    for k, error in zip((0, -2), errors):
        if error != "ValueError":
            raise AssertionError(f"top_k_filter(logits, {k}) should raise ValueError (k must be at least 1), "
                                 f"but {'it returned normally' if error is None else 'raised ' + error}.")


# ---------------------------------------------------------------- exercise 8: top_p_filter
def nucleus(logits, p, zone=1e-6):
    """The rule of the exercise in float64: (kept, either). A token is kept while the probability mass of the
    tokens more probable than it is < p; tokens tied with the last kept one are kept; tokens whose mass-before
    lies within `zone` of p may go either way (float32 rounding decides)."""
    probs = torch.softmax(logits.double(), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(order.values, dim=-1) - order.values
    kept_sorted = before < p
    either_sorted = (before - p).abs() < zone
    kept = torch.zeros_like(kept_sorted).scatter(-1, order.indices, kept_sorted)
    either = torch.zeros_like(either_sorted).scatter(-1, order.indices, either_sorted)
    threshold = torch.where(kept, probs, torch.inf).amin(dim=-1, keepdim=True)
    kept = kept | (probs >= threshold)
    return kept, either


def top_p_diagnoses(logits, p):
    probs = torch.softmax(logits.double(), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    through = torch.cumsum(order.values, dim=-1)
    unsort = lambda sorted_mask: torch.zeros_like(sorted_mask).scatter(-1, order.indices, sorted_mask)  # noqa: E731
    ascending = torch.sort(probs, dim=-1, stable=True)
    low_mass = torch.cumsum(ascending.values, dim=-1)
    return {
        "you dropped the token that crosses p: the nucleus is the smallest set whose mass REACHES p, so keep a token "
        "while the mass before it is < p.": unsort(through <= p),
        "you kept the least probable tokens: sort the probabilities in decreasing order.":
            torch.zeros_like(probs, dtype=torch.bool).scatter(-1, ascending.indices, low_mass <= p),
        "you compared the cumulative LOGITS with p; the nucleus is about probabilities: softmax first.":
            unsort(torch.cumsum(torch.sort(logits.double(), -1, descending=True).values, -1)
                   - torch.sort(logits.double(), -1, descending=True).values < p),
    }


@top_p_filter_values.judge
def judge_top_p_filter_values(seeds, outputs):
    for (logits, p), output in zip(top_p_value_cases(seeds), outputs):
        kept, either = nucleus(logits, p)
        expect_filtered(output, logits, kept, f"top_p_filter(logits, p={p:.4g})", top_p_diagnoses(logits, p), either)


@top_p_filter_edges.judge
def judge_top_p_filter_edges(seeds, data):
    outputs, errors = data
    for label, cases in top_p_edge_cases(seeds).items():
        for (logits, p), output in zip(cases, outputs[label]):
            if label.startswith("p = 1"):
                expect_filtered(output, logits, torch.ones_like(logits, dtype=torch.bool), f"top_p_filter with {label}",
                                {"p = 1 dropped the tokens of the tail: in float32 the cumulative sum reaches 1.0 "
                                 "before the last tokens. p = 1 means no filtering: return the logits unchanged.":
                                 nucleus(logits, 1.0 - 1e-7)[0]})
            elif label == "ties":
                kept, _ = nucleus(logits, p)
                expect_filtered(output, logits, kept, f"top_p_filter(logits, p={p}) with ties",
                                hint="tokens tied with the last kept token must be kept too: their order after a sort "
                                     "is arbitrary, so keep every token whose probability is >= the last kept one's.")
            else:
                kept = logits == logits.amax(dim=-1, keepdim=True)
                expect_filtered(output, logits, kept, f"top_p_filter with {label}")
    for p, error in zip((0.0, -0.5, 1.5), errors):
        if error != "ValueError":
            raise AssertionError(f"top_p_filter(logits, {p}) should raise ValueError (p must be in (0, 1]), but "
                                 f"{'it returned normally' if error is None else 'raised ' + error}.")


FALSE_FAILURE_PER_TAIL = 1e-9   # x (6 cases x 6 categories x 2 tails) < 1e-7 per run, for any seed


def expected_probabilities(logits, temperature, top_k=None, top_p=None):
    """transformers' warpers, in their order (temperature, top-k, top-p), then the softmax."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    scores = logits[None].double()
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0]


_LOG_FACTORIALS = {}


def log_factorials(n):
    if n not in _LOG_FACTORIALS:
        _LOG_FACTORIALS[n] = np.array([math.lgamma(i + 1) for i in range(n + 1)])
    return _LOG_FACTORIALS[n]


def binomial_interval(n, p, tail):
    """[lo, hi] with P(X < lo) <= tail and P(X > hi) <= tail for X ~ Binomial(n, p), from the exact pmf."""
    k = np.arange(n + 1)
    lf = log_factorials(n)
    if p >= 1:
        return n, n
    log_pmf = lf[n] - lf - lf[::-1] + k * math.log(p) + (n - k) * math.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    cdf = np.cumsum(pmf)
    lo = int(np.searchsorted(cdf, tail, side="right"))             # P(X < lo) = cdf[lo - 1] <= tail
    survival = np.cumsum(pmf[::-1])[::-1]                          # survival[i] = P(X >= i)
    above = np.nonzero(survival <= tail)[0]
    hi = int(above[0]) - 1 if len(above) else n                    # P(X > hi) = P(X >= hi + 1) <= tail
    return lo, hi


@sample_next_distribution.judge
def judge_sample_next_distribution(seeds, draws):
    cases, logits = sampling_cases(seeds)
    for settings, ids in zip(cases, draws):
        described = ", ".join(f"{k}={v:.3g}" for k, v in settings.items())
        ids = expect_tensor(ids, f"sample_next({described})")
        expect_shape(ids, (SAMPLES,), f"sample_next of ({SAMPLES}, 6) logits", "One token id per row.")
        if ids.dtype != torch.int64:
            raise AssertionError(f"sample_next returned {ids.dtype}; token ids are int64 (torch.multinomial's dtype).")
        if ids.min() < 0 or ids.max() > 5:
            raise AssertionError(f"sample_next({described}) returned ids outside 0..5 for a vocabulary of 6.")
        counts = torch.bincount(ids, minlength=6).tolist()
        expected = expected_probabilities(logits, **settings)
        unscaled = torch.softmax(logits.double(), -1)
        for token, (count, p) in enumerate(zip(counts, expected.tolist())):
            if p == 0:
                if count:
                    raise AssertionError(f"with {described}, token {token} was drawn {count} times although the "
                                         "filters remove it: draw from the softmax of the FILTERED logits (-inf gets "
                                         "probability 0).")
                continue
            lo, hi = binomial_interval(SAMPLES, p, FALSE_FAILURE_PER_TAIL)
            if not lo <= count <= hi:
                frequencies = [round(c / SAMPLES, 3) for c in counts]
                if settings["temperature"] != 1.0 and np.allclose(frequencies, unscaled.tolist(), atol=0.03):
                    raise AssertionError(f"with {described} your tokens follow softmax(logits), as if the "
                                         "temperature did nothing: divide the LOGITS by the temperature before the "
                                         "softmax (dividing the probabilities changes nothing once they are "
                                         "renormalised).")
                raise AssertionError(
                    f"with {described}, token {token} came {count} times in {SAMPLES} draws; its probability is "
                    f"{p:.4f}, so a correct sampler gives {lo}..{hi} (false alarm rate below 1e-9). Your frequencies "
                    f"{frequencies}, expected {[round(q, 3) for q in expected.tolist()]}. Apply the temperature to the "
                    "logits, then top_k_filter, then top_p_filter, then draw from the softmax.")


@sample_next_greedy_limit.judge
def judge_sample_next_greedy_limit(seeds, data):
    outputs, error = data
    argmax = greedy_logits(seeds).argmax(dim=-1)
    for label, ids in outputs.items():
        ids = expect_tensor(ids, f"sample_next with {label}")
        expect_shape(ids, (7,), f"sample_next with {label}", "One token per row of (7, 11) logits.")
        if not torch.equal(ids.long(), argmax):
            hint = {"temperature 0": "temperature 0 is the greedy limit: return logits.argmax(-1).",
                    "temperature 0 with top_k=3": "at temperature 0, return the argmax (the filters cannot change it).",
                    "top_k=1": "top_k=1 keeps only the largest logit, so the draw must be the argmax.",
                    "top_p=1e-6": "a tiny top_p keeps only the most probable token."}.get(
                label, "divided by a tiny temperature, the logits make a one-hot softmax on the argmax; use a stable "
                       "softmax (torch.softmax subtracts the max) so that nothing overflows to NaN.")
            raise AssertionError(f"sample_next with {label} returned {ids.tolist()}, expected the argmax "
                                 f"{argmax.tolist()}: {hint}")
    if error != "ValueError":
        outcome = "it returned" if error is None else "raised " + error
        raise AssertionError("sample_next(..., temperature=-0.5) should raise ValueError (0 is the greedy limit; a "
                             f"negative temperature means nothing), but {outcome}.")


@sample_next_generator.judge
def judge_sample_next_generator(seeds, data):
    first, again, other, untouched = data["first"], data["again"], data["other"], data["untouched"]
    expect_shape(expect_tensor(first, "sample_next"), (2, 3), "sample_next of (2, 3, V) logits",
                 "One token per row, for any leading shape: reshape to (-1, V) for torch.multinomial and back.")
    if not untouched:
        raise AssertionError("sample_next drew from torch's global random state: pass generator=generator to every "
                             "random function, so that the caller's seed alone decides the tokens.")
    if not torch.equal(first, again):
        raise AssertionError("two generators with the same seed gave different tokens: draw every random number from "
                             "`generator`.")
    if torch.equal(first, other):
        raise AssertionError("generators with different seeds gave the same 6 tokens out of 40: is the generator "
                             "ignored (a fixed seed inside sample_next)?")
    one, two = data["one after the other"]
    if not data["advanced"] or torch.equal(one, two):
        raise AssertionError("two calls with one generator gave the same 6 tokens out of 40, and the generator did not "
                             "move on: sample_next must draw its numbers FROM the generator (generator=generator), which "
                             "advances it, so that each step of generate() gets new draws. Reseeding torch's global "
                             "random state from generator.initial_seed() repeats the same draws at every step.")


@generate_matches_hf_greedy.judge
def judge_generate_matches_hf_greedy(seeds, data):
    greedy, nothing, sampled = data
    state, prompt = generate_problem(seeds)
    hf = hf_model(state, GEN_DIMS)
    expect_shape(expect_tensor(greedy, "generate"), (2, 14), "generate(model, a (2, 5) prompt, 9)",
                 "The prompt followed by the new tokens: (B, T0 + max_new_tokens).")
    if not torch.equal(greedy[:, :5].long(), prompt):
        raise AssertionError("generate's output must start with the prompt, as Hugging Face's does.")
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=9, do_sample=False,
                               pad_token_id=0)
        first_position = prompt
        for _ in range(9):
            first_position = torch.cat([first_position, hf(first_position).logits[:, 0].argmax(-1, keepdim=True)], 1)
    if not torch.equal(greedy.long(), expected):
        if torch.equal(greedy.long(), first_position):
            raise AssertionError("you choose each token from the logits of the FIRST position; the next token's scores "
                                 "are at the last position: logits[:, -1].")
        raise AssertionError(f"greedy generation differs from GPT2LMHeadModel.generate(do_sample=False):\nyours  "
                             f"{greedy.tolist()}\ntheirs {expected.tolist()}\nRun the model on the whole sequence so "
                             "far, take logits[:, -1], choose with sample_next, append, repeat. " + EARLIER)
    if not torch.equal(expect_tensor(nothing, "generate(..., 0)").long(), prompt):
        raise AssertionError("generate(model, prompt, 0) should return the prompt unchanged.")
    first, again = (expect_tensor(s, "generate with sampling") for s in sampled)
    expect_shape(first, (2, 11), "generate(model, prompt, 6, temperature=1.0)")
    if not torch.equal(first, again):
        raise AssertionError("sampling with two generators of the same seed gave different texts: pass `generator` "
                             "(and temperature, top_k, top_p) on to sample_next.")


@generate_checks_the_context.judge
def judge_generate_checks_the_context(seeds, results):
    for (length, new, fits), (outcome, shape, calls) in zip(CONTEXT_CASES, results):
        needed = length + new - 1
        if fits:
            if shape != (1, length + new):
                raise AssertionError(f"a prompt of {length} tokens with {new} new ones needs {needed} positions, which "
                                     f"fit in the window of 10; generate should return shape (1, {length + new}), "
                                     f"not {shape}. The last new token is never fed to the model.")
            continue
        if outcome != "ValueError":
            raise AssertionError(f"a prompt of {length} tokens with {new} new ones needs {needed} positions and the "
                                 "window has 10: generate should raise ValueError, but "
                                 f"{'it returned normally' if outcome is None else 'raised ' + outcome}.")
        if calls:
            raise AssertionError(f"generate raised ValueError only after running the model (on {len(calls)} inputs): "
                                 "check T0 + max_new_tokens - 1 against model.max_positions before the first step.")


# ---------------------------------------------------------------- exercise 17: generate_batch
def hf_batch(hf, prompts, new, eos, pad):
    """transformers' generate on the left-padded batch: the oracle."""
    width = max(len(row) for row in prompts)
    ids = torch.tensor([[pad] * (width - len(row)) + list(row) for row in prompts])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompts])
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=eos,
                           pad_token_id=pad)


def batch_by_hand(state, prompts, new, eos, pad, mistake):
    """The outputs of the usual mistakes (on the check's reference model), to name the one a wrong answer made."""
    with torch.random.fork_rng():
        model = ReferenceGPT(**BATCH_DIMS).double()
    model.load_state_dict(state)
    model.eval()
    width = max(len(row) for row in prompts)
    if mistake == "right padding":
        ids = torch.tensor([list(row) + [pad] * (width - len(row)) for row in prompts])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in prompts])
    else:
        ids = torch.tensor([[pad] * (width - len(row)) + list(row) for row in prompts])
        mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompts])
    if mistake == "mask from ids":
        mask = (ids != pad).long()
    done = torch.zeros(len(prompts), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(new):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            if mistake == "positions":
                positions = torch.arange(ids.shape[1]).expand_as(ids)
            seen = torch.ones_like(mask) if mistake == "no mask" else mask
            token = reference_forward_padded(model, ids, positions, seen)[:, -1].argmax(-1)
            if mistake != "no stop":
                token = token.masked_fill(done, pad)
                done = done | (token == eos)
            ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            if (mistake == "stop at the first" and done.any()) or (mistake != "no stop" and done.all()):
                break
    return ids


BATCH_MISTAKES = {
    "positions": "the positions ignore the padding: with left padding a row's first real token sits in column "
                 "T0 - length, but it is at position 0 for the model. Count positions from the mask "
                 "(cumulative sum of attention_mask, minus 1), not from the column.",
    "no mask": "the pads are attended: the attention mask must be 0 at every pad, so that no real token reads one.",
    "mask from ids": "the mask was built by comparing ids with pad_token_id, but the pad id is also a real token here "
                     "(it opens every prompt, as <|endoftext|> does in this course): build the mask from the prompts' "
                     "lengths.",
    "right padding": "the prompts are padded on the right: then the last column holds pads for the shorter prompts, "
                     "and their next token is predicted from a pad. Pad on the LEFT, so that every row's last token "
                     "is in the last column.",
    "no stop": "a row goes on writing after its end-of-sequence token: once a row has written eos_token_id, its later "
               "tokens are pad_token_id.",
    "stop at the first": "generation stopped when the first row finished: it stops when EVERY row has written "
                         "eos_token_id (or after max_new_tokens).",
}


def judge_batch(seeds, n, results):
    state, cases = batch_cases(seeds, n)
    hf = hf_model(state, BATCH_DIMS)
    for (description, prompts, new, eos, pad), found in zip(cases, results):
        ours = expect_tensor(found["ids"], "generate_batch").long()
        expected = hf_batch(hf, prompts, new, eos, pad)
        width = max(len(row) for row in prompts)
        if ours.dim() != 2 or ours.shape[0] != len(prompts) or ours.shape[1] < width:
            raise AssertionError(f"{description}: generate_batch returned shape {tuple(ours.shape)}; expected "
                                 f"{tuple(expected.shape)}: the {len(prompts)} prompts left-padded to {width} tokens, "
                                 "then the new tokens.")
        if not torch.equal(ours[:, :width], expected[:, :width]):
            raise AssertionError(f"{description}: the first {width} columns should be the prompts, left-padded with "
                                 f"pad_token_id={pad}: expected {expected[:, :width].tolist()}, got "
                                 f"{ours[:, :width].tolist()}.")
        if ours.shape == expected.shape and torch.equal(ours, expected):
            steps = expected.shape[1] - width
            if len(found["passes"]) > steps + 1 or any(size != len(prompts) for size in found["passes"]):
                raise AssertionError(f"{description}: {steps} new tokens took {len(found['passes'])} forward passes "
                                     f"of batch sizes {sorted(set(found['passes']))}: run the whole batch at once, one "
                                     "pass of forward_padded per new token.")
            continue
        for mistake, message in BATCH_MISTAKES.items():
            wrong = batch_by_hand(state, prompts, new, eos, pad, mistake)
            if wrong.shape == ours.shape and torch.equal(wrong, ours):
                raise AssertionError(f"{description}: {message}")
        raise AssertionError(f"{description}: generate_batch differs from transformers' generate on the same model "
                             f"(eos {eos}, pad {pad}):\nyours  {ours.tolist()}\ntheirs {expected.tolist()}\nLeft-pad, "
                             "mask the pads, count positions from the mask, take the last column's logits, and pad the "
                             "rows that have finished. " + EARLIER)


@generate_batch_matches_hf.judge
def judge_generate_batch_matches_hf(seeds, results):
    judge_batch(seeds, 1140, results)


@generate_batch_stops_at_eos.judge
def judge_generate_batch_stops_at_eos(seeds, results):
    judge_batch(seeds, 1150, results)


@kv_cache_shapes.judge
def judge_kv_cache_shapes(seeds, found):
    V, h, d = CACHE_DIMS["vocab_size"], CACHE_DIMS["num_heads"], CACHE_DIMS["d_model"]
    for (logits_shape, entries), (new, total) in zip(found, [(5, 5), (1, 6)]):
        if tuple(logits_shape) != (2, new, V):
            raise AssertionError(f"after {total - new} cached positions, forward_with_cache on {new} new tokens "
                                 f"returned logits of shape {tuple(logits_shape)}; expected (2, {new}, {V}): the new "
                                 "tokens only.")
        for i, (keys, values) in enumerate(entries):
            for what, shape in (("keys", keys), ("values", values)):
                if tuple(shape) != (2, h, total, d // h):
                    raise AssertionError(
                        f"after {total} positions, block {i}'s cached {what} have shape {tuple(shape)}; expected "
                        f"(B, num_heads, positions so far, d_head) = (2, {h}, {total}, {d // h}). Both keys and values "
                        "hold every position so far, split into heads (split_heads).")


def positions_from_zero(hf, ids, splits):
    """What a cache that restarts the position embeddings at 0 on every call gives (transformers, by hand)."""
    from transformers import DynamicCache
    cache, pieces = DynamicCache(config=hf.config), []
    for a, b in splits:
        out = hf(ids[:, a:b], past_key_values=cache, use_cache=True, position_ids=torch.arange(b - a)[None])
        pieces.append(out.logits)
    return torch.cat(pieces, dim=1)


def cached_by_hand(state, dims, ids, splits, mask):
    """A cached forward pass written out with torch ops, with the cache's usual mask mistakes: `mask` is
    "after_prompt_none" (causal on the first call only), "top_left" (is_causal=True with fewer queries than keys:
    query i sees keys 0..i) or "never"."""
    d, h = dims["d_model"], dims["num_heads"]
    cache, pieces = [None] * dims["num_layers"], []
    for a, b in splits:
        chunk, past = ids[:, a:b], a
        x = state["token_embeddings.embedding.weight"][chunk] + state["position_embeddings.table.weight"][a:b]
        B, T, _ = x.shape
        for i in range(dims["num_layers"]):
            def get(name, i=i):
                return state[f"blocks.{i}.{name}"]
            hidden = F.layer_norm(x, (d,), get("norm1.weight"), get("norm1.bias"), 1e-5)
            q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in
                       F.linear(hidden, get("self_attn.c_attn.weight"), get("self_attn.c_attn.bias")).split(d, dim=2))
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            total = k.shape[2]
            if mask == "top_left":
                allowed = torch.ones(T, total, dtype=torch.bool).tril()
            elif mask == "never" or (mask == "after_prompt_none" and past > 0):
                allowed = torch.ones(T, total, dtype=torch.bool)
            else:
                allowed = torch.ones(total, total, dtype=torch.bool).tril()[past:]
            scores = (q @ k.transpose(-2, -1) / math.sqrt(d // h)).masked_fill(~allowed, float("-inf"))
            heads = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, d)
            x = x + F.linear(heads, get("self_attn.c_proj.weight"), get("self_attn.c_proj.bias"))
            hidden = F.layer_norm(x, (d,), get("norm2.weight"), get("norm2.bias"), 1e-5)
            inner = F.gelu(F.linear(hidden, get("ffn.linear1.weight"), get("ffn.linear1.bias")), approximate="tanh")
            x = x + F.linear(inner, get("ffn.linear2.weight"), get("ffn.linear2.bias"))
        x = F.layer_norm(x, (d,), state["final_norm.weight"], state["final_norm.bias"], 1e-5)
        pieces.append(x @ state["token_embeddings.embedding.weight"].T)
    return torch.cat(pieces, dim=1)


def judge_stepwise(seeds, n, dims, length, splits, logits, what, hint):
    state, ids = cache_problem(seeds, n, dims, length)
    hf = hf_model(state, dims)
    with torch.no_grad():
        expected = hf(ids).logits
        logits = expect_tensor(logits, what)
        right = logits.shape == expected.shape and torch.allclose(logits.double(), expected, rtol=0, atol=1e-5)
        diagnoses = {} if right else {
            "the new tokens' positions restart at 0 at every call; they continue after the cache: "
            "model.position_embeddings(input_ids, start=T_past).": positions_from_zero(hf, ids, splits),
            "the new tokens after the cache are not masked: when several arrive at once, each may see only the cache "
            "and the new tokens up to itself, the last T_new rows of the causal mask over T_past + T_new positions.":
                cached_by_hand(state, dims, ids, splits, "after_prompt_none"),
            "your mask is aligned to the top left (is_causal=True with fewer queries than keys): new query i sees "
            "keys 0..i only, not the cache. Use the last T_new rows of the causal mask over T_past + T_new positions.":
                cached_by_hand(state, dims, ids, splits, "top_left"),
            "there is no causal mask at all: the prompt's tokens see the tokens after them.":
                cached_by_hand(state, dims, ids, splits, "never")}
    expect_close(logits, expected, what, diagnoses=diagnoses, rtol=0, atol=1e-5, hint=hint)


@kv_cache_matches_uncached.judge
def judge_kv_cache_matches_uncached(seeds, logits):
    judge_stepwise(seeds, 1080, GEN_DIMS, 14, MATCH_SPLITS, logits,
                   "cached logits (a 4-token prompt, then 10 tokens one by one) vs GPT2LMHeadModel on the whole "
                   "sequence",
                   "Each new token's query attends to all cached keys and its own; keys and values both grow. "
                   "(Graded on a reference GPT.)")


@kv_cache_chunks.judge
def judge_kv_cache_chunks(seeds, logits):
    judge_stepwise(seeds, 1090, GEN_DIMS, 12, CHUNK_SPLITS, logits,
                   "logits fed in chunks of 3, 5, 1 and 3 tokens vs GPT2LMHeadModel on the whole sequence",
                   "Several new tokens after a cache need the causal mask too, offset by the cache: the last T_new "
                   "rows of the causal mask over T_past + T_new positions, of shape (T_new, T_past + T_new).")


# ---------------------------------------------------------------- exercise 12: kv_cache_bytes
DTYPE_OF_BYTES = {1: torch.int8, 2: torch.float16, 4: torch.float32, 8: torch.float64}


@kv_cache_bytes_values.judge
def judge_kv_cache_bytes_values(seeds, results):
    for case, found in zip(bytes_cases(seeds), results):
        full = {"batch_size": 1, "bytes_per_value": 4, **case}
        with torch.device("meta"):   # the cache itself, shapes only
            one = torch.empty(full["batch_size"], full["num_kv_heads"], full["seq_len"], full["d_head"],
                              dtype=DTYPE_OF_BYTES[full["bytes_per_value"]])
        expected = 2 * full["num_layers"] * one.numel() * one.element_size()
        described = ", ".join(f"{k}={v}" for k, v in case.items())
        if isinstance(found, float) and found.is_integer():
            found = int(found)
        if type(found) is not int:
            raise AssertionError(f"kv_cache_bytes({described}) returned a {type(found).__name__}; a number of bytes is "
                                 "an int.")
        if found == expected // 2:
            raise AssertionError(f"kv_cache_bytes({described}) = {found:,}: that is the keys alone; the cache holds "
                                 "keys AND values, a factor 2.")
        if found != expected:
            hint = (" The defaults are batch_size=1 and bytes_per_value=4 (float32)." if len(case) == 4 else
                    " Every argument is a factor: layers, key/value heads, d_head, positions, batch size, bytes per "
                    "value.")
            raise AssertionError(f"kv_cache_bytes({described}) = {found:,}; the cache's tensors take {expected:,} "
                                 f"bytes (2 x layers x a (batch, heads, positions, d_head) tensor).{hint}")


# ---------------------------------------------------------------- exercise 18: LlamaAttention
def llama_config_of(d_model, num_heads, num_kv_heads, rope_base=10000.0, vocab_size=8, num_layers=1, d_ff=8,
                    max_positions=16, eps=1e-6):
    from courselib.llama import llama_config
    return llama_config(vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, max_positions, eps, rope_base)


def rotations(d_head, rope_base, T, dtype=torch.float64):
    """RoPE's (cos, sin) for positions 0..T-1 in Hugging Face's layout, computed in float64."""
    inv_freq = 1.0 / rope_base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def hf_llama_attention(state, case, x):
    from transformers.models.llama.modeling_llama import LlamaAttention
    config = llama_config_of(case["d_model"], case["num_heads"], case["num_kv_heads"], case["rope_base"])
    config._attn_implementation = "sdpa"   # eager attention takes its softmax in float32
    with torch.random.fork_rng():
        attn = LlamaAttention(config, layer_idx=0).double().eval()
    attn.load_state_dict(state, strict=True)
    with torch.no_grad():
        return attn(x, position_embeddings=rotations(case["d_model"] // case["num_heads"], case["rope_base"],
                                                     x.shape[1]), attention_mask=None)[0]


def llama_attention_by_hand(state, x, case, rope="heads", layout="interleave", rotate_values=False, mask=True,
                            rotate_keys=True):
    """Llama's attention with torch ops and switches for the usual mistakes."""
    from courselib.llama import apply_rope
    B, T, d = x.shape
    h, h_kv, base = case["num_heads"], case["num_kv_heads"], case["rope_base"]
    d_head = d // h
    q, k, v = (F.linear(x, state[f"{n}_proj.weight"]) for n in "qkv")
    if rope == "merged":                             # rotating the (B, T, h d_head) projections: pairs across heads
        q_rot, _ = apply_rope(q, q, base=base)
        k_rot, _ = apply_rope(k, k, base=base)
        q, k = q_rot, k_rot if rotate_keys else k

    def heads(t, n):
        return t.view(B, T, n, d_head).transpose(1, 2)

    q, k, v = heads(q, h), heads(k, h_kv), heads(v, h_kv)
    if rope == "heads":
        q_rot, k_rot = apply_rope(q, k, base=base)
        q, k = q_rot, (k_rot if rotate_keys else k)
        if rotate_values:
            v, _ = apply_rope(v, v, base=base)
    group = h // h_kv
    repeat = (lambda t: t.repeat_interleave(group, dim=1)) if layout == "interleave" else (lambda t: t.repeat(1, group, 1, 1))  # noqa: E731
    k, v = repeat(k), repeat(v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
    if mask:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, h * d_head)
    return F.linear(out, state["o_proj.weight"])


def llama_attention_diagnoses(state, x, case):
    def by_hand(**switches):
        return llama_attention_by_hand(state, x, case, **switches)

    found = {
        "RoPE is applied to the whole (B, T, h d_head) projections, before the split into heads (or after the merge): "
        "its pairs then mix features of different heads. Rotate each head's (B, h, T, d_head) queries and keys.":
            by_hand(rope="merged"),
        "there is no causal mask: every position attends to the whole sequence.": by_hand(mask=False),
        "the values are rotated too: RoPE turns the queries and the keys only (their dot products carry the "
        "positions).": by_hand(rotate_values=True),
        "only the queries are rotated: RoPE turns the keys too, so that q·k depends on the offset between positions.":
            by_hand(rotate_keys=False),
        "RoPE is missing: the queries and keys must be rotated by their positions (apply_rope).": by_hand(rope=None),
    }
    if case["num_kv_heads"] not in (1, case["num_heads"]):
        found["the key/value heads are repeated in the wrong layout (.repeat tiles them: 0, 1, 0, 1): query head i "
              "reads key/value head i // (h / h_kv), so repeat each one for its group, repeat_interleave (0, 0, 1, 1)."
              ] = by_hand(layout="tile")
    return found


@llama_attention_structure.judge
def judge_llama_attention_structure(seeds, data):
    d, h, h_kv = LLAMA_ATTENTION_STRUCTURE
    d_head = d // h
    expected = {"q_proj.weight": (h * d_head, d), "k_proj.weight": (h_kv * d_head, d),
                "v_proj.weight": (h_kv * d_head, d), "o_proj.weight": (d, h * d_head)}
    found = data["parameters"]
    biases = sorted(name for name in found if name.endswith("bias"))
    if biases:
        raise AssertionError(f"LlamaAttention has biases ({', '.join(biases)}): Llama's projections have none, "
                             "nn.Linear(..., bias=False).")
    for name, shape in expected.items():
        if name not in found:
            raise AssertionError(f"LlamaAttention({d}, {h}, {h_kv}) has no parameter `{name}`: the exercise asks for "
                                 f"q_proj, k_proj, v_proj and o_proj. Found: {', '.join(found) or 'none'}.")
        if found[name] != shape:
            hint = (" Keys and values have num_kv_heads heads of d_head features." if name[0] in "kv" else "")
            raise AssertionError(f"LlamaAttention({d}, {h}, {h_kv}).{name} has shape {found[name]}, expected "
                                 f"{shape}.{hint}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise AssertionError(f"LlamaAttention has parameters Llama's attention doesn't: {', '.join(extra)}.")
    if data["heads"] != [h, h_kv]:
        raise AssertionError(f"store num_heads and num_kv_heads ({h} and {h_kv}); found {data['heads']}.")
    for shape, (B, T) in zip(data["shapes"], [(2, 5), (1, 1), (3, 6)]):
        if tuple(shape) != (B, T, d):
            raise AssertionError(f"LlamaAttention on a ({B}, {T}, {d}) input returned shape {tuple(shape)}: attention "
                                 "keeps the shape (B, T, d_model).")


@llama_attention_matches_llama.judge
def judge_llama_attention_matches_llama(seeds, outputs):
    for i, (case, output) in enumerate(zip(LLAMA_ATTENTION_CASES, outputs)):
        state, x = llama_attention_problem(seeds, i, case)
        expected = hf_llama_attention(state, case, x)
        output = expect_tensor(output, "LlamaAttention output")
        right = output.shape == expected.shape and torch.allclose(output.double(), expected, rtol=1e-12, atol=1e-12)
        diagnoses = {} if right else llama_attention_diagnoses(state, x, case)
        expect_close(output, expected, f"LlamaAttention({case['d_model']}, {case['num_heads']}, {case['num_kv_heads']}, "
                     f"rope_base={case['rope_base']:g}) vs transformers' LlamaAttention (float64)", diagnoses=diagnoses,
                     rtol=1e-12, atol=1e-12,
                     hint="project, split into heads, RoPE on each head's q and k with base=rope_base, grouped-query "
                          "attention with a causal mask, merge, o_proj.")


# ---------------------------------------------------------------- exercise 19: LlamaBlock and Llama
def hf_llama(state, dims, eps_outside=False):
    """transformers' LlamaForCausalLM holding the check's weights, computing in float64 throughout (and, for a
    diagnosis, with RMSNorm's eps outside the square root)."""
    import types
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from courselib.llama import exact_float64
    config = llama_config_of(dims["d_model"], dims["num_heads"], dims["num_kv_heads"], dims["rope_base"],
                             dims["vocab_size"], dims["num_layers"], dims["d_ff"], dims["max_positions"], dims["eps"])
    with torch.random.fork_rng():
        model = exact_float64(LlamaForCausalLM(config).eval())
    model.load_state_dict({("lm_head.weight" if name == "lm_head.weight" else "model." + name): value
                           for name, value in state.items()}, strict=True)
    if eps_outside:
        def outside(self, hidden):
            return self.weight * hidden / (hidden.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)
        for module in model.modules():
            if isinstance(module, LlamaRMSNorm):
                module.forward = types.MethodType(outside, module)
    return model


@llama_structure.judge
def judge_llama_structure(seeds, data):
    dims = LLAMA_STRUCTURE_DIMS
    config = llama_config_of(dims["d_model"], dims["num_heads"], dims["num_kv_heads"], 10000.0, dims["vocab_size"],
                             dims["num_layers"], dims["d_ff"], dims["max_positions"])
    from transformers import LlamaForCausalLM
    with torch.random.fork_rng():
        expected = {name.removeprefix("model."): tuple(p.shape) for name, p in LlamaForCausalLM(config).named_parameters()}
    found = data["parameters"]
    if data["tied"]:
        raise AssertionError("lm_head.weight is the embedding table: Llama's head is untied, an nn.Linear(d_model, "
                             "vocab_size, bias=False) of its own.")
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        raise AssertionError(f"your Llama's parameter names differ from LlamaForCausalLM's (without 'model.'): missing "
                             f"{missing[:3]}, extra {extra[:3]}. The names are embed_tokens, layers[i].input_layernorm, "
                             ".self_attn, .post_attention_layernorm, .mlp, norm, lm_head.")
    wrong = [name for name in expected if found[name] != expected[name]]
    if wrong:
        raise AssertionError(f"{wrong[0]} has shape {found[wrong[0]]}, expected {expected[wrong[0]]}.")
    if data["max_positions"] != dims["max_positions"]:
        raise AssertionError("Llama.max_positions must hold the context it is built for (the given line).")
    if data["dropouts"]:
        raise AssertionError("Llama has dropout: Llama trains without it; the exercise asks for none.")
    for shape, (B, T) in zip(data["shapes"], [(2, 7), (1, 12)]):
        if tuple(shape) != (B, T, dims["vocab_size"]):
            raise AssertionError(f"Llama on ({B}, {T}) ids returned shape {tuple(shape)}; logits are (B, T, vocab_size).")


@llama_matches_hf.judge
def judge_llama_matches_hf(seeds, outputs):
    for i, output in enumerate(outputs):
        dims, state, ids = llama_value_problem(seeds, i)
        with torch.no_grad():
            expected = hf_llama(state, dims)(ids).logits
            output = expect_tensor(output, "Llama logits")
            right = output.shape == expected.shape and torch.allclose(output.double(), expected, rtol=1e-12, atol=1e-12)
            diagnoses = {} if right else {
                "RMSNorm's eps is outside the square root: x / sqrt(mean(x²) + eps), as in LlamaRMSNorm (notebook 07).":
                    hf_llama(state, dims, eps_outside=True)(ids).logits}
        expect_close(output, expected, f"Llama logits ({dims['num_layers']} layers, eps={dims['eps']:g}) vs "
                     "transformers' LlamaForCausalLM (float64)", diagnoses=diagnoses, rtol=1e-12, atol=1e-12,
                     hint="embed_tokens, then per layer x + self_attn(input_layernorm(x)) and x + "
                          "mlp(post_attention_layernorm(x)), then norm and lm_head. " + EARLIER)


# ---------------------------------------------------------------- exercise 22: llama_forward_with_cache
def llama_cached_by_hand(state, ids, mistake):
    """The cached logits of the usual mistakes, step by step as the probe calls (courselib.llama's pieces)."""
    from courselib.llama import RMSNorm, apply_rope, grouped_query_attention
    dims = LLAMA_CACHE_DIMS
    h, h_kv, d = dims["num_heads"], dims["num_kv_heads"], dims["d_model"]
    d_head = d // h

    def norm(x, name):
        module = RMSNorm(d, dims["eps"]).double()
        module.weight.data = state[name]
        return module(x)

    def linear(x, name):
        return x @ state[name].T

    cache, outputs = [None] * dims["num_layers"], []
    for a, b in LLAMA_CACHE_SPLITS:
        x, T = state["embed_tokens.weight"][ids[:, a:b]], b - a
        past = 0 if cache[0] is None else cache[0][0].shape[2]
        positions = torch.arange(T) if mistake == "offset" else torch.arange(past, past + T)
        for i in range(dims["num_layers"]):
            layer = f"layers.{i}."
            hx = norm(x, layer + "input_layernorm.weight")
            q = linear(hx, layer + "self_attn.q_proj.weight").view(2, T, h, d_head).transpose(1, 2)
            k = linear(hx, layer + "self_attn.k_proj.weight").view(2, T, h_kv, d_head).transpose(1, 2)
            v = linear(hx, layer + "self_attn.v_proj.weight").view(2, T, h_kv, d_head).transpose(1, 2)
            q, k = apply_rope(q, k, positions, base=dims["rope_base"])
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            total = k.shape[2]
            mask = None if mistake == "no mask" else torch.ones(total, total, dtype=torch.bool).tril()[past:]
            heads, _ = grouped_query_attention(q, k, v, mask)
            x = x + linear(heads.transpose(1, 2).reshape(2, T, d), layer + "self_attn.o_proj.weight")
            hx = norm(x, layer + "post_attention_layernorm.weight")
            gate, up = linear(hx, layer + "mlp.gate_proj.weight"), linear(hx, layer + "mlp.up_proj.weight")
            x = x + linear(F.silu(gate) * up, layer + "mlp.down_proj.weight")
        outputs.append(linear(norm(x, "norm.weight"), "lm_head.weight"))
    return torch.cat(outputs, dim=1)


@llama_cache_shapes.judge
def judge_llama_cache_shapes(seeds, shapes):
    dims = LLAMA_CACHE_DIMS
    h, h_kv, d_head = dims["num_heads"], dims["num_kv_heads"], dims["d_model"] // dims["num_heads"]
    total = 0
    for (a, b), entries in zip(LLAMA_CACHE_SPLITS, shapes):
        total += b - a
        if len(entries) != dims["num_layers"]:
            raise AssertionError(f"the cache should hold one entry per layer ({dims['num_layers']}), not {len(entries)}.")
        for keys, values in entries:
            expected = (2, h_kv, total, d_head)
            if keys == (2, h, total, d_head):
                raise AssertionError(f"the cache holds keys of shape {keys}: {h} heads, the queries' count. Cache the "
                                     f"{h_kv} key/value heads (B, num_kv_heads, T, d_head), before any repeat for the "
                                     "groups: that is grouped-query attention's saving.")
            if keys != expected or values != expected:
                raise AssertionError(f"after {total} tokens each layer's keys and values should have shape {expected} "
                                     f"(B, num_kv_heads, positions so far, d_head), not {keys} and {values}. Both grow "
                                     "along dim=2 at every call.")


@llama_cache_matches_uncached.judge
def judge_llama_cache_matches_uncached(seeds, logits):
    state, ids = llama_cache_problem(seeds, 1350)
    with torch.no_grad():
        expected = hf_llama(state, LLAMA_CACHE_DIMS)(ids).logits
    ours = torch.cat([expect_tensor(x, "llama_forward_with_cache's logits") for x in logits], dim=1)
    messages = {"offset": "the new tokens' rotary positions restart at 0 at every call: after T_past cached "
                          "positions they are T_past, T_past + 1, ... (apply_rope's positions argument), or every "
                          "score with the cached keys sees the wrong distance.",
                "no mask": "several new tokens after the cache see each other's future: they need the causal mask's "
                           "last T_new rows over T_past + T_new positions."}
    diagnoses = lambda: {message: llama_cached_by_hand(state, ids, mistake) for mistake, message in messages.items()}  # noqa: E731
    expect_close(ours, expected, "cached logits (a prompt of 4, single tokens, a chunk of 3) vs LlamaForCausalLM on "
                 "the whole sequence", diagnoses=diagnoses, rtol=1e-10, atol=1e-10,
                 hint="Rotate the new queries and keys by their positions T_past, T_past + 1, ... before caching the "
                      "keys; append keys and values along dim=2; attend with the last T_new rows of the causal mask. "
                      + EARLIER)


@speculative_matches_greedy.judge
def judge_speculative_matches_greedy(seeds, outputs):
    target_state, _, prompt = speculative_problem(seeds)
    hf = hf_model(target_state, SPEC_TARGET)
    for (start, new, label), found in zip([(prompt, 12, "an unrelated draft model, num_draft=3"),
                                           (prompt[:, :2], 7, "a perfect draft model, num_draft=1")], outputs):
        with torch.no_grad():
            expected = hf.generate(start, attention_mask=torch.ones_like(start), max_new_tokens=new, do_sample=False,
                                   pad_token_id=0)
        found = expect_tensor(found, "speculative_generate")
        expect_shape(found, tuple(expected.shape), f"speculative_generate with {label}",
                     "Exactly max_new_tokens new tokens after the prompt.")
        if not torch.equal(found.long(), expected):
            raise AssertionError(f"with {label}, speculative decoding returned {found.tolist()}; the target's greedy "
                                 f"generation is {expected.tolist()}. Accept drafts only while they equal the target's "
                                 "argmax at their position, then append the target's own token.")


@speculative_saves_target_calls.judge
def judge_speculative_saves_target_calls(seeds, data):
    output, calls = data
    target_state, _, prompt = speculative_problem(seeds)
    with torch.no_grad():
        expected = hf_model(target_state, SPEC_TARGET).generate(prompt, attention_mask=torch.ones_like(prompt),
                                                                max_new_tokens=15, do_sample=False, pad_token_id=0)
    if not torch.equal(expect_tensor(output, "speculative_generate").long(), expected):
        raise AssertionError("with a perfect draft model, speculative decoding must still return the target's greedy "
                             "tokens.")
    if len(calls) > 4:
        raise AssertionError(f"with a draft that is always right and num_draft=4, 15 tokens need 3 target calls (5 "
                             f"tokens each); yours made {len(calls)}. Check all the drafts in ONE target call on the "
                             "prefix plus the drafts.")
