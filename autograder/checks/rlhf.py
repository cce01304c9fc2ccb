"""Hidden checks for 11_rlhf. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs from `seeds` (token ids, masks,
logits, per-token log-probabilities, rewards, the weights of small GPTs of the course's
`courselib.gpt.GPT` class), calls the student's code through `call` under a watch and returns what it
produced: log-probabilities, losses, advantages, the weights after an optimiser step, gradients. What
must run on the student's objects after their function returns (a backward pass through the graph it
built) runs inside the call too (`_Closure`). The judge (autograder/judges/rlhf.py) runs in the grader:
it rebuilds the same inputs from the same seeds and compares with independent oracles (transformers'
`ForCausalLMLoss`, `torch.distributions`, float64 autograd on hand-written losses and loops).

Every exercise is graded on its own: `reinforce_step`, `grpo_loss`, `dpo_loss` and `ppo_epochs` get this module's
reference helpers (`reference_sequence_log_probs`, `reference_rloo_advantages`, `reference_ppo_clip_loss`) in
place of the student's. The course's reference answers live in `courselib.rlhf_reference`, which nothing
here imports and notebook 11's sandbox hides: the watch never resolves it (`_watched`), and the grader
refuses any answer that names it (it is on every list). Every check forbids the per-token log-probabilities the
notebook's cells use (`courselib.rlhf.token_log_probs`) where they would answer the exercise, this module's
helpers, and its exercise's library oracles; a helper handed over is trusted where the student's code calls it
by that name. Stochastic checks state their false-failure rate in a comment.
"""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call, expect_shape, probe
from courselib import rlhf as course
from courselib.gpt import GPT




# The course's reference answers: a module the grading kernel never imports (the sandbox hides it). On every list,
# so that the grader refuses an answer that names it; never handed to the watch (`_watched`), which would import it.
HIDDEN_REFERENCES = ["courselib.rlhf_reference"]
# The per-token log-probabilities that the notebook's cells use: Exercise 1 without its sum.
CELL_LOG_PROBS = ["courselib.rlhf.token_log_probs"]
# This module's own reference helpers, handed to later exercises so that each is graded on its own.
HELPER_REFERENCES = [f"{__name__}.{name}" for name in
                     ("reference_sequence_log_probs", "reference_rloo_advantages", "reference_ppo_clip_loss")]
COURSE_REFERENCES = [*HIDDEN_REFERENCES, *HELPER_REFERENCES]
HF_CAUSAL_LM_LOSS = "transformers.loss.loss_utils.ForCausalLMLoss"

SEQUENCE_SHORTCUTS = [HF_CAUSAL_LM_LOSS, *CELL_LOG_PROBS, *COURSE_REFERENCES]
SFT_SHORTCUTS = [HF_CAUSAL_LM_LOSS, *CELL_LOG_PROBS, *COURSE_REFERENCES]
# No library function computes a Bradley–Terry step, a leave-one-out baseline, a clipped surrogate, PPO's epochs,
# GRPO's or DPO's loss, a best-of-n choice or per-token returns: their oracles are written by hand in the judges,
# and the watch refuses the course's references.
REWARD_SHORTCUTS = COURSE_REFERENCES
# A reward model's oracle is transformers' GPT-2 (the judge's); the watch refuses it in the student's class.
TRANSFORMER_REWARD_SHORTCUTS = ["transformers.models.gpt2.modeling_gpt2.GPT2Model",
                                "transformers.models.gpt2.modeling_gpt2.GPT2ForSequenceClassification",
                                *COURSE_REFERENCES]
KL_SHORTCUTS = ["torch.distributions.kl_divergence", "torch.distributions.kl.kl_divergence", *COURSE_REFERENCES]
BEST_OF_N_SHORTCUTS = COURSE_REFERENCES
RLOO_SHORTCUTS = COURSE_REFERENCES
REINFORCE_SHORTCUTS = COURSE_REFERENCES
PPO_SHORTCUTS = COURSE_REFERENCES
PPO_EPOCHS_SHORTCUTS = COURSE_REFERENCES
GRPO_SHORTCUTS = COURSE_REFERENCES
DPO_SHORTCUTS = COURSE_REFERENCES
RETURNS_SHORTCUTS = COURSE_REFERENCES


def _watched(names):
    """The names the kernel's watch resolves: all but the hidden module (resolving would import it)."""
    return [name for name in names if not any(name == hidden or name.startswith(hidden + ".")
                                              for hidden in HIDDEN_REFERENCES)]


