"""Hidden checks for encoder, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/encoder.py, which also builds the
inputs both sides rebuild from the seeds."""
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import count, expect_close, expect_shape, expect_tensor, load_weights, quiet
from autograder.checks.encoder import (
    ACCURACY_EXAMPLES,
    ANY_SIZE_DIMS,
    CLASSIFIER_SHAPE_CASES,
    EMBEDDING_DIMS,
    FFN_SHAPE_CASES,
    KEEP,
    LAYER_NAMES,
    MATCH_CASES,
    MINIBERT_NAMES,
    PADDING_CASES,
    PADDING_DIMS,
    PARITY_DIMS,
    POST_LN_CASES,
    PRE_LN_CASES,
    ReferenceMiniBert,
    STRUCTURE_DIMS,
    SWIGLU_NAMES,
    SWIGLU_STRUCTURE_DIMS,
    TABLE_SHAPES,
    any_size_case,
    bert_weights,
    classifier_accuracy,
    classifier_shapes,
    classifier_uses_cls,
    cls_case,
    count_task_by_hand,
    embeddings_case,
    encoder_layer_padding_mask,
    encoder_layer_post_ln,
    encoder_layer_pre_ln,
    encoder_layer_structure,
    feed_forward_case,
    feed_forward_shapes,
    feed_forward_values,
    hf_bert_from,
    hf_name,
    layer_case,
    layer_norm_eps,
    layer_norm_eps_cases,
    layer_norm_parameters,
    layer_norm_value_cases,
    layer_norm_values,
    load_hf_any_size,
    load_hf_parity,
    match_case,
    minibert_embeddings,
    minibert_matches_hf_bert,
    minibert_padding_mask,
    minibert_structure,
    padding_case,
    parity_case,
    rms_swiglu_match_cases,
    rms_swiglu_structure_cases,
    stretch_rmsnorm_swiglu_match_llama,
    stretch_rmsnorm_swiglu_structure,
    swiglu_weight_shapes,
)


EARLIER = "(This test uses reference versions of your other classes, so only this exercise is graded here.)"


@feed_forward_shapes.judge
def judge_feed_forward_shapes(seeds, data):
    expected = 2 * 12 * 40 + 40 + 12
    if data["parameters"] != expected:
        raise AssertionError(f"FeedForward(12, 40) has {data['parameters']} parameters; two linear layers with "
                             f"biases have 2·12·40 + 40 + 12 = {expected}. Is there an extra layer?")
    for shape, out in zip(FFN_SHAPE_CASES, data["outputs"]):
        expect_shape(out, shape, f"FeedForward output for a {shape} input",
                     "The FFN maps each position's d_model vector to a d_model vector: the shape is unchanged.")


def feed_forward_diagnoses(weights, x):
    linear1 = lambda h: F.linear(h, weights["linear1.weight"], weights["linear1.bias"])  # noqa: E731
    linear2 = lambda h: F.linear(h, weights["linear2.weight"], weights["linear2.bias"])  # noqa: E731
    pre = linear1(x)
    return linear2(F.gelu(pre)), {
        "you used the tanh approximation of GELU; BERT uses the exact one, x·Φ(x) with the erf "
        "(F.gelu(x) or nn.GELU(), without approximate='tanh').": linear2(F.gelu(pre, approximate="tanh")),
        "you used ReLU; BERT's feed-forward uses GELU.": linear2(F.relu(pre)),
        "there is no activation between the two linear layers, so the FFN is just one linear map.": linear2(pre),
        "the activation comes after linear2; it belongs between linear1 and linear2.": F.gelu(linear2(pre)),
    }


@feed_forward_values.judge
def judge_feed_forward_values(seeds, data):
    out, one_by_one = data
    weights, x = feed_forward_case(seeds)
    expected, diagnoses = feed_forward_diagnoses(weights, x)
    expect_close(out, expected, "FeedForward output", diagnoses=diagnoses, rtol=1e-7, atol=1e-7)
    hint = "The FFN is position-wise: position t's output may depend only on position t's input."
    for position in one_by_one:
        expect_shape(expect_tensor(position, "FeedForward's output"), (x.shape[0], x.shape[2]),
                     "FeedForward's output for one position", hint)
    expect_close(torch.stack(one_by_one, 1), out, "FeedForward applied one position at a time", hint)


