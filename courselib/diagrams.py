"""Architecture diagrams drawn by code: boxes, arrows and shapes, one function per picture.

    from courselib import diagrams
    diagrams.qkv_projections()        # 04: where Q, K and V come from
    diagrams.head_split()             # 05: (B, T, d_model) -> (B, h, T, d_head), with the numbers of 05's example
    diagrams.encoder_decoder()        # 06, 10: encoder, decoder and the cross-attention arrows
    diagrams.encoder_decoder_stack()  # 10: the memory read by every decoder layer's cross-attention
    diagrams.post_ln_vs_pre_ln()      # 07: the two places a LayerNorm can sit
    diagrams.decoder_only_block()     # 09: GPT's pre-LN causal block and the residual stream
    diagrams.kv_cache()               # 09: one generation step with a KV cache: its mask rows, keys and values

Every picture is made of `Box`es and arrows on one matplotlib axis (`draw`), so a new diagram is a
list of boxes and a list of arrows. Each function returns the axis it drew on.
"""
import dataclasses

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.path import Path

# One colour per kind of part, used by every diagram.
COLOURS = {
    "input": "#e8eef7", "embedding": "#dbe9d5", "attention": "#f9dcc4", "cross": "#f4c7c3",
    "ffn": "#d6e4f0", "norm": "#fff2b3", "add": "#ffffff", "output": "#e4d9f2", "tensor": "#f2f2f2",
    "projection": "#cfe8e3",
}


@dataclasses.dataclass
class Box:
    """A labelled rectangle centred at (x, y) on a 0..100 canvas."""
    name: str
    x: float
    y: float
    label: str
    kind: str = "tensor"
    width: float = 22.0
    height: float = 7.0

    def edge(self, toward):
        """The point on this box's border in the direction of the point `toward`."""
        dx, dy = toward[0] - self.x, toward[1] - self.y
        if dx == dy == 0:
            return self.x, self.y
        scale = min(self.width / 2 / abs(dx) if dx else float("inf"),
                    self.height / 2 / abs(dy) if dy else float("inf"))
        return self.x + dx * scale, self.y + dy * scale


def draw(boxes, arrows, title="", size=(7, 6), ax=None, limits=((0, 100), (0, 100)), notes=()):
    """Draw `boxes` and `arrows` ((from, to) or (from, to, label) or (from, to, label, style)).

    style: "solid" (data flow), "dashed" (a residual or skip connection), "cross" (cross-attention).
    `notes` are (x, y, text) annotations.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    by_name = {box.name: box for box in boxes}
    for box in boxes:
        ax.add_patch(FancyBboxPatch((box.x - box.width / 2, box.y - box.height / 2), box.width, box.height,
                                    boxstyle="round,pad=0.4,rounding_size=1.2", linewidth=1.2,
                                    edgecolor="#444444", facecolor=COLOURS.get(box.kind, COLOURS["tensor"])))
        ax.text(box.x, box.y, box.label, ha="center", va="center", fontsize=9)
    for arrow in arrows:
        start, end = by_name[arrow[0]], by_name[arrow[1]]
        label = arrow[2] if len(arrow) > 2 else ""
        style = arrow[3] if len(arrow) > 3 else "solid"
        colour = {"cross": "#c0392b", "dashed": "#7f8c8d"}.get(style, "#333333")
        if style == "dashed":  # a skip connection: out to the right of the column, up, and back in
            # clear every box of the column that the skip passes, not only its two ends
            low, high = sorted((start.y, end.y))
            passed = [box for box in boxes if low <= box.y <= high
                      and box.x - box.width / 2 <= start.x <= box.x + box.width / 2]
            side = max(box.x + box.width / 2 for box in passed + [start, end]) + 5
            corners = [(start.x + start.width / 2, start.y), (side, start.y), (side, end.y),
                       (end.x + end.width / 2 + 0.8, end.y)]
            patch = FancyArrowPatch(path=Path(corners, [Path.MOVETO] + [Path.LINETO] * 3), arrowstyle="-|>",
                                    mutation_scale=12, color=colour, linewidth=1.3, linestyle="--")
            text_at = (side + 1, (start.y + end.y) / 2)
        else:
            a, b = start.edge((end.x, end.y)), end.edge((start.x, start.y))
            patch = FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=colour, linewidth=1.3)
            text_at = ((a[0] + b[0]) / 2 + 1.5, (a[1] + b[1]) / 2)
        ax.add_patch(patch)
        if label:
            ax.text(*text_at, label, fontsize=8, color=colour, ha="left", va="center")
    for x, y, text in notes:
        ax.text(x, y, text, fontsize=8, ha="center", va="center", color="#555555", style="italic")
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    ax.set_aspect("auto")
    ax.axis("off")
    if title:
        ax.set_title(title)
    return ax


def qkv_projections(ax=None):
    """04: each token's vector x is projected three ways; Q·Kᵀ scores, softmax weighs V."""
    boxes = [
        Box("X", 50, 90, "X  (T, d_model)\none row per token", "input", 30),
        Box("Q", 18, 68, "Q = X W_Q\n(T, d_k)", "projection"), Box("K", 50, 68, "K = X W_K\n(T, d_k)", "projection"),
        Box("V", 82, 68, "V = X W_V\n(T, d_v)", "projection"),
        Box("S", 34, 44, "scores = Q Kᵀ / √d_k\n(T, T)", "attention", 30),
        Box("W", 34, 24, "weights = softmax(scores)\nrow-wise  (T, T)", "attention", 30),
        Box("A", 58, 6, "output = weights V\n(T, d_v)", "output", 26),
    ]
    arrows = [("X", "Q", "W_Q"), ("X", "K", "W_K"), ("X", "V", "W_V"), ("Q", "S", "query"),
              ("K", "S", "key"), ("S", "W"), ("W", "A"), ("V", "A", "value")]
    return draw(boxes, arrows, "Where Q, K and V come from", ax=ax)


