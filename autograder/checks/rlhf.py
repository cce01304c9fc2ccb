"""Hidden checks for 11_rlhf. Each function is one grade cell's hidden part.

Layered as the course's tests are: shape first, then values on seeded random inputs against
independent oracles (`torch.distributions` for log-probabilities and KL, float64 NumPy formulas for
the losses), then behaviour (gradients, numerical stability, training a model with the student's
function). Seeds here are never used by the visible tests.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions import Categorical
from torch.distributions import kl_divergence as torch_kl_divergence

from autograder.checks.common import call, expect_close, expect_shape, generator, to_numpy

KL_SHORTCUTS = ["torch.distributions.kl_divergence", "torch.distributions.kl.kl_divergence"]
NO_GRADIENT = ("the result is not connected to the inputs' gradients: build it from torch operations on "
               "the tensors you were given (no .item(), .tolist(), .detach(), or torch.tensor(...) of Python numbers).")


def _tensor_result(result, name, what="a tensor"):
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return {what}, but it returned {type(result).__name__}.")
    return result


def _unchanged(inputs, copies, name):
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise AssertionError(f"{name} changed one of its input tensors in place (e.g. `x -= ...`); "
                             "compute into a new tensor so the caller's tensors survive.")


def _backward(value, name):
    try:
        value.backward()
    except RuntimeError as error:
        raise AssertionError(f"{name}: .backward() failed ({error}); {NO_GRADIENT}") from None


def _logaddexp0(x):
    """log(1 + e^x) in float64 without overflow: the oracle for -log σ(-x)."""
    return np.logaddexp(0.0, x)


# ================================================================ exercise 1: sequence_log_probs
def oracle_sequence_log_probs(logits, tokens, mask=None):
    """Σ_t m_t log p(tokens_t) from torch.distributions, in float64."""
    token_log_probs = Categorical(logits=logits.detach().double()).log_prob(tokens)   # (B, T)
    if mask is not None:
        token_log_probs = torch.where(mask, token_log_probs, torch.zeros_like(token_log_probs))
    return token_log_probs.sum(dim=-1)


def sequence_problem(seed, batch, length, vocab, scale=1.0):
    """Random logits and tokens with padding at the end of some rows (row 0 full, last row length 1)."""
    g = generator(seed)
    logits = torch.randn(batch, length, vocab, generator=g) * scale
    tokens = torch.randint(vocab, (batch, length), generator=g)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = length, 1
    mask = torch.arange(length) < lengths[:, None]
    return logits, tokens, mask


def sequence_diagnoses(logits, tokens, mask):
    """What buggy versions of sequence_log_probs return, keyed by the misconception."""
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)                  # (B, T)
    raw = logits.double().gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    counted = mask.double()
    shifted = (log_probs[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1) * counted[:, 1:]).sum(-1)
    return {
        "you summed over the padding too: positions where mask is False must add nothing "
        "(multiply by the mask, or zero them with masked_fill).": picked.sum(-1),
        "you summed probabilities, not log-probabilities: use log_softmax, not softmax.":
            (picked.exp() * counted).sum(-1),
        "you summed the tokens' raw logits: normalise them with log_softmax first.": (raw * counted).sum(-1),
        "you averaged over the positions; a sequence's log-probability is their sum (the chain rule).":
            (picked * counted).sum(-1) / counted.sum(-1),
        "you shifted logits and tokens by one position, but these logits are already aligned: "
        "logits[:, t] scores tokens[:, t].": shifted,
        "you used the mask the wrong way round: True means 'this token counts'.": (picked * (1 - counted)).sum(-1),
    }


def _sequence_log_probs(fn, logits, tokens, mask=None):
    args = (logits, tokens) if mask is None else (logits, tokens, mask)
    copies = [a.detach().clone() for a in args]
    result = call(fn, *args, name="sequence_log_probs")
    _unchanged([a.detach() for a in args], copies, "sequence_log_probs")
    return _tensor_result(result, "sequence_log_probs", "a (B,) tensor")


def sequence_log_probs_shapes(fn):
    for seed, (batch, length, vocab), masked in [(9001, (4, 6, 11), False), (9002, (2, 3, 5), True),
                                                  (9003, (7, 1, 2), True)]:
        logits, tokens, mask = sequence_problem(seed, batch, length, vocab)
        result = _sequence_log_probs(fn, logits, tokens, mask if masked else None)
        expect_shape(result, (batch,), f"sequence_log_probs of ({batch}, {length}, {vocab}) logits",
                     "One log-probability per sequence: sum over the positions (dim 1) and keep the batch.")


def sequence_log_probs_values(fn):
    for seed, (batch, length, vocab) in [(9101, (5, 7, 13)), (9102, (3, 4, 50))]:
        logits, tokens, mask = sequence_problem(seed, batch, length, vocab, scale=2.0)
        expect_close(_sequence_log_probs(fn, logits, tokens, mask), oracle_sequence_log_probs(logits, tokens, mask),
                     f"sequence_log_probs of a ({batch}, {length}, {vocab}) batch with padding",
                     "Take log_softmax over the vocabulary, pick each token's entry, sum where mask is True.",
                     diagnoses=sequence_diagnoses(logits, tokens, mask))
    logits, tokens, mask = sequence_problem(9103, 3, 5, 6)
    expect_close(_sequence_log_probs(fn, logits, tokens), oracle_sequence_log_probs(logits, tokens),
                 "sequence_log_probs with mask=None", "Without a mask, every position counts.",
                 diagnoses=sequence_diagnoses(logits, tokens, torch.ones_like(mask)))


def sequence_log_probs_masks_and_gradients(fn):
    # Confident float32 logits: the chosen tokens have probabilities like e^-300, which softmax rounds to 0.
    g = generator(9201)
    logits = torch.randn(3, 4, 6, generator=g) * 80
    tokens = logits.argmin(dim=-1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1, 2:] = False
    result = _sequence_log_probs(fn, logits, tokens, mask)
    if not np.all(np.isfinite(to_numpy(result, "sequence_log_probs"))):
        raise AssertionError("sequence_log_probs returned -inf or NaN for confident logits: the probability of an "
                             "unlikely token rounds to 0 in float32, and log(0) = -inf. Use torch.log_softmax, "
                             "which computes logits - logsumexp(logits) without forming the tiny probability.")
    expect_close(result, oracle_sequence_log_probs(logits, tokens, mask), "sequence_log_probs for confident logits",
                 rtol=1e-5, atol=1e-3)

    # Gradients: d/dlogits of Σ_t m_t log softmax(logits_t)[y_t] is m_t (onehot(y_t) - softmax(logits_t)).
    logits, tokens, mask = sequence_problem(9202, 3, 5, 7)
    leaf = logits.clone().requires_grad_(True)
    result = _sequence_log_probs(fn, leaf, tokens, mask)
    if not result.requires_grad:
        raise AssertionError(f"sequence_log_probs: no gradient can reach the logits; {NO_GRADIENT}")
    weights = torch.randn(3, generator=generator(9203))
    _backward((result * weights).sum(), "sequence_log_probs")
    if leaf.grad is None:
        raise AssertionError(f"sequence_log_probs: no gradient reached the logits; {NO_GRADIENT}")
    per_position = (F.one_hot(tokens, 7).double() - torch.softmax(logits.double(), dim=-1)) * weights.double()[:, None, None]
    expect_close(leaf.grad, per_position * mask[..., None], "the gradient of sequence_log_probs with respect to the logits",
                 diagnoses={"padding positions received a gradient: masked positions must not contribute at all.":
                            per_position})


def sequence_log_probs_trains_a_model(fn):
    """Maximum likelihood through the student's function must recover the data's word frequencies."""
    g = generator(9301)
    batch, length, vocab = 400, 5, 6
    true_probs = torch.softmax(torch.randn(length, vocab, generator=g) * 1.5, dim=-1)
    tokens = torch.multinomial(true_probs.repeat(batch, 1), 1, generator=g).view(batch, length)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = torch.arange(length) < lengths[:, None]
    tokens = tokens.masked_fill(~mask, 0)  # padded with id 0, which is also a real word
    table = torch.zeros(length, vocab, requires_grad=True)
    optimizer = torch.optim.Adam([table], lr=0.1)
    for _ in range(150):
        log_likelihood = _tensor_result(call(fn, table.expand(batch, length, vocab), tokens, mask,
                                             name="sequence_log_probs"), "sequence_log_probs")
        if not log_likelihood.requires_grad:
            raise AssertionError(f"sequence_log_probs cannot train a model: {NO_GRADIENT}")
        loss = -log_likelihood.mean()
        optimizer.zero_grad()
        _backward(loss, "sequence_log_probs")
        optimizer.step()
    one_hot = F.one_hot(tokens, vocab).double()
    counted = one_hot * mask[..., None]
    empirical = counted.sum(0) / counted.sum(dim=(0, 2))[:, None]
    with_padding = one_hot.mean(0)
    expect_close(torch.softmax(table.detach(), dim=-1), empirical,
                 "the next-word probabilities learned by maximising your sequence_log_probs on hidden data",
                 "Maximum likelihood should recover how often each word appears at each position.",
                 diagnoses={"the model learned to predict the padding: masked positions must add nothing to the "
                            "log-likelihood, so they give no gradient.": with_padding},
                 rtol=0.0, atol=0.02)


# ================================================================ exercise 2: preference_loss
def reference_preference_loss(r_chosen, r_rejected):
    """Handed to the student's dpo_loss in place of their own preference_loss (see common.call)."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def oracle_preference_loss(r_chosen, r_rejected):
    margin = (r_chosen.detach().double() - r_rejected.detach().double()).numpy()
    return _logaddexp0(-margin).mean()


