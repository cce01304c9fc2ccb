"""Mutants and alternative correct answers for 12_vision_transformer."""
from autograder.tests.variants import Variant

ASSIGNMENT = "12_vision_transformer"
PATCHIFY = "patchify_answer"
UNPATCHIFY = "unpatchify_answer"
EMBEDDING = "patch_embedding_answer"
CONV = "conv_weight_as_linear_answer"
CLS = "add_cls_and_positions_answer"
VIT = "vision_transformer_answer"
LOAD = "load_hf_vit_weights_answer"
INTERPOLATE = "interpolate_positions_answer"
EPOCH = "train_epoch_answer"
ROLLOUT = "attention_rollout_answer"
MAE = "mae_answer"


def replaced(source, *pairs):
    for old, new in pairs:
        if source.count(old) != 1:
            raise ValueError(f"variant base changed: {old!r} is not in it exactly once")
        source = source.replace(old, new)
    return source


# ------------------------------------------------------------------ patchify, unpatchify
PATCHIFY_HEAD = '''
def patchify(images, patch_size):
    B, C, H, W = images.shape
    P = patch_size
    if H % P or W % P:
        raise ValueError("not a whole number of patches")
'''


def patchify(body):
    return PATCHIFY_HEAD + body


UNPATCHIFY_HEAD = '''
def unpatchify(patches, patch_size, height, width):
    P = patch_size
    B, N, D = patches.shape
    C = D // (P * P)
    if N != (height // P) * (width // P):
        raise ValueError("the patches do not tile the image")
'''


def unpatchify(body):
    return UNPATCHIFY_HEAD + body


# ------------------------------------------------------------------ PatchEmbedding
def embedding(init, forward):
    return f'''
class PatchEmbedding(nn.Module):
    def __init__(self, in_channels, patch_size, d_model):
        super().__init__()
        self.patch_size = patch_size
{init}
    def forward(self, images):
{forward}'''


# ------------------------------------------------------------------ add_cls_and_positions
def cls(body):
    return "def add_cls_and_positions(patch_tokens, cls_token, pos_embed):\n" + body


# ------------------------------------------------------------------ VisionTransformer
VIT_BASE = '''
class VisionTransformer(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, num_classes, d_model, num_layers, num_heads, d_ff,
                 pool="cls", dropout=0.0, eps=1e-12):
        super().__init__()
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', not {pool!r}")
        self.pool = pool
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = PatchEmbedding(in_channels, patch_size, d_model)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, d_model))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, num_patches + 1, d_model))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=eps)
                                    for _ in range(num_layers))
        self.norm = LayerNorm(d_model, eps)
        self.head = nn.Linear(d_model, num_classes)

    def features(self, images):
        x = add_cls_and_positions(self.patch_embed(images), self.cls_token, self.pos_embed)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, images):
        hidden = self.features(images)
        pooled = hidden[:, 0] if self.pool == "cls" else hidden[:, 1:].mean(dim=1)
        return self.head(pooled)
'''

# ------------------------------------------------------------------ load_hf_vit_weights
LOAD_BASE = '''
def load_hf_vit_weights(model, hf_vit):
    def pair(ours, theirs):
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)

    embeddings = hf_vit.vit.embeddings
    with torch.no_grad():
        projection = embeddings.patch_embeddings.projection
        model.patch_embed.proj.weight.copy_(conv_weight_as_linear(projection.weight))
        model.patch_embed.proj.bias.copy_(projection.bias)
        model.cls_token.copy_(embeddings.cls_token)
        model.pos_embed.copy_(embeddings.position_embeddings)
        for ours, theirs in zip(model.layers, hf_vit.vit.layers, strict=True):
            pair(ours.norm1, theirs.layernorm_before)
            pair(ours.self_attn.q_proj, theirs.attention.q_proj)
            pair(ours.self_attn.k_proj, theirs.attention.k_proj)
            pair(ours.self_attn.v_proj, theirs.attention.v_proj)
            pair(ours.self_attn.out_proj, theirs.attention.o_proj)
            pair(ours.norm2, theirs.layernorm_after)
            pair(ours.ffn.linear1, theirs.mlp.fc1)
            pair(ours.ffn.linear2, theirs.mlp.fc2)
        pair(model.norm, hf_vit.vit.layernorm)
        pair(model.head, hf_vit.classifier)
    return model
'''

