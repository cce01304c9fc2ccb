"""Reference attention building blocks that later notebooks import instead of re-deriving.

Notebook 04 teaches `scaled_dot_product_attention`, 05 `MultiHeadAttention`, 06 the masks; from
07 on, notebooks use these. Masks are boolean and True means "may attend", as in
`torch.nn.functional.scaled_dot_product_attention`.
"""
import math

import torch
from torch import nn


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v. q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v).

    Returns (output (..., T_q, d_v), weights (..., T_q, T_k)).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)
    weights = masked_softmax(scores, mask) if mask is not None else torch.softmax(scores, dim=-1)
    return weights @ v, weights


def masked_softmax(scores, mask, dim=-1):
    """Softmax where mask is False gets weight 0; a row with nothing to attend to is all zeros."""
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=dim)
    return torch.nan_to_num(weights, nan=0.0)  # a fully masked row is exp(-inf)/0 = NaN


def causal_mask(T, device=None):
    """(T, T): query t may attend to keys 0..t."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def padding_mask(input_ids, pad_id):
    """(B, 1, 1, T): False at padding keys; broadcasts over heads and queries."""
    return (input_ids != pad_id)[:, None, None, :]


def causal_padding_mask(input_ids, pad_id):
    """(B, 1, T, T): causal and not padding."""
    return causal_mask(input_ids.shape[-1], input_ids.device) & padding_mask(input_ids, pad_id)


def split_heads(x, num_heads):
    """(B, T, d_model) -> (B, h, T, d_model / h)."""
    B, T, d_model = x.shape
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
    return x.view(B, T, num_heads, d_model // num_heads).transpose(1, 2)


def merge_heads(x):
    """(B, h, T, d_head) -> (B, T, h * d_head), the inverse of split_heads."""
    B, h, T, d_head = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_head)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention over d_model / h wide projections."""

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, h, T_q, d_head)
        k = split_heads(self.k_proj(key), self.num_heads)    # (B, h, T_k, d_head)
        v = split_heads(self.v_proj(value), self.num_heads)  # (B, h, T_k, d_head)
        output, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.out_proj(merge_heads(output)), weights   # (B, T_q, d_model), (B, h, T_q, T_k)
