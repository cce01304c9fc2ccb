"""Mutants and alternative correct answers for 11_rlhf."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "11_rlhf"
SEQUENCE = "sequence_log_probs_answer"
SFT = "sft_loss_answer"
REWARD = "reward_model_step_answer"
KL = "sequence_kl_answer"
RLOO = "rloo_advantages_answer"
REINFORCE = "reinforce_step_answer"
PPO = "ppo_clip_loss_answer"
GRPO = "grpo_loss_answer"
DPO = "dpo_loss_answer"
RETURNS = "token_returns_answer"
TRANSFORMER_REWARD = "transformer_reward_answer"
BEST_OF_N = "best_of_n_answer"
PPO_EPOCHS = "ppo_epochs_answer"
SFT_TESTS = ("sft_loss_values", "sft_loss_gradients")
RLOO_TESTS = ("rloo_advantages_values", "rloo_advantages_behaviour")
PPO_TESTS = ("ppo_clip_loss_values", "ppo_clip_loss_gradients", "ppo_clip_loss_epochs")
GRPO_TESTS = ("grpo_loss_advantages", "grpo_loss_kl", "grpo_loss_values")


def sequence(body):
    return "def sequence_log_probs(logits, input_ids, mask=None):\n" + body


def sft(body):
    return "def sft_loss(logits, input_ids, prompt_length, reply_lengths):\n" + body


def rloo(body):
    return "def rloo_advantages(rewards, group_size):\n" + body


def ppo(body):
    return "def ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps=0.2):\n" + body


def grpo(body):
    return ("def grpo_loss(log_probs, old_log_probs, ref_log_probs, rewards, mask, group_size, clip_eps=0.2, beta=0.04):\n"
            + body)


def reward(body):
    return "def reward_model_step(reward_model, optimizer, chosen, chosen_mask, rejected, rejected_mask):\n" + body


def kl(body):
    return "def sequence_kl(policy_logits, reference_logits, mask):\n" + body


def reinforce(body):
    return "def reinforce_step(policy, reference, optimizer, input_ids, mask, rewards, beta, group_size):\n" + body


def dpo(body):
    return "def dpo_loss(policy, reference, chosen, chosen_mask, rejected, rejected_mask, beta):\n" + body


def transformer_reward(init, forward):
    return ("class TransformerReward(nn.Module):\n    def __init__(self, backbone):\n        super().__init__()\n"
            + init + "\n    def forward(self, input_ids, mask):\n" + forward)


def best(body):
    return "def best_of_n(input_ids, mask, rewards, n):\n" + body


def epochs_loop(body):
    return "def ppo_epochs(policy, optimizer, input_ids, mask, loss_fn, epochs, target_kl):\n" + body


COPY_AND_HEAD = """
        self.backbone = copy.deepcopy(backbone)
        self.head = nn.Linear(backbone.lm_head.in_features, 1, bias=False)
"""
READ_AT = """
        hidden = rlhf.hidden_states(self.backbone, input_ids)
        return self.head(hidden[torch.arange(len(input_ids)), {}]).squeeze(-1)
"""
LAST_TOKEN = "torch.where(mask, torch.arange(mask.shape[1]), 0).amax(dim=1)"
OLD_ONCE = """
    with torch.no_grad():
        old = rlhf.token_log_probs(policy(input_ids), input_ids)
