"""Notebook 10's task, reference model and shipped checkpoint (courselib/seq2seq.py), the facts its T5/BART
table states, and the assumptions its hidden checks rest on (autograder/checks/encoder_decoder.py)."""
import datetime
import json
import math
import random

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from autograder.checks import encoder_decoder as checks  # noqa: E402
from autograder.checks.common import Seeds  # noqa: E402
from autograder.judges import encoder_decoder as judges  # noqa: E402
from courselib import diagrams, seq2seq  # noqa: E402
from courselib.attention import causal_mask, padding_mask  # noqa: E402

# One worker runs the whole module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_seq2seq")

torch.set_num_threads(1)


def randomized(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=g, dtype=param.dtype) / math.sqrt(param.shape[-1]))
    return model


# ---------------------------------------------------------------- the task
def test_every_date_in_every_format_fits_and_translates():
    day, last = seq2seq.FIRST_DAY, seq2seq.LAST_DAY
    while day <= last:
        for name, write in seq2seq.FORMATS.items():
            source, target = write(day), seq2seq.translate(day, name)
            assert len(seq2seq.tokenize(source)) <= seq2seq.SRC_LEN, source
            assert len(seq2seq.tokenize(target)) + 1 <= seq2seq.TGT_LEN, target
        day += datetime.timedelta(days=7 if day.day > 3 else 1)   # every month's first days, then weekly
    assert seq2seq.translate(datetime.date(1989, 3, 12), "dd.mm.yy") == "1989-03-12"
    assert seq2seq.translate(datetime.date(2021, 3, 12), "iso") == "12 march 2021"
    assert seq2seq.FORMATS["dd.mm.yy"](datetime.date(2001, 1, 5)) == "05.01.01"


def test_two_digit_years_have_one_century():
    for year in range(1950, 2050):
        yy = year % 100
        assert (1900 if yy >= 50 else 2000) + yy == year


def test_held_out_dates_never_reach_training():
    rng = random.Random(0)
    held = sum(seq2seq.is_held_out(seq2seq.random_date(rng, held_out=False)) for _ in range(5000))
    assert held == 0
    days = [seq2seq.FIRST_DAY + datetime.timedelta(days=i) for i in range(36525)]
    share = sum(map(seq2seq.is_held_out, days)) / len(days)
    assert 0.09 < share < 0.11, share
    src, tgt = seq2seq.held_out_set(50)
    assert src.shape == (50, seq2seq.SRC_LEN) and tgt.shape == (50, seq2seq.TGT_LEN)


def test_batches_pad_right_and_end_targets_with_eos():
    pairs = [("12 march 2021", "2021-03-12"), ("2001-01-05", "5 january 2001")]
    src, tgt = seq2seq.batch(pairs)
    assert seq2seq.to_text(tgt[0]) == "2021-03-12" and seq2seq.to_text(tgt[1]) == "5 january 2001"
    assert tgt[1].tolist()[6:] == [seq2seq.EOS, 0, 0, 0, 0]
    assert seq2seq.tokens_of(src[0]) == ["1", "2", "march", "2", "0", "2", "1"]
    with pytest.raises(ValueError):
        seq2seq.tokenize("12 marsh 2021")


# ---------------------------------------------------------------- the reference model
def padded_batch(seed, B=4, S=9, T=8):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, seq2seq.CONFIG["vocab_size"], (B, S), generator=g)
    tgt_in = torch.randint(3, seq2seq.CONFIG["vocab_size"], (B, T), generator=g)
    tgt_in[:, 0] = seq2seq.BOS
    src[1, 5:], src[3, 2:], tgt_in[2, 4:], tgt_in[3, 6:] = 0, 0, 0, 0
    return src, tgt_in