def preference_diagnoses(r_chosen, r_rejected):
    margin = (r_chosen.double() - r_rejected.double()).numpy()
    sigmoid = 1 / (1 + np.exp(-margin))
    return {
        "the sign is reversed: -log σ(r_rejected - r_chosen) is small when the REJECTED reply has the higher "
        "reward. The loss is -log σ(r_chosen - r_rejected).": _logaddexp0(margin).mean(),
        "you returned log σ(r_chosen - r_rejected), the log-likelihood; the loss to minimise is its negative.":
            -_logaddexp0(-margin).mean(),
        "you summed over the pairs; take the mean, so the loss doesn't grow with the batch.":
            _logaddexp0(-margin).sum(),
        "you used σ without the log: the Bradley–Terry loss is -log σ(r_chosen - r_rejected).": -sigmoid.mean(),
        "you used 1 - σ without the log: the Bradley–Terry loss is -log σ(r_chosen - r_rejected).": (1 - sigmoid).mean(),
    }


def _preference_loss(fn, r_chosen, r_rejected):
    copies = [r_chosen.detach().clone(), r_rejected.detach().clone()]
    result = call(fn, r_chosen, r_rejected, name="preference_loss")
    _unchanged([r_chosen.detach(), r_rejected.detach()], copies, "preference_loss")
    _tensor_result(result, "preference_loss", "a scalar tensor (the reward model trains by calling .backward() on it)")
    expect_shape(result, (), "preference_loss(r_chosen, r_rejected)", "Return the mean over the pairs: a scalar.")
    return result