# ---------------------------------------------------------------- reference helpers handed to later exercises
def reference_sequence_log_probs(logits, input_ids, mask=None):
    """Exercise 1, for the exercises that call it (graded on their own)."""
    counted = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask
    return (course.token_log_probs(logits, input_ids) * counted)[:, 1:].sum(dim=1)


def reference_rloo_advantages(rewards, group_size):
    groups = rewards.reshape(-1, group_size)
    return (groups - (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)).reshape(-1)


def reference_ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps=0.2):
    ratio = (log_probs - old_log_probs).exp()
    advantage = advantages.unsqueeze(1)
    smaller = torch.min(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)
    return -smaller[mask].sum() / mask.sum()


ADVICE = "the exercise asks you to write this yourself"


NO_GRADIENT = ("no gradient reaches the inputs: build the result from torch operations on the tensors you were given "
               "(no .item(), .tolist(), .detach() or torch.tensor(...) of Python numbers).")


class _Closure:
    """What must run under the watch, for `call`: the student's function and whatever the probe does with what it
    returned (a backward pass through its graph). It carries the student's globals, so that `call` swaps helpers
    into them."""

    def __init__(self, student, body):
        self.body = body
        if hasattr(student, "__globals__"):
            self.__globals__ = student.__globals__

    def __call__(self):
        return self.body()


def _backward(result, weights=None):
    """Backpropagate from the student's result (under the watch) when it is a plain tensor with a graph: a scalar,
    or (with `weights`) the weighted sum of a result of their shape. Anything else is left to the probe's checks."""
    if type(result) is not torch.Tensor or not result.requires_grad:
        return
    if weights is None and result.dim() == 0:
        result.backward()
    elif weights is not None and result.shape == weights.shape:
        (result * weights).sum().backward()


def _scalar(result, name, what="a scalar tensor (the mean over the batch)"):
    _tensor(result, name, what)
    expect_shape(result, (), name, "Return one number: a 0-dimensional tensor, the mean over the batch.")
    return result


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
    result = call(fn, *args, name="sequence_log_probs", forbidden=_watched(SEQUENCE_SHORTCUTS), forbidden_advice=ADVICE)
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
    weights = torch.randn(3, generator=seeds.generator(311))

    def body():
        result = fn(leaf, ids, mask)
        _backward(result, weights)               # Σ_b w_b log p(y_b): a gradient on every counted position
        return result

    result, gradient = call(_Closure(fn, body), name="sequence_log_probs", forbidden=_watched(SEQUENCE_SHORTCUTS),
                            forbidden_advice=ADVICE, capture=lambda: leaf.grad)
    if not _tensor(result, "sequence_log_probs", "a (B,) tensor").requires_grad or gradient is None:
        raise AssertionError(f"sequence_log_probs: {NO_GRADIENT}")
    return {"confident": confident, "gradient": gradient}


# ================================================================ exercise 2: sft_loss
EOS_ID = course.EOS_ID