def test_reference_model_is_torch_transformer_between_embedding_and_head():
    model = randomized(seq2seq.EncoderDecoder(**seq2seq.CONFIG).double().eval())
    theirs = seq2seq.to_torch_transformer(model, seq2seq.CONFIG["num_heads"])
    src, tgt_in = padded_batch(1)
    with torch.no_grad():
        memory = theirs.encoder(model.embed(src) + model.src_positions(src), src_key_padding_mask=src == 0)
        out = theirs.decoder(model.embed(tgt_in) + model.tgt_positions(tgt_in), memory,
                             tgt_mask=~causal_mask(tgt_in.shape[1]), tgt_key_padding_mask=tgt_in == 0,
                             memory_key_padding_mask=src == 0)
        torch.testing.assert_close(model.encode(src), memory, rtol=0, atol=1e-12)
        torch.testing.assert_close(model(src, tgt_in), model.head(out), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_reference_decoder_layer_is_torch_decoder_layer(norm_first):
    ours = randomized(seq2seq.DecoderLayer(12, 3, 20, norm_first=norm_first).double().eval(), 2)
    theirs = torch.nn.TransformerDecoderLayer(12, 3, 20, dropout=0.0, activation="gelu", batch_first=True,
                                              norm_first=norm_first).double()
    theirs.load_state_dict(seq2seq.torch_layer_state(ours, decoder=True))
    g = torch.Generator().manual_seed(3)
    x, memory = torch.randn(2, 5, 12, generator=g, dtype=torch.float64), torch.randn(2, 7, 12, generator=g, dtype=torch.float64)
    tgt_keep = torch.arange(5) < torch.tensor([5, 3])[:, None]
    mem_keep = torch.arange(7) < torch.tensor([6, 2])[:, None]
    with torch.no_grad():
        expected = theirs(x, memory, tgt_mask=~causal_mask(5), tgt_key_padding_mask=~tgt_keep,
                          memory_key_padding_mask=~mem_keep)
        torch.testing.assert_close(ours(x, memory, tgt_keep[:, None, None, :], mem_keep[:, None, None, :]), expected,
                                   rtol=0, atol=1e-12)


def test_reference_greedy_stops_and_pads():
    model = seq2seq.load_checkpoint()
    src, tgt = seq2seq.batch([("2021-03-12", "12 march 2021"), ("march 12, 2021", "2021-03-12")])
    out = seq2seq.greedy_decode(model, src, seq2seq.TGT_LEN)
    assert out.shape == (2, 11)                       # the ISO date with its [EOS] is the longest
    assert out[0].tolist()[7:] == [seq2seq.EOS] + [seq2seq.PAD] * 3   # "12 march 2021", [EOS], then padding
    assert seq2seq.exact_match(out, tgt) == 1.0


# ---------------------------------------------------------------- the shipped checkpoint
def test_shipped_checkpoint_is_small_safetensors_with_its_log():
    files = {p.name: p.stat().st_size for p in seq2seq.MODEL_DIR.iterdir()}
    assert {"model.safetensors", "config.json", "training_log.json", "README.md"} <= set(files), files
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in files)
    assert sum(files.values()) < 1_000_000
    assert json.loads((seq2seq.MODEL_DIR / "config.json").read_text()) == seq2seq.CONFIG
    log = json.loads((seq2seq.MODEL_DIR / "training_log.json").read_text())
    assert log["parameters"] == sum(p.numel() for p in seq2seq.load_checkpoint().parameters())


def test_shipped_checkpoint_translates_held_out_dates():
    model = seq2seq.load_checkpoint()
    src, tgt = seq2seq.batch(seq2seq.sample_pairs(600, random.Random(2024), held_out=True))
    accuracy = seq2seq.exact_match(seq2seq.greedy_decode(model, src, seq2seq.TGT_LEN), tgt)
    assert accuracy >= 0.99, accuracy


def test_checkpoint_loads_into_any_class_with_the_same_names():
    class Renamed(seq2seq.EncoderDecoder):
        pass
    assert isinstance(seq2seq.load_checkpoint(Renamed), Renamed)


def test_rebuild_is_reproducible():
    """Same seed, same first losses as the shipped build recorded (the first steps of its schedule)."""
    log = json.loads((seq2seq.MODEL_DIR / "training_log.json").read_text())
    torch.manual_seed(log["seed"])
    model = seq2seq.EncoderDecoder(**seq2seq.CONFIG)
    losses = seq2seq.train(model, 3, decay=True, seed=log["seed"])
    assert losses == pytest.approx(log["first_losses"][:3], rel=1e-4)


