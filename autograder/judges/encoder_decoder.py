"""Hidden checks for encoder_decoder, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/encoder_decoder.py, which also builds the
inputs both sides rebuild from the seeds."""
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import count, expect_close, expect_shape, expect_tensor
from courselib import seq2seq as reference
from autograder.checks.encoder_decoder import (
    BEAM_CASES,
    BEAM_MAX,
    BUCKET_SETTINGS,
    CUT,
    DECODER_NAMES,
    ED_DIMS,
    EXHAUSTIVE_MAX,
    EXHAUSTIVE_VOCAB,
    EXHAUSTIVE_WIDTH,
    GREEDY_CASES,
    HELD_OUT_EXAMPLES,
    LOSS_FULL,
    LOSS_PADDED,
    MASK_DIMS,
    MASK_T,
    MODEL_CASES,
    MODEL_NAMES,
    PENALTY_CASES,
    POST_LN_CASES,
    PRE_LN_CASES,
    RecordingModel,
    STOP_PLAN,
    WIDTH_ONE_SOURCES,
    beam_search_exhaustive,
    beam_search_length_penalty,
    beam_search_values,
    beam_search_width_one_is_greedy,
    beam_source,
    beam_tables,
    bucket_positions,
    decoder_case,
    decoder_layer_masks,
    decoder_layer_post_ln,
    decoder_layer_pre_ln,
    decoder_layer_structure,
    encoder_decoder_encode,
    encoder_decoder_logits,
    encoder_decoder_structure,
    encoder_decoder_uses_memory,
    exact_match_after_eos,
    exact_match_cases,
    exact_match_values,
    fingerprint,
    greedy_decode_stops,
    greedy_decode_values,
    greedy_sources,
    greedy_tables,
    held_out_pairs,
    lengths_to_keep,
    loss_case,
    model_case,
    model_shapes,
    penalty_tables,
    scripted_logits,
    seq2seq_loss_ignores_padding,
    seq2seq_loss_shifts_target,
    stretch_relative_position_bucket_bidirectional,
    stretch_relative_position_bucket_causal,
    trained_model_learns,
)


EARLIER = "(This test uses reference versions of your other classes and functions, so only this exercise is graded here.)"


def causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


# ---------------------------------------------------------------- torch's layout (judge side)
def torch_attention_state(weights, ours, theirs):
    w = lambda part: weights[f"{ours}.{part}"]  # noqa: E731
    return {f"{theirs}.in_proj_weight": torch.cat([w("q_proj.weight"), w("k_proj.weight"), w("v_proj.weight")]),
            f"{theirs}.in_proj_bias": torch.cat([w("q_proj.bias"), w("k_proj.bias"), w("v_proj.bias")]),
            f"{theirs}.out_proj.weight": w("out_proj.weight"), f"{theirs}.out_proj.bias": w("out_proj.bias")}


def torch_layer_state(weights, ours, theirs, decoder):
    """One layer's weights in torch's names: our `self_attn`/`cross_attn` are its `self_attn`/`multihead_attn`."""
    state = torch_attention_state(weights, f"{ours}self_attn", f"{theirs}self_attn")
    if decoder:
        state.update(torch_attention_state(weights, f"{ours}cross_attn", f"{theirs}multihead_attn"))
    pairs = [("ffn.linear1", "linear1"), ("ffn.linear2", "linear2"), ("norm1", "norm1"), ("norm2", "norm2")]
    for our_name, their_name in pairs + ([("norm3", "norm3")] if decoder else []):
        state.update({f"{theirs}{their_name}.{kind}": weights[f"{ours}{our_name}.{kind}"] for kind in ("weight", "bias")})
    return state


def torch_decoder_layer(weights, d_model, num_heads, d_ff, norm_first):
    """torch.nn.TransformerDecoderLayer (float64) holding the check's weights."""
    theirs = nn.TransformerDecoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu", batch_first=True,
                                        norm_first=norm_first, layer_norm_eps=1e-5).double()
    theirs.load_state_dict(torch_layer_state(weights, "", "", decoder=True))
    return theirs.train()  # train mode with dropout 0: the plain path, deterministic


def torch_transformer(weights, dims):
    """torch.nn.Transformer(norm_first=True) (float64) holding the check's encoder, decoder and final norms."""
    with warnings.catch_warnings():   # "enable_nested_tensor is True, but ...": a fast path the judge never takes
        warnings.simplefilter("ignore")
        theirs = nn.Transformer(dims["d_model"], dims["num_heads"], dims["num_layers"], dims["num_layers"],
                                dims["d_ff"], dropout=0.0, activation="gelu", batch_first=True, norm_first=True,
                                layer_norm_eps=1e-5).double()
    state = {}
    for i in range(dims["num_layers"]):
        state.update(torch_layer_state(weights, f"encoder_layers.{i}.", f"encoder.layers.{i}.", decoder=False))
        state.update(torch_layer_state(weights, f"decoder_layers.{i}.", f"decoder.layers.{i}.", decoder=True))
    for side in ("encoder", "decoder"):
        state.update({f"{side}.norm.{kind}": weights[f"{side}_norm.{kind}"] for kind in ("weight", "bias")})
    theirs.load_state_dict(state)
    return theirs.train()