@layer_norm_parameters.judge
def judge_layer_norm_parameters(seeds, data):
    params, out = data
    if set(params) != {"weight", "bias"}:
        raise AssertionError(f"LayerNorm(10) should have exactly two nn.Parameters, `weight` and `bias` "
                             f"(the names nn.LayerNorm uses), but it has {sorted(params) or 'none'}. "
                             "A plain tensor attribute is not trained: wrap it in nn.Parameter.")
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        expect_shape(params[name], (10,), f"LayerNorm.{name}", "One gain and one bias per feature: (d_model,).")
        if not torch.all(expect_tensor(params[name], f"LayerNorm.{name}") == value):
            raise AssertionError(f"LayerNorm.{name} should start at {value:g} everywhere, so that a new "
                                 "LayerNorm only normalises (as nn.LayerNorm does).")
    expect_shape(out, (4, 3, 10), "LayerNorm output", "Normalising does not change the shape.")


def layer_norm_diagnoses(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = x.var(-1, keepdim=True, unbiased=False)
    affine = lambda normed: normed * weight + bias  # noqa: E731
    return {
        "you used the unbiased variance (divided by d - 1); LayerNorm divides by d: "
        "x.var(dim=-1, unbiased=False) or ((x - mean)**2).mean(-1).":
            affine(centred / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps)),
        "you divided by the variance, not by its square root (the standard deviation).":
            affine(centred / (var + eps)),
        "you forgot the learned gain and shift: multiply by self.weight and add self.bias.":
            centred / torch.sqrt(var + eps),
        "you normalised over the wrong dimension: LayerNorm normalises each token's features, the last "
        "dimension, not the batch or the sequence.":
            affine((x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + eps)),
    }


def oracle_layer_norm(weights, eps):
    oracle = nn.LayerNorm(weights["weight"].shape[0], eps=eps).double()
    oracle.load_state_dict(weights)
    return oracle


@layer_norm_values.judge
def judge_layer_norm_values(seeds, data):
    outputs, gradients = data
    cases, gradient_input = layer_norm_value_cases(seeds)
    for (shape, eps, weights, x), out in zip(cases, outputs):
        with torch.no_grad():
            expected = oracle_layer_norm(weights, eps)(x)
        expect_close(out, expected, f"LayerNorm of a {shape} input", rtol=1e-7, atol=1e-7,
                     diagnoses=layer_norm_diagnoses(x, weights["weight"], weights["bias"], eps))
    if gradients is None:
        raise AssertionError("LayerNorm's output carries no gradient: don't detach() or use .data, or "
                             "weight and bias will never learn.")
    _, eps, weights, _ = cases[-1]
    oracle = oracle_layer_norm(weights, eps)
    oracle(gradient_input).pow(3).sum().backward()
    for name in ("weight", "bias"):
        expect_close(gradients[name], getattr(oracle, name).grad, f"the gradient of LayerNorm.{name}",
                     "Build the output from self.weight and self.bias with ordinary tensor operations.")


@layer_norm_eps.judge
def judge_layer_norm_eps(seeds, data):
    outputs, constant_out = data
    cases, constant_weights = layer_norm_eps_cases(seeds)
    for (eps, weights, x), out in zip(cases, outputs):
        weight, bias = weights["weight"], weights["bias"]
        centred = x - x.mean(-1, keepdim=True)
        std = x.var(-1, keepdim=True, unbiased=False).sqrt()
        with torch.no_grad():
            expected = oracle_layer_norm(weights, eps)(x)
        diagnoses = {
            f"eps is outside the square root: LayerNorm divides by sqrt(var + eps), not by "
            f"sqrt(var) + eps (eps={eps:g} here, so the difference shows).": centred / (std + eps) * weight + bias,
            "you ignored the eps argument: store it and use it.": centred / torch.sqrt(std**2 + 1e-12) * weight + bias,
        }
        expect_close(out, expected, f"LayerNorm(8, eps={eps:g}) of low-variance rows",
                     diagnoses=diagnoses, rtol=1e-7, atol=1e-7)
    if not torch.all(torch.isfinite(expect_tensor(constant_out, "LayerNorm's output"))):
        raise AssertionError("LayerNorm of a constant row (variance 0) gave inf or NaN: add eps to the "
                             "variance inside the square root, sqrt(var + eps).")
    expect_close(constant_out, constant_weights["bias"].expand(2, 8), "LayerNorm of a constant row",
                 "A constant row normalises to 0 (+ bias).")


def torch_layer_from(weights, d_model, num_heads, d_ff, norm_first):
    """torch.nn.TransformerEncoderLayer holding the check's weights (in_proj stacks W_Q, W_K, W_V)."""
    theirs = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu",
                                        batch_first=True, norm_first=norm_first, layer_norm_eps=1e-12).double()
    w = lambda name: weights[f"self_attn.{name}"]  # noqa: E731
    state = {"self_attn.in_proj_weight": torch.cat([w("q_proj.weight"), w("k_proj.weight"), w("v_proj.weight")]),
             "self_attn.in_proj_bias": torch.cat([w("q_proj.bias"), w("k_proj.bias"), w("v_proj.bias")]),
             "self_attn.out_proj.weight": w("out_proj.weight"), "self_attn.out_proj.bias": w("out_proj.bias")}
    for ours, their_name in [("ffn.linear1", "linear1"), ("ffn.linear2", "linear2"), ("norm1", "norm1"),
                             ("norm2", "norm2")]:
        state.update({f"{their_name}.{kind}": weights[f"{ours}.{kind}"] for kind in ("weight", "bias")})
    theirs.load_state_dict(state)
    return theirs.train()  # train mode with dropout 0: the plain (not fused) path, deterministic


PRE_FOR_POST = ("with norm_first=False you computed a pre-LN layer: post-LN (BERT) is x = norm1(x + attn(x)), "
                "then x = norm2(x + ffn(x)).")


POST_FOR_PRE = ("with norm_first=True you computed a post-LN layer: pre-LN is x = x + attn(norm1(x)), then "
                "x = x + ffn(norm2(x)).")


RESIDUAL_AFTER_NORM = ("the residual adds the normalised input: in pre-LN the skip connection carries the raw x, "
                       "x = x + attn(norm1(x)), not h + attn(h) with h = norm1(x).")


NO_RESIDUAL = "there is no residual connection: add each sublayer's input back to its output."


MASK_IGNORED = ("the padding mask is ignored: padded keys must get no attention. Pass it on: "
                "self.self_attn(x, mask=mask).")


MASK_INVERTED = ("the mask polarity is inverted: in our masks True means 'may attend' (torch's "
                 "src_key_padding_mask is the opposite: True means 'ignore').")


def reference_layer_outputs(theirs, x, keep, norm_first):
    """torch's layer output, and what the known mistakes give with the same weights."""
    padding = None if keep is None else ~keep

    def attn(h, ignore):
        return theirs.self_attn(h, h, h, key_padding_mask=ignore, need_weights=False)[0]

    def ffn(h):
        return theirs.linear2(F.gelu(theirs.linear1(h)))

    def post(ignore=padding):
        h = theirs.norm1(x + attn(x, ignore))
        return theirs.norm2(h + ffn(h))

    def pre(ignore=padding):
        h = x + attn(theirs.norm1(x), ignore)
        return h + ffn(theirs.norm2(h))

    def pre_residual_after_norm():
        h = theirs.norm1(x)
        h = h + attn(h, padding)
        g = theirs.norm2(h)
        return g + ffn(g)

    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=padding)
        if norm_first:
            diagnoses = {POST_FOR_PRE: post(), RESIDUAL_AFTER_NORM: pre_residual_after_norm(),
                         NO_RESIDUAL: ffn(theirs.norm2(attn(theirs.norm1(x), padding)))}
        else:
            diagnoses = {PRE_FOR_POST: pre(), NO_RESIDUAL: theirs.norm2(ffn(theirs.norm1(attn(x, padding))))}
        if keep is not None:
            same_setting = pre if norm_first else post
            diagnoses[MASK_IGNORED] = same_setting(None)
            diagnoses[MASK_INVERTED] = same_setting(keep)  # every row of keep has a True and a False
    return expected, diagnoses


