"""Hidden checks for 06_masking. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the inputs, call the student's code through `call`,
return the masks, weights and outputs it produced as data) and a judge (in the grader: rebuild the
same inputs from the same seeds, compute the oracle, run the behaviour tests on the student's masks,
compare, name the misconception). Layered as the course's tests are: shape first, then values on
seeded inputs against independent oracles, then behaviour. The oracles are torch's and Hugging
Face's own code, never a copy of the solution:
- `torch.nn.Transformer.generate_square_subsequent_mask` for the causal mask,
- the `attention_mask` of a Hugging Face `tokenizers` tokenizer with padding for the padding mask,
- `torch.nn.functional.scaled_dot_product_attention` for masked weights (in torch 2.13 it gives a
  fully masked row weights of zero, the contract of `masked_softmax`),
- `torch.nn.MultiheadAttention` for cross-attention (through `attn_mask`: its `key_padding_mask`
  check imports sympy, two seconds of the notebook's budget),
- for the optional packed-sequence mask, an explicit loop over (query, key) pairs, cross-checked with
  `torch.nn.attention.flex_attention.create_mask` (a mask_mod on CPU).
Exercises are graded on their own: the student's other mask functions are swapped for the course's
reference ones (`courselib.attention`) while a function runs, and the reference of the exercise
itself is forbidden. Modules and sentences come from the run's seeds, so the hidden inputs are never
the visible tests'.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import LOCAL_TOKEN, call, expect_close, expect_shape, probe, to_numpy
from courselib import attention as reference

ORACLE_SHORTCUTS = ["torch.nn.functional.scaled_dot_product_attention"]
# While one exercise is graded, its siblings are the course's reference versions (see common.call).
REFERENCE_HELPERS = {
    "causal_mask": reference.causal_mask,
    "padding_mask": reference.padding_mask,
    "causal_padding_mask": reference.causal_padding_mask,
    "masked_softmax": reference.masked_softmax,
}
# The course's references (and torch's own helper) that would answer each exercise.
OWN_WORK = "the exercise asks you to write it yourself; the course's version is the reference here, not the answer."
CAUSAL_SHORTCUTS = ["courselib.attention.causal_mask", "courselib.attention.causal_padding_mask",
                    "torch.nn.Transformer.generate_square_subsequent_mask"]
SOFTMAX_SHORTCUTS = ORACLE_SHORTCUTS + ["courselib.attention.masked_softmax",
                                        "courselib.attention.scaled_dot_product_attention"]
PADDING_SHORTCUTS = ["courselib.attention.padding_mask", "courselib.attention.causal_padding_mask"]
CAUSAL_PADDING_SHORTCUTS = ["courselib.attention.causal_padding_mask"]
VOCABULARY = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "and", "slept", "barked"]
SENTENCES = ["the cat sat on the mat", "a dog ran", "", "the dog barked and the cat slept on a log", "cat"]


# ---------------------------------------------------------------- oracles and inputs
def oracle_causal(T):
    """torch's own causal mask is additive (0 or -inf); 'may attend' is where it is 0."""
    return nn.Transformer.generate_square_subsequent_mask(T) == 0


def tokenized_batch(sentences, pad_id, direction="right"):
    """(input_ids (B, T), attention_mask (B, T) bool) from a `tokenizers` WordLevel tokenizer. The probe
    uses the ids only; the judge also the attention_mask, the oracle of padding_mask."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    words = VOCABULARY + ["[UNK]"]
    words.insert(pad_id, "[PAD]")  # the padding id is the tokenizer's choice, not always 0
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.enable_padding(direction=direction, pad_id=pad_id, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(sentences)
    input_ids = torch.tensor([e.ids for e in encodings])
    attention_mask = torch.tensor([e.attention_mask for e in encodings]).bool()
    return input_ids, attention_mask


def shuffled(seeds, stream, sentences):
    """The sentences in an order drawn for this run: the batch (and its padding) differs per run."""
    sentences = list(sentences)
    seeds.random(stream).shuffle(sentences)
    return sentences


def oracle_weights(scores, mask):
    """Masked softmax over the last dim by torch's kernel: scores @ I with scale 1, attending over I."""
    T_k = scores.shape[-1]
    identity = torch.eye(T_k, dtype=scores.dtype)
    return F.scaled_dot_product_attention(scores, identity, identity, attn_mask=mask, scale=1.0)


def oracle_weights_along(scores, mask, dim):
    mask = mask.expand(scores.shape)
    return oracle_weights(scores.movedim(dim, -1), mask.movedim(dim, -1)).movedim(-1, dim)


def seeded_mha(g, d_model=8, num_heads=2, cls=reference.MultiHeadAttention):
    """The course's module in float64 with weights from `g` (uniform in ±1/√d_model, like nn.Linear's
    own initialisation), so that probe and judge build the same one."""
    mha = cls(d_model, num_heads).double().eval()
    with torch.no_grad():
        for parameter in mha.parameters():
            parameter.copy_((torch.rand(parameter.shape, generator=g, dtype=torch.float64) * 2 - 1) / d_model ** 0.5)
    return mha


def torch_cross_attention(mha, decoder_states, encoder_states, encoder_padding_mask=None):
    """The same weights in torch.nn.MultiheadAttention, whose boolean masks mean True = ignore."""
    d_model = mha.q_proj.weight.shape[0]
    torch_mha = nn.MultiheadAttention(d_model, mha.num_heads, batch_first=True, dtype=decoder_states.dtype)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        torch_mha.out_proj.weight.copy_(mha.out_proj.weight)
        torch_mha.out_proj.bias.copy_(mha.out_proj.bias)
    torch_mha.eval()
    blocked = None
    if encoder_padding_mask is not None:  # torch's attn_mask is (B·h, T_q, T_k) and True means "blocked"
        B, T_q, T_k = decoder_states.shape[0], decoder_states.shape[1], encoder_states.shape[1]
        blocked = (~encoder_padding_mask).expand(B, mha.num_heads, T_q, T_k).reshape(B * mha.num_heads, T_q, T_k)
    with torch.no_grad():
        return torch_mha(decoder_states, encoder_states, encoder_states, attn_mask=blocked,
                         need_weights=True, average_attn_weights=False)