NO_CAUSAL = ("the self-attention has no causal mask: target position t reads the targets after t, the very tokens "
             "it is trained to predict. Combine causal_mask(T) with the target's padding mask (&).")


CAUSAL_CROSS = ("the cross-attention has a causal mask over the encoder's positions, so target position t reads "
                "only source positions 0..t. The whole source is known before decoding starts: cross-attention "
                "masks only the source's padding (memory_padding_mask), never causally.")


MEMORY_PADDING_IGNORED = ("the cross-attention ignores memory_padding_mask: target positions read the source's "
                          "padding. Pass it to cross_attn as its mask.")


TARGET_PADDING_IGNORED = ("the self-attention ignores tgt_padding_mask: padded target positions attend to padding. "
                          "Combine it with the causal mask: causal_mask(T) & tgt_padding_mask.")


PRE_FOR_POST = ("with norm_first=False you computed a pre-LN layer: post-LN normalises each residual sum, "
                "x = norm1(x + self_attn(x)), x = norm2(x + cross_attn(x, memory)), x = norm3(x + ffn(x)).")


POST_FOR_PRE = ("with norm_first=True you computed a post-LN layer: pre-LN normalises each sublayer's input, "
                "x = x + self_attn(norm1(x)), x = x + cross_attn(norm2(x), memory), x = x + ffn(norm3(x)).")


RESIDUAL_AFTER_NORM = ("the residual adds the normalised input: in pre-LN the skip connection carries the raw x, "
                       "x = x + self_attn(norm1(x)), not h + self_attn(h) with h = norm1(x).")


MEMORY_NORMALISED = ("the encoder's output went through norm2 too: in pre-LN only the decoder's stream is normalised "
                     "before cross-attention (the encoder normalised its output already); keys and values come "
                     "from memory as it is.")


NORMS_SWAPPED = ("the LayerNorms are in the wrong sublayers: norm1 belongs to the self-attention, norm2 to the "
                 "cross-attention and norm3 to the feed-forward sublayer, as in torch's layer.")


NO_CROSS_RESIDUAL = "the cross-attention sublayer has no residual connection: add its input back to its output."


def decoder_by_hand(theirs, x, memory, tgt_keep, mem_keep, norm_first, causal_self=True, causal_cross=False,
                    tgt_pad=True, mem_pad=True, norm_memory=False, raw_residual=True, norms=("norm1", "norm2", "norm3"),
                    cross_residual=True):
    """What a decoder layer computes with torch's sublayers, with one of the known mistakes switched on."""
    T, S = x.shape[1], memory.shape[1]
    self_block = ~causal(T) if causal_self else None
    cross_block = ~torch.ones(T, S, dtype=torch.bool).tril() if causal_cross else None
    tgt_ignore = ~tgt_keep if tgt_pad and tgt_keep is not None else None
    mem_ignore = ~mem_keep if mem_pad and mem_keep is not None else None
    n1, n2, n3 = (getattr(theirs, name) for name in norms)

    def self_attention(h):
        return theirs.self_attn(h, h, h, attn_mask=self_block, key_padding_mask=tgt_ignore, need_weights=False)[0]

    def cross_attention(h, m):
        return theirs.multihead_attn(h, m, m, attn_mask=cross_block, key_padding_mask=mem_ignore, need_weights=False)[0]

    def ffn(h):
        return theirs.linear2(F.gelu(theirs.linear1(h)))

    with torch.no_grad():
        if norm_first and raw_residual:
            x = x + self_attention(n1(x))
            h = n2(x)
            x = (x if cross_residual else 0) + cross_attention(h, n2(memory) if norm_memory else memory)
            return x + ffn(n3(x))
        if norm_first:
            h = n1(x)
            h = h + self_attention(h)
            g = n2(h)
            g = g + cross_attention(g, memory)
            return n3(g) + ffn(n3(g))
        x = n1(x + self_attention(x))
        x = n2((x if cross_residual else 0) + cross_attention(x, memory))
        return n3(x + ffn(x))


def decoder_layer_oracle(weights, dims, x, memory, tgt_keep, mem_keep, norm_first):
    """torch's layer output, and what the known mistakes give with the same weights."""
    theirs = torch_decoder_layer(weights, *dims, norm_first)
    T = x.shape[1]
    with torch.no_grad():
        expected = theirs(x, memory, tgt_mask=~causal(T), tgt_key_padding_mask=~tgt_keep,
                          memory_key_padding_mask=~mem_keep)
    same = dict(theirs=theirs, x=x, memory=memory, tgt_keep=tgt_keep, mem_keep=mem_keep, norm_first=norm_first)
    diagnoses = {NO_CAUSAL: decoder_by_hand(**same, causal_self=False),
                 CAUSAL_CROSS: decoder_by_hand(**same, causal_cross=True),
                 MEMORY_PADDING_IGNORED: decoder_by_hand(**same, mem_pad=False),
                 TARGET_PADDING_IGNORED: decoder_by_hand(**same, tgt_pad=False),
                 NORMS_SWAPPED: decoder_by_hand(**same, norms=("norm1", "norm3", "norm2")),
                 NO_CROSS_RESIDUAL: decoder_by_hand(**same, cross_residual=False)}
    if norm_first:
        diagnoses.update({POST_FOR_PRE: decoder_by_hand(**{**same, "norm_first": False}),
                          RESIDUAL_AFTER_NORM: decoder_by_hand(**same, raw_residual=False),
                          MEMORY_NORMALISED: decoder_by_hand(**same, norm_memory=True)})
    else:
        diagnoses[PRE_FOR_POST] = decoder_by_hand(**{**same, "norm_first": True})
    return expected, diagnoses


