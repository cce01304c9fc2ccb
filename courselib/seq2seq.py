"""Notebook 10's sequence-to-sequence task, its reference encoder–decoder, and the small trained checkpoint.

The task is date-format translation between the ways people write dates and ISO 8601, the way machines
write them. A date in any human format goes in and comes out in ISO; a date in ISO goes in and comes out in
words:

    12 march 2021   ->  2021-03-12        march 12, 2021  ->  2021-03-12
    12/03/2021      ->  2021-03-12        mar 12 2021     ->  2021-03-12
    12.03.21        ->  2021-03-12        (two-digit years: 50-99 are 19xx, 00-49 are 20xx)
    2021-03-12      ->  12 march 2021

Dates run from 1950 to 2049. One date in ten, chosen by a fixed hash of the date (`is_held_out`), never
appears in training in any format: held-out accuracy measures dates the model has never seen.

    src_ids, tgt_ids = batch(sample_pairs(64, random.Random(0)))   # (64, SRC_LEN), (64, TGT_LEN)
    model = load_checkpoint()                                       # the reference EncoderDecoder, trained
    print(to_text(greedy_decode(model, src_ids[:1], TGT_LEN)[0]))

The model (`EncoderDecoder`) is the original Transformer's shape built from the course's pieces: a
shared `TokenEmbedding` (scaled by √d_model), learned positions for each side, pre-LN `EncoderLayer`s
(courselib.blocks), pre-LN `DecoderLayer`s (masked self-attention, cross-attention, feed-forward), a final
LayerNorm on each side and a linear head. It computes what `torch.nn.Transformer(norm_first=True)` computes
between the same embeddings and head (autograder/tests/test_seq2seq.py proves it).

The checkpoint in `courselib/data/seq2seq_dates/` (safetensors and a config) loads into this class or
into any class with the same parameter names, such as the one learners write in notebook 10. It is
rebuilt from nothing but this file, with a fixed seed:

    python -m courselib.seq2seq --rebuild [--threads 1]
"""
import datetime
import functools
import json
import pathlib
import random
import re
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from courselib.attention import MultiHeadAttention, causal_mask, padding_mask
from courselib.blocks import EncoderLayer, FeedForward, LayerNorm, LearnedPositionalEmbedding, TokenEmbedding
from courselib.training import checkpoint_cli

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "data" / "seq2seq_dates"

# ---------------------------------------------------------------------------------------- the task
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december"]
ABBREVIATIONS = [month[:3] for month in MONTHS]  # "may" is its own abbreviation
SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]"]
PAD, BOS, EOS = 0, 1, 2
VOCAB = list(dict.fromkeys(SPECIAL_TOKENS + list("0123456789") + ["-", "/", ".", ","] + MONTHS + ABBREVIATIONS))
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
SRC_LEN = 10   # the longest sources, "dd/mm/yyyy" and "yyyy-mm-dd", are 10 tokens
TGT_LEN = 11   # "yyyy-mm-dd" and [EOS]; "d month yyyy" and [EOS] is 7 or 8
FIRST_DAY, LAST_DAY = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)

FORMATS = {
    "day month year": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "month day, year": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "dd/mm/yyyy": lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
    "mon day year": lambda d: f"{ABBREVIATIONS[d.month - 1]} {d.day} {d.year}",
    "dd.mm.yy": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year % 100:02d}",
    "iso": lambda d: iso(d),
}


def tokenize(text):
    """'march 12, 2021' -> ['march', '1', '2', ',', '2', '0', '2', '1']: words, single digits, punctuation."""
    tokens = re.findall(r"[a-z]+|\d|[^\sa-z\d]", text.lower())
    unknown = [token for token in tokens if token not in TOKEN_ID]
    if unknown:
        raise ValueError(f"{text!r} has tokens outside the vocabulary: {unknown}")
    return tokens


def iso(date):
    """ISO 8601: '2021-03-12'."""
    return f"{date.year:04d}-{date.month:02d}-{date.day:02d}"


