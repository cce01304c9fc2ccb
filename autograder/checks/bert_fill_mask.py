"""Hidden checks for 08_bert_fill_mask. Each function is one grade cell's hidden part.

Layered as the course's tests are: shape and format first, then values on seeded inputs against
independent oracles (`torch.nn.functional.cross_entropy`, `BertForMaskedLM`'s own loss,
`pipeline("fill-mask")`), then behaviour (rates measured over tens of thousands of tokens,
special tokens, generators, gradients, ordering). The models here are the course's tiny BERT and
small random BERTs with their special tokens moved, never the notebook's `model`, so the grade
doesn't depend on whether bert-base-uncased was available. Seeds are never used by the visible tests.
"""
import functools
import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import call, expect_close, expect_shape, generator, quiet

MASK_ID = 4  # the id of [MASK] in the synthetic problems below (ids 0-4 play the special tokens)
PIPELINE_CALLS = ["transformers.pipelines.base.Pipeline.__call__",
                  "transformers.pipelines.fill_mask.FillMaskPipeline.__call__"]


# ---------------------------------------------------------------- models and oracles
@functools.lru_cache(maxsize=None)
def tiny_bert():
    """The course's shipped tiny BERT (model, tokenizer)."""
    from courselib.tiny_bert import load_tiny_bert
    with quiet():
        return load_tiny_bert()


@functools.lru_cache(maxsize=None)
def random_bert(seed):
    """A small randomly initialised BERT whose tokenizer puts [MASK], [CLS]... at other ids.

    A fill_mask that hard-codes the tiny model's mask id, or its answers, fails here.
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
        with torch.random.fork_rng():
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
    return tiny_bert() if which == "tiny" else random_bert(which)


def oracle_fill_mask(which, text, top_k):
    with quiet(), torch.no_grad():
        return fill_mask_pipeline(*model_and_tokenizer(which))(text, top_k=top_k)


def reference_fill_mask(model, tokenizer, text, top_k=5):
    """Handed to top_k_accuracy in place of the student's fill_mask (see common.call)."""
    with quiet(), torch.no_grad():
        return fill_mask_pipeline(model, tokenizer)(text, top_k=top_k)


# ---------------------------------------------------------------- exercise 1: mask_tokens
def _mask_tokens(fn, input_ids, vocab_size, **kwargs):
    before = input_ids.clone()
    result = call(fn, input_ids, MASK_ID, vocab_size, name="mask_tokens", **kwargs)
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


def ordinary_ids(seed, shape, vocab_size):
    """Token ids that are never special: 5..vocab_size-1."""
    return torch.randint(5, vocab_size, shape, generator=generator(seed))


def mask_tokens_labels(fn):
    """Labels: the original id where a token is selected, -100 everywhere else; nothing else changes."""
    vocab_size = 300
    input_ids = ordinary_ids(8101, (6, 70), vocab_size)
    inputs, labels = _mask_tokens(fn, input_ids, vocab_size, generator=generator(8102))
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


def mask_tokens_rates(fn):
    """Over 32,768 tokens: 15% selected; of those 80% [MASK], 10% random, 10% unchanged (5-sigma bands)."""
    vocab_size = 1000
    input_ids = ordinary_ids(8201, (64, 512), vocab_size)
    inputs, labels = _mask_tokens(fn, input_ids, vocab_size, generator=generator(8202))
    rate, to_mask, to_random, unchanged = _rates(input_ids, inputs, labels)
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
    changed = (labels != -100) & (inputs != MASK_ID) & (inputs != input_ids)
    drawn = inputs[changed]
    if drawn.numel() and (drawn.min() < 0 or drawn.max() >= vocab_size):
        raise AssertionError("a random replacement is outside 0..vocab_size-1.")
    if drawn.numel() > 100 and drawn.unique().numel() < 0.5 * min(drawn.numel(), vocab_size):
        raise AssertionError(f"your {drawn.numel()} random replacements use only {drawn.unique().numel()} distinct "
                             "tokens: draw each one uniformly from the whole vocabulary, 0..vocab_size-1.")
    # another mlm_probability
    input_ids = ordinary_ids(8203, (32, 512), vocab_size)
    inputs, labels = _mask_tokens(fn, input_ids, vocab_size, mlm_probability=0.4, generator=generator(8204))
    rate, to_mask, _, _ = _rates(input_ids, inputs, labels)
    if abs(rate - 0.4) > 0.02:
        raise AssertionError(f"with mlm_probability=0.4 you selected {rate:.1%} of the tokens: use the "
                             "mlm_probability argument, not a hard-coded 0.15.")
    if abs(to_mask - 0.8) > 0.03:
        raise AssertionError(f"with mlm_probability=0.4, {to_mask:.1%} of the selected tokens became [MASK]; "
                             "it should still be 80%.")


