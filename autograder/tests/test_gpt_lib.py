"""What notebook 09 added to courselib, proven against transformers and PyTorch: the fused-attention GPT
(courselib.fused_gpt), the Llama-style pieces (courselib.llama) and model with its cache (courselib.llama_model),
the training monitor (courselib.training.TrainingMonitor) and the KV-cache diagram (courselib.diagrams.kv_cache);
and that notebook 09's grading kernel cannot import the course's answers to its exercises."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from courselib import diagrams, fused_gpt, gpt, llama, llama_model  # noqa: E402


@pytest.fixture(autouse=True)
def quiet_transformers():
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.set_verbosity_error()


def random_gpt2(num_layers=2, seed=0, **sizes):
    from transformers import GPT2Config, GPT2LMHeadModel
    settings = dict(vocab_size=50, n_positions=20, n_embd=16, n_head=4, n_layer=num_layers, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    settings.update(sizes)
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(**settings, attn_implementation="eager")).double().eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return hf


# ------------------------------------------------------------------------------------------ fused_gpt
def test_fused_gpt_equals_gpt2_logits_and_greedy_generation():
    hf = random_gpt2()
    model = fused_gpt.load_gpt2_weights(fused_gpt.gpt_like(hf.config).double(), hf).eval()
    ids = torch.randint(0, 50, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(model.float()(ids), hf.float()(ids).logits, rtol=0, atol=1e-5)
    model.double(), hf.double()
    prompt = ids[:1, :4]
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                           pad_token_id=0)
    assert torch.equal(gpt.generate(model, prompt, 12), expected)
    assert torch.equal(gpt.generate(model, prompt, 12, use_cache=False), expected)


def test_c_attn_is_loaded_as_one_transposed_matrix():
    hf = random_gpt2(num_layers=1)
    model = fused_gpt.load_gpt2_weights(fused_gpt.gpt_like(hf.config).double(), hf)
    assert torch.equal(model.blocks[0].self_attn.c_attn.weight, hf.transformer.h[0].attn.c_attn.weight.T)
    assert model.lm_head.weight is model.token_embeddings.weight


def test_the_fused_cache_matches_the_full_pass_in_chunks():
    hf = random_gpt2(seed=1)
    model = fused_gpt.load_gpt2_weights(fused_gpt.gpt_like(hf.config).double(), hf).eval()
    ids = torch.randint(0, 50, (2, 13))
    cache = [None, None]
    with torch.no_grad():
        pieces = [fused_gpt.forward_with_cache(model, ids[:, a:b], cache) for a, b in [(0, 4), (4, 9), (9, 10), (10, 13)]]
        torch.testing.assert_close(torch.cat(pieces, dim=1), model(ids), rtol=0, atol=1e-12)
    assert cache[0][0].shape == (2, 4, 13, 4)


def test_the_fused_attention_is_gpt2_attention():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    torch.manual_seed(2)
    theirs = GPT2Attention(GPT2Config(n_embd=12, n_head=3, attn_implementation="eager")).double().eval()
    ours = fused_gpt.CausalSelfAttention(12, 3).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        ours.c_attn.weight.copy_(theirs.c_attn.weight.T)
        ours.c_attn.bias.copy_(theirs.c_attn.bias)
        ours.c_proj.weight.copy_(theirs.c_proj.weight.T)
        ours.c_proj.bias.copy_(theirs.c_proj.bias)
        x = torch.randn(2, 7, 12, dtype=torch.float64)
        mask = torch.full((7, 7), float("-inf"), dtype=torch.float64).triu(1)
        torch.testing.assert_close(ours(x), theirs(x, attention_mask=mask)[0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        fused_gpt.CausalSelfAttention(10, 3)


def test_gpt2_init_scales_the_residual_projections_like_transformers():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = fused_gpt.GPT(vocab_size=256, d_model=64, num_layers=8, num_heads=4, max_positions=32)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=8, n_head=4, n_positions=32))
    for block, theirs in zip(model.blocks, hf.transformer.h):
        for ours, their in ((block.self_attn.c_proj, theirs.attn.c_proj), (block.ffn.linear2, theirs.mlp.c_proj)):
            assert ours.weight.std().item() == pytest.approx(their.weight.std().item(), rel=0.1)
            assert ours.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
        assert block.ffn.linear1.weight.std().item() == pytest.approx(0.02, rel=0.1)
        assert torch.count_nonzero(block.self_attn.c_attn.bias) == 0


def test_untrained_logits_have_std_of_about_0_02_sqrt_d():
    torch.manual_seed(0)
    model = fused_gpt.GPT(vocab_size=1024, d_model=128, num_layers=4, num_heads=4, max_positions=64).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, 1024, (8, 64)))
    assert logits.std().item() == pytest.approx(0.02 * math.sqrt(128), rel=0.1)


# ------------------------------------------------------------------------------------------ llama
def random_llama(eps=1e-5, rope_base=10000.0, num_kv_heads=2, seed=0):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(llama.llama_config(40, 16, 2, 4, num_kv_heads, 40, 20, eps, rope_base)).double().eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return hf


@pytest.mark.parametrize("eps, rope_base, num_kv_heads", [(1e-5, 10000.0, 2), (0.1, 500.0, 1), (1e-6, 10000.0, 4)])
def test_llama_equals_transformers(eps, rope_base, num_kv_heads):
    hf = random_llama(eps, rope_base, num_kv_heads)
    model = llama.load_llama_weights(llama_model.llama_like(hf.config).double(), hf).eval()
    ids = torch.randint(0, 40, (2, 20))
    with torch.no_grad():
        plain = (model(ids) - hf(ids).logits).abs().max().item()
        torch.testing.assert_close(model(ids), llama.exact_float64(hf)(ids).logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(model.float()(ids), hf.float()(ids).logits, rtol=0, atol=1e-5)
    assert 1e-9 < plain < 1e-5, f"transformers' float32 islands should show in float64 ({plain:.1e})"


def test_apply_rope_is_transformers_rotary_embedding():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64), torch.randn(2, 1, 6, 8, generator=g,
                                                                                   dtype=torch.float64)
    inv_freq = 1.0 / 500.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.arange(6, dtype=torch.float64)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[None]
    theirs = apply_rotary_pos_emb(q, k, angles.cos(), angles.sin())
    for ours, their in zip(llama.apply_rope(q, k, base=500.0), theirs):
        torch.testing.assert_close(ours, their, rtol=0, atol=1e-14)


def test_grouped_query_attention_is_pytorchs():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 5, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    output, weights = llama.grouped_query_attention(q, k, v, mask)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6, 5, dtype=torch.float64))
    with pytest.raises(ValueError):
        llama.grouped_query_attention(q, k[:, :1].expand(2, 4, 5, 4), v, mask)


def test_rms_norm_and_swiglu_are_transformers():
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    torch.manual_seed(3)
    theirs_norm, ours_norm = LlamaRMSNorm(8, eps=0.1).double(), llama.RMSNorm(8, eps=0.1).double()
    with torch.no_grad():
        theirs_norm.weight.normal_()
        ours_norm.weight.copy_(theirs_norm.weight)
    x = torch.randn(3, 8, dtype=torch.float32)
    torch.testing.assert_close(ours_norm.float()(x), theirs_norm.float()(x), rtol=0, atol=1e-6)
    config = llama.llama_config(10, 8, 1, 2, 2, 12, 8)
    theirs_mlp, ours_mlp = LlamaMLP(config), llama.SwiGLUFeedForward(8, 12)
    ours_mlp.load_state_dict(theirs_mlp.state_dict())
    torch.testing.assert_close(ours_mlp(x), theirs_mlp(x), rtol=0, atol=1e-6)


def test_llama_like_refuses_what_it_does_not_implement():
    config = llama.llama_config(10, 8, 1, 2, 2, 12, 8)
    config.tie_word_embeddings = True
    with pytest.raises(ValueError):
        llama_model.llama_like(config)



def test_the_llama_cache_equals_the_full_pass_and_holds_the_key_value_heads():
    hf = random_llama(eps=1e-5, rope_base=500.0, num_kv_heads=2, seed=3)
    model = llama.load_llama_weights(llama_model.llama_like(hf.config).double(), hf).eval()
    ids = torch.randint(0, 40, (2, 15))
    cache = model.new_cache()
    with torch.no_grad():
        pieces = [model(ids[:, a:b], cache) for a, b in [(0, 4), (4, 5), (5, 9), (9, 10), (10, 15)]]
        torch.testing.assert_close(torch.cat(pieces, dim=1), llama.exact_float64(hf)(ids).logits, rtol=0, atol=1e-12)
    assert cache[0][0].shape == cache[1][1].shape == (2, 2, 15, 4)   # 2 key/value heads, not the 4 query heads


# ------------------------------------------------------------------------------------------ integrity
HIDDEN_FROM_09 = ("courselib.gpt", "courselib.fused_gpt", "courselib.llama_model")


def test_notebook_09_and_its_checks_never_import_the_course_answers():
    """The modules that answer 09's exercises (autograder.checks.gpt.HIDDEN_MODULES, hidden from 09's sandbox) are
    imported neither by 09's cells nor by its hidden checks, nor by what those import."""
    import ast
    import subprocess
    import sys

    import nbformat

    from autograder.checks.gpt import HIDDEN_MODULES
    from autograder.submissions import solution_path

    assert set(HIDDEN_MODULES) == set(HIDDEN_FROM_09)
    for cell in nbformat.read(solution_path("09_gpt"), as_version=4).cells:
        if cell.cell_type == "code":
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.ImportFrom):
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                assert not any(name == m or name.startswith(m + ".") for name in names for m in HIDDEN_FROM_09), (
                    cell.get("id"), names)
    probe = ("import sys, courselib.stories, courselib.llama, courselib.seam, courselib.blocks, courselib.training, "
             "courselib.diagrams, courselib.plotting, courselib.testing, autograder.checks.gpt; "
             f"print(sorted(m for m in sys.modules if m in {HIDDEN_FROM_09!r}))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_courselib_gpt_keeps_the_names_later_notebooks_import():
    """11 (and its checks and library) import these from courselib.gpt; the corpus moved to courselib.stories."""
    from courselib import stories
    for name in ("EOS", "MODEL_DIR", "corpus", "token_stream", "windows", "held_out_windows", "train_tokenizer"):
        assert getattr(gpt, name) is getattr(stories, name), name
    for name in ("GPT", "lm_loss", "perplexity", "generate", "sample_next", "top_k_filter", "top_p_filter",
                 "load_tiny_gpt", "load_gpt2_weights", "to_gpt2", "kv_cache_bytes", "pretrain"):
        assert callable(getattr(gpt, name)), name

# ------------------------------------------------------------------------------------------ training, diagram
@pytest.mark.parametrize("grading", [False, True])
def test_training_monitor_counts_steps_and_keeps_both_curves(monkeypatch, grading):
    from courselib.training import TrainingMonitor
    if grading:
        monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")     # silent bar, one drawing at close()
    else:
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monitor = TrainingMonitor(6, tokens_per_step=128, title="test")
    assert monitor.bar.disable == grading
    for step in range(1, 7):
        monitor.update(step, 1.0 / step)
        if step % 3 == 0:
            monitor.held_out(step, 2.0 / step)
    if not grading:
        assert monitor.bar.n == 6 and "loss=0.167" in str(monitor.bar) and "tokens_per_s=" in str(monitor.bar)
    figure = monitor.close()
    assert monitor.steps == list(range(1, 7))
    assert list(monitor.held_out_line.get_xdata()) == [3, 6]
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["training loss", "held-out loss"]
    plt.close(figure)


def test_kv_cache_diagram_draws_its_parts():
    ax = diagrams.kv_cache(past=5, new=2)
    try:
        text = " ".join(t.get_text() for t in ax.texts) + " " + ax.get_title()
        for words in ("causal mask over T_past + T_new = 7", "mask[T_past:]", "keys", "values", "cached", "new",
                      "torch.cat", "dim=2"):
            assert words in text, f"the KV-cache diagram should show {words!r}: {text}"
        assert len(ax.patches) >= 7 * 7 + 2 * 7
    finally:
        plt.close(ax.figure)
