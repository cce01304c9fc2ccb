"""Hidden checks for 08_bert_fill_mask. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded inputs, call the student's code, return
what it produced) and a judge (in the grader: rebuild the same inputs, run the oracle, compare, name
the misconception). Layered as the course's tests are: shape and format first, then values on
seeded inputs against independent oracles (`torch.nn.functional.cross_entropy`, `BertForMaskedLM`'s
own loss and head, `pipeline("fill-mask")`, all run by the judges), then behaviour (rates measured over
tens of thousands of tokens, special tokens, generators, gradients, ordering, the tiny BERT rebuilt from
courselib's MiniBert and the learner's head, the optional pseudo-log-likelihood against its definition
computed one masked copy at a time, and its single forward pass). The models here are the
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

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import (build, call, expect_close, expect_shape, expect_tensor, probe, quiet, run,
                                      submodule)

MASK_ID = 4  # the id of [MASK] in the synthetic problems below (ids 0-4 play the special tokens)
# What answers an exercise outright: refused and flagged when the student's code reaches it.
MASK_TOKENS_CALLS = ["transformers.data.data_collator.DataCollatorForLanguageModeling.torch_mask_tokens"]
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


@functools.lru_cache(maxsize=None)
def oracle_fill_mask(which, text, top_k):
    """Judge side: pipeline("fill-mask")'s answer, as a tuple of its dicts."""
    with quiet(), torch.no_grad():
        return tuple(fill_mask_pipeline(*model_and_tokenizer(which))(text, top_k=top_k))


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


def _pair(result, shape):
    """Judge side: the (inputs, labels) a probe sent, as integer tensors of the input's shape."""
    inputs, labels = result
    for name, value in (("inputs", inputs), ("labels", labels)):
        expect_shape(expect_tensor(value, name), shape, name, "inputs and labels have the shape of input_ids.")
    return inputs.long(), labels.long()


def ordinary_ids(g, shape, vocab_size):
    """Token ids that are never special: 5..vocab_size-1."""
    return torch.randint(5, vocab_size, shape, generator=g)


def labels_case(seeds):
    return ordinary_ids(seeds.generator(8101), (6, 70), 300)


@probe
def mask_tokens_labels(seeds, fn):
    """Labels: the original id where a token is selected, -100 everywhere else; nothing else changes."""
    return _mask_tokens(fn, labels_case(seeds), 300, generator=seeds.generator(8102))


@mask_tokens_labels.judge
def judge_mask_tokens_labels(seeds, result):
    input_ids = labels_case(seeds)
    inputs, labels = _pair(result, input_ids.shape)
    if torch.equal(labels, input_ids):
        raise AssertionError("labels equal input_ids everywhere: labels must be -100 where nothing is predicted "
                             "(the ~85% of tokens that were not selected), so that the loss ignores them.")
    if (labels == 0).float().mean() > 0.5 and not (labels == -100).any():
        raise AssertionError("labels are 0 where nothing is predicted: use -100, the ignore_index of "
                             "cross_entropy. 0 is a real token id ([PAD]).")
    selected = labels != -100
    if not selected.any():
        raise AssertionError("every label is -100: no token was selected for prediction.")
    if not torch.equal(labels[selected], input_ids[selected]):
        if torch.equal(labels[selected], inputs[selected]):
            raise AssertionError("labels hold the corrupted inputs ([MASK] or the random token): the label "
                                 "is the original token, the one the model must recover.")
        raise AssertionError("where a label isn't -100 it must be the original token, input_ids at that position.")
    if not torch.equal(inputs[~selected], input_ids[~selected]):
        raise AssertionError("inputs changed at positions whose label is -100: only selected tokens are "
                             "corrupted, and every corrupted token must be predicted (have a label).")


def _rates(input_ids, inputs, labels):
    selected = labels != -100
    n_selected = int(selected.sum())
    masked = (inputs == MASK_ID) & selected
    kept = (inputs == input_ids) & selected
    randomised = selected & ~masked & ~kept
    return (n_selected / input_ids.numel(), masked.sum().item() / max(n_selected, 1),
            randomised.sum().item() / max(n_selected, 1), kept.sum().item() / max(n_selected, 1))


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


