"""Mutants and alternative correct answers for 09_gpt."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "09_gpt"
ATTENTION, BLOCK, MODEL = "causal_self_attention_answer", "decoder_block_answer", "gpt_answer"
LLAMA_ATTENTION, LLAMA = "llama_attention_answer", "llama_answer"
OPTIMIZER, LR, CLIP, CHECKPOINT = ("configure_optimizer_answer", "lr_at_answer", "clip_grad_norm_answer",
                                   "checkpoint_answer")
LOSS, PPL = "lm_loss_answer", "perplexity_answer"
LOADER, TRAIN, TOP_K, TOP_P = "load_gpt2_weights_answer", "train_answer", "top_k_filter_answer", "top_p_filter_answer"
SAMPLE, GENERATE, CACHE = "sample_next_answer", "generate_answer", "forward_with_cache_answer"
BYTES, SPECULATIVE = "kv_cache_bytes_answer", "speculative_generate_answer"
ADAMW, BATCH, LLAMA_CACHE = "adamw_update_answer", "generate_batch_answer", "llama_forward_with_cache_answer"

ATTENTION_INIT = '''
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("num_heads must divide d_model")
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, d = x.shape
        h = self.num_heads
'''
ATTENTION_RIGHT = '''        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return self.c_proj((weights @ v).transpose(1, 2).reshape(B, T, d))
'''


def attention(**replacements):
    body = ATTENTION_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return ATTENTION_INIT + body


BLOCK_INIT = '''
class DecoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = CausalSelfAttention(d_model, num_heads)
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
{tie}        gpt2_init(self)

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
LOADER_ATTENTION_RIGHT = '''            attn.c_attn.weight.copy_(theirs.attn.c_attn.weight.T)
            attn.c_attn.bias.copy_(theirs.attn.c_attn.bias)
'''
LOADER_TAIL = '''            for linear, conv in ((attn.c_proj, theirs.attn.c_proj),
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


TRAIN_HEAD = ("def train(model, optimizer, get_batch, steps, lr_schedule, held_out, eval_every=50, max_grad_norm=1.0,\n"
              "          start_step=0, monitor=None):\n")
TRAIN_RIGHT = '''
    losses, held_out_losses = [], []
    for step in range(start_step, steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_schedule(step)
        batch = get_batch()
        model.train()
        loss = lm_loss(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        if monitor is not None:
            monitor.update(step + 1, losses[-1])
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            model.eval()
            with torch.no_grad():
                held_out_losses.append((step + 1, lm_loss(model(held_out), held_out).item()))
            if monitor is not None:
                monitor.held_out(*held_out_losses[-1])
    model.eval()
    return losses, held_out_losses
'''


def train(body=TRAIN_RIGHT, **replacements):
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return TRAIN_HEAD + body


OPTIMIZER_HEAD = "def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):\n"


def optimizer(decays, betas="betas"):
    """configure_optimizer with a decay rule (an expression of p and name)."""
    return OPTIMIZER_HEAD + f'''
    named = list(model.named_parameters())
    decay = [p for name, p in named if {decays}]
    keep = [p for name, p in named if not ({decays})]
    return torch.optim.AdamW([{{"params": decay, "weight_decay": weight_decay}}, {{"params": keep, "weight_decay": 0.0}}],
                             lr=lr, betas={betas})
'''


LR_HEAD = "def lr_at(step, max_lr, warmup_steps, total_steps, min_lr):\n"
LR_RIGHT = '''
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
'''


def lr(**replacements):
    body = LR_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return LR_HEAD + body


CLIP_HEAD = "def clip_grad_norm(parameters, max_norm):\n"
CLIP_RIGHT = '''
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    factor = min(1.0, max_norm / (norm + 1e-6))
    for g in grads:
        g.mul_(factor)
    return norm
'''


def clip(**replacements):
    body = CLIP_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return CLIP_HEAD + body


CHECKPOINT_RIGHT = '''
def save_checkpoint(path, model, optimizer, step, generator):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(), "generator": generator.get_state()}, path)


def load_checkpoint(path, model, optimizer, generator):
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])
    generator.set_state(saved["generator"])
    return saved["step"]
'''


def checkpoint(**replacements):
    body = CHECKPOINT_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return body


LLAMA_ATTENTION_HEAD = '''
class LlamaAttention(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.rope_base = num_heads, num_kv_heads, rope_base
        self.d_head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(num_heads * self.d_head, d_model, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
'''
LLAMA_ATTENTION_RIGHT = '''        q = self.q_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, base=self.rope_base)
        heads, _ = grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
        return self.o_proj(heads.transpose(1, 2).reshape(B, T, -1))
'''


def llama_attention(**replacements):
    body = LLAMA_ATTENTION_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return LLAMA_ATTENTION_HEAD + body


LLAMA_RIGHT = '''
class LlamaBlock(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = LlamaAttention(d_model, num_heads, num_kv_heads, rope_base)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLUFeedForward(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, max_positions, eps=1e-6,
                 rope_base=10000.0):
        super().__init__()
        self.max_positions = max_positions
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, eps, rope_base)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        llama_init(self)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
'''


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
    B, T, d = x.shape
    for i, block in enumerate(model.blocks):
        attn = block.self_attn
        h = attn.num_heads
        q, k, v = attn.c_attn(block.norm1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k, v))
        if cache[i] is not None:
            k = torch.cat([cache[i][0], k], dim=2)
            v = torch.cat([cache[i][1], v], dim=2)
        cache[i] = (k, v)
        total = k.shape[2]
        mask = torch.ones(total, total, dtype=torch.bool).tril()[past:]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + block.dropout(attn.c_proj(attended.transpose(1, 2).reshape(B, T, d)))
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



ADAMW_HEAD = ("@torch.no_grad()\ndef adamw_update(param, grad, state, lr, betas=(0.9, 0.999), eps=1e-8, "
              "weight_decay=0.01):\n")
ADAMW_RIGHT = '''
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(param)
        state["exp_avg_sq"] = torch.zeros_like(param)
    beta1, beta2 = betas
    state["step"] += 1
    t = state["step"]
    param.mul_(1 - lr * weight_decay)
    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    m_hat = state["exp_avg"] / (1 - beta1 ** t)
    v_hat = state["exp_avg_sq"] / (1 - beta2 ** t)
    param.sub_(lr * m_hat / (v_hat.sqrt() + eps))
'''


def adamw(**replacements):
    body = ADAMW_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return ADAMW_HEAD + body


BATCH_HEAD = "@torch.no_grad()\ndef generate_batch(model, prompts, max_new_tokens, eos_token_id, pad_token_id):\n"
BATCH_RIGHT = '''
    width = max(len(row) for row in prompts)
    ids = torch.tensor([[pad_token_id] * (width - len(row)) + list(row) for row in prompts])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompts])
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        logits = forward_padded(model, ids, positions, mask)[:, -1]
        token = logits.argmax(dim=-1).masked_fill(finished, pad_token_id)
        finished = finished | (token == eos_token_id)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if finished.all():
            break
    return ids
'''


def batch(**replacements):
    body = BATCH_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return BATCH_HEAD + body


LLAMA_CACHE_HEAD = "def llama_forward_with_cache(model, input_ids, cache):\n"
LLAMA_CACHE_RIGHT = '''
    past = 0 if cache[0] is None else cache[0][0].shape[2]
    x = model.embed_tokens(input_ids)
    B, T, _ = x.shape
    positions = torch.arange(past, past + T)
    mask = torch.ones(past + T, past + T, dtype=torch.bool).tril()[past:]
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        d_head = attn.q_proj.out_features // attn.num_heads
        normed = layer.input_layernorm(x)
        q = attn.q_proj(normed).view(B, T, attn.num_heads, d_head).transpose(1, 2)
        k = attn.k_proj(normed).view(B, T, attn.num_kv_heads, d_head).transpose(1, 2)
        v = attn.v_proj(normed).view(B, T, attn.num_kv_heads, d_head).transpose(1, 2)
        q, k = apply_rope(q, k, positions, base=attn.rope_base)
        if cache[i] is not None:
            k = torch.cat([cache[i][0], k], dim=2)
            v = torch.cat([cache[i][1], v], dim=2)
        cache[i] = (k, v)
        heads, _ = grouped_query_attention(q, k, v, mask)
        x = x + attn.o_proj(heads.transpose(1, 2).reshape(B, T, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))
'''


def llama_cache(**replacements):
    body = LLAMA_CACHE_RIGHT
    for old, new in replacements.items():
        assert old in body, old
        body = body.replace(old, new)
    return LLAMA_CACHE_HEAD + body


SPECULATIVE_HEAD = ("@torch.no_grad()\ndef speculative_generate(target, draft, input_ids, max_new_tokens, "
                    "num_draft=4):\n")

MUTANTS = [
    # ---- CausalSelfAttention
    Variant("attention_qkv_in_the_wrong_order", {ATTENTION: attention(**{
        "q, k, v = self.c_attn(x).split(d, dim=2)": "k, q, v = self.c_attn(x).split(d, dim=2)"})},
        loses=("causal_self_attention_matches_gpt2",), message="order q, k, v"),
    Variant("attention_heads_split_before_qkv", {ATTENTION: attention(**{
        "        q, k, v = self.c_attn(x).split(d, dim=2)\n        q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) "
        "for t in (q, k, v))\n":
        "        q, k, v = self.c_attn(x).view(B, T, h, 3 * (d // h)).transpose(1, 2).split(d // h, dim=-1)\n"})},
        loses=("causal_self_attention_matches_gpt2",), message="split before the heads"),
    Variant("attention_without_a_mask", {ATTENTION: attention(**{
        "scores.masked_fill(~allowed, float(\"-inf\"))": "scores"})},
        loses=("causal_self_attention_is_causal", "causal_self_attention_matches_gpt2"), message="not causal"),
    Variant("attention_mask_sees_the_next_token", {ATTENTION: attention(**{".tril()": ".tril(1)"})},
        loses=("causal_self_attention_is_causal", "causal_self_attention_matches_gpt2"), message="see the next one"),
    Variant("attention_scaled_by_d_model", {ATTENTION: attention(**{"math.sqrt(d // h)": "math.sqrt(d)"})},
        loses=("causal_self_attention_matches_gpt2",), message="not √d"),
    Variant("attention_heads_merged_without_the_transpose", {ATTENTION: attention(**{
        "(weights @ v).transpose(1, 2).reshape(B, T, d)": "(weights @ v).reshape(B, T, d)"})},
        loses=("causal_self_attention_matches_gpt2",), message="transpose before the reshape"),
    Variant("attention_hard_codes_the_visible_four_heads", {ATTENTION: attention(**{
        "        q, k, v = self.c_attn(x)": "        h = 4\n        q, k, v = self.c_attn(x)"})},
        loses=("causal_self_attention_matches_gpt2",), message="GPT2Attention"),
    Variant("attention_from_the_course_reference", {ATTENTION: '''
from courselib.attention import merge_heads as _merge, scaled_dot_product_attention as _attend, split_heads as _split

class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("num_heads must divide d_model")
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = (_split(t, self.num_heads) for t in self.c_attn(x).split(x.shape[-1], dim=2))
        out, _ = _attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
        return self.c_proj(_merge(out))
'''}, loses=("causal_self_attention_structure", "causal_self_attention_matches_gpt2",
               "causal_self_attention_is_causal"), message="flagged for review"),
    Variant("attention_through_torch_multihead_attention", {ATTENTION: attention(**{
        "        q, k, v = self.c_attn(x).split(d, dim=2)": "        mha = nn.MultiheadAttention(d, h, batch_first=True).to(x.dtype)\n"
        "        with torch.no_grad():\n"
        "            mha.in_proj_weight.copy_(self.c_attn.weight)\n"
        "            mha.in_proj_bias.copy_(self.c_attn.bias)\n"
        "            mha.out_proj.weight.copy_(self.c_proj.weight)\n"
        "            mha.out_proj.bias.copy_(self.c_proj.bias)\n"
        "        return mha(x, x, x, attn_mask=torch.ones(T, T, dtype=torch.bool).triu(1), need_weights=False)[0]\n"
        "        q, k, v = self.c_attn(x).split(d, dim=2)"})},
        loses=("causal_self_attention_matches_gpt2",), message="flagged for review"),
    # ---- DecoderBlock
    Variant("block_post_ln", {BLOCK: block('''
        x = self.norm1(x + self.dropout(self.self_attn(x)))
        return self.norm2(x + self.dropout(self.ffn(x)))
''')}, loses=("decoder_block_matches_gpt2",), message="post-LN"),
    Variant("block_exact_gelu", {BLOCK: block('''
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))
''', approximate="none")}, loses=("decoder_block_matches_gpt2",), message="tanh approximation"),
    Variant("block_adds_the_normalised_stream", {BLOCK: block('''
        h = self.norm1(x)
        x = h + self.dropout(self.self_attn(h))
        h = self.norm2(x)
        return h + self.dropout(self.ffn(h))
''')}, loses=("decoder_block_matches_gpt2",), message="raw stream"),
    Variant("block_hard_codes_gpt2_eps", {BLOCK: block('''
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))
''').replace("LayerNorm(d_model, eps)", "LayerNorm(d_model, 1e-5)")},
        loses=("decoder_block_matches_gpt2",), message="whatever the block is given"),
    Variant("block_built_on_the_course_block", {BLOCK: '''
class DecoderBlock(nn.Module):
    def __new__(cls, *args, **kwargs):
        from courselib.fused_gpt import Block as _Block
        return _Block(*args, **kwargs)
'''}, loses=("decoder_block_matches_gpt2", "decoder_block_structure"), message="ask you to write what it holds"),
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
    Variant("loader_conv1d_untransposed", {LOADER: loader(conv_weight="conv.weight if conv.weight.shape == linear.weight.shape else conv.weight.T")},
        loses=("load_gpt2_copies_every_weight", "load_gpt2_parity"), message="as stored"),
    Variant("loader_reshapes_c_attn_instead_of_transposing", {LOADER: loader(
        attention='''            attn.c_attn.weight.copy_(theirs.attn.c_attn.weight.reshape(attn.c_attn.weight.shape))
            attn.c_attn.bias.copy_(theirs.attn.c_attn.bias)
''')}, loses=("load_gpt2_copies_every_weight", "load_gpt2_parity"), message="reshape"),
    Variant("loader_from_the_course_reference", {LOADER: '''
def load_gpt2_weights(model, hf):
    from courselib.fused_gpt import load_gpt2_weights as _load
    return _load(model, hf)
'''}, loses=("load_gpt2_copies_every_weight", "load_gpt2_parity", "load_gpt2_any_size"),
        message="ask you to write what it holds"),
    Variant("loader_ignores_extra_blocks", {LOADER: loader(zip_blocks="zip(model.blocks, transformer.h)")},
            loses=("load_gpt2_any_size",), message="without complaint"),
    # ---- train
    Variant("train_forgets_zero_grad", {TRAIN: train(**{"        optimizer.zero_grad()\n": ""})},
            loses=("train_steps_match_reference",), message="zero_grad"),
    Variant("train_without_clipping", {TRAIN: train(**{"        clip_grad_norm(model.parameters(), max_grad_norm)\n": ""})},
            loses=("train_steps_match_reference",), message="clip"),
    Variant("train_sets_the_rate_after_the_step", {TRAIN: train(**{
        "        for group in optimizer.param_groups:\n            group[\"lr\"] = lr_schedule(step)\n": "",
        "        optimizer.step()\n": "        optimizer.step()\n        for group in optimizer.param_groups:\n"
                                      "            group[\"lr\"] = lr_schedule(step)\n"})},
            loses=("train_steps_match_reference",), message="before the step"),
    Variant("train_ignores_start_step", {TRAIN: train(**{
        "    for step in range(start_step, steps):": "    for step in range(steps - start_step):"})},
            loses=("train_steps_match_reference", "checkpoint_resumes_the_optimizer_and_step"), message="start_step"),
    Variant("train_keeps_loss_tensors", {TRAIN: train(**{"losses.append(loss.item())": "losses.append(loss)",
                                                          "monitor.update(step + 1, losses[-1])":
                                                          "monitor.update(step + 1, loss.item())"})},
            loses=("train_steps_match_reference",), message="Python float"),
    Variant("train_measures_in_train_mode_with_gradients", {TRAIN: train(**{
        "            model.eval()\n            with torch.no_grad():\n                held_out_losses.append(("
        "step + 1, lm_loss(model(held_out), held_out).item()))":
        "            held_out_losses.append((step + 1, lm_loss(model(held_out), held_out).item()))"})},
        loses=("train_switches_modes",), message="train mode"),
    # ---- configure_optimizer
    Variant("optimizer_decays_layer_norm_gains", {OPTIMIZER: optimizer("name.endswith('weight')")},
            loses=("configure_optimizer_groups", "configure_optimizer_steps"), message="LayerNorm gain"),
    Variant("optimizer_decays_everything", {OPTIMIZER: optimizer("True")},
            loses=("configure_optimizer_groups", "configure_optimizer_steps"), message="in the decay group"),
    Variant("optimizer_spares_the_embeddings", {OPTIMIZER: optimizer("p.dim() >= 2 and 'embeddings' not in name")},
            loses=("configure_optimizer_groups",), message="decays, as every tensor"),
    Variant("optimizer_hard_codes_the_visible_betas", {OPTIMIZER: optimizer("p.dim() >= 2", betas="(0.9, 0.95)")},
            loses=("configure_optimizer_groups", "configure_optimizer_steps"), message="pass them on"),
    Variant("optimizer_lists_the_tied_head_twice", {OPTIMIZER: OPTIMIZER_HEAD + '''
    named = list(model.named_parameters(remove_duplicate=False))
    decay = [p for name, p in named if p.dim() >= 2]
    keep = [p for name, p in named if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}],
                             lr=lr, betas=betas)
'''}, loses=("configure_optimizer_groups", "configure_optimizer_steps"), message="appears twice"),
    # ---- lr_at
    Variant("lr_warmup_off_by_one", {LR: lr(**{"max_lr * (step + 1) / warmup_steps": "max_lr * step / warmup_steps"})},
            loses=("lr_at_values", "lr_at_matches_torch"), message="not 0"),
    Variant("lr_cosine_without_its_floor", {LR: lr(**{"return min_lr + 0.5 * (max_lr - min_lr) *": "return 0.5 * max_lr *"})},
            loses=("lr_at_values", "lr_at_matches_torch"), message="floor"),
    Variant("lr_cosine_counts_from_step_zero", {LR: lr(**{
        "(step - warmup_steps) / (total_steps - warmup_steps)": "step / total_steps"})},
            loses=("lr_at_values", "lr_at_matches_torch"), message="starts at its peak"),
    Variant("lr_cosine_back_up_after_the_end", {LR: lr(**{
        "min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))": "(step - warmup_steps) / (total_steps - warmup_steps)"})},
            loses=("lr_at_values",), message="stays at min_lr"),
    Variant("lr_hard_codes_the_visible_values", {LR: LR_HEAD + '''
    return [0.25, 0.5, 0.75, 1.0, 1.0, 0.966, 0.875, 0.741, 0.55, 0.384, 0.225, 0.134, 0.1, 0.1, 0.1, 0.1][min(step, 15)]
'''}, loses=("lr_at_values",), message="lr_at"),
    Variant("lr_from_torch_schedulers", {LR: LR_HEAD + '''
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=max_lr)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=min_lr)
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    for _ in range(min(step, total_steps) - warmup_steps):
        optimizer.step()
        cosine.step()
    return float(optimizer.param_groups[0]["lr"])
'''}, loses=("lr_at_values", "lr_at_matches_torch"), message="flagged for review"),
    # ---- clip_grad_norm
    Variant("clip_each_parameter_on_its_own", {CLIP: CLIP_HEAD + '''
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            norm = float(p.grad.double().norm())
            total += norm ** 2
            p.grad.mul_(min(1.0, max_norm / (norm + 1e-6)))
    return math.sqrt(total)
'''}, loses=("clip_grad_norm_values", "clip_grad_norm_matches_torch"), message="on its own"),
    Variant("clip_scales_short_gradients_up", {CLIP: clip(**{"min(1.0, max_norm / (norm + 1e-6))": "max_norm / (norm + 1e-6)"})},
            loses=("clip_grad_norm_values",), message="min(1"),
    Variant("clip_returns_the_norm_after_clipping", {CLIP: clip(**{"    return norm\n": "    return norm * factor\n"})},
            loses=("clip_grad_norm_values", "clip_grad_norm_matches_torch"), message="before clipping"),
    Variant("clip_forgets_the_square_root", {CLIP: clip(**{"math.sqrt(sum(": "(sum("})},
            loses=("clip_grad_norm_values", "clip_grad_norm_matches_torch"), message="sqrt"),
    Variant("clip_hard_codes_the_visible_norm", {CLIP: clip(**{"    return norm\n": "    return 13.0\n"})},
            loses=("clip_grad_norm_values", "clip_grad_norm_matches_torch"), message="returned"),
    Variant("clip_by_torch", {CLIP: CLIP_HEAD + '''
    return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
'''}, loses=("clip_grad_norm_values", "clip_grad_norm_matches_torch"), message="flagged for review"),
    # ---- checkpoints
    Variant("checkpoint_loses_the_optimizer_state", {CHECKPOINT: checkpoint(**{
        "    optimizer.load_state_dict(saved[\"optimizer\"])\n": ""})},
        loses=("checkpoint_resumes_the_optimizer_and_step", "checkpoint_resumes_the_randomness"),
        message="optimizer"),
    Variant("checkpoint_loses_the_step", {CHECKPOINT: checkpoint(**{"    return saved[\"step\"]": "    return 0"})},
            loses=("checkpoint_resumes_the_optimizer_and_step", "checkpoint_resumes_the_randomness"),
            message="saved step"),
    Variant("checkpoint_loses_torch_rng", {CHECKPOINT: checkpoint(**{"    torch.set_rng_state(saved[\"torch_rng\"])\n": ""})},
            loses=("checkpoint_resumes_the_randomness",), message="torch.set_rng_state"),
    Variant("checkpoint_loses_the_batch_generator", {CHECKPOINT: checkpoint(**{
        "    generator.set_state(saved[\"generator\"])\n": ""})},
        loses=("checkpoint_resumes_the_optimizer_and_step", "checkpoint_resumes_the_randomness"),
        message="generator"),
    # ---- LlamaAttention
    Variant("llama_rope_on_the_merged_width", {LLAMA_ATTENTION: llama_attention(**{
        "        q = self.q_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)\n"
        "        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)\n":
        "        q, _ = apply_rope(self.q_proj(x), self.q_proj(x), base=self.rope_base)\n"
        "        k, _ = apply_rope(self.k_proj(x), self.k_proj(x), base=self.rope_base)\n"
        "        q = q.view(B, T, self.num_heads, self.d_head).transpose(1, 2)\n"
        "        k = k.view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)\n",
        "        q, k = apply_rope(q, k, base=self.rope_base)\n": ""})},
        loses=("llama_attention_matches_llama",), message="after the split into heads"),
    Variant("llama_gqa_heads_tiled_with_repeat", {LLAMA_ATTENTION: llama_attention(**{
        "        heads, _ = grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())\n":
        "        group = self.num_heads // self.num_kv_heads\n"
        "        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)\n"
        "        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"})},
        loses=("llama_attention_matches_llama",), message="repeat_interleave"),
    Variant("llama_rotates_the_values_too", {LLAMA_ATTENTION: llama_attention(**{
        "        q, k = apply_rope(q, k, base=self.rope_base)\n":
        "        q, k = apply_rope(q, k, base=self.rope_base)\n        v, _ = apply_rope(v, v, base=self.rope_base)\n"})},
        loses=("llama_attention_matches_llama",), message="not the values"),
    Variant("llama_attention_without_a_mask", {LLAMA_ATTENTION: llama_attention(**{
        "grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())":
        "grouped_query_attention(q, k, v)"})},
        loses=("llama_attention_matches_llama",), message="causal"),
    Variant("llama_rope_ignores_its_base", {LLAMA_ATTENTION: llama_attention(**{
        "apply_rope(q, k, base=self.rope_base)": "apply_rope(q, k)"})},
        loses=("llama_attention_matches_llama",), message="rope_base=500"),
    Variant("llama_attention_from_the_course_reference", {LLAMA_ATTENTION: '''
class LlamaAttention(nn.Module):
    def __new__(cls, *args, **kwargs):
        from courselib.llama_model import LlamaAttention as _Reference
        return _Reference(*args, **kwargs)
'''}, loses=("llama_attention_structure", "llama_attention_matches_llama"), message="ask you to write what it holds"),
    # ---- LlamaBlock and Llama
    Variant("llama_rms_norm_eps_outside_the_root", {LLAMA: '''
class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps) * self.weight
''' + LLAMA_RIGHT}, loses=("llama_matches_hf",), message="square root"),
    Variant("llama_head_tied_to_the_embedding", {LLAMA: LLAMA_RIGHT.replace(
        "        llama_init(self)\n", "        llama_init(self)\n        self.lm_head.weight = self.embed_tokens.weight\n")},
        loses=("llama_structure", "llama_matches_hf"), message="untied"),
    Variant("llama_post_norm_block", {LLAMA: LLAMA_RIGHT.replace(
        "        x = x + self.self_attn(self.input_layernorm(x))\n        return x + self.mlp(self.post_attention_layernorm(x))",
        "        x = self.input_layernorm(x + self.self_attn(x))\n        return self.post_attention_layernorm(x + self.mlp(x))")},
        loses=("llama_matches_hf",), message="input_layernorm"),
    Variant("llama_without_the_final_norm", {LLAMA: LLAMA_RIGHT.replace("return self.lm_head(self.norm(x))",
                                                                         "return self.lm_head(x)")},
            loses=("llama_matches_hf",), message="norm and lm_head"),
    Variant("llama_from_the_course_reference", {LLAMA: '''
class LlamaBlock(nn.Module):
    def __new__(cls, *args, **kwargs):
        from courselib.llama_model import LlamaBlock as _Block
        return _Block(*args, **kwargs)


class Llama(nn.Module):
    def __new__(cls, *args, **kwargs):
        from courselib.llama_model import Llama as _Llama
        return _Llama(*args, **kwargs)
'''}, loses=("llama_structure", "llama_matches_hf"), message="ask you to write what it holds"),
    # ---- top_k_filter
    Variant("top_k_breaks_ties", {TOP_K: top_k('''
    if not isinstance(k, int) or k < 1:
        raise ValueError("k must be a positive integer")
    k = min(k, logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, k, dim=-1).indices, True)
    return logits.masked_fill(~keep, float("-inf"))
''')}, loses=("top_k_filter_values",), message="ties"),
    Variant("top_k_wraps_the_course_reference", {TOP_K: top_k('''
    import courselib.gpt
    return courselib.gpt.top_k_filter(logits, k)
''')}, loses=("top_k_filter_values",), message="ask you to write what it holds"),
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
    Variant("cache_is_causal_aligns_top_left", {CACHE: cache(**{
        "F.scaled_dot_product_attention(q, k, v, attn_mask=mask)": "F.scaled_dot_product_attention(q, k, v, is_causal=True)"})},
        loses=("kv_cache_matches_uncached", "kv_cache_chunks"), message="top left"),
    Variant("cache_appends_keys_but_not_values", {CACHE: cache(**{
        "            v = torch.cat([cache[i][1], v], dim=2)\n": ""})},
        loses=("kv_cache_shapes", "kv_cache_matches_uncached"), message="values"),
    Variant("cache_positions_restart_at_zero", {CACHE: cache(**{
        "model.position_embeddings(input_ids, start=past)": "model.position_embeddings(input_ids)"})},
        loses=("kv_cache_matches_uncached", "kv_cache_chunks"), message="positions T_past"),
    Variant("cache_without_a_mask_after_the_prompt", {CACHE: cache(**{
        "        mask = torch.ones(total, total, dtype=torch.bool).tril()[past:]\n":
        "        mask = torch.ones(total, total, dtype=torch.bool).tril() if past == 0 else None\n"})},
        loses=("kv_cache_chunks",), message="need the mask too"),
    # ---- kv_cache_bytes
    Variant("bytes_hard_codes_the_visible_answer", {BYTES: kv_bytes('''
    return 75_497_472
''')}, loses=("kv_cache_bytes_values",), message="Every factor counts"),
    Variant("bytes_keys_only", {BYTES: kv_bytes('''
    return num_layers * num_kv_heads * d_head * seq_len * batch_size * bytes_per_value
''')}, loses=("kv_cache_bytes_values",), message="keys AND values"),
    # ---- adamw_update
    Variant("adamw_without_bias_correction", {ADAMW: adamw(**{
        "state[\"exp_avg\"] / (1 - beta1 ** t)": "state[\"exp_avg\"]",
        "state[\"exp_avg_sq\"] / (1 - beta2 ** t)": "state[\"exp_avg_sq\"]"})},
        loses=("adamw_update_first_step", "adamw_update_matches_torch"), message="bias correction"),
    Variant("adamw_decay_added_to_the_gradient", {ADAMW: adamw(**{
        "    param.mul_(1 - lr * weight_decay)\n": "    grad = grad + weight_decay * param\n"})},
        loses=("adamw_update_first_step", "adamw_update_matches_torch"), message="decouples it"),
    Variant("adamw_eps_inside_the_square_root", {ADAMW: adamw(**{
        "(v_hat.sqrt() + eps)": "(v_hat + eps).sqrt()"})},
        loses=("adamw_update_first_step", "adamw_update_matches_torch"), message="inside the square root"),
    Variant("adamw_decays_after_the_step", {ADAMW: adamw(**{
        "    param.mul_(1 - lr * weight_decay)\n": "",
        "    param.sub_(lr * m_hat / (v_hat.sqrt() + eps))\n":
        "    param.sub_(lr * m_hat / (v_hat.sqrt() + eps))\n    param.mul_(1 - lr * weight_decay)\n"})},
        loses=("adamw_update_matches_torch",), message="as it was before the step"),
    Variant("adamw_hard_codes_the_default_betas", {ADAMW: adamw(**{
        "    beta1, beta2 = betas\n": "    beta1, beta2 = 0.9, 0.999\n"})},
        loses=("adamw_update_matches_torch",), message="the betas you were given"),
    # ---- generate_batch
    Variant("batch_positions_from_the_column", {BATCH: batch(**{
        "positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)": "positions = torch.arange(ids.shape[1]).expand_as(ids)"})},
        loses=("generate_batch_matches_hf",), message="first real token at position 0"),
    Variant("batch_without_the_attention_mask", {BATCH: batch(**{
        "forward_padded(model, ids, positions, mask)": "forward_padded(model, ids, positions, torch.ones_like(mask))"})},
        loses=("generate_batch_matches_hf",), message="no real token reading a pad"),
    Variant("batch_mask_from_the_ids", {BATCH: batch(**{
        "    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompts])\n":
        "    mask = (ids != pad_token_id).long()\n"})},
        loses=("generate_batch_matches_hf",), message="not from comparing ids with the pad"),
    Variant("batch_padded_on_the_right", {BATCH: batch(**{
        "[[pad_token_id] * (width - len(row)) + list(row) for row in prompts]":
        "[list(row) + [pad_token_id] * (width - len(row)) for row in prompts]",
        "[[0] * (width - len(row)) + [1] * len(row) for row in prompts]":
        "[[1] * len(row) + [0] * (width - len(row)) for row in prompts]"})},
        loses=("generate_batch_matches_hf",), message="padded on the LEFT"),
    Variant("batch_rows_go_on_after_their_end", {BATCH: batch(**{
        "logits.argmax(dim=-1).masked_fill(finished, pad_token_id)": "logits.argmax(dim=-1)"})},
        loses=("generate_batch_stops_at_eos",), message="goes on writing after its end-of-sequence token"),
    Variant("batch_stops_at_the_first_end", {BATCH: batch(**{"if finished.all():": "if finished.any():"})},
        loses=("generate_batch_stops_at_eos",), message="EVERY row"),
    Variant("batch_one_row_at_a_time", {BATCH: batch(**{
        "        logits = forward_padded(model, ids, positions, mask)[:, -1]\n":
        "        logits = torch.cat([forward_padded(model, ids[r:r + 1], positions[r:r + 1], mask[r:r + 1])[:, -1]\n"
        "                            for r in range(len(prompts))])\n"})},
        loses=("generate_batch_matches_hf",), message="one pass of forward_padded per new token"),
    # ---- llama_forward_with_cache
    Variant("llama_cache_rope_offset_missing", {LLAMA_CACHE: llama_cache(**{
        "positions = torch.arange(past, past + T)": "positions = torch.arange(T)"})},
        loses=("llama_cache_matches_uncached",), message="rotated by T_past"),
    Variant("llama_cache_repeats_the_heads", {LLAMA_CACHE: llama_cache(**{
        "        if cache[i] is not None:\n":
        "        group = attn.num_heads // attn.num_kv_heads\n"
        "        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n"
        "        if cache[i] is not None:\n"})},
        loses=("llama_cache_shapes",), message="not the 4 query heads"),
    Variant("llama_cache_without_a_mask", {LLAMA_CACHE: llama_cache(**{
        "grouped_query_attention(q, k, v, mask)": "grouped_query_attention(q, k, v)"})},
        loses=("llama_cache_matches_uncached",), message="is the mask there"),
    # ---- sample_next, reseeding instead of drawing from the generator
    Variant("sample_reseeds_the_global_generator", {SAMPLE: sample(SAMPLE_FILTERS + '''
    torch.manual_seed(generator.initial_seed())
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(logits.shape[:-1])
''')}, loses=("sample_next_generator",), message="global random state"),
    Variant("sample_reseeds_a_private_copy_and_never_advances", {SAMPLE: sample(SAMPLE_FILTERS + '''
    with torch.random.fork_rng():
        torch.manual_seed(generator.initial_seed())
        probs = torch.softmax(scaled, dim=-1)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(logits.shape[:-1])
''')}, loses=("sample_next_generator",), message="did not move on"),
    # ---- speculative_generate (optional stretch)
    Variant("speculative_one_target_call_per_token", {SPECULATIVE: SPECULATIVE_HEAD + '''
    ids = input_ids
    for _ in range(max_new_tokens):
        ids = torch.cat([ids, target(ids)[:, -1:].argmax(-1)], dim=1)
    return ids
'''}, loses=("stretch_speculative_saves_target_calls",), message="ONE target call"),
]

ALTERNATIVES = [
    Variant("adamw_in_torchs_own_form", {ADAMW: ADAMW_HEAD + '''
    if "step" not in state:
        state.update(step=0, exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
    state["step"] += 1
    beta1, beta2 = betas
    bias_correction1, bias_correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
    param.mul_(1 - lr * weight_decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
    denominator = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.addcdiv_(state["exp_avg"], denominator, value=-lr / bias_correction1)
'''}),
    Variant("adamw_with_new_tensors_and_the_papers_step_size", {ADAMW: ADAMW_HEAD + '''
    step = state.get("step", 0) + 1
    m = betas[0] * state.get("exp_avg", torch.zeros_like(param)) + (1 - betas[0]) * grad
    v = betas[1] * state.get("exp_avg_sq", torch.zeros_like(param)) + (1 - betas[1]) * grad * grad
    state["step"], state["exp_avg"], state["exp_avg_sq"] = step, m, v
    root_correction = math.sqrt(1 - betas[1] ** step)
    step_size = lr * root_correction / (1 - betas[0] ** step)          # Kingma and Ba's efficient form
    decayed = param * (1 - lr * weight_decay)
    param.copy_(decayed - step_size * m / (v.sqrt() + eps * root_correction))
'''}),
    Variant("batch_with_padding_functions", {BATCH: BATCH_HEAD + '''
    width = max(map(len, prompts))
    rows = [F.pad(torch.tensor(row), (width - len(row), 0), value=pad_token_id) for row in prompts]
    ids = torch.stack(rows)
    lengths = torch.tensor([len(row) for row in prompts])
    mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
    done = torch.zeros(len(prompts), dtype=torch.bool)
    steps = 0
    while steps < max_new_tokens and not bool(done.all()):
        positions = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
        chosen = torch.argmax(forward_padded(model, ids, positions, mask)[:, -1, :], dim=-1)
        chosen = torch.where(done, torch.full_like(chosen, pad_token_id), chosen)
        done |= chosen == eos_token_id
        ids = torch.cat((ids, chosen.unsqueeze(1)), dim=1)
        mask = F.pad(mask, (0, 1), value=1)
        steps += 1
    return ids
'''}),
    Variant("llama_cache_with_pytorch_gqa", {LLAMA_CACHE: llama_cache(**{
        "        heads, _ = grouped_query_attention(q, k, v, mask)\n":
        "        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)\n",
        "    positions = torch.arange(past, past + T)\n": "    positions = torch.arange(past + T)[past:]\n"})}),
    Variant("block_as_a_loop_over_sublayers", {BLOCK: block('''
        for norm, sublayer in ((self.norm1, self.self_attn), (self.norm2, self.ffn)):
            x = x + self.dropout(sublayer(norm(x)))
        return x
''')}),
    Variant("optimizer_in_one_pass", {OPTIMIZER: OPTIMIZER_HEAD + '''
    groups = ({"params": [], "weight_decay": weight_decay}, {"params": [], "weight_decay": 0.0})
    for _, param in model.named_parameters():
        groups[0 if param.ndim > 1 else 1]["params"].append(param)
    return torch.optim.AdamW(list(groups), lr=lr, betas=tuple(betas), eps=1e-8, weight_decay=0.0)
'''}),
    Variant("lr_with_numpy", {LR: LR_HEAD + '''
    import numpy as np
    if step < warmup_steps:
        return float(max_lr * (step + 1) / warmup_steps)
    progress = np.clip((step - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
    return float(min_lr + (max_lr - min_lr) * (1.0 + np.cos(np.pi * progress)) / 2.0)
'''}),
    Variant("clip_with_a_loop", {CLIP: CLIP_HEAD + '''
    with_grads = [p for p in parameters if p.grad is not None]
    squares = 0.0
    for p in with_grads:
        squares += float(torch.linalg.vector_norm(p.grad.double())) ** 2
    norm = squares ** 0.5
    if max_norm / (norm + 1e-6) < 1.0:
        for p in with_grads:
            p.grad *= max_norm / (norm + 1e-6)
    return norm
'''}),
    Variant("train_with_a_per_window_evaluation", {TRAIN: train(**{
        "                held_out_losses.append((step + 1, lm_loss(model(held_out), held_out).item()))":
        "                per_window = [lm_loss(model(w[None]), w[None]).item() for w in held_out]\n"
        "                held_out_losses.append((step + 1, sum(per_window) / len(per_window)))"})}),
    Variant("checkpoint_as_a_list", {CHECKPOINT: '''
def save_checkpoint(path, model, optimizer, step, generator):
    torch.save([model.state_dict(), optimizer.state_dict(), step, torch.get_rng_state(), generator.get_state()], path)


def load_checkpoint(path, model, optimizer, generator):
    weights, moments, step, rng, batches = torch.load(path)
    model.load_state_dict(weights)
    optimizer.load_state_dict(moments)
    torch.set_rng_state(rng)
    generator.set_state(batches)
    return step
'''}),
    Variant("llama_attention_with_its_own_rope_and_softmax", {LLAMA_ATTENTION: llama_attention(**{
        "        q, k = apply_rope(q, k, base=self.rope_base)\n"
        "        heads, _ = grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())\n":
        "        half = self.d_head // 2\n"
        "        theta = self.rope_base ** (-torch.arange(half, dtype=x.dtype) * 2 / self.d_head)\n"
        "        angle = torch.arange(T, dtype=x.dtype)[:, None] * theta\n"
        "        cos, sin = torch.cat([angle.cos(), angle.cos()], -1), torch.cat([angle.sin(), angle.sin()], -1)\n"
        "        turn = lambda t: t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin\n"
        "        q, k = turn(q), turn(k)\n"
        "        group = self.num_heads // self.num_kv_heads\n"
        "        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n"
        "        scores = (q @ k.transpose(-2, -1) / self.d_head ** 0.5).masked_fill(\n"
        "            torch.ones(T, T, dtype=torch.bool).triu(1), float(\"-inf\"))\n"
        "        heads = torch.softmax(scores, dim=-1) @ v\n"})}),
    Variant("llama_blocks_as_residual_pairs", {LLAMA: LLAMA_RIGHT.replace(
        "        x = x + self.self_attn(self.input_layernorm(x))\n        return x + self.mlp(self.post_attention_layernorm(x))",
        "        for norm, sublayer in ((self.input_layernorm, self.self_attn), (self.post_attention_layernorm, self.mlp)):\n"
        "            x = x + sublayer(norm(x))\n        return x")}),
    Variant("llama_attention_by_pytorch_gqa", {LLAMA_ATTENTION: llama_attention(**{
        "        heads, _ = grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())\n":
        "        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)\n"})}),
    Variant("llama_with_sequential_layers", {LLAMA: LLAMA_RIGHT.replace(
        "        self.layers = nn.ModuleList(LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, eps, rope_base)\n"
        "                                    for _ in range(num_layers))",
        "        self.layers = nn.Sequential(*[LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, eps, rope_base)\n"
        "                                      for _ in range(num_layers)])").replace(
        "        for layer in self.layers:\n            x = layer(x)\n", "        x = self.layers(x)\n")}),
    Variant("optimizer_by_module_types", {OPTIMIZER: OPTIMIZER_HEAD + '''
    decay, seen = [], set()
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and id(module.weight) not in seen:
            seen.add(id(module.weight))          # the tied head is the token table: once
            decay.append(module.weight)
    keep = [p for p in model.parameters() if id(p) not in seen]
    return torch.optim.AdamW([dict(params=decay, weight_decay=weight_decay), dict(params=keep, weight_decay=0.0)],
                             lr=lr, betas=betas, eps=1e-8)
'''}),
    Variant("lr_by_interpolation", {LR: LR_HEAD + '''
    if step >= total_steps:
        return float(min_lr)
    if step < warmup_steps:
        return (step + 1) * max_lr / warmup_steps
    weight = (math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps)) + 1) / 2
    return weight * max_lr + (1 - weight) * min_lr
'''}),
    Variant("clip_with_tensors", {CLIP: CLIP_HEAD + '''
    grads = [p.grad for p in list(parameters) if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor.to(g.dtype))
    return norm.item()
'''}),
    Variant("train_with_torch_clipping_and_a_while_loop", {TRAIN: TRAIN_HEAD + '''
    losses, measured = [], []
    step = start_step
    while step < steps:
        rate = lr_schedule(step)
        for group in optimizer.param_groups:
            group["lr"] = rate
        model.train()
        batch = get_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(model(batch), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        step += 1
        losses.append(float(loss))
        if monitor:
            monitor.update(step, losses[-1])
        if step % eval_every == 0 or step == steps:
            with torch.no_grad():
                model.eval()
                measured.append((step, float(lm_loss(model(held_out), held_out))))
                if monitor:
                    monitor.held_out(step, measured[-1][1])
    model.eval()
    return losses, measured
'''}),
    Variant("checkpoint_in_nested_dictionaries", {CHECKPOINT: '''
def save_checkpoint(path, model, optimizer, step, generator):
    state = {"weights": {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
             "progress": {"step": int(step)},
             "random": {"torch": torch.random.get_rng_state(), "batches": generator.get_state()}}
    torch.save(state, path)


def load_checkpoint(path, model, optimizer, generator):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["weights"]["model"], strict=True)
    optimizer.load_state_dict(state["weights"]["optimizer"])
    torch.random.set_rng_state(state["random"]["torch"])
    generator.set_state(state["random"]["batches"])
    return state["progress"]["step"]
'''}),
    Variant("attention_by_einsum", {ATTENTION: attention(**{
        "        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)\n": "        scores = torch.einsum(\"bhqd,bhkd->bhqk\", q, k) / math.sqrt(d // h)\n",
        "        return self.c_proj((weights @ v).transpose(1, 2).reshape(B, T, d))\n":
        "        return self.c_proj(torch.einsum(\"bhqk,bhkd->bqhd\", weights, v).reshape(B, T, d))\n"})}),
    Variant("attention_by_pytorch_sdpa", {ATTENTION: attention(**{
        "        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)\n"
        "        allowed = torch.ones(T, T, dtype=torch.bool).tril()\n"
        "        weights = torch.softmax(scores.masked_fill(~allowed, float(\"-inf\")), dim=-1)\n"
        "        return self.c_proj((weights @ v).transpose(1, 2).reshape(B, T, d))\n":
        "        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        "        return self.c_proj(heads.transpose(1, 2).reshape(B, T, d))\n"})}),
    Variant("block_with_torch_layer_norm", {BLOCK: '''
class DecoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.self_attn = CausalSelfAttention(d_model, num_heads)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        attended = self.self_attn(self.norm1(x))
        x = x + self.dropout(attended)
        fed = self.ffn(self.norm2(x))
        return x + self.dropout(fed)
'''}),
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
        gpt2_init(self)

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
        d = x.shape[-1]
        for i, block in enumerate(model.blocks):
            attn = block.self_attn
            qkv = attn.c_attn(block.norm1(x)).view(x.shape[0], 1, 3, attn.num_heads, d // attn.num_heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)         # 3 x (B, h, 1, d_head)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            weights = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]), dim=-1)
            x = x + attn.c_proj(torch.einsum("bhqk,bhkd->bqhd", weights, v).reshape(x.shape))
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
        ours.update({f"blocks.{i}.norm1.weight": theirs[h + "ln_1.weight"],
                     f"blocks.{i}.norm1.bias": theirs[h + "ln_1.bias"],
                     f"blocks.{i}.norm2.weight": theirs[h + "ln_2.weight"],
                     f"blocks.{i}.norm2.bias": theirs[h + "ln_2.bias"],
                     f"blocks.{i}.self_attn.c_attn.weight": theirs[h + "attn.c_attn.weight"].T,
                     f"blocks.{i}.self_attn.c_attn.bias": theirs[h + "attn.c_attn.bias"],
                     f"blocks.{i}.self_attn.c_proj.weight": theirs[h + "attn.c_proj.weight"].T,
                     f"blocks.{i}.self_attn.c_proj.bias": theirs[h + "attn.c_proj.bias"],
                     f"blocks.{i}.ffn.linear1.weight": theirs[h + "mlp.c_fc.weight"].T,
                     f"blocks.{i}.ffn.linear1.bias": theirs[h + "mlp.c_fc.bias"],
                     f"blocks.{i}.ffn.linear2.weight": theirs[h + "mlp.c_proj.weight"].T,
                     f"blocks.{i}.ffn.linear2.bias": theirs[h + "mlp.c_proj.bias"]})
    ours["lm_head.weight"] = ours["token_embeddings.embedding.weight"]
    model.load_state_dict(ours)   # strict: a missing or extra weight, or a wrong shape, raises
    return model
'''}),
]
