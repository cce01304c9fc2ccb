"""Mutants and alternative correct answers for 10_encoder_decoder."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "10_encoder_decoder"
LAYER = "decoder_layer_answer"
MODEL = "encoder_decoder_answer"
LOSS = "seq2seq_loss_answer"
GREEDY = "greedy_decode_answer"
MATCH = "exact_match_answer"
BEAM = "beam_search_answer"
BUCKET = "relative_position_bucket_answer"

LAYER_TESTS = ("decoder_layer_post_ln", "decoder_layer_pre_ln", "decoder_layer_masks")

# ------------------------------------------------------------------ DecoderLayer
LAYER_INIT = '''
class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention and feed-forward sublayers."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.norm3 = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
'''


def layer(masks, pre_ln_cross="self.cross_attn(h, memory, memory, mask=cross_mask)[0]",
          post_ln_cross="self.cross_attn(x, memory, memory, mask=cross_mask)[0]"):
    """A DecoderLayer whose masks (and, optionally, cross-attention call) are given."""
    return LAYER_INIT + f'''
    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        T, S = x.shape[1], memory.shape[1]
{masks}
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=self_mask)[0])
            h = self.norm2(x)
            x = x + self.dropout({pre_ln_cross})
            return x + self.dropout(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=self_mask)[0]))
        x = self.norm2(x + self.dropout({post_ln_cross}))
        return self.norm3(x + self.dropout(self.ffn(x)))
'''


RIGHT_MASKS = '''
        self_mask = causal_mask(T)
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        cross_mask = memory_padding_mask
'''

# ------------------------------------------------------------------ EncoderDecoder
MODEL_INIT = '''
class EncoderDecoder(nn.Module):
    """The encoder-decoder Transformer, pre-LN."""

    def __init__(self, vocab_size, d_model, num_heads, d_ff, num_layers, max_positions, pad_id, dropout=0.0):
        super().__init__()
        self.pad_id = pad_id
        self.embed = TokenEmbedding(vocab_size, d_model, padding_idx=pad_id)
        self.src_positions = LearnedPositionalEmbedding(max_positions, d_model)
        self.tgt_positions = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=1e-5) for _ in range(num_layers))
        self.encoder_norm = LayerNorm(d_model, eps=1e-5)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=1e-5) for _ in range(num_layers))
        self.decoder_norm = LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, src_ids, tgt_in_ids):
        return self.decode(tgt_in_ids, self.encode(src_ids), src_ids)
'''

RIGHT_ENCODE = '''
    def encode(self, src_ids):
        x = self.dropout(self.embed(src_ids) + self.src_positions(src_ids))
        keep = padding_mask(src_ids, self.pad_id)
        for layer in self.encoder_layers:
            x = layer(x, keep)
        return self.encoder_norm(x)
'''

RIGHT_DECODE = '''
    def decode(self, tgt_in_ids, memory, src_ids):
        y = self.dropout(self.embed(tgt_in_ids) + self.tgt_positions(tgt_in_ids))
        for layer in self.decoder_layers:
            y = layer(y, memory, padding_mask(tgt_in_ids, self.pad_id), padding_mask(src_ids, self.pad_id))
        return self.head(self.decoder_norm(y))
'''


def model(encode=RIGHT_ENCODE, decode=RIGHT_DECODE):
    return MODEL_INIT + encode + decode


# ------------------------------------------------------------------ seq2seq_loss
def loss(body):
    return "def seq2seq_loss(model, src_ids, tgt_ids, bos_id=BOS, pad_id=PAD):\n" + body


SHIFTED = """
    decoder_input = torch.cat([torch.full_like(tgt_ids[:, :1], bos_id), tgt_ids[:, :-1]], dim=1)
    logits = model(src_ids, decoder_input)