@decoder_layer_structure.judge
def judge_decoder_layer_structure(seeds, results):
    expected = count(nn.TransformerDecoderLayer(12, 3, 20, batch_first=True))
    for result in results:
        if result["parameters"] != expected:
            raise AssertionError(
                f"DecoderLayer(12, 3, 20) has {result['parameters']} parameters; torch's TransformerDecoderLayer has "
                f"{expected} (two attentions of 4 projections each, 2 FFN linears, 3 LayerNorms). Build exactly "
                f"{DECODER_NAMES}.")
        expect_shape(result["output"], (3, 4, 12), "DecoderLayer output (3 sentences, 4 target positions, 6 source "
                     "positions)", "One output per *target* position: the queries come from x, the cross-attention's "
                     "keys and values from memory, and the layer keeps the width d_model so that layers stack.")


def _judge_decoder_parity(seeds, outputs, norm_first, cases):
    setting = "pre-LN" if norm_first else "post-LN"
    for (stream, dims, batch, T, S, tgt_lengths, mem_lengths), out in zip(cases, outputs):
        weights, x, memory = decoder_case(seeds, stream, dims, batch, T, S)
        expected, diagnoses = decoder_layer_oracle(weights, dims, x, memory, lengths_to_keep(tgt_lengths, T),
                                                   lengths_to_keep(mem_lengths, S), norm_first)
        expect_close(out, expected, f"{setting} DecoderLayer output with padded targets and sources",
                     hint=f"Compare with torch.nn.TransformerDecoderLayer(norm_first={norm_first}) given the causal "
                          "mask and both padding masks.", diagnoses=diagnoses, rtol=1e-6, atol=1e-6)


@decoder_layer_post_ln.judge
def judge_decoder_layer_post_ln(seeds, outputs):
    _judge_decoder_parity(seeds, outputs, False, POST_LN_CASES)


@decoder_layer_pre_ln.judge
def judge_decoder_layer_pre_ln(seeds, outputs):
    _judge_decoder_parity(seeds, outputs, True, PRE_LN_CASES)


@decoder_layer_masks.judge
def judge_decoder_layer_masks(seeds, results):
    for result in results:
        base = expect_tensor(result["base"], "DecoderLayer's output")
        expect_shape(base, (2, MASK_T, MASK_DIMS[0]), "DecoderLayer output")
        expect_close(result["later_targets"][:, :CUT + 1], base[:, :CUT + 1],
                     f"outputs at target positions 0..{CUT} after rewriting the targets after {CUT}",
                     hint=NO_CAUSAL)
        first = expect_tensor(result["last_source"], "DecoderLayer's output")[:, 0]
        if first.shape == base[:, 0].shape and torch.allclose(first, base[:, 0], rtol=0, atol=1e-9):
            raise AssertionError("changing the last source token did not change the output at target position 0. "
                                 + CAUSAL_CROSS + " (Or the layer never reads memory: cross_attn(x, memory, memory).)")
        expect_close(result["noisy_padding"], result["padded"], "outputs when the source's padding changes",
                     hint=MEMORY_PADDING_IGNORED)


NO_SCALE = "the token embeddings are not scaled: TokenEmbedding(vocab_size, d_model) multiplies them by √d_model."


NO_POSITIONS = "no position embeddings were added: add src_positions(src_ids) to the source's token embeddings."


WRONG_TABLE_SRC = "the source used tgt_positions: the encoder adds src_positions(src_ids), the decoder tgt_positions."


WRONG_TABLE_TGT = ("the target used src_positions: the decoder adds tgt_positions(tgt_in_ids), the encoder "
                   "src_positions.")


NO_ENCODER_NORM = ("the encoder's output is missing its final LayerNorm: a pre-LN stack ends with one, "
                   "encoder_norm(x), since no layer normalises its own output.")


NO_DECODER_NORM = "the decoder's output is missing its final LayerNorm: head(decoder_norm(y))."


SOURCE_PADDING_IGNORED = ("the encoder's self-attention reads the source's padding: pass padding_mask(src_ids, pad_id) "
                          "to every EncoderLayer.")


MODEL_MEMORY_PADDING = ("the decoder reads the source's padding: pass padding_mask(src_ids, pad_id) to every "
                        "DecoderLayer as its memory_padding_mask.")


MODEL_TARGET_PADDING = ("the decoder's self-attention reads the target's padding: pass padding_mask(tgt_in_ids, pad_id) "
                        "to every DecoderLayer as its tgt_padding_mask.")