def sft_problem(g, batch, prompt_length, max_reply, vocab, scale=2.0):
    """Logits and demonstrations: a prompt (no <|endoftext|> in it), a reply of 1..max_reply tokens whose last is
    <|endoftext|>, then at least two tokens of <|endoftext|> padding. Row 0 has the longest reply, the last row a
    reply that is only its <|endoftext|>."""
    lengths = torch.randint(1, max_reply + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = max_reply, 1
    length = prompt_length + max_reply + 2
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    ids[torch.arange(length) >= prompt_length + lengths[:, None] - 1] = EOS_ID      # the end, then the padding
    logits = torch.randn(batch, length, vocab, generator=g) * scale
    return logits, ids, prompt_length, lengths


SFT_CASES = [(4, 3, 5, 11), (3, 1, 4, 7), (5, 6, 2, 13)]       # (batch, prompt length, longest reply, vocabulary)
SFT_ADVICE = ("write the masked mean yourself (F.cross_entropy with ignore_index is allowed): ForCausalLMLoss is the "
              "oracle the tests compare with, and courselib.rlhf holds the course's answers")


def _sft_loss(fn, logits, ids, prompt_length, lengths, backward=False):
    """The student's loss, and with `backward` the gradient on `logits` (a leaf), both read under the watch."""
    inputs = [logits, ids, lengths]
    before = [t.detach().clone() for t in inputs]

    def body():
        loss = fn(logits, ids, prompt_length, lengths)
        if backward:
            _backward(loss)
        return loss

    loss, gradient = call(_Closure(fn, body), name="sft_loss", forbidden=_watched(SFT_SHORTCUTS), forbidden_advice=SFT_ADVICE,
                          capture=lambda: logits.grad)
    _unchanged(before, [t.detach() for t in inputs], "sft_loss")
    return _scalar(loss, "sft_loss"), gradient


@probe
def sft_loss_values(seeds, fn):
    return [_sft_loss(fn, *sft_problem(seeds.generator(350 + i), *case))[0] for i, case in enumerate(SFT_CASES)]


@probe
def sft_loss_gradients(seeds, fn):
    logits, ids, prompt_length, lengths = sft_problem(seeds.generator(360), 4, 2, 4, 9)
    loss, gradient = _sft_loss(fn, logits.clone().requires_grad_(True), ids, prompt_length, lengths, backward=True)
    if not loss.requires_grad or gradient is None:
        raise AssertionError(f"sft_loss: {NO_GRADIENT}")
    return gradient


# ================================================================ exercise 3: reward_model_step
RM_VOCAB, RM_LR = 15, 0.5


def reward_problem(g, n=12, scale=1.0, dtype=torch.float32, mirrored=False):
    """Weights, a batch of pairs (one of them a tie) and leftover gradients. `mirrored`: the second half of
    the pairs is the first half swapped, so that margins of both signs are certain."""
    weights = (torch.randn(RM_VOCAB, generator=g) * scale).to(dtype)
    chosen, chosen_mask = episodes(g, n, 3, 6, RM_VOCAB)
    rejected, rejected_mask = episodes(g, n, 3, 6, RM_VOCAB)
    rejected[1], rejected_mask[1] = chosen[1], chosen_mask[1]      # one tie: identical replies
    # No other tie: a reply that reorders its rival's tokens has the same bag, a margin of exactly 0 that float32
    # sums in another order to ±1e-5, and its pair would count as won or not by rounding (1 key in 400 did).
    same_bag = (counts(chosen, chosen_mask) == counts(rejected, rejected_mask)).all(dim=1)
    for row in same_bag.nonzero().flatten().tolist():
        if row != 1:
            first = int(rejected_mask[row].nonzero()[0])           # the reply's first token: another one
            rejected[row, first] = (rejected[row, first] + 1) % RM_VOCAB
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
    result, weights_after = call(fn, model, optimizer, *batch, name="reward_model_step", forbidden=_watched(REWARD_SHORTCUTS),
                                 forbidden_advice=ADVICE, capture=lambda: model.token_reward.detach().clone())
    _unchanged(before, batch, "reward_model_step")
    loss, accuracy = _pair(result, "reward_model_step", ("loss", "accuracy"))
    numbers = []
    for name, value in (("loss", loss), ("accuracy", accuracy)):
        try:
            numbers.append(float(value))
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"reward_model_step should return the {name} as a number (e.g. loss.item()), but it "
                                 f"returned {type(value).__name__}.") from None
    return {"loss": numbers[0], "accuracy": numbers[1], "weights": weights_after}


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
        _, weights = call(fn, model, optimizer, *train, name="reward_model_step", forbidden=_watched(REWARD_SHORTCUTS),
                          forbidden_advice=ADVICE, capture=lambda: model.token_reward.detach().clone())
    return weights


def _sequence_kl(fn, policy_logits, reference_logits, mask):
    before = [policy_logits.clone(), reference_logits.clone(), mask.clone()]
    result = call(fn, policy_logits, reference_logits, mask, name="sequence_kl", forbidden=_watched(KL_SHORTCUTS),
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


# ================================================================ exercise 5: rloo_advantages
RLOO_CASES = [(3, 4), (5, 2), (2, 6)]        # (prompts, replies to each)


def rloo_problem(g, prompts, group_size):
    return torch.randn(prompts * group_size, generator=g, dtype=torch.float64) * 2


def _rloo(fn, rewards, group_size):
    before = rewards.clone()
    result = call(fn, rewards, group_size, name="rloo_advantages", forbidden=_watched(RLOO_SHORTCUTS), forbidden_advice=ADVICE)
    _unchanged([before], [rewards], "rloo_advantages")
    return _tensor(result, "rloo_advantages", "a (B,) tensor")


@probe
def rloo_advantages_values(seeds, fn):
    return [_rloo(fn, rloo_problem(seeds.generator(580 + i), *case), case[1]) for i, case in enumerate(RLOO_CASES)]


def rloo_behaviour_problem(seeds):
    g = seeds.generator(590)
    rewards = rloo_problem(g, 3, 4)
    shifts = (torch.randn(3, generator=g, dtype=torch.float64) * 5).repeat_interleave(4)   # one constant per prompt
    equal = torch.full((6,), float(torch.randn(1, generator=g)), dtype=torch.float64)
    return rewards, shifts, equal


@probe
def rloo_advantages_behaviour(seeds, fn):
    rewards, shifts, equal = rloo_behaviour_problem(seeds)
    return {"plain": _rloo(fn, rewards, 4), "shifted": _rloo(fn, rewards + shifts, 4), "equal": _rloo(fn, equal, 3),
            "one group": _rloo(fn, rewards, len(rewards))}


# ================================================================ exercise 6: reinforce_step
RL_LR = 0.1
RL_GROUP = 4                                 # 8 replies: 2 prompts of 4


def reinforce_problem(g, batch=8, prompt_length=3, reply_length=5):
    policy, reference = policy_and_reference(g)
    ids, mask = episodes(g, batch, prompt_length, reply_length, DIMS["vocab_size"])
    rewards = torch.randn(batch, generator=g, dtype=torch.float64) * 2
    junk = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in policy.parameters()]
    return policy, reference, ids, mask, rewards, junk


