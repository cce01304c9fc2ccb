"""Mutants and alternative correct answers for 10_encoder_decoder."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "10_encoder_decoder"
LAYER = "decoder_layer_answer"
MODEL = "encoder_decoder_answer"
LOSS = "seq2seq_loss_answer"
GREEDY = "greedy_decode_answer"
MATCH = "exact_match_answer"
BEAM = "beam_search_answer"
SMOOTH = "smoothed_cross_entropy_answer"
CACHE = "decode_with_cache_answer"
REORDER = "reorder_cache_answer"
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
            "length_penalty=1.0):\n" + body)


# The reference's search, with @places@ that a mutant changes: LENGTH (what a final score divides by),
# FINISH (which extensions may finish), LIVE (which extensions stay live), STOP (the stopping rule).
BEAM_SEARCH = """
    memory = model.encode(src_ids)
    live = torch.full((1, 1), bos_id, dtype=torch.long)
    live_scores = torch.zeros(1, dtype=torch.float64)
    finished = []
    for t in range(1, max_len + 1):
        k = live.shape[0]
        logits = model.decode(live, memory.expand(k, -1, -1), src_ids.expand(k, -1))
        log_probs = torch.log_softmax(logits[:, -1].double(), dim=-1)
        scores, order = (live_scores[:, None] + log_probs).flatten().sort(descending=True)
        rows, tokens = order // log_probs.shape[1], order % log_probs.shape[1]
        grown = torch.cat([live[rows], tokens[:, None]], dim=1)
        ends = (tokens == eos_id) | (t == max_len)
        top = torch.arange(len(tokens)) < beam_width
        may_finish = @FINISH@
        finished += [(score.item() / @LENGTH@ ** length_penalty, seq[1:])
                     for seq, score in zip(grown[may_finish], scores[may_finish])]
        finished = sorted(finished, key=lambda f: -f[0])[:beam_width]
        stay = @LIVE@
        live, live_scores = grown[stay][:beam_width], scores[stay][:beam_width]
        if t == max_len or len(live) == 0:
            break
        if @STOP@:
            break
    score, tokens = finished[0]
    return tokens, score
"""


RIGHT_BEAM = {"FINISH": "ends & top", "LENGTH": "t", "LIVE": "~ends",
              "STOP": "len(finished) == beam_width and live_scores[0].item() / t ** length_penalty <= finished[-1][0]"}


def filled(template, right, changes):
    """`template` with each @PLACE@ replaced by the right code, or by the mutant's `changes`."""
    for place, code in {**right, **changes}.items():
        template = template.replace(f"@{place}@", code)
    return template


def beam_with(**changes):
    return beam(filled(BEAM_SEARCH, RIGHT_BEAM, changes))


# ------------------------------------------------------------------ smoothed_cross_entropy
def smooth(body):
    return "def smoothed_cross_entropy(logits, targets, epsilon, ignore_index=PAD):\n" + body


SMOOTH_PARTS = """
    keep = targets != ignore_index
    log_probs = torch.log_softmax(logits[keep], dim=-1)
    right = -log_probs.gather(1, targets[keep][:, None]).squeeze(1)
    V = logits.shape[-1]
"""


# ------------------------------------------------------------------ decode_with_cache
def cached(body):
    return "def decode_with_cache(model, new_ids, memory, src_ids, cache):\n" + body


# The reference's cached pass, with named places that a mutant changes.
CACHED = """
    past = 0 if cache[0] is None else cache[0][0].shape[2]
    y = model.dropout(model.embed(new_ids) + model.tgt_positions(new_ids, start=@START@))
    self_mask = @MASK@
    source_keep = padding_mask(src_ids, model.pad_id)
    for i, layer in enumerate(model.decoder_layers):
        attention, cross, heads = layer.self_attn, layer.cross_attn, layer.self_attn.num_heads
        h = layer.norm1(y)
        q, k, v = (split_heads(p(h), heads) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        if @CROSS_ONCE@:
            cross_k = split_heads(cross.k_proj(memory), heads)
            cross_v = split_heads(cross.v_proj(memory), heads)
        else:
            past_k, past_v, cross_k, cross_v = cache[i]
        if cache[i] is not None:
            k, v = @GROW@
        cache[i] = (@STORE@, cross_k, cross_v)
        attended, _ = scaled_dot_product_attention(q, @KEYS@, self_mask)
        y = y + layer.dropout(attention.out_proj(merge_heads(attended)))
        g = layer.norm2(y)
        @CROSS_EXTRA@
        attended, _ = scaled_dot_product_attention(split_heads(cross.q_proj(g), heads), cross_k, cross_v, @CROSS_MASK@)
        y = y + layer.dropout(cross.out_proj(merge_heads(attended)))
        y = y + layer.dropout(layer.ffn(layer.norm3(y)))
    return model.head(model.decoder_norm(y))
"""


