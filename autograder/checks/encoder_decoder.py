"""Hidden checks for 10_encoder_decoder. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs and weights from `seeds`, calls the
student's code through `call` and returns plain data (outputs, recorded calls, decoded ids, scores). The
judge runs in the grader: it rebuilds the same inputs and weights from the same seeds and compares with
independent oracles:
- `torch.nn.TransformerDecoderLayer` (post-LN and pre-LN, padding masks on both sides) and
  `torch.nn.Transformer` (encoder, decoder and their final LayerNorms), holding the check's weights in
  torch's layout (`in_proj_weight` stacks W_Q, W_K, W_V);
- `torch.nn.functional.cross_entropy(ignore_index=...)` for the teacher-forced loss;
- for decoding, stand-in models whose next-token scores are a known function of the prefix
  (`ScriptedModel`): the judge decodes them with its own plain-Python greedy search, beam search and an
  exhaustive enumeration of every sequence;
- transformers' `T5Attention._relative_position_bucket` for the optional stretch exercise.

Every exercise is graded on its own: `EncoderDecoder` is built with the course's reference `DecoderLayer`
swapped in; the loss, the decoders and `exact_match` get stand-in models and chosen inputs. Only the
trained model's test (`trained_model_learns`) grades the notebook's own pipeline end to end.

Seeds come from the grader's per-run token. The one statistical test (`trained_model_learns`) measures a
mean loss over 256 fresh held-out dates against a threshold far above its spread (see its comment).
"""
import math
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks import common
from autograder.checks.common import (call, count, expect_close, expect_shape, expect_tensor, load_weights, probe,
                                      submodule)
from courselib import seq2seq as reference

if "ipykernel" not in sys.modules:
    # In the grader's process: the stretch exercise's judges compare with T5's own function, and importing it
    # takes a few seconds. The grader imports this module in the background while the notebook runs, so pay
    # for it now. (In the student's kernel only the stretch probes import it, when they run.)
    import transformers.models.t5.modeling_t5  # noqa: F401

ADVICE = "the exercise asks you to write this yourself"
EARLIER = "(This test uses reference versions of your other classes and functions, so only this exercise is graded here.)"
DECODER_LAYER_SHORTCUTS = ["torch.nn.TransformerDecoderLayer", "torch.nn.TransformerDecoder", "torch.nn.Transformer",
                           "courselib.seq2seq.DecoderLayer", "courselib.seq2seq.EncoderDecoder"]
DECODER_LAYER_ADVICE = ("assemble the layer from self_attn, cross_attn, ffn and the three LayerNorms yourself; "
                        "torch's TransformerDecoderLayer is the oracle here, not the answer.")
MODEL_SHORTCUTS = ["torch.nn.Transformer", "torch.nn.TransformerEncoder", "torch.nn.TransformerDecoder",
                   "courselib.seq2seq.EncoderDecoder"]
MODEL_ADVICE = ("build the embeddings and run the two stacks yourself; torch's nn.Transformer is the oracle here, "
                "not the answer.")
LOSS_SHORTCUTS = ["courselib.seq2seq.seq2seq_loss", "courselib.seq2seq.shift_right"]
# courselib's greedy_decode is decorated (@torch.no_grad()): the watch needs the function inside, whose code is
# its own (the decorator's wrapper is shared by every decorated function, the learner's included)
COURSE_GREEDY = "courselib.seq2seq.greedy_decode.__wrapped__"
GREEDY_SHORTCUTS = [COURSE_GREEDY]
EXACT_MATCH_SHORTCUTS = ["courselib.seq2seq.exact_match"]
BEAM_SHORTCUTS = [COURSE_GREEDY]
T5_BUCKET = "transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket"
BUCKET_SHORTCUTS = [T5_BUCKET]


# ---------------------------------------------------------------- probe-side harness
def build(cls, *args, advice=ADVICE, **kwargs):
    return common.build(cls, *args, advice=advice, **kwargs)


def run(fn, *args, advice=ADVICE, **kwargs):
    return common.run(fn, *args, advice=advice, **kwargs)


def keep_to_mask(keep):
    """(B, T) bool, True at real tokens -> the course's (B, 1, 1, T) padding mask."""
    return keep[:, None, None, :]


def causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


# ---------------------------------------------------------------- weights the checks choose (both sides)
def seeded_weights(g, shapes, norm_noise=0.3):
    """{name: float64 tensor} drawn from g in the order given: LayerNorm gains near 1 and shifts near 0,
    matrices with std 1/√fan_in, other vectors with std 0.3, so that no two tensors are alike."""
    weights = {}
    for name, shape in shapes:
        noise = torch.randn(shape, generator=g, dtype=torch.float64)
        if len(shape) == 1 and "norm" in name:
            weights[name] = (1.0 if name.endswith("weight") else 0.0) + norm_noise * noise
        elif len(shape) > 1:
            weights[name] = noise / math.sqrt(shape[-1])
        else:
            weights[name] = 0.3 * noise
    return weights


def linear_shapes(prefix, d_in, d_out):
    return [(f"{prefix}.weight", (d_out, d_in)), (f"{prefix}.bias", (d_out,))]


