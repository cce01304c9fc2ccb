"""Hidden checks for 07_encoder. Each public function is one grade cell's hidden part.

Layered as the course's tests are: shape and structure first, then values on seeded random inputs
against independent oracles (`torch.nn.LayerNorm`, `torch.nn.TransformerEncoderLayer`,
`transformers.BertModel`), then behaviour (padding, position-wise, training accuracy).

Every exercise is graded on its own: where one class builds another (`EncoderLayer` builds a
`LayerNorm` and a `FeedForward`, `MiniBert` builds `EncoderLayer`s), the reference classes below are
swapped into the student's namespace while their class is constructed (see `build`), and
`load_hf_bert_weights` is graded on a reference `MiniBert`. Seeds here are never used by the
visible tests.
"""
import inspect
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call, expect_close, expect_shape, generator, quiet, reference_globals
from courselib.attention import MultiHeadAttention, padding_mask

LAYER_NORM_SHORTCUTS = ["torch.nn.functional.layer_norm", "torch.layer_norm", "torch.native_layer_norm"]
LAYER_NORM_ADVICE = ("compute the mean and the variance yourself; torch's layer_norm (and nn.LayerNorm, "
                     "which calls it) is the oracle here, not the answer.")
EARLIER = "(This test uses reference versions of your other classes, so only this exercise is graded here.)"


# ---------------------------------------------------------------- reference classes, swapped in
class ReferenceLayerNorm(nn.LayerNorm):
    def __init__(self, d_model, eps=1e-12):
        super().__init__(d_model, eps=eps)


class ReferenceFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(F.gelu(self.linear1(x)))


class ReferenceEncoderLayer(nn.Module):
    """Post-LN or pre-LN, with the submodule names the notebook asks for."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-12):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = ReferenceFeedForward(d_model, d_ff)
        self.norm1 = ReferenceLayerNorm(d_model, eps)
        self.norm2 = ReferenceLayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        attend = lambda h: self.dropout(self.self_attn(h, mask=mask)[0])  # noqa: E731
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.dropout(self.ffn(x)))


class ReferenceMiniBert(nn.Module):
    def __init__(self, vocab_size, d_model, num_layers, num_heads, d_ff, max_positions, type_vocab_size=2,
                 dropout=0.0, eps=1e-12):
        super().__init__()
        self.d_model = d_model
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.position_embeddings = nn.Embedding(max_positions, d_model)
        self.segment_embeddings = nn.Embedding(type_vocab_size, d_model)
        self.embedding_norm = ReferenceLayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(ReferenceEncoderLayer(d_model, num_heads, d_ff, dropout, False, eps)
                                    for _ in range(num_layers))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1])
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.dropout(self.embedding_norm(x + self.segment_embeddings(token_type_ids)))
        mask = padding_mask(attention_mask, 0)
        for layer in self.layers:
            x = layer(x, mask)
        return x


REFERENCE_CLASSES = {"LayerNorm": ReferenceLayerNorm, "FeedForward": ReferenceFeedForward,
                     "EncoderLayer": ReferenceEncoderLayer}


# ---------------------------------------------------------------- harness
def build(cls, *args, name, helpers=None, **kwargs):
    """Instantiate the student's class quietly, with reference classes swapped into its namespace."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise AssertionError(f"{name} should be a class deriving from nn.Module, but it is a "
                             f"{type(cls).__name__}.")
    own_function = next((f for f in vars(cls).values() if inspect.isfunction(f)), None)
    with reference_globals(own_function, **(helpers or {})):
        module = call(cls, *args, name=name, **kwargs)
    return module.eval()


