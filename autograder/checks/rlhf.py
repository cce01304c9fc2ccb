"""Hidden checks for 11_rlhf. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs from `seeds` (token ids, masks,
logits, rewards, the weights of small GPTs of the course's `courselib.gpt.GPT` class), calls the
student's code through `call` and returns what it produced: log-probabilities, losses, the weights
after an optimiser step, gradients. The judge runs in the grader: it rebuilds the same inputs and
weights from the same seeds and compares with independent oracles:
- `torch.distributions.Categorical` (log-probabilities) and transformers' causal-LM loss
  `ForCausalLMLoss`, which fixes the convention: the logits at position t score token t + 1;
- `torch.distributions.kl_divergence` for the KL;
- float64 autograd on the rebuilt models for every gradient and optimiser step (REINFORCE, DPO,
  the reward model), and the closed-form optimum π_ref e^{r/β} / Z of the KL-penalised objective.

Every exercise is graded on its own: `reinforce_step` and `dpo_loss` get the course's reference
`sequence_log_probs` (`courselib.rlhf`) in place of the student's. Stochastic checks state their
false-failure rate in a comment.
"""
import copy
import math
import torch
import torch.nn.functional as F
from torch import nn
from autograder.checks.common import call, expect_shape, probe
from courselib import rlhf as course
from courselib.gpt import GPT




SEQUENCE_SHORTCUTS = ["courselib.rlhf.sequence_log_probs", "courselib.rlhf.sequence_kl",
                      "transformers.loss.loss_utils.ForCausalLMLoss"]


KL_SHORTCUTS = ["torch.distributions.kl_divergence", "torch.distributions.kl.kl_divergence",
                "courselib.rlhf.sequence_kl"]


ADVICE = "the exercise asks you to write this yourself"


NO_GRADIENT = ("no gradient reaches the inputs: build the result from torch operations on the tensors you were given "
               "(no .item(), .tolist(), .detach() or torch.tensor(...) of Python numbers).")


def _pair(result, name, what):
    if not isinstance(result, (tuple, list)) or len(result) != len(what):
        raise AssertionError(f"{name} should return the tuple ({', '.join(what)}), but it returned "
                             f"{type(result).__name__}" + (f" of length {len(result)}" if hasattr(result, "__len__")
                                                           else "") + ".")
    return tuple(result)


def _tensor(result, name, what="a tensor"):
    if type(result) is not torch.Tensor:
        raise AssertionError(f"{name} should return {what}, but it returned {type(result).__name__}.")
    return result


def _unchanged(before, after, name):
    if not all(torch.equal(a, b) for a, b in zip(before, after)):
        raise AssertionError(f"{name} changed one of its input tensors in place (e.g. `rewards -= ...`); compute into "
                             "a new tensor so that the caller's tensors survive.")


# ---------------------------------------------------------------- inputs the checks choose
def episodes(g, batch, prompt_length, reply_length, vocab):
    """Token ids (B, T) and a reply mask (B, T): a prompt, then a reply of 1..reply_length tokens, then
    the padding a batch runs to. Row 0 has the longest reply, the last row a one-token reply."""
    length = prompt_length + reply_length
    ids = torch.randint(vocab, (batch, length), generator=g)
    replies = torch.randint(1, reply_length + 1, (batch,), generator=g)
    replies[0], replies[-1] = reply_length, 1
    positions = torch.arange(length)
    mask = (positions >= prompt_length) & (positions < prompt_length + replies[:, None])
    return ids, mask


DIMS = dict(vocab_size=11, d_model=8, num_layers=1, num_heads=2, max_positions=12)


def seeded_gpt(g, dims=DIMS):
    """A small GPT of the course's class in float64 with random weights from `g` (logits of order 1)."""
    with torch.random.fork_rng():
        model = GPT(**dims).double()
    with torch.no_grad():
        for name, p in model.named_parameters():   # the tied head is the token table: drawn once
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise * 1.5 / math.sqrt(p.shape[-1]))
    return model


