"""Hidden checks for rlhf, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/rlhf.py, which also builds the
inputs both sides rebuild from the seeds.

The oracles are independent of the course's reference versions: transformers' `ForCausalLMLoss` for the
causal-LM convention and the SFT loss, `torch.distributions` for log-probabilities and the KL, and
float64 loops and autograd written here for the Bradley–Terry step, RLOO's baseline, REINFORCE, PPO's
clipped surrogate (and several epochs of it), GRPO's loss and DPO's."""
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions import Categorical
from torch.distributions import kl_divergence as torch_kl_divergence

from autograder.checks.common import expect_close, expect_shape, to_numpy
from autograder.checks.rlhf import (
    BANDIT_BETA,
    BEST_OF_N_CASES,
    PPO_LOOP_EPOCHS,
    PPO_LOOP_EPS,
    PPO_LOOP_LR,
    PPO_LOOP_TARGETS,
    best_of_n_problem,
    best_of_n_values,
    ppo_epochs_early_stop,
    ppo_epochs_update,
    ppo_loop_loss,
    ppo_loop_problem,
    transformer_reward_backbone,
    transformer_reward_problem,
    transformer_reward_values,
    EOS_ID,
    EPOCH_EPS,
    EPOCH_LR,
    EPOCHS,
    GRPO_ADVANTAGE_CASES,
    GRPO_EPS,
    GRPO_KL_BETAS,
    GRPO_VALUE_CASES,
    PPO_CASES,
    PPO_GRADIENT_EPS,
    RL_GROUP,
    RLOO_CASES,
    SFT_CASES,
    epochs_problem,
    grpo_kl_problem,
    grpo_loss_advantages,
    grpo_loss_kl,
    grpo_loss_values,
    grpo_problem,
    ppo_clip_loss_epochs,
    ppo_clip_loss_gradients,
    ppo_clip_loss_values,
    rloo_advantages_behaviour,
    rloo_advantages_values,
    rloo_behaviour_problem,
    rloo_problem,
    sft_loss_gradients,
    sft_loss_values,
    sft_problem,
    token_problem_for_ppo,
    BANDIT_TOLERANCE,
    BANDIT_VOCAB,
    DPO_BETAS,
    DPO_LARGE_BETA,
    KL_CASES,
    PENALTY_BETAS,
    RL_LR,
    RM_LR,
    SHAPE_CASES,
    TOKEN_CASES,
    VALUE_CASES,
    _confident_problem,
    _dpo_stable_problem,
    _kl_properties_problem,
    _large_margin_problem,
    bandit_problem,
    counts,
    dpo_loss_gradients,
    dpo_loss_is_stable,
    dpo_loss_values,
    dpo_problem,
    flat,
    flat_parameters,
    kl_problem,
    reinforce_problem,
    reinforce_step_finds_the_optimum,
    reinforce_step_penalized_reward,
    reinforce_step_update,
    reward_model_accuracy,
    reward_model_step_is_stable,
    reward_model_step_update,
    reward_problem,
    sequence_kl_properties,
    sequence_kl_values,
    sequence_log_probs_shapes,
    sequence_log_probs_stable_and_differentiable,
    sequence_log_probs_values,
    sequence_problem,
    stretch_token_returns_behaviour,
    stretch_token_returns_values,
    synthetic_comparisons,
    token_problem,
)


EARLIER = ("(This test gives your function the course's sequence_log_probs and rloo_advantages, so only this exercise "
           "is graded.)")


MISALIGNED = ("your log-probs are misaligned by one position: you scored input_ids[:, t] with logits[:, t], but in a "
              "causal LM (as in every Hugging Face model) the logits at position t predict the NEXT token, "
              "input_ids[:, t + 1]. Compare logits[:, :-1] with input_ids[:, 1:] and mask[:, 1:].")


# ================================================================ exercise 1: sequence_log_probs
def oracle_log_probs(logits, ids, mask=None):
    """Σ_t mask[:, t] log p(ids[:, t]) with p = softmax(logits[:, t - 1]), from torch.distributions (float64).
    Keeps the autograd graph of `logits` (the judges differentiate it)."""
    per_token = Categorical(logits=logits[:, :-1].double()).log_prob(ids[:, 1:])          # (B, T - 1)
    if mask is not None:
        per_token = torch.where(mask[:, 1:], per_token, torch.zeros_like(per_token))
    return per_token.sum(dim=-1)


def hf_log_probs(logits, ids, mask):
    """The same from transformers' causal-LM loss (which shifts the labels itself): -loss summed per row."""
    from transformers.loss.loss_utils import ForCausalLMLoss
    labels = ids.masked_fill(~mask, -100)
    return torch.stack([-ForCausalLMLoss(logits[b:b + 1], labels[b:b + 1], vocab_size=logits.shape[-1],
                                         num_items_in_batch=1) for b in range(len(ids))]).double()