def attention_shapes(prefix, d_model):
    return [shape for proj in ("q_proj", "k_proj", "v_proj", "out_proj")
            for shape in linear_shapes(f"{prefix}.{proj}", d_model, d_model)]


def norm_shapes(prefix, d_model):
    return [(f"{prefix}.weight", (d_model,)), (f"{prefix}.bias", (d_model,))]


def ffn_shapes(prefix, d_model, d_ff):
    return linear_shapes(f"{prefix}.linear1", d_model, d_ff) + linear_shapes(f"{prefix}.linear2", d_ff, d_model)


def encoder_layer_shapes(prefix, d_model, d_ff):
    return (attention_shapes(f"{prefix}self_attn", d_model) + ffn_shapes(f"{prefix}ffn", d_model, d_ff)
            + norm_shapes(f"{prefix}norm1", d_model) + norm_shapes(f"{prefix}norm2", d_model))


def decoder_layer_shapes(prefix, d_model, d_ff):
    return (attention_shapes(f"{prefix}self_attn", d_model) + attention_shapes(f"{prefix}cross_attn", d_model)
            + ffn_shapes(f"{prefix}ffn", d_model, d_ff)
            + [shape for n in (1, 2, 3) for shape in norm_shapes(f"{prefix}norm{n}", d_model)])


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


# ================================================================ exercise 1: DecoderLayer
DECODER_NAMES = ("`self_attn` and `cross_attn` (MultiHeadAttention), `ffn` (FeedForward with linear1 and linear2), "
                 "`norm1`, `norm2`, `norm3` (LayerNorm) and `dropout`")


def _decoder_layer(DecoderLayer, d_model, num_heads, d_ff, norm_first):
    layer = build(DecoderLayer, d_model, num_heads, d_ff, dropout=0.0, norm_first=norm_first, eps=1e-5,
                  name=f"DecoderLayer({d_model}, {num_heads}, {d_ff}, norm_first={norm_first})",
                  forbidden=DECODER_LAYER_SHORTCUTS, advice=DECODER_LAYER_ADVICE)
    for path in ("self_attn.q_proj", "self_attn.out_proj", "cross_attn.q_proj", "cross_attn.k_proj",
                 "cross_attn.v_proj", "cross_attn.out_proj", "ffn.linear1", "ffn.linear2", "norm1", "norm2", "norm3"):
        submodule(layer, path, "DecoderLayer", DECODER_NAMES)
    return layer


def _run_decoder_layer(layer, *args):
    return run(layer, *args, name="DecoderLayer.forward", forbidden=DECODER_LAYER_SHORTCUTS,
               advice=DECODER_LAYER_ADVICE)


def decoder_case(seeds, stream, dims, batch, T, S):
    g = seeds.generator(stream)
    weights = seeded_weights(g, decoder_layer_shapes("", dims[0], dims[2]))
    x = torch.randn(batch, T, dims[0], generator=g, dtype=torch.float64)
    memory = torch.randn(batch, S, dims[0], generator=g, dtype=torch.float64)
    return weights, x, memory


def lengths_to_keep(lengths, T):
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


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


@probe
def decoder_layer_structure(seeds, DecoderLayer):
    results = []
    for norm_first in (False, True):
        layer = _decoder_layer(DecoderLayer, 12, 3, 20, norm_first)
        g = seeds.generator(10001)
        x, memory = torch.randn(3, 4, 12, generator=g), torch.randn(3, 6, 12, generator=g)
        results.append({"parameters": count(layer), "output": _run_decoder_layer(layer, x, memory),
                        "modules": [type(layer.self_attn).__name__, type(layer.cross_attn).__name__]})
    return results


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


# (stream, dims (d_model, num_heads, d_ff), B, T, S, target lengths, source lengths)
POST_LN_CASES = [(10011, (12, 3, 20), 2, 5, 7, (5, 3), (6, 4)), (10012, (8, 2, 16), 3, 6, 4, (6, 2, 4), (4, 4, 1))]
PRE_LN_CASES = [(10021, (12, 3, 20), 2, 5, 7, (5, 3), (6, 4)), (10022, (8, 2, 16), 3, 6, 4, (6, 2, 4), (4, 4, 1))]


def _decoder_parity(DecoderLayer, seeds, norm_first, cases):
    outputs = []
    for stream, dims, batch, T, S, tgt_lengths, mem_lengths in cases:
        weights, x, memory = decoder_case(seeds, stream, dims, batch, T, S)
        layer = load_weights(_decoder_layer(DecoderLayer, *dims, norm_first).double(), weights, "DecoderLayer",
                             DECODER_NAMES)
        outputs.append(_run_decoder_layer(layer, x, memory, keep_to_mask(lengths_to_keep(tgt_lengths, T)),
                                          keep_to_mask(lengths_to_keep(mem_lengths, S))))
    return outputs


