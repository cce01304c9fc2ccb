"""courselib.rlhf, notebook 11's task and data: prompts cut from the course's stories at their turn, the
annotators' hidden taste in sync with the corpus's templates, episodes sampled from the GPT and masked
to the reply, preference pairs, the bag-of-words reward model, the frozen reference, and the reference
versions of the exercises against independent oracles (transformers' causal-LM loss, torch.distributions)."""
import collections
import math

import pytest
import torch
import torch.nn.functional as F

from courselib import gpt, rlhf


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.set_verbosity_error()
    return gpt.load_tiny_gpt()


@pytest.fixture(scope="module")
def tokenizer(shipped):
    return shipped[1]


def tiny_gpt(vocab_size=7, seed=0):
    """A small GPT of the course's class with weights large enough for peaked, distinct distributions."""
    generator = torch.Generator().manual_seed(seed)
    model = gpt.GPT(vocab_size, d_model=16, num_layers=1, num_heads=2, max_positions=40)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model.eval()


# ------------------------------------------------------------------------------------------ prompts
def test_prompts_are_the_story_tails_before_a_turn_and_their_true_continuations_are_proper_turns(tokenizer):
    prompts = rlhf.story_prompts(tokenizer, 300, seed=5)
    assert prompts.ids.shape == (300, rlhf.PROMPT_TOKENS) and prompts.ids.dtype == torch.long
    assert set(prompts.kinds) == set(rlhf.KINDS)
    assert min(collections.Counter(prompts.kinds).values()) > 50, "the three kinds of story come up about equally"
    for kind, ids, continuation in zip(prompts.kinds, prompts.ids, prompts.continuations):
        cue = rlhf.KINDS[kind][0]
        text = tokenizer.decode(ids)
        assert __import__("re").search(cue + "$", text), f"a {kind} prompt must end at its turn: {text!r}"
        # the corpus's own next sentence is always one of the two turns: the taste knows the templates
        assert rlhf.true_score(kind, continuation) in (rlhf.GOOD, rlhf.BAD), (kind, continuation)
        assert len(tokenizer(continuation).input_ids) < rlhf.MAX_NEW_TOKENS
    # the corpus's odds: baking and lost toys go well 70% of the time, sharing 60%
    good = collections.defaultdict(list)
    for kind, continuation in zip(prompts.kinds, prompts.continuations):
        good[kind].append(rlhf.true_score(kind, continuation) == rlhf.GOOD)
    for kind, expected in {"baking": 0.7, "lost toy": 0.7, "sharing": 0.6}.items():
        share = sum(good[kind]) / len(good[kind])
        assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / len(good[kind])), (kind, share)


def test_prompts_are_reproducible_and_differ_between_seeds(tokenizer):
    a, b = rlhf.story_prompts(tokenizer, 40, seed=1), rlhf.story_prompts(tokenizer, 40, seed=1)
    assert torch.equal(a.ids, b.ids) and a.kinds == b.kinds
    assert not torch.equal(a.ids, rlhf.story_prompts(tokenizer, 40, seed=2).ids)
    assert torch.equal(rlhf.story_prompts(tokenizer, 10, seed=1).ids, a.ids[:10]), "a prefix of a longer list"
    subset = a[torch.tensor([3, 0])]
    assert torch.equal(subset.ids, a.ids[[3, 0]]) and subset.kinds == [a.kinds[3], a.kinds[0]]


def test_true_score_of_turns_and_of_everything_else():
    assert rlhf.true_score("baking", " Then they put it in the oven and waited.") == rlhf.GOOD
    assert rlhf.true_score("baking", " But they forgot it in the oven, and it burned.") == rlhf.BAD
    assert rlhf.true_score("lost toy", ' Mia looked under the bed and said, "Here it is!"') == rlhf.GOOD
    assert rlhf.true_score("lost toy", " They looked in the toy box too, but the red truck was gone.") == rlhf.BAD
    assert rlhf.true_score("sharing", " They did not fight.") == rlhf.GOOD
    assert rlhf.true_score("sharing", " They pulled and pulled, and the kite broke.") == rlhf.BAD
    for kind, reply in [("lost toy", ' Mia looked and said, "Here it is!"'), ("baking", " They did not fight."),
                        ("sharing", " They did not fight. They"), ("baking", " Then Then Then Then"),
                        ("sharing", "They did not fight."), ("baking", "")]:
        assert rlhf.true_score(kind, reply) == rlhf.BROKEN, (kind, reply)


# ------------------------------------------------------------------------------------------ episodes
def test_response_mask_runs_from_the_prompt_to_the_first_end_token():
    end = torch.tensor([0, 9])
    ids = torch.tensor([[9, 1, 2, 9, 3, 9],     # a prompt ending in an end token; the reply ends at 3
                        [1, 1, 2, 3, 4, 5],     # never ends: the whole tail is the reply
                        [1, 1, 0, 0, 0, 0]])    # <|endoftext|> at once: a reply of one token
    mask = rlhf.response_mask(ids, 2, end)
    assert mask.tolist() == [[False, False, True, True, False, False],
                             [False, False, True, True, True, True],
                             [False, False, True, False, False, False]]


