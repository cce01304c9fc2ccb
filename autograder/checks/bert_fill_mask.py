"""Hidden checks for 08_bert_fill_mask. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded inputs, call the student's code, return
what it produced) and a judge (in the grader: rebuild the same inputs, run the oracle, compare, name
the misconception). Layered as the course's tests are: shape and format first, then values on
seeded inputs against independent oracles (`torch.nn.functional.cross_entropy`, `BertForMaskedLM`'s
own loss and head, `pipeline("fill-mask")`, all run by the judges), then behaviour (rates measured over
tens of thousands of tokens, special tokens, generators, gradients, ordering, the tiny BERT rebuilt from
courselib's MiniBert and the learner's head, the pre-training step against `BertForMaskedLM` trained on the
same weights with the same masks, the optional pseudo-log-likelihood against its definition computed one
masked copy at a time, and its single forward pass). The models here are the
course's tiny BERT and small random BERTs with their special tokens moved, never the notebook's
`model`, so the grade doesn't depend on whether bert-base-uncased was available; the random BERTs'
weights come from the seeds, so both sides build the same ones. The seeds come from the grader's
per-run token, so they are never the visible tests' inputs.
"""
import functools
import json
import math
import numbers
import threading

import torch

from autograder.checks.common import build, call, expect_shape, probe, quiet, run, submodule


MASK_ID = 4  # the id of [MASK] in the synthetic problems below (ids 0-4 play the special tokens)


# What answers an exercise outright: refused and flagged when the student's code reaches it. courselib.bert keeps
# references of 08's exercises (the hidden tests swap them in to grade one exercise at a time).
MASK_TOKENS_CALLS = ["transformers.data.data_collator.DataCollatorForLanguageModeling.torch_mask_tokens",
                     "courselib.bert.mask_tokens"]


MLM_LOSS_CALLS = ["courselib.bert.mlm_loss"]


PIPELINE_CALLS = ["transformers.pipelines.base.Pipeline.__call__",
                  "transformers.pipelines.fill_mask.FillMaskPipeline.__call__",
                  "transformers.pipelines.fill_mask.FillMaskPipeline.postprocess"]  # the pipeline's top-k


# ---------------------------------------------------------------- models and oracles
@functools.lru_cache(maxsize=None)
def tiny_bert():
    """The course's shipped tiny BERT (model, tokenizer)."""
    from courselib.tiny_bert import load_tiny_bert
    with quiet():
        return load_tiny_bert()


@functools.lru_cache(maxsize=None)
def tiny_vocab_size():
    """The tiny BERT's vocabulary size (the random BERTs' too), read without loading the model."""
    from courselib.tiny_bert import MODEL_DIR
    return json.loads((MODEL_DIR / "config.json").read_text())["vocab_size"]