"""

# ------------------------------------------------------------------ greedy_decode
def greedy(body):
    return "@torch.no_grad()\ndef greedy_decode(model, src_ids, max_len, bos_id=BOS, eos_id=EOS, pad_id=PAD):\n" + body


GREEDY_LOOP = """
    memory = model.encode(src_ids)
    out = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
"""

# ------------------------------------------------------------------ exact_match
def match(body):
    return "def exact_match(predictions, targets, eos_id=EOS):\n" + body


# ------------------------------------------------------------------ beam_search
def beam(body):
    return ("@torch.no_grad()\ndef beam_search(model, src_ids, beam_width, max_len, bos_id=BOS, eos_id=EOS, "
            "length_penalty=0.0):\n" + body)


BEAM_SEARCH = """
    memory = model.encode(src_ids)
    live = torch.full((1, 1), bos_id, dtype=torch.long)
    live_scores = torch.zeros(1, dtype=torch.float64)
    finished = []
    for _ in range(max_len):
        k = live.shape[0]
        log_probs = torch.log_softmax(model.decode(live, memory.expand(k, -1, -1), src_ids.expand(k, -1))[:, -1].double(), -1)
        candidates = (live_scores[:, None] + log_probs).flatten()
        best = candidates.topk(min(beam_width, candidates.numel()))
        rows, tokens = best.indices // log_probs.shape[1], best.indices % log_probs.shape[1]
        grown = torch.cat([live[rows], tokens[:, None]], dim=1)
        ended = tokens == eos_id
        finished += [(seq[1:], score.item()) for seq, score in zip(grown[ended], best.values[ended])]
        live, live_scores = grown[~ended], best.values[~ended]
        if live.shape[0] == 0:
            break
    finished += [(seq[1:], score.item()) for seq, score in zip(live, live_scores)]
"""

# ------------------------------------------------------------------ relative_position_bucket
def bucket(body):
    return ("def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):\n"
            + body)


BUCKET_TAIL = """
    max_exact = num_buckets // 2
    scaled = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    far = (max_exact + scaled.long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, far)
"""

MUTANTS = [
    # ---- DecoderLayer: the masks
    Variant("cross_attention_causal_over_the_source", {LAYER: layer('''
        self_mask = causal_mask(T)
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        cross_mask = torch.ones(T, S, dtype=torch.bool).tril()       # "no peeking" applied to the source too
        if memory_padding_mask is not None:
            cross_mask = cross_mask & memory_padding_mask
''')}, loses=LAYER_TESTS, message="causal mask over the encoder's positions"),
    Variant("self_attention_without_the_causal_mask", {LAYER: layer('''
        self_mask = tgt_padding_mask
        cross_mask = memory_padding_mask
''')}, loses=LAYER_TESTS, message="no causal mask"),
    Variant("cross_attention_ignores_the_source_padding", {LAYER: layer('''
        self_mask = causal_mask(T)
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        cross_mask = None
''')}, loses=LAYER_TESTS, message="ignores memory_padding_mask"),
    Variant("self_attention_ignores_the_target_padding", {LAYER: layer('''
        self_mask = causal_mask(T)
        cross_mask = memory_padding_mask
''')}, loses=("decoder_layer_post_ln", "decoder_layer_pre_ln"), message="ignores tgt_padding_mask"),
    # ---- DecoderLayer: the norms
    Variant("pre_ln_normalises_the_memory_too", {LAYER: layer(
        RIGHT_MASKS, pre_ln_cross="self.cross_attn(h, self.norm2(memory), self.norm2(memory), mask=cross_mask)[0]")},
        loses=("decoder_layer_pre_ln",), message="went through norm2"),
    Variant("norms_in_the_wrong_sublayers", {LAYER: LAYER_INIT + '''
    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        self_mask = causal_mask(x.shape[1])
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        if self.norm_first:
            x = x + self.self_attn(self.norm1(x), mask=self_mask)[0]
            x = x + self.cross_attn(self.norm3(x), memory, memory, mask=memory_padding_mask)[0]
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.self_attn(x, mask=self_mask)[0])
        x = self.norm3(x + self.cross_attn(x, memory, memory, mask=memory_padding_mask)[0])
        return self.norm2(x + self.ffn(x))
'''}, loses=("decoder_layer_post_ln", "decoder_layer_pre_ln"), message="wrong sublayers"),
    Variant("post_ln_computed_for_both_settings", {LAYER: LAYER_INIT + '''
    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        self_mask = causal_mask(x.shape[1])
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        x = self.norm1(x + self.self_attn(x, mask=self_mask)[0])
        x = self.norm2(x + self.cross_attn(x, memory, memory, mask=memory_padding_mask)[0])
        return self.norm3(x + self.ffn(x))
'''}, loses=("decoder_layer_pre_ln",), message="computed a post-LN layer"),
    # A wrapped course reference must lose its points and be flagged for a person to look at.
    Variant("decoder_layer_wraps_the_course_reference", {LAYER: '''
from courselib.seq2seq import DecoderLayer as _Reference


class DecoderLayer(_Reference):
    """The course's own layer, renamed."""