def test_training_decays_the_matrices_only(monkeypatch):
    """seq2seq.train uses notebook 09's weight-decay groups: every tensor with 2 or more dimensions (linear weights,
    the embedding and position tables) decays, biases and LayerNorm gains and shifts do not."""
    groups = []

    class Recording(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            groups.extend(self.param_groups)
    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    torch.manual_seed(0)
    model = seq2seq.EncoderDecoder(**seq2seq.CONFIG)
    seq2seq.train(model, 1)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for group in groups if group["weight_decay"] > 0 for p in group["params"]}
    kept = {names[id(p)] for group in groups if group["weight_decay"] == 0 for p in group["params"]}
    assert decayed == {name for name, p in model.named_parameters() if p.dim() >= 2}
    assert kept == {name for name, p in model.named_parameters() if p.dim() < 2}
    assert {"embed.embedding.weight", "tgt_positions.table.weight", "head.weight"} <= decayed
    assert {"encoder_norm.weight", "decoder_layers.0.norm2.bias", "head.bias"} <= kept
    assert [group["weight_decay"] for group in groups] == [0.01, 0.0]


# ---------------------------------------------------------------- the T5 / BART table (section 8)
@pytest.fixture(scope="module")
def t5_and_bart():
    import transformers
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4))
    bart = BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2,
                                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                                   encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64))
    return t5.eval(), bart.eval()


def test_t5_positions_are_relative_biases_in_the_first_layer_only(t5_and_bart):
    t5, _ = t5_and_bart
    names = [n for n, _ in t5.named_parameters()]
    assert [n for n in names if "relative" in n] == ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                                      "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    assert not any("position" in n and "relative" not in n for n in names)   # no absolute table
    assert (t5.config.relative_attention_num_buckets, t5.config.relative_attention_max_distance) == (32, 128)
    assert not t5.decoder.block[0].layer[1].EncDecAttention.has_relative_attention_bias


def test_t5_block_is_pre_ln_rmsnorm_without_biases_or_score_scaling(t5_and_bart):
    t5, _ = t5_and_bart
    x = 3 * torch.randn(2, 5, 16) + 1
    with torch.no_grad():
        ffn = t5.encoder.block[0].layer[-1]
        assert torch.allclose(ffn(x), x + ffn.DenseReluDense(ffn.layer_norm(x)))
        norm = t5.encoder.final_layer_norm
        rms = x / x.pow(2).mean(-1, keepdim=True).add(norm.variance_epsilon).sqrt()
        assert torch.allclose(norm(x), rms * norm.weight) and [n for n, _ in norm.named_parameters()] == ["weight"]
    assert not any(m.bias is not None for m in t5.modules() if isinstance(m, torch.nn.Linear))
    assert t5.encoder.block[0].layer[0].SelfAttention.scaling == 1.0
    assert t5.config.dense_act_fn == "relu"
    assert t5.lm_head.weight is t5.shared.weight and t5.config.scale_decoder_outputs


def test_bart_block_is_post_ln_with_learned_offset_positions(t5_and_bart):
    _, bart = t5_and_bart
    assert tuple(bart.model.encoder.embed_positions.weight.shape) == (64 + 2, 16)
    assert bart.model.encoder.embed_positions.offset == 2
    x = 3 * torch.randn(2, 5, 16) + 1
    with torch.no_grad():
        out = bart.model.encoder.layers[0](x, attention_mask=None)
    assert out.mean(-1).abs().max() < 1e-5 and (out.std(-1, unbiased=False) - 1).abs().max() < 1e-3
    assert hasattr(bart.model.encoder, "layernorm_embedding")
    assert bart.model.encoder.layers[0].self_attn.scaling == pytest.approx(4 ** -0.5)
    assert bart.config.activation_function == "gelu" and bart.config.scale_embedding is False
    assert bart.lm_head.weight is bart.model.shared.weight
    assert bart.config.decoder_start_token_id == bart.config.eos_token_id == 2


# ---------------------------------------------------------------- the hidden checks' assumptions
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_by_hand_is_torch_when_no_mistake_is_switched_on(norm_first):
    seeds = Seeds("by hand")
    weights, x, memory = checks.decoder_case(seeds, 1, (12, 3, 20), 2, 5, 7)
    tgt_keep, mem_keep = checks.lengths_to_keep((5, 3), 5), checks.lengths_to_keep((6, 4), 7)
    expected, diagnoses = judges.decoder_layer_oracle(weights, (12, 3, 20), x, memory, tgt_keep, mem_keep, norm_first)
    theirs = judges.torch_decoder_layer(weights, 12, 3, 20, norm_first)
    plain = judges.decoder_by_hand(theirs, x, memory, tgt_keep, mem_keep, norm_first)
    torch.testing.assert_close(plain, expected, rtol=0, atol=1e-12)
    for message, wrong in diagnoses.items():   # every diagnosis is a distinct mistake
        assert (wrong - expected).abs().max() > 1e-3, message


