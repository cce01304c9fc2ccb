"""Hidden checks for 09_gpt. Each check is one grade cell's hidden part: a probe and a judge.

The probe runs in the student's kernel: it builds the hidden inputs and weights from `seeds`, calls
the student's code through `call` and returns plain data (outputs, state_dict tensors, recorded
modes, sampled ids). The judge runs in the grader: it rebuilds the same inputs and weights from the
same seeds and compares with independent oracles:
- transformers' `GPT2Block`, `GPT2LMHeadModel` (logits, `generate`) and its causal-LM loss,
  holding the check's weights in GPT-2's own layout (`hf_state` transposes into Conv1D's (in, out));
- transformers' logits warpers (`TopKLogitsWarper`, `TopPLogitsWarper`, `TemperatureLogitsWarper`)
  and exact binomial tail bounds for sampling;
- hand-written SGD steps and torch's meta tensors for the training loop and the cache's size.

Every exercise is graded on its own: the GPT class is built with a reference `DecoderBlock` swapped
in; the loader, the loss, the training loop, `generate` and the KV cache run on the course's
reference `courselib.gpt.GPT` (same submodule names as the notebook's); `sample_next` gets
reference filters, `generate` a reference `sample_next`.

Statistical tests (sample_next_distribution) compare counts with exact binomial quantiles at a
false-failure rate of at most 1e-9 per tail, union-bounded over every category of every case: under
1e-7 per run, whatever the seeds (they change with the grader's token).
"""
import inspect
import math
import torch
from torch import nn
from autograder.checks.common import call, probe, reference_globals
from courselib import gpt as reference
from courselib.attention import MultiHeadAttention, causal_mask
from courselib.blocks import FeedForward, LayerNorm


BLOCK_SHORTCUTS = ["courselib.gpt.Block", "courselib.gpt.causal_attention", "courselib.blocks.EncoderLayer",
                   "torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer",
                   "transformers.models.gpt2.modeling_gpt2.GPT2Block"]


GPT_SHORTCUTS = ["courselib.gpt.GPT", "courselib.gpt.Block", "courselib.gpt.causal_attention",
                 "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
                 "transformers.models.gpt2.modeling_gpt2.GPT2Model"]


LOSS_SHORTCUTS = ["courselib.gpt.lm_loss", "transformers.loss.loss_utils.ForCausalLMLoss"]


PERPLEXITY_SHORTCUTS = ["courselib.gpt.perplexity"]


LOADER_SHORTCUTS = ["courselib.gpt.load_gpt2_weights", "courselib.gpt._gpt2_pairs", "courselib.gpt.to_gpt2"]


TRAIN_SHORTCUTS = ["courselib.gpt.pretrain"]


TOP_K_SHORTCUTS = ["courselib.gpt.top_k_filter", "transformers.generation.logits_process.TopKLogitsWarper"]


TOP_P_SHORTCUTS = ["courselib.gpt.top_p_filter", "transformers.generation.logits_process.TopPLogitsWarper"]


SAMPLE_SHORTCUTS = ["courselib.gpt.sample_next", "transformers.generation.logits_process.TemperatureLogitsWarper"]


# transformers' generate is decorated (@torch.no_grad()): the watch needs the function inside, whose code is its own
HF_GENERATE = "transformers.generation.utils.GenerationMixin.generate.__wrapped__"


GENERATE_SHORTCUTS = ["courselib.gpt.generate", HF_GENERATE]


CACHE_SHORTCUTS = ["courselib.gpt.GPT", "courselib.gpt.Block", "courselib.gpt.causal_attention"]


BYTES_SHORTCUTS = ["courselib.gpt.kv_cache_bytes"]


SPECULATIVE_SHORTCUTS = [HF_GENERATE]


ADVICE = "the exercise asks you to write this yourself"