def sequence_diagnoses(logits, ids, mask=None):
    """What buggy versions of sequence_log_probs return, keyed by the misconception."""
    if mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:, 0] = False
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    m = mask.double()
    no_shift = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)                         # logits[t] scores ids[t]
    shifted = log_probs[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)           # the right pairs
    wrong_way = log_probs[:, 1:].gather(-1, ids[:, :-1].unsqueeze(-1)).squeeze(-1)         # logits[t + 1] scores ids[t]
    raw = logits.double()[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    counted = m[:, 1:]
    return {
        MISALIGNED: (no_shift * m).sum(-1),
        "you shifted the logits and the tokens but not the mask: the mask belongs to input_ids, so the tokens you "
        "score, input_ids[:, 1:], are counted by mask[:, 1:].": (shifted * m[:, :-1]).sum(-1),
        "you shifted the wrong way: logits[:, t] predicts input_ids[:, t + 1], so drop the LAST position of the "
        "logits and the FIRST token: logits[:, :-1] against input_ids[:, 1:].": (wrong_way * m[:, 1:]).sum(-1),
        "your log-probs are misaligned by one the other way (logits[:, t + 1] scoring input_ids[:, t]); the logits at "
        "t score the token at t + 1.": (wrong_way * m[:, :-1]).sum(-1),
        "you summed over every position, prompt and padding included: only the tokens where mask is True count.":
            shifted.sum(-1),
        "you used the mask the wrong way round: True means 'this token counts'.": (shifted * (1 - counted)).sum(-1),
        "you summed probabilities, not log-probabilities: use log_softmax.": (shifted.exp() * counted).sum(-1),
        "you summed the raw logits: normalise them with log_softmax first.": (raw * counted).sum(-1),
        "you averaged over the positions; a sequence's log-probability is their sum (the chain rule).":
            (shifted * counted).sum(-1) / counted.sum(-1).clamp(min=1),
    }


@sequence_log_probs_shapes.judge
def judge_sequence_log_probs_shapes(seeds, results):
    for ((batch, prompt, reply, vocab), masked), result in zip(SHAPE_CASES, results):
        expect_shape(result, (batch,), f"sequence_log_probs of ({batch}, {prompt + reply}, {vocab}) logits"
                     + ("" if masked else " with mask=None"),
                     "One log-probability per sequence: sum over the positions and keep the batch dimension.")


@sequence_log_probs_values.judge
def judge_sequence_log_probs_values(seeds, data):
    for i, (case, result) in enumerate(zip(VALUE_CASES, data["masked"])):
        logits, ids, mask = sequence_problem(seeds.generator(200 + i), *case)
        batch, prompt, reply, vocab = case
        expect_close(result, hf_log_probs(logits, ids, mask),
                     f"sequence_log_probs of a ({batch}, {prompt + reply}, {vocab}) batch (a prompt of {prompt}, then "
                     "replies), against transformers' causal-LM loss", rtol=1e-4, atol=1e-4,
                     hint="logits[:, t] scores input_ids[:, t + 1]: log_softmax(logits[:, :-1]), pick input_ids[:, 1:], "
                          "sum where mask[:, 1:] is True.",
                     diagnoses=sequence_diagnoses(logits, ids, mask))
    logits, ids, _ = sequence_problem(seeds.generator(210), 3, 2, 5, 6)
    expect_close(data["unmasked"], oracle_log_probs(logits, ids), "sequence_log_probs with mask=None",
                 "Without a mask every predicted token counts: positions 1..T-1 (nothing predicts token 0).",
                 diagnoses=sequence_diagnoses(logits, ids))


@sequence_log_probs_stable_and_differentiable.judge
def judge_sequence_log_probs_stable_and_differentiable(seeds, data):
    logits, ids, mask = _confident_problem(seeds)
    if not np.all(np.isfinite(to_numpy(data["confident"], "sequence_log_probs"))):
        raise AssertionError("sequence_log_probs returned -inf or NaN for confident logits: the probability of an "
                             "unlikely token rounds to 0 in float32, and log(0) = -inf. Use torch.log_softmax, which "
                             "computes logits - logsumexp(logits) without forming the tiny probability.")
    expect_close(data["confident"], oracle_log_probs(logits, ids, mask), "sequence_log_probs for confident logits",
                 rtol=1e-5, atol=1e-2, diagnoses=sequence_diagnoses(logits, ids, mask))
    # d/dlogits[b, t] of Σ_t m[b, t+1] log softmax(logits[b, t])[ids[b, t+1]] is m (onehot - softmax); the last
    # position predicts nothing, so its gradient is 0.
    logits, ids, mask = sequence_problem(seeds.generator(310), 3, 2, 4, 7)
    weights = torch.randn(3, generator=seeds.generator(311)).double()
    per_position = F.one_hot(ids[:, 1:], 7).double() - torch.softmax(logits[:, :-1].double(), dim=-1)
    expected = torch.zeros(3, 6, 7, dtype=torch.float64)
    expected[:, :-1] = per_position * mask[:, 1:, None] * weights[:, None, None]
    no_shift = (F.one_hot(ids, 7).double() - torch.softmax(logits.double(), dim=-1)) * mask[..., None] * weights[:, None, None]
    expect_close(data["gradient"], expected, "the gradient of sequence_log_probs with respect to the logits",
                 "Only the logits that score a counted token get a gradient; the last position predicts nothing.",
                 diagnoses={MISALIGNED: no_shift,
                            "positions outside the mask received a gradient: masked tokens must add nothing.":
                                torch.cat([per_position * weights[:, None, None], torch.zeros(3, 1, 7)], dim=1)})


# ================================================================ exercise 2: sft_loss
def reply_positions(ids, prompt_length, lengths):
    """(B, T) bool: the reply of each row, positions prompt_length to prompt_length + length - 1."""
    positions = torch.arange(ids.shape[1])
    return (positions >= prompt_length) & (positions < prompt_length + lengths[:, None])


def hf_sft_loss(logits, ids, prompt_length, lengths):
    """transformers' causal-LM loss (it shifts the labels itself) with -100 outside the replies: float32, as
    transformers computes it."""
    from transformers.loss.loss_utils import ForCausalLMLoss
    labels = ids.masked_fill(~reply_positions(ids, prompt_length, lengths), -100)
    return ForCausalLMLoss(logits.float(), labels, vocab_size=logits.shape[-1])


SFT_MISTAKES = {
    "prompt": "you counted the prompt's tokens too: only the reply is learned (a model trained on the prompt learns to "
              "write users' messages). Count positions prompt_length to prompt_length + reply_length - 1.",
    "padding": "you counted the padding after each reply's <|endoftext|>: the reply ends at its length, and the "
               "padding must not count. Build the mask from the lengths.",
    "end": "you dropped the <|endoftext|> that ends each reply (a mask built from the token ids cannot tell it from the "
           "padding, which is the same token): the model must learn to stop. Build the mask from the lengths.",
    "unshifted": "your log-probs are misaligned by one position: the logits at position t score the NEXT token, "
                 "input_ids[:, t + 1]. Compare logits[:, :-1] with input_ids[:, 1:] and the mask's [:, 1:].",
    "mask not shifted": "you shifted the logits and the tokens but not the mask: the tokens you score, "
                        "input_ids[:, 1:], are counted by mask[:, 1:].",
    "one too many": "each reply runs one token too far: a reply of n tokens occupies positions prompt_length to "
                    "prompt_length + n - 1 (its last token is the <|endoftext|>).",
    "per reply": "you averaged each reply's tokens first, then the replies: every reply token weighs the same, so divide "
                 "the batch's sum by its number of reply tokens.",
    "sum": "you summed the cross-entropy over the tokens: take the mean over the reply tokens of the batch.",
    "per sequence sum": "you averaged the replies' summed losses: take the mean over the reply tokens of the batch.",
}


def sft_variant(logits, ids, prompt_length, lengths, variant="right"):
    """The SFT loss by hand in float64 (with the graph of `logits`), or what a common mistake computes instead."""
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    positions = torch.arange(ids.shape[1])
    reply = reply_positions(ids, prompt_length, lengths)
    counted = {"right": reply, "per reply": reply, "sum": reply, "per sequence sum": reply, "unshifted": reply,
               "mask not shifted": reply,
               "prompt": (positions >= 1) & (positions < prompt_length + lengths[:, None]),
               "padding": (positions >= prompt_length).expand_as(reply),
               "end": reply & (ids != EOS_ID),
               "one too many": (positions >= prompt_length) & (positions <= prompt_length + lengths[:, None])}[variant]
    if variant == "unshifted":
        picked, weight = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1), counted.double()
    else:
        picked = log_probs[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)              # scores token t + 1
        weight = (counted[:, :-1] if variant == "mask not shifted" else counted[:, 1:]).double()
    total = -(picked * weight)
    if variant == "per reply":
        return (total.sum(-1) / weight.sum(-1).clamp(min=1)).mean()
    if variant == "sum":
        return total.sum()
    if variant == "per sequence sum":
        return total.sum(-1).mean()
    return total.sum() / weight.sum()


@sft_loss_values.judge
def judge_sft_loss_values(seeds, results):
    for i, (case, result) in enumerate(zip(SFT_CASES, results)):
        logits, ids, prompt_length, lengths = sft_problem(seeds.generator(350 + i), *case)
        batch, _, longest, vocab = case
        expect_close(result, hf_sft_loss(logits, ids, prompt_length, lengths),
                     f"sft_loss of {batch} demonstrations (a prompt of {prompt_length}, replies of 1 to {longest} tokens "
                     f"and padding; {vocab} tokens), against transformers' causal-LM loss with -100 outside the replies",
                     rtol=1e-5, atol=1e-6,
                     hint="the mean over the reply tokens (each reply's <|endoftext|> included, the padding and the "
                          "prompt excluded) of -log softmax(logits[:, t - 1])[input_ids[:, t]].",
                     diagnoses={message: sft_variant(logits, ids, prompt_length, lengths, variant)
                                for variant, message in SFT_MISTAKES.items()})


def sft_gradient(logits, ids, prompt_length, lengths, variant="right"):
    leaf = logits.double().requires_grad_(True)
    return torch.autograd.grad(sft_variant(leaf, ids, prompt_length, lengths, variant), leaf)[0]


@sft_loss_gradients.judge
def judge_sft_loss_gradients(seeds, gradient):
    logits, ids, prompt_length, lengths = sft_problem(seeds.generator(360), 4, 2, 4, 9)
    right = sft_gradient(logits, ids, prompt_length, lengths)
    expect_close(gradient, right, "the gradient of sft_loss with respect to the logits", rtol=1e-4, atol=1e-7,
                 hint="(softmax - one-hot of the next token) / (number of reply tokens) at each position that scores a "
                      "reply token; 0 at the prompt's positions, at the padding's and at the last one.",
                 diagnoses={message: sft_gradient(logits, ids, prompt_length, lengths, variant)
                            for variant, message in SFT_MISTAKES.items()})


# ================================================================ exercise 5: rloo_advantages
RLOO_MISTAKES = {
    "group mean": "you left each reply in its own group's mean: then the baseline depends on the reply, and every "
                  "advantage shrinks by (k - 1) / k. Subtract the mean of the OTHER k - 1 replies to the same prompt.",
    "batch others": "you took the mean of the other rewards over the whole batch: the baseline compares a reply with the "
                    "other replies to the SAME prompt (groups of group_size consecutive rows).",
    "batch mean": "you subtracted the batch mean: compare each reply with the other replies to its own prompt, without "
                  "itself.",
    "strided": "your groups are strided (rows i, i + n, i + 2n, ...): the replies to one prompt are CONSECUTIVE rows, "
               "rewards.reshape(-1, group_size).",
    "divided by k": "you divided the others' sum by group_size: there are group_size - 1 others.",
    "none": "there is no baseline: subtract the mean of the other replies to the same prompt.",
    "baseline only": "you returned the baselines; the advantage is the reward minus its baseline.",
}


