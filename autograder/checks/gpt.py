"""Hidden checks for 09_gpt. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs and weights from `seeds`, calls
the student's code through `call` and returns plain data (outputs, state_dict tensors, recorded
modes, sampled ids). The judge (autograder/judges/gpt.py) runs in the grader: it rebuilds the same
inputs and weights from the same seeds and compares with independent oracles:
- transformers' `GPT2Attention`, `GPT2Block`, `GPT2LMHeadModel` (logits, `generate`, left-padded batched
  `generate` with an end-of-sequence token) and its causal-LM loss, holding the check's weights in GPT-2's own
  layout (`hf_state` transposes into Conv1D's (in, out)); `LlamaForCausalLM` for the Llama and its cache;
- `torch.optim.AdamW` for the learner's AdamW update;
- transformers' logits warpers (`TopKLogitsWarper`, `TopPLogitsWarper`, `TemperatureLogitsWarper`)
  and exact binomial tail bounds for sampling;
- hand-written SGD steps and torch's meta tensors for the training loop and the cache's size.

Every exercise is graded on its own: the block is built with a reference attention swapped in, the GPT class with
a reference block; the loader, the loss, the training loop, `generate` and the KV cache run on a reference GPT in
the notebook's layout and names; `sample_next` gets reference filters, `generate` a reference `sample_next`. Those
references are this module's own (`ReferenceGPT`, ...): the course's models (courselib.gpt, courselib.fused_gpt,
courselib.llama_model) answer 09's exercises, so nothing 09's kernel runs imports them (`HIDDEN_MODULES`: the
watch looks for their names only where a student's cell has imported one, and importing one while the student's
code runs is a finding).

Statistical tests (sample_next_distribution) compare counts with exact binomial quantiles at a
false-failure rate of at most 1e-9 per tail, union-bounded over every category of every case: under
1e-7 per run, whatever the seeds (they change with the grader's token).
"""
import inspect
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks.common import call as _plain_call
from autograder.checks.common import probe, reference_globals
from courselib import stories
from courselib.blocks import FeedForward, LayerNorm, LearnedPositionalEmbedding, TokenEmbedding
from courselib.llama import RMSNorm, SwiGLUFeedForward, apply_rope, grouped_query_attention

# The course's reference models: they answer 09's exercises, so 09's kernel never imports them (the lead hides them
# from 09's sandbox). Their names stay in the lists below for the grader's reading of the hand-in's source.
# (A frozenset, not a list: the grader reads module-level lists of dotted names as oracles.)
HIDDEN_MODULES = frozenset({"courselib.gpt", "courselib.fused_gpt", "courselib.llama_model"})


def call(fn, *args, forbidden=(), forbidden_modules=(), **kwargs):
    """common.call, with the course references of modules this kernel has not imported left to the import watch:
    resolving their names would import them (and in 09's sandbox they do not exist)."""
    unloaded = {dotted.rsplit(".", 1)[0] for dotted in forbidden
                if dotted.rsplit(".", 1)[0] in HIDDEN_MODULES and dotted.rsplit(".", 1)[0] not in sys.modules}
    watched = [dotted for dotted in forbidden if dotted.rsplit(".", 1)[0] not in unloaded]
    return _plain_call(fn, *args, forbidden=watched, forbidden_modules=(*forbidden_modules, *sorted(unloaded)),
                       **kwargs)


ATTENTION_SHORTCUTS = ["torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
                       "courselib.attention.MultiHeadAttention", "courselib.attention.scaled_dot_product_attention",
                       "courselib.attention.split_heads", "courselib.attention.merge_heads",
                       "courselib.attention.causal_mask", "courselib.attention.masked_softmax",
                       "courselib.gpt.causal_attention", "courselib.gpt.Block",
                       "courselib.fused_gpt.CausalSelfAttention", "courselib.fused_gpt.attend",
                       "courselib.fused_gpt.Block", f"{__name__}.ReferenceAttention", f"{__name__}.ReferenceBlock",
                       "transformers.models.gpt2.modeling_gpt2.GPT2Attention",
                       "transformers.models.gpt2.modeling_gpt2.eager_attention_forward"]


BLOCK_SHORTCUTS = ["courselib.fused_gpt.Block", "courselib.gpt.Block", "courselib.gpt.causal_attention",
                   f"{__name__}.ReferenceBlock", "courselib.blocks.EncoderLayer", "torch.nn.TransformerEncoderLayer",
                   "torch.nn.TransformerDecoderLayer", "transformers.models.gpt2.modeling_gpt2.GPT2Block"]


GPT_SHORTCUTS = ["courselib.fused_gpt.GPT", "courselib.gpt.GPT", "courselib.gpt.Block", "courselib.gpt.causal_attention",
                 f"{__name__}.ReferenceGPT", "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
                 "transformers.models.gpt2.modeling_gpt2.GPT2Model"]


LOSS_SHORTCUTS = ["courselib.gpt.lm_loss", f"{__name__}.reference_lm_loss", "transformers.loss.loss_utils.ForCausalLMLoss"]


PERPLEXITY_SHORTCUTS = ["courselib.gpt.perplexity"]


LOADER_SHORTCUTS = ["courselib.fused_gpt.load_gpt2_weights", "courselib.gpt.load_gpt2_weights",
                    "courselib.gpt._gpt2_pairs", "courselib.gpt.to_gpt2"]


TRAIN_SHORTCUTS = ["courselib.gpt.pretrain"]


TOP_K_SHORTCUTS = ["courselib.gpt.top_k_filter", f"{__name__}.reference_top_k_filter",
                   "transformers.generation.logits_process.TopKLogitsWarper"]


TOP_P_SHORTCUTS = ["courselib.gpt.top_p_filter", f"{__name__}.reference_top_p_filter",
                   "transformers.generation.logits_process.TopPLogitsWarper"]


SAMPLE_SHORTCUTS = ["courselib.gpt.sample_next", f"{__name__}.reference_sample_next",
                    "transformers.generation.logits_process.TemperatureLogitsWarper"]


# transformers' generate is decorated (@torch.no_grad()): the watch needs the function inside, whose code is its own
HF_GENERATE = "transformers.generation.utils.GenerationMixin.generate.__wrapped__"


GENERATE_SHORTCUTS = ["courselib.gpt.generate", f"{__name__}.reference_generate", HF_GENERATE]


CACHE_SHORTCUTS = ["courselib.fused_gpt.GPT", "courselib.fused_gpt.Block", "courselib.fused_gpt.CausalSelfAttention",
                   "courselib.fused_gpt.attend", "courselib.fused_gpt.forward_with_cache", "courselib.gpt.GPT",
                   "courselib.gpt.Block", "courselib.gpt.causal_attention", f"{__name__}.ReferenceGPT",
                   f"{__name__}.ReferenceBlock", f"{__name__}.ReferenceAttention"]


BYTES_SHORTCUTS = ["courselib.gpt.kv_cache_bytes"]


SPECULATIVE_SHORTCUTS = [HF_GENERATE]


ADVICE = "the exercise asks you to write this yourself"


# ---------------------------------------------------------------- the checks' own references
# What the probes run the student's code on, or swap in for the other exercises. They are written here, in the
# notebook's layout and names, and forbidden where they would answer the exercise being graded.
class ReferenceAttention(nn.Module):
    """GPT-2's causal self-attention: c_attn = [W_Q; W_K; W_V], heads split after q, k, v, c_proj."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}")
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.num_heads, d // self.num_heads).transpose(1, 2) for t in self.c_attn(x).split(d, 2))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d // self.num_heads)).masked_fill(
            torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        return self.c_proj((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, d))


class ReferenceBlock(nn.Module):
    """GPT-2's pre-LN block: norm1, self_attn, norm2, ffn (tanh GELU), dropout on both branches."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = ReferenceAttention(d_model, num_heads)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))


class ReferenceGPT(nn.Module):
    """GPT-2 in the notebook's names: token_embeddings, position_embeddings, dropout, blocks, final_norm, lm_head (tied).
    Its weights always come from the check (load_state_dict), so it keeps PyTorch's default initialisation."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None, dropout=0.0, eps=1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.token_embeddings = TokenEmbedding(vocab_size, d_model, scale=False)
        self.position_embeddings = LearnedPositionalEmbedding(max_positions, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(ReferenceBlock(d_model, num_heads, d_ff or 4 * d_model, dropout, eps)
                                    for _ in range(num_layers))
        self.final_norm = LayerNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.token_embeddings.weight

    def forward(self, input_ids):
        x = self.dropout(self.token_embeddings(input_ids) + self.position_embeddings(input_ids))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))


def reference_lm_loss(logits, input_ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))


def reference_top_k_filter(logits, k):
    if k >= logits.shape[-1]:
        return logits.clone()
    return logits.masked_fill(logits < torch.topk(logits, k, dim=-1).values[..., -1:], float("-inf"))


def reference_top_p_filter(logits, p):
    if p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    ordered = torch.sort(probs, dim=-1, descending=True).values
    kept = torch.cumsum(ordered, dim=-1) - ordered < p
    return logits.masked_fill(probs < torch.where(kept, ordered, torch.inf).amin(dim=-1, keepdim=True), float("-inf"))


def reference_sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None):
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k is not None:
        scaled = reference_top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = reference_top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(logits.shape[:-1])


def reference_generate(model, input_ids, max_new_tokens, generator=None, temperature=0.0, top_k=None, top_p=None):
    if input_ids.shape[1] + max_new_tokens - 1 > model.max_positions:
        raise ValueError("the prompt and the new tokens do not fit in the context window")
    ids = input_ids
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = reference_sample_next(model(ids)[:, -1], generator, temperature, top_k, top_p)
            ids = torch.cat([ids, token[:, None]], dim=1)
    return ids


class ReferenceLlamaAttention(nn.Module):
    """Llama's attention: q_proj, k_proj, v_proj (num_kv_heads), o_proj, no biases; RoPE per head; GQA; causal."""

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.rope_base = num_heads, num_kv_heads, rope_base
        self.d_head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(num_heads * self.d_head, d_model, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, base=self.rope_base)
        heads, _ = grouped_query_attention(q, k, v, torch.ones(T, T, dtype=torch.bool, device=x.device).tril())
        return self.o_proj(heads.transpose(1, 2).reshape(B, T, -1))


