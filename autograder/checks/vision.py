"""Hidden checks for 12_vision_transformer, the probe side. Each check is one grade cell's hidden part.

A probe builds seeded inputs (colour images, so that channel-first and channel-last orders differ; non-square
grids, so that rows and columns differ), calls the learner's code through `call` and returns plain data; its judge
(autograder/judges/vision.py, in the grader only) rebuilds the same inputs and compares with independent oracles:
`torch.nn.functional.unfold` / `fold` and `conv2d` for the patches, `transformers`' `ViTForImageClassification`
and `ViTEmbeddings.interpolate_pos_encoding` for the model, the loader and the positions, a recomputation for the
training epoch and the rollout, and `ViTMAEEmbeddings.random_masking` for the optional stretch.

Every exercise is graded on its own: where one piece uses another (PatchEmbedding uses patchify, the ViT uses
PatchEmbedding, add_cls_and_positions and 07's classes, the loader uses conv_weight_as_linear), the references
below are swapped into the learner's namespace while their code runs (`helpers`). The loader is graded on the
reference ViT below, loaded from a `transformers` model whose weights the check chose.
"""
import math
import threading

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import attempt, build, call, count, load_weights, probe, quiet, submodule
from autograder.checks.encoder import ReferenceEncoderLayer, ReferenceLayerNorm

HF_VIT = "transformers.models.vit.modeling_vit"
HF_VIT_MAE = "transformers.models.vit_mae.modeling_vit_mae"

# ---------------------------------------------------------------- what the watch refuses, per exercise
VIT_SHORTCUTS = [f"{HF_VIT}.ViTModel", f"{HF_VIT}.ViTForImageClassification", f"{HF_VIT}.ViTEmbeddings",
                 f"{HF_VIT}.ViTLayer", f"{__name__}.ReferenceVisionTransformer"]

VIT_ADVICE = ("assemble the model from your patch embedding, the [CLS] token, the positions and the encoder layers; "
              "transformers' ViT is the oracle here, not the answer.")

INTERPOLATE_SHORTCUTS = [f"{HF_VIT}.ViTEmbeddings.interpolate_pos_encoding"]

INTERPOLATE_ADVICE = "resize the grid of positions yourself with F.interpolate; transformers' ViT is the oracle here."

MASKING_SHORTCUTS = [f"{HF_VIT_MAE}.ViTMAEEmbeddings.random_masking"]

MASKING_ADVICE = "sort the noise yourself; transformers' ViTMAEEmbeddings.random_masking is the oracle here."


# ---------------------------------------------------------------- references, swapped in for the other exercises
def reference_patchify(images, patch_size):
    """(B, C, H, W) -> (B, N, C * P * P) by F.unfold (channel-first patches, row-major)."""
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


def reference_conv_weight_as_linear(weight):
    return weight.flatten(1)


def reference_add_cls_and_positions(patch_tokens, cls_token, pos_embed):
    return torch.cat([cls_token.expand(len(patch_tokens), -1, -1), patch_tokens], dim=1) + pos_embed


class ReferencePatchEmbedding(nn.Module):
    def __init__(self, in_channels, patch_size, d_model):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)

    def forward(self, images):
        return self.proj(reference_patchify(images, self.patch_size))


