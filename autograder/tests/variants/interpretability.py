"""Mutants and alternative correct answers for 13_inside_gpt."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "13_inside_gpt"
CACHE = "run_with_cache_answer"
SCORES = "head_scores_answer"
REPEATED = "repeated_tokens_answer"
LOSS = "loss_by_position_answer"
PREFIX = "prefix_matching_score_answer"
ABLATE = "ablate_head_answer"
LENS = "logit_lens_answer"
PATCH = "patch_residual_answer"
PATCH_HEAD = "patch_head_answer"
STATED = "name_mover_answer"
DLA = "direct_logit_attribution_answer"

CACHE_TESTS = ("run_with_cache_residual", "run_with_cache_pattern", "run_with_cache_z")


def cache(streams_hook="streams.append(output)", pattern_line=None, z_line=None, remove=True):
    """run_with_cache with one piece swapped for a bug."""
    pattern_line = pattern_line or ('patterns.append(torch.softmax(scores.masked_fill(future, float("-inf")), '
                                    'dim=-1))')
    z_line = z_line or "heads.append(merged_heads.view(B, T, h, d // h).transpose(1, 2))"
    removal = "for handle in handles:\n            handle.remove()" if remove else "pass"
    return f'''@torch.no_grad()
def run_with_cache(model, input_ids):
    streams, fused, merged = [], [], []
    handles = [model.blocks[0].register_forward_pre_hook(lambda module, args: streams.append(args[0]))]
    for block in model.blocks:
        handles.append(block.register_forward_hook(lambda module, args, output: {streams_hook}))
        handles.append(block.self_attn.c_attn.register_forward_hook(lambda module, args, output: fused.append(output)))
        handles.append(block.self_attn.c_proj.register_forward_pre_hook(lambda module, args: merged.append(args[0])))
    try:
        logits = model(input_ids)
    finally:
        {removal}
    B, T = input_ids.shape
    patterns, heads = [], []
    for block, qkv, merged_heads in zip(model.blocks, fused, merged):
        h = block.self_attn.num_heads
        d = merged_heads.shape[-1]
        q, k, _ = qkv.split(d, dim=-1)
        q, k = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        {pattern_line}
        {z_line}
    return logits, {{"resid": torch.stack(streams), "pattern": torch.stack(patterns), "z": torch.stack(heads)}}
'''


def scores(body):
    return "def head_scores(pattern, input_ids):\n" + body


SCORES_DUPLICATE = """
    same = input_ids[:, :, None] == input_ids[:, None, :]
    earlier = same & torch.ones(T, T, dtype=torch.bool).tril(-1)
    has = earlier.any(-1).to(pattern.dtype)[None, :, None]
    duplicate = ((pattern * earlier[None, :, None]).sum(-1) * has).sum((1, 3)) / has.sum((1, 3))