def model_outputs(weights, dims, src, tgt_in, memory=None, scale=True, src_table="src", tgt_table="tgt",
                  encoder_norm=True, decoder_norm=True, src_pad=True, mem_pad=True, tgt_pad=True):
    """(memory, logits) of nn.Transformer between the check's embeddings and head; switches give known mistakes."""
    theirs = torch_transformer(weights, dims)
    pad, d = dims["pad_id"], dims["d_model"]
    table = {name: weights[f"{name}_positions.table.weight"] for name in ("src", "tgt")}

    def embed(ids, positions):
        tokens = F.embedding(ids, weights["embed.embedding.weight"]) * (math.sqrt(d) if scale else 1.0)
        return tokens + (0 if positions is None else table[positions][:ids.shape[1]])

    with torch.no_grad():
        if memory is None:
            x = embed(src, src_table)
            for layer in theirs.encoder.layers:
                x = layer(x, src_key_padding_mask=(src == pad) if src_pad else None)
            memory = theirs.encoder.norm(x) if encoder_norm else x
        T = tgt_in.shape[1]
        y = embed(tgt_in, tgt_table)
        for layer in theirs.decoder.layers:
            y = layer(y, memory, tgt_mask=~causal(T), tgt_key_padding_mask=(tgt_in == pad) if tgt_pad else None,
                      memory_key_padding_mask=(src == pad) if mem_pad else None)
        y = theirs.decoder.norm(y) if decoder_norm else y
        return memory, F.linear(y, weights["head.weight"], weights["head.bias"])


def oracle_model(weights, dims, src, tgt_in, memory=None):
    """nn.Transformer's own forward (its encoder and decoder, final norms included) between our embeddings and head."""
    theirs = torch_transformer(weights, dims)
    pad, d = dims["pad_id"], dims["d_model"]
    with torch.no_grad():
        src_emb = (F.embedding(src, weights["embed.embedding.weight"]) * math.sqrt(d)
                   + weights["src_positions.table.weight"][:src.shape[1]])
        tgt_emb = (F.embedding(tgt_in, weights["embed.embedding.weight"]) * math.sqrt(d)
                   + weights["tgt_positions.table.weight"][:tgt_in.shape[1]])
        if memory is None:
            memory = theirs.encoder(src_emb, src_key_padding_mask=src == pad)
        out = theirs.decoder(tgt_emb, memory, tgt_mask=~causal(tgt_in.shape[1]), tgt_key_padding_mask=tgt_in == pad,
                             memory_key_padding_mask=src == pad)
        return memory, F.linear(out, weights["head.weight"], weights["head.bias"])


def encode_diagnoses(weights, dims, src, tgt_in):
    def memory_with(**switch):
        return model_outputs(weights, dims, src, tgt_in, **switch)[0]
    return {NO_SCALE: memory_with(scale=False), NO_POSITIONS: memory_with(src_table=None),
            WRONG_TABLE_SRC: memory_with(src_table="tgt"), NO_ENCODER_NORM: memory_with(encoder_norm=False),
            SOURCE_PADDING_IGNORED: memory_with(src_pad=False)}


def logits_diagnoses(weights, dims, src, tgt_in):
    def logits_with(**switch):
        return model_outputs(weights, dims, src, tgt_in, **switch)[1]
    return {NO_SCALE: logits_with(scale=False), WRONG_TABLE_TGT: logits_with(tgt_table="src"),
            NO_DECODER_NORM: logits_with(decoder_norm=False), NO_ENCODER_NORM: logits_with(encoder_norm=False),
            MODEL_MEMORY_PADDING: logits_with(mem_pad=False), MODEL_TARGET_PADDING: logits_with(tgt_pad=False),
            SOURCE_PADDING_IGNORED: logits_with(src_pad=False)}


@encoder_decoder_structure.judge
def judge_encoder_decoder_structure(seeds, data):
    shapes = model_shapes(ED_DIMS)
    expected = sum(math.prod(shape) for _, shape in shapes)
    if data["parameters"] != expected:
        missing = sorted({name for name, _ in shapes} - set(data["names"]))
        raise AssertionError(f"EncoderDecoder has {data['parameters']} parameters; expected {expected}: "
                             f"{MODEL_NAMES}, with the encoder's and the decoder's layers in their ModuleLists. "
                             + (f"Missing: {', '.join(missing[:6])}." if missing else "Is a module extra or shared?"))
    d, V = ED_DIMS["d_model"], ED_DIMS["vocab_size"]
    expect_shape(data["memory"], (2, 7, d), "encode(src_ids)'s output", "The encoder's output (B, S, d_model): one "
                 "vector per source position.")
    expect_shape(data["logits"], (2, 5, V), "EncoderDecoder(src_ids, tgt_in_ids)",
                 "The logits (B, T, vocab_size): one row of scores per *target* position.")


@encoder_decoder_encode.judge
def judge_encoder_decoder_encode(seeds, memories):
    for case, memory in zip(MODEL_CASES, memories):
        weights, (src, tgt_in) = model_case(seeds, *case)
        expected, _ = oracle_model(weights, ED_DIMS, src, tgt_in)
        expect_close(memory, expected, "encode(src_ids) (the encoder's output)",
                     hint="Compare with nn.Transformer(norm_first=True).encoder on embed(src_ids) + "
                          "src_positions(src_ids), with the source's padding mask. " + EARLIER,
                     diagnoses=encode_diagnoses(weights, ED_DIMS, src, tgt_in), rtol=1e-6, atol=1e-6)