def policy_and_reference(g, dims=DIMS, distance=0.3):
    """A policy, and a reference policy that differs from it by `distance` times noise in every weight."""
    policy = seeded_gpt(g, dims)
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(distance * torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    return policy, reference


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_parameters(model):
    return flat([p.detach() for p in model.parameters()]).clone()


def _sequence_log_probs(fn, logits, ids, mask=None):
    args = (logits, ids) if mask is None else (logits, ids, mask)
    before = [a.detach().clone() for a in args]
    result = call(fn, *args, name="sequence_log_probs", forbidden=SEQUENCE_SHORTCUTS, forbidden_advice=ADVICE)
    _unchanged(before, [a.detach() for a in args], "sequence_log_probs")
    return _tensor(result, "sequence_log_probs", "a (B,) tensor")


def sequence_problem(g, batch, prompt_length, reply_length, vocab, scale=2.0):
    ids, mask = episodes(g, batch, prompt_length, reply_length, vocab)
    logits = torch.randn(batch, prompt_length + reply_length, vocab, generator=g) * scale
    return logits, ids, mask


SHAPE_CASES = [((4, 2, 4, 11), True), ((2, 1, 2, 5), True), ((3, 3, 3, 7), False)]


@probe
def sequence_log_probs_shapes(seeds, fn):
    results = []
    for i, (case, masked) in enumerate(SHAPE_CASES):
        logits, ids, mask = sequence_problem(seeds.generator(100 + i), *case)
        results.append(_sequence_log_probs(fn, logits, ids, mask if masked else None))
    return results


VALUE_CASES = [(5, 4, 6, 13), (3, 1, 5, 50), (6, 7, 3, 9)]


@probe
def sequence_log_probs_values(seeds, fn):
    results = [_sequence_log_probs(fn, *sequence_problem(seeds.generator(200 + i), *case))
               for i, case in enumerate(VALUE_CASES)]
    logits, ids, _ = sequence_problem(seeds.generator(210), 3, 2, 5, 6)
    return {"masked": results, "unmasked": _sequence_log_probs(fn, logits, ids)}


def _confident_problem(seeds):
    # float32 logits of ±hundreds: the tokens picked are the least likely, with probabilities like e^-300
    g = seeds.generator(300)
    logits = torch.randn(3, 6, 7, generator=g) * 80
    ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), logits[:, :-1].argmin(dim=-1)], dim=1)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[:, 0] = False
    mask[1, 4:] = False
    return logits, ids, mask


@probe
def sequence_log_probs_stable_and_differentiable(seeds, fn):
    confident = _sequence_log_probs(fn, *_confident_problem(seeds))
    logits, ids, mask = sequence_problem(seeds.generator(310), 3, 2, 4, 7)
    leaf = logits.clone().requires_grad_(True)
    result = _sequence_log_probs(fn, leaf, ids, mask)
    if not result.requires_grad:
        raise AssertionError(f"sequence_log_probs: {NO_GRADIENT}")
    weights = torch.randn(3, generator=seeds.generator(311))
    try:
        (result * weights).sum().backward()
    except RuntimeError as error:
        raise AssertionError(f"sequence_log_probs: .backward() failed ({error}); {NO_GRADIENT}") from None
    if leaf.grad is None:
        raise AssertionError(f"sequence_log_probs: {NO_GRADIENT}")
    return {"confident": confident, "gradient": leaf.grad}


# ================================================================ exercise 2: reward_model_step
RM_VOCAB, RM_LR = 15, 0.5


