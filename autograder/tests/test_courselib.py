"""courselib's reference blocks (courselib/blocks.py) and MiniBert (courselib/bert.py) are drop-in equivalents
of what learners write in 02, 03 and 07, proven against PyTorch and transformers' BertModel, and interchangeable
with the references 07's hidden tests use."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from courselib import blocks
from courselib.attention import padding_mask

torch.set_num_threads(1)


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def randomize(module, seed):
    """Random weights everywhere, LayerNorm gains and shifts included, so that no parameter is idle."""
    g = seeded(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=g, dtype=param.dtype) / math.sqrt(param.shape[-1]))
    return module


# ---------------------------------------------------------------- 02: TokenEmbedding
@pytest.mark.parametrize("scale", [True, False])
def test_token_embedding_is_a_scaled_lookup(scale):
    module = blocks.TokenEmbedding(11, 6, scale=scale)
    ids = torch.randint(0, 11, (3, 5), generator=seeded(0))
    expected = F.embedding(ids, module.embedding.weight) * (math.sqrt(6) if scale else 1.0)
    torch.testing.assert_close(module(ids), expected, rtol=0, atol=0)
    assert [name for name, _ in module.named_parameters()] == ["embedding.weight"]
    assert module.weight is module.embedding.weight


def test_token_embedding_padding_row_is_zero_and_frozen():
    module = blocks.TokenEmbedding(9, 4, padding_idx=0)
    assert torch.equal(module.embedding.weight[0], torch.zeros(4))
    ids = torch.tensor([[0, 3, 0, 5]])
    module(ids).sum().backward()
    assert torch.equal(module.embedding.weight.grad[0], torch.zeros(4))
    assert module.embedding.weight.grad[3].abs().sum() > 0


# ---------------------------------------------------------------- 03: LearnedPositionalEmbedding
def test_learned_positions_are_rows_of_the_table():
    module = blocks.LearnedPositionalEmbedding(10, 4)
    ids = torch.zeros(3, 7, dtype=torch.long)
    table = module.table.weight
    torch.testing.assert_close(module(7), table[:7], rtol=0, atol=0)
    torch.testing.assert_close(module(ids), table[:7].expand(3, 7, 4), rtol=0, atol=0)
    torch.testing.assert_close(module(ids[:, :2], start=5), table[5:7].expand(3, 2, 4), rtol=0, atol=0)
    assert [name for name, _ in module.named_parameters()] == ["table.weight"]


@pytest.mark.parametrize("length, start", [(11, 0), (3, 8), (1, 10)])
def test_learned_positions_refuse_positions_past_the_table(length, start):
    with pytest.raises(ValueError, match="max_positions=10"):
        blocks.LearnedPositionalEmbedding(10, 4)(length, start=start)


# ---------------------------------------------------------------- 07: FeedForward, LayerNorm
@pytest.mark.parametrize("approximate, hf_name", [("none", "gelu"), ("tanh", "gelu_new")])
def test_feed_forward_matches_transformers_activations(approximate, hf_name):
    from transformers.activations import ACT2FN
    ffn = randomize(blocks.FeedForward(8, 20, approximate=approximate).double(), 1)
    x = 3 * torch.randn(2, 5, 8, generator=seeded(2), dtype=torch.float64)
    expected = ffn.linear2(ACT2FN[hf_name](ffn.linear1(x)))
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-12)
    assert sorted(name for name, _ in ffn.named_parameters()) == [
        "linear1.bias", "linear1.weight", "linear2.bias", "linear2.weight"]


@pytest.mark.parametrize("eps", [1e-12, 1e-5, 0.5])
def test_layer_norm_matches_torch(eps):
    ours, theirs = blocks.LayerNorm(16, eps=eps).double(), nn.LayerNorm(16, eps=eps).double()
    randomize(theirs, 3)
    ours.load_state_dict(theirs.state_dict())
    x = (2 + 4 * torch.randn(3, 5, 16, generator=seeded(4), dtype=torch.float64)).requires_grad_()
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)
    ours(x).pow(3).sum().backward()
    theirs(x).pow(3).sum().backward()
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(ours, name).grad, getattr(theirs, name).grad, rtol=1e-10, atol=1e-10)


def test_layer_norm_of_a_constant_row_is_finite():
    assert torch.equal(blocks.LayerNorm(4)(torch.full((2, 4), 7.0)), torch.zeros(2, 4))


# ---------------------------------------------------------------- 07: EncoderLayer
def torch_layer_holding(ours, d_model, num_heads, d_ff, norm_first, eps):
    """nn.TransformerEncoderLayer with our layer's weights (its in_proj stacks W_Q, W_K, W_V)."""
    theirs = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu", batch_first=True,
                                        norm_first=norm_first, layer_norm_eps=eps).double()
    attn = ours.self_attn
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        for their_name, module in [("self_attn.out_proj", attn.out_proj), ("linear1", ours.ffn.linear1),
                                   ("linear2", ours.ffn.linear2), ("norm1", ours.norm1), ("norm2", ours.norm2)]:
            theirs.get_submodule(their_name).load_state_dict(module.state_dict())
    return theirs.train()  # dropout 0: the plain (not fused) path


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("eps", [1e-12, 1e-5])
def test_encoder_layer_matches_torch(norm_first, eps):
    ours = randomize(blocks.EncoderLayer(12, 3, 20, norm_first=norm_first, eps=eps).double(), 5).eval()
    theirs = torch_layer_holding(ours, 12, 3, 20, norm_first, eps)
    x = torch.randn(2, 7, 12, generator=seeded(6), dtype=torch.float64)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[0, 5:] = False
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-10)
        masked = ours(x, padding_mask(keep.long(), 0))
        expected = theirs(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(masked[keep], expected[keep], rtol=0, atol=1e-10)


def test_encoder_layer_with_a_causal_mask_is_a_gpt2_block():
    """norm_first=True, GPT-2's eps and tanh GELU, and a causal mask: transformers' GPT2Block."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from courselib.attention import causal_mask
    config = GPT2Config(n_embd=12, n_head=3, n_inner=20, n_positions=16, attn_pdrop=0.0, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_implementation="eager")
    theirs = randomize(GPT2Block(config).double(), 7).eval()
    ours = blocks.EncoderLayer(12, 3, 20, norm_first=True, eps=config.layer_norm_epsilon, approximate="tanh").double()
    attn = theirs.attn
    with torch.no_grad():  # Conv1D stores (in, out): transpose into nn.Linear's (out, in)
        for name, weight, bias in zip(("q_proj", "k_proj", "v_proj"), attn.c_attn.weight.T.chunk(3),
                                      attn.c_attn.bias.chunk(3)):
            getattr(ours.self_attn, name).weight.copy_(weight)
            getattr(ours.self_attn, name).bias.copy_(bias)
        for module, conv in [(ours.self_attn.out_proj, attn.c_proj), (ours.ffn.linear1, theirs.mlp.c_fc),
                             (ours.ffn.linear2, theirs.mlp.c_proj)]:
            module.weight.copy_(conv.weight.T)
            module.bias.copy_(conv.bias)
        ours.norm1.load_state_dict(theirs.ln_1.state_dict())
        ours.norm2.load_state_dict(theirs.ln_2.state_dict())
    x = torch.randn(2, 9, 12, generator=seeded(8), dtype=torch.float64)
    # transformers builds the causal mask at the model level; a block on its own takes it additively
    additive = torch.zeros(9, 9, dtype=torch.float64).masked_fill(~causal_mask(9), float("-inf"))
    with torch.no_grad():
        expected = theirs(x, attention_mask=additive[None, None])
        expected = expected[0] if isinstance(expected, tuple) else expected
        torch.testing.assert_close(ours(x, causal_mask(9)), expected, rtol=0, atol=1e-10)


def test_blocks_are_interchangeable_with_the_hidden_tests_references():
    """07's hidden tests swap in their own reference classes: same names, same numbers."""
    from autograder.checks import encoder
    pairs = [(blocks.LayerNorm(10, eps=1e-5), encoder.ReferenceLayerNorm(10, eps=1e-5), (4, 10)),
             (blocks.FeedForward(10, 24), encoder.ReferenceFeedForward(10, 24), (2, 3, 10)),
             (blocks.EncoderLayer(10, 2, 24, norm_first=True),
              encoder.ReferenceEncoderLayer(10, 2, 24, norm_first=True), (2, 6, 10)),
             (blocks.EncoderLayer(10, 2, 24), encoder.ReferenceEncoderLayer(10, 2, 24), (2, 6, 10))]
    for seed, (ours, reference, shape) in enumerate(pairs):
        randomize(reference.double(), seed).eval()
        assert list(ours.state_dict()) == list(reference.state_dict()), type(ours).__name__
        ours.double().load_state_dict(reference.state_dict())
        ours.eval()
        x = torch.randn(*shape, generator=seeded(100 + seed), dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- 07: MiniBert (courselib/bert.py)
def small_bert_config(**overrides):
    from transformers import BertConfig
    settings = dict(vocab_size=40, hidden_size=12, num_hidden_layers=3, num_attention_heads=3, intermediate_size=20,
                    max_position_embeddings=16, type_vocab_size=3, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertConfig(**{**settings, **overrides})


def test_minibert_matches_transformers_bert_model():
    """Loaded from a random BertModel (random LayerNorms too), the same last hidden states in float64,
    on a padded batch of sentence pairs, padding positions included."""
    from transformers import BertModel

    from courselib import bert
    torch.manual_seed(0)
    theirs = randomize(BertModel(small_bert_config(), add_pooling_layer=False).double(), 9).eval()
    ours = bert.load_hf_bert_weights(bert.minibert_like(theirs.config).double(), theirs).eval()
    g = seeded(10)
    ids = torch.randint(1, 40, (3, 11), generator=g)
    segments = torch.randint(0, 3, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:], mask[2, 4:] = 0, 0
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, token_type_ids=segments).last_hidden_state
        torch.testing.assert_close(ours(ids, mask, segments), expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(ours(ids), theirs(ids).last_hidden_state, rtol=0, atol=1e-12)


def test_minibert_loads_a_masked_lm_or_its_state_dict_and_refuses_other_sizes():
    from transformers import BertForMaskedLM

    from courselib import bert
    torch.manual_seed(1)
    mlm = randomize(BertForMaskedLM(small_bert_config(num_hidden_layers=2)).double(), 11).eval()
    ids = torch.randint(0, 40, (2, 9), generator=seeded(12))
    with torch.no_grad():
        expected = mlm.bert(ids).last_hidden_state
        for source in (mlm, mlm.state_dict(), mlm.bert.state_dict()):
            ours = bert.load_hf_bert_weights(bert.minibert_like(mlm.config).double(), source).eval()
            torch.testing.assert_close(ours(ids), expected, rtol=0, atol=1e-12)
    for wrong in (small_bert_config(num_hidden_layers=3), small_bert_config(num_hidden_layers=1),
                  small_bert_config(num_hidden_layers=2, max_position_embeddings=20)):
        with pytest.raises(ValueError):
            bert.load_hf_bert_weights(bert.minibert_like(wrong), mlm)
    with pytest.raises(ValueError):
        bert.minibert_like(small_bert_config(hidden_act="gelu_new"))


def test_minibert_is_interchangeable_with_notebook_07s_reference():
    """Same parameter names as the MiniBert notebook 07 teaches (its hidden tests' reference), same numbers."""
    from autograder.checks import encoder

    from courselib import bert
    reference = randomize(encoder.ReferenceMiniBert(30, 8, 2, 2, 12, 10, 2).double(), 13).eval()
    ours = bert.MiniBert(30, 8, 2, 2, 12, 10, 2).double().eval()
    assert list(ours.state_dict()) == list(reference.state_dict())
    ours.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 30, (2, 7), generator=seeded(14))
    segments = torch.randint(0, 2, (2, 7), generator=seeded(15))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, segments), reference(ids, mask, segments), rtol=0, atol=1e-12)


