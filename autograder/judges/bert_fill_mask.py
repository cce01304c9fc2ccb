"""Hidden checks for bert_fill_mask, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/bert_fill_mask.py, which also builds the
inputs both sides rebuild from the seeds."""
import functools
import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks.common import expect_close, expect_shape, expect_tensor, matches, quiet
from autograder.checks.bert_fill_mask import (
    CLIP_CASE,
    FRESH_CASE,
    FROZEN_CASE,
    GROWING_K,
    HEAD_CASES,
    LOSS_CASES,
    MASK_ID,
    ONE_PASS_CASE,
    PLL_CASES,
    RATES_VOCAB,
    STEP_CASES,
    STEP_VOCAB,
    accuracy_cases,
    fill_mask_format,
    fill_mask_matches_pipeline,
    fill_mask_pipeline,
    fill_mask_scores_are_sorted_probabilities,
    format_cases,
    head_case,
    ignores_case,
    labels_case,
    mask_tokens_generator,
    mask_tokens_labels,
    mask_tokens_rates,
    mask_tokens_special_tokens,
    masked_lm_head_structure,
    masked_lm_head_tiny_bert,
    masked_lm_head_values,
    mlm_loss_ignores_positions,
    mlm_loss_values,
    mlm_problem,
    mlm_step_behaviour,
    mlm_step_values,
    model_and_tokenizer,
    pipeline_cases,
    pll_sentence,
    pll_tiny_sentence,
    rates_cases,
    sorted_cases,
    special_case,
    step_case,
    step_optimizer,
    stretch_pseudo_log_likelihood_one_pass,
    stretch_pseudo_log_likelihood_values,
    tiny_bert,
    tiny_head_case,
    tiny_loss_case,
    tiny_vocab_size,
    top_k_accuracy_grows_with_k,
    top_k_accuracy_values,
)


@functools.lru_cache(maxsize=None)
def oracle_fill_mask(which, text, top_k):
    """Judge side: pipeline("fill-mask")'s answer, as a tuple of its dicts."""
    with quiet(), torch.no_grad():
        return tuple(fill_mask_pipeline(*model_and_tokenizer(which))(text, top_k=top_k))


def _pair(result, shape):
    """Judge side: the (inputs, labels) a probe sent, as integer tensors of the input's shape."""
    inputs, labels = result
    for name, value in (("inputs", inputs), ("labels", labels)):
        expect_shape(expect_tensor(value, name), shape, name, "inputs and labels have the shape of input_ids.")
    return inputs.long(), labels.long()


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


MASK_FORMS = ("a 0/1 integer tensor", "a bool tensor")


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


def _scalar(loss):
    """Judge side: the loss a probe sent, checked to be one number."""
    expect_shape(expect_tensor(loss, "the loss"), (), "the loss",
                 "mlm_loss returns one number for the whole batch: a 0-dim tensor.")
    return loss


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


UNTIED = ("head.decoder.weight is not the embedding matrix: the decoder must be TIED to the token embeddings, "
          "the same Parameter (self.decoder.weight = embeddings.weight), not a copy")


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


# ---------------------------------------------------------------- exercise 6: mlm_step
STEP_RECIPE = ("one step: inputs, labels = mask_tokens(batch's input_ids, ..., special_tokens_mask=the batch's, "
               "generator=generator); loss = mlm_loss(model(inputs, attention_mask), labels); zero the gradients; "
               "backward; clip the global gradient norm to max_grad_norm; optimizer step; return loss.item(). "
               "(The tests swap in the course's mask_tokens and mlm_loss, so only this exercise is graded here.)")


def reference_masks(batches, order, mask_seed, fresh_generator_each_step=False, special=True):
    """Judge side: the (inputs, labels) that courselib's mask_tokens draws for each step from the case's generator
    (the masking is the step's input, drawn by the reference the probe swapped in)."""
    from courselib.bert import mask_tokens
    generator, masks = torch.Generator().manual_seed(mask_seed), []
    for index in order:
        if fresh_generator_each_step:
            generator = torch.Generator().manual_seed(mask_seed)
        batch = batches[index]
        masks.append(mask_tokens(batch["input_ids"], MASK_ID, STEP_VOCAB, generator=generator,
                                 special_tokens_mask=batch["special_tokens_mask"] if special else None))
    return masks


