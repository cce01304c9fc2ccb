"""Mutants and alternative correct answers for 07_encoder."""
from autograder.tests.variants import Variant

ASSIGNMENT = "07_encoder"
FFN = "feed_forward_answer"
NORM = "layer_norm_answer"
LAYER = "encoder_layer_answer"
BERT = "minibert_answer"
LOAD = "load_hf_bert_weights_answer"
HEAD = "sequence_classifier_answer"
STRETCH = "rms_norm_swiglu_answer"

# ------------------------------------------------------------------ FeedForward
FFN_INIT = '''
class FeedForward(nn.Module):
    """Position-wise feed-forward sublayer: linear1 (d_model -> d_ff), GELU, linear2 (d_ff -> d_model)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
'''


def ffn(forward):
    return FFN_INIT + "\n    def forward(self, x):\n" + forward


# ------------------------------------------------------------------ LayerNorm
NORM_INIT = '''
class LayerNorm(nn.Module):
    """Layer normalisation over the last dimension, with a learned gain `weight` and shift `bias`."""

    def __init__(self, d_model, eps=1e-12):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
'''


def norm(forward):
    return NORM_INIT + "\n    def forward(self, x):\n" + forward


# ------------------------------------------------------------------ EncoderLayer
LAYER_INIT = '''
class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sublayers, each with a residual connection and a LayerNorm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False, eps=1e-12):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
'''


def layer(forward):
    return LAYER_INIT + "\n    def forward(self, x, mask=None):\n" + forward


LAYER_PRE_OK = '''
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])
            return x + self.dropout(self.ffn(self.norm2(x)))
'''
LAYER_POST_OK = '''
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))
        return self.norm2(x + self.dropout(self.ffn(x)))
'''

# ------------------------------------------------------------------ MiniBert
BERT_INIT = '''
class MiniBert(nn.Module):
    """BERT's encoder: embeddings (token + position + segment, LayerNorm, dropout), then post-LN layers."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, d_ff, max_positions, type_vocab_size=2,
                 dropout=0.1, eps=1e-12):
        super().__init__()
        self.d_model = d_model
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.position_embeddings = nn.Embedding(max_positions, d_model)
        self.segment_embeddings = nn.Embedding(type_vocab_size, d_model)
        self.embedding_norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first=False, eps=eps)
                                     for _ in range(num_layers)])
'''


def bert(forward):
    return BERT_INIT + "\n    def forward(self, input_ids, attention_mask=None, token_type_ids=None):\n" + forward


BERT_DEFAULTS = '''
        batch, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
'''
BERT_LAYERS = '''
        mask = padding_mask(attention_mask, 0)
        for layer in self.layers:
            x = layer(x, mask)
        return x
'''

# ------------------------------------------------------------------ load_hf_bert_weights
LOAD_START = '''
def load_hf_bert_weights(model, hf_bert):
    """Copy a transformers BertModel's weights into a MiniBert of the same size; returns the model."""
'''
LOAD_BODY = '''
    def copy(ours, theirs):
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)

    with torch.no_grad():
        e = hf_bert.embeddings
        model.token_embeddings.weight.copy_(e.word_embeddings.weight)
        model.position_embeddings.weight.copy_(e.position_embeddings.weight)
        model.segment_embeddings.weight.copy_(e.token_type_embeddings.weight)
        copy(model.embedding_norm, e.LayerNorm)
        for ours, theirs in zip(model.layers, hf_bert.encoder.layer, strict=True):
            copy(ours.self_attn.q_proj, theirs.attention.self.query)
            copy(ours.self_attn.k_proj, theirs.attention.self.key)
            copy(ours.self_attn.v_proj, theirs.attention.self.value)
            copy(ours.self_attn.out_proj, theirs.attention.output.dense)
            copy(ours.norm1, NORM1)
            copy(ours.ffn.linear1, theirs.intermediate.dense)
            copy(ours.ffn.linear2, theirs.output.dense)
            copy(ours.norm2, NORM2)
    return model
'''


def load(norm1="theirs.attention.output.LayerNorm", norm2="theirs.output.LayerNorm", body=LOAD_BODY):
    return LOAD_START + body.replace("NORM1", norm1).replace("NORM2", norm2)


# ------------------------------------------------------------------ SequenceClassifier
HEAD_INIT = '''
class SequenceClassifier(nn.Module):
    """An encoder with a linear classification head on the final [CLS] hidden state."""

    def __init__(self, encoder, num_labels):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(encoder.d_model, num_labels)
'''