def preference_loss_values(fn):
    g = generator(9401)
    problems = [(torch.randn(n, generator=g) * 2, torch.randn(n, generator=g) * 2) for n in (9, 1, 32)]
    results = [float(_preference_loss(fn, *problem)) for problem in problems]
    expected = [oracle_preference_loss(*problem) for problem in problems]
    if np.ptp(results) < 1e-9 and np.ptp(expected) > 1e-3:
        raise AssertionError(f"preference_loss returned {results[0]:.6g} for three different batches of rewards: it "
                             "must be computed from r_chosen and r_rejected (a constant only fits the visible test).")
    for (r_chosen, r_rejected), result in zip(problems, results):
        expect_close(result, oracle_preference_loss(r_chosen, r_rejected), f"preference_loss of {len(r_chosen)} pairs",
                     "-log σ(r_chosen - r_rejected), averaged over the pairs.",
                     diagnoses=preference_diagnoses(r_chosen, r_rejected))
    r_chosen, r_rejected = (torch.randn(5, generator=g, dtype=torch.float64) for _ in range(2))
    expect_close(_preference_loss(fn, r_chosen, r_rejected), oracle_preference_loss(r_chosen, r_rejected),
                 "preference_loss of float64 rewards", diagnoses=preference_diagnoses(r_chosen, r_rejected))


