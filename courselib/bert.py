"""The reference MiniBert: notebook 07's BERT encoder, built from `courselib.blocks`, and its loader.

Notebook 07 teaches it; later notebooks import it (08 puts a masked-LM head on it). Same constructor,
submodule and parameter names as 07's `MiniBert`, so a state dict of one loads into the other:

| `MiniBert` | Hugging Face `BertModel` (inside `BertForMaskedLM`: `bert.` in front) |
| --- | --- |
| `token_embeddings` | `embeddings.word_embeddings` |
| `position_embeddings` | `embeddings.position_embeddings` |
| `segment_embeddings` | `embeddings.token_type_embeddings` |
| `embedding_norm` | `embeddings.LayerNorm` |
| `layers[i].self_attn.q_proj`, `k_proj`, `v_proj` | `encoder.layer[i].attention.self.query`, `key`, `value` |
| `layers[i].self_attn.out_proj` | `encoder.layer[i].attention.output.dense` |
| `layers[i].norm1` | `encoder.layer[i].attention.output.LayerNorm` |
| `layers[i].ffn.linear1`, `linear2` | `encoder.layer[i].intermediate.dense`, `output.dense` |
| `layers[i].norm2` | `encoder.layer[i].output.LayerNorm` |

    model = minibert_like(hf_bert.config)          # the sizes of any BertConfig
    load_hf_bert_weights(model, hf_bert)           # a BertModel, a BertForMaskedLM, or a state dict

and back (notebook 08 pre-trains a MiniBert with its masked-LM head, then hands it to `transformers`):

    hf_mlm = to_hf_bert_for_masked_lm(model, head, config)   # a BertForMaskedLM with the same weights

The head (`dense`, `norm`, `decoder` tied to `token_embeddings`) maps to `cls.predictions.transform.dense`,
`cls.predictions.transform.LayerNorm` and `cls.predictions.bias` (`mlm_head_hf_names`).

Notebook 08's own exercises have references here too, for its hidden tests (which grade one exercise at a
time by swapping them in) and for later notebooks: `mask_tokens` (the 80/10/10 corruption), `mlm_loss`,
`MaskedLMHead` (tied to the token embeddings) and `MiniBertForMaskedLM` (an encoder and a head: ids -> logits).
`load_hf_masked_lm_weights` loads a whole `BertForMaskedLM` into a `MiniBertForMaskedLM`.

autograder/tests/test_courselib.py proves parity with `transformers.BertModel` and, through the export, with
`BertForMaskedLM` (float64, eager attention).
"""
import torch
import torch.nn.functional as F
from torch import nn

from courselib.attention import padding_mask
from courselib.blocks import EncoderLayer, LayerNorm


class MiniBert(nn.Module):
    """BERT's encoder: token + position + segment embeddings, LayerNorm, dropout, then post-LN layers.

    forward(input_ids, attention_mask=None, token_type_ids=None): (B, T) integer tensors, attention_mask
    1 for real tokens and 0 for padding. Returns the last hidden states (B, T, d_model).
    """

    def __init__(self, vocab_size, d_model, num_layers, num_heads, d_ff, max_positions, type_vocab_size=2,
                 dropout=0.1, eps=1e-12):
        super().__init__()
        self.d_model = d_model
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.position_embeddings = nn.Embedding(max_positions, d_model)   # learned, row t for position t
        self.segment_embeddings = nn.Embedding(type_vocab_size, d_model)  # sentence A / B
        self.embedding_norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=False, eps=eps)
                                    for _ in range(num_layers))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)                              # one segment
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)        # (T,), from 0
        x = (self.token_embeddings(input_ids) + self.position_embeddings(positions)
             + self.segment_embeddings(token_type_ids))                              # (B, T, d_model)
        x = self.dropout(self.embedding_norm(x))
        mask = None if attention_mask is None else padding_mask(attention_mask, 0)   # (B, 1, 1, T)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def minibert_like(config):
    """A MiniBert with the sizes of a transformers BertConfig (absolute positions, exact GELU)."""
    if config.hidden_act != "gelu" or getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("MiniBert implements BERT's exact GELU and absolute (learned) positions only")
    return MiniBert(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                    config.intermediate_size, config.max_position_embeddings, config.type_vocab_size,
                    dropout=config.hidden_dropout_prob, eps=config.layer_norm_eps)