'''}, loses=("decoder_layer_structure",) + LAYER_TESTS, message="flagged for review"),
    Variant("decoder_layer_captures_torch_early", {LAYER: LAYER_INIT.replace("class DecoderLayer", '''
_TorchLayer = torch.nn.TransformerDecoderLayer


class DecoderLayer''') + '''
    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        d = x.shape[-1]
        theirs = _TorchLayer(d, self.self_attn.num_heads, self.ffn.linear1.out_features, dropout=0.0,
                             activation="gelu", batch_first=True, norm_first=self.norm_first).to(x.dtype)
        for ours, name in ((self.self_attn, "self_attn"), (self.cross_attn, "multihead_attn")):
            attention = getattr(theirs, name)
            attention.in_proj_weight.data = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]).data
            attention.in_proj_bias.data = torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]).data
            attention.out_proj.weight.data, attention.out_proj.bias.data = ours.out_proj.weight.data, ours.out_proj.bias.data
        theirs.linear1, theirs.linear2 = self.ffn.linear1, self.ffn.linear2
        theirs.norm1.weight.data, theirs.norm1.bias.data = self.norm1.weight.data, self.norm1.bias.data
        theirs.norm2.weight.data, theirs.norm2.bias.data = self.norm2.weight.data, self.norm2.bias.data
        theirs.norm3.weight.data, theirs.norm3.bias.data = self.norm3.weight.data, self.norm3.bias.data
        T = x.shape[1]
        return theirs(x, memory, tgt_mask=~causal_mask(T),
                      tgt_key_padding_mask=None if tgt_padding_mask is None else ~tgt_padding_mask[:, 0, 0],
                      memory_key_padding_mask=None if memory_padding_mask is None else ~memory_padding_mask[:, 0, 0])
'''}, loses=LAYER_TESTS, message="flagged for review"),
    # ---- EncoderDecoder
    Variant("model_without_the_final_norms", {MODEL: model(
        encode=RIGHT_ENCODE.replace("return self.encoder_norm(x)", "return x"),
        decode=RIGHT_DECODE.replace("self.head(self.decoder_norm(y))", "self.head(y)"))},
        loses=("encoder_decoder_encode", "encoder_decoder_logits"), message="final LayerNorm"),
    Variant("model_target_reads_source_positions", {MODEL: model(
        decode=RIGHT_DECODE.replace("self.tgt_positions(tgt_in_ids)", "self.src_positions(tgt_in_ids)"))},
        loses=("encoder_decoder_logits",), message="src_positions"),
    Variant("model_decode_encodes_again", {MODEL: model(
        decode=RIGHT_DECODE.replace("for layer in self.decoder_layers:", "memory = self.encode(src_ids)\n"
                                    "        for layer in self.decoder_layers:"))},
        loses=("encoder_decoder_uses_memory",), message="must read the memory it is given"),
    Variant("model_cross_attention_reads_source_padding", {MODEL: model(
        decode=RIGHT_DECODE.replace("padding_mask(src_ids, self.pad_id))", "None)"))},
        loses=("encoder_decoder_logits", "encoder_decoder_uses_memory"), message="source's padding"),
    Variant("model_wraps_the_course_reference", {MODEL: '''
