"""Pictures used by several notebooks."""
import matplotlib.pyplot as plt
import numpy as np


def _as_numpy(matrix):
    if hasattr(matrix, "detach"):  # a torch tensor
        matrix = matrix.detach().cpu().numpy()
    return np.asarray(matrix, dtype=float)


def plot_attention(weights, query_labels=None, key_labels=None, title="Attention weights",
                   ax=None, annotate=None, cmap="viridis"):
    """Heatmap of a (T_q, T_k) attention matrix: row i shows where query i looks.

    `annotate` writes each weight in its cell; by default only for matrices up to 8x8.
    """
    weights = _as_numpy(weights)
    if weights.ndim != 2:
        raise ValueError(f"plot_attention needs a 2-D (T_q, T_k) matrix, got shape {weights.shape}")
    if ax is None:
        size = min(8.0, 1.0 + 0.6 * max(weights.shape))
        _, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=max(1.0, float(weights.max())))
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    num_queries, num_keys = weights.shape
    ax.set_xticks(range(num_keys), key_labels if key_labels is not None else range(num_keys),
                  rotation=45 if key_labels is not None else 0)
    ax.set_yticks(range(num_queries), query_labels if query_labels is not None else range(num_queries))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if annotate is None:
        annotate = max(weights.shape) <= 8
    if annotate:
        for i in range(num_queries):
            for j in range(num_keys):
                value = weights[i, j]
                ax.text(j, i, f"{value:.2f}", ha="center", va="center",
                        color="black" if value > 0.6 else "white", fontsize=9)
    return ax


def plot_lines(xs, series, xlabel, ylabel, title, logy=False, ax=None):
    """Line plot of several named series that share the x values."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for label, ys in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax
