"""Hidden checks for 10_encoder_decoder. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs and weights from `seeds`, calls the
student's code through `call` and returns plain data (outputs, recorded calls, decoded ids, scores, cache
shapes). The judge (autograder/judges/encoder_decoder.py) runs in the grader: it rebuilds the same inputs and
weights from the same seeds and compares with independent oracles:
- `torch.nn.TransformerDecoderLayer` (post-LN and pre-LN, padding masks on both sides) and
  `torch.nn.Transformer` (encoder, decoder and their final LayerNorms), holding the check's weights in
  torch's layout (`in_proj_weight` stacks W_Q, W_K, W_V); the cached decoder is compared with
  `torch.nn.Transformer`'s decoder run on the whole prefix;
- `torch.nn.functional.cross_entropy(ignore_index=..., label_smoothing=...)` for the two losses;
- for decoding, stand-in models whose next-token scores are a known function of the prefix
  (`ScriptedModel`, `PrefixModel`): the judge decodes them with its own plain-Python greedy search, with
  transformers' `generate(num_beams=k)` (through `courselib.seq2seq.transformers_beam_search`) and with an
  exhaustive enumeration of every sequence;
- transformers' `T5Attention._relative_position_bucket` for the optional stretch exercise.

Every exercise is graded on its own: `EncoderDecoder` is built with the course's reference `DecoderLayer`
swapped in; the losses, the decoders and `exact_match` get stand-in models and chosen inputs; the cached
decoder runs on the course's reference `EncoderDecoder`. Only the trained model's test
(`trained_model_translates`) grades the notebook's own pipeline end to end.

Seeds come from the grader's per-run token. The one statistical test (`trained_model_translates`) measures
greedy exact match on 256 fresh held-out dates against a threshold far below its spread (see its judge).
"""
import math
import sys

import torch
from torch import nn

from autograder.checks import common
from autograder.checks.common import call, count, load_weights, probe, submodule
from courselib import seq2seq as reference


if "ipykernel" not in sys.modules:
    # In the grader's process: the stretch exercise's judges compare with T5's own function, and importing it
    # takes a few seconds. The grader imports this module in the background while the notebook runs, so pay
    # for it now. (In the student's kernel only the stretch probes import it, when they run.)
    import transformers.models.t5.modeling_t5  # noqa: F401


ADVICE = "the exercise asks you to write this yourself"


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


HF_GENERATE = "transformers.generation.utils.GenerationMixin.generate.__wrapped__"


COURSE_BEAM = "courselib.seq2seq.transformers_beam_search"


BEAM_SHORTCUTS = [COURSE_GREEDY, HF_GENERATE, COURSE_BEAM]


SMOOTHING_SHORTCUTS = ["torch.nn.functional.cross_entropy"]


SMOOTHING_ADVICE = "F.cross_entropy(label_smoothing=...) is the oracle here, not the answer"


# the reference model's and layers' own forward passes recompute every position, which the cache is for
CACHE_SHORTCUTS = ["courselib.seq2seq.EncoderDecoder", "courselib.seq2seq.DecoderLayer", "torch.nn.Transformer",
                   "torch.nn.TransformerDecoder", "torch.nn.TransformerDecoderLayer"]


CACHE_ADVICE = ("compute from the model's submodules: model.decode, model(...) and a layer's forward recompute every "
                "position, which is what the cache is for")


# transformers' caches reorder themselves for its beam search: what the exercise asks the learner to write
REORDER_SHORTCUTS = ["transformers.cache_utils.Cache.reorder_cache", "transformers.cache_utils.EncoderDecoderCache.reorder_cache",
                     "transformers.cache_utils.CacheLayerMixin.reorder_cache", "transformers.cache_utils.Cache.batch_select_indices",
                     "transformers.cache_utils.EncoderDecoderCache.batch_select_indices",
                     "transformers.cache_utils.DynamicLayer.batch_select_indices"]