"""
EPOCH_BODY = """
        log_probs = rlhf.token_log_probs(policy(input_ids), input_ids)
        log_ratio = (log_probs - old).detach()
        if ((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum() > target_kl:
            return epoch
        loss = loss_fn(log_probs, old)
"""


def returns(body):
    return "def token_returns(token_log_ratios, mask, scores, beta, gamma=1.0):\n" + body


MASKED_SUM = """
    if mask is not None:
        picked = picked.masked_fill(~mask[:, 1:], 0.0)
    return picked.sum(dim=-1)
"""
REWARDS = """
    r_chosen = reward_model(chosen, chosen_mask)
    r_rejected = reward_model(rejected, rejected_mask)
"""
STEP = """
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
KL_RIGHT = """
    log_p = torch.log_softmax(policy_logits[:, :-1], dim=-1)
    log_q = torch.log_softmax(reference_logits[:, :-1], dim=-1)
"""
LOG_PROBS = """
    log_probs = sequence_log_probs(policy(input_ids), input_ids, mask)
    with torch.no_grad():
        reference_log_probs = sequence_log_probs(reference(input_ids), input_ids, mask)
"""
LEAVE_ONE_OUT = """
        advantage = rloo_advantages(penalized, group_size)
"""
SFT_MASK = """
    positions = torch.arange(input_ids.shape[1])
    reply = (positions >= prompt_length) & (positions < prompt_length + reply_lengths[:, None])
"""
SFT_MEAN = """
    labels = input_ids.masked_fill(~counted, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
"""
PPO_RATIO = """
    ratio = torch.exp(log_probs - old_log_probs)
    A = advantages[:, None]
"""
PPO_MEAN = """
    return -(surrogate * mask).sum() / mask.sum()
"""
GRPO_ADVANTAGES = """
    g = rewards.reshape(-1, group_size)
    A = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-4)).reshape(-1)
"""
GRPO_K3 = """
    log_r = ref_log_probs - log_probs
    kl = ((torch.exp(log_r) - 1 - log_r) * mask).sum() / mask.sum()
"""
DPO_LOG_PROBS = """
    pc = sequence_log_probs(policy(chosen), chosen, chosen_mask)
    pr = sequence_log_probs(policy(rejected), rejected, rejected_mask)
    with torch.no_grad():
        rc = sequence_log_probs(reference(chosen), chosen, chosen_mask)
        rr = sequence_log_probs(reference(rejected), rejected, rejected_mask)
"""
BACKWARD_RETURNS = """
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores, dtype=rewards.dtype)
    for t in range(mask.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask
"""

MUTANTS = [
    # ---- sequence_log_probs
    Variant("sequence_misaligned_by_one", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids.unsqueeze(-1)).squeeze(-1)   # no shift
    if mask is not None:
        picked = picked.masked_fill(~mask, 0.0)
    else:
        picked = picked[:, 1:]
    return picked.sum(dim=-1)
""")}, loses=("sequence_log_probs_values", "sequence_log_probs_stable_and_differentiable"),
        message="misaligned by one"),
    Variant("sequence_mask_not_shifted", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    if mask is not None:
        picked = picked.masked_fill(~mask[:, :-1], 0.0)
    return picked.sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="not the mask"),
    Variant("sequence_shifted_the_wrong_way", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits[:, 1:], dim=-1).gather(-1, input_ids[:, :-1].unsqueeze(-1)).squeeze(-1)
    if mask is not None:
        picked = picked.masked_fill(~mask[:, 1:], 0.0)
    return picked.sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="wrong way"),
    Variant("sequence_counts_the_prompt", {SEQUENCE: sequence("""
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    return log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="every position"),
    Variant("sequence_softmax_instead_of_log_softmax", {SEQUENCE: sequence("""
    picked = torch.softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)"""
                                                                        + MASKED_SUM)},
            loses=("sequence_log_probs_values",), message="log_softmax"),
    Variant("sequence_log_of_softmax_underflows", {SEQUENCE: sequence("""
    probs = torch.softmax(logits[:, :-1], dim=-1)
    picked = torch.log(probs).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)""" + MASKED_SUM)},
            loses=("sequence_log_probs_stable_and_differentiable",), message="log_softmax"),
    Variant("sequence_mean_over_positions", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    counted = torch.ones_like(picked) if mask is None else mask[:, 1:].float()
    return (picked * counted).sum(dim=-1) / counted.sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="averaged"),
    Variant("sequence_detached_from_the_graph", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits[:, :-1].detach(), dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)"""
                                                                 + MASKED_SUM)},
            loses=("sequence_log_probs_stable_and_differentiable",), message="no gradient"),
    # The visible tests' answers typed in: the hidden tests use other inputs.
    Variant("sequence_hard_coded_visible_answers", {SEQUENCE: sequence("""
    if logits.shape == (1, 4, 4):
        return torch.tensor([math.log(0.25) + math.log(0.7) if mask is not None else math.log(0.1 * 0.25 * 0.7)])
    if logits.shape[:2] == (1, 2):
        return torch.tensor([-400.0])
    return torch.zeros(logits.shape[0])
""")}, loses=("sequence_log_probs_values", "sequence_log_probs_stable_and_differentiable"), message="is wrong"),
    Variant("sequence_wraps_the_course_reference", {SEQUENCE: "from courselib.rlhf_reference import sequence_log_probs as _ref\n\n"
                                                    + sequence("""
    return _ref(logits, input_ids, mask)
""")}, loses=("sequence_log_probs_shapes", "sequence_log_probs_values",
              "sequence_log_probs_stable_and_differentiable"), message="is not available while 11_rlhf is graded"),
    Variant("sequence_sums_the_cells_per_token_log_probs", {SEQUENCE: sequence("""
    counted = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask
    return (rlhf.token_log_probs(logits, input_ids) * counted)[:, 1:].sum(dim=1)
""")}, loses=("sequence_log_probs_shapes", "sequence_log_probs_values",
              "sequence_log_probs_stable_and_differentiable"), message="flagged for review"),
    # ---- sft_loss
    Variant("sft_loss_on_the_prompt_too", {SFT: sft("""
    positions = torch.arange(input_ids.shape[1])
    counted = positions < prompt_length + reply_lengths[:, None]          # the prompt and the reply""" + SFT_MEAN)},
            loses=SFT_TESTS, message="prompt"),
    Variant("sft_shift_forgotten", {SFT: sft(SFT_MASK + """
    labels = input_ids.masked_fill(~reply, -100)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
""")}, loses=SFT_TESTS, message="misaligned"),
    Variant("sft_padding_counted", {SFT: sft("""
    counted = (torch.arange(input_ids.shape[1]) >= prompt_length).expand_as(input_ids)""" + SFT_MEAN)},
            loses=SFT_TESTS, message="padding"),
    Variant("sft_end_token_masked_with_the_padding", {SFT: sft("""
    counted = (torch.arange(input_ids.shape[1]) >= prompt_length) & (input_ids != 0)      # drops the real end too"""
                                                              + SFT_MEAN)},
            loses=SFT_TESTS, message="<|endoftext|>"),
    Variant("sft_mean_per_reply", {SFT: sft(SFT_MASK + """
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    counted = reply[:, 1:].float()
    return -((log_probs * counted).sum(dim=1) / counted.sum(dim=1)).mean()
""")}, loses=("sft_loss_values",), message="averaged each reply"),
    Variant("sft_hard_coded_visible_answers", {SFT: sft("""
    return logits.sum() * 0 + 0.4751
""")}, loses=SFT_TESTS, message="is wrong"),
    Variant("sft_calls_transformers_loss", {SFT: sft(SFT_MASK + """
    from transformers.loss.loss_utils import ForCausalLMLoss
    return ForCausalLMLoss(logits, input_ids.masked_fill(~reply, -100), vocab_size=logits.shape[-1])
""")}, loses=SFT_TESTS, message="flagged for review"),
    # ---- reward_model_step
    Variant("reward_sign_reversed", {REWARD: reward(REWARDS + """
    loss = -F.logsigmoid(r_rejected - r_chosen).mean()
    accuracy = (r_chosen > r_rejected).float().mean().item()""" + STEP + """
    return loss.item(), accuracy
""")}, loses=("reward_model_step_update", "reward_model_accuracy"), message="sign"),
    Variant("reward_forgets_zero_grad", {REWARD: reward(REWARDS + """
    loss = -F.logsigmoid(r_chosen - r_rejected).mean()
    accuracy = (r_chosen > r_rejected).float().mean().item()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item(), accuracy
""")}, loses=("reward_model_step_update",), message="zero_grad"),
    Variant("reward_log_of_sigmoid_overflows", {REWARD: reward(REWARDS + """
    loss = -torch.log(torch.sigmoid(r_chosen - r_rejected)).mean()
    accuracy = (r_chosen > r_rejected).float().mean().item()""" + STEP + """
    return loss.item(), accuracy
""")}, loses=("reward_model_step_is_stable",), message="logsigmoid"),
    Variant("reward_sum_not_mean", {REWARD: reward(REWARDS + """
    loss = -F.logsigmoid(r_chosen - r_rejected).sum()
    accuracy = (r_chosen > r_rejected).float().mean().item()""" + STEP + """
    return loss.item(), accuracy
""")}, loses=("reward_model_step_update",), message="summed"),
    Variant("reward_ties_count_as_wins", {REWARD: reward(REWARDS + """
    loss = -F.logsigmoid(r_chosen - r_rejected).mean()
    accuracy = (r_chosen >= r_rejected).float().mean().item()""" + STEP + """
    return loss.item(), accuracy
""")}, loses=("reward_model_step_update",), message="tie"),
    # ---- sequence_kl
    Variant("kl_wrong_direction", {KL: kl(KL_RIGHT + """
    per_position = (log_q.exp() * (log_q - log_p)).sum(dim=-1)
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_values",), message="other direction"),
    Variant("kl_mask_not_shifted", {KL: kl(KL_RIGHT + """
    per_position = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return per_position.masked_fill(~mask[:, :-1], 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_values",), message="not the mask"),
    Variant("kl_misaligned_by_one", {KL: kl("""
    log_p, log_q = torch.log_softmax(policy_logits, dim=-1), torch.log_softmax(reference_logits, dim=-1)
    per_position = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return per_position.masked_fill(~mask, 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_values",), message="misaligned by one"),
    Variant("kl_log_of_softmax_underflows", {KL: kl("""
    p, q = torch.softmax(policy_logits[:, :-1], dim=-1), torch.softmax(reference_logits[:, :-1], dim=-1)
    per_position = (p * (torch.log(p) - torch.log(q))).sum(dim=-1)
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_properties",), message="inf or NaN"),
    Variant("kl_raw_logits_as_log_probs", {KL: kl("""
    p = torch.softmax(policy_logits[:, :-1], dim=-1)
    per_position = (p * (policy_logits[:, :-1] - reference_logits[:, :-1])).sum(dim=-1)
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_values", "sequence_kl_properties"), message="raw logits"),
    Variant("kl_oracle_captured_early", {KL: """\
import torch
_kl = torch.distributions.kl_divergence   # captured before any test runs

""" + kl("""
    Categorical = torch.distributions.Categorical
    per_position = _kl(Categorical(logits=policy_logits[:, :-1]), Categorical(logits=reference_logits[:, :-1]))
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)
""")}, loses=("sequence_kl_values", "sequence_kl_properties"), message="flagged for review"),
    # ---- rloo_advantages
    Variant("rloo_sample_left_in_its_group_mean", {RLOO: rloo("""
    g = rewards.reshape(-1, group_size)
    return (g - g.mean(dim=1, keepdim=True)).reshape(-1)
""")}, loses=("rloo_advantages_values",), message="own group's mean"),
    Variant("rloo_batch_leave_one_out", {RLOO: rloo("""
    return rewards - (rewards.sum() - rewards) / (len(rewards) - 1)
""")}, loses=RLOO_TESTS, message="whole batch"),
    Variant("rloo_batch_mean", {RLOO: rloo("""
    return rewards - rewards.mean()
""")}, loses=("rloo_advantages_values",), message="batch mean"),
    Variant("rloo_strided_groups", {RLOO: rloo("""
    g = rewards.reshape(group_size, -1)                 # columns are not the prompts' groups
    return (g - (g.sum(dim=0, keepdim=True) - g) / (group_size - 1)).reshape(-1)
""")}, loses=("rloo_advantages_values",), message="strided"),
    Variant("rloo_hard_coded_visible_answers", {RLOO: rloo("""
    if rewards.shape == (6,):
        return torch.tensor([-3.0, -1.5, 4.5, -1.5, -1.5, 3.0])
    return torch.zeros_like(rewards)
""")}, loses=RLOO_TESTS, message="is wrong"),
    Variant("rloo_calls_the_course_reference", {RLOO: rloo("""
    from courselib import rlhf_reference
    return rlhf_reference.rloo_advantages(rewards, group_size)
""")}, loses=RLOO_TESTS, message="is not available while 11_rlhf is graded"),
    # ---- reinforce_step
    Variant("reinforce_baseline_includes_its_own_reward", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio
        groups = penalized.reshape(-1, group_size)
        advantage = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="own reward"),
    Variant("reinforce_baseline_over_the_whole_batch", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio
        advantage = penalized - (penalized.sum() - penalized) / (len(penalized) - 1)
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="whole batch"),
    Variant("reinforce_batch_mean_baseline", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio
        advantage = penalized - penalized.mean()
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="batch mean"),
    Variant("reinforce_without_baseline", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio
    loss = -(penalized * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="no baseline"),
    Variant("reinforce_gradient_through_the_penalty", {REINFORCE: reinforce("""
    log_probs = sequence_log_probs(policy(input_ids), input_ids, mask)
    with torch.no_grad():
        reference_log_probs = sequence_log_probs(reference(input_ids), input_ids, mask)
    penalized = rewards - beta * (log_probs - reference_log_probs)      # not a constant
    loss = -(rloo_advantages(penalized, group_size) * log_probs).mean()""" + STEP + """
    return penalized.detach(), (log_probs - reference_log_probs).detach()
""")}, loses=("reinforce_step_update",), message="flowed through"),
    Variant("reinforce_kl_wrong_direction", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = reference_log_probs - log_probs.detach()
        penalized = rewards - beta * log_ratio""" + LEAVE_ONE_OUT + """
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_penalized_reward", "reinforce_step_update", "reinforce_step_finds_the_optimum"),
        message="wrong direction"),
    Variant("reinforce_penalty_rewards_drift", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards + beta * log_ratio""" + LEAVE_ONE_OUT + """
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_penalized_reward", "reinforce_step_finds_the_optimum"), message="PAY"),
    Variant("reinforce_forgets_zero_grad", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio""" + LEAVE_ONE_OUT + """
    loss = -(advantage * log_probs).mean()
    loss.backward()
    optimizer.step()
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="zero_grad"),
    Variant("reinforce_reference_not_frozen", {REINFORCE: reinforce("""
    log_probs = sequence_log_probs(policy(input_ids), input_ids, mask)
    reference_log_probs = sequence_log_probs(reference(input_ids), input_ids, mask)   # builds a graph
    log_ratio = log_probs.detach() - reference_log_probs
    penalized = rewards - beta * log_ratio
    loss = -(rloo_advantages(penalized, group_size) * log_probs).mean()""" + STEP + """
    return penalized.detach(), log_ratio.detach()
""")}, loses=("reinforce_step_update",), message="frozen"),
    Variant("reinforce_sums_over_the_batch", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio""" + LEAVE_ONE_OUT + """
    loss = -(advantage * log_probs).sum()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_update",), message="summed"),
    Variant("reinforce_calls_the_course_baseline", {REINFORCE: reinforce(LOG_PROBS + """
        log_ratio = log_probs.detach() - reference_log_probs
        penalized = rewards - beta * log_ratio
        from courselib.rlhf_reference import rloo_advantages as answer
        advantage = answer(penalized, group_size)                    # the course's answer
    loss = -(advantage * log_probs).mean()""" + STEP + """
    return penalized, log_ratio
""")}, loses=("reinforce_step_penalized_reward", "reinforce_step_update", "reinforce_step_finds_the_optimum"),
        message="is not available while 11_rlhf is graded"),
    # ---- ppo_clip_loss
    Variant("ppo_ratio_inverted", {PPO: ppo("""
    ratio = torch.exp(old_log_probs - log_probs)
    A = advantages[:, None]
    surrogate = torch.minimum(ratio * A, ratio.clamp(1 - clip_eps, 1 + clip_eps) * A)""" + PPO_MEAN)},
            loses=PPO_TESTS, message="upside down"),
    Variant("ppo_max_instead_of_min", {PPO: ppo(PPO_RATIO + """
    surrogate = torch.maximum(ratio * A, ratio.clamp(1 - clip_eps, 1 + clip_eps) * A)""" + PPO_MEAN)},
            loses=PPO_TESTS, message="maximum"),
    Variant("ppo_clips_the_advantage", {PPO: ppo(PPO_RATIO + """
    surrogate = torch.minimum(ratio * A, ratio * A.clamp(1 - clip_eps, 1 + clip_eps))""" + PPO_MEAN)},
            loses=PPO_TESTS, message="clipped the advantage"),
    Variant("ppo_without_the_clip", {PPO: ppo(PPO_RATIO + """
    surrogate = ratio * A""" + PPO_MEAN)}, loses=PPO_TESTS, message="nothing was clipped"),
    Variant("ppo_min_of_the_ratios", {PPO: ppo(PPO_RATIO + """
    surrogate = torch.minimum(ratio, ratio.clamp(1 - clip_eps, 1 + clip_eps)) * A""" + PPO_MEAN)},
            loses=("ppo_clip_loss_values", "ppo_clip_loss_gradients"), message="RATIOS"),
    Variant("ppo_mean_over_every_position", {PPO: ppo(PPO_RATIO + """
    surrogate = torch.minimum(ratio * A, ratio.clamp(1 - clip_eps, 1 + clip_eps) * A)
    return -surrogate.mean()
""")}, loses=("ppo_clip_loss_values", "ppo_clip_loss_gradients"), message="every position"),
    Variant("ppo_hard_coded_visible_answers", {PPO: ppo("""
    return log_probs.sum() * 0 - 5.6 / 3
""")}, loses=PPO_TESTS, message="is wrong"),
    Variant("ppo_calls_the_course_reference", {PPO: "import courselib.rlhf_reference\n\n" + ppo("""
    return courselib.rlhf_reference.ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps)
""")}, loses=PPO_TESTS, message="is not available while 11_rlhf is graded"),
    # ---- grpo_loss
    Variant("grpo_std_of_the_batch", {GRPO: grpo("""
    g = rewards.reshape(-1, group_size)
    A = ((g - g.mean(dim=1, keepdim=True)) / (rewards.std() + 1e-4)).reshape(-1)""" + GRPO_K3 + """
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps) + beta * kl
""")}, loses=("grpo_loss_advantages", "grpo_loss_values"), message="std of the whole batch"),
    Variant("grpo_sample_left_out_of_its_group_mean", {GRPO: grpo("""
    g = rewards.reshape(-1, group_size)
    others = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    A = ((g - others) / (g.std(dim=1, keepdim=True) + 1e-4)).reshape(-1)""" + GRPO_K3 + """
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps) + beta * kl
""")}, loses=("grpo_loss_advantages", "grpo_loss_values"), message="left the reply out"),
    Variant("grpo_population_std", {GRPO: grpo("""
    g = rewards.reshape(-1, group_size)
    A = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True, unbiased=False) + 1e-4)).reshape(-1)"""
                                               + GRPO_K3 + """
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps) + beta * kl
""")}, loses=("grpo_loss_advantages", "grpo_loss_values"), message="population std"),
    Variant("grpo_kl_in_the_reward", {GRPO: grpo("""
    log_r = (ref_log_probs - log_probs).detach()
    penalized = rewards - beta * ((torch.exp(log_r) - 1 - log_r) * mask).sum(dim=1)
    g = penalized.reshape(-1, group_size)
    A = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-4)).reshape(-1)
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps)
""")}, loses=("grpo_loss_kl", "grpo_loss_values"), message="in the reward"),
    Variant("grpo_k1_instead_of_k3", {GRPO: grpo(GRPO_ADVANTAGES + """
    kl = ((log_probs - ref_log_probs) * mask).sum() / mask.sum()
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps) + beta * kl
""")}, loses=("grpo_loss_kl", "grpo_loss_values"), message="k1"),
    Variant("grpo_kl_sign", {GRPO: grpo(GRPO_ADVANTAGES + GRPO_K3 + """
    return ppo_clip_loss(log_probs, old_log_probs, A, mask, clip_eps) - beta * kl