class ReferenceVisionTransformer(nn.Module):
    """The notebook's VisionTransformer (its names), for grading the loader on its own."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, d_model, num_layers, num_heads, d_ff,
                 pool="cls", dropout=0.0, eps=1e-12):
        super().__init__()
        self.pool = pool
        self.patch_embed = ReferencePatchEmbedding(in_channels, patch_size, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, d_model))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(ReferenceEncoderLayer(d_model, num_heads, d_ff, dropout, True, eps)
                                    for _ in range(num_layers))
        self.norm = ReferenceLayerNorm(d_model, eps)
        self.head = nn.Linear(d_model, num_classes)

    def features(self, images):
        x = self.dropout(reference_add_cls_and_positions(self.patch_embed(images), self.cls_token, self.pos_embed))
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, images):
        hidden = self.features(images)
        return self.head(hidden[:, 0] if self.pool == "cls" else hidden[:, 1:].mean(dim=1))


VIT_HELPERS = {"PatchEmbedding": ReferencePatchEmbedding, "EncoderLayer": ReferenceEncoderLayer,
               "LayerNorm": ReferenceLayerNorm, "add_cls_and_positions": reference_add_cls_and_positions,
               "patchify": reference_patchify}


# ---------------------------------------------------------------- exercise 1: patchify
def _tensor_result(fn, *args, name, **kwargs):
    before = [a.clone() if torch.is_tensor(a) else a for a in args]
    result = call(fn, *args, name=name, **kwargs)
    for old, new in zip(before, args):
        if torch.is_tensor(old) and not torch.equal(old, new):
            raise AssertionError(f"{name} changed its input in place: compute into a new tensor.")
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return a tensor, but it returned {type(result).__name__}.")
    return result


# (batch, channels, height, width, patch size): colour and non-square images, patches of 1 to 4 pixels
PATCHIFY_CASES = [(2, 3, 8, 12, 4), (1, 2, 6, 4, 2), (3, 1, 8, 8, 2), (2, 4, 3, 6, 3), (1, 3, 5, 5, 1)]


def patchify_cases(seeds):
    g = seeds.generator(1201)
    return [(torch.randn(b, c, h, w, generator=g, dtype=torch.float64), p) for b, c, h, w, p in PATCHIFY_CASES]


@probe
def patchify_shapes(seeds, patchify):
    images, patch_size = patchify_cases(seeds)[0]
    out = _tensor_result(patchify, images, patch_size, name="patchify")
    errors = [attempt(patchify, torch.zeros(1, 3, h, w), p, name="patchify") for h, w, p in [(8, 12, 3), (6, 8, 4)]]
    return {"shape": tuple(out.shape), "errors": errors}


@probe
def patchify_order(seeds, patchify):
    return [_tensor_result(patchify, images, p, name=f"patchify with P={p}") for images, p in patchify_cases(seeds)]


# ---------------------------------------------------------------- exercise 2: unpatchify
# (batch, channels, height, width, patch size)
UNPATCHIFY_CASES = [(2, 3, 6, 10, 2), (1, 2, 8, 4, 4), (2, 1, 9, 6, 3)]


def unpatchify_cases(seeds):
    g = seeds.generator(1202)
    return [(torch.randn(b, (h // p) * (w // p), c * p * p, generator=g, dtype=torch.float64), p, h, w)
            for b, c, h, w, p in UNPATCHIFY_CASES]


@probe
def unpatchify_inverts_patchify(seeds, unpatchify):
    outputs = [_tensor_result(unpatchify, patches, p, h, w, name="unpatchify")
               for patches, p, h, w in unpatchify_cases(seeds)]
    patches, p, h, w = unpatchify_cases(seeds)[0]
    error = attempt(unpatchify, patches, p, h + p, w, name="unpatchify")
    return {"outputs": outputs, "error": error}


# ---------------------------------------------------------------- exercise 3: PatchEmbedding
EMBEDDING_DIMS = [(3, 4, 10, (2, 8, 12)), (2, 2, 6, (3, 6, 4))]   # in_channels, P, d_model, (B, H, W)


def embedding_cases(seeds):
    g = seeds.generator(1203)
    cases = []
    for c, p, d, (b, h, w) in EMBEDDING_DIMS:
        weight = torch.randn(d, c * p * p, generator=g, dtype=torch.float64) / math.sqrt(c * p * p)
        bias = 0.3 * torch.randn(d, generator=g, dtype=torch.float64)
        cases.append(((c, p, d), {"proj.weight": weight, "proj.bias": bias},
                      torch.randn(b, c, h, w, generator=g, dtype=torch.float64)))
    return cases


@probe
def patch_embedding_values(seeds, PatchEmbedding):
    outputs = []
    for dims, weights, images in embedding_cases(seeds):
        module = build(PatchEmbedding, *dims, name=f"PatchEmbedding{dims}")
        proj = submodule(module, "proj", "PatchEmbedding", "one nn.Linear named `proj`")
        if not isinstance(proj, nn.Linear):
            raise AssertionError(f"PatchEmbedding.proj should be an nn.Linear, not {type(proj).__name__}.")
        load_weights(module.double(), weights, "PatchEmbedding", "one nn.Linear named `proj`")
        with torch.no_grad():
            outputs.append(_tensor_result(module, images, name="PatchEmbedding.forward",
                                          helpers={"patchify": reference_patchify}))
    return outputs


# ---------------------------------------------------------------- exercise 4: conv_weight_as_linear
CONV_DIMS = [(8, 3, 4), (5, 2, 2), (6, 1, 3)]   # d_model, C, P


def conv_cases(seeds):
    g = seeds.generator(1204)
    return [torch.randn(d, c, p, p, generator=g, dtype=torch.float64) for d, c, p in CONV_DIMS]


@probe
def conv_equals_linear_patch_embedding(seeds, conv_weight_as_linear):
    return [_tensor_result(conv_weight_as_linear, weight, name="conv_weight_as_linear") for weight in conv_cases(seeds)]


# ---------------------------------------------------------------- exercise 5: add_cls_and_positions
CLS_CASES = [(3, 5, 6), (1, 9, 4), (2, 1, 3)]   # B, N, d


def cls_cases(seeds):
    g = seeds.generator(1205)
    return [(torch.randn(b, n, d, generator=g, dtype=torch.float64), torch.randn(1, 1, d, generator=g, dtype=torch.float64),
             torch.randn(1, n + 1, d, generator=g, dtype=torch.float64)) for b, n, d in CLS_CASES]


@probe
def add_cls_and_positions_values(seeds, add_cls_and_positions):
    return [_tensor_result(add_cls_and_positions, *case, name="add_cls_and_positions") for case in cls_cases(seeds)]


# ---------------------------------------------------------------- exercise 6: VisionTransformer
def vit_dims(image_size=8, patch_size=2, in_channels=3, num_classes=5, d_model=12, num_layers=2, num_heads=3, d_ff=20):
    return dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels, num_classes=num_classes,
                d_model=d_model, num_layers=num_layers, num_heads=num_heads, d_ff=d_ff)


def linear_shapes(prefix, d_in, d_out):
    return [(f"{prefix}.weight", (d_out, d_in)), (f"{prefix}.bias", (d_out,))]


def vit_shapes(image_size, patch_size, in_channels, num_classes, d_model, num_layers, num_heads, d_ff):
    n = (image_size // patch_size) ** 2
    shapes = linear_shapes("patch_embed.proj", in_channels * patch_size * patch_size, d_model)
    shapes += [("cls_token", (1, 1, d_model)), ("pos_embed", (1, n + 1, d_model))]
    for i in range(num_layers):
        for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes += linear_shapes(f"layers.{i}.self_attn.{projection}", d_model, d_model)
        shapes += linear_shapes(f"layers.{i}.ffn.linear1", d_model, d_ff) + linear_shapes(f"layers.{i}.ffn.linear2", d_ff, d_model)
        shapes += [(f"layers.{i}.{norm}.{kind}", (d_model,)) for norm in ("norm1", "norm2") for kind in ("weight", "bias")]
    shapes += [("norm.weight", (d_model,)), ("norm.bias", (d_model,))]
    return shapes + linear_shapes("head", d_model, num_classes)


def vit_weights(g, dims):
    """{name: float64 tensor}: LayerNorm gains near 1 and shifts near 0, matrices with std 1/sqrt(fan_in), the
    [CLS] token, the positions and the other vectors with std 0.5."""
    weights = {}
    for name, shape in vit_shapes(**dims):
        noise = torch.randn(shape, generator=g, dtype=torch.float64)
        if "norm" in name:
            weights[name] = (1.0 if name.endswith("weight") else 0.0) + 0.3 * noise
        elif name.endswith("weight"):
            weights[name] = noise / math.sqrt(shape[-1])
        else:
            weights[name] = 0.5 * noise
    return weights


VIT_NAMES = ("`patch_embed` (PatchEmbedding, with `proj`), `cls_token`, `pos_embed`, `layers` (EncoderLayers), "
             "`norm` and `head`")


def _vit(VisionTransformer, dims, pool="cls", weights=None):
    model = build(VisionTransformer, *dims.values(), pool=pool, name=f"VisionTransformer{tuple(dims.values())}",
                  helpers=VIT_HELPERS, forbidden=VIT_SHORTCUTS, advice=VIT_ADVICE)
    for path in ("patch_embed", "layers", "norm", "head"):
        submodule(model, path, "VisionTransformer", VIT_NAMES)
    if weights is None:
        return model
    return load_weights(model.double(), weights, "VisionTransformer", VIT_NAMES)


def _run_vit(method, images, name):
    with torch.no_grad():
        return _tensor_result(method, images, name=name, helpers=VIT_HELPERS, forbidden=VIT_SHORTCUTS,
                              forbidden_advice=VIT_ADVICE)


def vit_images(g, dims, batch=3):
    size = dims["image_size"]
    return torch.randn(batch, dims["in_channels"], size, size, generator=g, dtype=torch.float64)


STRUCTURE_DIMS = vit_dims(image_size=12, patch_size=4, in_channels=2, num_classes=7, num_layers=3)


@probe
def vision_transformer_structure(seeds, VisionTransformer):
    model = _vit(VisionTransformer, STRUCTURE_DIMS)
    layers = getattr(model, "layers", [])
    images = vit_images(seeds.generator(1206), STRUCTURE_DIMS).float()
    error = attempt(VisionTransformer, *STRUCTURE_DIMS.values(), pool="max", name="VisionTransformer")
    return {"parameters": {name: tuple(p.shape) for name, p in model.named_parameters()}, "count": count(model),
            "layers": len(layers), "norm_first": [bool(getattr(layer, "norm_first", False)) for layer in layers],
            "logits_shape": tuple(_run_vit(model, images, "VisionTransformer.forward").shape), "error": error}


# (weights stream, dims) for the features' parity; the images' stream is the weights' + 50
FEATURE_CASES = [(1207, vit_dims()), (1208, vit_dims(image_size=12, patch_size=3, in_channels=1, d_model=8,
                                                      num_layers=1, num_heads=2, d_ff=16))]


def vit_case(seeds, stream, dims):
    return vit_weights(seeds.generator(stream), dims), vit_images(seeds.generator(stream + 50), dims)


@probe
def vision_transformer_features(seeds, VisionTransformer):
    outputs = []
    for stream, dims in FEATURE_CASES:
        weights, images = vit_case(seeds, stream, dims)
        model = _vit(VisionTransformer, dims, weights=weights)
        outputs.append(_run_vit(model.features, images, "VisionTransformer.features"))
    return outputs


POOLING_DIMS = vit_dims(image_size=6, patch_size=2, in_channels=2, num_classes=4)


@probe
def vision_transformer_pooling(seeds, VisionTransformer):
    weights, images = vit_case(seeds, 1209, POOLING_DIMS)
    return {pool: _run_vit(_vit(VisionTransformer, POOLING_DIMS, pool, weights), images, f"VisionTransformer(pool={pool!r})")
            for pool in ("cls", "mean")}


# ---------------------------------------------------------------- exercise 7: load_hf_vit_weights
# our parameter names -> ViTForImageClassification's
HF_LAYER_NAMES = {"norm1": "layernorm_before", "norm2": "layernorm_after", "self_attn.q_proj": "attention.q_proj",
                  "self_attn.k_proj": "attention.k_proj", "self_attn.v_proj": "attention.v_proj",
                  "self_attn.out_proj": "attention.o_proj", "ffn.linear1": "mlp.fc1", "ffn.linear2": "mlp.fc2"}

HF_OTHER_NAMES = {"patch_embed.proj.weight": "vit.embeddings.patch_embeddings.projection.weight",
                  "patch_embed.proj.bias": "vit.embeddings.patch_embeddings.projection.bias",
                  "cls_token": "vit.embeddings.cls_token", "pos_embed": "vit.embeddings.position_embeddings",
                  "norm.weight": "vit.layernorm.weight", "norm.bias": "vit.layernorm.bias",
                  "head.weight": "classifier.weight", "head.bias": "classifier.bias"}


def hf_name(name):
    if name in HF_OTHER_NAMES:
        return HF_OTHER_NAMES[name]
    _, i, rest = name.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    return f"vit.layers.{i}.{HF_LAYER_NAMES[module]}.{kind}"


def hf_vit_from(weights, dims, dtype=torch.float64):
    """A ViTForImageClassification (sdpa attention, eval mode) holding `weights` (our names), built offline."""
    from transformers import ViTConfig, ViTForImageClassification
    config = ViTConfig(image_size=dims["image_size"], patch_size=dims["patch_size"], num_channels=dims["in_channels"],
                       num_labels=dims["num_classes"], hidden_size=dims["d_model"],
                       num_hidden_layers=dims["num_layers"], num_attention_heads=dims["num_heads"],
                       intermediate_size=dims["d_ff"], layer_norm_eps=1e-12, attn_implementation="sdpa")
    with quiet(), torch.random.fork_rng(devices=[]):
        model = ViTForImageClassification(config).to(dtype).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            target = params.pop(hf_name(name))
            target.copy_(value.reshape(target.shape))   # the conv's filters: (d, C·P·P) -> (d, C, P, P)
    if params:
        raise RuntimeError(f"ViTForImageClassification parameters the check does not set: {sorted(params)}")
    return model


def _loaded(load_hf_vit_weights, dims, hf, images, dtype):
    """The reference ViT after the learner's loader copied `hf` into it: its parameters, and its logits."""
    with torch.random.fork_rng(devices=[]):
        model = ReferenceVisionTransformer(*dims.values()).to(dtype).eval()
    result = call(load_hf_vit_weights, model, hf, name="load_hf_vit_weights",
                  helpers={"conv_weight_as_linear": reference_conv_weight_as_linear})
    if result is not None and result is not model:
        raise AssertionError("load_hf_vit_weights should copy into `model` (and return it), but it returned another object.")
    state = {name: param.detach().clone() for name, param in model.named_parameters()}
    with torch.no_grad():
        return state, model(images.to(dtype))