def translate(date, format_name):
    """The target for `date` written in `format_name`: ISO for every human format, words for ISO."""
    return FORMATS["day month year"](date) if format_name == "iso" else iso(date)


def is_held_out(date):
    """One date in ten, by a fixed multiplicative hash of its ordinal: never used for training."""
    return (date.toordinal() * 2654435761) % 2**32 % 10 == 0


def random_date(rng, held_out=False):
    """A uniformly random date of 1950-2049 from the training dates, or from the held-out ones."""
    span = LAST_DAY.toordinal() - FIRST_DAY.toordinal()
    while True:
        date = datetime.date.fromordinal(FIRST_DAY.toordinal() + rng.randint(0, span))
        if is_held_out(date) == held_out:
            return date


def sample_pairs(n, rng, held_out=False, formats=None):
    """n (source text, target text) pairs: random dates, each in a random format (or one of `formats`)."""
    names = list(formats or FORMATS)
    pairs = []
    for _ in range(n):
        date, name = random_date(rng, held_out), rng.choice(names)
        pairs.append((FORMATS[name](date), translate(date, name)))
    return pairs


def encode(texts, length, eos=False):
    """Token ids (N, length), right-padded with [PAD]; `eos` appends [EOS] to each text."""
    ids = torch.full((len(texts), length), PAD, dtype=torch.long)
    for row, text in enumerate(texts):
        tokens = [TOKEN_ID[token] for token in tokenize(text)] + ([EOS] if eos else [])
        if len(tokens) > length:
            raise ValueError(f"{text!r} needs {len(tokens)} positions, more than {length}")
        ids[row, :len(tokens)] = torch.tensor(tokens)
    return ids


def batch(pairs):
    """(src_ids (N, SRC_LEN), tgt_ids (N, TGT_LEN)): targets end with [EOS]; both right-padded with [PAD]."""
    sources, targets = zip(*pairs)
    return encode(sources, SRC_LEN), encode(targets, TGT_LEN, eos=True)


def tokens_of(ids):
    """The tokens of one row of ids, up to (not including) the first [EOS]; [PAD] and [BOS] skipped."""
    out = []
    for i in (ids.tolist() if torch.is_tensor(ids) else ids):
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(VOCAB[i])
    return out


def to_text(ids):
    """A row of ids as text: '2021-03-12', '12 march 2021' (a space between words and numbers)."""
    text = ""
    for token in tokens_of(ids):
        joined = not text or token in "-/.," or text[-1] in "-/." or (token.isdigit() and text[-1].isdigit())
        text += token if joined else " " + token
    return text


def training_batches(batch_size, seed):
    """An endless stream of fresh training batches (held-out dates never appear)."""
    rng = random.Random(seed)
    while True:
        yield batch(sample_pairs(batch_size, rng))


# ---------------------------------------------------------------------------------------- the model
class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder's output, feed-forward; each sublayer with
    a residual connection and a LayerNorm: post-LN when norm_first=False, pre-LN when norm_first=True.

    Submodules: self_attn, cross_attn (MultiHeadAttention), ffn (FeedForward), norm1, norm2, norm3 (LayerNorm,
    one per sublayer), dropout. The same computation as torch.nn.TransformerDecoderLayer(activation="gelu").
    forward(x (B, T, d_model), memory (B, S, d_model), tgt_padding_mask (B, 1, 1, T) or None,
    memory_padding_mask (B, 1, 1, S) or None; True at real tokens) -> (B, T, d_model).
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model, eps) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        mask = causal_mask(x.shape[1], x.device)                  # (T, T): no peeking at later targets
        if tgt_padding_mask is not None:
            mask = mask & tgt_padding_mask                        # (B, 1, T, T)
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, mask=mask)[0])
            h = self.norm2(x)                                     # the memory is not normalised here
            x = x + self.dropout(self.cross_attn(h, memory, memory, mask=memory_padding_mask)[0])
            return x + self.dropout(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, mask=memory_padding_mask)[0]))
        return self.norm3(x + self.dropout(self.ffn(x)))


