"""Mutants and alternative correct answers for 11_rlhf."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "11_rlhf"
SEQUENCE = "sequence_log_probs_answer"
PREFERENCE = "preference_loss_answer"
KL = "kl_divergence_answer"
PENALIZED = "kl_penalized_reward_answer"
DPO = "dpo_loss_answer"


def sequence(body):
    return "def sequence_log_probs(logits, tokens, mask=None):\n" + body


def preference(body):
    return "def preference_loss(r_chosen, r_rejected):\n" + body


def kl(body):
    return "def kl_divergence(logits_p, logits_q):\n" + body


def penalized(body):
    return "def kl_penalized_reward(reward, logp_policy, logp_ref, beta):\n" + body


def dpo(body):
    return ("def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, "
            "beta):\n" + body)


MASKED_SUM = """
    if mask is not None:
        picked = picked * mask
    return picked.sum(dim=-1)
"""

# The visible tests' expected answers, as a student who hard-codes them would type them.
VISIBLE_PREFERENCE_LOSS = "0.6380888942471007"      # mean of -log σ(2), -log σ(0.5), -log σ(-1)
VISIBLE_STABLE_LOSS = "120.13862943611199"    # (500 + 100 + log 2) / 5

MUTANTS = [
    # ---- sequence_log_probs
    Variant("sequence_sums_over_padding", {SEQUENCE: sequence("""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(dim=-1)
""")}, loses=("sequence_log_probs_values", "sequence_log_probs_masks_and_gradients"), message="padding"),
    Variant("sequence_softmax_instead_of_log_softmax", {SEQUENCE: sequence("""
    picked = torch.softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)""" + MASKED_SUM)},
            loses=("sequence_log_probs_values",), message="log_softmax"),
    Variant("sequence_log_of_softmax_underflows", {SEQUENCE: sequence("""
    picked = torch.log(torch.softmax(logits, dim=-1)).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)""" + MASKED_SUM)},
            loses=("sequence_log_probs_masks_and_gradients",), message="log_softmax"),
    Variant("sequence_mean_over_positions", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if mask is None:
        return picked.mean(dim=-1)
    return (picked * mask).sum(dim=-1) / mask.sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="once per counted position"),
    Variant("sequence_shifts_already_aligned_logits", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    if mask is not None:
        picked = picked * mask[:, 1:]
    return picked.sum(dim=-1)
""")}, loses=("sequence_log_probs_values",), message="don't shift"),
    Variant("sequence_detached_from_the_graph", {SEQUENCE: sequence("""
    picked = torch.log_softmax(logits.detach(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)""" + MASKED_SUM)},
            loses=("sequence_log_probs_masks_and_gradients", "sft_learns_the_grammar"), message="no gradient"),
    # ---- preference_loss
    Variant("preference_sign_error", {PREFERENCE: preference("""
    return -F.logsigmoid(r_rejected - r_chosen).mean()
""")}, loses=("preference_loss_values", "reward_model_accuracy"), message="sign"),
    Variant("preference_log_of_sigmoid_overflows", {PREFERENCE: preference("""
    return -torch.log(torch.sigmoid(r_chosen - r_rejected)).mean()
""")}, loses=("preference_loss_is_stable",), message="logsigmoid"),
    Variant("preference_sum_not_mean", {PREFERENCE: preference("""
    return -F.logsigmoid(r_chosen - r_rejected).sum()
""")}, loses=("preference_loss_values",), message="averaged"),
    # Hard-coding the visible answers must earn nothing: the hidden tests use other rewards.
    Variant("preference_hard_coded_visible_answers", {PREFERENCE: preference(f"""
    if r_chosen.shape[0] == 5:
        return torch.tensor({VISIBLE_STABLE_LOSS})
    return torch.tensor({VISIBLE_PREFERENCE_LOSS})
""")}, loses=("preference_loss_values", "preference_loss_is_stable", "reward_model_accuracy"),
            message="constant"),
    # ---- kl_divergence
    Variant("kl_arguments_swapped", {KL: kl("""
    log_p, log_q = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return F.kl_div(log_p, log_q, reduction="none", log_target=True).sum(dim=-1)  # KL(q || p)
""")}, loses=("kl_divergence_values",), message="FIRST"),
    Variant("kl_softmax_instead_of_log_softmax", {KL: kl("""
    p, q = torch.softmax(logits_p, dim=-1), torch.softmax(logits_q, dim=-1)
    return (p * (p - q)).sum(dim=-1)
""")}, loses=("kl_divergence_values", "kl_divergence_properties"), message="log_softmax"),
    Variant("kl_log_of_softmax_underflows", {KL: kl("""
    p, q = torch.softmax(logits_p, dim=-1), torch.softmax(logits_q, dim=-1)
    return (p * (torch.log(p) - torch.log(q))).sum(dim=-1)
""")}, loses=("kl_divergence_properties",), message="log_softmax"),
    Variant("kl_raw_logits_as_log_probs", {KL: kl("""
    return (torch.softmax(logits_p, dim=-1) * (logits_p - logits_q)).sum(dim=-1)
""")}, loses=("kl_divergence_properties", "kl_divergence_values"), message="normalise"),
    Variant("kl_mean_over_vocabulary", {KL: kl("""
    log_p, log_q = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return (log_p.exp() * (log_p - log_q)).mean(dim=-1)
""")}, loses=("kl_divergence_values",), message="log_softmax"),
    Variant("kl_calls_the_oracle", {KL: kl("""
    return torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits_p),
                                             torch.distributions.Categorical(logits=logits_q))
""")}, loses=("kl_divergence_values", "kl_divergence_properties"), message="oracle"),
    # ---- kl_penalized_reward
    Variant("penalized_beta_on_the_reward", {PENALIZED: penalized("""
    return beta * reward - (logp_policy - logp_ref)
""")}, loses=("kl_penalized_reward_values", "kl_penalized_reward_behaviour"), message="β (log π - log π_ref)"),
    Variant("penalized_sign_error", {PENALIZED: penalized("""
    return reward + beta * (logp_policy - logp_ref)
""")}, loses=("kl_penalized_reward_values",), message="pays"),
    Variant("penalized_beta_only_on_the_policy", {PENALIZED: penalized("""
    return reward - beta * logp_policy + logp_ref
""")}, loses=("kl_penalized_reward_values", "kl_penalized_reward_behaviour"), message="β (log π - log π_ref)"),
    Variant("penalized_in_place", {PENALIZED: penalized("""
    reward -= beta * (logp_policy - logp_ref)
    return reward
""")}, loses=("kl_penalized_reward_values",), message="in place"),
    # ---- dpo_loss
    Variant("dpo_sign_error", {DPO: dpo("""
    return preference_loss(beta * (policy_rejected_logps - ref_rejected_logps),
                           beta * (policy_chosen_logps - ref_chosen_logps))
""")}, loses=("dpo_loss_values", "dpo_loss_behaviour"), message="chosen"),
    Variant("dpo_beta_only_on_the_policy", {DPO: dpo("""
    return preference_loss(beta * policy_chosen_logps - ref_chosen_logps,
                           beta * policy_rejected_logps - ref_rejected_logps)
""")}, loses=("dpo_loss_values", "dpo_loss_behaviour"), message="β multiplies"),
    Variant("dpo_beta_outside_the_log_sigmoid", {DPO: dpo("""
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -beta * F.logsigmoid(margin).mean()
""")}, loses=("dpo_loss_values", "dpo_loss_behaviour"), message="inside the log-sigmoid"),
    Variant("dpo_without_the_reference", {DPO: dpo("""
    return preference_loss(beta * policy_chosen_logps, beta * policy_rejected_logps)
""")}, loses=("dpo_loss_values",), message="log-ratios"),
    Variant("dpo_log_of_sigmoid_overflows", {DPO: dpo("""
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -torch.log(torch.sigmoid(beta * margin)).mean()
""")}, loses=("dpo_loss_is_stable",), message="logsigmoid"),
    Variant("dpo_sum_not_mean", {DPO: dpo("""
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).sum()
""")}, loses=("dpo_loss_values",), message="mean"),
]