@functools.lru_cache(maxsize=None)
def random_bert(seed):
    """A small randomly initialised BERT whose tokenizer puts [MASK], [CLS]... at other ids.

    A fill_mask that hard-codes the tiny model's mask id, or its answers, fails here. Its weights
    follow from `seed` alone, so the probe and the judge build the same model.
    """
    from transformers import BertForMaskedLM, BertTokenizerFast

    from courselib.tiny_bert import tiny_config
    _, tokenizer = tiny_bert()
    pieces = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    specials, ordinary = pieces[:5], pieces[5:]
    # [PAD] stays at 0 (BERT's convention); [UNK] [CLS] [SEP] [MASK] move to 100..103 as in bert-base.
    reordered = [specials[0]] + ordinary[:99] + specials[1:] + ordinary[99:]
    with quiet():
        shuffled = BertTokenizerFast(vocab={piece: i for i, piece in enumerate(reordered)}, do_lower_case=True,
                                     model_max_length=128, clean_up_tokenization_spaces=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            config = tiny_config(len(shuffled), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, initializer_range=0.5)
            model = BertForMaskedLM(config).eval()
    return model, shuffled


_PIPELINES = {}


def fill_mask_pipeline(model, tokenizer):
    """pipeline("fill-mask") for this model and tokenizer, built once."""
    from transformers import pipeline
    key = (id(model), id(tokenizer))
    if key not in _PIPELINES:
        with quiet():
            _PIPELINES[key] = (pipeline("fill-mask", model=model, tokenizer=tokenizer), model, tokenizer)
    return _PIPELINES[key][0]


def model_and_tokenizer(which):
    """"tiny", or the seed of a random BERT."""
    return tiny_bert() if which == "tiny" else random_bert(which)


def reference_fill_mask(model, tokenizer, text, top_k=5):
    """Handed to top_k_accuracy in place of the student's fill_mask (see common.call)."""
    with quiet(), torch.no_grad():
        return fill_mask_pipeline(model, tokenizer)(text, top_k=top_k)


# ---------------------------------------------------------------- exercise 1: mask_tokens
def _mask_tokens(fn, input_ids, vocab_size, **kwargs):
    before = input_ids.clone()
    result = call(fn, input_ids, MASK_ID, vocab_size, name="mask_tokens", forbidden=MASK_TOKENS_CALLS,
                  forbidden_advice="write the 80/10/10 corruption yourself; DataCollatorForLanguageModeling is "
                                   "the oracle here, not the answer.", **kwargs)
    if not torch.equal(input_ids, before):
        raise AssertionError("mask_tokens changed input_ids in place (e.g. `input_ids[selected] = mask_token_id`): "
                             "the caller still needs the original tokens. Work on input_ids.clone().")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("mask_tokens must return the pair (inputs, labels).")
    inputs, labels = result
    for name, value in (("inputs", inputs), ("labels", labels)):
        if not torch.is_tensor(value):
            raise AssertionError(f"{name} should be a torch tensor, but it is a {type(value).__name__}.")
        expect_shape(value, input_ids.shape, name, "inputs and labels have the shape of input_ids.")
        if value.dtype.is_floating_point or value.dtype == torch.bool:
            raise AssertionError(f"{name} has dtype {value.dtype}: token ids and labels are integers "
                                 "(torch.long), like input_ids.")
    return inputs, labels


def _a_number(result, refusal):
    """Probe side: a student's number as a float (a one-element tensor is accepted); else `refusal` + its type."""
    if torch.is_tensor(result) and result.numel() == 1:
        result = result.item()
    if not isinstance(result, numbers.Real):
        raise AssertionError(f"{refusal} {type(result).__name__}.")
    return float(result)


def ordinary_ids(g, shape, vocab_size):
    """Token ids that are never special: 5..vocab_size-1."""
    return torch.randint(5, vocab_size, shape, generator=g)


def labels_case(seeds):
    return ordinary_ids(seeds.generator(8101), (6, 70), 300)


@probe
def mask_tokens_labels(seeds, fn):
    """Labels: the original id where a token is selected, -100 everywhere else; nothing else changes."""
    return _mask_tokens(fn, labels_case(seeds), 300, generator=seeds.generator(8102))


RATES_VOCAB = 1000


def rates_cases(seeds):
    """Over 32,768 tokens with the default probability, then 16,384 with mlm_probability=0.4."""
    return ordinary_ids(seeds.generator(8201), (64, 512), RATES_VOCAB), ordinary_ids(seeds.generator(8203), (32, 512),
                                                                                     RATES_VOCAB)


@probe
def mask_tokens_rates(seeds, fn):
    """Over 32,768 tokens: 15% selected; of those 80% [MASK], 10% random, 10% unchanged (5-sigma bands)."""
    default, higher = rates_cases(seeds)
    return (_mask_tokens(fn, default, RATES_VOCAB, generator=seeds.generator(8202)),
            _mask_tokens(fn, higher, RATES_VOCAB, mlm_probability=0.4, generator=seeds.generator(8204)))


SPECIAL_VOCAB = 500


# 192 sequences (~4,000 ordinary tokens): the 0.05 band on the ordinary tokens' rate is then more than
# 6 standard deviations wide, for whatever seed a run brings.
SPECIAL_BATCH, SPECIAL_LENGTH = 192, 40


def special_case(seeds):
    """A batch of [CLS] ... [SEP] [PAD]... rows of random lengths, and where its special tokens are."""
    g = seeds.generator(8301)
    lengths = torch.randint(5, SPECIAL_LENGTH - 1, (SPECIAL_BATCH,), generator=g)
    input_ids = torch.randint(5, SPECIAL_VOCAB, (SPECIAL_BATCH, SPECIAL_LENGTH), generator=g)
    positions = torch.arange(SPECIAL_LENGTH)
    input_ids[:, 0] = 2                                         # [CLS]
    input_ids[positions[None, :] == lengths[:, None] + 1] = 3   # [SEP]
    input_ids[positions[None, :] > lengths[:, None] + 1] = 0    # [PAD]
    return input_ids, (input_ids == 0) | (input_ids == 2) | (input_ids == 3)


@probe
def mask_tokens_special_tokens(seeds, fn):
    """Special tokens ([CLS], [SEP], [PAD]) are never selected, whether the mask is 0/1 or bool."""
    input_ids, special = special_case(seeds)
    return [_mask_tokens(fn, input_ids, SPECIAL_VOCAB, special_tokens_mask=mask, mlm_probability=0.6,
                         generator=seeds.generator(8302)) for mask in (special.long(), special)]


GENERATOR_VOCAB = 400


@probe
def mask_tokens_generator(seeds, fn):
    """The same generator seed gives the same result, whatever the global RNG; other seeds differ."""
    input_ids = ordinary_ids(seeds.generator(8401), (8, 128), GENERATOR_VOCAB)
    with torch.random.fork_rng(devices=[]):  # the notebook's own random numbers stay as they were
        torch.manual_seed(seeds.seed(8402))
        first = _mask_tokens(fn, input_ids, GENERATOR_VOCAB, generator=seeds.generator(8403))
        torch.manual_seed(seeds.seed(8404))
        second = _mask_tokens(fn, input_ids, GENERATOR_VOCAB, generator=seeds.generator(8403))
        other = _mask_tokens(fn, input_ids, GENERATOR_VOCAB, generator=seeds.generator(8405))
        torch.manual_seed(seeds.seed(8406))
        default_a = _mask_tokens(fn, input_ids, GENERATOR_VOCAB)
        torch.manual_seed(seeds.seed(8406))
        default_b = _mask_tokens(fn, input_ids, GENERATOR_VOCAB)
    return {"first": first, "second": second, "other": other, "default_a": default_a, "default_b": default_b}


# ---------------------------------------------------------------- exercise 2: mlm_loss
def _mlm_loss(fn, logits, labels):
    result = call(fn, logits, labels, name="mlm_loss", forbidden=MLM_LOSS_CALLS,
                  forbidden_advice="write the loss yourself (F.cross_entropy is fine); courselib.bert.mlm_loss is the "
                                   "course's reference, not the answer.")
    if not torch.is_tensor(result):
        raise AssertionError(f"mlm_loss should return a torch tensor (a scalar you can call .backward() on), "
                             f"but it returned a {type(result).__name__}. Don't call .item().")
    return result


def mlm_problem(g, batch, length, vocab, predicted=0.3, dtype=torch.float64):
    logits = torch.randn(batch, length, vocab, generator=g, dtype=dtype) * 3
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[torch.rand(batch, length, generator=g) > predicted] = -100
    labels[:, 0] = 1  # every sequence predicts at least one token; how many more varies
    return logits, labels


LOSS_CASES = [(8501, (3, 9, 40)), (8502, (5, 4, 17))]


TINY_SENTENCES = ["the dog slept on the rug.", "berlin is the capital of germany."]


def tiny_loss_case(seeds):
    """The tiny BERT's batch, and labels that predict a seeded half of its positions."""
    model, tokenizer = tiny_bert()
    batch = tokenizer(TINY_SENTENCES, padding=True, return_tensors="pt")
    predicted = torch.rand(batch["input_ids"].shape, generator=seeds.generator(8503)) < 0.5
    predicted[:, 1] = True  # the first word of each sentence, so that no row is all ignored
    return model, batch, batch["input_ids"].masked_fill(~predicted, -100)


@probe
def mlm_loss_values(seeds, fn):
    """Against torch's cross_entropy (float64), then against BertForMaskedLM's own loss."""
    losses = [_mlm_loss(fn, *mlm_problem(seeds.generator(stream), *shape)) for stream, shape in LOSS_CASES]
    model, batch, labels = tiny_loss_case(seeds)
    with torch.no_grad(), quiet():
        logits = model(**batch).logits
    return losses, _mlm_loss(fn, logits, labels)


def ignores_case(seeds):
    """A problem, and the same logits with large noise where the labels are -100."""
    logits, labels = mlm_problem(seeds.generator(8601), 4, 6, 11)
    noisy = logits.clone()
    noisy[labels == -100] += 50 * torch.randn(noisy[labels == -100].shape, generator=seeds.generator(8602),
                                              dtype=logits.dtype)
    return logits, labels, noisy


@probe
def mlm_loss_ignores_positions(seeds, fn):
    """Ignored positions don't change the loss and get no gradient; predicted ones do."""
    logits, labels, noisy = ignores_case(seeds)
    loss, noisy_loss = _mlm_loss(fn, logits, labels), _mlm_loss(fn, noisy, labels)
    leaf = logits.clone().requires_grad_(True)
    result = _mlm_loss(fn, leaf, labels)
    gradient = None
    if result.requires_grad:
        call(lambda: result.backward(), name="loss.backward()")
        gradient = leaf.grad
    return {"loss": loss, "noisy_loss": noisy_loss, "requires_grad": bool(result.requires_grad), "gradient": gradient}


# ---------------------------------------------------------------- exercise 3: fill_mask
def _fill_mask(fn, which, text, top_k=None):
    """Probe side: the student's predictions, as they are (the judge checks their format)."""
    model, tokenizer = model_and_tokenizer(which)
    kwargs = {} if top_k is None else {"top_k": top_k}
    with torch.no_grad():
        return call(fn, model, tokenizer, text, name="fill_mask", forbidden=PIPELINE_CALLS,
                    forbidden_advice="do the fill-mask by hand (tokenize, find [MASK], softmax, top-k): "
                                     "pipeline('fill-mask') is what your answer is compared with.", **kwargs)


def format_cases(seeds):
    return [("tiny", "the puppy slept on the [MASK].", 3), ("tiny", "[MASK] is the capital of italy.", None),
            (seeds.seed(8711), "my rabbit likes to sleep on the [MASK].", 7)]


@probe
def fill_mask_format(seeds, fn):
    """The pipeline's format: top_k dicts (5 by default) with score, token, token_str, sequence."""
    return [_fill_mask(fn, *case) for case in format_cases(seeds)]


def pipeline_cases(seeds):
    return [("tiny", "paris is the capital of [MASK].", 4), ("tiny", "[MASK] comes after monday.", None),
            ("tiny", "we hear with our [MASK], and we see with our eyes.", 10),
            (seeds.seed(8712), "the dog barked at the [MASK] all night.", 6),
            (seeds.seed(8713), "[MASK] plays the violin.", 1)]


@probe
def fill_mask_matches_pipeline(seeds, fn):
    """Same tokens, same order, same strings, scores to 1e-5, on the tiny BERT and two random BERTs."""
    return [_fill_mask(fn, *case) for case in pipeline_cases(seeds)]


def sorted_cases(seeds):
    return [("tiny", "the kitten is lying on the [MASK]."), (seeds.seed(8714), "a baby sheep is called a [MASK].")]


@probe
def fill_mask_scores_are_sorted_probabilities(seeds, fn):
    """Scores fall from first to last, and over the whole vocabulary they sum to 1."""
    return [_fill_mask(fn, which, text, top_k=tiny_vocab_size()) for which, text in sorted_cases(seeds)]


# ---------------------------------------------------------------- exercise 5: top_k_accuracy
TOP_K_EXAMPLES = [
    ("berlin is the capital of [MASK].", "germany"), ("the capital of spain is [MASK].", "madrid"),
    ("the day after friday is [MASK].", "saturday"), ("three plus four is [MASK].", "seven"),
    ("the opposite of wet is [MASK].", "dry"), ("the bee lives in a [MASK].", "hive"),
    ("we smell with our [MASK].", "nose"), ("the [MASK] mooed loudly.", "cow"),
    ("a ripe lemon is [MASK].", "yellow"), ("the pilot works at the [MASK].", "airport"),
    ("people in poland speak [MASK].", "polish"), ("the cat sat on the [MASK].", "cat"),
    ("the month after march is [MASK].", "april"), ("grace plays the [MASK].", "flute"),
]


def _accuracy(fn, which, examples, k):
    model, tokenizer = model_and_tokenizer(which)
    with torch.no_grad():
        result = call(fn, model, tokenizer, examples, k, name="top_k_accuracy",
                      helpers={"fill_mask": reference_fill_mask})
    return _a_number(result, "top_k_accuracy should return a number between 0 and 1, but it returned a")


def accuracy_cases(seeds):
    # k = 5 and 4 on the tiny BERT: there, the right answer and each bug's answer all differ
    return [("tiny", TOP_K_EXAMPLES, 5), ("tiny", TOP_K_EXAMPLES, 4), ("tiny", TOP_K_EXAMPLES[::2], 10),
            (seeds.seed(8715), TOP_K_EXAMPLES, 300)]


@probe
def top_k_accuracy_values(seeds, fn):
    """Against an accuracy counted from pipeline('fill-mask'), for several k, on two models."""
    return [_accuracy(fn, which, examples, k) for which, examples, k in accuracy_cases(seeds)]


GROWING_K = (1, 2, 5, 20)


@probe
def top_k_accuracy_grows_with_k(seeds, fn):
    """Never falls as k grows; reaches 1 when k is the vocabulary size (every answer is a token)."""
    return ([_accuracy(fn, "tiny", TOP_K_EXAMPLES, k) for k in GROWING_K],
            _accuracy(fn, "tiny", TOP_K_EXAMPLES[:4], tiny_vocab_size()))


# ---------------------------------------------------------------- exercise 4: MaskedLMHead
HF_BERT = "transformers.models.bert.modeling_bert"


# transformers' heads answer the exercise outright, and so does the course's reference head (courselib.bert, which
# the hidden tests of exercise 6 build their models with); the encoder, courselib.bert.MiniBert, is the exercise's
# starting point.
HEAD_CALLS = [f"{HF_BERT}.BertOnlyMLMHead", f"{HF_BERT}.BertLMPredictionHead",
              f"{HF_BERT}.BertPredictionHeadTransform", f"{HF_BERT}.BertForMaskedLM", "courselib.bert.MaskedLMHead"]


HEAD_ADVICE = ("build the head yourself (dense, GELU, LayerNorm, tied decoder); transformers' BertForMaskedLM "
               "head is what your answer is compared with, not the answer.")


HEAD_NAMES = "dense (nn.Linear(d, d)), norm (a LayerNorm(d, eps)) and decoder (weight tied, own bias)"


# Widths (d) and vocabularies that the visible tests never use (16, 24 and 128 there).
HEAD_CASES = [dict(stream=8801, V=37, d=20, B=2, T=5, eps=1e-12), dict(stream=8802, V=23, d=12, B=3, T=4, eps=1e-6)]


def _head(MaskedLMHead, embedding, eps=None):
    kwargs = {} if eps is None else {"eps": eps}
    head = build(MaskedLMHead, embedding, name="MaskedLMHead(embeddings)", forbidden=HEAD_CALLS, advice=HEAD_ADVICE,
                 **kwargs).double()
    for path in ("dense", "norm", "decoder"):
        submodule(head, path, "MaskedLMHead", HEAD_NAMES)
    if getattr(head.decoder, "bias", None) is None:
        raise AssertionError("head.decoder has no bias: BERT's decoder adds its own bias, one score per token "
                             "(vocab_size,), on top of the tied weight (nn.Linear(d, vocab_size), bias=True).")
    return head


def head_weights(g, V, d):
    """The seeded weights of a case: embedding E (V, d), dense, norm, decoder bias. The dense weights are
    small, so that the LayerNorm's input has a small variance and its eps matters."""
    return {"embedding": torch.randn(V, d, generator=g, dtype=torch.float64),
            "dense.weight": 0.05 * torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d),
            "dense.bias": 0.01 * torch.randn(d, generator=g, dtype=torch.float64),
            "norm.weight": 1 + 0.3 * torch.randn(d, generator=g, dtype=torch.float64),
            "norm.bias": 0.3 * torch.randn(d, generator=g, dtype=torch.float64),
            "decoder.bias": torch.randn(V, generator=g, dtype=torch.float64)}


