"""The modern decoder's pieces, as the course's references, and the helpers notebook 09 uses beside them.

Learners write the pieces in earlier notebooks' stretch exercises; notebook 09 reaches their versions through
`courselib.seam.earlier(...)` and falls back on these when an earlier notebook is unfinished:

| reference | learners write it in | what it is |
| --- | --- | --- |
| `apply_rope(q, k, positions=None, base=10000.0)` | 03 | rotary embeddings, rotate_half layout (pair i = i, i + d/2) |
| `grouped_query_attention(q, k, v, mask=None)` | 05 | each group of consecutive query heads shares a key/value head |
| `RMSNorm(d_model, eps=1e-6)` | 07 | x / sqrt(mean(x²) + eps) · weight: no centring, no shift |
| `SwiGLUFeedForward(d_model, d_ff)` | 07 | down_proj(silu(gate_proj(x)) * up_proj(x)), no biases |

Beside them: `llama_config` (the transformers `LlamaConfig` of a size), `load_llama_weights` (a `LlamaForCausalLM`
state dict into a model with Hugging Face's names) and `exact_float64` (transformers' Llama computing in float64
throughout, for 1e-12 comparisons). The Llama model itself, which notebook 09's learners write, is
`courselib.llama_model` (09's grading kernel never imports it).
autograder/tests/test_gpt_lib.py proves every piece against transformers.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def apply_rope(q, k, positions=None, base=10000.0):
    """Rotate q and k (..., T, d), d even, by their positions (T,) (default 0..T-1): pair i is (i, i + d/2),
    turned by the angle position * base^(-2i/d). Returns (q_rotated, k_rotated)."""
    T, d = q.shape[-2], q.shape[-1]
    if positions is None:
        positions = torch.arange(T, device=q.device)
    half = d // 2
    theta = base ** (-2 * torch.arange(half, dtype=q.dtype, device=q.device) / d)   # (d/2,)
    angles = positions.to(q.dtype)[:, None] * theta                                  # (T, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)

    def rotate(x):
        first, second = x[..., :half], x[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    return rotate(q), rotate(k)


def grouped_query_attention(q, k, v, mask=None):
    """q (B, h, T, d_head), k and v (B, h_kv, S, d_head) with h_kv dividing h: query head i reads key/value head
    i // (h / h_kv). mask: bool, True = may attend. Returns (output (B, h, T, d_head), weights (B, h, T, S))."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)     # (B, h, S, d_head)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


class RMSNorm(nn.Module):
    """x / sqrt(mean(x², last dim) + eps) · weight (Llama's norm). Parameter: weight (d_model,), starting at 1."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class SwiGLUFeedForward(nn.Module):
    """Llama's gated MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), all three nn.Linear without biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def llama_config(vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, max_positions, eps=1e-6,
                 rope_base=10000.0):
    """The transformers LlamaConfig of these sizes (eager attention, no biases, untied head, no dropout)."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=num_layers,
                       num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=d_ff,
                       max_position_embeddings=max_positions, rms_norm_eps=eps,
                       rope_parameters={"rope_type": "default", "rope_theta": rope_base}, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, tie_word_embeddings=False, attention_dropout=0.0,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")


def load_llama_weights(model, hf):
    """Copy a LlamaForCausalLM into a Llama of the same size, in place (the names are the same, without the
    "model." prefix; every weight is nn.Linear's (out, in), so nothing is transposed). Returns model."""
    theirs = {name.removeprefix("model."): value for name, value in hf.state_dict().items()}
    with torch.no_grad():
        model.load_state_dict(theirs, strict=True)
    return model


def exact_float64(hf):
    """Make a transformers Llama compute in float64 throughout, in place, and return it.

    Even in a float64 model, transformers computes RoPE's angles and RMSNorm in float32 (for half-precision
    training), and its eager attention takes the softmax in float32; the three limit a comparison to about 1e-6.
    This switches the attention to PyTorch's SDPA and the other two to float64 (the same formulas), so that a
    float64 comparison can ask for 1e-12.
    """
    import types

    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        config = self.config
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[..., None].double() * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    hf.double()
    hf.set_attn_implementation("sdpa")
    for module in hf.modules():
        if isinstance(module, LlamaRMSNorm):
            module.forward = types.MethodType(rms_norm, module)
        elif isinstance(module, LlamaRotaryEmbedding):
            module.forward = types.MethodType(rotary, module)
    return hf