@mask_tokens_rates.judge
def judge_mask_tokens_rates(seeds, results):
    default, higher = rates_cases(seeds)
    inputs, labels = _pair(results[0], default.shape)
    rate, to_mask, to_random, unchanged = _rates(default, inputs, labels)
    summary = (f"You selected {rate:.1%} of the tokens; of those {to_mask:.1%} became [MASK], "
               f"{to_random:.1%} a random token and {unchanged:.1%} stayed unchanged.")
    if abs(rate - 0.15) > 0.012:
        raise AssertionError(f"{summary} BERT selects each token with probability mlm_probability=0.15, "
                             "and only the selected ones get labels.")
    if abs(to_mask - 0.1) < 0.03 and abs(unchanged - 0.8) < 0.03:
        raise AssertionError(f"{summary} That is 80/10/10 done as 10/10/80: 80% of the selected tokens must "
                             "become [MASK], 10% a random token, and only 10% stay unchanged.")
    if abs(to_mask - 0.8) > 0.03 or abs(to_random - 0.1) > 0.025 or abs(unchanged - 0.1) > 0.025:
        hint = ""
        if abs(to_mask - 0.72) < 0.03 and abs(unchanged - 0.18) < 0.03:
            hint = (" Your random replacement also overwrote tokens already set to [MASK]: choose the random "
                    "10% among the selected tokens that were NOT masked (half of the remaining 20%).")
        raise AssertionError(f"{summary} The 80/10/10 rule: 80% [MASK], 10% random, 10% unchanged.{hint}")
    # the random replacements are drawn from the whole vocabulary
    changed = (labels != -100) & (inputs != MASK_ID) & (inputs != default)
    drawn = inputs[changed]
    if drawn.numel() and (drawn.min() < 0 or drawn.max() >= RATES_VOCAB):
        raise AssertionError("a random replacement is outside 0..vocab_size-1.")
    if drawn.numel() > 100 and drawn.unique().numel() < 0.5 * min(drawn.numel(), RATES_VOCAB):
        raise AssertionError(f"your {drawn.numel()} random replacements use only {drawn.unique().numel()} distinct "
                             "tokens: draw each one uniformly from the whole vocabulary, 0..vocab_size-1.")
    # another mlm_probability
    inputs, labels = _pair(results[1], higher.shape)
    rate, to_mask, _, _ = _rates(higher, inputs, labels)
    if abs(rate - 0.4) > 0.02:
        raise AssertionError(f"with mlm_probability=0.4 you selected {rate:.1%} of the tokens: use the "
                             "mlm_probability argument, not a hard-coded 0.15.")
    if abs(to_mask - 0.8) > 0.03:
        raise AssertionError(f"with mlm_probability=0.4, {to_mask:.1%} of the selected tokens became [MASK]; "
                             "it should still be 80%.")


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


MASK_FORMS = ("a 0/1 integer tensor", "a bool tensor")


@probe
def mask_tokens_special_tokens(seeds, fn):
    """Special tokens ([CLS], [SEP], [PAD]) are never selected, whether the mask is 0/1 or bool."""
    input_ids, special = special_case(seeds)
    return [_mask_tokens(fn, input_ids, SPECIAL_VOCAB, special_tokens_mask=mask, mlm_probability=0.6,
                         generator=seeds.generator(8302)) for mask in (special.long(), special)]


@mask_tokens_special_tokens.judge
def judge_mask_tokens_special_tokens(seeds, results):
    input_ids, special = special_case(seeds)
    for description, result in zip(MASK_FORMS, results):
        inputs, labels = _pair(result, input_ids.shape)
        if (labels[special] != -100).any() or not torch.equal(inputs[special], input_ids[special]):
            count = int(((labels != -100) & special).sum())
            raise AssertionError(f"with special_tokens_mask given as {description}, {count} special tokens "
                                 "([CLS], [SEP], [PAD]) were selected. They must never be masked or predicted: "
                                 "set their selection probability to 0 (convert the mask with .bool()).")
        ordinary_rate = ((labels != -100) & ~special).sum().item() / (~special).sum().item()
        if abs(ordinary_rate - 0.6) > 0.05:
            raise AssertionError(f"with special tokens present, {ordinary_rate:.1%} of the ordinary tokens were "
                                 "selected, expected mlm_probability = 60%: select every ordinary token with "
                                 "probability mlm_probability, and no special one.")


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


@mask_tokens_generator.judge
def judge_mask_tokens_generator(seeds, results):
    shape = (8, 128)
    pairs = {name: _pair(result, shape) for name, result in results.items()}
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(pairs[a], pairs[b]))  # noqa: E731
    if not same("first", "second"):
        raise AssertionError("two calls with generators seeded alike gave different results: draw every random "
                             "number from `generator` (torch.rand(..., generator=generator), "
                             "torch.randint(..., generator=generator)), not from the global RNG.")
    if torch.equal(pairs["first"][1], pairs["other"][1]):
        raise AssertionError("generators with different seeds selected the same tokens: the selection must be random.")
    if not same("default_a", "default_b"):
        raise AssertionError("with generator=None, mask_tokens should use torch's global RNG, so that "
                             "torch.manual_seed makes it reproducible.")


# ---------------------------------------------------------------- exercise 2: mlm_loss
def _mlm_loss(fn, logits, labels):
    result = call(fn, logits, labels, name="mlm_loss")
    if not torch.is_tensor(result):
        raise AssertionError(f"mlm_loss should return a torch tensor (a scalar you can call .backward() on), "
                             f"but it returned a {type(result).__name__}. Don't call .item().")
    return result