def run(module, *args, name, **kwargs):
    """module(*args) quietly, without gradients; the result must be a tensor."""
    with torch.no_grad():
        result = call(module, *args, name=name, **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return a tensor, but it returned {type(result).__name__}.")
    return result


def submodule(module, path, owner, expected):
    """module.<path>, or a message that says which names the notebook asks for."""
    found = module
    for part in path.split("."):
        found = getattr(found, part, None)
        if found is None:
            names = ", ".join(name for name, _ in module.named_children()) or "none"
            raise AssertionError(f"{owner} has no `{path}`: the exercise asks for {expected}. "
                                 f"Its submodules are: {names}.")
    return found


def randomize(module, generator_, scale=1.0, norm_noise=0.3):
    """Random weights, and LayerNorm weights away from 1 and 0, so that no two tensors are alike."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.dim() == 1 and ("norm" in name.lower() or "layernorm" in name.lower()):
                base = 1.0 if name.endswith("weight") else 0.0
                param.copy_(base + norm_noise * torch.randn(param.shape, generator=generator_))
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else 1
                std = scale / math.sqrt(fan_in) if param.dim() > 1 else 0.3 * scale
                param.copy_(std * torch.randn(param.shape, generator=generator_))
    return module


# ---------------------------------------------------------------- exercise 1: FeedForward
def _linear(module, name, d_in, d_out):
    layer = submodule(module, name, "FeedForward", "`linear1` (d_model -> d_ff) and `linear2` (d_ff -> d_model)")
    if not isinstance(layer, nn.Linear) or (layer.in_features, layer.out_features) != (d_in, d_out):
        raise AssertionError(f"FeedForward.{name} should be nn.Linear({d_in}, {d_out}), but it is {layer}.")
    return layer


def feed_forward_shapes(FeedForward):
    ffn = build(FeedForward, 12, 40, name="FeedForward(12, 40)")
    _linear(ffn, "linear1", 12, 40)
    _linear(ffn, "linear2", 40, 12)
    count = sum(p.numel() for p in ffn.parameters())
    if count != 2 * 12 * 40 + 40 + 12:
        raise AssertionError(f"FeedForward(12, 40) has {count} parameters; two linear layers with biases "
                             f"have 2·12·40 + 40 + 12 = {2 * 12 * 40 + 52}. Is there an extra layer?")
    g = generator(7101)
    for shape in [(2, 5, 12), (7, 12), (1, 1, 3, 12)]:
        out = run(ffn, torch.randn(*shape, generator=g), name=f"FeedForward on a {shape} input")
        expect_shape(out, shape, f"FeedForward output for a {shape} input",
                     "The FFN maps each position's d_model vector to a d_model vector: the shape is unchanged.")


def feed_forward_diagnoses(ffn, x):
    pre = ffn.linear1(x)
    return {
        "you used the tanh approximation of GELU; BERT uses the exact one, x·Φ(x) with the erf "
        "(F.gelu(x) or nn.GELU(), without approximate='tanh').": ffn.linear2(F.gelu(pre, approximate="tanh")),
        "you used ReLU; BERT's feed-forward uses GELU.": ffn.linear2(F.relu(pre)),
        "there is no activation between the two linear layers, so the FFN is just one linear map.": ffn.linear2(pre),
        "the activation comes after linear2; it belongs between linear1 and linear2.": F.gelu(ffn.linear2(pre)),
    }


def feed_forward_values(FeedForward):
    g = generator(7102)
    ffn = randomize(build(FeedForward, 6, 20, name="FeedForward(6, 20)"), g, scale=2.0).double()
    _linear(ffn, "linear1", 6, 20)
    _linear(ffn, "linear2", 20, 6)
    x = torch.randn(3, 9, 6, generator=g, dtype=torch.float64)
    with torch.no_grad():
        expected = F.linear(F.gelu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)),
                            ffn.linear2.weight, ffn.linear2.bias)
        diagnoses = feed_forward_diagnoses(ffn, x)
    out = run(ffn, x, name="FeedForward")
    expect_close(out, expected, "FeedForward output", diagnoses=diagnoses, rtol=1e-7, atol=1e-7)
    # Position-wise: each position on its own gives the same result as the whole sequence.
    one_by_one = torch.stack([run(ffn, x[:, t], name="FeedForward on one position") for t in range(x.shape[1])], 1)
    expect_close(one_by_one, out, "FeedForward applied one position at a time",
                 "The FFN is position-wise: position t's output may depend only on position t's input.")


# ---------------------------------------------------------------- exercise 2: LayerNorm
def _layer_norm(LayerNorm, d_model, **kwargs):
    return build(LayerNorm, d_model, name=f"LayerNorm({d_model})", **kwargs)


def _forward_layer_norm(norm, x):
    before = x.clone()
    result = call(norm, x, name="LayerNorm.forward", forbidden=LAYER_NORM_SHORTCUTS,
                  forbidden_advice=LAYER_NORM_ADVICE)
    if not torch.is_tensor(result):
        raise AssertionError(f"LayerNorm should return a tensor, but it returned {type(result).__name__}.")
    if not torch.equal(x, before):
        raise AssertionError("LayerNorm changed its input in place (e.g. `x -= mean`); the residual "
                             "connection still needs the original x, so compute into a new tensor.")
    return result


def layer_norm_parameters(LayerNorm):
    norm = _layer_norm(LayerNorm, 10)
    params = dict(norm.named_parameters())
    if set(params) != {"weight", "bias"}:
        raise AssertionError(f"LayerNorm(10) should have exactly two nn.Parameters, `weight` and `bias` "
                             f"(the names nn.LayerNorm uses), but it has {sorted(params) or 'none'}. "
                             "A plain tensor attribute is not trained: wrap it in nn.Parameter.")
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        expect_shape(params[name], (10,), f"LayerNorm.{name}", "One gain and one bias per feature: (d_model,).")
        if not torch.all(params[name] == value):
            raise AssertionError(f"LayerNorm.{name} should start at {value:g} everywhere, so that a new "
                                 "LayerNorm only normalises (as nn.LayerNorm does).")
    out = _forward_layer_norm(norm, torch.randn(4, 3, 10, generator=generator(7201)))
    expect_shape(out, (4, 3, 10), "LayerNorm output", "Normalising does not change the shape.")


def layer_norm_diagnoses(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = x.var(-1, keepdim=True, unbiased=False)
    affine = lambda normed: normed * weight + bias  # noqa: E731
    return {
        "you used the unbiased variance (divided by d - 1); LayerNorm divides by d: "
        "x.var(dim=-1, unbiased=False) or ((x - mean)**2).mean(-1).":
            affine(centred / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps)),
        "you divided by the variance, not by its square root (the standard deviation).":
            affine(centred / (var + eps)),
        "you forgot the learned gain and shift: multiply by self.weight and add self.bias.":
            centred / torch.sqrt(var + eps),
        "you normalised over the wrong dimension: LayerNorm normalises each token's features, the last "
        "dimension, not the batch or the sequence.":
            affine((x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + eps)),
    }


def layer_norm_values(LayerNorm):
    g = generator(7202)
    for shape, eps in [((3, 7, 10), 1e-12), ((5, 10), 1e-5), ((2, 2, 4, 10), 1e-12)]:
        norm = randomize(_layer_norm(LayerNorm, 10, eps=eps), g).double()
        x = 3.0 + 2.0 * torch.randn(*shape, generator=g, dtype=torch.float64)
        oracle = nn.LayerNorm(10, eps=eps).double()
        oracle.load_state_dict({"weight": norm.weight.detach(), "bias": norm.bias.detach()})
        with torch.no_grad():
            expected = oracle(x)
            diagnoses = layer_norm_diagnoses(x, norm.weight, norm.bias, eps)
        out = _forward_layer_norm(norm, x)
        expect_close(out, expected, f"LayerNorm of a {shape} input", diagnoses=diagnoses, rtol=1e-7, atol=1e-7)
    # Gradients flow to the learned gain and bias exactly as through nn.LayerNorm.
    x = torch.randn(4, 10, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        out = _forward_layer_norm(norm, x)
        if not out.requires_grad:
            raise AssertionError("LayerNorm's output carries no gradient: don't detach() or use .data, or "
                                 "weight and bias will never learn.")
        norm.zero_grad()
        out.pow(3).sum().backward()
        oracle(x).pow(3).sum().backward()
    for name in ("weight", "bias"):
        expect_close(getattr(norm, name).grad, getattr(oracle, name).grad, f"the gradient of LayerNorm.{name}",
                     "Build the output from self.weight and self.bias with ordinary tensor operations.")


def layer_norm_eps(LayerNorm):
    """Rows with a small variance, where it matters whether eps is inside the square root."""
    g = generator(7203)
    for eps, spread in [(0.1, 0.2), (1e-4, 0.005)]:
        norm = randomize(_layer_norm(LayerNorm, 8, eps=eps), g).double()
        x = 5.0 + spread * torch.randn(6, 8, generator=g, dtype=torch.float64)
        oracle = nn.LayerNorm(8, eps=eps).double()
        oracle.load_state_dict({"weight": norm.weight.detach(), "bias": norm.bias.detach()})
        centred = x - x.mean(-1, keepdim=True)
        std = x.var(-1, keepdim=True, unbiased=False).sqrt()
        with torch.no_grad():
            expected = oracle(x)
            diagnoses = {
                f"eps is outside the square root: LayerNorm divides by sqrt(var + eps), not by "
                f"sqrt(var) + eps (eps={eps:g} here, so the difference shows).":
                    centred / (std + eps) * norm.weight + norm.bias,
                "you ignored the eps argument: store it and use it.":
                    centred / torch.sqrt(std**2 + 1e-12) * norm.weight + norm.bias,
            }
        expect_close(_forward_layer_norm(norm, x), expected, f"LayerNorm(8, eps={eps:g}) of low-variance rows",
                     diagnoses=diagnoses, rtol=1e-7, atol=1e-7)
    # A constant row has zero variance: eps is what keeps 0 / 0 from becoming NaN.
    norm = _layer_norm(LayerNorm, 8).double()
    constant = torch.full((2, 8), 3.0, dtype=torch.float64)
    out = _forward_layer_norm(norm, constant)
    if not torch.all(torch.isfinite(out)):
        raise AssertionError("LayerNorm of a constant row (variance 0) gave inf or NaN: add eps to the "
                             "variance inside the square root, sqrt(var + eps).")
    expect_close(out, torch.zeros(2, 8), "LayerNorm of a constant row", "A constant row normalises to 0 (+ bias).")


# ---------------------------------------------------------------- exercise 3: EncoderLayer
LAYER_NAMES = ("`self_attn` (courselib's MultiHeadAttention), `ffn` (your FeedForward with linear1 and linear2), "
               "`norm1` and `norm2` (LayerNorms)")


def _encoder_layer(EncoderLayer, d_model, num_heads, d_ff, norm_first):
    layer = build(EncoderLayer, d_model, num_heads, d_ff, dropout=0.0, norm_first=norm_first, eps=1e-12,
                  name=f"EncoderLayer({d_model}, {num_heads}, {d_ff}, norm_first={norm_first})",
                  helpers={"LayerNorm": ReferenceLayerNorm, "FeedForward": ReferenceFeedForward})
    for path in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                 "ffn.linear1", "ffn.linear2", "norm1", "norm2"):
        submodule(layer, path, "EncoderLayer", LAYER_NAMES)
    return layer


def torch_layer_like(ours, d_model, num_heads, d_ff, norm_first):
    """torch.nn.TransformerEncoderLayer holding the student's weights (in_proj stacks W_q, W_k, W_v)."""
    theirs = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu",
                                        batch_first=True, norm_first=norm_first, layer_norm_eps=1e-12)
    attn = ours.self_attn
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        for their_name, our_module in [("self_attn.out_proj", attn.out_proj), ("linear1", ours.ffn.linear1),
                                       ("linear2", ours.ffn.linear2), ("norm1", ours.norm1), ("norm2", ours.norm2)]:
            theirs.get_submodule(their_name).load_state_dict(our_module.state_dict())
    return theirs.double().train()  # train mode with dropout 0: the plain (not fused) path, deterministic