def reward_problem(g, n=12, scale=1.0, dtype=torch.float32, mirrored=False):
    """Weights, a batch of pairs (one of them a tie) and leftover gradients. `mirrored`: the second half of
    the pairs is the first half swapped, so that margins of both signs are certain."""
    weights = (torch.randn(RM_VOCAB, generator=g) * scale).to(dtype)
    chosen, chosen_mask = episodes(g, n, 3, 6, RM_VOCAB)
    rejected, rejected_mask = episodes(g, n, 3, 6, RM_VOCAB)
    rejected[1], rejected_mask[1] = chosen[1], chosen_mask[1]      # one tie: identical replies
    if mirrored:
        half = n // 2
        chosen[half:], chosen_mask[half:] = rejected[:half].clone(), rejected_mask[:half].clone()
        rejected[half:], rejected_mask[half:] = chosen[:half].clone(), chosen_mask[:half].clone()
    junk = torch.randn(RM_VOCAB, generator=g).to(dtype)            # gradients left over from elsewhere
    return weights, (chosen, chosen_mask, rejected, rejected_mask), junk


def _reward_model_step(fn, weights, batch, junk):
    model = course.BagOfWordsReward(RM_VOCAB).to(weights.dtype)
    with torch.no_grad():
        model.token_reward.copy_(weights)
    model.token_reward.grad = junk.clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=RM_LR)
    before = [t.clone() for t in batch]
    result = call(fn, model, optimizer, *batch, name="reward_model_step")
    _unchanged(before, batch, "reward_model_step")
    loss, accuracy = _pair(result, "reward_model_step", ("loss", "accuracy"))
    numbers = []
    for name, value in (("loss", loss), ("accuracy", accuracy)):
        try:
            numbers.append(float(value))
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"reward_model_step should return the {name} as a number (e.g. loss.item()), but it "
                                 f"returned {type(value).__name__}.") from None
    return {"loss": numbers[0], "accuracy": numbers[1], "weights": model.token_reward.detach().clone()}


def counts(ids, mask):
    """(N, V) how many times each token appears where mask is True."""
    return (F.one_hot(ids, RM_VOCAB).double() * mask[..., None]).sum(dim=1)


@probe
def reward_model_step_update(seeds, fn):
    return _reward_model_step(fn, *reward_problem(seeds.generator(400)))


def _large_margin_problem(seeds):
    # weights of ±100s: margins of hundreds, where σ(m) rounds to 0 or 1 in float32
    return reward_problem(seeds.generator(410), n=10, scale=60.0, mirrored=True)


@probe
def reward_model_step_is_stable(seeds, fn):
    return _reward_model_step(fn, *_large_margin_problem(seeds))


def synthetic_comparisons(g, n_train=400, n_test=2000, noise=0.5):
    taste = torch.randn(RM_VOCAB, generator=g)

    def pairs(n):
        a, a_mask = episodes(g, n, 2, 6, RM_VOCAB)
        b, b_mask = episodes(g, n, 2, 6, RM_VOCAB)
        s_a, s_b = counts(a, a_mask).float() @ taste, counts(b, b_mask).float() @ taste
        a_wins = (torch.rand(n, generator=g) < torch.sigmoid((s_a - s_b) / noise))[:, None]
        return (torch.where(a_wins, a, b), torch.where(a_wins, a_mask, b_mask),
                torch.where(a_wins, b, a), torch.where(a_wins, b_mask, a_mask))

    return taste, pairs(n_train), pairs(n_test)