def head(forward):
    return HEAD_INIT + "\n    def forward(self, input_ids, attention_mask=None, token_type_ids=None):\n" + forward



# ------------------------------------------------------------------ RMSNorm and SwiGLUFeedForward (optional stretch)
RMS_INIT = '''
class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learned gain `weight`."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
'''
RMS_FORWARD = '''
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
'''
SWIGLU_INIT = '''

class SwiGLUFeedForward(nn.Module):
    """Llama's gated feed-forward sublayer: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
'''
SWIGLU_FORWARD = '''
    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''


def stretch(rms_forward=RMS_FORWARD, swiglu_forward=SWIGLU_FORWARD, rms_init=RMS_INIT, swiglu_init=SWIGLU_INIT):
    return rms_init + rms_forward + swiglu_init + swiglu_forward

MUTANTS = [
    # ---- FeedForward
    Variant("ffn_gelu_tanh_approximation", {FFN: ffn('''
        return self.linear2(F.gelu(self.linear1(x), approximate="tanh"))
''')}, loses=("feed_forward_values", "load_hf_parity"), message="tanh approximation"),
    Variant("ffn_relu", {FFN: ffn('''
        return self.linear2(torch.relu(self.linear1(x)))
''')}, loses=("feed_forward_values",), message="ReLU"),
    Variant("ffn_no_activation", {FFN: ffn('''
        return self.linear2(self.linear1(x))
''')}, loses=("feed_forward_values",), message="no activation between linear1 and linear2"),
    Variant("ffn_subclasses_the_course_reference", {FFN: '''
from courselib.blocks import FeedForward as _CourseFeedForward


class FeedForward(_CourseFeedForward):
    """Position-wise feed-forward sublayer: the course's own, renamed."""
'''}, loses=("feed_forward_shapes", "feed_forward_values"), message="is not available while 07_encoder is graded"),
    # ---- LayerNorm
    Variant("layer_norm_unbiased_variance", {NORM: norm('''
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True)  # unbiased by default: divides by d - 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
''')}, loses=("layer_norm_values",), message="unbiased variance"),
    Variant("layer_norm_eps_outside_sqrt", {NORM: norm('''
        mean = x.mean(dim=-1, keepdim=True)
        std = x.var(dim=-1, keepdim=True, unbiased=False).sqrt()
        return (x - mean) / (std + self.eps) * self.weight + self.bias
''')}, loses=("layer_norm_eps",), message="inside the square root"),
    Variant("layer_norm_no_eps", {NORM: norm('''
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var) * self.weight + self.bias
''')}, loses=("layer_norm_eps",), message="eps"),
    Variant("layer_norm_over_batch", {NORM: norm('''
        mean = x.mean(dim=0, keepdim=True)
        var = x.var(dim=0, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
''')}, loses=("layer_norm_values",), message="over the last dimension"),
    Variant("layer_norm_without_gain_and_bias", {NORM: norm('''
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps)
''')}, loses=("layer_norm_values",), message="gain and shift"),
    Variant("layer_norm_calls_torch", {NORM: norm('''
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
''')}, loses=("layer_norm_parameters", "layer_norm_values", "layer_norm_eps"), message="oracle"),
    # The oracle taken in ways a patch of torch's names missed: a reference captured at the top of the cell (the
    # watch sees it: review), and the course's own reference (courselib.blocks) wrapped: out of 07's sandbox, the
    # import fails, and the test says that the cell defining LayerNorm stopped there.
    Variant("layer_norm_oracle_captured_early", {NORM: "_layer_norm = torch.nn.functional.layer_norm  "
                                                       "# captured before any test runs\n" + norm('''
        return _layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
''')}, loses=("layer_norm_parameters", "layer_norm_values", "layer_norm_eps"), message="flagged for review"),
    Variant("layer_norm_wraps_the_course_reference", {NORM: "from courselib.blocks import LayerNorm as "
                                                            "_CourseLayerNorm\n" + norm('''
        return _CourseLayerNorm.forward(self, x)