class ReferenceLlamaBlock(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = ReferenceLlamaAttention(d_model, num_heads, num_kv_heads, rope_base)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLUFeedForward(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class ReferenceLlama(nn.Module):
    """Llama in Hugging Face's names without "model.": embed_tokens, layers, norm, lm_head (untied)."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, max_positions, eps=1e-6,
                 rope_base=10000.0):
        super().__init__()
        self.max_positions = max_positions
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(ReferenceLlamaBlock(d_model, num_heads, num_kv_heads, d_ff, eps, rope_base)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# ---------------------------------------------------------------- weights the checks choose
def attention_state(g, d_model, prefix=""):
    """Random weights for one CausalSelfAttention, in the notebook's names (float64): c_attn is [W_Q; W_K; W_V]."""
    def mat(*shape, scale):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    return {f"{prefix}c_attn.weight": mat(3 * d_model, d_model, scale=1 / math.sqrt(d_model)),
            f"{prefix}c_attn.bias": mat(3 * d_model, scale=0.2),
            f"{prefix}c_proj.weight": mat(d_model, d_model, scale=1 / math.sqrt(d_model)),
            f"{prefix}c_proj.bias": mat(d_model, scale=0.2)}


def block_state(g, d_model, d_ff, prefix=""):
    """Random weights for one block, in the notebook's names (float64). LayerNorm gains away from 1."""
    def mat(*shape, scale):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    state = {}
    for norm in ("norm1", "norm2"):
        state[f"{prefix}{norm}.weight"] = 1.0 + mat(d_model, scale=0.3)
        state[f"{prefix}{norm}.bias"] = mat(d_model, scale=0.2)
    state.update(attention_state(g, d_model, prefix=f"{prefix}self_attn."))
    state[f"{prefix}ffn.linear1.weight"] = mat(d_ff, d_model, scale=1 / math.sqrt(d_model))
    state[f"{prefix}ffn.linear1.bias"] = mat(d_ff, scale=0.2)
    state[f"{prefix}ffn.linear2.weight"] = mat(d_model, d_ff, scale=1 / math.sqrt(d_ff))
    state[f"{prefix}ffn.linear2.bias"] = mat(d_model, scale=0.2)
    return state


def gpt_state(g, vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None):
    """Random weights for a whole GPT in the notebook's names (float64); lm_head is the token table."""
    d_ff = d_ff or 4 * d_model
    def mat(*shape, scale):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    state = {"token_embeddings.embedding.weight": mat(vocab_size, d_model, scale=0.5),
             "position_embeddings.table.weight": mat(max_positions, d_model, scale=0.3)}
    for i in range(num_layers):
        state.update(block_state(g, d_model, d_ff, prefix=f"blocks.{i}."))
    state["final_norm.weight"] = 1.0 + 0.3 * torch.randn(d_model, generator=g, dtype=torch.float64)
    state["final_norm.bias"] = 0.2 * torch.randn(d_model, generator=g, dtype=torch.float64)
    state["lm_head.weight"] = state["token_embeddings.embedding.weight"]
    return state


def hf_attention_state(state, prefix=""):
    """One attention's weights in GPT-2's layout: Conv1D weights are (in, out), c_attn one (d, 3d) matrix."""
    return {"c_attn.weight": state[f"{prefix}c_attn.weight"].T.contiguous(),
            "c_attn.bias": state[f"{prefix}c_attn.bias"],
            "c_proj.weight": state[f"{prefix}c_proj.weight"].T.contiguous(),
            "c_proj.bias": state[f"{prefix}c_proj.bias"]}


def hf_block_state(state, prefix=""):
    """One block's weights in GPT-2's layout."""
    def get(name):
        return state[prefix + name]

    out = {"ln_1.weight": get("norm1.weight"), "ln_1.bias": get("norm1.bias"),
           "ln_2.weight": get("norm2.weight"), "ln_2.bias": get("norm2.bias"),
           "mlp.c_fc.weight": get("ffn.linear1.weight").T.contiguous(), "mlp.c_fc.bias": get("ffn.linear1.bias"),
           "mlp.c_proj.weight": get("ffn.linear2.weight").T.contiguous(), "mlp.c_proj.bias": get("ffn.linear2.bias")}
    out.update({f"attn.{k}": v for k, v in hf_attention_state(state, f"{prefix}self_attn.").items()})
    return out


def hf_state(state, num_layers):
    """A whole GPT's weights in GPT2LMHeadModel's names and layout."""
    out = {"transformer.wte.weight": state["token_embeddings.embedding.weight"],
           "transformer.wpe.weight": state["position_embeddings.table.weight"],
           "transformer.ln_f.weight": state["final_norm.weight"], "transformer.ln_f.bias": state["final_norm.bias"],
           "lm_head.weight": state["token_embeddings.embedding.weight"]}
    for i in range(num_layers):
        out.update({f"transformer.h.{i}.{k}": v for k, v in hf_block_state(state, f"blocks.{i}.").items()})
    return out


def gpt2_config(vocab_size, d_model, num_layers, num_heads, max_positions, d_ff=None, eps=1e-5):
    from transformers import GPT2Config
    return GPT2Config(vocab_size=vocab_size, n_embd=d_model, n_layer=num_layers, n_head=num_heads,
                      n_positions=max_positions, n_inner=d_ff, layer_norm_epsilon=eps, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      attn_implementation="eager")


def hf_model(state, dims):
    """transformers' GPT2LMHeadModel (float64, eval) holding the check's weights."""
    from transformers import GPT2LMHeadModel
    with torch.random.fork_rng():   # its initialisation draws from torch's global generator: leave it as it was
        model = GPT2LMHeadModel(gpt2_config(**dims)).double().eval()
    model.load_state_dict(hf_state(state, dims["num_layers"]), strict=True)
    return model


def reference_gpt(state, dims, dropout=0.0):
    """The course's reference GPT in the notebook's layout (float64, eval) holding the check's weights: what the
    graded functions run on."""
    with torch.random.fork_rng():
        model = ReferenceGPT(**dims, dropout=dropout).double()
    model.load_state_dict(state, strict=True)
    return model.eval()


# ---------------------------------------------------------------- the harness
def student_call(fn, *args, name, helpers=None, forbidden=(), **kwargs):
    """call(fn, ...) with reference helpers swapped into the globals of the student's own code: through
    decorators (@torch.no_grad() wraps a function in torch's module) and into a class's methods."""
    own = inspect.unwrap(fn) if callable(fn) else fn
    if isinstance(own, type):
        own = next((f for f in vars(own).values() if inspect.isfunction(f)), None)
    with reference_globals(own, **(helpers or {})):
        return call(fn, *args, name=name, forbidden=forbidden, forbidden_advice=ADVICE, **kwargs)


def build(cls, *args, name, helpers=None, forbidden=(), **kwargs):
    """The student's class instantiated quietly (reference classes swapped in), torch's generator untouched."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise AssertionError(f"{name} should be a class deriving from nn.Module, but it is a {type(cls).__name__}.")
    with torch.random.fork_rng():
        return student_call(cls, *args, name=name, helpers=helpers, forbidden=forbidden, **kwargs)


def run(module, *args, name, forbidden=(), helpers=None, **kwargs):
    """module(*args) quietly and without gradients; the result must be a plain tensor."""
    with torch.no_grad():
        result = student_call(module, *args, name=name, forbidden=forbidden, helpers=helpers, **kwargs)
    if type(result) is not torch.Tensor:
        raise AssertionError(f"{name} should return a tensor, but it returned {type(result).__name__}.")
    return result


def raised(fn, *args, name, forbidden=(), helpers=None, **kwargs):
    """The name of the exception the student's code raises for these arguments, or None."""
    def attempt_it():
        try:
            fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as error:  # the exception is the answer here
            return type(error).__name__
        return None
    own = inspect.unwrap(fn)
    if isinstance(own, type):
        own = next((f for f in vars(own).values() if inspect.isfunction(f)), None)
    with reference_globals(own, **(helpers or {})):
        return call(attempt_it, name=name, forbidden=forbidden, forbidden_advice=ADVICE)


def load_into(model, state, owner, aliases=None):
    """Load the check's weights into the student's module by the notebook's names (with accepted aliases)."""
    aliases = aliases or {}
    theirs = dict(model.named_parameters(remove_duplicate=False))
    missing = [name for name in state if name not in theirs and aliases.get(name) not in theirs]
    if missing:
        raise AssertionError(f"{owner} has no parameter `{missing[0]}`: the exercise asks for submodules named "
                             f"as in the notebook. Its parameters are: {', '.join(theirs) or 'none'}.")
    inverse = {alias: name for name, alias in aliases.items()}
    unexpected = [name for name in theirs if name not in state and inverse.get(name) not in state]
    if unexpected:
        raise AssertionError(f"{owner} has a parameter the exercise doesn't ask for: `{unexpected[0]}`.")
    new = {}
    for name, value in theirs.items():
        source = state[name] if name in state else state[inverse[name]]
        if tuple(value.shape) != tuple(source.shape):
            raise AssertionError(f"{owner}.{name} has shape {tuple(value.shape)}; expected {tuple(source.shape)}.")
        new[name] = source
    model.double().load_state_dict(new, strict=False)   # buffers (a registered mask, say) stay as they are
    return model.eval()


# ---------------------------------------------------------------- exercise 1: CausalSelfAttention
ATTENTION_STRUCTURE_CASE = (12, 3)


def _attention(CausalSelfAttention, d_model, num_heads):
    return build(CausalSelfAttention, d_model, num_heads, forbidden=ATTENTION_SHORTCUTS,
                 name=f"CausalSelfAttention({d_model}, {num_heads})")


def _attend(module, x):
    return run(module, x, name="CausalSelfAttention.forward", forbidden=ATTENTION_SHORTCUTS)


@probe
def causal_self_attention_structure(seeds, CausalSelfAttention):
    d_model, num_heads = ATTENTION_STRUCTURE_CASE
    attn = _attention(CausalSelfAttention, d_model, num_heads).eval()
    g = seeds.generator(895)
    shapes = [tuple(_attend(attn, torch.randn(*shape, generator=g)).shape)
              for shape in [(2, 5, d_model), (1, 1, d_model), (3, 8, d_model)]]
    refusal = raised(CausalSelfAttention, 10, 3, name="CausalSelfAttention(10, 3)", forbidden=ATTENTION_SHORTCUTS)
    return {"num_heads": getattr(attn, "num_heads", None),
            "layers": {name: (None if not isinstance(getattr(attn, name, None), nn.Linear) else
                              [getattr(attn, name).in_features, getattr(attn, name).out_features,
                               getattr(attn, name).bias is not None]) for name in ("c_attn", "c_proj")},
            "parameters": {name: tuple(p.shape) for name, p in attn.named_parameters()},
            "shapes": shapes, "refusal": refusal}


ATTENTION_VALUE_CASES = [dict(d_model=12, num_heads=3, B=2, T=7), dict(d_model=8, num_heads=2, B=1, T=6),
                         dict(d_model=16, num_heads=4, B=2, T=5)]


def attention_value_problem(seeds, i, case):
    g = seeds.generator(900 + i)
    state = attention_state(g, case["d_model"])
    x = torch.randn(case["B"], case["T"], case["d_model"], generator=g, dtype=torch.float64)
    return state, x


@probe
def causal_self_attention_matches_gpt2(seeds, CausalSelfAttention):
    outputs = []
    for i, case in enumerate(ATTENTION_VALUE_CASES):
        state, x = attention_value_problem(seeds, i, case)
        attn = load_into(_attention(CausalSelfAttention, case["d_model"], case["num_heads"]), state,
                         "CausalSelfAttention")
        outputs.append(_attend(attn, x))
    return outputs


CAUSAL_CUTS = (8, 5, 2)


def causal_problem(seeds):
    g = seeds.generator(920)
    state = attention_state(g, 8)
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    changes = [torch.randn(2, 9 - t, 8, generator=g, dtype=torch.float64) for t in CAUSAL_CUTS]
    return state, x, changes


@probe
def causal_self_attention_is_causal(seeds, CausalSelfAttention):
    state, x, changes = causal_problem(seeds)
    attn = load_into(_attention(CausalSelfAttention, 8, 2), state, "CausalSelfAttention")
    base = _attend(attn, x)
    changed = []
    for t, new in zip(CAUSAL_CUTS, changes):
        edited = x.clone()
        edited[:, t:] = new
        changed.append(_attend(attn, edited))
    return base, changed


# ---------------------------------------------------------------- exercise 2: DecoderBlock
BLOCK_HELPERS = {"CausalSelfAttention": ReferenceAttention}


BLOCK_STRUCTURE_CASE = (12, 3, 20)


def _block(DecoderBlock, d_model, num_heads, d_ff, eps=1e-5, dropout=0.0):
    return build(DecoderBlock, d_model, num_heads, d_ff, dropout=dropout, eps=eps, forbidden=BLOCK_SHORTCUTS,
                 helpers=BLOCK_HELPERS, name=f"DecoderBlock({d_model}, {num_heads}, {d_ff}, dropout={dropout}, "
                                             f"eps={eps:g})")


def _run_block(block, x):
    return run(block, x, name="DecoderBlock.forward", forbidden=BLOCK_SHORTCUTS, helpers=BLOCK_HELPERS)


@probe
def decoder_block_structure(seeds, DecoderBlock):
    d_model, num_heads, d_ff = BLOCK_STRUCTURE_CASE
    block = _block(DecoderBlock, d_model, num_heads, d_ff, dropout=0.25)
    g = seeds.generator(901)
    shapes = [tuple(_run_block(block.eval(), torch.randn(*shape, generator=g)).shape)
              for shape in [(2, 5, d_model), (1, 1, d_model), (3, 7, d_model)]]
    return {"attributes": {name: hasattr(block, name) for name in ("norm1", "self_attn", "norm2", "ffn", "dropout")},
            "parameters": {name: tuple(p.shape) for name, p in block.named_parameters()},
            "dropouts": [m.p for m in block.modules() if isinstance(m, nn.Dropout)],
            "eps": [float(getattr(getattr(block, norm, None), "eps", -1)) for norm in ("norm1", "norm2")],
            "shapes": shapes}


BLOCK_VALUE_CASES = [dict(d_model=8, num_heads=2, d_ff=20, eps=1e-5, B=2, T=6),
                     dict(d_model=12, num_heads=4, d_ff=16, eps=1e-3, B=1, T=5)]


def block_value_problem(seeds, i, case):
    g = seeds.generator(910 + i)
    state = block_state(g, case["d_model"], case["d_ff"])
    x = torch.randn(case["B"], case["T"], case["d_model"], generator=g, dtype=torch.float64)
    return state, x


@probe
def decoder_block_matches_gpt2(seeds, DecoderBlock):
    outputs = []
    for i, case in enumerate(BLOCK_VALUE_CASES):
        state, x = block_value_problem(seeds, i, case)
        block = _block(DecoderBlock, case["d_model"], case["num_heads"], case["d_ff"], eps=case["eps"])
        load_into(block, state, "DecoderBlock")
        outputs.append(_run_block(block, x))
    return outputs


# ---------------------------------------------------------------- exercise 3: GPT
GPT_NAMES = ("token_embeddings, position_embeddings, dropout, blocks (nn.ModuleList of DecoderBlock), final_norm, "
             "lm_head (nn.Linear(d_model, vocab_size, bias=False), tied)")


GPT_ALIASES = {"token_embeddings.embedding.weight": "token_embeddings.weight",
               "position_embeddings.table.weight": "position_embeddings.weight"}


GPT_STRUCTURE_DIMS = dict(vocab_size=29, d_model=12, num_layers=2, num_heads=3, max_positions=16)


GPT_HELPERS = {"DecoderBlock": ReferenceBlock}


def _gpt(GPT, dims, dropout=0.0):
    return build(GPT, dims["vocab_size"], dims["d_model"], dims["num_layers"], dims["num_heads"],
                 dims["max_positions"], dropout=dropout, name="GPT({vocab_size}, {d_model}, {num_layers}, "
                 "{num_heads}, {max_positions})".format(**dims), helpers=GPT_HELPERS, forbidden=GPT_SHORTCUTS)


def _run_gpt(model, ids):
    return run(model, ids, name="GPT.forward", forbidden=GPT_SHORTCUTS, helpers=GPT_HELPERS)


def token_table(model):
    embeddings = getattr(model, "token_embeddings", None)
    table = getattr(embeddings, "embedding", embeddings)
    return getattr(table, "weight", None)


@probe
def gpt_structure(seeds, GPT):
    dims = GPT_STRUCTURE_DIMS
    model = _gpt(GPT, dims, dropout=0.2).eval()
    g = seeds.generator(930)
    shapes = [tuple(_run_gpt(model, torch.randint(0, dims["vocab_size"], (B, T), generator=g)).shape)
              for B, T in [(2, 7), (1, 16), (3, 1)]]
    head = getattr(model, "lm_head", None)
    blocks = getattr(model, "blocks", None)
    return {"attributes": {name: hasattr(model, name) for name in
                           ("token_embeddings", "position_embeddings", "dropout", "blocks", "final_norm", "lm_head")},
            "blocks": ([type(b).__name__ for b in blocks] if isinstance(blocks, (nn.ModuleList, nn.Sequential))
                       else None),
            "head": None if not isinstance(head, nn.Linear) else [head.in_features, head.out_features,
                                                                   head.bias is not None],
            "dropouts": [m.p for m in model.modules() if isinstance(m, nn.Dropout)],
            "max_positions": getattr(model, "max_positions", None), "shapes": shapes,
            "parameters": {name: tuple(p.shape) for name, p in model.named_parameters()}}


@probe
def gpt_head_is_tied(seeds, GPT):
    dims = GPT_STRUCTURE_DIMS
    model = _gpt(GPT, dims)
    table, head = token_table(model), getattr(getattr(model, "lm_head", None), "weight", None)
    if table is None or head is None:
        raise AssertionError(f"GPT needs token_embeddings and lm_head: the exercise asks for {GPT_NAMES}.")
    # Behaviour: after a gradient step, is the head still the embedding table?
    g = seeds.generator(931)
    ids = torch.randint(0, dims["vocab_size"], (2, 9), generator=g)
    with torch.random.fork_rng():
        logits = student_call(model.train(), ids, name="GPT.forward", forbidden=GPT_SHORTCUTS, helpers=GPT_HELPERS)
        reference_lm_loss(logits, ids).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.5 * p.grad
    return {"same_parameter": head is table, "count": sum(p.numel() for p in model.parameters()),
            "difference_after_a_step": (float((head - table).abs().max().detach()) if head.shape == table.shape
                                        else None)}


GPT_VALUE_CASES = [(dict(vocab_size=31, d_model=12, num_layers=2, num_heads=3, max_positions=14), (2, 9)),
                   (dict(vocab_size=23, d_model=8, num_layers=3, num_heads=2, max_positions=10), (1, 10))]


def gpt_value_problem(seeds, i):
    dims, (B, T) = GPT_VALUE_CASES[i]
    g = seeds.generator(940 + i)
    state = gpt_state(g, **dims)
    ids = torch.randint(0, dims["vocab_size"], (B, T), generator=g)
    return dims, state, ids


@probe
def gpt_matches_gpt2(seeds, GPT):
    outputs = []
    for i in range(len(GPT_VALUE_CASES)):
        dims, state, ids = gpt_value_problem(seeds, i)
        model = load_into(_gpt(GPT, dims), state, "GPT", aliases=GPT_ALIASES)
        outputs.append(_run_gpt(model, ids))
    return outputs


# ---------------------------------------------------------------- exercise 4: lm_loss
LOSS_SHAPES = [(2, 7, 11), (3, 4, 5), (1, 2, 9)]


def loss_problem(seeds):
    g = seeds.generator(950)
    return [(torch.randn(*shape, generator=g, dtype=torch.float64) * 2,
             torch.randint(0, shape[-1], shape[:2], generator=g)) for shape in LOSS_SHAPES]


@probe
def lm_loss_values(seeds, lm_loss):
    results = []
    for logits, ids in loss_problem(seeds):
        logits = logits.clone().requires_grad_()
        loss = call(lm_loss, logits, ids, name="lm_loss", forbidden=LOSS_SHORTCUTS, forbidden_advice=ADVICE)
        if type(loss) is not torch.Tensor:
            raise AssertionError(f"lm_loss should return a torch tensor, not a {type(loss).__name__}: the training "
                                 "loop calls loss.backward() on it.")
        results.append((loss.detach(), loss.requires_grad))
    return results


# ---------------------------------------------------------------- exercise 5: perplexity
PPL_DIMS = dict(vocab_size=27, d_model=8, num_layers=2, num_heads=2, max_positions=12)


PPL_SHAPES = [(2, 9), (4, 5), (1, 12)]


def perplexity_problem(seeds):
    g = seeds.generator(960)
    state = gpt_state(g, **PPL_DIMS)
    return state, [torch.randint(0, PPL_DIMS["vocab_size"], shape, generator=g) for shape in PPL_SHAPES]


def watch_modes(model):
    """Record (batch size, train mode?, gradients on?) of every forward call."""
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(
        (int(args[0].shape[0]), bool(module.training), bool(torch.is_grad_enabled()))))
    return seen


@probe
def perplexity_values(seeds, perplexity):
    state, batches = perplexity_problem(seeds)
    model = reference_gpt(state, PPL_DIMS, dropout=0.3).train()
    seen = watch_modes(model)
    with torch.random.fork_rng():
        value = student_call(perplexity, model, batches, name="perplexity", helpers={"lm_loss": reference_lm_loss},
                             forbidden=PERPLEXITY_SHORTCUTS)
    if isinstance(value, torch.Tensor):
        raise AssertionError("perplexity should return a Python float (math.exp(...) or .item()), not a tensor.")
    if not isinstance(value, (float, int)):
        raise AssertionError(f"perplexity should return a float, not a {type(value).__name__}.")
    return float(value), seen


# ---------------------------------------------------------------- exercise 6: load_gpt2_weights
LOAD_DIMS = dict(vocab_size=31, d_model=12, num_layers=2, num_heads=3, max_positions=14)


ANY_SIZE_DIMS = dict(vocab_size=23, d_model=8, num_layers=3, num_heads=2, max_positions=20, d_ff=24)


def load_problem(seeds, n, dims):
    g = seeds.generator(n)
    state = gpt_state(g, **dims)
    ids = torch.randint(0, dims["vocab_size"], (2, dims["max_positions"]), generator=g)
    return state, ids


def _load(load_gpt2_weights, model, hf):
    result = call(load_gpt2_weights, model, hf, name="load_gpt2_weights", forbidden=LOADER_SHORTCUTS,
                  forbidden_advice=ADVICE)
    if result is not None and result is not model:
        raise AssertionError("load_gpt2_weights should copy into `model` (and return it), but it returned another "
                             "object.")
    return model


def fresh_reference(dims):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return ReferenceGPT(**dims).double().eval()


@probe
def load_gpt2_copies_every_weight(seeds, load_gpt2_weights):
    state, _ = load_problem(seeds, 970, LOAD_DIMS)
    model = _load(load_gpt2_weights, fresh_reference(LOAD_DIMS), hf_model(state, LOAD_DIMS))
    return {"state": dict(model.state_dict()),
            "tied": model.lm_head.weight is model.token_embeddings.embedding.weight}


@probe
def load_gpt2_parity(seeds, load_gpt2_weights):
    state, ids = load_problem(seeds, 971, LOAD_DIMS)
    model = _load(load_gpt2_weights, fresh_reference(LOAD_DIMS), hf_model(state, LOAD_DIMS))
    with torch.no_grad():
        return model(ids)


@probe
def load_gpt2_any_size(seeds, load_gpt2_weights):
    state, ids = load_problem(seeds, 972, ANY_SIZE_DIMS)
    hf = hf_model(state, ANY_SIZE_DIMS)
    model = _load(load_gpt2_weights, fresh_reference(ANY_SIZE_DIMS), hf.transformer)   # a GPT2Model this time
    with torch.no_grad():
        logits = model(ids)
    refusals = {}
    for label, dims in [("2 blocks", {**ANY_SIZE_DIMS, "num_layers": 2}),
                        ("16 positions", {**ANY_SIZE_DIMS, "max_positions": 16})]:
        refusals[label] = raised(load_gpt2_weights, fresh_reference(dims), hf, name="load_gpt2_weights",
                                 forbidden=LOADER_SHORTCUTS)
    return logits, refusals


# ---------------------------------------------------------------- exercise 7: configure_optimizer
OPTIMIZER_SHORTCUTS = ["courselib.gpt.pretrain"]


OPTIMIZER_DIMS = dict(vocab_size=19, d_model=8, num_layers=2, num_heads=2, max_positions=7)


OPTIMIZER_SETTINGS = dict(lr=0.03, weight_decay=0.25, betas=(0.85, 0.9))


OPTIMIZER_STEPS = 3


def optimizer_problem(seeds):
    """The weights, and one seeded gradient per parameter and step, by the notebook's parameter names."""
    g = seeds.generator(1200)
    state = gpt_state(g, **OPTIMIZER_DIMS)
    names = [name for name, _ in reference_gpt(state, OPTIMIZER_DIMS).named_parameters()]
    grads = [{name: torch.randn(state[name].shape, generator=g, dtype=torch.float64) for name in names}
             for _ in range(OPTIMIZER_STEPS)]
    return state, names, grads


def _optimizer(configure_optimizer, model):
    optimizer = call(configure_optimizer, model, **OPTIMIZER_SETTINGS, name="configure_optimizer",
                     forbidden=OPTIMIZER_SHORTCUTS, forbidden_advice=ADVICE)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise AssertionError(f"configure_optimizer should return a torch.optim.AdamW, not a {type(optimizer).__name__}.")
    return optimizer


@probe
def configure_optimizer_groups(seeds, configure_optimizer):
    state, _, _ = optimizer_problem(seeds)
    model = reference_gpt(state, OPTIMIZER_DIMS)
    optimizer = _optimizer(configure_optimizer, model)
    names = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)                     # the tied head is the token table: one name
    groups = [{"names": [names.get(id(p), "a tensor that is not a parameter of the model") for p in group["params"]],
               "weight_decay": float(group.get("weight_decay", -1.0)), "lr": float(group.get("lr", -1.0)),
               "betas": [float(b) for b in group.get("betas", ())]} for group in optimizer.param_groups]
    return {"kind": type(optimizer).__name__, "groups": groups}


