"""The course's reference Llama-style language model, with a KV cache: what notebook 09's learners write.

Built from `courselib.llama`'s pieces (the references of notebooks 03, 05 and 07: `apply_rope`,
`grouped_query_attention`, `RMSNorm`, `SwiGLUFeedForward`) with Hugging Face's `LlamaForCausalLM` names
(`embed_tokens`, `layers[i].input_layernorm`, `.self_attn.{q,k,v,o}_proj`, `.post_attention_layernorm`, `.mlp`,
`norm`, `lm_head`), so that `courselib.llama.load_llama_weights` copies its state dict by name. No biases
anywhere; the head is untied, as in Llama 2 and Llama 3 8B.

`Llama.forward(ids, cache)` runs with a KV cache (`new_cache()`: one entry per layer, None or (keys, values)):
the new tokens take the positions after the cached ones, their keys are rotated by those positions before they
are stored, and each layer stores num_kv_heads heads, not num_heads (grouped-query attention's saving).

Notebook 09's learners write `LlamaAttention`, `LlamaBlock`, `Llama` and the cached forward, so its grading
kernel never imports this module (its cells and hidden checks import `courselib.llama`'s helpers only).
autograder/tests/test_gpt_lib.py proves it against transformers.
"""
import torch
from torch import nn

from courselib.llama import RMSNorm, SwiGLUFeedForward, apply_rope, grouped_query_attention


class LlamaAttention(nn.Module):
    """Causal grouped-query attention with rotary positions: q_proj (d -> h d_head), k_proj and v_proj
    (d -> h_kv d_head), o_proj (h d_head -> d), no biases. forward: x (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        if d_model % num_heads or num_heads % num_kv_heads:
            raise ValueError("num_heads must divide d_model, and num_kv_heads must divide num_heads")
        self.num_heads, self.num_kv_heads, self.rope_base = num_heads, num_kv_heads, rope_base
        self.d_head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(num_heads * self.d_head, d_model, bias=False)

    def forward(self, x, past=None):
        """x (B, T, d) after `past` (keys, values), each (B, h_kv, T_past, d_head), or None. Returns the output
        (B, T, d) when past is None and no cache is wanted; see forward_cached."""
        return self.forward_cached(x, past)[0]

    def forward_cached(self, x, past):
        """(output (B, T, d), (keys, values) of all T_past + T positions, keys already rotated)."""
        B, T, _ = x.shape
        start = 0 if past is None else past[0].shape[-2]
        q = self.q_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)       # (B, h, T, d_head)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)    # (B, h_kv, T, d_head)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)
        positions = torch.arange(start, start + T, device=x.device)
        q, k = apply_rope(q, k, positions, base=self.rope_base)                          # per head, by position
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)        # (B, h_kv, T_all, d_head)
        total = start + T
        mask = torch.ones(total, total, dtype=torch.bool, device=x.device).tril()[start:]   # (T, T_all)
        heads, _ = grouped_query_attention(q, k, v, mask)                               # (B, h, T, d_head)
        return self.o_proj(heads.transpose(1, 2).reshape(B, T, -1)), (k, v)


class LlamaBlock(nn.Module):
    """Pre-norm block: x + self_attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x))."""

    def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = LlamaAttention(d_model, num_heads, num_kv_heads, rope_base)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLUFeedForward(d_model, d_ff)

    def forward(self, x, past=None):
        """x (B, T, d) -> (x, the layer's new cache entry)."""
        attended, present = self.self_attn.forward_cached(self.input_layernorm(x), past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Llama(nn.Module):
    """A Llama-style LM: embed_tokens, layers (LlamaBlock), norm (RMSNorm), lm_head (untied, no bias).

    forward(input_ids (B, T), cache=None) -> logits (B, T, V). No position table: RoPE carries the positions, so
    max_positions only states the context the model is trained for (generate() checks it). `cache` (from
    new_cache()) is updated in place; the new tokens take the positions after it.
    """

    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, max_positions, eps=1e-6,
                 rope_base=10000.0):
        super().__init__()
        self.max_positions = max_positions
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, eps, rope_base)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():   # Llama's initialisation: N(0, 0.02) for every matrix, norms at 1
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def new_cache(self):
        return [None] * len(self.layers)

    def forward(self, input_ids, cache=None):
        x = self.embed_tokens(input_ids)                  # (B, T, d)
        for i, layer in enumerate(self.layers):
            x, present = layer(x, None if cache is None else cache[i])
            if cache is not None:
                cache[i] = present
        return self.lm_head(self.norm(x))                 # (B, T, V)


def llama_like(config):
    """A Llama with the sizes of a transformers LlamaConfig (default RoPE, no biases, untied head)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or config.attention_bias or config.mlp_bias:
        raise ValueError("Llama implements default RoPE and bias-free layers only")
    if config.tie_word_embeddings or config.hidden_act != "silu":
        raise ValueError("Llama has an untied head and SiLU gates")
    return Llama(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                 config.num_key_value_heads, config.intermediate_size, config.max_position_embeddings,
                 config.rms_norm_eps, rope.get("rope_theta", 10000.0))