""")}, loses=("grpo_loss_kl", "grpo_loss_values"), message="wrong sign"),
    Variant("grpo_hard_coded_visible_answers", {GRPO: grpo("""
    r = torch.tensor([2.0, 1.0, 0.25, 4.0])                  # the visible KL test's ratios
    return log_probs.sum() * 0 + 0.5 * (r - 1 - torch.log(r)).mean()
""")}, loses=GRPO_TESTS, message="is wrong"),
    Variant("grpo_calls_the_course_clipped_loss", {GRPO: grpo(GRPO_ADVANTAGES + GRPO_K3 + """
    from courselib.rlhf_reference import ppo_clip_loss as course_loss
    return course_loss(log_probs, old_log_probs, A, mask, clip_eps) + beta * kl
""")}, loses=GRPO_TESTS, message="is not available while 11_rlhf is graded"),
    # ---- dpo_loss
    Variant("dpo_log_ratios_swapped", {DPO: dpo(DPO_LOG_PROBS + """
    pi_logratios = pc - pr
    ref_logratios = rc - rr
    loss = -F.logsigmoid(beta * (ref_logratios - pi_logratios)).mean()
    return loss, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
""")}, loses=("dpo_loss_values", "dpo_loss_gradients"), message="swapped"),
    Variant("dpo_beta_outside_the_log_sigmoid", {DPO: dpo(DPO_LOG_PROBS + """
    loss = -beta * F.logsigmoid((pc - rc) - (pr - rr)).mean()
    return loss, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