def test_minibert_and_a_tied_head_export_to_bert_for_masked_lm():
    """The reverse of load_hf_bert_weights: a random MiniBert (random LayerNorms too) and a masked-LM head tied to
    its embeddings become a BertForMaskedLM with the same logits (float64), padding and segments included; the
    round trip back through load_hf_bert_weights gives the same tensors; wrong sizes and untied heads refuse."""
    from transformers import BertForMaskedLM

    from courselib import bert
    config = small_bert_config(num_hidden_layers=2, layer_norm_eps=1e-7)

    class Head(nn.Module):  # 08's MaskedLMHead, as its exercise asks for it
        def __init__(self, embeddings, eps):
            super().__init__()
            vocab_size, d_model = embeddings.weight.shape
            self.dense, self.norm = nn.Linear(d_model, d_model), blocks.LayerNorm(d_model, eps)
            self.decoder = nn.Linear(d_model, vocab_size)
            self.decoder.weight = embeddings.weight

        def forward(self, hidden):
            return self.decoder(self.norm(F.gelu(self.dense(hidden))))

    encoder = bert.minibert_like(config).double()
    head = Head(encoder.token_embeddings, config.layer_norm_eps).double()
    randomize(encoder, 16), randomize(head, 17)
    encoder.eval(), head.eval()
    rng = torch.get_rng_state()
    theirs = bert.to_hf_bert_for_masked_lm(encoder, head, config)
    assert torch.equal(torch.get_rng_state(), rng), "the export must leave the global random numbers alone"
    assert isinstance(theirs, BertForMaskedLM) and not theirs.training and theirs.dtype == torch.float64
    assert theirs.cls.predictions.decoder.weight is theirs.bert.embeddings.word_embeddings.weight
    g = seeded(18)
    ids = torch.randint(0, 40, (3, 10), generator=g)
    segments = torch.randint(0, 3, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        ours = head(encoder(ids, mask, segments))
        torch.testing.assert_close(theirs(ids, attention_mask=mask, token_type_ids=segments).logits, ours,
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(theirs(ids).logits, head(encoder(ids)), rtol=0, atol=1e-12)
    back = bert.load_hf_bert_weights(bert.minibert_like(config).double(), theirs)
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    for name, target in bert.mlm_head_hf_names().items():
        assert torch.equal(theirs.state_dict()[target], head.state_dict()[name]), name

    with pytest.raises(ValueError):   # other sizes
        bert.to_hf_bert_for_masked_lm(encoder, head, small_bert_config(num_hidden_layers=2, hidden_size=15))
    with pytest.raises(ValueError):   # another depth
        bert.to_hf_bert_for_masked_lm(encoder, head, small_bert_config(num_hidden_layers=3))
    untied = Head(encoder.token_embeddings, config.layer_norm_eps).double()
    untied.decoder.weight = nn.Parameter(encoder.token_embeddings.weight.detach().clone())
    with pytest.raises(ValueError):
        bert.to_hf_bert_for_masked_lm(encoder, untied, config)


def test_init_bert_weights_draws_small_weights_and_zero_biases_and_keeps_the_tie():
    from courselib import bert
    torch.manual_seed(19)
    encoder = bert.MiniBert(300, 32, 2, 2, 64, 16)
    decoder = nn.Linear(32, 300)
    decoder.weight = encoder.token_embeddings.weight
    model = nn.ModuleDict({"bert": encoder, "decoder": decoder})
    assert bert.init_bert_weights(model, std=0.02) is model
    assert decoder.weight is encoder.token_embeddings.weight
    assert abs(encoder.token_embeddings.weight.std().item() - 0.02) < 0.002
    assert abs(encoder.layers[0].ffn.linear1.weight.std().item() - 0.02) < 0.002
    assert (decoder.bias == 0).all() and (encoder.layers[1].self_attn.q_proj.bias == 0).all()
    assert (encoder.embedding_norm.weight == 1).all() and (encoder.embedding_norm.bias == 0).all()