class EncoderDecoder(nn.Module):
    """The encoder–decoder Transformer, pre-LN, from the course's pieces.

    Submodules: embed (TokenEmbedding shared by both sides, scaled by √d_model), src_positions and
    tgt_positions (LearnedPositionalEmbedding), encoder_layers (pre-LN EncoderLayers), encoder_norm,
    decoder_layers (pre-LN DecoderLayers), decoder_norm, head (nn.Linear(d_model, vocab_size)), dropout.
    encode(src_ids (B, S)) -> memory (B, S, d_model); decode(tgt_in_ids (B, T), memory, src_ids) -> logits
    (B, T, vocab_size); forward(src_ids, tgt_in_ids) = decode(tgt_in_ids, encode(src_ids), src_ids).
    """

    def __init__(self, vocab_size, d_model, num_heads, d_ff, num_layers, max_positions, pad_id, dropout=0.0):
        super().__init__()
        self.pad_id = pad_id
        self.embed = TokenEmbedding(vocab_size, d_model, padding_idx=pad_id)
        self.src_positions = LearnedPositionalEmbedding(max_positions, d_model)
        self.tgt_positions = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=1e-5)
                                            for _ in range(num_layers))
        self.encoder_norm = LayerNorm(d_model, eps=1e-5)
        self.decoder_layers = nn.ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=1e-5)
                                            for _ in range(num_layers))
        self.decoder_norm = LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab_size)

    def encode(self, src_ids):
        x = self.dropout(self.embed(src_ids) + self.src_positions(src_ids))   # (B, S, d_model)
        mask = padding_mask(src_ids, self.pad_id)                              # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x)                                            # pre-LN: one final LayerNorm

    def decode(self, tgt_in_ids, memory, src_ids):
        y = self.dropout(self.embed(tgt_in_ids) + self.tgt_positions(tgt_in_ids))  # (B, T, d_model)
        tgt_mask, memory_mask = padding_mask(tgt_in_ids, self.pad_id), padding_mask(src_ids, self.pad_id)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask, memory_mask)
        return self.head(self.decoder_norm(y))                                 # (B, T, vocab_size)

    def forward(self, src_ids, tgt_in_ids):
        return self.decode(tgt_in_ids, self.encode(src_ids), src_ids)


def torch_layer_state(layer, decoder):
    """One of our EncoderLayers or DecoderLayers as a torch.nn.Transformer(En|De)coderLayer state dict:
    torch stacks W_Q, W_K, W_V into one (3 d, d) `in_proj_weight`, and calls cross-attention `multihead_attn`."""
    state = {}
    attentions = [("self_attn", "self_attn")] + ([("cross_attn", "multihead_attn")] if decoder else [])
    for ours, theirs in attentions:
        attn = getattr(layer, ours)
        state[f"{theirs}.in_proj_weight"] = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        state[f"{theirs}.in_proj_bias"] = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        state[f"{theirs}.out_proj.weight"], state[f"{theirs}.out_proj.bias"] = attn.out_proj.weight, attn.out_proj.bias
    modules = {"linear1": layer.ffn.linear1, "linear2": layer.ffn.linear2, "norm1": layer.norm1, "norm2": layer.norm2}
    if decoder:
        modules["norm3"] = layer.norm3
    for name, module in modules.items():
        state[f"{name}.weight"], state[f"{name}.bias"] = module.weight, module.bias
    return state