def bool_mask(value, name, hint=""):
    """Judge side: the student's mask, checked to be a bool tensor."""
    if not torch.is_tensor(value):
        raise AssertionError(f"{name} should be a torch tensor, but it is a {type(value).__name__}.")
    if value.dtype != torch.bool:
        raise AssertionError(
            f"{name} has dtype {value.dtype}; masks in this course are bool (True = may attend). "
            "A float mask means something else to torch: F.scaled_dot_product_attention *adds* it to "
            f"the scores. Compare with `==`, `!=`, `>=` or call .bool(). {hint}".strip())
    return value


def _attend(q, k, v, mask, who):
    """Judge side: attention by torch's kernel under the student's mask (data)."""
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError as error:
        raise AssertionError(f"{who} could not be used as a mask for scores of shape "
                             f"{tuple(q.shape[:-1]) + (k.shape[-2],)}: {error}") from None


# ---------------------------------------------------------------- exercise 1: causal_mask
CAUSAL_ADVICE = ("build the mask yourself (torch.ones(...).tril(), or comparing positions): the course's "
                 "causal_mask and torch's generate_square_subsequent_mask are the references here, not the answer.")


def _causal(fn, T):
    return call(fn, T, name="causal_mask", forbidden=CAUSAL_SHORTCUTS, forbidden_advice=CAUSAL_ADVICE)


def causal_mask_diagnoses(T):
    lower = torch.ones(T, T).tril()
    return {
        "the diagonal is excluded: a token may always attend to itself (the diagonal is True), "
        "otherwise token 0 has nothing at all to look at. Use tril(), not tril(-1).": lower.tril(-1),
        "the triangle is inverted: query t may attend to keys 0..t, the *lower* triangle. Yours lets "
        "every token see the future (triu) and hides its past.": lower.T,
        "your mask is True where attention is *forbidden* (the strict upper triangle). In this course, as "
        "in F.scaled_dot_product_attention, True means 'may attend'.": 1 - lower,
    }


def causal_sizes(seeds):
    return (3, 7, 10, 1, seeds.random(2600).randint(2, 16))


@probe
def causal_mask_values(seeds, fn):
    return [_causal(fn, T) for T in causal_sizes(seeds)]


@causal_mask_values.judge
def judge_causal_mask_values(seeds, masks):
    for T, mask in zip(causal_sizes(seeds), masks):
        bool_mask(mask, f"causal_mask({T})")
        expect_shape(mask, (T, T), f"causal_mask({T})",
                     "The mask is (T, T), one row per query, built from T; a fixed-size answer won't do.")
        expect_close(mask, oracle_causal(T), f"causal_mask({T})", diagnoses=causal_mask_diagnoses(T))


PEEK_T, PEEK_CUT, PREFIXES = 7, 4, (3, 5)