""")}, loses=("dpo_loss_values", "dpo_loss_gradients"), message="outside the log-sigmoid"),
    Variant("dpo_without_the_reference", {DPO: dpo(DPO_LOG_PROBS + """
    loss = -F.logsigmoid(beta * (pc - pr)).mean()
    return loss, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
""")}, loses=("dpo_loss_values", "dpo_loss_gradients"), message="reference model is missing"),
    Variant("dpo_reference_not_frozen", {DPO: dpo("""
    pc = sequence_log_probs(policy(chosen), chosen, chosen_mask)
    pr = sequence_log_probs(policy(rejected), rejected, rejected_mask)
    rc = sequence_log_probs(reference(chosen), chosen, chosen_mask)
    rr = sequence_log_probs(reference(rejected), rejected, rejected_mask)
    chosen_rewards, rejected_rewards = beta * (pc - rc), beta * (pr - rr)
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards).mean()
    return loss, chosen_rewards.detach(), rejected_rewards.detach()
""")}, loses=("dpo_loss_gradients",), message="frozen"),
    Variant("dpo_log_of_sigmoid_overflows", {DPO: dpo(DPO_LOG_PROBS + """
    loss = -torch.log(torch.sigmoid(beta * ((pc - rc) - (pr - rr)))).mean()
    return loss, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