@probe
def reward_model_accuracy(seeds, fn):
    _, train, _ = synthetic_comparisons(seeds.generator(420))
    model = course.BagOfWordsReward(RM_VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(60):
        call(fn, model, optimizer, *train, name="reward_model_step")
    return model.token_reward.detach().clone()


def _sequence_kl(fn, policy_logits, reference_logits, mask):
    before = [policy_logits.clone(), reference_logits.clone(), mask.clone()]
    result = call(fn, policy_logits, reference_logits, mask, name="sequence_kl", forbidden=KL_SHORTCUTS,
                  forbidden_advice="write Σ_v π_v (log π_v - log π_ref_v) yourself: torch.distributions.kl_divergence "
                                   "is the oracle the tests compare with")
    _unchanged(before, [policy_logits, reference_logits, mask], "sequence_kl")
    return _tensor(result, "sequence_kl", "a (B,) tensor")


def kl_problem(g, batch, prompt_length, reply_length, vocab, scale=2.0):
    ids, mask = episodes(g, batch, prompt_length, reply_length, vocab)
    length = prompt_length + reply_length
    return (torch.randn(batch, length, vocab, generator=g) * scale,
            torch.randn(batch, length, vocab, generator=g) * scale, mask)


KL_CASES = [(4, 3, 5, 10), (2, 1, 4, 7), (5, 6, 2, 30)]


@probe
def sequence_kl_values(seeds, fn):
    return [_sequence_kl(fn, *kl_problem(seeds.generator(500 + i), *case)) for i, case in enumerate(KL_CASES)]


def _kl_properties_problem(seeds):
    g = seeds.generator(510)
    policy_logits, reference_logits, mask = kl_problem(g, 6, 2, 5, 9, scale=2.0)
    shift = torch.randn(6, 7, 1, generator=g) * 10                       # a constant per position
    sharp_p, sharp_q, sharp_mask = kl_problem(g, 4, 2, 3, 10, scale=60.0)   # probabilities that round to 0
    return policy_logits, reference_logits, mask, shift, (sharp_p, sharp_q, sharp_mask)


@probe
def sequence_kl_properties(seeds, fn):
    policy_logits, reference_logits, mask, shift, sharp = _kl_properties_problem(seeds)
    return {"same": _sequence_kl(fn, policy_logits, policy_logits.clone(), mask),
            "shifted": _sequence_kl(fn, policy_logits, reference_logits + shift, mask),
            "sharp": _sequence_kl(fn, *sharp)}


# ================================================================ exercise 4: reinforce_step
RL_LR = 0.1


def reinforce_problem(g, batch=8, prompt_length=3, reply_length=5):
    policy, reference = policy_and_reference(g)
    ids, mask = episodes(g, batch, prompt_length, reply_length, DIMS["vocab_size"])
    rewards = torch.randn(batch, generator=g, dtype=torch.float64) * 2
    junk = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in policy.parameters()]
    return policy, reference, ids, mask, rewards, junk


def _reinforce_step(fn, policy, reference, ids, mask, rewards, beta, junk):
    reference.requires_grad_(True)     # a frozen reference would hide a graph built through it
    for p, j in zip(policy.parameters(), junk):
        p.grad = j.clone()
    optimizer = torch.optim.SGD(policy.parameters(), lr=RL_LR)
    reference_before = flat_parameters(reference)
    inputs = [ids, mask, rewards]
    before = [t.clone() for t in inputs]
    result = call(fn, policy, reference, optimizer, ids, mask, rewards, beta, name="reinforce_step",
                  helpers={"sequence_log_probs": course.sequence_log_probs})
    _unchanged(before, inputs, "reinforce_step")
    penalized, log_ratio = _pair(result, "reinforce_step", ("penalized", "log_ratio"))
    for name, value in (("penalized", penalized), ("log_ratio", log_ratio)):
        _tensor(value, f"reinforce_step's {name}", "a (B,) tensor")
        if value.requires_grad:
            raise AssertionError(f"reinforce_step's {name} still carries a gradient: the penalised reward is a number "
                                 "the update is weighted by, not something to differentiate (detach it, or compute "
                                 "it under torch.no_grad()).")
    return {"penalized": penalized, "log_ratio": log_ratio, "after": flat_parameters(policy),
            "reference_moved": not torch.equal(reference_before, flat_parameters(reference)),
            "reference_grads": [name for name, p in reference.named_parameters()
                                if p.grad is not None and p.grad.abs().sum() > 0]}


PENALTY_BETAS = (0.4, 2.5)


