"""RLHF on the course's small GPT (notebook 11): the task, the annotators, the data, a crude reward model.

The policy starts as the pre-trained GPT of notebook 09 (`courselib.gpt.load_tiny_gpt`), a storyteller. Its
task is the next sentence of a story, at a point where the story can go well or badly, asked in a chat
template:

    User:<the last PROMPT_TOKENS tokens of a story>
    Assistant: <one sentence><|endoftext|>

    prompts = chat_prompts(tokenizer, 200, seed=1)                 # templated, (200, 28) token ids
    ids, mask = sample_episodes(policy, prompts.ids, generator)    # prompt + reply, mask on the reply
    scores = true_scores(tokenizer, ids, mask, prompts.kinds)     # what the (simulated) annotators think

- **Prompts** come from `courselib.gpt.corpus` (stories of other seeds than the model's training corpus),
  cut just before the sentence that decides three kinds of story: a cake that bakes or burns, a lost toy
  that is found or stays lost, two children who share or fight. The story part of a prompt is the last
  `PROMPT_TOKENS` tokens before that sentence: the model was trained on windows cut anywhere in its token
  stream, so a prompt that starts mid-story is what it knows, and equal lengths let a batch be sampled at
  once (the course's GPT has no padding mask). `chat_prompts` wraps them in the template's tokens
  (`USER`, `ASSISTANT`), which the pre-trained model has never seen together: supervised fine-tuning on
  `demonstrations` (the stories' own next sentences, each followed by <|endoftext|>) teaches it the format.
- **An episode** is the reply: the sampled tokens up to and including the first <|endoftext|>, at most
  `MAX_NEW_TOKENS`. `response_mask` marks them. A batch is sampled until every reply has ended, and padded
  with <|endoftext|> after each end (GPT-2's tokenizer has no other padding token).
- **The annotators' taste** (`true_score`) is hidden from the reward model and the policy: a reply that
  turns the story well scores +1, badly −1, and anything that is not one proper next sentence of this story
  that then stops −2. `collect_preferences` asks them to compare two replies with Bradley–Terry noise.
- **The reward model** `BagOfWordsReward` learns one number per token and adds them up over the reply.

`token_log_probs` gives the per-token log-probabilities that PPO and GRPO work with, `hidden_states` a GPT's
last hidden states (for a reward model on its backbone). The RL, DPO and best-of-n runs of the notebook's
comparison, over seeds (`Comparison`), take the learner's own functions as arguments. The course's reference
answers to the exercises are in `courselib.rlhf_reference`, which notebook 11's grading kernel cannot import.
"""
import copy
import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from courselib.gpt import corpus

PROMPT_TOKENS = 16        # the story part of every prompt is this long, so a batch of prompts is one tensor
MAX_NEW_TOKENS = 20       # the longest proper reply is 18 tokens with its <|endoftext|>
EOS_ID = 0                # <|endoftext|>: ends a reply, and pads a batch after it (the tokenizer's only special token)
USER, ASSISTANT = "User:", "\nAssistant:"   # the chat template: USER + story + ASSISTANT, then the reply
GOOD, BAD, BROKEN = 1.0, -1.0, -2.0

# The sentence before the turn, and the replies that turn each kind of story well or badly. A name is any
# capitalised word and a place or a thing any lower-case words, so that the regexes don't copy the corpus's lists.
_WORDS = r"[a-z]+(?: [a-z]+)*"
KINDS = {
    "baking": (r"mixed it with a spoon\.",
               rf"Then they put it in the oven and waited\.",
               rf"But they forgot it in the oven, and it burned\."),
    "lost toy": (r"came to help\.",
                 rf'[A-Z][a-z]+ looked {_WORDS} and said, "Here it is!"',
                 rf"They looked {_WORDS} too, but the {_WORDS} was gone\."),
    "sharing": (rf"wanted the {_WORDS} too\.",
                r"They did not fight\.",
                rf"They pulled and pulled, and the {_WORDS} broke\."),
}