REINFORCE_HELPERS = {"sequence_log_probs": reference_sequence_log_probs, "rloo_advantages": reference_rloo_advantages}


def _reinforce_step(fn, policy, reference, ids, mask, rewards, beta, junk):
    reference.requires_grad_(True)     # a frozen reference would hide a graph built through it
    for p, j in zip(policy.parameters(), junk):
        p.grad = j.clone()
    optimizer = torch.optim.SGD(policy.parameters(), lr=RL_LR)
    reference_before = flat_parameters(reference)
    inputs = [ids, mask, rewards]
    before = [t.clone() for t in inputs]
    def after():                                  # what the step did to both models, read under the watch
        return {"after": flat_parameters(policy), "reference_after": flat_parameters(reference),
                "reference_grads": [name for name, p in reference.named_parameters()
                                    if p.grad is not None and bool(p.grad.abs().sum() > 0)]}

    result, state = call(fn, policy, reference, optimizer, ids, mask, rewards, beta, RL_GROUP, name="reinforce_step",
                         helpers=REINFORCE_HELPERS, forbidden=_watched(REINFORCE_SHORTCUTS), forbidden_advice=ADVICE,
                         capture=after)
    _unchanged(before, inputs, "reinforce_step")
    penalized, log_ratio = _pair(result, "reinforce_step", ("penalized", "log_ratio"))
    for name, value in (("penalized", penalized), ("log_ratio", log_ratio)):
        _tensor(value, f"reinforce_step's {name}", "a (B,) tensor")
        if value.requires_grad:
            raise AssertionError(f"reinforce_step's {name} still carries a gradient: the penalised reward is a number "
                                 "the update is weighted by, not something to differentiate (detach it, or compute "
                                 "it under torch.no_grad()).")
    return {"penalized": penalized, "log_ratio": log_ratio, "after": state["after"],
            "reference_moved": not torch.equal(reference_before, state["reference_after"]),
            "reference_grads": state["reference_grads"]}


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
# π* ∝ π_ref e^{r/β}. 300 Adam steps of the student's reinforce_step on 64 samples each (RLOO in groups of 8), with
# the policy's probabilities averaged over the last 100 steps. Over 300 seeds a correct step ended within 0.0014
# (total variation) of π* in the worst case; the test allows 0.02. Steps with no penalty or the penalty's sign
# flipped ended 0.099 or more away (100 seeds).
BANDIT_VOCAB, BANDIT_BETA, BANDIT_STEPS, BANDIT_BATCH, BANDIT_TOLERANCE = 6, 0.5, 300, 64, 0.02
BANDIT_GROUP = 8        # one prompt: its 64 samples in groups of 8


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
    table = reference_logits.clone()                          # the policy's logits, as read after each step
    for step in range(BANDIT_STEPS):
        actions = torch.multinomial(torch.softmax(table[0], dim=-1), BANDIT_BATCH, replacement=True, generator=g)
        ids = torch.stack([torch.zeros_like(actions), actions], dim=1)                     # (B, 2): prompt, reply
        _, table = call(fn, policy, reference, optimizer, ids, mask, rewards[actions], BANDIT_BETA, BANDIT_GROUP,
                        name="reinforce_step", helpers=REINFORCE_HELPERS, forbidden=_watched(REINFORCE_SHORTCUTS),
                        forbidden_advice=ADVICE, capture=lambda: policy.table.detach().clone())
        if step >= BANDIT_STEPS - 100:
            averaged += torch.softmax(table[0], dim=-1) / 100
    return averaged


