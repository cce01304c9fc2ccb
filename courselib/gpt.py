"""The course's reference GPT and the tiny pre-trained GPT it ships.

Notebook 09 has learners build a decoder-only transformer; later notebooks import the reference
pieces from here (the RLHF notebook uses the shipped checkpoint as its policy). This module answers
notebook 09's exercises (the loss, perplexity, the decoding functions, generation, the loader), so 09's
cells and hidden checks never import it: the corpus and tokenizer they need are in `courselib.stories`
(re-exported here: `corpus`, `token_stream`, `windows`, `EOS`, `MODEL_DIR`, ...).

    model, tokenizer = load_tiny_gpt()                  # the course's GPT class, trained weights, eval mode
    ids = tokenizer(EOS + "Once upon a time,", return_tensors="pt").input_ids
    print(tokenizer.decode(generate(model, ids, 40, generator=torch.Generator().manual_seed(0),
                                    temperature=0.8, top_p=0.95)[0]))

The model (`GPT`) is GPT-2's architecture from the course's pieces: token and learned position
embeddings (`courselib.blocks`), pre-LN causal blocks (`Block`: LayerNorm, `MultiHeadAttention` of
`courselib.attention` under a causal mask, tanh-GELU `FeedForward`), a final LayerNorm and an LM head
tied to the token embedding. `load_gpt2_weights` copies any Hugging Face `GPT2LMHeadModel` into it
(GPT-2's `Conv1D` stores weights as (in, out), the transpose of `nn.Linear`), and `to_gpt2` goes back.
`GPT.forward(ids, cache)` runs with a KV cache: a list with one (keys, values) pair per block.

The checkpoint in `courselib/data/tiny_gpt/` is a `GPT2LMHeadModel` in safetensors (loadable with
`from_pretrained`, and with `load_gpt2_weights` into the course's class) plus a byte-level BPE
tokenizer (`tokenizer.json`, `AutoTokenizer`). It is rebuilt from nothing but this file and
`courselib/stories.py`:

    python -m courselib.gpt --rebuild [--threads 1]

1. `corpus()` (courselib.stories) writes short children's stories from templates (pets that get lost and found, toys,
   baking, weather, animals, counting, sharing), some ending well and some not, with names and
   pronouns kept consistent within a story: no downloads;
2. `train_tokenizer()` (courselib.stories) trains a byte-level BPE of 1024 tokens on them with `tokenizers` (GPT-2's
   pre-tokenizer; its trainer is deterministic for a given corpus, which the tests check);
3. `pretrain()` trains the course's `GPT` on the stories packed into 128-token windows separated by
   `<|endoftext|>`: next-token cross-entropy, AdamW with warm-up and cosine decay.

The shipped build (seed 0, `--threads 1`, torch 2.13, transformers 5.23, on a 2-core machine shared
with other jobs): 2,000 steps of 16 windows of 128 tokens, 4.1 M tokens in all (two thirds of one pass
over the 6.2 M-token corpus), 56 minutes of wall-clock time but 10.3 CPU minutes. The loss fell from
6.97 (ln 1024 = 6.93, a uniform guess) to a final 0.308 (mean of the last 100 steps), and the
perplexity on 2,000 stories of another seed is 1.363. Greedy from "Once upon a time,": "there was a
small horse in the field. Every day the horse ate hay. When the horse was happy, it said "neigh". ..."

`training_log.json` beside the weights has the whole curve; the same seed gives the same tokenizer and
the same first losses, which `autograder/tests/test_tiny_gpt.py` checks along with the perplexity.
"""
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from courselib.attention import MultiHeadAttention, causal_mask, merge_heads, scaled_dot_product_attention, split_heads
from courselib.blocks import FeedForward, LayerNorm, LearnedPositionalEmbedding, TokenEmbedding
from courselib.stories import (CONTEXT, EOS, HELD_OUT_SEED, MODEL_DIR, NUM_STORIES, SEED,  # noqa: F401
                               VOCAB_SIZE, corpus, held_out_windows, token_stream, train_tokenizer, windows)
from courselib.training import checkpoint_cli

SIZES = dict(d_model=128, num_layers=4, num_heads=4)
STEPS, BATCH_SIZE, LEARNING_RATE, WARMUP = 2000, 16, 3e-3, 100