def _load_head(head, embedding, weights):
    """Probe side: the weights into the embedding (as loading the encoder does) and the head, by the names
    the exercise asks for. The decoder's weight comes with the embedding, if it is tied."""
    with torch.no_grad():
        embedding.weight.copy_(weights["embedding"])
        for name in ("dense.weight", "dense.bias", "norm.weight", "norm.bias", "decoder.bias"):
            module, _, attribute = name.rpartition(".")
            target = getattr(getattr(head, module), attribute, None)
            if not torch.is_tensor(target) or tuple(target.shape) != tuple(weights[name].shape):
                raise AssertionError(f"head.{name} should be a tensor of shape {tuple(weights[name].shape)}; the "
                                     f"exercise asks for {HEAD_NAMES}.")
            target.copy_(weights[name])


def head_case(seeds, case):
    g = seeds.generator(case["stream"])
    weights = head_weights(g, case["V"], case["d"])
    hidden = torch.randn(case["B"], case["T"], case["d"], generator=g, dtype=torch.float64)
    return weights, hidden


@probe
def masked_lm_head_structure(seeds, MaskedLMHead):
    """dense, norm, decoder; the decoder's weight IS the embedding matrix (tied) with its own bias; eps is
    passed on; a backward pass sends the decoder's gradient to the embedding matrix."""
    case = HEAD_CASES[0]
    from torch import nn
    embedding = nn.Embedding(case["V"], case["d"]).double()
    head = _head(MaskedLMHead, embedding)
    tied = head.decoder.weight is embedding.weight
    parameters = {id(p) for p in head.parameters()}
    weights, hidden = head_case(seeds, case)
    _load_head(head, embedding, weights)
    direction = torch.randn(case["B"], case["T"], case["V"], generator=seeds.generator(8803), dtype=torch.float64)
    logits = call(head, hidden, name="MaskedLMHead.forward", forbidden=HEAD_CALLS, forbidden_advice=HEAD_ADVICE)
    if not torch.is_tensor(logits):
        raise AssertionError(f"MaskedLMHead.forward should return a tensor of logits, not a {type(logits).__name__}.")
    if logits.requires_grad:
        call(lambda: (logits * direction).sum().backward(), name="loss.backward()")
    with torch.random.fork_rng(devices=[]):
        other = build(MaskedLMHead, nn.Embedding(case["V"], case["d"]), name="MaskedLMHead(embeddings, eps=1e-7)",
                      forbidden=HEAD_CALLS, advice=HEAD_ADVICE, eps=1e-7)
    eps = getattr(getattr(other, "norm", None), "eps", None)
    return {"tied": tied, "embedding_in_parameters": id(embedding.weight) in parameters,
            "bias_is_parameter": isinstance(head.decoder.bias, nn.Parameter) and id(head.decoder.bias) in parameters,
            "bias_is_weight": head.decoder.bias is embedding.weight, "shape": tuple(logits.shape),
            "eps": float(eps) if isinstance(eps, numbers.Real) else None, "gradient": embedding.weight.grad}


