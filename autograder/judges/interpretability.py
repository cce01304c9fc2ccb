"""Hidden checks for 13_inside_gpt, the judge side (in the grader only, never in the sandbox).

The oracle is transformers' `GPT2LMHeadModel` holding the probe's seeded weights (09's names mapped to GPT-2's,
the Conv1D weights transposed): its hidden states (the last one before `ln_f`, read by a hook on the last block),
its eager attention weights, its value vectors and `ln_f`/`lm_head` for the lens, and its blocks hooked for
patching and ablation. The scores are explicit loops over positions. What the notebook states about the shipped
model (the head that moves the name) is measured here again, on the shipped weights in GPT-2's own class.
"""
import functools
import math

import torch

from autograder.checks.common import expect_close, expect_shape, expect_tensor
from autograder.checks.interpretability import (
    ABLATIONS,
    DIMS,
    HEAD_PATCHES,
    PREFIX_LENGTHS,
    REPEAT_CASES,
    RESIDUAL_PATCHES,
    ablate_head_leaves_the_model,
    ablate_head_values,
    ablation_problem,
    attribution_problem,
    cache_problem,
    head_scores_duplicate,
    head_scores_previous_and_first,
    logit_lens_values,
    lens_problem,
    loss_by_position_values,
    loss_problem,
    name_mover_stated,
    patch_head_values,
    patch_problem,
    patch_residual_keeps_the_clean_cache,
    patch_residual_values,
    prefix_matching_score_values,
    prefix_problem,
    random_state,
    repeated_tokens_values,
    run_with_cache_pattern,
    run_with_cache_residual,
    run_with_cache_z,
    scores_problem,
    stretch_direct_logit_attribution,
)


# ------------------------------------------------------------------------------------------- the oracle
def hf_state(state, num_layers):
    """09's names -> GPT2LMHeadModel's, Conv1D weights as (in, out)."""
    out = {"transformer.wte.weight": state["token_embeddings.embedding.weight"],
           "transformer.wpe.weight": state["position_embeddings.table.weight"],
           "transformer.ln_f.weight": state["final_norm.weight"], "transformer.ln_f.bias": state["final_norm.bias"],
           "lm_head.weight": state["token_embeddings.embedding.weight"]}
    pairs = [("norm1", "ln_1", False), ("self_attn.c_attn", "attn.c_attn", True),
             ("self_attn.c_proj", "attn.c_proj", True), ("norm2", "ln_2", False),
             ("ffn.linear1", "mlp.c_fc", True), ("ffn.linear2", "mlp.c_proj", True)]
    for i in range(num_layers):
        for ours, theirs, transpose in pairs:
            weight = state[f"blocks.{i}.{ours}.weight"]
            out[f"transformer.h.{i}.{theirs}.weight"] = weight.T.contiguous() if transpose else weight
            out[f"transformer.h.{i}.{theirs}.bias"] = state[f"blocks.{i}.{ours}.bias"]
    return out