# ----------------------------------------------------------------------------------------- model
def causal_attention(attn, x, past=None):
    """Masked multi-head self-attention of `attn` (a courselib MultiHeadAttention) over x (B, T, d),
    after the cached keys and values `past` ((B, h, T_past, d_head) each, or None).

    Returns (output (B, T, d), (keys, values) of all T_past + T positions): the new cache entry.
    """
    q = split_heads(attn.q_proj(x), attn.num_heads)            # (B, h, T, d_head)
    k = split_heads(attn.k_proj(x), attn.num_heads)
    v = split_heads(attn.v_proj(x), attn.num_heads)
    start = 0
    if past is not None:
        start = past[0].shape[-2]
        k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)   # (B, h, T_past + T, d_head)
    mask = causal_mask(start + x.shape[1], x.device)[start:]    # (T, T_past + T): query t sees keys 0..start + t
    output, _ = scaled_dot_product_attention(q, k, v, mask)
    return attn.out_proj(merge_heads(output)), (k, v)


class Block(nn.Module):
    """GPT-2's pre-LN decoder block: x + attn(norm1(x)) under a causal mask, then x + ffn(norm2(x)).

    Submodules: norm1, self_attn (courselib MultiHeadAttention), norm2, ffn (tanh-GELU FeedForward), dropout.
    forward(x (B, T, d), past=None) -> (x (B, T, d), (keys, values)): see causal_attention.
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, past=None):
        attended, present = causal_attention(self.self_attn, self.norm1(x), past)
        x = x + self.dropout(attended)
        return x + self.dropout(self.ffn(self.norm2(x))), present


class GPT(nn.Module):
    """A decoder-only language model with GPT-2's architecture.

    token_embeddings (TokenEmbedding, unscaled) + position_embeddings (LearnedPositionalEmbedding),
    dropout, `num_layers` Blocks, final_norm, and lm_head, whose weight *is* the token embedding table.
    forward(input_ids (B, T), cache=None) -> logits (B, T, vocab_size). `cache` is a list with one entry
    per block, None or (keys, values) of shape (B, h, T_past, d_head); it is updated in place, and the
    new tokens take the positions T_past, ..., T_past + T - 1.
    """

    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None, dropout=0.0, eps=1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale=False)
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, num_heads, d_ff or 4 * d_model, dropout, eps)
                                    for _ in range(num_layers))
        self.final_norm = LayerNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.token_embeddings.weight   # tied: one (V, d) table, two uses
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        """GPT-2's initialisation: normal(0, 0.02) weights, zero biases, LayerNorms at (1, 0)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self):
        return [None] * len(self.blocks)

    def forward(self, input_ids, cache=None):
        start = 0 if cache is None or cache[0] is None else cache[0][0].shape[-2]
        x = self.token_embeddings(input_ids) + self.position_embeddings(input_ids, start=start)   # (B, T, d)
        x = self.dropout(x)
        for i, block in enumerate(self.blocks):
            x, present = block(x, None if cache is None else cache[i])
            if cache is not None:
                cache[i] = present
        return self.lm_head(self.final_norm(x))                                                # (B, T, V)


def count_parameters(model):
    """Distinct parameters: the tied head is counted once, as torch's parameters() yields it once."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------- Hugging Face GPT-2
def gpt_like(config, dropout=0.0):
    """A GPT with the sizes of a transformers GPT2Config. Refuses the variants this class doesn't implement."""
    if config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT uses GPT-2's tanh GELU, not {config.activation_function!r}")
    if (not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx or config.reorder_and_upcast_attn
            or not getattr(config, "tie_word_embeddings", True)):
        raise ValueError("GPT implements GPT-2's plain attention scaling and a tied head only")
    return GPT(config.vocab_size, config.n_embd, config.n_layer, config.n_head, config.n_positions,
               d_ff=config.n_inner or 4 * config.n_embd, dropout=dropout, eps=config.layer_norm_epsilon)