# ================================================================ exercise 7: ppo_clip_loss
def token_problem_for_ppo(g, batch, prompt_length, reply_length, noise=0.3):
    """Per-token log-probabilities of the sampling policy and of the policy being trained (ratios around e^(±noise),
    many outside [1 - ε, 1 + ε]), one advantage per reply, a reply mask. float64."""
    _, mask = episodes(g, batch, prompt_length, reply_length, 2)
    length = prompt_length + reply_length
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3 - 0.5
    log_probs = old + torch.randn(batch, length, generator=g, dtype=torch.float64) * noise
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    return log_probs, old, advantages, mask


PPO_CASES = [(4, 3, 5, 0.2), (3, 2, 6, 0.1), (6, 4, 3, 0.3)]     # (batch, prompt length, reply length, ε)


def _ppo(fn, log_probs, old, advantages, mask, eps, backward=False, then=None, capture=None):
    """The student's loss; with `backward`, its backward pass, then `then()` (an optimiser's step), and `capture()`
    (what the probe reads of it), all under the watch. Returns (loss, captured)."""
    inputs = [log_probs, old, advantages, mask]
    before = [t.detach().clone() for t in inputs]

    def body():
        loss = fn(log_probs, old, advantages, mask, eps)
        if backward:
            _backward(loss)
        if then is not None:
            then()
        return loss

    result = call(_Closure(fn, body), name="ppo_clip_loss", forbidden=_watched(PPO_SHORTCUTS), forbidden_advice=ADVICE,
                  capture=capture)
    loss, captured = result if capture is not None else (result, None)
    _unchanged(before, [t.detach() for t in inputs], "ppo_clip_loss")
    return _scalar(loss, "ppo_clip_loss"), captured


@probe
def ppo_clip_loss_values(seeds, fn):
    results = []
    for i, (batch, prompt_length, reply_length, eps) in enumerate(PPO_CASES):
        results.append(_ppo(fn, *token_problem_for_ppo(seeds.generator(630 + i), batch, prompt_length, reply_length),
                            eps)[0])
    return results


PPO_GRADIENT_EPS = 0.2


@probe
def ppo_clip_loss_gradients(seeds, fn):
    log_probs, old, advantages, mask = token_problem_for_ppo(seeds.generator(640), 6, 2, 5)
    leaf = log_probs.clone().requires_grad_(True)
    loss, gradient = _ppo(fn, leaf, old, advantages, mask, PPO_GRADIENT_EPS, backward=True, capture=lambda: leaf.grad)
    if not loss.requires_grad or gradient is None:
        raise AssertionError(f"ppo_clip_loss: {NO_GRADIENT}")
    return gradient


# Several epochs on one batch: a one-token policy (a table of logits, float64) samples EPOCH_BATCH replies, and
# EPOCHS steps of SGD follow the student's loss on that batch. The judge replays them with its own loss.
EPOCH_VOCAB, EPOCH_BATCH, EPOCHS, EPOCH_LR, EPOCH_EPS = 6, 12, 6, 0.5, 0.2


def epochs_problem(seeds):
    g = seeds.generator(650)
    table = torch.randn(2, EPOCH_VOCAB, generator=g, dtype=torch.float64)
    actions = torch.multinomial(torch.softmax(table[0], dim=-1), EPOCH_BATCH, replacement=True, generator=g)
    ids = torch.stack([torch.zeros_like(actions), actions], dim=1)                       # (B, 2): prompt, reply
    advantages = torch.randn(EPOCH_BATCH, generator=g, dtype=torch.float64)
    mask = torch.tensor([[False, True]]).expand(EPOCH_BATCH, 2)
    return table, ids, advantages, mask


@probe
def ppo_clip_loss_epochs(seeds, fn):
    table, ids, advantages, mask = epochs_problem(seeds)
    policy = TablePolicy(table)
    old = course.token_log_probs(policy(ids), ids).detach()                           # the policy that sampled
    optimizer = torch.optim.SGD(policy.parameters(), lr=EPOCH_LR)
    losses = []
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        log_probs = course.token_log_probs(policy(ids), ids)                          # outside the watch: ours
        loss, (stepped, table) = _ppo(fn, log_probs, old, advantages, mask, EPOCH_EPS, backward=True,
                                      then=optimizer.step,
                                      capture=lambda: (policy.table.grad is not None, policy.table.detach().clone()))
        if not stepped:
            raise AssertionError(f"ppo_clip_loss: {NO_GRADIENT}")
        losses.append(loss.detach())
    return {"table": table, "losses": torch.stack(losses)}


# ================================================================ exercise 8: grpo_loss
def grpo_problem(g, prompts, group_size, prompt_length=2, reply_length=5, equal_group=True):
    """Per-token log-probabilities of the policy, of the sampling policy and of the reference, rewards in groups
    of group_size consecutive rows (with `equal_group`, the first group's rewards all equal), a reply mask."""
    batch = prompts * group_size
    log_probs, old, _, mask = token_problem_for_ppo(g, batch, prompt_length, reply_length)
    reference = old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.3
    rewards = torch.randn(batch, generator=g, dtype=torch.float64) * 2
    if equal_group:
        rewards[:group_size] = rewards[0]
    return log_probs, old, reference, rewards, mask