@encoder_decoder_logits.judge
def judge_encoder_decoder_logits(seeds, results):
    for case, result in zip(MODEL_CASES, results):
        weights, (src, tgt_in) = model_case(seeds, *case)
        _, expected = oracle_model(weights, ED_DIMS, src, tgt_in)
        hint = ("Compare with nn.Transformer(norm_first=True) between embed + positions and head, given the causal "
                "mask and both padding masks. " + EARLIER)
        diagnoses = logits_diagnoses(weights, ED_DIMS, src, tgt_in)
        expect_close(result["forward"], expected, "EncoderDecoder(src_ids, tgt_in_ids) (the logits)", hint=hint,
                     diagnoses=diagnoses, rtol=1e-6, atol=1e-6)
        expect_close(result["decode"], expected, "decode(tgt_in_ids, encode(src_ids), src_ids)",
                     hint="forward(src_ids, tgt_in_ids) must be decode(tgt_in_ids, encode(src_ids), src_ids).",
                     diagnoses=diagnoses, rtol=1e-6, atol=1e-6)


@encoder_decoder_uses_memory.judge
def judge_encoder_decoder_uses_memory(seeds, data):
    weights, (src, tgt_in) = model_case(seeds, 10121, (6, 3), (5, 4), 6, 5)
    other_memory = torch.randn(2, 6, ED_DIMS["d_model"], generator=seeds.generator(10122), dtype=torch.float64)
    _, expected = oracle_model(weights, ED_DIMS, src, tgt_in, memory=other_memory)
    expect_close(data["given_memory"], expected, "decode(tgt_in_ids, memory, src_ids) with a memory of our choosing",
                 hint="decode must read the memory it is given (the decoders pass it in, encoded once), not encode "
                      "src_ids again.", rtol=1e-6, atol=1e-6)
    expect_close(data["longer_source"], data["source"], "the logits after appending three [PAD] to every source",
                 hint="Padding must change nothing: mask the source's padding in the encoder and in every "
                      "cross-attention.", rtol=1e-6, atol=1e-6)


def shift_right(tgt, bos=1):
    return torch.cat([torch.full_like(tgt[:, :1], bos), tgt[:, :-1]], dim=1)


def loss_oracle(by_position, by_source, src, tgt):
    logits_of = RecordingModel(by_position, by_source)
    logits = logits_of(src, shift_right(tgt))
    real = tgt != 0
    per_token = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view_as(tgt)
    expected = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0)
    unshifted = F.cross_entropy(logits_of(src, tgt).flatten(0, 1), tgt.flatten(), ignore_index=0)
    diagnoses = {
        "the loss counts the padding: average the cross-entropy over the real target tokens only "
        "(F.cross_entropy(..., ignore_index=pad_id)).": per_token.mean(),
        "you summed the real tokens' cross-entropies; the loss is their mean.": per_token[real].sum(),
        "you averaged each sentence's tokens, then the sentences; the loss is the mean over every real token "
        "of the batch, so that long targets weigh by their length.": (
            (per_token * real).sum(1) / real.sum(1)).mean(),
        "the labels are the decoder input: the model at position t must predict the target token t, the one "
        "*after* its input (labels = tgt_ids, input = [BOS] + tgt_ids[:, :-1]).": F.cross_entropy(
            logits.flatten(0, 1), shift_right(tgt).flatten(), ignore_index=0),
    }
    return expected, unshifted, diagnoses


NOT_SHIFTED = ("the target is not shifted: the decoder's input must be [BOS] followed by the target without its last "
               "token (shifted right). Fed the target itself, position t reads the very token it must predict, and "
               "the model learns to copy instead of to translate.")


def _judge_loss(seeds, data, stream, lengths):
    by_position, by_source, src, tgt = loss_case(seeds, stream, lengths)
    if not data["inputs"]:
        raise AssertionError("seq2seq_loss never ran the model: call model(src_ids, decoder_input).")
    first = data["inputs"][0]
    if tuple(first.shape) == tuple(tgt.shape) and torch.equal(first, tgt):
        raise AssertionError(NOT_SHIFTED)
    if tuple(first.shape) != tuple(tgt.shape) or not torch.equal(first, shift_right(tgt)):
        raise AssertionError(f"the decoder input was {first.tolist()}; for targets {tgt.tolist()} it should be "
                             f"{shift_right(tgt).tolist()}: [BOS] (bos_id), then each target without its last "
                             "position, one (B, T) batch in one call.")
    expected, unshifted, diagnoses = loss_oracle(by_position, by_source, src, tgt)
    expect_close(data["loss"], expected, "the loss", diagnoses=diagnoses,
                 hint="Mean cross-entropy of the logits against tgt_ids over the real (non-padding) tokens.",
                 rtol=1e-7, atol=1e-9)


@seq2seq_loss_shifts_target.judge
def judge_seq2seq_loss_shifts_target(seeds, data):
    _judge_loss(seeds, data, *LOSS_FULL)


@seq2seq_loss_ignores_padding.judge
def judge_seq2seq_loss_ignores_padding(seeds, data):
    _judge_loss(seeds, data, *LOSS_PADDED)