@probe
def masked_lm_head_values(seeds, MaskedLMHead):
    """Logits against transformers' BertOnlyMLMHead (float64) with seeded weights, loaded after the head is
    built (as a checkpoint is), on sizes and an eps the visible tests don't use."""
    from torch import nn
    results = []
    for case in HEAD_CASES:
        embedding = nn.Embedding(case["V"], case["d"]).double()
        head = _head(MaskedLMHead, embedding, eps=case["eps"])
        weights, hidden = head_case(seeds, case)
        _load_head(head, embedding, weights)
        results.append(run(head, hidden, name="MaskedLMHead.forward", forbidden=HEAD_CALLS, advice=HEAD_ADVICE))
    return results


def tiny_head_case(seeds):
    """Sentences from the tiny BERT's corpus, one ordinary token of each replaced by [MASK]."""
    from courselib.tiny_bert import corpus
    _, tokenizer = tiny_bert()
    batch = tokenizer(corpus(3, seed=seeds.seed(8811)), padding=True, return_tensors="pt")
    g = seeds.generator(8812)
    positions = []
    for row, mask in enumerate(batch["attention_mask"]):
        pieces = tokenizer.convert_ids_to_tokens(batch["input_ids"][row][:int(mask.sum())])
        # whole words only (not [CLS], the full stop or [SEP]), so that the decoded text tokenizes back alike
        words = [i for i in range(1, len(pieces) - 2)
                 if not pieces[i].startswith("##") and not pieces[i + 1].startswith("##")]
        position = words[int(torch.randint(len(words), (), generator=g))]
        batch["input_ids"][row, position] = tokenizer.mask_token_id
        positions.append(position)
    return batch, positions