def head_split(num_heads=2, d_head=3, T=4, ax=None):
    """05: x (B, T, d_model) as a grid, one row per token and d_model = h·d_head columns coloured by head;
    .view + .transpose(1, 2) give h grids (T, d_head), each holding *all* T tokens. Cells show 10·t + j,
    the token t and the feature j, as in the notebook's example."""
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4.6))
    colours = ["#f9dcc4", "#d6e4f0", "#dbe9d5", "#e4d9f2", "#fff2b3", "#f4c7c3"]
    d_model, cell, top = num_heads * d_head, 5.0, 78.0

    def grid(x0, columns, head_of_column, feature_of_column):
        for t in range(T):
            for c in range(columns):
                ax.add_patch(Rectangle((x0 + c * cell, top - (t + 1) * cell * 1.6), cell, cell * 1.6, linewidth=0.8,
                                       edgecolor="#444444", facecolor=colours[head_of_column(c) % len(colours)]))
                ax.text(x0 + (c + 0.5) * cell, top - (t + 0.5) * cell * 1.6, f"{10 * t + feature_of_column(c)}",
                        ha="center", va="center", fontsize=7)

    left = 8.0
    grid(left, d_model, lambda c: c // d_head, lambda c: c)
    for t in range(T):
        ax.text(left - 1, top - (t + 0.5) * cell * 1.6, f"token {t}", ha="right", va="center", fontsize=7)
    for h in range(num_heads):
        ax.text(left + (h + 0.5) * d_head * cell, top + 2.5, f"head {h}", ha="center", fontsize=7)
    ax.text(left + d_model * cell / 2, top + 9, "x: (B, T, d_model), one row per token", ha="center", fontsize=9)
    ax.text(left + d_model * cell / 2, top - T * cell * 1.6 - 6,
            f".view(B, T, h, d_head): h = {num_heads} blocks of\nd_head = {d_head} features per token",
            ha="center", va="top", fontsize=8)

    right = left + d_model * cell + 22
    gap = d_head * cell + 5
    for h in range(num_heads):
        grid(right + h * gap, d_head, lambda c, h=h: h, lambda c, h=h: h * d_head + c)
        ax.text(right + h * gap + d_head * cell / 2, top + 2.5, f"head {h}", ha="center", fontsize=7)
    ax.text(right + (num_heads * gap - 5) / 2, top + 9, "(B, h, T, d_head): each head holds all T tokens",
            ha="center", fontsize=9)
    ax.text(right + (num_heads * gap - 5) / 2, top - T * cell * 1.6 - 6,
            "each head attends on its own (T, d_head) slice,\nall heads in one batched matmul",
            ha="center", va="top", fontsize=8)
    middle = top - T * cell * 1.6 / 2
    ax.add_patch(FancyArrowPatch((left + d_model * cell + 2, middle + 3), (right - 2, middle + 3), arrowstyle="-|>",
                                 mutation_scale=14, color="#333333"))
    ax.text((left + d_model * cell + right) / 2, middle + 6, ".transpose(1, 2)", ha="center", fontsize=8)
    ax.add_patch(FancyArrowPatch((right - 2, middle - 3), (left + d_model * cell + 2, middle - 3), arrowstyle="-|>",
                                 mutation_scale=14, color="#7f8c8d"))
    ax.text((left + d_model * cell + right) / 2, middle - 7, "merge_heads:\n.transpose(1, 2)\n.reshape(B, T, d_model)",
            ha="center", va="top", fontsize=7, color="#555555")
    ax.set_xlim(0, right + num_heads * gap)
    ax.set_ylim(28, 92)
    ax.set_aspect("auto")
    ax.axis("off")
    ax.set_title("Splitting d_model into heads: view, then transpose")
    return ax


def encoder_decoder(ax=None):
    """06, 10: the encoder reads the source once; every decoder layer attends to its output."""
    boxes = [
        Box("src", 22, 6, "source tokens", "input"), Box("src_emb", 22, 20, "embedding\n+ positions", "embedding"),
        Box("enc_attn", 22, 38, "self-attention\n(padding mask)", "attention"),
        Box("enc_ffn", 22, 56, "feed-forward", "ffn"), Box("memory", 22, 76, "encoder output\n(B, S, d_model)", "output", 26),
        Box("tgt", 75, 6, "target tokens\n(shifted right)", "input"), Box("tgt_emb", 75, 20, "embedding\n+ positions", "embedding"),
        Box("dec_self", 75, 36, "masked self-attention\n(causal)", "attention", 28),
        Box("dec_cross", 75, 54, "cross-attention\nQ: decoder; K, V: encoder", "cross", 30),
        Box("dec_ffn", 75, 70, "feed-forward", "ffn"), Box("head", 75, 86, "linear + softmax\nnext target token", "output", 26),
    ]
    arrows = [("src", "src_emb"), ("src_emb", "enc_attn"), ("enc_attn", "enc_ffn"), ("enc_ffn", "memory"),
              ("tgt", "tgt_emb"), ("tgt_emb", "dec_self"), ("dec_self", "dec_cross"), ("dec_cross", "dec_ffn"),
              ("dec_ffn", "head"), ("memory", "dec_cross", "keys, values", "cross")]
    notes = [(22, 95, "encoder (× N layers)"), (75, 96, "decoder (× N layers)"),
             (48, 30, "residual + LayerNorm\naround every sublayer")]
    return draw(boxes, arrows, "Encoder–decoder: cross-attention joins the two stacks", ax=ax, size=(8, 7),
                notes=notes)


def encoder_decoder_stack(num_layers=2, ax=None):
    """10: N encoder layers, then one memory that every one of the N decoder layers reads (one cross-attention
    arrow per decoder layer), and the output head."""
    step = 62 / num_layers
    boxes = [Box("src", 22, 4, "source ids (B, S)", "input"), Box("src_emb", 22, 15, "embed + src_positions", "embedding", 26),
             Box("tgt", 75, 4, "[BOS] + target (shifted right)", "input", 30),
             Box("tgt_emb", 75, 15, "embed + tgt_positions", "embedding", 26)]
    arrows = [("src", "src_emb"), ("tgt", "tgt_emb")]
    below_enc, below_dec = "src_emb", "tgt_emb"
    for i in range(num_layers):
        y = 27 + i * step
        boxes += [Box(f"enc{i}", 22, y + step / 4, f"encoder layer {i + 1}\nself-attention, feed-forward", "attention", 28,
                      step / 2),
                  Box(f"self{i}", 75, y, f"decoder layer {i + 1}: masked self-attention", "attention", 38, step / 4),
                  Box(f"cross{i}", 75, y + step / 3, "cross-attention", "cross", 38, step / 4),
                  Box(f"ffn{i}", 75, y + 2 * step / 3, "feed-forward", "ffn", 38, step / 4)]
        arrows += [(below_enc, f"enc{i}"), (below_dec, f"self{i}"), (f"self{i}", f"cross{i}"), (f"cross{i}", f"ffn{i}")]
        below_enc, below_dec = f"enc{i}", f"ffn{i}"
    boxes += [Box("memory", 22, 94, "encoder_norm → memory (B, S, d)", "output", 34),
              Box("head", 75, 94, "decoder_norm → head → logits", "output", 34)]
    arrows += [(below_enc, "memory"), (below_dec, "head")]
    arrows += [("memory", f"cross{i}", "keys, values" if i == 0 else "", "cross") for i in range(num_layers)]
    notes = [(22, 100, "encoder: runs once per source"), (75, 100, "decoder: runs once per output token")]
    return draw(boxes, arrows, "", ax=ax, size=(9, 8), limits=((0, 100), (-2, 103)), notes=notes)


def _sublayer_column(x, pre_ln, prefix):
    if pre_ln:
        return [Box(f"{prefix}in", x, 6, "x", "input", 10), Box(f"{prefix}n1", x, 20, "LayerNorm", "norm"),
                Box(f"{prefix}attn", x, 34, "self-attention", "attention"), Box(f"{prefix}add1", x, 48, "+", "add", 6, 6),
                Box(f"{prefix}n2", x, 60, "LayerNorm", "norm"), Box(f"{prefix}ffn", x, 74, "feed-forward", "ffn"),
                Box(f"{prefix}add2", x, 88, "+", "add", 6, 6)]
    return [Box(f"{prefix}in", x, 6, "x", "input", 10), Box(f"{prefix}attn", x, 20, "self-attention", "attention"),
            Box(f"{prefix}add1", x, 34, "+", "add", 6, 6), Box(f"{prefix}n1", x, 46, "LayerNorm", "norm"),
            Box(f"{prefix}ffn", x, 60, "feed-forward", "ffn"), Box(f"{prefix}add2", x, 74, "+", "add", 6, 6),
            Box(f"{prefix}n2", x, 88, "LayerNorm", "norm")]


def post_ln_vs_pre_ln(ax=None):
    """07: post-LN normalises after each residual sum; pre-LN normalises only the sublayer's input,
    so the residual stream itself is never normalised inside the block."""
    post, pre = _sublayer_column(25, False, "post_"), _sublayer_column(75, True, "pre_")
    path = lambda column: [(a.name, b.name) for a, b in zip(column, column[1:])]  # noqa: E731
    arrows = path(post) + path(pre) + [
        ("post_in", "post_add1", "residual", "dashed"), ("post_n1", "post_add2", "residual", "dashed"),
        ("pre_in", "pre_add1", "residual", "dashed"), ("pre_add1", "pre_add2", "residual", "dashed")]
    notes = [(25, 97, "post-LN (2017 Transformer, BERT)"), (75, 97, "pre-LN (GPT-2 and most LLMs)")]
    return draw(post + pre, arrows, "", ax=ax, size=(9, 7), notes=notes, limits=((0, 100), (0, 100)))


def decoder_only_block(ax=None):
    """09: GPT's block: pre-LN, causal self-attention, feed-forward, on a residual stream."""
    boxes = [Box("tok", 40, 3, "token + position embeddings", "embedding", 36),
             Box("n1", 40, 16, "LayerNorm", "norm"), Box("attn", 40, 28, "causal self-attention", "attention", 32),
             Box("add1", 40, 40, "+", "add", 6, 6), Box("n2", 40, 52, "LayerNorm", "norm"),
             Box("ffn", 40, 64, "feed-forward (d → 4d → d)", "ffn", 32), Box("add2", 40, 76, "+", "add", 6, 6),
             Box("nf", 40, 88, "final LayerNorm", "norm"),
             Box("head", 40, 100, "LM head (tied to the embedding)", "output", 40)]
    arrows = [("tok", "n1"), ("n1", "attn"), ("attn", "add1"), ("add1", "n2"), ("n2", "ffn"), ("ffn", "add2"),
              ("add2", "nf"), ("nf", "head"), ("tok", "add1", "residual stream", "dashed"),
              ("add1", "add2", "", "dashed")]
    notes = [(12, 58, "× N blocks")]
    ax = draw(boxes, arrows, "A decoder-only (GPT) block", ax=ax, size=(6.5, 8.5), limits=((0, 100), (-4, 106)),
              notes=notes)
    ax.plot([22, 22], [10, 80], color="#999999", linewidth=1)  # the bracket of one block
    return ax


def kv_cache(past=5, new=2, ax=None):
    """09: one step with a KV cache. Left: the causal mask over all past + new positions, of which the step uses
    the last `new` rows. Right: the cached keys and values (B, h, T_past, d_head) and the new tokens' own, appended
    along the positions (dim=2); only the new tokens go through the model."""
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4.4))
    total, cell = past + new, 6.0
    top, left = 80.0, 6.0
    for row in range(total):                       # the full causal mask, query rows against key columns
        for col in range(total):
            visible, used = col <= row, row >= past
            face = ("#f9dcc4" if used else "#e8eef7") if visible else "#ffffff"
            ax.add_patch(Rectangle((left + col * cell, top - (row + 1) * cell), cell, cell, linewidth=0.6,
                                   edgecolor="#888888", facecolor=face))
    ax.add_patch(Rectangle((left, top - total * cell), total * cell, new * cell, linewidth=2.2, edgecolor="#c0392b",
                           facecolor="none"))
    ax.text(left + total * cell / 2, top + 4, f"causal mask over T_past + T_new = {total} positions",
            ha="center", fontsize=9)
    ax.text(left - 1, top - (past + new / 2) * cell, "new\nqueries", ha="right", va="center", fontsize=8,
            color="#c0392b")
    ax.text(left + total * cell / 2, top - total * cell - 4,
            f"this step uses rows {past}..{total - 1}: mask[T_past:], shape (T_new, T_past + T_new)",
            ha="center", va="top", fontsize=8, color="#c0392b")

    right = left + total * cell + 22
    for i, (name, y) in enumerate((("keys", top - 12), ("values", top - 34))):
        for col in range(total):
            cached = col < past
            ax.add_patch(Rectangle((right + col * cell, y - cell), cell, cell * 1.4, linewidth=0.8, edgecolor="#444444",
                                   facecolor="#dbe9d5" if cached else "#f9dcc4"))
        ax.text(right - 1, y - cell / 2 + 1, name, ha="right", va="center", fontsize=9)
        ax.text(right + past * cell / 2, y + cell * 0.4 + 2.5, "cached (B, h, T_past, d_head)" if i == 0 else "cached",
                ha="center", fontsize=8, color="#27ae60")
        ax.text(right + (past + new / 2) * cell, y + cell * 0.4 + 2.5, "new", ha="center", fontsize=8,
                color="#c0392b")
    ax.text(right + total * cell / 2, top - 52,
            "torch.cat([cached, new], dim=2): the cache grows by T_new positions per step.\n"
            "Only the new tokens pass through c_attn, the feed-forward network and the head;\n"
            "their queries attend to every key, cached or new, allowed by the mask rows.",
            ha="center", va="top", fontsize=8)
    ax.set_xlim(0, right + total * cell + 8)
    ax.set_ylim(top - total * cell - 14, top + 10)
    ax.set_aspect("auto")
    ax.axis("off")
    ax.set_title("A generation step with a KV cache")
    return ax