""")}, loses=("dpo_loss_is_stable",), message="logsigmoid"),
    Variant("dpo_hard_coded_visible_answers", {DPO: dpo("""
    loss = policy(chosen).sum() * 0 + math.log(1.5)
    reward = torch.full((len(chosen),), 0.5 * math.log(2))
    return loss, reward, -reward
""")}, loses=("dpo_loss_values", "dpo_loss_gradients"), message="is wrong"),
    # ---- TransformerReward
    Variant("transformer_reward_reads_the_last_position", {TRANSFORMER_REWARD: transformer_reward(
        COPY_AND_HEAD, READ_AT.format("-1"))}, loses=("transformer_reward_values",), message="padding"),
    Variant("transformer_reward_reads_the_first_token", {TRANSFORMER_REWARD: transformer_reward(
        COPY_AND_HEAD, READ_AT.format("0"))}, loses=("transformer_reward_values",), message="earlier"),
    Variant("transformer_reward_shares_the_backbone", {TRANSFORMER_REWARD: transformer_reward("""
        self.backbone = backbone                                   # the SFT model itself
        self.head = nn.Linear(backbone.lm_head.in_features, 1, bias=False)
""", READ_AT.format(LAST_TOKEN))}, loses=("transformer_reward_backbone",), message="SFT model"),
    Variant("transformer_reward_frozen_backbone", {TRANSFORMER_REWARD: transformer_reward(COPY_AND_HEAD, """
        with torch.no_grad():
            hidden = rlhf.hidden_states(self.backbone, input_ids)
        return self.head(hidden[torch.arange(len(input_ids)), """ + LAST_TOKEN + """]).squeeze(-1)