# ------------------------------------------------------------------ interpolate_positions
INTERPOLATE_BASE = '''
def interpolate_positions(pos_embed, new_grid):
    cls_slot, patches = pos_embed[:, :1], pos_embed[:, 1:]
    g, d = math.isqrt(patches.shape[1]), patches.shape[-1]
    grid = patches.reshape(1, g, g, d).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    patches = grid.permute(0, 2, 3, 1).reshape(1, -1, d)
    return torch.cat([cls_slot, patches], dim=1)
'''

# ------------------------------------------------------------------ train_epoch
EPOCH_BASE = '''
def train_epoch(model, optimizer, images, labels, batch_size, generator, scheduler=None):
    model.train()
    order = torch.randperm(len(images), generator=generator)
    losses = []
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses
'''

# ------------------------------------------------------------------ attention_rollout
ROLLOUT_BASE = '''
def attention_rollout(attentions):
    B, _, T, _ = attentions[0].shape
    rollout = torch.eye(T, dtype=attentions[0].dtype).expand(B, T, T)
    for weights in attentions:
        mixed = (weights.mean(dim=1) + torch.eye(T, dtype=weights.dtype)) / 2
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed @ rollout
    return rollout
'''

# ------------------------------------------------------------------ the stretch: random_masking, masked_patch_loss
MAE_BASE = '''
def random_masking(tokens, noise, mask_ratio):
    B, N, d = tokens.shape
    keep = int(N * (1 - mask_ratio))
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    kept = torch.gather(tokens, 1, ids_shuffle[:, :keep, None].expand(-1, -1, d))
    mask = torch.ones(B, N, dtype=tokens.dtype)
    mask[:, :keep] = 0
    mask = torch.gather(mask, 1, ids_restore)
    return kept, mask, ids_restore


def masked_patch_loss(predicted, target, mask):
    per_patch = ((predicted - target) ** 2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum()
'''