def mask_tokens_special_tokens(fn):
    """Special tokens ([CLS], [SEP], [PAD]) are never selected, whether the mask is 0/1 or bool."""
    vocab_size = 500
    g = generator(8301)
    batch, length = 48, 40
    lengths = torch.randint(5, length - 1, (batch,), generator=g)
    input_ids = torch.randint(5, vocab_size, (batch, length), generator=g)
    positions = torch.arange(length)
    input_ids[:, 0] = 2                                         # [CLS]
    input_ids[positions[None, :] == lengths[:, None] + 1] = 3   # [SEP]
    input_ids[positions[None, :] > lengths[:, None] + 1] = 0    # [PAD]
    special = (input_ids == 0) | (input_ids == 2) | (input_ids == 3)
    for description, mask in (("a 0/1 integer tensor", special.long()), ("a bool tensor", special)):
        inputs, labels = _mask_tokens(fn, input_ids, vocab_size, special_tokens_mask=mask,
                                      mlm_probability=0.6, generator=generator(8302))
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


def mask_tokens_generator(fn):
    """The same generator seed gives the same result, whatever the global RNG; other seeds differ."""
    vocab_size = 400
    input_ids = ordinary_ids(8401, (8, 128), vocab_size)
    torch.manual_seed(8402)
    first = _mask_tokens(fn, input_ids, vocab_size, generator=generator(8403))
    torch.manual_seed(8404)
    second = _mask_tokens(fn, input_ids, vocab_size, generator=generator(8403))
    if not all(torch.equal(a, b) for a, b in zip(first, second)):
        raise AssertionError("two calls with generators seeded alike gave different results: draw every random "
                             "number from `generator` (torch.rand(..., generator=generator), "
                             "torch.randint(..., generator=generator)), not from the global RNG.")
    other = _mask_tokens(fn, input_ids, vocab_size, generator=generator(8405))
    if torch.equal(first[1], other[1]):
        raise AssertionError("generators with different seeds selected the same tokens: the selection must be random.")
    torch.manual_seed(8406)
    default_a = _mask_tokens(fn, input_ids, vocab_size)
    torch.manual_seed(8406)
    default_b = _mask_tokens(fn, input_ids, vocab_size)
    if not all(torch.equal(a, b) for a, b in zip(default_a, default_b)):
        raise AssertionError("with generator=None, mask_tokens should use torch's global RNG, so that "
                             "torch.manual_seed makes it reproducible.")


# ---------------------------------------------------------------- exercise 2: mlm_loss
def _mlm_loss(fn, logits, labels):
    result = call(fn, logits, labels, name="mlm_loss")
    if not torch.is_tensor(result):
        raise AssertionError(f"mlm_loss should return a torch tensor (a scalar you can call .backward() on), "
                             f"but it returned a {type(result).__name__}. Don't call .item().")
    expect_shape(result, (), "the loss", "mlm_loss returns one number for the whole batch: a 0-dim tensor.")
    return result


def mlm_problem(seed, batch, length, vocab, predicted=0.3, dtype=torch.float64):
    g = generator(seed)
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


def mlm_loss_values(fn):
    """Against torch's cross_entropy (float64), then against BertForMaskedLM's own loss."""
    for seed, shape in [(8501, (3, 9, 40)), (8502, (5, 4, 17))]:
        logits, labels = mlm_problem(seed, *shape)
        expected = F.cross_entropy(logits.reshape(-1, shape[-1]), labels.reshape(-1), ignore_index=-100)
        expect_close(_mlm_loss(fn, logits, labels), expected, "mlm_loss", diagnoses=loss_diagnoses(logits, labels),
                     hint="The MLM loss is the mean of -log softmax(logits)[label] over the tokens whose "
                          "label isn't -100.")
    model, tokenizer = tiny_bert()
    batch = tokenizer(["the dog slept on the rug.", "berlin is the capital of germany."], padding=True,
                      return_tensors="pt")
    labels = batch["input_ids"].clone()
    labels[:, ::2] = -100
    with torch.no_grad(), quiet():
        output = model(**batch, labels=labels)
    expect_close(_mlm_loss(fn, output.logits, labels), output.loss, "mlm_loss on BertForMaskedLM's logits",
                 "BertForMaskedLM(..., labels=labels).loss is the reference: cross-entropy over the "
                 "predicted positions only.", atol=1e-5)