def hf_model(state, dims=DIMS):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    config = GPT2Config(vocab_size=dims["vocab_size"], n_embd=dims["d_model"], n_layer=dims["num_layers"],
                        n_head=dims["num_heads"], n_positions=dims["max_positions"], n_inner=dims.get("d_ff"),
                        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        model = GPT2LMHeadModel(config).double().eval()
    model.load_state_dict(hf_state(state, dims["num_layers"]), strict=True)
    return model.requires_grad_(False)


def oracle_for(seeds, n):
    """The oracle GPT-2 with the weights the probe drew from stream n."""
    return hf_model(random_state(seeds.generator(n)))


@torch.no_grad()
def oracle_cache(hf, ids):
    """(logits, resid (L+1, B, T, d), pattern (L, B, h, T, T), z (L, B, h, T, d_head)) from GPT2LMHeadModel."""
    last = []
    handle = hf.transformer.h[-1].register_forward_hook(lambda module, args, output: last.append(output))
    try:
        out = hf(ids, output_hidden_states=True, output_attentions=True)
    finally:
        handle.remove()
    resid = torch.stack([*out.hidden_states[:-1], last[0]])                    # hidden_states[-1] is after ln_f
    pattern = torch.stack(out.attentions)
    zs = []
    for layer, block in enumerate(hf.transformer.h):
        d = resid.shape[-1]
        heads = hf.config.n_head
        v = block.attn.c_attn(block.ln_1(resid[layer]))[..., 2 * d:]                # (B, T, d)
        v = v.view(*v.shape[:2], heads, d // heads).transpose(1, 2)                 # (B, h, T, d_head)
        zs.append(pattern[layer] @ v)
    return out.logits, resid, pattern, torch.stack(zs)


def scores_and_pattern_mistakes(hf, resid):
    """The attention of each layer without the causal mask, before the softmax, and without the 1/sqrt scale."""
    unmasked, raw, unscaled = [], [], []
    for layer, block in enumerate(hf.transformer.h):
        d, heads = resid.shape[-1], hf.config.n_head
        q, k, _ = block.attn.c_attn(block.ln_1(resid[layer])).split(d, dim=-1)
        q, k = (t.view(*t.shape[:2], heads, d // heads).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-2, -1)
        T = scores.shape[-1]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        unmasked.append(torch.softmax(scores / math.sqrt(d // heads), dim=-1))
        raw.append((scores / math.sqrt(d // heads)).masked_fill(future, float("-inf")).clamp(min=-1e9))
        unscaled.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1))
    return torch.stack(unmasked), torch.stack(raw), torch.stack(unscaled)


def expect_no_hooks_left(data, name):
    if data["hooks_left"]:
        raise AssertionError(f"{name} left {data['hooks_left']} hook(s) on the model: every later forward pass runs "
                             "them too. Keep the handles that register_forward_hook returns and call .remove() on "
                             "each, in a finally: block so that they go even when something raises.")


def expect_model_unchanged(data, expected_logits, name):
    expect_close(data["after"], expected_logits, f"the model's logits after {name} returned",
                 f"{name} must leave the model as it found it: the hooks removed, no weight changed.")


# ---------------------------------------------------------------- exercise 1: run_with_cache
def _cache_oracle(seeds, which, data):
    model_seed = {"residual": 1101, "pattern": 1202, "z": 1303}[which]
    _, ids = cache_problem(seeds, which)
    hf = oracle_for(seeds, model_seed)
    logits, resid, pattern, z = oracle_cache(hf, ids)
    expect_no_hooks_left(data, "run_with_cache")
    expect_model_unchanged(data, logits, "run_with_cache")
    expect_close(expect_tensor(data["logits"], "logits"), logits, "the logits run_with_cache returns",
                 "Return the model's own output of the forward pass the hooks watched.")
    return hf, ids, logits, resid, pattern, z


@run_with_cache_residual.judge
def judge_run_with_cache_residual(seeds, data):
    hf, ids, logits, resid, pattern, z = _cache_oracle(seeds, "residual", data)
    L, (B, T), d = DIMS["num_layers"], ids.shape, DIMS["d_model"]
    got = data["cache"]["resid"]
    expect_shape(got, (L + 1, B, T, d), "cache['resid']",
                 "One residual stream per boundary: the embeddings entering block 0, then each block's output: "
                 "L + 1 tensors of (B, T, d_model), stacked.")

    def diagnoses():
        deltas = resid.clone()
        deltas[1:] = resid[1:] - resid[:-1]                                # what each block adds, not the sum
        shifted = torch.cat([resid[:1], resid[:1], resid[1:-1]])             # block inputs only, block 0's twice
        return {"cache['resid'][l + 1] is what block l adds (its sublayers' outputs) before the residual "
                "connection adds it to the stream: record the block's output, x + attn(...) + ffn(...).": deltas,
                "your streams are one block late: resid[0] is the embeddings (block 0's input) and resid[l + 1] "
                "is block l's output.": shifted}
    expect_close(got, resid, "cache['resid']", diagnoses=diagnoses, atol=1e-6)


@run_with_cache_pattern.judge
def judge_run_with_cache_pattern(seeds, data):
    hf, ids, logits, resid, pattern, z = _cache_oracle(seeds, "pattern", data)
    L, (B, T), h = DIMS["num_layers"], ids.shape, DIMS["num_heads"]
    got = data["cache"]["pattern"]
    expect_shape(got, (L, B, h, T, T), "cache['pattern']",
                 "One (B, h, T, T) pattern per layer, stacked: row t of head h is where query t looks.")

    def diagnoses():
        unmasked, raw, unscaled = scores_and_pattern_mistakes(hf, resid)
        return {"your pattern lets queries look at later positions: apply the causal mask (query t sees keys "
                "0..t) before the softmax.": unmasked,
                "your pattern is the masked scores before the softmax: each row must be a distribution that "
                "sums to 1.": raw,
                "your scores are not divided by √d_head before the softmax.": unscaled}
    expect_close(got, pattern, "cache['pattern']", diagnoses=diagnoses, atol=1e-6)


@run_with_cache_z.judge
def judge_run_with_cache_z(seeds, data):
    hf, ids, logits, resid, pattern, z = _cache_oracle(seeds, "z", data)
    L, (B, T), h, d = DIMS["num_layers"], ids.shape, DIMS["num_heads"], DIMS["d_model"]
    got = data["cache"]["z"]
    expect_shape(got, (L, B, h, T, d // h), "cache['z']",
                 "Each head's output before c_proj mixes the heads: c_proj's input, (B, T, d_model), viewed as "
                 "(B, T, h, d_head) and transposed to (B, h, T, d_head); one per layer, stacked.")

    def diagnoses():
        merged = z.transpose(2, 3).reshape(L, B, T, d)
        return {"your z comes from viewing c_proj's (B, T, d) input directly as (B, h, T, d_head): the heads sit "
                "side by side along the last dimension, so view it as (B, T, h, d_head) and then transpose.":
                merged.reshape(L, B, h, T, d // h)}
    expect_close(got, z, "cache['z']", diagnoses=diagnoses, atol=1e-6)


# ---------------------------------------------------------------- exercise 2: head_scores
def oracle_scores(pattern, ids):
    """Loops over every query, as the definitions read."""
    L, B, H, T, _ = pattern.shape
    previous, first, duplicate = (torch.zeros(L, H, dtype=torch.float64) for _ in range(3))
    duplicates = [(b, t, [s for s in range(t) if ids[b, s] == ids[b, t]]) for b in range(B) for t in range(T)]
    duplicates = [(b, t, earlier) for b, t, earlier in duplicates if earlier]
    for layer in range(L):
        for head in range(H):
            p = pattern[layer, :, head].double()
            previous[layer, head] = sum(p[b, t, t - 1] for b in range(B) for t in range(1, T)) / (B * (T - 1))
            first[layer, head] = sum(p[b, t, 0] for b in range(B) for t in range(1, T)) / (B * (T - 1))
            duplicate[layer, head] = sum(p[b, t, earlier].sum() for b, t, earlier in duplicates) / len(duplicates)
    return {"previous": previous, "first": first, "duplicate": duplicate}


@head_scores_previous_and_first.judge
def judge_head_scores_previous_and_first(seeds, data):
    pattern, ids = scores_problem(seeds)
    expected = oracle_scores(pattern, ids)
    L, _, H, T, _ = pattern.shape

    def previous_mistakes():
        return {"your previous-token score reads the diagonal (each query's attention to itself); it is the "
                "attention from t to t - 1.": pattern.diagonal(0, -2, -1).mean((1, -1)),
                "your previous-token score averages over all T queries, with query 0 (which has no previous token) "
                "counted as 0: average over queries 1..T-1.": pattern.diagonal(-1, -2, -1).sum(-1).mean(1) / T}

    def first_mistakes():
        return {"your first-token score counts query 0, whose whole attention is on position 0 by the causal "
                "mask: average over queries 1..T-1.": pattern[..., :, 0].mean((1, -1))}
    expect_close(expect_tensor(data["previous"], "scores['previous']"), expected["previous"], "scores['previous']",
                 "(L, h): the mean over the batch and queries t = 1..T-1 of pattern[..., t, t - 1].",
                 diagnoses=previous_mistakes)
    expect_close(expect_tensor(data["first"], "scores['first']"), expected["first"], "scores['first']",
                 "(L, h): the mean over the batch and queries t = 1..T-1 of pattern[..., t, 0].",
                 diagnoses=first_mistakes)


@head_scores_duplicate.judge
def judge_head_scores_duplicate(seeds, data):
    pattern, ids = scores_problem(seeds)
    expected = oracle_scores(pattern, ids)

    def mistakes():
        same = (ids[:, :, None] == ids[:, None, :])                                   # (B, T, T)
        earlier = same & torch.ones_like(same[0]).tril(-1)
        with_self = same & torch.ones_like(same[0]).tril()
        has = earlier.any(-1)                                                         # (B, T)
        mass = (pattern * earlier[None, :, None]).sum(-1)                             # (L, B, h, T)
        mass_self = (pattern * with_self[None, :, None]).sum(-1)
        per_query = has[None, :, None].double()
        return {"your duplicate-token score counts the query's own position as a duplicate of itself: only "
                "earlier positions s < t with the same token count.":
                (mass_self * per_query).sum((1, 3)) / per_query.sum((1, 3)),
                "your duplicate-token score averages over every query, also those whose token has not appeared "
                "before: average over the queries that have an earlier duplicate.": mass.mean((1, 3))}
    expect_close(expect_tensor(data["duplicate"], "scores['duplicate']"), expected["duplicate"],
                 "scores['duplicate']", "(L, h): for each query whose token appeared earlier, the attention on "
                 "those earlier positions, summed; averaged over such queries.", diagnoses=mistakes)


# ---------------------------------------------------------------- exercise 3: repeated_tokens
@repeated_tokens_values.judge
def judge_repeated_tokens_values(seeds, results):
    for i, ((batch_size, length, vocab_size), result) in enumerate(zip(REPEAT_CASES, results)):
        g = seeds.generator(3101 + i)
        draws = torch.randint(1, vocab_size, (batch_size, length), generator=g)
        after = torch.randint(1000, (1,), generator=g)
        expected = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), draws, draws], dim=1)
        ids = expect_tensor(result["ids"], "repeated_tokens' output")
        case = f"repeated_tokens({batch_size}, {length}, {vocab_size}, generator)"
        expect_shape(ids, (batch_size, 1 + 2 * length), case,
                     "One <bos> column (token 0), then `length` random tokens, then the same `length` again.")
        if ids.dtype != torch.long:
            raise AssertionError(f"{case} has dtype {ids.dtype}: token ids are integers (torch.long).")
        if not torch.equal(ids[:, 0], torch.zeros(batch_size, dtype=torch.long)):
            raise AssertionError(f"{case}: column 0 must be the <bos> token, 0.")
        if not torch.equal(ids[:, 1:1 + length], ids[:, 1 + length:]):
            raise AssertionError(f"{case}: the second half must repeat the first exactly (draw once, use twice).")
        if bool((ids[:, 1:] == 0).any()) and vocab_size > 1:
            raise AssertionError(f"{case}: a random token is 0, the <bos> id: draw from 1..vocab_size-1.")
        if not torch.equal(ids, expected) or not torch.equal(result["generator_after"], after):
            raise AssertionError(f"{case} is not the draw the contract asks for: one call torch.randint(1, "
                                 "vocab_size, (batch_size, length), generator=generator), and nothing else drawn "
                                 "from the generator.")


# ---------------------------------------------------------------- exercise 4: loss_by_position
@loss_by_position_values.judge
def judge_loss_by_position_values(seeds, result):
    logits, ids = loss_problem(seeds)
    B, T, V = logits.shape
    log_probs = logits.log_softmax(-1)
    expected = torch.tensor([sum(-log_probs[b, t, ids[b, t + 1]] for b in range(B)) / B for t in range(T - 1)])

    def mistakes():
        unshifted = -log_probs.gather(-1, ids[..., None])[..., 0]
        return {"your loss compares logits[:, t] with ids[:, t]; position t predicts the NEXT token, ids[:, t + 1].":
                unshifted.mean(0)[:T - 1],
                "your loss averages over positions, not over the batch: return one number per position.":
                (-log_probs[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]).mean(1)}
    expect_close(expect_tensor(result, "loss_by_position"), expected, "loss_by_position",
                 "(T - 1,): entry t is the cross-entropy of logits[:, t] against ids[:, t + 1], averaged over the "
                 "batch.", diagnoses=mistakes)


# ---------------------------------------------------------------- exercise 5: prefix_matching_score
@prefix_matching_score_values.judge
def judge_prefix_matching_score_values(seeds, results):
    for i, (length, result) in enumerate(zip(PREFIX_LENGTHS, results)):
        pattern = prefix_problem(seeds, i, length)
        L, B, H, T, _ = pattern.shape
        queries = range(length + 1, 2 * length + 1)
        expected = torch.tensor([[sum(pattern[layer, b, head, t, t - length + 1] for b in range(B) for t in queries)
                                  / (B * length) for head in range(H)] for layer in range(L)])

        def mistakes():
            def score(offset, qs=queries):
                return torch.stack([pattern[..., t, t - length + offset] for t in qs], -1).mean((1, -1))
            return {"your score reads the attention to the earlier copy of the same token (t - length); an "
                    "induction head looks one further, at the token that came next (t - length + 1).": score(0),
                    "your score is two positions past the earlier copy (t - length + 2): the token that followed "
                    "it is at t - length + 1.": score(2, range(length + 1, 2 * length)),
                    "your score starts one query late: the second copy starts at position length + 1 "
                    "(position 0 is <bos>).": score(1, range(length + 2, 2 * length + 1))}
        expect_close(expect_tensor(result, "prefix_matching_score"), expected,
                     f"prefix_matching_score with length {length}",
                     "(L, h): the mean over the batch and the second copy's queries t = length + 1 .. 2 length of "
                     "pattern[..., t, t - length + 1].", diagnoses=mistakes)


# ---------------------------------------------------------------- exercise 6: ablate_head
def _c_proj_input_hook(hf, layer, change):
    """A pre-hook on GPT-2's c_proj of `layer` that changes its (B, T, d) input with `change`."""
    return hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(lambda module, args: (change(args[0]),))


@torch.no_grad()
def oracle_ablated(hf, ids, layer, head):
    d_head = hf.config.n_embd // hf.config.n_head

    def zero(x):
        x = x.clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return x
    handle = _c_proj_input_hook(hf, layer, zero)
    try:
        return hf(ids).logits
    finally:
        handle.remove()


@ablate_head_values.judge
def judge_ablate_head_values(seeds, results):
    _, ids = ablation_problem(seeds)
    hf = oracle_for(seeds, 6101)
    with torch.no_grad():
        plain = hf(ids).logits
    for (layer, head), data in zip(ABLATIONS, results):

        def mistakes(layer=layer, head=head):
            wrong = {}
            if head + 1 < hf.config.n_head:
                wrong["you zeroed the next head's slice: head h owns columns h·d_head .. (h+1)·d_head - 1 of "
                      "c_proj's input."] = oracle_ablated(hf, ids, layer, head + 1)
            if head > 0:
                wrong["you zeroed the previous head's slice: head h owns columns h·d_head .. (h+1)·d_head - 1 of "
                      "c_proj's input."] = oracle_ablated(hf, ids, layer, head - 1)
            if layer + 1 < hf.config.n_layer:
                wrong["you ablated the head in the next block: blocks are counted from 0."] = \
                    oracle_ablated(hf, ids, layer + 1, head)
            return wrong
        expect_close(expect_tensor(data["logits"], "ablate_head's logits"), oracle_ablated(hf, ids, layer, head),
                     f"ablate_head(model, ids, layer={layer}, head={head})",
                     "Zero head `head`'s d_head columns of c_proj's input in block `layer` (a forward pre-hook), "
                     "so that the head writes nothing; c_proj's bias stays.", diagnoses=mistakes, atol=1e-6)


@ablate_head_leaves_the_model.judge
def judge_ablate_head_leaves_the_model(seeds, data):
    _, ids = ablation_problem(seeds)
    hf = oracle_for(seeds, 6101)
    with torch.no_grad():
        plain = hf(ids).logits
    expect_no_hooks_left(data, "ablate_head")
    if not data["weights_kept"]:
        raise AssertionError("ablate_head changed the model's weights: zero a copy of c_proj's input in a pre-hook, "
                             "never c_proj's weight, so that the model is whole again afterwards.")
    expect_model_unchanged(data, plain, "ablate_head")


# ---------------------------------------------------------------- exercise 7: logit_lens
@logit_lens_values.judge
def judge_logit_lens_values(seeds, result):
    _, resid = lens_problem(seeds)
    hf = oracle_for(seeds, 7101)
    with torch.no_grad():
        expected = hf.lm_head(hf.transformer.ln_f(resid))
    expect_shape(result, expected.shape, "logit_lens' output", "(L + 1, B, T, vocab_size): one set of logits per "
                 "residual stream.")
    expect_close(expect_tensor(result, "logit_lens"), expected, "logit_lens",
                 diagnoses=lambda: {"your lens skips the final LayerNorm: the unembedding was trained on "
                                    "final_norm's output, never on the raw stream.": hf.lm_head(resid)}, atol=1e-6)


# ---------------------------------------------------------------- exercise 8: patch_residual
@torch.no_grad()
def oracle_patched_residual(hf, ids, clean, layer, position):
    blocks = hf.transformer.h

    def put(x):
        x = x.clone()
        x[:, position] = clean[layer][:, position]
        return x
    if layer < len(blocks):   # the stream entering block `layer`
        handle = blocks[layer].register_forward_pre_hook(
            lambda module, args, kwargs: ((put(args[0]), *args[1:]), kwargs), with_kwargs=True)
    else:                     # the last block's output
        handle = blocks[-1].register_forward_hook(lambda module, args, output: put(output))
    try:
        return hf(ids).logits
    finally:
        handle.remove()


def _judge_patches(seeds, n, results, cases, oracle, name, mistakes):
    model_seed = n
    _, ids, resid, z = patch_problem(seeds, n)
    clean = resid if name == "patch_residual" else z
    hf = oracle_for(seeds, model_seed)
    with torch.no_grad():
        plain = hf(ids).logits
    for where, data in zip(cases, results):
        if not data["cache_unchanged"]:
            raise AssertionError(f"{name} changed the clean cache it was given: the next patch would read your "
                                 "corrupted activations instead of the clean ones. Copy what you take from it "
                                 "(.clone()) and write only into the corrupted run's activations.")
        expect_no_hooks_left(data, name)
        expect_model_unchanged(data, plain, name)
        expect_close(expect_tensor(data["logits"], f"{name}'s logits"), oracle(hf, ids, clean, *where),
                     f"{name}(model, ids, clean, {where[0]}, {where[1]})",
                     diagnoses=lambda where=where: mistakes(hf, ids, clean, *where), atol=1e-6)


def residual_mistakes(hf, ids, clean, layer, position):
    wrong = {}
    if layer + 1 <= hf.config.n_layer:
        wrong["you patched the stream one block late: clean['resid'][l] enters block l (index 0: the embeddings; "
              "index L: the last block's output)."] = oracle_patched_residual(hf, ids, clean, layer + 1, position)
    if layer > 0:
        wrong["you patched the stream one block early: clean['resid'][l] enters block l."] = \
            oracle_patched_residual(hf, ids, clean, layer - 1, position)
    return wrong


@patch_residual_values.judge
def judge_patch_residual_values(seeds, results):
    _judge_patches(seeds, 8101, results, RESIDUAL_PATCHES, oracle_patched_residual, "patch_residual",
                   residual_mistakes)


@patch_residual_keeps_the_clean_cache.judge
def judge_patch_residual_keeps_the_clean_cache(seeds, results):
    _judge_patches(seeds, 8201, results, [(1, 1), (1, 4)], oracle_patched_residual, "patch_residual",
                   residual_mistakes)


# ---------------------------------------------------------------- exercise 9: patch_head
@torch.no_grad()
def oracle_patched_head(hf, ids, clean_z, layer, head):
    d_head = hf.config.n_embd // hf.config.n_head

    def put(x):
        x = x.clone()
        x[..., head * d_head:(head + 1) * d_head] = clean_z[layer][:, head]
        return x
    handle = _c_proj_input_hook(hf, layer, put)
    try:
        return hf(ids).logits
    finally:
        handle.remove()


def head_mistakes(hf, ids, clean_z, layer, head):
    wrong = {}
    for other in (head - 1, head + 1):
        if 0 <= other < hf.config.n_head:
            d_head = hf.config.n_embd // hf.config.n_head

            def put(x, other=other):
                x = x.clone()
                x[..., other * d_head:(other + 1) * d_head] = clean_z[layer][:, head]
                return x
            handle = _c_proj_input_hook(hf, layer, put)
            try:
                with torch.no_grad():
                    wrong[f"you wrote the clean head's output into head {other}'s slice: head h owns columns "
                          "h·d_head .. (h+1)·d_head - 1 of c_proj's input."] = hf(ids).logits
            finally:
                handle.remove()
    return wrong


@patch_head_values.judge
def judge_patch_head_values(seeds, results):
    _judge_patches(seeds, 9101, results, HEAD_PATCHES, oracle_patched_head, "patch_head", head_mistakes)


# ---------------------------------------------------------------- exercise 10: what patching found
@functools.lru_cache(maxsize=1)
def measured_name_mover():
    """(layer, head) whose patching restores most of the name, and the first stream at which patching the last
    position alone restores it, measured on the shipped model over the notebook's name pairs."""
    from courselib.interp import shipped_name_prompts, shipped_state_dict, SHIPPED
    state = {k: v.double() for k, v in shipped_state_dict().items()}
    dims = {k: SHIPPED[k] for k in ("vocab_size", "d_model", "num_layers", "num_heads", "max_positions", "d_ff")}
    hf = hf_model(state, dims)
    L, H = dims["num_layers"], dims["num_heads"]
    head_effects = torch.zeros(L, H, dtype=torch.float64)
    arrival = []
    for clean_ids, corrupted_ids, right, wrong in shipped_name_prompts():
        def difference(logits):
            return float(logits[0, -1, right] - logits[0, -1, wrong])
        clean_logits, clean_resid, _, clean_z = oracle_cache(hf, clean_ids)
        with torch.no_grad():
            base = difference(hf(corrupted_ids).logits)
        top = difference(clean_logits)
        for layer in range(L):
            for head in range(H):
                patched = difference(oracle_patched_head(hf, corrupted_ids, clean_z, layer, head))
                head_effects[layer, head] += (patched - base) / (top - base)
        restored = [(difference(oracle_patched_residual(hf, corrupted_ids, clean_resid, layer, clean_ids.shape[1] - 1))
                     - base) / (top - base) for layer in range(L + 1)]
        arrival.append(next(layer for layer, r in enumerate(restored) if r > 0.9))
    best = int(head_effects.argmax())
    return (best // H, best % H), max(arrival), min(arrival)


@name_mover_stated.judge
def judge_name_mover_stated(seeds, data):
    (layer, head), latest, earliest = measured_name_mover()
    stated = data["head"]
    if not isinstance(stated, (tuple, list)) or len(stated) != 2 or not all(isinstance(x, int) for x in stated):
        raise AssertionError("NAME_MOVER_HEAD should be a pair of integers (layer, head), counted from 0.")
    if tuple(stated) != (layer, head):
        raise AssertionError(f"NAME_MOVER_HEAD = {tuple(stated)} is not the head whose clean output restores the most "
                             "of the name in the heads' patching map. Read the map's largest cell: its row is the "
                             "layer (block), its column the head, both counted from 0.")
    if not isinstance(data["arrives"], int) or not earliest <= data["arrives"] <= latest:
        raise AssertionError(f"NAME_ARRIVES_AT = {data['arrives']!r} is not the first residual stream (index into "
                             "cache['resid'], 0 = the embeddings) at which patching the last position alone restores "
                             "the name (more than 90%) in the residual patching map.")


# ---------------------------------------------------------------- stretch: direct_logit_attribution
@stretch_direct_logit_attribution.judge
@torch.no_grad()
def judge_stretch_direct_logit_attribution(seeds, result):
    _, cache, token, other = attribution_problem(seeds)
    hf = oracle_for(seeds, 10101)
    L, h = DIMS["num_layers"], DIMS["num_heads"]
    d_head = DIMS["d_model"] // h
    final = cache["resid"][-1][:, -1]                                                 # (B, d)
    scale = torch.sqrt(final.var(-1, unbiased=False, keepdim=True) + hf.transformer.ln_f.eps)   # (B, 1)
    direction = hf.lm_head.weight[token] - hf.lm_head.weight[other]                  # (d,)
    expected = torch.zeros(final.shape[0], L, h, dtype=torch.float64)
    unnormalised = torch.zeros_like(expected)
    for layer in range(L):
        W_O = hf.transformer.h[layer].attn.c_proj.weight                              # Conv1D: (in, out)
        for head in range(h):
            out = cache["z"][layer][:, head, -1] @ W_O[head * d_head:(head + 1) * d_head]   # (B, d)
            centred = out - out.mean(-1, keepdim=True)
            expected[:, layer, head] = (centred / scale * hf.transformer.ln_f.weight) @ direction
            unnormalised[:, layer, head] = out @ direction
    expect_shape(result, expected.shape, "direct_logit_attribution's output", "(B, L, h): one number per head.")
    expect_close(expect_tensor(result, "direct_logit_attribution"), expected, "direct_logit_attribution",
                 diagnoses=lambda: {"your attribution skips the final LayerNorm: centre each head's output and "
                                    "divide by the final stream's scale (frozen at the last position), times "
                                    "final_norm's weight, before the unembedding.": unnormalised}, atol=1e-6)