# ----------------------------------------------------------------------------------------------- the task
@dataclasses.dataclass
class Prompts:
    ids: torch.Tensor      # (N, PROMPT_TOKENS) token ids
    kinds: list            # N kinds of story: "baking", "lost toy" or "sharing"
    continuations: list    # N strings: how the story really went on (its next sentence, with its leading space)

    def __len__(self):
        return len(self.kinds)

    def __getitem__(self, index):
        """Prompts at `index` (an int tensor or a list of positions)."""
        index = torch.as_tensor(index).reshape(-1)
        return Prompts(self.ids[index], [self.kinds[i] for i in index.tolist()],
                       [self.continuations[i] for i in index.tolist()])


def story_prompts(tokenizer, n, seed=1, length=PROMPT_TOKENS):
    """`n` prompts from stories of `corpus(..., seed)` that reach a turn (a third of all stories do),
    in the corpus's order. Seed 0 is the model's training corpus; the notebook uses others."""
    cues = {kind: re.compile(cue + " ") for kind, (cue, _, _) in KINDS.items()}
    count = 3 * n + 64   # 3 of the corpus's 8 kinds of story have a turn
    while True:
        ids, kinds, continuations = [], [], []
        for story in corpus(count, seed):
            for kind, cue in cues.items():
                match = cue.search(story)
                if match:
                    tokens = tokenizer(story[:match.end() - 1]).input_ids
                    if len(tokens) >= length:
                        ids.append(tokens[-length:])
                        kinds.append(kind)
                        rest = story[match.end() - 1:]
                        continuations.append(re.match(r' [^.!?]*(?:\.|!"|!|\?)', rest).group(0))
                    break
            if len(kinds) == n:
                return Prompts(torch.tensor(ids), kinds, continuations)
        count *= 2


def chat_prompts(tokenizer, n, seed=1):
    """`story_prompts` in the chat template: the ids of USER, the story's last PROMPT_TOKENS tokens, the ids of
    ASSISTANT: (n, 28) ids with the course's tokenizer, all of one length."""
    return chat_template(tokenizer, story_prompts(tokenizer, n, seed))


def chat_template(tokenizer, prompts):
    """Prompts whose ids are wrapped in the template, (N, len(USER ids) + PROMPT_TOKENS + len(ASSISTANT ids))."""
    n = len(prompts)
    user = torch.tensor(tokenizer(USER).input_ids).expand(n, -1)
    assistant = torch.tensor(tokenizer(ASSISTANT).input_ids).expand(n, -1)
    return Prompts(torch.cat([user, prompts.ids, assistant], dim=1), prompts.kinds, prompts.continuations)


def demonstrations(tokenizer, prompts):
    """SFT data: each chat prompt followed by the story's own next sentence and <|endoftext|>, padded on the right
    with <|endoftext|> to the longest. Returns (ids (N, P + L), reply_lengths (N,)): the reply of row b is
    ids[b, P:P + reply_lengths[b]], its last token the <|endoftext|> that ends it."""
    replies = [tokenizer(continuation).input_ids + [EOS_ID] for continuation in prompts.continuations]
    lengths = torch.tensor([len(reply) for reply in replies])
    ids = torch.full((len(prompts), prompts.ids.shape[1] + int(lengths.max())), EOS_ID)
    ids[:, :prompts.ids.shape[1]] = prompts.ids
    for row, reply in zip(ids, replies):
        row[prompts.ids.shape[1]:prompts.ids.shape[1] + len(reply)] = torch.tensor(reply)
    return ids, lengths


def response_mask(ids, prompt_length, end_ids):
    """(B, T) bool: True on the reply, from `prompt_length` up to and including its first end token."""
    is_end = torch.isin(ids, end_ids)
    is_end[:, :prompt_length] = False
    ended_before = (is_end.long().cumsum(dim=1) - is_end.long()) > 0     # an end token earlier in the reply
    mask = ~ended_before
    mask[:, :prompt_length] = False
    return mask