''')}, loses=("layer_norm_parameters", "layer_norm_values", "layer_norm_eps"), message="is not available while 07_encoder is graded"),
    Variant("layer_norm_in_place", {NORM: norm('''
        x -= x.mean(dim=-1, keepdim=True)
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * self.weight + self.bias
''')}, loses=("layer_norm_parameters", "layer_norm_values"), message="in place"),
    Variant("layer_norm_plain_tensors", {NORM: '''
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-12):
        super().__init__()
        self.eps = eps
        self.weight = torch.ones(d_model)
        self.bias = torch.zeros(d_model)

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
'''}, loses=("layer_norm_parameters",), message="nn.Parameter"),
    # Hard-coding the visible worked example (x = [1, 2, 3, 4]) must earn nothing.
    Variant("layer_norm_hard_coded_worked_example", {NORM: norm('''
        return torch.tensor([[-1.3416, -0.4472, 0.4472, 1.3416]])
''')}, loses=("layer_norm_parameters", "layer_norm_values", "layer_norm_eps"), message="shape"),
    # ---- EncoderLayer
    Variant("encoder_pre_ln_residual_after_norm", {LAYER: layer('''
        if self.norm_first:
            x = self.norm1(x)
            x = x + self.dropout(self.self_attn(x, mask=mask)[0])
            x = self.norm2(x)
            return x + self.dropout(self.ffn(x))
''' + LAYER_POST_OK)}, loses=("encoder_layer_pre_ln", "encoder_layer_padding_mask"), message="raw x"),
    Variant("encoder_norm_first_ignored", {LAYER: layer(LAYER_POST_OK)},
            loses=("encoder_layer_pre_ln", "encoder_layer_padding_mask"), message="With norm_first=True the layer is pre-LN"),
    Variant("encoder_always_pre_ln", {LAYER: layer('''
        x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])
        return x + self.dropout(self.ffn(self.norm2(x)))
''')}, loses=("encoder_layer_post_ln", "encoder_layer_padding_mask"), message="A pre-LN layer here"),
    Variant("encoder_no_residual", {LAYER: layer(LAYER_PRE_OK + '''
        x = self.norm1(self.dropout(self.self_attn(x, mask=mask)[0]))
        return self.norm2(self.dropout(self.ffn(x)))
''')}, loses=("encoder_layer_post_ln", "encoder_layer_padding_mask"), message="missing residual"),
    Variant("encoder_mask_ignored", {LAYER: layer('''
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x))[0])
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x)[0]))
        return self.norm2(x + self.dropout(self.ffn(x)))
''')}, loses=("encoder_layer_padding_mask",), message="the mask is ignored"),
    Variant("encoder_mask_inverted_like_torch", {LAYER: layer('''
        if mask is not None:
            mask = ~mask  # torch's src_key_padding_mask convention: True means ignore
''' + LAYER_PRE_OK + LAYER_POST_OK)}, loses=("encoder_layer_padding_mask",), message="the mask is inverted"),
    Variant("encoder_ffn_reads_the_input_not_the_attention_output", {LAYER: layer(LAYER_PRE_OK + '''
        h = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))
        return self.norm2(h + self.dropout(self.ffn(x)))
''')}, loses=("encoder_layer_post_ln",), message="reads the attention sublayer's output"),
    Variant("encoder_wraps_the_course_reference", {LAYER: "from courselib.blocks import EncoderLayer as "
                                                          "_CourseLayer\n" + layer('''
        return _CourseLayer.forward(self, x, mask)
''')}, loses=("encoder_layer_structure", "encoder_layer_post_ln", "encoder_layer_pre_ln",
              "encoder_layer_padding_mask"), message="is not available while 07_encoder is graded"),
    Variant("encoder_runs_torch_layer_captured_early", {LAYER: "_TorchLayer = nn.TransformerEncoderLayer  "
                                                               "# captured before any test runs\n" + layer('''
        attn, d_model = self.self_attn, x.shape[-1]
        theirs = _TorchLayer(d_model, attn.num_heads, self.ffn.linear1.out_features, dropout=0.0, activation="gelu",
                             batch_first=True, norm_first=self.norm_first, layer_norm_eps=self.norm1.eps)
        theirs = theirs.to(x.dtype).train()
        with torch.no_grad():
            theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                                             attn.v_proj.weight]))
            theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
            for their_name, ours in [("self_attn.out_proj", attn.out_proj), ("linear1", self.ffn.linear1),
                                     ("linear2", self.ffn.linear2), ("norm1", self.norm1), ("norm2", self.norm2)]:
                theirs.get_submodule(their_name).load_state_dict(ours.state_dict())
        padding = None if mask is None else ~mask.reshape(mask.shape[0], -1)   # (B, 1, 1, T) -> (B, T)
        return theirs(x, src_key_padding_mask=padding)