"""


def repeated(body):
    return "def repeated_tokens(batch_size, length, vocab_size, generator):\n" + body


def loss(body):
    return "def loss_by_position(logits, input_ids):\n" + body


def prefix(body):
    return "def prefix_matching_score(pattern, length):\n" + body


def ablate(zeroing, remove=True):
    removal = "handle.remove()" if remove else "pass"
    return f'''@torch.no_grad()
def ablate_head(model, input_ids, layer, head):
    attention = model.blocks[layer].self_attn
    d_head = attention.c_proj.in_features // attention.num_heads

    def silence(module, args):
        merged = args[0].clone()
        {zeroing}
        return (merged,)
    handle = attention.c_proj.register_forward_pre_hook(silence)
    try:
        return model(input_ids)
    finally:
        {removal}
'''


def lens(body):
    return "def logit_lens(model, resid):\n" + body


def patch(body):
    return "@torch.no_grad()\ndef patch_residual(model, corrupted_ids, clean_resid, layer, position):\n" + body


def patch_head(body):
    return "@torch.no_grad()\ndef patch_head(model, corrupted_ids, clean_z, layer, head):\n" + body


def dla(body):
    return "def direct_logit_attribution(model, cache, token, other):\n" + body


MUTANTS = [
    # ---- run_with_cache
    Variant("cache_resid_before_the_residual_add", {CACHE: cache(streams_hook="streams.append(output - args[0])")},
            loses=("run_with_cache_residual",), message="includes its input"),
    Variant("cache_resid_of_the_attention_sublayer", {CACHE: cache(
        streams_hook="streams.append(output)").replace(
        "handles.append(block.register_forward_hook(", "handles.append(block.self_attn.register_forward_hook(")},
        loses=("run_with_cache_residual",), message="resid"),
    Variant("cache_pattern_before_the_causal_mask", {CACHE: cache(
        pattern_line="patterns.append(torch.softmax(scores, dim=-1))")},
        loses=("run_with_cache_pattern",), message="may not look at keys after t"),
    Variant("cache_pattern_before_the_softmax", {CACHE: cache(
        pattern_line='patterns.append(scores.masked_fill(future, float("-inf")).clamp(min=-1e9))')},
        loses=("run_with_cache_pattern",), message="sum to 1"),
    Variant("cache_pattern_unscaled", {CACHE: cache(
        pattern_line='patterns.append(torch.softmax((scores * math.sqrt(d // h)).masked_fill(future, '
                     'float("-inf")), dim=-1))')},
        loses=("run_with_cache_pattern",), message="√d_head"),
    Variant("cache_z_heads_split_without_transpose", {CACHE: cache(
        z_line="heads.append(merged_heads.view(B, h, T, d // h))")},
        loses=("run_with_cache_z",), message="then transpose"),
    Variant("cache_hooks_left_on_the_model", {CACHE: cache(remove=False)},
            loses=CACHE_TESTS, message="hook"),
    # ---- head_scores
    Variant("scores_previous_reads_the_diagonal", {SCORES: scores("""
    T = pattern.shape[-1]
    previous = pattern.diagonal(0, -2, -1)[..., 1:].mean((1, -1))
    first = pattern[..., 1:, 0].mean((1, -1))""" + SCORES_DUPLICATE + """
    return {"previous": previous, "first": first, "duplicate": duplicate}
""")}, loses=("head_scores_previous_and_first",), message="weight on t - 1"),
    Variant("scores_first_counts_query_zero", {SCORES: scores("""
    T = pattern.shape[-1]
    previous = pattern.diagonal(-1, -2, -1).mean((1, -1))
    first = pattern[..., :, 0].mean((1, -1))""" + SCORES_DUPLICATE + """
    return {"previous": previous, "first": first, "duplicate": duplicate}
""")}, loses=("head_scores_previous_and_first",), message="query 0"),
    Variant("scores_duplicate_counts_the_query_itself", {SCORES: scores("""
    T = pattern.shape[-1]
    previous = pattern.diagonal(-1, -2, -1).mean((1, -1))
    first = pattern[..., 1:, 0].mean((1, -1))
    same = input_ids[:, :, None] == input_ids[:, None, :]
    earlier = same & torch.ones(T, T, dtype=torch.bool).tril(-1)
    itself = same & torch.ones(T, T, dtype=torch.bool).tril()
    has = earlier.any(-1).to(pattern.dtype)[None, :, None]
    duplicate = ((pattern * itself[None, :, None]).sum(-1) * has).sum((1, 3)) / has.sum((1, 3))
    return {"previous": previous, "first": first, "duplicate": duplicate}
""")}, loses=("head_scores_duplicate",), message="own position"),
    Variant("scores_duplicate_over_every_query", {SCORES: scores("""
    T = pattern.shape[-1]
    previous = pattern.diagonal(-1, -2, -1).mean((1, -1))
    first = pattern[..., 1:, 0].mean((1, -1))
    same = input_ids[:, :, None] == input_ids[:, None, :]
    earlier = same & torch.ones(T, T, dtype=torch.bool).tril(-1)
    duplicate = (pattern * earlier[None, :, None]).sum(-1).mean((1, 3))
    return {"previous": previous, "first": first, "duplicate": duplicate}