@probe
def reinforce_step_penalized_reward(seeds, fn):
    results = []
    for i, beta in enumerate(PENALTY_BETAS):
        policy, reference, ids, mask, rewards, junk = reinforce_problem(seeds.generator(600 + i))
        data = _reinforce_step(fn, policy, reference, ids, mask, rewards, beta, junk)
        results.append({"penalized": data["penalized"], "log_ratio": data["log_ratio"]})
    return results


@probe
def reinforce_step_update(seeds, fn):
    policy, reference, ids, mask, rewards, junk = reinforce_problem(seeds.generator(610))
    return _reinforce_step(fn, policy, reference, ids, mask, rewards, 0.7, junk)


# A one-token bandit with a table policy: the KL-penalised objective E[r] - β KL(π || π_ref) has its optimum at
# π* ∝ π_ref e^{r/β}. 300 Adam steps of the student's reinforce_step on 64 samples each, with the policy's
# probabilities averaged over the last 100 steps. Over 300 seeds a correct step ended within 0.0015 (total
# variation) of π* in the worst case; the test allows 0.02. Steps with no penalty or the penalty's sign flipped
# ended 0.062 or more away (median 0.64).
BANDIT_VOCAB, BANDIT_BETA, BANDIT_STEPS, BANDIT_BATCH, BANDIT_TOLERANCE = 6, 0.5, 300, 64, 0.02