@probe
def configure_optimizer_steps(seeds, configure_optimizer):
    state, names, grads = optimizer_problem(seeds)
    model = reference_gpt(state, OPTIMIZER_DIMS)
    optimizer = _optimizer(configure_optimizer, model)
    params = dict(model.named_parameters())

    def steps():
        for step_grads in grads:
            for name in names:
                params[name].grad = step_grads[name].clone()
            optimizer.step()
    call(steps, name="optimizer.step() of your configure_optimizer's AdamW")
    return {name: param.detach() for name, param in model.named_parameters()}


# ---------------------------------------------------------------- exercise 8: adamw_update
# torch's Adam family: the classes, the function behind them (decorated: the watch needs the function inside),
# each implementation it dispatches to, and the fused kernels
ADAMW_SHORTCUTS = ["torch.optim.AdamW", "torch.optim.Adam", "torch.optim.adam.adam.__wrapped__",
                   "torch.optim.adam._single_tensor_adam", "torch.optim.adam._multi_tensor_adam",
                   "torch.optim.adam._fused_adam", "torch._fused_adam_", "torch._fused_adamw_"]


# (shape, gradient scale, lr per step, betas, eps, weight_decay): a step with tiny gradients is where eps decides
ADAMW_FIRST_CASES = [((3, 4), 1.0, [0.1], (0.9, 0.999), 1e-8, 0.0),
                     ((5,), 1e-3, [0.05], (0.8, 0.99), 1e-8, 0.2),
                     ((2, 3), 2.0, [0.3], (0.9, 0.95), 1e-3, 0.5)]


