"""The seam between a later notebook and what the learner wrote in an earlier one.

    apply_rope = earlier("03_positional_encoding", "apply_rope")
    RMSNorm, SwiGLUFeedForward = earlier("07_encoder", "RMSNorm", "SwiGLUFeedForward")

`earlier` looks for the learner's notebook beside the current one (`../03_positional_encoding/
03_positional_encoding.ipynb` from the folder the kernel runs in, as in `course/`), takes the answer cell that
defines each name (an nbgrader answer cell, found by its grade_id's cell and the names it defines), the
notebook's import cell and any definition-only cells the answer needs, and executes them in a fresh namespace.
It then runs each object on a small input and compares it with courselib's reference. The learner's version is
used if it runs and agrees; otherwise the reference is, and one printed line says which and why:

    apply_rope: yours, from 03_positional_encoding (it agrees with courselib's reference on a small input)
    RMSNorm: courselib's reference (07_encoder's answer raises NotImplementedError: the exercise is unfinished)

Under grading (`courselib.training.grading()`) the reference is always used: a hidden test never depends on
another notebook, and the grading sandbox holds only the graded notebook's folder.
The learner's code runs in this kernel, with torch's random state and thread count kept as they were.
"""
import ast
import builtins
import importlib
import json
import pathlib

import torch

from courselib.training import grading

# name -> (the notebook that teaches it, the dotted name of courselib's reference)
REFERENCES = {
    "apply_rope": ("03_positional_encoding", "courselib.llama.apply_rope"),
    "grouped_query_attention": ("05_multi_head_attention", "courselib.llama.grouped_query_attention"),
    "RMSNorm": ("07_encoder", "courselib.llama.RMSNorm"),
    "SwiGLUFeedForward": ("07_encoder", "courselib.llama.SwiGLUFeedForward"),
    "CausalSelfAttention": ("09_gpt", "courselib.fused_gpt.CausalSelfAttention"),
    "DecoderBlock": ("09_gpt", "courselib.fused_gpt.Block"),
    "GPT": ("09_gpt", "courselib.fused_gpt.GPT"),
    "LayerNorm": ("07_encoder", "courselib.blocks.LayerNorm"),
    "FeedForward": ("07_encoder", "courselib.blocks.FeedForward"),
    "EncoderLayer": ("07_encoder", "courselib.blocks.EncoderLayer"),
}


class Unusable(Exception):
    """The learner's version cannot be used; the message says why."""


def reference(name):
    module, _, attribute = REFERENCES[name][1].rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def earlier(notebook, *names, root=None, quiet=False):
    """The learner's `names` from their notebook `notebook` (e.g. "03_positional_encoding"), each checked on a
    small input, or courselib's reference for any that is missing, unfinished or disagrees. Returns one object
    for one name, a tuple for several. `root` is the folder holding the notebooks' folders (default: the parent
    of the current folder)."""
    for name in names:
        if name not in REFERENCES:
            raise KeyError(f"the seam knows {', '.join(REFERENCES)}; not {name!r}")
    found, reasons = {}, {}
    if grading():
        reasons = {name: "graded runs use the references: a hidden test never depends on another notebook"
                   for name in names}
    else:
        try:
            namespace = load_answers(notebook, names, root)
        except Unusable as why:
            reasons = {name: str(why) for name in names}
        else:
            for name in names:
                try:
                    found[name] = vet(name, namespace[name], notebook)
                except Unusable as why:
                    reasons[name] = str(why)
    chosen = []
    for name in names:
        if name in found:
            line = f"{name}: yours, from {notebook} (it agrees with courselib's reference on a small input)"
            chosen.append(found[name])
        else:
            line = f"{name}: courselib's reference ({reasons[name]})"
            chosen.append(reference(name))
        if not quiet:
            print(line)
    return chosen[0] if len(chosen) == 1 else tuple(chosen)


# ------------------------------------------------------------------------------------ reading the notebook
def notebook_path(notebook, root=None):
    root = pathlib.Path.cwd().parent if root is None else pathlib.Path(root)
    return root / notebook / f"{notebook}.ipynb"


