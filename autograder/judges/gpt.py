"""Hidden checks for gpt, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/gpt.py, which also builds the
inputs both sides rebuild from the seeds."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, expect_tensor, to_numpy
from autograder.checks.gpt import (
    ANY_SIZE_DIMS,
    BLOCK_STRUCTURE_CASE,
    BLOCK_VALUE_CASES,
    CACHE_DIMS,
    CAUSAL_CUTS,
    CHUNK_SPLITS,
    CONTEXT_CASES,
    EVAL_EVERY,
    GEN_DIMS,
    GPT_NAMES,
    GPT_STRUCTURE_DIMS,
    LOAD_DIMS,
    MATCH_SPLITS,
    PPL_DIMS,
    SAMPLES,
    SPEC_TARGET,
    TRAIN_DIMS,
    TRAIN_LR,
    TRAIN_STEPS,
    block_value_problem,
    bytes_cases,
    cache_problem,
    decoder_block_is_causal,
    decoder_block_matches_gpt2,
    decoder_block_structure,
    generate_checks_the_context,
    generate_matches_hf_greedy,
    generate_problem,
    gpt2_config,
    gpt_head_is_tied,
    gpt_matches_gpt2,
    gpt_structure,
    gpt_value_problem,
    greedy_logits,
    hf_block_state,
    hf_model,
    hf_state,
    kv_cache_bytes_values,
    kv_cache_chunks,
    kv_cache_matches_uncached,
    kv_cache_shapes,
    lm_loss_values,
    load_gpt2_any_size,
    load_gpt2_copies_every_weight,
    load_gpt2_parity,
    load_problem,
    loss_problem,
    perplexity_problem,
    perplexity_values,
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
)


EARLIER = "(This test uses reference versions of the other exercises, so only this one is graded here.)"


def hf_logits(state, dims, ids):
    with torch.no_grad():
        return hf_model(state, dims)(ids).logits


def hf_block(state, d_model, num_heads, d_ff, eps):
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    with torch.random.fork_rng():
        block = GPT2Block(gpt2_config(1, d_model, 1, num_heads, 8, d_ff, eps)).double().eval()
    block.load_state_dict(hf_block_state(state), strict=True)
    return block


def additive_causal(T, diagonal=0):
    mask = torch.ones(T, T, dtype=torch.bool).tril(diagonal)
    return torch.zeros(T, T, dtype=torch.float64).masked_fill(~mask, float("-inf"))[None, None]


# ---------------------------------------------------------------- a block computed by hand (diagnoses)
def block_by_hand(state, x, num_heads, eps, mask, post_ln=False, approximate="tanh", raw_residual=True):
    """A GPT-2-style block written out with torch ops, with switches for the usual mistakes."""
    def norm(name, h):
        return F.layer_norm(h, h.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"], eps)

    def linear(name, h):
        return F.linear(h, state[f"{name}.weight"], state[f"{name}.bias"])

    def attend(h):
        B, T, d = h.shape
        split = lambda t: t.view(B, T, num_heads, d // num_heads).transpose(1, 2)  # noqa: E731
        q, k, v = (split(linear(f"self_attn.{p}_proj", h)) for p in "qkv")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return linear("self_attn.out_proj", out.transpose(1, 2).reshape(B, T, d))

    def ffn(h):
        return linear("ffn.linear2", F.gelu(linear("ffn.linear1", h), approximate=approximate))

    if post_ln:
        x = norm("norm1", x + attend(x))
        return norm("norm2", x + ffn(x))
    h = norm("norm1", x)
    x = (x if raw_residual else h) + attend(h)
    h = norm("norm2", x)
    return (x if raw_residual else h) + ffn(h)


# ---------------------------------------------------------------- exercise 1: DecoderBlock
BLOCK_NAMES = "norm1, self_attn (MultiHeadAttention), norm2, ffn (FeedForward), dropout"


def block_parameter_shapes(d_model, d_ff):
    shapes = {f"{norm}.{p}": (d_model,) for norm in ("norm1", "norm2") for p in ("weight", "bias")}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        shapes[f"self_attn.{proj}.weight"], shapes[f"self_attn.{proj}.bias"] = (d_model, d_model), (d_model,)
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
    T, h, eps = x.shape[1], case["num_heads"], case["eps"]
    causal, ahead = torch.ones(T, T, dtype=torch.bool).tril(), torch.ones(T, T, dtype=torch.bool).tril(1)

    def by_hand(mask=causal, eps=eps, **switches):
        return block_by_hand(state, x, h, eps, mask, **switches)

    found = {
        "there is no causal mask: every position attends to the whole sequence, future included. Pass "
        "causal_mask(T) to self_attn.": by_hand(mask=None),
        "your mask lets position t see position t + 1 (tril(1)?): a token may attend to itself and the past only, "
        "causal_mask(T) = torch.ones(T, T).tril().": by_hand(mask=ahead),
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
            right = torch.allclose(output.double(), expected, rtol=1e-7, atol=1e-7)
            diagnoses = {} if right else block_diagnoses(state, x, case)
        expect_close(output, expected, f"DecoderBlock output (d_model={case['d_model']}, eps={case['eps']:g}) vs "
                     "transformers' GPT2Block", diagnoses=diagnoses, rtol=1e-7, atol=1e-7)


@decoder_block_is_causal.judge
def judge_decoder_block_is_causal(seeds, data):
    base, changed = data
    base = to_numpy(base, "DecoderBlock output")
    expect_shape(base, (2, 9, 8), "DecoderBlock output")
    for t, after in zip(CAUSAL_CUTS, changed):
        after = to_numpy(after, "DecoderBlock output")
        moved = np.abs(after - base).max(axis=(0, 2)) > 1e-9         # (T,): which positions' outputs changed
        if moved[:t].any():
            first = int(np.argmax(moved[:t]))
            if moved[:t].all() or first < t - 1:
                raise AssertionError(f"changing the tokens at positions {t}..8 changed the output at position {first}: "
                                     "the block is not causal. Pass causal_mask(T) to self_attn, so that position t "
                                     "reads positions 0..t only.")
            raise AssertionError(f"changing the tokens at positions {t}..8 changed the output at position {t - 1}: "
                                 "your mask lets a token see the next one (torch.ones(T, T).tril(1)?). The diagonal "
                                 "offset must be 0: a token sees itself and the past.")
        if not moved[t:].any():
            raise AssertionError(f"changing the tokens at positions {t}..8 changed no output at all: the block must "
                                 "compute from its input.")


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
            diagnoses = {} if torch.allclose(expect_tensor(output, "GPT logits").double(), expected, rtol=1e-7,
                                             atol=1e-7) else gpt_diagnoses(hf, ids)
        expect_close(output, expected, f"GPT logits ({dims['num_layers']} blocks) vs transformers' GPT2LMHeadModel",
                     diagnoses=diagnoses, rtol=1e-7, atol=1e-7,
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
    if expected.dim() == 2 and expected.shape == ours.shape and torch.allclose(ours, expected.T):
        return (f"model.{name} holds GPT-2's weight as stored, untransposed: a Conv1D stores (in_features, "
                "out_features), nn.Linear (out_features, in_features), so copy conv.weight.T. (The matrix is square, "
                "so copy_ raised no error.)")
    if name.startswith("blocks.") and ".self_attn." in name:
        return (f"model.{name} is wrong: c_attn.weight is (d, 3d) with W_Q, W_K, W_V side by side; transpose it to "
                "(3d, d) and chunk(3) gives q, k, v in that order (c_attn.bias splits the same way).")
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


EVAL_AT = [3, 6, 7]


def hand_sgd(state, batches, held_out, variant="right"):
    """GPT2LMHeadModel trained by hand: the oracle (variant 'right') and two classic mistakes."""
    hf = hf_model(state, TRAIN_DIMS)
    params = [p for p in hf.parameters()]
    V = TRAIN_DIMS["vocab_size"]
    loss_of = lambda ids: F.cross_entropy(hf(ids).logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))  # noqa: E731
    losses, held, accumulated, previous = [], [], [torch.zeros_like(p) for p in params], None
    for step, batch in enumerate(batches, start=1):
        loss = loss_of(batch)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            if variant == "accumulate":      # no zero_grad: every step adds to the old gradients
                accumulated = [a + g for a, g in zip(accumulated, grads)]
                update = accumulated
            elif variant == "step_first":    # step() before backward(): each update uses the previous gradient
                update, previous = previous, grads
            else:
                update = grads
            if update is not None:
                for p, g in zip(params, update):
                    p -= TRAIN_LR * g
        losses.append(loss.item())
        if step % EVAL_EVERY == 0 or step == len(batches):
            with torch.no_grad():
                held.append((step, loss_of(held_out).item()))
    ours = {}
    for name, value in hf.state_dict().items():
        ours[name] = value
    return losses, held, ours


@train_steps_match_reference.judge
def judge_train_steps_match_reference(seeds, data):
    state, batches, held_out = train_problem(seeds, 980)
    losses, held = data["losses"], data["held_out"]
    if len(losses) != TRAIN_STEPS:
        raise AssertionError(f"train returned {len(losses)} losses for {TRAIN_STEPS} batches: one per step.")
    if not all(type(x) is float for x in losses):
        kinds = sorted({type(x).__name__ for x in losses})
        raise AssertionError(f"the losses are {', '.join(kinds)}, not Python floats: store loss.item(). A list of loss "
                             "tensors keeps every step's graph alive (a memory leak that grows with training).")
    steps = [pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None for pair in held]
    if steps != EVAL_AT:
        raise AssertionError(f"held_out_losses should hold (steps done, loss) after steps {EVAL_AT} (every "
                             f"{EVAL_EVERY} steps and after the last of {TRAIN_STEPS}); found steps {steps}.")
    if not all(type(pair[1]) is float for pair in held):
        raise AssertionError("each held-out loss should be a Python float (loss.item()).")
    expected_losses, expected_held, expected_state = hand_sgd(state, batches, held_out)
    # The graded run must reproduce a reference run whose loss falls (one batch, seen 7 times, small steps).
    if not expected_losses[-1] < expected_losses[0]:
        raise RuntimeError("the reference run's loss did not fall on this seed: the test itself is wrong")
    diagnoses = {
        "the gradients add up from step to step: call optimizer.zero_grad() before loss.backward() in every step.":
            hand_sgd(state, batches, held_out, "accumulate")[0],
        "optimizer.step() runs before loss.backward(), so each step applies the previous batch's gradient: forward, "
        "zero_grad, backward, step.": hand_sgd(state, batches, held_out, "step_first")[0],
    }
    expect_close(losses, expected_losses, "the training losses", diagnoses=diagnoses, rtol=1e-6, atol=1e-8,
                 hint="one step per batch: loss = lm_loss(model(batch), batch); optimizer.zero_grad(); "
                      "loss.backward(); optimizer.step(). " + EARLIER)
    expect_close([v for _, v in held], [v for _, v in expected_held], "the held-out losses", rtol=1e-6, atol=1e-8,
                 hint="measure lm_loss(model(held_out), held_out) after the step, in eval mode.")
    trained = hf_state({**data["state"], "lm_head.weight": data["state"]["token_embeddings.embedding.weight"]},
                       TRAIN_DIMS["num_layers"])
    for name, value in expected_state.items():
        expect_close(trained[name], value, f"the trained {name}", rtol=1e-6, atol=1e-8,
                     hint="the parameters after the last step differ from plain SGD on lm_loss.")


@train_switches_modes.judge
def judge_train_switches_modes(seeds, data):
    seen, still_training = data
    steps = [(training, grad) for size, training, grad in seen if size == 3]
    measurements = [(training, grad) for size, training, grad in seen if size == 2]
    if len(steps) != TRAIN_STEPS:
        raise AssertionError(f"the model ran on {len(steps)} training batches for {TRAIN_STEPS} steps: one forward "
                             "pass per batch.")
    if not all(training for training, _ in steps):
        first = next(i for i, (training, _) in enumerate(steps) if not training) + 1
        raise AssertionError(f"training step {first} ran in eval mode (dropout off): call model.train() before each "
                             "step; a measurement switches to eval mode, so switch back.")
    if not all(grad for _, grad in steps):
        raise AssertionError("a training step ran without gradients (inside torch.no_grad()): only the measurements "
                             "belong there.")
    if len(measurements) < len(EVAL_AT):
        raise AssertionError(f"the model ran on the held-out batch {len(measurements)} times; the loss is measured "
                             f"after steps {EVAL_AT}.")
    if any(training for training, _ in measurements):
        raise AssertionError("a held-out measurement ran in train mode: call model.eval() before measuring (with "
                             "dropout on, the measurement is random).")
    if any(grad for _, grad in measurements):
        raise AssertionError("a held-out measurement built a graph: measure inside torch.no_grad() (no gradients leak "
                             "into the next step, and no memory is spent on a graph nobody uses).")
    if still_training:
        raise AssertionError("train left the model in train mode: call model.eval() before returning, so that "
                             "sampling and measuring afterwards are deterministic.")


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
    first, again, other, untouched = data
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


def judge_stepwise(seeds, n, dims, length, splits, logits, what, hint):
    state, ids = cache_problem(seeds, n, dims, length)
    hf = hf_model(state, dims)
    with torch.no_grad():
        expected = hf(ids).logits
        diagnoses = {} if torch.allclose(expect_tensor(logits, what).double(), expected, rtol=0, atol=1e-5) else {
            "the new tokens' positions restart at 0 at every call; they continue after the cache: "
            "model.position_embeddings(input_ids, start=T_past).": positions_from_zero(hf, ids, splits)}
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
                   "Several new tokens after a cache need the causal mask too, offset by the cache: "
                   "causal_mask(T_past + T_new)[T_past:], of shape (T_new, T_past + T_new).")


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