def _judge_decoder_parity(seeds, outputs, norm_first, cases):
    setting = "pre-LN" if norm_first else "post-LN"
    for (stream, dims, batch, T, S, tgt_lengths, mem_lengths), out in zip(cases, outputs):
        weights, x, memory = decoder_case(seeds, stream, dims, batch, T, S)
        expected, diagnoses = decoder_layer_oracle(weights, dims, x, memory, lengths_to_keep(tgt_lengths, T),
                                                   lengths_to_keep(mem_lengths, S), norm_first)
        expect_close(out, expected, f"{setting} DecoderLayer output with padded targets and sources",
                     hint=f"Compare with torch.nn.TransformerDecoderLayer(norm_first={norm_first}) given the causal "
                          "mask and both padding masks.", diagnoses=diagnoses, rtol=1e-6, atol=1e-6)


@probe
def decoder_layer_post_ln(seeds, DecoderLayer):
    return _decoder_parity(DecoderLayer, seeds, False, POST_LN_CASES)


@decoder_layer_post_ln.judge
def judge_decoder_layer_post_ln(seeds, outputs):
    _judge_decoder_parity(seeds, outputs, False, POST_LN_CASES)


@probe
def decoder_layer_pre_ln(seeds, DecoderLayer):
    return _decoder_parity(DecoderLayer, seeds, True, PRE_LN_CASES)


@decoder_layer_pre_ln.judge
def judge_decoder_layer_pre_ln(seeds, outputs):
    _judge_decoder_parity(seeds, outputs, True, PRE_LN_CASES)


MASK_DIMS, MASK_T, MASK_S, CUT = (12, 3, 20), 6, 5, 2   # target positions 0..CUT keep their inputs
MASK_SOURCE_KEEP = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])


@probe
def decoder_layer_masks(seeds, DecoderLayer):
    results = []
    for norm_first, stream in ((False, 10031), (True, 10032)):
        weights, x, memory = decoder_case(seeds, stream, MASK_DIMS, 2, MASK_T, MASK_S)
        layer = load_weights(_decoder_layer(DecoderLayer, *MASK_DIMS, norm_first).double(), weights, "DecoderLayer",
                             DECODER_NAMES)
        g = seeds.generator(stream + 100)
        later = x.clone()
        later[:, CUT + 1:] = torch.randn(2, MASK_T - CUT - 1, MASK_DIMS[0], generator=g, dtype=torch.float64)
        last_source = memory.clone()
        last_source[:, -1] = 3 * torch.randn(2, MASK_DIMS[0], generator=g, dtype=torch.float64)
        noisy_padding = memory.clone()
        noisy_padding[~MASK_SOURCE_KEEP] = 100 * torch.randn(int((~MASK_SOURCE_KEEP).sum()), MASK_DIMS[0], generator=g,
                                                             dtype=torch.float64)
        keep = keep_to_mask(MASK_SOURCE_KEEP)
        results.append({"base": _run_decoder_layer(layer, x, memory),
                        "later_targets": _run_decoder_layer(layer, later, memory),
                        "last_source": _run_decoder_layer(layer, x, last_source),
                        "padded": _run_decoder_layer(layer, x, memory, None, keep),
                        "noisy_padding": _run_decoder_layer(layer, x, noisy_padding, None, keep)})
    return results


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


# ================================================================ exercise 2: EncoderDecoder
ED_DIMS = dict(vocab_size=23, d_model=12, num_heads=3, d_ff=20, num_layers=2, max_positions=12, pad_id=0)
MODEL_NAMES = ("`embed` (TokenEmbedding), `src_positions` and `tgt_positions` (LearnedPositionalEmbedding), "
               "`encoder_layers` and `decoder_layers` (nn.ModuleLists), `encoder_norm`, `decoder_norm` (LayerNorm) "
               "and `head` (nn.Linear(d_model, vocab_size))")


def model_shapes(dims):
    V, d, d_ff, L, P = (dims[k] for k in ("vocab_size", "d_model", "d_ff", "num_layers", "max_positions"))
    shapes = [("embed.embedding.weight", (V, d)), ("src_positions.table.weight", (P, d)),
              ("tgt_positions.table.weight", (P, d))]
    for i in range(L):
        shapes += encoder_layer_shapes(f"encoder_layers.{i}.", d, d_ff)
    shapes += norm_shapes("encoder_norm", d)
    for i in range(L):
        shapes += decoder_layer_shapes(f"decoder_layers.{i}.", d, d_ff)
    return shapes + norm_shapes("decoder_norm", d) + linear_shapes("head", d, V)


def model_weights(seeds, stream, dims=ED_DIMS):
    weights = seeded_weights(seeds.generator(stream), model_shapes(dims))
    weights["embed.embedding.weight"][dims["pad_id"]] = 0.0   # TokenEmbedding's padding row is zero
    return weights


def model_batch(g, src_lengths, tgt_lengths, S, T, dims=ED_DIMS):
    """Source ids (B, S) and decoder-input ids (B, T) ([BOS]=1 first), right-padded with 0."""
    B, V = len(src_lengths), dims["vocab_size"]
    src = torch.randint(3, V, (B, S), generator=g)
    tgt = torch.randint(3, V, (B, T), generator=g)
    tgt[:, 0] = 1
    src[~lengths_to_keep(src_lengths, S)] = dims["pad_id"]
    tgt[~lengths_to_keep(tgt_lengths, T)] = dims["pad_id"]
    return src, tgt