def to_torch_transformer(model, num_heads):
    """torch.nn.Transformer(norm_first=True) holding `model`'s encoder, decoder and final norms (any class with
    the reference's submodule and parameter names). It computes model's memory and, before `head`, its decoder
    output: torch_model.encoder(embed(src) + src_positions(src), src_key_padding_mask=src == pad) is
    model.encode(src)."""
    first = model.decoder_layers[0]
    d_model, d_ff = first.ffn.linear1.in_features, first.ffn.linear1.out_features
    with warnings.catch_warnings():   # "enable_nested_tensor is True, but ...norm_first was True": a fast path we skip
        warnings.simplefilter("ignore")
        theirs = nn.Transformer(d_model, num_heads, len(model.encoder_layers), len(model.decoder_layers),
                                d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True,
                                layer_norm_eps=model.encoder_norm.eps).to(first.ffn.linear1.weight.dtype)
    state = {}
    for i, layer in enumerate(model.encoder_layers):
        state.update({f"encoder.layers.{i}.{k}": v for k, v in torch_layer_state(layer, decoder=False).items()})
    for i, layer in enumerate(model.decoder_layers):
        state.update({f"decoder.layers.{i}.{k}": v for k, v in torch_layer_state(layer, decoder=True).items()})
    for side in ("encoder", "decoder"):
        norm = getattr(model, f"{side}_norm")
        state[f"{side}.norm.weight"], state[f"{side}.norm.bias"] = norm.weight, norm.bias
    theirs.load_state_dict(state)
    return theirs.train()   # dropout 0; train mode avoids the fused fast path


def shift_right(tgt_ids, bos_id=BOS):
    """Teacher forcing's decoder input: [BOS] then the target without its last position."""
    bos = torch.full_like(tgt_ids[:, :1], bos_id)
    return torch.cat([bos, tgt_ids[:, :-1]], dim=1)


def seq2seq_loss(model, src_ids, tgt_ids, bos_id=BOS, pad_id=PAD):
    """Mean cross-entropy over the real (non-padding) target tokens, with teacher forcing."""
    logits = model(src_ids, shift_right(tgt_ids, bos_id))                     # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt_ids.flatten(), ignore_index=pad_id)


@torch.no_grad()
def greedy_decode(model, src_ids, max_len, bos_id=BOS, eos_id=EOS, pad_id=PAD):
    """The most likely next token, step by step: (B, L) generated ids, L <= max_len, [PAD] after [EOS]."""
    memory = model.encode(src_ids)                       # the encoder runs once
    out = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_ids = model.decode(out, memory, src_ids)[:, -1].argmax(dim=-1)
        next_ids = next_ids.masked_fill(finished, pad_id)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        finished |= next_ids == eos_id
        if finished.all():
            break
    return out[:, 1:]


def exact_match(predictions, targets, eos_id=EOS):
    """Share of rows whose tokens up to and including the first [EOS] are the target's."""
    def up_to_eos(row):
        row = row.tolist()
        return row[:row.index(eos_id) + 1] if eos_id in row else row
    return sum(up_to_eos(p) == up_to_eos(t) for p, t in zip(predictions, targets)) / len(targets)