REORDER_ADVICE = "transformers' caches reorder themselves for its beam search; the exercise asks you to write the gather"


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


@probe
def decoder_layer_post_ln(seeds, DecoderLayer):
    return _decoder_parity(DecoderLayer, seeds, False, POST_LN_CASES)


@probe
def decoder_layer_pre_ln(seeds, DecoderLayer):
    return _decoder_parity(DecoderLayer, seeds, True, PRE_LN_CASES)


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


@probe
def encoder_decoder_structure(seeds, EncoderDecoder):
    model = _model(EncoderDecoder)
    src, tgt_in = model_batch(seeds.generator(10101), (7, 4), (5, 3), S=7, T=5)
    return {"parameters": count(model), "memory": _encode(model, src), "logits": _forward(model, src, tgt_in),
            "names": sorted(name for name, _ in model.named_parameters())}


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


@probe
def encoder_decoder_logits(seeds, EncoderDecoder):
    results = []
    for case in MODEL_CASES:
        weights, (src, tgt_in) = model_case(seeds, *case)
        model = _loaded_model(EncoderDecoder, weights)
        results.append({"forward": _forward(model, src, tgt_in),
                        "decode": _decode(model, tgt_in, _encode(model, src), src)})
    return results


@probe
def encoder_decoder_uses_memory(seeds, EncoderDecoder):
    weights, (src, tgt_in) = model_case(seeds, 10121, (6, 3), (5, 4), 6, 5)
    model = _loaded_model(EncoderDecoder, weights)
    other_memory = torch.randn(2, 6, ED_DIMS["d_model"], generator=seeds.generator(10122), dtype=torch.float64)
    longer_src = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)   # three more [PAD] columns
    return {"given_memory": _decode(model, tgt_in, other_memory, src),
            "longer_source": _forward(model, longer_src, tgt_in), "source": _forward(model, src, tgt_in)}


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


LOSS_FULL = (10201, (6, 6, 6))          # every target fills all 6 positions: no padding


LOSS_PADDED = (10202, (6, 2, 4, 5))     # targets of 6, 2, 4 and 5 tokens, then [PAD]


@probe
def seq2seq_loss_shifts_target(seeds, seq2seq_loss):
    return _loss(seeds, *LOSS_FULL, seq2seq_loss)


@probe
def seq2seq_loss_ignores_padding(seeds, seq2seq_loss):
    return _loss(seeds, *LOSS_PADDED, seq2seq_loss)


# ================================================================ the trained model
HELD_OUT_EXAMPLES = 256


def held_out_pairs(seeds):
    return reference.sample_pairs(HELD_OUT_EXAMPLES, seeds.random(10301), held_out=True)


def fingerprint(state):
    """Two numbers per tensor, in name order: enough to recognise the shipped checkpoint."""
    return torch.tensor([[t.double().sum().item(), t.double().square().sum().item()] for _, t in sorted(state.items())],
                        dtype=torch.float64)


@probe
def trained_model_translates(seeds, model):
    if not isinstance(model, nn.Module):
        raise AssertionError(f"`model` should be your trained EncoderDecoder, but it is a {type(model).__name__}.")
    src, _ = reference.batch(held_out_pairs(seeds))
    was_training = model.training
    model.eval()
    try:   # the course's greedy decoder (the notebook's own comes later) on the learner's model
        predictions = run(reference.greedy_decode, model, src, reference.TGT_LEN, name="greedy decoding of your model",
                          forbidden=MODEL_SHORTCUTS)
    finally:
        model.train(was_training)
    return {"predictions": predictions.long(), "fingerprint": fingerprint(model.state_dict())}


# ================================================================ exercise 6: smoothed_cross_entropy
# (stream, rows, vocabulary, epsilon, ignore_index, rows ignored)
SMOOTHING_VALUES_CASES = [(10351, 12, 9, 0.1, 0, 2), (10352, 20, 40, 0.25, 0, 5), (10353, 9, 5, 0.0, 0, 1),
                          (10354, 16, 13, 0.6, 0, 0)]