def sample_episodes(policy, prompt_ids, generator, end_ids=torch.tensor([EOS_ID]), max_new_tokens=MAX_NEW_TOKENS,
                    temperature=1.0):
    """One reply per prompt, sampled from `policy` (a courselib.gpt.GPT) with its KV cache, token by token,
    until every reply has ended or has max_new_tokens. Returns (ids (B, L + n), mask (B, L + n)), n <= max_new_tokens:
    the prompts, the replies, and <|endoftext|> after a reply's end; mask True on the replies."""
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad():
            cache = policy.new_cache()
            logits = policy(prompt_ids, cache)[:, -1]                                 # (B, V): the next token's
            tokens, ended = [], torch.zeros(len(prompt_ids), dtype=torch.bool)
            for _ in range(max_new_tokens):
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(1)   # (B,)
                token = token.masked_fill(ended, EOS_ID)                             # padding after the end
                tokens.append(token)
                ended |= torch.isin(token, end_ids)
                if ended.all():
                    break
                logits = policy(token[:, None], cache)[:, -1]
    finally:
        policy.train(was_training)
    ids = torch.cat([prompt_ids, torch.stack(tokens, dim=1)], dim=1)
    return ids, response_mask(ids, prompt_ids.shape[1], end_ids)


def pad_episodes(ids, mask, width):
    """Episodes padded on the right to `width` tokens with <|endoftext|>, outside the mask."""
    extra = width - ids.shape[1]
    return F.pad(ids, (0, extra), value=EOS_ID), F.pad(mask, (0, extra), value=False)


def stopped(ids, mask):
    """(B,) bool: did the reply end with <|endoftext|> (rather than run to MAX_NEW_TOKENS)?"""
    last = mask.long().cumsum(dim=1).argmax(dim=1)                    # the position of the reply's last token
    return mask.any(dim=1) & (ids[torch.arange(len(ids)), last] == EOS_ID)


def replies(tokenizer, ids, mask):
    """The text of each reply with its leading space, without the <|endoftext|> that ends it; a reply that never
    stopped ends in " …"."""
    ended = stopped(ids, mask)
    return [tokenizer.decode(row[keep][:-1]) if end else tokenizer.decode(row[keep]) + " …"
            for row, keep, end in zip(ids, mask, ended)]


# ---------------------------------------------------------------------------------------- the annotators
_GOOD = {kind: re.compile(" " + good) for kind, (_, good, _) in KINDS.items()}
_BAD = {kind: re.compile(" " + bad) for kind, (_, _, bad) in KINDS.items()}


def true_score(kind, reply):
    """The annotators' hidden taste for one reply (its text, without the <|endoftext|> that ends it) to a story of
    this kind: GOOD (+1) if it turns the story well, BAD (−1) if badly, BROKEN (−2) if it is not a proper next
    sentence of such a story at all."""
    if _GOOD[kind].fullmatch(reply):
        return GOOD
    if _BAD[kind].fullmatch(reply):
        return BAD
    return BROKEN


def true_scores(tokenizer, ids, mask, kinds):
    """(B,) float tensor of `true_score` for a batch of episodes; a reply that never stopped is BROKEN."""
    ended = stopped(ids, mask).tolist()
    return torch.tensor([true_score(kind, text) if end else BROKEN
                         for kind, text, end in zip(kinds, replies(tokenizer, ids, mask), ended)])


@dataclasses.dataclass
class PreferencePairs:
    chosen: torch.Tensor           # (N, T) prompt + preferred reply
    chosen_mask: torch.Tensor      # (N, T) True on the reply
    rejected: torch.Tensor
    rejected_mask: torch.Tensor

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, index):
        return PreferencePairs(self.chosen[index], self.chosen_mask[index], self.rejected[index],
                               self.rejected_mask[index])


def collect_preferences(policy, tokenizer, prompts, generator, end_ids=torch.tensor([EOS_ID]), noise=0.5):
    """Two replies of `policy` to each prompt, shown to the annotators. When their taste ranks the two the
    same they have no preference and the pair is dropped (as many preference datasets drop ties);
    otherwise they prefer a over b with probability σ((s_a − s_b) / noise), s = true_score: Bradley–Terry,
    with noise. Returns the PreferencePairs and the prompts they answer."""
    a, a_mask = sample_episodes(policy, prompts.ids, generator, end_ids)
    b, b_mask = sample_episodes(policy, prompts.ids, generator, end_ids)
    width = max(a.shape[1], b.shape[1])
    (a, a_mask), (b, b_mask) = pad_episodes(a, a_mask, width), pad_episodes(b, b_mask, width)
    s_a = true_scores(tokenizer, a, a_mask, prompts.kinds)
    s_b = true_scores(tokenizer, b, b_mask, prompts.kinds)
    a_wins = (torch.rand(len(s_a), generator=generator) < torch.sigmoid((s_a - s_b) / noise))[:, None]   # (N, 1)
    kept = (s_a != s_b).nonzero().squeeze(1)
    pairs = PreferencePairs(torch.where(a_wins, a, b), torch.where(a_wins, a_mask, b_mask),
                            torch.where(a_wins, b, a), torch.where(a_wins, b_mask, a_mask))
    return pairs[kept], prompts[kept]