class EncoderDecoder(seq2seq.EncoderDecoder):
    """The course's model, renamed."""
'''}, loses=("encoder_decoder_structure", "encoder_decoder_encode", "encoder_decoder_logits"),
        message="flagged for review"),
    # ---- seq2seq_loss
    Variant("loss_on_the_unshifted_target", {LOSS: loss("""
    logits = model(src_ids, tgt_ids)   # the decoder reads the answer it must predict
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_ids.reshape(-1), ignore_index=pad_id)
""")}, loses=("seq2seq_loss_shifts_target", "seq2seq_loss_ignores_padding", "trained_model_learns"),
        message="not shifted"),
    Variant("loss_counts_the_padding", {LOSS: loss(SHIFTED + """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_ids.reshape(-1))
""")}, loses=("seq2seq_loss_ignores_padding",), message="counts the padding"),
    Variant("loss_averages_each_sentence_first", {LOSS: loss(SHIFTED + """
    per_token = F.cross_entropy(logits.transpose(1, 2), tgt_ids, reduction="none")   # (B, T)
    real = (tgt_ids != pad_id).float()
    return ((per_token * real).sum(1) / real.sum(1)).mean()
""")}, loses=("seq2seq_loss_ignores_padding",), message="each sentence"),
    Variant("loss_labels_are_the_decoder_input", {LOSS: loss(SHIFTED + """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), decoder_input.reshape(-1), ignore_index=pad_id)
""")}, loses=("seq2seq_loss_shifts_target", "seq2seq_loss_ignores_padding"), message="labels are the decoder input"),
    Variant("loss_wraps_the_course_reference", {LOSS: """
from courselib.seq2seq import seq2seq_loss as _loss


def seq2seq_loss(model, src_ids, tgt_ids, bos_id=BOS, pad_id=PAD):
    return _loss(model, src_ids, tgt_ids, bos_id, pad_id)
"""}, loses=("seq2seq_loss_shifts_target", "seq2seq_loss_ignores_padding"), message="flagged for review"),
    # ---- greedy_decode
    Variant("greedy_encodes_at_every_step", {GREEDY: greedy("""
    out = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_ids = model(src_ids, out)[:, -1].argmax(-1)      # forward encodes the source again
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        done = done | (next_ids == eos_id)
        if done.all():
            break
    return out[:, 1:]
""")}, loses=("greedy_decode_stops",), message="the encoder ran"),
    Variant("greedy_keeps_writing_after_eos", {GREEDY: greedy(GREEDY_LOOP + """
        next_ids = model.decode(out, memory, src_ids)[:, -1].argmax(-1)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        done = done | (next_ids == eos_id)
        if done.all():
            break
    return out[:, 1:]
""")}, loses=("greedy_decode_values",), message="kept generating after its [EOS]"),
    Variant("greedy_reads_the_first_position", {GREEDY: greedy(GREEDY_LOOP + """
        next_ids = model.decode(out, memory, src_ids)[:, 0].argmax(-1)
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        done = done | (next_ids == eos_id)
        if done.all():
            break
    return out[:, 1:]
""")}, loses=("greedy_decode_values",), message="last position"),
    Variant("greedy_always_runs_to_max_len", {GREEDY: greedy(GREEDY_LOOP + """
        next_ids = model.decode(out, memory, src_ids)[:, -1].argmax(-1)
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        done = done | (next_ids == eos_id)
    return out[:, 1:]
""")}, loses=("greedy_decode_stops", "greedy_decode_values"), message="stop as soon as all rows"),
    # Hard-coding the visible test's answer must earn nothing: the hidden tests decode other sources.
    Variant("greedy_hard_coded_visible_answer", {GREEDY: greedy("""
    rows = [[31, 8, 5, 3, 3, 4, 2, 0, 0, 0, 0], [4, 5, 14, 3, 6, 14, 5, 3, 5, 4, 2], [21, 4, 2, 0, 0, 0, 0, 0, 0, 0, 0]]
    return torch.tensor(rows)[:, :max_len]
""")}, loses=("greedy_decode_values", "greedy_decode_stops"), message="shape"),
    # ---- exact_match
    Variant("exact_match_compares_whole_rows", {MATCH: match("""
    width = max(predictions.shape[1], targets.shape[1])
    p = F.pad(predictions, (0, width - predictions.shape[1]), value=0)
    t = F.pad(targets, (0, width - targets.shape[1]), value=0)
    return (p == t).all(dim=1).float().mean().item()
""")}, loses=("exact_match_after_eos",), message="not part of the answer"),
    Variant("exact_match_counts_tokens", {MATCH: match("""
    width = min(predictions.shape[1], targets.shape[1])
    return (predictions[:, :width] == targets[:, :width]).float().mean().item()
""")}, loses=("exact_match_values",), message="matching tokens"),
    Variant("exact_match_accepts_answers_without_eos", {MATCH: match("""
    right = 0
    for p, t in zip(predictions.tolist(), targets.tolist()):
        answer = t[:t.index(eos_id)]                 # the target's tokens, [EOS] left out
        right += p[:len(answer)] == answer
    return right / len(targets)
""")}, loses=("exact_match_after_eos",), message="never produced [EOS]"),
    # ---- beam_search
    Variant("beam_compares_raw_sums_across_lengths", {BEAM: beam(BEAM_SEARCH + """
    tokens, total = max(finished, key=lambda f: f[1])      # the raw sum, whatever the lengths
    return tokens, total / len(tokens) ** length_penalty
""")}, loses=("beam_search_length_penalty",), message="unnormalised scores"),
    Variant("beam_counts_bos_in_the_length", {BEAM: beam(BEAM_SEARCH + """
    tokens, total = max(finished, key=lambda f: f[1] / (len(f[0]) + 1) ** length_penalty)
    return tokens, total / (len(tokens) + 1) ** length_penalty
""")}, loses=("beam_search_length_penalty",), message="[BOS] not"),
    Variant("beam_keeps_only_beam_width_live_by_topk_without_min", {BEAM: beam(
        BEAM_SEARCH.replace("topk(min(beam_width, candidates.numel()))", "topk(beam_width)") + """
    tokens, total = max(finished, key=lambda f: f[1] / len(f[0]) ** length_penalty)
    return tokens, total / len(tokens) ** length_penalty
""")}, loses=("beam_search_exhaustive",), message="min(beam_width"),
    Variant("beam_width_one_calls_the_course_greedy", {BEAM: beam("""
    if beam_width == 1:
        tokens = seq2seq.greedy_decode(model, src_ids, max_len, bos_id, eos_id)[0]
        log_probs = torch.log_softmax(model(src_ids, torch.cat([torch.tensor([[bos_id]]), tokens[None, :-1]], 1)).double(), -1)
        return tokens, log_probs[0, torch.arange(len(tokens)), tokens].sum().item()
""" + BEAM_SEARCH + """
    tokens, total = max(finished, key=lambda f: f[1] / len(f[0]) ** length_penalty)
    return tokens, total / len(tokens) ** length_penalty
""")}, loses=("beam_search_width_one_is_greedy",), message="flagged for review"),
    # ---- relative_position_bucket (optional stretch)
    Variant("bucket_forgets_the_direction_offset", {BUCKET: bucket("""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
""" + BUCKET_TAIL)}, loses=("stretch_relative_position_bucket_bidirectional",), message="upper half"),
    Variant("bucket_calls_t5_captured_early", {BUCKET: """
from transformers.models.t5.modeling_t5 import T5Attention

_t5_bucket = T5Attention._relative_position_bucket


def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5_bucket(relative_position, bidirectional, num_buckets, max_distance)
"""}, loses=("stretch_relative_position_bucket_bidirectional", "stretch_relative_position_bucket_causal"),
        message="flagged for review"),
]


ALTERNATIVES = [
    # Attention written out with einsum in a module of the learner's own (no MultiHeadAttention).
    Variant("decoder_layer_with_its_own_einsum_attention", {LAYER: '''
class EinsumAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.v_proj, self.out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        h = self.num_heads
        q = self.q_proj(query).unflatten(-1, (h, -1))                 # (B, T, h, d_head)
        k = self.k_proj(key).unflatten(-1, (h, -1))                   # (B, S, h, d_head)
        v = self.v_proj(value).unflatten(-1, (h, -1))
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhts,bshd->bthd", weights, v).flatten(-2)
        return self.out_proj(out), weights


class DecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn, self.cross_attn = EinsumAttention(d_model, num_heads), EinsumAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = LayerNorm(d_model, eps), LayerNorm(d_model, eps), LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        T = x.shape[1]
        self_mask = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask
        sublayers = [lambda h: self.self_attn(h, h, h, self_mask)[0],
                     lambda h: self.cross_attn(h, memory, memory, memory_padding_mask)[0],
                     self.ffn]
        for sublayer, norm in zip(sublayers, (self.norm1, self.norm2, self.norm3)):
            x = x + self.dropout(sublayer(norm(x))) if self.norm_first else norm(x + self.dropout(sublayer(x)))
        return x
'''}),
    # Split heads by hand on courselib's modules, the masks built with where and additive -inf.
    Variant("decoder_layer_split_heads_by_hand", {LAYER: "from courselib.attention import merge_heads, split_heads\n"
                                                  + LAYER_INIT + '''
    def attend(self, attention, query, memory, mask):
        h = attention.num_heads
        q = split_heads(attention.q_proj(query), h)
        k, v = split_heads(attention.k_proj(memory), h), split_heads(attention.v_proj(memory), h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores + torch.where(mask, 0.0, float("-inf")).to(scores.dtype)
        return attention.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        self_mask = torch.tril(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool))
        if tgt_padding_mask is not None:
            self_mask = torch.logical_and(self_mask, tgt_padding_mask)
        if self.norm_first:
            x = x + self.attend(self.self_attn, self.norm1(x), self.norm1(x), self_mask)
            x = x + self.attend(self.cross_attn, self.norm2(x), memory, memory_padding_mask)
            return x + self.ffn(self.norm3(x))
        x = self.norm1(x + self.attend(self.self_attn, x, x, self_mask))
        x = self.norm2(x + self.attend(self.cross_attn, x, memory, memory_padding_mask))
        return self.norm3(x + self.ffn(x))