''')}, loses=("encoder_layer_structure", "encoder_layer_post_ln", "encoder_layer_pre_ln",
              "encoder_layer_padding_mask"), message="flagged for review"),
    # ---- MiniBert
    Variant("minibert_positions_start_at_1", {BERT: bert(BERT_DEFAULTS + '''
        positions = torch.arange(1, T + 1, device=input_ids.device)
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.dropout(self.embedding_norm(x + self.segment_embeddings(token_type_ids)))
''' + BERT_LAYERS)}, loses=("minibert_embeddings", "minibert_matches_hf_bert"), message="start at 1"),
    Variant("minibert_ignores_segments", {BERT: bert(BERT_DEFAULTS + '''
        positions = torch.arange(T, device=input_ids.device)
        x = self.dropout(self.embedding_norm(self.token_embeddings(input_ids) + self.position_embeddings(positions)))
''' + BERT_LAYERS)}, loses=("minibert_embeddings", "minibert_matches_hf_bert"), message="segment embeddings are missing"),
    Variant("minibert_no_embedding_norm", {BERT: bert(BERT_DEFAULTS + '''
        positions = torch.arange(T, device=input_ids.device)
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.dropout(x + self.segment_embeddings(token_type_ids))
''' + BERT_LAYERS)}, loses=("minibert_embeddings", "minibert_matches_hf_bert"), message="embedding_norm (the LayerNorm of the sum)"),
    Variant("minibert_ignores_padding_mask", {BERT: bert(BERT_DEFAULTS + '''
        positions = torch.arange(T, device=input_ids.device)
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.dropout(self.embedding_norm(x + self.segment_embeddings(token_type_ids)))
        for layer in self.layers:
            x = layer(x)
        return x
''')}, loses=("minibert_padding_mask", "minibert_matches_hf_bert"), message="attention_mask is ignored"),
    Variant("minibert_mask_inverted", {BERT: bert(BERT_DEFAULTS + '''
        positions = torch.arange(T, device=input_ids.device)
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.dropout(self.embedding_norm(x + self.segment_embeddings(token_type_ids)))
        mask = (attention_mask == 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x
''')}, loses=("minibert_padding_mask",), message="attention_mask is 1 for real tokens"),
    # ---- load_hf_bert_weights
    Variant("load_swaps_the_two_layer_norms", {LOAD: load(norm1="theirs.output.LayerNorm",
                                                          norm2="theirs.attention.output.LayerNorm")},
            loses=("load_hf_parity", "load_hf_any_size"), message="output.LayerNorm"),
    Variant("load_transposes_linear_weights", {LOAD: load(body=LOAD_BODY.replace(
        "ours.weight.copy_(theirs.weight)",
        "ours.weight.copy_(theirs.weight.mT if theirs.weight.dim() == 2 and "
        "theirs.weight.shape[0] == theirs.weight.shape[1] else theirs.weight)"))},
            loses=("load_hf_parity", "load_hf_any_size"), message="no transpose"),
    Variant("load_skips_the_embedding_norm", {LOAD: load(body=LOAD_BODY.replace(
        "        copy(model.embedding_norm, e.LayerNorm)\n", ""))},
            loses=("load_hf_parity", "load_hf_any_size"), message="embeddings.LayerNorm included"),
    Variant("load_assumes_two_layers", {LOAD: load(body=LOAD_BODY.replace(
        "zip(model.layers, hf_bert.encoder.layer, strict=True)", "zip(model.layers[:2], hf_bert.encoder.layer[:2])"))},
            loses=("load_hf_any_size",), message="don't assume a number"),
    Variant("load_rebinds_data_without_shape_checks", {LOAD: load(body=LOAD_BODY.replace(
        "ours.weight.copy_(theirs.weight)\n        ours.bias.copy_(theirs.bias)",
        "ours.weight.data = theirs.weight.data.clone()\n        ours.bias.data = theirs.bias.data.clone()").replace(
        "model.position_embeddings.weight.copy_(e.position_embeddings.weight)",
        "model.position_embeddings.weight.data = e.position_embeddings.weight.data.clone()"))},
            loses=("load_hf_any_size",), message="without complaint"),
    # 08's reference MiniBert and loader (courselib.bert) taken for 07's answers: out of 07's sandbox.
    Variant("minibert_is_the_course_reference", {BERT: "from courselib.bert import MiniBert\n"},
            loses=("minibert_embeddings", "minibert_padding_mask", "minibert_matches_hf_bert", "minibert_structure"),
            message="is not available while 07_encoder is graded"),
    Variant("load_is_the_course_reference", {LOAD: "from courselib.bert import load_hf_bert_weights\n"},
            loses=("load_hf_parity", "load_hf_any_size"), message="is not available while 07_encoder is graded"),
    # ---- SequenceClassifier
    Variant("classifier_mean_pools", {HEAD: head('''
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(hidden.mean(dim=1)))
''')}, loses=("classifier_uses_cls",), message="[CLS]"),
    Variant("classifier_last_token", {HEAD: head('''
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(hidden[:, -1]))
''')}, loses=("classifier_uses_cls",), message="[CLS]"),
    Variant("classifier_drops_the_mask", {HEAD: head('''
        hidden = self.encoder(input_ids, token_type_ids=token_type_ids)
        return self.classifier(self.dropout(hidden[:, 0]))
