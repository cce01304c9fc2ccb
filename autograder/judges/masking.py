"""Hidden checks for masking, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/masking.py, which also builds the
inputs both sides rebuild from the seeds."""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import LOCAL_TOKEN, expect_close, expect_shape, to_numpy
from courselib import attention as reference
from autograder.checks.masking import (
    BEHAVIOUR_SETTINGS,
    CAUSAL_PADDING_SHAPE_PAD_ID,
    EXTRA_PADDING,
    MATCH_CASES,
    PACKED_BEHAVIOUR_CASES,
    PEEK_CUT,
    PEEK_T,
    PREFIXES,
    SENTENCES,
    SHAPE_PAD_ID,
    VOCABULARY,
    causal_mask_no_peeking,
    causal_mask_values,
    causal_padding_cases,
    causal_padding_mask_behaviour,
    causal_padding_mask_shape,
    causal_padding_mask_values,
    causal_sizes,
    cross_attention_ignores_encoder_padding,
    cross_attention_matches_torch,
    cross_attention_shapes,
    cross_problem,
    dim_cases,
    huge_hidden_case,
    masked_softmax_never_nan,
    masked_softmax_respects_dim,
    masked_softmax_values,
    never_nan_problem,
    packed_value_cases,
    packing,
    padding_mask_shape,
    padding_mask_values,
    padding_never_changes_real_tokens,
    padding_value_cases,
    real_tokens_batches,
    seeded_mha,
    softmax_value_cases,
    stretch_packed_causal_mask_behaviour,
    stretch_packed_causal_mask_values,
    tokenized_batch,
)


# ---------------------------------------------------------------- oracles and inputs
def oracle_causal(T):
    """torch's own causal mask is additive (0 or -inf); 'may attend' is where it is 0."""
    return nn.Transformer.generate_square_subsequent_mask(T) == 0


def oracle_weights(scores, mask):
    """Masked softmax over the last dim by torch's kernel: scores @ I with scale 1, attending over I."""
    T_k = scores.shape[-1]
    identity = torch.eye(T_k, dtype=scores.dtype)
    return F.scaled_dot_product_attention(scores, identity, identity, attn_mask=mask, scale=1.0)


def oracle_weights_along(scores, mask, dim):
    mask = mask.expand(scores.shape)
    return oracle_weights(scores.movedim(dim, -1), mask.movedim(dim, -1)).movedim(-1, dim)


def torch_cross_attention(mha, decoder_states, encoder_states, encoder_padding_mask=None):
    """The same weights in torch.nn.MultiheadAttention, whose boolean masks mean True = ignore."""
    d_model = mha.q_proj.weight.shape[0]
    torch_mha = nn.MultiheadAttention(d_model, mha.num_heads, batch_first=True, dtype=decoder_states.dtype)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        torch_mha.out_proj.weight.copy_(mha.out_proj.weight)
        torch_mha.out_proj.bias.copy_(mha.out_proj.bias)
    torch_mha.eval()
    blocked = None
    if encoder_padding_mask is not None:  # torch's attn_mask is (B·h, T_q, T_k) and True means "blocked"
        B, T_q, T_k = decoder_states.shape[0], decoder_states.shape[1], encoder_states.shape[1]
        blocked = (~encoder_padding_mask).expand(B, mha.num_heads, T_q, T_k).reshape(B * mha.num_heads, T_q, T_k)
    with torch.no_grad():
        return torch_mha(decoder_states, encoder_states, encoder_states, attn_mask=blocked,
                         need_weights=True, average_attn_weights=False)


def bool_mask(value, name, hint=""):
    """Judge side: the student's mask, checked to be a bool tensor."""
    if not torch.is_tensor(value):
        raise AssertionError(f"{name} should be a torch tensor, but it is a {type(value).__name__}.")
    if value.dtype != torch.bool:
        raise AssertionError(
            f"{name} has dtype {value.dtype}; masks in this course are bool (True = may attend). "
            "A float mask means something else to torch: F.scaled_dot_product_attention *adds* it to "
            f"the scores. Compare with `==`, `!=`, `>=` or call .bool(). {hint}".strip())
    return value


def _attend(q, k, v, mask, who):
    """Judge side: attention by torch's kernel under the student's mask (data)."""
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError as error:
        raise AssertionError(f"{who} could not be used as a mask for scores of shape "
                             f"{tuple(q.shape[:-1]) + (k.shape[-2],)}: {error}") from None