""")}, loses=("head_scores_duplicate",), message="own position does not count"),
    # Hard-coding the visible example's answer must earn nothing: the hidden patterns are random.
    Variant("scores_hard_coded_visible_answer", {SCORES: scores("""
    return {"previous": torch.tensor([[1.0, 1 / 3, 1 / 6]]), "first": torch.tensor([[1 / 3, 1.0, 1 / 6]]),
            "duplicate": torch.tensor([[0.0, 0.0, 1.0]])}
""")}, loses=("head_scores_previous_and_first", "head_scores_duplicate"), message="shape"),
    # ---- repeated_tokens
    Variant("repeated_draws_twice", {REPEATED: repeated("""
    first = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    second = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    return torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), first, second], dim=1)
""")}, loses=("repeated_tokens_values",), message="repeat"),
    Variant("repeated_without_bos", {REPEATED: repeated("""
    draws = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    return torch.cat([draws, draws], dim=1)
""")}, loses=("repeated_tokens_values",), message="shape"),
    # ---- loss_by_position
    Variant("loss_not_shifted", {LOSS: loss("""
    losses = F.cross_entropy(logits.transpose(1, 2), input_ids, reduction="none")
    return losses.mean(0)[:-1]
""")}, loses=("loss_by_position_values",), message="predicts input_ids[:, t + 1]"),
    Variant("loss_averaged_over_positions", {LOSS: loss("""
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    return losses.mean(1)
""")}, loses=("loss_by_position_values",), message="shape"),
    # ---- prefix_matching_score
    Variant("prefix_offset_by_one", {PREFIX: prefix("""
    queries = torch.arange(length + 1, 2 * length + 1)
    return pattern[..., queries, queries - length].mean((1, -1))
""")}, loses=("prefix_matching_score_values",), message="one past its token"),
    Variant("prefix_queries_start_late", {PREFIX: prefix("""
    queries = torch.arange(length + 2, 2 * length + 1)
    return pattern[..., queries, queries - length + 1].mean((1, -1))
""")}, loses=("prefix_matching_score_values",), message="one query late"),
    # ---- ablate_head
    Variant("ablate_the_next_heads_slice", {ABLATE: ablate(
        "merged[..., (head + 1) * d_head:(head + 2) * d_head] = 0.0")},
        loses=("ablate_head_values",), message="Zero columns"),
    Variant("ablate_positions_instead_of_columns", {ABLATE: ablate("merged[:, head * d_head:(head + 1) * d_head] = 0.0")},
        loses=("ablate_head_values",), message="Zero columns"),
    Variant("ablate_leaves_its_hook", {ABLATE: ablate("merged[..., head * d_head:(head + 1) * d_head] = 0.0",
                                                      remove=False)},
            loses=("ablate_head_leaves_the_model",), message="hook"),
    Variant("ablate_by_zeroing_the_weights", {ABLATE: '''@torch.no_grad()
def ablate_head(model, input_ids, layer, head):
    attention = model.blocks[layer].self_attn
    d_head = attention.c_proj.in_features // attention.num_heads
    attention.c_proj.weight[:, head * d_head:(head + 1) * d_head] = 0.0
    return model(input_ids)
'''}, loses=("ablate_head_leaves_the_model",), message="changed the model's weights"),
    # ---- logit_lens
    Variant("lens_without_the_final_layernorm", {LENS: lens("""
    return model.lm_head(resid)