def preference_loss_is_stable(fn):
    for dtype, margins in [(torch.float32, [-1000.0, -150.0, -95.0, -20.0, 0.0, 20.0, 95.0, 150.0, 1000.0]),
                           (torch.float64, [-5000.0, -800.0, -3.0, 800.0, 5000.0])]:
        margin = torch.tensor(margins, dtype=dtype)
        r_chosen = (margin + 7.0).requires_grad_(True)
        r_rejected = torch.full_like(margin, 7.0)
        loss = _preference_loss(fn, r_chosen, r_rejected)
        worst = min(margins)
        if not np.isfinite(float(loss.detach())):
            raise AssertionError(f"preference_loss is inf or NaN for a margin of {worst:g} in {dtype}: σ({worst:g}) "
                                 "rounds to 0 and log(0) = -inf. Use F.logsigmoid(x) (or -F.softplus(-x)), which "
                                 "never forms σ(x).")
        expect_close(loss, oracle_preference_loss(r_chosen, r_rejected),
                     f"preference_loss for margins from {worst:g} to {max(margins):g} ({dtype})", rtol=1e-5, atol=1e-4)
        if not loss.requires_grad:
            raise AssertionError(f"preference_loss: {NO_GRADIENT}")
        _backward(loss, "preference_loss")
        expected_grad = -torch.sigmoid(-margin.double()) / len(margins)
        expect_close(r_chosen.grad, expected_grad, f"the gradient of preference_loss with respect to r_chosen ({dtype})",
                     "d/dr_chosen of -log σ(m) is -σ(-m) / N: about -1/N when the chosen reply is far behind. "
                     "log(sigmoid(x)) has a NaN or 0 gradient there; F.logsigmoid does not.")


def synthetic_comparisons(seed, n_train, n_test, n_words=12, noise=0.5):
    """Replies as word counts, a hidden linear taste and Bradley–Terry annotators."""
    g = generator(seed)
    word_value = torch.randn(n_words, generator=g)

    def pairs(n):
        a = torch.randint(0, 3, (n, n_words), generator=g).float()
        b = torch.randint(0, 3, (n, n_words), generator=g).float()
        a_wins = (torch.rand(n, generator=g) < torch.sigmoid((a - b) @ word_value / noise))[:, None]
        return torch.where(a_wins, a, b), torch.where(a_wins, b, a)

    return pairs(n_train), pairs(n_test)


REWARD_MODEL_ACCURACY = 0.90  # a correct loss reaches about 94%; the noisy annotators agree with the true taste on about 95%


def reward_model_accuracy(fn):
    """A linear reward model trained with the student's loss on hidden comparisons, scored on held-out pairs."""
    (train_chosen, train_rejected), (test_chosen, test_rejected) = synthetic_comparisons(9501, 600, 3000)
    weights = torch.zeros(train_chosen.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weights], lr=0.05)
    for _ in range(200):
        loss = _tensor_result(call(fn, train_chosen @ weights, train_rejected @ weights, name="preference_loss"),
                              "preference_loss", "a scalar tensor")
        if not loss.requires_grad:
            raise AssertionError(f"preference_loss cannot train a reward model: {NO_GRADIENT}")
        optimizer.zero_grad()
        _backward(loss, "preference_loss")
        optimizer.step()
    with torch.no_grad():
        accuracy = ((test_chosen - test_rejected) @ weights > 0).float().mean().item()
    if accuracy < 0.5:
        raise AssertionError(f"a reward model trained with your preference_loss on hidden comparisons ranks the "
                             f"rejected reply higher on {1 - accuracy:.0%} of held-out pairs: your loss pushes the "
                             "rewards the wrong way (a sign error).")
    if accuracy < REWARD_MODEL_ACCURACY:
        raise AssertionError(f"a reward model trained with your preference_loss on hidden comparisons reached only "
                             f"{accuracy:.1%} held-out pair accuracy (at least {REWARD_MODEL_ACCURACY:.0%} expected). "
                             "Is the loss -log σ(r_chosen - r_rejected), with a gradient?")