def causal_mask_diagnoses(T):
    lower = torch.ones(T, T).tril()
    return {
        "the diagonal is excluded: a token may always attend to itself (the diagonal is True), "
        "otherwise token 0 has nothing at all to look at. Use tril(), not tril(-1).": lower.tril(-1),
        "the triangle is inverted: query t may attend to keys 0..t, the *lower* triangle. Yours lets "
        "every token see the future (triu) and hides its past.": lower.T,
        "your mask is True where attention is *forbidden* (the strict upper triangle). In this course, as "
        "in F.scaled_dot_product_attention, True means 'may attend'.": 1 - lower,
    }


@causal_mask_values.judge
def judge_causal_mask_values(seeds, masks):
    for T, mask in zip(causal_sizes(seeds), masks):
        bool_mask(mask, f"causal_mask({T})")
        expect_shape(mask, (T, T), f"causal_mask({T})",
                     "The mask is (T, T), one row per query, built from T; a fixed-size answer won't do.")
        expect_close(mask, oracle_causal(T), f"causal_mask({T})", diagnoses=causal_mask_diagnoses(T))


def peeking_problem(seeds):
    """q, k, v (2, 3, T, 5), and k, v with tokens PEEK_CUT.. rewritten."""
    T, cut = PEEK_T, PEEK_CUT
    g = seeds.generator(2601)
    q, k, v = (torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[..., cut:, :] = torch.randn(2, 3, T - cut, 5, generator=g, dtype=torch.float64)
    v2[..., cut:, :] = torch.randn(2, 3, T - cut, 5, generator=g, dtype=torch.float64)
    return q, k, v, k2, v2


@causal_mask_no_peeking.judge
def judge_causal_mask_no_peeking(seeds, masks):
    """Changing the future never changes the past, and one pass equals T prefix-sized passes."""
    T, cut = PEEK_T, PEEK_CUT
    q, k, v, k2, v2 = peeking_problem(seeds)
    mask = bool_mask(masks[T], f"causal_mask({T})")
    before = _attend(q, k, v, mask, f"causal_mask({T})")
    after = _attend(q, k2, v2, mask, f"causal_mask({T})")
    changed = (after[..., :cut, :] - before[..., :cut, :]).abs().amax(dim=(0, 1, 3))
    if changed.max() > 1e-9:
        position = int(torch.nonzero(changed > 1e-9)[0])
        raise AssertionError(
            f"Changing tokens {cut}..{T - 1} changed the output at position {position}: under your mask a "
            "token peeks at the future. Query t may only attend to keys 0..t.")
    first = _attend(q[..., :1, :], k[..., :1, :], v[..., :1, :], bool_mask(masks[1], "causal_mask(1)"),
                    "causal_mask(1)")
    expect_close(first[..., 0, :], v[..., 0, :], "the output at position 0",
                 "The first token may attend only to itself, so its output is its own value vector.")
    for t in PREFIXES:
        prefix = _attend(q[..., :t, :], k[..., :t, :], v[..., :t, :], bool_mask(masks[t], f"causal_mask({t})"),
                         f"causal_mask({t})")
        expect_close(before[..., :t, :], prefix, f"the first {t} outputs",
                     f"One pass over {T} tokens must give the same first {t} outputs as a pass over "
                     f"those {t} tokens alone: each position sees exactly itself and its past.")


def expect_weights_shape(weights, scores):
    expect_shape(weights, scores.shape, "masked_softmax(scores, mask)",
                 "The weights have the shape of the scores; the mask only broadcasts against them.")


def masked_softmax_diagnoses(scores, mask):
    allowed = mask.expand(scores.shape)
    return {
        "you zeroed the masked weights after the softmax: the remaining weights no longer sum to 1 and "
        "still depend on the hidden scores. Set masked scores to -inf *before* the softmax.":
            torch.softmax(scores, dim=-1) * allowed,
        "you filled the masked scores with 0 instead of -inf: a score of 0 still gets weight e⁰/Σ. "
        "Fill with float('-inf') so that the weight is exactly 0.":
            torch.softmax(scores.masked_fill(~allowed, 0.0), dim=-1),
        "you hid exactly the positions the mask allows: True means 'may attend'. Fill the scores where "
        "the mask is False (masked_fill(~mask, ...)).":
            oracle_weights(scores, ~allowed),
    }


@masked_softmax_values.judge
def judge_masked_softmax_values(seeds, results):
    weights_per_mask, huge = results
    scores, masks = softmax_value_cases(seeds)
    for (description, mask), weights in zip(masks, weights_per_mask):
        expect_weights_shape(weights, scores)
        expect_close(weights, oracle_weights(scores, mask), f"masked_softmax with {description}",
                     "Masked positions get weight exactly 0 and each row sums to 1 over the allowed keys.",
                     diagnoses=masked_softmax_diagnoses(scores, mask))
    random_mask = masks[-1][1]
    expected = oracle_weights(huge_hidden_case(scores, random_mask), random_mask)
    expect_weights_shape(huge, scores)
    if not np.allclose(np.nan_to_num(to_numpy(huge, "masked_softmax"), nan=-1.0), expected.numpy(),
                       rtol=1e-4, atol=1e-5):
        raise AssertionError(
            "masked_softmax is wrong when a hidden score is huge (150 where the visible ones are near 0): "
            "normalising over all keys first lets hidden scores swallow the visible ones (e^-150 underflows "
            "in float32), so masking or renormalising afterwards cannot recover them. Hidden scores must "
            "never take part: set them to -inf before the softmax.")


@masked_softmax_never_nan.judge
def judge_masked_softmax_never_nan(seeds, data):
    """Fully masked rows are zeros, in the forward pass and in the gradient; huge scores stay finite."""
    scores, mask, upstream, big, big_mask = never_nan_problem(seeds)
    fully_masked = ~mask.any(dim=-1)
    weights = data["weights"]
    expect_weights_shape(weights, scores)
    weights_np = to_numpy(weights, "masked_softmax")
    if not np.all(np.isfinite(weights_np)):
        raise AssertionError(
            "masked_softmax returned NaN for a row where every key is masked: the softmax of a row of -inf "
            "is 0/0. Such a row (e.g. a padding query) must come out as all zeros: replace NaN by 0 "
            "(torch.nan_to_num) or zero the rows where mask.any(dim, keepdim=True) is False.")
    rows = weights_np[fully_masked.numpy()]
    if np.allclose(rows, 1.0 / scores.shape[-1], atol=1e-6):
        raise AssertionError(
            "a fully masked row came out uniform (1/T_k each): filling with a large negative number "
            "(-1e9, finfo.min) instead of -inf makes every masked score equal, so the row averages keys "
            "it may not see. A row with nothing to attend to must be all zeros.")
    expect_close(weights, oracle_weights(scores, mask), "masked_softmax with fully masked rows",
                 "Rows with at least one allowed key sum to 1; rows with none are all zeros.")

    # Training backpropagates through these rows: one NaN gradient poisons every parameter.
    if not data["attached"]:
        raise AssertionError("masked_softmax's output is cut off from autograd (detach, .data, NumPy?): "
                             "a model trains through it, so keep it a differentiable torch computation.")
    grad = data["grad"]
    if grad is None or not np.all(np.isfinite(to_numpy(grad, "the gradient"))):
        raise AssertionError(
            "the forward pass is fine, but the gradient of masked_softmax is NaN on fully masked rows. "
            "Adding a -inf mask (scores + mask) lets the softmax's NaN flow back into the scores; "
            "masked_fill(~mask, -inf) or torch.where(mask, scores, -inf) gives masked scores no gradient.")
    oracle_leaf = scores.clone().requires_grad_(True)
    (oracle_weights(oracle_leaf, mask) * upstream).sum().backward()
    expect_close(grad, oracle_leaf.grad, "the gradient of masked_softmax with respect to the scores")

    big_weights = data["big"]
    expect_weights_shape(big_weights, big)
    if not np.all(np.isfinite(to_numpy(big_weights, "masked_softmax"))):
        raise AssertionError("masked_softmax overflowed for scores around 1e4: subtract the row maximum "
                             "before exponentiating (torch.softmax does this for you).")
    expect_close(big_weights, oracle_weights(big, big_mask), "masked_softmax for scores around 1e4")


@masked_softmax_respects_dim.judge
def judge_masked_softmax_respects_dim(seeds, results):
    scores, cases = dim_cases(seeds)
    for (dim, mask), weights in zip(cases, results):
        expect_weights_shape(weights, scores)
        expect_close(weights, oracle_weights_along(scores, mask, dim), f"masked_softmax(..., dim={dim})",
                     "Normalise along `dim` (torch.softmax(..., dim=dim)); the mask broadcasts as before.",
                     diagnoses={"your masked_softmax ignores `dim` and always normalises the last dimension.":
                                oracle_weights(scores, mask.expand(scores.shape))})


@padding_mask_shape.judge
def judge_padding_mask_shape(seeds, mask):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=SHAPE_PAD_ID)
    B, T = input_ids.shape
    bool_mask(mask, "padding_mask(input_ids, pad_id)")
    shape = tuple(mask.shape)
    if shape == (B, 1, T, 1):
        raise AssertionError(
            f"padding_mask has shape {shape}: the padding is on the query axis, so you mask queries instead "
            "of keys. Padding must be hidden as a *key* (the last axis): (B, 1, 1, T), i.e. "
            "mask[:, None, None, :], so every real query stops looking at it.")
    if shape == (B, T):
        raise AssertionError(
            f"padding_mask has shape {shape}: (B, T) would broadcast against scores (B, h, T_q, T_k) as if B "
            "were the queries. Add the head and query axes: (B, 1, 1, T).")
    expect_shape(mask, (B, 1, 1, T), "padding_mask(input_ids, pad_id)",
                 "One row per sequence, with axes for heads and queries of size 1: (B, 1, 1, T).")


