"""courselib.vision_data and what notebook 12's checks rest on: the shipped digits are what tools/build_digits.py
makes, the split and the baselines are as the notebook says, the oracles the judges use equal what they stand for,
and the ranking the notebook states (a small CNN beats the ViT at this size) holds over seeds."""
import hashlib
import math
import statistics

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import vision as checks
from autograder.checks.common import Seeds
from courselib import vision_data

pytestmark = pytest.mark.xdist_group("vision-lib")


def test_the_shipped_digits_are_what_the_tool_builds():
    import importlib.util
    spec = importlib.util.spec_from_file_location("build_digits", vision_data.DATA_DIR.parents[2] / "tools" / "build_digits.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    committed = (vision_data.DATA_DIR / "digits.npz").read_bytes()
    assert hashlib.sha256(committed).hexdigest() == vision_data.DIGITS_SHA256
    assert vision_data.DIGITS_SHA256 in (vision_data.DATA_DIR / "README.md").read_text()
    images, labels = vision_data.load_digits()
    rebuilt = tool.npz_bytes((images[:, 0] * 16).round().to(torch.uint8).numpy(), labels.to(torch.uint8).numpy())
    assert rebuilt == committed, "tools/build_digits.py no longer writes the committed file byte for byte"
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.float32 and 0 <= images.min() < images.max() == 1
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    data = bytearray((vision_data.DATA_DIR / "digits.npz").read_bytes())
    data[100] ^= 1
    (tmp_path / "digits.npz").write_bytes(bytes(data))
    monkeypatch.setattr(vision_data, "DATA_DIR", tmp_path)
    with pytest.raises(RuntimeError, match="sha256"):
        vision_data.load_digits()


def test_the_split_is_fixed_and_disjoint():
    (train_x, train_y), (test_x, test_y) = vision_data.digits_split()
    assert len(train_y) == 1437 and len(test_y) == 360
    (again_x, _), _ = vision_data.digits_split()
    assert torch.equal(train_x, again_x)
    images, _ = vision_data.load_digits()
    rows = {tuple(x.flatten().tolist()) for x in train_x}
    assert sum(tuple(x.flatten().tolist()) in rows for x in test_x) < 5   # a few digits are drawn identically
    assert len(images) == len(train_x) + len(test_x)


def test_the_baselines_have_the_sizes_the_notebook_quotes():
    assert sum(p.numel() for p in vision_data.SmallCNN().parameters()) == 9_930
    assert vision_data.SmallCNN()(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert vision_data.MLP()(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    vit = checks.ReferenceVisionTransformer(8, 2, 1, 10, 32, 2, 4, 64)
    assert sum(p.numel() for p in vit.parameters()) == 18_218


def test_sincos_positions_equal_transformers():
    from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding
    for rows, columns, d in [(4, 4, 32), (3, 5, 8), (6, 2, 12)]:
        assert torch.allclose(vision_data.sincos_2d_positions(rows, columns, d),
                              build_2d_sinusoidal_position_embedding(rows, columns, d), atol=1e-7)
    with pytest.raises(ValueError):
        vision_data.sincos_2d_positions(4, 4, 30)


def test_row_column_contrast_sees_a_grid():
    assert vision_data.row_column_contrast(vision_data.sincos_2d_positions(4, 4, 32), (4, 4)) > 0.05
    noise = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    assert abs(vision_data.row_column_contrast(noise, (4, 4))) < 0.1


def test_the_judges_vit_oracle_equals_the_reference_model():
    """hf_vit_from maps the notebook's names onto ViTForImageClassification: with the same weights the course's
    reference VisionTransformer and transformers' agree to float64 rounding (so the oracle is the model the
    notebook describes), features and logits, for both poolings' inputs."""
    for stream, dims in checks.FEATURE_CASES:
        weights, images = checks.vit_case(Seeds("test"), stream, dims)
        ours = checks.ReferenceVisionTransformer(*dims.values()).double().eval()
        ours.load_state_dict(weights)
        hf = checks.hf_vit_from(weights, dims)
        with torch.no_grad():
            assert torch.allclose(ours.features(images), hf.vit(images).last_hidden_state, rtol=0, atol=1e-12)
            assert torch.allclose(ours(images), hf(images).logits, rtol=0, atol=1e-12)


def test_the_interpolation_oracle_is_bicubic_with_cls_apart():
    from autograder.judges.vision import oracle_interpolation
    table = torch.randn(1, 17, 6, dtype=torch.float64)
    grid = table[:, 1:].reshape(1, 4, 4, 6).permute(0, 3, 1, 2)
    resized = F.interpolate(grid, size=(5, 3), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, 15, 6)
    assert torch.allclose(oracle_interpolation(table, (5, 3)), torch.cat([table[:, :1], resized], 1), atol=1e-12)


def train(model, seed, epochs=60, peak_lr=3e-3, batch=64):
    """The notebook's run: AdamW (weight decay 0.05), warm-up and cosine, shuffled passes from a seeded generator."""
    (train_x, train_y), (test_x, test_y) = vision_data.digits_split()
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.05)
    scheduler = vision_data.warmup_cosine(optimizer, epochs * math.ceil(len(train_y) / batch))
    order = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for indices in torch.randperm(len(train_y), generator=order).split(batch):
            loss = F.cross_entropy(model(train_x[indices]), train_y[indices])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
    model.eval()
    with torch.no_grad():
        return (model(test_x).argmax(-1) == test_y).float().mean().item()


def vit(seed):
    torch.manual_seed(seed)
    model = checks.ReferenceVisionTransformer(8, 2, 1, 10, 32, 2, 4, 64)
    torch.nn.init.trunc_normal_(model.cls_token, std=0.02)
    torch.nn.init.trunc_normal_(model.pos_embed, std=0.02)
    return model


def test_the_cnn_beats_the_vit_over_seeds_and_the_vit_reaches_95_percent():
    """Notebook 12 says: at its settings the ViT reads about 97% of the held-out digits (95% or more in the runs it
    quotes), the small CNN beats it, and the learned positions do not reliably find the grid's rows and columns
    (some seeds fall far short of sin-cos's contrast). Seeds 0-2 (about 100 CPU seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vits, cnns, contrasts = [], [], []
        for seed in range(3):
            model = vit(seed)
            vits.append(train(model, seed))
            contrasts.append(vision_data.row_column_contrast(model.pos_embed[0, 1:].detach(), (4, 4)))
            torch.manual_seed(seed)
            cnns.append(train(vision_data.SmallCNN(), seed))
    finally:
        torch.set_num_threads(threads)
    sincos = vision_data.row_column_contrast(vision_data.sincos_2d_positions(4, 4, 32), (4, 4))
    print(f"ViT {vits}, CNN {cnns}, position contrasts {contrasts} (sin-cos {sincos:.3f})")
    assert statistics.mean(vits) >= 0.95 and min(vits) >= 0.94, f"the ViT's held-out accuracies over seeds 0-2: {vits}"
    assert statistics.mean(cnns) > statistics.mean(vits), f"the CNN ({cnns}) no longer beats the ViT ({vits}) on average"
    assert max(contrasts) < sincos + 0.02 and min(contrasts) < sincos / 2, (
        f"the learned positions' row-and-column contrasts {contrasts} against sin-cos's {sincos:.3f}: the notebook says "
        "they do not reliably reach it")