def _model(EncoderDecoder, dims=ED_DIMS):
    model = build(EncoderDecoder, **dims, dropout=0.0, name="EncoderDecoder(...)",
                  helpers={"DecoderLayer": reference.DecoderLayer}, forbidden=MODEL_SHORTCUTS, advice=MODEL_ADVICE)
    for method in ("encode", "decode"):
        if not callable(getattr(model, method, None)):
            raise AssertionError(f"EncoderDecoder has no `{method}` method: the exercise asks for encode(src_ids) and "
                                 "decode(tgt_in_ids, memory, src_ids).")
    return model


def _loaded_model(EncoderDecoder, weights):
    return load_weights(_model(EncoderDecoder).double(), weights, "EncoderDecoder", MODEL_NAMES)


def _encode(model, src):
    return run(model.encode, src, name="EncoderDecoder.encode", forbidden=MODEL_SHORTCUTS, advice=MODEL_ADVICE)


def _decode(model, tgt_in, memory, src):
    return run(model.decode, tgt_in, memory, src, name="EncoderDecoder.decode", forbidden=MODEL_SHORTCUTS,
               advice=MODEL_ADVICE)


def _forward(model, src, tgt_in):
    return run(model, src, tgt_in, name="EncoderDecoder.forward", forbidden=MODEL_SHORTCUTS, advice=MODEL_ADVICE)


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


@probe
def encoder_decoder_structure(seeds, EncoderDecoder):
    model = _model(EncoderDecoder)
    src, tgt_in = model_batch(seeds.generator(10101), (7, 4), (5, 3), S=7, T=5)
    return {"parameters": count(model), "memory": _encode(model, src), "logits": _forward(model, src, tgt_in),
            "names": sorted(name for name, _ in model.named_parameters())}


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


MODEL_CASES = [(10111, (7, 4, 6), (5, 3, 5), 7, 5), (10112, (3, 8), (8, 2), 8, 8)]


def model_case(seeds, stream, src_lengths, tgt_lengths, S, T):
    return model_weights(seeds, stream), model_batch(seeds.generator(stream + 50), src_lengths, tgt_lengths, S, T)


@probe
def encoder_decoder_encode(seeds, EncoderDecoder):
    memories = []
    for case in MODEL_CASES:
        weights, (src, _) = model_case(seeds, *case)
        memories.append(_encode(_loaded_model(EncoderDecoder, weights), src))
    return memories


@encoder_decoder_encode.judge
def judge_encoder_decoder_encode(seeds, memories):
    for case, memory in zip(MODEL_CASES, memories):
        weights, (src, tgt_in) = model_case(seeds, *case)
        expected, _ = oracle_model(weights, ED_DIMS, src, tgt_in)
        expect_close(memory, expected, "encode(src_ids) (the encoder's output)",
                     hint="Compare with nn.Transformer(norm_first=True).encoder on embed(src_ids) + "
                          "src_positions(src_ids), with the source's padding mask. " + EARLIER,
                     diagnoses=encode_diagnoses(weights, ED_DIMS, src, tgt_in), rtol=1e-6, atol=1e-6)


@probe
def encoder_decoder_logits(seeds, EncoderDecoder):
    results = []
    for case in MODEL_CASES:
        weights, (src, tgt_in) = model_case(seeds, *case)
        model = _loaded_model(EncoderDecoder, weights)
        results.append({"forward": _forward(model, src, tgt_in),
                        "decode": _decode(model, tgt_in, _encode(model, src), src)})
    return results


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


@probe
def encoder_decoder_uses_memory(seeds, EncoderDecoder):
    weights, (src, tgt_in) = model_case(seeds, 10121, (6, 3), (5, 4), 6, 5)
    model = _loaded_model(EncoderDecoder, weights)
    other_memory = torch.randn(2, 6, ED_DIMS["d_model"], generator=seeds.generator(10122), dtype=torch.float64)
    longer_src = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)   # three more [PAD] columns
    return {"given_memory": _decode(model, tgt_in, other_memory, src),
            "longer_source": _forward(model, longer_src, tgt_in), "source": _forward(model, src, tgt_in)}


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


# ================================================================ exercise 3: seq2seq_loss
LOSS_VOCAB, LOSS_T = 9, 6   # ids 0 [PAD], 1 [BOS], 2 [EOS], 3..8 tokens


class RecordingModel(nn.Module):
    """Stands in for an EncoderDecoder in the loss tests: its logits are a fixed random function of the
    decoder input (by position and token) and of the source's first token, and it records its inputs."""

    def __init__(self, by_position, by_source):
        super().__init__()
        self.by_position, self.by_source = by_position, by_source   # (T, V, V), (V, V)
        self.inputs = []

    def encode(self, src_ids):
        return self.by_source[src_ids[:, 0]][:, None, :].expand(-1, src_ids.shape[1], -1)   # (B, S, V)

    def decode(self, tgt_in_ids, memory, src_ids):
        self.inputs.append(tgt_in_ids.detach().clone())
        T = tgt_in_ids.shape[1]
        if T > self.by_position.shape[0]:
            raise ValueError(f"decoder input of length {T}: longer than the targets ({self.by_position.shape[0]})")
        return self.by_position[torch.arange(T)[None, :], tgt_in_ids] + memory[:, :1, :]   # (B, T, V)

    def forward(self, src_ids, tgt_in_ids):
        return self.decode(tgt_in_ids, self.encode(src_ids), src_ids)