PRE_FOR_POST = ("with norm_first=False you computed a pre-LN layer: post-LN (BERT) is x = norm1(x + attn(x)), "
                "then x = norm2(x + ffn(x)).")
POST_FOR_PRE = ("with norm_first=True you computed a post-LN layer: pre-LN is x = x + attn(norm1(x)), then "
                "x = x + ffn(norm2(x)).")
RESIDUAL_AFTER_NORM = ("the residual adds the normalised input: in pre-LN the skip connection carries the raw x, "
                       "x = x + attn(norm1(x)), not h + attn(h) with h = norm1(x).")
NO_RESIDUAL = "there is no residual connection: add each sublayer's input back to its output."
MASK_IGNORED = ("the padding mask is ignored: padded keys must get no attention. Pass it on: "
                "self.self_attn(x, mask=mask).")
MASK_INVERTED = ("the mask polarity is inverted: in our masks True means 'may attend' (torch's "
                 "src_key_padding_mask is the opposite: True means 'ignore').")


def reference_layer_outputs(theirs, x, keep, norm_first):
    """torch's layer output, and what the known mistakes give with the same weights."""
    padding = None if keep is None else ~keep

    def attn(h, ignore):
        return theirs.self_attn(h, h, h, key_padding_mask=ignore, need_weights=False)[0]

    def ffn(h):
        return theirs.linear2(F.gelu(theirs.linear1(h)))

    def post(ignore=padding):
        h = theirs.norm1(x + attn(x, ignore))
        return theirs.norm2(h + ffn(h))

    def pre(ignore=padding):
        h = x + attn(theirs.norm1(x), ignore)
        return h + ffn(theirs.norm2(h))

    def pre_residual_after_norm():
        h = theirs.norm1(x)
        h = h + attn(h, padding)
        g = theirs.norm2(h)
        return g + ffn(g)

    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=padding)
        if norm_first:
            diagnoses = {POST_FOR_PRE: post(), RESIDUAL_AFTER_NORM: pre_residual_after_norm(),
                         NO_RESIDUAL: ffn(theirs.norm2(attn(theirs.norm1(x), padding)))}
        else:
            diagnoses = {PRE_FOR_POST: pre(), NO_RESIDUAL: theirs.norm2(ffn(theirs.norm1(attn(x, padding))))}
        if keep is not None:
            same_setting = pre if norm_first else post
            diagnoses[MASK_IGNORED] = same_setting(None)
            diagnoses[MASK_INVERTED] = same_setting(keep)  # every row of keep has a True and a False
    return expected, diagnoses