def _judge_layer(seeds, out, norm_first, stream, dims, batch, keep=None):
    weights, x = layer_case(seeds, stream, dims, batch)
    expected, diagnoses = reference_layer_outputs(torch_layer_from(weights, *dims, norm_first), x, keep, norm_first)
    setting = "pre-LN" if norm_first else "post-LN"
    expect_close(out, expected, f"{setting} EncoderLayer output" + (" with padding" if keep is not None else ""),
                 hint=f"Compare with torch.nn.TransformerEncoderLayer(norm_first={norm_first}). {EARLIER}",
                 diagnoses=diagnoses, rtol=1e-6, atol=1e-6)
    return x


@encoder_layer_structure.judge
def judge_encoder_layer_structure(seeds, results):
    expected = count(nn.TransformerEncoderLayer(12, 3, 20, batch_first=True))
    for result in results:
        if result["parameters"] != expected:
            raise AssertionError(f"EncoderLayer(12, 3, 20) has {result['parameters']} parameters; torch's layer has "
                                 f"{expected} (4 attention projections, 2 FFN linears, 2 LayerNorms). Build exactly "
                                 f"{LAYER_NAMES}.")
        expect_shape(result["output"], (3, 4, 12), "EncoderLayer output",
                     "An encoder layer keeps the shape (batch, T, d_model), so that layers can be stacked.")


@encoder_layer_post_ln.judge
def judge_encoder_layer_post_ln(seeds, outputs):
    for case, out in zip(POST_LN_CASES, outputs):
        _judge_layer(seeds, out, False, *case)


@encoder_layer_pre_ln.judge
def judge_encoder_layer_pre_ln(seeds, outputs):
    for case, out in zip(PRE_LN_CASES, outputs):
        _judge_layer(seeds, out, True, *case)


@encoder_layer_padding_mask.judge
def judge_encoder_layer_padding_mask(seeds, results):
    for (norm_first, stream), (out, again) in zip(PADDING_CASES, results):
        x = _judge_layer(seeds, out, norm_first, stream, (12, 3, 20), (3, 6), keep=KEEP)
        expect_shape(expect_tensor(again, "EncoderLayer's output"), x.shape, "EncoderLayer output")
        expect_close(again[KEEP], out[KEEP], "real positions' outputs when the padding changes",
                     "Padded keys must get exactly zero attention: the mask is applied before the softmax.")


def reference_minibert(weights, dims):
    """The course's own MiniBert holding `weights` (the judge's model of known mistakes)."""
    model = ReferenceMiniBert(*dims.values()).double().eval()
    return load_weights(model, weights, "ReferenceMiniBert", MINIBERT_NAMES)