# ------------------------------------------------------------------------------------------ the models
class BagOfWordsReward(nn.Module):
    """r(y) = Σ_t m_t w[y_t]: one learned number per token, added up over the reply. Blind to word order
    and to repetition, as crude reward models are blind to something."""

    def __init__(self, vocab_size):
        super().__init__()
        self.token_reward = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, ids, mask):
        # ids, mask (N, T) -> (N,)
        return (self.token_reward[ids] * mask).sum(dim=1)


def frozen_copy(model):
    """A copy of `model` that never trains: eval mode, no gradients. RLHF's reference policy."""
    return copy.deepcopy(model).eval().requires_grad_(False)


# ------------------------------------------------------------------------------ what the cells compute with
def token_log_probs(logits, input_ids):
    """(B, T): entry t is log p(input_ids[:, t] | input_ids[:, <t]) from logits[:, t - 1] (causal convention), aligned
    with input_ids; entry 0 is 0 (nothing predicts the first token). logits (B, T, V) = model(input_ids)."""
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0))                                                    # (B, T)


def hidden_states(model, input_ids):
    """The final hidden states (B, T, d) of a courselib.gpt.GPT: its forward pass without the vocabulary head
    (`model.lm_head(hidden_states(model, ids))` is `model(ids)`)."""
    x = model.token_embeddings(input_ids) + model.position_embeddings(input_ids)
    x = model.dropout(x)
    for block in model.blocks:
        x, _ = block(x)
    return model.final_norm(x)


# ------------------------------------------------------------------------------- the runs the notebook compares
RL_STEPS, PROMPTS_PER_STEP, GROUP_SIZE = 15, 8, 4    # 15 steps of k = 4 replies to each of 8 prompts (32 replies)
RLOO_LR = 1e-3
PPO_SETTINGS = dict(lr=3e-4, epochs=4, clip_eps=0.2, target_kl=0.02)
PPO_UNTUNED = dict(lr=1e-3, epochs=2, clip_eps=0.2, target_kl=float("inf"))   # the notebook's first version
GRPO_SETTINGS = dict(lr=3e-4, epochs=4, clip_eps=0.2, target_kl=0.02, beta=2.0)
DPO_SETTINGS = dict(beta=1.0, steps=10, batch_size=16, lr=1e-4)
BEST_OF = 4                                          # best-of-n's n: as many replies per prompt as RL's groups
EVAL_SEED = 7
SEEDS = (0, 1, 2, 3, 4)
GRPO_NAME = f"GRPO, β = {GRPO_SETTINGS['beta']:g}"
METHODS = ("SFT (reference)", f"best-of-{BEST_OF}", "RLOO, β = 1", "PPO, β = 1", GRPO_NAME, "DPO, β = 1", "RLOO, β = 0",
           "PPO untuned, β = 1", "GRPO, β = 0.5")


@dataclasses.dataclass
class Setup:
    """What every run of the comparison shares: the frozen SFT model, the reward model, the prompts, the pairs."""
    reference: nn.Module
    reward_model: nn.Module
    tokenizer: object
    train_prompts: Prompts
    eval_prompts: Prompts
    pairs: "PreferencePairs"


def new_policy(reference):
    """A trainable copy of the reference (RL and DPO start from the SFT model's weights)."""
    return copy.deepcopy(reference).train().requires_grad_(True)