''')}, loses=("classifier_uses_cls",), message="attention_mask"),
    Variant("classifier_encoder_not_registered", {HEAD: '''
class SequenceClassifier(nn.Module):
    def __init__(self, encoder, num_labels):
        super().__init__()
        self.__dict__["encoder"] = encoder  # hidden from nn.Module: its parameters are not ours
        self.classifier = nn.Linear(encoder.d_model, num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.classifier(self.encoder(input_ids, attention_mask, token_type_ids)[:, 0])
'''}, loses=("classifier_shapes", "classifier_uses_cls"), message="submodule"),
    # ---- RMSNorm and SwiGLUFeedForward (optional stretch)
    Variant("rms_norm_subtracts_the_mean", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        centred = x - x.mean(dim=-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
''')}, loses=("stretch_rmsnorm_swiglu_match_llama", "stretch_rmsnorm_swiglu_structure"), message="that is LayerNorm"),
    Variant("rms_norm_eps_outside_sqrt", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps) * self.weight
''')}, loses=("stretch_rmsnorm_swiglu_structure",), message="inside the square root"),
    Variant("rms_norm_divides_by_the_norm_not_the_rms", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + self.eps) * self.weight
''')}, loses=("stretch_rmsnorm_swiglu_match_llama",), message="sqrt(mean(x²) + eps)"),
    Variant("rms_norm_default_eps_1e-5", {STRETCH: stretch(rms_init=RMS_INIT.replace("eps=1e-6", "eps=1e-5"))},
            loses=("stretch_rmsnorm_swiglu_structure",), message="eps=1e-6"),
    Variant("swiglu_silu_on_up_proj", {STRETCH: stretch(swiglu_forward='''
    def forward(self, x):
        return self.down_proj(F.silu(self.up_proj(x)) * self.gate_proj(x))
''')}, loses=("stretch_rmsnorm_swiglu_match_llama",), message="the SiLU is on up_proj"),
    Variant("swiglu_relu", {STRETCH: stretch(swiglu_forward='''
    def forward(self, x):
        return self.down_proj(torch.relu(self.gate_proj(x)) * self.up_proj(x))
''')}, loses=("stretch_rmsnorm_swiglu_match_llama",), message="not ReLU"),
    Variant("swiglu_linears_with_bias", {STRETCH: stretch(swiglu_init=SWIGLU_INIT.replace(", bias=False)", ")"))},
            loses=("stretch_rmsnorm_swiglu_match_llama", "stretch_rmsnorm_swiglu_structure"), message="bias=False"),
    Variant("rms_norm_wraps_llama_rms_norm", {STRETCH: '''
from transformers.models.llama.modeling_llama import LlamaRMSNorm


class RMSNorm(LlamaRMSNorm):
    """Llama's own, renamed."""
''' + SWIGLU_INIT + SWIGLU_FORWARD}, loses=("stretch_rmsnorm_swiglu_match_llama", "stretch_rmsnorm_swiglu_structure"),
            message="flagged for review"),
    Variant("rms_norm_calls_torch_rms_norm", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
''')}, loses=("stretch_rmsnorm_swiglu_match_llama", "stretch_rmsnorm_swiglu_structure"), message="flagged for review"),
]

WARN_AND_PRINT = '''
        import logging, sys, warnings
        warnings.warn("a library deprecation warning", UserWarning)
        print("a library writing to stderr", file=sys.stderr)
        logging.getLogger("some.library").warning("a library logging a warning")
'''

ALTERNATIVES = [
    Variant("ffn_erf_by_hand_and_var_mean_norm", {
        FFN: ffn('''
        h = self.linear1(x)
        return self.linear2(0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0))))