MUTANTS = [
    # ---- patchify
    Variant("patchify_channel_last", {PATCHIFY: patchify('''
    grid = images.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 3, 5, 1)
    return grid.reshape(B, -1, C * P * P)
''')}, loses=("patchify_order",), message="channel-last"),
    Variant("patchify_patches_column_by_column", {PATCHIFY: patchify('''
    grid = images.reshape(B, C, H // P, P, W // P, P).permute(0, 4, 2, 1, 3, 5)
    return grid.reshape(B, -1, C * P * P)
''')}, loses=("patchify_order",), message="Patches row by row"),
    Variant("patchify_pixels_column_by_column", {PATCHIFY: patchify('''
    grid = images.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 1, 5, 3)
    return grid.reshape(B, -1, C * P * P)
''')}, loses=("patchify_order",), message="pixels row by row"),
    Variant("patchify_reshape_without_permute", {PATCHIFY: patchify('''
    return images.reshape(B, (H // P) * (W // P), C * P * P)
''')}, loses=("patchify_order",), message="row by row"),
    Variant("patchify_no_value_error", {PATCHIFY: '''
def patchify(images, patch_size):
    B, C, H, W = images.shape
    P = patch_size
    grid = images[..., :H // P * P, :W // P * P].reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 1, 3, 5)
    return grid.reshape(B, -1, C * P * P)
'''}, loses=("patchify_shapes",), message="ValueError"),
    # Hard-coding the visible worked example must earn nothing: the hidden tests use other images.
    Variant("patchify_hard_coded_visible_answer", {PATCHIFY: '''
def patchify(images, patch_size):
    if images.shape[-1] % patch_size:
        raise ValueError("not a whole number of patches")
    return torch.tensor([[[0.0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]])
'''}, loses=("patchify_shapes", "patchify_order"), message="shape"),
    # ---- unpatchify
    Variant("unpatchify_reads_channel_last", {UNPATCHIFY: unpatchify('''
    grid = patches.reshape(B, height // P, width // P, P, P, C).permute(0, 5, 1, 3, 2, 4)
    return grid.reshape(B, C, height, width)
''')}, loses=("unpatchify_inverts_patchify",), message="reverse order"),
    Variant("unpatchify_reshape_only", {UNPATCHIFY: unpatchify('''
    return patches.reshape(B, C, height, width)
''')}, loses=("unpatchify_inverts_patchify",), message="reverse order"),
    # ---- PatchEmbedding
    Variant("patch_embedding_without_bias", {EMBEDDING: embedding(
        "        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model, bias=False)\n",
        "        return self.proj(patchify(images, self.patch_size))\n")},
        loses=("patch_embedding_values",), message="proj.bias"),
    Variant("patch_embedding_on_raw_pixels", {EMBEDDING: embedding(
        "        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)\n",
        "        B = images.shape[0]\n        P = self.patch_size\n"
        "        return self.proj(images.reshape(B, -1, images.shape[1] * P * P))\n")},
        loses=("patch_embedding_values",), message="PatchEmbedding"),
    # ---- conv_weight_as_linear
    Variant("conv_weight_flattened_channel_last", {CONV: '''
def conv_weight_as_linear(weight):
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)
'''}, loses=("conv_equals_linear_patch_embedding",), message="channel first"),
    Variant("conv_weight_rows_and_columns_swapped", {CONV: '''
def conv_weight_as_linear(weight):
    return weight.transpose(2, 3).reshape(weight.shape[0], -1)
'''}, loses=("conv_equals_linear_patch_embedding",), message="patchify's order"),
    Variant("conv_weight_transposed", {CONV: '''
def conv_weight_as_linear(weight):
    return weight.reshape(weight.shape[0], -1).T
'''}, loses=("conv_equals_linear_patch_embedding",), message="must match"),
    # ---- add_cls_and_positions
    Variant("cls_appended_instead_of_prepended", {CLS: cls('''
    return torch.cat([patch_tokens, cls_token.expand(len(patch_tokens), -1, -1)], dim=1) + pos_embed
''')}, loses=("add_cls_and_positions_values",), message="prepend it"),
    Variant("positions_added_before_cls_is_concatenated", {CLS: cls('''
    tokens = patch_tokens + pos_embed[:, 1:]
    return torch.cat([cls_token.expand(len(patch_tokens), -1, -1), tokens], dim=1)
''')}, loses=("add_cls_and_positions_values",), message="then add the positions"),
    Variant("cls_position_skipped", {CLS: cls('''
    tokens = patch_tokens + pos_embed[:, :patch_tokens.shape[1]]
    return torch.cat([cls_token.expand(len(patch_tokens), -1, -1), tokens], dim=1)
''')}, loses=("add_cls_and_positions_values",), message="position 0"),
    # ---- VisionTransformer
    Variant("vit_pools_the_last_token", {VIT: replaced(VIT_BASE, ('hidden[:, 0] if self.pool == "cls"',
                                                                  'hidden[:, -1] if self.pool == "cls"'))},
            loses=("vision_transformer_pooling",), message="last slot"),
    Variant("vit_mean_pool_includes_cls", {VIT: replaced(VIT_BASE, ("hidden[:, 1:].mean(dim=1)", "hidden.mean(dim=1)"))},
            loses=("vision_transformer_pooling",), message="slots 1..N"),
    Variant("vit_without_final_norm", {VIT: replaced(VIT_BASE, ("        return self.norm(x)", "        return x"))},
            loses=("vision_transformer_features",), message="final LayerNorm"),
    Variant("vit_post_ln_layers", {VIT: replaced(VIT_BASE, ("norm_first=True", "norm_first=False"))},
            loses=("vision_transformer_structure", "vision_transformer_features"), message="pre-LN"),
    Variant("vit_appends_cls_itself", {VIT: replaced(VIT_BASE, (
        "x = add_cls_and_positions(self.patch_embed(images), self.cls_token, self.pos_embed)",
        "tokens = self.patch_embed(images)\n"
        "        x = torch.cat([tokens, self.cls_token.expand(len(tokens), -1, -1)], dim=1) + self.pos_embed"))},
            loses=("vision_transformer_features",), message="appended"),
    Variant("vit_uses_transformers_layers", {VIT: replaced(VIT_BASE, (
        "        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=True, eps=eps)\n"
        "                                    for _ in range(num_layers))",
        "        from transformers import ViTConfig\n"
        "        from transformers.models.vit.modeling_vit import ViTLayer\n"
        "        config = ViTConfig(hidden_size=d_model, num_attention_heads=num_heads, intermediate_size=d_ff)\n"
        "        self.layers = nn.ModuleList(ViTLayer(config) for _ in range(num_layers))"))},
            loses=("vision_transformer_features",), message="transformers"),
    # ---- load_hf_vit_weights
    Variant("load_conv_weight_channel_last", {LOAD: replaced(LOAD_BASE, (
        "conv_weight_as_linear(projection.weight)",
        "projection.weight.permute(0, 2, 3, 1).reshape(projection.weight.shape[0], -1)"))},
            loses=("load_hf_vit_parity_float32", "load_hf_vit_parity_float64"), message="conv weight's layout"),
    Variant("load_norms_swapped", {LOAD: replaced(LOAD_BASE, ("pair(ours.norm1, theirs.layernorm_before)",
                                                              "pair(ours.norm1, theirs.layernorm_after)"),
                                                  ("pair(ours.norm2, theirs.layernorm_after)",
                                                   "pair(ours.norm2, theirs.layernorm_before)"))},
            loses=("load_hf_vit_parity_float32", "load_hf_vit_any_size"), message="norm1 is layernorm_before"),
    Variant("load_forgets_the_final_norm", {LOAD: replaced(LOAD_BASE, ("        pair(model.norm, hf_vit.vit.layernorm)\n", ""))},
            loses=("load_hf_vit_parity_float32",), message="Copy every row"),
    Variant("load_without_strict_zip", {LOAD: replaced(LOAD_BASE, (", strict=True)", ")"))},
            loses=("load_hf_vit_any_size",), message="without an error"),
    Variant("load_rebinds_data_in_float32", {LOAD: replaced(LOAD_BASE, (
        "        model.cls_token.copy_(embeddings.cls_token)",
        "        model.cls_token.data = embeddings.cls_token.data.float()"))},
            loses=("load_hf_vit_parity_float64",), message="rebinding"),
    # ---- interpolate_positions
    Variant("interpolate_ignores_the_cls_slot", {INTERPOLATE: '''
def interpolate_positions(pos_embed, new_grid):
    rows, columns = new_grid
    sequence = pos_embed.transpose(1, 2)
    resized = F.interpolate(sequence, size=1 + rows * columns, mode="linear", align_corners=False)
    return resized.transpose(1, 2)
'''}, loses=("interpolate_positions_values", "interpolate_positions_keeps_cls"), message="Keep [CLS]'s slot apart"),
    Variant("interpolate_drops_the_cls_slot", {INTERPOLATE: replaced(INTERPOLATE_BASE, (
        "    return torch.cat([cls_slot, patches], dim=1)", "    return patches"))},
            loses=("interpolate_positions_values", "interpolate_positions_keeps_cls"), message="shape"),
    Variant("interpolate_bilinear", {INTERPOLATE: replaced(INTERPOLATE_BASE, ('mode="bicubic"', 'mode="bilinear"'))},
            loses=("interpolate_positions_values",), message="bicubically"),
    Variant("interpolate_rows_and_columns_swapped", {INTERPOLATE: replaced(INTERPOLATE_BASE, (
        "size=tuple(new_grid)", "size=tuple(new_grid)[::-1]"), (
        "patches = grid.permute(0, 2, 3, 1).reshape(1, -1, d)", "patches = grid.permute(0, 3, 2, 1).reshape(1, -1, d)"))},
            loses=("interpolate_positions_values",), message="row-major"),
    # ---- train_epoch
    Variant("train_epoch_forgets_zero_grad", {EPOCH: replaced(EPOCH_BASE, ("        optimizer.zero_grad()\n", ""))},
            loses=("train_epoch_steps",), message="zero_grad"),
    Variant("train_epoch_stays_in_eval_mode", {EPOCH: replaced(EPOCH_BASE, ("    model.train()\n", ""))},
            loses=("train_epoch_modes_and_schedule",), message="evaluation mode"),
    Variant("train_epoch_scheduler_before_the_step", {EPOCH: replaced(EPOCH_BASE, (
        "        optimizer.step()\n        if scheduler is not None:\n            scheduler.step()\n",
        "        if scheduler is not None:\n            scheduler.step()\n        optimizer.step()\n"))},
            loses=("train_epoch_modes_and_schedule",), message="not before"),
    Variant("train_epoch_ignores_the_generator", {EPOCH: replaced(EPOCH_BASE, (
        "torch.randperm(len(images), generator=generator)", "torch.randperm(len(images))"))},
            loses=("train_epoch_steps",), message="order"),
    Variant("train_epoch_drops_the_last_batch", {EPOCH: replaced(EPOCH_BASE, (
        "range(0, len(order), batch_size)", "range(0, len(order) - batch_size + 1, batch_size)"))},
            loses=("train_epoch_steps",), message="batches"),
    Variant("train_epoch_never_steps", {EPOCH: replaced(EPOCH_BASE, ("        optimizer.step()\n", ""))},
            loses=("train_epoch_steps", "train_epoch_learns", "vit_trained_accuracy"), message="the batch losses"),
    # ---- attention_rollout
    Variant("rollout_in_the_wrong_order", {ROLLOUT: replaced(ROLLOUT_BASE, ("rollout = mixed @ rollout",
                                                                            "rollout = rollout @ mixed"))},
            loses=("attention_rollout_values",), message="from the left"),
    Variant("rollout_without_the_residual", {ROLLOUT: replaced(ROLLOUT_BASE, (
        "(weights.mean(dim=1) + torch.eye(T, dtype=weights.dtype)) / 2", "weights.mean(dim=1)"))},
            loses=("attention_rollout_values",), message="add the identity"),
    Variant("rollout_max_over_heads", {ROLLOUT: replaced(ROLLOUT_BASE, ("weights.mean(dim=1)", "weights.amax(dim=1)"))},
            loses=("attention_rollout_values",), message="Average the heads"),
    Variant("rollout_rows_not_renormalised", {ROLLOUT: replaced(ROLLOUT_BASE, (
        "        mixed = mixed / mixed.sum(dim=-1, keepdim=True)\n", ""))},
            loses=("attention_rollout_unnormalised_rows",), message="divide each row by its sum"),
    # ---- the optional stretch
    Variant("mae_mask_left_in_shuffled_order", {MAE: replaced(MAE_BASE, (
        "    mask = torch.gather(mask, 1, ids_restore)\n", ""))},
            loses=("stretch_random_masking",), message="0 where kept"),
    Variant("mae_keeps_the_largest_noise", {MAE: replaced(MAE_BASE, ("torch.argsort(noise, dim=1)",
                                                                     "torch.argsort(noise, dim=1, descending=True)"))},
            loses=("stretch_random_masking",), message="smallest noise"),
    Variant("mae_loss_over_every_patch", {MAE: replaced(MAE_BASE, ("(per_patch * mask).sum() / mask.sum()",
                                                                   "per_patch.mean()"))},
            loses=("stretch_masked_patch_loss",), message="Only the hidden patches"),
]