ADAMW_STEP_CASES = [((4, 3), 1.0, [0.01, 0.03, 0.02, 0.05, 0.04, 0.01, 0.02, 0.03], (0.9, 0.999), 1e-8, 0.01),
                    ((6,), 1e-5, [0.1] * 6, (0.9, 0.95), 1e-8, 0.0),
                    ((3, 2), 0.5, [0.2, 0.1, 0.3, 0.2, 0.1], (0.8, 0.9), 1e-3, 0.7),
                    ((2, 2, 2), 3.0, [0.05] * 7, (0.5, 0.6), 0.1, 0.1)]


def adamw_problem(seeds, n, cases):
    """Per case: the starting tensor and one seeded gradient per step (float64)."""
    g = seeds.generator(n)
    problems = []
    for shape, scale, rates, *_ in cases:
        start = torch.randn(shape, generator=g, dtype=torch.float64)
        grads = [scale * torch.randn(shape, generator=g, dtype=torch.float64) for _ in rates]
        problems.append((start, grads))
    return problems


def _adamw(seeds, n, cases, adamw_update):
    results = []
    for (start, grads), (_, _, rates, betas, eps, weight_decay) in zip(adamw_problem(seeds, n, cases), cases):
        param, state, trajectory = nn.Parameter(start.clone()), {}, []
        for grad, lr in zip(grads, rates):
            with torch.no_grad():
                _, (after, kept) = call(adamw_update, param, grad.clone(), state, lr, betas=betas, eps=eps,
                                        weight_decay=weight_decay, name="adamw_update", forbidden=ADAMW_SHORTCUTS,
                                        forbidden_advice=ADVICE,
                                        capture=lambda: (param.detach().clone(), dict(state)))
            trajectory.append(after)
        if not {"step", "exp_avg", "exp_avg_sq"} <= set(kept):
            raise AssertionError(f"after a step, state should hold 'step', 'exp_avg' and 'exp_avg_sq'; it holds "
                                 f"{sorted(map(str, kept))}.")
        step = kept["step"]
        results.append({"trajectory": trajectory,
                        "step": float(step) if isinstance(step, (int, float)) or torch.is_tensor(step) else None,
                        "exp_avg": kept["exp_avg"], "exp_avg_sq": kept["exp_avg_sq"]})
    return results


@probe
def adamw_update_first_step(seeds, adamw_update):
    return _adamw(seeds, 1205, ADAMW_FIRST_CASES, adamw_update)


@probe
def adamw_update_matches_torch(seeds, adamw_update):
    return _adamw(seeds, 1206, ADAMW_STEP_CASES, adamw_update)


# ---------------------------------------------------------------- exercise 8: lr_at
LR_SHORTCUTS = ["torch.optim.lr_scheduler.LambdaLR", "torch.optim.lr_scheduler.LinearLR",
                "torch.optim.lr_scheduler.CosineAnnealingLR", "torch.optim.lr_scheduler.SequentialLR",
                "torch.optim.lr_scheduler.OneCycleLR", "torch.optim.lr_scheduler.CosineAnnealingWarmRestarts"]


def lr_value_cases(seeds):
    """Designed schedules: (max_lr, warmup_steps, total_steps, min_lr), every step from 0 to past the end."""
    r = seeds.random(1210)
    return [(1.0, 4, 12, 0.1), (r.choice([3e-4, 6e-4, 1e-3]), 1, 6, 0.0), (2.0, 3, 4, 0.5),
            (r.uniform(0.5, 2.0), r.randint(2, 5), r.randint(8, 15), r.uniform(0.01, 0.2))]


def lr_torch_cases(seeds):
    r = seeds.random(1211)
    cases = []
    for _ in range(3):
        warmup = r.randint(2, 20)
        peak = r.uniform(1e-4, 1e-2)
        cases.append((peak, warmup, warmup + r.randint(5, 80), peak * r.choice([0.0, 0.1, 0.05])))
    return cases


def _lr_values(lr_at, cases):
    results = []
    for max_lr, warmup, total, min_lr in cases:
        values = []
        for step in range(total + 4):
            value = call(lr_at, step, max_lr, warmup, total, min_lr, name="lr_at", forbidden=LR_SHORTCUTS,
                         forbidden_advice=ADVICE)
            if isinstance(value, torch.Tensor) or not isinstance(value, (float, int)):
                raise AssertionError(f"lr_at should return a Python float, not a {type(value).__name__}.")
            values.append(float(value))
        results.append(values)
    return results


@probe
def lr_at_values(seeds, lr_at):
    return _lr_values(lr_at, lr_value_cases(seeds))


@probe
def lr_at_matches_torch(seeds, lr_at):
    return _lr_values(lr_at, lr_torch_cases(seeds))