ALTERNATIVES = [
    Variant("sequence_cross_entropy", {SEQUENCE: sequence("""
    picked = -F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")   # (B, T)""" + MASKED_SUM)}),
    Variant("sequence_categorical_where", {SEQUENCE: sequence("""
    picked = torch.distributions.Categorical(logits=logits).log_prob(tokens)
    if mask is not None:
        picked = torch.where(mask, picked, torch.zeros_like(picked))
    return picked.sum(dim=1)
""")}),
    Variant("sequence_one_hot_logsumexp", {SEQUENCE: sequence("""
    one_hot = F.one_hot(tokens, logits.shape[-1]).to(logits.dtype)
    picked = (one_hot * logits).sum(-1) - torch.logsumexp(logits, dim=-1)""" + MASKED_SUM)}),
    Variant("preference_softplus", {PREFERENCE: preference("""
    return F.softplus(r_rejected - r_chosen).mean()
""")}),
    Variant("preference_binary_cross_entropy", {PREFERENCE: preference("""
    margin = r_chosen - r_rejected
    return F.binary_cross_entropy_with_logits(margin, torch.ones_like(margin))
""")}),
    Variant("kl_with_f_kl_div", {KL: kl("""
    log_p, log_q = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)
""")}),
    Variant("kl_logsumexp_by_hand", {KL: kl("""
    log_p = logits_p - torch.logsumexp(logits_p, dim=-1, keepdim=True)
    log_q = logits_q - torch.logsumexp(logits_q, dim=-1, keepdim=True)
    return torch.einsum("...v,...v->...", torch.softmax(logits_p, dim=-1), log_p - log_q)
""")}),
    Variant("penalized_expanded", {PENALIZED: penalized("""
    return reward - beta * logp_policy + beta * logp_ref
""")}),
    Variant("penalized_torch_sub", {PENALIZED: penalized("""
    return torch.sub(reward, logp_policy - logp_ref, alpha=beta)
""")}),
    Variant("dpo_paper_formula", {DPO: dpo("""
    pi_logratios = policy_chosen_logps - policy_rejected_logps
    ref_logratios = ref_chosen_logps - ref_rejected_logps
    return -F.logsigmoid(beta * (pi_logratios - ref_logratios)).mean()
""")}),
    Variant("dpo_softplus", {DPO: dpo("""
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    return F.softplus(beta * (rejected - chosen)).mean()
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        PREFERENCE: preference(WARN_AND_PRINT + """
    return -F.logsigmoid(r_chosen - r_rejected).mean()
"""),
        KL: kl(WARN_AND_PRINT + """
    log_p, log_q = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)
"""),
        DPO: dpo(WARN_AND_PRINT + """
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean()
""")}),
]