def peeking_problem(seeds):
    """q, k, v (2, 3, T, 5), and k, v with tokens PEEK_CUT.. rewritten."""
    T, cut = PEEK_T, PEEK_CUT
    g = seeds.generator(2601)
    q, k, v = (torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[..., cut:, :] = torch.randn(2, 3, T - cut, 5, generator=g, dtype=torch.float64)
    v2[..., cut:, :] = torch.randn(2, 3, T - cut, 5, generator=g, dtype=torch.float64)
    return q, k, v, k2, v2


@probe
def causal_mask_no_peeking(seeds, fn):
    """The student's masks; the judge attends with them."""
    return {T: _causal(fn, T) for T in (PEEK_T, 1, *PREFIXES)}


@causal_mask_no_peeking.judge
def judge_causal_mask_no_peeking(seeds, masks):
    """Changing the future never changes the past, and one pass equals T prefix-sized passes."""
    T, cut = PEEK_T, PEEK_CUT
    q, k, v, k2, v2 = peeking_problem(seeds)
    mask = bool_mask(masks[T], f"causal_mask({T})")
    before = _attend(q, k, v, mask, f"causal_mask({T})")
    after = _attend(q, k2, v2, mask, f"causal_mask({T})")
    changed = (after[..., :cut, :] - before[..., :cut, :]).abs().amax(dim=(0, 1, 3))
    if changed.max() > 1e-9:
        position = int(torch.nonzero(changed > 1e-9)[0])
        raise AssertionError(
            f"Changing tokens {cut}..{T - 1} changed the output at position {position}: under your mask a "
            "token peeks at the future. Query t may only attend to keys 0..t.")
    first = _attend(q[..., :1, :], k[..., :1, :], v[..., :1, :], bool_mask(masks[1], "causal_mask(1)"),
                    "causal_mask(1)")
    expect_close(first[..., 0, :], v[..., 0, :], "the output at position 0",
                 "The first token may attend only to itself, so its output is its own value vector.")
    for t in PREFIXES:
        prefix = _attend(q[..., :t, :], k[..., :t, :], v[..., :t, :], bool_mask(masks[t], f"causal_mask({t})"),
                         f"causal_mask({t})")
        expect_close(before[..., :t, :], prefix, f"the first {t} outputs",
                     f"One pass over {T} tokens must give the same first {t} outputs as a pass over "
                     f"those {t} tokens alone: each position sees exactly itself and its past.")


# ---------------------------------------------------------------- exercise 2: masked_softmax
SOFTMAX_ADVICE = ("mask and normalise the scores yourself: torch's scaled_dot_product_attention is the oracle "
                  "here, and the course's masked_softmax the reference, not the answer.")


def _masked_softmax(fn, scores, mask, **kwargs):
    before = scores.detach().clone()
    result = call(fn, scores, mask, name="masked_softmax", forbidden=SOFTMAX_SHORTCUTS,
                  forbidden_advice=SOFTMAX_ADVICE, **kwargs)
    if not torch.equal(scores.detach(), before):
        raise AssertionError("masked_softmax changed `scores` in place (masked_fill_ or scores[~mask] = ...): "
                             "the caller's scores must survive. Use the out-of-place masked_fill or torch.where.")
    if not torch.is_tensor(result):
        raise AssertionError(f"masked_softmax should return a torch tensor, but it returned {type(result).__name__}.")
    return result


def expect_weights_shape(weights, scores):
    expect_shape(weights, scores.shape, "masked_softmax(scores, mask)",
                 "The weights have the shape of the scores; the mask only broadcasts against them.")


def at_least_one_key(mask, dim=-1):
    """Give every row of a random mask one allowed key, so that no row is fully masked."""
    mask = mask.clone()
    index = [slice(None)] * mask.dim()
    index[dim] = 0
    mask[tuple(index)] = True
    return mask


def masked_softmax_diagnoses(scores, mask):
    allowed = mask.expand(scores.shape)
    return {
        "you zeroed the masked weights after the softmax: the remaining weights no longer sum to 1 and "
        "still depend on the hidden scores. Set masked scores to -inf *before* the softmax.":
            torch.softmax(scores, dim=-1) * allowed,
        "you filled the masked scores with 0 instead of -inf: a score of 0 still gets weight e⁰/Σ. "
        "Fill with float('-inf') so that the weight is exactly 0.":
            torch.softmax(scores.masked_fill(~allowed, 0.0), dim=-1),
        "you hid exactly the positions the mask allows: True means 'may attend'. Fill the scores where "
        "the mask is False (masked_fill(~mask, ...)).":
            oracle_weights(scores, ~allowed),
    }


def softmax_value_cases(seeds):
    """Scores (2, 3, 5, 6) and three masks that broadcast differently against them."""
    g = seeds.generator(2602)
    scores = torch.randn(2, 3, 5, 6, generator=g) * 2
    rectangular_causal = torch.ones(5, 6, dtype=torch.bool).tril(1)            # (T_q, T_k)
    padding = at_least_one_key(torch.rand(2, 1, 1, 6, generator=g) > 0.4)      # (B, 1, 1, T_k)
    random_mask = at_least_one_key(torch.rand(2, 3, 5, 6, generator=g) > 0.5)  # (B, h, T_q, T_k)
    return scores, [("a (T_q, T_k) causal-style mask", rectangular_causal),
                    ("a (B, 1, 1, T_k) padding mask", padding),
                    ("a (B, h, T_q, T_k) mask", random_mask)]


def huge_hidden_case(scores, random_mask):
    # A hidden score can be anything, even far larger than every visible one (float32, as in training).
    return scores.masked_fill(~random_mask, 150.0)


@probe
def masked_softmax_values(seeds, fn):
    """Parity with F.scaled_dot_product_attention's weights under the same boolean mask."""
    scores, masks = softmax_value_cases(seeds)
    random_mask = masks[-1][1]
    return ([_masked_softmax(fn, scores, mask) for _, mask in masks],
            _masked_softmax(fn, huge_hidden_case(scores, random_mask), random_mask))


@masked_softmax_values.judge
def judge_masked_softmax_values(seeds, results):
    weights_per_mask, huge = results
    scores, masks = softmax_value_cases(seeds)
    for (description, mask), weights in zip(masks, weights_per_mask):
        expect_weights_shape(weights, scores)
        expect_close(weights, oracle_weights(scores, mask), f"masked_softmax with {description}",
                     "Masked positions get weight exactly 0 and each row sums to 1 over the allowed keys.",
                     diagnoses=masked_softmax_diagnoses(scores, mask))
    random_mask = masks[-1][1]
    expected = oracle_weights(huge_hidden_case(scores, random_mask), random_mask)
    expect_weights_shape(huge, scores)
    if not np.allclose(np.nan_to_num(to_numpy(huge, "masked_softmax"), nan=-1.0), expected.numpy(),
                       rtol=1e-4, atol=1e-5):
        raise AssertionError(
            "masked_softmax is wrong when a hidden score is huge (150 where the visible ones are near 0): "
            "normalising over all keys first lets hidden scores swallow the visible ones (e^-150 underflows "
            "in float32), so masking or renormalising afterwards cannot recover them. Hidden scores must "
            "never take part: set them to -inf before the softmax.")


def never_nan_problem(seeds):
    """Float64 scores with fully masked rows, the upstream gradient, and scores around 1e4."""
    g = seeds.generator(2603)
    scores = torch.randn(2, 4, 5, generator=g, dtype=torch.float64) * 3
    mask = at_least_one_key(torch.rand(2, 4, 5, generator=g) > 0.5)
    mask[1, 0] = False   # a query with nothing to attend to (a padding query under left padding)
    mask[1, 3] = False
    mask[0, 2] = False
    upstream = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    big = 1e4 + torch.randn(3, 6, generator=g, dtype=torch.float64) * 50
    big_mask = at_least_one_key(torch.rand(3, 6, generator=g) > 0.3)
    return scores, mask, upstream, big, big_mask


@probe
def masked_softmax_never_nan(seeds, fn):
    scores, mask, upstream, big, big_mask = never_nan_problem(seeds)
    weights = _masked_softmax(fn, scores, mask)
    # Training backpropagates through these rows: the probe measures the gradient, the judge decides.
    leaf = scores.clone().requires_grad_(True)
    attached = _masked_softmax(fn, leaf, mask)
    grad = None
    if attached.grad_fn is not None and tuple(attached.shape) == tuple(leaf.shape):
        (attached * upstream).sum().backward()
        grad = leaf.grad
    return {"weights": weights, "attached": attached.grad_fn is not None, "grad": grad,
            "big": _masked_softmax(fn, big, big_mask)}


@masked_softmax_never_nan.judge
def judge_masked_softmax_never_nan(seeds, data):
    """Fully masked rows are zeros, in the forward pass and in the gradient; huge scores stay finite."""
    scores, mask, upstream, big, big_mask = never_nan_problem(seeds)
    fully_masked = ~mask.any(dim=-1)
    weights = data["weights"]
    expect_weights_shape(weights, scores)
    weights_np = to_numpy(weights, "masked_softmax")
    if not np.all(np.isfinite(weights_np)):
        raise AssertionError(
            "masked_softmax returned NaN for a row where every key is masked: the softmax of a row of -inf "
            "is 0/0. Such a row (e.g. a padding query) must come out as all zeros: replace NaN by 0 "
            "(torch.nan_to_num) or zero the rows where mask.any(dim, keepdim=True) is False.")
    rows = weights_np[fully_masked.numpy()]
    if np.allclose(rows, 1.0 / scores.shape[-1], atol=1e-6):
        raise AssertionError(
            "a fully masked row came out uniform (1/T_k each): filling with a large negative number "
            "(-1e9, finfo.min) instead of -inf makes every masked score equal, so the row averages keys "
            "it may not see. A row with nothing to attend to must be all zeros.")
    expect_close(weights, oracle_weights(scores, mask), "masked_softmax with fully masked rows",
                 "Rows with at least one allowed key sum to 1; rows with none are all zeros.")

    # Training backpropagates through these rows: one NaN gradient poisons every parameter.
    if not data["attached"]:
        raise AssertionError("masked_softmax's output is cut off from autograd (detach, .data, NumPy?): "
                             "a model trains through it, so keep it a differentiable torch computation.")
    grad = data["grad"]
    if grad is None or not np.all(np.isfinite(to_numpy(grad, "the gradient"))):
        raise AssertionError(
            "the forward pass is fine, but the gradient of masked_softmax is NaN on fully masked rows. "
            "Adding a -inf mask (scores + mask) lets the softmax's NaN flow back into the scores; "
            "masked_fill(~mask, -inf) or torch.where(mask, scores, -inf) gives masked scores no gradient.")
    oracle_leaf = scores.clone().requires_grad_(True)
    (oracle_weights(oracle_leaf, mask) * upstream).sum().backward()
    expect_close(grad, oracle_leaf.grad, "the gradient of masked_softmax with respect to the scores")

    big_weights = data["big"]
    expect_weights_shape(big_weights, big)
    if not np.all(np.isfinite(to_numpy(big_weights, "masked_softmax"))):
        raise AssertionError("masked_softmax overflowed for scores around 1e4: subtract the row maximum "
                             "before exponentiating (torch.softmax does this for you).")
    expect_close(big_weights, oracle_weights(big, big_mask), "masked_softmax for scores around 1e4")


def dim_cases(seeds):
    g = seeds.generator(2604)
    scores = torch.randn(3, 4, 5, generator=g)
    return scores, [(0, at_least_one_key(torch.rand(3, 4, 5, generator=g) > 0.5, dim=0)),
                    (-2, at_least_one_key(torch.rand(1, 4, 5, generator=g) > 0.5, dim=-2)),
                    (1, at_least_one_key(torch.rand(3, 4, 1, generator=g) > 0.5, dim=1))]


@probe
def masked_softmax_respects_dim(seeds, fn):
    scores, cases = dim_cases(seeds)
    return [_masked_softmax(fn, scores, mask, dim=dim) for dim, mask in cases]


@masked_softmax_respects_dim.judge
def judge_masked_softmax_respects_dim(seeds, results):
    scores, cases = dim_cases(seeds)
    for (dim, mask), weights in zip(cases, results):
        expect_weights_shape(weights, scores)
        expect_close(weights, oracle_weights_along(scores, mask, dim), f"masked_softmax(..., dim={dim})",
                     "Normalise along `dim` (torch.softmax(..., dim=dim)); the mask broadcasts as before.",
                     diagnoses={"your masked_softmax ignores `dim` and always normalises the last dimension.":
                                oracle_weights(scores, mask.expand(scores.shape))})


# ---------------------------------------------------------------- exercise 3: padding_mask
PADDING_ADVICE = "compare input_ids with pad_id yourself: the course's padding_mask is the reference here, not the answer."


def _padding(fn, input_ids, pad_id):
    return call(fn, input_ids, pad_id, name="padding_mask", forbidden=PADDING_SHORTCUTS,
                forbidden_advice=PADDING_ADVICE)


SHAPE_PAD_ID = 5


@probe
def padding_mask_shape(seeds, fn):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=SHAPE_PAD_ID)            # (3, 6)
    return _padding(fn, input_ids, SHAPE_PAD_ID)