# ---------------------------------------------------------------- weights the checks choose
def block_state(g, d_model, d_ff, prefix=""):
    """Random weights for one block, in the notebook's names (float64). LayerNorm gains away from 1."""
    def mat(*shape, scale):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    state = {}
    for norm in ("norm1", "norm2"):
        state[f"{prefix}{norm}.weight"] = 1.0 + mat(d_model, scale=0.3)
        state[f"{prefix}{norm}.bias"] = mat(d_model, scale=0.2)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        state[f"{prefix}self_attn.{proj}.weight"] = mat(d_model, d_model, scale=1 / math.sqrt(d_model))
        state[f"{prefix}self_attn.{proj}.bias"] = mat(d_model, scale=0.2)
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


def hf_block_state(state, prefix=""):
    """One block's weights in GPT-2's layout: Conv1D weights are (in, out), c_attn is [W_Q W_K W_V]."""
    def get(name):
        return state[prefix + name]

    return {"ln_1.weight": get("norm1.weight"), "ln_1.bias": get("norm1.bias"),
            "attn.c_attn.weight": torch.cat([get(f"self_attn.{p}_proj.weight") for p in "qkv"]).T.contiguous(),
            "attn.c_attn.bias": torch.cat([get(f"self_attn.{p}_proj.bias") for p in "qkv"]),
            "attn.c_proj.weight": get("self_attn.out_proj.weight").T.contiguous(),
            "attn.c_proj.bias": get("self_attn.out_proj.bias"),
            "ln_2.weight": get("norm2.weight"), "ln_2.bias": get("norm2.bias"),
            "mlp.c_fc.weight": get("ffn.linear1.weight").T.contiguous(), "mlp.c_fc.bias": get("ffn.linear1.bias"),
            "mlp.c_proj.weight": get("ffn.linear2.weight").T.contiguous(), "mlp.c_proj.bias": get("ffn.linear2.bias")}


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
    """The course's reference GPT (float64, eval) holding the check's weights: what graded functions run on."""
    with torch.random.fork_rng():
        model = reference.GPT(**dims, dropout=dropout).double()
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


def run(module, *args, name, forbidden=(), **kwargs):
    """module(*args) quietly and without gradients; the result must be a plain tensor."""
    with torch.no_grad():
        result = student_call(module, *args, name=name, forbidden=forbidden, **kwargs)
    if type(result) is not torch.Tensor:
        raise AssertionError(f"{name} should return a tensor, but it returned {type(result).__name__}.")
    return result


def raised(fn, *args, name, forbidden=(), helpers=None, **kwargs):
    """The name of the exception the student's code raises for these arguments, or None."""
    def attempt():
        try:
            fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as error:  # the exception is the answer here
            return type(error).__name__
        return None
    own = inspect.unwrap(fn)
    with reference_globals(own, **(helpers or {})):
        return call(attempt, name=name, forbidden=forbidden, forbidden_advice=ADVICE)


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