def mlm_loss_ignores_positions(fn):
    """Ignored positions don't change the loss and get no gradient; predicted ones do."""
    logits, labels = mlm_problem(8601, 4, 6, 11)
    loss = _mlm_loss(fn, logits, labels)
    noisy = logits.clone()
    noisy[labels == -100] += 50 * torch.randn(noisy[labels == -100].shape, generator=generator(8602),
                                              dtype=logits.dtype)
    if not math.isclose(float(_mlm_loss(fn, noisy, labels)), float(loss), rel_tol=1e-9, abs_tol=1e-9):
        raise AssertionError("changing the logits where labels are -100 changed the loss: positions that are not "
                             "predicted must not count at all.")
    leaf = logits.clone().requires_grad_(True)
    result = _mlm_loss(fn, leaf, labels)
    if not result.requires_grad:
        raise AssertionError("loss.requires_grad is False: compute the loss with torch operations on the logits "
                             "(no .item(), .detach() or NumPy), so that training can call loss.backward().")
    result.backward()
    ignored = labels == -100
    if leaf.grad is None or leaf.grad[ignored].abs().max() > 0:
        raise AssertionError("the ignored positions received a gradient: they must not take part in the loss.")
    if leaf.grad[~ignored].abs().sum(dim=-1).min() == 0:
        raise AssertionError("some predicted position received no gradient: every token whose label isn't -100 "
                             "must count in the loss.")


# ---------------------------------------------------------------- exercise 3: fill_mask
def _fill_mask(fn, which, text, top_k=None):
    model, tokenizer = model_and_tokenizer(which)
    kwargs = {} if top_k is None else {"top_k": top_k}
    with torch.no_grad():
        result = call(fn, model, tokenizer, text, name="fill_mask", forbidden=PIPELINE_CALLS,
                      forbidden_advice="do the fill-mask by hand (tokenize, find [MASK], softmax, top-k): "
                                       "pipeline('fill-mask') is what your answer is compared with.", **kwargs)
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
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
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


def fill_mask_format(fn):
    """The pipeline's format: top_k dicts (5 by default) with score, token, token_str, sequence."""
    _fill_mask(fn, "tiny", "the puppy slept on the [MASK].", top_k=3)
    _fill_mask(fn, "tiny", "[MASK] is the capital of italy.")
    _fill_mask(fn, 8711, "my rabbit likes to sleep on the [MASK].", top_k=7)


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


def fill_mask_matches_pipeline(fn):
    """Same tokens, same order, same strings, scores to 1e-5, on the tiny BERT and two random BERTs."""
    cases = [("tiny", "paris is the capital of [MASK].", 4), ("tiny", "[MASK] comes after monday.", None),
             ("tiny", "we hear with our [MASK], and we see with our eyes.", 10),
             (8712, "the dog barked at the [MASK] all night.", 6), (8713, "[MASK] plays the violin.", 1)]
    for which, text, top_k in cases:
        result = _fill_mask(fn, which, text, top_k)
        expected = oracle_fill_mask(which, text, 5 if top_k is None else top_k)
        where = f"for {text!r}" + ("" if which == "tiny" else " (on a small random BERT whose [MASK] id is "
                                                            f"{model_and_tokenizer(which)[1].mask_token_id})")
        tokens = [entry["token"] for entry in result]
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


def fill_mask_scores_are_sorted_probabilities(fn):
    """Scores fall from first to last, and over the whole vocabulary they sum to 1."""
    for which, text in (("tiny", "the kitten is lying on the [MASK]."), (8714, "a baby sheep is called a [MASK].")):
        model, tokenizer = model_and_tokenizer(which)
        vocab_size = model.config.vocab_size
        result = _fill_mask(fn, which, text, top_k=vocab_size)
        scores = np.array([float(entry["score"]) for entry in result])
        if np.any(np.diff(scores) > 1e-9):
            raise AssertionError(f"the scores for {text!r} are not sorted: the predictions must come highest score "
                                 "first (torch.topk sorts them; argsort sorts lowest first).")
        if np.any(scores < 0) or abs(scores.sum() - 1) > 1e-4:
            raise AssertionError(f"over all {vocab_size} tokens your scores sum to {scores.sum():.4g}: they must be "
                                 "probabilities over the vocabulary, a softmax over the last axis, summing to 1.")
        if sorted(entry["token"] for entry in result) != list(range(vocab_size)):
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