# ---------------------------------------------------------------- exercise 9: clip_grad_norm
CLIP_SHORTCUTS = ["torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_.__wrapped__",
                  "torch.nn.utils.clip_grad.clip_grad_norm",
                  "torch.nn.utils.clip_grad._clip_grads_with_norm_.__wrapped__",
                  "torch.nn.utils.clip_grad._get_total_norm.__wrapped__"]


def clip_cases(seeds, n, designed):
    """(gradients, or None for a parameter without one; max_norm) per case, in float64 and float32."""
    g = seeds.generator(n)
    cases = []
    if designed:
        grads = [torch.randn(3, 4, generator=g, dtype=torch.float64), None, torch.randn(5, generator=g, dtype=torch.float64)]
        norm = math.sqrt(sum(float(t.pow(2).sum()) for t in grads if t is not None))
        cases += [(grads, norm * 0.3), (grads, norm * 2.0),                      # clipped; left alone
                  ([torch.zeros(2, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)], 1.0),   # all zero
                  ([10 * torch.randn(7, generator=g, dtype=torch.float64)], 1.0)]  # one parameter
    else:
        for dtype in (torch.float64, torch.float32, torch.float64):
            grads = [torch.randn(*shape, generator=g, dtype=dtype) * scale
                     for shape, scale in [((6, 5), 1.0), ((5,), 3.0), ((2, 3, 4), 0.2), ((1,), 5.0)]]
            cases.append((grads, float(torch.rand(1, generator=g)) * 4 + 0.5))
    return cases


def _clip(clip_grad_norm, cases):
    results = []
    for grads, max_norm in cases:
        params = []
        for grad in grads:
            shape, dtype = ((1,), torch.float64) if grad is None else (grad.shape, grad.dtype)
            param = nn.Parameter(torch.zeros(shape, dtype=dtype))
            param.grad = None if grad is None else grad.clone()
            params.append(param)
        norm = call(clip_grad_norm, (p for p in params), max_norm, name="clip_grad_norm", forbidden=CLIP_SHORTCUTS,
                    forbidden_advice=ADVICE)
        if isinstance(norm, torch.Tensor) or not isinstance(norm, (float, int)):
            raise AssertionError(f"clip_grad_norm should return the norm as a Python float, not a "
                                 f"{type(norm).__name__}.")
        results.append((float(norm), [None if p.grad is None else p.grad.detach().clone() for p in params]))
    return results


@probe
def clip_grad_norm_values(seeds, clip_grad_norm):
    return _clip(clip_grad_norm, clip_cases(seeds, 1220, designed=True))


@probe
def clip_grad_norm_matches_torch(seeds, clip_grad_norm):
    return _clip(clip_grad_norm, clip_cases(seeds, 1221, designed=False))


# ---------------------------------------------------------------- exercise 10: train
TRAIN_SHORTCUTS = ["courselib.gpt.pretrain"]


TRAIN_DIMS = dict(vocab_size=17, d_model=8, num_layers=1, num_heads=2, max_positions=9)


TRAIN_STEPS, EVAL_EVERY, TRAIN_CLIP, RESUME_STEPS = 7, 3, 0.3, 9


def torch_clip(parameters, max_norm):
    """The reference for the student's clip_grad_norm, which train() calls: PyTorch's."""
    return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))


TRAIN_HELPERS = {"clip_grad_norm": torch_clip}


def train_problem(seeds, n):
    g = seeds.generator(n)
    state = gpt_state(g, **TRAIN_DIMS)
    batches = [torch.randint(0, TRAIN_DIMS["vocab_size"], (3, 9), generator=g) for _ in range(RESUME_STEPS)]
    held_out = torch.randint(0, TRAIN_DIMS["vocab_size"], (2, 9), generator=g)
    rates = [float(r) for r in 0.05 + 0.5 * torch.rand(RESUME_STEPS, generator=g, dtype=torch.float64)]
    return state, batches, held_out, rates


class Recorder:
    """A stand-in for TrainingMonitor that records what the loop reports."""

    def __init__(self):
        self.updates, self.held_outs = [], []

    def update(self, step, loss):
        self.updates.append((int(step), float(loss)))

    def held_out(self, step, loss):
        self.held_outs.append((int(step), float(loss)))


def _train(seeds, n, train, dropout=0.0):
    state, batches, held_out, rates = train_problem(seeds, n)
    model = reference_gpt(state, TRAIN_DIMS, dropout=dropout).eval()
    seen = watch_modes(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=99.0)   # never used as it is: the schedule sets every step
    queue = iter(batches)
    recorder = Recorder()
    runs = []
    with torch.random.fork_rng():
        for start, stop in ((0, TRAIN_STEPS), (TRAIN_STEPS, RESUME_STEPS)):   # a run, then its continuation
            result = student_call(train, model, optimizer, lambda: next(queue), stop, rates.__getitem__, held_out,
                                  eval_every=EVAL_EVERY, max_grad_norm=TRAIN_CLIP, start_step=start,
                                  monitor=recorder, name="train", helpers={"lm_loss": reference_lm_loss, **TRAIN_HELPERS},
                                  forbidden=TRAIN_SHORTCUTS)
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise AssertionError("train should return the pair (losses, held_out_losses).")
            runs.append(result)
    return model, seen, runs, recorder


def plain(x):
    return x.detach() if type(x) is torch.Tensor else x


@probe
def train_steps_match_reference(seeds, train):
    model, _, runs, recorder = _train(seeds, 980, train)
    out = []
    for losses, held_out_losses in runs:
        if not isinstance(losses, list) or not isinstance(held_out_losses, list):
            raise AssertionError("train should return two lists: (losses, held_out_losses).")
        out.append({"losses": [plain(x) for x in losses],
                    "held_out": [tuple(plain(v) for v in pair) if isinstance(pair, (tuple, list)) else plain(pair)
                                 for pair in held_out_losses]})
    return {"runs": out, "state": {name: p.detach() for name, p in model.named_parameters()},
            "reported": recorder.updates, "reported_held_out": recorder.held_outs}


@probe
def train_switches_modes(seeds, train):
    model, seen, _, _ = _train(seeds, 981, train, dropout=0.1)
    return seen, bool(model.training)


# ---------------------------------------------------------------- exercise 11: checkpoints
CHECKPOINT_DIMS = dict(vocab_size=23, d_model=8, num_layers=2, num_heads=2, max_positions=8)


CHECKPOINT_STEPS, CHECKPOINT_AT = 9, 4


def checkpoint_problem(seeds, n):
    g = seeds.generator(n)
    state = gpt_state(g, **CHECKPOINT_DIMS)
    stranger = gpt_state(g, **CHECKPOINT_DIMS)               # what a new session's model starts from
    data = torch.randint(0, CHECKPOINT_DIMS["vocab_size"], (30, CHECKPOINT_DIMS["max_positions"]), generator=g)
    return state, stranger, data, [seeds.seed(n + k) % 2 ** 31 for k in range(1, 5)]


def checkpoint_schedule(step):
    return reference_lr(step, 0.02, 3, CHECKPOINT_STEPS, 0.002)


def reference_lr(step, max_lr, warmup, total, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def checkpoint_steps(model, optimizer, generator, data, start, stop):
    """The recipe's steps start..stop-1, batches of 4 windows drawn from `generator`: the run both sides replay."""
    model.train()
    for step in range(start, stop):
        for group in optimizer.param_groups:
            group["lr"] = checkpoint_schedule(step)
        batch = data[torch.randint(len(data), (4,), generator=generator)]
        loss = reference_lm_loss(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def checkpoint_session(state, dropout, seed, generator_seed):
    """A model, its AdamW and a batch generator, as a session builds them (torch seeded with `seed`)."""
    torch.manual_seed(seed)
    model = reference_gpt(state, CHECKPOINT_DIMS, dropout=dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
    return model, optimizer, torch.Generator().manual_seed(generator_seed)


def _checkpoint(seeds, n, save_checkpoint, load_checkpoint, dropout):
    import tempfile
    state, stranger, data, (seed, generator_seed, new_seed, new_generator_seed) = checkpoint_problem(seeds, n)
    with torch.random.fork_rng():
        model, optimizer, generator = checkpoint_session(state, dropout, seed, generator_seed)
        uninterrupted = checkpoint_steps(model, optimizer, generator, data, 0, CHECKPOINT_STEPS)
        model, optimizer, generator = checkpoint_session(state, dropout, seed, generator_seed)
        checkpoint_steps(model, optimizer, generator, data, 0, CHECKPOINT_AT)
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/checkpoint.pt"
            call(save_checkpoint, path, model, optimizer, CHECKPOINT_AT, generator, name="save_checkpoint")
            model, optimizer, generator = checkpoint_session(stranger, dropout, new_seed, new_generator_seed)
            step = call(load_checkpoint, path, model, optimizer, generator, name="load_checkpoint")
        if isinstance(step, torch.Tensor):
            step = step.item()
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= CHECKPOINT_STEPS:
            raise AssertionError(f"load_checkpoint should return the saved step as an int, not {step!r}.")
        resumed = checkpoint_steps(model, optimizer, generator, data, step, CHECKPOINT_STEPS)
    return {"uninterrupted": uninterrupted, "resumed": resumed, "step": step,
            "identical": all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)}


@probe
def checkpoint_resumes_the_optimizer_and_step(seeds, save_checkpoint, load_checkpoint):
    return _checkpoint(seeds, 1230, save_checkpoint, load_checkpoint, dropout=0.0)


@probe
def checkpoint_resumes_the_randomness(seeds, save_checkpoint, load_checkpoint):
    return _checkpoint(seeds, 1240, save_checkpoint, load_checkpoint, dropout=0.3)


# ---------------------------------------------------------------- section 5: the training run learns
RUN_DIMS = dict(d_model=64, num_layers=2, num_heads=4, max_positions=64)


RUN_STEPS, RUN_BATCH, RUN_LR, RUN_FACTOR = 40, 8, 6e-3, 0.8


def run_data(seeds):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(stories.MODEL_DIR)
    story_seed = seeds.seed(1250) % 2 ** 31
    stream = stories.token_stream(tokenizer, stories.corpus(300, seed=story_seed))
    held = stories.token_stream(tokenizer, stories.corpus(40, seed=story_seed + 1))
    return (stories.windows(stream, RUN_DIMS["max_positions"]), stories.windows(held, RUN_DIMS["max_positions"]),
            len(tokenizer))


@probe
def training_run_learns(seeds, GPT, configure_optimizer, lr_at, train):
    windows, held_out, vocab_size = run_data(seeds)
    with torch.random.fork_rng():
        torch.manual_seed(seeds.seed(1251))
        model = call(GPT, vocab_size, RUN_DIMS["d_model"], RUN_DIMS["num_layers"], RUN_DIMS["num_heads"],
                     RUN_DIMS["max_positions"], name="GPT")
        optimizer = call(configure_optimizer, model, RUN_LR, name="configure_optimizer")
        order = torch.Generator().manual_seed(seeds.seed(1252))

        def loss_now():
            model.eval()
            with torch.no_grad():
                return float(reference_lm_loss(model(held_out), held_out))

        before = loss_now()
        call(train, model, optimizer, lambda: windows[torch.randint(len(windows), (RUN_BATCH,), generator=order)],
             RUN_STEPS, lambda step: lr_at(step, RUN_LR, 8, RUN_STEPS, RUN_LR / 10), held_out, eval_every=RUN_STEPS,
             name="train (your whole recipe)")
        after = loss_now()
    return {"before": before, "after": after, "vocab_size": vocab_size}


# ---------------------------------------------------------------- exercise 12: top_k_filter
def top_k_cases(seeds):
    g = seeds.generator(1001)
    random_rows = torch.randn(5, 9, generator=g) * 2
    cases = [(random_rows, k) for k in (1, 3, 8, 9, 12)]
    cases.append((torch.randn(2, 3, 7, generator=g) * 2, 2))
    # ties at the boundary are kept; ties above it don't add anything
    cases.append((torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0], [5.0, 4.0, 4.0, 1.0, 0.5]]), 2))
    cases.append((torch.tensor([[5.0, 4.0, 4.0, 1.0, 0.5]]), 3))
    return cases