@padding_mask_values.judge
def judge_padding_mask_values(seeds, masks):
    for (pad_id, direction, sentences), mask in zip(padding_value_cases(seeds), masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        bool_mask(mask, "padding_mask(input_ids, pad_id)")
        expected = attention_mask[:, None, None, :]
        expect_shape(mask, expected.shape, "padding_mask(input_ids, pad_id)", "(B, 1, 1, T).")
        diagnoses = {"you hid the real tokens and kept the padding: True means 'may attend' (a real token).":
                     ~expected}
        if pad_id != 0:
            diagnoses["you compared with 0 instead of pad_id: the padding id is whatever the tokenizer "
                      "uses, here " + str(pad_id) + "."] = (input_ids != 0)[:, None, None, :]
        expect_close(mask, expected, f"padding_mask with pad_id={pad_id}, {direction} padding",
                     "It must agree with the tokenizer's attention_mask: True at real tokens, False at padding.",
                     diagnoses=diagnoses)


@padding_never_changes_real_tokens.judge
def judge_padding_never_changes_real_tokens(seeds, masks):
    """Each sentence alone gives the same outputs at its real tokens as inside a padded batch."""
    g = seeds.generator(2605)
    mha = seeded_mha(g)
    embedding = nn.Embedding(len(VOCABULARY) + 2, 8).double()  # [PAD] and [UNK] rows are random, as in a real model
    with torch.no_grad():
        embedding.weight.copy_(torch.randn(embedding.weight.shape, generator=g, dtype=torch.float64))
    for extra, (input_ids, attention_mask), mask in zip(EXTRA_PADDING, real_tokens_batches(seeds), masks):
        bool_mask(mask, "padding_mask(input_ids, pad_id)")
        with torch.no_grad():
            try:
                batched, _ = mha(embedding(input_ids), mask=mask)
            except RuntimeError as error:
                raise AssertionError(f"padding_mask's result {tuple(mask.shape)} does not broadcast against the "
                                     f"scores (B, h, T, T): {error}") from None
            for b, length in enumerate(attention_mask.sum(dim=-1).tolist()):
                alone, _ = mha(embedding(input_ids[b:b + 1, :length]))
                expect_close(batched[b, :length], alone[0], f"outputs at the real tokens of sentence {b}",
                             f"With {'more ' if extra else ''}padding appended, real tokens must give the same "
                             "outputs as the sentence alone: padding keys (the last axis of the mask) must be "
                             "hidden from every query.")


@causal_padding_mask_shape.judge
def judge_causal_padding_mask_shape(seeds, mask):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=CAUSAL_PADDING_SHAPE_PAD_ID)
    B, T = input_ids.shape
    bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
    expect_shape(mask, (B, 1, T, T), "causal_padding_mask(input_ids, pad_id)",
                 "causal (T, T) & padding (B, 1, 1, T) broadcast to (B, 1, T, T): one (T, T) mask per sequence, "
                 "shared by all heads.")