@probe
def masked_lm_head_tiny_bert(seeds, MaskedLMHead):
    """The tiny BERT loaded into courselib's MiniBert and your head: BertForMaskedLM's logits (float32,
    1e-4) and pipeline('fill-mask')'s top 5 at each [MASK]."""
    from courselib.bert import load_hf_bert_weights, minibert_like
    model, _ = tiny_bert()
    batch, positions = tiny_head_case(seeds)
    with torch.random.fork_rng(devices=[]):
        encoder = minibert_like(model.config).eval()
    head = build(MaskedLMHead, encoder.token_embeddings, name="MaskedLMHead(encoder.token_embeddings)",
                 forbidden=HEAD_CALLS, advice=HEAD_ADVICE)
    for path in ("dense", "norm", "decoder"):
        submodule(head, path, "MaskedLMHead", HEAD_NAMES)
    load_hf_bert_weights(encoder, model)  # the encoder, embeddings included: a tied decoder follows
    predictions = model.cls.predictions
    with torch.no_grad():
        head.dense.weight.copy_(predictions.transform.dense.weight)
        head.dense.bias.copy_(predictions.transform.dense.bias)
        head.norm.weight.copy_(predictions.transform.LayerNorm.weight)
        head.norm.bias.copy_(predictions.transform.LayerNorm.bias)
        head.decoder.bias.copy_(predictions.bias)
        hidden = encoder(batch["input_ids"], batch["attention_mask"])
    logits = run(head, hidden, name="MaskedLMHead.forward", forbidden=HEAD_CALLS, advice=HEAD_ADVICE)
    return logits[torch.arange(len(positions)), torch.tensor(positions)]  # (3, V), at the masks