RIGHT_CACHED = {"START": "past", "MASK": "causal_mask(past + new_ids.shape[1])[past:]", "CROSS_ONCE": "cache[i] is None",
                "GROW": "torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)", "STORE": "k, v",
                "KEYS": "k, v", "CROSS_EXTRA": "pass", "CROSS_MASK": "source_keep"}


def cached_with(**changes):
    return cached(filled(CACHED, RIGHT_CACHED, changes))


# ------------------------------------------------------------------ reorder_cache
def reorder(body):
    return "def reorder_cache(cache, beam_idx):\n" + body


REORDER_TESTS = ("reorder_cache_rows", "reorder_cache_in_beam_search")


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
""")}, loses=("seq2seq_loss_shifts_target", "seq2seq_loss_ignores_padding", "trained_model_translates"),
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
    Variant("beam_shrinks_as_hypotheses_finish", {BEAM: beam_with(LIVE="~ends & top")},
            loses=("beam_search_keeps_k_live",), message="beam shrank"),
    Variant("beam_compares_raw_sums_across_lengths", {BEAM: beam_with(LENGTH="1")},
            loses=("beam_search_length_penalty", "beam_search_keeps_k_live"), message="unnormalised scores"),
    Variant("beam_counts_bos_in_the_length", {BEAM: beam_with(LENGTH="(t + 1)")},
            loses=("beam_search_length_penalty", "beam_search_values"), message="[BOS]"),
    Variant("beam_ignores_the_stopping_rule", {BEAM: beam_with(STOP="False")},
            loses=("beam_search_stopping",), message="went on after the stopping rule"),
    Variant("beam_lets_only_eos_finish_at_max_len", {BEAM: beam_with(
        FINISH="(tokens == eos_id) & top", LIVE="tokens != eos_id").replace(
        "    score, tokens = finished[0]", "    if not finished:\n        return live[0, 1:], live_scores[0].item() / "
        "(live.shape[1] - 1) ** length_penalty\n    score, tokens = finished[0]")},
        loses=("beam_search_stopping",), message="all finish, [EOS] or not"),
    Variant("beam_finishes_every_eos_extension", {BEAM: beam_with(FINISH="ends")},
            loses=("beam_search_keeps_k_live",), message="not among the beam_width best"),
    Variant("beam_sorts_with_topk_of_twice_the_width", {BEAM: beam_with().replace(
        ".flatten().sort(descending=True)", ".flatten().topk(2 * beam_width)")},
        loses=("beam_search_exhaustive",), message="keeps them all"),
    Variant("beam_calls_transformers_generate", {BEAM: beam("""
    tokens, score = seq2seq.transformers_beam_search(model, src_ids, beam_width, max_len, length_penalty, bos_id,
                                                     eos_id)
    return tokens, score
""")}, loses=("beam_search_values", "beam_search_keeps_k_live"), message="flagged for review"),
    Variant("beam_width_one_calls_the_course_greedy", {BEAM: beam("""
    if beam_width == 1:
        tokens = seq2seq.greedy_decode(model, src_ids, max_len, bos_id, eos_id)[0]
        log_probs = torch.log_softmax(model(src_ids, torch.cat([torch.tensor([[bos_id]]), tokens[None, :-1]], 1)).double(), -1)
        return tokens, log_probs[0, torch.arange(len(tokens)), tokens].sum().item() / len(tokens) ** length_penalty