PARITY_DIMS = vit_dims()


@probe
def load_hf_vit_parity_float32(seeds, load_hf_vit_weights):
    weights, images = vit_case(seeds, 1210, PARITY_DIMS)
    return _loaded(load_hf_vit_weights, PARITY_DIMS, hf_vit_from(weights, PARITY_DIMS, torch.float32), images,
                   torch.float32)


@probe
def load_hf_vit_parity_float64(seeds, load_hf_vit_weights):
    weights, images = vit_case(seeds, 1211, PARITY_DIMS)
    return _loaded(load_hf_vit_weights, PARITY_DIMS, hf_vit_from(weights, PARITY_DIMS), images, torch.float64)


ANY_SIZE_DIMS = vit_dims(image_size=12, patch_size=4, in_channels=2, num_classes=10, d_model=8, num_layers=3,
                         num_heads=2, d_ff=12)


@probe
def load_hf_vit_any_size(seeds, load_hf_vit_weights):
    weights, images = vit_case(seeds, 1212, ANY_SIZE_DIMS)
    hf = hf_vit_from(weights, ANY_SIZE_DIMS)
    state, logits = _loaded(load_hf_vit_weights, ANY_SIZE_DIMS, hf, images, torch.float64)
    # A model of another size (two layers, not three) must be refused, not half loaded.
    with torch.random.fork_rng(devices=[]):
        smaller = ReferenceVisionTransformer(*vit_dims(**{**ANY_SIZE_DIMS, "num_layers": 2}).values()).double()
    refused = attempt(load_hf_vit_weights, smaller, hf, name="load_hf_vit_weights",
                      helpers={"conv_weight_as_linear": reference_conv_weight_as_linear})
    return state, logits, refused