# ================================================================ exercise 3: kl_divergence
def oracle_kl(logits_p, logits_q):
    return torch_kl_divergence(Categorical(logits=logits_p.double()), Categorical(logits=logits_q.double()))


def kl_diagnoses(logits_p, logits_q):
    p64, q64 = logits_p.double(), logits_q.double()
    log_p, log_q = torch.log_softmax(p64, dim=-1), torch.log_softmax(q64, dim=-1)
    p, q = log_p.exp(), log_q.exp()
    return {
        "your arguments are swapped: this is KL(q || p). KL(p || q) averages log p - log q under p, the FIRST "
        "argument.": (q * (log_q - log_p)).sum(-1),
        "you used softmax where log_softmax belongs: Σ p (p - q) is not the KL, which compares log-probabilities.":
            (p * (p - q)).sum(-1),
        "you used the raw logits as log-probabilities: normalise them with log_softmax first.": (p * (p64 - q64)).sum(-1),
        "you averaged over the vocabulary; the KL sums over it.": (p * (log_p - log_q)).mean(-1),
        "you forgot to weight by p: KL(p || q) = Σ p (log p - log q).": (log_p - log_q).sum(-1),
        "you computed the cross-entropy -Σ p log q; the KL also subtracts p's entropy: Σ p (log p - log q).":
            -(p * log_q).sum(-1),
    }


def _kl(fn, logits_p, logits_q):
    copies = [logits_p.clone(), logits_q.clone()]
    result = call(fn, logits_p, logits_q, name="kl_divergence", forbidden=KL_SHORTCUTS,
                  forbidden_advice="write Σ p (log p - log q) yourself: torch.distributions.kl_divergence is "
                                   "the oracle the tests compare with.")
    _unchanged([logits_p, logits_q], copies, "kl_divergence")
    return _tensor_result(result, "kl_divergence")


def kl_divergence_values(fn):
    g = generator(9601)
    for shape in [(3, 5, 7), (2, 9), (4, 2, 3, 5)]:
        logits_p, logits_q = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
        result = _kl(fn, logits_p, logits_q)
        hint = "One KL per position: sum over the last dimension (the vocabulary) only."
        if tuple(result.shape) == shape:
            hint = "You kept the vocabulary dimension: sum p (log p - log q) over it."
        expect_shape(result, shape[:-1], f"kl_divergence of {shape} logits", hint)
    for seed, shape, scale in [(9602, (4, 6, 10), 2.0), (9603, (5, 3), 0.5)]:
        g = generator(seed)
        logits_p, logits_q = torch.randn(*shape, generator=g) * scale, torch.randn(*shape, generator=g) * scale
        expect_close(_kl(fn, logits_p, logits_q), oracle_kl(logits_p, logits_q), f"kl_divergence of {shape} logits",
                     "KL(p || q) = Σ_v p_v (log p_v - log q_v) with log p = log_softmax(logits_p).",
                     diagnoses=kl_diagnoses(logits_p, logits_q))


