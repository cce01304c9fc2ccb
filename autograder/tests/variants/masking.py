"""Mutants and alternative correct answers for 06_masking."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "06_masking"
CAUSAL = "causal_mask_answer"
SOFTMAX = "masked_softmax_answer"
PADDING = "padding_mask_answer"
CAUSAL_PADDING = "causal_padding_mask_answer"
CROSS = "cross_attention_answer"
PACKED = "packed_causal_mask_answer"


def causal(body):
    return "def causal_mask(T):\n" + body


def masked_softmax(body):
    return "def masked_softmax(scores, mask, dim=-1):\n" + body


def padding(body):
    return "def padding_mask(input_ids, pad_id):\n" + body


def causal_padding(body):
    return "def causal_padding_mask(input_ids, pad_id):\n" + body


def cross(body):
    return "def cross_attention(decoder_states, encoder_states, mha, encoder_padding_mask=None):\n" + body


def packed(body):
    return "def packed_causal_mask(document_ids, window=None):\n" + body


def cross_by_hand(q_from="decoder_states", kv_from="encoder_states", scale="math.sqrt(q.shape[-1])", extra_mask="",
                  merge="merge_heads(weights @ v)", out="mha.out_proj({})"):
    """A from-projections cross_attention with one part changed (the mutants' common body)."""
    return cross(f"""
    h = mha.num_heads
    q = split_heads(mha.q_proj({q_from}), h)
    k = split_heads(mha.k_proj({kv_from}), h)
    v = split_heads(mha.v_proj({kv_from}), h)
    scores = q @ k.transpose(-2, -1) / {scale}
    mask = torch.ones_like(scores, dtype=torch.bool) if encoder_padding_mask is None else encoder_padding_mask
{extra_mask}    weights = masked_softmax(scores, mask)
    B, T_dec = decoder_states.shape[:2]
    return {out.format(merge)}, weights
""")


ALL_CROSS = ("cross_attention_shapes", "cross_attention_matches_torch", "cross_attention_ignores_encoder_padding")
ALL_PACKED = ("stretch_packed_causal_mask_values", "stretch_packed_causal_mask_behaviour")


MUTANTS = [
    # ---- causal_mask
    Variant("causal_diagonal_excluded", {CAUSAL: causal("""
    return torch.ones(T, T, dtype=torch.bool).tril(-1)
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="diagonal"),
    Variant("causal_triangle_inverted", {CAUSAL: causal("""
    return torch.ones(T, T, dtype=torch.bool).triu()
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="triangle is inverted"),
    Variant("causal_true_means_blocked", {CAUSAL: causal("""
    return torch.ones(T, T, dtype=torch.bool).triu(1)
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="True means 'may attend'"),
    Variant("causal_float_mask", {CAUSAL: causal("""
    return torch.ones(T, T).tril()
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="bool"),
    # Hard-coding the visible 4x4 answer must earn nothing: the hidden tests use other sizes.
    Variant("causal_hard_coded_visible_answer", {CAUSAL: causal("""
    return torch.tensor([[1, 0, 0, 0],
                         [1, 1, 0, 0],
                         [1, 1, 1, 0],
                         [1, 1, 1, 1]], dtype=torch.bool)
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="shape"),
    # torch's own helper (the oracle) captured under another name before the test: the old check had
    # no watch here at all; the watch recognises the helper's code and flags the answer.
    Variant("causal_from_torch_helper_through_an_alias", {CAUSAL: """
_square_subsequent = nn.Transformer.generate_square_subsequent_mask


""" + causal("""
    return _square_subsequent(T) == 0
""")}, loses=("causal_mask_values", "causal_mask_no_peeking"), message="flagged for review"),
    # ---- masked_softmax
    Variant("masked_softmax_zeroed_after_softmax", {SOFTMAX: masked_softmax("""
    return torch.softmax(scores, dim=dim) * mask
""")}, loses=("masked_softmax_values",), message="not the weights after it"),
    Variant("masked_softmax_renormalised_after_softmax", {SOFTMAX: masked_softmax("""
    weights = torch.softmax(scores, dim=dim) * mask
    return weights / weights.sum(dim=dim, keepdim=True).clamp_min(1e-30)
""")}, loses=("masked_softmax_values",), message="hidden score is huge"),
    Variant("masked_softmax_fill_with_zero", {SOFTMAX: masked_softmax("""
    return torch.softmax(scores.masked_fill(~mask, 0.0), dim=dim)
""")}, loses=("masked_softmax_values",), message="a score of 0 still gets weight"),
    Variant("masked_softmax_polarity_inverted", {SOFTMAX: masked_softmax("""
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=dim)
    return torch.nan_to_num(weights, nan=0.0)
""")}, loses=("masked_softmax_values",), message="True means 'may attend'"),
    Variant("masked_softmax_nan_on_fully_masked_rows", {SOFTMAX: masked_softmax("""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
""")}, loses=("masked_softmax_never_nan",), message="NaN"),
    Variant("masked_softmax_large_negative_not_inf", {SOFTMAX: masked_softmax("""
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=dim)
""")}, loses=("masked_softmax_never_nan",), message="uniform"),
    Variant("masked_softmax_additive_inf_mask", {SOFTMAX: masked_softmax("""
    additive = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(scores + additive, dim=dim), nan=0.0)
""")}, loses=("masked_softmax_never_nan",), message="gradient"),
    Variant("masked_softmax_ignores_dim", {SOFTMAX: masked_softmax("""
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0)
""")}, loses=("masked_softmax_respects_dim",), message="pass dim on to the softmax"),
    Variant("masked_softmax_modifies_scores_in_place", {SOFTMAX: masked_softmax("""
    scores.masked_fill_(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(scores, dim=dim), nan=0.0)
""")}, loses=("masked_softmax_values",), message="in place"),
    Variant("masked_softmax_calls_the_oracle", {SOFTMAX: masked_softmax("""
    moved = scores.movedim(dim, -1)
    identity = torch.eye(moved.shape[-1], dtype=scores.dtype)
    weights = F.scaled_dot_product_attention(moved, identity, identity,
                                             attn_mask=mask.expand(scores.shape).movedim(dim, -1), scale=1.0)
    return weights.movedim(-1, dim)
""")}, loses=("masked_softmax_values",), message="oracle"),
    # A wrapper around the course's reference: only torch's kernel was refused before; the watch sees
    # the course's code, however it is reached.
    Variant("masked_softmax_wraps_the_course_reference", {SOFTMAX: """
from courselib.attention import masked_softmax as _course_masked_softmax


""" + masked_softmax("""
    return _course_masked_softmax(scores, mask, dim=dim)
""")}, loses=("masked_softmax_values", "masked_softmax_never_nan", "masked_softmax_respects_dim"),
        message="flagged for review"),
    # ---- padding_mask
    Variant("padding_masks_queries_not_keys", {PADDING: padding("""
    return (input_ids != pad_id)[:, None, :, None]
""")}, loses=("padding_mask_shape", "padding_never_changes_real_tokens"), message="queries instead of keys"),
    Variant("padding_not_broadcastable", {PADDING: padding("""
    return input_ids != pad_id
""")}, loses=("padding_mask_shape", "padding_mask_values", "padding_never_changes_real_tokens"),
        message="(B, 1, 1, T)"),
    Variant("padding_compares_with_zero", {PADDING: padding("""
    return (input_ids != 0)[:, None, None, :]
""")}, loses=("padding_mask_values", "padding_never_changes_real_tokens"), message="pad_id"),
    Variant("padding_polarity_inverted", {PADDING: padding("""
    return (input_ids == pad_id)[:, None, None, :]
""")}, loses=("padding_mask_values", "padding_never_changes_real_tokens"), message="True means 'may attend'"),
    Variant("padding_float_mask", {PADDING: padding("""
    return (input_ids != pad_id).float()[:, None, None, :]
""")}, loses=("padding_mask_shape", "padding_mask_values"), message="bool"),
    Variant("padding_hard_coded_visible_answer", {PADDING: padding("""
    return torch.tensor([[True, True, True, False, False],
                         [True, True, True, True, True]])[:, None, None, :]
""")}, loses=("padding_mask_shape", "padding_mask_values", "padding_never_changes_real_tokens"),
        message="shape"),
    # ---- causal_padding_mask (graded with the reference causal_mask and padding_mask)
    Variant("causal_padding_combined_with_or", {CAUSAL_PADDING: causal_padding("""
    return causal_mask(input_ids.shape[-1]) | padding_mask(input_ids, pad_id)
""")}, loses=("causal_padding_mask_values", "causal_padding_mask_behaviour"), message="instead of & (and)"),
    Variant("causal_padding_hides_padding_queries", {CAUSAL_PADDING: causal_padding("""
    return causal_mask(input_ids.shape[-1]) & (input_ids != pad_id)[:, None, :, None]
""")}, loses=("causal_padding_mask_values", "causal_padding_mask_behaviour"), message="hid padding queries"),
    Variant("causal_padding_forgets_causal", {CAUSAL_PADDING: causal_padding("""
    B, T = input_ids.shape
    return padding_mask(input_ids, pad_id).expand(B, 1, T, T)
""")}, loses=("causal_padding_mask_values", "causal_padding_mask_behaviour"), message="causal part is missing"),
    Variant("causal_padding_forgets_padding", {CAUSAL_PADDING: causal_padding("""
    B, T = input_ids.shape
    return causal_mask(T).expand(B, 1, T, T)
""")}, loses=("causal_padding_mask_values", "causal_padding_mask_behaviour"), message="padding part is missing"),
    Variant("causal_padding_without_head_axis", {CAUSAL_PADDING: causal_padding("""
    return causal_mask(input_ids.shape[-1]) & (input_ids != pad_id)[:, None, :]
""")}, loses=("causal_padding_mask_shape",), message="(B, 1, T, T)"),
    # ---- cross_attention (graded with the reference masks and masked_softmax; built from mha's projections)
    # The one-liner that used to be the answer: the exercise now forbids the module call, and says so.
    Variant("cross_calls_the_module", {CROSS: cross("""
    return mha(decoder_states, encoder_states, encoder_states, mask=encoder_padding_mask)
""")}, loses=ALL_CROSS, message="calling mha(...) (its forward) is not allowed"),
    # The class's forward reached around the instance: the watch refuses it and flags the answer.
    Variant("cross_calls_the_class_forward", {CROSS: cross("""
    return MultiHeadAttention.forward(mha, decoder_states, encoder_states, mask=encoder_padding_mask)
""")}, loses=ALL_CROSS, message="flagged for review"),
    Variant("cross_queries_and_keys_swapped", {CROSS: cross_by_hand(q_from="encoder_states", kv_from="decoder_states")},
            loses=ALL_CROSS, message="queries come from the decoder"),
    Variant("cross_ignores_encoder_padding_mask", {CROSS: cross_by_hand().replace(
        "weights = masked_softmax(scores, mask)", "weights = torch.softmax(scores, dim=-1)")},
        loses=("cross_attention_matches_torch", "cross_attention_ignores_encoder_padding"),
        message="pass encoder_padding_mask on"),
    Variant("cross_with_a_causal_mask", {CROSS: cross_by_hand(
        extra_mask="    mask = mask & torch.ones(scores.shape[-2:], dtype=torch.bool).tril()\n")},
        loses=("cross_attention_matches_torch",), message="causal mask in cross-attention"),
    Variant("cross_scaled_by_sqrt_d_model", {CROSS: cross_by_hand(scale="math.sqrt(decoder_states.shape[-1])")},
            loses=("cross_attention_matches_torch",), message="√d_head"),
    Variant("cross_heads_merged_without_transpose", {CROSS: cross_by_hand(
        merge="(weights @ v).reshape(B, T_dec, -1)")},
        loses=("cross_attention_matches_torch",), message="transpose(1, 2) before the reshape"),
    Variant("cross_by_hand_without_out_proj", {CROSS: cross_by_hand(out="{}")},
            loses=("cross_attention_matches_torch",), message="out_proj"),
    # ---- packed_causal_mask (optional stretch)
    Variant("packed_causal_only", {PACKED: packed("""
    B, T = document_ids.shape
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T)
""")}, loses=ALL_PACKED, message="leaks across documents"),
    Variant("packed_documents_not_causal", {PACKED: packed("""
    mask = document_ids[:, :, None] == document_ids[:, None, :]
    if window is not None:
        lag = torch.arange(document_ids.shape[1])
        mask = mask & ((lag[:, None] - lag[None, :]).abs() < window)
    return mask[:, None]
""")}, loses=ALL_PACKED, message="stay causal"),
    Variant("packed_window_off_by_one", {PACKED: packed("""
    position = torch.arange(document_ids.shape[1])
    lag = position[:, None] - position[None, :]                      # t - s
    mask = (document_ids[:, :, None] == document_ids[:, None, :]) & (lag >= 0)
    if window is not None:
        mask = mask & (lag <= window)
    return mask[:, None]
""")}, loses=ALL_PACKED, message="off-by-one"),
    Variant("packed_without_head_axis", {PACKED: packed("""
    position = torch.arange(document_ids.shape[1])
    lag = position[:, None] - position[None, :]
    mask = (document_ids[:, :, None] == document_ids[:, None, :]) & (lag >= 0)
    if window is not None:
        mask = mask & (lag < window)
    return mask
""")}, loses=ALL_PACKED, message="(B, 1, T, T)"),
]


ALTERNATIVES = [
    Variant("causal_arange_comparison", {CAUSAL: causal("""
    positions = torch.arange(T)
    return positions[:, None] >= positions[None, :]
""")}),
    Variant("causal_loops", {CAUSAL: causal("""
    return torch.tensor([[key <= query for key in range(T)] for query in range(T)], dtype=torch.bool).reshape(T, T)
""")}),
    Variant("causal_not_strict_upper", {CAUSAL: causal("""
    return ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
""")}),
    Variant("masked_softmax_where_and_any", {SOFTMAX: masked_softmax("""
    weights = torch.softmax(torch.where(mask, scores, float("-inf")), dim=dim)
    return torch.where(mask.any(dim=dim, keepdim=True), weights, torch.zeros((), dtype=scores.dtype))
""")}),
    Variant("masked_softmax_finfo_min_then_zero", {SOFTMAX: masked_softmax("""
    # Hugging Face style: the most negative float, then zero the masked weights
    weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=dim)
    return weights * mask
""")}),
    Variant("masked_softmax_by_hand", {SOFTMAX: masked_softmax("""
    hidden = scores.masked_fill(~mask, float("-inf"))
    top = hidden.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # a fully masked row has no max
    exps = torch.exp(hidden - top)
    return exps / exps.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)
""")}),
    Variant("padding_unsqueeze", {PADDING: padding("""
    return input_ids.ne(pad_id).unsqueeze(1).unsqueeze(2)
""")}),
    Variant("padding_view", {PADDING: padding("""
    B, T = input_ids.shape
    return (input_ids != pad_id).view(B, 1, 1, T)
""")}),
    Variant("causal_padding_from_scratch", {CAUSAL_PADDING: causal_padding("""
    positions = torch.arange(input_ids.shape[-1])
    sees_past = positions[None, :] <= positions[:, None]               # (T, T)
    is_real = input_ids != pad_id                                       # (B, T)
    return sees_past[None, None, :, :] & is_real[:, None, None, :]      # (B, 1, T, T)
""")}),
    Variant("causal_padding_logical_and_expand", {CAUSAL_PADDING: causal_padding("""
    B, T = input_ids.shape
    return torch.logical_and(causal_mask(T).expand(B, 1, T, T), padding_mask(input_ids, pad_id))
""")}),
    Variant("cross_by_hand", {CROSS: cross("""
    h = mha.num_heads
    q = split_heads(mha.q_proj(decoder_states), h)        # (B, h, T_dec, d_head)
    k = split_heads(mha.k_proj(encoder_states), h)        # (B, h, T_enc, d_head)
    v = split_heads(mha.v_proj(encoder_states), h)        # (B, h, T_enc, d_head)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if encoder_padding_mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = masked_softmax(scores, encoder_padding_mask)
    return mha.out_proj(merge_heads(weights @ v)), weights
""")}),
    Variant("cross_einsum", {CROSS: cross("""
    B, T_dec, d_model = decoder_states.shape
    T_enc, h = encoder_states.shape[1], mha.num_heads
    d_head = d_model // h
    q = mha.q_proj(decoder_states).view(B, T_dec, h, d_head)
    k = mha.k_proj(encoder_states).view(B, T_enc, h, d_head)
    v = mha.v_proj(encoder_states).view(B, T_enc, h, d_head)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d_head ** 0.5
    if encoder_padding_mask is not None:
        scores = scores.masked_fill(~encoder_padding_mask, float("-inf"))
    weights = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)     # an all-padding source: zeros, not NaN
    heads = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T_dec, d_model)
    return mha.out_proj(heads), weights