def _filter(fn, logits, arg, name, forbidden):
    before = logits.clone()
    result = call(fn, logits, arg, name=name, forbidden=forbidden, forbidden_advice=ADVICE)
    if not torch.equal(before, logits):
        raise AssertionError(f"{name} changed its input in place: return a filtered copy (logits.masked_fill(...), "
                             "not masked_fill_), because the caller still needs the logits.")
    if type(result) is not torch.Tensor:
        raise AssertionError(f"{name} should return a tensor, not a {type(result).__name__}.")
    return result


@probe
def top_k_filter_values(seeds, top_k_filter):
    outputs = [_filter(top_k_filter, logits, k, "top_k_filter", TOP_K_SHORTCUTS) for logits, k in top_k_cases(seeds)]
    errors = [raised(top_k_filter, torch.zeros(2, 4), k, name="top_k_filter", forbidden=TOP_K_SHORTCUTS)
              for k in (0, -2)]
    return outputs, errors


def midway_p(logits, after):
    """A p halfway between the mass of the `after` most probable tokens and the next one, for every row."""
    probs = torch.sort(torch.softmax(logits.double(), dim=-1), dim=-1, descending=True).values
    mass = torch.cumsum(probs, dim=-1)
    return float(((mass[..., after - 1] + mass[..., after]) / 2).reshape(-1)[0])


def top_p_value_cases(seeds):
    g = seeds.generator(1002)
    cases = []
    for after in (1, 3, 6):
        row = torch.randn(1, 10, generator=g) * 1.5
        cases.append((row, midway_p(row, after)))               # the nucleus ends well away from p
    cases.append((torch.randn(6, 10, generator=g) * 1.5, 0.55))  # several rows: the zone test decides boundaries
    cases.append((torch.randn(2, 2, 8, generator=g) * 1.5, 0.8))
    designed = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]]).log()
    cases += [(designed, 0.6), (designed, 0.4), (designed, 0.85)]
    return cases


@probe
def top_p_filter_values(seeds, top_p_filter):
    return [_filter(top_p_filter, logits, p, "top_p_filter", TOP_P_SHORTCUTS) for logits, p in top_p_value_cases(seeds)]


def top_p_edge_cases(seeds):
    g = seeds.generator(1003)
    spread = torch.randn(3, 12, generator=g)
    spread[:, :4] = -45.0                                          # tokens whose probability rounds to nothing
    return {"p = 1 with a tail that float32 rounds away": [(torch.tensor([[0.0, 0.0, -60.0]]), 1.0), (spread, 1.0)],
            "ties": [(torch.tensor([[2.0, 1.0, 1.0, 0.0]]), 0.7), (torch.tensor([[1.0, 1.0, 1.0, 1.0]]), 0.3),
                     (torch.tensor([[3.0, 0.5, 0.5, 0.5, -1.0]]), 0.9)],
            "a tiny p keeps only the most probable token": [(torch.randn(4, 9, generator=g), 1e-9)]}


@probe
def top_p_filter_edges(seeds, top_p_filter):
    outputs = {label: [_filter(top_p_filter, logits, p, "top_p_filter", TOP_P_SHORTCUTS) for logits, p in cases]
               for label, cases in top_p_edge_cases(seeds).items()}
    errors = [raised(top_p_filter, torch.zeros(1, 4), p, name="top_p_filter", forbidden=TOP_P_SHORTCUTS)
              for p in (0.0, -0.5, 1.5)]
    return outputs, errors


# ---------------------------------------------------------------- exercise 14: sample_next
SAMPLES = 12_000


def sampling_logits(seeds):
    """Six logits with a guaranteed spread (a permuted ramp plus noise), so that every temperature shows."""
    g = seeds.generator(1010)
    ramp = torch.linspace(-2.0, 1.5, 6)
    return (ramp + 0.1 * torch.randn(6, generator=g))[torch.randperm(6, generator=g)]


def sampling_cases(seeds):
    logits = sampling_logits(seeds)
    tempered = lambda t: logits / t  # noqa: E731
    return [dict(temperature=1.0), dict(temperature=0.5), dict(temperature=2.0), dict(temperature=1.0, top_k=3),
            dict(temperature=1.3, top_p=midway_p(tempered(1.3)[None], 2)),
            dict(temperature=0.7, top_k=4, top_p=midway_p(top_k_only(tempered(0.7), 4)[None], 2))], logits


def top_k_only(logits, k):
    return reference_top_k_filter(logits, k)


def _sample(sample_next, logits, generator, **kwargs):
    return student_call(sample_next, logits, generator, name="sample_next", forbidden=SAMPLE_SHORTCUTS,
                        helpers={"top_k_filter": reference_top_k_filter, "top_p_filter": reference_top_p_filter},
                        **kwargs)


@probe
def sample_next_distribution(seeds, sample_next):
    cases, logits = sampling_cases(seeds)
    draws = []
    for i, settings in enumerate(cases):
        with torch.random.fork_rng():
            draws.append(_sample(sample_next, logits.expand(SAMPLES, 6), seeds.generator(1020 + i), **settings))
    return draws


def greedy_logits(seeds):
    g = seeds.generator(1030)
    ramp = torch.linspace(-3.0, 3.0, 11)                    # gaps of 0.6: the argmax is never in doubt
    return torch.stack([ramp[torch.randperm(11, generator=g)] for _ in range(7)])


@probe
def sample_next_greedy_limit(seeds, sample_next):
    logits = greedy_logits(seeds)
    with torch.random.fork_rng():
        outputs = {"temperature 0": _sample(sample_next, logits, seeds.generator(1031), temperature=0)}
        for label, scale, temperature in [("temperature 1e-4", 1, 1e-4),
                                          ("temperature 1e-4 on logits in the hundreds", 50, 1e-4)]:
            try:
                outputs[label] = _sample(sample_next, scale * logits, seeds.generator(1033), temperature=temperature)
            except AssertionError as error:
                raise AssertionError(f"{error}\n(At temperature {temperature:g} the scaled logits reach the ten "
                                     "thousands: exp overflows to inf, and inf / inf is NaN. Use a stable softmax, "
                                     "torch.softmax, which subtracts the maximum first.)") from None
        outputs.update({
            "temperature 0 with top_k=3": _sample(sample_next, logits, seeds.generator(1032), temperature=0, top_k=3),
            "top_k=1": _sample(sample_next, logits, seeds.generator(1035), temperature=1.0, top_k=1),
            "top_p=1e-6": _sample(sample_next, logits, seeds.generator(1036), temperature=1.0, top_p=1e-6)})
    error = raised(sample_next, logits, seeds.generator(1037), name="sample_next", forbidden=SAMPLE_SHORTCUTS,
                   temperature=-0.5)
    return outputs, error


@probe
def sample_next_generator(seeds, sample_next):
    g = seeds.generator(1040)
    logits = 0.1 * torch.randn(2, 3, 40, generator=g)
    seed_a, seed_b = seeds.seed(1041), seeds.seed(1042)
    with torch.random.fork_rng():
        torch.manual_seed(seeds.seed(1043))
        before = torch.get_rng_state()
        first = _sample(sample_next, logits, torch.Generator().manual_seed(seed_a))
        untouched = torch.equal(before, torch.get_rng_state())
        again = _sample(sample_next, logits, torch.Generator().manual_seed(seed_a))
        other = _sample(sample_next, logits, torch.Generator().manual_seed(seed_b))
        # one generator for two calls, as generate() passes it: each call must draw new numbers from it
        shared = torch.Generator().manual_seed(seeds.seed(1044))
        fresh = shared.get_state()
        one = _sample(sample_next, logits, shared)
        advanced = not torch.equal(fresh, shared.get_state())
        two = _sample(sample_next, logits, shared)
    return {"first": first, "again": again, "other": other, "untouched": untouched,
            "one after the other": (one, two), "advanced": advanced}


# ---------------------------------------------------------------- exercise 15: generate
GEN_DIMS = dict(vocab_size=37, d_model=12, num_layers=2, num_heads=3, max_positions=20)


def generate_problem(seeds):
    g = seeds.generator(1050)
    return gpt_state(g, **GEN_DIMS), torch.randint(0, GEN_DIMS["vocab_size"], (2, 5), generator=g)


def _generate(generate, *args, **kwargs):
    return student_call(generate, *args, name="generate", helpers={"sample_next": reference_sample_next},
                        forbidden=GENERATE_SHORTCUTS, **kwargs)


@probe
def generate_matches_hf_greedy(seeds, generate):
    state, prompt = generate_problem(seeds)
    model = reference_gpt(state, GEN_DIMS)
    with torch.random.fork_rng():
        greedy = _generate(generate, model, prompt, 9)
        nothing = _generate(generate, model, prompt, 0)
        sampled = [_generate(generate, model, prompt, 6, generator=torch.Generator().manual_seed(seeds.seed(1051)),
                             temperature=1.0) for _ in range(2)]
    return greedy, nothing, sampled


CONTEXT_CASES = [(11, 1, False), (8, 4, False), (10, 1, True), (3, 8, True)]


@probe
def generate_checks_the_context(seeds, generate):
    dims = {**GEN_DIMS, "max_positions": 10}
    model = reference_gpt(gpt_state(seeds.generator(1060), **dims), dims)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(int(args[0].shape[1])))
    results = []
    for length, new, fits in CONTEXT_CASES:
        calls.clear()
        prompt = torch.randint(0, dims["vocab_size"], (1, length), generator=seeds.generator(1061))
        if fits:
            with torch.random.fork_rng():
                out = _generate(generate, model, prompt, new)
            results.append(("ok", tuple(out.shape) if hasattr(out, "shape") else None, list(calls)))
        else:
            error = raised(generate, model, prompt, new, name="generate", forbidden=GENERATE_SHORTCUTS,
                           helpers={"sample_next": reference_sample_next})
            results.append((error, None, list(calls)))
    return results