def _layer_matches_torch(EncoderLayer, norm_first, seed, keep=None, dims=(12, 3, 20), batch=(2, 5)):
    g = generator(seed)
    ours = randomize(_encoder_layer(EncoderLayer, *dims, norm_first=norm_first), g)
    theirs = torch_layer_like(ours, *dims, norm_first=norm_first)
    ours = ours.double()
    x = torch.randn(*batch, dims[0], generator=g, dtype=torch.float64)
    expected, diagnoses = reference_layer_outputs(theirs, x, keep, norm_first)
    args = (x,) if keep is None else (x, keep[:, None, None, :])
    out = run(ours, *args, name="EncoderLayer.forward")
    setting = "pre-LN" if norm_first else "post-LN"
    expect_close(out, expected, f"{setting} EncoderLayer output" + (" with padding" if keep is not None else ""),
                 hint=f"Compare with torch.nn.TransformerEncoderLayer(norm_first={norm_first}). {EARLIER}",
                 diagnoses=diagnoses, rtol=1e-6, atol=1e-6)
    return ours, x, out


def encoder_layer_structure(EncoderLayer):
    for norm_first in (False, True):
        ours = _encoder_layer(EncoderLayer, 12, 3, 20, norm_first)
        theirs = nn.TransformerEncoderLayer(12, 3, 20, batch_first=True)
        count, expected = sum(p.numel() for p in ours.parameters()), sum(p.numel() for p in theirs.parameters())
        if count != expected:
            raise AssertionError(f"EncoderLayer(12, 3, 20) has {count} parameters; torch's layer has {expected} "
                                 "(4 attention projections, 2 FFN linears, 2 LayerNorms). Build exactly "
                                 f"{LAYER_NAMES}.")
        x = torch.randn(3, 4, 12, generator=generator(7301))
        expect_shape(run(ours, x, name="EncoderLayer.forward"), (3, 4, 12), "EncoderLayer output",
                     "An encoder layer keeps the shape (batch, T, d_model), so that layers can be stacked.")


def encoder_layer_post_ln(EncoderLayer):
    _layer_matches_torch(EncoderLayer, False, 7302)
    _layer_matches_torch(EncoderLayer, False, 7303, dims=(8, 2, 8), batch=(1, 7))


def encoder_layer_pre_ln(EncoderLayer):
    _layer_matches_torch(EncoderLayer, True, 7304)
    _layer_matches_torch(EncoderLayer, True, 7305, dims=(8, 2, 8), batch=(1, 7))


def encoder_layer_padding_mask(EncoderLayer):
    keep = torch.tensor([[True, True, True, False, False, False],
                         [True, True, True, True, True, False],
                         [True, False, False, False, False, False]])
    for norm_first, seed in [(False, 7306), (True, 7307)]:
        ours, x, out = _layer_matches_torch(EncoderLayer, norm_first, seed, keep=keep, batch=(3, 6))
        # Behaviour: whatever sits at the padded positions, the real positions' outputs don't change.
        noisy = x.clone()
        noisy[~keep] = 100.0 * torch.randn(int((~keep).sum()), x.shape[-1], generator=generator(seed + 10),
                                           dtype=torch.float64)
        again = run(ours, noisy, keep[:, None, None, :], name="EncoderLayer.forward")
        expect_close(again[keep], out[keep], "real positions' outputs when the padding changes",
                     "Padded keys must get exactly zero attention: the mask is applied before the softmax.")