'''}),
    # The model with masks built by comparison, and a loop over zip of layers.
    Variant("model_with_masks_by_comparison", {MODEL: MODEL_INIT + '''
    def encode(self, src_ids):
        keep = (src_ids != self.pad_id)[:, None, None, :]
        x = self.dropout(self.embed(src_ids) + self.src_positions.table.weight[:src_ids.shape[1]])
        for layer in self.encoder_layers:
            x = layer(x, mask=keep)
        return self.encoder_norm(x)

    def decode(self, tgt_in_ids, memory, src_ids):
        target_keep = (tgt_in_ids != self.pad_id).unsqueeze(1).unsqueeze(2)
        source_keep = (src_ids != self.pad_id).unsqueeze(1).unsqueeze(2)
        y = self.dropout(self.embed(tgt_in_ids) + self.tgt_positions(tgt_in_ids.shape[1]))
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_padding_mask=target_keep, memory_padding_mask=source_keep)
        return self.head(self.decoder_norm(y))
'''}),
    # The loss by hand: log-softmax, gather, and a masked mean.
    Variant("loss_by_gather_and_mask", {LOSS: loss("""
    decoder_input = tgt_ids.roll(1, dims=1)
    decoder_input[:, 0] = bos_id
    log_probs = torch.log_softmax(model(src_ids, decoder_input), dim=-1)           # (B, T, V)
    picked = log_probs.gather(-1, tgt_ids[..., None]).squeeze(-1)                  # (B, T)
    real = tgt_ids != pad_id
    return -(picked * real).sum() / real.sum()
""")}),
    # Greedy decoding one row at a time after one batched encode.
    Variant("greedy_row_by_row", {GREEDY: greedy("""
    memory = model.encode(src_ids)
    rows = []
    for i in range(src_ids.shape[0]):
        row = [bos_id]
        while len(row) <= max_len and row[-1] != eos_id:
            logits = model.decode(torch.tensor([row]), memory[i:i + 1], src_ids[i:i + 1])
            row.append(int(logits[0, -1].argmax()))
        rows.append(row[1:])
    width = max(len(row) for row in rows)
    return torch.tensor([row + [pad_id] * (width - len(row)) for row in rows])
""")}),
    Variant("exact_match_vectorised", {MATCH: match("""
    width = max(predictions.shape[1], targets.shape[1])
    p = F.pad(predictions, (0, width - predictions.shape[1]), value=-1)
    t = F.pad(targets, (0, width - targets.shape[1]), value=-1)
    before_eos = (t == eos_id).long().cumsum(1) - (t == eos_id).long() == 0     # the target's answer, [EOS] included
    return ((p == t) | ~before_eos).all(dim=1).double().mean().item()
""")}),
    # Beam search over Python lists, one hypothesis at a time, with sorted().
    Variant("beam_search_loop_over_hypotheses", {BEAM: beam("""
    memory = model.encode(src_ids)
    live, finished = [([bos_id], 0.0)], []
    for _ in range(max_len):
        candidates = []
        for tokens, score in live:
            logits = model.decode(torch.tensor([tokens]), memory, src_ids)[0, -1]
            log_probs = torch.log_softmax(logits.double(), dim=-1).tolist()
            candidates += [(tokens + [token], score + lp) for token, lp in enumerate(log_probs)]
        candidates = sorted(candidates, key=lambda c: c[1], reverse=True)[:beam_width]
        finished += [c for c in candidates if c[0][-1] == eos_id]
        live = [c for c in candidates if c[0][-1] != eos_id]
        if not live:
            break
    finished += live
    def final(c):
        return c[1] / (len(c[0]) - 1) ** length_penalty
    tokens, score = max(finished, key=final)
    return torch.tensor(tokens[1:]), final((tokens, score))
""")}),
    Variant("bucket_with_a_loop_in_float64", {BUCKET: bucket("""
    out = torch.empty_like(relative_position)
    half = num_buckets // 2 if bidirectional else num_buckets
    exact = half // 2
    for index, r in enumerate(relative_position.flatten().tolist()):
        offset = half if bidirectional and r > 0 else 0
        n = abs(r) if bidirectional else max(-r, 0)
        if n < exact:
            b = n
        else:
            b = min(half - 1, exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact)))
        out.view(-1)[index] = offset + b
    return out
""")}),
    # Correct answers whose libraries warn on stderr lose nothing.
    Variant("loss_and_exact_match_noisy_on_stderr", {
        LOSS: loss(WARN_AND_PRINT + SHIFTED + """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_ids.reshape(-1), ignore_index=pad_id)
"""),
        MATCH: match(WARN_AND_PRINT + """
    def answer(row):
        row = row.tolist()
        return row[:row.index(eos_id) + 1] if eos_id in row else row
    return sum(answer(p) == answer(t) for p, t in zip(predictions, targets)) / len(targets)
""")}),
]