def train_rl(setup, policy, update, beta, steps=RL_STEPS, lr=RLOO_LR, seed=0, live_plot=None, desc=None):
    """`steps` RL steps: sample GROUP_SIZE replies to each of PROMPTS_PER_STEP training prompts from the policy,
    score them with the reward model, and call update(policy, reference, optimizer, ids, mask, rewards, beta,
    group_size), which returns (penalised rewards, log π(y) - log π_ref(y)[, epochs taken]). Adam. Returns the
    history: per step the mean learned reward, the mean k1 KL estimate, the mean true score (and the epochs)."""
    from courselib.training import progress
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    history = {"reward": [], "KL": [], "true score": [], "epochs": []}
    for step in progress(range(steps), desc=desc or f"{getattr(update, '__name__', 'update')} β={beta:g}", leave=False):
        batch = setup.train_prompts[torch.randint(len(setup.train_prompts), (PROMPTS_PER_STEP,), generator=generator)]
        prompt_ids = batch.ids.repeat_interleave(GROUP_SIZE, dim=0)          # each prompt k times, consecutive rows
        kinds = [kind for kind in batch.kinds for _ in range(GROUP_SIZE)]
        ids, mask = sample_episodes(policy, prompt_ids, generator)          # the actions
        with torch.no_grad():
            rewards = setup.reward_model(ids, mask)
        returned = update(policy, setup.reference, optimizer, ids, mask, rewards, beta, GROUP_SIZE)
        history["reward"].append(rewards.mean().item())
        history["KL"].append(returned[1].mean().item())                     # k1 on this batch
        history["true score"].append(true_scores(setup.tokenizer, ids, mask, kinds).mean().item())
        if len(returned) > 2:
            history["epochs"].append(returned[2])
        if live_plot is not None:
            live_plot.update(step, history["reward"][-1])
    policy.eval()
    return history


def summary_of(setup, ids, mask, kl, prompts=None):
    """The measures of the comparison for replies (ids, mask) to the evaluation prompts with their KL (N,)."""
    prompts = prompts or setup.eval_prompts
    with torch.no_grad():
        reward = setup.reward_model(ids, mask)
    scores = true_scores(setup.tokenizer, ids, mask, prompts.kinds)
    texts = replies(setup.tokenizer, ids, mask)
    return {"reward": reward.mean().item(), "true score": scores.mean().item(), "KL": float(kl.mean()),
            "good": (scores == GOOD).float().mean().item(), "bad": (scores == BAD).float().mean().item(),
            "broken": (scores == BROKEN).float().mean().item(), "distinct replies": len(set(texts)), "replies": texts}