""")}),
    Variant("cross_reshape_transpose_and_F_softmax", {CROSS: cross("""
    B, T_dec, d_model = decoder_states.shape
    h = mha.num_heads
    d_head = d_model // h
    def heads(x):
        return x.reshape(B, -1, h, d_head).transpose(1, 2)          # (B, h, T, d_head)
    q = heads(mha.q_proj(decoder_states))
    k, v = heads(mha.k_proj(encoder_states)), heads(mha.v_proj(encoder_states))
    scores = torch.matmul(q, k.transpose(2, 3)) * d_head ** -0.5
    if encoder_padding_mask is not None:
        scores = scores.masked_fill(encoder_padding_mask.logical_not(), -math.inf)
    weights = F.softmax(scores, dim=-1)
    weights = torch.where(torch.isnan(weights), torch.zeros_like(weights), weights)
    merged = torch.matmul(weights, v).transpose(1, 2).contiguous().view(B, T_dec, d_model)
    return mha.out_proj(merged), weights
""")}),
    Variant("packed_broadcast_comparisons", {PACKED: packed("""
    position = torch.arange(document_ids.shape[-1])
    query, key = position[:, None], position[None, :]                   # t down, s across
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & (key <= query)
    if window is not None:
        allowed = allowed & (query - key < window)
    return allowed.unsqueeze(1)