SMOOTHING_PADDING_CASES = [(10361, 14, 11, 0.2, 0, 9), (10362, 10, 6, 0.1, -100, 5), (10363, 12, 7, 0.3, 3, 4)]


def smoothing_case(seeds, stream, rows, vocab, epsilon, ignore_index, ignored):
    """Seeded float64 logits (rows, vocab) and targets (rows,), `ignored` of them set to ignore_index (never as a
    label otherwise)."""
    g = seeds.generator(stream)
    logits = 2.5 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    labels = [label for label in range(vocab) if label != ignore_index]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (rows,), generator=g)]
    targets[torch.randperm(rows, generator=g)[:ignored]] = ignore_index
    return logits, targets


def _smoothing(seeds, smoothed_cross_entropy, cases):
    losses = []
    for stream, rows, vocab, epsilon, ignore_index, ignored in cases:
        logits, targets = smoothing_case(seeds, stream, rows, vocab, epsilon, ignore_index, ignored)
        loss = call(smoothed_cross_entropy, logits.clone(), targets.clone(), epsilon, ignore_index=ignore_index,
                    name="smoothed_cross_entropy", forbidden=SMOOTHING_SHORTCUTS, forbidden_advice=SMOOTHING_ADVICE)
        if type(loss) is not torch.Tensor or loss.numel() != 1:
            raise AssertionError("smoothed_cross_entropy should return the loss as a one-number tensor, but it returned "
                                 f"{type(loss).__name__}" + (f" of shape {tuple(loss.shape)}" if torch.is_tensor(loss)
                                                             else "") + ".")
        losses.append(loss.detach().reshape(()).double())
    return losses


@probe
def smoothed_cross_entropy_values(seeds, smoothed_cross_entropy):
    return _smoothing(seeds, smoothed_cross_entropy, SMOOTHING_VALUES_CASES)


@probe
def smoothed_cross_entropy_ignores_padding(seeds, smoothed_cross_entropy):
    return _smoothing(seeds, smoothed_cross_entropy, SMOOTHING_PADDING_CASES)


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


STOP_PLAN = (1, 3, 0, 2, 1, 3, 0, 2)   # every source plans its [EOS] by step 3


@probe
def greedy_decode_stops(seeds, greedy_decode):
    model = ScriptedModel(*greedy_tables(seeds, 10421, STOP_PLAN))
    src = greedy_sources((0, 1, 2, 3), seeds, 10422)
    out = _greedy(greedy_decode, model, src, 9)
    return {"out": out, "encodes": model.encodes, "longest_input": model.longest_input}


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


@probe
def exact_match_after_eos(seeds, exact_match):
    g = seeds.generator(10511)
    target = torch.cat([torch.randint(3, 12, (1, 5), generator=g), torch.tensor([[2, 0, 0]])], dim=1)   # 5 + [EOS]
    garbage_after = torch.cat([target[:, :6], torch.randint(3, 12, (1, 3), generator=g)], dim=1)
    no_eos = torch.cat([target[:, :5], torch.randint(3, 12, (1, 1), generator=g)], dim=1)           # cut at max_len
    wider = torch.cat([target[:, :6], torch.zeros(1, 6, dtype=torch.long)], dim=1)                # other width
    return [_exact_match(exact_match, p, target) for p in (garbage_after, no_eos, wider)]


# ================================================================ exercise 7: beam_search
BEAM_VOCAB, BEAM_MAX = 7, 5


def _beam(beam_search, model, src, width, max_len, penalty):
    result = call(beam_search, model, src, width, max_len, bos_id=1, eos_id=2, length_penalty=penalty,
                  name="beam_search", forbidden=BEAM_SHORTCUTS,
                  forbidden_advice="transformers' generate is the oracle here, not the answer")
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