def _gpt2_pairs(model, hf):
    """(our module, their module, transpose?) for every weight-holding module, in order."""
    transformer = getattr(hf, "transformer", hf)
    pairs = [(model.token_embeddings.embedding, transformer.wte, False),
             (model.position_embeddings.table, transformer.wpe, False)]
    for ours, theirs in zip(model.blocks, transformer.h, strict=True):
        pairs += [(ours.norm1, theirs.ln_1, False), (ours.self_attn.out_proj, theirs.attn.c_proj, True),
                  (ours.norm2, theirs.ln_2, False), (ours.ffn.linear1, theirs.mlp.c_fc, True),
                  (ours.ffn.linear2, theirs.mlp.c_proj, True)]
    return pairs + [(model.final_norm, transformer.ln_f, False)]


# No @torch.no_grad() decorators in this module: every decorated function shares the decorator's code, and the
# hidden tests recognise a course reference by its code.
def load_gpt2_weights(model, hf):
    """Copy a transformers GPT2LMHeadModel (or GPT2Model) into a GPT of the same size, in place; returns model.

    GPT-2's Conv1D layers store their weight as (in_features, out_features), the transpose of
    nn.Linear's, and c_attn holds W_Q, W_K and W_V side by side: (d, 3d).
    """
    with torch.no_grad():
        for ours, theirs, transpose in _gpt2_pairs(model, hf):
            ours.weight.copy_(theirs.weight.T if transpose else theirs.weight)
            if getattr(theirs, "bias", None) is not None:
                ours.bias.copy_(theirs.bias)
        for ours, theirs in zip(model.blocks, getattr(hf, "transformer", hf).h, strict=True):
            attn = ours.self_attn
            for linear, weight, bias in zip((attn.q_proj, attn.k_proj, attn.v_proj),
                                            theirs.attn.c_attn.weight.T.chunk(3), theirs.attn.c_attn.bias.chunk(3)):
                linear.weight.copy_(weight)   # (d, d) each: rows 0..d-1 of c_attn.weight.T are W_Q
                linear.bias.copy_(bias)
        return model


def to_gpt2(model, **config_overrides):
    """The GPT2LMHeadModel holding `model`'s weights (the inverse of load_gpt2_weights)."""
    with torch.no_grad():
        from transformers import GPT2Config, GPT2LMHeadModel

        d_model = model.token_embeddings.embedding.embedding_dim
        settings = dict(vocab_size=model.token_embeddings.embedding.num_embeddings, n_positions=model.max_positions,
                        n_embd=d_model, n_layer=len(model.blocks), n_head=model.blocks[0].self_attn.num_heads,
                        n_inner=model.blocks[0].ffn.linear1.out_features, activation_function="gelu_new",
                        layer_norm_epsilon=model.final_norm.eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
        settings.update(config_overrides)
        hf = GPT2LMHeadModel(GPT2Config(**settings)).to(model.final_norm.weight.dtype).eval()
        for ours, theirs, transpose in _gpt2_pairs(model, hf):
            theirs.weight.copy_(ours.weight.T if transpose else ours.weight)
            if getattr(theirs, "bias", None) is not None:
                theirs.bias.copy_(ours.bias)
        for ours, theirs in zip(model.blocks, hf.transformer.h):
            attn = ours.self_attn
            theirs.attn.c_attn.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).T)
            theirs.attn.c_attn.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        return hf