def oracle_steps(seeds, case, bug=None):
    """Judge side: the case's steps done by transformers' BertForMaskedLM on the same weights (its own masked-LM
    loss, labels=), torch's clip_grad_norm_ and the case's optimiser. `bug` does one known mistake instead.
    Returns (losses, the trained BertForMaskedLM, the global gradient norm of the first step before clipping)."""
    model, batches, mask_seed = step_case(seeds, case)
    model.train()
    parameters = list(model.parameters())
    optimizer = step_optimizer(case, parameters)
    losses, first_norm = [], None
    for index, (inputs, labels) in zip(case["order"], reference_masks(batches, case["order"], mask_seed)):
        batch = batches[index]
        labels = batch["input_ids"] if bug == "every_position" else labels
        inputs = batch["input_ids"] if bug == "uncorrupted_inputs" else inputs
        if bug != "accumulate":
            optimizer.zero_grad()
        with quiet():
            loss = model(input_ids=inputs, attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        if bug == "clip_each":
            for parameter in parameters:
                torch.nn.utils.clip_grad_norm_(parameter, case["max_grad_norm"])
        elif bug != "no_clip":
            norm = torch.nn.utils.clip_grad_norm_(parameters, case["max_grad_norm"])
            first_norm = float(norm) if first_norm is None else first_norm
        if bug == "zero_before_step":
            optimizer.zero_grad()
        optimizer.step()
        losses.append(loss.item())
    return losses, model, first_norm


STEP_DIAGNOSES = {
    "every_position": "your loss counts every position, as if every token were to be predicted: pass mask_tokens' "
                      "labels (-100 where nothing is predicted) to mlm_loss, not the batch's input_ids.",
    "uncorrupted_inputs": "the model read the uncorrupted batch, so it sees every answer: feed it mask_tokens' inputs; "
                          "the original ids only come back as labels.",
    "accumulate": "the gradients add up from step to step: zero them (optimizer.zero_grad()) before loss.backward() "
                  "in every step.",
    "no_clip": "the gradients were not clipped before the update (or were clipped after optimizer.step(), which "
               "changes nothing): clip_grad_norm_(model.parameters(), max_grad_norm) between backward and step.",
    "clip_each": "you clipped each parameter's gradient on its own: max_grad_norm bounds the norm of ALL the "
                 "gradients together, one global norm (clip_grad_norm_(model.parameters(), max_grad_norm)).",
    "zero_before_step": "the gradients were zeroed between loss.backward() and optimizer.step(), so the step had "
                        "nothing to apply: zero them before backward.",
}


def _step_losses(losses, count):
    if not isinstance(losses, list) or len(losses) != count:
        raise AssertionError(f"mlm_step was called {count} times and returned {losses!r}: one loss per call.")
    if not all(type(x) is float for x in losses):
        kinds = sorted({type(x).__name__ for x in losses})
        raise AssertionError(f"mlm_step returned {', '.join(kinds)}, not a Python float: return loss.item() (a loss "
                             "tensor keeps the step's whole graph alive).")
    return losses


def _check_inputs(seeds, case, seen):
    """Judge side: the model read, at each step, the masking that mask_tokens draws from the generator passed in."""
    _, batches, mask_seed = step_case(seeds, case)
    order = case["order"]
    if len(seen) != len(order) or any(not torch.is_tensor(ids) for ids in seen):
        raise AssertionError(f"the model ran {len(seen)} times in {len(order)} steps: call it once per step, as "
                             "model(inputs, attention_mask).")
    for step, (index, ids) in enumerate(zip(order, seen)):
        if torch.equal(ids, batches[index]["input_ids"]):
            raise AssertionError(STEP_DIAGNOSES["uncorrupted_inputs"])
        earlier = [j for j in range(step) if order[j] == index and torch.equal(seen[j], ids)]
        if earlier:
            raise AssertionError(f"at step {step + 1} the batch of step {earlier[0] + 1} came back and the model read "
                                 "the very same corruption: mask every batch afresh at every step, with the generator "
                                 "passed in (dynamic masking). A generator seeded inside the step, or masks made once "
                                 "and kept, mask a sentence the same way each time it comes back.")
    masks = reference_masks(batches, order, mask_seed)
    careless = reference_masks(batches, order, mask_seed, special=False)
    for step, (ids, (inputs, _), (unspecial, _)) in enumerate(zip(seen, masks, careless)):
        if torch.equal(ids, inputs):
            continue
        if torch.equal(ids, unspecial):
            raise AssertionError("[CLS], [SEP] or [PAD] were masked: pass the batch's special_tokens_mask on to "
                                 "mask_tokens.")
        raise AssertionError(f"at step {step + 1} the model did not read the masking that mask_tokens draws from the "
                             "generator passed in: call mask_tokens(batch['input_ids'], mask_token_id, vocab_size, "
                             "special_tokens_mask=batch['special_tokens_mask'], generator=generator) once per step, "
                             "and feed its inputs to the model.")


UNTIED_BY_STEP = ("after your steps, head.decoder.weight is no longer bert.token_embeddings.weight: the step untied "
                  "the head. The decoder and the embeddings are one Parameter; train it as it is, and never "
                  "replace either one.")


@mlm_step_values.judge
def judge_mlm_step_values(seeds, results):
    from courselib.bert import hf_names, mlm_head_hf_names
    for case, data in zip(STEP_CASES, results):
        where = f"({case['optimizer']}, lr {case['lr']:g}, max_grad_norm {case['max_grad_norm']:g})"
        losses = _step_losses(data["losses"], len(case["order"]))
        _check_inputs(seeds, case, data["inputs"])
        if data["tied"] is not True:
            raise AssertionError(UNTIED_BY_STEP)
        if not any(data["moved"]):
            raise AssertionError(f"{where}: no parameter changed in {len(losses)} steps: optimizer.step() must run "
                                 "after loss.backward(), with the gradients still there (zero them before backward, "
                                 "not between backward and step).")
        expected, model, _ = oracle_steps(seeds, case)
        theirs = model.state_dict()
        names = {f"bert.{ours}": f"bert.{name}" for ours, name in hf_names(model.config.num_hidden_layers).items()}
        names.update({f"head.{ours}": name for ours, name in mlm_head_hf_names().items()})
        trained = data["state"]
        missing = [ours for ours in names if ours not in trained]
        if missing:
            raise AssertionError(f"after the steps the model has no parameter {missing[0]}: the step must train the "
                                 "model it is given, not replace its parts.")
        if matches(losses, expected, 1e-9, 1e-9) and all(matches(trained[ours], theirs[name], 1e-7, 1e-9)
                                                          for ours, name in names.items()):
            continue
        mistakes = {message: oracle_steps(seeds, case, bug) for bug, message in STEP_DIAGNOSES.items()}  # only now
        expect_close(losses, expected, f"the losses of {len(losses)} steps {where}", hint=STEP_RECIPE,
                     diagnoses={message: wrong[0] for message, wrong in mistakes.items()}, rtol=1e-9, atol=1e-9)
        for ours, name in names.items():
            expect_close(trained[ours], theirs[name], f"{ours} after {len(losses)} steps {where}",
                         hint="the losses are right but this parameter is not: " + STEP_RECIPE,
                         diagnoses={message: wrong[1].state_dict()[name] for message, wrong in mistakes.items()},
                         rtol=1e-7, atol=1e-9)


@mlm_step_behaviour.judge
def judge_mlm_step_behaviour(seeds, data):
    fresh, frozen, clip = data["fresh"], data["frozen"], data["clip"]
    for case, result in ((FRESH_CASE, fresh), (FROZEN_CASE, frozen), (CLIP_CASE, clip)):
        steps = 2 if case is FROZEN_CASE else len(case["order"])
        _step_losses(result["losses"], steps)
    _check_inputs(seeds, FRESH_CASE, fresh["inputs"])
    if fresh["tied"] is not True or frozen["tied"] is not True:
        raise AssertionError(UNTIED_BY_STEP)
    first, second = frozen["gradients"]
    same = len(first) == len(second) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.allclose(a, b, rtol=1e-9, atol=1e-12))
        for a, b in zip(first, second))
    if not same:
        raise AssertionError("two steps at learning rate 0, on the same batch and the same masks, left different "
                             "gradients: " + STEP_DIAGNOSES["accumulate"])
    _, _, norm = oracle_steps(seeds, CLIP_CASE)
    change = math.sqrt(sum(x * x for x in clip["moved"]))
    limit = CLIP_CASE["max_grad_norm"] * CLIP_CASE["lr"]
    if not math.isclose(change, limit, rel_tol=1e-6):
        hint = ""
        if math.isclose(change, norm * CLIP_CASE["lr"], rel_tol=1e-6):
            hint = STEP_DIAGNOSES["no_clip"]
        elif change > limit:
            hint = STEP_DIAGNOSES["clip_each"] if change < norm else STEP_DIAGNOSES["no_clip"]
        elif change == 0:
            hint = STEP_DIAGNOSES["zero_before_step"]
        raise AssertionError(f"one SGD step at learning rate 1 with max_grad_norm={CLIP_CASE['max_grad_norm']:g} moved "
                             f"the parameters by {change:.4g} (the global norm of the change); the gradient's norm was "
                             f"{norm:.4g}, so the clipped step moves them by exactly {limit:g}. {hint}".strip())


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
    """The PLL, and a function that returns the common mistakes' values (two more passes: only on a mismatch)."""
    T = len(input_ids)
    scored = ~special.bool()
    one = pll_terms(model, input_ids, mask_id, lambda t: torch.arange(T) == t)
    total = lambda terms: sum(v for v, s in zip(terms, scored.tolist()) if s)  # noqa: E731
    return total(one), lambda: {
        "you scored the unmasked sentence: the true token is in the input, so the model reads the answer. Mask "
        "position t in the copy that scores it.":
            total(pll_terms(model, input_ids, mask_id, lambda t: torch.zeros(T, dtype=torch.bool))),
        "you masked every position at once: in the copy that scores t, only t is [MASK] and the other tokens "
        "stay.": total(pll_terms(model, input_ids, mask_id, lambda t: scored)),
        "you scored [CLS] and [SEP] too: skip the positions where special_tokens_mask is 1.": sum(one),
        "you added probabilities: the PLL adds log-probabilities (log_softmax).":
            sum(math.exp(v) for v, s in zip(one, scored.tolist()) if s),
    }


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