def kl_divergence_properties(fn):
    g = generator(9611)
    logits_p, logits_q = torch.randn(5, 8, generator=g) * 2, torch.randn(5, 8, generator=g) * 2
    expect_close(_kl(fn, logits_p, logits_p), torch.zeros(5), "KL(p || p)", "A distribution is at KL 0 from itself.")
    shift = torch.randn(5, 1, generator=g) * 10
    expect_close(_kl(fn, logits_p, logits_q + shift), oracle_kl(logits_p, logits_q),
                 "KL(p || q) after adding a constant to each position's logits of q",
                 "Adding a constant to all logits doesn't change the softmax: normalise with log_softmax.",
                 diagnoses=kl_diagnoses(logits_p, logits_q + shift))
    many_p, many_q = torch.randn(200, 6, generator=g) * 3, torch.randn(200, 6, generator=g) * 3
    if to_numpy(_kl(fn, many_p, many_q), "kl_divergence").min() < -1e-5:
        raise AssertionError("kl_divergence returned a negative value; a KL divergence is never negative. "
                             "Did you weight by q instead of p, or leave out the normalisation?")
    # Confident float32 logits: many probabilities round to 0, and 0 · log 0 must count as 0.
    sharp_p, sharp_q = torch.randn(4, 3, 10, generator=g) * 60, torch.randn(4, 3, 10, generator=g) * 60
    result = _kl(fn, sharp_p, sharp_q)
    if not np.all(np.isfinite(to_numpy(result, "kl_divergence"))):
        raise AssertionError("kl_divergence is inf or NaN for confident logits: softmax rounds small probabilities to "
                             "0 in float32, log(0) = -inf, and 0 · -inf is NaN. Compute log p and log q with "
                             "log_softmax, and p as log_p.exp().")
    expect_close(result, oracle_kl(sharp_p, sharp_q), "kl_divergence for confident logits", rtol=1e-4, atol=1e-3)


# ================================================================ exercise 4: kl_penalized_reward
def oracle_penalized_reward(reward, logp_policy, logp_ref, beta):
    return reward.double().numpy() - float(beta) * (logp_policy.double().numpy() - logp_ref.double().numpy())


def penalized_diagnoses(reward, logp_policy, logp_ref, beta):
    r, lp, lr = (t.double().numpy() for t in (reward, logp_policy, logp_ref))
    return {
        "β multiplies the reward instead of the KL term: it must be reward - β (log π - log π_ref).":
            beta * r - (lp - lr),
        "the penalty has the wrong sign: a reply likelier under the policy than under the reference must pay, "
        "reward - β (log π - log π_ref).": r + beta * (lp - lr),
        "β multiplies only log π; it must multiply the whole difference, reward - β (log π - log π_ref).":
            r - beta * lp + lr,
        "β multiplies only log π_ref; it must multiply the whole difference, reward - β (log π - log π_ref).":
            r - lp + beta * lr,
        "β is missing: reward - β (log π - log π_ref).": r - (lp - lr),
        "you divided by β; the penalty is β times the log-ratio.": r - (lp - lr) / beta,
    }


def _penalized(fn, reward, logp_policy, logp_ref, beta):
    copies = [reward.clone(), logp_policy.clone(), logp_ref.clone()]
    result = call(fn, reward, logp_policy, logp_ref, beta, name="kl_penalized_reward")
    _unchanged([reward, logp_policy, logp_ref], copies, "kl_penalized_reward")
    return _tensor_result(result, "kl_penalized_reward")


def penalized_problem(seed, shape, dtype=torch.float32):
    g = generator(seed)
    reward = torch.randn(*shape, generator=g, dtype=dtype) * 3
    logp_ref = -torch.rand(*shape, generator=g, dtype=dtype) * 20
    logp_policy = logp_ref + torch.randn(*shape, generator=g, dtype=dtype) * 2
    return reward, logp_policy, logp_ref


def kl_penalized_reward_values(fn):
    for seed, shape, beta, dtype in [(9701, (6,), 0.3, torch.float32), (9702, (3, 4), 2.5, torch.float32),
                                     (9703, (5,), 0.05, torch.float64)]:
        reward, logp_policy, logp_ref = penalized_problem(seed, shape, dtype)
        result = _penalized(fn, reward, logp_policy, logp_ref, beta)
        expect_shape(result, shape, f"kl_penalized_reward of {shape} tensors", "The penalty applies elementwise.")
        expect_close(result, oracle_penalized_reward(reward, logp_policy, logp_ref, beta),
                     f"kl_penalized_reward with β = {beta}", "reward - β (log π - log π_ref).",
                     diagnoses=penalized_diagnoses(reward, logp_policy, logp_ref, beta))