# ---------------------------------------------------------------- exercise 17: generate_batch
BATCH_SHORTCUTS = ["courselib.gpt.generate", f"{__name__}.reference_generate", HF_GENERATE]


BATCH_DIMS = dict(vocab_size=29, d_model=12, num_layers=2, num_heads=3, max_positions=24)


def reference_forward_padded(model, input_ids, positions, attention_mask):
    """The notebook's forward_padded (given there): logits (B, T, V) of rows whose tokens sit at `positions`, each
    reading the earlier real tokens of its row (attention_mask 1); a pad reads itself only."""
    B, T = input_ids.shape
    x = model.token_embeddings(input_ids) + model.position_embeddings.table(positions)
    eye = torch.eye(T, dtype=torch.bool, device=x.device)
    mask = (torch.ones(T, T, dtype=torch.bool, device=x.device).tril() & attention_mask.bool()[:, None, None, :]) | eye
    for block in model.blocks:
        attn, d = block.self_attn, x.shape[-1]
        q, k, v = (t.view(B, T, attn.num_heads, -1).transpose(1, 2) for t in attn.c_attn(block.norm1(x)).split(d, 2))
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + block.dropout(attn.c_proj(heads.transpose(1, 2).reshape(B, T, d)))
        x = x + block.dropout(block.ffn(block.norm2(x)))
    return model.lm_head(model.final_norm(x))