GRPO_HELPERS = {"ppo_clip_loss": reference_ppo_clip_loss}
GRPO_EPS = 0.2


def _grpo(fn, log_probs, old, reference, rewards, mask, group_size, eps, beta):
    """The loss and its gradient on log_probs, both computed under the watch."""
    leaf = log_probs.detach().clone().requires_grad_(True)
    inputs = [old, reference, rewards, mask]
    before = [t.clone() for t in inputs]

    def body():
        loss = fn(leaf, old, reference, rewards, mask, group_size, eps, beta)
        _backward(loss)
        return loss

    result, gradient = call(_Closure(fn, body), name="grpo_loss", helpers=GRPO_HELPERS, forbidden=_watched(GRPO_SHORTCUTS),
                            forbidden_advice=ADVICE, capture=lambda: leaf.grad)
    _unchanged(before, inputs, "grpo_loss")
    loss = _scalar(result, "grpo_loss")
    if not loss.requires_grad or gradient is None:
        raise AssertionError(f"grpo_loss: {NO_GRADIENT}")
    return {"loss": loss.detach(), "gradient": gradient}


GRPO_ADVANTAGE_CASES = [(3, 4), (2, 3), (4, 2)]     # (prompts, group size)


@probe
def grpo_loss_advantages(seeds, fn):
    """β = 0 and the policy is the one that sampled (ratios 1): the gradient on each reply token is -A / N."""
    results = []
    for i, (prompts, group_size) in enumerate(GRPO_ADVANTAGE_CASES):
        _, old, reference, rewards, mask = grpo_problem(seeds.generator(660 + i), prompts, group_size)
        results.append(_grpo(fn, old, old, reference, rewards, mask, group_size, GRPO_EPS, 0.0)["gradient"])
    return results


GRPO_KL_BETAS = (0.3, 1.7)


def grpo_kl_problem(seeds, i):
    """Every group's rewards equal (all advantages 0): only the KL term is left."""
    log_probs, _, reference, rewards, mask = grpo_problem(seeds.generator(670 + i), 3, 3)
    rewards = rewards.reshape(3, 3)[:, :1].expand(3, 3).reshape(-1).clone()
    return log_probs, reference, rewards, mask


@probe
def grpo_loss_kl(seeds, fn):
    results = []
    for i, beta in enumerate(GRPO_KL_BETAS):
        log_probs, reference, rewards, mask = grpo_kl_problem(seeds, i)
        results.append(_grpo(fn, log_probs, log_probs.clone(), reference, rewards, mask, 3, GRPO_EPS, beta))
    return results


GRPO_VALUE_CASES = [(3, 4, 0.2, 0.1), (2, 5, 0.3, 0.5)]    # (prompts, group size, ε, β)


@probe
def grpo_loss_values(seeds, fn):
    results = []
    for i, (prompts, group_size, eps, beta) in enumerate(GRPO_VALUE_CASES):
        problem = grpo_problem(seeds.generator(680 + i), prompts, group_size)
        results.append(_grpo(fn, *problem, group_size, eps, beta))
    return results


# ================================================================ exercise 9: dpo_loss
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

    def body():
        result = fn(policy, reference, *batch, beta)
        if isinstance(result, (tuple, list)) and len(result) == 3:
            _backward(result[0])                             # the policy's gradient, under the watch
        return result

    def gradients():                              # what the backward pass left on both models, read under the watch
        return {"gradient": flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in policy.parameters()]),
                "reference_grads": [name for name, p in reference.named_parameters()
                                    if p.grad is not None and bool(p.grad.abs().sum() > 0)]}

    result, state = call(_Closure(fn, body), name="dpo_loss", helpers={"sequence_log_probs": reference_sequence_log_probs},
                         forbidden=_watched(DPO_SHORTCUTS), forbidden_advice=ADVICE, capture=gradients)
    _unchanged(before, batch, "dpo_loss")
    loss, chosen_rewards, rejected_rewards = _pair(result, "dpo_loss", ("loss", "chosen_rewards", "rejected_rewards"))
    _tensor(loss, "dpo_loss's loss", "a scalar tensor (the policy trains by calling .backward() on it)")
    expect_shape(loss, (), "dpo_loss's loss", "Return the mean over the pairs: a scalar.")
    if not loss.requires_grad:
        raise AssertionError(f"dpo_loss's loss cannot train the policy: {NO_GRADIENT}")
    for name, value in (("chosen_rewards", chosen_rewards), ("rejected_rewards", rejected_rewards)):
        _tensor(value, f"dpo_loss's {name}", "a (B,) tensor")
    return {"loss": loss, "chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards,
            "gradient": state["gradient"], "reference_grads": state["reference_grads"]}


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
    result = call(fn, log_ratios, mask, scores, beta, gamma, name="token_returns", forbidden=_watched(RETURNS_SHORTCUTS),
                  forbidden_advice=ADVICE)
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