def kl_penalized_reward_behaviour(fn):
    reward, logp_policy, logp_ref = penalized_problem(9711, (8,))
    expect_close(_penalized(fn, reward, logp_policy, logp_ref, 0.0), reward, "kl_penalized_reward with β = 0",
                 "With β = 0 there is no penalty: the reward comes back unchanged.")
    expect_close(_penalized(fn, reward, logp_ref.clone(), logp_ref, 3.7), reward,
                 "kl_penalized_reward when log π = log π_ref", "Equal log-probs mean no penalty, whatever β.")
    one = to_numpy(_penalized(fn, reward, logp_policy, logp_ref, 1.0), "kl_penalized_reward")
    three = to_numpy(_penalized(fn, reward, logp_policy, logp_ref, 3.0), "kl_penalized_reward")
    expect_close(three - one, -2.0 * (logp_policy - logp_ref).double(),
                 "the change of the penalised reward from β = 1 to β = 3",
                 "The penalty grows linearly with β: raising β by 2 subtracts 2 (log π - log π_ref) more.")
    per_token = penalized_problem(9712, (4, 6))
    expect_close(_penalized(fn, *per_token, 0.2), oracle_penalized_reward(*per_token, 0.2),
                 "kl_penalized_reward of per-token (4, 6) tensors", "The penalty applies elementwise, at any shape.")


# ================================================================ exercise 5: dpo_loss
def dpo_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    pc, pr, rc, rr = (t.detach().double().numpy() for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected))
    return float(beta) * ((pc - rc) - (pr - rr))


def oracle_dpo_loss(*args):
    return _logaddexp0(-dpo_margin(*args)).mean()


def dpo_diagnoses(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    pc, pr, rc, rr = (t.detach().double().numpy() for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected))
    z = beta * ((pc - rc) - (pr - rr))
    return {
        "chosen and rejected are swapped (a sign error): the loss must fall as the chosen reply's log-ratio rises, "
        "-log σ(β [(log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))]).": _logaddexp0(z).mean(),
        "β multiplies only the policy's log-probs; it multiplies both log-ratios, reference included.":
            _logaddexp0(-(beta * (pc - pr) - (rc - rr))).mean(),
        "β multiplies only the reference's log-probs; it multiplies both log-ratios, policy included.":
            _logaddexp0(-((pc - pr) - beta * (rc - rr))).mean(),
        "β is outside the log-sigmoid: the loss is -log σ(β · margin), not -β log σ(margin).":
            (beta * _logaddexp0(-(z / beta))).mean(),
        "the reference log-probs are added; each implicit reward is β (log π - log π_ref).":
            _logaddexp0(-beta * ((pc + rc) - (pr + rr))).mean(),
        "the reference model is missing: the implicit reward is β log(π / π_ref), not β log π.":
            _logaddexp0(-beta * (pc - pr)).mean(),
        "you summed over the pairs; take the mean.": _logaddexp0(-z).sum(),
        "you returned log σ(...), the log-likelihood; the loss is its negative.": -_logaddexp0(-z).mean(),
    }


def _dpo(fn, *args):
    copies = [a.detach().clone() for a in args[:4]]
    result = call(fn, *args, name="dpo_loss", helpers={"preference_loss": reference_preference_loss})
    _unchanged([a.detach() for a in args[:4]], copies, "dpo_loss")
    _tensor_result(result, "dpo_loss", "a scalar tensor (the policy trains by calling .backward() on it)")
    expect_shape(result, (), "dpo_loss(...)", "Return the mean over the pairs: a scalar.")
    return result


def dpo_problem(seed, batch, dtype=torch.float32, spread=3.0):
    g = generator(seed)
    ref_chosen = -5 - torch.rand(batch, generator=g, dtype=dtype) * 25
    ref_rejected = -5 - torch.rand(batch, generator=g, dtype=dtype) * 25
    policy_chosen = ref_chosen + torch.randn(batch, generator=g, dtype=dtype) * spread
    policy_rejected = ref_rejected + torch.randn(batch, generator=g, dtype=dtype) * spread
    return policy_chosen, policy_rejected, ref_chosen, ref_rejected


