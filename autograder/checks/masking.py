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
import torch
import torch.nn.functional as F

from autograder.checks.common import call, probe
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


def seeded_mha(g, d_model=8, num_heads=2, cls=reference.MultiHeadAttention):
    """The course's module in float64 with weights from `g` (uniform in ±1/√d_model, like nn.Linear's
    own initialisation), so that probe and judge build the same one."""
    mha = cls(d_model, num_heads).double().eval()
    with torch.no_grad():
        for parameter in mha.parameters():
            parameter.copy_((torch.rand(parameter.shape, generator=g, dtype=torch.float64) * 2 - 1) / d_model ** 0.5)
    return mha


# ---------------------------------------------------------------- exercise 1: causal_mask
CAUSAL_ADVICE = ("build the mask yourself (torch.ones(...).tril(), or comparing positions): the course's "
                 "causal_mask and torch's generate_square_subsequent_mask are the references here, not the answer.")


def _causal(fn, T):
    return call(fn, T, name="causal_mask", forbidden=CAUSAL_SHORTCUTS, forbidden_advice=CAUSAL_ADVICE)


def causal_sizes(seeds):
    return (3, 7, 10, 1, seeds.random(2600).randint(2, 16))


@probe
def causal_mask_values(seeds, fn):
    return [_causal(fn, T) for T in causal_sizes(seeds)]


PEEK_T, PEEK_CUT, PREFIXES = 7, 4, (3, 5)


@probe
def causal_mask_no_peeking(seeds, fn):
    """The student's masks; the judge attends with them."""
    return {T: _causal(fn, T) for T in (PEEK_T, 1, *PREFIXES)}


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


def at_least_one_key(mask, dim=-1):
    """Give every row of a random mask one allowed key, so that no row is fully masked."""
    mask = mask.clone()
    index = [slice(None)] * mask.dim()
    index[dim] = 0
    mask[tuple(index)] = True
    return mask


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


def padding_value_cases(seeds):
    """(pad_id, direction, sentences), the sentences in an order drawn for this run."""
    return [(5, "right", shuffled(seeds, 2620, SENTENCES)), (0, "left", shuffled(seeds, 2621, SENTENCES)),
            (12, "right", shuffled(seeds, 2622, SENTENCES[1:4]))]


@probe
def padding_mask_values(seeds, fn):
    return [_padding(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in padding_value_cases(seeds)]


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


def causal_padding_cases(seeds, stream, settings):
    return [(pad_id, direction, shuffled(seeds, stream + i, SENTENCES)) for i, (pad_id, direction) in enumerate(settings)]


@probe
def causal_padding_mask_values(seeds, fn):
    return [_causal_padding_mask(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in causal_padding_cases(seeds, 2630, [(3, "right"), (7, "left")])]


BEHAVIOUR_SETTINGS = [(2, "right"), (9, "left")]


@probe
def causal_padding_mask_behaviour(seeds, fn):
    return [_causal_padding_mask(fn, tokenized_batch(sentences, pad_id, direction)[0], pad_id)
            for pad_id, direction, sentences in causal_padding_cases(seeds, 2640, BEHAVIOUR_SETTINGS)]


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


@probe
def cross_attention_shapes(seeds, fn):
    mha, dec, enc, mask = cross_problem(seeds, 2607, B=2, T_dec=3, T_enc=6, lengths=[6, 4])
    return [_cross(fn, dec, enc, mha, with_mask) for with_mask in (None, mask)]


MATCH_CASES = [(2608, 2, 4, 6, [6, 3]), (2609, 3, 5, 5, [2, 5, 4]), (2610, 1, 2, 3, None)]


@probe
def cross_attention_matches_torch(seeds, fn):
    results = []
    for stream, B, T_dec, T_enc, lengths in MATCH_CASES:
        mha, dec, enc, mask = cross_problem(seeds, stream, B, T_dec, T_enc, lengths=lengths)
        results.append(_cross(fn, dec, enc, mha, mask))
    return results


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


PACKED_VALUE_CASES = [(2650, 3, 10, None), (2651, 2, 12, 3), (2652, 2, 7, 1), (2653, 1, 1, None),
                      (2654, 2, 9, 20), (2655, 2, 11, 4)]


def packed_value_cases(seeds):
    return [(packing(seeds, stream, B, T), window) for stream, B, T, window in PACKED_VALUE_CASES]


@probe
def stretch_packed_causal_mask_values(seeds, fn):
    return [_packed(fn, document_ids, window) for document_ids, window in packed_value_cases(seeds)]


PACKED_BEHAVIOUR_CASES = [(2660, 2, 12, None), (2661, 2, 10, 3)]


@probe
def stretch_packed_causal_mask_behaviour(seeds, fn):
    return [_packed(fn, packing(seeds, stream, B, T), window) for stream, B, T, window in PACKED_BEHAVIOUR_CASES]
