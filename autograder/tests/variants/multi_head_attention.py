"""Mutants and alternative correct answers for 05_multi_head_attention."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "05_multi_head_attention"
SPLIT = "split_heads_answer"
MERGE = "merge_heads_answer"
MHA = "multi_head_attention_answer"
COPY = "copy_from_torch_answer"
COUNT = "mha_num_parameters_answer"
GQA = "grouped_query_attention_answer"

DIVISIBILITY_CHECK = """
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
"""


def split(body):
    return "def split_heads(x, num_heads):\n    B, T, d_model = x.shape\n" + body


def merge(body):
    return "def merge_heads(x):\n    B, h, T, d_head = x.shape\n" + body


def mha(init, forward):
    return ("class MultiHeadAttention(nn.Module):\n"
            "    def __init__(self, d_model, num_heads, bias=True):\n"
            "        super().__init__()\n" + init +
            "\n    def forward(self, query, key=None, value=None, mask=None):\n" + forward)


def copy(body):
    return "def copy_from_torch(mha, torch_mha):\n" + body


def count(body):
    return "def mha_num_parameters(d_model, num_heads, bias=True):\n" + body


def gqa(body):
    return "def grouped_query_attention(q, k, v, mask=None):\n" + body


GQA_CHECK = """
    h, h_kv = q.shape[1], k.shape[1]
    if h % h_kv:
        raise ValueError(f"h={h} query heads, h_kv={h_kv} key/value heads: h_kv must divide h")
    g = h // h_kv
"""
GQA_ATTEND = """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
"""


INIT = """
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model, self.num_heads = d_model, num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
"""
DEFAULTS = """
        key = query if key is None else key
        value = key if value is None else value
"""
PROJECT_AND_SPLIT = DEFAULTS + """
        q = split_heads(self.q_proj(query), self.num_heads)
        k = split_heads(self.k_proj(key), self.num_heads)
        v = split_heads(self.v_proj(value), self.num_heads)
"""
ATTEND = """
        heads, weights = scaled_dot_product_attention(q, k, v, mask)
"""
INLINE_ATTENTION = """
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = weights @ v
"""
RETURN = """
        return self.out_proj(merge_heads(heads)), weights
"""

COPY_BODY = """
    d = torch_mha.embed_dim
    with torch.no_grad():
        for i, linear in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
            linear.weight.copy_(torch_mha.in_proj_weight[i * d:(i + 1) * d])
            if torch_mha.in_proj_bias is not None:
                linear.bias.copy_(torch_mha.in_proj_bias[i * d:(i + 1) * d])
        mha.out_proj.weight.copy_(torch_mha.out_proj.weight)
        if torch_mha.out_proj.bias is not None:
            mha.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return mha