def loss_case(seeds, stream, lengths):
    """A stand-in model's tables and a batch of targets ending in [EOS], right-padded to LOSS_T."""
    g = seeds.generator(stream)
    by_position = torch.randn(LOSS_T, LOSS_VOCAB, LOSS_VOCAB, generator=g, dtype=torch.float64) * 2
    by_source = torch.randn(LOSS_VOCAB, LOSS_VOCAB, generator=g, dtype=torch.float64)
    src = torch.randint(3, LOSS_VOCAB, (len(lengths), 5), generator=g)
    tgt = torch.randint(3, LOSS_VOCAB, (len(lengths), LOSS_T), generator=g)
    for row, length in enumerate(lengths):        # `length` tokens, the last of them [EOS], then [PAD]
        tgt[row, length - 1] = 2
        tgt[row, length:] = 0
    return by_position, by_source, src, tgt


def _loss(seeds, stream, lengths, seq2seq_loss):
    by_position, by_source, src, tgt = loss_case(seeds, stream, lengths)
    model = RecordingModel(by_position, by_source)
    loss = call(seq2seq_loss, model, src, tgt, bos_id=1, pad_id=0, name="seq2seq_loss", forbidden=LOSS_SHORTCUTS,
                forbidden_advice=ADVICE)
    if not torch.is_tensor(loss) or loss.numel() != 1:
        raise AssertionError("seq2seq_loss should return the loss as a one-number tensor, but it returned "
                             f"{type(loss).__name__}" + (f" of shape {tuple(loss.shape)}" if torch.is_tensor(loss) else "")
                             + ".")
    return {"loss": loss.detach().reshape(()).double(), "inputs": model.inputs}


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


LOSS_FULL = (10201, (6, 6, 6))          # every target fills all 6 positions: no padding
LOSS_PADDED = (10202, (6, 2, 4, 5))     # targets of 6, 2, 4 and 5 tokens, then [PAD]


@probe
def seq2seq_loss_shifts_target(seeds, seq2seq_loss):
    return _loss(seeds, *LOSS_FULL, seq2seq_loss)


@seq2seq_loss_shifts_target.judge
def judge_seq2seq_loss_shifts_target(seeds, data):
    _judge_loss(seeds, data, *LOSS_FULL)


@probe
def seq2seq_loss_ignores_padding(seeds, seq2seq_loss):
    return _loss(seeds, *LOSS_PADDED, seq2seq_loss)


@seq2seq_loss_ignores_padding.judge
def judge_seq2seq_loss_ignores_padding(seeds, data):
    _judge_loss(seeds, data, *LOSS_PADDED)


# ================================================================ the trained model
HELD_OUT_EXAMPLES = 256
# The learner's model trains 200 steps (100 under grading); on held-out dates it then scores about 0.07
# (0.65 under grading) nats per target token, an untrained one about ln 40 = 3.7. The mean over 256 fresh
# dates (about 2600 tokens) moves by a few hundredths from one seed to the next, so the threshold below fails
# a correct notebook with a negligible probability for any seed; a model trained on an unshifted target (it
# learns to copy) stays far above it.
LOSS_THRESHOLD = 1.5


def held_out_pairs(seeds):
    return reference.sample_pairs(HELD_OUT_EXAMPLES, seeds.random(10301), held_out=True)


def fingerprint(state):
    """Two numbers per tensor, in name order: enough to recognise the shipped checkpoint."""
    return torch.tensor([[t.double().sum().item(), t.double().square().sum().item()] for _, t in sorted(state.items())],
                        dtype=torch.float64)


@probe
def trained_model_learns(seeds, model):
    if not isinstance(model, nn.Module):
        raise AssertionError(f"`model` should be your trained EncoderDecoder, but it is a {type(model).__name__}.")
    src, tgt = reference.batch(held_out_pairs(seeds))
    was_training = model.training
    model.eval()
    try:
        logits = run(model, src, reference.shift_right(tgt), name="model", forbidden=MODEL_SHORTCUTS)
    finally:
        model.train(was_training)
    return {"logits": logits.float(), "fingerprint": fingerprint(model.state_dict())}


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


# ================================================================ decoding: the stand-in model
NEVER, FREE = -1, -2   # a row's planned [EOS] step: never, or no plan (EOS scored like any token)