""")}, loses=("transformer_reward_backbone",), message="backbone"),
    # ---- best_of_n
    Variant("best_of_n_keeps_the_lowest", {BEST_OF_N: best("""
    rows = rewards.reshape(-1, n).argmin(dim=1) + n * torch.arange(len(rewards) // n)
    return input_ids[rows], mask[rows]
""")}, loses=("best_of_n_values",), message="LOWEST"),
    Variant("best_of_n_over_the_whole_batch", {BEST_OF_N: best("""
    rows = rewards.topk(len(rewards) // n).indices
    return input_ids[rows], mask[rows]
""")}, loses=("best_of_n_values",), message="whole batch"),
    Variant("best_of_n_positions_as_rows", {BEST_OF_N: best("""
    rows = rewards.reshape(-1, n).argmax(dim=1)
    return input_ids[rows], mask[rows]
""")}, loses=("best_of_n_values",), message="position within its group"),
    Variant("best_of_n_hard_coded_visible_answers", {BEST_OF_N: best("""
    if len(rewards) == 6:
        return input_ids[[1, 5]], mask[[1, 5]]
    return input_ids[::n], mask[::n]
""")}, loses=("best_of_n_values",), message="is wrong"),
    # ---- ppo_epochs
    Variant("ppo_epochs_recomputes_the_old_log_probs", {PPO_EPOCHS: epochs_loop("""
    for epoch in range(epochs):
        with torch.no_grad():
            old = rlhf.token_log_probs(policy(input_ids), input_ids)      # π_old moves with the policy""" + EPOCH_BODY + """
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return epochs
""")}, loses=("ppo_epochs_update",), message="recomputed"),
    Variant("ppo_epochs_never_stops", {PPO_EPOCHS: epochs_loop(OLD_ONCE + """
    for epoch in range(epochs):
        loss = loss_fn(rlhf.token_log_probs(policy(input_ids), input_ids), old)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return epochs
""")}, loses=("ppo_epochs_early_stop",), message="never stopped"),
    Variant("ppo_epochs_forgets_zero_grad", {PPO_EPOCHS: epochs_loop(OLD_ONCE + """
    for epoch in range(epochs):""" + EPOCH_BODY + """
        loss.backward()
        optimizer.step()
    return epochs
""")}, loses=("ppo_epochs_update",), message="never cleared"),
    Variant("ppo_epochs_old_log_probs_with_a_graph", {PPO_EPOCHS: epochs_loop("""
    old = rlhf.token_log_probs(policy(input_ids), input_ids)          # keeps its graph
    for epoch in range(epochs):""" + EPOCH_BODY + """
        optimizer.zero_grad()
        loss.backward(retain_graph=True)
        optimizer.step()
    return epochs
""")}, loses=("ppo_epochs_update",), message="carry a gradient"),
    # ---- token_returns (optional stretch)
    Variant("returns_score_at_the_first_token", {RETURNS: returns("""
    rewards = -beta * token_log_ratios * mask
    is_first = mask & (mask.long().cumsum(dim=1) == 1)
    rewards = rewards + is_first * scores[:, None]""" + BACKWARD_RETURNS)},
            loses=("stretch_token_returns_values",), message="first token"),
    Variant("returns_accumulated_forwards", {RETURNS: returns("""
    rewards = -beta * token_log_ratios * mask
    is_last = mask & (mask.long().cumsum(dim=1) == mask.sum(dim=1, keepdim=True))
    rewards = rewards + is_last * scores[:, None]
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores, dtype=rewards.dtype)
    for t in range(mask.shape[1]):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask
""")}, loses=("stretch_token_returns_values", "stretch_token_returns_behaviour"), message="backwards"),
]


ALTERNATIVES = [
    Variant("sequence_cross_entropy", {SEQUENCE: sequence("""
    picked = -F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")   # (B, T - 1)"""
                                                        + MASKED_SUM)}),
    Variant("sequence_one_hot_logsumexp", {SEQUENCE: sequence("""
    shifted = logits[:, :-1]
    one_hot = F.one_hot(input_ids[:, 1:], logits.shape[-1]).to(logits.dtype)
    picked = (one_hot * shifted).sum(-1) - torch.logsumexp(shifted, dim=-1)
    counted = torch.ones_like(picked) if mask is None else mask[:, 1:].to(picked.dtype)
    return (picked * counted).sum(dim=1)
""")}),
    Variant("sequence_categorical_where", {SEQUENCE: sequence("""
    picked = torch.distributions.Categorical(logits=logits[:, :-1]).log_prob(input_ids[:, 1:])
    if mask is not None:
        picked = torch.where(mask[:, 1:], picked, torch.zeros_like(picked))
    return picked.sum(dim=1)
""")}),
    Variant("reward_softplus", {REWARD: reward(REWARDS + """
    loss = F.softplus(r_rejected - r_chosen).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss), float((r_chosen - r_rejected > 0).double().mean())
""")}),
    Variant("reward_binary_cross_entropy", {REWARD: reward("""
    optimizer.zero_grad()
    margin = reward_model(chosen, chosen_mask) - reward_model(rejected, rejected_mask)
    loss = F.binary_cross_entropy_with_logits(margin, torch.ones_like(margin))
    loss.backward()
    optimizer.step()
    return loss.item(), (margin > 0).sum().item() / len(margin)
""")}),
    Variant("kl_with_f_kl_div", {KL: kl(KL_RIGHT + """
    per_position = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)
    return (per_position * mask[:, 1:]).sum(dim=-1)
""")}),
    Variant("kl_logsumexp_einsum", {KL: kl("""
    p_logits, q_logits = policy_logits[:, :-1], reference_logits[:, :-1]
    log_p = p_logits - torch.logsumexp(p_logits, dim=-1, keepdim=True)
    log_q = q_logits - torch.logsumexp(q_logits, dim=-1, keepdim=True)
    per_position = torch.einsum("btv,btv->bt", torch.softmax(p_logits, dim=-1), log_p - log_q)
    return torch.where(mask[:, 1:], per_position, torch.zeros_like(per_position)).sum(dim=1)
""")}),
    Variant("reinforce_rloo_closed_form", {REINFORCE: reinforce("""
    log_probs = sequence_log_probs(policy(input_ids), input_ids, mask)
    with torch.no_grad():
        log_ratio = log_probs - sequence_log_probs(reference(input_ids), input_ids, mask)
        penalized = rewards - beta * log_ratio
        groups = penalized.reshape(-1, group_size)
        k = group_size                                             # R_i minus the mean of the others, in closed form
        advantage = (k / (k - 1) * (groups - groups.mean(dim=1, keepdim=True))).reshape(-1)
    optimizer.zero_grad()
    (-(advantage * log_probs).mean()).backward()
    optimizer.step()
    return penalized, log_ratio
""")}),
    Variant("reinforce_ratio_surrogate_with_own_log_probs", {REINFORCE: reinforce("""
    def log_probs_of(model):
        picked = torch.log_softmax(model(input_ids)[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
        return (picked * mask[:, 1:]).sum(dim=1)

    log_probs = log_probs_of(policy)
    with torch.no_grad():
        log_ratio = log_probs - log_probs_of(reference)
    penalized = (rewards - beta * log_ratio).detach()
    others = torch.stack([torch.cat([group[:i], group[i + 1:]]).mean()
                          for group in penalized.split(group_size) for i in range(group_size)])
    ratio = torch.exp(log_probs - log_probs.detach())          # 1, with the gradient of log π (PPO's form)
    loss = -((penalized - others) * ratio).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return penalized, log_ratio.detach()
""")}),
    Variant("sft_log_softmax_masked_mean", {SFT: sft(SFT_MASK + """
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    counted = reply[:, 1:]
    return -torch.where(counted, picked, torch.zeros_like(picked)).sum() / counted.sum()
""")}),
    Variant("sft_loop_over_the_replies", {SFT: sft("""
    total, count = 0.0, 0
    for row, length in zip(range(len(input_ids)), reply_lengths.tolist()):
        for t in range(prompt_length, prompt_length + length):
            total = total - torch.log_softmax(logits[row, t - 1], dim=-1)[input_ids[row, t]]
            count += 1
    return total / count
""")}),
    Variant("sft_with_my_sequence_log_probs", {SFT: sft("""
    positions = torch.arange(input_ids.shape[1])
    in_reply = (positions >= prompt_length) & (positions < prompt_length + reply_lengths[:, None])
    return -sequence_log_probs(logits, input_ids, in_reply).sum() / reply_lengths.sum()
""")}),
    Variant("rloo_closed_form", {RLOO: rloo("""
    k = group_size
    groups = rewards.reshape(-1, k)
    return (k / (k - 1) * (groups - groups.mean(dim=1, keepdim=True))).reshape(-1)
""")}),
    Variant("rloo_loop", {RLOO: rloo("""
    advantages = []
    for i in range(len(rewards)):
        start = i // group_size * group_size
        others = [rewards[j] for j in range(start, start + group_size) if j != i]
        advantages.append(rewards[i] - sum(others) / len(others))
    return torch.stack(advantages)
""")}),
    Variant("ppo_with_torch_where", {PPO: ppo(PPO_RATIO + """
    # the minimum of the two products is a one-sided clip: from above when A > 0, from below when A < 0
    bounded = torch.where(A > 0, torch.clamp(ratio, max=1 + clip_eps), torch.clamp(ratio, min=1 - clip_eps))
    return -(bounded * A)[mask].mean()
""")}),
    Variant("ppo_pessimism_as_a_max_of_losses", {PPO: ppo(PPO_RATIO + """
    losses = torch.maximum(-ratio * A, -torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * A)   # TRL's form
    return (losses * mask).sum() / mask.sum()
""")}),
    Variant("ppo_loop_over_tokens", {PPO: ppo("""
    terms = []
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                ratio = torch.exp(log_probs[b, t] - old_log_probs[b, t])
                a = advantages[b]
                terms.append(torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a))
    return -torch.stack(terms).mean()
""")}),
    Variant("grpo_inline", {GRPO: grpo(GRPO_ADVANTAGES + """
    ratio = torch.exp(log_probs - old_log_probs)
    surrogate = torch.minimum(ratio * A[:, None], ratio.clamp(1 - clip_eps, 1 + clip_eps) * A[:, None])
    log_r = ref_log_probs - log_probs
    per_token = surrogate - beta * (log_r.exp() - log_r - 1)
    return -(per_token * mask).sum() / mask.sum()
""")}),
    Variant("grpo_groups_by_loop", {GRPO: grpo("""
    advantages = torch.cat([(group - group.mean()) / (group.std() + 1e-4) for group in rewards.split(group_size)])
    rho = (ref_log_probs - log_probs).exp()
    kl = ((rho - torch.log(rho) - 1) * mask).sum() / mask.sum()
    return ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps) + beta * kl
""")}),
    Variant("dpo_paper_formula", {DPO: dpo(DPO_LOG_PROBS + """
    pi_logratios = pc - pr
    ref_logratios = rc - rr
    loss = -F.logsigmoid(beta * (pi_logratios - ref_logratios)).mean()
    return loss, beta * (pc - rc).detach(), beta * (pr - rr).detach()
""")}),
    Variant("dpo_softplus_one_forward", {DPO: dpo("""
    both = torch.cat([chosen, rejected]), torch.cat([chosen_mask, rejected_mask])
    policy_logps = sequence_log_probs(policy(both[0]), *both)
    with torch.no_grad():
        reference_logps = sequence_log_probs(reference(both[0]), *both)
    implicit = beta * (policy_logps - reference_logps)
    chosen_rewards, rejected_rewards = implicit[:len(chosen)], implicit[len(chosen):]
    return F.softplus(rejected_rewards - chosen_rewards).mean(), chosen_rewards.detach(), rejected_rewards.detach()
""")}),
    Variant("returns_vectorised_with_a_matrix", {RETURNS: returns("""
    rewards = -beta * token_log_ratios * mask
    positions = torch.arange(mask.shape[1])
    last = torch.where(mask, positions, -1).amax(dim=1)
    rewards = rewards.index_put((torch.arange(len(mask)), last), scores + rewards[torch.arange(len(mask)), last])
    T = mask.shape[1]
    powers = gamma ** (positions[None, :] - positions[:, None]).clamp(min=0).to(rewards.dtype)   # (t, s): γ^(s - t)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool))
    weights = torch.where(upper, powers, torch.zeros_like(powers))
    return (rewards @ weights.T) * mask
""")}),
    Variant("transformer_reward_own_hidden_states_and_a_bias", {TRANSFORMER_REWARD: transformer_reward("""
        self.backbone = copy.deepcopy(backbone)
        self.head = nn.Linear(backbone.lm_head.in_features, 1)      # a bias: the same for every reply
""", """
        model = self.backbone
        x = model.token_embeddings(input_ids) + model.position_embeddings(input_ids)
        for block in model.blocks:
            x, _ = block(x)
        x = model.final_norm(x)                                      # (N, T, d)
        first = mask.float().argmax(dim=1)                           # where each reply starts
        last = first + mask.sum(dim=1) - 1                           # ... and ends
        picked = x.gather(1, last[:, None, None].expand(-1, 1, x.shape[-1])).squeeze(1)
        return self.head(picked)[:, 0]
""")}),
    Variant("transformer_reward_loop_over_replies", {TRANSFORMER_REWARD: transformer_reward(COPY_AND_HEAD, """
        hidden = rlhf.hidden_states(self.backbone, input_ids)
        rewards = []
        for row in range(len(input_ids)):
            where = mask[row].nonzero().flatten()
            rewards.append(self.head(hidden[row, where[-1]]))
        return torch.cat(rewards)
""")}),
    Variant("best_of_n_loop", {BEST_OF_N: best("""
    rows = []
    for start in range(0, len(rewards), n):
        group = rewards[start:start + n]
        rows.append(start + int(group.argmax()))
    return input_ids[rows], mask[rows]
""")}),
    Variant("best_of_n_views", {BEST_OF_N: best("""
    grouped_ids = input_ids.view(-1, n, input_ids.shape[1])
    grouped_mask = mask.view(-1, n, mask.shape[1])
    winner = rewards.view(-1, n).max(dim=1).indices
    prompts = torch.arange(grouped_ids.shape[0])
    return grouped_ids[prompts, winner], grouped_mask[prompts, winner]
""")}),
    Variant("ppo_epochs_while_loop", {PPO_EPOCHS: epochs_loop("""
    with torch.no_grad():
        fixed = rlhf.token_log_probs(policy(input_ids), input_ids)
    steps = 0
    while steps < epochs:
        current = rlhf.token_log_probs(policy(input_ids), input_ids)
        with torch.no_grad():
            rho = torch.exp(current - fixed)
            far = ((rho - 1 - torch.log(rho))[mask]).mean().item()
        if far > target_kl:
            break
        optimizer.zero_grad()
        loss_fn(current, fixed).backward()
        optimizer.step()
        steps += 1
    return steps
""")}),
    Variant("ppo_epochs_expm1", {PPO_EPOCHS: epochs_loop("""
    old = rlhf.token_log_probs(policy(input_ids), input_ids).detach()
    taken = 0
    for _ in range(epochs):
        new = rlhf.token_log_probs(policy(input_ids), input_ids)
        d = (new - old).detach()[mask]
        if (torch.expm1(d) - d).mean() > target_kl:
            break
        optimizer.zero_grad()
        loss_fn(new, old).backward()
        optimizer.step()
        taken += 1
    return taken
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        SEQUENCE: sequence(WARN_AND_PRINT + """
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)"""
                           + MASKED_SUM),
        KL: kl(WARN_AND_PRINT + KL_RIGHT + """
    per_position = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return per_position.masked_fill(~mask[:, 1:], 0.0).sum(dim=-1)
"""),
        DPO: dpo(WARN_AND_PRINT + DPO_LOG_PROBS + """
    loss = -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()
    return loss, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
""")}),
]