# ---------------------------------------------------------------- reference pieces swapped in
class ReferenceDecoderBlock(nn.Module):
    """The notebook's DecoderBlock (same names, same API), for grading the GPT class on its own."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, eps=1e-5):
        super().__init__()
        self.norm1 = LayerNorm(d_model, eps)
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, approximate="tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.self_attn(self.norm1(x), mask=causal_mask(x.shape[1], x.device))[0])
        return x + self.dropout(self.ffn(self.norm2(x)))


BLOCK_STRUCTURE_CASE = (12, 3, 20)


def _block(DecoderBlock, d_model, num_heads, d_ff, eps=1e-5, dropout=0.0):
    return build(DecoderBlock, d_model, num_heads, d_ff, dropout=dropout, eps=eps, forbidden=BLOCK_SHORTCUTS,
                 name=f"DecoderBlock({d_model}, {num_heads}, {d_ff}, dropout={dropout}, eps={eps:g})")


@probe
def decoder_block_structure(seeds, DecoderBlock):
    d_model, num_heads, d_ff = BLOCK_STRUCTURE_CASE
    block = _block(DecoderBlock, d_model, num_heads, d_ff, dropout=0.25)
    g = seeds.generator(901)
    shapes = [tuple(run(block.eval(), torch.randn(*shape, generator=g), name="DecoderBlock.forward",
                        forbidden=BLOCK_SHORTCUTS).shape)
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
        outputs.append(run(block, x, name="DecoderBlock.forward", forbidden=BLOCK_SHORTCUTS))
    return outputs


CAUSAL_CUTS = (8, 5, 2)


def causal_problem(seeds):
    g = seeds.generator(920)
    state = block_state(g, 8, 24)
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    changes = [torch.randn(2, 9 - t, 8, generator=g, dtype=torch.float64) for t in CAUSAL_CUTS]
    return state, x, changes


@probe
def decoder_block_is_causal(seeds, DecoderBlock):
    state, x, changes = causal_problem(seeds)
    block = load_into(_block(DecoderBlock, 8, 2, 24), state, "DecoderBlock")
    base = run(block, x, name="DecoderBlock.forward", forbidden=BLOCK_SHORTCUTS)
    changed = []
    for t, new in zip(CAUSAL_CUTS, changes):
        edited = x.clone()
        edited[:, t:] = new
        changed.append(run(block, edited, name="DecoderBlock.forward", forbidden=BLOCK_SHORTCUTS))
    return base, changed


# ---------------------------------------------------------------- exercise 2: GPT
GPT_NAMES = ("token_embeddings, position_embeddings, dropout, blocks (nn.ModuleList of DecoderBlock), final_norm, "
             "lm_head (nn.Linear(d_model, vocab_size, bias=False), tied)")


GPT_ALIASES = {"token_embeddings.embedding.weight": "token_embeddings.weight",
               "position_embeddings.table.weight": "position_embeddings.weight"}


GPT_STRUCTURE_DIMS = dict(vocab_size=29, d_model=12, num_layers=2, num_heads=3, max_positions=16)


def _gpt(GPT, dims, dropout=0.0):
    return build(GPT, dims["vocab_size"], dims["d_model"], dims["num_layers"], dims["num_heads"],
                 dims["max_positions"], dropout=dropout, name="GPT({vocab_size}, {d_model}, {num_layers}, "
                 "{num_heads}, {max_positions})".format(**dims), helpers={"DecoderBlock": ReferenceDecoderBlock},
                 forbidden=GPT_SHORTCUTS)


def token_table(model):
    embeddings = getattr(model, "token_embeddings", None)
    table = getattr(embeddings, "embedding", embeddings)
    return getattr(table, "weight", None)


@probe
def gpt_structure(seeds, GPT):
    dims = GPT_STRUCTURE_DIMS
    model = _gpt(GPT, dims, dropout=0.2).eval()
    g = seeds.generator(930)
    shapes = [tuple(run(model, torch.randint(0, dims["vocab_size"], (B, T), generator=g), name="GPT.forward",
                        forbidden=GPT_SHORTCUTS).shape) for B, T in [(2, 7), (1, 16), (3, 1)]]
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
        logits = call(model.train(), ids, name="GPT.forward", forbidden=GPT_SHORTCUTS, forbidden_advice=ADVICE)
        reference.lm_loss(logits, ids).backward()
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
        outputs.append(run(model, ids, name="GPT.forward", forbidden=GPT_SHORTCUTS))
    return outputs


# ---------------------------------------------------------------- exercise 3: lm_loss
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


# ---------------------------------------------------------------- exercise 4: perplexity
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
        value = student_call(perplexity, model, batches, name="perplexity", helpers={"lm_loss": reference.lm_loss},
                             forbidden=PERPLEXITY_SHORTCUTS)
    if isinstance(value, torch.Tensor):
        raise AssertionError("perplexity should return a Python float (math.exp(...) or .item()), not a tensor.")
    if not isinstance(value, (float, int)):
        raise AssertionError(f"perplexity should return a float, not a {type(value).__name__}.")
    return float(value), seen


# ---------------------------------------------------------------- exercise 5: load_gpt2_weights
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
        return reference.GPT(**dims).double().eval()


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


# ---------------------------------------------------------------- exercise 6: train
TRAIN_DIMS = dict(vocab_size=17, d_model=8, num_layers=1, num_heads=2, max_positions=9)


TRAIN_STEPS, EVAL_EVERY, TRAIN_LR = 7, 3, 0.2


def train_problem(seeds, n):
    g = seeds.generator(n)
    state = gpt_state(g, **TRAIN_DIMS)
    batch = torch.randint(0, TRAIN_DIMS["vocab_size"], (3, 9), generator=g)
    held_out = torch.randint(0, TRAIN_DIMS["vocab_size"], (2, 9), generator=g)
    return state, [batch] * TRAIN_STEPS, held_out   # one batch, seen 7 times: a loss that must fall


def _train(seeds, n, train):
    state, batches, held_out = train_problem(seeds, n)
    model = reference_gpt(state, TRAIN_DIMS).eval()
    seen = watch_modes(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=TRAIN_LR)
    result = student_call(train, model, optimizer, batches, held_out, eval_every=EVAL_EVERY, name="train",
                          helpers={"lm_loss": reference.lm_loss}, forbidden=TRAIN_SHORTCUTS)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("train should return the pair (losses, held_out_losses).")
    return model, seen, result


@probe
def train_steps_match_reference(seeds, train):
    model, _, (losses, held_out_losses) = _train(seeds, 980, train)
    if not isinstance(losses, list) or not isinstance(held_out_losses, list):
        raise AssertionError("train should return two lists: (losses, held_out_losses).")
    plain = lambda x: x.detach() if type(x) is torch.Tensor else x  # noqa: E731
    return {"losses": [plain(x) for x in losses],
            "held_out": [tuple(plain(v) for v in pair) if isinstance(pair, (tuple, list)) else plain(pair)
                         for pair in held_out_losses],
            "state": {name: p.detach() for name, p in model.named_parameters()}}


@probe
def train_switches_modes(seeds, train):
    model, seen, _ = _train(seeds, 981, train)
    return seen, bool(model.training)


# ---------------------------------------------------------------- exercise 7: top_k_filter
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


# ---------------------------------------------------------------- exercise 9: sample_next
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
    return reference.top_k_filter(logits, k)


def _sample(sample_next, logits, generator, **kwargs):
    return student_call(sample_next, logits, generator, name="sample_next", forbidden=SAMPLE_SHORTCUTS,
                        helpers={"top_k_filter": reference.top_k_filter, "top_p_filter": reference.top_p_filter},
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
    return first, again, other, untouched


# ---------------------------------------------------------------- exercise 10: generate
GEN_DIMS = dict(vocab_size=37, d_model=12, num_layers=2, num_heads=3, max_positions=20)


def generate_problem(seeds):
    g = seeds.generator(1050)
    return gpt_state(g, **GEN_DIMS), torch.randint(0, GEN_DIMS["vocab_size"], (2, 5), generator=g)


def _generate(generate, *args, **kwargs):
    return student_call(generate, *args, name="generate", helpers={"sample_next": reference.sample_next},
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
                           helpers={"sample_next": reference.sample_next})
            results.append((error, None, list(calls)))
    return results


# ---------------------------------------------------------------- exercise 11: forward_with_cache
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


# ---------------------------------------------------------------- exercise 13 (optional): speculative decoding
SPEC_TARGET = dict(vocab_size=37, d_model=12, num_layers=2, num_heads=3, max_positions=24)


SPEC_DRAFT = dict(vocab_size=37, d_model=8, num_layers=1, num_heads=2, max_positions=24)


def speculative_problem(seeds):
    g = seeds.generator(1110)
    return gpt_state(g, **SPEC_TARGET), gpt_state(g, **SPEC_DRAFT), torch.randint(0, 37, (1, 4), generator=g)


def _speculate(fn, target, draft, prompt, new, num_draft):
    with torch.random.fork_rng():
        return student_call(fn, target, draft, prompt, new, num_draft=num_draft, name="speculative_generate",
                            helpers={"generate": reference.generate}, forbidden=SPECULATIVE_SHORTCUTS)


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