class ScriptedModel(nn.Module):
    """Stands in for a trained EncoderDecoder in the decoding tests: the next-token scores at position t are
    by_position[t] + by_previous[token at t] + the source's row of by_source (by its first token), so the
    judge can recompute them for any prefix. A source can also plan when [EOS] comes (eos_at). [PAD] and
    [BOS] score -20 and -21: never chosen unless a beam keeps everything. It counts its encoder runs and
    remembers the longest decoder input it was given."""

    def __init__(self, by_position, by_previous, by_source, eos_at):
        super().__init__()
        self.by_position, self.by_previous, self.by_source, self.eos_at = by_position, by_previous, by_source, eos_at
        self.encodes, self.longest_input = 0, 0

    def encode(self, src_ids):
        self.encodes += 1
        first = src_ids[:, 0]
        plan = self.eos_at[first].double()[:, None]
        row = torch.cat([self.by_source[first], plan], dim=1)                 # (B, V + 1)
        return row[:, None, :].expand(-1, src_ids.shape[1], -1)              # (B, S, V + 1)

    def decode(self, tgt_in_ids, memory, src_ids):
        self.longest_input = max(self.longest_input, tgt_in_ids.shape[1])
        if memory.dim() != 3 or memory.shape[-1] != self.by_source.shape[1] + 1:
            raise ValueError(f"memory of shape {tuple(memory.shape)} is not what encode returned")
        if memory.shape[0] not in (1, tgt_in_ids.shape[0]):
            raise ValueError(f"the memory's batch ({memory.shape[0]}) does not match the decoder input's "
                             f"({tgt_in_ids.shape[0]}): repeat the source's memory for every hypothesis")
        return scripted_logits(self.by_position, self.by_previous, memory[:, 0, :-1], memory[:, 0, -1], tgt_in_ids)

    def forward(self, src_ids, tgt_in_ids):
        return self.decode(tgt_in_ids, self.encode(src_ids), src_ids)


def scripted_logits(by_position, by_previous, source_row, plan, tgt_in_ids):
    """(B, T, V) scores: the same function whether the model runs it or the judge does."""
    T = tgt_in_ids.shape[1]
    if T > by_position.shape[0]:
        raise ValueError(f"a decoder input of length {T}: longer than max_len + 1")
    logits = by_position[:T][None] + by_previous[tgt_in_ids] + source_row[:, None, :]   # (B, T, V)
    steps = torch.arange(T, dtype=torch.float64)[None, :]
    planned = (plan >= 0)[:, None]
    eos = torch.where(steps == plan[:, None], 12.0, -12.0)
    logits[..., 2] = torch.where(planned | (plan == NEVER)[:, None], eos, logits[..., 2])
    logits[..., 0], logits[..., 1] = -20.0, -21.0
    return logits


def scripted_tables(g, vocab, max_len, num_sources=8, scale=1.5):
    by_position = torch.randn(max_len + 1, vocab, generator=g, dtype=torch.float64) * scale
    by_previous = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * scale
    by_source = torch.randn(num_sources, vocab, generator=g, dtype=torch.float64) * scale
    return by_position, by_previous, by_source


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


# ================================================================ exercise 4: greedy_decode
GREEDY_VOCAB = 8
# Each case: rows' first source tokens, each source's planned [EOS] step (NEVER: runs to max_len), max_len.
GREEDY_CASES = [((0, 1, 2, 3), (2, 4, 0, NEVER, 1, 3, 5, 2), 6), ((4, 5, 6, 7), (2, 4, 0, NEVER, 5, 3, 5, 2), 4)]


def greedy_tables(seeds, stream, eos_plan):
    # scores for 12 positions: more than any max_len the tests ask for, so that a decoder running on is seen
    by_position, by_previous, by_source = scripted_tables(seeds.generator(stream), GREEDY_VOCAB, 11)
    return by_position, by_previous, by_source, torch.tensor(eos_plan)


def greedy_sources(firsts, seeds, stream):
    src = torch.randint(3, GREEDY_VOCAB, (len(firsts), 4), generator=seeds.generator(stream))
    src[:, 0] = torch.tensor(firsts)
    return src


def _greedy(greedy_decode, model, src, max_len):
    out = run(greedy_decode, model, src, max_len, bos_id=1, eos_id=2, pad_id=0, name="greedy_decode",
              forbidden=GREEDY_SHORTCUTS)
    if out.dtype not in (torch.int64, torch.int32):
        raise AssertionError(f"greedy_decode should return token ids (a long tensor), not {out.dtype}.")
    return out.long()


@probe
def greedy_decode_values(seeds, greedy_decode):
    outputs = []
    for i, (firsts, plan, max_len) in enumerate(GREEDY_CASES):
        model = ScriptedModel(*greedy_tables(seeds, 10401 + i, plan))
        outputs.append(_greedy(greedy_decode, model, greedy_sources(firsts, seeds, 10411 + i), max_len))
    return outputs


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


STOP_PLAN = (1, 3, 0, 2, 1, 3, 0, 2)   # every source plans its [EOS] by step 3


@probe
def greedy_decode_stops(seeds, greedy_decode):
    model = ScriptedModel(*greedy_tables(seeds, 10421, STOP_PLAN))
    src = greedy_sources((0, 1, 2, 3), seeds, 10422)
    out = _greedy(greedy_decode, model, src, 9)
    return {"out": out, "encodes": model.encodes, "longest_input": model.longest_input}


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