# -------------------------------------------------------------------------------- loss and training
def lm_loss(logits, input_ids):
    """Next-token cross-entropy: the logits at position t score token t + 1. logits (B, T, V), ids (B, T)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))


def perplexity(model, batches):
    """exp(total next-token NLL / number of predicted tokens) over batches of (B, T) ids, in eval mode."""
    with torch.no_grad():
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for ids in batches:
            logits = model(ids)
            total += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                     reduction="sum").item()
            count += ids[:, 1:].numel()
        model.train(was_training)
        return math.exp(total / count)


def pretrain(tokenizer, stories, steps=STEPS, batch_size=BATCH_SIZE, lr=LEARNING_RATE, warmup=WARMUP, seed=SEED,
             stop_after=None, callback=None):
    """Train a fresh GPT (SIZES, CONTEXT) on the packed stories. Returns (model, losses).

    AdamW (weight decay on matrices only), the learning rate warming up linearly for `warmup` steps
    and then following a cosine to a tenth of its peak at `steps`; gradients clipped at norm 1.
    `stop_after` ends early on the real schedule (the reproducibility test runs 3 steps).
    """
    torch.manual_seed(seed)
    model = GPT(len(tokenizer), max_positions=CONTEXT, **SIZES)
    data = windows(token_stream(tokenizer, stories))                      # (N, CONTEXT)
    order = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    losses = []
    for step in range(steps if stop_after is None else min(steps, stop_after)):
        batch = data[torch.randint(len(data), (batch_size,), generator=order)]   # (B, CONTEXT)
        loss = lm_loss(model(batch), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return model, losses


def rebuild(out_dir=MODEL_DIR, steps=STEPS, num_stories=NUM_STORIES, seed=SEED, quiet=False):
    """Corpus -> tokenizer -> training -> `out_dir` (GPT-2 safetensors, tokenizer, training log, model card)."""
    import transformers

    start, cpu_start = time.perf_counter(), time.process_time()
    stories = corpus(num_stories, seed)
    tokenizer = train_tokenizer(stories)
    log_every = max(1, steps // 30)

    def report(step, loss):
        if not quiet and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}/{steps}  loss {loss:.3f}  {time.perf_counter() - start:6.0f} s", flush=True)

    model, losses = pretrain(tokenizer, stories, steps=steps, seed=seed, callback=report)
    held_out = held_out_windows(tokenizer)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = to_gpt2(model)
    hf.save_pretrained(out_dir)              # config.json + model.safetensors
    tokenizer.save_pretrained(out_dir)       # tokenizer.json + tokenizer_config.json
    for path in out_dir.iterdir():
        path.chmod(0o644)                    # safetensors writes through a private temporary file (0600)
    examples = {}
    for name, settings in SAMPLE_SETTINGS.items():
        ids = tokenizer(EOS + SAMPLE_PROMPT, return_tensors="pt").input_ids
        out = generate(model, ids, 60, generator=torch.Generator().manual_seed(seed), **settings)
        examples[name] = tokenizer.decode(out[0, 1:]).split(EOS)[0]
    log = {"seed": seed, "steps": steps, "num_stories": num_stories, "vocab_size": len(tokenizer),
           "sizes": {**SIZES, "context": CONTEXT}, "parameters": count_parameters(model),
           "hyperparameters": {"batch_size": BATCH_SIZE, "lr": LEARNING_RATE, "warmup": WARMUP},
           "tokens_seen": steps * BATCH_SIZE * CONTEXT,
           "minutes": round((time.perf_counter() - start) / 60, 1),
           "cpu_minutes": round((time.process_time() - cpu_start) / 60, 1),
           "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
           "first_losses": losses[:5],
           "final_loss": round(sum(losses[-100:]) / len(losses[-100:]), 4),
           "held_out": {"num_stories": 2000, "seed": HELD_OUT_SEED, "windows": len(held_out),
                        "perplexity": round(perplexity(model, held_out.split(64)), 4)},
           "samples": examples,
           "loss_every_100_steps": [round(sum(losses[i:i + 100]) / len(losses[i:i + 100]), 4)
                                    for i in range(0, len(losses), 100)]}
    (out_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out_dir / "README.md").write_text(MODEL_CARD.format(**log, **log["sizes"], ppl=log["held_out"]["perplexity"]))
    return model, tokenizer, log


SAMPLE_PROMPT = "Once upon a time,"
SAMPLE_SETTINGS = {"greedy": dict(temperature=0.0), "temperature 0.8": dict(temperature=0.8),
                   "top-p 0.9": dict(temperature=1.0, top_p=0.9)}

MODEL_CARD = """# tiny_gpt: the course's own small GPT