ALTERNATIVES = [
    Variant("patchify_by_unfold", {PATCHIFY: patchify('''
    return F.unfold(images, kernel_size=P, stride=P).transpose(1, 2)
''')}),
    Variant("patchify_by_einsum", {PATCHIFY: patchify('''
    grid = images.reshape(B, C, H // P, P, W // P, P)
    return torch.einsum("bchpwq->bhwcpq", grid).reshape(B, (H // P) * (W // P), C * P * P)
''')}),
    Variant("patchify_by_loops", {PATCHIFY: patchify('''
    rows = []
    for i in range(H // P):
        for j in range(W // P):
            rows.append(images[:, :, i * P:(i + 1) * P, j * P:(j + 1) * P].reshape(B, -1))
    return torch.stack(rows, dim=1)
''')}),
    Variant("unpatchify_by_fold", {UNPATCHIFY: unpatchify('''
    return F.fold(patches.transpose(1, 2), output_size=(height, width), kernel_size=P, stride=P)
''')}),
    Variant("unpatchify_by_loops", {UNPATCHIFY: unpatchify('''
    images = patches.new_zeros(B, C, height, width)
    columns = width // P
    for n in range(N):
        i, j = divmod(n, columns)
        images[:, :, i * P:(i + 1) * P, j * P:(j + 1) * P] = patches[:, n].reshape(B, C, P, P)
    return images
''')}),
    Variant("patch_embedding_by_matmul", {EMBEDDING: embedding(
        "        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)\n",
        "        return patchify(images, self.patch_size) @ self.proj.weight.T + self.proj.bias\n")}),
    Variant("patch_embedding_by_unfold", {EMBEDDING: embedding(
        "        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)\n",
        "        patches = F.unfold(images, kernel_size=self.patch_size, stride=self.patch_size)\n"
        "        return self.proj(patches.transpose(1, 2))\n")}),
    Variant("conv_weight_flatten", {CONV: '''
def conv_weight_as_linear(weight):
    return weight.flatten(start_dim=1).clone()
'''}),
    Variant("conv_weight_view", {CONV: '''
def conv_weight_as_linear(weight):
    d_model, C, P, _ = weight.shape
    return weight.contiguous().view(d_model, C * P * P)
'''}),
    Variant("cls_by_repeat", {CLS: cls('''
    B = patch_tokens.shape[0]
    sequence = torch.cat((cls_token.repeat(B, 1, 1), patch_tokens), dim=1)
    return sequence + pos_embed.expand(B, -1, -1)
''')}),
    Variant("cls_by_slot_assignment", {CLS: cls('''
    B, N, d = patch_tokens.shape
    sequence = patch_tokens.new_empty(B, N + 1, d)
    sequence[:, 0] = cls_token[:, 0]
    sequence[:, 1:] = patch_tokens
    return sequence + pos_embed
''')}),
    Variant("vit_randn_init_and_sum_pooling", {VIT: replaced(VIT_BASE, (
        'hidden[:, 0] if self.pool == "cls" else hidden[:, 1:].mean(dim=1)',
        'hidden[:, 0] if self.pool == "cls" else hidden[:, 1:].sum(dim=1) / (hidden.shape[1] - 1)'))}),
    Variant("vit_embeddings_inline", {VIT: replaced(VIT_BASE, (
        "        x = add_cls_and_positions(self.patch_embed(images), self.cls_token, self.pos_embed)",
        "        tokens = self.patch_embed(images)\n"
        "        x = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], 1) + self.pos_embed"), (
        "        for layer in self.layers:\n            x = layer(x)\n",
        "        x = nn.Sequential(*self.layers)(x)\n"))}),
    Variant("load_by_a_table_of_names", {LOAD: '''
def load_hf_vit_weights(model, hf_vit):
    table = {"patch_embed.proj.bias": "vit.embeddings.patch_embeddings.projection.bias",
             "cls_token": "vit.embeddings.cls_token", "pos_embed": "vit.embeddings.position_embeddings",
             "norm.weight": "vit.layernorm.weight", "norm.bias": "vit.layernorm.bias",
             "head.weight": "classifier.weight", "head.bias": "classifier.bias"}
    inside = {"norm1": "layernorm_before", "norm2": "layernorm_after", "self_attn.q_proj": "attention.q_proj",
              "self_attn.k_proj": "attention.k_proj", "self_attn.v_proj": "attention.v_proj",
              "self_attn.out_proj": "attention.o_proj", "ffn.linear1": "mlp.fc1", "ffn.linear2": "mlp.fc2"}
    if len(model.layers) != len(hf_vit.vit.layers):
        raise ValueError("the models have different depths")
    for i in range(len(model.layers)):
        for ours, theirs in inside.items():
            for kind in ("weight", "bias"):
                table[f"layers.{i}.{ours}.{kind}"] = f"vit.layers.{i}.{theirs}.{kind}"
    source = dict(hf_vit.named_parameters())
    params = dict(model.named_parameters())
    with torch.no_grad():
        params["patch_embed.proj.weight"].copy_(
            conv_weight_as_linear(source["vit.embeddings.patch_embeddings.projection.weight"]))
        for ours, theirs in table.items():
            params[ours].copy_(source[theirs])
    return model
'''}),
    Variant("load_reshapes_the_conv_itself", {LOAD: replaced(LOAD_BASE, (
        "conv_weight_as_linear(projection.weight)", "projection.weight.flatten(1)"))}),
    Variant("interpolate_by_unflatten", {INTERPOLATE: '''
def interpolate_positions(pos_embed, new_grid):
    side = int(round((pos_embed.shape[1] - 1) ** 0.5))
    grid = pos_embed[0, 1:].T.unflatten(1, (side, side))[None]
    resized = F.interpolate(grid, size=(new_grid[0], new_grid[1]), mode="bicubic", align_corners=False)
    return torch.cat([pos_embed[:, :1], resized[0].flatten(1).T[None]], dim=1)
'''}),
    Variant("interpolate_with_a_shortcut_for_the_same_grid", {INTERPOLATE: replaced(INTERPOLATE_BASE, (
        "    grid = patches.reshape(1, g, g, d).permute(0, 3, 1, 2)\n",
        "    if tuple(new_grid) == (g, g):\n        return pos_embed.clone()\n"
        "    grid = patches.reshape(1, g, g, d).permute(0, 3, 1, 2)\n"))}),
    Variant("train_epoch_by_split", {EPOCH: '''
def train_epoch(model, optimizer, images, labels, batch_size, generator, scheduler=None):
    model.train()
    losses = []
    for batch in torch.randperm(len(images), generator=generator).split(batch_size):
        optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(images[batch]), labels[batch], reduction="sum") / len(batch)
        loss.backward()
        optimizer.step()
        if scheduler:
            scheduler.step()
        losses.append(float(loss))
    return losses
'''}),
    Variant("train_epoch_by_dataloader", {EPOCH: '''
def train_epoch(model, optimizer, images, labels, batch_size, generator, scheduler=None):
    from torch.utils.data import DataLoader, TensorDataset
    order = torch.randperm(len(images), generator=generator).tolist()
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch_size, sampler=order)
    model.train()
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses
'''}),
    Variant("rollout_by_multi_dot", {ROLLOUT: '''
def attention_rollout(attentions):
    T = attentions[0].shape[-1]
    mixed = []
    for weights in attentions:
        a = 0.5 * weights.mean(1) + 0.5 * torch.eye(T, dtype=weights.dtype)
        mixed.append(a / a.sum(-1, keepdim=True))
    result = mixed[0]
    for a in mixed[1:]:
        result = torch.einsum("bij,bjk->bik", a, result)
    return result
'''}),
    Variant("rollout_reversed_loop", {ROLLOUT: '''
def attention_rollout(attentions):
    T = attentions[0].shape[-1]
    result = None
    for weights in reversed(attentions):
        a = weights.sum(dim=1) / weights.shape[1] + torch.eye(T, dtype=weights.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else torch.bmm(result, a)
    return result
'''}),
    Variant("mae_by_indexing", {MAE: '''
def random_masking(tokens, noise, mask_ratio):
    B, N, d = tokens.shape
    keep = int(N * (1 - mask_ratio))
    order = noise.argsort(dim=1)
    rows = torch.arange(B)[:, None]
    kept = tokens[rows, order[:, :keep]]
    mask = torch.ones(B, N, dtype=tokens.dtype)
    mask[rows, order[:, :keep]] = 0
    ids_restore = torch.empty_like(order)
    ids_restore[rows, order] = torch.arange(N).expand(B, N)
    return kept, mask, ids_restore


def masked_patch_loss(predicted, target, mask):
    errors = F.mse_loss(predicted, target, reduction="none").mean(-1)
    return errors[mask.bool()].mean()
'''}),
]