def _hf_outputs(hf, input_ids, attention_mask=None, token_type_ids=None, layers=True):
    with torch.no_grad(), quiet():
        if not layers:
            return hf.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        return hf(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


@minibert_structure.judge
def judge_minibert_structure(seeds, data):
    for name, shape in TABLE_SHAPES:
        expect_shape(data["tables"][name], shape, f"MiniBert.{name}.weight",
                     "token: (vocab_size, d_model), position: (max_positions, d_model), "
                     "segment: (type_vocab_size, d_model).")
    if data["layers"] != 3:
        raise AssertionError(f"MiniBert(num_layers=3) has {data['layers']} layers in `layers`.")
    expected = count(hf_bert_from(bert_weights(seeds.generator(7400), STRUCTURE_DIMS), STRUCTURE_DIMS))
    if data["parameters"] != expected:
        raise AssertionError(f"MiniBert has {data['parameters']} parameters, a BertModel of the same size (without "
                             f"its pooler) has {expected}. {MINIBERT_NAMES}.")
    expect_shape(data["output"], (2, 7, 12), "MiniBert output",
                 "MiniBert returns the last hidden states (batch, T, d_model).")


@minibert_embeddings.judge
def judge_minibert_embeddings(seeds, data):
    out, with_defaults = data
    weights, (input_ids, attention_mask, token_type_ids) = embeddings_case(seeds)
    hf = hf_bert_from(weights, EMBEDDING_DIMS)
    expected = _hf_outputs(hf, input_ids, token_type_ids=token_type_ids, layers=False)
    T = input_ids.shape[1]
    e = hf.embeddings
    with torch.no_grad():
        words, segments = e.word_embeddings(input_ids), e.token_type_embeddings(token_type_ids)
        positions = e.position_embeddings(torch.arange(T))
        diagnoses = {
            "the positions must start at 0: position_ids = torch.arange(T), the first token ([CLS]) "
            "uses row 0 of position_embeddings.": e.LayerNorm(words + segments + e.position_embeddings(torch.arange(1, T + 1))),
            "the segment (token type) embeddings are missing: add segment_embeddings(token_type_ids).":
                e.LayerNorm(words + positions),
            "the position embeddings are missing: add position_embeddings(position_ids).": e.LayerNorm(words + segments),
            "the embedding LayerNorm is missing: BERT normalises the sum of the three embeddings.":
                words + positions + segments,
        }
    expect_close(out, expected, "MiniBert's embeddings (num_layers=0)", diagnoses=diagnoses, rtol=1e-6, atol=1e-6,
                 hint="token + position + segment, then LayerNorm, then dropout. " + EARLIER)
    # Defaults: token_type_ids=None means segment 0 everywhere; attention_mask=None means no padding.
    expected = _hf_outputs(hf, input_ids, token_type_ids=torch.zeros_like(input_ids), layers=False)
    expect_close(with_defaults, expected, "MiniBert's embeddings with token_type_ids=None",
                 "Without token_type_ids, every token is in segment 0 (as in BertModel).", rtol=1e-6, atol=1e-6)


MINIBERT_MASK_IGNORED = ("attention_mask is ignored: padded tokens are attended to. Turn it into a (B, 1, 1, T) "
                         "boolean mask (courselib's padding_mask(attention_mask, 0)) and pass it to every layer.")


MINIBERT_MASK_INVERTED = ("the attention mask is inverted: attention_mask is 1 for real tokens and 0 for padding, "
                          "and our masks are True where attention is allowed.")


def padding_diagnoses(weights, dims, input_ids, attention_mask, token_type_ids):
    """What a MiniBert that ignores or inverts attention_mask returns (our masked softmax, HF's weights)."""
    wrong = reference_minibert(weights, dims)
    with torch.no_grad():
        return {MINIBERT_MASK_IGNORED: wrong(input_ids, None, token_type_ids),
                MINIBERT_MASK_INVERTED: wrong(input_ids, 1 - attention_mask, token_type_ids)}


@minibert_matches_hf_bert.judge
def judge_minibert_matches_hf_bert(seeds, outputs):
    for (stream, dims), out in zip(MATCH_CASES, outputs):
        weights, batch = match_case(seeds, stream, dims)
        expect_close(out, _hf_outputs(hf_bert_from(weights, dims), *batch),
                     "MiniBert's last hidden states vs BertModel", rtol=1e-6, atol=1e-6,
                     diagnoses=padding_diagnoses(weights, dims, *batch),
                     hint="Check the order: embeddings, LayerNorm, dropout, then the layers, with the padding "
                          "mask passed to each. " + EARLIER)


@minibert_padding_mask.judge
def judge_minibert_padding_mask(seeds, data):
    out, again, without_mask = data
    weights, (input_ids, attention_mask, token_type_ids) = padding_case(seeds)
    hf = hf_bert_from(weights, PADDING_DIMS)
    expect_close(out, _hf_outputs(hf, input_ids, attention_mask, token_type_ids),
                 "MiniBert's hidden states on a padded batch", rtol=1e-6, atol=1e-6,
                 diagnoses=padding_diagnoses(weights, PADDING_DIMS, input_ids, attention_mask, token_type_ids),
                 hint="At padded positions BertModel still computes a hidden state (its queries attend to the "
                      "real tokens): don't zero them. " + EARLIER)
    expect_shape(expect_tensor(again, "MiniBert's output"), out.shape, "MiniBert output")
    real = attention_mask.bool()
    expect_close(again[real], out[real], "real tokens' hidden states when the pad ids change",
                 "Real tokens must give padded positions zero attention.")
    expect_close(without_mask, _hf_outputs(hf, input_ids, None, token_type_ids), "MiniBert with attention_mask=None",
                 "Without a mask every token may attend to every token.", rtol=1e-6, atol=1e-6)


def _describe_mismatch(name, ours, weights):
    for other, theirs in weights.items():
        if other != name and theirs.shape == ours.shape and torch.allclose(ours, theirs):
            return f"model.{name} holds hf_bert.{hf_name(other)}, but it should hold hf_bert.{hf_name(name)}."
        if theirs.dim() == 2 and theirs.shape[::-1] == ours.shape and torch.allclose(ours, theirs.T):
            return (f"model.{name} holds the transpose of hf_bert.{hf_name(other)}: nn.Linear stores its weight as "
                    "(out_features, in_features) in both models, so copy it as it is.")
    return f"model.{name} was not copied from hf_bert.{hf_name(name)}."


def _judge_loaded(state, out, dims, weights, batch, what, hint):
    for name, theirs in weights.items():
        ours = state.get(name)
        if ours is None:
            raise AssertionError(f"after load_hf_bert_weights, model has no parameter {name}: copy the values "
                                 "into the model's own parameters, don't replace its modules.")
        ours = expect_tensor(ours, f"model.{name}").double()
        if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=0, atol=1e-12):
            raise AssertionError(_describe_mismatch(name, ours, weights))
    expect_close(out, _hf_outputs(hf_bert_from(weights, dims), *batch), what, rtol=1e-6, atol=1e-6, hint=hint)