def exact_match_cases(seeds, stream):
    """Targets ending in [EOS], and predictions that are right, off by one token, cut short, missing [EOS],
    or right up to [EOS] and then anything: shuffled into random rows."""
    g = seeds.generator(stream)
    rng = seeds.random(stream)
    rows = []
    for kind in ["right", "right", "right", "after_eos", "after_eos", "one_token", "short", "no_eos", "longer",
                 "right", "one_token", "after_eos"]:
        length = rng.randint(3, 7)
        target = torch.randint(3, 12, (length,), generator=g).tolist() + [2]
        prediction = list(target)
        if kind == "after_eos":
            prediction += torch.randint(0, 12, (rng.randint(1, 3),), generator=g).tolist()
        elif kind == "one_token":
            i = rng.randrange(length)
            prediction[i] = 3 + (prediction[i] - 3 + rng.randint(1, 8)) % 9
        elif kind == "short":
            prediction = target[:-2] + [2]
        elif kind == "no_eos":
            prediction = target[:-1] + torch.randint(3, 12, (2,), generator=g).tolist()
        elif kind == "longer":
            prediction = target[:-1] + [5, 2]
        rows.append((prediction, target))
    rng.shuffle(rows)
    width_p, width_t = max(len(p) for p, _ in rows) + 1, max(len(t) for _, t in rows) + 2
    predictions = torch.zeros(len(rows), width_p, dtype=torch.long)
    targets = torch.zeros(len(rows), width_t, dtype=torch.long)
    for i, (p, t) in enumerate(rows):
        predictions[i, :len(p)] = torch.tensor(p)
        targets[i, :len(t)] = torch.tensor(t)
    return predictions, targets


def _exact_match(exact_match, predictions, targets):
    result = call(exact_match, predictions, targets, eos_id=2, name="exact_match", forbidden=EXACT_MATCH_SHORTCUTS)
    try:
        return float(result)
    except (TypeError, ValueError):
        raise AssertionError(f"exact_match should return a number (the share of exact matches), not "
                             f"{type(result).__name__}.") from None


@probe
def exact_match_values(seeds, exact_match):
    results = []
    for stream in (10501, 10502):
        predictions, targets = exact_match_cases(seeds, stream)
        results.append(_exact_match(exact_match, predictions, targets))
        results.append(_exact_match(exact_match, targets[:5], targets[:5]))   # every row right: 1.0
    return results


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


@probe
def exact_match_after_eos(seeds, exact_match):
    g = seeds.generator(10511)
    target = torch.cat([torch.randint(3, 12, (1, 5), generator=g), torch.tensor([[2, 0, 0]])], dim=1)   # 5 + [EOS]
    garbage_after = torch.cat([target[:, :6], torch.randint(3, 12, (1, 3), generator=g)], dim=1)
    no_eos = torch.cat([target[:, :5], torch.randint(3, 12, (1, 1), generator=g)], dim=1)           # cut at max_len
    wider = torch.cat([target[:, :6], torch.zeros(1, 6, dtype=torch.long)], dim=1)                # other width
    return [_exact_match(exact_match, p, target) for p in (garbage_after, no_eos, wider)]


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


# ================================================================ exercise 6: beam_search
BEAM_VOCAB, BEAM_MAX = 7, 5


def _beam(beam_search, model, src, width, max_len, penalty):
    result = call(beam_search, model, src, width, max_len, bos_id=1, eos_id=2, length_penalty=penalty,
                  name="beam_search", forbidden=BEAM_SHORTCUTS)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("beam_search must return the pair (tokens, score).")
    tokens, score = result
    try:
        tokens = torch.as_tensor(tokens).flatten().long()
        score = float(score)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError("beam_search must return (tokens, score): a 1-D tensor (or list) of token ids and a "
                             "number.") from None
    return tokens, score


def beam_tables(seeds, stream, vocab=BEAM_VOCAB, max_len=BEAM_MAX):
    by_position, by_previous, by_source = scripted_tables(seeds.generator(stream), vocab, max_len, scale=1.0)
    return by_position, by_previous, by_source, torch.full((8,), FREE)


def beam_source(first, seeds, stream, vocab=BEAM_VOCAB):
    src = torch.randint(3, vocab, (1, 4), generator=seeds.generator(stream))
    src[0, 0] = first
    return src


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


WIDTH_ONE_SOURCES = (0, 1, 2)


@probe
def beam_search_width_one_is_greedy(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10601))
    return [_beam(beam_search, model, beam_source(first, seeds, 10602 + first), 1, BEAM_MAX, 0.0)
            for first in WIDTH_ONE_SOURCES]


@beam_search_width_one_is_greedy.judge
def judge_beam_search_width_one_is_greedy(seeds, results):
    tables = beam_tables(seeds, 10601)
    for first, (tokens, score) in zip(WIDTH_ONE_SOURCES, results):
        source = beam_source(first, seeds, 10602 + first)[0].tolist()
        greedy = reference_greedy(tables, source, BEAM_MAX)
        log_probs = [next_log_probs(tables, source, greedy[:i])[token] for i, token in enumerate(greedy)]
        _judge_beam(tokens, score, greedy, sum(log_probs), "with beam_width=1 (greedy decoding)")


BEAM_CASES = [(3, 2), (4, 3), (5, 4)]   # (source's first token, beam width)


@probe
def beam_search_values(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10611))
    return [_beam(beam_search, model, beam_source(first, seeds, 10612 + first), width, BEAM_MAX, 0.0)
            for first, width in BEAM_CASES]