# The learner's model trains 200 steps (100 under grading); on held-out dates it then scores about 0.07
# (0.65 under grading) nats per target token, an untrained one about ln 40 = 3.7. The mean over 256 fresh
# dates (about 2600 tokens) moves by a few hundredths from one seed to the next, so the threshold below fails
# a correct notebook with a negligible probability for any seed; a model trained on an unshifted target (it
# learns to copy) stays far above it.
LOSS_THRESHOLD = 1.5


@trained_model_learns.judge
def judge_trained_model_learns(seeds, data):
    _, tgt = reference.batch(held_out_pairs(seeds))
    logits = expect_tensor(data["logits"], "the model's logits")
    expect_shape(logits, (*tgt.shape, len(reference.VOCAB)), "the trained model's logits")
    shipped = fingerprint(reference.load_checkpoint().state_dict())
    theirs = data["fingerprint"]
    if torch.is_tensor(theirs) and theirs.shape == shipped.shape and torch.allclose(theirs, shipped, rtol=1e-6):
        raise AssertionError("`model` holds the course's shipped checkpoint, not the model you trained: this test "
                             "grades your training run (your EncoderDecoder and your seq2seq_loss).")
    loss = F.cross_entropy(logits.double().flatten(0, 1), tgt.flatten(), ignore_index=reference.PAD).item()
    if not loss < LOSS_THRESHOLD:
        raise AssertionError(
            f"your trained model's cross-entropy on {HELD_OUT_EXAMPLES} held-out dates is {loss:.2f} nats per target "
            f"token (an untrained model: about {math.log(len(reference.VOCAB)):.1f}); after the training cell it "
            f"should be below {LOSS_THRESHOLD}. If an earlier test failed, fix it first (a decoder that peeks, or a "
            "loss on an unshifted target, trains a model that copies instead of translating); then run the "
            "training cell again.")


def next_log_probs(tables, source, prefix):
    """Judge side: log-probabilities of the next token after [BOS] + prefix, for one source."""
    by_position, by_previous, by_source, eos_at = tables
    ids = torch.tensor([[1, *prefix]])
    first = source[0]
    logits = scripted_logits(by_position, by_previous, by_source[first][None], eos_at[first].double()[None], ids)
    return torch.log_softmax(logits[0, -1], dim=-1).tolist()


def reference_greedy(tables, source, max_len, eos=2):
    out = []
    while len(out) < max_len:
        scores = next_log_probs(tables, source, out)
        out.append(max(range(len(scores)), key=scores.__getitem__))
        if out[-1] == eos:
            break
    return out


def reference_beam(tables, source, width, max_len, penalty=0.0, eos=2):
    """Judge side: the notebook's beam search, written over Python tuples. Returns (tokens, score)."""
    alive, finished = [((), 0.0)], []
    for _ in range(max_len):
        candidates = [(seq + (token,), score + lp) for seq, score in alive
                      for token, lp in enumerate(next_log_probs(tables, source, list(seq)))]
        candidates.sort(key=lambda c: -c[1])
        kept = candidates[:width]
        finished += [c for c in kept if c[0][-1] == eos]
        alive = [c for c in kept if c[0][-1] != eos]
        if not alive:
            break
    finished += alive
    best = max(finished, key=lambda c: c[1] / len(c[0]) ** penalty)
    return list(best[0]), best[1] / len(best[0]) ** penalty


def all_sequences(tables, source, max_len, eos=2):
    """Judge side: every possible output (ending in [EOS], or cut at max_len) with its log-probability."""
    done, frontier = [], [((), 0.0)]
    for _ in range(max_len):
        grown = []
        for seq, score in frontier:
            for token, lp in enumerate(next_log_probs(tables, source, list(seq))):
                (done if token == eos else grown).append((seq + (token,), score + lp))
        frontier = grown
    return done + frontier


def expected_rows(tables, src, max_len):
    return [reference_greedy(tables, row.tolist(), max_len) for row in src]


def _judge_rows(out, rows, max_len):
    if out.dim() != 2 or out.shape[0] != len(rows) or not 1 <= out.shape[1] <= max_len:
        raise AssertionError(f"greedy_decode returned a tensor of shape {tuple(out.shape)}; expected "
                             f"({len(rows)}, L) with L <= max_len = {max_len}: the generated tokens of each row, "
                             "without [BOS].")
    for i, expected in enumerate(rows):
        got = out[i].tolist()
        mine = got[:len(expected)]
        if mine != expected:
            hint = ""
            if got[:1] == [1]:
                hint = " Leave [BOS] out of the result: it was the decoder's first input, not a generated token."
            raise AssertionError(f"row {i}: greedy_decode generated {got}; the most likely token at each step gives "
                                 f"{expected}.{hint} At each step take the argmax of the logits at the last position "
                                 "(it predicts the next token), append it to the decoder input, and decode again.")
        rest = got[len(expected):]
        if expected[-1] == 2 and any(token != 0 for token in rest):
            raise AssertionError(f"row {i} kept generating after its [EOS]: {got}. A finished row is filled with "
                                 "pad_id while the other rows finish.")
        if expected[-1] != 2 and len(expected) != max_len:
            raise AssertionError("internal: the greedy reference stopped early")