def dpo_loss_values(fn):
    problems = [(dpo_problem(9801, 8), 0.1), (dpo_problem(9802, 1), 0.5), (dpo_problem(9803, 16), 2.0),
                (dpo_problem(9804, 5, torch.float64), 0.3)]
    results = [float(_dpo(fn, *logps, beta)) for logps, beta in problems]
    expected = [oracle_dpo_loss(*logps, beta) for logps, beta in problems]
    if np.ptp(results) < 1e-9 and np.ptp(expected) > 1e-3:
        raise AssertionError(f"dpo_loss returned {results[0]:.6g} for four different batches: it must be computed "
                             "from its arguments (a constant only fits the visible test).")
    for (logps, beta), result in zip(problems, results):
        expect_close(result, oracle_dpo_loss(*logps, beta), f"dpo_loss of {len(logps[0])} pairs with β = {beta}",
                     "-log σ(β [(log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))]), averaged.",
                     diagnoses=dpo_diagnoses(*logps, beta))


def dpo_loss_behaviour(fn):
    policy_chosen, policy_rejected, ref_chosen, ref_rejected = dpo_problem(9811, 6)
    expect_close(_dpo(fn, ref_chosen.clone(), ref_rejected.clone(), ref_chosen, ref_rejected, 0.7), np.log(2),
                 "dpo_loss when the policy equals the reference", "Both log-ratios are 0: the loss is log 2.")
    expect_close(_dpo(fn, policy_chosen, policy_rejected, ref_chosen, ref_rejected, 0.0), np.log(2),
                 "dpo_loss with β = 0", "β scales both implicit rewards, so with β = 0 the loss is log 2.",
                 diagnoses=dpo_diagnoses(policy_chosen, policy_rejected, ref_chosen, ref_rejected, 1e-12))
    beta = 0.4
    chosen, rejected = policy_chosen.clone().requires_grad_(True), policy_rejected.clone().requires_grad_(True)
    loss = _dpo(fn, chosen, rejected, ref_chosen, ref_rejected, beta)
    if not loss.requires_grad:
        raise AssertionError(f"dpo_loss: {NO_GRADIENT}")
    _backward(loss, "dpo_loss")
    z = torch.from_numpy(dpo_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta))
    weight = beta * torch.sigmoid(-z) / len(z)
    expect_close(chosen.grad, -weight, "the gradient of dpo_loss with respect to the chosen log-probs",
                 "Raising log π(y_w) must lower the loss, by β σ(-z) / N per pair.",
                 diagnoses={"the gradient has the wrong sign: raising the chosen replies' log-probs must LOWER "
                            "the loss.": weight})
    expect_close(rejected.grad, weight, "the gradient of dpo_loss with respect to the rejected log-probs",
                 "Raising log π(y_l) must raise the loss, by β σ(-z) / N per pair.")


def dpo_loss_is_stable(fn):
    for dtype, scale in [(torch.float32, 300.0), (torch.float64, 3000.0)]:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected = dpo_problem(9821, 6, dtype, spread=scale)
        chosen = policy_chosen.clone().requires_grad_(True)
        loss = _dpo(fn, chosen, policy_rejected, ref_chosen, ref_rejected, 1.0)
        margins = dpo_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected, 1.0)
        if not np.isfinite(float(loss.detach())):
            raise AssertionError(f"dpo_loss is inf or NaN for margins as large as ±{np.abs(margins).max():.0f} "
                                 f"({dtype}): σ of a large negative number rounds to 0 and log(0) = -inf. "
                                 "Use F.logsigmoid (or your stable preference_loss).")
        expect_close(loss, oracle_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, 1.0),
                     f"dpo_loss for large margins ({dtype})", rtol=1e-5, atol=1e-3)
        _backward(loss, "dpo_loss")
        expected_grad = -torch.sigmoid(-torch.from_numpy(margins)) / len(margins)
        expect_close(chosen.grad, expected_grad, f"the gradient of dpo_loss for large margins ({dtype})",
                     "log(sigmoid(x)) has a NaN or zero gradient for large |x|; F.logsigmoid does not.")