class TablePolicy(nn.Module):
    """logits (B, T, V) from a (T, V) table: position t's next-token distribution, whatever the tokens."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, ids):
        return self.table.expand(ids.shape[0], -1, -1)


def bandit_problem(seeds):
    g = seeds.generator(620)
    reference_logits = torch.randn(2, BANDIT_VOCAB, generator=g, dtype=torch.float64)
    rewards = torch.rand(BANDIT_VOCAB, generator=g, dtype=torch.float64) * 2 - 1
    return reference_logits, rewards


@probe
def reinforce_step_finds_the_optimum(seeds, fn):
    reference_logits, rewards = bandit_problem(seeds)
    policy, reference = TablePolicy(reference_logits), TablePolicy(reference_logits).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    g = seeds.generator(621)
    mask = torch.tensor([[False, True]]).expand(BANDIT_BATCH, 2)
    averaged = torch.zeros(BANDIT_VOCAB, dtype=torch.float64)
    for step in range(BANDIT_STEPS):
        with torch.no_grad():
            actions = torch.multinomial(torch.softmax(policy.table[0], dim=-1), BANDIT_BATCH, replacement=True,
                                        generator=g)
        ids = torch.stack([torch.zeros_like(actions), actions], dim=1)                     # (B, 2): prompt, reply
        call(fn, policy, reference, optimizer, ids, mask, rewards[actions], BANDIT_BETA, name="reinforce_step",
             helpers={"sequence_log_probs": course.sequence_log_probs})
        if step >= BANDIT_STEPS - 100:
            averaged += torch.softmax(policy.table[0].detach(), dim=-1) / 100
    return averaged


# ================================================================ exercise 5: dpo_loss
def dpo_problem(g, batch=6, mirrored=False):
    """Models and a batch of pairs. `mirrored`: the second half is the first half swapped, so that
    margins of both signs are certain."""
    policy, reference = policy_and_reference(g)
    chosen, chosen_mask = episodes(g, batch, 3, 5, DIMS["vocab_size"])
    rejected, rejected_mask = episodes(g, batch, 3, 5, DIMS["vocab_size"])
    rejected[:, :3] = chosen[:, :3]                 # the two replies answer the same prompt
    if mirrored:
        half = batch // 2
        chosen[half:], chosen_mask[half:] = rejected[:half].clone(), rejected_mask[:half].clone()
        rejected[half:], rejected_mask[half:] = chosen[:half].clone(), chosen_mask[:half].clone()
    return policy, reference, (chosen, chosen_mask, rejected, rejected_mask)


def _dpo_loss(fn, policy, reference, batch, beta):
    reference.requires_grad_(True)
    before = [t.clone() for t in batch]
    result = call(fn, policy, reference, *batch, beta, name="dpo_loss",
                  helpers={"sequence_log_probs": course.sequence_log_probs})
    _unchanged(before, batch, "dpo_loss")
    loss, chosen_rewards, rejected_rewards = _pair(result, "dpo_loss", ("loss", "chosen_rewards", "rejected_rewards"))
    _tensor(loss, "dpo_loss's loss", "a scalar tensor (the policy trains by calling .backward() on it)")
    expect_shape(loss, (), "dpo_loss's loss", "Return the mean over the pairs: a scalar.")
    if not loss.requires_grad:
        raise AssertionError(f"dpo_loss's loss cannot train the policy: {NO_GRADIENT}")
    for name, value in (("chosen_rewards", chosen_rewards), ("rejected_rewards", rejected_rewards)):
        _tensor(value, f"dpo_loss's {name}", "a (B,) tensor")
    try:
        loss.backward()
    except RuntimeError as error:
        raise AssertionError(f"dpo_loss: .backward() failed ({error}); {NO_GRADIENT}") from None
    return {"loss": loss, "chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards,
            "gradient": flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in policy.parameters()]),
            "reference_grads": [name for name, p in reference.named_parameters()
                                if p.grad is not None and p.grad.abs().sum() > 0]}


DPO_BETAS = (0.5, 2.0)


@probe
def dpo_loss_values(seeds, fn):
    results = []
    for i, beta in enumerate(DPO_BETAS):
        policy, reference, batch = dpo_problem(seeds.generator(700 + i))
        data = _dpo_loss(fn, policy, reference, batch, beta)
        results.append({key: data[key] for key in ("loss", "chosen_rewards", "rejected_rewards")})
    return results


@probe
def dpo_loss_gradients(seeds, fn):
    policy, reference, batch = dpo_problem(seeds.generator(710))
    data = _dpo_loss(fn, policy, reference, batch, 0.8)
    return {"gradient": data["gradient"], "reference_grads": data["reference_grads"]}


def _dpo_stable_problem(seeds):
    # β of thousands: margins z = β (...) of ±thousands, where σ(z) rounds to 0 even in float64 (below -745)
    return dpo_problem(seeds.generator(720), batch=8, mirrored=True)


DPO_LARGE_BETA = 4000.0


@probe
def dpo_loss_is_stable(seeds, fn):
    policy, reference, batch = _dpo_stable_problem(seeds)
    data = _dpo_loss(fn, policy, reference, batch, DPO_LARGE_BETA)
    return {"loss": data["loss"], "gradient": data["gradient"]}


# ================================================================ stretch: token_returns
def token_problem(g, batch=5, prompt_length=3, reply_length=6):
    _, mask = episodes(g, batch, prompt_length, reply_length, 2)
    log_ratios = torch.randn(batch, prompt_length + reply_length, generator=g, dtype=torch.float64) * mask
    scores = torch.randn(batch, generator=g, dtype=torch.float64) * 2
    return log_ratios, mask, scores


TOKEN_CASES = [(0.3, 1.0), (1.5, 0.9), (0.7, 0.0)]


def _token_returns(fn, log_ratios, mask, scores, beta, gamma):
    before = [log_ratios.clone(), mask.clone(), scores.clone()]
    result = call(fn, log_ratios, mask, scores, beta, gamma, name="token_returns")
    _unchanged(before, [log_ratios, mask, scores], "token_returns")
    return _tensor(result, "token_returns", "a (B, T) tensor")


@probe
def stretch_token_returns_values(seeds, fn):
    return [_token_returns(fn, *token_problem(seeds.generator(800 + i)), beta, gamma)
            for i, (beta, gamma) in enumerate(TOKEN_CASES)]


@probe
def stretch_token_returns_behaviour(seeds, fn):
    log_ratios, mask, scores = token_problem(seeds.generator(810), batch=6)
    return _token_returns(fn, log_ratios, mask, scores, 0.8, 1.0)