def _scalar(loss):
    """Judge side: the loss a probe sent, checked to be one number."""
    expect_shape(expect_tensor(loss, "the loss"), (), "the loss",
                 "mlm_loss returns one number for the whole batch: a 0-dim tensor.")
    return loss


def mlm_problem(g, batch, length, vocab, predicted=0.3, dtype=torch.float64):
    logits = torch.randn(batch, length, vocab, generator=g, dtype=dtype) * 3
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[torch.rand(batch, length, generator=g) > predicted] = -100
    labels[:, 0] = 1  # every sequence predicts at least one token; how many more varies
    return logits, labels


def loss_diagnoses(logits, labels):
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    per_token = F.cross_entropy(flat_logits, flat_labels, reduction="none")  # 0 where ignored
    predicted = flat_labels != -100
    by_sequence = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # (B, T)
    counts = (labels != -100).sum(dim=1)
    return {
        "you averaged over every position, ignored ones included: divide by the number of predicted "
        "tokens (labels != -100) only.": per_token.mean(),
        "you summed the losses: take their mean over the predicted tokens.": per_token.sum(),
        "you averaged each sequence first, then the sequences: each predicted token must count once, "
        "whichever sequence it is in.": (by_sequence.sum(dim=1)[counts > 0] / counts[counts > 0]).mean(),
        "you took -logit of the right token without the log-softmax: cross-entropy is "
        "-log softmax(logits)[label].": -flat_logits[predicted].gather(1, flat_labels[predicted, None]).mean(),
    }


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


@mlm_loss_values.judge
def judge_mlm_loss_values(seeds, data):
    losses, tiny_loss = data
    for (stream, shape), loss in zip(LOSS_CASES, losses):
        logits, labels = mlm_problem(seeds.generator(stream), *shape)
        expected = F.cross_entropy(logits.reshape(-1, shape[-1]), labels.reshape(-1), ignore_index=-100)
        expect_close(_scalar(loss), expected, "mlm_loss", diagnoses=loss_diagnoses(logits, labels),
                     hint="The MLM loss is the mean of -log softmax(logits)[label] over the tokens whose "
                          "label isn't -100.")
    model, batch, labels = tiny_loss_case(seeds)
    with torch.no_grad(), quiet():
        output = model(**batch, labels=labels)
    expect_close(_scalar(tiny_loss), output.loss, "mlm_loss on BertForMaskedLM's logits",
                 "BertForMaskedLM(..., labels=labels).loss is the reference: cross-entropy over the "
                 "predicted positions only.", atol=1e-5)


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


@mlm_loss_ignores_positions.judge
def judge_mlm_loss_ignores_positions(seeds, data):
    _, labels, _ = ignores_case(seeds)
    loss, noisy_loss = _scalar(data["loss"]), _scalar(data["noisy_loss"])
    if not math.isclose(float(noisy_loss), float(loss), rel_tol=1e-9, abs_tol=1e-9):
        raise AssertionError("changing the logits where labels are -100 changed the loss: positions that are not "
                             "predicted must not count at all.")
    if data["requires_grad"] is not True:
        raise AssertionError("loss.requires_grad is False: compute the loss with torch operations on the logits "
                             "(no .item(), .detach() or NumPy), so that training can call loss.backward().")
    ignored = labels == -100
    gradient = data["gradient"]
    if gradient is None or expect_tensor(gradient, "the gradient").shape != labels.shape + (11,) \
            or gradient[ignored].abs().max() > 0:
        raise AssertionError("the ignored positions received a gradient: they must not take part in the loss.")
    if gradient[~ignored].abs().sum(dim=-1).min() == 0:
        raise AssertionError("some predicted position received no gradient: every token whose label isn't -100 "
                             "must count in the loss.")


# ---------------------------------------------------------------- exercise 3: fill_mask
def _fill_mask(fn, which, text, top_k=None):
    """Probe side: the student's predictions, as they are (the judge checks their format)."""
    model, tokenizer = model_and_tokenizer(which)
    kwargs = {} if top_k is None else {"top_k": top_k}
    with torch.no_grad():
        return call(fn, model, tokenizer, text, name="fill_mask", forbidden=PIPELINE_CALLS,
                    forbidden_advice="do the fill-mask by hand (tokenize, find [MASK], softmax, top-k): "
                                     "pipeline('fill-mask') is what your answer is compared with.", **kwargs)