""" + beam_with()[beam_with().index("\n    memory"):])}, loses=("beam_search_width_one_is_greedy",), message="flagged for review"),
    # Hard-coding the visible tests' answers must earn nothing: the hidden tests search other models.
    Variant("beam_hard_coded_visible_answers", {BEAM: beam("""
    answers = {  # (first step's table, beam_width, max_len, length_penalty): what the visible tests expect
        ("tricky", 1, 5, 0.0): ([4, 7, 2], math.log(0.40 * 0.28)),
        ("tricky", 2, 5, 0.0): ([5, 12, 10, 2], math.log(0.35 * 0.48 * 0.55)),
        ("tricky", 3, 5, 0.0): ([6, 3, 2], math.log(0.25)),
        ("tricky", 2, 5, 1.0): ([5, 12, 10, 2], math.log(0.35 * 0.48 * 0.55) / 4),
        ("tricky", 3, 5, 1.0): ([6, 3, 2], math.log(0.25) / 3),
        ("refill", 2, 5, 1.0): ([7, 8, 2], math.log(0.25) / 3),
        ("wordy", 2, 6, 0.0): ([2], math.log(0.45)),
        ("wordy", 2, 6, 1.0): ([5, 3, 3, 2], math.log(0.5 * 0.7 ** 3) / 4),
        ("patient", 2, 6, 1.0): ([2], math.log(0.5)),
        ("wordy", 2, 3, 1.0): ([5, 3, 3], math.log(0.5 * 0.7 * 0.7) / 3),
        ("tricky", 500, 4, 1.0): ([6, 3, 2], math.log(0.25) / 3),
    }
    names = {0.40: "tricky", 0.45: "wordy", 0.5: "patient"}
    table = getattr(model, "table", {})
    first = table.get((), {}) if isinstance(table, dict) else {}
    name = "refill" if first.get("4") == 0.25 else names.get(first.get("1", first.get("[EOS]")), "")
    tokens, score = answers.get((name, beam_width, max_len, length_penalty), ([eos_id], 0.0))
    return torch.tensor(tokens), score
""")}, loses=("beam_search_width_one_is_greedy", "beam_search_values", "beam_search_keeps_k_live"),
        message="beam_search returned"),
    # ---- smoothed_cross_entropy
    Variant("smoothing_over_the_v_minus_1_wrong_tokens", {SMOOTH: smooth(SMOOTH_PARTS + """
    wrong = -log_probs.sum(-1) - right
    return ((1 - epsilon) * right + epsilon * wrong / (V - 1)).mean()
""")}, loses=("smoothed_cross_entropy_values",), message="V - 1"),
    Variant("smoothing_counts_the_padding", {SMOOTH: smooth(SMOOTH_PARTS + """
    return ((1 - epsilon) * right - epsilon * log_probs.mean(-1)).sum() / len(targets)
""")}, loses=("smoothed_cross_entropy_ignores_padding", "smoothed_cross_entropy_values"),
        message="divided by every row"),
    Variant("smoothing_applied_to_the_log_probs", {SMOOTH: smooth(SMOOTH_PARTS + """
    return ((1 - epsilon) * right - epsilon / V).mean()
""")}, loses=("smoothed_cross_entropy_values",), message="smoothed the log-probabilities"),
    Variant("smoothing_gathers_before_dropping_ignored_rows", {SMOOTH: smooth("""
    log_probs = torch.log_softmax(logits, dim=-1)
    right = -log_probs.gather(1, targets[:, None]).squeeze(1)
    keep = (targets != ignore_index).double()
    return (((1 - epsilon) * right - epsilon * log_probs.mean(-1)) * keep).sum() / keep.sum()
""")}, loses=("smoothed_cross_entropy_ignores_padding",), message="select the rows"),
    Variant("smoothing_calls_f_cross_entropy", {SMOOTH: smooth("""
    return F.cross_entropy(logits, targets, label_smoothing=epsilon, ignore_index=ignore_index)
""")}, loses=("smoothed_cross_entropy_values", "smoothed_cross_entropy_ignores_padding"),
        message="flagged for review"),
    Variant("smoothing_hard_coded_visible_answers", {SMOOTH: smooth("""
    answers = {(0.0, 0): 6.858233451843262, (0.1, 0): 6.727940082550049, (0.3, 0): 6.467352867126465,
               (0.2, -100): 4.170465469360352}
    return torch.tensor(answers.get((epsilon, ignore_index), 1.0))