@load_hf_parity.judge
def judge_load_hf_parity(seeds, data):
    state, out = data
    weights, batch = parity_case(seeds)
    _judge_loaded(state, out, PARITY_DIMS, weights, batch, "last hidden states after loading",
                  "(Graded on a reference MiniBert, so only your loader counts here.)")


@load_hf_any_size.judge
def judge_load_hf_any_size(seeds, data):
    state, out, refused = data
    weights, batch = any_size_case(seeds)
    _judge_loaded(state, out, ANY_SIZE_DIMS, weights, batch,
                  "last hidden states of a 3-layer, 3-segment model after loading",
                  "Read the number of layers and the sizes from the models; don't assume 2 layers or d=12.")
    if refused is not True:
        raise AssertionError("load_hf_bert_weights copied a BertModel with 30 positions into a MiniBert with 20 "
                             "without complaint: copy with tensor.copy_() (it checks shapes) or compare shapes and "
                             "raise, so that a wrong configuration fails loudly.")


@classifier_shapes.judge
def judge_classifier_shapes(seeds, outputs):
    for (batch, _, _, num_labels), logits in zip(CLASSIFIER_SHAPE_CASES, outputs):
        expect_shape(logits, (batch, num_labels), "logits",
                     "One row of num_labels scores per sequence, from the [CLS] vector: (batch, num_labels). "
                     "Read the width from encoder.d_model.")


@classifier_uses_cls.judge
def judge_classifier_uses_cls(seeds, data):
    _, (_, attention_mask, token_type_ids), _, changed_cls, head = cls_case(seeds)
    seen_mask, seen_types = data["seen_mask"], data["seen_types"]
    if seen_mask is None or not torch.equal(seen_mask, attention_mask):
        raise AssertionError("SequenceClassifier didn't pass attention_mask on to the encoder, so padding "
                             "would be attended to.")
    if seen_types is None or not torch.equal(seen_types, token_type_ids):
        raise AssertionError("SequenceClassifier didn't pass token_type_ids on to the encoder.")
    # Only the first position may matter.
    logits = expect_tensor(data["logits"], "logits")
    expect_close(data["same"], logits, "logits when only the non-[CLS] hidden states change",
                 hint="The head must read only the [CLS] vector, hidden[:, 0]: not a mean over the tokens, "
                      "not the last token.")
    again = expect_tensor(data["again"], "logits")
    if again.shape == logits.shape and torch.allclose(again, logits):
        raise AssertionError("The logits didn't change when the [CLS] hidden state changed: classify from "
                             "hidden[:, 0].")
    if data["plain_head"] is True:
        expect_close(again, F.linear(changed_cls[:, 0], head["classifier.weight"], head["classifier.bias"]), "logits",
                     "With one linear layer the logits are classifier(hidden[:, 0]).")


@classifier_accuracy.judge
def judge_classifier_accuracy(seeds, logits, threshold=0.95):
    *_, labels = count_task_by_hand(ACCURACY_EXAMPLES, seeds.generator(7603))
    expect_shape(logits, (ACCURACY_EXAMPLES, 3), "the trained classifier's logits", "Three classes: fewer, equal, more.")
    accuracy = (expect_tensor(logits, "logits").argmax(-1) == labels).float().mean().item()
    if accuracy < threshold:
        raise AssertionError(f"the trained classifier gets {accuracy:.1%} of {ACCURACY_EXAMPLES} fresh examples right; "
                             f"the notebook promises at least {threshold:.0%}. If an earlier test failed, fix it "
                             "first; otherwise train again.")


