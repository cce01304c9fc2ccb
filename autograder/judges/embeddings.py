"""Hidden checks for embeddings, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/embeddings.py, which also builds the
inputs both sides rebuild from the seeds."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import expect_close, expect_shape
from autograder.checks.embeddings import (
    BACKWARD_DTYPE_CASE,
    BACKWARD_SCALE_CASES,
    BACKWARD_VALUE_CASES,
    COSINE_CASES,
    EMBED_CASES,
    FORMAT_QUERIES,
    FORMAT_TABLE,
    IN_RANGE_IDS,
    OUT_OF_RANGE_CASES,
    PADDING_MODULE,
    SCALE_ENSURE,
    SCALING_CASES,
    SHAPES_IDS,
    SHAPES_MODULE,
    SHAPE_CASES,
    SHAPE_VOCAB,
    TIED_SHAPE_HIDDEN,
    TIED_SHAPE_TABLE,
    TIED_VALUE_CASES,
    TIE_CASES,
    TIE_TABLE,
    TRANSPOSE_HINT,
    VALUE_CASES,
    backward_problem,
    backward_value_problem,
    cosine_table,
    embed_problem,
    embed_uses_one_hot,
    embed_values,
    nearest_neighbours_cosine,
    nearest_neighbours_format,
    nearest_neighbours_ties,
    one_hot_rejects_out_of_range,
    one_hot_shape_and_dtype,
    one_hot_values,
    padding_problem,
    scaling_problem,
    sharing_problem,
    spied_problem,
    stretch_embedding_backward_options,
    stretch_embedding_backward_values,
    tie_problem,
    tied_lm_logits_shapes,
    tied_lm_logits_shares_weights,
    tied_lm_logits_values,
    tied_value_problem,
    token_embedding_padding,
    token_embedding_scaling,
    token_embedding_shapes,
    value_ids,
)


@one_hot_shape_and_dtype.judge
def judge_one_hot_shape_and_dtype(seeds, results):
    vocab_size = SHAPE_VOCAB
    for (_, shape), result in zip(SHAPE_CASES, results, strict=True):
        found = tuple(result.shape)
        if found in {(vocab_size, *shape), (*shape[:-1], vocab_size, shape[-1])} and found != (*shape, vocab_size):
            raise AssertionError(
                f"one_hot of ids {shape} has shape {found}: the vocabulary is on the wrong axis. It must be the "
                f"LAST axis, {(*shape, vocab_size)}, so that one_hot(ids, V) @ E (E is (V, d)) gives (..., d).")
        expect_shape(result, (*shape, vocab_size), f"one_hot of ids {shape}",
                     "The result has the shape of ids plus one last axis of length vocab_size.")
        if result.dtype != torch.float32:
            raise AssertionError(
                f"one_hot returned dtype {result.dtype}; it must be torch.float32. Integer or bool one-hot "
                "vectors can't be multiplied with a float embedding matrix (F.one_hot returns int64: "
                "convert with .float()).")


@one_hot_values.judge
def judge_one_hot_values(seeds, results):
    for (stream, shape, vocab_size), result in zip(VALUE_CASES, results, strict=True):
        expected = F.one_hot(value_ids(seeds, stream, shape, vocab_size), vocab_size).double()
        expect_close(result, expected, f"one_hot(ids of shape {shape}, {vocab_size})",
                     "Each vector is all zeros except a 1.0 at position ids[...] (the first token is id 0).",
                     diagnoses={
                         "your ones are one position too far right: ids count from 0, so token 0 sets "
                         "position 0.": F.pad(expected, (1, 0))[..., :-1],
                         "your ones are one position too far left: ids count from 0, so token i sets "
                         "position i.": F.pad(expected, (0, 1))[..., 1:],
                     })


@one_hot_rejects_out_of_range.judge
def judge_one_hot_rejects_out_of_range(seeds, data):
    for (bad_ids, vocab_size), error in zip(OUT_OF_RANGE_CASES, data["raised"], strict=True):
        if error is None:
            raise AssertionError(
                f"one_hot({bad_ids}, vocab_size={vocab_size}) returned a result. An id outside "
                f"0..{vocab_size - 1} must raise ValueError: a silent all-zero (or wrapped-around) row would "
                "hide a tokenizer/model mismatch.")
        if not error["is_value_error"]:
            raise AssertionError(
                f"one_hot({bad_ids}, vocab_size={vocab_size}) raised {error['type']}: {error['message']}. "
                "Check the range yourself and raise ValueError with a message naming the bad id.")
    good = torch.tensor(IN_RANGE_IDS)
    expect_close(data["in_range"], F.one_hot(good, 5).double(), f"one_hot({IN_RANGE_IDS}, 5)",
                 "Ids from 0 to vocab_size - 1 are all valid; only ids outside that range raise.")


@embed_values.judge
def judge_embed_values(seeds, results):
    for case, result in zip(EMBED_CASES, results, strict=True):
        ids, E = embed_problem(seeds, *case)
        shape, d = case[1], case[3]
        expect_shape(result, (*shape, d), f"embed(ids {shape}, E {tuple(E.shape)})",
                     "ids (...,) and E (V, d) give (..., d): one row of E per token.")
        if result.dtype != E.dtype:
            raise AssertionError(f"embed returned dtype {result.dtype} for an E of dtype {E.dtype}: the vectors "
                                 "are rows of E, so keep E's dtype (convert the one-hot to E.dtype, not E).")
        layer = nn.Embedding.from_pretrained(E)
        expect_close(result, layer(ids), f"embed(ids {shape}, E {tuple(E.shape)}) vs torch.nn.Embedding",
                     "Row t of the result is E[ids[t]].")
        expect_close(result, F.embedding(ids, E), "embed vs F.embedding")


@embed_uses_one_hot.judge
def judge_embed_uses_one_hot(seeds, data):
    ids, E = spied_problem(seeds)
    vocab_sizes = data["vocab_sizes"]
    if not vocab_sizes:
        raise AssertionError("embed never called one_hot: compute the lookup as one_hot(ids, V) @ E. "
                             "(E[ids] gives the same numbers, but this exercise is about seeing the lookup "
                             "as a matrix product.)")
    if any(v != E.shape[0] for v in vocab_sizes):
        raise AssertionError(f"embed called one_hot with vocab_size={vocab_sizes[0]}, but E has "
                             f"{E.shape[0]} rows: the vocabulary size is E.shape[0].")
    expect_close(data["result"], 2.0 * E[ids], "embed with a one_hot that returns 2 × one-hot",
                 "embed called one_hot but its result doesn't come from that one-hot: return "
                 "one_hot(ids, V) @ E, not E[ids].",
                 diagnoses={"embed called one_hot but returned E[ids] anyway: the result must be the "
                            "product one_hot(ids, V) @ E.": E[ids]})


@token_embedding_shapes.judge
def judge_token_embedding_shapes(seeds, data):
    vocab_size, d_model = SHAPES_MODULE
    expect_shape(data["weight"], (vocab_size, d_model), "self.embedding.weight",
                 "The table has one row of width d_model per token: (vocab_size, d_model).")
    count = data["parameter_count"]
    if count != vocab_size * d_model:
        raise AssertionError(f"TokenEmbedding({vocab_size}, {d_model}) has {count} parameters; its only "
                             f"parameter is the table, vocab_size × d_model = {vocab_size * d_model}. "
                             "The √d_model factor is a constant, not a learned parameter.")
    for (_, shape), output in zip(SHAPES_IDS, data["outputs"], strict=True):
        expect_shape(output, (*shape, d_model), f"TokenEmbedding output for ids {shape}",
                     "ids (...,) become vectors (..., d_model); for a padded batch (B, T) -> (B, T, d_model).")


@token_embedding_scaling.judge
def judge_token_embedding_scaling(seeds, results):
    for case, (scaled, unscaled) in zip(SCALING_CASES, results, strict=True):
        _, vocab_size, d_model, _ = case
        table, ids = scaling_problem(seeds, *case)
        lookup = nn.Embedding.from_pretrained(table)(ids)
        expect_close(scaled, lookup * math.sqrt(d_model), f"TokenEmbedding(scale=True) with d_model={d_model}",
                     "With scale=True, multiply the looked-up rows by √d_model in forward.",
                     diagnoses={
                         "with scale=True your vectors are the table rows unscaled: multiply them by "
                         "√d_model in forward (scaling the initial weights instead is undone as soon as "
                         "the weights are trained or loaded).": lookup,
                         "you scaled by d_model; the original Transformer scales by √d_model.": lookup * d_model,
                         "you divided by √d_model; the original Transformer multiplies by √d_model.":
                             lookup / math.sqrt(d_model),
                         "you scaled by √vocab_size; the factor is √d_model, the width of the vectors.":
                             lookup * math.sqrt(vocab_size),
                     })
        expect_close(unscaled, lookup, f"TokenEmbedding(scale=False) with d_model={d_model}",
                     "With scale=False (as in BERT and GPT-2) the vectors are the table rows, unchanged.",
                     diagnoses={"with scale=False the vectors must not be scaled (BERT doesn't scale), but "
                                "yours are multiplied by √d_model: apply the factor only when scale=True.":
                                lookup * math.sqrt(d_model)})


@token_embedding_padding.judge
def judge_token_embedding_padding(seeds, data):
    vocab_size, d_model, pad = PADDING_MODULE
    ids, upstream = padding_problem(seeds)
    # nn.Embedding's gradient: the sum of the upstream gradients at each token's positions, none for padding.
    oracle = nn.Embedding(vocab_size, d_model, padding_idx=pad)
    (oracle(ids) * upstream).sum().backward()
    expected = oracle.weight.grad
    for scale, result in zip((True, False), data["padded"], strict=True):
        if not torch.all(result["table"][pad] == 0):
            raise AssertionError(f"TokenEmbedding(..., padding_idx={pad}): row {pad} of the table is not zero. "
                                 "The padding row must start as zeros and stay there: pass padding_idx to "
                                 "nn.Embedding.")
        if result["output"][ids == pad].abs().max() > 0:
            raise AssertionError(f"the vectors at padding positions (id {pad}) are not zero.")
        grad = result["grad"]
        if grad[pad].abs().max() > 0:
            raise AssertionError(f"the padding row {pad} received a gradient, so one training step would "
                                 "make it non-zero. nn.Embedding(..., padding_idx=pad) never updates that row; "
                                 "zeroing it once at the start is not enough.")
        # Compare up to the constant factor, so that a wrong scale is graded by token_embedding_scaling only.
        factor = float((grad * expected).sum() / (expected * expected).sum())
        expect_close(grad, factor * expected, f"the gradient of the table (padding_idx={pad}, scale={scale})",
                     "Every row but the padding row gets the sum of the upstream gradients at the positions "
                     "of its token, as nn.Embedding's does.")
    # Without padding_idx, no row is special: token 0 is an ordinary token and is trained.
    if torch.any(data["unpadded"]["table"].abs().sum(dim=-1) == 0):
        raise AssertionError("with padding_idx=None a row of the table is zero: no token is padding unless "
                             "padding_idx says so (don't default it to 0).")
    if data["unpadded"]["grad"][0].abs().max() == 0:
        raise AssertionError("with padding_idx=None token 0 got no gradient: only the padding_idx row is frozen, "
                             "and here there is none.")


@tied_lm_logits_shapes.judge
def judge_tied_lm_logits_shapes(seeds, results):
    _, vocab_size, d = TIED_SHAPE_TABLE
    for (_, lead), logits in zip(TIED_SHAPE_HIDDEN, results, strict=True):
        expect_shape(logits, (*lead, vocab_size), f"tied_lm_logits(hidden {(*lead, d)}, E {(vocab_size, d)})",
                     f"One score per vocabulary entry: (..., d) -> (..., V). {TRANSPOSE_HINT}")


@tied_lm_logits_values.judge
def judge_tied_lm_logits_values(seeds, results):
    for case, result in zip(TIED_VALUE_CASES, results, strict=True):
        _, _, vocab_size, d = case
        hidden, weight = tied_value_problem(seeds, *case)
        logits = hidden @ weight.T
        diagnoses = {
            "your scores are probabilities (a softmax): return the logits; the softmax belongs to the "
            "loss or the sampler.": torch.softmax(logits, dim=-1),
            "your logits are scaled by 1/√d: tying shares E, it doesn't rescale the scores.":
                logits / math.sqrt(d),
            "your logits are scaled by √d: tying shares E, it doesn't rescale the scores.": logits * math.sqrt(d),
        }
        if vocab_size == d:  # square: hidden @ E runs, and is wrong
            diagnoses["you multiplied by E, not by its transpose: logit i is hidden · E[i], so use Eᵀ."] = \
                hidden @ weight
        expect_close(result, F.linear(hidden, weight), f"tied_lm_logits (V={vocab_size}, d={d})",
                     "Logit i is the dot product of the hidden vector with E[i]: hidden @ Eᵀ, with no bias.",
                     diagnoses=diagnoses)


@tied_lm_logits_shares_weights.judge
def judge_tied_lm_logits_shares_weights(seeds, grad):
    _, hidden, upstream = sharing_problem(seeds)
    if grad is None:
        raise AssertionError("no gradient reached embedding_weight through tied_lm_logits: don't detach it, "
                             "copy it (.data, .clone().detach(), torch.tensor(...)) or build a new nn.Linear "
                             "from it. Tying means the same parameter, so the output layer's gradient trains "
                             "the embedding too.")
    expected = torch.einsum("...v,...d->vd", upstream, hidden)
    expect_close(grad, expected, "the gradient reaching the embedding table through the logits",
                 "The gradient of sum(upstream * hidden @ Eᵀ) with respect to E is upstreamᵀ @ hidden.")


def cosine_oracle(E, index):
    return F.cosine_similarity(E[index].unsqueeze(0), E, dim=-1)


def ranked(similarity, index, k, descending=True):
    """Indices by similarity (ties: smaller index first), the query left out."""
    order = torch.sort(similarity.double(), descending=descending, stable=True).indices.tolist()
    return [i for i in order if i != index][:k]


def _expect_indices(found, expected, name, diagnoses=()):
    if found == expected:
        return
    for misconception, wrong in diagnoses:
        if found == wrong:
            raise AssertionError(f"{name} is wrong: {misconception}")
    raise AssertionError(f"{name} returned {found}, expected {expected}: the k other tokens with the largest "
                         "cosine similarity to E[index], most similar first (ties: smaller index first).")


@nearest_neighbours_format.judge
def judge_nearest_neighbours_format(seeds, results):
    vocab_size = FORMAT_TABLE[1]
    for (index, k), found in zip(FORMAT_QUERIES, results, strict=True):
        if index in found:
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) = {found} contains the query {index} "
                                 "itself; the query itself is excluded (it is always its own best match).")
        if len(found) != k:
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) returned {len(found)} indices, not k={k}.")
        if len(set(found)) != k or not all(0 <= i < vocab_size for i in found):
            raise AssertionError(f"nearest_neighbours(E, {index}, {k}) = {found}: expected k distinct row "
                                 f"indices of E, each between 0 and {vocab_size - 1}.")


@nearest_neighbours_cosine.judge
def judge_nearest_neighbours_cosine(seeds, results):
    for (stream, vocab_size, d, index, k, dtype), found in zip(COSINE_CASES, results, strict=True):
        E = cosine_table(seeds, stream, vocab_size, d, dtype)
        similarity = cosine_oracle(E, index)
        dot = E @ E[index]
        distance = -(E - E[index]).norm(dim=-1)
        _expect_indices(found, ranked(similarity, index, k), f"nearest_neighbours(E {tuple(E.shape)}, {index}, {k})",
                        diagnoses=[
                            ("it matches a ranking by dot product. The dot product prefers long vectors; "
                             "cosine similarity divides by both lengths, so only the direction counts.",
                             ranked(dot, index, k)),
                            ("it lists the least similar tokens: sort by cosine similarity in decreasing order "
                             "(most similar first).", ranked(similarity, index, k, descending=False)),
                            ("it matches a ranking by Euclidean distance, which depends on the lengths; "
                             "use cosine similarity.", ranked(distance, index, k)),
                            ("it includes the query itself: the query is excluded, whatever its similarity.",
                             ranked(similarity, -1, k)),
                        ])


@nearest_neighbours_ties.judge
def judge_nearest_neighbours_ties(seeds, results):
    for index, k, expected in TIE_CASES:  # the ties are exact in torch's own cosine similarity
        if ranked(cosine_oracle(TIE_TABLE, index), index, k) != expected:
            raise RuntimeError("the tie example no longer has the intended ties")
    E, queries = tie_problem(seeds)
    for (index, k), found in zip(queries, results, strict=True):
        expected = ranked(cosine_oracle(E, index), index, k)
        if found == expected:
            continue
        if index in found:
            raise AssertionError(
                f"nearest_neighbours(E, {index}, {k}) = {found} contains the query {index}. Another token can "
                "be exactly as similar as the query to itself (a duplicate vector), so dropping the first "
                "result is not enough: exclude the query by its index (e.g. set its similarity to -inf).")
        raise AssertionError(
            f"nearest_neighbours(E, {index}, {k}) = {found}, expected {expected}. This table has exact ties "
            "(copies of a row, and rows mirrored around the query); break them by the smaller index, e.g. with torch.sort(similarity, "
            "descending=True, stable=True). (torch.topk and a plain sort leave the order of ties unspecified.)")


def oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx=None, scale_grad_by_freq=False):
    """The gradient that autograd computes through torch.nn.functional.embedding, for the table."""
    weight = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype, requires_grad=True)
    F.embedding(ids, weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq).backward(grad_output)
    return weight.grad


def _backward_shape(result, ids, grad_output, vocab_size, name):
    batch, length, d = grad_output.shape
    found = tuple(result.shape)
    hint = {(batch * length, d): "that is one row per POSITION (B·T of them): add the rows of the same token "
                                 "together into one row per vocabulary entry.",
            (batch, length, d): "that is grad_output's shape: the gradient of the TABLE has one row per "
                                "vocabulary entry.",
            (d, vocab_size): "that is the transpose: the table is (vocab_size, d), and so is its gradient."}
    if found in hint and found != (vocab_size, d):
        raise AssertionError(f"{name} has shape {found}: {hint[found]}")
    expect_shape(result, (vocab_size, d), name, "The gradient of the table has the table's shape (vocab_size, d).")


def _last_write_wins(ids, grad_output, vocab_size, padding_idx=None, first=False):
    """What `grad[ids] = grad_output` leaves: one occurrence per token (the last, or the first)."""
    grad = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    rows = list(zip(ids.reshape(-1).tolist(), grad_output.reshape(-1, grad_output.shape[-1])))
    for token, row in (reversed(rows) if first else rows):
        grad[token] = row
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad


def _scaled_per_sequence(ids, grad_output, vocab_size, padding_idx=None):
    """scale_grad_by_freq with counts taken in each sequence, not over the batch."""
    total = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    for sequence_ids, sequence_grads in zip(ids, grad_output):
        total += oracle_embedding_grad(sequence_ids, sequence_grads, vocab_size, padding_idx, True)
    return total


@stretch_embedding_backward_values.judge
def judge_stretch_embedding_backward_values(seeds, results):
    for case, result in zip(BACKWARD_VALUE_CASES, results, strict=True):
        _, batch, length, vocab_size, d, padding_idx, _ = case
        ids, grad_output = backward_value_problem(seeds, *case)
        name = f"embedding_backward(ids {tuple(ids.shape)}, V={vocab_size}, padding_idx={padding_idx})"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        expected = oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx)
        diagnoses = {
            "a token that occurs several times keeps only one of its upstream gradients (grad[ids] = g: the "
            "last write wins). It must get the SUM of them: accumulate with index_add_ / scatter_add_.":
                _last_write_wins(ids, grad_output, vocab_size, padding_idx),
            "a token that occurs several times keeps only its first upstream gradient. It must get the SUM of "
            "them all.": _last_write_wins(ids, grad_output, vocab_size, padding_idx, first=True),
            "you divided by the token counts although scale_grad_by_freq=False: by default each token gets "
            "the plain SUM of its upstream gradients.":
                oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx, True),
        }
        if padding_idx is not None:
            diagnoses[f"the padding row {padding_idx} received a gradient: with padding_idx set, that row's "
                      "gradient is zero (nn.Embedding never trains it)."] = \
                oracle_embedding_grad(ids, grad_output, vocab_size)
        expect_close(result, expected, name, rtol=1e-9, atol=1e-12, diagnoses=diagnoses,
                     hint="Row i is the sum of grad_output over every position where token i occurs: Xᵀ G.")


@stretch_embedding_backward_options.judge
def judge_stretch_embedding_backward_options(seeds, data):
    for case, result in zip(BACKWARD_SCALE_CASES, data["scaled"], strict=True):
        stream, batch, length, vocab_size, d, padding_idx, highest_id = case
        ids, grad_output = backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id,
                                            ensure=SCALE_ENSURE)
        name = f"embedding_backward(ids {tuple(ids.shape)}, V={vocab_size}, padding_idx={padding_idx}, " \
               "scale_grad_by_freq=True)"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        if not torch.isfinite(result).all():
            raise AssertionError(f"{name} contains inf or NaN: a token absent from the batch has a count of 0, "
                                 "so don't divide its row by 0. Its gradient is exactly zero.")
        if not torch.all(result[highest_id + 1:] == 0):
            raise AssertionError(f"{name}: the rows of tokens that never occur in the batch ({highest_id + 1} to "
                                 f"{vocab_size - 1}) must be exactly zero.")
        plain = oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx)
        diagnoses = {
            "you counted each token per sequence; scale_grad_by_freq divides by the number of times the token "
            "occurs in the WHOLE batch (all B·T positions).":
                _scaled_per_sequence(ids, grad_output, vocab_size, padding_idx),
            "scale_grad_by_freq=True must divide each token's summed gradient by the number of times that token "
            "occurs in the batch; yours is the plain sum.": plain,
            "you divided every row by the number of positions B·T (a mean); divide each token's row by the "
            "number of times THAT token occurs in the batch.": plain / ids.numel(),
            "you divided every row by the vocabulary size; divide each token's row by the number of times THAT "
            "token occurs in the batch.": plain / vocab_size,
        }
        if padding_idx is not None:
            diagnoses[f"the padding row {padding_idx} received a gradient: with padding_idx set, that row's "
                      "gradient is zero, with or without scale_grad_by_freq."] = \
                oracle_embedding_grad(ids, grad_output, vocab_size, None, True)
        expect_close(result, oracle_embedding_grad(ids, grad_output, vocab_size, padding_idx, True), name,
                     rtol=1e-9, atol=1e-12, diagnoses=diagnoses,
                     hint="Each token's row is the sum of its upstream gradients divided by how often the token "
                          "occurs in the whole batch; the padding row stays zero.")
    stream, batch, length, vocab_size, d, _, highest_id = BACKWARD_DTYPE_CASE
    for key, (ids, grad_output) in (
            ("float32", backward_problem(seeds, stream, batch, length, vocab_size, d, highest_id, torch.float32)),
            ("one_sequence", backward_problem(seeds, stream + 1, 1, length, vocab_size, d, highest_id,
                                              torch.float32))):
        result = data[key]
        name = f"embedding_backward(ids {tuple(ids.shape)}, float32 grad_output (B, T, {d}), V={vocab_size})"
        _backward_shape(result, ids, grad_output, vocab_size, name)
        if result.dtype != torch.float32:
            raise AssertionError(f"{name} returned {result.dtype}: the gradient has grad_output's dtype "
                                 "(create the zeros with dtype=grad_output.dtype).")
        if not torch.all(result[highest_id + 1:] == 0):
            raise AssertionError(f"{name}: the rows of tokens that never occur in the batch must be exactly zero.")
        expect_close(result, oracle_embedding_grad(ids, grad_output, vocab_size), name,
                     "Row i is the sum of grad_output over every position where token i occurs.")
