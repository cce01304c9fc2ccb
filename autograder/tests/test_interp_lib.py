"""courselib.interp (notebook 13's shipped GPT loader, attention-only model, training loop and name stories) and the
claims notebook 13 makes about what it measures, checked here at the notebook's own settings so that the suite fails
when one of them stops holding:
- the shipped weights loaded without transformers give GPT2LMHeadModel's logits, in 09's reference class and
  through the seam in the learner's own class;
- over three seeds, the attention-only model's second copy is at least 2 nats cheaper than the first, ablating its
  induction head gives back more than half of that drop, so does its previous-token head, and any other head at
  most 15% (the notebook's section 3);
- the GPT has no induction head (no prefix-matching score above 0.1, a repeated story's second copy no cheaper);
- in every name pair, head 2.1 restores the most of the name and the name reaches the last position at resid[3];
  the logit lens puts " Ben" on top from resid[3] (sections 4 and 5).
The hooks and scores used here are written in this file, independently of the notebook's answers.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from courselib import interp

pytestmark = pytest.mark.xdist_group("interp_lib")
torch.set_num_threads(1)   # small tensors: a second thread only waits on a shared machine

VOCAB, LENGTH, STEPS = 32, 6, 1500   # the notebook's settings (section 3)


# ------------------------------------------------------------------------------------------ helpers
def repeated(batch_size, length, vocab_size, generator):
    draws = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    return torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), draws, draws], dim=1)


@torch.no_grad()
def patterns(model, ids):
    """(L, B, h, T, T) from c_attn's output, by hooks."""
    seen = []
    handles = [block.self_attn.c_attn.register_forward_hook(lambda m, a, out: seen.append(out))
               for block in model.blocks]
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    result = []
    for block, qkv in zip(model.blocks, seen):
        B, T, three_d = qkv.shape
        h, d = block.self_attn.num_heads, three_d // 3
        q, k = (x.reshape(B, T, h, d // h).permute(0, 2, 1, 3) for x in qkv.split(d, -1)[:2])
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
        result.append(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1))
    return torch.stack(result)


@torch.no_grad()
def run(model, ids, silenced=None, patched=None):
    """Logits, with one head (layer, head) zeroed at c_proj's input, or replaced by `patched` = (layer, head, z)."""
    handle = None
    if silenced or patched:
        layer, head = (silenced or patched)[:2]
        attention = model.blocks[layer].self_attn
        size = attention.c_proj.in_features // attention.num_heads

        def change(module, args):
            x = args[0].clone()
            x[..., head * size:(head + 1) * size] = 0.0 if silenced else patched[2]
            return (x,)
        handle = attention.c_proj.register_forward_pre_hook(change)
    try:
        return model(ids)
    finally:
        if handle is not None:
            handle.remove()


def copies(model, ids, **kwargs):
    losses = F.cross_entropy(run(model, ids, **kwargs)[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(0)
    return losses[:LENGTH].mean().item(), losses[LENGTH + 1:].mean().item()


# ------------------------------------------------------------------------------------------ the loader
def test_the_shipped_weights_give_transformers_logits():
    from transformers import GPT2LMHeadModel
    model, tokenizer = interp.load_shipped_gpt()
    hf = GPT2LMHeadModel.from_pretrained(interp.MODEL_DIR).eval()
    ids = interp.encode(tokenizer, interp.name_story("Zoe", "Ben"))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    assert interp.encode(tokenizer, "Once")[0, 0].item() == 0, "<|endoftext|> is token 0"


def test_the_learners_class_loads_through_the_seam():
    from autograder.config import SOLUTIONS_DIR
    from courselib.seam import earlier
    GPT, _, _ = earlier("09_gpt", "GPT", "DecoderBlock", "CausalSelfAttention", root=SOLUTIONS_DIR, quiet=True)
    assert GPT.__module__ == "earlier_09_gpt", "09's reference answers should be found and agree"
    ours, _ = interp.load_shipped_gpt(GPT)
    reference, tokenizer = interp.load_shipped_gpt()
    ids = interp.encode(tokenizer, "Once upon a time, Zoe")
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), reference(ids))


def test_the_attention_only_model_has_09s_names_and_takes_a_start():
    model = interp.AttentionOnlyGPT(11, 8, 2, 2, 10, layer_norm=False).eval()
    assert {"blocks.0.self_attn.c_attn.weight", "blocks.1.self_attn.c_proj.bias", "lm_head.weight"} <= set(
        model.state_dict())
    ids = torch.randint(11, (2, 4))
    with torch.no_grad():
        shifted = model(ids, start=3)
        by_hand = model.token_embeddings(ids) + model.position_embeddings.table.weight[3:7]
        for block in model.blocks:
            by_hand = block(by_hand)
        torch.testing.assert_close(shifted, model.lm_head(by_hand))
    with pytest.raises(ValueError):
        model(ids, start=7)


def test_every_name_is_one_token_and_the_prompts_differ_in_the_friends_only():
    for clean, corrupted, right, wrong in interp.shipped_name_prompts():
        assert clean.shape == corrupted.shape and right != wrong
        assert (clean != corrupted).sum() == 2, "the friend is named twice"


# ------------------------------------------------------------------------------------------ section 3's claims
@pytest.fixture(scope="module")
def induction_runs():
    runs = []
    held_out = repeated(500, LENGTH, VOCAB, torch.Generator().manual_seed(1234))
    for seed in range(3):
        torch.manual_seed(seed)
        model = interp.AttentionOnlyGPT(VOCAB, d_model=64, num_layers=2, num_heads=2, max_positions=32,
                                        layer_norm=False)
        interp.train_induction(model, repeated, STEPS, lengths=(3, LENGTH), seed=seed)
        runs.append((model.eval(), held_out))
    return runs


def test_induction_forms_in_every_seed_and_needs_both_heads(induction_runs):
    for seed, (model, held_out) in enumerate(induction_runs):
        first, second = copies(model, held_out)
        assert first - second >= 2.0, f"seed {seed}: the second copy is only {first - second:.2f} nats cheaper"
        pattern = patterns(model, held_out)
        queries = torch.arange(LENGTH + 1, 2 * LENGTH + 1)
        prefix = pattern[..., queries, queries - LENGTH + 1].mean((1, -1))
        previous = pattern.diagonal(-1, -2, -1).mean((1, -1))
        induction, previous_token = (1, int(prefix[1].argmax())), (0, int(previous[0].argmax()))
        shares = {}
        for layer in range(2):
            for head in range(2):
                shares[(layer, head)] = (copies(model, held_out, silenced=(layer, head))[1] - second) / (first - second)
        assert shares[induction] > 0.5, f"seed {seed}: ablating the induction head gives back {shares[induction]:.2f}"
        assert shares[previous_token] > 0.5, (
            f"seed {seed}: ablating the previous-token head gives back {shares[previous_token]:.2f}")
        others = [share for key, share in shares.items() if key not in (induction, previous_token)]
        assert max(others) <= 0.15, f"seed {seed}: another head gives back {max(others):.2f}"


# ------------------------------------------------------------------------------------------ sections 4 and 5
@pytest.fixture(scope="module")
def shipped():
    return interp.load_shipped_gpt()


def test_the_gpt_has_no_induction_head(shipped):
    model, tokenizer = shipped
    from courselib.stories import corpus
    stories = [s for s in corpus(60, seed=3) if len(tokenizer.encode(s).ids) >= 40][:16]
    batch = torch.stack([interp.encode(tokenizer, s)[0, :40] for s in stories])
    repeated_story = torch.cat([batch[:, :1], batch[:, 1:31], batch[:, 1:31]], dim=1)
    with torch.no_grad():
        losses = F.cross_entropy(model(repeated_story)[:, :-1].transpose(1, 2), repeated_story[:, 1:],
                                 reduction="none").mean(0)
    assert losses[31:].mean() >= losses[:30].mean(), "a repeated story's second copy is cheaper"
    pattern = patterns(model, repeated_story)
    queries = torch.arange(31, 61)
    assert pattern[..., queries, queries - 29].mean((1, -1)).max() <= 0.1


def test_one_head_moves_the_name_in_every_pair(shipped):
    model, tokenizer = shipped
    for clean, corrupted, right, wrong in interp.shipped_name_prompts():
        def difference(logits):
            return (logits[0, -1, right] - logits[0, -1, wrong]).item()
        top, bottom = difference(run(model, clean)), difference(run(model, corrupted))
        merged = []
        handles = [block.self_attn.c_proj.register_forward_pre_hook(lambda m, a: merged.append(a[0]))
                   for block in model.blocks]
        run(model, clean)
        for handle in handles:
            handle.remove()
        size = merged[0].shape[-1] // 4
        shares = torch.tensor([[(difference(run(model, corrupted, patched=(layer, head, merged[layer][..., head * size:(
            head + 1) * size]))) - bottom) / (top - bottom) for head in range(4)] for layer in range(4)])
        assert divmod(int(shares.flatten().argmax()), 4) == (2, 1), shares
        arrived = []
        for layer in range(5):
            clean_streams = []
            hooks = [model.blocks[0].register_forward_pre_hook(lambda m, a: clean_streams.append(a[0]))]
            hooks += [block.register_forward_hook(lambda m, a, out: clean_streams.append(out)) for block in model.blocks]
            run(model, clean)
            for hook in hooks:
                hook.remove()

            def last_position(stream, layer=layer, clean_streams=clean_streams):
                stream = stream.clone()
                stream[:, -1] = clean_streams[layer][:, -1]
                return stream
            hook = (model.blocks[layer].register_forward_pre_hook(lambda m, a: (last_position(a[0]),)) if layer < 4
                    else model.blocks[-1].register_forward_hook(lambda m, a, out: last_position(out)))
            arrived.append((difference(run(model, corrupted)) - bottom) / (top - bottom) > 0.9)
            hook.remove()
        assert arrived == [False, False, False, True, True], arrived


def test_the_lens_puts_the_name_on_top_after_block_2(shipped):
    model, tokenizer = shipped
    clean, _, right, _ = interp.shipped_name_prompts()[0]
    streams = []
    handles = [model.blocks[0].register_forward_pre_hook(lambda m, a: streams.append(a[0]))]
    handles += [block.register_forward_hook(lambda m, a, out: streams.append(out)) for block in model.blocks]
    with torch.no_grad():
        model(clean)
        top = [int(model.lm_head(model.final_norm(stream[0, -1])).argmax()) for stream in streams]
    for handle in handles:
        handle.remove()
    assert [t == right for t in top] == [False, False, False, True, True], top
