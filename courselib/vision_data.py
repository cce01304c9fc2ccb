"""Images for notebook 12 (a Vision Transformer): the UCI handwritten digits, the baselines a ViT is compared
with, and the pictures of what a ViT looks at.

    images, labels = load_digits()                 # (1797, 1, 8, 8) float32 in [0, 1], (1797,) int64
    (train_x, train_y), (test_x, test_y) = digits_split()
    show_images(test_x[:8], test_y[:8])

Nothing here is an exercise of notebook 12: patchify, the ViT and its training loop are the learner's.
The data ship in courselib/data/digits/ (README.md there: source, licence, checksum); tools/build_digits.py
rebuilds them.
"""
import hashlib
import math
import pathlib

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data" / "digits"
DIGITS_SHA256 = "aa64e930663d6e9271e1566601d65e70236553f73ec6cb041a4ab37167cf1d04"
NUM_HELD_OUT = 360   # a fifth of the 1,797 images, never trained on
SPLIT_SEED = 0


def load_digits(verify=True):
    """All 1,797 digits: images (1797, 1, 8, 8) float32, pixels 0..16 scaled to [0, 1], and labels (1797,) int64."""
    path = DATA_DIR / "digits.npz"
    if verify and hashlib.sha256(path.read_bytes()).hexdigest() != DIGITS_SHA256:
        raise RuntimeError(f"{path} is not the file the course ships (its sha256 differs): "
                           "python tools/build_digits.py rebuilds it")
    with np.load(path) as data:
        images = torch.tensor(data["images"], dtype=torch.float32)[:, None] / 16.0
        labels = torch.tensor(data["labels"], dtype=torch.long)
    return images, labels


def digits_split():
    """((train_images, train_labels), (held_out_images, held_out_labels)): 1,437 and 360 digits, the same
    split every time (a fixed random permutation)."""
    images, labels = load_digits()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, held_out = order[:-NUM_HELD_OUT], order[-NUM_HELD_OUT:]
    return (images[train], labels[train]), (images[held_out], labels[held_out])


# ---------------------------------------------------------------------------------------------- baselines
class SmallCNN(nn.Module):
    """Two 3x3 convolutions (16 and 32 channels, ReLU), a 2x2 max-pool and a linear classifier: 9,930
    parameters for 8x8 grey images. Its inductive bias: local filters, shared across positions."""

    def __init__(self, num_classes=10, channels=(16, 32)):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(c2 * 4 * 4, num_classes)

    def forward(self, images):                       # (B, 1, 8, 8)
        return self.classifier(self.features(images).flatten(1))   # (B, num_classes)