# ---------------------------------------------------------------- exercise 8: interpolate_positions
# (grid g, d, new grid)
INTERPOLATE_CASES = [(4, 6, (6, 6)), (3, 5, (5, 2)), (4, 4, (2, 3)), (2, 3, (2, 2))]


def interpolate_cases(seeds):
    g = seeds.generator(1213)
    return [(torch.randn(1, 1 + grid * grid, d, generator=g, dtype=torch.float64), new) for grid, d, new in INTERPOLATE_CASES]


def _interpolate(fn, table, new_grid):
    return _tensor_result(fn, table, new_grid, name="interpolate_positions", forbidden=INTERPOLATE_SHORTCUTS,
                          forbidden_advice=INTERPOLATE_ADVICE)


@probe
def interpolate_positions_values(seeds, interpolate_positions):
    return [_interpolate(interpolate_positions, table, new) for table, new in interpolate_cases(seeds)[:3]]


KEEPS_CLS_GRID = (2, 2)   # fewer slots: an interpolation that runs over [CLS]'s slot too changes it


@probe
def interpolate_positions_keeps_cls(seeds, interpolate_positions):
    cases = interpolate_cases(seeds)
    return [_interpolate(interpolate_positions, table, new) for table, new in (cases[3], (cases[1][0], KEEPS_CLS_GRID))]