""")}, loses=("logit_lens_values",), message="through final_norm and lm_head"),
    # ---- patch_residual
    Variant("patch_writes_into_the_clean_cache", {PATCH: patch("""
    def swapped(stream):
        patched = clean_resid[layer]
        keep = torch.arange(stream.shape[1]) != position
        patched[:, keep] = stream[:, keep]
        return patched
    if layer < len(model.blocks):
        handle = model.blocks[layer].register_forward_pre_hook(lambda module, args: (swapped(args[0]),))
    else:
        handle = model.blocks[-1].register_forward_hook(lambda module, args, output: swapped(output))
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}, loses=("patch_residual_keeps_the_clean_cache",), message="wrote into the clean cache"),
    Variant("patch_one_block_late", {PATCH: patch("""
    def swapped(stream):
        stream = stream.clone()
        stream[:, position] = clean_resid[layer][:, position]
        return stream
    handle = model.blocks[min(layer, len(model.blocks) - 1)].register_forward_hook(
        lambda module, args, output: swapped(output))
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}, loses=("patch_residual_values",), message="enters block"),
    Variant("patch_every_position", {PATCH: patch("""
    def swapped(stream):
        return clean_resid[layer].clone()
    if layer < len(model.blocks):
        handle = model.blocks[layer].register_forward_pre_hook(lambda module, args: (swapped(args[0]),))
    else:
        handle = model.blocks[-1].register_forward_hook(lambda module, args, output: swapped(output))
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}, loses=("patch_residual_values",), message="Patch `position` only"),
    # ---- patch_head
    Variant("patch_head_into_the_next_slice", {PATCH_HEAD: patch_head("""
    attention = model.blocks[layer].self_attn
    width = attention.c_proj.in_features // attention.num_heads
    other = (head + 1) % attention.num_heads

    def clean_head(module, args):
        merged = args[0].clone()
        merged[..., other * width:(other + 1) * width] = clean_z[layer][:, head]
        return (merged,)
    hook = attention.c_proj.register_forward_pre_hook(clean_head)
    try:
        return model(corrupted_ids)
    finally:
        hook.remove()
""")}, loses=("patch_head_values",), message="another head's slice"),
    Variant("patch_head_writes_into_the_clean_cache", {PATCH_HEAD: patch_head("""
    attention = model.blocks[layer].self_attn
    width = attention.c_proj.in_features // attention.num_heads

    def clean_head(module, args):
        merged = args[0]
        merged[..., head * width:(head + 1) * width] = clean_z[layer][:, head]
        clean_z[layer][:, head] = 0.0
        return (merged,)
    hook = attention.c_proj.register_forward_pre_hook(clean_head)
    try:
        return model(corrupted_ids)
    finally:
        hook.remove()
""")}, loses=("patch_head_values",), message="wrote into the clean cache"),
    # ---- the stated result
    Variant("stated_the_second_best_head", {STATED: """NAME_MOVER_HEAD = (2, 2)
NAME_ARRIVES_AT = 3
"""}, loses=("name_mover_stated",), message="NAME_MOVER_HEAD"),
    Variant("stated_the_stream_of_the_movers_block", {STATED: """NAME_MOVER_HEAD = (2, 1)
NAME_ARRIVES_AT = 2
"""}, loses=("name_mover_stated",), message="b + 1"),
    # ---- direct_logit_attribution
    Variant("dla_without_the_final_layernorm", {DLA: dla("""
    direction = model.lm_head.weight[token] - model.lm_head.weight[other]
    L, B, h, T, d_head = cache["z"].shape
    shares = []
    for layer, block in enumerate(model.blocks):
        W_O = block.self_attn.c_proj.weight.view(-1, h, d_head)
        written = torch.einsum("bhe,dhe->bhd", cache["z"][layer][:, :, -1], W_O)
        shares.append(written @ direction)
    return torch.stack(shares, dim=1)
""")}, loses=("stretch_direct_logit_attribution",), message="LayerNorm"),
]