# ---------------------------------------------------------------- exercise 4: MiniBert
MINIBERT_NAMES = ("`token_embeddings`, `position_embeddings`, `segment_embeddings` (nn.Embedding), "
                  "`embedding_norm` (LayerNorm), `layers` (nn.ModuleList of EncoderLayer) and `d_model`")


def hf_bert(seed, vocab_size=31, d_model=12, num_layers=2, num_heads=3, d_ff=20, max_positions=16,
            type_vocab_size=2):
    """A small random transformers.BertModel (eager attention, eval mode, float64), built offline."""
    from transformers import BertConfig, BertModel
    config = BertConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=num_layers,
                        num_attention_heads=num_heads, intermediate_size=d_ff, max_position_embeddings=max_positions,
                        type_vocab_size=type_vocab_size, hidden_act="gelu", layer_norm_eps=1e-12,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    torch.manual_seed(seed)
    with quiet():
        model = BertModel(config, add_pooling_layer=False)
    return randomize(model, generator(seed), scale=1.5).double().eval()


def reference_load(model, hf):
    """The oracle's own copy of a BertModel into a MiniBert with the notebook's names."""
    pairs = parameter_pairs(model, hf)
    with torch.no_grad():
        for _, ours, theirs in pairs:
            ours.copy_(theirs)
    return model


def parameter_pairs(model, hf):
    """(our name, our tensor, HF tensor) for every parameter BertModel has besides the pooler."""
    e = hf.embeddings
    pairs = [("token_embeddings.weight", e.word_embeddings.weight),
             ("position_embeddings.weight", e.position_embeddings.weight),
             ("segment_embeddings.weight", e.token_type_embeddings.weight),
             ("embedding_norm.weight", e.LayerNorm.weight), ("embedding_norm.bias", e.LayerNorm.bias)]
    for i, block in enumerate(hf.encoder.layer):
        a = block.attention
        for ours, theirs in [("self_attn.q_proj", a.self.query), ("self_attn.k_proj", a.self.key),
                             ("self_attn.v_proj", a.self.value), ("self_attn.out_proj", a.output.dense),
                             ("norm1", a.output.LayerNorm), ("ffn.linear1", block.intermediate.dense),
                             ("ffn.linear2", block.output.dense), ("norm2", block.output.LayerNorm)]:
            pairs += [(f"layers.{i}.{ours}.weight", theirs.weight), (f"layers.{i}.{ours}.bias", theirs.bias)]
    ours = dict(model.named_parameters())
    missing = [name for name, _ in pairs if name not in ours]
    if missing:
        raise AssertionError(f"MiniBert has no parameter {missing[0]}: the exercise asks for {MINIBERT_NAMES}, "
                             "with EncoderLayer's names inside each layer.")
    return [(name, ours[name], theirs) for name, theirs in pairs]


