"""Hidden checks for 12_vision_transformer, the judge side (in the grader only, never in the sandbox): the oracles
(`F.unfold` / `F.fold` / `F.conv2d`, transformers' `ViTForImageClassification`, `ViTEmbeddings.interpolate_pos_encoding`
and `ViTMAEEmbeddings.random_masking`, recomputations of an SGD epoch and of attention rollout), the diagnoses, and
one judge per probe of autograder/checks/vision.py."""
import functools
import math

import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, expect_tensor
from autograder.checks.vision import (
    ACCURACY_EXAMPLES,
    ANY_SIZE_DIMS,
    CLS_CASES,
    CONV_DIMS,
    EPOCH_CASES,
    FEATURE_CASES,
    INTERPOLATE_CASES,
    KEEPS_CLS_GRID,
    PARITY_DIMS,
    PATCHIFY_CASES,
    POOLING_DIMS,
    STRUCTURE_DIMS,
    UNPATCHIFY_CASES,
    add_cls_and_positions_values,
    attention_rollout_unnormalised_rows,
    attention_rollout_values,
    cls_cases,
    conv_cases,
    conv_equals_linear_patch_embedding,
    embedding_cases,
    epoch_cases,
    hf_name,
    hf_vit_from,
    interpolate_cases,
    interpolate_positions_keeps_cls,
    interpolate_positions_values,
    load_hf_vit_any_size,
    load_hf_vit_parity_float32,
    load_hf_vit_parity_float64,
    loss_cases,
    masking_cases,
    patch_embedding_values,
    patchify_cases,
    patchify_order,
    patchify_shapes,
    rollout_cases,
    stretch_masked_patch_loss,
    stretch_random_masking,
    train_epoch_learns,
    train_epoch_modes_and_schedule,
    train_epoch_steps,
    unnormalised_rollout_case,
    unpatchify_cases,
    unpatchify_inverts_patchify,
    vision_transformer_features,
    vision_transformer_pooling,
    vision_transformer_structure,
    vit_case,
    vit_shapes,
    vit_trained_accuracy,
    vit_weights,
)


# ---------------------------------------------------------------- patches
def oracle_patches(images, p):
    """F.unfold: (B, C·P·P, N), channel-first within a patch, patches row-major."""
    return F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)


