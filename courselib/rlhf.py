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

Reference versions of exercises live here too (`sequence_log_probs`, `sequence_kl`, `rloo_advantages`,
`ppo_clip_loss`), as the course keeps reference versions of the pieces learners build: the hidden tests
hand them to later exercises so that each exercise is graded on its own. `token_log_probs` gives the
per-token log-probabilities that PPO and GRPO work with.
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


# --------------------------------------------------------------- reference versions of the exercises
def sequence_log_probs(logits, input_ids, mask=None):
    """Σ_t mask[:, t] log p(input_ids[:, t] | input_ids[:, <t]) with the causal-LM convention: the logits
    at position t score the token at t + 1. logits (B, T, V) = model(input_ids); input_ids, mask (B, T),
    mask True on the tokens that count (mask[:, 0] is ignored: nothing predicts the first token). (B,)."""
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)                           # (B, T - 1, V)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)       # (B, T - 1)
    if mask is not None:
        picked = picked.masked_fill(~mask[:, 1:], 0.0)
    return picked.sum(dim=-1)


def token_log_probs(logits, input_ids):
    """(B, T): entry t is log p(input_ids[:, t] | input_ids[:, <t]) from logits[:, t - 1] (causal convention), aligned
    with input_ids; entry 0 is 0 (nothing predicts the first token). logits (B, T, V) = model(input_ids)."""
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0))                                                    # (B, T)


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


def ppo_clip_loss(log_probs, old_log_probs, advantages, mask, clip_eps=0.2):
    """PPO's clipped surrogate, as a loss: -mean over the counted tokens of min(ρ A, clip(ρ, 1 - ε, 1 + ε) A),
    ρ = exp(log_probs - old_log_probs) per token. log_probs, old_log_probs, mask (B, T); advantages (B,)."""
    ratio = torch.exp(log_probs - old_log_probs)                                    # (B, T)
    advantage = advantages[:, None]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    return -(surrogate * mask).sum() / mask.sum()


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