class MLP(nn.Module):
    """The 64 pixels, one hidden layer of 128 ReLUs, 10 scores: no idea that pixels have neighbours."""

    def __init__(self, num_pixels=64, hidden=128, num_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(num_pixels, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, images):
        return self.net(images)


def warmup_cosine(optimizer, total_steps, warmup_steps=20):
    """A LambdaLR: linear warm-up over `warmup_steps`, then a cosine from the peak down to 0 at `total_steps`."""
    def factor(step):
        return min(1.0, (step + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(step, total_steps) / total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------- positions
def sincos_2d_positions(grid_height, grid_width, d_model, temperature=10000.0):
    """Fixed 2-D sin-cos position embeddings (MAE's), (grid_height * grid_width, d_model), rows in row-major patch
    order: a quarter of the features are sin(row · ω), a quarter cos(row · ω), then sin and cos of the column,
    with ω = temperature^(-k / (d_model / 4)), k = 0 .. d_model/4 - 1. Equal to transformers'
    `build_2d_sinusoidal_position_embedding` (autograder/tests/test_vision_lib.py)."""
    if d_model % 4:
        raise ValueError(f"d_model={d_model} must be divisible by 4 (sin and cos of the row and of the column)")
    quarter = d_model // 4
    omega = temperature ** -(torch.arange(quarter, dtype=torch.float64) / quarter)        # (d/4,)
    rows, columns = torch.meshgrid(torch.arange(grid_height, dtype=torch.float64),
                                   torch.arange(grid_width, dtype=torch.float64), indexing="ij")
    row_angles, column_angles = rows.reshape(-1, 1) * omega, columns.reshape(-1, 1) * omega   # (N, d/4) each
    table = torch.cat([row_angles.sin(), row_angles.cos(), column_angles.sin(), column_angles.cos()], dim=1)
    return table.float()


# ---------------------------------------------------------------------------------------------- pictures
def _image(image):
    image = image.detach().cpu() if torch.is_tensor(image) else torch.as_tensor(image)
    return image.squeeze(0).numpy() if image.dim() == 3 else image.numpy()


def show_images(images, labels=None, predictions=None, columns=8, size=1.1, title=None):
    """A grid of grey images (B, 1, H, W) with their labels (and predictions: red when wrong)."""
    count = len(images)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(columns * size, rows * size * 1.15), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= count:
            continue
        ax.imshow(_image(images[i]), cmap="gray_r", vmin=0, vmax=1)
        caption = "" if labels is None else f"{int(labels[i])}"
        if predictions is not None:
            caption += f" → {int(predictions[i])}"
            wrong = labels is not None and int(predictions[i]) != int(labels[i])
            ax.set_title(caption, fontsize=9, color="tab:red" if wrong else "black")
        elif caption:
            ax.set_title(caption, fontsize=9)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def show_patches(image, patch_size):
    """One image with its patch grid drawn on it and the patches numbered in row-major order."""
    pixels = _image(image)
    height, width = pixels.shape
    figure, ax = plt.subplots(figsize=(3.2, 3.2))
    ax.imshow(pixels, cmap="gray_r", vmin=0, vmax=1)
    for line in range(0, height + 1, patch_size):
        ax.axhline(line - 0.5, color="tab:orange", linewidth=1.5)
    for line in range(0, width + 1, patch_size):
        ax.axvline(line - 0.5, color="tab:orange", linewidth=1.5)
    for n in range((height // patch_size) * (width // patch_size)):
        row, column = divmod(n, width // patch_size)
        ax.text(column * patch_size - 0.3, row * patch_size - 0.2, str(n), color="tab:blue", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{patch_size}x{patch_size} patches, numbered row by row")
    return figure


def overlay_attention(image, weights, ax=None, title=None):
    """A (grid_h, grid_w) map of attention weights over an image's patches (each patch's weight fills its patch,
    bright is much), with the outline of the image's ink drawn on top."""
    pixels = _image(image)
    weights = weights.detach().cpu().double() if torch.is_tensor(weights) else torch.as_tensor(weights).double()
    height, width = pixels.shape
    upsampled = F.interpolate(weights[None, None], size=(height, width), mode="nearest")[0, 0].numpy()
    if ax is None:
        _, ax = plt.subplots(figsize=(2.4, 2.4))
    ax.imshow(upsampled, cmap="magma", vmin=0, vmax=max(float(upsampled.max()), 1e-9))   # bright: much attention
    ax.contour(pixels, levels=[0.35], colors="cyan", linewidths=1.5)                   # the digit's outline on top
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def position_similarity(patch_positions):
    """(N, N) cosine similarities between the N patch position embeddings (N, d)."""
    normed = F.normalize(patch_positions.detach().double(), dim=-1)
    return normed @ normed.T


def plot_position_similarity(patch_positions, grid, title="Cosine similarity of position embeddings"):
    """The ViT paper's picture: for each patch position (one small map per position, laid out as the grid), its
    position embedding's cosine similarity with every other position's."""
    grid_h, grid_w = grid
    similarity = position_similarity(patch_positions).reshape(grid_h, grid_w, grid_h, grid_w).numpy()
    figure, axes = plt.subplots(grid_h, grid_w, figsize=(grid_w * 1.1, grid_h * 1.1), squeeze=False)
    for row in range(grid_h):
        for column in range(grid_w):
            image = axes[row, column].imshow(similarity[row, column], cmap="viridis", vmin=-1, vmax=1)
            axes[row, column].set_xticks([])
            axes[row, column].set_yticks([])
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.suptitle(title)
    return figure


def row_column_contrast(patch_positions, grid):
    """Mean cosine similarity of position pairs that share a row or a column, minus that of pairs that share
    neither: positive when the embeddings have learned the grid's rows and columns."""
    grid_h, grid_w = grid
    similarity = position_similarity(patch_positions)
    rows = torch.arange(grid_h * grid_w) // grid_w
    columns = torch.arange(grid_h * grid_w) % grid_w
    same_line = (rows[:, None] == rows[None, :]) | (columns[:, None] == columns[None, :])
    different = ~torch.eye(len(rows), dtype=torch.bool)
    return float(similarity[same_line & different].mean() - similarity[~same_line].mean())


__all__ = ["MLP", "SmallCNN", "digits_split", "load_digits", "overlay_attention", "plot_position_similarity",
           "position_similarity", "row_column_contrast", "show_images", "show_patches", "sincos_2d_positions",
           "warmup_cosine"]