def _check_format(result, text, top_k=None):
    """Judge side: top_k dicts (5 by default) with score, token, token_str and sequence, as the pipeline gives."""
    expected_length = 5 if top_k is None else top_k
    if not isinstance(result, list):
        raise AssertionError(f"fill_mask should return a list of dicts, like pipeline('fill-mask'), "
                             f"but it returned a {type(result).__name__}.")
    if len(result) != expected_length:
        raise AssertionError(f"fill_mask(..., {text!r}{'' if top_k is None else f', top_k={top_k}'}) returned "
                             f"{len(result)} predictions, expected {expected_length}"
                             + (" (top_k defaults to 5)." if top_k is None else "."))
    for entry in result:
        if not isinstance(entry, dict) or set(entry) != {"score", "token", "token_str", "sequence"}:
            found = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise AssertionError(f"each prediction is a dict with exactly the keys score, token, token_str and "
                                 f"sequence, as pipeline('fill-mask') returns; found {found}.")
        if torch.is_tensor(entry["score"]) or torch.is_tensor(entry["token"]):
            raise AssertionError("score and token are tensors: return plain Python numbers, as the pipeline "
                                 "does (.item() or .tolist()).")
        if not isinstance(entry["token"], numbers.Integral) or not isinstance(entry["score"], numbers.Real):
            raise AssertionError(f"token should be an int and score a float; found {type(entry['token']).__name__} "
                                 f"and {type(entry['score']).__name__}.")
        if not isinstance(entry["token_str"], str) or not isinstance(entry["sequence"], str):
            raise AssertionError("token_str and sequence should be strings (tokenizer.decode).")
    return result


def format_cases(seeds):
    return [("tiny", "the puppy slept on the [MASK].", 3), ("tiny", "[MASK] is the capital of italy.", None),
            (seeds.seed(8711), "my rabbit likes to sleep on the [MASK].", 7)]


@probe
def fill_mask_format(seeds, fn):
    """The pipeline's format: top_k dicts (5 by default) with score, token, token_str, sequence."""
    return [_fill_mask(fn, *case) for case in format_cases(seeds)]


@fill_mask_format.judge
def judge_fill_mask_format(seeds, results):
    for (_, text, top_k), result in zip(format_cases(seeds), results):
        _check_format(result, text, top_k)


def fill_mask_diagnoses(which, text, top_k):
    """(tokens, scores) that known bugs would return, keyed by the misconception."""
    model, tokenizer = model_and_tokenizer(which)
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad(), quiet():
        logits = model(**encoded).logits[0]                      # (T, V)
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0])
    wrong = {}

    def top(scores):
        values, ids = scores.topk(top_k)
        return ids.tolist(), values.tolist()

    wrong["your scores are a softmax over the sequence axis (the positions); the softmax must run over the "
          "vocabulary: logits[0, mask_position].softmax(dim=-1)."] = top(logits.softmax(dim=0)[position])
    wrong["your scores are raw logits: apply a softmax over the vocabulary to get probabilities."] = top(
        logits[position])
    wrong["your scores are log-probabilities: the pipeline's score is the probability itself (softmax, "
          "not log_softmax)."] = top(logits[position].log_softmax(dim=-1))
    for shift in (-1, 1):
        wrong[f"you read the logits at position {position + shift} instead of the [MASK]'s {position}: find it "
              "in the tokenized input_ids (which start with [CLS]), not in the words of the text."] = top(
            logits[position + shift].softmax(dim=-1))
    return wrong


def pipeline_cases(seeds):
    return [("tiny", "paris is the capital of [MASK].", 4), ("tiny", "[MASK] comes after monday.", None),
            ("tiny", "we hear with our [MASK], and we see with our eyes.", 10),
            (seeds.seed(8712), "the dog barked at the [MASK] all night.", 6),
            (seeds.seed(8713), "[MASK] plays the violin.", 1)]


@probe
def fill_mask_matches_pipeline(seeds, fn):
    """Same tokens, same order, same strings, scores to 1e-5, on the tiny BERT and two random BERTs."""
    return [_fill_mask(fn, *case) for case in pipeline_cases(seeds)]


@fill_mask_matches_pipeline.judge
def judge_fill_mask_matches_pipeline(seeds, results):
    for (which, text, top_k), result in zip(pipeline_cases(seeds), results):
        _check_format(result, text, top_k)
        expected = oracle_fill_mask(which, text, 5 if top_k is None else top_k)
        where = f"for {text!r}" + ("" if which == "tiny" else " (on a small random BERT whose [MASK] id is "
                                                            f"{model_and_tokenizer(which)[1].mask_token_id})")
        tokens = [int(entry["token"]) for entry in result]
        scores = [float(entry["score"]) for entry in result]
        expected_tokens = [entry["token"] for entry in expected]
        diagnoses = fill_mask_diagnoses(which, text, len(tokens))
        for misconception, (wrong_tokens, wrong_scores) in diagnoses.items():
            if tokens == wrong_tokens and np.allclose(scores, wrong_scores, atol=1e-5, rtol=1e-4):
                raise AssertionError(f"fill_mask {where}: {misconception}")
        if tokens != expected_tokens:
            if sorted(tokens) == sorted(expected_tokens):
                raise AssertionError(f"fill_mask {where} found the right {len(tokens)} tokens but in the wrong "
                                     "order: sort them by score, highest first, as torch.topk does.")
            raise AssertionError(f"fill_mask {where} predicted the token ids {tokens}; pipeline('fill-mask') "
                                 f"gives {expected_tokens}. Take the logits at the [MASK] position, a softmax "
                                 "over the vocabulary, then the top-k.")
        expect_close(scores, [entry["score"] for entry in expected], f"the scores {where}",
                     "score is the softmax probability over the vocabulary at the [MASK] position.",
                     rtol=0, atol=1e-5)
        for got, want in zip(result, expected):
            if got["token_str"] != want["token_str"]:
                raise AssertionError(f"token_str {where} is {got['token_str']!r}, the pipeline gives "
                                     f"{want['token_str']!r}: use tokenizer.decode([token]).")
            if got["sequence"] != want["sequence"]:
                raise AssertionError(f"sequence {where} is {got['sequence']!r}, the pipeline gives "
                                     f"{want['sequence']!r}: put the token at the [MASK] position of input_ids and "
                                     "decode them with skip_special_tokens=True.")