# ---------------------------------------------------------------------------------------- Hugging Face's beam search
def transformers_beam_search(model, src_ids, beam_width, max_len, length_penalty=1.0, bos_id=BOS, eos_id=EOS,
                             pad_id=PAD):
    """Hugging Face's beam search, `generate(num_beams=beam_width)` with its defaults (early_stopping=False), on
    any model with encode(src_ids) -> memory and decode(tgt_in_ids, memory, src_ids) -> logits, for one source
    src_ids (1, S). It runs the decoder on the whole prefix at every step (no cache), as the model defines it.

    Returns (tokens, score): the best hypothesis's generated ids, a 1-D tensor without [BOS] ([EOS] included if it
    finished), and its score, the sum of its log-probabilities / len(tokens) ** length_penalty, in float32 as
    transformers computes it."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _generation_model()(model, bos_id, eos_id, pad_id).generate(
                input_ids=src_ids, num_beams=beam_width, max_length=max_len + 1, length_penalty=length_penalty,
                early_stopping=False, do_sample=False, num_return_sequences=1, use_cache=False, output_scores=True,
                return_dict_in_generate=True)
    finally:
        transformers.logging.set_verbosity(verbosity)
    tokens = out.sequences[0, 1:]
    if beam_width > 1:
        return tokens, out.sequences_scores[0].item()
    # one beam: generate() decodes greedily and reports no sequence score, so score the tokens it chose
    with torch.no_grad():
        logits = model.decode(out.sequences[:, :-1], model.encode(src_ids), src_ids)[0]         # (L, V)
    total = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None]).sum().item()
    return tokens, total / len(tokens) ** length_penalty


@functools.lru_cache(maxsize=None)
def _generation_model():
    """A transformers model class around an encode/decode model, built on first use (importing transformers takes
    seconds): `generate` reaches the model's encode through get_encoder() and its decode through forward."""
    import dataclasses

    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput

    @dataclasses.dataclass
    class SourceEncoding(ModelOutput):
        # generate() repeats every tensor of the encoder's output for each beam: the memory and the source ids
        last_hidden_state: torch.Tensor = None
        source_ids: torch.Tensor = None

    class Encoder(nn.Module):
        main_input_name = "input_ids"

        def __init__(self, encode):
            super().__init__()
            self.encode = encode

        def forward(self, input_ids=None, **kwargs):
            return SourceEncoding(last_hidden_state=self.encode(input_ids), source_ids=input_ids)

    class GenerationModel(PreTrainedModel, GenerationMixin):
        config_class = PretrainedConfig
        main_input_name = "input_ids"

        def __init__(self, model, bos_id, eos_id, pad_id):
            super().__init__(PretrainedConfig(is_encoder_decoder=True, decoder_start_token_id=bos_id,
                                              bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id))
            self.encoder = Encoder(model.encode)
            self.decode = model.decode
            self.anchor = nn.Parameter(torch.zeros(1))   # generate() reads the device from a parameter

        def get_encoder(self):
            return self.encoder

        def forward(self, decoder_input_ids=None, encoder_outputs=None, **kwargs):
            logits = self.decode(decoder_input_ids, encoder_outputs.last_hidden_state, encoder_outputs.source_ids)
            return Seq2SeqLMOutput(logits=logits)

        def prepare_inputs_for_generation(self, input_ids, encoder_outputs=None, **kwargs):
            return {"decoder_input_ids": input_ids, "encoder_outputs": encoder_outputs}   # the whole prefix

    return GenerationModel


# ---------------------------------------------------------------------------------------- training
CONFIG = dict(vocab_size=len(VOCAB), d_model=32, num_heads=4, d_ff=64, num_layers=2, max_positions=16, pad_id=PAD)
SEED = 0
STEPS, BATCH_SIZE, LEARNING_RATE, WARMUP = 3000, 64, 1e-2, 20


def train(model, steps, loss_fn=seq2seq_loss, batch_size=BATCH_SIZE, lr=LEARNING_RATE, warmup=WARMUP, decay=False,
          seed=SEED, callback=None):
    """AdamW on fresh batches of training dates, the learning rate warming up over `warmup` steps (then,
    with `decay`, falling linearly to 0 at `steps`). Weight decay (0.01) in notebook 09's two groups: every
    tensor with two or more dimensions (the linear layers' weights, the embedding and position tables) decays;
    biases and LayerNorm gains and shifts do not, since decay would pull a gain towards 0 instead of its neutral 1.
    `loss_fn(model, src_ids, tgt_ids)` is the loss; `callback(step, loss)` runs after each step. Returns the list
    of losses; the model ends in eval mode."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.01}, {"params": vectors, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.98))

    def factor(step):
        warm = (step + 1) / warmup
        return min(warm, (steps - step) / max(1, steps - warmup)) if decay else min(warm, 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    batches = training_batches(batch_size, seed)
    losses = []
    model.train()
    for step in range(steps):
        src_ids, tgt_ids = next(batches)
        loss = loss_fn(model, src_ids, tgt_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return losses


def held_out_set(n=2000, seed=12345):
    """The held-out evaluation set used by the build log and the tests: (src_ids, tgt_ids)."""
    return batch(sample_pairs(n, random.Random(seed), held_out=True))


def rebuild(out_dir=MODEL_DIR, steps=STEPS, seed=SEED, quiet=False):
    """Train the reference EncoderDecoder from scratch and write `out_dir` (safetensors + config + log)."""
    from safetensors.torch import save_file

    start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    model = EncoderDecoder(**CONFIG)
    log_every = max(1, steps // 20)

    def report(step, loss):
        if not quiet and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}/{steps}  loss {loss:.4f}  {time.perf_counter() - start:6.0f} s", flush=True)

    losses = train(model, steps, decay=True, seed=seed, callback=report)
    src_ids, tgt_ids = held_out_set()
    accuracy = exact_match(greedy_decode(model, src_ids, TGT_LEN), tgt_ids)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
    log = {"seed": seed, "steps": steps, "parameters": sum(p.numel() for p in model.parameters()),
           "hyperparameters": {"batch_size": BATCH_SIZE, "lr": LEARNING_RATE, "warmup": WARMUP, "decay": "linear",
                               "weight_decay": "0.01 on tensors of 2 or more dimensions, 0 on the others"},
           "held_out_exact_match": round(accuracy, 4), "held_out_examples": len(tgt_ids),
           "minutes": round((time.perf_counter() - start) / 60, 1),
           "cpu_minutes": round((time.process_time() - cpu_start) / 60, 1),
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "first_losses": losses[:5],
           "final_loss": round(sum(losses[-100:]) / len(losses[-100:]), 5),
           "loss_every_100_steps": [round(sum(losses[i:i + 100]) / len(losses[i:i + 100]), 5)
                                    for i in range(0, len(losses), 100)]}
    (out_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out_dir / "README.md").write_text(MODEL_CARD.format(**log, **CONFIG))
    return model, log


MODEL_CARD = """# seq2seq_dates: notebook 10's trained encoder–decoder