# ================================================================ transformer reward model (TransformerReward)
def reward_episodes(g, batch=6, prompt_length=3, reply_length=5, vocab=DIMS["vocab_size"]):
    """Episodes whose padding (after each reply's last token) holds random tokens, so that a reward read at a padding
    position differs from one read at the reply's last token; row 0's reply runs to the last position."""
    ids, mask = episodes(g, batch, prompt_length, reply_length, vocab)
    return ids, mask


def _transformer_reward(cls, backbone, head_weight):
    """The student's reward model on `backbone`, its head set to `head_weight` (a bias, if any, to 0), in float64."""
    with torch.random.fork_rng(devices=[]):      # the head's initialisation leaves the notebook's random numbers be
        model = call(cls, backbone, name="TransformerReward", forbidden=_watched(TRANSFORMER_REWARD_SHORTCUTS),
                     forbidden_advice=ADVICE)
    if not isinstance(model, nn.Module):
        raise AssertionError("TransformerReward should be a class deriving from nn.Module.")
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear) or head.out_features != 1 or head.in_features != DIMS["d_model"]:
        raise AssertionError(f"TransformerReward needs `self.head = nn.Linear(d_model, 1, bias=False)`, one number from "
                             f"a hidden state of d_model = {DIMS['d_model']} features; it has {head!r}.")
    model.double()
    with torch.no_grad():
        head.weight.copy_(head_weight.reshape(1, -1))
        if head.bias is not None:
            head.bias.zero_()
    return model


def transformer_reward_problem(seeds):
    g = seeds.generator(900)
    backbone = seeded_gpt(g)
    head = torch.randn(DIMS["d_model"], generator=g, dtype=torch.float64)
    ids, mask = reward_episodes(g)
    return backbone, head, ids, mask


@probe
def transformer_reward_values(seeds, cls):
    backbone, head, ids, mask = transformer_reward_problem(seeds)
    model = _transformer_reward(cls, backbone, head).eval()
    before = [ids.clone(), mask.clone()]
    with torch.no_grad():
        rewards = call(model, ids, mask, name="TransformerReward.forward",
                       forbidden=_watched(TRANSFORMER_REWARD_SHORTCUTS), forbidden_advice=ADVICE)
    _unchanged(before, [ids, mask], "TransformerReward.forward")
    return _tensor(rewards, "TransformerReward.forward", "an (N,) tensor")


@probe
def transformer_reward_backbone(seeds, cls):
    backbone, head, ids, mask = transformer_reward_problem(seeds)
    originals = {p.data_ptr() for p in backbone.parameters()}
    backbone_before = flat_parameters(backbone)
    model = _transformer_reward(cls, backbone, head).train()
    weights = torch.randn(len(ids), generator=seeds.generator(901), dtype=torch.float64)

    def body():
        rewards = model(ids, mask)
        _backward(rewards, weights)
        return rewards

    def state():
        named = dict(model.named_parameters())
        return {"shared": sorted(name for name, p in named.items() if p.data_ptr() in originals),
                "head_gradient": model.head.weight.grad is not None and bool(model.head.weight.grad.abs().sum() > 0),
                "trained": sorted(name for name, p in named.items()
                                  if p.grad is not None and bool(p.grad.abs().sum() > 0)),
                "parameters": sum(p.numel() for p in model.parameters())}

    rewards, data = call(_Closure(model, body), name="TransformerReward", forbidden=_watched(TRANSFORMER_REWARD_SHORTCUTS),
                         forbidden_advice=ADVICE, capture=state)
    if not _tensor(rewards, "TransformerReward.forward", "an (N,) tensor").requires_grad:
        raise AssertionError(f"TransformerReward: {NO_GRADIENT}")
    data["backbone_changed"] = not torch.equal(backbone_before, flat_parameters(backbone))
    return data


# ================================================================ best_of_n
BEST_OF_N_CASES = [(3, 4), (2, 5), (4, 2), (3, 1)]          # (prompts, n)