""")}, loses=("smoothed_cross_entropy_values", "smoothed_cross_entropy_ignores_padding"), message="is wrong"),
    # ---- decode_with_cache
    Variant("cache_cross_attention_from_the_decoder_stream", {CACHE: cached_with(
        CROSS_EXTRA="cross_k, cross_v = split_heads(cross.k_proj(g), heads), split_heads(cross.v_proj(g), heads)",
        CROSS_MASK="None")}, loses=("decode_with_cache_matches_decode",), message="decoder's own stream"),
    Variant("cache_cross_attention_projected_at_every_call", {CACHE: cached_with(CROSS_ONCE="True").replace(
        "        else:\n            past_k, past_v, cross_k, cross_v = cache[i]\n",
        "        if cache[i] is not None:\n            past_k, past_v = cache[i][:2]\n")},
        loses=("decode_with_cache_cross_once",), message="computed once"),
    Variant("cache_no_causal_mask_for_several_new_tokens", {CACHE: cached_with(MASK="None")},
            loses=("decode_with_cache_chunks",), message="causal mask"),
    Variant("cache_positions_restart_at_zero", {CACHE: cached_with(START="0")},
            loses=("decode_with_cache_matches_decode", "decode_with_cache_chunks"), message="restart at 0"),
    Variant("cache_does_not_grow", {CACHE: cached_with(GROW="k, v")},
            loses=("decode_with_cache_shapes", "decode_with_cache_matches_decode"), message="must grow"),
    Variant("cache_calls_the_model_decode", {CACHE: cached("""
    past = 0 if cache[0] is None else cache[0][0].shape[2]
    prefix = new_ids if past == 0 else torch.cat([cache[0][0][:, 0, :, 0].long(), new_ids], dim=1)
    logits = model.decode(prefix, memory, src_ids)[:, past:]   # recomputes every position
    for i in range(len(cache)):
        cache[i] = (prefix[:, None, :, None].double(), prefix[:, None, :, None].double(), memory, memory)
    return logits
""")}, loses=("decode_with_cache_matches_decode",), message="flagged for review"),
    Variant("cache_hard_coded_visible_shapes", {CACHE: cached("""
    past = 0 if cache[0] is None else cache[0][0].shape[2]
    B, T_new = new_ids.shape
    for i in range(len(cache)):          # the visible test's sizes: 4 heads of 4, 5 source positions, 20 tokens
        cache[i] = (torch.zeros(B, 4, past + T_new, 4), torch.zeros(B, 4, past + T_new, 4), torch.zeros(B, 4, 5, 4),
                    torch.zeros(B, 4, 5, 4))
    return torch.zeros(B, T_new, 20)
""")}, loses=("decode_with_cache_shapes", "decode_with_cache_matches_decode"), message="logits of"),
    # ---- reorder_cache (issue 37's known bugs: not every layer, the self-attention's cache only, the wrong dim)
    Variant("reorder_only_the_first_layer", {REORDER: reorder("""
    first = tuple(tensor.index_select(0, beam_idx) for tensor in cache[0])
    return [first] + list(cache[1:])
""")}, loses=REORDER_TESTS, message="every layer"),
    Variant("reorder_the_self_attention_cache_only", {REORDER: reorder("""
    return [(keys[beam_idx], values[beam_idx], cross_keys, cross_values)
            for keys, values, cross_keys, cross_values in cache]
""")}, loses=REORDER_TESTS, message="cross-attention keys came back in their old order"),
    Variant("reorder_the_keys_but_not_the_values", {REORDER: reorder("""
    return [(keys[beam_idx], values, cross_keys[beam_idx], cross_values[beam_idx])
            for keys, values, cross_keys, cross_values in cache]
""")}, loses=REORDER_TESTS, message="move together"),
    Variant("reorder_along_the_heads", {REORDER: reorder("""
    return [tuple(tensor.index_select(1, beam_idx) for tensor in entry) for entry in cache]
""")}, loses=REORDER_TESTS, message="dim 1, the heads"),
    Variant("reorder_writes_into_the_given_cache", {REORDER: reorder("""
    new = []
    for entry in cache:
        tensors = []
        for tensor in entry:
            if tensor.shape[0] == len(beam_idx):
                tensors.append(tensor.copy_(tensor[beam_idx]))    # the caller's tensor, overwritten
            else:
                tensors.append(tensor[beam_idx])
        new.append(tuple(tensors))
    return new
""")}, loses=("reorder_cache_rows",), message="changed the tensors it was given"),
    # Hard-coding the visible test's order must earn nothing: the hidden tests draw other beam_idx.
    Variant("reorder_hard_coded_visible_order", {REORDER: reorder("""
    order = torch.tensor([2, 2, 0, 1])
    return [tuple(tensor[order[:len(beam_idx)] % tensor.shape[0]] for tensor in entry) for entry in cache]
""")}, loses=REORDER_TESTS, message="reorder_cache"),
    Variant("reorder_calls_transformers_cache", {REORDER: reorder("""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    self_cache, cross_cache = DynamicCache(), DynamicCache()
    for i, (keys, values, cross_keys, cross_values) in enumerate(cache):
        self_cache.update(keys, values, i)
        cross_cache.update(cross_keys, cross_values, i)
    both = EncoderDecoderCache(self_cache, cross_cache)
    both.reorder_cache(beam_idx)
    return [(both.self_attention_cache.layers[i].keys, both.self_attention_cache.layers[i].values,
             both.cross_attention_cache.layers[i].keys, both.cross_attention_cache.layers[i].values)
            for i in range(len(cache))]