# ---------------------------------------------------------------- exercise 9: train_epoch
class StepModel(nn.Module):
    """A linear map of the pixels (float64), recording the mode of every call."""

    def __init__(self, weight, bias):
        super().__init__()
        self.linear = nn.Linear(weight.shape[1], weight.shape[0]).double()
        with torch.no_grad():
            self.linear.weight.copy_(weight)
            self.linear.bias.copy_(bias)
        self.modes = []

    def forward(self, images):
        self.modes.append(self.training)
        return self.linear(images.flatten(1))


# (examples, batch size, learning rate)
EPOCH_CASES = [(11, 4, 0.5), (12, 6, 0.3)]


def epoch_cases(seeds):
    g = seeds.generator(1214)
    cases = []
    for n, batch_size, lr in EPOCH_CASES:
        weight = 0.3 * torch.randn(5, 16, generator=g, dtype=torch.float64)
        bias = 0.3 * torch.randn(5, generator=g, dtype=torch.float64)
        images = torch.randn(n, 1, 4, 4, generator=g, dtype=torch.float64)
        labels = torch.randint(0, 5, (n,), generator=g)
        cases.append((weight, bias, images, labels, batch_size, lr, seeds.seed(1215 + n)))
    return cases


def _epoch(train_epoch, model, optimizer, images, labels, batch_size, seed, scheduler=None):
    result = call(train_epoch, model, optimizer, images, labels, batch_size, torch.Generator().manual_seed(seed),
                  scheduler, name="train_epoch")
    if not isinstance(result, (list, tuple)):
        raise AssertionError(f"train_epoch should return the list of batch losses, not a {type(result).__name__}.")
    return [float(loss) if not torch.is_tensor(loss) else loss.detach().double() for loss in result]


