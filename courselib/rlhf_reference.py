"""The course's reference answers to notebook 11's exercises (RLHF).

Kept apart from `courselib.rlhf` so that notebook 11's grading kernel cannot reach them: neither the
notebook's cells, nor its probes (autograder/checks/rlhf.py), nor anything they import, imports this
module, and the grading sandbox of notebook 11 hides it. The test suite uses it (the seed comparison of
autograder/tests/test_rlhf_lib.py runs the notebook's pipeline with these pieces), and so may later
notebooks.
"""
import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn

from courselib import rlhf


def sequence_log_probs(logits, input_ids, mask=None):
    """Σ_t mask[:, t] log p(input_ids[:, t] | input_ids[:, <t]) with the causal-LM convention: the logits
    at position t score the token at t + 1. logits (B, T, V) = model(input_ids); input_ids, mask (B, T),
    mask True on the tokens that count (mask[:, 0] is ignored: nothing predicts the first token). (B,)."""
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)                           # (B, T - 1, V)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)       # (B, T - 1)
    if mask is not None:
        picked = picked.masked_fill(~mask[:, 1:], 0.0)
    return picked.sum(dim=-1)


def sft_loss(logits, input_ids, prompt_length, reply_lengths):
    """Mean next-token cross-entropy over the reply tokens of a batch, each reply's <|endoftext|> included."""
    positions = torch.arange(input_ids.shape[1])
    in_reply = (positions >= prompt_length) & (positions < prompt_length + reply_lengths[:, None])
    labels = input_ids.masked_fill(~in_reply, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def reward_model_step(reward_model, optimizer, chosen, chosen_mask, rejected, rejected_mask):
    """One Bradley–Terry step; (loss, accuracy) before the update, as floats."""
    r_chosen, r_rejected = reward_model(chosen, chosen_mask), reward_model(rejected, rejected_mask)
    loss = -F.logsigmoid(r_chosen - r_rejected).mean()
    accuracy = (r_chosen > r_rejected).float().mean().item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item(), accuracy


def sequence_kl(policy_logits, reference_logits, mask):
    """Σ_t mask[:, t] KL(π(· | x_<t) || π_ref(· | x_<t)): the exact KL of each token's next-token
    distributions, summed over the reply. Logits (B, T, V) at the same input ids, causal convention. (B,)."""
    log_p = torch.log_softmax(policy_logits[:, :-1], dim=-1)
    log_q = torch.log_softmax(reference_logits[:, :-1], dim=-1)
    per_position = (log_p.exp() * (log_p - log_q)).sum(dim=-1)                     # (B, T - 1)
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)


def rloo_advantages(rewards, group_size):
    """RLOO: each reward minus the mean of the other group_size - 1 rewards of its group. rewards (B,), its
    groups consecutive rows (row i in group i // group_size). Returns (B,)."""
    groups = rewards.reshape(-1, group_size)                                        # (B / k, k)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


def reinforce_step(policy, reference, optimizer, input_ids, mask, rewards, beta, group_size):
    """One REINFORCE step with the KL-penalised reward and RLOO's baseline; (penalized, log_ratio) without gradient."""
    log_probs = sequence_log_probs(policy(input_ids), input_ids, mask)
    with torch.no_grad():
        log_ratio = log_probs.detach() - sequence_log_probs(reference(input_ids), input_ids, mask)
        penalized = rewards - beta * log_ratio
        advantages = rloo_advantages(penalized, group_size)
    loss = -(advantages * log_probs).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return penalized, log_ratio


def ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps=0.2):
    """PPO's clipped surrogate, as a loss: -mean over the counted tokens of min(ρ A, clip(ρ, 1 - ε, 1 + ε) A),
    ρ = exp(log_probs - old_log_probs) per token. log_probs, old_log_probs, mask (B, T); advantages (B,)."""
    ratio = torch.exp(log_probs - old_log_probs)                                    # (B, T)
    advantage = advantages[:, None]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    return -(surrogate * mask).sum() / mask.sum()


def ppo_epochs(policy, optimizer, input_ids, mask, loss_fn, epochs, target_kl):
    """PPO's epochs on one batch: the sampling policy's per-token log-probs once, fixed; then up to `epochs`
    optimiser steps of loss_fn(log_probs, old_log_probs), stopping before a step once the mean over the reply
    tokens of ρ - 1 - log ρ (an estimate of KL(π_old || π_θ)) exceeds target_kl. Returns the steps taken."""
    with torch.no_grad():
        old_log_probs = rlhf.token_log_probs(policy(input_ids), input_ids)
    for epoch in range(epochs):
        log_probs = rlhf.token_log_probs(policy(input_ids), input_ids)
        log_ratio = (log_probs - old_log_probs).detach()
        kl = ((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum()
        if kl > target_kl:
            return epoch
        loss = loss_fn(log_probs, old_log_probs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return epochs


def grpo_loss(log_probs, old_log_probs, ref_log_probs, rewards, mask, group_size, clip_eps=0.2, beta=0.04):
    """PPO's clipped loss with group-normalised advantages, plus beta times the mean k3 over the reply tokens."""
    grouped = rewards.reshape(-1, group_size)
    advantages = ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)).reshape(-1)
    log_r = ref_log_probs - log_probs
    kl = ((torch.exp(log_r) - 1 - log_r) * mask).sum() / mask.sum()
    return ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps) + beta * kl