def sorted_cases(seeds):
    return [("tiny", "the kitten is lying on the [MASK]."), (seeds.seed(8714), "a baby sheep is called a [MASK].")]


@probe
def fill_mask_scores_are_sorted_probabilities(seeds, fn):
    """Scores fall from first to last, and over the whole vocabulary they sum to 1."""
    return [_fill_mask(fn, which, text, top_k=tiny_vocab_size()) for which, text in sorted_cases(seeds)]


@fill_mask_scores_are_sorted_probabilities.judge
def judge_fill_mask_scores_are_sorted_probabilities(seeds, results):
    vocab_size = tiny_vocab_size()  # the random BERTs share the tiny BERT's vocabulary
    for (_, text), result in zip(sorted_cases(seeds), results):
        _check_format(result, text, vocab_size)
        scores = np.array([float(entry["score"]) for entry in result])
        if np.any(np.diff(scores) > 1e-9):
            raise AssertionError(f"the scores for {text!r} are not sorted: the predictions must come highest score "
                                 "first (torch.topk sorts them; argsort sorts lowest first).")
        if np.any(scores < 0) or abs(scores.sum() - 1) > 1e-4:
            raise AssertionError(f"over all {vocab_size} tokens your scores sum to {scores.sum():.4g}: they must be "
                                 "probabilities over the vocabulary, a softmax over the last axis, summing to 1.")
        if sorted(int(entry["token"]) for entry in result) != list(range(vocab_size)):
            raise AssertionError("with top_k equal to the vocabulary size, every token id should appear once.")


# ---------------------------------------------------------------- exercise 4: top_k_accuracy
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


def ranked(which, text, cases):
    """Judge side: the pipeline's predictions for `text`, best first, as many as the largest k any case asks
    of this model. One call serves every k: its top K predictions begin with its top k (torch.topk sorts)."""
    deepest = max(k for model, examples, k in cases if model == which and any(t == text for t, _ in examples))
    return oracle_fill_mask(which, text, deepest)


def _hits(which, examples, k, cases, where="token_str"):
    """For each example, is the answer among the pipeline's k best token_str (or inside one of their
    filled-in sequences)?"""
    hits = []
    for text, answer in examples:
        top = ranked(which, text, cases)[:k]
        hits.append(answer in [entry["token_str"] for entry in top] if where == "token_str"
                    else any(answer in entry["sequence"] for entry in top))
    return hits


def accuracy_diagnoses(which, examples, k, cases):
    fraction = lambda kk: sum(_hits(which, examples, kk, cases)) / len(examples)  # noqa: E731
    return {
        "you returned the number of hits; the accuracy is the fraction of examples, hits / len(examples).":
            sum(_hits(which, examples, k, cases)),
        "your accuracy ignores k and only checks the top prediction: an example counts when the answer is "
        "anywhere among the k best tokens.": fraction(1),
        f"your accuracy looks at the top {k - 1} predictions instead of the top {k}: an off-by-one in the "
        "slice?": fraction(max(k - 1, 1)) if k > 1 else -1.0,
        "you checked whether the answer appears anywhere in the filled-in sentence: compare it with the "
        "predicted token_str itself (the answer may already be elsewhere in the sentence).":
            sum(_hits(which, examples, k, cases, where="sequence")) / len(examples),
    }


@probe
def top_k_accuracy_values(seeds, fn):
    """Against an accuracy counted from pipeline('fill-mask'), for several k, on two models."""
    return [_accuracy(fn, which, examples, k) for which, examples, k in accuracy_cases(seeds)]