def test_model_outputs_without_switches_are_the_oracle():
    seeds = Seeds("model")
    weights, (src, tgt_in) = checks.model_case(seeds, *checks.MODEL_CASES[0])
    memory, logits = judges.model_outputs(weights, checks.ED_DIMS, src, tgt_in)
    oracle_memory, oracle_logits = judges.oracle_model(weights, checks.ED_DIMS, src, tgt_in)
    torch.testing.assert_close(memory, oracle_memory, rtol=0, atol=1e-12)
    torch.testing.assert_close(logits, oracle_logits, rtol=0, atol=1e-12)
    for message, wrong in judges.logits_diagnoses(weights, checks.ED_DIMS, src, tgt_in).items():
        assert (wrong - oracle_logits).abs().max() > 1e-3, message


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(40)])
def test_length_penalty_case_separates_raw_and_normalised_for_any_seed(token):
    tables = checks.penalty_tables(Seeds(token))
    scores = judges.scripted_next(tables, checks.PENALTY_SOURCE[0].tolist())
    raw, _ = judges.reference_beam(scores, 2, 6, 0.0)
    normalised, _ = judges.reference_beam(scores, 2, 6, 1.0)
    assert raw == [2] and normalised == [3, 3, 3, 2]


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(10)])
def test_greedy_cases_end_where_planned(token):
    seeds = Seeds(token)
    for i, (firsts, plan, max_len) in enumerate(checks.GREEDY_CASES):
        tables = checks.greedy_tables(seeds, 10401 + i, plan)
        rows = judges.expected_rows(tables, checks.greedy_sources(firsts, seeds, 10411 + i), max_len)
        for first, row in zip(firsts, rows):
            stop = plan[first]
            assert len(row) == (max_len if stop < 0 or stop >= max_len else stop + 1)
            assert (row[-1] == 2) == (0 <= stop < max_len)


def test_exhaustive_beam_is_the_best_sequence():
    seeds = Seeds("beam")
    tables = checks.beam_tables(seeds, 10631, checks.EXHAUSTIVE_VOCAB, checks.EXHAUSTIVE_MAX)
    source = checks.beam_source(3, seeds, 10632, checks.EXHAUSTIVE_VOCAB)[0].tolist()
    for penalty in (0.0, 1.0):
        best = max(judges.all_sequences(tables, source, checks.EXHAUSTIVE_MAX),
                   key=lambda c: c[1] / len(c[0]) ** penalty)
        tokens, score = judges.reference_beam(judges.scripted_next(tables, source), checks.EXHAUSTIVE_WIDTH,
                                              checks.EXHAUSTIVE_MAX, penalty)
        assert tokens == list(best[0]) and score == pytest.approx(best[1] / len(best[0]) ** penalty)


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(12)])
def test_reference_beam_is_transformers_generate(token):
    """The judges' float64 beam search is the algorithm of transformers' generate(num_beams=k): the same tokens
    and, to generate's float32, the same score, on random scripted models of every size the checks use."""
    seeds = Seeds(token)
    rng = seeds.random(1)
    for case in range(6):
        vocab, max_len = rng.choice([5, 7, 9]), rng.randint(2, 6)
        tables = checks.beam_tables(seeds, 100 + case, vocab, max_len)
        source = [rng.randrange(8), 3, 4]
        width, penalty = rng.randint(1, vocab - 1), rng.choice([0.0, 0.5, 1.0, 2.0])
        ours = judges.reference_beam(judges.scripted_next(tables, source), width, max_len, penalty)
        theirs = seq2seq.transformers_beam_search(checks.ScriptedModel(*tables), torch.tensor([source]), width, max_len,
                                                  penalty, 1, 2, 0)
        assert ours[0] == theirs[0].tolist() and ours[1] == pytest.approx(theirs[1], rel=1e-5, abs=1e-5), \
            (vocab, max_len, width, penalty)


