"""The judges' oracles that stand in for a library the grading kernel does not import (its import would cost
every student seconds), proven equal to that library here."""
import numpy as np
import pytest
import torch

from autograder.judges.positional_encoding import oracle_rope

# transformers computes the angles in float32: at position 4000 that is off by about 4000 * 6e-8 radians
ATOL = 1e-3


@pytest.mark.parametrize("d, base, first_position", [(16, 10000.0, 0), (8, 500.0, 100), (32, 1e6, 4000)])
def test_oracle_rope_is_transformers_llama_rotary_embedding(d, base, first_position):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, 3, 12, d, generator=g), torch.randn(2, 3, 12, d, generator=g)  # (B, heads, T, d)
    positions = torch.arange(first_position, first_position + 12)
    config = LlamaConfig(hidden_size=3 * d, num_attention_heads=3, head_dim=d,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])                      # (1, T, d) each
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    for x, their in zip((q, k), theirs):
        np.testing.assert_allclose(oracle_rope(x.numpy(), positions.numpy(), base), their.numpy(), rtol=0, atol=ATOL)
    # two of the judge's diagnoses, made from Hugging Face's code: the other layout and the other direction
    neighbours = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    interleaved = apply_rotary_pos_emb(q[..., neighbours], k, cos, sin)[0][..., neighbours.argsort()]
    np.testing.assert_allclose(oracle_rope(q.numpy(), positions.numpy(), base, layout="interleaved"),
                               interleaved.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(oracle_rope(q.numpy(), positions.numpy(), base, sign=-1.0),
                               apply_rotary_pos_emb(q, k, cos, -sin)[0].numpy(), rtol=0, atol=ATOL)
