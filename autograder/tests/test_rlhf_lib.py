"""courselib.rlhf, notebook 11's task and data: prompts cut from the course's stories at their turn and wrapped
in the chat template, SFT demonstrations, the annotators' hidden taste in sync with the corpus's templates,
episodes sampled from the GPT and masked to the reply up to its <|endoftext|>, preference pairs, the
bag-of-words reward model (and the hidden reward-step problems built on it), the frozen reference, and the
reference versions of the exercises against independent oracles (transformers' causal-LM loss,
torch.distributions, loops)."""
import collections
import math

import pytest
import torch
import torch.nn.functional as F

from courselib import gpt, rlhf
from courselib import rlhf_reference as answers

# One worker runs the whole module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_rlhf_lib")


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.set_verbosity_error()
    return gpt.load_tiny_gpt()


@pytest.fixture(scope="module")
def tokenizer(shipped):
    return shipped[1]


@pytest.fixture(scope="module")
def sft_model(shipped):
    """The shipped GPT after the notebook's SFT run (30 steps of 32 demonstrations, Adam 1e-3): about 5 CPU seconds."""
    model, tokenizer = shipped
    prompts = rlhf.chat_prompts(tokenizer, 256, seed=4)
    ids, lengths = rlhf.demonstrations(tokenizer, prompts)
    tuned = rlhf.frozen_copy(model).train().requires_grad_(True)
    optimizer = torch.optim.Adam(tuned.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    reply = (torch.arange(ids.shape[1]) >= prompts.ids.shape[1]) & (
        torch.arange(ids.shape[1]) < prompts.ids.shape[1] + lengths[:, None])
    for _ in range(30):
        rows = torch.randint(len(ids), (32,), generator=generator)
        loss = -answers.sequence_log_probs(tuned(ids[rows]), ids[rows], reply[rows]).sum() / lengths[rows].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return tuned.eval()


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


def test_chat_prompts_wrap_the_story_tails_in_the_template(tokenizer):
    stories, chats = rlhf.story_prompts(tokenizer, 20, seed=3), rlhf.chat_prompts(tokenizer, 20, seed=3)
    user, assistant = tokenizer(rlhf.USER).input_ids, tokenizer(rlhf.ASSISTANT).input_ids
    assert chats.ids.shape == (20, len(user) + rlhf.PROMPT_TOKENS + len(assistant)) == (20, 28)
    assert torch.equal(chats.ids[:, len(user):len(user) + rlhf.PROMPT_TOKENS], stories.ids), "the story's own ids"
    assert chats.kinds == stories.kinds and chats.continuations == stories.continuations
    text = tokenizer.decode(chats.ids[0])
    assert text.startswith("User:") and text.endswith("\nAssistant:") and tokenizer.decode(stories.ids[0]) in text


def test_demonstrations_end_each_reply_with_its_end_token_and_pad_after_it(tokenizer):
    prompts = rlhf.chat_prompts(tokenizer, 40, seed=4)
    ids, lengths = rlhf.demonstrations(tokenizer, prompts)
    length = prompts.ids.shape[1]
    assert torch.equal(ids[:, :length], prompts.ids) and ids.shape[1] == length + lengths.max()
    for row, n, continuation in zip(ids, lengths.tolist(), prompts.continuations):
        assert row[length + n - 1] == rlhf.EOS_ID, "a reply ends with <|endoftext|>"
        assert (row[length + n:] == rlhf.EOS_ID).all(), "the padding after it is <|endoftext|> too"
        assert rlhf.EOS_ID not in row[length:length + n - 1].tolist()
        assert tokenizer.decode(row[length:length + n - 1]) == continuation
    assert tokenizer.eos_token_id == rlhf.EOS_ID == tokenizer.convert_tokens_to_ids("<|endoftext|>")


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


def test_true_scores_need_the_end_token_and_replies_show_a_reply_that_ran_on(tokenizer):
    prompt = rlhf.chat_prompts(tokenizer, 1, seed=3)
    kinds = prompt.kinds * 2
    good = {"baking": " Then they put it in the oven and waited.", "sharing": " They did not fight.",
            "lost toy": ' Mia looked under the bed and said, "Here it is!"'}[prompt.kinds[0]]
    reply = tokenizer(good).input_ids
    stops, runs_on = reply + [rlhf.EOS_ID, rlhf.EOS_ID], reply + tokenizer(" Then").input_ids + [rlhf.EOS_ID]
    width = max(len(stops), len(runs_on))
    ids = torch.cat([prompt.ids.expand(2, -1), torch.tensor([stops + [0] * (width - len(stops)),
                                                             runs_on + [0] * (width - len(runs_on))])], dim=1)
    mask = rlhf.response_mask(ids, prompt.ids.shape[1], torch.tensor([rlhf.EOS_ID]))
    assert rlhf.stopped(ids, mask).tolist() == [True, True]
    assert rlhf.true_scores(tokenizer, ids, mask, kinds).tolist() == [rlhf.GOOD, rlhf.BROKEN]
    assert rlhf.replies(tokenizer, ids, mask) == [good, good + " Then"]
    cut = mask.clone()
    cut[0, prompt.ids.shape[1] + len(reply):] = False          # the same words, but no end token: it never stopped
    assert rlhf.stopped(ids, cut).tolist() == [False, True]
    assert rlhf.true_scores(tokenizer, ids, cut, kinds)[0] == rlhf.BROKEN
    assert rlhf.replies(tokenizer, ids, cut)[0] == good + " …"


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


def test_sft_teaches_the_shipped_gpt_the_chat_format_at_about_the_corpus_odds(shipped, sft_model):
    """Notebook 11's story: the pre-trained GPT does not answer in the chat template, and a short SFT makes it write
    proper turns that stop. If a new checkpoint breaks either, notebook 11 breaks."""
    model, tokenizer = shipped
    prompts = rlhf.chat_prompts(tokenizer, 96, seed=3)
    for policy, broken in ((model, (0.9, 1.0)), (sft_model, (0.0, 0.05))):
        ids, mask = rlhf.sample_episodes(policy, prompts.ids, torch.Generator().manual_seed(0))
        scores = rlhf.true_scores(tokenizer, ids, mask, prompts.kinds)
        assert broken[0] <= (scores == rlhf.BROKEN).float().mean() <= broken[1], rlhf.replies(tokenizer, ids, mask)
    assert 0.5 <= (scores == rlhf.GOOD).float().mean() <= 0.85


def test_preferences_drop_ties_and_mostly_follow_the_taste(shipped, sft_model):
    _, tokenizer = shipped
    prompts = rlhf.chat_prompts(tokenizer, 128, seed=5)
    pairs, answered = rlhf.collect_preferences(sft_model, tokenizer, prompts, torch.Generator().manual_seed(0))
    length = prompts.ids.shape[1]
    assert 0 < len(pairs) == len(answered) < 128
    assert pairs.chosen.shape == pairs.rejected.shape == pairs.chosen_mask.shape == pairs.rejected_mask.shape
    assert torch.equal(pairs.chosen[:, :length], answered.ids)
    assert torch.equal(pairs.rejected[:, :length], answered.ids), "both replies answer the same prompt"
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


def test_the_hidden_reward_step_problems_have_no_tie_but_the_one_they_mean():
    """The hidden tests of reward_model_step count a pair as won when r_chosen > r_rejected. A reply that reorders
    its rival's tokens ties it exactly, and the course's float32 model sums the two in another order: its margin
    came out 7.6e-6 under key sweep-292, and a correct answer lost the test (1 key in 400). Only the tie the
    problem means (identical replies, and its mirror) may remain, and the float32 wins must be the float64 ones."""
    from autograder.checks import common
    from autograder.checks import rlhf as hidden
    for key in ["sweep-292", *(f"key-{n}" for n in range(300))]:
        seeds = common.Seeds(key)
        for (weights, (chosen, chosen_mask, rejected, rejected_mask), _), meant in (
                (hidden.reward_problem(seeds.generator(400)), [1]), (hidden._large_margin_problem(seeds), [1, 6])):
            difference = hidden.counts(chosen, chosen_mask) - hidden.counts(rejected, rejected_mask)
            ties = (difference == 0).all(dim=1).nonzero().flatten().tolist()
            assert ties == meant, f"{key}: pairs {ties} tie, where only {meant} should"
            model = rlhf.BagOfWordsReward(hidden.RM_VOCAB)
            with torch.no_grad():
                model.token_reward.copy_(weights)
            won = model(chosen, chosen_mask) - model(rejected, rejected_mask) > 0
            assert torch.equal(won, difference @ weights.double() > 0), f"{key}: float32 rounding decides a pair"


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
    torch.testing.assert_close(answers.sequence_log_probs(logits, ids, mask), expected)
    all_tokens = torch.ones_like(mask)
    torch.testing.assert_close(answers.sequence_log_probs(logits, ids), answers.sequence_log_probs(logits, ids, all_tokens))
    torch.testing.assert_close(answers.sequence_log_probs(logits[:1], ids[:1]), -gpt.lm_loss(logits[:1], ids[:1]).reshape(1) * 8)


def test_reference_sequence_kl_sums_the_exact_kl_of_the_distributions_that_produce_the_reply():
    from torch.distributions import Categorical, kl_divergence
    g = torch.Generator().manual_seed(1)
    p, q = torch.randn(3, 6, 5, generator=g) * 2, torch.randn(3, 6, 5, generator=g) * 2
    mask = torch.arange(6) >= torch.tensor([[2], [4], [5]])
    per_position = kl_divergence(Categorical(logits=p[:, :-1]), Categorical(logits=q[:, :-1]))
    torch.testing.assert_close(answers.sequence_kl(p, q, mask), (per_position * mask[:, 1:]).sum(dim=1))
    # its expectation under the policy's samples is the expectation of the one-sample estimate log π - log π_ref
    assert torch.allclose(answers.sequence_kl(p, p + 1.0, mask), torch.zeros(3), atol=1e-6)


def test_kl_of_sampled_replies_matches_its_one_sample_estimate():
    """E_y~π[Σ_t KL_t] = E_y~π[log π(y) - log π_ref(y)]: both estimators of the sequence KL agree on average
    (4,000 replies from a tiny GPT; the means agree within 4 standard errors of their difference, fixed seed)."""
    policy, reference = tiny_gpt(seed=5), tiny_gpt(seed=6)
    prompts = torch.tensor([[1, 2]]).expand(4000, -1)
    end = torch.tensor([0])
    ids, mask = rlhf.sample_episodes(policy, prompts, torch.Generator().manual_seed(7), end, max_new_tokens=4)
    with torch.no_grad():
        exact = answers.sequence_kl(policy(ids), reference(ids), mask)
        estimate = answers.sequence_log_probs(policy(ids), ids, mask) - answers.sequence_log_probs(reference(ids), ids, mask)
    difference = estimate - exact
    assert abs(difference.mean()) < 4 * difference.std() / math.sqrt(len(difference)), (exact.mean(), estimate.mean())
    assert exact.var() < estimate.var(), "the exact per-token KL is the lower-variance estimator"


def test_token_log_probs_are_sequence_log_probs_token_by_token():
    g = torch.Generator().manual_seed(2)
    logits, ids = torch.randn(3, 7, 9, generator=g), torch.randint(9, (3, 7), generator=g)
    mask = torch.arange(7) >= torch.tensor([[2], [3], [6]])
    per_token = rlhf.token_log_probs(logits, ids)
    assert per_token.shape == (3, 7) and (per_token[:, 0] == 0).all()
    torch.testing.assert_close((per_token * mask).sum(dim=1), answers.sequence_log_probs(logits, ids, mask))
    torch.testing.assert_close(per_token[1, 4], torch.log_softmax(logits[1, 3], dim=-1)[ids[1, 4]])


def test_reference_rloo_advantages_leave_each_reply_out_of_its_own_group():
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = torch.stack([rewards[i] - torch.cat([rewards[i // 4 * 4:i], rewards[i + 1:i // 4 * 4 + 4]]).mean()
                            for i in range(12)])
    torch.testing.assert_close(answers.rloo_advantages(rewards, 4), expected)
    # TRL's RLOOTrainer: (group sum - r) / (k - 1) as the baseline
    grouped = rewards.view(-1, 4)
    torch.testing.assert_close(answers.rloo_advantages(rewards, 4),
                               (grouped - (grouped.sum(1, keepdim=True) - grouped) / 3).view(-1))


def test_reference_ppo_clip_loss_is_the_pessimistic_surrogate_and_stops_where_clipped():
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5
    log_probs = (old + 0.4 * torch.randn(3, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.arange(5) >= torch.tensor([[1], [2], [4]])
    terms = []
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                ratio = math.exp(log_probs[b, t].item() - old[b, t].item())
                a = advantages[b].item()
                terms.append(min(ratio * a, min(max(ratio, 0.8), 1.2) * a))
    loss = answers.ppo_clip_loss(log_probs, old, advantages, mask, 0.2)
    assert math.isclose(loss.item(), -sum(terms) / len(terms), rel_tol=1e-12)
    loss.backward()
    ratio = (log_probs - old).exp().detach()
    clipped = ((ratio > 1.2) & (advantages[:, None] > 0)) | ((ratio < 0.8) & (advantages[:, None] < 0))
    assert (log_probs.grad[clipped | ~mask] == 0).all() and (log_probs.grad[~clipped & mask] != 0).all()


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


# ------------------------------------------------------------------------ what 11's grading kernel can reach
def test_notebook_11_its_probes_and_their_imports_never_load_the_reference_answers():
    """courselib.rlhf_reference holds the answers to 11's exercises: 11's cells (courselib.rlhf and the modules the
    notebook imports) and its probes (autograder.checks.rlhf) must never import it, so that 11's sandbox can hide it."""
    import json
    import pathlib
    import subprocess
    import sys
    code = ("import sys, courselib.rlhf, courselib.gpt, courselib.testing, courselib.training, autograder.checks.rlhf\n"
            "print('courselib.rlhf_reference' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", "importing 11's cells' and probes' modules loaded courselib.rlhf_reference"
    root = pathlib.Path(__file__).resolve().parents[2]
    notebook = json.loads((root / "solutions" / "11_rlhf" / "11_rlhf.ipynb").read_text())
    sources = "".join("".join(cell["source"]) for cell in notebook["cells"])
    assert "rlhf_reference" not in sources
    from autograder.checks import rlhf as hidden
    for name in ("sequence_log_probs", "sequence_kl", "rloo_advantages", "ppo_clip_loss"):
        assert not hasattr(rlhf, name), f"courselib.rlhf.{name} answers an exercise of 11: it belongs in rlhf_reference"
    assert all("courselib.rlhf_reference" in getattr(hidden, name) for name in dir(hidden)
               if name.endswith("_SHORTCUTS")), "every list of 11's checks names the hidden module (the grader reads them)"


def test_hidden_states_are_the_forward_pass_without_the_vocabulary_head():
    model = tiny_gpt(seed=8)
    ids = torch.randint(7, (3, 9), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(model.lm_head(rlhf.hidden_states(model, ids)), model(ids))


def test_reference_transformer_reward_reads_each_replys_last_token_like_transformers():
    """The reward of a reply is the head on transformers' GPT-2 last hidden state at its last token: padding after it,
    whatever its tokens, changes nothing."""
    from transformers import GPT2Config, GPT2ForSequenceClassification
    model = tiny_gpt(vocab_size=9, seed=10)
    torch.manual_seed(0)
    reward = answers.TransformerReward(model).eval()
    ids = torch.randint(1, 9, (4, 8), generator=torch.Generator().manual_seed(11))
    mask = torch.arange(8) >= 3
    mask = mask & (torch.arange(8) < torch.tensor([[8], [6], [4], [5]]))
    hf_lm = gpt.to_gpt2(model)
    config = GPT2Config(**{**hf_lm.config.to_dict(), "num_labels": 1, "pad_token_id": 0})
    classifier = GPT2ForSequenceClassification(config).eval()
    classifier.transformer.load_state_dict(hf_lm.transformer.state_dict())
    with torch.no_grad():
        classifier.score.weight.copy_(reward.head.weight)
        padded = ids.masked_fill(~mask & (torch.arange(8) >= 3), 0)     # transformers finds the last non-padding token
        torch.testing.assert_close(reward(ids, mask), classifier(padded).logits[:, 0], atol=1e-5, rtol=1e-5)
    assert all(p is not q for p, q in zip(reward.backbone.parameters(), model.parameters())), "a copy of the backbone"


def test_reference_best_of_n_keeps_each_prompts_favourite():
    ids, mask = torch.arange(12)[:, None].expand(12, 3), torch.ones(12, 3, dtype=torch.bool)
    rewards = torch.tensor([0.0, 2, 1, 5, 4, 3, 7, 9, 8, 6, 1, 2])
    kept, _ = answers.best_of_n(ids, mask, rewards, 3)
    assert kept[:, 0].tolist() == [1, 3, 7, 9]
    assert answers.best_of_n(ids, mask, rewards, 1)[0].equal(ids)


def test_reference_ppo_epochs_keeps_pi_old_and_stops_on_the_kl():
    policy = tiny_gpt(seed=12).train()
    ids = torch.randint(7, (6, 8), generator=torch.Generator().manual_seed(13))
    mask = (torch.arange(8) >= 3).expand(6, 8)
    advantages = torch.randn(6, generator=torch.Generator().manual_seed(14))
    olds = []

    def loss_fn(log_probs, old_log_probs):
        olds.append(old_log_probs)
        return answers.ppo_clip_loss(log_probs, old_log_probs, advantages, mask, 0.2)

    assert answers.ppo_epochs(policy, torch.optim.SGD(policy.parameters(), lr=0.5), ids, mask, loss_fn, 4,
                              float("inf")) == 4
    assert len(olds) == 4 and all(o is olds[0] for o in olds) and not olds[0].requires_grad
    assert answers.ppo_epochs(policy, torch.optim.SGD(policy.parameters(), lr=0.5), ids, mask, loss_fn, 4, 0.0) == 1


# -------------------------------------------------------------------------- the comparison over training seeds
SWEEP_SEEDS = (1, 4)     # the seeds under which the first settings of PPO (1) and of GRPO (4) broke their replies


@pytest.fixture(scope="module")
def sweep(shipped):
    """11's comparison in self-study settings (15 RL steps, 96 evaluation prompts), run with the course's reference
    answers under two training seeds: about 3 CPU minutes, the cost of proving the text's rankings."""
    setup = answers.build_setup(*shipped)
    return rlhf.Comparison(setup, answers.pieces()).sweep(SWEEP_SEEDS)


def test_every_comparison_the_text_makes_holds_under_other_training_seeds(sweep):
    """The claims of 11's section 11 (rlhf.sweep_claims, which the notebook checks over its five seeds): if a change
    to the settings, the data or the reference answers breaks a ranking under another seed, the text is wrong."""
    claims = rlhf.sweep_claims(sweep)
    assert claims, "the notebook states comparisons: sweep_claims must return them"
    broken = [claim for claim, holds in claims.items() if not holds]
    assert not broken, f"under training seeds {SWEEP_SEEDS}: " + "; ".join(broken) + "\n" + rlhf.sweep_table(sweep)