WIDTH_ONE_SOURCES = (0, 1, 2)


@probe
def beam_search_width_one_is_greedy(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10601))
    return [_beam(beam_search, model, beam_source(first, seeds, 10602 + first), 1, BEAM_MAX, 0.0)
            for first in WIDTH_ONE_SOURCES]


# (source's first token, beam width, length_penalty, max_len): random scores, compared with transformers' generate
BEAM_CASES = [(3, 2, 0.0, 5), (4, 3, 1.0, 5), (5, 4, 0.5, 4), (6, 2, 1.0, 3), (7, 3, 2.0, 5)]


@probe
def beam_search_values(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10611))
    return [_beam(beam_search, model, beam_source(first, seeds, 10612 + first), width, max_len, penalty)
            for first, width, penalty, max_len in BEAM_CASES]


class PrefixModel(nn.Module):
    """Stands in for a trained EncoderDecoder in the designed beam tests: table[prefix] is the (V,) row of
    next-token logits after [BOS] + prefix (a tuple of ids); after a prefix the table does not list, [EOS]
    comes for sure (logit 0, every other token -30). The source is ignored."""

    def __init__(self, table, vocab):
        super().__init__()
        self.table = table
        self.ending = torch.full((vocab,), -30.0, dtype=torch.float64)
        self.ending[2] = 0.0

    def encode(self, src_ids):
        return torch.zeros(src_ids.shape[0], src_ids.shape[1], 1, dtype=torch.float64)

    def decode(self, tgt_in_ids, memory, src_ids):
        B, T = tgt_in_ids.shape
        logits = self.ending.repeat(B, T, 1)                                  # (B, T, V)
        for b in range(B):
            for t in range(T):
                row = self.table.get(tuple(tgt_in_ids[b, 1:t + 1].tolist()))
                if row is not None:
                    logits[b, t] = row
        return logits

    def forward(self, src_ids, tgt_in_ids):
        return self.decode(tgt_in_ids, self.encode(src_ids), src_ids)


PREFIX_VOCAB = 8   # [PAD] [BOS] [EOS] and the tokens 3..7


# Designed cases (the notebook's `refill`, `patient` and `wordy` with max_len 3), probabilities by prefix; the
# tables below add seeded noise (std 0.03) to every logit, far below the margins they are designed with.
# REFILL: [EOS] (0.40) finishes at step 1 and 4 (0.25) refills its place; "4 5 [EOS]" (log 0.25 / 3 = -0.46)
# beats "3 7 [EOS]" (-0.66), which a beam that shrank to one hypothesis returns.
REFILL = {(): {2: 0.40, 3: 0.35, 4: 0.25}, (3,): {7: 0.4, 6: 0.3, 3: 0.3}, (4,): {5: 1.0}}


# PATIENT: after step 2 the finished set ([EOS] -0.69, "3 [EOS]" -0.86) is full and the best live hypothesis,
# "3 4" (log 0.12 / 2 = -1.06), cannot beat it at its length: stop, and return [EOS]. A search that goes on finds
# "3 4 4 4 [EOS]" (log 0.12 / 5 = -0.42).
PATIENT = {(): {2: 0.5, 3: 0.3, 5: 0.2}, (3,): {2: 0.6, 4: 0.4}, (5,): {2: 0.5, 6: 0.5}, (3, 4): {4: 1.0},
           (3, 4, 4): {4: 1.0}}


# TRUNCATED (max_len 3): at the last step "3 5 5" finishes without [EOS] (log 0.245 / 3 = -0.47) and beats [EOS]
# (log 0.45 = -0.80); a search that lets only [EOS] finish returns [EOS].
TRUNCATED = {(): {2: 0.45, 3: 0.5, 4: 0.05}, (3,): {5: 0.7, 4: 0.16, 2: 0.14}, (3, 5): {5: 0.7, 4: 0.16, 2: 0.14},
       (3, 5, 5): {2: 0.7, 4: 0.16, 3: 0.14}}