def oracle_accuracy(which, examples, k):
    hits = [answer in [entry["token_str"] for entry in oracle_fill_mask(which, text, k)] for text, answer in examples]
    return sum(hits) / len(examples)


def _accuracy(fn, which, examples, k):
    model, tokenizer = model_and_tokenizer(which)
    with torch.no_grad():
        result = call(fn, model, tokenizer, examples, k, name="top_k_accuracy",
                      helpers={"fill_mask": reference_fill_mask})
    if torch.is_tensor(result) and result.numel() == 1:
        result = result.item()
    if not isinstance(result, numbers.Real):
        raise AssertionError(f"top_k_accuracy should return a number between 0 and 1, "
                             f"but it returned a {type(result).__name__}.")
    return float(result)


def accuracy_diagnoses(which, examples, k):
    hits_in = lambda kk: [answer in [e["token_str"] for e in oracle_fill_mask(which, text, kk)]  # noqa: E731
                          for text, answer in examples]
    in_sequence = [any(answer in e["sequence"] for e in oracle_fill_mask(which, text, k)) for text, answer in examples]
    return {
        "you returned the number of hits; the accuracy is the fraction of examples, hits / len(examples).":
            sum(hits_in(k)),
        "your accuracy ignores k and only checks the top prediction: an example counts when the answer is "
        "anywhere among the k best tokens.": sum(hits_in(1)) / len(examples),
        f"your accuracy looks at the top {k - 1} predictions instead of the top {k}: an off-by-one in the "
        "slice?": sum(hits_in(max(k - 1, 1))) / len(examples) if k > 1 else -1.0,
        "you checked whether the answer appears anywhere in the filled-in sentence: compare it with the "
        "predicted token_str itself (the answer may already be elsewhere in the sentence).":
            sum(in_sequence) / len(examples),
    }


def top_k_accuracy_values(fn):
    """Against an accuracy counted from pipeline('fill-mask'), for several k, on two models."""
    # k = 5 and 4 on the tiny BERT: there, the right answer and each bug's answer all differ
    for which, examples, k in (("tiny", TOP_K_EXAMPLES, 5), ("tiny", TOP_K_EXAMPLES, 4),
                               ("tiny", TOP_K_EXAMPLES[::2], 10), (8715, TOP_K_EXAMPLES, 300)):
        expected = oracle_accuracy(which, examples, k)
        candidates = accuracy_diagnoses(which, examples, k)
        values = list(candidates.values())
        # a misconception is named only if its answer differs from the right one and from the others'
        diagnoses = {m: v for m, v in candidates.items()
                     if not math.isclose(v, expected) and sum(math.isclose(v, w) for w in values) == 1}
        model_name = "the tiny BERT" if which == "tiny" else "a small random BERT"
        expect_close(_accuracy(fn, which, examples, k), expected,
                     f"top_k_accuracy with k={k} on {len(examples)} examples ({model_name})", diagnoses=diagnoses,
                     hint="The accuracy is the fraction of (text, answer) examples whose answer is one of the k "
                          "token_str that fill_mask ranks first.")


def top_k_accuracy_grows_with_k(fn):
    """Never falls as k grows; reaches 1 when k is the vocabulary size (every answer is a token)."""
    model, tokenizer = tiny_bert()
    values = [_accuracy(fn, "tiny", TOP_K_EXAMPLES, k) for k in (1, 2, 5, 20)]
    if any(b < a - 1e-12 for a, b in zip(values, values[1:])):
        raise AssertionError(f"top_k_accuracy for k = 1, 2, 5, 20 is {values}: it can never fall when k grows, "
                             "since the top-k predictions include the top-(k-1).")
    everything = _accuracy(fn, "tiny", TOP_K_EXAMPLES[:4], model.config.vocab_size)
    if not math.isclose(everything, 1.0):
        raise AssertionError(f"with k = the vocabulary size every answer is among the predictions, so the "
                             f"accuracy must be 1, not {everything:g}.")