"""

MUTANTS = [
    # ---- split_heads
    Variant("split_view_without_transpose", {SPLIT: split(DIVISIBILITY_CHECK + """
    return x.view(B, num_heads, T, d_model // num_heads)
""")}, loses=("split_heads_values",), message="mixes tokens into heads"),
    Variant("split_interleaves_features", {SPLIT: split(DIVISIBILITY_CHECK + """
    return x.view(B, T, d_model // num_heads, num_heads).permute(0, 3, 1, 2)
""")}, loses=("split_heads_values",), message="Head 0 holds features 0, 1, 2"),
    Variant("split_without_transpose_keeps_tokens_first", {SPLIT: split(DIVISIBILITY_CHECK + """
    return x.view(B, T, num_heads, d_model // num_heads)
""")}, loses=("split_heads_shape", "split_heads_values"), message="heads before tokens"),
    Variant("split_no_divisibility_check", {SPLIT: split("""
    return x.view(B, T, num_heads, d_model // num_heads).transpose(1, 2)
""")}, loses=("split_heads_checks_divisibility",), message="not ValueError"),
    Variant("split_message_without_numbers", {SPLIT: split("""
    if d_model % num_heads:
        raise ValueError("bad number of heads")
    return x.view(B, T, num_heads, d_model // num_heads).transpose(1, 2)
""")}, loses=("split_heads_checks_divisibility",), message="both numbers"),
    # A wrapper around the course's reference: the old identity check never saw it; the watch does.
    Variant("split_wraps_the_course_reference", {SPLIT: """
from courselib.attention import split_heads as _course_split_heads


def split_heads(x, num_heads):
    return _course_split_heads(x, num_heads)
"""}, loses=("split_heads_shape", "split_heads_values", "split_heads_checks_divisibility"),
        message="flagged for review"),
    # ---- merge_heads
    Variant("merge_heads_in_wrong_order", {MERGE: merge("""
    return x.permute(0, 2, 3, 1).reshape(B, T, h * d_head)
""")}, loses=("merge_heads_inverts_split",), message="head 0's features, then head 1's"),
    Variant("merge_without_transpose", {MERGE: merge("""
    return x.reshape(B, T, h * d_head)
""")}, loses=("merge_heads_inverts_split",), message="Transpose back"),
    Variant("merge_view_after_transpose", {MERGE: merge("""
    return x.transpose(1, 2).view(B, T, h * d_head)
""")}, loses=("merge_heads_shape", "merge_heads_inverts_split"), message="contiguous"),
    # ---- MultiHeadAttention
    Variant("mha_scaled_by_sqrt_d_model", {MHA: mha(INIT, PROJECT_AND_SPLIT + """
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = weights @ v
""" + RETURN)}, loses=("mha_values",), message="not by √d_model"),
    Variant("mha_missing_out_proj", {MHA: mha(INIT, PROJECT_AND_SPLIT + ATTEND + """
        return merge_heads(heads), weights
""")}, loses=("mha_values",), message="out_proj"),
    Variant("mha_view_without_transpose", {MHA: mha(INIT, DEFAULTS + """
        B, T_q, T_k, h = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        d_head = self.d_model // h
        q = self.q_proj(query).view(B, h, T_q, d_head)
        k = self.k_proj(key).view(B, h, T_k, d_head)
        v = self.v_proj(value).view(B, h, T_k, d_head)
""" + ATTEND + """
        return self.out_proj(heads.reshape(B, T_q, self.d_model)), weights
""")}, loses=("mha_values",), message="mixes tokens into heads"),
    Variant("mha_heads_merged_in_wrong_order", {MHA: mha(INIT, PROJECT_AND_SPLIT + ATTEND + """
        B, h, T_q, d_head = heads.shape
        return self.out_proj(heads.permute(0, 2, 3, 1).reshape(B, T_q, h * d_head)), weights
""")}, loses=("mha_values",), message="in order"),
    Variant("mha_no_divisibility_check", {MHA: mha("""
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
""", PROJECT_AND_SPLIT + ATTEND + RETURN)}, loses=("mha_modules",), message="ValueError"),
    Variant("mha_ignores_bias_argument", {MHA: mha(INIT.replace(", bias=bias", ""),
                                                    PROJECT_AND_SPLIT + ATTEND + RETURN)},
            loses=("mha_modules",), message="bias=False"),
    Variant("mha_always_self_attention", {MHA: mha(INIT, """
        q = split_heads(self.q_proj(query), self.num_heads)
        k = split_heads(self.k_proj(query), self.num_heads)
        v = split_heads(self.v_proj(query), self.num_heads)
""" + ATTEND + RETURN)}, loses=("mha_shapes", "mha_cross_attention"), message="Keys come from `key`"),
    # The visible tests pass the same memory as key and value; only the hidden test tells them apart.
    Variant("mha_values_from_key", {MHA: mha(INIT, DEFAULTS + """
        q = split_heads(self.q_proj(query), self.num_heads)
        k = split_heads(self.k_proj(key), self.num_heads)
        v = split_heads(self.v_proj(key), self.num_heads)
""" + ATTEND + RETURN)}, loses=("mha_cross_attention",), message="values come from `key`"),
    Variant("mha_weights_averaged_over_heads", {MHA: mha(INIT, PROJECT_AND_SPLIT + ATTEND + """
        return self.out_proj(merge_heads(heads)), weights.mean(dim=1)
""")}, loses=("mha_shapes",), message="Don't average"),
    Variant("mha_ignores_mask", {MHA: mha(INIT, PROJECT_AND_SPLIT + """
        heads, weights = scaled_dot_product_attention(q, k, v)
""" + RETURN)}, loses=("mha_mask",), message="pass `mask` on"),
    # Its own __init__, the course's forward borrowed as a plain function: not a subclass, so the old
    # check let it through; the watch recognises the course's code.
    Variant("mha_borrows_the_course_forward", {MHA: """
from courselib.attention import MultiHeadAttention as _CourseMultiHeadAttention

_course_forward = _CourseMultiHeadAttention.forward


""" + mha(INIT, """
        return _course_forward(self, query, key, value, mask)
""")}, loses=("mha_shapes", "mha_values", "mha_cross_attention", "mha_mask"), message="flagged for review"),
    # ---- copy_from_torch
    Variant("copy_in_proj_in_k_q_v_order", {COPY: copy(COPY_BODY.replace(
        "(mha.q_proj, mha.k_proj, mha.v_proj)", "(mha.k_proj, mha.q_proj, mha.v_proj)"))},
        loses=("copy_from_torch_values",), message="W_Q, then W_K, then W_V"),
    Variant("copy_in_proj_in_q_v_k_order", {COPY: copy(COPY_BODY.replace(
        "(mha.q_proj, mha.k_proj, mha.v_proj)", "(mha.q_proj, mha.v_proj, mha.k_proj)"))},
        loses=("copy_from_torch_values",), message="W_Q, then W_K, then W_V"),
    Variant("copy_transposes_weights", {COPY: copy(COPY_BODY.replace(
        "linear.weight.copy_(torch_mha.in_proj_weight[i * d:(i + 1) * d])",
        "linear.weight.copy_(torch_mha.in_proj_weight[i * d:(i + 1) * d].T)").replace(
        "mha.out_proj.weight.copy_(torch_mha.out_proj.weight)", "mha.out_proj.weight.copy_(torch_mha.out_proj.weight.T)"))},
        loses=("copy_from_torch_values",), message="as it is"),
    Variant("copy_forgets_out_proj", {COPY: copy(COPY_BODY.replace(
        "        mha.out_proj.weight.copy_(torch_mha.out_proj.weight)\n", "").replace(
        "            mha.out_proj.bias.copy_(torch_mha.out_proj.bias)\n", "            pass\n"))},
        loses=("copy_from_torch_values",), message="Copy out_proj"),
    Variant("copy_forgets_biases", {COPY: copy("""
    d = torch_mha.embed_dim
    with torch.no_grad():
        for i, linear in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
            linear.weight.copy_(torch_mha.in_proj_weight[i * d:(i + 1) * d])
        mha.out_proj.weight.copy_(torch_mha.out_proj.weight)
    return mha
""")}, loses=("copy_from_torch_values",), message="in_proj_bias is split the same way"),
    Variant("copy_assumes_biases_exist", {COPY: copy("""
    W_Q, W_K, W_V = torch_mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
    with torch.no_grad():
        for linear, weight, bias in [(mha.q_proj, W_Q, b_q), (mha.k_proj, W_K, b_k), (mha.v_proj, W_V, b_v)]:
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        mha.out_proj.weight.copy_(torch_mha.out_proj.weight)
        mha.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return mha
""")}, loses=("copy_from_torch_without_bias",), message="only when they exist"),
    Variant("copy_outside_no_grad", {COPY: copy(COPY_BODY.replace("    with torch.no_grad():\n", "    if True:\n"))},
            loses=("copy_from_torch_values", "copy_from_torch_without_bias"), message="torch.no_grad"),
    # ---- mha_num_parameters
    Variant("count_ignores_bias", {COUNT: count(DIVISIBILITY_CHECK + """
    return 4 * d_model * d_model + 4 * d_model
""")}, loses=("mha_num_parameters_bias",), message="without biases"),
    Variant("count_without_out_proj", {COUNT: count(DIVISIBILITY_CHECK + """
    return 3 * d_model * d_model + (3 * d_model if bias else 0)
""")}, loses=("mha_num_parameters_counts", "mha_num_parameters_bias"), message="four d×d weight matrices"),
    Variant("count_no_divisibility_check", {COUNT: count("""
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
""")}, loses=("mha_num_parameters_counts",), message="must raise ValueError"),
    # Hard-coding the visible answers passes every visible test and must earn nothing.
    Variant("count_hard_coded_visible_answers", {COUNT: count(DIVISIBILITY_CHECK + """
    known = {(512, True): 1_050_624, (768, True): 2_362_368, (512, False): 1_048_576}
    return known.get((d_model, bias), 1_050_624)
""")}, loses=("mha_num_parameters_counts", "mha_num_parameters_bias"), message="hard-coded"),
    # ---- grouped_query_attention (optional stretch)
    Variant("gqa_tiles_heads_with_repeat", {GQA: gqa(GQA_CHECK + """
    k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
""" + GQA_ATTEND)}, loses=("stretch_gqa_values", "stretch_gqa_sharing"), message="repeat_interleave (0, 0, 1, 1)"),
    Variant("gqa_tiles_only_the_values", {GQA: gqa(GQA_CHECK + """
    k, v = k.repeat_interleave(g, dim=1), v.repeat(1, g, 1, 1)
""" + GQA_ATTEND)}, loses=("stretch_gqa_values", "stretch_gqa_sharing"), message="for k and v"),
    Variant("gqa_no_scaling", {GQA: gqa(GQA_CHECK + """
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
""" + GQA_ATTEND.replace(" / math.sqrt(q.shape[-1])", ""))}, loses=("stretch_gqa_values",), message="√d_head"),
    Variant("gqa_ignores_mask", {GQA: gqa(GQA_CHECK + """
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
""" + GQA_ATTEND.replace("if mask is not None:", "if False:"))}, loses=("stretch_gqa_values",),
        message="the mask was ignored"),
    Variant("gqa_no_divisibility_check", {GQA: gqa("""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
""" + GQA_ATTEND)}, loses=("stretch_gqa_sharing",), message="not ValueError"),
    Variant("gqa_message_without_numbers", {GQA: gqa("""
    if q.shape[1] % k.shape[1]:
        raise ValueError("bad number of key/value heads")
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
""" + GQA_ATTEND)}, loses=("stretch_gqa_sharing",), message="both numbers"),
    # The oracle itself, captured before the test, for the output; the weights by hand.
    Variant("gqa_calls_the_oracle_captured_early", {GQA: """
import torch
_oracle = torch.nn.functional.scaled_dot_product_attention


def grouped_query_attention(q, k, v, mask=None):
    g = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(g, dim=1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return _oracle(q, k, v, attn_mask=mask, enable_gqa=True), torch.softmax(scores, dim=-1)
"""}, loses=("stretch_gqa_values", "stretch_gqa_sharing"), message="flagged for review"),
    # The notebook's own import: the course's scaled_dot_product_attention after repeat_interleave.
    Variant("gqa_uses_the_course_attention", {GQA: gqa(GQA_CHECK + """
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return scaled_dot_product_attention(q, k, v, mask)
""")}, loses=("stretch_gqa_values", "stretch_gqa_sharing"), message="flagged for review"),
]


ALTERNATIVES = [
    Variant("split_merge_with_chunk_and_cat", {
        SPLIT: split(DIVISIBILITY_CHECK + """
    return torch.stack(torch.chunk(x, num_heads, dim=-1), dim=1)
"""),
        MERGE: merge("""
    return torch.cat([x[:, i] for i in range(h)], dim=-1)
""")}),
    Variant("split_merge_with_unflatten_and_permute", {
        SPLIT: """
def split_heads(x, num_heads):
    if x.shape[-1] % num_heads:
        raise ValueError(f"{num_heads} heads cannot share d_model={x.shape[-1]} features equally")
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)
""",
        MERGE: """
def merge_heads(x):
    return x.permute(0, 2, 1, 3).contiguous().flatten(start_dim=2)
"""}),
    # One loop over heads, its own softmax, no split/merge helpers, value defaulting through key.
    Variant("mha_loop_over_heads", {MHA: mha("""
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.h, self.d_head = num_heads, d_model // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
""", """
        if key is None:
            key = query
        if value is None:
            value = key
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        outputs, all_weights = [], []
        for i in range(self.h):
            cols = slice(i * self.d_head, (i + 1) * self.d_head)
            scores = torch.einsum("bqd,bkd->bqk", q[..., cols], k[..., cols]) / self.d_head ** 0.5
            if mask is not None:
                head_mask = mask.expand(q.shape[0], self.h, q.shape[1], k.shape[1])[:, i]
                scores = scores.masked_fill(~head_mask, float("-inf"))
            w = torch.softmax(scores, dim=-1)
            all_weights.append(w)
            outputs.append(w @ v[..., cols])
        return self.out_proj(torch.cat(outputs, dim=-1)), torch.stack(all_weights, dim=1)
""")}),
    # One fused qkv product, reshape/permute, baddbmm-free einsum attention with an additive mask.
    Variant("mha_fused_qkv_einsum", {MHA: mha(INIT, DEFAULTS + """
        B, T_q, _ = query.shape
        T_k = key.shape[1]
        h, d_head = self.num_heads, self.d_model // self.num_heads
        W = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        b = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        Wq, Wk, Wv = W.split(self.d_model)
        bq, bk, bv = (None, None, None) if b is None else b.split(self.d_model)
        q = F.linear(query, Wq, bq).reshape(B, T_q, h, d_head).permute(0, 2, 1, 3)
        k = F.linear(key, Wk, bk).reshape(B, T_k, h, d_head).permute(0, 2, 1, 3)
        v = F.linear(value, Wv, bv).reshape(B, T_k, h, d_head).permute(0, 2, 1, 3)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * d_head ** -0.5
        if mask is not None:
            scores = scores + torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        heads = torch.einsum("bhqk,bhkd->bhqd", weights, v)
        return self.out_proj(heads.permute(0, 2, 1, 3).reshape(B, T_q, self.d_model)), weights
""")}),
    Variant("copy_with_parameters_and_state_dicts", {COPY: copy("""
    d = torch_mha.embed_dim
    for i, name in enumerate(["q_proj", "k_proj", "v_proj"]):
        state = {"weight": torch_mha.in_proj_weight[i * d:(i + 1) * d]}
        if torch_mha.in_proj_bias is not None:
            state["bias"] = torch_mha.in_proj_bias[i * d:(i + 1) * d]
        getattr(mha, name).load_state_dict(state)
    mha.out_proj.weight = nn.Parameter(torch_mha.out_proj.weight.detach().clone())
    if torch_mha.out_proj.bias is not None:
        mha.out_proj.bias = nn.Parameter(torch_mha.out_proj.bias.detach().clone())
    return mha
""")}),
    Variant("count_by_building_the_module", {COUNT: count("""
    return sum(p.numel() for p in MultiHeadAttention(d_model, num_heads, bias=bias).parameters())
""")}),
    Variant("count_closed_form_with_bool_arithmetic", {COUNT: count("""
    if d_model % num_heads:
        raise ValueError(f"{num_heads} heads don't divide d_model={d_model}")
    return 4 * d_model * (d_model + int(bias))
""")}),
    # ---- grouped_query_attention (optional stretch)
    # No copy: q grouped as (B, h_kv, g, T, d_head), k and v broadcast over the group, the mask reshaped alike.
    Variant("gqa_grouped_broadcast_without_copies", {GQA: gqa(GQA_CHECK + """
    B, _, T, d_head = q.shape
    S = k.shape[2]
    grouped = q.reshape(B, h_kv, g, T, d_head)
    scores = grouped @ k[:, :, None].transpose(-2, -1) / d_head ** 0.5      # (B, h_kv, g, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(B, h, T, S).reshape(B, h_kv, g, T, S), float("-inf"))
    weights = scores.softmax(dim=-1)
    return (weights @ v[:, :, None]).reshape(B, h, T, d_head), weights.reshape(B, h, T, S)
""")}),
    # Hugging Face's repeat_kv: expand a new group dimension, then reshape it into the heads.
    Variant("gqa_expand_and_reshape", {GQA: gqa(GQA_CHECK + """
    B, _, S, d_head = k.shape
    k = k[:, :, None].expand(B, h_kv, g, S, d_head).reshape(B, h, S, d_head)
    v = v[:, :, None].expand(B, h_kv, g, S, d_head).reshape(B, h, S, d_head)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) * d_head ** -0.5
    if mask is not None:
        scores = scores + torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return torch.einsum("bhts,bhsd->bhtd", weights, v), weights
""")}),
    # Index the K/V heads with i // g, then a loop over query heads with a stable softmax by hand.
    Variant("gqa_index_then_loop_over_heads", {GQA: gqa(GQA_CHECK + """
    kv_of_head = torch.arange(h) // g
    k, v = k[:, kv_of_head], v[:, kv_of_head]
    if mask is not None:
        mask = mask.expand(q.shape[0], h, q.shape[2], k.shape[2])
    outputs, all_weights = [], []
    for i in range(h):
        scores = q[:, i] @ k[:, i].mT / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask[:, i], float("-inf"))
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        w = e / e.sum(dim=-1, keepdim=True)
        all_weights.append(w)
        outputs.append(w @ v[:, i])
    return torch.stack(outputs, dim=1), torch.stack(all_weights, dim=1)
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        SPLIT: split(WARN_AND_PRINT + DIVISIBILITY_CHECK + """
    return x.view(B, T, num_heads, d_model // num_heads).transpose(1, 2)
"""),
        MERGE: merge(WARN_AND_PRINT + """
    return x.transpose(1, 2).reshape(B, T, h * d_head)
"""),
        COPY: copy(WARN_AND_PRINT + COPY_BODY),
        COUNT: count(WARN_AND_PRINT + DIVISIBILITY_CHECK + """
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
""")}),
]