def llama_rms_norm(weight, eps):
    """The oracle: transformers' LlamaRMSNorm holding `weight`, in weight's dtype."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    oracle = LlamaRMSNorm(weight.shape[0], eps=eps).to(weight.dtype)
    oracle.load_state_dict({"weight": weight})
    return oracle


def llama_mlp(weights):
    """The oracle: transformers' LlamaMLP (SiLU, no biases) holding `weights`, in their dtype."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    d_ff, d_model = weights["gate_proj.weight"].shape
    config = LlamaConfig(hidden_size=d_model, intermediate_size=d_ff, num_attention_heads=1, hidden_act="silu",
                         mlp_bias=False)
    with torch.random.fork_rng(devices=[]):
        oracle = LlamaMLP(config).to(weights["gate_proj.weight"].dtype)
    oracle.load_state_dict(weights)
    return oracle


def rms_norm_diagnoses(x, weight, eps):
    mean_square = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        "you subtracted the mean: that is LayerNorm. RMSNorm does not centre x, it only divides by the root mean "
        "square sqrt(mean(x²) + eps).": centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weight,
        "eps is outside the square root: RMSNorm divides by sqrt(mean(x²) + eps), not by sqrt(mean(x²)) + eps.":
            x / (mean_square.sqrt() + eps) * weight,
        "you divided by the norm, sqrt(sum(x²)), not the root MEAN square: average the squares over the d features.":
            x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight,
        "you divided by the mean square, not by its square root.": x / (mean_square + eps) * weight,
        "you forgot the learned gain: multiply by self.weight.": x / torch.sqrt(mean_square + eps),
    }


def swiglu_diagnoses(weights, x):
    gate = x @ weights["gate_proj.weight"].T
    up = x @ weights["up_proj.weight"].T
    down = lambda h: h @ weights["down_proj.weight"].T  # noqa: E731
    return {
        "the SiLU is on up_proj: it belongs on gate_proj, down_proj(silu(gate_proj(x)) * up_proj(x)). The two "
        "projections are not interchangeable once the weights are loaded by name.": down(F.silu(up) * gate),
        "you used ReLU; Llama's SwiGLU uses SiLU, x·sigmoid(x) (F.silu).": down(F.relu(gate) * up),
        "you used GELU (that is GEGLU); Llama's SwiGLU uses SiLU, x·sigmoid(x) (F.silu).": down(F.gelu(gate) * up),
        "the SiLU is applied to the product; apply it to gate_proj(x) alone, then multiply by up_proj(x).":
            down(F.silu(gate * up)),
        "up_proj is missing: multiply silu(gate_proj(x)) by up_proj(x) before down_proj.": down(F.silu(gate)),
    }


def _expect_state(state, expected, owner, hint):
    if set(state) != set(expected):
        extra = sorted(set(state) - set(expected))
        raise AssertionError(f"{owner}'s state_dict holds {sorted(state)}, expected exactly {sorted(expected)}"
                             + (f" ({', '.join(extra)} should not be there). " if extra else ". ") + hint)
    for name, value in expected.items():
        ours = expect_tensor(state[name], f"{owner}.{name}")
        if ours.shape != value.shape or not torch.equal(ours.to(value.dtype), value):
            raise AssertionError(f"{owner}.{name} does not hold the weights the test loaded into it; don't "
                                 "copy or re-create parameters in forward.")


def _expect_dtype(out, dtype, name):
    if expect_tensor(out, name).dtype != dtype:
        raise AssertionError(f"{name} is {out.dtype} for a {dtype} input: return the input's dtype, as the Llama "
                             "modules do (LlamaRMSNorm computes in float32 and casts back).")