'''),
        NORM: norm('''
        var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
        return self.weight * (x - mean) * torch.rsqrt(var + self.eps) + self.bias
''')}),
    Variant("ffn_gelu_module_and_two_pass_norm", {
        FFN: FFN_INIT + '''        self.activation = nn.GELU()

    def forward(self, x):
        return self.linear2(self.activation(self.linear1(x)))
''',
        NORM: norm('''
        d = x.shape[-1]
        mean = x.sum(dim=-1, keepdim=True) / d
        centred = x - mean
        var = (centred * centred).sum(dim=-1, keepdim=True) / d
        return torch.addcmul(self.bias, centred / (var + self.eps).sqrt(), self.weight)
''')}),
    Variant("layer_with_sublayer_helpers", {LAYER: LAYER_INIT + '''
    def _attention_block(self, x, mask):
        return self.dropout(self.self_attn(x, x, x, mask=mask)[0])

    def _feed_forward_block(self, x):
        return self.dropout(self.ffn(x))

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self._attention_block(self.norm1(x), mask)
            x = x + self._feed_forward_block(self.norm2(x))
        else:
            x = self.norm1(x + self._attention_block(x, mask))
            x = self.norm2(x + self._feed_forward_block(x))
        return x
'''}),
    Variant("minibert_sliced_tables_and_bool_mask", {BERT: bert('''
        T = input_ids.shape[1]
        x = self.token_embeddings(input_ids) + self.position_embeddings.weight[:T]
        if token_type_ids is not None:
            x = x + self.segment_embeddings(token_type_ids)
        else:
            x = x + self.segment_embeddings.weight[0]
        x = self.dropout(self.embedding_norm(x))
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x
''')}),
    Variant("load_by_renaming_the_state_dict", {LOAD: LOAD_START + '''
    renames = {"embeddings.word_embeddings": "token_embeddings",
               "embeddings.position_embeddings": "position_embeddings",
               "embeddings.token_type_embeddings": "segment_embeddings",
               "embeddings.LayerNorm": "embedding_norm",
               "encoder.layer.": "layers.",
               "attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
               "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
               "attention.output.LayerNorm": "norm1", "intermediate.dense": "ffn.linear1",
               "output.dense": "ffn.linear2", "output.LayerNorm": "norm2"}
    state = {}
    for name, tensor in hf_bert.state_dict().items():
        if name.startswith("pooler") or name.endswith(("position_ids", "token_type_ids")):
            continue
        for old, new in renames.items():
            name = name.replace(old, new)
        state[name] = tensor
    model.load_state_dict(state, strict=True)
    return model
'''}),
    Variant("classifier_with_a_bert_pooler", {HEAD: '''
class SequenceClassifier(nn.Module):
    def __init__(self, encoder, num_labels):
        super().__init__()
        self.encoder = encoder
        self.pooler = nn.Sequential(nn.Linear(encoder.d_model, encoder.d_model), nn.Tanh())
        self.classifier = nn.Linear(encoder.d_model, num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        cls = self.encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[:, 0]
        return self.classifier(self.pooler(cls))
'''}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        FFN: ffn(WARN_AND_PRINT + '''
        return self.linear2(F.gelu(self.linear1(x)))
'''),
        NORM: norm(WARN_AND_PRINT + '''
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
'''),
        LOAD: LOAD_START + WARN_AND_PRINT.replace("\n        ", "\n    ") + load(body=LOAD_BODY)[len(LOAD_START):]}),
    # The optional stretch: torch.rsqrt with Llama's float32 round trip and x·sigmoid(x) for the SiLU ...
    Variant("stretch_rsqrt_float32_round_trip_and_sigmoid", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
''', swiglu_forward='''
    def forward(self, x):
        gate = self.gate_proj(x)
        return self.down_proj(gate * torch.sigmoid(gate) * self.up_proj(x))
''')}),
    # ... and the norm divided by sqrt(d), with an nn.SiLU module.
    Variant("stretch_vector_norm_and_silu_module", {STRETCH: stretch(rms_forward='''
    def forward(self, x):
        rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
        return self.weight * x / torch.sqrt(rms ** 2 + self.eps)
''', swiglu_init=SWIGLU_INIT + '''        self.activation = nn.SiLU()
''', swiglu_forward='''
    def forward(self, x):
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
''')}),
]