# ---------------------------------------------------------------- random masked LMs (exercises 6 and 7)
def random_mlm(seed, vocab_size, initializer_range):
    """A small random BertForMaskedLM in float64 (eager attention, no dropout), its weights from `seed` alone, so
    that the probe and the judge build the same one; random LayerNorms and output bias, so that every one of them
    is used."""
    from transformers import BertForMaskedLM

    from courselib.tiny_bert import tiny_config
    with quiet(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = tiny_config(vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=32, initializer_range=initializer_range,
                             attn_implementation="eager")
        model = BertForMaskedLM(config).double().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "LayerNorm" in name or name == "cls.predictions.bias":
                    param.add_(0.3 * torch.randn_like(param))
    return model


# ---------------------------------------------------------------- exercise 6: mlm_step
STEP_VOCAB = 60


# What would do the step's work for it: the collator's masking, transformers' BERT (whose own loss is the oracle),
# the course's export to it, and the course's whole pre-training loop.
STEP_SHORTCUTS = [MASK_TOKENS_CALLS[0], f"{HF_BERT}.BertForMaskedLM", "courselib.bert.to_hf_bert_for_masked_lm",
                  "courselib.tiny_bert.pretrain"]


STEP_ADVICE = ("write the step yourself with your mask_tokens and mlm_loss; transformers' BertForMaskedLM, trained on "
               "the same weights, is what your step is compared with.")


# The optimiser, learning rate, clipping and the order in which the batches come (a batch that comes back must be
# masked afresh). SGD shows clipping directly; AdamW is what pre-training uses.
STEP_CASES = [dict(stream=8951, optimizer="SGD", lr=0.05, max_grad_norm=0.5, order=(0, 1, 0, 1)),
              dict(stream=8955, optimizer="AdamW", lr=0.02, max_grad_norm=1.0, order=(0, 0, 0))]


# Behaviour: one batch three times (fresh masks, the tie kept); a step at lr 0 twice (no accumulation); a step
# of SGD at lr 1 with a tiny max_grad_norm (the update IS the clipped gradient).
FRESH_CASE = dict(stream=8961, optimizer="SGD", lr=0.05, max_grad_norm=1.0, order=(0, 0, 0))
FROZEN_CASE = dict(stream=8965, optimizer="SGD", lr=0.0, max_grad_norm=1.0, order=(0,))
CLIP_CASE = dict(stream=8969, optimizer="SGD", lr=1.0, max_grad_norm=1e-3, order=(1,))


def step_batches(seeds, stream):
    """Two padded batches of 8 rows, [CLS] ... [SEP] [PAD]..., ids 5.. for words: dicts of input_ids,
    attention_mask and special_tokens_mask, (8, T) long tensors, as a tokenizer gives them. About 80 words per
    batch, so that mask_tokens always selects some."""
    g = seeds.generator(stream)
    batches = []
    for _ in range(2):
        words = torch.randint(8, 13, (8,), generator=g)                   # words per row
        length = int(words.max()) + 2
        input_ids = torch.randint(5, STEP_VOCAB, (8, length), generator=g)
        position = torch.arange(length)[None, :]
        input_ids[:, 0] = 2                                                # [CLS]
        input_ids[position == words[:, None] + 1] = 3                      # [SEP]
        input_ids[position > words[:, None] + 1] = 0                       # [PAD]
        special = (input_ids == 0) | (input_ids == 2) | (input_ids == 3)
        batches.append({"input_ids": input_ids, "attention_mask": (input_ids != 0).long(),
                        "special_tokens_mask": special.long()})
    return batches


def step_case(seeds, case):
    """A case's random BertForMaskedLM, its batches, and the seed of the generator the masks are drawn from.

    BertModel's word embeddings have a padding row ([PAD], id 0) whose input-side gradient it zeroes; the course's
    MiniBert has none, so a [PAD] id drawn as one of mask_tokens' random replacements is trained like any token.
    The oracle model drops the padding row (its weights stay as they are) so that both train alike."""
    model = random_mlm(seeds.seed(case["stream"]), STEP_VOCAB, 0.2)
    model.bert.embeddings.word_embeddings.padding_idx = None
    return model, step_batches(seeds, case["stream"] + 1), seeds.seed(case["stream"] + 2)


def step_optimizer(case, parameters):
    """The case's optimiser (torch's own, default settings apart from the learning rate)."""
    return getattr(torch.optim, case["optimizer"])(parameters, lr=case["lr"])


def _step_model(hf_mlm):
    """Probe side: hf_mlm's weights in courselib's MiniBertForMaskedLM (the encoder and the reference head, tied),
    in train mode: the model the student's step trains."""
    from courselib.bert import MiniBertForMaskedLM, load_hf_masked_lm_weights, minibert_like
    with torch.random.fork_rng(devices=[]):
        model = MiniBertForMaskedLM(minibert_like(hf_mlm.config)).double()
    return load_hf_masked_lm_weights(model, hf_mlm).train()


def _plain(value):
    """A tensor the student returned, without its graph (the judge says what a float would have been)."""
    return value.detach() if type(value) in (torch.Tensor, torch.nn.Parameter) else value


class _Steps:
    """The student's mlm_step, once per batch of `order`, as ONE call of `call` (in the student's namespace, so that
    the reference mask_tokens and mlm_loss are swapped in), reading what the judge needs before it returns: the
    losses, the input_ids the model read at each step, the gradients left after each step, the tie, the
    parameters."""

    def __init__(self, fn, model, optimizer, batches, order, generator, max_grad_norm):
        self.fn, self.model, self.optimizer, self.batches = fn, model, optimizer, batches
        self.order, self.generator, self.max_grad_norm = order, generator, max_grad_norm
        if hasattr(fn, "__globals__"):
            self.__globals__ = fn.__globals__

    def __call__(self):
        model, seen = self.model, []

        def record(module, args, kwargs):
            ids = args[0] if args else kwargs.get("input_ids")
            seen.append(ids.detach().clone() if torch.is_tensor(ids) else None)

        hook = model.register_forward_pre_hook(record, with_kwargs=True)
        losses, gradients = [], []
        try:
            for index in self.order:
                generator = self.generator() if callable(self.generator) else self.generator
                losses.append(_plain(self.fn(model, self.optimizer, self.batches[index], MASK_ID, STEP_VOCAB,
                                             generator=generator, max_grad_norm=self.max_grad_norm)))
                gradients.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
        finally:
            hook.remove()
        decoder = getattr(model.head, "decoder", None)
        return {"losses": losses, "inputs": seen, "gradients": gradients,
                "tied": getattr(decoder, "weight", None) is model.bert.token_embeddings.weight,
                "state": {name: p.detach().clone() for name, p in model.named_parameters()}}


def _run_steps(fn, seeds, case, fresh_generator_each_step=False):
    """Probe side: the student's steps on one case, with the reference mask_tokens and mlm_loss swapped in."""
    from courselib import bert as reference
    hf_mlm, batches, mask_seed = step_case(seeds, case)
    model = _step_model(hf_mlm)
    optimizer = step_optimizer(case, model.parameters())
    generator = ((lambda: torch.Generator().manual_seed(mask_seed)) if fresh_generator_each_step
                 else torch.Generator().manual_seed(mask_seed))
    parameters = list(model.parameters())   # the optimiser's, even if the step replaced one of them
    before = [p.detach().clone() for p in parameters]
    data = call(_Steps(fn, model, optimizer, batches, case["order"], generator, case["max_grad_norm"]),
                name="mlm_step", helpers={"mask_tokens": reference.mask_tokens, "mlm_loss": reference.mlm_loss},
                forbidden=STEP_SHORTCUTS, forbidden_advice=STEP_ADVICE)
    data["moved"] = [float((p.detach() - q).norm()) for p, q in zip(parameters, before)]   # each one's change
    return data


@probe
def mlm_step_values(seeds, fn):
    """Losses and parameters after a few steps (SGD with active clipping, then AdamW) of the student's step on a
    random BERT, against transformers' BertForMaskedLM trained on the same weights and the same masks."""
    return [_run_steps(fn, seeds, case) for case in STEP_CASES]


@probe
def mlm_step_behaviour(seeds, fn):
    """A batch that comes back is masked afresh, from the generator passed in; the tie survives the steps; gradients
    do not pile up from step to step; the update of SGD at lr 1 is the gradient clipped to max_grad_norm."""
    return {"fresh": _run_steps(fn, seeds, FRESH_CASE),
            "frozen": _run_steps(fn, seeds, {**FROZEN_CASE, "order": (0, 0)}, fresh_generator_each_step=True),
            "clip": _run_steps(fn, seeds, CLIP_CASE)}


# ---------------------------------------------------------------- exercise 7 (optional stretch): pseudo_log_likelihood
PLL_VOCAB = 50


PLL_CASES = [(8901, 9, "a 0/1 integer tensor"), (8902, 13, "a bool tensor")]  # (stream, T, special mask form)


def pll_bert(seed):
    """A small random BertForMaskedLM in float64: a wide initialisation makes its predictions peaked, so that each
    known mistake gives a clearly different score."""
    return random_mlm(seed, PLL_VOCAB, 0.5)


def pll_sentence(seeds, stream, length, form):
    """A random model's sentence: (model, input_ids (T,), mask id, special_tokens_mask (T,)), with [CLS],
    [SEP] and [MASK] at seeded ids (never the tiny BERT's 2, 3 and 4)."""
    g = seeds.generator(stream)
    cls_id, sep_id, mask_id = (5 + torch.randperm(PLL_VOCAB - 5, generator=g)[:3]).tolist()
    ordinary = torch.tensor([i for i in range(PLL_VOCAB) if i not in (cls_id, sep_id, mask_id)])
    words = ordinary[torch.randint(len(ordinary), (length - 2,), generator=g)]
    input_ids = torch.cat([torch.tensor([cls_id]), words, torch.tensor([sep_id])])
    special = torch.zeros(length, dtype=torch.long)
    special[0] = special[-1] = 1
    if form == "a bool tensor":
        special = special.bool()
    return pll_bert(seeds.seed(stream)), input_ids, mask_id, special


def pll_tiny_sentence(seeds):
    from courselib.tiny_bert import corpus
    model, tokenizer = tiny_bert()
    encoded = tokenizer(corpus(1, seed=seeds.seed(8903))[0], return_special_tokens_mask=True, return_tensors="pt")
    return model, encoded["input_ids"][0], tokenizer.mask_token_id, encoded["special_tokens_mask"][0]


def _pll(fn, model, input_ids, mask_id, special):
    value = call(fn, model, input_ids.clone(), mask_id, special.clone(), name="pseudo_log_likelihood")
    return _a_number(value, "pseudo_log_likelihood should return a Python float (.item()), not a")


@probe
def stretch_pseudo_log_likelihood_values(seeds, fn):
    """Against the definition computed one masked copy at a time: two random float64 BERTs whose [CLS], [SEP]
    and [MASK] sit at other ids (one special mask of 0/1 integers, one of bools), then the tiny BERT."""
    values = [_pll(fn, *pll_sentence(seeds, *case)) for case in PLL_CASES]
    return values + [_pll(fn, *pll_tiny_sentence(seeds))]


class CountingCalls(torch.nn.Module):
    """Probe side: the model, keeping every batch of ids it is called with."""

    def __init__(self, model):
        super().__init__()
        self.model, self.batches = model, []

    def forward(self, input_ids=None, *args, **kwargs):
        self.batches.append(input_ids.detach().clone() if torch.is_tensor(input_ids) else None)
        return self.model(input_ids, *args, **kwargs)


ONE_PASS_CASE = (8904, 11, "a 0/1 integer tensor")


@probe
def stretch_pseudo_log_likelihood_one_pass(seeds, fn):
    """The model is called once, on a batch of one copy per non-special position, each with only that position
    masked."""
    model, input_ids, mask_id, special = pll_sentence(seeds, *ONE_PASS_CASE)
    counting = CountingCalls(model)
    _pll(fn, counting, input_ids, mask_id, special)
    return counting.batches


# ---------------------------------------------------------------- warming up the judges
def warm_up():
    """What the judges need first: transformers, the tiny BERT and its pipeline (seconds to load)."""
    from transformers import BertForMaskedLM, BertTokenizerFast  # noqa: F401 (random_bert's)
    fill_mask_pipeline(*tiny_bert())


# The grader imports the check modules in a background thread while the kernel runs
# (autograder/judging.py, load_checks_in_background): load what the judges need then, not after the notebook.
# In the kernel, this module is imported by a test cell on the main thread, and loads nothing more.
if threading.current_thread().name == "load-hidden-checks":
    try:
        warm_up()
    except Exception:  # a judge that needs it will say what is wrong
        pass