@padding_mask_shape.judge
def judge_padding_mask_shape(seeds, mask):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=SHAPE_PAD_ID)
    B, T = input_ids.shape
    bool_mask(mask, "padding_mask(input_ids, pad_id)")
    shape = tuple(mask.shape)
    if shape == (B, 1, T, 1):
        raise AssertionError(
            f"padding_mask has shape {shape}: the padding is on the query axis, so you mask queries instead "
            "of keys. Padding must be hidden as a *key* (the last axis): (B, 1, 1, T), i.e. "
            "mask[:, None, None, :], so every real query stops looking at it.")
    if shape == (B, T):
        raise AssertionError(
            f"padding_mask has shape {shape}: (B, T) would broadcast against scores (B, h, T_q, T_k) as if B "
            "were the queries. Add the head and query axes: (B, 1, 1, T).")
    expect_shape(mask, (B, 1, 1, T), "padding_mask(input_ids, pad_id)",
                 "One row per sequence, with axes for heads and queries of size 1: (B, 1, 1, T).")


def padding_value_cases(seeds):
    """(pad_id, direction, sentences), the sentences in an order drawn for this run."""
    return [(5, "right", shuffled(seeds, 2620, SENTENCES)), (0, "left", shuffled(seeds, 2621, SENTENCES)),
            (12, "right", shuffled(seeds, 2622, SENTENCES[1:4]))]


