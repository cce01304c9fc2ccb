"""Hidden checks for 13_inside_gpt, the probe side: what runs in the student's kernel.

Each probe builds its hidden inputs from `seeds`: a small GPT in notebook 09's layout (`courselib.fused_gpt.GPT`,
09's reference, which answers none of 13's exercises) with seeded random weights in float64, token ids, random
attention patterns or residual streams. It calls the student's function through `call` and returns what came back,
with what the probe saw around the call (hooks left on the model, whether an input tensor was changed). The judges
(autograder/judges/interpretability.py, in the grader only) rebuild the same weights and inputs and compare with
independent oracles: transformers' `GPT2LMHeadModel` holding the same weights (its hidden states and attention
weights, its own modules for the logit lens, its blocks hooked for patching and ablation), and explicit loops over
positions for the scores.
"""
import torch

from autograder.checks.common import call, probe

# Building the oracle's GPT2 in the kernel would answer the cache, the lens, ablation and patching.
ORACLE_SHORTCUTS = ["transformers.GPT2LMHeadModel", "transformers.GPT2Model",
                    "transformers.models.gpt2.modeling_gpt2.GPT2Attention",
                    "transformers.models.gpt2.modeling_gpt2.GPT2Block"]
ADVICE = "record the activations with hooks on the course's model; transformers' GPT-2 is the hidden tests' oracle."

# ---------------------------------------------------------------------------------------- seeded models
DIMS = dict(vocab_size=29, d_model=12, num_layers=3, num_heads=3, max_positions=16)   # d_head = 4


def random_state(seed_generator, dims=DIMS):
    """Weights for a GPT of `dims` in 09's names, drawn from the generator (the judge draws the same)."""
    from courselib.fused_gpt import GPT
    with torch.random.fork_rng(devices=[]):
        template = GPT(**dims).double()
    g, state = seed_generator, {}
    for name, tensor in template.state_dict().items():
        if name == "lm_head.weight":
            continue                                                  # tied to the token embedding
        noise = torch.randn(tensor.shape, generator=g, dtype=torch.float64)
        if "norm" in name:
            state[name] = (1.0 + 0.2 * noise) if name.endswith("weight") else 0.2 * noise
        elif name.endswith("bias"):
            state[name] = 0.2 * noise
        elif "embeddings" in name:
            state[name] = noise
        else:
            state[name] = noise / tensor.shape[-1] ** 0.5 * 1.5     # c_attn, c_proj, ffn: order-one activations
    state["lm_head.weight"] = state["token_embeddings.embedding.weight"]
    return state


def random_gpt(seeds, n, dims=DIMS):
    """09's GPT (float64, eval) with the seeded weights of stream `n`."""
    from courselib.fused_gpt import GPT
    with torch.random.fork_rng(devices=[]):
        model = GPT(**dims).double()
    model.load_state_dict(random_state(seeds.generator(n), dims))
    return model.eval()


def random_ids(seeds, n, batch, length, vocab=DIMS["vocab_size"]):
    return torch.randint(vocab, (batch, length), generator=seeds.generator(n))


def hooks_on(model):
    """How many forward hooks and pre-hooks are registered on the model's modules."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _model_call(fn, model, *args, name):
    """Call the student's function on a model; also return how many hooks it left and model(ids) afterwards."""
    ids = args[0]
    result, (left, after) = call(fn, model, *args, name=name, forbidden=ORACLE_SHORTCUTS, forbidden_advice=ADVICE,
                                 capture=lambda: (hooks_on(model), model(ids).detach()))
    return result, left, after


# ---------------------------------------------------------------- exercise 1: run_with_cache
CACHE_KEYS = ("resid", "pattern", "z")


def _cache(fn, model, ids):
    with torch.no_grad():
        result, left, after = _model_call(fn, model, ids, name="run_with_cache")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("run_with_cache must return the pair (logits, cache).")
    logits, cache = result
    if not isinstance(cache, dict) or not set(CACHE_KEYS) <= set(cache):
        raise AssertionError(f"the cache must be a dict with the keys {CACHE_KEYS}; yours has "
                             f"{sorted(cache) if isinstance(cache, dict) else type(cache).__name__}.")
    for key in CACHE_KEYS:
        if not torch.is_tensor(cache[key]):
            raise AssertionError(f"cache[{key!r}] should be one tensor (stack the layers with torch.stack), "
                                 f"but it is a {type(cache[key]).__name__}.")
    return {"logits": logits, "cache": {key: cache[key] for key in CACHE_KEYS}, "hooks_left": left,
            "after": after}