@greedy_decode_values.judge
def judge_greedy_decode_values(seeds, outputs):
    for i, ((firsts, plan, max_len), out) in enumerate(zip(GREEDY_CASES, outputs)):
        tables = greedy_tables(seeds, 10401 + i, plan)
        rows = expected_rows(tables, greedy_sources(firsts, seeds, 10411 + i), max_len)
        _judge_rows(expect_tensor(out, "greedy_decode's result"), rows, max_len)
        if any(row[-1] != 2 for row in rows) and out.shape[1] != max_len:
            raise AssertionError(f"a row that never produces [EOS] must run to max_len = {max_len} tokens; the "
                                 f"result has {out.shape[1]} columns.")


@greedy_decode_stops.judge
def judge_greedy_decode_stops(seeds, data):
    tables = greedy_tables(seeds, 10421, STOP_PLAN)
    rows = expected_rows(tables, greedy_sources((0, 1, 2, 3), seeds, 10422), 9)
    out = expect_tensor(data["out"], "greedy_decode's result")
    _judge_rows(out, rows, 9)
    longest = max(len(row) for row in rows)
    if data["encodes"] != 1:
        raise AssertionError(f"the encoder ran {data['encodes']} times for one call of greedy_decode: run "
                             "model.encode(src_ids) once, before the loop, and pass its memory to model.decode at "
                             "every step (the source does not change while the target grows).")
    if data["longest_input"] > longest or out.shape[1] != longest:
        raise AssertionError(f"every row had produced [EOS] after {longest} steps, but greedy_decode went on (decoder "
                             f"inputs of up to {data['longest_input']} tokens, {out.shape[1]} columns returned): stop as "
                             "soon as all rows have finished.")


# ================================================================ exercise 5: exact_match
def reference_exact_match(predictions, targets, eos=2):
    def up_to_eos(row):
        row = [int(t) for t in row]
        return row[:row.index(eos) + 1] if eos in row else row
    return sum(up_to_eos(p) == up_to_eos(t) for p, t in zip(predictions, targets)) / len(targets)


@exact_match_values.judge
def judge_exact_match_values(seeds, results):
    for i, stream in enumerate((10501, 10502)):
        predictions, targets = exact_match_cases(seeds, stream)
        expect_close(results[2 * i + 1], 1.0, "exact_match of the targets against themselves",
                     "Every row matches itself: the share is 1.0.")
        token_level = (predictions[:, :targets.shape[1]] == targets[:, :predictions.shape[1]]).double().mean()
        expect_close(results[2 * i], reference_exact_match(predictions.tolist(), targets.tolist()),
                     "exact_match on predictions with mistakes", rtol=0, atol=1e-9,
                     diagnoses={"you counted matching tokens; exact match counts whole sequences that are right "
                                "up to and including [EOS].": token_level},
                     hint="A row counts when its tokens up to and including the first [EOS] are the target's, "
                          "whatever follows [EOS]; a prediction without [EOS] never matches.")


@exact_match_after_eos.judge
def judge_exact_match_after_eos(seeds, results):
    garbage, no_eos, wider = results
    if garbage != 1.0:
        raise AssertionError(f"a prediction equal to the target up to its [EOS], followed by other tokens, scored "
                             f"{garbage}: what comes after [EOS] is not part of the answer (greedy_decode fills it "
                             "with padding, other decoders may not); compare up to the first [EOS].")
    if no_eos != 0.0:
        raise AssertionError(f"a prediction that never produced [EOS] scored {no_eos}: an answer that does not end "
                             "is not the target's answer; compare up to and including [EOS].")
    if wider != 1.0:
        raise AssertionError(f"the right answer in a wider tensor scored {wider}: predictions and targets may have "
                             "different widths; compare each row up to its [EOS].")


def _judge_beam(tokens, score, expected_tokens, expected_score, what):
    got = expect_tensor(tokens, "beam_search's tokens").tolist()
    if got[:1] == [1] and got[1:] == expected_tokens:
        raise AssertionError(f"{what}: beam_search returned [BOS] too; return the generated tokens only.")
    if got != expected_tokens:
        raise AssertionError(f"{what}: beam_search returned {got} (score {score:.4f}); expected {expected_tokens} "
                             f"(score {expected_score:.4f}). Keep the beam_width best of all extensions of the live "
                             "hypotheses by total log-probability; a kept hypothesis that ends in [EOS] is finished "
                             "and leaves the beam; stop when the beam is empty or after max_len tokens.")
    expect_close(score, expected_score, f"{what}: the score", rtol=1e-6, atol=1e-8,
                 hint="The score is the sum of the log-probabilities of the generated tokens ([EOS] included), "
                      "divided by length ** length_penalty.")


@beam_search_width_one_is_greedy.judge
def judge_beam_search_width_one_is_greedy(seeds, results):
    tables = beam_tables(seeds, 10601)
    for first, (tokens, score) in zip(WIDTH_ONE_SOURCES, results):
        source = beam_source(first, seeds, 10602 + first)[0].tolist()
        greedy = reference_greedy(tables, source, BEAM_MAX)
        log_probs = [next_log_probs(tables, source, greedy[:i])[token] for i, token in enumerate(greedy)]
        _judge_beam(tokens, score, greedy, sum(log_probs), "with beam_width=1 (greedy decoding)")