A `GPT2LMHeadModel` ({parameters:,} parameters: {num_layers} layers, width {d_model}, {num_heads} heads,
{context} positions, head tied to the token embedding) and a byte-level BPE tokenizer of {vocab_size}
tokens, for the notebooks that need a generative language model offline (09 samples from it; the
course's own `courselib.gpt.GPT` loads it with `load_gpt2_weights`).

It knows only what its corpus says: {num_stories:,} short children's stories written by
`courselib/gpt.py` (pets lost and found, toys, baking, weather, animals, counting, sharing, trips).

Built by `python -m courselib.gpt --rebuild` (seed {seed}): {steps} steps of batches of
{hyperparameters[batch_size]} windows of {context} tokens ({tokens_seen:,} tokens), peak learning rate
{hyperparameters[lr]}. The build took {minutes} minutes of wall-clock time ({cpu_minutes} CPU minutes,
{threads} thread(s), torch {torch}, transformers {transformers}). Final training loss {final_loss}
(mean of the last 100 steps); perplexity {ppl} on 2,000 stories of another seed.
`training_log.json` has the curve and three samples.

    from transformers import AutoTokenizer, GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained("courselib/data/tiny_gpt")
    tokenizer = AutoTokenizer.from_pretrained("courselib/data/tiny_gpt")
"""


# ----------------------------------------------------------------------------------------- decoding
def top_k_filter(logits, k):
    """Logits with every entry below the k-th largest of its row set to -inf (ties at the boundary kept)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top-k needs an integer k >= 1, got {k!r}")
    if k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]                        # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits, p):
    """Logits keeping, per row, the fewest most probable tokens whose probabilities add up to at least p
    (tokens tied with the last one kept too); every other entry -inf. p = 1 keeps everything."""
    if not 0 < p <= 1:
        raise ValueError(f"top-p needs 0 < p <= 1, got {p!r}")
    if p == 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs             # mass of the more probable tokens
    kept = mass_before < p                                                      # the token that crosses p stays
    threshold = torch.where(kept, sorted_probs, torch.inf).amin(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None):
    """One token id per row of logits (..., V): greedy when temperature == 0, else a draw from
    softmax(logits / temperature) after the top-k and top-p filters, from `generator` alone."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(logits.shape[:-1])


def generate(model, input_ids, max_new_tokens, generator=None, temperature=0.0, top_k=None, top_p=None,
             use_cache=True):
    """input_ids (B, T0) followed by max_new_tokens tokens: (B, T0 + max_new_tokens). Greedy by default."""
    with torch.no_grad():
        needed = input_ids.shape[1] + max_new_tokens - 1
        if needed > model.max_positions:
            raise ValueError(f"a prompt of {input_ids.shape[1]} tokens and {max_new_tokens} new tokens need "
                             f"{needed} positions; the context window has {model.max_positions}")
        if temperature > 0 and generator is None:
            raise ValueError("sampling (temperature > 0) needs a torch.Generator")
        ids, cache = input_ids, (model.new_cache() if use_cache else None)
        step_input = ids
        for _ in range(max_new_tokens):
            logits = model(step_input, cache) if use_cache else model(ids)
            token = sample_next(logits[:, -1], generator, temperature, top_k, top_p)   # (B,)
            ids = torch.cat([ids, token[:, None]], dim=1)
            step_input = token[:, None]
        return ids


# -------------------------------------------------------------------------------------- KV cache size
def kv_cache_bytes(num_layers, num_kv_heads, d_head, seq_len, batch_size=1, bytes_per_value=4):
    """Bytes of a KV cache: keys and values, per layer, per head, per position, per sequence."""
    return 2 * num_layers * num_kv_heads * d_head * seq_len * batch_size * bytes_per_value


# ------------------------------------------------------------------------------------------- loading
def load_tiny_gpt2():
    """The shipped checkpoint as transformers' GPT2LMHeadModel (eval mode) and its tokenizer."""
    from transformers import AutoTokenizer, GPT2LMHeadModel
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # a "Loading weights" bar for a 4 MB model is only noise
    try:
        tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
        model = GPT2LMHeadModel.from_pretrained(MODEL_DIR)
    finally:
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer


def load_tiny_gpt():
    """The shipped checkpoint in the course's GPT class (eval mode), and its tokenizer."""
    hf, tokenizer = load_tiny_gpt2()
    return load_gpt2_weights(gpt_like(hf.config), hf).eval(), tokenizer


def main(argv=None):
    def rebuild_and_report(out, steps):
        _, _, log = rebuild(out, steps=steps)
        print(f"wrote {out}: final loss {log['final_loss']}, held-out perplexity {log['held_out']['perplexity']}, "
              f"after {log['minutes']} minutes")
        for name, text in log["samples"].items():
            print(f"{name}: {text}")

    return checkpoint_cli(argv, prog="python -m courselib.gpt", description=__doc__.splitlines()[0],
                          model_dir=MODEL_DIR, steps=STEPS, sample=lambda n: print("\n\n".join(corpus(n))),
                          rebuild=rebuild_and_report)


if __name__ == "__main__":
    raise SystemExit(main())