@probe
def padding_mask_values(seeds, fn):
    return [_padding(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in padding_value_cases(seeds)]


@padding_mask_values.judge
def judge_padding_mask_values(seeds, masks):
    for (pad_id, direction, sentences), mask in zip(padding_value_cases(seeds), masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        bool_mask(mask, "padding_mask(input_ids, pad_id)")
        expected = attention_mask[:, None, None, :]
        expect_shape(mask, expected.shape, "padding_mask(input_ids, pad_id)", "(B, 1, 1, T).")
        diagnoses = {"you hid the real tokens and kept the padding: True means 'may attend' (a real token).":
                     ~expected}
        if pad_id != 0:
            diagnoses["you compared with 0 instead of pad_id: the padding id is whatever the tokenizer "
                      "uses, here " + str(pad_id) + "."] = (input_ids != 0)[:, None, None, :]
        expect_close(mask, expected, f"padding_mask with pad_id={pad_id}, {direction} padding",
                     "It must agree with the tokenizer's attention_mask: True at real tokens, False at padding.",
                     diagnoses=diagnoses)


REAL_TOKENS_PAD_ID, EXTRA_PADDING = 4, (0, 3)


def real_tokens_batches(seeds):
    """[(input_ids, attention_mask)] with no empty sentence, then with more padding appended."""
    sentences = shuffled(seeds, 2623, SENTENCES[:2] + SENTENCES[3:])
    input_ids, attention_mask = tokenized_batch(sentences, REAL_TOKENS_PAD_ID, "right")
    batches = []
    for extra in EXTRA_PADDING:  # appending more padding must change nothing either
        batches.append((F.pad(input_ids, (0, extra), value=REAL_TOKENS_PAD_ID),
                        F.pad(attention_mask, (0, extra), value=False)))
    return batches


@probe
def padding_never_changes_real_tokens(seeds, fn):
    return [_padding(fn, input_ids, REAL_TOKENS_PAD_ID) for input_ids, _ in real_tokens_batches(seeds)]


@padding_never_changes_real_tokens.judge
def judge_padding_never_changes_real_tokens(seeds, masks):
    """Each sentence alone gives the same outputs at its real tokens as inside a padded batch."""
    g = seeds.generator(2605)
    mha = seeded_mha(g)
    embedding = nn.Embedding(len(VOCABULARY) + 2, 8).double()  # [PAD] and [UNK] rows are random, as in a real model
    with torch.no_grad():
        embedding.weight.copy_(torch.randn(embedding.weight.shape, generator=g, dtype=torch.float64))
    for extra, (input_ids, attention_mask), mask in zip(EXTRA_PADDING, real_tokens_batches(seeds), masks):
        bool_mask(mask, "padding_mask(input_ids, pad_id)")
        with torch.no_grad():
            try:
                batched, _ = mha(embedding(input_ids), mask=mask)
            except RuntimeError as error:
                raise AssertionError(f"padding_mask's result {tuple(mask.shape)} does not broadcast against the "
                                     f"scores (B, h, T, T): {error}") from None
            for b, length in enumerate(attention_mask.sum(dim=-1).tolist()):
                alone, _ = mha(embedding(input_ids[b:b + 1, :length]))
                expect_close(batched[b, :length], alone[0], f"outputs at the real tokens of sentence {b}",
                             f"With {'more ' if extra else ''}padding appended, real tokens must give the same "
                             "outputs as the sentence alone: padding keys (the last axis of the mask) must be "
                             "hidden from every query.")


# ---------------------------------------------------------------- exercise 4: causal_padding_mask
def _causal_padding_mask(fn, input_ids, pad_id):
    helpers = {name: REFERENCE_HELPERS[name] for name in ("causal_mask", "padding_mask")}
    return call(fn, input_ids, pad_id, name="causal_padding_mask", helpers=helpers,
                forbidden=CAUSAL_PADDING_SHORTCUTS,
                forbidden_advice="combine causal_mask and padding_mask yourself: the course's causal_padding_mask "
                                 "is the reference here, not the answer.")


CAUSAL_PADDING_SHAPE_PAD_ID = 3


@probe
def causal_padding_mask_shape(seeds, fn):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=CAUSAL_PADDING_SHAPE_PAD_ID)            # (3, 6)
    return _causal_padding_mask(fn, input_ids, CAUSAL_PADDING_SHAPE_PAD_ID)


@causal_padding_mask_shape.judge
def judge_causal_padding_mask_shape(seeds, mask):
    input_ids, _ = tokenized_batch(SENTENCES[:3], pad_id=CAUSAL_PADDING_SHAPE_PAD_ID)
    B, T = input_ids.shape
    bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
    expect_shape(mask, (B, 1, T, T), "causal_padding_mask(input_ids, pad_id)",
                 "causal (T, T) & padding (B, 1, 1, T) broadcast to (B, 1, T, T): one (T, T) mask per sequence, "
                 "shared by all heads.")


def causal_padding_cases(seeds, stream, settings):
    return [(pad_id, direction, shuffled(seeds, stream + i, SENTENCES)) for i, (pad_id, direction) in enumerate(settings)]


@probe
def causal_padding_mask_values(seeds, fn):
    return [_causal_padding_mask(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in causal_padding_cases(seeds, 2630, [(3, "right"), (7, "left")])]


@causal_padding_mask_values.judge
def judge_causal_padding_mask_values(seeds, masks):
    cases = causal_padding_cases(seeds, 2630, [(3, "right"), (7, "left")])
    for (pad_id, direction, sentences), mask in zip(cases, masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        T = input_ids.shape[-1]
        causal, keys = oracle_causal(T), attention_mask[:, None, None, :]
        expected = causal & keys
        bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
        expect_shape(mask, expected.shape, "causal_padding_mask(input_ids, pad_id)", "(B, 1, T, T).")
        expect_close(mask, expected, f"causal_padding_mask with {direction} padding", diagnoses={
            "you combined the masks with | (or): a key may be attended only if it is in the past *and* is a "
            "real token, so combine with &.": causal | keys,
            "your padding hides padding *queries* (rows) instead of padding *keys* (columns).":
                causal & attention_mask[:, None, :, None],
            "your mask hides padding but not the future: add the causal part.": keys.expand(expected.shape),
            "your mask hides the future but not the padding: add the padding part.": causal.expand(expected.shape),
        })


BEHAVIOUR_SETTINGS = [(2, "right"), (9, "left")]


@probe
def causal_padding_mask_behaviour(seeds, fn):
    return [_causal_padding_mask(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in causal_padding_cases(seeds, 2640, BEHAVIOUR_SETTINGS)]


@causal_padding_mask_behaviour.judge
def judge_causal_padding_mask_behaviour(seeds, masks):
    """With the mask, a padded batch gives each real token what is_causal=True gives the sentence alone."""
    g = seeds.generator(2606)
    for (pad_id, direction, sentences), mask in zip(causal_padding_cases(seeds, 2640, BEHAVIOUR_SETTINGS), masks):
        input_ids, attention_mask = tokenized_batch(sentences, pad_id, direction)
        B, T = input_ids.shape
        q, k, v = (torch.randn(B, 2, T, 4, generator=g, dtype=torch.float64) for _ in range(3))
        bool_mask(mask, "causal_padding_mask(input_ids, pad_id)")
        batched = _attend(q, k, v, mask, "causal_padding_mask(input_ids, pad_id)")
        if not torch.isfinite(batched).all():
            raise AssertionError("attention under your mask gave NaN or inf.")
        for b in range(B):
            real = attention_mask[b]
            if not real.any():
                continue
            alone = F.scaled_dot_product_attention(q[b:b + 1, :, real], k[b:b + 1, :, real], v[b:b + 1, :, real],
                                                   is_causal=True)
            expect_close(batched[b][:, real], alone[0], f"outputs at the real tokens of sentence {b} ({direction} "
                         "padding)", "Under the combined mask each real token sees exactly the real tokens up to "
                         "itself, as torch's is_causal=True does for the sentence alone.")


# ---------------------------------------------------------------- exercise 5: cross_attention
# The exercise builds cross-attention from mha's projections: the module's own forward and any attention
# function that would do the scores-softmax-sum for the student are refused.
CROSS_SHORTCUTS = ["courselib.attention.MultiHeadAttention.forward", "courselib.attention.scaled_dot_product_attention",
                   "torch.nn.functional.scaled_dot_product_attention",
                   "torch.nn.functional.multi_head_attention_forward"]
CROSS_ADVICE = ("build cross-attention from mha.q_proj, mha.k_proj, mha.v_proj and mha.out_proj yourself: the "
                "module's forward and the attention functions are the references here, not the answer.")
NO_MODULE_CALL = ("Exercise 5 asks you to build cross-attention from mha.q_proj, mha.k_proj, mha.v_proj and "
                  "mha.out_proj: calling mha(...) (its forward) is not allowed.")


def refuse_module_call(*args, **kwargs):
    """Put in place of the probe's mha.forward: the projections stay, the module call teaches."""
    raise AssertionError(NO_MODULE_CALL)


def _cross(fn, decoder_states, encoder_states, mha, encoder_padding_mask=None):
    kwargs = {} if encoder_padding_mask is None else {"encoder_padding_mask": encoder_padding_mask}
    mha.forward = refuse_module_call   # an instance attribute: nn.Module.__call__ finds it before the class's
    with torch.no_grad():  # the checks compare numbers; no autograd graph is needed
        result = call(fn, decoder_states, encoder_states, mha, name="cross_attention", helpers=REFERENCE_HELPERS,
                      forbidden=CROSS_SHORTCUTS, forbidden_advice=CROSS_ADVICE, **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("cross_attention must return the pair (output, weights), as MultiHeadAttention does.")
    return tuple(result)


class ShortNamedMultiHeadAttention(reference.MultiHeadAttention):
    """The course's module with a one-line repr, so that error messages stay readable."""

    def __repr__(self):
        return f"MultiHeadAttention(d_model={self.q_proj.in_features}, num_heads={self.num_heads})"


def cross_problem(seeds, stream, B, T_dec, T_enc, d_model=8, num_heads=2, lengths=None):
    """The course's module with seeded weights, decoder and encoder states, and the encoder's padding mask."""
    g = seeds.generator(stream)
    mha = seeded_mha(g, d_model, num_heads, cls=ShortNamedMultiHeadAttention)
    decoder_states = torch.randn(B, T_dec, d_model, generator=g, dtype=torch.float64)
    encoder_states = torch.randn(B, T_enc, d_model, generator=g, dtype=torch.float64)
    mask = None
    if lengths is not None:
        mask = (torch.arange(T_enc)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    return mha, decoder_states, encoder_states, mask


SWAP_HINT = ("queries come from the decoder (mha.q_proj(decoder_states)) and keys and values from the encoder "
             "(mha.k_proj and mha.v_proj of encoder_states). You swapped them.")
SCALE_HINT = ("you divided the scores by √d_model: each head's dot product has d_head = d_model / h terms, so "
              "divide by √d_head (q.shape[-1] after the split), not by the model's width.")
MERGE_HINT = ("you merged the heads without moving the head axis back: (B, h, T_dec, d_head).reshape(B, T_dec, "
              "d_model) mixes tokens and heads. transpose(1, 2) before the reshape (or merge_heads).")


@probe
def cross_attention_shapes(seeds, fn):
    mha, dec, enc, mask = cross_problem(seeds, 2607, B=2, T_dec=3, T_enc=6, lengths=[6, 4])
    return [_cross(fn, dec, enc, mha, with_mask) for with_mask in (None, mask)]


@cross_attention_shapes.judge
def judge_cross_attention_shapes(seeds, results):
    for output, weights in results:
        if tuple(getattr(output, "shape", ())) == (2, 6, 8):
            raise AssertionError("cross_attention's output has shape (2, 6, 8), one row per *encoder* token: "
                                 + SWAP_HINT)
        expect_shape(output, (2, 3, 8), "cross_attention's output",
                     "One output per decoder token: (B, T_dec, d_model).")
        expect_shape(weights, (2, 2, 3, 6), "cross_attention's weights",
                     "(B, h, T_dec, T_enc): each decoder query spreads its weight over the encoder tokens.")


def by_hand(mha, dec, enc, mask, scale, merge):
    """Judge side: cross-attention from the projections with a chosen scale and head merge, for diagnoses."""
    h = mha.num_heads
    q, k, v = (reference.split_heads(x, h) for x in (mha.q_proj(dec), mha.k_proj(enc), mha.v_proj(enc)))
    scores = q @ k.transpose(-2, -1) / scale
    weights = reference.masked_softmax(scores, mask) if mask is not None else torch.softmax(scores, dim=-1)
    return mha.out_proj(merge(weights @ v)), weights


def cross_diagnoses(mha, dec, enc, mask):
    """{misconception: (wrong output, wrong weights)} for the outputs and weights a bug would give."""
    with torch.no_grad():
        diagnoses = {"you ignored encoder_padding_mask: decoder queries must not attend to the source's padding.":
                     mha(dec, enc)}
        (B, T_dec, d_model), T_enc = dec.shape, enc.shape[1]
        rectangular_causal = torch.ones(T_dec, T_enc, dtype=torch.bool).tril()
        combined = rectangular_causal if mask is None else rectangular_causal & mask
        diagnoses["you applied a causal mask in cross-attention: the source sentence is known in full, so every "
                  "decoder position may attend to every (real) encoder token. Only the decoder's "
                  "self-attention is causal."] = mha(dec, enc, mask=combined)
        if T_dec == T_enc:
            diagnoses[SWAP_HINT] = mha(enc, dec, mask=mask)
        d_head = d_model // mha.num_heads
        diagnoses[SCALE_HINT] = by_hand(mha, dec, enc, mask, d_model ** 0.5, reference.merge_heads)
        diagnoses[MERGE_HINT] = by_hand(mha, dec, enc, mask, d_head ** 0.5, lambda x: x.reshape(B, T_dec, d_model))
        _, weights = mha(dec, enc, mask=mask)
        values = reference.split_heads(mha.v_proj(enc), mha.num_heads)
        diagnoses["you skipped the output projection: return mha.out_proj(merge_heads(weights @ v)), as "
                  "MultiHeadAttention does."] = (reference.merge_heads(weights @ values), weights)
    return diagnoses


MATCH_CASES = [(2608, 2, 4, 6, [6, 3]), (2609, 3, 5, 5, [2, 5, 4]), (2610, 1, 2, 3, None)]


@probe
def cross_attention_matches_torch(seeds, fn):
    results = []
    for stream, B, T_dec, T_enc, lengths in MATCH_CASES:
        mha, dec, enc, mask = cross_problem(seeds, stream, B, T_dec, T_enc, lengths=lengths)
        results.append(_cross(fn, dec, enc, mha, mask))
    return results


@cross_attention_matches_torch.judge
def judge_cross_attention_matches_torch(seeds, results):
    for (stream, B, T_dec, T_enc, lengths), (output, weights) in zip(MATCH_CASES, results):
        mha, dec, enc, mask = cross_problem(seeds, stream, B, T_dec, T_enc, lengths=lengths)
        expected_output, expected_weights = torch_cross_attention(mha, dec, enc, mask)
        diagnoses = cross_diagnoses(mha, dec, enc, mask)
        expect_close(output, expected_output, "cross_attention's output",
                     "The same as torch.nn.MultiheadAttention(query=decoder, key=value=encoder, key_padding_mask="
                     "~mask) with the same weights.",
                     diagnoses={message: wrong_output for message, (wrong_output, _) in diagnoses.items()})
        expect_close(weights, expected_weights, "cross_attention's weights",
                     "Return the weights of the same attention: softmax of decoder queries · encoder keys / "
                     "√d_head, masked at the encoder's padding, (B, h, T_dec, T_enc).",
                     diagnoses={message: wrong_weights for message, (_, wrong_weights) in diagnoses.items()})


@probe
def cross_attention_ignores_encoder_padding(seeds, fn):
    mha, dec, enc, mask = cross_problem(seeds, 2611, B=2, T_dec=4, T_enc=5, lengths=[5, 3])
    g = seeds.generator(2612)
    # More padding (random vectors, as real pad embeddings are) must not change any decoder output.
    padded_enc = torch.cat([enc, torch.randn(2, 3, 8, generator=g, dtype=torch.float64)], dim=1)
    padded_mask = F.pad(mask, (0, 3), value=False)
    # Decoder positions don't see each other in cross-attention: changing one changes only its own output.
    changed_dec = dec.clone()
    changed_dec[:, 2] = torch.randn(2, 8, generator=g, dtype=torch.float64)
    # A source made only of padding: nothing to attend to, weights all zero, no NaN.
    empty_mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    empty_mask[0, ..., :2] = True
    return {"plain": _cross(fn, dec, enc, mha, mask), "padded": _cross(fn, dec, padded_enc, mha, padded_mask),
            "changed": _cross(fn, changed_dec, enc, mha, mask), "empty": _cross(fn, dec, enc, mha, empty_mask)}


@cross_attention_ignores_encoder_padding.judge
def judge_cross_attention_ignores_encoder_padding(seeds, results):
    output, _ = results["plain"]
    padded_output, padded_weights = results["padded"]
    expect_close(padded_output, output, "decoder outputs after appending encoder padding",
                 "Appending padding to the source must change nothing: its keys are masked for every query.")
    if np.abs(to_numpy(padded_weights, "weights")[..., 5:]).max() > 1e-9:
        raise AssertionError("decoder queries gave weight to encoder padding: apply encoder_padding_mask.")
    changed_output, _ = results["changed"]
    others = [0, 1, 3]
    expect_close(to_numpy(changed_output, "cross_attention's output")[:, others], to_numpy(output, "output")[:, others],
                 "the other decoder positions' outputs",
                 "In cross-attention a decoder position looks only at the encoder; changing decoder token 2 "
                 "may change output 2 only. Did you take keys or values from the decoder?")
    empty_output, empty_weights = results["empty"]
    empty_output, empty_weights = to_numpy(empty_output, "output"), to_numpy(empty_weights, "weights")
    if not (np.all(np.isfinite(empty_output)) and np.all(np.isfinite(empty_weights))):
        raise AssertionError("cross_attention gave NaN for a source sentence made only of padding: its weights "
                             "must be all zeros (masked_softmax handles fully masked rows).")
    expect_close(empty_weights[1], np.zeros((2, 4, 5)), "the weights for an all-padding source",
                 "With nothing to attend to, every weight is 0.")


# ---------------------------------------------------------------- exercise 6 (optional stretch): packed_causal_mask
PACKED_SHORTCUTS = ["torch.nn.attention.flex_attention.create_mask",
                    "torch.nn.attention.flex_attention.create_block_mask"]
PACKED_ADVICE = ("compare positions and document ids yourself: flex_attention's create_mask is the oracle here, "
                 "not the answer.")


def _packed(fn, document_ids, window):
    kwargs = {} if window is None else {"window": window}
    return call(fn, document_ids.clone(), name="packed_causal_mask", forbidden=PACKED_SHORTCUTS,
                forbidden_advice=PACKED_ADVICE, helpers={"causal_mask": REFERENCE_HELPERS["causal_mask"]}, **kwargs)


def packing(seeds, stream, B, T):
    """(B, T) document ids of packed rows: documents of random lengths laid end to end, numbered from 0."""
    rng = seeds.random(stream)
    rows = []
    for _ in range(B):
        row, document = [], 0
        while len(row) < T:
            row += [document] * rng.randint(1, max(1, T // 2))
            document += 1
        rows.append(row[:T])
    return torch.tensor(rows)


def oracle_packed(document_ids, window=None):
    """The definition, one (query t, key s) pair at a time: same document, s <= t, t - s < window."""
    B, T = document_ids.shape
    mask = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            for s in range(T):
                mask[b, 0, t, s] = bool(document_ids[b, t] == document_ids[b, s] and s <= t
                                        and (window is None or t - s < window))
    return mask


def flex_packed(document_ids, window=None):
    """The same mask from torch's flex_attention create_mask with a mask_mod (it runs on CPU), or None."""
    try:
        from torch.nn.attention.flex_attention import create_mask
    except ImportError:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (kv_idx <= q_idx)
        return allowed if window is None else allowed & (q_idx - kv_idx < window)

    B, T = document_ids.shape
    return create_mask(mask_mod, B, None, T, T, device="cpu")


def expected_packed(seeds, document_ids, window=None):
    """The loop's mask, cross-checked with the library's where the grader judges. (create_mask's first call
    warms up torch's vmap, about 0.3 s of CPU, too much for a notebook that judges itself in its kernel.)"""
    expected = oracle_packed(document_ids, window)
    library = flex_packed(document_ids, window) if seeds.token != LOCAL_TOKEN else None
    if library is not None and not torch.equal(library, expected):  # the two oracles must agree
        raise RuntimeError("the packed-mask oracles disagree: fix the check, not the answer")
    return expected


def packed_diagnoses(document_ids, window):
    B, T = document_ids.shape
    positions = torch.arange(T)
    causal = (positions[None, :] <= positions[:, None])[None, None]              # (1, 1, T, T)
    same = (document_ids[:, :, None] == document_ids[:, None, :])[:, None]       # (B, 1, T, T)
    lag = positions[:, None] - positions[None, :]
    diagnoses = {
        "your mask is a plain causal mask: it lets a token attend to earlier *documents* packed into the same "
        "row. Also require document_ids[b, s] == document_ids[b, t].": causal.expand(B, 1, T, T),
        "your mask hides other documents but is not causal: a token sees later tokens of its own document. "
        "Also require s <= t.": same,
        "True means 'may attend' in this course: your mask is True exactly where attention is forbidden.":
            ~oracle_packed(document_ids, window),
    }
    if window is not None:
        diagnoses["your window is off by one: with window w a query sees w keys, itself and the w - 1 before it, "
                  "so the rule is t - s < window, not t - s <= window."] = causal & same & (lag <= window)
        diagnoses[f"you ignored window={window}: with a window, a query may also attend only to the keys "
                  "t - window < s <= t."] = causal & same
    return diagnoses


PACKED_VALUE_CASES = [(2650, 3, 10, None), (2651, 2, 12, 3), (2652, 2, 7, 1), (2653, 1, 1, None),
                      (2654, 2, 9, 20), (2655, 2, 11, 4)]


def packed_value_cases(seeds):
    return [(packing(seeds, stream, B, T), window) for stream, B, T, window in PACKED_VALUE_CASES]


def check_packed_mask(mask, document_ids, window):
    B, T = document_ids.shape
    name = f"packed_causal_mask(document_ids of shape {(B, T)}" + ("" if window is None else f", window={window}") + ")"
    bool_mask(mask, name)
    expect_shape(mask, (B, 1, T, T), name, "(B, 1, T, T): one (T, T) mask per packed row, and a head axis of size 1 "
                 "that broadcasts over the heads of the scores (B, h, T, T).")
    return name


@probe
def stretch_packed_causal_mask_values(seeds, fn):
    return [_packed(fn, document_ids, window) for document_ids, window in packed_value_cases(seeds)]


@stretch_packed_causal_mask_values.judge
def judge_stretch_packed_causal_mask_values(seeds, masks):
    for (document_ids, window), mask in zip(packed_value_cases(seeds), masks):
        name = check_packed_mask(mask, document_ids, window)
        expect_close(mask, expected_packed(seeds, document_ids, window), name,
                     "Position t may attend to s when both are in the same document, s <= t, and (with a window) "
                     "t - s < window.", diagnoses=packed_diagnoses(document_ids, window))


PACKED_BEHAVIOUR_CASES = [(2660, 2, 12, None), (2661, 2, 10, 3)]


@probe
def stretch_packed_causal_mask_behaviour(seeds, fn):
    return [_packed(fn, packing(seeds, stream, B, T), window) for stream, B, T, window in PACKED_BEHAVIOUR_CASES]


@stretch_packed_causal_mask_behaviour.judge
def judge_stretch_packed_causal_mask_behaviour(seeds, masks):
    """Attention over a packed row under the mask equals attention over each document alone."""
    g = seeds.generator(2662)
    for (stream, B, T, window), mask in zip(PACKED_BEHAVIOUR_CASES, masks):
        document_ids = packing(seeds, stream, B, T)
        name = check_packed_mask(mask, document_ids, window)
        q, k, v = (torch.randn(B, 2, T, 4, generator=g, dtype=torch.float64) for _ in range(3))
        packed = _attend(q, k, v, mask, name)
        for b in range(B):
            for document in document_ids[b].unique().tolist():
                inside = document_ids[b] == document
                n = int(inside.sum())
                alone_mask = torch.ones(n, n, dtype=torch.bool).tril()
                if window is not None:
                    alone_mask = alone_mask.triu(1 - window)   # keys t - window + 1 .. t
                alone = F.scaled_dot_product_attention(q[b][:, inside], k[b][:, inside], v[b][:, inside],
                                                       attn_mask=alone_mask)
                expect_close(packed[b][:, inside], alone, f"the outputs of document {document} in packed row {b}"
                             + ("" if window is None else f" (window={window})"),
                             "Packed into a row, each document must attend exactly as it would alone: no key of "
                             "another document, no future key" + ("" if window is None else
                                                                  ", and only the last `window` keys") + ".")