def greedy_continuation(model, prompt, steps):
    """The reference's greedy tokens after one unpadded prompt (a list): what choosing the cases' eos reads."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


def batch_cases(seeds, n):
    """(description, prompts, max_new_tokens, eos_token_id, pad_token_id) of the check, and the weights. For
    generate_batch_matches_hf (n = 1140) no row writes eos; for generate_batch_stops_at_eos (1150) some do."""
    g = seeds.generator(n)
    state = gpt_state(g, **BATCH_DIMS)
    model = reference_gpt(state, BATCH_DIMS)
    V = BATCH_DIMS["vocab_size"]

    def prompts(lengths, first=None):
        rows = [torch.randint(1, V, (length,), generator=g).tolist() for length in lengths]
        return [[first] + row[1:] for row in rows] if first is not None else rows

    if n == 1140:
        mixed = prompts([5, 2, 7, 3])
        written = {token for row in mixed for token in greedy_continuation(model, row, 8)}
        unused = [token for token in range(1, V) if token not in written]
        eos = unused[0] if unused else V - 1
        opening = prompts([4, 1, 6, 2], first=0)        # every prompt opens with token 0, also the pad and eos
        return state, [("prompts of lengths 5, 2, 7 and 3", mixed, 8, eos, 0 if eos else V - 1),
                       ("token 0 opens every prompt and is also the pad and the end of sequence", opening, 8, 0, 0)]
    mixed = prompts([3, 6, 2])
    ends = greedy_continuation(model, mixed[2], 3)[2]    # the shortest prompt's third new token
    single = prompts([4])
    stop = greedy_continuation(model, single[0], 3)[2]
    return state, [("the third row ends early; the others go on", mixed, 8, ends, V - 1 if ends != V - 1 else 0),
                   ("one prompt that ends after 3 tokens or fewer", single, 8, stop, V - 1 if stop != V - 1 else 0)]


def _batch(seeds, n, generate_batch):
    state, cases = batch_cases(seeds, n)
    model = reference_gpt(state, BATCH_DIMS)
    passes = []
    model.lm_head.register_forward_hook(lambda module, args, output: passes.append(int(args[0].shape[0])))
    results = []
    for description, prompts, new, eos, pad in cases:
        passes.clear()
        with torch.random.fork_rng():
            out = student_call(generate_batch, model, [list(row) for row in prompts], new, eos, pad,
                               name="generate_batch", helpers={"forward_padded": reference_forward_padded},
                               forbidden=BATCH_SHORTCUTS)
        if type(out) is not torch.Tensor:
            raise AssertionError(f"generate_batch should return a (B, T0 + new) tensor of ids, not a "
                                 f"{type(out).__name__}.")
        results.append({"ids": out, "passes": list(passes)})
    return results


@probe
def generate_batch_matches_hf(seeds, generate_batch):
    return _batch(seeds, 1140, generate_batch)


@probe
def generate_batch_stops_at_eos(seeds, generate_batch):
    return _batch(seeds, 1150, generate_batch)


# ---------------------------------------------------------------- exercise 16: forward_with_cache
CACHE_DIMS = dict(vocab_size=29, d_model=12, num_layers=2, num_heads=3, max_positions=16)


def _cached(forward_with_cache, model, ids, cache, sizes):
    try:
        logits = call(forward_with_cache, model, ids, cache, name="forward_with_cache", forbidden=CACHE_SHORTCUTS,
                      forbidden_advice="compute from the model's submodules (model(...) and a block's forward "
                                       "recompute every position, which is what the cache is for)")
    except AssertionError as error:
        if sizes:
            raise AssertionError(f"{error}\n(The call after {sizes[-1]} cached positions failed. Both the keys and the "
                                 "values must grow by the new tokens at every call: concatenate each along dim=2 and "
                                 "store the pair in cache[i].)") from None
        raise
    if type(logits) is not torch.Tensor:
        raise AssertionError(f"forward_with_cache should return the logits tensor, not a {type(logits).__name__}.")
    for i, entry in enumerate(cache):
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and all(type(t) is torch.Tensor for t in entry)):
            raise AssertionError(f"after a call, cache[{i}] should be the pair (keys, values) of block {i}, found "
                                 f"{type(entry).__name__}.")
    sizes.append(int(ids.shape[1]) + (sizes[-1] if sizes else 0))
    return logits


def cache_problem(seeds, n, dims, length):
    g = seeds.generator(n)
    return gpt_state(g, **dims), torch.randint(0, dims["vocab_size"], (2, length), generator=g)


@probe
def kv_cache_shapes(seeds, forward_with_cache):
    state, ids = cache_problem(seeds, 1070, CACHE_DIMS, 6)
    model = reference_gpt(state, CACHE_DIMS)
    cache, sizes, found = [None] * CACHE_DIMS["num_layers"], [], []
    with torch.no_grad():
        for chunk in (ids[:, :5], ids[:, 5:6]):
            logits = _cached(forward_with_cache, model, chunk, cache, sizes)
            found.append((tuple(logits.shape), [(tuple(k.shape), tuple(v.shape)) for k, v in cache]))
    return found


MATCH_SPLITS = [(0, 4)] + [(t, t + 1) for t in range(4, 14)]


CHUNK_SPLITS = [(0, 3), (3, 8), (8, 9), (9, 12)]


def _stepwise(seeds, n, forward_with_cache, dims, length, splits):
    state, ids = cache_problem(seeds, n, dims, length)
    model = reference_gpt(state, dims)
    cache, sizes = [None] * dims["num_layers"], []
    with torch.no_grad():
        return torch.cat([_cached(forward_with_cache, model, ids[:, a:b], cache, sizes) for a, b in splits], dim=1)


@probe
def kv_cache_matches_uncached(seeds, forward_with_cache):
    return _stepwise(seeds, 1080, forward_with_cache, GEN_DIMS, 14, MATCH_SPLITS)


@probe
def kv_cache_chunks(seeds, forward_with_cache):
    return _stepwise(seeds, 1090, forward_with_cache, GEN_DIMS, 12, CHUNK_SPLITS)


def bytes_cases(seeds):
    r = seeds.random(1100)
    cases = [dict(num_layers=r.randint(1, 48), num_kv_heads=r.randint(1, 16), d_head=r.choice([16, 32, 64, 128]),
                  seq_len=r.randint(1, 4096), batch_size=r.randint(2, 8), bytes_per_value=r.choice([1, 2, 8]))
             for _ in range(3)]
    cases.append(dict(num_layers=r.randint(1, 48), num_kv_heads=r.randint(1, 16), d_head=64,
                      seq_len=r.randint(1, 4096)))
    return cases


@probe
def kv_cache_bytes_values(seeds, kv_cache_bytes):
    return [call(kv_cache_bytes, name="kv_cache_bytes", forbidden=BYTES_SHORTCUTS, forbidden_advice=ADVICE, **case)
            for case in bytes_cases(seeds)]


# ---------------------------------------------------------------- exercise 18: LlamaAttention
LLAMA_SHORTCUTS = ["courselib.llama_model.LlamaAttention", "courselib.llama_model.LlamaBlock",
                   "courselib.llama_model.Llama", f"{__name__}.ReferenceLlamaAttention",
                   f"{__name__}.ReferenceLlamaBlock", f"{__name__}.ReferenceLlama",
                   "transformers.models.llama.modeling_llama.LlamaAttention",
                   "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
                   "transformers.models.llama.modeling_llama.eager_attention_forward",
                   "transformers.models.llama.modeling_llama.LlamaDecoderLayer",
                   "transformers.models.llama.modeling_llama.LlamaModel",
                   "transformers.models.llama.modeling_llama.LlamaForCausalLM"]


LLAMA_ATTENTION_STRUCTURE = (16, 4, 2)


def _llama_attention(LlamaAttention, d_model, num_heads, num_kv_heads, rope_base=10000.0):
    return build(LlamaAttention, d_model, num_heads, num_kv_heads, rope_base=rope_base, forbidden=LLAMA_SHORTCUTS,
                 name=f"LlamaAttention({d_model}, {num_heads}, {num_kv_heads}, rope_base={rope_base:g})")


def _run_llama(module, x, name):
    return run(module, x, name=name, forbidden=LLAMA_SHORTCUTS)


@probe
def llama_attention_structure(seeds, LlamaAttention):
    d_model, num_heads, num_kv_heads = LLAMA_ATTENTION_STRUCTURE
    attn = _llama_attention(LlamaAttention, d_model, num_heads, num_kv_heads).eval()
    g = seeds.generator(1300)
    shapes = [tuple(_run_llama(attn, torch.randn(*shape, generator=g), "LlamaAttention.forward").shape)
              for shape in [(2, 5, d_model), (1, 1, d_model), (3, 6, d_model)]]
    return {"parameters": {name: tuple(p.shape) for name, p in attn.named_parameters()}, "shapes": shapes,
            "heads": [getattr(attn, "num_heads", None), getattr(attn, "num_kv_heads", None)]}


LLAMA_ATTENTION_CASES = [dict(d_model=16, num_heads=4, num_kv_heads=2, rope_base=10000.0, B=2, T=7),
                         dict(d_model=12, num_heads=3, num_kv_heads=1, rope_base=500.0, B=1, T=6),
                         dict(d_model=16, num_heads=2, num_kv_heads=2, rope_base=10000.0, B=2, T=5)]


def llama_attention_state(g, d_model, num_heads, num_kv_heads, prefix=""):
    d_head = d_model // num_heads

    def mat(rows, columns):
        return torch.randn(rows, columns, generator=g, dtype=torch.float64) / math.sqrt(columns) * 1.5

    return {f"{prefix}q_proj.weight": mat(num_heads * d_head, d_model),
            f"{prefix}k_proj.weight": mat(num_kv_heads * d_head, d_model),
            f"{prefix}v_proj.weight": mat(num_kv_heads * d_head, d_model),
            f"{prefix}o_proj.weight": mat(d_model, num_heads * d_head)}


def llama_attention_problem(seeds, i, case):
    g = seeds.generator(1310 + i)
    state = llama_attention_state(g, case["d_model"], case["num_heads"], case["num_kv_heads"])
    return state, torch.randn(case["B"], case["T"], case["d_model"], generator=g, dtype=torch.float64)


@probe
def llama_attention_matches_llama(seeds, LlamaAttention):
    outputs = []
    for i, case in enumerate(LLAMA_ATTENTION_CASES):
        state, x = llama_attention_problem(seeds, i, case)
        attn = _llama_attention(LlamaAttention, case["d_model"], case["num_heads"], case["num_kv_heads"],
                                case["rope_base"])
        load_into(attn, state, "LlamaAttention")
        outputs.append(_run_llama(attn, x, "LlamaAttention.forward"))
    return outputs


# ---------------------------------------------------------------- exercise 19: LlamaBlock and Llama
LLAMA_HELPERS = {"LlamaAttention": ReferenceLlamaAttention}


LLAMA_MODEL_SHORTCUTS = ["courselib.llama_model.LlamaBlock", "courselib.llama_model.Llama", f"{__name__}.ReferenceLlamaBlock",
                         f"{__name__}.ReferenceLlama", "transformers.models.llama.modeling_llama.LlamaAttention",
                         "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
                         "transformers.models.llama.modeling_llama.eager_attention_forward",
                         "transformers.models.llama.modeling_llama.LlamaDecoderLayer",
                         "transformers.models.llama.modeling_llama.LlamaModel",
                         "transformers.models.llama.modeling_llama.LlamaForCausalLM"]


LLAMA_STRUCTURE_DIMS = dict(vocab_size=31, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=40,
                            max_positions=12)


LLAMA_VALUE_CASES = [(dict(vocab_size=37, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=40,
                           max_positions=12, eps=1e-5, rope_base=10000.0), (2, 12)),
                     (dict(vocab_size=29, d_model=12, num_layers=1, num_heads=3, num_kv_heads=1, d_ff=24,
                           max_positions=9, eps=0.1, rope_base=500.0), (1, 9))]


def _llama(Llama, dims):
    described = ", ".join(f"{k}={v}" for k, v in dims.items())
    return build(Llama, **dims, name=f"Llama({described})", helpers=LLAMA_HELPERS, forbidden=LLAMA_MODEL_SHORTCUTS)


def llama_state(g, vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff, **_):
    """Random weights for a whole Llama, by the notebook's (Hugging Face's, without "model.") names."""
    def vec(n):
        return 1.0 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)

    def mat(rows, columns, scale=1.0):
        return torch.randn(rows, columns, generator=g, dtype=torch.float64) * scale / math.sqrt(columns)

    state = {"embed_tokens.weight": 0.5 * torch.randn(vocab_size, d_model, generator=g, dtype=torch.float64)}
    for i in range(num_layers):
        prefix = f"layers.{i}."
        state[prefix + "input_layernorm.weight"] = vec(d_model)
        state.update(llama_attention_state(g, d_model, num_heads, num_kv_heads, prefix + "self_attn."))
        state[prefix + "post_attention_layernorm.weight"] = vec(d_model)
        state.update({prefix + "mlp.gate_proj.weight": mat(d_ff, d_model), prefix + "mlp.up_proj.weight": mat(d_ff, d_model),
                      prefix + "mlp.down_proj.weight": mat(d_model, d_ff)})
    state["norm.weight"] = vec(d_model)
    state["lm_head.weight"] = mat(vocab_size, d_model, scale=2.0)
    return state


def llama_value_problem(seeds, i):
    dims, (B, T) = LLAMA_VALUE_CASES[i]
    g = seeds.generator(1320 + i)
    return dims, llama_state(g, **dims), torch.randint(0, dims["vocab_size"], (B, T), generator=g)


@probe
def llama_structure(seeds, Llama):
    dims = LLAMA_STRUCTURE_DIMS
    model = _llama(Llama, dims).eval()
    g = seeds.generator(1330)
    shapes = [tuple(run(model, torch.randint(0, dims["vocab_size"], (B, T), generator=g), name="Llama.forward",
                        forbidden=LLAMA_MODEL_SHORTCUTS, helpers=LLAMA_HELPERS).shape) for B, T in [(2, 7), (1, 12)]]
    head, table = getattr(getattr(model, "lm_head", None), "weight", None), getattr(getattr(model, "embed_tokens", None),
                                                                                   "weight", None)
    return {"parameters": {name: tuple(p.shape) for name, p in model.named_parameters()}, "shapes": shapes,
            "tied": head is not None and head is table, "max_positions": getattr(model, "max_positions", None),
            "dropouts": sum(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())}


@probe
def llama_matches_hf(seeds, Llama):
    outputs = []
    for i in range(len(LLAMA_VALUE_CASES)):
        dims, state, ids = llama_value_problem(seeds, i)
        model = load_into(_llama(Llama, dims), state, "Llama")
        outputs.append(run(model, ids, name="Llama.forward", forbidden=LLAMA_MODEL_SHORTCUTS, helpers=LLAMA_HELPERS))
    return outputs


# ---------------------------------------------------------------- exercise 22: llama_forward_with_cache
LLAMA_CACHE_SHORTCUTS = ["courselib.llama_model.LlamaAttention", "courselib.llama_model.LlamaBlock",
                         "courselib.llama_model.Llama", f"{__name__}.ReferenceLlamaAttention",
                         f"{__name__}.ReferenceLlamaBlock", f"{__name__}.ReferenceLlama",
                         "transformers.models.llama.modeling_llama.LlamaAttention",
                         "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
                         "transformers.models.llama.modeling_llama.LlamaDecoderLayer",
                         "transformers.models.llama.modeling_llama.LlamaModel",
                         "transformers.models.llama.modeling_llama.LlamaForCausalLM"]


LLAMA_CACHE_DIMS = dict(vocab_size=31, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=24,
                        max_positions=16, eps=1e-5, rope_base=500.0)


# the prompt, single tokens, a chunk of three after the cache, single tokens again
LLAMA_CACHE_SPLITS = [(0, 4), (4, 5), (5, 6), (6, 9), (9, 10), (10, 11)]


LLAMA_CACHE_HELPERS = {"apply_rope": apply_rope, "grouped_query_attention": grouped_query_attention}


def llama_cache_problem(seeds, n):
    g = seeds.generator(n)
    dims = LLAMA_CACHE_DIMS
    return llama_state(g, **dims), torch.randint(0, dims["vocab_size"], (2, LLAMA_CACHE_SPLITS[-1][1]), generator=g)


def _llama_cached(seeds, n, llama_forward_with_cache):
    state, ids = llama_cache_problem(seeds, n)
    with torch.random.fork_rng():
        model = ReferenceLlama(**LLAMA_CACHE_DIMS).double()
    model.load_state_dict(state, strict=True)
    model.eval()
    cache, logits, shapes = [None] * LLAMA_CACHE_DIMS["num_layers"], [], []
    for a, b in LLAMA_CACHE_SPLITS:
        with torch.no_grad():
            out, entries = student_call(llama_forward_with_cache, model, ids[:, a:b], cache,
                                        name="llama_forward_with_cache", helpers=LLAMA_CACHE_HELPERS,
                                        forbidden=LLAMA_CACHE_SHORTCUTS, capture=lambda: list(cache))
        if type(out) is not torch.Tensor:
            raise AssertionError(f"llama_forward_with_cache should return the logits tensor, not a {type(out).__name__}.")
        for i, entry in enumerate(entries):
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and all(torch.is_tensor(x) for x in entry)):
                raise AssertionError(f"after a call, cache[{i}] should be the pair (keys, values) of layer {i}, found "
                                     f"{type(entry).__name__}.")
        logits.append(out)
        shapes.append([(tuple(k.shape), tuple(v.shape)) for k, v in entries])
    return {"logits": logits, "shapes": shapes}


@probe
def llama_cache_shapes(seeds, llama_forward_with_cache):
    return _llama_cached(seeds, 1340, llama_forward_with_cache)["shapes"]


@probe
def llama_cache_matches_uncached(seeds, llama_forward_with_cache):
    return _llama_cached(seeds, 1350, llama_forward_with_cache)["logits"]


# ---------------------------------------------------------------- exercise 20 (optional): speculative decoding
SPEC_TARGET = dict(vocab_size=37, d_model=12, num_layers=2, num_heads=3, max_positions=24)


SPEC_DRAFT = dict(vocab_size=37, d_model=8, num_layers=1, num_heads=2, max_positions=24)


def speculative_problem(seeds):
    g = seeds.generator(1110)
    return gpt_state(g, **SPEC_TARGET), gpt_state(g, **SPEC_DRAFT), torch.randint(0, 37, (1, 4), generator=g)


def _speculate(fn, target, draft, prompt, new, num_draft):
    with torch.random.fork_rng():
        return student_call(fn, target, draft, prompt, new, num_draft=num_draft, name="speculative_generate",
                            helpers={"generate": reference_generate}, forbidden=SPECULATIVE_SHORTCUTS)


@probe
def speculative_matches_greedy(seeds, speculative_generate):
    target_state, draft_state, prompt = speculative_problem(seeds)
    target, draft = reference_gpt(target_state, SPEC_TARGET), reference_gpt(draft_state, SPEC_DRAFT)
    twin = reference_gpt(target_state, SPEC_TARGET)
    return [_speculate(speculative_generate, target, draft, prompt, 12, 3),
            _speculate(speculative_generate, target, twin, prompt[:, :2], 7, 1)]


@probe
def speculative_saves_target_calls(seeds, speculative_generate):
    target_state, _, prompt = speculative_problem(seeds)
    target, twin = reference_gpt(target_state, SPEC_TARGET), reference_gpt(target_state, SPEC_TARGET)
    calls = []
    target.register_forward_pre_hook(lambda module, args: calls.append(int(args[0].shape[1])))
    output = _speculate(speculative_generate, target, twin, prompt, 15, 4)
    return output, calls
