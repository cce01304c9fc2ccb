"""The architecture diagrams draw what their captions promise (courselib/diagrams.py)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from courselib import diagrams  # noqa: E402

# diagram -> words its picture must show
PROMISES = {
    "qkv_projections": ["X W_Q", "X W_K", "X W_V", "√d_k", "softmax"],
    "head_split": ["head 0", "d_head", ".transpose(1, 2)", "(B, h, T, d_head)"],
    "encoder_decoder": ["cross-attention", "encoder output", "shifted right", "keys, values", "causal"],
    "encoder_decoder_stack": ["decoder layer 2: masked self-attention", "cross-attention", "memory (B, S, d)",
                              "keys, values", "shifted right", "runs once per source"],
    "post_ln_vs_pre_ln": ["post-LN", "pre-LN", "LayerNorm", "residual"],
    "decoder_only_block": ["causal self-attention", "tied", "residual stream", "final LayerNorm"],
}


@pytest.mark.parametrize("name", sorted(PROMISES))
def test_diagram_draws_its_parts(name):
    ax = getattr(diagrams, name)()
    try:
        text = " ".join(t.get_text() for t in ax.texts) + " " + ax.get_title()
        missing = [word for word in PROMISES[name] if word not in text]
        assert not missing, f"{name} should show {missing}; it shows: {text}"
        assert len(ax.patches) >= 5, f"{name} drew only {len(ax.patches)} shapes"
    finally:
        plt.close(ax.figure)


def test_an_arrow_names_boxes_that_exist():
    boxes = [diagrams.Box("a", 10, 10, "a"), diagrams.Box("b", 50, 50, "b")]
    with pytest.raises(KeyError):
        diagrams.draw(boxes, [("a", "missing")])
    plt.close("all")