def prefix_model(seeds, stream, spec, vocab=PREFIX_VOCAB):
    g = seeds.generator(stream)
    table = {}
    for prefix, probabilities in spec.items():
        row = torch.full((vocab,), -30.0, dtype=torch.float64)
        for token, p in probabilities.items():
            row[token] = math.log(p)
        table[prefix] = row + 0.03 * torch.randn(vocab, generator=g, dtype=torch.float64)
    return PrefixModel(table, vocab)


# SPARE (length_penalty 0): [EOS] (0.30) is only the third extension of step 1, so a beam of 2 does not finish it
# (transformers keeps it as a spare); "3 5 [EOS]" (log 0.216 = -1.53) wins. A search that finishes every [EOS]
# extension returns [EOS] (log 0.30 = -1.20).
SPARE = {(): {3: 0.36, 4: 0.34, 2: 0.30}, (3,): {5: 0.6, 6: 0.4}, (4,): {7: 0.6, 5: 0.4}}


PREFIX_SOURCE = torch.tensor([[3, 4, 5]])


# (stream, table, beam width, length_penalty, max_len)
KEEPS_LIVE_CASES = [(10641, "REFILL", 2, 1.0, 5), (10642, "REFILL", 2, 0.5, 5), (10643, "SPARE", 2, 0.0, 5)]


STOPPING_CASES = [(10651, "PATIENT", 2, 1.0, 6), (10652, "TRUNCATED", 2, 1.0, 3)]


DESIGNED = {"REFILL": REFILL, "PATIENT": PATIENT, "TRUNCATED": TRUNCATED, "SPARE": SPARE}


def _designed(seeds, beam_search, cases):
    return [_beam(beam_search, prefix_model(seeds, stream, DESIGNED[name]), PREFIX_SOURCE, width, max_len, penalty)
            for stream, name, width, penalty, max_len in cases]


@probe
def beam_search_keeps_k_live(seeds, beam_search):
    return _designed(seeds, beam_search, KEEPS_LIVE_CASES)


@probe
def beam_search_stopping(seeds, beam_search):
    return _designed(seeds, beam_search, STOPPING_CASES)


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


PENALTY_SOURCE = torch.tensor([[3, 4, 3]])


@probe
def beam_search_length_penalty(seeds, beam_search):
    model = ScriptedModel(*penalty_tables(seeds))
    return [_beam(beam_search, model, PENALTY_SOURCE, width, 6, penalty) for penalty, width in PENALTY_CASES]


EXHAUSTIVE_VOCAB, EXHAUSTIVE_MAX, EXHAUSTIVE_WIDTH = 6, 4, 2000   # 6 tokens, 4 steps: at most 6**4 candidates


@probe
def beam_search_exhaustive(seeds, beam_search):
    model = ScriptedModel(*beam_tables(seeds, 10631, EXHAUSTIVE_VOCAB, EXHAUSTIVE_MAX))
    src = beam_source(3, seeds, 10632, EXHAUSTIVE_VOCAB)
    return [_beam(beam_search, model, src, EXHAUSTIVE_WIDTH, EXHAUSTIVE_MAX, penalty) for penalty in (0.0, 1.0)]


# ================================================================ exercise 8: decode_with_cache
CACHE_STREAM = 10801


def cache_problem(seeds, stream, T):
    """The reference EncoderDecoder (float64) with the check's weights, two padded sources, the decoder inputs
    of two rows ([BOS], then T - 1 tokens: no padding, as a decoder generates them) and the memory."""
    weights = model_weights(seeds, stream)
    model = reference.EncoderDecoder(**ED_DIMS).double().eval()
    load_weights(model, weights, "the course's EncoderDecoder", MODEL_NAMES)
    src, tgt_in = model_batch(seeds.generator(stream + 50), (7, 4), (T, T), S=7, T=T)
    with torch.no_grad():
        memory = model.encode(src)                                   # the course's code, not the student's
    return model, src, tgt_in, memory