def test_sampled_episodes_start_with_the_prompt_stop_when_all_ended_and_pad_after_the_end():
    model = tiny_gpt()
    prompts = torch.randint(7, (50, 4), generator=torch.Generator().manual_seed(1))
    end = torch.tensor([0, 3])
    ids, mask = rlhf.sample_episodes(model, prompts, torch.Generator().manual_seed(2), end, max_new_tokens=12)
    assert torch.equal(ids[:, :4], prompts) and ids.shape == mask.shape and ids.shape[1] <= 4 + 12
    assert torch.equal(mask, rlhf.response_mask(ids, 4, end))
    lengths = mask.sum(dim=1)
    assert (lengths >= 1).all() and not mask[:, :4].any()
    ended = torch.isin(ids[torch.arange(50), 3 + lengths], end)
    assert (ended | (lengths == 12)).all(), "a reply runs to its first end token, or to max_new_tokens"
    after = ~mask & (torch.arange(ids.shape[1]) >= 4)
    assert (ids[after] == 0).all(), "after its end a reply is padded with <|endoftext|>"
    if ended.all():
        assert ids.shape[1] < 4 + 12 or lengths.max() == 12, "sampling stops once every reply has ended"
    again = rlhf.sample_episodes(model, prompts, torch.Generator().manual_seed(2), end, max_new_tokens=12)
    assert torch.equal(again[0], ids), "the same generator gives the same episodes"
    assert not model.training, "the model's mode is left as it was"


def test_sampled_first_tokens_follow_the_model():
    """The first reply token of 4,000 episodes, against the model's next-token distribution: counts within
    5 binomial standard deviations (a false failure about once in 3 million per token, with this fixed seed)."""
    model = tiny_gpt(vocab_size=5, seed=3)
    prompts = torch.tensor([[1, 2, 3]]).expand(4000, -1)
    ids, _ = rlhf.sample_episodes(model, prompts, torch.Generator().manual_seed(4), torch.tensor([0]), max_new_tokens=1)
    with torch.no_grad():
        probs = torch.softmax(model(prompts[:1])[0, -1], dim=-1)
    counts = torch.bincount(ids[:, 3], minlength=5).double()
    expected = 4000 * probs.double()
    assert ((counts - expected).abs() <= 5 * (expected * (1 - probs.double())).sqrt() + 1).all(), (counts, expected)


def test_padded_episodes_keep_their_masks():
    ids, mask = torch.tensor([[1, 2, 3]]), torch.tensor([[False, True, True]])
    padded_ids, padded_mask = rlhf.pad_episodes(ids, mask, 5)
    assert padded_ids.tolist() == [[1, 2, 3, 0, 0]] and padded_mask.tolist() == [[False, True, True, False, False]]


def test_the_shipped_gpt_writes_proper_turns_at_about_the_corpus_odds(shipped):
    """The task needs a policy that writes the turns: if a new checkpoint stops doing so, notebook 11 breaks."""
    model, tokenizer = shipped
    prompts = rlhf.story_prompts(tokenizer, 96, seed=3)
    ids, mask = rlhf.sample_episodes(model, prompts.ids, torch.Generator().manual_seed(0), rlhf.end_token_ids(tokenizer))
    scores = rlhf.true_scores(tokenizer, ids, mask, prompts.kinds)
    assert (scores == rlhf.BROKEN).float().mean() <= 0.05, rlhf.replies(tokenizer, ids, mask)
    assert 0.5 <= (scores == rlhf.GOOD).float().mean() <= 0.85


def test_preferences_drop_ties_and_mostly_follow_the_taste(shipped):
    model, tokenizer = shipped
    prompts = rlhf.story_prompts(tokenizer, 128, seed=4)
    pairs, answered = rlhf.collect_preferences(model, tokenizer, prompts, torch.Generator().manual_seed(0),
                                               rlhf.end_token_ids(tokenizer))
    assert 0 < len(pairs) == len(answered) < 128
    assert pairs.chosen.shape == pairs.rejected.shape == pairs.chosen_mask.shape == pairs.rejected_mask.shape
    assert torch.equal(pairs.chosen[:, :rlhf.PROMPT_TOKENS], answered.ids)
    assert torch.equal(pairs.rejected[:, :rlhf.PROMPT_TOKENS], answered.ids), "both replies answer the same prompt"
    chosen = rlhf.true_scores(tokenizer, pairs.chosen, pairs.chosen_mask, answered.kinds)
    rejected = rlhf.true_scores(tokenizer, pairs.rejected, pairs.rejected_mask, answered.kinds)
    assert (chosen != rejected).all(), "ties are dropped"
    assert (chosen > rejected).float().mean() > 0.9, "with noise 0.5 the annotators pick the better reply 98% of the time"
    assert len(pairs[:3]) == 3