def patch_diagnoses(images, p):
    def wrong():
        B, C, H, W = images.shape
        grid = images.reshape(B, C, H // p, p, W // p, p)
        return {
            "each patch is flattened channel-last (pixel by pixel, the channels of a pixel together); the order asked "
            "for is channel-first: all of channel 0's pixels of the patch, then channel 1's.":
                grid.permute(0, 2, 4, 3, 5, 1).reshape(B, -1, C * p * p),
            "the patches run column by column; they go row by row (patch 1 is to the right of patch 0).":
                grid.permute(0, 4, 2, 1, 3, 5).reshape(B, -1, C * p * p),
            "inside each patch the pixels run column by column; they go row by row.":
                grid.permute(0, 2, 4, 1, 5, 3).reshape(B, -1, C * p * p),
            "you reshaped without moving the axes: a plain reshape of (B, C, H, W) to (B, N, C·P·P) cuts the image into "
            "strips, not patches. permute the grid axes in front first.": images.reshape(B, -1, C * p * p),
        }
    return wrong


@patchify_shapes.judge
def judge_patchify_shapes(seeds, data):
    b, c, h, w, p = PATCHIFY_CASES[0]
    expect_shape(torch.zeros(data["shape"]), (b, (h // p) * (w // p), c * p * p), f"patchify of ({b}, {c}, {h}, {w}) with P={p}",
                 f"N = ({h}/{p})·({w}/{p}) patches of C·P·P = {c * p * p} numbers.")
    for result, (h, w, p) in zip(data["errors"], [(8, 12, 3), (6, 8, 4)]):
        if not result["value_error"]:
            raise AssertionError(f"patchify of an {h}x{w} image with P={p} should raise ValueError (the image is not a whole "
                                 f"number of patches), but it {'raised ' + result['error'] if result['error'] else 'returned'}.")


@patchify_order.judge
def judge_patchify_order(seeds, outputs):
    for (images, p), out in zip(patchify_cases(seeds), outputs):
        expect_close(out, oracle_patches(images, p), f"patchify of a {tuple(images.shape)} image with P={p}",
                     "Patches row-major, each patch channel-first, then row by row.", diagnoses=patch_diagnoses(images, p),
                     rtol=0, atol=1e-12)


@unpatchify_inverts_patchify.judge
def judge_unpatchify(seeds, data):
    for (patches, p, h, w), out in zip(unpatchify_cases(seeds), data["outputs"]):
        expected = F.fold(patches.transpose(1, 2), output_size=(h, w), kernel_size=p, stride=p)

        def wrong(patches=patches, p=p, h=h, w=w):
            B, N, D = patches.shape
            C = D // (p * p)
            grid = patches.reshape(B, h // p, w // p, p, p, C)
            return {"the patches were read as channel-last; patchify's order is channel-first (C, P, P) inside each patch.":
                    grid.permute(0, 5, 1, 3, 2, 4).reshape(B, C, h, w),
                    "you reshaped without moving the axes back: undo patchify's permutation.": patches.reshape(B, C, h, w)}
        expect_close(out, expected, f"unpatchify to ({C_of(patches, p)}, {h}, {w}) with P={p}",
                     "Undo patchify's steps in reverse: split into (B, rows, columns, C, P, P), permute, merge.",
                     diagnoses=wrong, rtol=0, atol=1e-12)
    if not data["error"]["value_error"]:
        raise AssertionError("unpatchify should raise ValueError when the number of patches does not tile the image.")


def C_of(patches, p):
    return patches.shape[-1] // (p * p)


# ---------------------------------------------------------------- the patch embedding
def conv_tokens(images, weight, bias, p):
    """The oracle: a Conv2d with kernel = stride = P, its grid flattened row-major."""
    return F.conv2d(images, weight, bias, stride=p).flatten(2).transpose(1, 2)


@patch_embedding_values.judge
def judge_patch_embedding(seeds, outputs):
    for ((c, p, d), weights, images), out in zip(embedding_cases(seeds), outputs):
        weight = weights["proj.weight"].reshape(d, c, p, p)
        expect_close(out, conv_tokens(images, weight, weights["proj.bias"], p), f"PatchEmbedding({c}, {p}, {d})",
                     "proj applied to patchify(images, patch_size): (B, N, d_model).",
                     diagnoses={"you left out proj's bias.": conv_tokens(images, weight, None, p)}, rtol=0, atol=1e-10)


@conv_equals_linear_patch_embedding.judge
def judge_conv_weight_as_linear(seeds, outputs):
    g = torch.Generator().manual_seed(seeds.seed(1299))
    for weight, (d, c, p), matrix in zip(conv_cases(seeds), CONV_DIMS, outputs):
        matrix = expect_tensor(matrix, "conv_weight_as_linear(weight)")
        expect_shape(matrix, (d, c * p * p), f"conv_weight_as_linear of a ({d}, {c}, {p}, {p}) weight",
                     "One row per output feature, C·P·P numbers per row, as nn.Linear stores (out, in).")
        images = torch.randn(2, c, 2 * p, 3 * p, generator=g, dtype=torch.float64)
        expected = conv_tokens(images, weight, None, p)
        actual = oracle_patches(images, p) @ matrix.double().T
        wrong = {"each filter was flattened channel-last (P, P, C); patchify lays a patch out channel-first (C, P, P), "
                 "as the filter already is.": oracle_patches(images, p) @ weight.permute(0, 2, 3, 1).reshape(d, -1).T,
                 "the filter's rows and columns were swapped (a transpose of P x P).":
                     oracle_patches(images, p) @ weight.transpose(2, 3).reshape(d, -1).T}
        expect_close(actual, expected, f"a linear patch embedding with your ({d}, {c}·{p}·{p}) matrix against the Conv2d",
                     "Flatten each filter in patchify's order.", diagnoses=wrong, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- [CLS] and positions
@add_cls_and_positions_values.judge
def judge_add_cls_and_positions(seeds, outputs):
    for (tokens, cls, positions), out in zip(cls_cases(seeds), outputs):
        b, n, d = tokens.shape
        expected = torch.cat([cls.expand(b, 1, d), tokens], dim=1) + positions
        wrong = {
            "the [CLS] token is appended at the end; it goes in front, slot 0.":
                torch.cat([tokens, cls.expand(b, 1, d)], dim=1) + positions,
            "the positions were added before the [CLS] token was put in place, so [CLS] got no position (or patch 0's): "
            "prepend [CLS] first, then add all N + 1 positions.":
                torch.cat([cls.expand(b, 1, d), tokens + positions[:, 1:]], dim=1),
            "the patches got positions 0..N-1 and [CLS] none: put [CLS] in slot 0 first, then add slot t's position to slot t.":
                torch.cat([cls.expand(b, 1, d), tokens + positions[:, :n]], dim=1),
        }
        expect_close(out, expected, f"add_cls_and_positions of ({b}, {n}, {d}) tokens",
                     "[CLS] in slot 0, patch n in slot n + 1, then pos_embed added to every slot.", diagnoses=wrong,
                     rtol=0, atol=1e-12)


# ---------------------------------------------------------------- the ViT
@functools.lru_cache(maxsize=8)
def _oracle(stream, token, dims_items):
    """transformers' ViT holding the check's weights: (model, images), cached per check run."""
    from autograder.checks.common import Seeds
    dims = dict(dims_items)
    weights, images = vit_case(Seeds(token), stream, dims)
    return hf_vit_from(weights, dims), images


def oracle_outputs(seeds, stream, dims):
    model, images = _oracle(stream, seeds.token, tuple(dims.items()))
    with torch.no_grad():
        hidden = model.vit(images).last_hidden_state
        return hidden, model.classifier(hidden[:, 0]), model.classifier(hidden[:, 1:].mean(dim=1))


@vision_transformer_structure.judge
def judge_vision_transformer_structure(seeds, data):
    expected = dict(vit_shapes(**STRUCTURE_DIMS))
    found = {name: tuple(shape) for name, shape in data["parameters"].items()}
    missing = sorted(set(expected) - set(found))
    if missing:
        raise AssertionError(f"VisionTransformer has no parameter {missing[0]} (of {len(missing)} missing): see the table "
                             "of names; the loader and the tests use them.")
    for name, shape in expected.items():
        if found[name] != shape:
            raise AssertionError(f"VisionTransformer's {name} has shape {found[name]}, expected {shape} (a 12x12 image in "
                                 "4x4 patches: 9 patches and [CLS]).")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise AssertionError(f"VisionTransformer has parameters the ViT has not: {extra}.")
    if data["layers"] != STRUCTURE_DIMS["num_layers"] or not all(data["norm_first"]):
        raise AssertionError("layers should hold num_layers EncoderLayers with norm_first=True (a ViT is pre-LN).")
    if tuple(data["logits_shape"]) != (3, STRUCTURE_DIMS["num_classes"]):
        raise AssertionError(f"the logits have shape {tuple(data['logits_shape'])}, expected (B, num_classes) = (3, 7).")
    if not data["error"]["value_error"]:
        raise AssertionError("VisionTransformer(..., pool='max') should raise ValueError: only 'cls' and 'mean' exist.")


def features_diagnoses(seeds, stream, dims):
    def wrong():
        model, images = _oracle(stream, seeds.token, tuple(dims.items()))
        embeddings = model.vit.embeddings
        with torch.no_grad():
            tokens = embeddings.patch_embeddings(images)
            cls = embeddings.cls_token.expand(len(images), -1, -1)
            positions = embeddings.position_embeddings
            return {"the final LayerNorm is missing: features ends with `norm` (pre-LN layers leave the stream "
                    "unnormalised).": _run_layers(model, torch.cat([cls, tokens], 1) + positions, final=False),
                    "the [CLS] token is appended; it goes in front, slot 0.":
                        _run_layers(model, torch.cat([tokens, cls], 1) + positions),
                    "there are no position embeddings in the sum.": _run_layers(model, torch.cat([cls, tokens], 1))}
    return wrong


def _run_layers(model, x, final=True):
    for layer in model.vit.layers:
        x = layer(x)
    return model.vit.layernorm(x) if final else x


@vision_transformer_features.judge
def judge_vision_transformer_features(seeds, outputs):
    for (stream, dims), out in zip(FEATURE_CASES, outputs):
        hidden, _, _ = oracle_outputs(seeds, stream, dims)
        expect_close(out, hidden, f"features of a ViT{tuple(dims.values())} against transformers' last_hidden_state",
                     "patch_embed, [CLS] in front and positions added, dropout, the pre-LN layers, the final norm. (Graded "
                     "with the course's PatchEmbedding, add_cls_and_positions and 07 classes.)",
                     diagnoses=features_diagnoses(seeds, stream, dims), rtol=0, atol=1e-10)


@vision_transformer_pooling.judge
def judge_vision_transformer_pooling(seeds, data):
    hidden, by_cls, by_mean = oracle_outputs(seeds, 1209, POOLING_DIMS)
    model, _ = _oracle(1209, seeds.token, tuple(POOLING_DIMS.items()))
    with torch.no_grad():
        wrong = {"the head reads the last slot; with pool='cls' it reads slot 0, [CLS].": model.classifier(hidden[:, -1]),
                 "mean pooling included the [CLS] slot; it averages the N patch states, slots 1..N.":
                     model.classifier(hidden.mean(dim=1)),
                 "the head reads the mean of the patches; with pool='cls' it reads slot 0.": by_mean,
                 "the head reads slot 0; with pool='mean' it reads the mean of slots 1..N.": by_cls}
    expect_close(data["cls"], by_cls, "the logits with pool='cls'", diagnoses=wrong, rtol=0, atol=1e-10)
    expect_close(data["mean"], by_mean, "the logits with pool='mean'", diagnoses=wrong, rtol=0, atol=1e-10)


# ---------------------------------------------------------------- the loader
def loader_diagnoses(state, weights):
    d, cpp = weights["patch_embed.proj.weight"].shape
    found = state.get("patch_embed.proj.weight")
    messages = []
    if found is not None and tuple(found.shape) == (d, cpp) and not torch.allclose(found.double(), weights["patch_embed.proj.weight"]):
        c = cpp // (PARITY_DIMS["patch_size"] ** 2) if cpp == PARITY_DIMS["in_channels"] * PARITY_DIMS["patch_size"] ** 2 else None
        if c:
            p = PARITY_DIMS["patch_size"]
            channel_last = weights["patch_embed.proj.weight"].reshape(d, c, p, p).permute(0, 2, 3, 1).reshape(d, -1)
            if torch.allclose(found.double(), channel_last, atol=1e-6):
                messages.append("the projection's filters were flattened channel-last (P, P, C): flatten them as patchify "
                                "lays out a patch, channel first (your conv_weight_as_linear).")
    swaps = [("layers.0.norm1.weight", "layers.0.norm2.weight", "norm1 and norm2 are swapped: norm1 is layernorm_before "
              "(before attention), norm2 layernorm_after."),
             ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "q_proj and k_proj are swapped."),
             ("norm.weight", "layers.0.norm1.weight", "")]
    for ours, theirs, message in swaps:
        if message and ours in state and torch.allclose(state[ours].double(), weights[theirs], atol=1e-6):
            messages.append(message)
    return messages


def _judge_loaded(state, logits, weights, dims, images, atol, what):
    for name, value in weights.items():
        found = state.get(name)
        if found is None:
            raise AssertionError(f"the model has no {name} after loading.")
        if not torch.allclose(found.double(), value, rtol=0, atol=max(atol, 1e-6)):
            known = loader_diagnoses(state, weights)
            raise AssertionError(f"after load_hf_vit_weights, {name} is not transformers' {hf_name(name)}"
                                 + (f": {known[0]}" if known else ": copy every row of the table."))
    hf = hf_vit_from(weights, dims, dtype=logits.dtype)
    with torch.no_grad():
        expected = hf(images.to(logits.dtype)).logits
    expect_close(logits, expected, what, "(Graded on the course's VisionTransformer, so only your loader counts.)",
                 rtol=0, atol=atol)


@load_hf_vit_parity_float32.judge
def judge_load_hf_vit_parity_float32(seeds, data):
    state, logits = data
    weights, images = vit_case(seeds, 1210, PARITY_DIMS)
    _judge_loaded(state, logits, {k: v.float().double() for k, v in weights.items()}, PARITY_DIMS, images, 1e-5,
                  "the logits after loading (float32)")


@load_hf_vit_parity_float64.judge
def judge_load_hf_vit_parity_float64(seeds, data):
    state, logits = data
    rebound = [name for name, tensor in state.items() if tensor.dtype != torch.float64]
    if rebound or logits.dtype != torch.float64:
        raise AssertionError(f"after loading into a float64 model, {(rebound or ['the logits'])[0]} is not float64: "
                             "copy_ into each parameter, which keeps the model's dtype; rebinding `.data` (or replacing "
                             "the parameter) puts transformers' tensor in its place.")
    weights, images = vit_case(seeds, 1211, PARITY_DIMS)
    _judge_loaded(state, logits, weights, PARITY_DIMS, images, 1e-12, "the logits after loading (float64, to 1e-12)")


@load_hf_vit_any_size.judge
def judge_load_hf_vit_any_size(seeds, data):
    state, logits, refused = data
    weights, images = vit_case(seeds, 1212, ANY_SIZE_DIMS)
    _judge_loaded(state, logits, weights, ANY_SIZE_DIMS, images, 1e-12,
                  "the logits of a 3-layer ViT with 12x12 two-channel images in 4x4 patches")
    if refused["error"] is None:
        raise AssertionError("load_hf_vit_weights loaded a 3-layer ViT into a 2-layer model without an error: "
                             "zip(..., strict=True) makes a depth mismatch raise.")


# ---------------------------------------------------------------- positions
def oracle_interpolation(table, new_grid):
    """transformers' ViTEmbeddings.interpolate_pos_encoding, as its ViT does it for a larger image."""
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings
    grid, d = math.isqrt(table.shape[1] - 1), table.shape[-1]
    config = ViTConfig(image_size=grid, patch_size=1, hidden_size=d, num_channels=1)
    with torch.random.fork_rng(devices=[]):
        embeddings = ViTEmbeddings(config).double()
    with torch.no_grad():
        embeddings.position_embeddings.copy_(table)
        rows, columns = new_grid
        return embeddings.interpolate_pos_encoding(torch.zeros(1, 1 + rows * columns, d, dtype=torch.float64), rows, columns)


def interpolation_diagnoses(table, new_grid):
    def wrong():
        rows, columns = new_grid
        grid, d = math.isqrt(table.shape[1] - 1), table.shape[-1]
        patches = table[:, 1:].reshape(1, grid, grid, d).permute(0, 3, 1, 2)

        def resized(mode, align=False, size=(rows, columns)):
            out = F.interpolate(patches, size=size, mode=mode, align_corners=align if mode != "nearest" else None)
            return out.permute(0, 2, 3, 1).reshape(1, -1, d)
        found = {
            "the grid was resized bilinearly; the ViT's interpolation is bicubic.":
                torch.cat([table[:, :1], resized("bilinear")], 1),
            "align_corners=True: ViT interpolates with align_corners=False.":
                torch.cat([table[:, :1], resized("bicubic", True)], 1),
            "the [CLS] slot was interpolated with the patches as one sequence: keep slot 0 apart and resize only the grid.":
                F.interpolate(table.transpose(1, 2), size=1 + rows * columns, mode="linear",
                              align_corners=False).transpose(1, 2),
        }
        if rows != columns:
            swapped = resized("bicubic", size=(columns, rows)).reshape(1, columns, rows, d).transpose(1, 2).reshape(1, -1, d)
            found["rows and columns are swapped: new_grid is (rows, columns), and the grid flattens row-major."] = (
                torch.cat([table[:, :1], swapped], 1))
        return found
    return wrong


@interpolate_positions_values.judge
def judge_interpolate_positions_values(seeds, outputs):
    for (table, new_grid), out in zip(interpolate_cases(seeds)[:3], outputs):
        expect_close(out, oracle_interpolation(table, new_grid), f"positions of a {math.isqrt(table.shape[1] - 1)}-grid "
                     f"resized to {new_grid}", "Keep slot 0 apart; resize the (d, g, g) grid bicubically, "
                     "align_corners=False; flatten row-major.", diagnoses=interpolation_diagnoses(table, new_grid),
                     rtol=0, atol=1e-10)


@interpolate_positions_keeps_cls.judge
def judge_interpolate_positions_keeps_cls(seeds, outputs):
    cases = interpolate_cases(seeds)
    same, other = outputs
    expect_close(same, cases[3][0], "positions resized to their own grid", "Bicubic to the same size is the identity.",
                 rtol=0, atol=1e-10)
    table = cases[1][0]
    rows, columns = KEEPS_CLS_GRID
    expect_shape(expect_tensor(other, "interpolate_positions"), (1, 1 + rows * columns, table.shape[-1]),
                 f"positions resized from 3x3 to {rows}x{columns}")
    expect_close(other[:, 0], table[:, 0], f"slot 0 after resizing from 3x3 to {rows}x{columns}",
                 "[CLS] has no place in the grid: it stays as it was.", rtol=0, atol=0)


# ---------------------------------------------------------------- the training epoch
def sgd_epoch(weight, bias, images, labels, batch_size, lr, seed, zero_grad=True):
    """The oracle: the epoch recomputed step by step (float64, plain SGD)."""
    weight, bias = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    losses, grads = [], None
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        loss = F.cross_entropy(images[batch].flatten(1) @ weight.T + bias, labels[batch])
        g_w, g_b = torch.autograd.grad(loss, (weight, bias))
        grads = (g_w, g_b) if zero_grad or grads is None else (grads[0] + g_w, grads[1] + g_b)
        with torch.no_grad():
            weight -= lr * grads[0]
            bias -= lr * grads[1]
        losses.append(loss.item())
    return losses, weight.detach(), bias.detach()


@train_epoch_steps.judge
def judge_train_epoch_steps(seeds, results):
    for (weight, bias, images, labels, batch_size, lr, seed), (n, _, _), found in zip(epoch_cases(seeds), EPOCH_CASES, results):
        losses, w, b = sgd_epoch(weight, bias, images, labels, batch_size, lr, seed)
        batches = math.ceil(n / batch_size)
        if len(found["losses"]) != batches:
            raise AssertionError(f"{n} examples in batches of {batch_size} make {batches} batches (the last one smaller); "
                                 f"train_epoch returned {len(found['losses'])} losses.")
        accumulated = sgd_epoch(weight, bias, images, labels, batch_size, lr, seed, zero_grad=False)
        expect_close(torch.tensor([float(v) for v in found["losses"]]), torch.tensor(losses), "the batch losses",
                     "Visit the examples in the order torch.randperm(len(images), generator=generator) gives, in "
                     "consecutive batches; each loss is the mean cross-entropy of its batch.",
                     diagnoses={"the losses are right only until the second step: without optimizer.zero_grad() the "
                                "gradients add up from step to step.": torch.tensor(accumulated[0])}, rtol=1e-9, atol=1e-9)
        expect_close(found["weight"], w, "the weights after one epoch of SGD",
                     "zero_grad, backward, step for every batch.",
                     diagnoses={"without optimizer.zero_grad() the gradients add up from step to step.": accumulated[1]},
                     rtol=1e-9, atol=1e-9)
        expect_close(found["bias"], b, "the bias after one epoch of SGD", rtol=1e-9, atol=1e-9)


@train_epoch_modes_and_schedule.judge
def judge_train_epoch_modes_and_schedule(seeds, data):
    n, batch_size, _ = EPOCH_CASES[0]
    batches = math.ceil(n / batch_size)
    if not data["modes"] or not all(data["modes"]):
        raise AssertionError("the model ran in evaluation mode: call model.train() at the start of the epoch (accuracy "
                             "leaves it in evaluation mode, which switches dropout off).")
    if data["scheduler_steps"] != batches:
        raise AssertionError(f"the scheduler stepped {data['scheduler_steps']} times in an epoch of {batches} batches: "
                             "call scheduler.step() once after every optimizer.step(), when a scheduler is given.")
    weight, bias, images, labels, batch_size, lr, seed = epoch_cases(seeds)[0]
    # the learning rate falls as 1 / (step + 1): recompute the epoch with that schedule
    w, b = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    for step, start in enumerate(range(0, len(order), batch_size)):
        batch = order[start:start + batch_size]
        loss = F.cross_entropy(images[batch].flatten(1) @ w.T + b, labels[batch])
        g_w, g_b = torch.autograd.grad(loss, (w, b))
        with torch.no_grad():
            w -= lr / (step + 1) * g_w
            b -= lr / (step + 1) * g_b
    expect_close(data["weight"], w.detach(), "the weights after an epoch with a scheduler",
                 "scheduler.step() after each optimizer.step(), not before it.", rtol=1e-9, atol=1e-9)


LEARN_FACTOR = 0.6


@train_epoch_learns.judge
def judge_train_epoch_learns(seeds, data):
    before, after = data["before"], data["after"]
    if not after <= LEARN_FACTOR * before:
        raise AssertionError(f"three epochs of your train_epoch took an MLP's held-out loss from {before:.3f} to {after:.3f}; "
                             f"it should fall to {LEARN_FACTOR:.0%} of its start or lower. Check zero_grad, backward and "
                             "step in every batch, and that the loss is the cross-entropy of the model's logits.")


ACCURACY_THRESHOLD = 0.5


@vit_trained_accuracy.judge
def judge_vit_trained_accuracy(seeds, logits):
    from courselib.vision_data import digits_split
    _, (_, test_y) = digits_split()
    chosen = torch.randperm(len(test_y), generator=seeds.generator(1219))[:ACCURACY_EXAMPLES]
    logits = expect_tensor(logits, "your ViT's logits")
    expect_shape(logits, (ACCURACY_EXAMPLES, 10), "your ViT's logits on held-out digits", "Ten classes, one row per image.")
    accuracy = (logits.argmax(-1) == test_y[chosen]).double().mean().item()
    if accuracy < ACCURACY_THRESHOLD:
        raise AssertionError(f"your trained ViT classifies {accuracy:.1%} of {ACCURACY_EXAMPLES} held-out digits; it should "
                             f"reach at least {ACCURACY_THRESHOLD:.0%} (ten classes: chance is 10%). If an earlier test "
                             "failed, fix it first, then train again.")


# ---------------------------------------------------------------- rollout
def oracle_rollout(attentions):
    T = attentions[0].shape[-1]
    mixed = []
    for weights in attentions:
        a = torch.einsum("bhij->bij", weights) / weights.shape[1] + torch.eye(T, dtype=weights.dtype)
        mixed.append(a / a.sum(dim=-1, keepdim=True))
    return functools.reduce(lambda rollout, a: torch.einsum("bij,bjk->bik", a, rollout), mixed)


def rollout_diagnoses(attentions):
    def wrong():
        T = attentions[0].shape[-1]
        eye = torch.eye(T, dtype=torch.float64)
        half = [(w.mean(1) + eye) / 2 for w in attentions]
        found = {"the heads were combined by their maximum; the rollout here averages them (mean over dim 1).":
                 functools.reduce(lambda r, a: a @ r, [(w.amax(1) + eye) / (w.amax(1) + eye).sum(-1, keepdim=True)
                                                       for w in attentions]),
                 "the identity (the residual path) is missing: Ã = (mean of the heads + I) / 2.":
                 functools.reduce(lambda r, a: a @ r, [w.mean(1) for w in attentions])}
        if len(attentions) > 1:
            found["the product is in the wrong order: the later layer multiplies from the left, R = Ã_L ··· Ã_1."] = (
                functools.reduce(lambda r, a: r @ a, half))
        return found
    return wrong


@attention_rollout_values.judge
def judge_attention_rollout_values(seeds, outputs):
    for attentions, out in zip(rollout_cases(seeds), outputs):
        expect_close(out, oracle_rollout(attentions), f"the rollout of {len(attentions)} layer(s)",
                     "Ã = (mean over heads + I) / 2 per layer, then R = Ã_L ··· Ã_1.", diagnoses=rollout_diagnoses(attentions),
                     rtol=0, atol=1e-10)


@attention_rollout_unnormalised_rows.judge
def judge_attention_rollout_unnormalised_rows(seeds, out):
    attentions = unnormalised_rollout_case(seeds)
    eye = torch.eye(5, dtype=torch.float64)
    expect_close(out, oracle_rollout(attentions), "the rollout of weights whose rows do not sum to 1",
                 "After adding the identity, divide each row by its sum.",
                 diagnoses={"the rows were not renormalised after adding the identity.":
                            functools.reduce(lambda r, a: a @ r, [(w.mean(1) + eye) / 2 for w in attentions])},
                 rtol=0, atol=1e-10)


# ---------------------------------------------------------------- stretch: MAE
def oracle_masking(tokens, noise, ratio):
    from transformers import ViTMAEConfig
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEEmbeddings
    config = ViTMAEConfig(hidden_size=4, image_size=4, patch_size=2, num_channels=1, mask_ratio=ratio)
    with torch.random.fork_rng(devices=[]):
        embeddings = ViTMAEEmbeddings(config)
    kept, mask, ids_restore = embeddings.random_masking(tokens, noise)
    return kept, mask, ids_restore


@stretch_random_masking.judge
def judge_stretch_random_masking(seeds, results):
    for (tokens, noise, ratio), found in zip(masking_cases(seeds), results):
        kept, mask, ids_restore = oracle_masking(tokens, noise, ratio)
        what = f"random_masking of {tuple(tokens.shape)} tokens at a mask ratio of {ratio}"
        expect_close(found[0], kept, f"kept, {what}", "The tokens of the smallest noise values, smallest first.",
                     diagnoses={"you kept the tokens of the largest noise values; keep the smallest (argsort is ascending).":
                                torch.gather(tokens, 1, noise.argsort(1, descending=True)[:, :kept.shape[1], None].expand(-1, -1, tokens.shape[-1]))},
                     rtol=0, atol=0)
        expect_close(found[1], mask, f"mask, {what}", "1 where hidden, 0 where kept, in the patches' original order.",
                     diagnoses={"the mask is in shuffled order: unshuffle it with torch.gather(mask, 1, ids_restore).":
                                (torch.arange(tokens.shape[1]) >= kept.shape[1]).double().expand_as(mask)}, rtol=0, atol=0)
        expect_close(found[2], ids_restore, f"ids_restore, {what}", "argsort of argsort(noise): the inverse permutation.",
                     diagnoses={"ids_restore is argsort(noise) itself; it is the inverse, argsort(argsort(noise)).":
                                noise.argsort(1)}, rtol=0, atol=0)


@stretch_masked_patch_loss.judge
def judge_stretch_masked_patch_loss(seeds, outputs):
    for (predicted, target, mask), out in zip(loss_cases(seeds), outputs):
        per_patch = ((predicted - target) ** 2).mean(-1)
        expected = (per_patch * mask).sum() / mask.sum()
        expect_close(out, expected, "masked_patch_loss", "The mean over the hidden patches of each patch's squared error.",
                     diagnoses={"you averaged over every patch; only the hidden ones (mask == 1) count.": per_patch.mean(),
                                "you divided by B·N, not by the number of hidden patches.": (per_patch * mask).mean(),
                                "the visible patches were scored, not the hidden ones.":
                                    (per_patch * (1 - mask)).sum() / (1 - mask).sum()},
                     rtol=1e-9, atol=1e-12)
