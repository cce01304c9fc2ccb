"""Reference versions of the building blocks learners write in notebooks 02, 03 and 07.

Later notebooks import these instead of re-deriving them, so a learner who got stuck in an earlier
notebook can still finish a later one. Each class has the constructor, the submodule and parameter
names and the numbers of the notebook that teaches it (autograder/tests/test_courselib.py proves
them against PyTorch):

| class | taught in | what it is |
| --- | --- | --- |
| `TokenEmbedding` | 02 | an `nn.Embedding` (in `.embedding`), times √d_model when `scale=True` |
| `LearnedPositionalEmbedding` | 03 | a trainable (max_positions, d_model) table (in `.table`) |
| `FeedForward` | 07 | `linear1` -> GELU -> `linear2`, position-wise |
| `LayerNorm` | 07 | `weight` · (x - mean) / sqrt(var + eps) + `bias`, over the last dimension |
| `EncoderLayer` | 07 | attention and feed-forward sublayers, post-LN or pre-LN (`norm_first`) |

Attention itself (notebooks 04-06) lives in `courselib.attention`. Masks are boolean, True meaning
"may attend".
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from courselib.attention import MultiHeadAttention


class TokenEmbedding(nn.Module):
    """Token ids (...,) -> vectors (..., d_model), looked up in a learned (vocab_size, d_model) table.

    The table is `self.embedding` (an nn.Embedding). scale=True multiplies by √d_model, as the original
    Transformer does; scale=False doesn't (BERT, GPT-2). The padding_idx row is zero and never trained.
    """

    def __init__(self, vocab_size, d_model, padding_idx=None, scale=True):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.multiplier = math.sqrt(d_model) if scale else 1.0

    @property
    def weight(self):
        """The (vocab_size, d_model) table, e.g. to tie an output layer to it."""
        return self.embedding.weight

    def forward(self, ids):
        return self.embedding(ids) * self.multiplier  # (..., d_model)


class LearnedPositionalEmbedding(nn.Module):
    """A trainable (max_positions, d_model) table (`self.table`, an nn.Embedding): row t is added to
    the token at position t (BERT, GPT-2).

    forward((B, T) ids) -> (B, T, d_model); forward(T) -> (T, d_model). `start` shifts the positions to
    start, ..., start + T - 1: a decoder that caches its past feeds new tokens at the positions that
    follow it. A position past the table raises ValueError.
    """

    def __init__(self, max_positions, d_model):
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)

    def forward(self, ids_or_length, start=0):
        length = ids_or_length if isinstance(ids_or_length, int) else ids_or_length.shape[-1]
        if start < 0 or start + length > self.max_positions:
            raise ValueError(f"positions {start}..{start + length - 1} do not fit max_positions="
                             f"{self.max_positions}: the table has rows for positions 0..{self.max_positions - 1} only")
        positions = torch.arange(start, start + length, device=self.table.weight.device)
        rows = self.table(positions)                                              # (T, d_model)
        if isinstance(ids_or_length, int):
            return rows
        return rows.expand(*ids_or_length.shape[:-1], length, rows.shape[-1])     # (B, T, d_model)


class FeedForward(nn.Module):
    """Position-wise feed-forward sublayer: linear1 (d_model -> d_ff), GELU, linear2 (d_ff -> d_model).

    approximate="none" is the exact GELU x·Φ(x) (BERT); approximate="tanh" is the tanh approximation
    (GPT-2's "gelu_new"). The two differ by up to about 5e-4.
    forward: x (..., d_model) -> (..., d_model), the same MLP at every position.
    """

    def __init__(self, d_model, d_ff, approximate="none"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.approximate = approximate

    def forward(self, x):
        return self.linear2(F.gelu(self.linear1(x), approximate=self.approximate))  # (..., d_ff) in between


class LayerNorm(nn.Module):
    """Layer normalisation over the last dimension, the same as nn.LayerNorm(d_model, eps=eps).

    Parameters: weight (the gain γ, starts at 1) and bias (the shift β, starts at 0), both (d_model,).
    The variance divides by d (biased), and eps sits inside the square root. BERT's eps is 1e-12
    (the default here, as in notebook 07); GPT-2's is 1e-5.
    """

    def __init__(self, d_model, eps=1e-12):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)                       # (..., 1)
        variance = x.var(dim=-1, keepdim=True, unbiased=False)    # (..., 1), divides by d
        return (x - mean) / torch.sqrt(variance + self.eps) * self.weight + self.bias


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sublayers, each with a residual connection and a LayerNorm:
    post-LN (the 2017 Transformer, BERT) when norm_first=False, pre-LN (GPT-2) when norm_first=True.

    Submodules: self_attn (courselib.attention.MultiHeadAttention), ffn (FeedForward), norm1 (the
    attention sublayer's), norm2 (the feed-forward sublayer's), dropout (on each sublayer's output,
    before the residual sum). `approximate` picks the FFN's GELU (see FeedForward).
    forward: x (B, T, d_model), mask (bool, True = may attend, broadcastable to (B, h, T, T))
    -> (B, T, d_model). With a causal mask and norm_first=True this is a GPT-2 block.
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-12, approximate="none"):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, approximate=approximate)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        if self.norm_first:  # pre-LN: only the sublayer's input is normalised; the residual path stays raw
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))   # post-LN: normalise the sum
        return self.norm2(x + self.dropout(self.ffn(x)))                    # (B, T, d_model)


__all__ = ["EncoderLayer", "FeedForward", "LayerNorm", "LearnedPositionalEmbedding", "TokenEmbedding"]