@probe
def train_epoch_steps(seeds, train_epoch):
    results = []
    for weight, bias, images, labels, batch_size, lr, seed in epoch_cases(seeds):
        model = StepModel(weight, bias).eval()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        losses = _epoch(train_epoch, model, optimizer, images, labels, batch_size, seed)
        results.append({"losses": losses, "weight": model.linear.weight.detach().clone(),
                        "bias": model.linear.bias.detach().clone()})
    return results


@probe
def train_epoch_modes_and_schedule(seeds, train_epoch):
    weight, bias, images, labels, batch_size, lr, seed = epoch_cases(seeds)[0]
    model = StepModel(weight, bias).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    losses = _epoch(train_epoch, model, optimizer, images, labels, batch_size, seed, scheduler)
    return {"modes": list(model.modes), "scheduler_steps": scheduler.last_epoch, "losses": len(losses),
            "weight": model.linear.weight.detach().clone(), "bias": model.linear.bias.detach().clone()}


LEARN_EPOCHS, LEARN_EXAMPLES = 3, 600


@probe
def train_epoch_learns(seeds, train_epoch):
    """An MLP trained by the learner's loop on a seeded selection of the training digits, measured on the held-out ones."""
    from courselib.vision_data import MLP, digits_split
    (train_x, train_y), (test_x, test_y) = digits_split()
    chosen = torch.randperm(len(train_y), generator=seeds.generator(1216))[:LEARN_EXAMPLES]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds.seed(1217))
        model = MLP()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        with torch.no_grad():
            before = F.cross_entropy(model(test_x), test_y).item()
        for epoch in range(LEARN_EPOCHS):
            _epoch(train_epoch, model, optimizer, train_x[chosen], train_y[chosen], 32, seeds.seed(1218 + epoch))
        model.eval()
        with torch.no_grad():
            after = F.cross_entropy(model(test_x), test_y).item()
    return {"before": before, "after": after}