# ------------------------------------------------------------------------------------------ models
def test_bag_of_words_reward_adds_the_masked_tokens_rewards():
    model = rlhf.BagOfWordsReward(4)
    with torch.no_grad():
        model.token_reward.copy_(torch.tensor([1.0, 2.0, -3.0, 10.0]))
    ids = torch.tensor([[3, 1, 1, 2], [3, 0, 2, 0]])
    mask = torch.tensor([[False, True, True, True], [False, True, False, False]])
    assert model(ids, mask).tolist() == [1.0, 1.0]


def test_frozen_copy_is_independent_in_eval_mode_and_without_gradients():
    model = tiny_gpt().train()
    frozen = rlhf.frozen_copy(model)
    assert not frozen.training and model.training
    assert not any(p.requires_grad for p in frozen.parameters()) and all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not torch.equal(next(model.parameters()), next(frozen.parameters()))
    assert frozen.lm_head.weight is frozen.token_embeddings.weight, "the tie survives the copy"


# ------------------------------------------------------------------------------ reference exercises
def test_reference_sequence_log_probs_is_transformers_causal_lm_convention():
    from transformers.loss.loss_utils import ForCausalLMLoss
    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(4, 9, 11, generator=g), torch.randint(11, (4, 9), generator=g)
    mask = torch.arange(9) >= torch.tensor([[2], [5], [8], [1]])
    expected = torch.stack([-ForCausalLMLoss(logits[b:b + 1], ids[b:b + 1].masked_fill(~mask[b:b + 1], -100), 11,
                                             num_items_in_batch=1) for b in range(4)])
    torch.testing.assert_close(rlhf.sequence_log_probs(logits, ids, mask), expected)
    all_tokens = torch.ones_like(mask)
    torch.testing.assert_close(rlhf.sequence_log_probs(logits, ids), rlhf.sequence_log_probs(logits, ids, all_tokens))
    torch.testing.assert_close(rlhf.sequence_log_probs(logits[:1], ids[:1]), -gpt.lm_loss(logits[:1], ids[:1]).reshape(1) * 8)


def test_reference_sequence_kl_sums_the_exact_kl_of_the_distributions_that_produce_the_reply():
    from torch.distributions import Categorical, kl_divergence
    g = torch.Generator().manual_seed(1)
    p, q = torch.randn(3, 6, 5, generator=g) * 2, torch.randn(3, 6, 5, generator=g) * 2
    mask = torch.arange(6) >= torch.tensor([[2], [4], [5]])
    per_position = kl_divergence(Categorical(logits=p[:, :-1]), Categorical(logits=q[:, :-1]))
    torch.testing.assert_close(rlhf.sequence_kl(p, q, mask), (per_position * mask[:, 1:]).sum(dim=1))
    # its expectation under the policy's samples is the expectation of the one-sample estimate log π - log π_ref
    assert torch.allclose(rlhf.sequence_kl(p, p + 1.0, mask), torch.zeros(3), atol=1e-6)


def test_kl_of_sampled_replies_matches_its_one_sample_estimate():
    """E_y~π[Σ_t KL_t] = E_y~π[log π(y) - log π_ref(y)]: both estimators of the sequence KL agree on average
    (4,000 replies from a tiny GPT; the means agree within 4 standard errors of their difference, fixed seed)."""
    policy, reference = tiny_gpt(seed=5), tiny_gpt(seed=6)
    prompts = torch.tensor([[1, 2]]).expand(4000, -1)
    end = torch.tensor([0])
    ids, mask = rlhf.sample_episodes(policy, prompts, torch.Generator().manual_seed(7), end, max_new_tokens=4)
    with torch.no_grad():
        exact = rlhf.sequence_kl(policy(ids), reference(ids), mask)
        estimate = rlhf.sequence_log_probs(policy(ids), ids, mask) - rlhf.sequence_log_probs(reference(ids), ids, mask)
    difference = estimate - exact
    assert abs(difference.mean()) < 4 * difference.std() / math.sqrt(len(difference)), (exact.mean(), estimate.mean())
    assert exact.var() < estimate.var(), "the exact per-token KL is the lower-variance estimator"


def test_pipeline_diagram_draws():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ax = rlhf.draw_pipeline()
    texts = [t.get_text() for t in ax.texts]
    assert {"Pre-training", "SFT", "Reward model", "RL (e.g. PPO)"} <= set(texts)
    assert any("DPO" in t for t in texts)
    plt.close(ax.figure)


def test_bradley_terry_gradient_of_the_bag_of_words():
    """The notebook's reward-model step on the shipped model's sizes: one SGD step of -log σ(r_w - r_l)."""
    model = rlhf.BagOfWordsReward(6)
    chosen, rejected = torch.tensor([[0, 1, 2]]), torch.tensor([[0, 3, 3]])
    mask = torch.tensor([[False, True, True]])
    loss = -F.logsigmoid(model(chosen, mask) - model(rejected, mask)).mean()
    loss.backward()
    assert model.token_reward.grad.tolist() == [0.0, -0.5, -0.5, 1.0, 0.0, 0.0]