@top_k_accuracy_values.judge
def judge_top_k_accuracy_values(seeds, values):
    cases = accuracy_cases(seeds)
    for (which, examples, k), value in zip(cases, values):
        expected = sum(_hits(which, examples, k, cases)) / len(examples)
        candidates = accuracy_diagnoses(which, examples, k, cases)
        wrong = list(candidates.values())
        # a misconception is named only if its answer differs from the right one and from the others'
        diagnoses = {m: v for m, v in candidates.items()
                     if not math.isclose(v, expected) and sum(math.isclose(v, w) for w in wrong) == 1}
        model_name = "the tiny BERT" if which == "tiny" else "a small random BERT"
        expect_close(value, expected, f"top_k_accuracy with k={k} on {len(examples)} examples ({model_name})",
                     diagnoses=diagnoses,
                     hint="The accuracy is the fraction of (text, answer) examples whose answer is one of the k "
                          "token_str that fill_mask ranks first.")


GROWING_K = (1, 2, 5, 20)


@probe
def top_k_accuracy_grows_with_k(seeds, fn):
    """Never falls as k grows; reaches 1 when k is the vocabulary size (every answer is a token)."""
    return ([_accuracy(fn, "tiny", TOP_K_EXAMPLES, k) for k in GROWING_K],
            _accuracy(fn, "tiny", TOP_K_EXAMPLES[:4], tiny_vocab_size()))


@top_k_accuracy_grows_with_k.judge
def judge_top_k_accuracy_grows_with_k(seeds, data):
    values, everything = data
    values = [float(v) for v in values]
    if any(b < a - 1e-12 for a, b in zip(values, values[1:])):
        raise AssertionError(f"top_k_accuracy for k = {', '.join(map(str, GROWING_K))} is {values}: it can never "
                             "fall when k grows, since the top-k predictions include the top-(k-1).")
    if not math.isclose(float(everything), 1.0):
        raise AssertionError(f"with k = the vocabulary size every answer is among the predictions, so the "
                             f"accuracy must be 1, not {float(everything):g}.")


# ---------------------------------------------------------------- exercise 5: MaskedLMHead
HF_BERT = "transformers.models.bert.modeling_bert"
# transformers' heads answer the exercise outright; courselib has no reference MLM head (only the encoder,
# courselib.bert.MiniBert, which the exercise builds on).
HEAD_CALLS = [f"{HF_BERT}.BertOnlyMLMHead", f"{HF_BERT}.BertLMPredictionHead",
              f"{HF_BERT}.BertPredictionHeadTransform", f"{HF_BERT}.BertForMaskedLM"]
HEAD_ADVICE = ("build the head yourself (dense, GELU, LayerNorm, tied decoder); transformers' BertForMaskedLM "
               "head is what your answer is compared with, not the answer.")
HEAD_NAMES = "dense (nn.Linear(d, d)), norm (a LayerNorm(d, eps)) and decoder (weight tied, own bias)"
UNTIED = ("head.decoder.weight is not the embedding matrix: the decoder must be TIED to the token embeddings, "
          "the same Parameter (self.decoder.weight = embeddings.weight), not a copy")
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


def oracle_head(weights, eps, act="gelu", norm=True, bias=True, transform=True):
    """Judge side: transformers' BERT MLM head (BertOnlyMLMHead) with these weights, its decoder tied to E."""
    from torch import nn
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertOnlyMLMHead

    V, d = weights["embedding"].shape
    config = BertConfig(vocab_size=V, hidden_size=d, hidden_act=act, layer_norm_eps=eps)
    with quiet(), torch.random.fork_rng(devices=[]):
        head = BertOnlyMLMHead(config).double().eval()
    predictions = head.predictions
    with torch.no_grad():
        predictions.decoder.weight = nn.Parameter(weights["embedding"].clone())
        predictions.transform.dense.weight.copy_(weights["dense.weight"])
        predictions.transform.dense.bias.copy_(weights["dense.bias"])
        predictions.transform.LayerNorm.weight.copy_(weights["norm.weight"])
        predictions.transform.LayerNorm.bias.copy_(weights["norm.bias"])
        predictions.decoder.bias.copy_(weights["decoder.bias"] if bias else torch.zeros_like(weights["decoder.bias"]))
    if not norm:
        predictions.transform.LayerNorm = nn.Identity()
    if not transform:
        predictions.transform = nn.Identity()
    return head


def head_diagnoses(weights, eps, hidden):
    with torch.no_grad():
        wrong = lambda **kwargs: oracle_head(weights, **{"eps": eps, **kwargs})(hidden)  # noqa: E731
        return {
            "your head uses the tanh approximation of GELU (approximate='tanh', GPT-2's gelu_new): BERT's head "
            "uses the exact erf GELU, F.gelu(x).": wrong(act="gelu_new"),
            "your head uses ReLU where BERT's uses the exact erf GELU, F.gelu(x).": wrong(act="relu"),
            "your head's LayerNorm has eps 1e-5 (nn.LayerNorm's default): pass the eps argument on "
            f"(BERT's is 1e-12, this test used {eps:g}).": wrong(eps=1e-5),
            f"your head's LayerNorm ignores the eps argument ({eps:g} here) and uses 1e-12: pass eps on.":
                wrong(eps=1e-12) if eps != 1e-12 else None,
            "the transform LayerNorm is missing: dense, GELU, then norm, then the decoder.": wrong(norm=False),
            "the decoder's bias is missing: BERT adds its own bias (vocab_size,) after the tied weight.":
                wrong(bias=False),
            "the transform (dense, GELU, LayerNorm) is missing: the decoder reads its output, not the hidden "
            "states.": wrong(transform=False),
        }


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