def defined_names(tree):
    """Names a cell's top-level statements define (functions, classes, imports, assignments)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def used_names(tree):
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def definition_only(tree):
    """A cell that only defines (imports, functions, classes, constants): safe to run for its definitions."""
    def constant(value):
        return all(isinstance(n, (ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Load, ast.UnaryOp, ast.USub,
                                  ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow))
                   for n in ast.walk(value))
    return all(isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
               or (isinstance(node, ast.Assign) and constant(node.value))
               or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
               for node in tree.body)


def load_answers(notebook, names, root=None):
    """Execute the notebook's import cell, the answer cells defining `names` and the definition-only cells they
    need, in a fresh namespace. Raises Unusable with the reason."""
    path = notebook_path(notebook, root)
    if not path.is_file():
        raise Unusable(f"{path.parent.name}/{path.name} not found beside this notebook")
    try:
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    except (OSError, ValueError, KeyError) as error:
        raise Unusable(f"{path.name} is unreadable ({type(error).__name__})") from None
    parsed = []
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            parsed.append((cell, source, ast.parse(source)))
        except SyntaxError:
            parsed.append((cell, source, None))
    if not parsed or parsed[0][2] is None:
        raise Unusable(f"{path.name} has no readable import cell")
    chosen = [0]
    for name in names:
        answers = [i for i, (cell, _, tree) in enumerate(parsed)
                   if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and tree is not None
                   and name in defined_names(tree)]
        if not answers:
            raise Unusable(f"{notebook} has no answer cell that defines {name} (or it does not parse)")
        chosen.append(answers[-1])
    available = set(dir(builtins))
    for i in list(chosen):
        available |= defined_names(parsed[i][2])
    missing = set().union(*(used_names(parsed[i][2]) for i in chosen)) - available
    for i, (cell, _, tree) in enumerate(parsed):   # definition-only cells that define what the answers use
        if missing and i not in chosen and tree is not None and definition_only(tree) and defined_names(tree) & missing:
            chosen.append(i)
            missing -= defined_names(tree)
    namespace = {"__name__": f"earlier_{notebook}"}
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):   # an import cell that seeds torch must not move this notebook's seed
            for i in sorted(set(chosen)):
                cell, source, _ = parsed[i]
                exec(compile(source, f"{notebook}.ipynb, cell {i}", "exec"), namespace)   # noqa: S102 (the learner's own code)
    except Exception as error:
        raise Unusable(f"{notebook}'s cells raise {type(error).__name__}: {error}") from None
    finally:
        torch.set_num_threads(threads)
    return namespace


# ------------------------------------------------------------------------------------ checking what was found
def vet(name, candidate, notebook):
    """The candidate if it runs on a small input and agrees with the reference; else Unusable with the reason."""
    try:
        with torch.random.fork_rng(devices=[]):
            difference = SMOKE_TESTS[name](candidate, reference(name))
    except NotImplementedError:
        raise Unusable(f"{notebook}'s answer raises NotImplementedError: the exercise is unfinished") from None
    except Exception as error:
        raise Unusable(f"yours raises {type(error).__name__} on a small input: {error}") from None
    if not difference <= 1e-9:
        raise Unusable(f"yours differs from it by {difference:.2g} on a small input: check {notebook}'s tests")
    return candidate


def _largest_difference(ours, theirs):
    ours = ours if isinstance(ours, (tuple, list)) else (ours,)
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    if len(ours) != len(theirs):
        raise ValueError(f"it returns {len(ours)} values, the reference {len(theirs)}")
    return max(float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")
               for a, b in zip(ours, theirs))


def _smoke_rope(fn, ref):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 5, 8, generator=g,
                                                                                   dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 9])
    return max(_largest_difference(fn(q, k), ref(q, k)),
               _largest_difference(fn(q, k, positions, base=500.0), ref(q, k, positions, base=500.0)))


def _smoke_gqa(fn, ref):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    return _largest_difference(fn(q, k, v, mask), ref(q, k, v, mask))


def _smoke_module(*args):
    def smoke(cls, ref):
        g = torch.Generator().manual_seed(2)
        ours, theirs = cls(*args).double().eval(), ref(*args).double().eval()
        with torch.no_grad():
            for param in theirs.parameters():
                param.copy_(torch.randn(param.shape, generator=g, dtype=torch.float64))
        ours.load_state_dict(theirs.state_dict())   # the same parameter names, or an error
        x = torch.randn(2, 3, args[0], generator=g, dtype=torch.float64)
        with torch.no_grad():
            return _largest_difference(ours(x), theirs(x))
    return smoke


def _smoke_gpt(cls, ref):
    g = torch.Generator().manual_seed(3)
    ours, theirs = cls(30, 8, 2, 2, 6).double().eval(), ref(30, 8, 2, 2, 6).double().eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(torch.randn(param.shape, generator=g, dtype=torch.float64))
    ours.load_state_dict(theirs.state_dict())   # 09's parameter names (lm_head tied to the token embedding)
    ids = torch.randint(30, (2, 6), generator=g)
    with torch.no_grad():
        return _largest_difference(ours(ids), theirs(ids))


def _smoke_encoder_layer(cls, ref):
    """07's EncoderLayer (d_model, num_heads, d_ff, dropout, norm_first): post-LN and pre-LN both."""
    return max(_smoke_module(8, 2, 12, 0.0, norm_first)(cls, ref) for norm_first in (False, True))


SMOKE_TESTS = {"apply_rope": _smoke_rope, "grouped_query_attention": _smoke_gqa,
               "RMSNorm": _smoke_module(8), "SwiGLUFeedForward": _smoke_module(8, 12),
               "CausalSelfAttention": _smoke_module(8, 2), "DecoderBlock": _smoke_module(8, 2, 16), "GPT": _smoke_gpt,
               "LayerNorm": _smoke_module(8), "FeedForward": _smoke_module(8, 12), "EncoderLayer": _smoke_encoder_layer}