def init_bert_weights(model, std=0.02):
    """BERT's initialisation, in place (returns model): every nn.Linear and nn.Embedding weight from
    normal(0, std) (`config.initializer_range`, 0.02), biases at zero; LayerNorms keep their (1, 0).
    PyTorch's defaults draw embeddings from normal(0, 1): a decoder tied to them starts far from uniform."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    return model


def hf_names(num_layers):
    """{MiniBert parameter name: BertModel parameter name}, the table above."""
    names = {"token_embeddings.weight": "embeddings.word_embeddings.weight",
             "position_embeddings.weight": "embeddings.position_embeddings.weight",
             "segment_embeddings.weight": "embeddings.token_type_embeddings.weight"}
    pairs = {"embedding_norm": "embeddings.LayerNorm"}
    for i in range(num_layers):
        ours, theirs = f"layers.{i}.", f"encoder.layer.{i}."
        pairs.update({f"{ours}self_attn.q_proj": f"{theirs}attention.self.query",
                      f"{ours}self_attn.k_proj": f"{theirs}attention.self.key",
                      f"{ours}self_attn.v_proj": f"{theirs}attention.self.value",
                      f"{ours}self_attn.out_proj": f"{theirs}attention.output.dense",
                      f"{ours}norm1": f"{theirs}attention.output.LayerNorm",
                      f"{ours}ffn.linear1": f"{theirs}intermediate.dense",
                      f"{ours}ffn.linear2": f"{theirs}output.dense",
                      f"{ours}norm2": f"{theirs}output.LayerNorm"})
    for ours, theirs in pairs.items():  # nn.Linear is (out, in) in both models: no transpose
        names[f"{ours}.weight"], names[f"{ours}.bias"] = f"{theirs}.weight", f"{theirs}.bias"
    return names


def load_hf_bert_weights(model, hf_bert):
    """Copy a Hugging Face BERT's encoder weights into a MiniBert of the same size, in place; returns model.

    hf_bert: a BertModel, a BertForMaskedLM (or any model that keeps its BertModel in `.bert`), or the
    state dict of one. The pooler and any head are not MiniBert's and are left out. A missing tensor or
    one of another shape raises ValueError.
    """
    state = hf_bert.state_dict() if isinstance(hf_bert, nn.Module) else dict(hf_bert)
    if not any(key.startswith("embeddings.") for key in state):  # BertForMaskedLM & co.: "bert." in front
        state = {key[len("bert."):]: value for key, value in state.items() if key.startswith("bert.")}
    ours = model.state_dict()
    with torch.no_grad():
        for name, theirs in hf_names(len(model.layers)).items():
            if theirs not in state:
                raise ValueError(f"the Hugging Face weights have no {theirs} (for MiniBert's {name})")
            if tuple(state[theirs].shape) != tuple(ours[name].shape):
                raise ValueError(f"{theirs} has shape {tuple(state[theirs].shape)}, MiniBert's {name} "
                                 f"{tuple(ours[name].shape)}: build the MiniBert with minibert_like(config)")
            ours[name].copy_(state[theirs])
    depth = len({key.split(".")[2] for key in state if key.startswith("encoder.layer.")})
    if depth != len(model.layers):
        raise ValueError(f"the Hugging Face model has {depth} layers, this MiniBert {len(model.layers)}")
    return model


def mlm_head_hf_names():
    """{masked-LM head parameter name: BertForMaskedLM parameter name}. The decoder's weight is not listed:
    it is the token embedding matrix (tied), exported with the encoder."""
    ours = {"dense": "cls.predictions.transform.dense", "norm": "cls.predictions.transform.LayerNorm"}
    names = {f"{a}.{kind}": f"{b}.{kind}" for a, b in ours.items() for kind in ("weight", "bias")}
    names["decoder.bias"] = "cls.predictions.bias"
    return names


def to_hf_bert_for_masked_lm(model, head, config):
    """The reverse of `load_hf_bert_weights`, head included: a new transformers BertForMaskedLM(config), in
    model's dtype and in eval mode, holding the weights of a MiniBert `model` and of its masked-LM `head`
    (submodules `dense`, `norm` and `decoder`, the decoder's weight tied to model.token_embeddings).

    config must give the same sizes (`minibert_like(config)` builds such a MiniBert). A missing tensor, one of
    another shape, another depth or an untied decoder raises ValueError. Neither model is changed, and the
    global random number generator is left as it was.
    """
    from transformers import BertForMaskedLM

    decoder_weight = getattr(getattr(head, "decoder", None), "weight", None)
    if decoder_weight is not model.token_embeddings.weight:
        raise ValueError("the head's decoder.weight is not the MiniBert's token_embeddings.weight: BertForMaskedLM "
                         "ties them (one tensor), so an untied head cannot be exported")
    if config.num_hidden_layers != len(model.layers):
        raise ValueError(f"the config has {config.num_hidden_layers} layers, this MiniBert {len(model.layers)}")
    with torch.random.fork_rng(devices=[]):   # BertForMaskedLM draws its (overwritten) initial weights
        hf_mlm = BertForMaskedLM(config).to(model.token_embeddings.weight.dtype)
    theirs = hf_mlm.state_dict()             # tensors that share storage with hf_mlm's parameters
    sources = [(model.state_dict(), {ours: f"bert.{name}" for ours, name in hf_names(len(model.layers)).items()},
                "MiniBert"), (head.state_dict(), mlm_head_hf_names(), "the head")]
    with torch.no_grad():
        for state, names, owner in sources:
            for name, target in names.items():
                if name not in state:
                    raise ValueError(f"{owner} has no {name} (for BertForMaskedLM's {target})")
                if tuple(state[name].shape) != tuple(theirs[target].shape):
                    raise ValueError(f"{owner}'s {name} has shape {tuple(state[name].shape)}, BertForMaskedLM's "
                                     f"{target} {tuple(theirs[target].shape)}: use the config the MiniBert was "
                                     "built from")
                theirs[target].copy_(state[name])
    written = {target for _, names, _ in sources for target in names.values()}
    left = [name for name, _ in hf_mlm.named_parameters() if name not in written]   # tied ones listed once
    if left:
        raise ValueError(f"BertForMaskedLM({type(config).__name__}) has parameters that MiniBert has no match for: "
                         f"{', '.join(left)}")
    if hf_mlm.cls.predictions.decoder.weight is not hf_mlm.bert.embeddings.word_embeddings.weight:
        raise ValueError("this config does not tie BertForMaskedLM's decoder to its embeddings "
                         "(tie_word_embeddings=False): the MiniBert's head is tied")
    return hf_mlm.eval()


# ---------------------------------------------------------------- notebook 08's masked language model
def mask_tokens(input_ids, mask_token_id, vocab_size, special_tokens_mask=None, mlm_probability=0.15,
                generator=None):
    """BERT's masked-LM corruption of a batch (notebook 08, exercise 1): (inputs, labels), both like input_ids.

    Each token that special_tokens_mask does not mark is selected with probability mlm_probability; labels hold
    the original id there and -100 elsewhere. Of the selected tokens 80% become mask_token_id, 10% a random id in
    0..vocab_size-1 and 10% stay. Every random number comes from `generator` (None: the global one), in this
    order: selection, [MASK], random-or-kept, the random ids. input_ids is not changed.
    """
    inputs, labels = input_ids.clone(), input_ids.clone()
    probability = torch.full(input_ids.shape, mlm_probability)               # (B, T)
    if special_tokens_mask is not None:
        probability.masked_fill_(special_tokens_mask.bool(), 0.0)            # never [CLS], [SEP], [PAD]
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels[~selected] = -100                                                 # cross_entropy's ignore_index
    to_mask = selected & torch.bernoulli(torch.full(input_ids.shape, 0.8), generator=generator).bool()
    inputs[to_mask] = mask_token_id
    to_random = selected & ~to_mask & torch.bernoulli(torch.full(input_ids.shape, 0.5), generator=generator).bool()
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator)
    inputs[to_random] = random_ids[to_random]
    return inputs, labels


def mlm_loss(logits, labels):
    """The masked-LM loss (notebook 08, exercise 2): mean cross-entropy over the positions whose label is not
    -100. logits (B, T, V), labels (B, T) -> a 0-dim tensor."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head (notebook 08, exercise 4): dense, exact GELU, LayerNorm(eps), then `decoder`, whose
    weight IS the token embedding matrix `embeddings.weight` (tied) and whose bias (V,) is its own.

    forward: hidden states (..., d) -> logits (..., V).
    """

    def __init__(self, embeddings, eps=1e-12):
        super().__init__()
        vocab_size, d_model = embeddings.weight.shape
        self.dense = nn.Linear(d_model, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.decoder = nn.Linear(d_model, vocab_size)
        self.decoder.weight = embeddings.weight   # tied: one Parameter, two names
        nn.init.zeros_(self.decoder.bias)

    def forward(self, hidden):
        return self.decoder(self.norm(F.gelu(self.dense(hidden))))   # (..., V)


class MiniBertForMaskedLM(nn.Module):
    """A MiniBert (`bert`) and a masked-LM head (`head`, by default a MaskedLMHead tied to the encoder's token
    embeddings): forward(input_ids, attention_mask=None, token_type_ids=None) -> logits (B, T, V)."""

    def __init__(self, encoder, head=None):
        super().__init__()
        self.bert = encoder
        self.head = MaskedLMHead(encoder.token_embeddings, encoder.embedding_norm.eps) if head is None else head

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.head(self.bert(input_ids, attention_mask, token_type_ids))   # (B, T, V)


def load_hf_masked_lm_weights(model, hf_mlm):
    """Copy a transformers BertForMaskedLM (or its state dict) into a MiniBertForMaskedLM of the same sizes, in
    place; returns model. The encoder as `load_hf_bert_weights` does it, the decoder's weight with it (tied), and
    the head's dense, norm and decoder bias by `mlm_head_hf_names`. A missing tensor or another shape raises
    ValueError."""
    state = hf_mlm.state_dict() if isinstance(hf_mlm, nn.Module) else dict(hf_mlm)
    load_hf_bert_weights(model.bert, state)
    ours = model.head.state_dict()
    with torch.no_grad():
        for name, theirs in mlm_head_hf_names().items():
            if theirs not in state or name not in ours:
                raise ValueError(f"no {theirs} in the Hugging Face weights, or no {name} in the head")
            if tuple(state[theirs].shape) != tuple(ours[name].shape):
                raise ValueError(f"{theirs} has shape {tuple(state[theirs].shape)}, the head's {name} "
                                 f"{tuple(ours[name].shape)}")
            ours[name].copy_(state[theirs])
    return model


__all__ = ["MaskedLMHead", "MiniBert", "MiniBertForMaskedLM", "hf_names", "init_bert_weights", "load_hf_bert_weights",
           "load_hf_masked_lm_weights", "mask_tokens", "minibert_like", "mlm_head_hf_names", "mlm_loss",
           "to_hf_bert_for_masked_lm"]