def dpo_loss(policy, reference, chosen, chosen_mask, rejected, rejected_mask, beta):
    """(mean DPO loss with gradient, chosen implicit rewards, rejected implicit rewards)."""
    policy_chosen = sequence_log_probs(policy(chosen), chosen, chosen_mask)
    policy_rejected = sequence_log_probs(policy(rejected), rejected, rejected_mask)
    with torch.no_grad():
        reference_chosen = sequence_log_probs(reference(chosen), chosen, chosen_mask)
        reference_rejected = sequence_log_probs(reference(rejected), rejected, rejected_mask)
    chosen_rewards = beta * (policy_chosen - reference_chosen)
    rejected_rewards = beta * (policy_rejected - reference_rejected)
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards).mean()
    return loss, chosen_rewards.detach(), rejected_rewards.detach()


class TransformerReward(nn.Module):
    """A reward model on a copy of a GPT backbone: a scalar head (no bias) on the final hidden state of each
    reply's last token (the last position where the mask is True)."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = copy.deepcopy(backbone)
        self.head = nn.Linear(self.backbone.lm_head.in_features, 1, bias=False)

    def forward(self, input_ids, mask):
        hidden = rlhf.hidden_states(self.backbone, input_ids)                      # (N, T, d)
        last = (mask.long() * torch.arange(mask.shape[1])).argmax(dim=1)           # (N,)
        return self.head(hidden[torch.arange(len(input_ids)), last]).squeeze(-1)  # (N,)


def best_of_n(input_ids, mask, rewards, n):
    """Of each prompt's n consecutive candidates, the one with the highest reward: (ids, mask) of B / n rows."""
    best = rewards.reshape(-1, n).argmax(dim=1) + torch.arange(0, len(rewards), n)
    return input_ids[best], mask[best]


def token_returns(token_log_ratios, mask, scores, beta, gamma=1.0):
    """Per-token rewards (the penalty, the score at the reply's last token) and their discounted returns."""
    rewards = -beta * token_log_ratios * mask
    is_last = mask & (mask.long().cumsum(dim=1) == mask.sum(dim=1, keepdim=True))
    rewards = rewards + is_last * scores[:, None]
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores, dtype=rewards.dtype)
    for t in range(mask.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask


def build_setup(model, tokenizer, sft_steps=30, reward_steps=100, eval_prompts=96):
    """The notebook's setup built with the course's recipe (for the suite's seed comparison): SFT of `model` on the
    demonstrations (Adam 1e-3, `sft_steps` batches of 32), the preference pairs of its replies, the bag-of-words
    reward model (`reward_steps` full-batch SGD steps at 1.0). Uses the course's reference answers."""
    answers = sys.modules[__name__]
    chat_prompts, demonstrations, frozen_copy = rlhf.chat_prompts, rlhf.demonstrations, rlhf.frozen_copy
    collect_preferences, BagOfWordsReward, Setup = rlhf.collect_preferences, rlhf.BagOfWordsReward, rlhf.Setup
    train_prompts, test_prompts = chat_prompts(tokenizer, 256, seed=1), chat_prompts(tokenizer, 128, seed=2)
    evaluation, demonstration_prompts = chat_prompts(tokenizer, eval_prompts, seed=3), chat_prompts(tokenizer, 256, seed=4)
    ids, lengths = demonstrations(tokenizer, demonstration_prompts)
    tuned = copy.deepcopy(model).train()
    optimizer = torch.optim.Adam(tuned.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(sft_steps):
        rows = torch.randint(len(ids), (32,), generator=generator)
        loss = answers.sft_loss(tuned(ids[rows]), ids[rows], demonstration_prompts.ids.shape[1], lengths[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    reference = frozen_copy(tuned.eval())
    generator = torch.Generator().manual_seed(0)
    pairs, _ = collect_preferences(reference, tokenizer, train_prompts, generator)
    reward_model = BagOfWordsReward(len(tokenizer))
    optimizer = torch.optim.SGD(reward_model.parameters(), lr=1.0)
    for _ in range(reward_steps):
        answers.reward_model_step(reward_model, optimizer, pairs.chosen, pairs.chosen_mask, pairs.rejected,
                                  pairs.rejected_mask)
    return Setup(reference, reward_model, tokenizer, train_prompts, evaluation, pairs)


def pieces():
    """The reference answers under the names notebook 11 gives its own, for `rlhf.Comparison`."""
    return {"sequence_log_probs": sequence_log_probs, "sequence_kl": sequence_kl, "rloo_advantages": rloo_advantages,
            "reinforce_step": reinforce_step, "ppo_clip_loss": ppo_clip_loss, "ppo_epochs": ppo_epochs,
            "grpo_loss": grpo_loss, "dpo_loss": dpo_loss, "best_of_n": best_of_n, "sft_loss": sft_loss}