@stretch_rmsnorm_swiglu_match_llama.judge
def judge_stretch_rmsnorm_swiglu_match_llama(seeds, data):
    norm_results, ffn_results = data
    norms, ffns = rms_swiglu_match_cases(seeds)
    # LlamaRMSNorm computes in float32 even for a float64 input: float32's tolerance for every case.
    for (shape, dtype, eps, weight, x), result in zip(norms, norm_results):
        _expect_state(result["state"], {"weight": weight}, "RMSNorm",
                      "RMSNorm has one learned gain, `weight`, and no bias (no β).")
        name = f"RMSNorm(d_model={shape[-1]}, eps={eps:g}) of a {dtype} {shape} input"
        with torch.no_grad():
            expected = llama_rms_norm(weight, eps)(x)
        expect_close(result["output"], expected, name, rtol=1e-5, atol=1e-6,
                     diagnoses=rms_norm_diagnoses(x.double(), weight.double(), eps))
        _expect_dtype(result["output"], dtype, name)
    for (shape, dtype, weights, x), result in zip(ffns, ffn_results):
        _expect_state(result["state"], weights, "SwiGLUFeedForward",
                      "Llama's feed-forward has no biases: nn.Linear(..., bias=False) for all three.")
        name = f"SwiGLUFeedForward({shape[-1]}, {weights['gate_proj.weight'].shape[0]}) of a {dtype} {shape} input"
        with torch.no_grad():
            expected = llama_mlp(weights)(x)
        tolerance = dict(rtol=1e-7, atol=1e-8) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
        expect_close(result["output"], expected, name, **tolerance,
                     diagnoses=swiglu_diagnoses({k: w.double() for k, w in weights.items()}, x.double()))
        _expect_dtype(result["output"], dtype, name)


@stretch_rmsnorm_swiglu_structure.judge
def judge_stretch_rmsnorm_swiglu_structure(seeds, data):
    for d, state in zip((8, 5), data["fresh"]):
        if set(state) != {"weight"}:
            raise AssertionError(f"RMSNorm({d})'s state_dict holds {sorted(state) or 'nothing'}; expected exactly one "
                                 "nn.Parameter, `weight` (the name LlamaRMSNorm uses): no bias, no β.")
        expect_shape(state["weight"], (d,), f"RMSNorm({d}).weight", "One gain per feature: (d_model,).")
        if not torch.all(expect_tensor(state["weight"], "RMSNorm.weight") == 1):
            raise AssertionError("RMSNorm.weight should start at 1 everywhere, so that a new RMSNorm only normalises.")
    for ffn, (d_model, d_ff) in zip(data["ffns"], SWIGLU_STRUCTURE_DIMS):
        expected = dict(swiglu_weight_shapes(d_model, d_ff))
        if ffn["linear"] != {name: "Linear" for name in ("gate_proj", "up_proj", "down_proj")}:
            raise AssertionError(f"SwiGLUFeedForward's gate_proj, up_proj and down_proj are {ffn['linear']}: the "
                                 f"exercise asks for {SWIGLU_NAMES}.")
        if ffn["parameters"] != expected:
            biases = sorted(name for name in ffn["parameters"] if name.endswith("bias"))
            raise AssertionError(f"SwiGLUFeedForward({d_model}, {d_ff}) has parameters {ffn['parameters']}; expected "
                                 f"{expected}. " + ("Llama's linear layers have no bias: pass bias=False. " if biases
                                                    else "") + f"The exercise asks for {SWIGLU_NAMES}.")
    eps_cases, small = rms_swiglu_structure_cases(seeds)
    ones = torch.ones(8, dtype=torch.float64)
    for (eps, x), out in zip(eps_cases, data["eps_outputs"]):
        with torch.no_grad():
            expected = llama_rms_norm(ones, eps)(x)
        expect_close(out, expected, f"RMSNorm(8, eps={eps:g}) of rows whose mean square is near eps",
                     rtol=1e-5, atol=1e-6, diagnoses=rms_norm_diagnoses(x, ones, eps),
                     hint="eps goes inside the square root: x / sqrt(mean(x²) + eps).")
    with torch.no_grad():
        expected = llama_rms_norm(ones, 1e-6)(small)
    expect_close(data["default_output"], expected, "RMSNorm(8) of rows whose mean square is about 1e-6",
                 rtol=1e-5, atol=1e-6, diagnoses={
                     "RMSNorm(d_model) should use eps=1e-6 (Llama's rms_norm_eps) by default.":
                         small / torch.sqrt(small.pow(2).mean(-1, keepdim=True) + 1e-5)},
                 hint="The default is eps=1e-6, inside the square root.")
    expect_close(data["zero_output"], torch.zeros(2, 8), "RMSNorm(8) of a zero vector",
                 hint="A zero vector has mean square 0: eps inside the square root keeps 0 / 0 from becoming NaN.")