CACHE_CASES = {"residual": (1101, (2, 9)), "pattern": (1202, (3, 11)), "z": (1303, (2, 10))}


def cache_problem(seeds, which):
    n, (batch, length) = CACHE_CASES[which]
    return random_gpt(seeds, n), random_ids(seeds, n + 1, batch, length)


@probe
def run_with_cache_residual(seeds, run_with_cache):
    return _cache(run_with_cache, *cache_problem(seeds, "residual"))


@probe
def run_with_cache_pattern(seeds, run_with_cache):
    return _cache(run_with_cache, *cache_problem(seeds, "pattern"))


@probe
def run_with_cache_z(seeds, run_with_cache):
    return _cache(run_with_cache, *cache_problem(seeds, "z"))


# ---------------------------------------------------------------- exercise 2: head_scores
SCORE_KEYS = ("previous", "first", "duplicate")


def random_patterns(g, layers, batch, heads, length, sharpness=2.0):
    """(L, B, h, T, T) causal attention patterns: random scores, masked, softmaxed (rows sum to 1)."""
    scores = torch.randn(layers, batch, heads, length, length, generator=g, dtype=torch.float64) * sharpness
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


def scores_problem(seeds):
    pattern = random_patterns(seeds.generator(2101), 2, 3, 4, 12)
    ids = torch.randint(5, (3, 12), generator=seeds.generator(2102))   # a vocabulary of 5: many repeats
    ids[0, 0] = ids[0, 1]                                              # a duplicate at position 1 in one row
    return pattern, ids


def _scores(fn, pattern, ids):
    result = call(fn, pattern.clone(), ids.clone(), name="head_scores")
    if not isinstance(result, dict) or not set(SCORE_KEYS) <= set(result):
        raise AssertionError(f"head_scores must return a dict with the keys {SCORE_KEYS}.")
    return {key: result[key] for key in SCORE_KEYS}


@probe
def head_scores_previous_and_first(seeds, head_scores):
    return _scores(head_scores, *scores_problem(seeds))


@probe
def head_scores_duplicate(seeds, head_scores):
    return _scores(head_scores, *scores_problem(seeds))


# ---------------------------------------------------------------- exercise 3: repeated_tokens
REPEAT_CASES = [(3, 5, 11), (1, 7, 50), (4, 2, 3)]   # (batch_size, length, vocab_size)


@probe
def repeated_tokens_values(seeds, repeated_tokens):
    results = []
    for i, (batch_size, length, vocab_size) in enumerate(REPEAT_CASES):
        generator = seeds.generator(3101 + i)
        out = call(repeated_tokens, batch_size, length, vocab_size, generator, name="repeated_tokens")
        after = torch.randint(1000, (1,), generator=generator)    # where the student left the generator
        results.append({"ids": out, "generator_after": after})
    return results


# ---------------------------------------------------------------- exercise 4: loss_by_position
def loss_problem(seeds):
    g = seeds.generator(4101)
    logits = torch.randn(3, 8, 13, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(13, (3, 8), generator=g)
    return logits, ids


@probe
def loss_by_position_values(seeds, loss_by_position):
    logits, ids = loss_problem(seeds)
    return call(loss_by_position, logits.clone(), ids.clone(), name="loss_by_position")


# ---------------------------------------------------------------- exercise 5: prefix_matching_score
PREFIX_LENGTHS = (4, 7)


def prefix_problem(seeds, i, length):
    return random_patterns(seeds.generator(5101 + i), 2, 3, 4, 1 + 2 * length)


@probe
def prefix_matching_score_values(seeds, prefix_matching_score):
    return [call(prefix_matching_score, prefix_problem(seeds, i, length), length, name="prefix_matching_score")
            for i, length in enumerate(PREFIX_LENGTHS)]


# ---------------------------------------------------------------- exercise 6: ablate_head
ABLATIONS = [(0, 0), (1, 2), (2, 1)]


def ablation_problem(seeds):
    return random_gpt(seeds, 6101), random_ids(seeds, 6102, 2, 8)


@probe
def ablate_head_values(seeds, ablate_head):
    model, ids = ablation_problem(seeds)
    results = []
    with torch.no_grad():
        for layer, head in ABLATIONS:
            logits, left, after = _model_call(ablate_head, model, ids, layer, head, name="ablate_head")
            results.append({"logits": logits, "hooks_left": left, "after": after})
    return results


@probe
def ablate_head_leaves_the_model(seeds, ablate_head):
    model, ids = ablation_problem(seeds)
    with torch.no_grad():
        _, left, after = _model_call(ablate_head, model, ids, 1, 1, name="ablate_head")
        weights_kept = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                             random_gpt(seeds, 6101).state_dict().values()))
    return {"hooks_left": left, "after": after, "weights_kept": weights_kept}