def bert_batch(seed, vocab_size=31, batch=3, T=9, type_vocab_size=2):
    """A padded batch of two-segment inputs: [CLS] ... [SEP] ... [SEP] [PAD]..."""
    g = generator(seed)
    input_ids = torch.randint(4, vocab_size, (batch, T), generator=g)
    lengths = torch.tensor([T, T - 3, 4, T - 1, 5][:batch])
    attention_mask = (torch.arange(T) < lengths[:, None]).long()
    token_type_ids = ((torch.arange(T) >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    token_type_ids = token_type_ids.clamp(max=type_vocab_size - 1)
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    return input_ids, attention_mask, token_type_ids


def _minibert(MiniBert, *dims, type_vocab_size=2):
    model = build(MiniBert, *dims, type_vocab_size=type_vocab_size, name=f"MiniBert{dims}",
                  helpers=REFERENCE_CLASSES)
    for name in ("token_embeddings", "position_embeddings", "segment_embeddings", "embedding_norm", "layers"):
        submodule(model, name, "MiniBert", MINIBERT_NAMES)
    if getattr(model, "d_model", None) != dims[1]:
        raise AssertionError(f"MiniBert should store its width as `self.d_model` (= {dims[1]}); the "
                             "classification head reads it.")
    return model


def _hf_outputs(hf, input_ids, attention_mask=None, token_type_ids=None, layers=True):
    with torch.no_grad(), quiet():
        if not layers:
            return hf.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        return hf(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


def minibert_structure(MiniBert):
    dims = (29, 12, 3, 3, 20, 14)
    model = _minibert(MiniBert, *dims, type_vocab_size=3)
    for name, shape in [("token_embeddings", (29, 12)), ("position_embeddings", (14, 12)),
                        ("segment_embeddings", (3, 12))]:
        table = getattr(model, name)
        if not isinstance(table, nn.Embedding):
            raise AssertionError(f"MiniBert.{name} should be an nn.Embedding, but it is {type(table).__name__}.")
        expect_shape(table.weight, shape, f"MiniBert.{name}.weight",
                     "token: (vocab_size, d_model), position: (max_positions, d_model), "
                     "segment: (type_vocab_size, d_model).")
    if len(model.layers) != 3:
        raise AssertionError(f"MiniBert(num_layers=3) has {len(model.layers)} layers in `layers`.")
    hf = hf_bert(7400, vocab_size=29, d_model=12, num_layers=3, max_positions=14, type_vocab_size=3)
    count, expected = sum(p.numel() for p in model.parameters()), sum(p.numel() for p in hf.parameters())
    if count != expected:
        raise AssertionError(f"MiniBert has {count} parameters, a BertModel of the same size (without its "
                             f"pooler) has {expected}. {MINIBERT_NAMES}.")
    input_ids, attention_mask, token_type_ids = bert_batch(7401, vocab_size=29, batch=2, T=7)
    out = run(model, input_ids, attention_mask, token_type_ids, name="MiniBert.forward")
    expect_shape(out, (2, 7, 12), "MiniBert output", "MiniBert returns the last hidden states (batch, T, d_model).")


def minibert_embeddings(MiniBert):
    """num_layers=0: the output is the embedding sum after LayerNorm, exactly BertEmbeddings'."""
    hf = hf_bert(7402, vocab_size=31, num_layers=0, max_positions=16, type_vocab_size=3)
    model = reference_load(_minibert(MiniBert, 31, 12, 0, 3, 20, 16, type_vocab_size=3).double(), hf)
    input_ids, attention_mask, token_type_ids = bert_batch(7403, vocab_size=31, type_vocab_size=3)
    out = run(model, input_ids, attention_mask, token_type_ids, name="MiniBert.forward")
    expected = _hf_outputs(hf, input_ids, token_type_ids=token_type_ids, layers=False)
    T = input_ids.shape[1]
    e = hf.embeddings
    with torch.no_grad():
        words, segments = e.word_embeddings(input_ids), e.token_type_embeddings(token_type_ids)
        positions = e.position_embeddings(torch.arange(T))
        diagnoses = {
            "the positions must start at 0: position_ids = torch.arange(T), the first token ([CLS]) "
            "uses row 0 of position_embeddings.": e.LayerNorm(words + segments + e.position_embeddings(torch.arange(1, T + 1))),
            "the segment (token type) embeddings are missing: add segment_embeddings(token_type_ids).":
                e.LayerNorm(words + positions),
            "the position embeddings are missing: add position_embeddings(position_ids).": e.LayerNorm(words + segments),
            "the embedding LayerNorm is missing: BERT normalises the sum of the three embeddings.":
                words + positions + segments,
        }
    expect_close(out, expected, "MiniBert's embeddings (num_layers=0)", diagnoses=diagnoses, rtol=1e-6, atol=1e-6,
                 hint="token + position + segment, then LayerNorm, then dropout. " + EARLIER)
    # Defaults: token_type_ids=None means segment 0 everywhere; attention_mask=None means no padding.
    out = run(model, input_ids, name="MiniBert.forward with the defaults")
    expected = _hf_outputs(hf, input_ids, token_type_ids=torch.zeros_like(input_ids), layers=False)
    expect_close(out, expected, "MiniBert's embeddings with token_type_ids=None",
                 "Without token_type_ids, every token is in segment 0 (as in BertModel).", rtol=1e-6, atol=1e-6)


MINIBERT_MASK_IGNORED = ("attention_mask is ignored: padded tokens are attended to. Turn it into a (B, 1, 1, T) "
                         "boolean mask (courselib's padding_mask(attention_mask, 0)) and pass it to every layer.")
MINIBERT_MASK_INVERTED = ("the attention mask is inverted: attention_mask is 1 for real tokens and 0 for padding, "
                          "and our masks are True where attention is allowed.")


def padding_diagnoses(hf, dims, input_ids, attention_mask, token_type_ids):
    """What a MiniBert that ignores or inverts attention_mask returns (our masked softmax, HF's weights)."""
    wrong = reference_load(ReferenceMiniBert(*dims).double().eval(), hf)
    with torch.no_grad():
        return {MINIBERT_MASK_IGNORED: wrong(input_ids, None, token_type_ids),
                MINIBERT_MASK_INVERTED: wrong(input_ids, 1 - attention_mask, token_type_ids)}


def minibert_matches_hf_bert(MiniBert):
    for seed, dims in [(7404, dict(vocab_size=31, d_model=12, num_layers=2, num_heads=3, d_ff=20, max_positions=16)),
                       (7405, dict(vocab_size=23, d_model=8, num_layers=3, num_heads=2, d_ff=16, max_positions=10))]:
        hf = hf_bert(seed, **dims)
        model = reference_load(_minibert(MiniBert, *dims.values()).double(), hf)
        input_ids, attention_mask, token_type_ids = bert_batch(seed + 20, vocab_size=dims["vocab_size"])
        out = run(model, input_ids, attention_mask, token_type_ids, name="MiniBert.forward")
        expect_close(out, _hf_outputs(hf, input_ids, attention_mask, token_type_ids),
                     "MiniBert's last hidden states vs BertModel", rtol=1e-6, atol=1e-6,
                     diagnoses=padding_diagnoses(hf, dims.values(), input_ids, attention_mask, token_type_ids),
                     hint="Check the order: embeddings, LayerNorm, dropout, then the layers, with the padding "
                          "mask passed to each. " + EARLIER)


def minibert_padding_mask(MiniBert):
    dims = (31, 12, 2, 3, 20, 16)
    hf = hf_bert(7406)
    model = reference_load(_minibert(MiniBert, *dims).double(), hf)
    input_ids, attention_mask, token_type_ids = bert_batch(7407)
    out = run(model, input_ids, attention_mask, token_type_ids, name="MiniBert.forward")
    diagnoses = padding_diagnoses(hf, dims, input_ids, attention_mask, token_type_ids)
    expect_close(out, _hf_outputs(hf, input_ids, attention_mask, token_type_ids),
                 "MiniBert's hidden states on a padded batch", rtol=1e-6, atol=1e-6, diagnoses=diagnoses,
                 hint="At padded positions BertModel still computes a hidden state (its queries attend to the "
                      "real tokens): don't zero them. " + EARLIER)
    # Behaviour: the real tokens don't see what is written at the padded positions.
    other_padding = input_ids.masked_fill(attention_mask == 0, 7)
    again = run(model, other_padding, attention_mask, token_type_ids, name="MiniBert.forward")
    real = attention_mask.bool()
    expect_close(again[real], out[real], "real tokens' hidden states when the pad ids change",
                 "Real tokens must give padded positions zero attention.")
    # attention_mask=None means every token is real.
    expect_close(run(model, input_ids, None, token_type_ids, name="MiniBert.forward"),
                 _hf_outputs(hf, input_ids, None, token_type_ids), "MiniBert with attention_mask=None",
                 "Without a mask every token may attend to every token.", rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- exercise 5: load_hf_bert_weights
def _load(load_hf_bert_weights, model, hf):
    result = call(lambda: load_hf_bert_weights(model, hf), name="load_hf_bert_weights")
    if result is not None and result is not model:
        raise AssertionError("load_hf_bert_weights should copy into `model` (and may return it), but it "
                             "returned a different object.")
    return model


def _describe_mismatch(name, ours, theirs, hf):
    ours = ours.detach()
    hf_names = {id(p): n for n, p in hf.named_parameters()}
    for other_name, other in hf.named_parameters():
        if other.shape == ours.shape and torch.allclose(ours, other.detach()) and not torch.equal(other, theirs):
            return (f"model.{name} holds hf_bert.{other_name}, but it should hold "
                    f"hf_bert.{hf_names.get(id(theirs), '?')}.")
        if other.dim() == 2 and other.shape[::-1] == ours.shape and torch.allclose(ours, other.detach().T):
            return (f"model.{name} holds the transpose of hf_bert.{other_name}: nn.Linear stores its weight as "
                    "(out_features, in_features) in both models, so copy it as it is.")
    return f"model.{name} was not copied from hf_bert.{hf_names.get(id(theirs), '?')}."


def _check_all_copied(model, hf):
    for name, ours, theirs in parameter_pairs(model, hf):
        if ours.shape != theirs.shape or not torch.allclose(ours.detach(), theirs.detach(), rtol=0, atol=1e-12):
            raise AssertionError(_describe_mismatch(name, ours, theirs, hf))


def load_hf_parity(load_hf_bert_weights):
    hf = hf_bert(7501, vocab_size=31, d_model=12, num_layers=2, num_heads=3, d_ff=20, max_positions=16)
    model = ReferenceMiniBert(31, 12, 2, 3, 20, 16).double().eval()
    _load(load_hf_bert_weights, model, hf)
    _check_all_copied(model, hf)
    input_ids, attention_mask, token_type_ids = bert_batch(7502)
    with torch.no_grad():
        out = model(input_ids, attention_mask, token_type_ids)
    expect_close(out, _hf_outputs(hf, input_ids, attention_mask, token_type_ids), "last hidden states after loading",
                 rtol=1e-6, atol=1e-6, hint="(Graded on a reference MiniBert, so only your loader counts here.)")


def load_hf_any_size(load_hf_bert_weights):
    dims = dict(vocab_size=37, d_model=8, num_layers=3, num_heads=2, d_ff=12, max_positions=30, type_vocab_size=3)
    hf = hf_bert(7503, **dims)
    model = ReferenceMiniBert(*dims.values()).double().eval()
    _load(load_hf_bert_weights, model, hf)
    _check_all_copied(model, hf)
    input_ids, attention_mask, token_type_ids = bert_batch(7504, vocab_size=37, batch=4, T=11, type_vocab_size=3)
    with torch.no_grad():
        out = model(input_ids, attention_mask, token_type_ids)
    expect_close(out, _hf_outputs(hf, input_ids, attention_mask, token_type_ids),
                 "last hidden states of a 3-layer, 3-segment model after loading", rtol=1e-6, atol=1e-6,
                 hint="Read the number of layers and the sizes from the models; don't assume 2 layers or d=12.")
    # A model of another size must be refused, not silently broadcast into.
    small = ReferenceMiniBert(37, 8, 3, 2, 12, 20, 3).double()
    try:
        call(lambda: load_hf_bert_weights(small, hf), name="load_hf_bert_weights")
    except AssertionError as error:
        if "raised" in str(error):
            return
        raise
    raise AssertionError("load_hf_bert_weights copied a BertModel with 30 positions into a MiniBert with 20 "
                         "without complaint: copy with tensor.copy_() (it checks shapes) or compare shapes and "
                         "raise, so that a wrong configuration fails loudly.")


# ---------------------------------------------------------------- exercise 6: SequenceClassifier
class StubEncoder(nn.Module):
    """Returns hidden states the test controls, and remembers what it was called with."""

    def __init__(self, hidden):
        super().__init__()
        self.d_model = hidden.shape[-1]
        self.hidden = hidden
        self.scale = nn.Parameter(torch.ones(()))
        self.calls = []

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        self.calls.append((input_ids, attention_mask, token_type_ids))
        return self.hidden * self.scale


def _classifier(SequenceClassifier, hidden, num_labels):
    encoder = StubEncoder(hidden)
    model = build(SequenceClassifier, encoder, num_labels, name=f"SequenceClassifier(encoder, {num_labels})")
    if not any(p is encoder.scale for p in model.parameters()):
        raise AssertionError("SequenceClassifier doesn't register the encoder as a submodule (self.encoder = "
                             "encoder), so an optimizer over its parameters would never train the encoder.")
    return model, encoder


def _logits(model, input_ids, attention_mask=None, token_type_ids=None):
    return run(model, input_ids, attention_mask, token_type_ids, name="SequenceClassifier.forward")


def classifier_shapes(SequenceClassifier):
    g = generator(7601)
    for batch, T, d, num_labels in [(4, 6, 10, 3), (1, 3, 7, 2), (5, 9, 16, 5)]:
        model, _ = _classifier(SequenceClassifier, torch.randn(batch, T, d, generator=g), num_labels)
        logits = _logits(model, torch.zeros(batch, T, dtype=torch.long))
        expect_shape(logits, (batch, num_labels), "logits",
                     "One row of num_labels scores per sequence, from the [CLS] vector: (batch, num_labels). "
                     "Read the width from encoder.d_model.")


def classifier_uses_cls(SequenceClassifier):
    g = generator(7602)
    hidden = torch.randn(3, 5, 8, generator=g)
    model, encoder = _classifier(SequenceClassifier, hidden, 4)
    input_ids = torch.randint(0, 9, (3, 5), generator=g)
    attention_mask = torch.ones(3, 5, dtype=torch.long)
    attention_mask[0, 3:] = 0
    token_type_ids = torch.zeros(3, 5, dtype=torch.long)
    token_type_ids[:, 2:] = 1
    logits = _logits(model, input_ids, attention_mask, token_type_ids)
    seen_ids, seen_mask, seen_types = encoder.calls[-1]
    if seen_mask is None or not torch.equal(seen_mask, attention_mask):
        raise AssertionError("SequenceClassifier didn't pass attention_mask on to the encoder, so padding "
                             "would be attended to.")
    if seen_types is None or not torch.equal(seen_types, token_type_ids):
        raise AssertionError("SequenceClassifier didn't pass token_type_ids on to the encoder.")
    # Only the first position may matter.
    changed = hidden.clone()
    changed[:, 1:] = torch.randn(3, 4, 8, generator=g)
    encoder.hidden = changed
    expect_close(_logits(model, input_ids, attention_mask, token_type_ids), logits,
                 "logits when only the non-[CLS] hidden states change",
                 hint="The head must read only the [CLS] vector, hidden[:, 0]: not a mean over the tokens, "
                      "not the last token.")
    changed[:, 0] = torch.randn(3, 8, generator=g)
    again = _logits(model, input_ids, attention_mask, token_type_ids)
    if torch.allclose(again, logits):
        raise AssertionError("The logits didn't change when the [CLS] hidden state changed: classify from "
                             "hidden[:, 0].")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if len(linears) == 1:  # the plain head: logits = W h_CLS + b
        expect_close(again, linears[0](changed[:, 0]).detach(), "logits",
                     "With one linear layer the logits are classifier(hidden[:, 0]).")


# ---------------------------------------------------------------- the trained classifier
PAD, CLS, SEP, A = 0, 1, 2, 3
NUM_LETTERS, MAX_SEGMENT = 6, 6


def count_task_by_hand(num_examples, seed):
    """The notebook's task, written independently: is "a" more, equally or less frequent in segment A?"""
    g = generator(seed)
    T = 2 * MAX_SEGMENT + 3
    input_ids = torch.zeros(num_examples, T, dtype=torch.long)
    token_type_ids = torch.zeros(num_examples, T, dtype=torch.long)
    labels = torch.zeros(num_examples, dtype=torch.long)
    for i in range(num_examples):
        first, second = (torch.randint(A, A + NUM_LETTERS, (int(torch.randint(1, MAX_SEGMENT + 1, (1,), generator=g)),),
                                       generator=g) for _ in range(2))
        row = [CLS, *first.tolist(), SEP, *second.tolist(), SEP]
        input_ids[i, :len(row)] = torch.tensor(row)
        token_type_ids[i, len(first) + 2:len(row)] = 1
        labels[i] = 1 + int(np.sign(int((first == A).sum()) - int((second == A).sum())))
    return input_ids, (input_ids != PAD).long(), token_type_ids, labels


def classifier_accuracy(classifier, threshold=0.95):
    input_ids, attention_mask, token_type_ids, labels = count_task_by_hand(1500, 7603)
    was_training = getattr(classifier, "training", False)
    classifier.eval()
    try:
        logits = run(classifier, input_ids, attention_mask, token_type_ids, name="classifier")
    finally:
        classifier.train(was_training)
    expect_shape(logits, (1500, 3), "the trained classifier's logits", "Three classes: fewer, equal, more.")
    accuracy = (logits.argmax(-1) == labels).float().mean().item()
    if accuracy < threshold:
        raise AssertionError(f"the trained classifier gets {accuracy:.1%} of 1500 fresh examples right; the "
                             f"notebook promises at least {threshold:.0%}. If an earlier test failed, fix it "
                             "first; otherwise train again.")