# ---------------------------------------------------------------- the trained ViT
ACCURACY_EXAMPLES = 240


@probe
def vit_trained_accuracy(seeds, vit):
    """The learner's trained ViT on a seeded selection of the 360 held-out digits: its logits."""
    from courselib.vision_data import digits_split
    _, (test_x, _) = digits_split()
    chosen = torch.randperm(len(test_x), generator=seeds.generator(1219))[:ACCURACY_EXAMPLES]
    if not isinstance(vit, nn.Module):
        raise AssertionError(f"`vit` should be your trained VisionTransformer, not a {type(vit).__name__}.")
    was_training = vit.training
    vit.eval()
    try:
        with torch.no_grad():
            return _tensor_result(vit, test_x[chosen], name="your trained ViT")
    finally:
        vit.train(was_training)


# ---------------------------------------------------------------- exercise 10: attention_rollout
# (B, h, T, layers)
ROLLOUT_CASES = [(2, 3, 5, 1), (2, 2, 6, 2), (1, 4, 7, 3)]


def rollout_cases(seeds):
    g = seeds.generator(1220)
    return [[torch.softmax(2 * torch.randn(b, h, t, t, generator=g, dtype=torch.float64), dim=-1) for _ in range(layers)]
            for b, h, t, layers in ROLLOUT_CASES]


@probe
def attention_rollout_values(seeds, attention_rollout):
    return [_tensor_result(attention_rollout, attentions, name="attention_rollout") for attentions in rollout_cases(seeds)]


def unnormalised_rollout_case(seeds):
    g = seeds.generator(1221)
    return [torch.rand(2, 3, 5, 5, generator=g, dtype=torch.float64) for _ in range(2)]


@probe
def attention_rollout_unnormalised_rows(seeds, attention_rollout):
    return _tensor_result(attention_rollout, unnormalised_rollout_case(seeds), name="attention_rollout")


# ---------------------------------------------------------------- exercise 11 (optional stretch): MAE
# (B, N, d, mask ratio)
MASKING_CASES = [(2, 16, 3, 0.75), (3, 10, 4, 0.5), (1, 7, 2, 0.6)]


def masking_cases(seeds):
    g = seeds.generator(1222)
    return [(torch.randn(b, n, d, generator=g, dtype=torch.float64), torch.rand(b, n, generator=g, dtype=torch.float64),
             ratio) for b, n, d, ratio in MASKING_CASES]


@probe
def stretch_random_masking(seeds, random_masking, masked_patch_loss):
    results = []
    for tokens, noise, ratio in masking_cases(seeds):
        result = call(random_masking, tokens, noise, ratio, name="random_masking", forbidden=MASKING_SHORTCUTS,
                      forbidden_advice=MASKING_ADVICE)
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise AssertionError("random_masking should return the three tensors (kept, mask, ids_restore).")
        results.append(tuple(result))
    return results


def loss_cases(seeds):
    g = seeds.generator(1223)
    cases = []
    for b, n, d in [(2, 9, 4), (3, 5, 6)]:
        mask = (torch.rand(b, n, generator=g) < 0.6).double()
        mask[:, 0] = 1.0
        cases.append((torch.randn(b, n, d, generator=g, dtype=torch.float64),
                      torch.randn(b, n, d, generator=g, dtype=torch.float64), mask))
    return cases


@probe
def stretch_masked_patch_loss(seeds, random_masking, masked_patch_loss):
    return [_tensor_result(masked_patch_loss, *case, name="masked_patch_loss") for case in loss_cases(seeds)]


# ---------------------------------------------------------------- warming up the judges
def warm_up():
    """What the judges need first: transformers' ViT (seconds to import)."""
    from transformers import ViTConfig, ViTForImageClassification  # noqa: F401


if threading.current_thread().name == "load-hidden-checks":
    try:
        warm_up()
    except Exception:  # a judge that needs it will say what is wrong
        pass