@beam_search_values.judge
def judge_beam_search_values(seeds, results):
    tables = beam_tables(seeds, 10611)
    for (first, width), (tokens, score) in zip(BEAM_CASES, results):
        source = beam_source(first, seeds, 10612 + first)[0].tolist()
        expected_tokens, expected_score = reference_beam(tables, source, width, BEAM_MAX)
        _judge_beam(tokens, score, expected_tokens, expected_score, f"with beam_width={width}")


# A designed case: [EOS] at once is the likeliest single sequence, but "a a a [EOS]" has the better
# log-probability per token. Probabilities by step (small seeded noise is added to every score):
#   step 0: [EOS] 0.45, a 0.5, b 0.05;  steps 1-2: a 0.7, b 0.15, [EOS] 0.15;  step 3: [EOS] 0.7, a/b 0.15.
# Raw sums: [EOS] -0.80 beats "a a a [EOS]" -1.76; per token (length_penalty=1): -0.44 beats -0.80. The
# margins (0.96 and 0.36) are far above what the noise (std 0.03 per score) can move.
PENALTY_STEPS = [{2: 0.45, 3: 0.5, 4: 0.05}, {3: 0.7, 4: 0.15, 2: 0.15}, {3: 0.7, 4: 0.15, 2: 0.15},
                 {2: 0.7, 3: 0.15, 4: 0.15}, {2: 0.98, 3: 0.01, 4: 0.01}, {2: 0.98, 3: 0.01, 4: 0.01},
                 {2: 0.98, 3: 0.01, 4: 0.01}]
PENALTY_CASES = [(0.0, 2), (1.0, 2), (1.0, 3), (0.5, 2)]   # (length_penalty, beam width)


def penalty_tables(seeds):
    g = seeds.generator(10621)
    by_position = torch.full((len(PENALTY_STEPS), 5), -20.0, dtype=torch.float64)
    for step, probabilities in enumerate(PENALTY_STEPS):
        for token, p in probabilities.items():
            by_position[step, token] = math.log(p)
    by_position[:, 2:] += 0.03 * torch.randn(len(PENALTY_STEPS), 3, generator=g, dtype=torch.float64)
    return by_position, torch.zeros(5, 5, dtype=torch.float64), torch.zeros(8, 5, dtype=torch.float64), \
        torch.full((8,), FREE)


@probe
def beam_search_length_penalty(seeds, beam_search):
    model = ScriptedModel(*penalty_tables(seeds))
    src = torch.tensor([[3, 4, 3]])
    return [_beam(beam_search, model, src, width, 6, penalty) for penalty, width in PENALTY_CASES]


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


EXHAUSTIVE_VOCAB, EXHAUSTIVE_MAX, EXHAUSTIVE_WIDTH = 6, 4, 2000   # 6 tokens, 4 steps: at most 6**4 candidates


@probe
def beam_search_exhaustive(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10631, EXHAUSTIVE_VOCAB, EXHAUSTIVE_MAX))
    src = beam_source(3, seeds, 10632, EXHAUSTIVE_VOCAB)
    return [_beam(beam_search, model, src, EXHAUSTIVE_WIDTH, EXHAUSTIVE_MAX, penalty) for penalty in (0.0, 1.0)]


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


# ================================================================ stretch: T5's relative position buckets
# (num_buckets, max_distance): every setting gives T5's buckets exactly in float32 and float64 (checked for
# relative positions -1000..1000), so no bucket sits on a rounding boundary.
BUCKET_SETTINGS = [(32, 128), (16, 64), (8, 20), (12, 50)]


def bucket_positions(seeds, stream):
    g = seeds.generator(stream)
    near = torch.arange(-20, 21)
    far = torch.randint(-400, 401, (60,), generator=g)
    return torch.cat([near, far]).reshape(1, -1).repeat(2, 1) * torch.tensor([[1], [-1]])   # (2, 101)


def _buckets(fn, positions, bidirectional, num_buckets, max_distance):
    out = run(fn, positions.clone(), bidirectional, num_buckets, max_distance, name="relative_position_bucket",
              forbidden=BUCKET_SHORTCUTS, advice="T5's own _relative_position_bucket is the oracle here, not the answer")
    return out.long()


def _bucket_probe(seeds, fn, bidirectional, stream):
    positions = bucket_positions(seeds, stream)
    return [_buckets(fn, positions, bidirectional, *setting) for setting in BUCKET_SETTINGS]


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


@probe
def stretch_relative_position_bucket_bidirectional(seeds, relative_position_bucket):
    return _bucket_probe(seeds, relative_position_bucket, True, 10701)


@stretch_relative_position_bucket_bidirectional.judge
def judge_stretch_relative_position_bucket_bidirectional(seeds, outputs):
    _bucket_judge(seeds, outputs, True, 10701)


@probe
def stretch_relative_position_bucket_causal(seeds, relative_position_bucket):
    return _bucket_probe(seeds, relative_position_bucket, False, 10702)


@stretch_relative_position_bucket_causal.judge
def judge_stretch_relative_position_bucket_causal(seeds, outputs):
    _bucket_judge(seeds, outputs, False, 10702)