def oracle_rloo(rewards, group_size, variant="right"):
    """RLOO advantages with a loop over the replies, float64; the keyword gives what common mistakes compute."""
    rewards = rewards.double()
    batch, prompts = len(rewards), len(rewards) // group_size
    advantages = torch.zeros(batch, dtype=torch.float64)
    for i in range(batch):
        if variant in ("batch others", "batch mean"):
            group = list(range(batch))
        elif variant == "strided":
            group = [j for j in range(batch) if j % prompts == i % prompts]
        else:
            group = list(range(i // group_size * group_size, (i // group_size + 1) * group_size))
        others = [rewards[j] for j in group if j != i]
        if variant in ("group mean", "batch mean"):
            baseline = sum(rewards[j] for j in group) / len(group)
        elif variant == "divided by k":
            baseline = sum(others) / group_size
        elif variant == "none":
            baseline = 0.0
        else:
            baseline = sum(others) / len(others)
        advantages[i] = baseline if variant == "baseline only" else rewards[i] - baseline
    return advantages


@rloo_advantages_values.judge
def judge_rloo_advantages_values(seeds, results):
    for i, ((prompts, group_size), result) in enumerate(zip(RLOO_CASES, results)):
        rewards = rloo_problem(seeds.generator(580 + i), prompts, group_size)
        expect_close(result, oracle_rloo(rewards, group_size),
                     f"rloo_advantages of {prompts} prompts × {group_size} replies", rtol=1e-6, atol=1e-8,
                     hint="A_i = R_i - (sum of the other replies' rewards in i's group) / (group_size - 1), the group "
                          "of row i being rows group_size · (i // group_size) onwards.",
                     diagnoses={message: oracle_rloo(rewards, group_size, variant)
                                for variant, message in RLOO_MISTAKES.items()})


@rloo_advantages_behaviour.judge
def judge_rloo_advantages_behaviour(seeds, data):
    rewards, shifts, equal = rloo_behaviour_problem(seeds)
    expect_close(data["shifted"], data["plain"], "rloo_advantages after adding one constant to all the rewards of a "
                 "prompt", rtol=1e-6, atol=1e-8,
                 hint="the baseline is made of the same prompt's other rewards, so whatever all the replies to a prompt "
                      "share cancels.",
                 diagnoses={RLOO_MISTAKES["batch others"]: oracle_rloo(rewards + shifts, 4, "batch others")})
    expect_close(data["equal"], torch.zeros(6), "rloo_advantages of replies that all score the same", atol=1e-9,
                 hint="every reply equals its baseline: no advantage.")
    expect_close(data["one group"], oracle_rloo(rewards, len(rewards)), "rloo_advantages with group_size = B",
                 rtol=1e-6, atol=1e-8, hint="one group of the whole batch: each reply against the rest of the batch.",
                 diagnoses={message: oracle_rloo(rewards, len(rewards), variant)
                            for variant, message in RLOO_MISTAKES.items()})


def reward_step_oracle(weights, batch, junk):
    """Bradley–Terry by hand in float64: margins, loss, accuracy, and the weights after one SGD step, with
    what common mistakes would have produced instead."""
    chosen, chosen_mask, rejected, rejected_mask = batch
    difference = counts(chosen, chosen_mask) - counts(rejected, rejected_mask)          # (N, V)
    w = weights.double()
    margin = difference @ w
    gradient = -(torch.sigmoid(-margin)[:, None] * difference).mean(dim=0)              # d/dw of mean -log σ(m)
    step = {
        "right": w - RM_LR * gradient,
        "the gradients were not zeroed first: the optimizer already held gradients (from another batch), and "
        "backward() ADDS to them. Call optimizer.zero_grad() before loss.backward().":
            w - RM_LR * (gradient + junk.double()),
        "the sign is reversed: -log σ(r_rejected - r_chosen) trains the model to prefer the REJECTED replies. "
        "The loss is -log σ(r_chosen - r_rejected).": w - RM_LR * (torch.sigmoid(margin)[:, None] * difference).mean(0),
        "you summed the loss over the pairs: take the mean, so that the step size doesn't grow with the batch.":
            w - RM_LR * len(margin) * gradient,
        "the loss is missing its log: the Bradley–Terry loss is -log σ(r_chosen - r_rejected), not -σ(...).":
            w + RM_LR * (torch.sigmoid(margin) * torch.sigmoid(-margin))[:, None].mul(difference).mean(0),
        "the weights did not change: call optimizer.step() after loss.backward().": w,
    }
    return margin, F.softplus(-margin).mean(), (margin > 0).double().mean(), step


def _judge_reward_step(data, weights, batch, junk, what):
    margin, loss, accuracy, step = reward_step_oracle(weights, batch, junk)
    new_margin = (counts(batch[0], batch[1]) - counts(batch[2], batch[3])) @ step["right"]
    expect_close(data["loss"], loss, f"the loss reward_model_step returned ({what})", rtol=1e-4, atol=1e-4,
                 hint="-log σ(r_chosen - r_rejected), averaged over the pairs, measured before the update.",
                 diagnoses={"you returned the loss after the update: measure it on the batch before the step.":
                            F.softplus(-new_margin).mean(),
                            "the sign is reversed: the loss must be small when the CHOSEN reply has the higher reward, "
                            "-log σ(r_chosen - r_rejected).": F.softplus(margin).mean(),
                            "you returned the summed loss: take the mean over the pairs.": F.softplus(-margin).sum()})
    expect_close(data["accuracy"], accuracy, f"the accuracy reward_model_step returned ({what})", atol=1e-6,
                 hint="the share of pairs in which the chosen reply gets the strictly higher reward, before the update.",
                 diagnoses={"a tie is not a win: count the pairs with r_chosen > r_rejected, strictly (one pair here has "
                            "two identical replies).": (margin >= 0).double().mean(),
                            "you measured the accuracy after the update: measure it on the batch before the step.":
                                (new_margin > 0).double().mean()})
    right = step.pop("right")
    expect_close(data["weights"], right, f"the reward model's weights after reward_model_step ({what})",
                 rtol=1e-4, atol=1e-4, diagnoses=step,
                 hint="zero_grad, the Bradley–Terry loss of this batch, backward, step: one SGD step of -log σ(r_w - r_l).")


@reward_model_step_update.judge
def judge_reward_model_step_update(seeds, data):
    _judge_reward_step(data, *reward_problem(seeds.generator(400)), "12 pairs")


@reward_model_step_is_stable.judge
def judge_reward_model_step_is_stable(seeds, data):
    if not np.isfinite(data["loss"]) or not np.all(np.isfinite(to_numpy(data["weights"], "weights"))):
        raise AssertionError("reward_model_step gives inf or NaN when the reward margins are in the hundreds: σ(-300) "
                             "rounds to 0 in float32 and log(0) = -inf. Use F.logsigmoid(x) (or -F.softplus(-x)), "
                             "which never forms σ(x).")
    _judge_reward_step(data, *_large_margin_problem(seeds), "margins in the hundreds")


# A reward model trained with the student's step on hidden comparisons: replies are bags of RM_VOCAB
# tokens, the annotators' taste is a hidden linear score of the bag, and they choose with Bradley–Terry
# noise. Over 300 seeds a correct step came within 0.032 (worst case, mean 0.010) of the accuracy of the
# hidden taste itself on 2,000 held-out pairs; the test allows 0.06, and a sign error scores below 0.5.
ACCURACY_GAP = 0.06


@reward_model_accuracy.judge
def judge_reward_model_accuracy(seeds, weights):
    taste, _, (chosen, chosen_mask, rejected, rejected_mask) = synthetic_comparisons(seeds.generator(420))
    difference = counts(chosen, chosen_mask) - counts(rejected, rejected_mask)
    learned = (difference @ torch.as_tensor(to_numpy(weights, "the reward model's weights")) > 0).double().mean().item()
    best = (difference @ taste.double() > 0).double().mean().item()
    if learned < 0.5:
        raise AssertionError(f"a reward model trained with your reward_model_step on hidden comparisons prefers the "
                             f"REJECTED reply on {1 - learned:.0%} of held-out pairs: the loss pushes the rewards the "
                             "wrong way (a sign error), or the step goes uphill.")
    if learned < best - ACCURACY_GAP:
        raise AssertionError(f"a reward model trained with your reward_model_step on hidden comparisons agrees with "
                             f"the annotators on {learned:.1%} of held-out pairs; their own taste reaches {best:.1%}, "
                             f"and a correct step comes within {ACCURACY_GAP:.0%} of it. Is it one step of "
                             "-log σ(r_chosen - r_rejected) on the whole batch, after zero_grad?")


# ================================================================ exercise 3: sequence_kl
def oracle_kl(policy_logits, reference_logits, mask):
    per_position = torch_kl_divergence(Categorical(logits=policy_logits[:, :-1].double()),
                                       Categorical(logits=reference_logits[:, :-1].double()))     # (B, T - 1)
    return (per_position * mask[:, 1:]).sum(dim=-1)


def kl_diagnoses(policy_logits, reference_logits, mask):
    lp, lq = torch.log_softmax(policy_logits.double(), -1), torch.log_softmax(reference_logits.double(), -1)
    p, q = lp.exp(), lq.exp()
    m = mask.double()

    def summed(per_position, shift=True):
        return (per_position[:, :-1] * m[:, 1:]).sum(-1) if shift else (per_position * m).sum(-1)

    forward = (p * (lp - lq)).sum(-1)                                                                  # (B, T)
    return {
        "you computed KL(π_ref || π), the other direction: the KL is not symmetric. RLHF's penalty averages "
        "log π - log π_ref under the POLICY, π: Σ_v π_v (log π_v - log π_ref_v).": summed((q * (lq - lp)).sum(-1)),
        "your KL is misaligned by one position: the distribution at logits[:, t] produces the NEXT token, "
        "input_ids[:, t + 1] (the causal-LM convention), so it counts where mask[:, t + 1] is True: use "
        "logits[:, :-1] with mask[:, 1:].": summed(forward, shift=False),
        "you shifted the logits but not the mask: the distribution at logits[:, t] produces input_ids[:, t + 1], so "
        "it counts where mask[:, t + 1] is True: use mask[:, 1:] with logits[:, :-1].":
            (forward[:, :-1] * m[:, :-1]).sum(-1),
        "you summed over every position: only the positions that produce a reply token count.": forward[:, :-1].sum(-1),
        "you used softmax where log_softmax belongs: Σ p (p - q) is not the KL.": summed((p * (p - q)).sum(-1)),
        "you used raw logits as log-probabilities: normalise them with log_softmax first.":
            summed((p * (policy_logits.double() - reference_logits.double())).sum(-1)),
        "you averaged over the vocabulary; the KL sums over it.": summed((p * (lp - lq)).mean(-1)),
        "you forgot to weight by π: KL = Σ_v π_v (log π_v - log π_ref_v).": summed((lp - lq).sum(-1)),
        "you computed the cross-entropy -Σ π log π_ref; the KL also subtracts π's entropy.": summed(-(p * lq).sum(-1)),
    }


@sequence_kl_values.judge
def judge_sequence_kl_values(seeds, results):
    for i, (case, result) in enumerate(zip(KL_CASES, results)):
        policy_logits, reference_logits, mask = kl_problem(seeds.generator(500 + i), *case)
        batch, prompt, reply, vocab = case
        expect_shape(result, (batch,), f"sequence_kl of ({batch}, {prompt + reply}, {vocab}) logits",
                     "One KL per sequence: sum over the vocabulary, then over the counted positions.")
        expect_close(result, oracle_kl(policy_logits, reference_logits, mask),
                     f"sequence_kl of a ({batch}, {prompt + reply}, {vocab}) batch",
                     "Σ over the positions t < T-1 with mask[:, t + 1] of Σ_v π_v (log π_v - log π_ref_v), with "
                     "log π = log_softmax(policy_logits[:, t]).",
                     diagnoses=kl_diagnoses(policy_logits, reference_logits, mask))


@sequence_kl_properties.judge
def judge_sequence_kl_properties(seeds, data):
    policy_logits, reference_logits, mask, shift, sharp = _kl_properties_problem(seeds)
    expect_close(data["same"], torch.zeros(6), "sequence_kl of a policy with itself",
                 "A distribution is at KL 0 from itself.")
    expect_close(data["shifted"], oracle_kl(policy_logits, reference_logits, mask),
                 "sequence_kl after adding a constant to each position's reference logits",
                 "Adding a constant to every logit doesn't change the softmax: normalise with log_softmax.",
                 diagnoses=kl_diagnoses(policy_logits, reference_logits + shift, mask))
    result = to_numpy(data["sharp"], "sequence_kl")
    if not np.all(np.isfinite(result)):
        raise AssertionError("sequence_kl is inf or NaN for confident logits: softmax rounds small probabilities to 0 "
                             "in float32, log(0) = -inf and 0 · -inf is NaN. Compute log π and log π_ref with "
                             "log_softmax, and π as log_π.exp().")
    expect_close(result, oracle_kl(*sharp), "sequence_kl for confident logits", rtol=1e-4, atol=1e-2,
                 diagnoses=kl_diagnoses(*sharp))


def oracle_reinforce_gradient(policy, reference, ids, mask, rewards, beta, baseline="right",
                              detach=True, direction=1.0, scale=1.0):
    """The gradient the REINFORCE surrogate -mean((R - b) log π(y)) gives, R = r - β (log π(y) - log π_ref(y)),
    b RLOO's baseline over groups of RL_GROUP rows. The keyword arguments give what common mistakes compute
    instead (`baseline` names a variant of oracle_rloo)."""
    log_probs = oracle_log_probs(policy(ids), ids, mask)                                   # (B,) with a graph
    with torch.no_grad():
        reference_log_probs = oracle_log_probs(reference(ids), ids, mask)
    log_ratio = (log_probs if not detach else log_probs.detach()) - reference_log_probs
    penalized = rewards - beta * direction * log_ratio
    advantages = oracle_rloo(penalized, RL_GROUP, baseline)        # keeps the graph of R when it has one (detach=False)
    loss = -(advantages * log_probs).mean() * scale
    return flat(torch.autograd.grad(loss, list(policy.parameters()), allow_unused=True, materialize_grads=True))


def reinforce_penalized_oracle(policy, reference, ids, mask, rewards):
    with torch.no_grad():
        log_ratio = oracle_log_probs(policy(ids), ids, mask) - oracle_log_probs(reference(ids), ids, mask)
    return log_ratio


@reinforce_step_penalized_reward.judge
def judge_reinforce_step_penalized_reward(seeds, results):
    for i, (beta, data) in enumerate(zip(PENALTY_BETAS, results)):
        policy, reference, ids, mask, rewards, _ = reinforce_problem(seeds.generator(600 + i))
        log_ratio = reinforce_penalized_oracle(policy, reference, ids, mask, rewards)
        expect_close(data["log_ratio"], log_ratio, f"reinforce_step's log_ratio (β = {beta})",
                     "log π(y) - log π_ref(y) of each sampled reply: the policy's sequence log-prob minus the "
                     "reference's, both from sequence_log_probs with the reply mask. " + EARLIER,
                     diagnoses={"log_ratio has the wrong direction: it is log π(y) - log π_ref(y), the policy's minus "
                                "the reference's (the one-sample estimate of KL(π || π_ref)).": -log_ratio})
        r = rewards
        expect_close(data["penalized"], r - beta * log_ratio, f"reinforce_step's penalised rewards (β = {beta})",
                     "R = reward - β (log π(y) - log π_ref(y)).",
                     diagnoses={
                         "the KL penalty has the wrong direction or sign: a reply that is likelier under the policy "
                         "than under the reference must PAY, R = reward - β (log π - log π_ref).": r + beta * log_ratio,
                         "β multiplies the reward instead of the KL term: R = reward - β (log π - log π_ref).":
                             beta * r - log_ratio,
                         "β is missing: R = reward - β (log π - log π_ref).": r - log_ratio,
                         "you divided by β; the penalty is β times the log-ratio.": r - log_ratio / beta,
                         "you returned the advantage (R minus the baseline), not the penalised reward R itself.":
                             oracle_rloo(r - beta * log_ratio, RL_GROUP),
                     })


@reinforce_step_update.judge
def judge_reinforce_step_update(seeds, data):
    policy, reference, ids, mask, rewards, junk = reinforce_problem(seeds.generator(610))
    before = flat_parameters(policy)
    step = (before - torch.as_tensor(to_numpy(data["after"], "the policy's weights"))) / RL_LR   # the gradient used
    args = (policy, reference, ids, mask, rewards, 0.7)
    right = oracle_reinforce_gradient(*args)
    diagnoses = {
        "your baseline includes the sample's own reward (the group mean): then b depends on y_i, and every step "
        "shrinks by (k - 1) / k. Use the mean of the OTHER replies to the same prompt.":
            oracle_reinforce_gradient(*args, baseline="group mean"),
        "your baseline is the mean of the other samples of the whole batch: RLOO compares each reply with the other "
        "replies to the SAME prompt, the groups of group_size consecutive rows (rloo_advantages(penalized, group_size)).":
            oracle_reinforce_gradient(*args, baseline="batch others"),
        "your baseline is the batch mean: RLOO compares each reply with the other replies to the same prompt.":
            oracle_reinforce_gradient(*args, baseline="batch mean"),
        "there is no baseline: subtract the leave-one-out mean of the other samples' penalised rewards from R.":
            oracle_reinforce_gradient(*args, baseline="none"),
        "the policy did not change: either every advantage R - b is 0 (a baseline equal to each sample's own "
        "reward; it must not depend on the sample it is subtracted from), or optimizer.step() was never called.":
            torch.zeros_like(right),
        "the gradient flowed through the penalised reward: R weighs the log-prob and must be a constant (compute "
        "it from detached log-probs, or under torch.no_grad()).": oracle_reinforce_gradient(*args, detach=False),
        "the gradients were not zeroed first: the optimizer already held gradients, and backward() ADDS to them. "
        "Call optimizer.zero_grad() before loss.backward().": right + flat(junk),
        "the update goes the wrong way: minimise -mean(advantage · log π(y)) (REINFORCE ascends the reward).": -right,
        "you summed over the batch: take the mean of advantage · log π(y).":
            oracle_reinforce_gradient(*args, scale=len(rewards)),
        "the KL penalty has the wrong direction or sign: R = reward - β (log π - log π_ref).":
            oracle_reinforce_gradient(*args, direction=-1.0),
    }
    scale = right.abs().max().item()
    expect_close(step, right, "the policy's update by reinforce_step (one SGD step)", rtol=1e-4, atol=1e-5 * scale,
                 hint="zero_grad; R = reward - β (log π - log π_ref) as a constant; advantage = R minus the mean of the "
                      "other replies to the same prompt (rloo_advantages); loss = -mean(advantage · log π(y)); backward; "
                      "step. " + EARLIER,
                 diagnoses=diagnoses)
    if data["reference_grads"] or data["reference_moved"]:
        raise AssertionError("reinforce_step gave the reference policy gradients"
                             + (" and changed its weights" if data["reference_moved"] else "")
                             + f" ({', '.join(data['reference_grads'][:3])}...): the reference is frozen. Compute its "
                               "log-probs under torch.no_grad().")


@reinforce_step_finds_the_optimum.judge
def judge_reinforce_step_finds_the_optimum(seeds, averaged):
    reference_logits, rewards = bandit_problem(seeds)
    optimum = torch.softmax(reference_logits[0] + rewards / BANDIT_BETA, dim=-1)
    reached = torch.as_tensor(to_numpy(averaged, "the policy's probabilities"))
    distance = 0.5 * (reached - optimum).abs().sum().item()
    if not math.isfinite(distance) or distance > BANDIT_TOLERANCE:
        greedy = torch.zeros(BANDIT_VOCAB, dtype=torch.float64)
        greedy[rewards.argmax()] = 1
        hint = ("it drifted towards the single best reply, as with no KL penalty at all: is β (log π - log π_ref) "
                "subtracted from the reward?" if 0.5 * (reached - greedy).abs().sum() < distance else
                "check the update with the tests above.")
        raise AssertionError(
            f"on a one-token problem, 300 steps of your reinforce_step (β = {BANDIT_BETA}) ended at probabilities "
            f"{np.round(reached.numpy(), 3).tolist()}, {distance:.3f} (total variation) from the optimum of the "
            f"KL-penalised objective, π* ∝ π_ref e^(r/β) = {np.round(optimum.numpy(), 3).tolist()}; a correct step "
            f"comes within {BANDIT_TOLERANCE}: {hint}")


# ================================================================ exercise 7: ppo_clip_loss
PPO_MISTAKES = {
    "inverted": "your ratio is upside down: ρ = π_θ / π_old = exp(log_probs - old_log_probs), the policy being trained "
                "over the one that sampled.",
    "max": "you took the maximum of the two surrogates: PPO keeps the MINIMUM, the pessimistic one, so that moving past "
           "the clip range gains nothing.",
    "no clip": "nothing was clipped: the surrogate is min(ρ A, clip(ρ, 1 - ε, 1 + ε) A).",
    "clipped only": "you kept only the clipped surrogate: take the minimum of the clipped and the unclipped one (a token "
                    "that moved the wrong way must still be pulled back).",
    "clip advantage": "you clipped the advantage: clip the probability RATIO to [1 - ε, 1 + ε] and multiply by A.",
    "min of ratios": "you took the minimum of the two RATIOS before multiplying by A: with a negative advantage the "
                     "smaller product comes from the larger ratio. Take the minimum of the two products.",
    "unmasked": "you averaged over every position: only the reply tokens (mask True) count.",
    "per reply": "you averaged each reply's tokens first, then the replies: the loss is the mean over all the reply tokens "
                 "of the batch.",
    "sum": "you summed over the tokens: take the mean over the reply tokens of the batch.",
    "objective": "you returned the objective; the loss to minimise is its negative.",
}


def oracle_ppo(log_probs, old, advantages, mask, eps, variant="right"):
    """PPO's clipped loss by hand in float64, a loop over the tokens (keeps the graph of log_probs); the keyword
    gives what a common mistake computes instead."""
    batch, length = mask.shape
    per_token = [[None] * length for _ in range(batch)]
    for b in range(batch):
        a = advantages[b].double()
        for t in range(length):
            log_ratio = log_probs[b, t].double() - old[b, t].double()
            ratio = torch.exp(-log_ratio if variant == "inverted" else log_ratio)
            clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
            if variant == "max":
                value = torch.maximum(ratio * a, clipped * a)
            elif variant == "no clip":
                value = ratio * a
            elif variant == "clipped only":
                value = clipped * a
            elif variant == "clip advantage":
                value = torch.minimum(ratio * a, ratio * torch.clamp(a, 1 - eps, 1 + eps))
            elif variant == "min of ratios":
                value = torch.minimum(ratio, clipped) * a
            else:
                value = torch.minimum(ratio * a, clipped * a)
            per_token[b][t] = value
    values = torch.stack([torch.stack(row) for row in per_token])                            # (B, T)
    counted = mask.double()
    if variant == "unmasked":
        return -values.mean()
    if variant == "per reply":
        return -((values * counted).sum(-1) / counted.sum(-1)).mean()
    if variant == "sum":
        return -(values * counted).sum()
    return (values * counted).sum() / counted.sum() * (1 if variant == "objective" else -1)


@ppo_clip_loss_values.judge
def judge_ppo_clip_loss_values(seeds, results):
    for i, ((batch, prompt_length, reply_length, eps), result) in enumerate(zip(PPO_CASES, results)):
        problem = token_problem_for_ppo(seeds.generator(630 + i), batch, prompt_length, reply_length)
        expect_close(result, oracle_ppo(*problem, eps), f"ppo_clip_loss of {batch} replies with ε = {eps}",
                     rtol=1e-5, atol=1e-7,
                     hint="-mean over the reply tokens of min(ρ A, clip(ρ, 1 - ε, 1 + ε) A), ρ = exp(log_probs - "
                          "old_log_probs), A the reply's advantage.",
                     diagnoses={message: oracle_ppo(*problem, eps, variant) for variant, message in PPO_MISTAKES.items()})


def ppo_gradient(log_probs, old, advantages, mask, eps, variant="right"):
    leaf = log_probs.double().clone().requires_grad_(True)
    return torch.autograd.grad(oracle_ppo(leaf, old, advantages, mask, eps, variant), leaf)[0]


@ppo_clip_loss_gradients.judge
def judge_ppo_clip_loss_gradients(seeds, gradient):
    problem = token_problem_for_ppo(seeds.generator(640), 6, 2, 5)
    right = ppo_gradient(*problem, PPO_GRADIENT_EPS)
    expect_close(gradient, right, "the gradient of ppo_clip_loss with respect to log_probs", rtol=1e-5,
                 atol=1e-7 * right.abs().max().item(),
                 hint="-ρ A / N on a token where the unclipped term is the smaller (or ρ is inside the range), 0 where "
                      "the clip holds (ρ > 1 + ε with A > 0, ρ < 1 - ε with A < 0) and outside the reply.",
                 diagnoses=lambda: {message: ppo_gradient(*problem, PPO_GRADIENT_EPS, variant)
                                    for variant, message in PPO_MISTAKES.items()})


def ppo_epochs_replay(seeds, variant="right"):
    """EPOCHS steps of SGD on one batch of the one-token policy, with the oracle's loss (or a mistake's)."""
    table, ids, advantages, mask = epochs_problem(seeds)
    table = table.clone()
    actions = ids[:, 1]

    def log_probs_of(weights):                                       # (B, 2): 0 at the prompt, log π(action) after it
        picked = torch.log_softmax(weights[0], dim=-1)[actions]
        return torch.stack([torch.zeros_like(picked), picked], dim=1)

    old = log_probs_of(table).detach()
    losses = []
    for _ in range(EPOCHS):
        leaf = table.clone().requires_grad_(True)
        loss = oracle_ppo(log_probs_of(leaf), old, advantages, mask, EPOCH_EPS, variant)
        (gradient,) = torch.autograd.grad(loss, leaf)
        table = table - EPOCH_LR * gradient
        losses.append(loss.detach())
    return table, torch.stack(losses)


@ppo_clip_loss_epochs.judge
def judge_ppo_clip_loss_epochs(seeds, data):
    table, losses = ppo_epochs_replay(seeds)
    mistakes = functools.cache(lambda: {message: ppo_epochs_replay(seeds, variant)
                                        for variant, message in PPO_MISTAKES.items()})
    expect_close(data["losses"], losses, f"ppo_clip_loss at each of {EPOCHS} epochs of SGD on one batch", rtol=1e-5,
                 atol=1e-7, hint="the first epoch has ρ = 1 everywhere; later ones see the ratio move, and the clip hold it.",
                 diagnoses=lambda: {message: wrong[1] for message, wrong in mistakes().items()})
    expect_close(data["table"], table, f"the policy's logits after {EPOCHS} epochs of SGD on one batch with your loss",
                 rtol=1e-5, atol=1e-7, diagnoses=lambda: {message: wrong[0] for message, wrong in mistakes().items()})


# ================================================================ exercise 8: grpo_loss
GRPO_MISTAKES = {
    "batch std": "you divided by the std of the whole batch: GRPO normalises each reply within its own group, "
                 "(r - the group's mean) / (the group's std + 1e-4).",
    "batch mean": "you subtracted the batch mean: GRPO subtracts the mean of the reply's own group.",
    "leave one out": "you left the reply out of its group's mean (RLOO's baseline): GRPO's group mean includes the reply "
                     "itself.",
    "population std": "you used the population std (dividing by k): the exercise, like TRL, uses torch's default std, "
                      "with k - 1.",
    "no std": "you did not divide by the group's standard deviation: A = (r - group mean) / (group std + 1e-4).",
    "eps outside": "the 1e-4 goes next to the std, (std + 1e-4), not inside a square root or elsewhere.",
    "kl in reward k1": "you put the KL in the reward (r - β k1 before normalising): GRPO adds β times the mean k3 to the "
                       "LOSS, with its gradient.",
    "kl in reward k3": "you put the KL in the reward (r - β k3 before normalising): GRPO adds β times the mean k3 to the "
                       "LOSS, with its gradient.",
    "k1": "you used k1 = log π - log π_ref per token; GRPO's KL is k3 = r - 1 - log r with r = π_ref / π, never "
          "negative.",
    "kl sign": "the KL term has the wrong sign: the loss ADDS β · KL (the objective subtracts it).",
    "reversed k3": "your r is upside down: r = π_ref / π_θ, log r = ref_log_probs - log_probs.",
    "no kl": "the loss has no KL term: add β times the mean of k3 over the reply tokens.",
    "kl sum": "you added β times the SUM of k3; take its mean over the reply tokens, as for the clipped loss.",
    "per reply": "you averaged each reply's tokens first, then the replies (the GRPO paper's form); the exercise averages "
                 "over all the reply tokens of the batch.",
    "no clip": "nothing was clipped: the surrogate is min(ρ A, clip(ρ, 1 - ε, 1 + ε) A), as in ppo_clip_loss.",
}


def oracle_grpo_advantages(rewards, group_size, variant="right"):
    """Group-normalised advantages by hand (float64 loops): (r - group mean) / (group std with k - 1, + 1e-4)."""
    rewards = rewards.double()
    batch = len(rewards)
    advantages = torch.zeros(batch, dtype=torch.float64)
    everything = [float(r) for r in rewards]
    overall_mean = sum(everything) / batch
    overall_std = math.sqrt(sum((r - overall_mean) ** 2 for r in everything) / (batch - 1))
    for i in range(batch):
        group = [float(rewards[j]) for j in range(i // group_size * group_size, (i // group_size + 1) * group_size)]
        mean = sum(group) / group_size
        squares = sum((r - mean) ** 2 for r in group)
        std = math.sqrt(squares / (group_size - 1))
        centre = {"leave one out": (sum(group) - float(rewards[i])) / (group_size - 1),
                  "batch mean": overall_mean}.get(variant, mean)
        scale = {"batch std": overall_std + 1e-4, "population std": math.sqrt(squares / group_size) + 1e-4,
                 "no std": 1.0, "eps outside": math.sqrt(squares / (group_size - 1) + 1e-4)}.get(variant, std + 1e-4)
        advantages[i] = (float(rewards[i]) - centre) / scale
    return advantages


def oracle_grpo(log_probs, old, reference, rewards, mask, group_size, eps, beta, variant="right"):
    """GRPO's loss by hand in float64, and its gradient on log_probs; the keyword gives a common mistake."""
    leaf = log_probs.double().clone().requires_grad_(True)
    counted = mask.double()
    if variant.startswith("kl in reward"):
        log_r = (reference - log_probs).double()
        estimate = -log_r if variant.endswith("k1") else torch.exp(log_r) - 1 - log_r
        rewards = rewards.double() - beta * (estimate * counted).sum(dim=1)
    advantages = oracle_grpo_advantages(rewards, group_size, variant)
    surrogate = oracle_ppo(leaf, old, advantages, mask, eps, "no clip" if variant == "no clip" else "right")
    if variant == "per reply":
        surrogate = oracle_ppo(leaf, old, advantages, mask, eps, "per reply")
    log_r = reference.double() - leaf
    per_token = {"k1": -log_r, "reversed k3": torch.exp(-log_r) - 1 + log_r}.get(variant, torch.exp(log_r) - 1 - log_r)
    if variant == "per reply":
        kl = ((per_token * counted).sum(-1) / counted.sum(-1)).mean()
    elif variant == "kl sum":
        kl = (per_token * counted).sum()
    else:
        kl = (per_token * counted).sum() / counted.sum()
    sign = {"kl sign": -1.0, "no kl": 0.0}.get(variant, 0.0 if variant.startswith("kl in reward") else 1.0)
    loss = surrogate + sign * beta * kl
    (gradient,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), gradient


def _judge_grpo(data, problem, group_size, eps, beta, what, compare=("loss", "gradient")):
    right_loss, right_gradient = oracle_grpo(*problem, group_size, eps, beta)
    mistakes = functools.cache(lambda: {message: oracle_grpo(*problem, group_size, eps, beta, variant)
                                        for variant, message in GRPO_MISTAKES.items()})
    if "loss" in compare:
        expect_close(data["loss"], right_loss, f"grpo_loss ({what})", rtol=1e-5, atol=1e-7,
                     hint="ppo_clip_loss with A = (r - group mean) / (group std + 1e-4), plus β times the mean over the "
                          "reply tokens of r - 1 - log r, r = π_ref / π_θ.",
                     diagnoses=lambda: {message: wrong[0] for message, wrong in mistakes().items()})
    expect_close(data["gradient"], right_gradient, f"the gradient of grpo_loss on log_probs ({what})", rtol=1e-5,
                 atol=1e-7 * right_gradient.abs().max().item(),
                 hint="the clipped surrogate's gradient with the group-normalised advantages, plus β (1 - r) / N per "
                      "reply token from the KL term.",
                 diagnoses=lambda: {message: wrong[1] for message, wrong in mistakes().items()})


@grpo_loss_advantages.judge
def judge_grpo_loss_advantages(seeds, gradients):
    for i, ((prompts, group_size), gradient) in enumerate(zip(GRPO_ADVANTAGE_CASES, gradients)):
        _, old, reference, rewards, mask = grpo_problem(seeds.generator(660 + i), prompts, group_size)
        _judge_grpo({"gradient": gradient}, (old, old, reference, rewards, mask), group_size, GRPO_EPS, 0.0,
                    f"{prompts} prompts × {group_size} replies, β = 0 and ratios 1: the gradient on a reply token is "
                    "-A / N", compare=("gradient",))


@grpo_loss_kl.judge
def judge_grpo_loss_kl(seeds, results):
    for i, (beta, data) in enumerate(zip(GRPO_KL_BETAS, results)):
        log_probs, reference, rewards, mask = grpo_kl_problem(seeds, i)
        _judge_grpo(data, (log_probs, log_probs, reference, rewards, mask), 3, GRPO_EPS, beta,
                    f"equal rewards in every group, so every advantage is 0; β = {beta}")


@grpo_loss_values.judge
def judge_grpo_loss_values(seeds, results):
    for i, ((prompts, group_size, eps, beta), data) in enumerate(zip(GRPO_VALUE_CASES, results)):
        problem = grpo_problem(seeds.generator(680 + i), prompts, group_size)
        _judge_grpo(data, problem, group_size, eps, beta, f"{prompts} prompts × {group_size} replies, ε = {eps}, β = {beta}")


def oracle_dpo(policy, reference, batch, beta, variant="right"):
    """The DPO loss by hand in float64 and its gradient, or what a common mistake computes instead."""
    chosen, chosen_mask, rejected, rejected_mask = batch
    pc, pr = oracle_log_probs(policy(chosen), chosen, chosen_mask), oracle_log_probs(policy(rejected), rejected, rejected_mask)
    with torch.no_grad():
        rc = oracle_log_probs(reference(chosen), chosen, chosen_mask)
        rr = oracle_log_probs(reference(rejected), rejected, rejected_mask)
    margin = (pc - rc) - (pr - rr)
    loss = {"right": lambda: -F.logsigmoid(beta * margin).mean(),
            "swapped": lambda: -F.logsigmoid(beta * ((rc - pc) - (rr - pr))).mean(),
            "outside": lambda: -beta * F.logsigmoid(margin).mean(),
            "policy only": lambda: -F.logsigmoid(beta * (pc - pr) - (rc - rr)).mean(),
            "no reference": lambda: -F.logsigmoid(beta * (pc - pr)).mean(),
            "sum": lambda: -F.logsigmoid(beta * margin).sum(),
            "likelihood": lambda: F.logsigmoid(beta * margin).mean()}[variant]()
    gradient = flat(torch.autograd.grad(loss, list(policy.parameters()), allow_unused=True, materialize_grads=True))
    return loss.detach(), beta * (pc - rc).detach(), beta * (pr - rr).detach(), gradient


DPO_MISTAKES = {
    "swapped": "you swapped the policy's and the reference's log-ratios (or chosen and rejected): the loss must FALL as "
               "the policy raises the chosen reply above the reference, -log σ(β [(log π(y_w) - log π_ref(y_w)) - "
               "(log π(y_l) - log π_ref(y_l))]).",
    "outside": "β is outside the log-sigmoid: the loss is -log σ(β · margin), not -β log σ(margin).",
    "policy only": "β multiplies only the policy's log-probs; it multiplies both log-ratios, reference included.",
    "no reference": "the reference model is missing: each implicit reward is β log(π / π_ref), not β log π.",
    "sum": "you summed over the pairs; take the mean.",
    "likelihood": "you returned log σ(...), the log-likelihood; the loss is its negative.",
}


@dpo_loss_values.judge
def judge_dpo_loss_values(seeds, results):
    for i, (beta, data) in enumerate(zip(DPO_BETAS, results)):
        policy, reference, batch = dpo_problem(seeds.generator(700 + i))
        loss, chosen_rewards, rejected_rewards, _ = oracle_dpo(policy, reference, batch, beta)
        expect_close(data["chosen_rewards"], chosen_rewards, f"dpo_loss's chosen_rewards (β = {beta})",
                     "The implicit reward of each chosen reply, β (log π(y_w) - log π_ref(y_w)), without gradient. "
                     + EARLIER, diagnoses={"the implicit reward is β (log π - log π_ref), the policy's minus the "
                                           "reference's.": -chosen_rewards})
        expect_close(data["rejected_rewards"], rejected_rewards, f"dpo_loss's rejected_rewards (β = {beta})",
                     "β (log π(y_l) - log π_ref(y_l)) for each rejected reply.")
        expect_close(data["loss"], loss, f"dpo_loss (β = {beta})",
                     "-log σ(chosen_rewards - rejected_rewards), averaged over the pairs.",
                     diagnoses=lambda: {message: oracle_dpo(policy, reference, batch, beta, variant)[0]
                                        for variant, message in DPO_MISTAKES.items()})


@dpo_loss_gradients.judge
def judge_dpo_loss_gradients(seeds, data):
    policy, reference, batch = dpo_problem(seeds.generator(710))
    right = oracle_dpo(policy, reference, batch, 0.8)[3]
    expect_close(data["gradient"], right, "the gradient of dpo_loss with respect to the policy's weights",
                 rtol=1e-4, atol=1e-5 * right.abs().max().item(),
                 hint="Only the policy's log-probs carry gradients; the reference's are constants. " + EARLIER,
                 diagnoses={message: oracle_dpo(policy, reference, batch, 0.8, variant)[3]
                            for variant, message in DPO_MISTAKES.items()})
    if data["reference_grads"]:
        raise AssertionError(f"dpo_loss gave the reference policy gradients ({', '.join(data['reference_grads'][:3])}"
                             "...): the reference is frozen. Compute its log-probs under torch.no_grad().")


@dpo_loss_is_stable.judge
def judge_dpo_loss_is_stable(seeds, data):
    policy, reference, batch = _dpo_stable_problem(seeds)
    loss, chosen_rewards, rejected_rewards, gradient = oracle_dpo(policy, reference, batch, DPO_LARGE_BETA)
    largest = (chosen_rewards - rejected_rewards).abs().max().item()
    if not np.isfinite(to_numpy(data["loss"], "dpo_loss")).all():
        raise AssertionError(f"dpo_loss is inf or NaN for margins as large as ±{largest:.0f}: σ of a large negative "
                             "number rounds to 0 and log(0) = -inf. Use F.logsigmoid (or -F.softplus(-x)).")
    expect_close(data["loss"], loss, f"dpo_loss for margins up to ±{largest:.0f}", rtol=1e-6, atol=1e-6)
    expect_close(data["gradient"], gradient, f"the gradient of dpo_loss for margins up to ±{largest:.0f}",
                 rtol=1e-4, atol=1e-6 * gradient.abs().max().item(),
                 hint="log(sigmoid(x)) has a zero or NaN gradient for large |x|; F.logsigmoid does not.")


def oracle_token_returns(log_ratios, mask, scores, beta, gamma, place="last", direction="backward", masked=True):
    """G_t = Σ_{s ≥ t} γ^(s - t) r_s on the reply, r_s = -β log_ratio_s (+ the score at the reply's last token),
    written as a loop over positions; the keywords give common mistakes."""
    batch, length = mask.shape
    rewards = -beta * log_ratios.double() * mask
    positions = torch.arange(length).expand(batch, length)
    last = torch.where(mask, positions, -1).amax(dim=1)
    first = torch.where(mask, positions, length).amin(dim=1)
    at = last if place == "last" else first
    rewards[torch.arange(batch), at] += scores.double()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(batch, dtype=torch.float64)
    order = range(length - 1, -1, -1) if direction == "backward" else range(length)
    for t in order:
        running = rewards[:, t] + gamma * running * (mask[:, t] if masked else 1)
        returns[:, t] = running
    return returns * mask if masked else returns


@stretch_token_returns_values.judge
def judge_stretch_token_returns_values(seeds, results):
    for i, ((beta, gamma), result) in enumerate(zip(TOKEN_CASES, results)):
        log_ratios, mask, scores = token_problem(seeds.generator(800 + i))
        args = (log_ratios, mask, scores, beta, gamma)
        expect_shape(result, tuple(mask.shape), "token_returns", "One return per token position: (B, T).")
        expect_close(result, oracle_token_returns(*args), f"token_returns with β = {beta}, γ = {gamma}",
                     "r_t = -β log_ratio_t on the reply, plus the score at its LAST token; G_t = r_t + γ G_{t+1} "
                     "from the end backwards; 0 outside the reply.",
                     diagnoses={"the score was paid at the reply's first token; the reward model judges the whole "
                                "reply, so it is paid at the LAST one.": oracle_token_returns(*args, place="first"),
                                "you accumulated from the start forwards; a return sums what comes AFTER t: "
                                "G_t = r_t + γ G_{t+1}, computed from the end backwards.":
                                    oracle_token_returns(*args, direction="forward"),
                                "positions outside the reply have returns: multiply by the mask.":
                                    oracle_token_returns(*args, masked=False)})


@stretch_token_returns_behaviour.judge
def judge_stretch_token_returns_behaviour(seeds, result):
    log_ratios, mask, scores = token_problem(seeds.generator(810), batch=6)
    result = torch.as_tensor(to_numpy(result, "token_returns"))
    first = torch.where(mask, torch.arange(mask.shape[1]), mask.shape[1]).amin(dim=1)
    at_first = result[torch.arange(len(first)), first]
    expect_close(at_first, scores.double() - 0.8 * log_ratios.double().sum(dim=1),
                 "the return at each reply's first token (γ = 1)",
                 "With γ = 1 the return from the first token is the whole reply's penalised reward, "
                 "score - β Σ_t log_ratio_t: reinforce_step's R, paid token by token.")
    if np.abs(result.numpy()[~mask.numpy()]).max(initial=0) > 1e-9:
        raise AssertionError("token_returns has non-zero returns outside the reply: multiply by the mask.")


# ================================================================ TransformerReward
def oracle_hidden(backbone, ids):
    """The backbone's final hidden states (after its last LayerNorm) from transformers' GPT2Model, float64."""
    from courselib.gpt import to_gpt2
    hf = to_gpt2(backbone).double()
    with torch.no_grad():
        return hf.transformer(input_ids=ids).last_hidden_state


def read_at(hidden, head, positions):
    return torch.stack([hidden[b, t] @ head for b, t in enumerate(positions)])


def transformer_reward_oracle(backbone, head, ids, mask):
    """{what: rewards}: the right token (each row's last position with mask True) and common mistakes."""
    hidden = oracle_hidden(backbone, ids)
    rows = [[t for t in range(ids.shape[1]) if mask[b, t]] for b in range(len(ids))]
    right = read_at(hidden, head, [r[-1] for r in rows])
    mistakes = {
        "you read the reward at the last position of the row, padding included: a batch runs to its longest reply, "
        "so a shorter reply's last position is padding. Read the hidden state at each reply's own last token (the "
        "last position where the mask is True).": read_at(hidden, head, [ids.shape[1] - 1] * len(ids)),
        "you read the reward at the first token of the row (the prompt's): in a causal model only the last token has "
        "seen the whole reply. Read each reply's last token (the last position where the mask is True).":
            read_at(hidden, head, [0] * len(ids)),
        "you read the reward at each reply's FIRST token: in a causal model it has not seen the rest of the reply. "
        "Read its last token (the last position where the mask is True).": read_at(hidden, head, [r[0] for r in rows]),
        "you read the reward one position before each reply's last token: the last position where the mask is True "
        "is the reply's last token.": read_at(hidden, head, [r[-1] - 1 for r in rows]),
        "you averaged the head's output over the reply's tokens; a reward model reads one token, the reply's last, "
        "which in a causal model has seen all of it.":
            torch.stack([torch.stack([hidden[b, t] @ head for t in r]).mean() for b, r in enumerate(rows)]),
        "you read the hidden state before the backbone's final LayerNorm (final_norm): the head reads what the "
        "vocabulary head would.": read_at(_pre_norm_hidden(backbone, ids), head, [r[-1] for r in rows]),
    }
    return right, mistakes


def _pre_norm_hidden(backbone, ids):
    """GPT-2's blocks without its last LayerNorm (transformers' last_hidden_state has ln_f applied)."""
    from courselib.gpt import to_gpt2
    hf = to_gpt2(backbone).double()
    with torch.no_grad():
        x = hf.transformer.wte(ids) + hf.transformer.wpe(torch.arange(ids.shape[1]))
        for block in hf.transformer.h:
            out = block(x)
            x = out[0] if isinstance(out, tuple) else out
    return x


@transformer_reward_values.judge
def judge_transformer_reward_values(seeds, rewards):
    backbone, head, ids, mask = transformer_reward_problem(seeds)
    expect_shape(rewards, (len(ids),), "TransformerReward's rewards", "One number per reply: (N,).")
    right, mistakes = transformer_reward_oracle(backbone, head, ids, mask)
    expect_close(rewards, right, f"TransformerReward on {len(ids)} replies of 1 to {mask.sum(1).max()} tokens (a small "
                 "GPT backbone, the head's weights set by the test), against transformers' GPT-2 hidden states",
                 rtol=1e-6, atol=1e-8,
                 hint="head(final hidden state at each reply's last token), the last position where the mask is True.",
                 diagnoses=lambda: mistakes)


@transformer_reward_backbone.judge
def judge_transformer_reward_backbone(seeds, data):
    backbone, _, _, _ = transformer_reward_problem(seeds)
    if data["shared"] or data["backbone_changed"]:
        raise AssertionError("TransformerReward shares its weights with the model it was given "
                             f"({', '.join(data['shared'][:3])}...): training the reward model would change the SFT "
                             "model, which is the reference policy. Keep a copy of the backbone (copy.deepcopy).")
    expected = sum(p.numel() for p in backbone.parameters()) + backbone.lm_head.in_features
    if data["parameters"] not in (expected, expected + 1):
        raise AssertionError(f"TransformerReward has {data['parameters']:,} parameters; a copy of the backbone "
                             f"({expected - backbone.lm_head.in_features:,}) and a head of d_model weights make "
                             f"{expected:,}. Keep the whole backbone and one nn.Linear(d_model, 1).")
    if not data["head_gradient"]:
        raise AssertionError("no gradient reached the head: the reward must be the head's output on a hidden state.")
    if not any(not name.startswith("head") for name in data["trained"]):
        raise AssertionError("no gradient reached the backbone: a reward model trains the whole transformer, not only "
                             "its head (don't detach the hidden states or compute them under torch.no_grad()).")


# ================================================================ best_of_n
def best_of_n_oracle(ids, mask, rewards, n, variant="right"):
    """The rows a best-of-n choice keeps, by a loop over the groups; the keyword gives a common mistake."""
    groups = len(rewards) // n
    rows = []
    for p in range(groups):
        members = list(range(p * n, (p + 1) * n)) if variant != "strided" else list(range(p, len(rewards), groups))
        pick = {"right": max, "strided": max, "worst": min}.get(variant, max)
        rows.append(members[0] if variant == "first" else pick(members, key=lambda r: float(rewards[r])))
    if variant == "global":
        rows = sorted(range(len(rewards)), key=lambda r: -float(rewards[r]))[:groups]
    return ids[rows], mask[rows]


BEST_OF_N_MISTAKES = {
    "worst": "you kept the reply with the LOWEST reward of each group: best-of-n keeps the reward model's favourite.",
    "strided": "your groups are strided (rows p, p + B, ...): the n candidates of one prompt are CONSECUTIVE rows, "
               "rewards.reshape(-1, n).",
    "global": "you kept the best replies of the whole batch: best-of-n keeps one reply per prompt, the best of its own "
              "n candidates.",
    "first": "you kept each group's first candidate: keep the one with the highest reward.",
}


@best_of_n_values.judge
def judge_best_of_n_values(seeds, results):
    for i, ((prompts, n), result) in enumerate(zip(BEST_OF_N_CASES, results)):
        ids, mask, rewards = best_of_n_problem(seeds.generator(920 + i), prompts, n)
        right_ids, right_mask = best_of_n_oracle(ids, mask, rewards, n)
        expect_shape(result["ids"], tuple(right_ids.shape), f"best_of_n's input_ids ({prompts} prompts × {n} candidates)",
                     "One reply per prompt: (B / n, T).")
        expect_close(result["ids"], right_ids, f"the replies best_of_n kept ({prompts} prompts × {n} candidates)",
                     atol=0, rtol=0, hint="for each prompt's n consecutive rows, the row with the highest reward.",
                     diagnoses={message: best_of_n_oracle(ids, mask, rewards, n, variant)[0]
                                for variant, message in BEST_OF_N_MISTAKES.items()})
        expect_close(result["mask"], right_mask, f"the masks best_of_n kept ({prompts} prompts × {n} candidates)",
                     atol=0, rtol=0, hint="the mask of the same row as the reply kept.")


# ================================================================ ppo_epochs
def ppo_loop_replay(seeds, i, target_kl, variant="right"):
    """The loop by hand, float64 (SGD): the old log-probs once, up to PPO_LOOP_EPOCHS steps of the check's clipped
    loss, a stop before a step once the mean k3 of the ratios exceeds target_kl. Returns (weights, steps taken)."""
    policy, ids, mask, advantages, _ = ppo_loop_problem(seeds, i)
    params = list(policy.parameters())
    counted = mask.double()

    def per_token(model):                                    # log π(ids[t] | ids[<t]) at t, 0 at t = 0
        picked = Categorical(logits=model(ids)[:, :-1].double()).log_prob(ids[:, 1:])
        return torch.cat([torch.zeros(len(ids), 1, dtype=torch.float64), picked], dim=1)

    with torch.no_grad():
        old = per_token(policy)
    taken = 0
    for epoch in range(PPO_LOOP_EPOCHS):
        log_probs = per_token(policy)
        if variant == "recomputed":
            old = log_probs.detach()
        log_ratio = (log_probs - old).detach()
        kl = ((log_ratio.exp() - 1 - log_ratio) * counted).sum() / counted.sum()
        if variant != "no stop" and kl > target_kl:
            break
        ratio = torch.exp(log_probs - old)
        surrogate = torch.minimum(ratio * advantages[:, None], ratio.clamp(1 - PPO_LOOP_EPS, 1 + PPO_LOOP_EPS)
                                  * advantages[:, None])
        loss = -(surrogate * counted).sum() / counted.sum()
        gradients = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)
        with torch.no_grad():
            for p, grad in zip(params, gradients):
                p -= PPO_LOOP_LR * grad
        taken += 1
    return flat_parameters(policy), taken


def _judge_ppo_epochs(seeds, i, target_kl, data, what):
    if data["old_has_graph"]:
        raise AssertionError("ppo_epochs handed loss_fn old log-probs that carry a gradient: π_old is the policy that "
                             "sampled the batch, a constant. Compute them once, before the epochs, under torch.no_grad().")
    if not data["has_graph"]:
        raise AssertionError("ppo_epochs handed loss_fn log-probs without a gradient: compute the current policy's "
                             "log-probs in each epoch with the graph (not under torch.no_grad()).")
    olds = data["old"]
    if len(olds) > 1 and any(not torch.equal(torch.as_tensor(to_numpy(o, "old_log_probs")),
                                             torch.as_tensor(to_numpy(olds[0], "old_log_probs"))) for o in olds[1:]):
        raise AssertionError("ppo_epochs handed loss_fn different old log-probs in different epochs: you recomputed them "
                             "from the policy being trained, so every epoch's ratio starts at 1 and the clip never "
                             "holds. π_old is the policy that sampled the batch: compute its log-probs ONCE, before "
                             "the loop, and keep them fixed.")
    right, taken = ppo_loop_replay(seeds, i, target_kl)
    if data["taken"] != taken or data["calls"] != taken:
        no_stop = ppo_loop_replay(seeds, i, target_kl, "no stop")[1]
        hint = ("it never stopped: before each epoch's step, measure the mean over the reply tokens of ρ - 1 - log ρ "
                "between the current policy and π_old, and stop once it exceeds target_kl."
                if data["taken"] == no_stop and taken != no_stop else
                "the stop comes BEFORE the step of the epoch whose KL exceeds target_kl, and the loop returns how "
                "many steps it took.")
        raise AssertionError(f"ppo_epochs ({what}) took {data['taken']} optimiser steps and called loss_fn "
                             f"{data['calls']} times; a correct loop takes {taken}: {hint}")
    expect_close(data["after"], right, f"the policy's weights after ppo_epochs ({what})", rtol=1e-6,
                 atol=1e-9 * max(1.0, right.abs().max().item()),
                 hint="each epoch: the current per-token log-probs (with gradient), the KL check, then zero_grad, "
                      "loss_fn(log_probs, old_log_probs), backward, step.",
                 diagnoses=lambda: {"the gradients were not zeroed first: the optimizer already held gradients, and "
                                    "backward() ADDS to them. Call optimizer.zero_grad() before each backward().":
                                    _junk_replay(seeds, i, target_kl)})


def _junk_replay(seeds, i, target_kl):
    """What a loop that never zeroes the gradients ends with (the check leaves junk gradients in the optimizer)."""
    policy, ids, mask, advantages, junk = ppo_loop_problem(seeds, i)
    for p, j in zip(policy.parameters(), junk):
        p.grad = j.clone()
    optimizer = torch.optim.SGD(policy.parameters(), lr=PPO_LOOP_LR)
    old = course_token_log_probs(policy(ids), ids).detach()
    for epoch in range(PPO_LOOP_EPOCHS):
        log_probs = course_token_log_probs(policy(ids), ids)
        log_ratio = (log_probs - old).detach()
        if ((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum() > target_kl:
            break
        ppo_loop_loss(log_probs, old, advantages, mask).backward()
        optimizer.step()
    return flat_parameters(policy)


def course_token_log_probs(logits, ids):
    picked = Categorical(logits=logits[:, :-1].double()).log_prob(ids[:, 1:])
    return torch.cat([torch.zeros(len(ids), 1, dtype=torch.float64), picked], dim=1)


@ppo_epochs_update.judge
def judge_ppo_epochs_update(seeds, data):
    _judge_ppo_epochs(seeds, 0, PPO_LOOP_TARGETS[0], data, f"{PPO_LOOP_EPOCHS} epochs, no KL target")


@ppo_epochs_early_stop.judge
def judge_ppo_epochs_early_stop(seeds, data):
    _judge_ppo_epochs(seeds, 1, PPO_LOOP_TARGETS[1], data,
                      f"{PPO_LOOP_EPOCHS} epochs, target_kl = {PPO_LOOP_TARGETS[1]:g}: the first step moves the policy "
                      "past it")