@causal_padding_mask_values.judge
def judge_causal_padding_mask_values(seeds, masks):
    cases = causal_padding_cases(seeds, 2630, [(3, "right"), (7, "left")])
    for (pad_id, direction, sentences), mask in zip(cases, masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        T = input_ids.shape[-1]
        causal, keys = oracle_causal(T), attention_mask[:, None, None, :]
        expected = causal & keys
        bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
        expect_shape(mask, expected.shape, "causal_padding_mask(input_ids, pad_id)", "(B, 1, T, T).")
        expect_close(mask, expected, f"causal_padding_mask with {direction} padding", diagnoses={
            "you combined the masks with | (or): a key may be attended only if it is in the past *and* is a "
            "real token, so combine with &.": causal | keys,
            "your padding hides padding *queries* (rows) instead of padding *keys* (columns).":
                causal & attention_mask[:, None, :, None],
            "your mask hides padding but not the future: add the causal part.": keys.expand(expected.shape),
            "your mask hides the future but not the padding: add the padding part.": causal.expand(expected.shape),
        })


@causal_padding_mask_behaviour.judge
def judge_causal_padding_mask_behaviour(seeds, masks):
    """With the mask, a padded batch gives each real token what is_causal=True gives the sentence alone."""
    g = seeds.generator(2606)
    for (pad_id, direction, sentences), mask in zip(causal_padding_cases(seeds, 2640, BEHAVIOUR_SETTINGS), masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        B, T = input_ids.shape
        q, k, v = (torch.randn(B, 2, T, 4, generator=g, dtype=torch.float64) for _ in range(3))
        bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
        batched = _attend(q, k, v, mask, "causal_padding_mask(input_ids, pad_id)")
        if not torch.isfinite(batched).all():
            raise AssertionError("attention under your mask gave NaN or inf.")
        for b in range(B):
            real = attention_mask[b]
            if not real.any():
                continue
            alone = F.scaled_dot_product_attention(q[b:b + 1, :, real], k[b:b + 1, :, real], v[b:b + 1, :, real],
                                                   is_causal=True)
            expect_close(batched[b][:, real], alone[0], f"outputs at the real tokens of sentence {b} ({direction} "
                         "padding)", "Under the combined mask each real token sees exactly the real tokens up to "
                         "itself, as torch's is_causal=True does for the sentence alone.")


SWAP_HINT = ("queries come from the decoder (mha.q_proj(decoder_states)) and keys and values from the encoder "
             "(mha.k_proj and mha.v_proj of encoder_states). You swapped them.")


SCALE_HINT = ("you divided the scores by √d_model: each head's dot product has d_head = d_model / h terms, so "
              "divide by √d_head (q.shape[-1] after the split), not by the model's width.")


MERGE_HINT = ("you merged the heads without moving the head axis back: (B, h, T_dec, d_head).reshape(B, T_dec, "
              "d_model) mixes tokens and heads. transpose(1, 2) before the reshape (or merge_heads).")


@cross_attention_shapes.judge
def judge_cross_attention_shapes(seeds, results):
    for output, weights in results:
        if tuple(getattr(output, "shape", ())) == (2, 6, 8):
            raise AssertionError("cross_attention's output has shape (2, 6, 8), one row per *encoder* token: "
                                 + SWAP_HINT)
        expect_shape(output, (2, 3, 8), "cross_attention's output",
                     "One output per decoder token: (B, T_dec, d_model).")
        expect_shape(weights, (2, 2, 3, 6), "cross_attention's weights",
                     "(B, h, T_dec, T_enc): each decoder query spreads its weight over the encoder tokens.")


def by_hand(mha, dec, enc, mask, scale, merge):
    """Judge side: cross-attention from the projections with a chosen scale and head merge, for diagnoses."""
    h = mha.num_heads
    q, k, v = (reference.split_heads(x, h) for x in (mha.q_proj(dec), mha.k_proj(enc), mha.v_proj(enc)))
    scores = q @ k.transpose(-2, -1) / scale
    weights = reference.masked_softmax(scores, mask) if mask is not None else torch.softmax(scores, dim=-1)
    return mha.out_proj(merge(weights @ v)), weights


def cross_diagnoses(mha, dec, enc, mask):
    """{misconception: (wrong output, wrong weights)} for the outputs and weights a bug would give."""
    with torch.no_grad():
        diagnoses = {"you ignored encoder_padding_mask: decoder queries must not attend to the source's padding.":
                     mha(dec, enc)}
        (B, T_dec, d_model), T_enc = dec.shape, enc.shape[1]
        rectangular_causal = torch.ones(T_dec, T_enc, dtype=torch.bool).tril()
        combined = rectangular_causal if mask is None else rectangular_causal & mask
        diagnoses["you applied a causal mask in cross-attention: the source sentence is known in full, so every "
                  "decoder position may attend to every (real) encoder token. Only the decoder's "
                  "self-attention is causal."] = mha(dec, enc, mask=combined)
        if T_dec == T_enc:
            diagnoses[SWAP_HINT] = mha(enc, dec, mask=mask)
        d_head = d_model // mha.num_heads
        diagnoses[SCALE_HINT] = by_hand(mha, dec, enc, mask, d_model ** 0.5, reference.merge_heads)
        diagnoses[MERGE_HINT] = by_hand(mha, dec, enc, mask, d_head ** 0.5, lambda x: x.reshape(B, T_dec, d_model))
        _, weights = mha(dec, enc, mask=mask)
        values = reference.split_heads(mha.v_proj(enc), mha.num_heads)
        diagnoses["you skipped the output projection: return mha.out_proj(merge_heads(weights @ v)), as "
                  "MultiHeadAttention does."] = (reference.merge_heads(weights @ values), weights)
    return diagnoses


@cross_attention_matches_torch.judge
def judge_cross_attention_matches_torch(seeds, results):
    for (stream, B, T_dec, T_enc, lengths), (output, weights) in zip(MATCH_CASES, results):
        mha, dec, enc, mask = cross_problem(seeds, stream, B, T_dec, T_enc, lengths=lengths)
        expected_output, expected_weights = torch_cross_attention(mha, dec, enc, mask)
        diagnoses = cross_diagnoses(mha, dec, enc, mask)
        expect_close(output, expected_output, "cross_attention's output",
                     "The same as torch.nn.MultiheadAttention(query=decoder, key=value=encoder, key_padding_mask="
                     "~mask) with the same weights.",
                     diagnoses={message: wrong_output for message, (wrong_output, _) in diagnoses.items()})
        expect_close(weights, expected_weights, "cross_attention's weights",
                     "Return the weights of the same attention: softmax of decoder queries · encoder keys / "
                     "√d_head, masked at the encoder's padding, (B, h, T_dec, T_enc).",
                     diagnoses={message: wrong_weights for message, (_, wrong_weights) in diagnoses.items()})


@cross_attention_ignores_encoder_padding.judge
def judge_cross_attention_ignores_encoder_padding(seeds, results):
    output, _ = results["plain"]
    padded_output, padded_weights = results["padded"]
    expect_close(padded_output, output, "decoder outputs after appending encoder padding",
                 "Appending padding to the source must change nothing: its keys are masked for every query.")
    if np.abs(to_numpy(padded_weights, "weights")[..., 5:]).max() > 1e-9:
        raise AssertionError("decoder queries gave weight to encoder padding: apply encoder_padding_mask.")
    changed_output, _ = results["changed"]
    others = [0, 1, 3]
    expect_close(to_numpy(changed_output, "cross_attention's output")[:, others], to_numpy(output, "output")[:, others],
                 "the other decoder positions' outputs",
                 "In cross-attention a decoder position looks only at the encoder; changing decoder token 2 "
                 "may change output 2 only. Did you take keys or values from the decoder?")
    empty_output, empty_weights = results["empty"]
    empty_output, empty_weights = to_numpy(empty_output, "output"), to_numpy(empty_weights, "weights")
    if not (np.all(np.isfinite(empty_output)) and np.all(np.isfinite(empty_weights))):
        raise AssertionError("cross_attention gave NaN for a source sentence made only of padding: its weights "
                             "must be all zeros (masked_softmax handles fully masked rows).")
    expect_close(empty_weights[1], np.zeros((2, 4, 5)), "the weights for an all-padding source",
                 "With nothing to attend to, every weight is 0.")


def oracle_packed(document_ids, window=None):
    """The definition, one (query t, key s) pair at a time: same document, s <= t, t - s < window."""
    B, T = document_ids.shape
    mask = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            for s in range(T):
                mask[b, 0, t, s] = bool(document_ids[b, t] == document_ids[b, s] and s <= t
                                        and (window is None or t - s < window))
    return mask


def flex_packed(document_ids, window=None):
    """The same mask from torch's flex_attention create_mask with a mask_mod (it runs on CPU), or None."""
    try:
        from torch.nn.attention.flex_attention import create_mask
    except ImportError:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (kv_idx <= q_idx)
        return allowed if window is None else allowed & (q_idx - kv_idx < window)

    B, T = document_ids.shape
    return create_mask(mask_mod, B, None, T, T, device="cpu")


def expected_packed(seeds, document_ids, window=None):
    """The loop's mask, cross-checked with the library's where the grader judges. (create_mask's first call
    warms up torch's vmap, about 0.3 s of CPU, too much for a notebook that judges itself in its kernel.)"""
    expected = oracle_packed(document_ids, window)
    library = flex_packed(document_ids, window) if seeds.token != LOCAL_TOKEN else None
    if library is not None and not torch.equal(library, expected):  # the two oracles must agree
        raise RuntimeError("the packed-mask oracles disagree: fix the check, not the answer")
    return expected


def packed_diagnoses(document_ids, window):
    B, T = document_ids.shape
    positions = torch.arange(T)
    causal = (positions[None, :] <= positions[:, None])[None, None]              # (1, 1, T, T)
    same = (document_ids[:, :, None] == document_ids[:, None, :])[:, None]       # (B, 1, T, T)
    lag = positions[:, None] - positions[None, :]
    diagnoses = {
        "your mask is a plain causal mask: it lets a token attend to earlier *documents* packed into the same "
        "row. Also require document_ids[b, s] == document_ids[b, t].": causal.expand(B, 1, T, T),
        "your mask hides other documents but is not causal: a token sees later tokens of its own document. "
        "Also require s <= t.": same,
        "True means 'may attend' in this course: your mask is True exactly where attention is forbidden.":
            ~oracle_packed(document_ids, window),
    }
    if window is not None:
        diagnoses["your window is off by one: with window w a query sees w keys, itself and the w - 1 before it, "
                  "so the rule is t - s < window, not t - s <= window."] = causal & same & (lag <= window)
        diagnoses[f"you ignored window={window}: with a window, a query may also attend only to the keys "
                  "t - window < s <= t."] = causal & same
    return diagnoses


def check_packed_mask(mask, document_ids, window):
    B, T = document_ids.shape
    name = f"packed_causal_mask(document_ids of shape {(B, T)}" + ("" if window is None else f", window={window}") + ")"
    bool_mask(mask, name)
    expect_shape(mask, (B, 1, T, T), name, "(B, 1, T, T): one (T, T) mask per packed row, and a head axis of size 1 "
                 "that broadcasts over the heads of the scores (B, h, T, T).")
    return name


@stretch_packed_causal_mask_values.judge
def judge_stretch_packed_causal_mask_values(seeds, masks):
    for (document_ids, window), mask in zip(packed_value_cases(seeds), masks):
        name = check_packed_mask(mask, document_ids, window)
        expect_close(mask, expected_packed(seeds, document_ids, window), name,
                     "Position t may attend to s when both are in the same document, s <= t, and (with a window) "
                     "t - s < window.", diagnoses=packed_diagnoses(document_ids, window))


@stretch_packed_causal_mask_behaviour.judge
def judge_stretch_packed_causal_mask_behaviour(seeds, masks):
    """Attention over a packed row under the mask equals attention over each document alone."""
    g = seeds.generator(2662)
    for (stream, B, T, window), mask in zip(PACKED_BEHAVIOUR_CASES, masks):
        document_ids = packing(seeds, stream, B, T)
        name = check_packed_mask(mask, document_ids, window)
        q, k, v = (torch.randn(B, 2, T, 4, generator=g, dtype=torch.float64) for _ in range(3))
        packed = _attend(q, k, v, mask, name)
        for b in range(B):
            for document in document_ids[b].unique().tolist():
                inside = document_ids[b] == document
                n = int(inside.sum())
                alone_mask = torch.ones(n, n, dtype=torch.bool).tril()
                if window is not None:
                    alone_mask = alone_mask.triu(1 - window)   # keys t - window + 1 .. t
                alone = F.scaled_dot_product_attention(q[b][:, inside], k[b][:, inside], v[b][:, inside],
                                                       attn_mask=alone_mask)
                expect_close(packed[b][:, inside], alone, f"the outputs of document {document} in packed row {b}"
                             + ("" if window is None else f" (window={window})"),
                             "Packed into a row, each document must attend exactly as it would alone: no key of "
                             "another document, no future key" + ("" if window is None else
                                                                  ", and only the last `window` keys") + ".")
