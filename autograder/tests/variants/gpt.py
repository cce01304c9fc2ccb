"""Mutants and alternative correct answers for 09_gpt."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "09_gpt"
BLOCK, MODEL, LOSS, PPL = "decoder_block_answer", "gpt_answer", "lm_loss_answer", "perplexity_answer"
LOADER, TRAIN, TOP_K, TOP_P = "load_gpt2_weights_answer", "train_answer", "top_k_filter_answer", "top_p_filter_answer"
SAMPLE, GENERATE, CACHE = "sample_next_answer", "generate_answer", "forward_with_cache_answer"
BYTES, SPECULATIVE = "kv_cache_bytes_answer", "speculative_generate_answer"

BLOCK_INIT = '''
class DecoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="{approximate}")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
'''


def block(forward, approximate="tanh"):
    return BLOCK_INIT.format(approximate=approximate) + forward


GPT_INIT = '''
class GPT(nn.Module):
    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None, dropout=0.0, eps=1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale={scale})
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, num_heads, d_ff or 4 * d_model, dropout, eps)
                                    for _ in range(num_layers))
        self.final_norm = LayerNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
{tie}        self.apply(gpt2_init)

    def forward(self, input_ids):
'''
TIED = "        self.lm_head.weight = self.token_embeddings.weight\n"
GPT_FORWARD = '''        x = self.dropout(self.token_embeddings(input_ids) + self.position_embeddings(input_ids))
        for block in self.blocks:
            x = block(x)
        return self.lm_head({final})
'''


def gpt(scale="False", tie=TIED, final="self.final_norm(x)"):
    return GPT_INIT.format(scale=scale, tie=tie) + GPT_FORWARD.format(final=final)


def loss(body):
    return "def lm_loss(logits, input_ids):\n" + body


def ppl(body):
    return "@torch.no_grad()\ndef perplexity(model, batches):\n" + body


LOADER_HEAD = '''
def load_gpt2_weights(model, hf):
    transformer = getattr(hf, "transformer", hf)
    with torch.no_grad():
        model.token_embeddings.embedding.weight.copy_(transformer.wte.weight)
        model.position_embeddings.table.weight.copy_(transformer.wpe.weight)
        for ours, theirs in {zip_blocks}:
            for norm, their_norm in ((ours.norm1, theirs.ln_1), (ours.norm2, theirs.ln_2)):
                norm.weight.copy_(their_norm.weight)
                norm.bias.copy_(their_norm.bias)
            attn = ours.self_attn
'''
LOADER_ATTENTION_RIGHT = '''            for linear, weight, bias in zip((attn.q_proj, attn.k_proj, attn.v_proj),
                                            theirs.attn.c_attn.weight.T.chunk(3), theirs.attn.c_attn.bias.chunk(3)):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
'''
LOADER_TAIL = '''            for linear, conv in ((attn.out_proj, theirs.attn.c_proj),
                                 (ours.ffn.linear1, theirs.mlp.c_fc), (ours.ffn.linear2, theirs.mlp.c_proj)):
                linear.weight.copy_({conv_weight})
                linear.bias.copy_(conv.bias)
        model.final_norm.weight.copy_(transformer.ln_f.weight)
        model.final_norm.bias.copy_(transformer.ln_f.bias)
    return model
'''


def loader(zip_blocks="zip(model.blocks, transformer.h, strict=True)", attention=LOADER_ATTENTION_RIGHT,
           conv_weight="conv.weight.T"):
    return LOADER_HEAD.format(zip_blocks=zip_blocks) + attention + LOADER_TAIL.format(conv_weight=conv_weight)


TRAIN_HEAD = "def train(model, optimizer, batches, held_out, eval_every=50, plot=None):\n"
TRAIN_RIGHT = '''
    losses, held_out_losses = [], []
    for step, batch in enumerate(batches, start=1):
        model.train()
        loss = lm_loss(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % eval_every == 0 or step == len(batches):
            model.eval()
            with torch.no_grad():
                held_out_losses.append((step, lm_loss(model(held_out), held_out).item()))
    model.eval()
    return losses, held_out_losses
'''


def train(body=TRAIN_RIGHT, **replacements):
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return TRAIN_HEAD + body


def top_k(body):
    return "def top_k_filter(logits, k):\n" + body


def top_p(body):
    return "def top_p_filter(logits, p):\n" + body


TOP_P_CHECK = '''
    if not 0 < p <= 1:
        raise ValueError(f"top-p needs 0 < p <= 1, got {p}")
'''


def sample(body):
    return "def sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None):\n" + body


SAMPLE_FILTERS = '''
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
'''


def gen(body):
    return ("@torch.no_grad()\ndef generate(model, input_ids, max_new_tokens, generator=None, temperature=0.0, "
            "top_k=None, top_p=None):\n" + body)


GENERATE_CHECK = '''
    if input_ids.shape[1] + max_new_tokens - 1 > model.max_positions:
        raise ValueError("the prompt and the new tokens do not fit in the context window")
'''

CACHE_HEAD = "def forward_with_cache(model, input_ids, cache):\n"
CACHE_RIGHT = '''
    past = 0 if cache[0] is None else cache[0][0].shape[2]
    x = model.token_embeddings(input_ids) + model.position_embeddings(input_ids, start=past)
    x = model.dropout(x)
    for i, block in enumerate(model.blocks):
        attn = block.self_attn
        h = block.norm1(x)
        q = split_heads(attn.q_proj(h), attn.num_heads)
        k = split_heads(attn.k_proj(h), attn.num_heads)
        v = split_heads(attn.v_proj(h), attn.num_heads)
        if cache[i] is not None:
            k = torch.cat([cache[i][0], k], dim=2)
            v = torch.cat([cache[i][1], v], dim=2)
        cache[i] = (k, v)
        mask = causal_mask(k.shape[2], x.device)[past:]
        attended, _ = scaled_dot_product_attention(q, k, v, mask)
        x = x + block.dropout(attn.out_proj(merge_heads(attended)))
        x = x + block.dropout(block.ffn(block.norm2(x)))
    return model.lm_head(model.final_norm(x))
'''


def cache(body=CACHE_RIGHT, **replacements):
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return CACHE_HEAD + body


def kv_bytes(body):
    return "def kv_cache_bytes(num_layers, num_kv_heads, d_head, seq_len, batch_size=1, bytes_per_value=4):\n" + body


SPECULATIVE_HEAD = ("@torch.no_grad()\ndef speculative_generate(target, draft, input_ids, max_new_tokens, "
                    "num_draft=4):\n")

MUTANTS = [
    # ---- DecoderBlock
    Variant("block_mask_sees_the_next_token", {BLOCK: block('''
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril(1)
        x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])
        return x + self.dropout(self.ffn(self.norm2(x)))
''')}, loses=("decoder_block_is_causal", "decoder_block_matches_gpt2"), message="see the next one"),
    Variant("block_without_a_mask", {BLOCK: block('''
        x = x + self.dropout(self.self_attn(self.norm1(x))[0])
        return x + self.dropout(self.ffn(self.norm2(x)))
''')}, loses=("decoder_block_is_causal", "decoder_block_matches_gpt2"), message="not causal"),
    Variant("block_post_ln", {BLOCK: block('''
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=causal_mask(x.shape[1]))[0]))
        return self.norm2(x + self.dropout(self.ffn(x)))
''')}, loses=("decoder_block_matches_gpt2",), message="post-LN"),
    Variant("block_exact_gelu", {BLOCK: block('''
        x = x + self.dropout(self.self_attn(self.norm1(x), mask=causal_mask(x.shape[1]))[0])
        return x + self.dropout(self.ffn(self.norm2(x)))
''', approximate="none")}, loses=("decoder_block_matches_gpt2",), message="tanh approximation"),
    Variant("block_built_on_the_course_encoder_layer", {BLOCK: '''
from courselib.blocks import EncoderLayer as _Layer

class DecoderBlock(_Layer):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first=True, eps=eps, approximate="tanh")

    def forward(self, x):
        return super().forward(x, causal_mask(x.shape[1]))
'''}, loses=("decoder_block_structure", "decoder_block_matches_gpt2", "decoder_block_is_causal"),
        message="flagged for review"),
    # ---- GPT
    Variant("gpt_untied_head", {MODEL: gpt(tie="")}, loses=("gpt_head_is_tied",), message="not tied"),
    Variant("gpt_scales_the_embeddings", {MODEL: gpt(scale="True")}, loses=("gpt_matches_gpt2",), message="√d_model"),
    Variant("gpt_without_final_norm", {MODEL: gpt(final="x")}, loses=("gpt_matches_gpt2",),
            message="final LayerNorm is missing"),
    # ---- lm_loss
    Variant("loss_without_the_shift", {LOSS: loss('''
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), input_ids.reshape(-1))
''')}, loses=("lm_loss_values",), message="at t itself"),
    Variant("loss_shifted_the_wrong_way", {LOSS: loss('''
    return F.cross_entropy(logits[:, 1:].reshape(-1, logits.shape[-1]), input_ids[:, :-1].reshape(-1))
''')}, loses=("lm_loss_values",), message="wrong way"),
    Variant("loss_from_the_oracle_captured_early", {LOSS: '''
from transformers.loss.loss_utils import ForCausalLMLoss as _causal_lm_loss

def lm_loss(logits, input_ids):
    return _causal_lm_loss(logits, input_ids, vocab_size=logits.shape[-1])
'''}, loses=("lm_loss_values",), message="flagged for review"),
    # ---- perplexity
    Variant("perplexity_averages_batch_perplexities", {PPL: ppl('''
    model.eval()
    return sum(math.exp(lm_loss(model(ids), ids).item()) for ids in batches) / len(batches)
''')}, loses=("perplexity_values",), message="per-batch perplexities"),
    Variant("perplexity_in_train_mode", {PPL: ppl('''
    total, count = 0.0, 0
    for ids in batches:
        total += lm_loss(model(ids), ids).item() * ids[:, 1:].numel()
        count += ids[:, 1:].numel()
    return math.exp(total / count)
''')}, loses=("perplexity_values",), message="eval mode"),
    # ---- load_gpt2_weights
    Variant("loader_conv1d_untransposed", {LOADER: loader(
        attention='''            weights = theirs.attn.c_attn.weight.chunk(3, dim=1)  # (d, d) each, stored (in, out)
            for linear, weight, bias in zip((attn.q_proj, attn.k_proj, attn.v_proj), weights,
                                            theirs.attn.c_attn.bias.chunk(3)):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
''', conv_weight="conv.weight if conv.weight.shape == linear.weight.shape else conv.weight.T")},
        loses=("load_gpt2_copies_every_weight", "load_gpt2_parity"), message="untransposed"),
    Variant("loader_ignores_extra_blocks", {LOADER: loader(zip_blocks="zip(model.blocks, transformer.h)")},
            loses=("load_gpt2_any_size",), message="without complaint"),
    # ---- train
    Variant("train_forgets_zero_grad", {TRAIN: train(**{"        optimizer.zero_grad()\n": ""})},
            loses=("train_steps_match_reference",), message="zero_grad"),
    Variant("train_keeps_loss_tensors", {TRAIN: train(**{"losses.append(loss.item())": "losses.append(loss)"})},
            loses=("train_steps_match_reference",), message="Python float"),
    Variant("train_measures_in_train_mode_with_gradients", {TRAIN: train(**{
        "            model.eval()\n            with torch.no_grad():\n                held_out_losses.append(("
        "step, lm_loss(model(held_out), held_out).item()))":
        "            held_out_losses.append((step, lm_loss(model(held_out), held_out).item()))"})},
        loses=("train_switches_modes",), message="train mode"),
    # ---- top_k_filter
    Variant("top_k_breaks_ties", {TOP_K: top_k('''
    if not isinstance(k, int) or k < 1:
        raise ValueError("k must be a positive integer")
    k = min(k, logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, k, dim=-1).indices, True)
    return logits.masked_fill(~keep, float("-inf"))
''')}, loses=("top_k_filter_values",), message="ties"),
    Variant("top_k_wraps_the_course_reference", {TOP_K: "import courselib.gpt\n\n" + top_k('''
    return courselib.gpt.top_k_filter(logits, k)
''')}, loses=("top_k_filter_values",), message="flagged for review"),
    # ---- top_p_filter
    Variant("top_p_drops_the_token_that_crosses_p", {TOP_P: top_p(TOP_P_CHECK + '''
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    keep_sorted = torch.cumsum(sorted_probs, dim=-1) <= p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))
''')}, loses=("top_p_filter_values",), message="crosses p"),
    Variant("top_p_one_drops_the_tail", {TOP_P: top_p(TOP_P_CHECK + '''
    probs = torch.softmax(logits, dim=-1)
    sorted_probs = torch.sort(probs, dim=-1, descending=True).values
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    smallest = torch.where(before < p, sorted_probs, torch.inf).amin(dim=-1, keepdim=True)
    return logits.masked_fill(probs < smallest, float("-inf"))
''')}, loses=("top_p_filter_edges",), message="p = 1"),
    # ---- sample_next
    Variant("temperature_after_softmax", {SAMPLE: sample('''
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1) / temperature
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(logits.shape[:-1])
''')}, loses=("sample_next_distribution",), message="no effect"),
    Variant("sample_from_the_global_generator", {SAMPLE: sample(SAMPLE_FILTERS + '''
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(logits.shape[:-1])
''')}, loses=("sample_next_generator",), message="global random state"),
    Variant("sample_with_a_naive_softmax", {SAMPLE: sample(SAMPLE_FILTERS + '''
    probs = torch.exp(scaled) / torch.exp(scaled).sum(dim=-1, keepdim=True)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(logits.shape[:-1])
''')}, loses=("sample_next_greedy_limit",), message="NaN"),
    # ---- generate
    Variant("generate_reads_the_first_position", {GENERATE: gen(GENERATE_CHECK + '''
    ids = input_ids
    for _ in range(max_new_tokens):
        token = sample_next(model(ids)[:, 0], generator, temperature, top_k, top_p)
        ids = torch.cat([ids, token[:, None]], dim=1)
    return ids
''')}, loses=("generate_matches_hf_greedy",), message="LAST position"),
    Variant("generate_never_checks_the_window", {GENERATE: gen('''
    ids = input_ids
    for _ in range(max_new_tokens):
        token = sample_next(model(ids)[:, -1], generator, temperature, top_k, top_p)
        ids = torch.cat([ids, token[:, None]], dim=1)
    return ids
''')}, loses=("generate_checks_the_context",), message="BEFORE running the model"),
    # ---- forward_with_cache
    Variant("cache_appends_keys_but_not_values", {CACHE: cache(**{
        "            v = torch.cat([cache[i][1], v], dim=2)\n": ""})},
        loses=("kv_cache_shapes", "kv_cache_matches_uncached"), message="values"),
    Variant("cache_positions_restart_at_zero", {CACHE: cache(**{
        "model.position_embeddings(input_ids, start=past)": "model.position_embeddings(input_ids)"})},
        loses=("kv_cache_matches_uncached", "kv_cache_chunks"), message="positions T_past"),
    Variant("cache_without_a_mask_after_the_prompt", {CACHE: cache(**{
        "        mask = causal_mask(k.shape[2], x.device)[past:]\n":
        "        mask = causal_mask(k.shape[2], x.device) if past == 0 else None\n"})},
        loses=("kv_cache_chunks",), message="mask"),
    # ---- kv_cache_bytes
    Variant("bytes_hard_codes_the_visible_answer", {BYTES: kv_bytes('''
    return 75_497_472
''')}, loses=("kv_cache_bytes_values",), message="Every factor counts"),
    Variant("bytes_keys_only", {BYTES: kv_bytes('''
    return num_layers * num_kv_heads * d_head * seq_len * batch_size * bytes_per_value
''')}, loses=("kv_cache_bytes_values",), message="keys AND values"),
    # ---- speculative_generate (optional stretch)
    Variant("speculative_one_target_call_per_token", {SPECULATIVE: SPECULATIVE_HEAD + '''
    ids = input_ids
    for _ in range(max_new_tokens):
        ids = torch.cat([ids, target(ids)[:, -1:].argmax(-1)], dim=1)
    return ids
'''}, loses=("stretch_speculative_saves_target_calls",), message="ONE target call"),
]

ALTERNATIVES = [
    Variant("gpt_sequential_blocks_tied_the_other_way", {MODEL: '''
class GPT(nn.Module):
    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None, dropout=0.0, eps=1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale=False)
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[DecoderBlock(d_model, num_heads, d_ff or 4 * d_model, dropout, eps)
                                      for _ in range(num_layers)])
        self.final_norm = LayerNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.token_embeddings.embedding.weight = self.lm_head.weight   # tied from the other side
        self.apply(gpt2_init)

    def forward(self, input_ids):
        x = self.dropout(self.token_embeddings(input_ids) + self.position_embeddings(input_ids))
        return F.linear(self.final_norm(self.blocks(x)), self.token_embeddings.weight)
'''}),
    Variant("loss_by_log_softmax_and_gather", {LOSS: loss(WARN_AND_PRINT + '''
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = log_probs.gather(-1, input_ids[:, 1:, None])[..., 0]
    return -picked.mean()
''')}),
    Variant("top_p_sort_based_loop", {TOP_P: top_p(TOP_P_CHECK + '''
    if p == 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    flat_logits, flat_probs = logits.reshape(-1, logits.shape[-1]), probs.reshape(-1, probs.shape[-1])
    rows = []
    for row_logits, row_probs in zip(flat_logits, flat_probs):
        mass, last = 0.0, None
        for prob in sorted(row_probs.tolist(), reverse=True):
            if mass >= p:
                break
            mass += prob
            last = prob
        rows.append(row_logits.masked_fill(row_probs < last, float("-inf")))
    return torch.stack(rows).reshape(logits.shape)
''')}),
    Variant("top_k_by_sorting", {TOP_K: top_k('''
    if not isinstance(k, int) or k < 1:
        raise ValueError("k must be a positive integer")
    if k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.sort(logits, dim=-1, descending=True).values[..., k - 1:k]
    return torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf")))
''')}),
    Variant("sample_by_inverse_cdf", {SAMPLE: sample(SAMPLE_FILTERS + '''
    probs = torch.softmax(scaled, dim=-1).reshape(-1, logits.shape[-1])
    cumulative = torch.cumsum(probs, dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator) * cumulative[:, -1:]
    ids = torch.searchsorted(cumulative, u, right=True).clamp(max=logits.shape[-1] - 1)
    return ids.reshape(logits.shape[:-1])
''')}),
    Variant("cache_one_token_at_a_time", {CACHE: CACHE_HEAD + '''
    outputs = []
    for t in range(input_ids.shape[1]):                  # a loop over the new tokens: no mask needed
        token = input_ids[:, t:t + 1]
        past = 0 if cache[0] is None else cache[0][0].shape[2]
        x = model.token_embeddings(token) + model.position_embeddings(token, start=past)
        for i, block in enumerate(model.blocks):
            attn = block.self_attn
            h = block.norm1(x)
            q, k, v = (split_heads(proj(h), attn.num_heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
            x = x + attn.out_proj(merge_heads(weights @ v))
            x = x + block.ffn(block.norm2(x))
        outputs.append(model.lm_head(model.final_norm(x)))
    return torch.cat(outputs, dim=1)
'''}),
    Variant("loader_by_renaming_the_state_dict", {LOADER: '''
def load_gpt2_weights(model, hf):
    theirs = {name.removeprefix("transformer."): value for name, value in hf.state_dict().items()}
    ours = {"token_embeddings.embedding.weight": theirs["wte.weight"],
            "position_embeddings.table.weight": theirs["wpe.weight"],
            "final_norm.weight": theirs["ln_f.weight"], "final_norm.bias": theirs["ln_f.bias"]}
    if len(model.blocks) != sum(1 for name in theirs if name.endswith(".ln_1.weight")):
        raise ValueError("not the same number of blocks")
    for i in range(len(model.blocks)):
        h = f"h.{i}."
        q, k, v = theirs[h + "attn.c_attn.weight"].T.chunk(3)
        bq, bk, bv = theirs[h + "attn.c_attn.bias"].chunk(3)
        ours.update({f"blocks.{i}.norm1.weight": theirs[h + "ln_1.weight"],
                     f"blocks.{i}.norm1.bias": theirs[h + "ln_1.bias"],
                     f"blocks.{i}.norm2.weight": theirs[h + "ln_2.weight"],
                     f"blocks.{i}.norm2.bias": theirs[h + "ln_2.bias"],
                     f"blocks.{i}.self_attn.q_proj.weight": q, f"blocks.{i}.self_attn.q_proj.bias": bq,
                     f"blocks.{i}.self_attn.k_proj.weight": k, f"blocks.{i}.self_attn.k_proj.bias": bk,
                     f"blocks.{i}.self_attn.v_proj.weight": v, f"blocks.{i}.self_attn.v_proj.bias": bv,
                     f"blocks.{i}.self_attn.out_proj.weight": theirs[h + "attn.c_proj.weight"].T,
                     f"blocks.{i}.self_attn.out_proj.bias": theirs[h + "attn.c_proj.bias"],
                     f"blocks.{i}.ffn.linear1.weight": theirs[h + "mlp.c_fc.weight"].T,
                     f"blocks.{i}.ffn.linear1.bias": theirs[h + "mlp.c_fc.bias"],
                     f"blocks.{i}.ffn.linear2.weight": theirs[h + "mlp.c_proj.weight"].T,
                     f"blocks.{i}.ffn.linear2.bias": theirs[h + "mlp.c_proj.bias"]})
    ours["lm_head.weight"] = ours["token_embeddings.embedding.weight"]
    model.load_state_dict(ours)   # strict: a missing or extra weight, or a wrong shape, raises
    return model
'''}),
]