""")}),
    Variant("packed_loops", {PACKED: packed("""
    B, T = document_ids.shape
    ids = document_ids.tolist()
    rows = [[[ids[b][t] == ids[b][s] and s <= t and (window is None or t - s < window) for s in range(T)]
             for t in range(T)] for b in range(B)]
    return torch.tensor(rows, dtype=torch.bool).reshape(B, 1, T, T)
""")}),
    Variant("packed_tril_and_equality", {PACKED: packed("""
    B, T = document_ids.shape
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if window is not None:
        allowed = torch.logical_and(allowed, torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1 - window))
    same = document_ids.unsqueeze(-1).eq(document_ids.unsqueeze(-2))
    return (same & allowed).view(B, 1, T, T)
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        CAUSAL: causal(WARN_AND_PRINT + """
    return torch.ones(T, T, dtype=torch.bool).tril()
"""),
        SOFTMAX: masked_softmax(WARN_AND_PRINT + """
    return torch.nan_to_num(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim), nan=0.0)
"""),
        PADDING: padding(WARN_AND_PRINT + """
    return (input_ids != pad_id)[:, None, None, :]
"""),
        CROSS: cross(WARN_AND_PRINT + """
    h = mha.num_heads
    q, k, v = (split_heads(x, h) for x in (mha.q_proj(decoder_states), mha.k_proj(encoder_states),
                                           mha.v_proj(encoder_states)))
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, -1) if encoder_padding_mask is None else masked_softmax(scores, encoder_padding_mask)
    return mha.out_proj(merge_heads(weights @ v)), weights
""")}),
]