""")}, loses=REORDER_TESTS, message="flagged for review"),
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
    # Beam search over Python lists, one hypothesis at a time, with sorted() and a walk down the ranking.
    Variant("beam_search_loop_over_hypotheses", {BEAM: beam("""
    memory = model.encode(src_ids)
    live, finished = [([bos_id], 0.0)], []
    for t in range(1, max_len + 1):
        candidates = []
        for tokens, score in live:
            logits = model.decode(torch.tensor([tokens]), memory, src_ids)[0, -1]
            log_probs = torch.log_softmax(logits.double(), dim=-1).tolist()
            candidates += [(tokens + [token], score + lp) for token, lp in enumerate(log_probs)]
        candidates.sort(key=lambda c: c[1], reverse=True)
        live = []
        for rank, (tokens, score) in enumerate(candidates):
            if tokens[-1] == eos_id or t == max_len:
                if rank < beam_width:
                    finished.append((score / t ** length_penalty, tokens[1:]))
            elif len(live) < beam_width:
                live.append((tokens, score))
            if rank >= beam_width and len(live) == beam_width:
                break
        finished = sorted(finished, reverse=True, key=lambda f: f[0])[:beam_width]
        if t == max_len or (len(finished) == beam_width and live[0][1] / t ** length_penalty <= finished[-1][0]):
            break
    score, tokens = finished[0]
    return torch.tensor(tokens), score
