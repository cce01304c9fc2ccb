"""Notebook 09's GPT in GPT-2's own attention layout: one fused `c_attn` projection for queries, keys and values.

The course's first reference GPT (`courselib.gpt.GPT`, which notebook 11 and the shipped checkpoint use)
builds its attention from notebook 05's `MultiHeadAttention`, with three separate projections. This module is the
reference for what learners write in notebook 09, in nanoGPT's form:

    CausalSelfAttention   c_attn = nn.Linear(d, 3d) -> q, k, v (GPT-2's order), heads, causal mask, c_proj
    Block                 norm1, self_attn (CausalSelfAttention), norm2, ffn (tanh-GELU FeedForward), dropout
    GPT                   token_embeddings, position_embeddings, dropout, blocks, final_norm, lm_head (tied)

Hugging Face's `GPT2LMHeadModel` stores the same numbers: `load_gpt2_weights` copies one into the other, with
`c_attn` copied as ONE (d, 3d) Conv1D matrix, transposed to nn.Linear's (3d, d). `GPT.forward(ids, cache)` runs
with a KV cache (a list with one entry per block, None or (keys, values); `new_cache()`), so
`courselib.gpt.generate` works on this class too. `gpt2_init` is GPT-2's initialisation, the residual projections scaled by 1/sqrt(2 L).
The block has no attention dropout (GPT-2's `attn_pdrop`): only the residual branches and the embeddings drop.

Notebook 09's learners write all of this, so 09's grading kernel never imports this module (09's hidden checks
hold small references of their own); later notebooks may.
autograder/tests/test_gpt_lib.py proves it against transformers.
"""
import math

import torch
from torch import nn

from courselib.blocks import FeedForward, LayerNorm, LearnedPositionalEmbedding, TokenEmbedding


def attend(q, k, v, past_length=0):
    """Causal attention of q (B, h, T_new, d_head) over k, v (B, h, T_past + T_new, d_head); query i sits at
    position past_length + i and sees keys 0..past_length + i. Returns (B, h, T_new, d_head)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])                  # (B, h, T_new, T_all)
    total = k.shape[-2]
    mask = torch.ones(total, total, dtype=torch.bool, device=q.device).tril()[past_length:]   # (T_new, T_all)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention with GPT-2's fused projection.

    c_attn: nn.Linear(d, 3d), its output [q | k | v] along the features; c_proj: nn.Linear(d, d), W_O.
    forward(x (B, T, d)) -> (B, T, d); position t reads positions 0..t.
    """

    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def heads(self, x):
        """q, k, v of x (B, T, d), each split into heads: (B, h, T, d_head)."""
        B, T, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)                                   # 3 x (B, T, d)
        return [t.view(B, T, self.num_heads, d // self.num_heads).transpose(1, 2) for t in (q, k, v)]

    def merge(self, heads):
        """(B, h, T, d_head) -> W_O applied to the heads side by side, (B, T, d)."""
        B, h, T, d_head = heads.shape
        return self.c_proj(heads.transpose(1, 2).reshape(B, T, h * d_head))

    def forward(self, x):
        q, k, v = self.heads(x)
        return self.merge(attend(q, k, v))

    def forward_cached(self, x, past):
        """Attention of the new positions x (B, T, d) after `past` (keys, values), each (B, h, T_past, d_head), or
        None. Returns (output (B, T, d), (keys, values) of all T_past + T positions)."""
        q, k, v = self.heads(x)
        start = 0
        if past is not None:
            start = past[0].shape[-2]
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        return self.merge(attend(q, k, v, start)), (k, v)


class Block(nn.Module):
    """GPT-2's pre-LN block: x + attn(norm1(x)), then x + ffn(norm2(x))."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = CausalSelfAttention(d_model, num_heads)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))

    def forward_cached(self, x, past):
        """forward for the new positions x after `past`; returns (x, the block's new cache entry)."""
        attended, present = self.self_attn.forward_cached(self.norm1(x), past)
        x = x + self.dropout(attended)
        return x + self.dropout(self.ffn(self.norm2(x))), present


def gpt2_init(model):
    """GPT-2's initialisation: N(0, 0.02) linear and embedding weights, zero biases, LayerNorms at (1, 0), and
    N(0, 0.02 / sqrt(2 L)) for the two projections per block that write into the residual stream."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    residual_std = 0.02 / math.sqrt(2 * len(model.blocks))
    for block in model.blocks:
        for projection in (block.self_attn.c_proj, block.ffn.linear2):
            nn.init.normal_(projection.weight, std=residual_std)


class GPT(nn.Module):
    """GPT-2: token + learned position embeddings, dropout, pre-LN Blocks, final_norm, lm_head tied to the tokens.

    forward(input_ids (B, T), cache=None) -> logits (B, T, V). `cache` (from new_cache()) holds each block's
    (keys, values); it is updated in place and the new tokens take the positions after it.
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
        self.lm_head.weight = self.token_embeddings.weight
        gpt2_init(self)

    def new_cache(self):
        return [None] * len(self.blocks)

    def forward(self, input_ids, cache=None):
        start = 0 if cache is None or cache[0] is None else cache[0][0].shape[-2]
        x = self.token_embeddings(input_ids) + self.position_embeddings(input_ids, start=start)   # (B, T, d)
        x = self.dropout(x)
        for i, block in enumerate(self.blocks):
            if cache is None:
                x = block(x)
            else:
                x, cache[i] = block.forward_cached(x, cache[i])
        return self.lm_head(self.final_norm(x))                                                # (B, T, V)


def gpt_like(config, dropout=0.0):
    """A GPT with the sizes of a transformers GPT2Config (courselib.gpt.gpt_like says which configs it refuses)."""
    return GPT(config.vocab_size, config.n_embd, config.n_layer, config.n_head, config.n_positions,
               d_ff=config.n_inner or 4 * config.n_embd, dropout=dropout, eps=config.layer_norm_epsilon)


def load_gpt2_weights(model, hf):
    """Copy a GPT2LMHeadModel (or GPT2Model) into a GPT of the same size, in place; returns model.

    Conv1D stores (in, out), nn.Linear (out, in): every Conv1D weight is copied transposed, c_attn as one matrix.
    """
    transformer = getattr(hf, "transformer", hf)
    pairs = [(model.token_embeddings.embedding, transformer.wte, False),
             (model.position_embeddings.table, transformer.wpe, False), (model.final_norm, transformer.ln_f, False)]
    for ours, theirs in zip(model.blocks, transformer.h, strict=True):
        pairs += [(ours.norm1, theirs.ln_1, False), (ours.self_attn.c_attn, theirs.attn.c_attn, True),
                  (ours.self_attn.c_proj, theirs.attn.c_proj, True), (ours.norm2, theirs.ln_2, False),
                  (ours.ffn.linear1, theirs.mlp.c_fc, True), (ours.ffn.linear2, theirs.mlp.c_proj, True)]
    with torch.no_grad():
        for ours, theirs, transpose in pairs:
            ours.weight.copy_(theirs.weight.T if transpose else theirs.weight)
            if getattr(theirs, "bias", None) is not None:
                ours.bias.copy_(theirs.bias)
    return model


def forward_with_cache(model, input_ids, cache):
    """Notebook 09's exercise: model(input_ids, cache), cache a list of None or (keys, values) per block."""
    return model(input_ids, cache)
