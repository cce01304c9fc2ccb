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
from courselib.stories import EOS, MODEL_DIR

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

    def __init__(self, d_model, num_heads, eps=1e-5, layer_norm=True):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps) if layer_norm else nn.Identity()
        self.self_attn = CausalSelfAttention(d_model, num_heads)

    def forward(self, x):
        return x + self.self_attn(self.norm1(x))


class AttentionOnlyGPT(nn.Module):
    """Token + learned position embeddings, attention-only blocks, final_norm and an untied lm_head.

    forward(input_ids (B, T), start=0) -> logits (B, T, V); the tokens take positions start .. start + T - 1.
    The submodule names are notebook 09's GPT's. With layer_norm=False, norm1 and final_norm are identities
    (notebook 13's induction model has none).
    """

    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, eps=1e-5, layer_norm=True):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale=False)
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.blocks = nn.ModuleList(AttentionOnlyBlock(d_model, num_heads, eps, layer_norm)
                                    for _ in range(num_layers))
        self.final_norm = LayerNorm(d_model, eps) if layer_norm else nn.Identity()
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids, start=0):
        x = self.token_embeddings(input_ids) + self.position_embeddings(input_ids, start=start)   # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))                                      # (B, T, V)


def train_induction(model, make_batch, steps, lengths=(3, 6), batch_size=64, lr=3e-3, seed=0, monitor=None):
    """Adam on the next-token loss of batches `make_batch(batch_size, length, vocab_size, generator)`.

    Each step draws its `length` from `lengths` (inclusive) and a random start in the position table, so that
    neither a fixed distance back nor an absolute position tells where the copy of a token is: only finding the
    token's earlier occurrence does. Returns the list of losses; `monitor` (a TrainingMonitor) is updated each step.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    vocab_size = model.lm_head.out_features
    low, high = lengths
    losses = []
    model.train()
    for step in range(steps):
        length = int(torch.randint(low, high + 1, (1,), generator=generator))
        ids = make_batch(batch_size, length, vocab_size, generator)                     # (B, 1 + 2 length)
        start = int(torch.randint(0, model.max_positions - ids.shape[1] + 1, (1,), generator=generator))
        logits = model(ids, start=start)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab_size), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if monitor is not None:
            monitor.update(step, loss.item())
    return losses


# --------------------------------------------------------------------------------------- the name stories
# (the main character, the friend who helps, the friend of the corrupted run): one-token names, both friends he's
NAME_PAIRS = [("Zoe", "Ben", "Max"), ("Lily", "Tom", "Sam"), ("Mia", "Leo", "Jack"), ("Anna", "Finn", "Noah"),
              ("Lucy", "Emma", "Sara")]


def name_story(name, friend):
    """A lost-toy story of the corpus's kind, stopped where the next token is the friend's name."""
    return (f"Once upon a time, {name} could not find her doll. She looked under the bed and on the shelf, but it "
            f"was not there. {name} was sad. {friend} came to help. {friend} looked in the toy box and said, "
            f"\"Here it is!\" {name} smiled and said, \"Thank you,")


def name_id(tokenizer, name):
    """The id of " name" (one token for every name of the corpus)."""
    ids = tokenizer.encode(" " + name).ids
    if len(ids) != 1:
        raise ValueError(f"{name!r} is {len(ids)} tokens")
    return ids[0]


def shipped_name_prompts(pairs=NAME_PAIRS):
    """[(clean ids (1, T), corrupted ids (1, T), the clean friend's id, the corrupted friend's id)] per pair."""
    tokenizer = load_tokenizer()
    return [(encode(tokenizer, name_story(name, friend)), encode(tokenizer, name_story(name, other)),
             name_id(tokenizer, friend), name_id(tokenizer, other)) for name, friend, other in pairs]


# ------------------------------------------------------------------------------------------------ pictures
def heatmap(values, row_labels=None, col_labels=None, title="", xlabel="", ylabel="", ax=None, cmap="viridis",
            centre=None, annotate=None, fmt="{:.2f}"):
    """A 2-D array as an image with labelled rows and columns; `centre` makes a diverging scale around it."""
    values = values.detach().cpu().numpy() if hasattr(values, "detach") else np.asarray(values, dtype=float)
    rows, cols = values.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14.0, 1.5 + 0.45 * cols), min(8.0, 1.2 + 0.45 * rows)))
    kwargs = {}
    if centre is not None:
        reach = max(float(np.abs(values - centre).max()), 1e-9)
        kwargs = dict(vmin=centre - reach, vmax=centre + reach)
    image = ax.imshow(values, cmap=cmap, aspect="auto", **kwargs)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(cols), col_labels if col_labels is not None else range(cols),
                  rotation=90 if col_labels is not None and cols > 8 else 0)
    ax.set_yticks(range(rows), row_labels if row_labels is not None else range(rows))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate if annotate is not None else rows * cols <= 64:
        middle = (np.nanmax(values) + np.nanmin(values)) / 2
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if (values[i, j] < middle) == (centre is None) else "black")
    return ax


def plot_head_patterns(pattern, labels, title="", titles=None):
    """Attention patterns (n, T, T) side by side, one panel each (titled "head i" unless `titles` are given)."""
    heads = pattern.shape[0]
    figure, axes = plt.subplots(1, heads, figsize=(3.2 * heads, 3.4))
    for head, ax in enumerate(np.atleast_1d(axes)):
        ax.imshow(pattern[head].detach().cpu().numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(titles[head] if titles is not None else f"head {head}")
        step = max(1, len(labels) // 12)
        ax.set_xticks(range(0, len(labels), step), labels[::step], rotation=90, fontsize=7)
        ax.set_yticks(range(0, len(labels), step), labels[::step], fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_in_context_loss(losses, length, title="loss at each position", ax=None, labels=None):
    """Per-position losses (one curve each, a dict label -> (T - 1,) values), the copy's start marked."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.5))
    for label, values in losses.items():
        ax.plot(range(1, len(values) + 1), np.asarray(values, dtype=float), marker="o", label=label)
    ax.axvline(length + 0.5, color="grey", linestyle="--")
    ax.text(length + 0.7, ax.get_ylim()[1] * 0.9, "the copy starts", color="grey")
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel("loss (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def log_uniform(vocab_size):
    """ln V: the loss of a uniform guess."""
    return math.log(vocab_size)
