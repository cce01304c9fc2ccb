"""The course's shipped tiny BERT: loadable the standard ways, sensible predictions, reproducible build,
and a fast fallback when bert-base-uncased is unavailable."""
import json
import time

import pytest
import torch

from courselib import tiny_bert

SEATS = set(tiny_bert.SEATS)


@pytest.fixture(scope="module")
def unmasker():
    from transformers import pipeline
    from transformers.utils import logging
    logging.set_verbosity_error()
    return pipeline("fill-mask", model=str(tiny_bert.MODEL_DIR))  # the path, as any user would load it


def test_shipped_files_are_small_safetensors_and_a_wordpiece_tokenizer():
    files = {p.name: p.stat().st_size for p in tiny_bert.MODEL_DIR.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
            "training_log.json"} <= set(files), files
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in files), "weights ship as safetensors only"
    total_mb = sum(files.values()) / 1e6
    assert 1 < total_mb < 10, f"the tiny BERT should be a few MB, it is {total_mb:.1f} MB"
    tokenizer_json = json.loads((tiny_bert.MODEL_DIR / "tokenizer.json").read_text())
    assert tokenizer_json["model"]["type"] == "WordPiece"


def test_loads_with_the_standard_classes():
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForMaskedLM, BertTokenizerFast
    auto_tokenizer = AutoTokenizer.from_pretrained(tiny_bert.MODEL_DIR)
    bert_tokenizer = BertTokenizerFast.from_pretrained(tiny_bert.MODEL_DIR)
    text = "The cat sat on the [MASK]."
    assert auto_tokenizer(text)["input_ids"] == bert_tokenizer(text)["input_ids"]
    ids = auto_tokenizer(text)["input_ids"]
    assert ids[0] == auto_tokenizer.cls_token_id and ids[-1] == auto_tokenizer.sep_token_id
    assert auto_tokenizer.mask_token_id in ids and auto_tokenizer.unk_token_id not in ids
    model = AutoModelForMaskedLM.from_pretrained(tiny_bert.MODEL_DIR)
    assert isinstance(model, BertForMaskedLM) and model.config.vocab_size == len(auto_tokenizer)


def test_the_cat_sat_on_furniture(unmasker):
    predictions = unmasker("the cat sat on the [MASK].", top_k=5)
    words = [p["token_str"] for p in predictions]
    assert set(words[:3]) <= SEATS, f"expected mat/sofa/bed-like words first, got {words}"
    on_furniture = sum(p["score"] for p in unmasker("the cat sat on the [MASK].", targets=sorted(SEATS),
                                                    top_k=len(SEATS)))
    assert on_furniture > 0.8, f"only {on_furniture:.2f} of the probability goes to furniture"


@pytest.mark.parametrize("text, answer", [
    ("the day after monday is [MASK].", "tuesday"), ("the month after june is [MASK].", "july"),
    ("two plus two is [MASK].", "four"), ("the opposite of hot is [MASK].", "cold"),
    ("we see with our [MASK].", "eyes"), ("the [MASK] barked loudly.", "dog"),
    ("the [MASK] mooed loudly.", "cow"), ("the sky is [MASK].", "blue"),
    ("the doctor works at the [MASK].", "hospital"), ("it is cold in the [MASK].", "winter"),
])
def test_knows_facts_of_its_corpus(unmasker, text, answer):
    """Facts the shipped build learned (it puts a country after "capital of", but not yet the right one)."""
    words = [p["token_str"] for p in unmasker(text, top_k=3)]
    assert answer in words, f"{text} -> {words}, expected {answer} in the top 3"


def test_pronouns_are_balanced_in_the_corpus():
    sentences = tiny_bert.corpus(20_000)
    teachers = [s.split()[0] for s in sentences if s.endswith(" teacher.") and s.split()[0] in ("he", "she")]
    share = teachers.count("she") / len(teachers)
    assert 0.45 < share < 0.55, f"'she is a ... teacher.' is {share:.0%} of the pronoun-teacher sentences"


def test_rebuild_is_reproducible():
    """Same seed, same corpus, same vocabulary, same first losses as the shipped build recorded."""
    log = json.loads((tiny_bert.MODEL_DIR / "training_log.json").read_text())
    sentences = tiny_bert.corpus(log["num_sentences"], log["seed"])
    assert sentences == tiny_bert.corpus(log["num_sentences"], log["seed"])
    vocab = tiny_bert.learn_wordpiece_vocab(sentences)
    shipped = (tiny_bert.MODEL_DIR / "vocab.txt").read_text().splitlines()
    assert list(vocab) == shipped, "the WordPiece vocabulary learned from the corpus differs from the shipped one"

    tokenizer = tiny_bert.train_tokenizer(sentences)
    losses = tiny_bert.pretrain(tokenizer, sentences, steps=log["steps"], seed=log["seed"], stop_after=3,
                                **log["hyperparameters"])[1]
    # rel=1e-4, not equality: another number of threads sums in another order
    assert losses == pytest.approx(log["first_losses"][:3], rel=1e-4), (
        "a rebuild's first losses differ from those the shipped model recorded")


def test_fallback_is_fast_offline(monkeypatch):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForMaskedLM  # noqa: F401 (imports aren't timed)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    model, tokenizer, name = tiny_bert.load_fill_mask_model("course-tests/no-such-model", verbose=False)
    elapsed = time.perf_counter() - start
    assert name == "tiny-bert" and model.config.vocab_size == len(tokenizer)
    assert elapsed < 3, f"the fallback took {elapsed:.1f} s with HF_HUB_OFFLINE=1"


def test_fallback_is_fast_without_hf_hub_offline(monkeypatch):
    """No HF_HUB_OFFLINE: a quick probe of the hub (a thread with a 1.5 s limit, DNS included) decides,
    so an offline machine never waits for huggingface_hub's download retries (47 s measured)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForMaskedLM  # noqa: F401 (imports aren't timed)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    start = time.perf_counter()
    model, tokenizer, name = tiny_bert.load_fill_mask_model("course-tests/no-such-model", verbose=False)
    elapsed = time.perf_counter() - start
    assert name == "tiny-bert"
    assert elapsed < 5, f"the fallback took {elapsed:.1f} s without HF_HUB_OFFLINE"


def test_eager_attention_returns_weights():
    model, tokenizer = tiny_bert.load_tiny_bert(attn_implementation="eager")
    with torch.no_grad():
        attentions = model(**tokenizer("the cat sat on the mat.", return_tensors="pt"),
                           output_attentions=True).attentions
    assert len(attentions) == model.config.num_hidden_layers
    assert torch.allclose(attentions[0].sum(dim=-1), torch.ones(1))