def evaluate(setup, policy, sequence_kl, seed=EVAL_SEED):
    """The policy's replies to the evaluation prompts: learned reward, true score and its verdicts, the per-token
    KL to the reference summed along each reply (`sequence_kl`, the learner's), distinct replies."""
    ids, mask = sample_episodes(policy, setup.eval_prompts.ids, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        kl = sequence_kl(policy(ids), setup.reference(ids), mask)
    return summary_of(setup, ids, mask, kl)


def best_of_n_kl_bound(n):
    """log n - (n - 1) / n: the KL of best-of-n sampling from the reference is at most this (equal to it when
    no two candidates tie; Stiennon et al. 2020, Beirami et al. 2024)."""
    import math
    return math.log(n) - (n - 1) / n


def evaluate_best_of_n(setup, best_of_n, n=BEST_OF, seed=EVAL_SEED):
    """n replies of the reference to each evaluation prompt, the reward model's favourite kept (`best_of_n`, the
    learner's). Its KL column is the bound log n - (n - 1) / n."""
    prompt_ids = setup.eval_prompts.ids.repeat_interleave(n, dim=0)
    ids, mask = sample_episodes(setup.reference, prompt_ids, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        rewards = setup.reward_model(ids, mask)
    best_ids, best_mask = best_of_n(ids, mask, rewards, n)
    return summary_of(setup, best_ids, best_mask, torch.tensor([best_of_n_kl_bound(n)]))


def ppo_step(policy, reference, optimizer, input_ids, mask, rewards, beta, group_size, *, ppo_epochs, rloo_advantages,
             ppo_clip_loss, epochs, clip_eps, target_kl):
    """PPO as the notebook runs it: the KL penalty in the reward (k1 of each reply), RLOO's advantages, then the
    learner's `ppo_epochs` loop with their `ppo_clip_loss`. Returns (penalised rewards, k1, epochs taken)."""
    with torch.no_grad():
        old = token_log_probs(policy(input_ids), input_ids)                  # π_old: it sampled the batch
        log_ratio = ((old - token_log_probs(reference(input_ids), input_ids)) * mask).sum(dim=1)   # k1 of each reply
        penalized = rewards - beta * log_ratio
        advantages = rloo_advantages(penalized, group_size)
    taken = ppo_epochs(policy, optimizer, input_ids, mask,
                       lambda log_probs, old_log_probs: ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps),
                       epochs, target_kl)
    return penalized, log_ratio, taken


def grpo_step(policy, reference, optimizer, input_ids, mask, rewards, beta, group_size, *, ppo_epochs, grpo_loss,
              epochs, clip_eps, target_kl):
    """GRPO as the notebook runs it: the learner's `ppo_epochs` loop with their `grpo_loss` on the raw rewards
    (the KL in the loss). Returns (rewards, k1 of each reply, epochs taken)."""
    with torch.no_grad():
        reference_log_probs = token_log_probs(reference(input_ids), input_ids)
        log_ratio = ((token_log_probs(policy(input_ids), input_ids) - reference_log_probs) * mask).sum(dim=1)
    taken = ppo_epochs(policy, optimizer, input_ids, mask,
                       lambda log_probs, old_log_probs: grpo_loss(log_probs, old_log_probs, reference_log_probs, rewards,
                                                                   mask, group_size, clip_eps, beta),
                       epochs, target_kl)
    return rewards, log_ratio, taken


def train_dpo(setup, policy, dpo_loss, beta, steps, batch_size, lr, seed=0, live_plot=None):
    """DPO on the preference pairs: `steps` Adam steps of the learner's `dpo_loss` on `batch_size` different pairs."""
    from courselib.training import progress
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for step in progress(range(steps), desc=f"DPO β={beta:g}", leave=False):
        batch = setup.pairs[torch.randperm(len(setup.pairs), generator=generator)[:batch_size]]
        loss, _, _ = dpo_loss(policy, setup.reference, batch.chosen, batch.chosen_mask, batch.rejected,
                              batch.rejected_mask, beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if live_plot is not None:
            live_plot.update(step, loss.item())
    policy.eval()
    return policy


class Comparison:
    """The notebook's methods, each run from the SFT model with the learner's own functions (`pieces`: a dict of
    the notebook's names, sequence_kl, reinforce_step, rloo_advantages, ppo_clip_loss, ppo_epochs, grpo_loss,
    dpo_loss, best_of_n), under one training seed: `run(name, seed)` returns `evaluate`'s measures."""

    def __init__(self, setup, pieces):
        self.setup, self.pieces = setup, pieces

    def update(self, name):
        """The update function `train_rl` calls for an RL method (with its settings)."""
        import functools
        p = self.pieces
        if name.startswith("RLOO"):
            return p["reinforce_step"]
        if name.startswith("PPO"):
            chosen = PPO_UNTUNED if name.startswith("PPO untuned") else PPO_SETTINGS
            settings = {k: v for k, v in chosen.items() if k != "lr"}
            update = functools.partial(ppo_step, ppo_epochs=p["ppo_epochs"], rloo_advantages=p["rloo_advantages"],
                                       ppo_clip_loss=p["ppo_clip_loss"], **settings)
        else:
            settings = {k: v for k, v in GRPO_SETTINGS.items() if k not in ("lr", "beta")}
            update = functools.partial(grpo_step, ppo_epochs=p["ppo_epochs"], grpo_loss=p["grpo_loss"], **settings)
        update.__name__ = name.split(",")[0].split()[0].lower() + "_step"
        return update

    @staticmethod
    def beta(name):
        return float(name.rpartition("= ")[2])

    def train(self, name, seed=0, steps=RL_STEPS, live_plot=None):
        """A policy trained by method `name` (not SFT or best-of-n) with training seed `seed`, and its history."""
        policy = new_policy(self.setup.reference)
        if name.startswith("DPO"):
            settings = dict(DPO_SETTINGS)
            settings["beta"] = self.beta(name)
            return train_dpo(self.setup, policy, self.pieces["dpo_loss"], seed=seed, live_plot=live_plot,
                             **settings), None
        lr = {"PPO": PPO_SETTINGS["lr"], "PPO untuned": PPO_UNTUNED["lr"],
              "GRPO": GRPO_SETTINGS["lr"]}.get(name.split(",")[0], RLOO_LR)
        history = train_rl(self.setup, policy, self.update(name), self.beta(name), steps=steps, lr=lr, seed=seed,
                           live_plot=live_plot, desc=f"{name}, seed {seed}")
        return policy, history

    def run(self, name, seed=0, steps=RL_STEPS):
        """`evaluate`'s measures of method `name` trained with seed `seed`."""
        if name.startswith("SFT"):
            return evaluate(self.setup, self.setup.reference, self.pieces["sequence_kl"])
        if name.startswith("best-of-"):
            # its seed is the sampling's: the evaluation seed for seed 0, another for each other seed
            return evaluate_best_of_n(self.setup, self.pieces["best_of_n"], int(name.rpartition("-")[2]),
                                      seed=EVAL_SEED + 1000 * seed)
        policy, _ = self.train(name, seed, steps)
        return evaluate(self.setup, policy, self.pieces["sequence_kl"])

    def sweep(self, seeds=SEEDS, methods=METHODS, done=None, steps=RL_STEPS):
        """{method: [measures under each seed]}; `done` {(method, seed): measures} are reused, not rerun."""
        done = done or {}
        return {name: [done[name, seed] if (name, seed) in done else self.run(name, seed, steps) for seed in seeds]
                for name in methods}


MEASURES = ("reward", "true score", "KL", "broken")


def spread(values):
    """(mean, standard deviation over the seeds, smallest, largest)."""
    values = torch.tensor(values, dtype=torch.float64)
    return (values.mean().item(), values.std().item() if len(values) > 1 else 0.0, values.min().item(),
            values.max().item())


def sweep_table(results):
    """The sweep's table: mean ± standard deviation over the seeds, and the range, of each method's measures."""
    seeds = len(next(iter(results.values())))
    lines = [f"{'':<16}" + "".join(f"{m:>26}" for m in ("learned reward", "true score", "KL (nats)", "broken replies")),
             f"{'':<16}" + f"{f'mean ± std over {seeds} seeds [smallest, largest]':>104}"]
    for name, runs in results.items():
        cells = []
        for measure in MEASURES:
            mean, std, low, high = spread([run[measure] for run in runs])
            if measure == "broken":
                cells.append(f"{mean:5.0%} ± {std:4.0%} [{low:4.0%}, {high:4.0%}]")
            else:
                prefix = "≤" if name.startswith("best-of-") and measure == "KL" else " "
                cells.append(f"{prefix}{mean:5.2f} ± {std:4.2f} [{low:5.2f}, {high:5.2f}]")
        lines.append(f"{name:<16}" + "".join(f"{c:>26}" for c in cells))
    return "\n".join(lines)


def sweep_claims(results):
    """{claim: does it hold in every seed of `results`}: the comparisons notebook 11's text makes (section 11). The
    notebook checks them over its five seeds, the test suite over two others (test_rlhf_lib)."""
    def runs(name, measure):
        return torch.tensor([run[measure] for run in results[name]], dtype=torch.float64)

    sft = runs("SFT (reference)", "true score")
    best = runs(f"best-of-{BEST_OF}", "true score")
    rl = ("RLOO, β = 1", "PPO, β = 1")
    claims = {}
    for name in rl:
        claims[f"{name} raises the true score above the SFT model's by at least 0.3"] = bool(
            (runs(name, "true score") >= sft + 0.3).all())
    claims["no RL method beats best-of-4's true score in every seed"] = all(
        bool((runs(name, "true score") <= best).any()) for name in (*rl, GRPO_NAME))
    claims["best-of-4's mean true score is within 0.1 of the best RL method's"] = bool(
        (max(runs(name, "true score").mean() for name in rl) - best.mean()).abs() <= 0.1)
    claims["tuned PPO moves less far from the reference than RLOO (KL) in every seed"] = bool(
        (runs("PPO, β = 1", "KL") < runs("RLOO, β = 1", "KL")).all())
    claims["tuned PPO breaks at most 6% of its replies in every seed"] = bool((runs("PPO, β = 1", "broken") <= 0.06).all())
    claims["untuned PPO breaks more than a quarter of its replies in at least one seed"] = bool(
        (runs("PPO untuned, β = 1", "broken") > 0.25).any())
    claims["DPO raises the true score above the SFT model's by at least 0.2 in every seed"] = bool(
        (runs("DPO, β = 1", "true score") >= sft + 0.2).all())
    claims["DPO's true score is below RLOO's and PPO's in every seed"] = all(
        bool((runs("DPO, β = 1", "true score") < runs(name, "true score")).all()) for name in rl)
    claims["DPO moves less far from the reference (KL) than RLOO and PPO in every seed"] = all(
        bool((runs("DPO, β = 1", "KL") < runs(name, "KL")).all()) for name in rl)
    grpo = GRPO_NAME
    claims[f"{grpo} raises the true score above the SFT model's by at least 0.1 in every seed"] = bool(
        (runs(grpo, "true score") >= sft + 0.1).all())
    claims[f"{grpo} breaks at most 6% of its replies in every seed"] = bool((runs(grpo, "broken") <= 0.06).all())
    claims[f"{grpo} moves less far from the reference (KL) than RLOO and PPO in every seed"] = all(
        bool((runs(grpo, "KL") < runs(name, "KL")).all()) for name in rl)
    claims[f"{grpo}'s true score is below tuned PPO's in every seed"] = bool(
        (runs(grpo, "true score") < runs("PPO, β = 1", "true score")).all())
    claims["GRPO at β = 0.5 breaks more than a quarter of its replies in at least one seed"] = bool(
        (runs("GRPO, β = 0.5", "broken") > 0.25).any())
    hacked, kept = "RLOO, β = 0", "RLOO, β = 1"
    claims["at β = 0 RLOO collects more learned reward than at β = 1 in every seed"] = bool(
        (runs(hacked, "reward") > runs(kept, "reward")).all())
    claims["at β = 0 RLOO's true score is below the SFT model's in every seed"] = bool((runs(hacked, "true score") < sft).all())
    claims["at β = 0 RLOO moves at least 10 times further from the reference than at β = 1 in every seed"] = bool(
        (runs(hacked, "KL") > 10 * runs(kept, "KL")).all())
    return claims


# ------------------------------------------------------------------------------------------- pictures
def draw_pipeline(ax=None):
    """The four stages from a language model to an assistant, with DPO's shortcut drawn under them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    stages = [("Pre-training", "next-token prediction\non a huge corpus"),
              ("SFT", "the same loss on\ndemonstrations"),
              ("Reward model", "Bradley–Terry loss\non compared pairs"),
              ("RL (e.g. PPO)", "maximise reward\n− β · KL to the SFT model")]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3))
    for i, (title, detail) in enumerate(stages):
        x = 2.9 * i
        ax.add_patch(FancyBboxPatch((x, 0), 2.3, 1.5, boxstyle="round,pad=0.06", fc="#e8eef7", ec="#4a6fa5"))
        ax.text(x + 1.15, 1.15, title, ha="center", va="center", weight="bold")
        ax.text(x + 1.15, 0.5, detail, ha="center", va="center", fontsize=9)
        if i:
            ax.annotate("", xy=(x - 0.08, 0.75), xytext=(x - 0.52, 0.75), arrowprops={"arrowstyle": "->"})
    ax.annotate("", xy=(2.9 * 3 + 1.15, -0.1), xytext=(2.9 + 1.15, -0.1),
                arrowprops={"arrowstyle": "->", "connectionstyle": "arc3,rad=0.25", "color": "#b5562d"})
    ax.text(2.9 * 2 + 1.15, -0.95, "DPO: from the compared pairs straight to the policy", ha="center", color="#b5562d")
    ax.set_xlim(-0.2, 11.3)
    ax.set_ylim(-1.2, 1.7)
    ax.axis("off")
    ax.set_title("From a language model to an assistant")
    return ax