ALTERNATIVES = [
    # ---- run_with_cache: hooks keyed by module in dicts, the pattern with einsum and a -inf triangle added
    Variant("cache_with_dicts_and_einsum", {CACHE: '''@torch.no_grad()
def run_with_cache(model, input_ids):
    outputs, qkvs, zs = {}, {}, {}
    handles = []

    def keep(store, key, before=False):
        def seen(module, args, output=None):
            store[key] = args[0] if before else output
        return seen
    handles.append(model.blocks[0].register_forward_pre_hook(keep(outputs, -1, before=True)))
    for index, block in enumerate(model.blocks):
        handles.append(block.register_forward_hook(keep(outputs, index)))
        handles.append(block.self_attn.c_attn.register_forward_hook(keep(qkvs, index)))
        handles.append(block.self_attn.c_proj.register_forward_pre_hook(keep(zs, index, before=True)))
    try:
        logits = model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    B, T = input_ids.shape
    n = len(model.blocks)
    h = model.blocks[0].self_attn.num_heads
    d = zs[0].shape[-1]
    causal = torch.full((T, T), float("-inf")).triu(1)
    pats, heads = [], []
    for index in range(n):
        q, k, _ = qkvs[index].chunk(3, dim=-1)
        q = q.unflatten(-1, (h, d // h))
        k = k.unflatten(-1, (h, d // h))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / (d // h) ** 0.5 + causal.to(q.dtype)
        pats.append(scores.softmax(-1))
        heads.append(zs[index].unflatten(-1, (h, d // h)).permute(0, 2, 1, 3))
    resid = torch.stack([outputs[i] for i in range(-1, n)])
    return logits, {"resid": resid, "pattern": torch.stack(pats), "z": torch.stack(heads)}
'''}),
    Variant("cache_with_block_inputs_and_the_final_norms_input", {CACHE: WARN_AND_PRINT.join(['''@torch.no_grad()
def run_with_cache(model, input_ids):''', '''
    entering, fused, merged = [], [], []
    handles = [block.register_forward_pre_hook(lambda module, args: entering.append(args[0])) for block in model.blocks]
    handles.append(model.final_norm.register_forward_pre_hook(lambda module, args: entering.append(args[0])))
    for block in model.blocks:
        handles.append(block.self_attn.c_attn.register_forward_hook(lambda m, a, out: fused.append(out.clone())))
        handles.append(block.self_attn.c_proj.register_forward_pre_hook(lambda m, a: merged.append(a[0].clone())))
    try:
        logits = model(input_ids)
    finally:
        while handles:
            handles.pop().remove()
    B, T = input_ids.shape
    patterns, heads = [], []
    for block, qkv, z in zip(model.blocks, fused, merged):
        nh = block.self_attn.num_heads
        dh = z.shape[-1] // nh
        q = qkv[..., :nh * dh].reshape(B, T, nh, dh).permute(0, 2, 1, 3)
        k = qkv[..., nh * dh:2 * nh * dh].reshape(B, T, nh, dh).permute(0, 2, 1, 3)
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh)
        scores = torch.where(allowed, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        patterns.append(weights / weights.sum(-1, keepdim=True))
        heads.append(z.reshape(B, T, nh, dh).permute(0, 2, 1, 3))
    return logits, {"resid": torch.stack(entering), "pattern": torch.stack(patterns), "z": torch.stack(heads)}
'''])}),
    # ---- head_scores
    Variant("scores_with_loops", {SCORES: scores("""
    L, B, h, T, _ = pattern.shape
    previous = torch.zeros(L, h, dtype=pattern.dtype)
    first = torch.zeros(L, h, dtype=pattern.dtype)
    duplicate = torch.zeros(L, h, dtype=pattern.dtype)
    count = 0
    for b in range(B):
        for t in range(1, T):
            previous += pattern[:, b, :, t, t - 1] / (B * (T - 1))
            first += pattern[:, b, :, t, 0] / (B * (T - 1))
            earlier = [s for s in range(t) if input_ids[b, s] == input_ids[b, t]]
            if earlier:
                duplicate += pattern[:, b, :, t, earlier].sum(-1)
                count += 1
    return {"previous": previous, "first": first, "duplicate": duplicate / count}
""")}),
    Variant("scores_with_gather_and_masked_means", {SCORES: scores("""
    T = pattern.shape[-1]
    rows = torch.arange(1, T)
    previous = pattern[..., rows, rows - 1].mean(dim=(1, 3))
    first = pattern[..., rows, torch.zeros_like(rows)].mean(dim=(1, 3))
    strictly_before = torch.ones(T, T).tril(-1).bool()
    match = (input_ids.unsqueeze(2) == input_ids.unsqueeze(1)) & strictly_before
    queries = match.any(dim=2)
    mass = torch.where(match[None, :, None], pattern, torch.zeros_like(pattern)).sum(-1)
    duplicate = mass.permute(0, 2, 1, 3)[..., queries].mean(-1)
    return {"previous": previous, "first": first, "duplicate": duplicate}
""")}),
    # ---- repeated_tokens
    Variant("repeated_with_repeat", {REPEATED: repeated("""
    once = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    return torch.cat([once.new_zeros(batch_size, 1), once.repeat(1, 2)], dim=1)
""")}),
    Variant("repeated_by_filling", {REPEATED: repeated("""
    out = torch.zeros(batch_size, 1 + 2 * length, dtype=torch.long)
    out[:, 1:1 + length] = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    out[:, 1 + length:] = out[:, 1:1 + length]
    return out
""")}),
    # ---- loss_by_position
    Variant("loss_by_gathering_log_probs", {LOSS: loss("""
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return -picked.mean(dim=0)
""")}),
    Variant("loss_with_a_loop_over_positions", {LOSS: loss("""
    return torch.stack([F.cross_entropy(logits[:, t], input_ids[:, t + 1]) for t in range(logits.shape[1] - 1)])
""")}),
    # ---- prefix_matching_score
    Variant("prefix_with_a_diagonal", {PREFIX: prefix("""
    stripe = pattern.diagonal(offset=-(length - 1), dim1=-2, dim2=-1)   # entries (t, t - length + 1)
    return stripe[..., 2:].mean(dim=(1, 3))
""")}),
    Variant("prefix_with_a_loop", {PREFIX: prefix("""
    total = 0
    for t in range(length + 1, 2 * length + 1):
        total = total + pattern[:, :, :, t, t - length + 1].mean(1)
    return total / length
""")}),
    # ---- ablate_head
    Variant("ablate_with_a_view_of_the_heads", {ABLATE: '''@torch.no_grad()
def ablate_head(model, input_ids, layer, head):
    proj = model.blocks[layer].self_attn.c_proj
    heads = model.blocks[layer].self_attn.num_heads

    def drop(module, args):
        x = args[0]
        split = x.reshape(*x.shape[:-1], heads, -1).clone()
        split[..., head, :] = 0
        return (split.flatten(-2),)
    handle = proj.register_forward_pre_hook(drop)
    try:
        out = model(input_ids)
    finally:
        handle.remove()
    return out
'''}),
    Variant("ablate_by_subtracting_the_heads_output", {ABLATE: '''@torch.no_grad()
def ablate_head(model, input_ids, layer, head):
    proj = model.blocks[layer].self_attn.c_proj
    size = proj.in_features // model.blocks[layer].self_attn.num_heads
    cols = slice(head * size, (head + 1) * size)

    def subtract(module, args, output):
        return output - args[0][..., cols] @ module.weight[:, cols].T
    handle = proj.register_forward_hook(subtract)
    try:
        return model(input_ids)
    finally:
        handle.remove()
'''}),
    # ---- logit_lens
    Variant("lens_by_hand", {LENS: lens("""
    norm = model.final_norm
    mean = resid.mean(-1, keepdim=True)
    var = ((resid - mean) ** 2).mean(-1, keepdim=True)
    normed = (resid - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
    return normed @ model.lm_head.weight.T
""")}),
    Variant("lens_with_functional_calls", {LENS: lens("""
    norm = model.final_norm
    normed = F.layer_norm(resid, resid.shape[-1:], norm.weight, norm.bias, norm.eps)
    return F.linear(normed, model.lm_head.weight)
""")}),
    # ---- patch_residual
    Variant("patch_final_stream_at_the_final_norm", {PATCH: patch("""
    target = model.blocks[layer] if layer < len(model.blocks) else model.final_norm

    def replace(module, args):
        stream = args[0].clone()
        stream[:, position, :] = clean_resid[layer, :, position, :]
        return (stream,) + tuple(args[1:])
    handle = target.register_forward_pre_hook(replace)
    try:
        logits = model(corrupted_ids)
    finally:
        handle.remove()
    return logits
""")}),
    Variant("patch_with_where", {PATCH: patch("""
    def mixed(stream):
        at = (torch.arange(stream.shape[1]) == position)[None, :, None]
        return torch.where(at, clean_resid[layer].to(stream.dtype), stream)
    blocks = model.blocks
    if layer == len(blocks):
        handle = blocks[layer - 1].register_forward_hook(lambda module, args, output: mixed(output))
    else:
        handle = blocks[layer].register_forward_pre_hook(lambda module, args: (mixed(args[0]),))
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}),
    # ---- patch_head
    Variant("patch_head_with_a_view", {PATCH_HEAD: patch_head("""
    heads = model.blocks[layer].self_attn.num_heads

    def put(module, args):
        split = args[0].unflatten(-1, (heads, -1)).clone()
        split[:, :, head] = clean_z[layer, :, head]
        return (split.flatten(-2),)
    handle = model.blocks[layer].self_attn.c_proj.register_forward_pre_hook(put)
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}),
    Variant("patch_head_with_cat", {PATCH_HEAD: patch_head("""
    size = clean_z.shape[-1]

    def put(module, args):
        x = args[0]
        before, after = x[..., :head * size], x[..., (head + 1) * size:]
        return (torch.cat([before, clean_z[layer][:, head].to(x.dtype), after], dim=-1),)
    handle = model.blocks[layer].self_attn.c_proj.register_forward_pre_hook(put)
    try:
        return model(corrupted_ids)
    finally:
        handle.remove()
""")}),
    # ---- the stated result, read off the maps the notebook computed
    Variant("stated_from_the_maps", {STATED: """NAME_MOVER_HEAD = divmod(int(heads_restored.flatten().argmax()), heads_restored.shape[1])
NAME_ARRIVES_AT = int((residual_map[:, -1] > 0.9).float().argmax())
"""}),
    Variant("stated_as_a_list_converted", {STATED: """NAME_MOVER_HEAD = tuple([2, 1])
NAME_ARRIVES_AT = 2 + 1
"""}),
    # ---- direct_logit_attribution
    Variant("dla_with_loops_and_layer_norm_pieces", {DLA: dla("""
    final = cache["resid"][-1][:, -1]
    norm = model.final_norm
    sigma = (final.var(-1, unbiased=False) + norm.eps).sqrt()                    # (B,)
    unembed = model.lm_head.weight[token] - model.lm_head.weight[other]
    L, B, h, T, dh = cache["z"].shape
    out = torch.zeros(B, L, h, dtype=final.dtype)
    for layer in range(L):
        weight = model.blocks[layer].self_attn.c_proj.weight
        for hd in range(h):
            written = cache["z"][layer][:, hd, -1] @ weight[:, hd * dh:(hd + 1) * dh].T    # (B, d)
            centred = written - written.mean(-1, keepdim=True)
            out[:, layer, hd] = (centred * norm.weight / sigma[:, None]) @ unembed
    return out
""")}),
    Variant("dla_by_a_centring_matrix", {DLA: dla("""
    final = cache["resid"][-1][:, -1]
    d = final.shape[-1]
    centring = torch.eye(d, dtype=final.dtype) - 1.0 / d
    scale = torch.rsqrt(final.var(-1, unbiased=False) + model.final_norm.eps)   # (B,)
    direction = centring @ ((model.lm_head.weight[token] - model.lm_head.weight[other]) * model.final_norm.weight)
    z = cache["z"][..., -1, :]                                                     # (L, B, h, dh)
    L, B, h, dh = z.shape
    W = torch.stack([block.self_attn.c_proj.weight.T.reshape(h, dh, d) for block in model.blocks])   # (L, h, dh, d)
    values = torch.einsum("lbhe,lhed,d->blh", z, W, direction)
    return values * scale[:, None, None]
""")}),
]