""")}),
    # Beam search as transformers writes it: the 2 * beam_width best extensions by topk, then a second topk for
    # the live ones (finished ones pushed to -inf), finished hypotheses kept in tensors.
    Variant("beam_search_two_topks_like_transformers", {BEAM: beam("""
    memory = model.encode(src_ids)
    live = torch.full((1, 1), bos_id, dtype=torch.long)
    live_scores = torch.zeros(1, dtype=torch.float64)
    done_tokens, done_scores = [], torch.empty(0, dtype=torch.float64)
    for t in range(1, max_len + 1):
        k = live.shape[0]
        log_probs = torch.log_softmax(model.decode(live, memory.expand(k, -1, -1), src_ids.expand(k, -1))[:, -1].double(), -1)
        flat = (live_scores[:, None] + log_probs).flatten()
        best, index = flat.topk(min(2 * beam_width, flat.numel()))
        grown = torch.cat([live[index // log_probs.shape[1]], (index % log_probs.shape[1])[:, None]], dim=1)
        ends = (grown[:, -1] == eos_id) | (t == max_len)
        first = ends & (torch.arange(len(best)) < beam_width)
        done_tokens += [row[1:] for row in grown[first]]
        done_scores = torch.cat([done_scores, best[first] / t ** length_penalty])
        keep = done_scores.argsort(descending=True)[:beam_width]
        done_tokens, done_scores = [done_tokens[i] for i in keep.tolist()], done_scores[keep]
        running = torch.where(ends, torch.tensor(float("-inf"), dtype=torch.float64), best)
        order = running.argsort(descending=True)[:beam_width]
        order = order[running[order] > float("-inf")]
        live, live_scores = grown[order], best[order]
        if t == max_len or len(live) == 0:
            break
        if len(done_tokens) == beam_width and live_scores[0] / t ** length_penalty <= done_scores.min():
            break
    return done_tokens[0], done_scores[0].item()
""")}),
    # The smoothed loss as the full target distribution q, dotted with the log-probabilities.
    Variant("smoothing_with_the_target_distribution", {SMOOTH: smooth("""
    rows = (targets != ignore_index).nonzero().squeeze(1)
    V = logits.shape[-1]
    q = torch.full((len(rows), V), epsilon / V, dtype=logits.dtype)
    q[torch.arange(len(rows)), targets[rows]] += 1 - epsilon
    return -(q * torch.log_softmax(logits[rows], dim=-1)).sum(dim=-1).mean()
""")}),
    # The smoothed loss from F.nll_loss (not the oracle) and a masked mean of the uniform part.
    Variant("smoothing_with_nll_loss", {SMOOTH: smooth("""
    log_probs = F.log_softmax(logits, dim=-1)
    nll = F.nll_loss(log_probs, targets, ignore_index=ignore_index)
    keep = targets != ignore_index
    uniform = -log_probs[keep].mean(dim=-1).mean()
    return (1 - epsilon) * nll + epsilon * uniform
""")}),
    # The cached pass with the attention written out in einsum, the caches kept as the four-tuple built at the end.
    Variant("cache_with_einsum_attention", {CACHE: cached("""
    T_past = cache[0][0].shape[2] if cache[0] is not None else 0
    B, T_new = new_ids.shape
    y = model.embed(new_ids) + model.tgt_positions.table.weight[T_past:T_past + T_new]
    allowed = torch.arange(T_past + T_new)[None, :] <= torch.arange(T_past, T_past + T_new)[:, None]   # (T_new, T)
    source_real = (src_ids != model.pad_id)[:, None, None, :]

    def heads_of(x, h):
        return x.reshape(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3)

    def attend(q, k, v, allowed):
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        out = torch.einsum("bhqk,bhkd->bhqd", weights, v)
        return out.permute(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)

    for i, layer in enumerate(model.decoder_layers):
        h = layer.self_attn.num_heads
        x = layer.norm1(y)
        q = heads_of(layer.self_attn.q_proj(x), h)
        k_new, v_new = heads_of(layer.self_attn.k_proj(x), h), heads_of(layer.self_attn.v_proj(x), h)
        if cache[i] is None:
            k, v = k_new, v_new
            cross_k, cross_v = heads_of(layer.cross_attn.k_proj(memory), h), heads_of(layer.cross_attn.v_proj(memory), h)
        else:
            k, v = torch.cat((cache[i][0], k_new), 2), torch.cat((cache[i][1], v_new), 2)
            cross_k, cross_v = cache[i][2], cache[i][3]
        y = y + layer.self_attn.out_proj(attend(q, k, v, allowed))
        q = heads_of(layer.cross_attn.q_proj(layer.norm2(y)), h)
        y = y + layer.cross_attn.out_proj(attend(q, cross_k, cross_v, source_real))
        y = y + layer.ffn(layer.norm3(y))
        cache[i] = (k, v, cross_k, cross_v)
    return model.head(model.decoder_norm(y))
""")}),
    # The cached pass with torch's fused attention (not the oracle) and the layers' own attention modules' weights.
    Variant("cache_with_torch_sdpa", {CACHE: cached("""
    past = 0 if cache[0] is None else cache[0][0].size(2)
    y = model.embed(new_ids) + model.tgt_positions(new_ids, start=past)
    n = new_ids.shape[1]
    self_mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)
    source_keep = padding_mask(src_ids, model.pad_id)
    for i, layer in enumerate(model.decoder_layers):
        heads = layer.self_attn.num_heads
        x = layer.norm1(y)
        attention = layer.self_attn
        q, k, v = (split_heads(projection(x), heads) for projection in (attention.q_proj, attention.k_proj,
                                                                         attention.v_proj))
        entry = cache[i]
        if entry is None:
            entry = (k[:, :, :0], v[:, :, :0], split_heads(layer.cross_attn.k_proj(memory), heads),
                     split_heads(layer.cross_attn.v_proj(memory), heads))
        k, v = torch.cat([entry[0], k], 2), torch.cat([entry[1], v], 2)
        cache[i] = (k, v, entry[2], entry[3])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self_mask)
        y = y + layer.self_attn.out_proj(merge_heads(out))
        q = split_heads(layer.cross_attn.q_proj(layer.norm2(y)), heads)
        out = F.scaled_dot_product_attention(q, entry[2], entry[3], attn_mask=source_keep)
        y = y + layer.cross_attn.out_proj(merge_heads(out))
        y = y + layer.ffn(layer.norm3(y))
    return model.head(model.decoder_norm(y))
""")}),
    Variant("reorder_by_indexing_in_a_loop", {REORDER: reorder("""
    reordered = []
    for layer_cache in cache:
        reordered.append(tuple(tensor[beam_idx] for tensor in layer_cache))
    return reordered
""")}),
    Variant("reorder_by_stacking_rows", {REORDER: reorder("""
    rows = beam_idx.tolist()
    return [tuple(torch.stack([tensor[row] for row in rows]) for tensor in entry) for entry in cache]
""")}),
    Variant("reorder_with_gather", {REORDER: reorder("""
    def gather_rows(tensor):
        index = beam_idx.view(-1, 1, 1, 1).expand(len(beam_idx), *tensor.shape[1:])
        return torch.gather(tensor, 0, index)
    return [tuple(gather_rows(tensor) for tensor in entry) for entry in cache]
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