The reference `courselib.seq2seq.EncoderDecoder` ({parameters:,} parameters: {num_layers} encoder and
{num_layers} decoder layers, pre-LN, width {d_model}, {num_heads} heads, feed-forward {d_ff}, a vocabulary of
{vocab_size} tokens) trained to translate dates between human formats and ISO 8601 ("march 12, 2021" ->
"2021-03-12", "2021-03-12" -> "12 march 2021").

Built by `python -m courselib.seq2seq --rebuild` (seed {seed}): {steps} steps of batches of
{hyperparameters[batch_size]} fresh training dates, AdamW (weight decay {hyperparameters[weight_decay]}),
peak learning rate {hyperparameters[lr]} after {hyperparameters[warmup]} warm-up steps, then a linear decay.
The build took {minutes} minutes of wall-clock time ({cpu_minutes} CPU minutes, {threads} thread(s), torch {torch}). Final training loss {final_loss} (mean of
the last 100 steps); greedy exact match on {held_out_examples} held-out dates (never seen in training):
{held_out_exact_match:.2%}. `training_log.json` has the curve.

    from courselib.seq2seq import load_checkpoint
    model = load_checkpoint()                 # or load_checkpoint(YourEncoderDecoder)
"""


def load_checkpoint(model_class=None):
    """The shipped trained model in eval mode, as `model_class` (default: the reference EncoderDecoder),
    which must take CONFIG's arguments and have the reference's parameter names."""
    from safetensors.torch import load_file

    config = json.loads((MODEL_DIR / "config.json").read_text())
    with torch.random.fork_rng(devices=[]):  # building the model draws random weights: leave the caller's generator
        model = (model_class or EncoderDecoder)(**config)
    model.load_state_dict(load_file(MODEL_DIR / "model.safetensors"))
    return model.eval()


def main(argv=None):
    def print_pairs(n):
        for source, target in sample_pairs(n, random.Random(SEED)):
            print(f"{source:>20}  ->  {target}")

    def rebuild_and_report(out, steps):
        _, log = rebuild(out, steps=steps)
        print(f"wrote {out}: held-out exact match {log['held_out_exact_match']:.2%} after {log['minutes']} minutes")

    return checkpoint_cli(argv, prog="python -m courselib.seq2seq", description=__doc__.splitlines()[0],
                          model_dir=MODEL_DIR, steps=STEPS, sample=print_pairs, rebuild=rebuild_and_report)


if __name__ == "__main__":
    raise SystemExit(main())