def _entry_shapes(cache):
    """Each cache entry's four shapes, or a description of what is there instead (read under the watch)."""
    if not isinstance(cache, list):
        return "not a list"
    found = []
    for entry in cache:
        if isinstance(entry, (tuple, list)) and len(entry) == 4 and all(type(t) is torch.Tensor for t in entry):
            found.append([[int(n) for n in t.shape] for t in entry])
        else:
            found.append(type(entry).__name__ + (f" of length {len(entry)}" if isinstance(entry, (tuple, list)) else ""))
    return found


def _cached_run(decode_with_cache, seeds, stream, T, splits, later_memory=None):
    """Feed tgt_in in pieces [a, b) through decode_with_cache, one cache for all: per call the logits, the cache's
    shapes after it and how many times the cross-attention's key and value projections ran during it."""
    model, src, tgt_in, memory = cache_problem(seeds, stream, T)
    runs = []
    hooks = [module.register_forward_hook(lambda module, inputs, output: runs.append(1))
             for layer in model.decoder_layers for module in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)]
    cache, calls = [None] * ED_DIMS["num_layers"], []
    try:
        for a, b in splits:
            given = memory if a == 0 or later_memory is None else later_memory
            before = len(runs)
            try:
                with torch.no_grad():
                    logits, shapes = call(decode_with_cache, model, tgt_in[:, a:b], given, src, cache,
                                          name="decode_with_cache", forbidden=CACHE_SHORTCUTS,
                                          forbidden_advice=CACHE_ADVICE, capture=lambda: _entry_shapes(cache))
            except AssertionError as error:
                if not a:
                    raise
                raise AssertionError(f"{error}\n(The call after {a} cached positions failed. The cache must grow: the "
                                     "self-attention's keys and values of every position so far, the cached ones "
                                     "followed by the new ones (torch.cat along dim=2), under the causal mask's rows "
                                     "for the new positions.)") from None
            if type(logits) is not torch.Tensor:
                raise AssertionError(f"decode_with_cache should return the logits tensor, not a {type(logits).__name__}.")
            calls.append({"new": [a, b], "logits": logits.detach().double(), "shapes": shapes,
                          "cross_projections": len(runs) - before})
    finally:
        for hook in hooks:
            hook.remove()
    return calls


CACHE_SHAPE_SPLITS = [(0, 3), (3, 4), (4, 6)]


CACHE_STEP_SPLITS = [(t, t + 1) for t in range(9)]


CACHE_CHUNK_SPLITS = [(0, 3), (3, 4), (4, 7), (7, 9)]


CACHE_ONCE_SPLITS = [(0, 1), (1, 2), (2, 5), (5, 6)]


@probe
def decode_with_cache_shapes(seeds, decode_with_cache):
    return _cached_run(decode_with_cache, seeds, CACHE_STREAM, 6, CACHE_SHAPE_SPLITS)


@probe
def decode_with_cache_matches_decode(seeds, decode_with_cache):
    return _cached_run(decode_with_cache, seeds, CACHE_STREAM + 1, 9, CACHE_STEP_SPLITS)


@probe
def decode_with_cache_chunks(seeds, decode_with_cache):
    return _cached_run(decode_with_cache, seeds, CACHE_STREAM + 2, 9, CACHE_CHUNK_SPLITS)


def later_memory(seeds):
    """What later calls receive as `memory` in decode_with_cache_cross_once: noise, which must not be read."""
    return 3 * torch.randn(2, 7, ED_DIMS["d_model"], generator=seeds.generator(CACHE_STREAM + 90), dtype=torch.float64)


@probe
def decode_with_cache_cross_once(seeds, decode_with_cache):
    return _cached_run(decode_with_cache, seeds, CACHE_STREAM + 3, 6, CACHE_ONCE_SPLITS, later_memory(seeds))