def best_of_n_problem(g, prompts, n, prompt_length=2, reply_length=4):
    ids, mask = episodes(g, prompts * n, prompt_length, reply_length, 13)
    rewards = torch.randperm(prompts * n, generator=g).double() + 0.5 * torch.rand(prompts * n, generator=g,
                                                                                    dtype=torch.float64)   # no ties
    return ids, mask, rewards


@probe
def best_of_n_values(seeds, fn):
    results = []
    for i, (prompts, n) in enumerate(BEST_OF_N_CASES):
        ids, mask, rewards = best_of_n_problem(seeds.generator(920 + i), prompts, n)
        before = [ids.clone(), mask.clone(), rewards.clone()]
        result = call(fn, ids, mask, rewards, n, name="best_of_n", forbidden=_watched(BEST_OF_N_SHORTCUTS),
                      forbidden_advice=ADVICE)
        _unchanged(before, [ids, mask, rewards], "best_of_n")
        chosen_ids, chosen_mask = _pair(result, "best_of_n", ("input_ids", "mask"))
        results.append({"ids": _tensor(chosen_ids, "best_of_n's input_ids"), "mask": _tensor(chosen_mask, "best_of_n's mask")})
    return results


# ================================================================ ppo_epochs
# A small GPT of the course's class (float64) samples nothing here: the batch, its advantages and the loss are the
# check's, the loop is the student's. SGD with a large step, so that the ratios leave [1 - ε, 1 + ε] by the second
# epoch and a loop that recomputes the old log-probs ends elsewhere.
PPO_LOOP_EPOCHS, PPO_LOOP_LR, PPO_LOOP_EPS = 4, 2.0, 0.2
PPO_LOOP_TARGETS = (math.inf, 1e-12)            # no early stop; a stop before the second epoch's step


def ppo_loop_problem(seeds, i):
    g = seeds.generator(940 + i)
    policy = seeded_gpt(g)
    ids, mask = episodes(g, 6, 3, 5, DIMS["vocab_size"])
    advantages = torch.randn(6, generator=g, dtype=torch.float64)
    junk = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in policy.parameters()]
    return policy, ids, mask, advantages, junk


def ppo_loop_loss(log_probs, old_log_probs, advantages, mask, clip_eps=PPO_LOOP_EPS):
    """The check's clipped loss (the judge replays the same with its own code)."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped, clipped = ratio * advantages[:, None], torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages[:, None]
    return -(torch.min(unclipped, clipped) * mask).sum() / mask.sum()


def _ppo_epochs(fn, seeds, i, target_kl):
    policy, ids, mask, advantages, junk = ppo_loop_problem(seeds, i)
    for p, j in zip(policy.parameters(), junk):
        p.grad = j.clone()                                  # left over from elsewhere
    optimizer = torch.optim.SGD(policy.parameters(), lr=PPO_LOOP_LR)
    seen = []                                               # what the loop handed the loss, epoch by epoch

    def loss_fn(log_probs, old_log_probs):
        if type(log_probs) is not torch.Tensor or type(old_log_probs) is not torch.Tensor:
            raise AssertionError("ppo_epochs must call loss_fn(log_probs, old_log_probs) with two (B, T) tensors.")
        seen.append({"old": old_log_probs.detach().clone(), "old_has_graph": bool(old_log_probs.requires_grad),
                     "has_graph": bool(log_probs.requires_grad)})
        return ppo_loop_loss(log_probs, old_log_probs, advantages, mask)

    before = [ids.clone(), mask.clone()]
    taken, after = call(fn, policy, optimizer, ids, mask, loss_fn, PPO_LOOP_EPOCHS, target_kl, name="ppo_epochs",
                        forbidden=_watched(PPO_EPOCHS_SHORTCUTS), forbidden_advice=ADVICE,
                        capture=lambda: flat_parameters(policy))
    _unchanged(before, [ids, mask], "ppo_epochs")
    try:
        taken = int(taken)
    except (TypeError, ValueError):
        raise AssertionError(f"ppo_epochs should return the number of optimiser steps it took (an int), not "
                             f"{type(taken).__name__}.") from None
    return {"taken": taken, "after": after, "calls": len(seen),
            "old": [s["old"] for s in seen], "old_has_graph": any(s["old_has_graph"] for s in seen),
            "has_graph": all(s["has_graph"] for s in seen)}


@probe
def ppo_epochs_update(seeds, fn):
    return _ppo_epochs(fn, seeds, 0, PPO_LOOP_TARGETS[0])


@probe
def ppo_epochs_early_stop(seeds, fn):
    return _ppo_epochs(fn, seeds, 1, PPO_LOOP_TARGETS[1])