# the mistakes each designed beam case is built to expose (autograder/checks/encoder_decoder.py says how)
DESIGNED_EXPECTATIONS = {"REFILL": ([4, 5, 2], ["shrink"]), "SPARE": ([3, 5, 2], ["every_eos_finishes"]),
                         "PATIENT": ([2], ["no_stop"]), "TRUNCATED": ([3, 5, 5], ["eos_only_at_end"])}


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(10)])
def test_designed_beam_cases_hold_for_any_seed(token):
    seeds = Seeds(token)
    for stream, name, width, penalty, max_len in checks.KEEPS_LIVE_CASES + checks.STOPPING_CASES:
        model = checks.prefix_model(seeds, stream, checks.DESIGNED[name])
        expected, mistakes = DESIGNED_EXPECTATIONS[name]
        theirs, _ = seq2seq.transformers_beam_search(model, checks.PREFIX_SOURCE, width, max_len, penalty, 1, 2, 0)
        assert theirs.tolist() == expected, (name, penalty)
        assert judges.reference_beam(judges.prefix_next(model), width, max_len, penalty)[0] == expected
        for mistake in mistakes:
            assert judges.reference_beam(judges.prefix_next(model), width, max_len, penalty, mistake=mistake)[0] != \
                expected, (name, mistake)


def test_transformers_beam_search_agrees_with_the_notebook_on_the_shipped_model():
    model = seq2seq.load_checkpoint()
    src = seq2seq.encode(["march 12, 2021"], seq2seq.SRC_LEN)
    tokens, score = seq2seq.transformers_beam_search(model, src, 3, seq2seq.TGT_LEN)
    assert seq2seq.to_text(tokens) == "2021-03-12" and tokens[-1] == seq2seq.EOS and -0.1 < score <= 0


def test_cached_by_hand_without_mistakes_is_the_oracle():
    seeds = Seeds("cache")
    model, src, tgt_in, memory = checks.cache_problem(seeds, checks.CACHE_STREAM + 2, 9)
    _, expected = judges.oracle_model(checks.model_weights(seeds, checks.CACHE_STREAM + 2), checks.ED_DIMS, src, tgt_in)
    splits = checks.CACHE_CHUNK_SPLITS
    torch.testing.assert_close(judges.cached_by_hand(model, src, tgt_in, memory, splits), expected, rtol=0, atol=1e-12)
    for switch in ("restart_positions", "cross_from_stream", "no_past"):
        wrong = judges.cached_by_hand(model, src, tgt_in, memory, splits, **{switch: True})
        assert (wrong - expected).abs().max() > 1e-3, switch
    no_mask = judges.cached_by_hand(model, src, tgt_in, memory, splits, causal_chunks=False)
    assert (no_mask - expected).abs().max() > 1e-3
    later = judges.cached_by_hand(model, src, tgt_in, memory, splits, later_memory=checks.later_memory(seeds))
    assert (later - expected).abs().max() > 1e-3


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(5)])
def test_smoothing_oracle_is_the_formula_and_its_diagnoses_are_distinct(token):
    for case in checks.SMOOTHING_VALUES_CASES + checks.SMOOTHING_PADDING_CASES:
        logits, targets = checks.smoothing_case(Seeds(token), *case)
        epsilon, ignore_index = case[3], case[4]
        expected, diagnoses = judges.smoothing_oracle(logits, targets, epsilon, ignore_index)
        keep = targets != ignore_index
        log_probs = torch.log_softmax(logits[keep], dim=-1)
        q = torch.full_like(log_probs, epsilon / logits.shape[-1])
        q[torch.arange(len(q)), targets[keep]] += 1 - epsilon
        torch.testing.assert_close(expected, -(q * log_probs).sum(-1).mean(), rtol=1e-12, atol=1e-12)
        for message, wrong in diagnoses.items():   # a mistake that changes nothing in a case is no diagnosis there
            harmless = ("every row" in message and keep.all()
                        or epsilon == 0 and "summed" not in message and "every row" not in message)
            assert harmless or (wrong - expected).abs() > 1e-6, (case, message)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bucket_settings_sit_on_no_rounding_boundary(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention
    positions = torch.arange(-1000, 1001)
    for num_buckets, max_distance in checks.BUCKET_SETTINGS:
        expected = T5Attention._relative_position_bucket(positions, bidirectional, num_buckets, max_distance)
        half = num_buckets // 2 if bidirectional else num_buckets
        n = positions.abs() if bidirectional else (-positions).clamp(min=0)
        exact = half // 2
        far = (exact + (torch.log(n.double() / exact) / math.log(max_distance / exact) * (half - exact)).long())
        ours = torch.where(n < exact, n, far.clamp(max=half - 1)) + (half * (positions > 0) if bidirectional else 0)
        assert torch.equal(ours, expected), (num_buckets, max_distance)


def test_trained_model_threshold_is_far_from_an_untrained_model():
    torch.manual_seed(0)
    model = seq2seq.EncoderDecoder(**seq2seq.CONFIG).eval()
    src, tgt = seq2seq.batch(checks.held_out_pairs(Seeds("untrained")))
    assert seq2seq.exact_match(seq2seq.greedy_decode(model, src, seq2seq.TGT_LEN), tgt) < judges.EXACT_MATCH_THRESHOLD / 5


def test_stack_diagram_has_one_cross_attention_arrow_per_decoder_layer():
    for num_layers in (1, 2, 3):
        ax = diagrams.encoder_decoder_stack(num_layers)
        try:
            red = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"
                   and matplotlib.colors.to_hex(p.get_edgecolor()) == "#c0392b"]
            assert len(red) == num_layers
            texts = " ".join(t.get_text() for t in ax.texts)
            assert f"decoder layer {num_layers}: masked self-attention" in texts
        finally:
            plt.close(ax.figure)