# ================================================================ exercise 9: reorder_cache
CACHE_PARTS = ("self-attention keys", "self-attention values", "cross-attention keys", "cross-attention values")


def reorder_case(seeds, stream, layers, heads, T, S, d_head, rows, beam_idx_length):
    """A cache of `layers` entries (self keys, self values: (rows, heads, T, d_head); cross keys, cross values:
    (rows, heads, S, d_head)), every entry seeded and distinct, and a beam_idx of `beam_idx_length` rows drawn
    from 0..rows-1 with a repeat (and, when it is no longer than rows, a row left out)."""
    g = seeds.generator(stream)
    cache = [tuple(torch.randn(rows, heads, length, d_head, generator=g, dtype=torch.float64)
                   for length in (T, T, S, S)) for _ in range(layers)]
    while True:
        beam_idx = torch.randint(0, rows, (beam_idx_length,), generator=g)
        repeats = len(set(beam_idx.tolist())) < beam_idx_length or rows == 1
        dropped = beam_idx_length > rows or len(set(beam_idx.tolist())) < rows
        if repeats and dropped:
            return cache, beam_idx


# (stream, layers, heads, T_past, S, d_head, rows before, rows after): the same number of rows (heads as many as
# the rows, so that a gather along the heads runs and is judged by its values), the first step of a beam search
# (one row, [BOS], becomes beam_width rows) and a growing batch with three layers
REORDER_CASES = [(10901, 2, 4, 3, 5, 2, 4, 4), (10902, 2, 3, 1, 6, 2, 1, 3), (10903, 3, 2, 5, 4, 3, 3, 5)]


def _structure(cache, layers, what):
    """The four tensors of each of `layers` entries, or a teaching failure (read under the watch)."""
    if not isinstance(cache, (list, tuple)) or len(cache) != layers:
        found = f"a {type(cache).__name__}" + (f" of length {len(cache)}" if isinstance(cache, (list, tuple)) else "")
        raise AssertionError(f"{what} should be a list of {layers} entries, one per decoder layer; found {found}.")
    for i, entry in enumerate(cache):
        if not isinstance(entry, (tuple, list)) or len(entry) != 4 or not all(type(t) is torch.Tensor for t in entry):
            raise AssertionError(f"entry {i} of {what} should be the tuple (self_keys, self_values, cross_keys, "
                                 f"cross_values) of four tensors; found {type(entry).__name__}.")
    return [[t.detach().clone() for t in entry] for entry in cache]


def _reorder(reorder_cache, cache, beam_idx):
    originals = [t for entry in cache for t in entry]
    copies = [t.clone() for t in originals]
    given = [tuple(entry) for entry in cache]
    result, unchanged = call(reorder_cache, given, beam_idx.clone(), name="reorder_cache", forbidden=REORDER_SHORTCUTS,
                             forbidden_advice=REORDER_ADVICE,
                             capture=lambda: all(torch.equal(a, b) for a, b in zip(originals, copies)))
    return result, unchanged


@probe
def reorder_cache_rows(seeds, reorder_cache):
    results = []
    for stream, layers, heads, T, S, d_head, rows, after in REORDER_CASES:
        cache, beam_idx = reorder_case(seeds, stream, layers, heads, T, S, d_head, rows, after)
        result, unchanged = _reorder(reorder_cache, cache, beam_idx)
        results.append({"cache": _structure(result, layers, "reorder_cache's result"), "input_unchanged": unchanged})
    return results


# The learner's reorder inside a batched beam search, step by step (as transformers runs it: several sources, each
# with its own beams, beam_idx never crossing from one source's rows to another's). No model: each layer's cached
# self-attention key (value) of a position is a seeded vector of the token there, and its cross-attention keys
# (values) are a seeded table of the row's source, so that the judge knows what every row's cache must hold.
SIM_LAYERS, SIM_HEADS, SIM_D, SIM_S, SIM_VOCAB = 2, 2, 3, 4, 9
SIM_SOURCES, SIM_WIDTH, SIM_STEPS = 2, 3, 4