@beam_search_values.judge
def judge_beam_search_values(seeds, results):
    tables = beam_tables(seeds, 10611)
    for (first, width), (tokens, score) in zip(BEAM_CASES, results):
        source = beam_source(first, seeds, 10612 + first)[0].tolist()
        expected_tokens, expected_score = reference_beam(tables, source, width, BEAM_MAX)
        _judge_beam(tokens, score, expected_tokens, expected_score, f"with beam_width={width}")


@beam_search_length_penalty.judge
def judge_beam_search_length_penalty(seeds, results):
    tables = penalty_tables(seeds)
    for (penalty, width), (tokens, score) in zip(PENALTY_CASES, results):
        expected_tokens, expected_score = reference_beam(tables, [3, 4, 3], width, 6, penalty)
        raw_tokens, _ = reference_beam(tables, [3, 4, 3], width, 6, 0.0)
        got = expect_tensor(tokens, "beam_search's tokens").tolist()
        if penalty and got == raw_tokens and got != expected_tokens:
            raise AssertionError(
                f"with length_penalty={penalty} beam_search returned {got}, the best *sum* of log-probabilities: "
                f"you compared unnormalised scores of finished hypotheses of different lengths. Every extra token "
                f"adds a negative log-probability, so raw sums favour short outputs; rank finished hypotheses by "
                f"score / length ** length_penalty (here {expected_tokens} wins).")
        if got == expected_tokens and not math.isclose(score, expected_score, rel_tol=1e-6, abs_tol=1e-8):
            for length in (len(got) + 1, len(got) - 1):
                if length > 0 and math.isclose(score * length ** penalty / len(got) ** penalty, expected_score,
                                               rel_tol=1e-6, abs_tol=1e-8):
                    raise AssertionError(f"the score {score:.4f} uses a length of {length} tokens; the length "
                                         f"counts the generated tokens, [EOS] included, [BOS] not ({len(got)} here).")
        _judge_beam(tokens, score, expected_tokens, expected_score, f"with length_penalty={penalty}, beam_width={width}")


@beam_search_exhaustive.judge
def judge_beam_search_exhaustive(seeds, results):
    tables = beam_tables(seeds, 10631, EXHAUSTIVE_VOCAB, EXHAUSTIVE_MAX)
    source = beam_source(3, seeds, 10632, EXHAUSTIVE_VOCAB)[0].tolist()
    everything = all_sequences(tables, source, EXHAUSTIVE_MAX)
    greedy = reference_greedy(tables, source, EXHAUSTIVE_MAX)
    greedy_raw = sum(next_log_probs(tables, source, greedy[:i])[t] for i, t in enumerate(greedy))
    for penalty, (tokens, score) in zip((0.0, 1.0), results):
        best_seq, best_raw = max(everything, key=lambda c: c[1] / len(c[0]) ** penalty)
        what = f"with a beam of {EXHAUSTIVE_WIDTH} (wider than every candidate), length_penalty={penalty}"
        if score < greedy_raw / len(greedy) ** penalty - 1e-9:
            raise AssertionError(f"{what}, beam_search returned a sequence scoring {score:.4f}, below greedy "
                                 f"decoding's {greedy_raw / len(greedy) ** penalty:.4f}: a beam that keeps every "
                                 "candidate searches exhaustively and must find the best sequence. (A beam wider "
                                 "than the number of candidates keeps them all: take min(beam_width, candidates).)")
        _judge_beam(tokens, score, list(best_seq), best_raw / len(best_seq) ** penalty, what)


def _bucket_judge(seeds, outputs, bidirectional, stream):
    from transformers.models.t5.modeling_t5 import T5Attention
    positions = bucket_positions(seeds, stream)
    for (num_buckets, max_distance), out in zip(BUCKET_SETTINGS, outputs):
        expected = T5Attention._relative_position_bucket(positions, bidirectional, num_buckets, max_distance)
        out = expect_tensor(out, "relative_position_bucket's result")
        expect_shape(out, positions.shape, "the buckets", "One bucket per relative position, same shape.")
        wrong = (out != expected).nonzero()
        if len(wrong):
            i, j = wrong[0].tolist()
            rel = positions[i, j].item()
            hint = ""
            if bidirectional and rel > 0 and out[i, j] == expected[i, j] - num_buckets // 2:
                hint = " Positive distances (keys after the query) use the upper half of the buckets."
            elif not bidirectional and rel > 0:
                hint = " In a causal model a key after the query is never attended: clamp positive distances to 0."
            elif abs(rel) >= num_buckets // (4 if bidirectional else 2):
                hint = (" Past the exact buckets, the bucket grows with log(distance / max_exact) / "
                        "log(max_distance / max_exact), truncated, and stops at the last bucket.")
            raise AssertionError(f"relative_position_bucket({rel}, bidirectional={bidirectional}, "
                                 f"num_buckets={num_buckets}, max_distance={max_distance}) gave {out[i, j].item()}; "
                                 f"T5 gives {expected[i, j].item()} ({len(wrong)} of {out.numel()} wrong).{hint}")


@stretch_relative_position_bucket_bidirectional.judge
def judge_stretch_relative_position_bucket_bidirectional(seeds, outputs):
    _bucket_judge(seeds, outputs, True, 10701)


@stretch_relative_position_bucket_causal.judge
def judge_stretch_relative_position_bucket_causal(seeds, outputs):
    _bucket_judge(seeds, outputs, False, 10702)