# ---------------------------------------------------------------- exercise 7: logit_lens
def lens_problem(seeds):
    model = random_gpt(seeds, 7101)
    resid = torch.randn(DIMS["num_layers"] + 1, 2, 5, DIMS["d_model"], generator=seeds.generator(7102),
                        dtype=torch.float64) * 2 + 0.5
    return model, resid


@probe
def logit_lens_values(seeds, logit_lens):
    model, resid = lens_problem(seeds)
    with torch.no_grad():
        return call(logit_lens, model, resid.clone(), name="logit_lens", forbidden=ORACLE_SHORTCUTS,
                    forbidden_advice=ADVICE)


# ---------------------------------------------------------------- exercise 8: patch_residual
def patch_problem(seeds, n):
    """A model, corrupted ids, and a 'clean' cache of random numbers: patching must put exactly these in."""
    model, ids = random_gpt(seeds, n), random_ids(seeds, n + 1, 2, 7)
    g = seeds.generator(n + 2)
    resid = torch.randn(DIMS["num_layers"] + 1, 2, 7, DIMS["d_model"], generator=g, dtype=torch.float64)
    z = torch.randn(DIMS["num_layers"], 2, DIMS["num_heads"], 7, DIMS["d_model"] // DIMS["num_heads"], generator=g,
                    dtype=torch.float64)
    return model, ids, resid, z


RESIDUAL_PATCHES = [(0, 0), (1, 3), (2, 6), (3, 2)]   # (layer, position); layer 3 = the last block's output


def _patched(fn, model, ids, clean, *where, name):
    copy = clean.clone()
    with torch.no_grad():
        result, (left, after, unchanged) = call(
            fn, model, ids, copy, *where, name=name, forbidden=ORACLE_SHORTCUTS, forbidden_advice=ADVICE,
            capture=lambda: (hooks_on(model), model(ids).detach(), torch.equal(copy, clean)))
    return {"logits": result, "hooks_left": left, "after": after, "cache_unchanged": unchanged}


@probe
def patch_residual_values(seeds, patch_residual):
    model, ids, resid, _ = patch_problem(seeds, 8101)
    return [_patched(patch_residual, model, ids, resid, layer, position, name="patch_residual")
            for layer, position in RESIDUAL_PATCHES]


@probe
def patch_residual_keeps_the_clean_cache(seeds, patch_residual):
    model, ids, resid, _ = patch_problem(seeds, 8201)
    return [_patched(patch_residual, model, ids, resid, layer, position, name="patch_residual")
            for layer, position in [(1, 1), (1, 4)]]


# ---------------------------------------------------------------- exercise 9: patch_head
HEAD_PATCHES = [(0, 2), (1, 0), (2, 1)]


@probe
def patch_head_values(seeds, patch_head):
    model, ids, _, z = patch_problem(seeds, 9101)
    return [_patched(patch_head, model, ids, z, layer, head, name="patch_head") for layer, head in HEAD_PATCHES]


# ---------------------------------------------------------------- exercise 10: what patching found
@probe
def name_mover_stated(seeds, name_mover_head, name_arrives_at):
    return {"head": name_mover_head, "arrives": name_arrives_at}


# ---------------------------------------------------------------- stretch: direct_logit_attribution
def attribution_problem(seeds):
    """A model, a random cache (the attribution is defined for any residual stream and head outputs) and two tokens."""
    model, _, resid, z = patch_problem(seeds, 10101)
    token, other = torch.randperm(DIMS["vocab_size"], generator=seeds.generator(10104))[:2].tolist()
    return model, {"resid": resid * 2 + 0.3, "z": z}, token, other


@probe
def stretch_direct_logit_attribution(seeds, direct_logit_attribution):
    model, cache, token, other = attribution_problem(seeds)
    copies = {key: value.clone() for key, value in cache.items()}
    with torch.no_grad():
        return call(direct_logit_attribution, model, copies, token, other, name="direct_logit_attribution",
                    forbidden=ORACLE_SHORTCUTS, forbidden_advice=ADVICE)
