"""What notebook 13 ("Inside your GPT") builds on: the shipped GPT in notebook 09's class, a tiny attention-only
model, and the pictures. Nothing here answers one of notebook 13's exercises (the hooks, the scores, the logit
lens, patching and ablation are the learner's; the judges hold the oracles).

    model, tokenizer = load_shipped_gpt()            # 09's GPT layout (courselib.fused_gpt), the shipped weights
    ids = encode(tokenizer, "Once upon a time,")     # (1, T), <|endoftext|> first, as the model was trained
    toy = AttentionOnlyGPT(vocab_size=32, d_model=64, num_layers=2, num_heads=4, max_positions=25)

`load_shipped_gpt(GPT)` builds any class with notebook 09's constructor and parameter names (the learner's own,
through `courselib.seam.earlier`) and copies the shipped checkpoint into it from its safetensors file, without
importing transformers: GPT-2's `Conv1D` weights are stored (in, out) and are transposed into nn.Linear's
(out, in). `AttentionOnlyGPT` is the same model with the feed-forward sublayers taken out: its blocks have
`norm1` and `self_attn` (09's fused `c_attn` and `c_proj`) only, so every hook that works on the GPT works on it.
"""
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from courselib.blocks import LayerNorm, LearnedPositionalEmbedding, TokenEmbedding
from courselib.fused_gpt import GPT as ReferenceGPT
from courselib.fused_gpt import CausalSelfAttention
from courselib.gpt import EOS, MODEL_DIR

SHIPPED = dict(vocab_size=1024, d_model=128, num_layers=4, num_heads=4, max_positions=128, d_ff=512)


# ------------------------------------------------------------------------------------------ the shipped GPT
def shipped_state_dict():
    """The shipped GPT2LMHeadModel's tensors under notebook 09's parameter names (Conv1D weights transposed)."""
    from safetensors.torch import load_file

    hf = load_file(MODEL_DIR / "model.safetensors")
    ours = {"token_embeddings.embedding.weight": hf["transformer.wte.weight"],
            "position_embeddings.table.weight": hf["transformer.wpe.weight"],
            "final_norm.weight": hf["transformer.ln_f.weight"], "final_norm.bias": hf["transformer.ln_f.bias"],
            "lm_head.weight": hf["transformer.wte.weight"]}
    for i in range(SHIPPED["num_layers"]):
        theirs = f"transformer.h.{i}."
        pairs = [("norm1", "ln_1", False), ("self_attn.c_attn", "attn.c_attn", True),
                 ("self_attn.c_proj", "attn.c_proj", True), ("norm2", "ln_2", False),
                 ("ffn.linear1", "mlp.c_fc", True), ("ffn.linear2", "mlp.c_proj", True)]
        for name, hf_name, transpose in pairs:
            weight = hf[theirs + hf_name + ".weight"]
            ours[f"blocks.{i}.{name}.weight"] = weight.T.contiguous() if transpose else weight
            ours[f"blocks.{i}.{name}.bias"] = hf[theirs + hf_name + ".bias"]
    return ours


def load_tokenizer():
    """The shipped byte-level BPE tokenizer (`tokenizers.Tokenizer`, no transformers import)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def load_shipped_gpt(GPT=ReferenceGPT):
    """The shipped trained GPT in class `GPT` (notebook 09's constructor and names), eval mode, and the tokenizer."""
    model = GPT(SHIPPED["vocab_size"], SHIPPED["d_model"], SHIPPED["num_layers"], SHIPPED["num_heads"],
                SHIPPED["max_positions"])
    state = shipped_state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name not in state:
                raise KeyError(f"{type(model).__name__} has a parameter {name!r} that GPT-2's layout does not")
            tensor.copy_(state[name])
    return model.eval(), load_tokenizer()


def encode(tokenizer, text, eos=True):
    """(1, T) token ids of `text`, after <|endoftext|> when `eos` (the shipped model saw every story after one)."""
    return torch.tensor([tokenizer.encode((EOS if eos else "") + text).ids])


def tokens(tokenizer, ids):
    """The text of each token of a 1-D sequence of ids, for labels ("<eos>" for <|endoftext|>)."""
    return [tokenizer.decode([int(i)], skip_special_tokens=False).replace(EOS, "<eos>") for i in ids]


# --------------------------------------------------------------------------------- an attention-only model
class AttentionOnlyBlock(nn.Module):
    """x + self_attn(norm1(x)): notebook 09's block without the feed-forward sublayer."""

    def __init__(self, d_model, num_heads, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = CausalSelfAttention(d_model, num_heads)

    def forward(self, x):
        return x + self.self_attn(self.norm1(x))


class AttentionOnlyGPT(nn.Module):
    """Token + learned position embeddings, attention-only blocks, final_norm and an untied lm_head.

    forward(input_ids (B, T)) -> logits (B, T, V). The submodule names are notebook 09's GPT's.
    """

    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, eps=1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale=False)
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.blocks = nn.ModuleList(AttentionOnlyBlock(d_model, num_heads, eps) for _ in range(num_layers))
        self.final_norm = LayerNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids):
        x = self.token_embeddings(input_ids) + self.position_embeddings(input_ids)   # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))                                      # (B, T, V)