def simulation_tables(seeds):
    """Per layer: self keys and values of every token (V, h, d); cross keys and values of every source (n, h, S, d)."""
    g = seeds.generator(10911)
    shape = (SIM_LAYERS, 2)
    tokens = torch.randn(*shape, SIM_VOCAB, SIM_HEADS, SIM_D, generator=g, dtype=torch.float64)
    sources = torch.randn(*shape, SIM_SOURCES, SIM_HEADS, SIM_S, SIM_D, generator=g, dtype=torch.float64)
    return tokens, sources


def simulation_steps(seeds):
    """[(beam_idx, new tokens)] of each step: the first step turns each source's one row ([BOS]) into SIM_WIDTH rows,
    the later ones pick each source's parents among its own rows, with repeats."""
    g = seeds.generator(10912)
    steps, rows = [], 1
    for _ in range(SIM_STEPS):
        parents = torch.randint(0, rows, (SIM_SOURCES, SIM_WIDTH), generator=g)
        beam_idx = (parents + rows * torch.arange(SIM_SOURCES)[:, None]).flatten()   # (SIM_SOURCES * SIM_WIDTH,)
        steps.append((beam_idx, torch.randint(3, SIM_VOCAB, (SIM_SOURCES * SIM_WIDTH,), generator=g)))
        rows = SIM_WIDTH
    return steps


def simulation_start(tables):
    """Each source's one row after [BOS] (id 1): the cache as the first decoding step leaves it."""
    tokens, sources = tables
    bos = torch.full((SIM_SOURCES,), 1)
    return [(tokens[i, 0][bos][:, :, None], tokens[i, 1][bos][:, :, None], sources[i, 0], sources[i, 1])
            for i in range(SIM_LAYERS)]


@probe
def reorder_cache_in_beam_search(seeds, reorder_cache):
    tables = simulation_tables(seeds)
    tokens = tables[0]
    cache = simulation_start(tables)
    for step, (beam_idx, new_tokens) in enumerate(simulation_steps(seeds), start=1):
        result, _ = _reorder(reorder_cache, cache, beam_idx)
        reordered = _structure(result, SIM_LAYERS, f"reorder_cache's result at step {step}")
        for i, entry in enumerate(reordered):
            for part, tensor in zip(CACHE_PARTS, entry):
                if tensor.shape[0] != len(beam_idx):
                    along = (" (it looks gathered along dim 1, the heads: the hypotheses are dim 0)"
                             if tensor.dim() == 4 and tensor.shape[1] == len(beam_idx) else "")
                    raise AssertionError(
                        f"at step {step} of a beam search over {SIM_SOURCES} sources ({len(beam_idx)} hypotheses), layer "
                        f"{i}'s {part} came back from reorder_cache with {tensor.shape[0]} rows, shape "
                        f"{tuple(tensor.shape)}: every tensor of every layer needs one row per entry of beam_idx, row r "
                        f"being row beam_idx[r] of the cache before (gather along dim 0, the hypotheses){along}.")
        cache = [(torch.cat([k, tokens[i, 0][new_tokens][:, :, None]], dim=2),      # the new position's key and value
                  torch.cat([v, tokens[i, 1][new_tokens][:, :, None]], dim=2), ck, cv)
                 for i, (k, v, ck, cv) in enumerate(reordered)]
    return [list(entry) for entry in cache]


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


@probe
def stretch_relative_position_bucket_bidirectional(seeds, relative_position_bucket):
    return _bucket_probe(seeds, relative_position_bucket, True, 10701)


@probe
def stretch_relative_position_bucket_causal(seeds, relative_position_bucket):
    return _bucket_probe(seeds, relative_position_bucket, False, 10702)