@masked_lm_head_structure.judge
def judge_masked_lm_head_structure(seeds, data):
    case = HEAD_CASES[0]
    if data["tied"] is not True:
        raise AssertionError(f"{UNTIED} (clone(), copy_() or a new nn.Parameter), which the first training step "
                             "or loaded checkpoint leaves behind.")
    if data["bias_is_parameter"] is not True:
        raise AssertionError("head.decoder.bias should be a trainable nn.Parameter of the head, of shape "
                             "(vocab_size,).")
    if tuple(data["shape"]) != (case["B"], case["T"], case["V"]):
        raise AssertionError(f"MaskedLMHead maps hidden states {(case['B'], case['T'], case['d'])} to logits of shape "
                             f"{(case['B'], case['T'], case['V'])}; yours had shape {tuple(data['shape'])}.")
    if data["eps"] is not None and not math.isclose(data["eps"], 1e-7):
        raise AssertionError(f"MaskedLMHead(embeddings, eps=1e-7).norm.eps is {data['eps']:g}: pass the eps argument "
                             "on to the LayerNorm.")
    weights, hidden = head_case(seeds, case)
    oracle = oracle_head(weights, case["eps"])
    direction = torch.randn(case["B"], case["T"], case["V"], generator=seeds.generator(8803), dtype=torch.float64)
    (oracle(hidden) * direction).sum().backward()
    if data["gradient"] is None:
        raise AssertionError(f"after loss.backward() the embedding matrix has no gradient: {UNTIED}.")
    expect_close(data["gradient"], oracle.predictions.decoder.weight.grad, "the embedding matrix's gradient",
                 "With the decoder tied, the loss's gradient with respect to the decoder's weight is the embedding "
                 "matrix's gradient.", rtol=1e-7, atol=1e-9)


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


@masked_lm_head_values.judge
def judge_masked_lm_head_values(seeds, results):
    for case, logits in zip(HEAD_CASES, results):
        weights, hidden = head_case(seeds, case)
        with torch.no_grad():
            expected = oracle_head(weights, case["eps"])(hidden)
        diagnoses = {m: v for m, v in head_diagnoses(weights, case["eps"], hidden).items() if v is not None}
        expect_close(logits, expected, f"the logits (vocabulary {case['V']}, d={case['d']}, eps={case['eps']:g})",
                     "dense, exact GELU, LayerNorm(d, eps), then the decoder: hidden @ E.T + bias, with E the tied "
                     "embedding matrix. (The weights were loaded after your head was built: a decoder that copied "
                     "the embedding matrix keeps the old one.)", diagnoses=diagnoses, rtol=1e-9, atol=1e-9)


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


@masked_lm_head_tiny_bert.judge
def judge_masked_lm_head_tiny_bert(seeds, logits):
    model, tokenizer = tiny_bert()
    batch, positions = tiny_head_case(seeds)
    with torch.no_grad(), quiet():
        expected = model(**batch).logits[torch.arange(len(positions)), torch.tensor(positions)]
    expect_close(logits, expected, "the tiny BERT's logits at [MASK] (courselib's MiniBert + your head)",
                 "With the tiny BERT's weights, MiniBert + MaskedLMHead must be BertForMaskedLM: if only these "
                 "fail, does your decoder read the embedding matrix loaded into the encoder (tied)?",
                 rtol=0, atol=1e-4)
    unmask = fill_mask_pipeline(model, tokenizer)
    for row, position in enumerate(positions):
        text = tokenizer.decode(batch["input_ids"][row][batch["attention_mask"][row].bool()][1:-1])
        with torch.no_grad(), quiet():
            theirs = [p["token"] for p in unmask(text, top_k=5)]
        ours = logits[row].double().softmax(-1).topk(5).indices.tolist()
        if ours != theirs:
            raise AssertionError(f"for {text!r} your model's top 5 are {ours}, pipeline('fill-mask')'s {theirs}.")


# ---------------------------------------------------------------- exercise 6 (optional stretch): pseudo_log_likelihood
PLL_VOCAB = 50
PLL_CASES = [(8901, 9, "a 0/1 integer tensor"), (8902, 13, "a bool tensor")]  # (stream, T, special mask form)