# ---------------------------------------------------------------- reorder_cache (exercise 9)
def test_the_gather_oracle_is_transformers_reorder_cache():
    """The judges' gather (row r <- row beam_idx[r]) is what transformers' EncoderDecoderCache.reorder_cache does
    to the self-attention's and the cross-attention's keys and values of every layer."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    seeds = Seeds("reorder")
    for stream, layers, heads, T, S, d_head, rows, after in checks.REORDER_CASES:
        cache, beam_idx = checks.reorder_case(seeds, stream, layers, heads, T, S, d_head, rows, after)
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for i, (keys, values, cross_keys, cross_values) in enumerate(cache):
            self_cache.update(keys, values, i)
            cross_cache.update(cross_keys, cross_values, i)
        theirs = EncoderDecoderCache(self_cache, cross_cache)
        theirs.reorder_cache(beam_idx)
        for i, entry in enumerate(cache):
            library = (theirs.self_attention_cache.layers[i].keys, theirs.self_attention_cache.layers[i].values,
                       theirs.cross_attention_cache.layers[i].keys, theirs.cross_attention_cache.layers[i].values)
            for tensor, reordered in zip(entry, library):
                assert torch.equal(judges.gathered(tensor, beam_idx), reordered)


@pytest.mark.parametrize("token", [f"seed {i}" for i in range(20)])
def test_reorder_cases_repeat_and_drop_rows_and_the_simulation_keeps_its_sources(token):
    """Every hidden reorder case repeats a row and leaves one out (so that an unordered or truncated answer differs),
    the first lets a gather along the heads run (so that its diagnosis is reached), and the simulated beam search
    never takes a row from another source's beams, as transformers' never does."""
    seeds = Seeds(token)
    for index, (stream, layers, heads, T, S, d_head, rows, after) in enumerate(checks.REORDER_CASES):
        cache, beam_idx = checks.reorder_case(seeds, stream, layers, heads, T, S, d_head, rows, after)
        assert len(beam_idx) == after and int(beam_idx.max()) < rows
        assert len(set(beam_idx.tolist())) < after and (after > rows or len(set(beam_idx.tolist())) < rows)
        assert index or (rows == after <= heads and not torch.equal(beam_idx, torch.arange(rows)))
    rows = 1
    for beam_idx, new_tokens in checks.simulation_steps(seeds):
        sources = beam_idx.view(checks.SIM_SOURCES, checks.SIM_WIDTH) // rows
        assert torch.equal(sources, torch.arange(checks.SIM_SOURCES)[:, None].expand_as(sources))
        assert int(new_tokens.min()) >= 3
        rows = checks.SIM_WIDTH