def pll_bert(seed):
    """A small random BertForMaskedLM in float64 (eager attention), its weights from `seed` alone, so that the
    probe and the judge build the same one. A wide initialisation and random LayerNorms and output bias make
    its predictions peaked, so that each known mistake gives a clearly different score."""
    from transformers import BertForMaskedLM

    from courselib.tiny_bert import tiny_config
    with quiet(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = tiny_config(PLL_VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=32, initializer_range=0.5,
                             attn_implementation="eager")
        model = BertForMaskedLM(config).double().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "LayerNorm" in name or name == "cls.predictions.bias":
                    param.add_(0.3 * torch.randn_like(param))
    return model


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


def pll_terms(model, input_ids, mask_id, masked):
    """Judge side, the definition as a loop: for each position t, log p(input_ids[t]) at t with the tokens of
    `masked(t)` (a bool (T,)) replaced by mask_id, one forward pass per position."""
    terms = []
    with torch.no_grad(), quiet():
        for t in range(len(input_ids)):
            sentence = torch.where(masked(t), mask_id, input_ids)
            log_probs = model(input_ids=sentence[None]).logits[0, t].double().log_softmax(dim=-1)
            terms.append(log_probs[input_ids[t]].item())
    return terms


def pll_oracle_and_diagnoses(model, input_ids, mask_id, special):
    T = len(input_ids)
    scored = ~special.bool()
    one = pll_terms(model, input_ids, mask_id, lambda t: torch.arange(T) == t)
    none = pll_terms(model, input_ids, mask_id, lambda t: torch.zeros(T, dtype=torch.bool))
    every = pll_terms(model, input_ids, mask_id, lambda t: scored)
    total = lambda terms: sum(v for v, s in zip(terms, scored.tolist()) if s)  # noqa: E731
    return total(one), {
        "you scored the unmasked sentence: the true token is in the input, so the model reads the answer. Mask "
        "position t in the copy that scores it.": total(none),
        "you masked every position at once: in the copy that scores t, only t is [MASK] and the other tokens "
        "stay.": total(every),
        "you scored [CLS] and [SEP] too: skip the positions where special_tokens_mask is 1.": sum(one),
        "you added probabilities: the PLL adds log-probabilities (log_softmax).":
            sum(math.exp(v) for v, s in zip(one, scored.tolist()) if s),
    }


@probe
def stretch_pseudo_log_likelihood_values(seeds, fn):
    """Against the definition computed one masked copy at a time: two random float64 BERTs whose [CLS], [SEP]
    and [MASK] sit at other ids (one special mask of 0/1 integers, one of bools), then the tiny BERT."""
    values = [_pll(fn, *pll_sentence(seeds, *case)) for case in PLL_CASES]
    return values + [_pll(fn, *pll_tiny_sentence(seeds))]


@stretch_pseudo_log_likelihood_values.judge
def judge_stretch_pseudo_log_likelihood_values(seeds, values):
    problems = [pll_sentence(seeds, *case) for case in PLL_CASES] + [pll_tiny_sentence(seeds)]
    descriptions = [f"a random BERT, T={length}, special_tokens_mask {form}" for _, length, form in PLL_CASES]
    descriptions.append("the tiny BERT on a sentence of its corpus")
    for problem, value, description, tolerance in zip(problems, values, descriptions, (1e-9, 1e-9, 1e-3)):
        expected, diagnoses = pll_oracle_and_diagnoses(*problem)
        expect_close(value, expected, f"pseudo_log_likelihood ({description})", diagnoses=diagnoses,
                     rtol=1e-9, atol=tolerance,
                     hint="Sum, over the non-special positions t, log softmax(logits)[input_ids[t]] at t in the copy "
                          "where only t is masked.")


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


@stretch_pseudo_log_likelihood_one_pass.judge
def judge_stretch_pseudo_log_likelihood_one_pass(seeds, batches):
    _, input_ids, mask_id, special = pll_sentence(seeds, *ONE_PASS_CASE)
    if len(batches) != 1:
        raise AssertionError(f"the model was called {len(batches)} times for one sentence: stack all the masked "
                             "copies into one batch (N, T) and call it once.")
    batch = expect_tensor(batches[0], "the batch of masked copies (model(input_ids=batch))")
    scored = (~special.bool()).nonzero()[:, 0].tolist()
    expect_shape(batch, (len(scored), len(input_ids)), "the batch of masked copies",
                 f"one masked copy per non-special position ({len(scored)} of the {len(input_ids)}), and no copy "
                 "for [CLS] or [SEP].")
    masked = batch == mask_id
    if not ((masked.sum(dim=1) == 1).all() and torch.equal(torch.where(masked, input_ids, batch),
                                                             input_ids.expand_as(batch))):
        raise AssertionError("each copy in the batch must be the sentence with exactly one position replaced by "
                             "mask_token_id, every other token unchanged.")
    if sorted(masked.nonzero()[:, 1].tolist()) != scored:
        raise AssertionError("the copies must mask each non-special position once, and never [CLS] or [SEP].")


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
