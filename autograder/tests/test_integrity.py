"""Integrity decided in the grader (autograder/integrity.py), attacked as a determined student would.

The grader reads the hand-in's source: every route to the grader's machinery or to code reached
indirectly is flagged for the instructor's review, naming the cell, and costs nothing (it is a suspicion:
`exec` or `globals()` prove nothing by themselves); an answer whose code reaches its exercise's oracle
fails that test and is flagged. The kernel's own watch and guard can only add to that. Each route has
an attack here that must be found, and the idioms of correct answers must not be: a correct answer
never loses a point or gets a flag (`%timeit`, `"x" not in globals()`, a total_ordering class, a
checkpoint loaded with weights_only=False among them). A few attacks run the whole path (04 graded in the
sandbox), where the source's verdict must hold even when the attack hides from the kernel's watch, and one
runs at class level beside an honest classmate. The harm a notebook can do to the grader is bounded:
findings, messages and images in the report, the kernel's own output, what the grader buffers.
"""
import json
import os
import subprocess
import sys

import nbformat
import pytest

from autograder import classroom, demo, integrity
from autograder.config import REPO_ROOT
from autograder.submissions import student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import self_attention as attention

A04 = "04_self_attention"
IMPORTS = (None, "import math\nimport sys\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\n"
                 "from torch import nn\n")

# (name, code in a student's cell, words of its finding)
ROUTES = [
    ("exec", "exec('F.softmax')", "runs code from a string"),
    ("eval", "f = eval('F.soft' + 'max')", "runs code from a string"),
    ("compile", "code = compile('1', 'x', 'eval')", "compiles code"),
    ("dunder import", "m = __import__('torch')", "imports by name"),
    ("importlib", "import importlib\nm = importlib.import_module('torch.nn.functional')", "imports by name"),
    ("computed getattr on a module", "f = getattr(torch, 'soft' + 'max')", "computed at run time"),
    ("computed getattr through a variable", "name = 'softmax'\nf = getattr(F, name)", "computed at run time"),
    ("computed getattr through an alias", "m = torch\nf = getattr(m, 'soft' + 'max')", "computed at run time"),
    ("attrgetter", "import operator\nf = operator.attrgetter('soft' + 'max')(torch)", "computed names"),
    ("vars", "f = vars(torch)['softmax']", "namespace as a dict"),
    ("globals", "g = globals()", "namespace as a dict"),
    ("__dict__", "f = torch.__dict__['softmax']", "`__dict__`"),
    ("__globals__", "def f(): pass\ng = f.__globals__", "`__globals__`"),
    ("__subclasses__", "classes = object.__subclasses__()", "`__subclasses__`"),
    ("__builtins__", "b = __builtins__", "`__builtins__`"),
    ("builtins", "import builtins\nbuiltins.print = None", "Python's builtins"),
    ("sys.modules", "sys.modules['torch'].softmax", "`sys.modules`"),
    ("sys.settrace", "sys.settrace(lambda *a: None)", "`sys.settrace`"),
    ("sys.setprofile", "sys.setprofile(None)", "`sys.setprofile`"),
    ("sys._getframe", "frame = sys._getframe(1)", "`sys._getframe`"),
    ("rebinding stdout", "sys.stdout = open('x', 'w')", "rebinds part of `sys`"),
    ("a thread", "import threading\nthreading.Thread(target=print).start()", "starts threads"),
    ("_thread", "import _thread\n_thread.start_new_thread(print, ())", "starts threads"),
    ("concurrent futures", "from concurrent.futures import ThreadPoolExecutor", "threads or processes"),
    ("multiprocessing", "import multiprocessing", "starts processes"),
    ("subprocess", "import subprocess", "starts programs"),
    ("os.system", "import os\nos.system('true')", "`os.system`"),
    ("os.write to the grader's stdout", "import os\nos.write(1, b'{}')", "`os.write`"),
    ("ctypes", "import ctypes", "calls C code"),
    ("gc", "import gc\nobjects = gc.get_objects()", "garbage collector"),
    ("inspect frames", "import inspect\nframe = inspect.currentframe()", "frames and live objects"),
    ("types.FunctionType", "import types\nf = types.FunctionType(compile('1','x','eval'), {})", "code objects"),
    ("pickle", "import pickle\npickle.loads(b'')", "pickles"),
    ("code in a magic", "%timeit exec('F.softmax')", "runs code from a string"),
    ("code in a cell magic", "%%time\nf = eval('F.soft' + 'max')", "runs code from a string"),
    ("get_ipython", "get_ipython().events.register('pre_run_cell', print)", "IPython's shell"),
    ("a display hook", "ip = get_ipython()\nip.display_pub.register_hook(lambda message: None)", "IPython's shell"),
    ("a magic", "%load_ext autoreload", "IPython's shell"),
    ("globals() kept", "if 'x' in globals():\n    g = globals()", "namespace as a dict"),
    ("IPython internals", "from IPython.core.interactiveshell import InteractiveShell", "IPython's machinery"),
    ("ipykernel", "import ipykernel", "the kernel's machinery"),
    ("the autograder", "from autograder.checks import common", "reaches the grader"),
    ("the gradebook", "import sqlite3\nsqlite3.connect('gradebook.db')", "opens a database"),
    ("torch function modes", "from torch.overrides import TorchFunctionMode", "how torch dispatches"),
    ("torch's mode stack", "torch._C._set_torch_function_mode(None)", "how torch dispatches"),
    ("monkeypatching torch", "torch.allclose = lambda *a, **k: True", "monkeypatching"),
    ("monkeypatching F", "F.softmax = print", "monkeypatching"),
    ("monkeypatching through setattr", "setattr(torch, 'allclose', print)", "monkeypatching"),
    ("monkeypatching numpy", "np.testing.assert_allclose = print", "monkeypatching"),
    ("monkeypatching a method", "torch.Tensor.__eq__ = lambda a, b: True", "monkeypatching"),
    ("a __torch_function__", "class T(torch.Tensor):\n    @classmethod\n    def __torch_function__(c, *a):\n"
                             "        return True", "defines `__torch_function__`"),
    ("signal handlers", "import signal\nsignal.signal(14, print)", "signal handlers"),
    ("atexit", "import atexit", "at exit"),
    ("weakref finalizers", "import weakref\nweakref.finalize(print, print)", "when an object dies"),
    ("breakpoint", "breakpoint()", "debugger"),
]

# Idioms of correct answers: none of them may be a route.
CORRECT = [
    ("a changed default dtype", "torch.set_default_dtype(torch.float64)\nx = torch.zeros(2)\n"
                                "torch.set_default_dtype(torch.float32)"),
    ("seeding and determinism settings", "torch.manual_seed(0)\nnp.random.seed(0)\nimport random\nrandom.seed(0)\n"
                                         "torch.use_deterministic_algorithms(True)\n"
                                         "torch.backends.cudnn.deterministic = True\ntorch.backends.cudnn.benchmark = False"),
    ("einsum and baddbmm", "def f(q, k):\n    s = torch.einsum('bqd,bkd->bqk', q, k)\n"
                           "    return torch.baddbmm(s, q, k.transpose(1, 2), beta=0.0)"),
    ("in-place ops", "def f(x):\n    y = x.clone()\n    y -= y.max(-1, keepdim=True).values\n    y.exp_()\n"
                     "    y /= y.sum(-1, keepdim=True)\n    return y"),
    ("a caching class", "class Cache:\n    def __init__(self):\n        self.store = {}\n"
                        "    def __call__(self, key, make):\n        if key not in self.store:\n"
                        "            self.store[key] = make()\n        return self.store[key]\n"
                        "    def __len__(self):\n        return len(self.store)\n"
                        "    def __repr__(self):\n        return f'{type(self).__name__}({len(self)})'"),
    ("NumPy round trips", "def f(x):\n    a = x.detach().cpu().numpy()\n    return torch.from_numpy(np.exp(a - a.max()))"),
    ("functools", "import functools\n@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else "
                  "fib(n - 1) + fib(n - 2)\ntotal = functools.reduce(lambda a, b: a + b, [1, 2])\n"
                  "g = functools.partial(fib, 3)"),
    ("modules with computed names on self", "class M(nn.Module):\n    def __init__(self, n):\n"
                                            "        super().__init__()\n        for i in range(n):\n"
                                            "            setattr(self, f'layer{i}', nn.Linear(2, 2))\n"
                                            "    def forward(self, x):\n        for i in range(2):\n"
                                            "            x = getattr(self, f'layer{i}')(x)\n        return x"),
    ("noise on stderr", "print('note', file=sys.stderr)\nsys.stderr.write('note\\n')\nimport logging, warnings\n"
                        "logging.getLogger('x').warning('note')\nwarnings.warn('note')"),
    ("progress bars and displays", "from tqdm.auto import tqdm\nfrom IPython.display import display, HTML\n"
                                   "for _ in tqdm(range(2)):\n    pass\ndisplay(HTML('<b>x</b>'))"),
    ("environment settings", "import os\nos.environ['TOKENIZERS_PARALLELISM'] = 'false'\np = os.path.join('a', 'b')"),
    ("dataclasses and type names", "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int = 0\n"
                                   "name = type(P()).__name__\nq = P.__init__"),
    ("torch.load of weights", "state = torch.load('x.pt', weights_only=True)"),
    ("computed names on objects handed in", "def copy(ours, theirs):\n    for name in ('q_proj', 'k_proj'):\n"
                                            "        getattr(ours, name).weight.copy_(getattr(theirs.attn, name).weight)\n"
                                            "        setattr(ours, name + '_copied', True)"),
    ("an unregistered submodule", "class C(nn.Module):\n    def __init__(self, encoder):\n"
                                  "        super().__init__()\n        self.__dict__['encoder'] = encoder"),
    ("plots", "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)\nplt.plot([1, 2])"),
    ("timing with %timeit and %%time", "%timeit -n 3 -r 1 torch.randn(3, 4).exp()\n"),
    ("a cell magic that times", "%%time\nx = torch.randn(3, 4).exp()"),
    ("%matplotlib", "%matplotlib inline"),
    ("a membership test on globals()", "if 'timings' not in globals():\n    timings = {}"),
    ("a total_ordering class of hypotheses", "import functools\n@functools.total_ordering\nclass Hypothesis:\n"
                                             "    def __init__(self, score):\n        self.score = score\n"
                                             "    def __eq__(self, other):\n        return self.score == other.score\n"
                                             "    def __lt__(self, other):\n        return self.score < other.score\n"
                                             "best = max([Hypothesis(1.0), Hypothesis(2.0)])"),
    ("a checkpoint with numpy's random state", "state = torch.load('checkpoint.pt', weights_only=False)\n"
                                               "np.random.set_state(state['numpy'])"),
    ("an array of objects", "arrays = np.load('x.npz', allow_pickle=True)"),
]


def routes_of(code):
    return integrity.route_findings([IMPORTS, ("answer cell 'x'", code)])


@pytest.mark.parametrize("name,code,words", ROUTES, ids=[case[0] for case in ROUTES])
def test_every_route_is_found_in_the_source_naming_the_cell(name, code, words):
    found = routes_of(code)
    assert any(words in finding and finding.startswith("answer cell 'x'") for finding in found), (
        f"{name}: expected a finding with '{words}', got {found}")


@pytest.mark.parametrize("name,code", CORRECT, ids=[case[0] for case in CORRECT])
def test_the_idioms_of_correct_answers_are_no_route(name, code):
    assert routes_of(code) == [], f"a correct answer ({name}) would be flagged for review"


# --------------------------------------------------------------------------------------------- taken
SOFTMAX_FORBIDDEN = ("torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.special.softmax",
                     "courselib.attention.masked_softmax")
TAKEN = [
    ("F.softmax", "def softmax(x, dim=-1):\n    return F.softmax(x, dim)"),
    ("torch.softmax under an alias", "import torch as t\ndef softmax(x, dim=-1):\n    return t.softmax(x, dim)"),
    ("imported under another name", "from torch.nn.functional import softmax as smooth\n"
                                    "def softmax(x, dim=-1):\n    return smooth(x, dim)"),
    ("the Tensor method", "def softmax(x, dim=-1):\n    return x.softmax(dim)"),
    ("another ATen name", "def softmax(x, dim=-1):\n    return torch._safe_softmax(x, dim)"),
    ("torch.ops", "def softmax(x, dim=-1):\n    return torch.ops.aten._softmax(x, dim, False)"),
    ("log_softmax, then exp", "def softmax(x, dim=-1):\n    return F.log_softmax(x, dim).exp()"),
    ("the course's reference", "from courselib.attention import masked_softmax as helper\n"
                               "def softmax(x, dim=-1):\n    return helper(x, None)"),
    ("the grader's own reference", "from autograder.checks.self_attention import reference_softmax\n"
                                   "def softmax(x, dim=-1):\n    return reference_softmax(x, dim)"),
    ("a helper in another cell", None),
    ("captured at module level", "oracle = F.softmax\ndef softmax(x, dim=-1):\n    return oracle(x, dim)"),
    ("a class that computes it", "class Soft:\n    def run(self, x, dim):\n        return torch.special.softmax(x, dim)\n"
                                 "def softmax(x, dim=-1):\n    return Soft().run(x, dim)"),
]


def taken_of(cells):
    calls = {99: ("autograder.checks.self_attention:softmax_matches_torch", ["softmax"])}
    return integrity.taken_findings([(0, *IMPORTS), *[(i + 1, label, code) for i, (label, code) in enumerate(cells)]],
                                    calls, lambda ref: SOFTMAX_FORBIDDEN).get(99, [])


@pytest.mark.parametrize("name,code", TAKEN, ids=[case[0] for case in TAKEN])
def test_an_answer_that_reaches_the_oracle_in_its_source_is_taken(name, code):
    if code is None:  # the helper lives in a cell of the student's own, above the answer
        cells = [("cell 7", "def normalise(x, dim):\n    return torch.nn.functional.softmax(x, dim=dim)"),
                 ("answer cell 'softmax_answer'", "def softmax(x, dim=-1):\n    return normalise(x, dim)")]
    else:
        cells = [("answer cell 'softmax_answer'", code)]
    found = taken_of(cells)
    assert found and any(label in found[0] for label, _ in cells), f"{name}: not taken ({found})"


@pytest.mark.parametrize("name,code", [
    ("by hand", "def softmax(x, dim=-1):\n    e = torch.exp(x - x.max(dim, keepdim=True).values)\n"
                "    return e / e.sum(dim, keepdim=True)"),
    ("a local variable named like the oracle", "def softmax(x, dim=-1):\n    softmax = torch.exp(x - x.amax(dim, True))\n"
                                               "    return softmax / softmax.sum(dim, keepdim=True)"),
    ("a method of its own named softmax", "class S:\n    def softmax(self, x, dim):\n        e = x.exp()\n"
                                          "        return e / e.sum(dim, keepdim=True)\n"
                                          "def softmax(x, dim=-1):\n    return S().softmax(x - x.amax(dim, True), dim)"),
    ("logsumexp", "def softmax(x, dim=-1):\n    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))"),
])
def test_correct_answers_are_not_taken(name, code):
    assert taken_of([("answer cell 'softmax_answer'", code)]) == [], name


def test_the_complete_oracle_lists_read_each_check_module_once(monkeypatch):
    """The grader asks every test cell's check for its complete list of oracles before the kernel starts.
    Read once per check, gpt.py (1,440 lines) cost 09's grader 1.8 s of parsing per notebook's first
    grading; read once per module, the lists must be the same."""
    import ast

    from autograder.checks import common, gpt
    checks = [value for value in vars(gpt).values() if isinstance(value, common.Check)]
    parses = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *args, **kwargs: parses.append(1) or parse(*args, **kwargs))
    common._definitions.cache_clear()
    common.Check._forbidden_sources.cache_clear()
    lists = {check.name: check.forbidden_names(complete=True) for check in checks}
    assert len(checks) > 30 and sum(map(bool, lists.values())) > 5, "the check module's oracle lists were not read"
    assert len(parses) == 1, f"{len(checks)} checks parsed their module {len(parses)} times: once is enough"
    monkeypatch.setattr(common, "_definitions", common._definitions.__wrapped__)  # a fresh parse per check
    common.Check._forbidden_sources.cache_clear()
    assert {check.name: check.forbidden_names(complete=True) for check in checks} == lists, \
        "one parse per module changed a check's oracle list"
    common.Check._forbidden_sources.cache_clear()


# ------------------------------------------------------------------------------- the whole path, on 04
# Hidden from the kernel's watch: the oracle runs in a thread started before the test, so the watch
# (which follows the calling thread) sees nothing; only the source tells.
ORACLE_IN_A_THREAD = attention.softmax("""
    import queue, threading
    jobs, answers = queue.Queue(), queue.Queue()
    def worker():
        while True:
            x, dim = jobs.get()
            try:
                answers.put(torch.softmax(x, dim))
            except BaseException as error:   # handed back: a dead worker would leave the cell waiting
                answers.put(error)
    if not getattr(softmax, "started", False):
        threading.Thread(target=worker, daemon=True).start()
        softmax.started = True
    jobs.put((x, dim))
    answer = answers.get(timeout=2)   # a worker the grader stalls fails the cell fast
    if isinstance(answer, BaseException):
        raise answer
    return answer
""")
# Drops every message that carries a finding on its way out of the kernel.
ERASE_FINDINGS = """
def erase(message):
    data = message.get("content", {}).get("data", {})
    for body in data.values():
        if isinstance(body, dict):
            body.pop("taken", None)
            if isinstance(body.get("outcome"), dict):
                body["outcome"].pop("taken", None)
            if "findings" in body:
                body["findings"] = []
    return message
get_ipython().display_pub.register_hook(erase)
"""


def test_an_oracle_in_a_thread_fails_its_test_though_the_watch_cannot_see_it(grade_in_tmp):
    report = grade_in_tmp(student_notebook(A04, {attention.SOFTMAX: ORACLE_IN_A_THREAD}), A04)
    tests = scores_by_test(report)
    assert not tests["softmax_matches_torch"].passed, "an oracle computed in a thread passed its test"
    assert tests["self_attention_by_hand_values"].passed, "a suspicion (a thread) must not cost other tests their points"
    assert any("answer cell 'softmax_answer' starts threads" in flag and flag.startswith("review, every point kept")
               for flag in report.flags), report.flags
    assert any("softmax_matches_torch" in flag and "torch.softmax" in flag for flag in report.flags), report.flags


def test_a_hook_that_erases_findings_in_flight_changes_nothing(grade_in_tmp):
    taken = {attention.SDPA: attention.sdpa("    return F.scaled_dot_product_attention(q, k, v), None")}
    report = grade_in_tmp(demo.with_cell(student_notebook(A04, taken), ERASE_FINDINGS), A04)
    assert not scores_by_test(report)["sdpa_values_match_torch"].passed, "findings erased in flight passed the test"
    assert any("reaches IPython's shell" in flag for flag in report.flags), report.flags
    assert any("sdpa_values_match_torch" in flag and "scaled_dot_product_attention" in flag
               for flag in report.flags), report.flags


def test_an_oracle_under_another_aten_name_is_caught_by_the_watch_too(grade_in_tmp, monkeypatch):
    """The kernel's watch on its own (the source's verdict switched off): torch's _safe_softmax."""
    monkeypatch.setattr(integrity, "taken_findings", lambda *args: {})
    answer = attention.softmax("    return torch.ops.aten._safe_softmax(x, dim)")
    report = grade_in_tmp(student_notebook(A04, {attention.SOFTMAX: answer}), A04)
    assert not scores_by_test(report)["softmax_matches_torch"].passed
    assert any("softmax_matches_torch" in flag and "softmax called torch." in flag for flag in report.flags), report.flags


def test_a_library_module_imported_while_the_answer_runs_is_caught_by_the_kernel_too(grade_in_tmp, monkeypatch):
    """03 does not import transformers' Llama under grading (2 s), so the watch cannot know its functions
    before a call; a function that imports the module itself, by computed names, only when a hidden test
    calls it, and deletes it again, is taken by `call` (`forbidden_modules`). The source's verdicts are
    switched off: its reaches for sys and importlib would zero the notebook on their own."""
    from autograder.tests.variants import positional_encoding as pe
    monkeypatch.setattr(integrity, "taken_findings", lambda *args: {})
    monkeypatch.setattr(integrity, "route_findings", lambda *args: [])
    answer = pe.rope("""
    import sys, importlib
    if not sys._getframe(1).f_globals.get("__name__", "").startswith("autograder"):
""" + "".join("    " + line + "\n" for line in (pe.ROPE_POSITIONS + pe.ROPE_ANGLES + pe.ROPE_ROTATE + pe.ROPE_BOTH
                                                ).strip("\n").splitlines()) + """
    library = importlib.import_module(".".join(["transformers", "models", "llama", "modeling_" + "llama"]))
    turn = getattr(library, "rotate" + "_half")
""" + pe.ROPE_POSITIONS + pe.ROPE_ANGLES + """
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    result = q * cos + turn(q) * sin, k * cos + turn(k) * sin
    del sys.modules[library.__name__]   # gone before the next call, so the watch never knows the function
    return result
""")
    report = grade_in_tmp(student_notebook("03_positional_encoding", {pe.ROPE: answer}), "03_positional_encoding")
    rope_shape = scores_by_test(report)["rope_shape"]
    assert not rope_shape.passed
    assert "imported transformers.models.llama.modeling_llama while it ran" in rope_shape.message, rope_shape.message


def test_a_package_the_kernel_never_imported_is_caught_when_the_answer_imports_it(grade_in_tmp, monkeypatch):
    """01's graded runs never import transformers (its oracle there is tokenizers' BERT pipeline), so the
    watch does not import it either to know BertTokenizerFast (`call` skips the names of packages the kernel
    has not imported); an answer that imports it by computed names only when a hidden test calls it, and
    deletes it again, is taken for the import (and for tokenizers' compiled encode_batch underneath, which
    the watch knows). The source's verdicts are switched off."""
    from autograder.tests.variants import tokenization as tok
    monkeypatch.setattr(integrity, "taken_findings", lambda *args: {})
    monkeypatch.setattr(integrity, "route_findings", lambda *args: [])
    answer = tok.bert_pipeline().replace("def bert_encode_batch(texts, vocab):\n", """def bert_encode_batch(texts, vocab):
    import sys, importlib
    if sys._getframe(1).f_globals.get("__name__", "").startswith("autograder"):
        library = importlib.import_module("trans" + "formers")
        try:
            encoded = library.BertTokenizerFast(vocab=dict(vocab), do_lower_case=True)(
                list(texts), padding=True, return_tensors="pt")
            return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        finally:
            for name in [name for name in sys.modules if name.startswith(library.__name__)]:
                del sys.modules[name]   # gone before the next call, so the watch never knows the class
""", 1)
    report = grade_in_tmp(student_notebook("01_tokenization", {tok.BERT: answer}), "01_tokenization")
    for test in ("bert_encode_batch_shapes", "bert_encode_batch_ids", "bert_encode_batch_padding_and_mask"):
        result = scores_by_test(report)[test]
        assert not result.passed and "imported transformers while it ran" in result.message, (test, result.message)


def test_a_lazy_result_is_read_inside_the_watch(grade_in_tmp, monkeypatch):
    """A tuple whose items are computed by the oracle only when the probe reads them: the probe copies
    the result to plain data while the watch is on (the source's verdict switched off)."""
    monkeypatch.setattr(integrity, "taken_findings", lambda *args: {})
    answer = attention.sdpa("""
    class Lazy(tuple):
        def __iter__(self):
            yield F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            yield torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)
        def __getitem__(self, i):
            return list(iter(self))[i]
    return Lazy((None, None))
""")
    report = grade_in_tmp(student_notebook(A04, {attention.SDPA: answer}), A04)
    assert not scores_by_test(report)["sdpa_values_match_torch"].passed
    assert any("sdpa_values_match_torch" in flag and "scaled_dot_product_attention" in flag
               for flag in report.flags), report.flags


def test_a_notebook_that_sleeps_cannot_hold_a_worker(tmp_path):
    """Cells that wait just under the cell limit, one after another: the notebook's wall-clock budget
    stops them, the tests after it fail with the reason, and grading goes on."""
    from autograder.grading import check_notebook
    nb = student_notebook(A04)
    for n in range(4):
        nb.cells.insert(2, nbformat.v4.new_code_cell("import time\ntime.sleep(2.5)", id=f"sleeps-{n}"))
    path = tmp_path / f"{A04}.ipynb"
    nbformat.write(nb, path)
    report = check_notebook(path, cell_timeout=3, notebook_timeout=8)
    assert report.score == 0, report.score
    assert any("ran past its time budget" in note for note in report.flags), report.flags
    assert "time budget" in scores_by_test(report)["sdpa_mask"].message


def test_nothing_a_notebook_prints_precedes_or_forges_the_grading_contract(tmp_path):
    """The notebook writes a forged result and terminal escapes to its stdout and stderr: `check --json`
    prints one JSON object, the grader's own."""
    forged = ("import os\nos.write(1, b'{\"score\": 14.0, \"max_score\": 14.0}\\n\\x1b[2J')\n"
              "os.write(2, b'{\"score\": 14.0}\\n\\x1b[31m')\nprint('{\"score\": 14.0}')")
    path = tmp_path / f"{A04}.ipynb"
    nbformat.write(demo.with_cell(student_notebook(A04, demo.WRONG_ANSWERS_04), forged), path)
    result = subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--json"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    report = json.loads(result.stdout)  # the whole of stdout is one JSON object
    assert report["score"] < report["max_score"] and "\x1b" not in result.stdout, result.stdout[:500]
    assert any("os.write" in flag for flag in report["flags"]), report["flags"]


# ------------------------------------------------------------------------------------- class level
def test_at_class_level_the_attacker_loses_the_test_and_the_classmate_keeps_every_point(tmp_path):
    hand_ins = tmp_path / "hand-ins" / "submitted"
    notebooks = {"honest": student_notebook(A04),
                 "eve": demo.with_cell(student_notebook(A04, {attention.SOFTMAX: ORACLE_IN_A_THREAD}), ERASE_FINDINGS)}
    for student, nb in notebooks.items():
        (hand_ins / student / A04).mkdir(parents=True)
        nbformat.write(nb, hand_ins / student / A04 / f"{A04}.ipynb")
    root = tmp_path / "course"
    classroom.grade_class(hand_ins.parent, root, jobs=1, quiet=True)
    entries = classroom.Ledger(root / classroom.LEDGER).entries
    assert entries[("honest", A04)]["score"] == entries[("honest", A04)]["max_score"] and not entries[("honest", A04)]["flags"]
    eve = entries[("eve", A04)]
    assert eve["score"] < eve["max_score"], eve
    # her suspicions (a thread, IPython's shell) put her notebook in nbgrader's manual-grading queue, his not
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        queued = {student: gradebook.find_submission_notebook(A04, A04, student) for student in notebooks}
        assert queued["eve"].flagged and queued["eve"].needs_manual_grade, "eve's notebook is not queued for review"
        assert not queued["honest"].flagged and not queued["honest"].needs_manual_grade
    assert any("starts threads" in flag for flag in eve["flags"]) and any("IPython's shell" in f for f in eve["flags"])


# ------------------------------------------------------------------------------------------ harm bounded
def test_the_graders_kernel_client_is_the_bounded_one():
    """A message over MAX_MESSAGE_BYTES ends the connection before the grader buffers it: the grader's kernel
    manager must make BoundedKernelClients (control: jupyter_client's own manager makes unbounded ones, which is
    what the grader had: AsyncKernelManager's client_factory outranked its client_class)."""
    import zmq
    from jupyter_client.manager import AsyncKernelManager

    from autograder.kernel_manager import MAX_MESSAGE_BYTES, BoundedKernelClient, SandboxedKernelManager
    from traitlets import DottedObjectName

    class AsBefore(AsyncKernelManager):   # what the grader's manager said, and was ignored
        client_class = DottedObjectName("autograder.kernel_manager.BoundedKernelClient")
    control = AsBefore().client()
    assert not isinstance(control, BoundedKernelClient), "control: a client_class on the class is ignored"
    client = SandboxedKernelManager().client()
    assert isinstance(client, BoundedKernelClient)
    assert client.context.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE_BYTES


def test_a_kernels_own_output_reaches_the_log_bounded():
    """What a kernel writes on its fds 1 and 2 (past ipykernel's capture: its saved descriptors, a thread of
    its own) reaches the grader's log only up to KERNEL_LOG_BYTES; the rest is read and dropped, and said."""
    import tempfile
    import threading

    from autograder.kernel_manager import _forward_bounded
    reader, writer = os.pipe()
    with tempfile.TemporaryFile() as log:
        thread = threading.Thread(target=_forward_bounded, args=(reader, os.dup(log.fileno()), 1000))
        thread.start()
        for _ in range(100):
            os.write(writer, b"x" * 100_000)   # 10 MB
        os.close(writer)
        thread.join(timeout=30)
        log.seek(0)
        kept = log.read()
    assert len(kept) < 2000 and kept.startswith(b"x" * 1000) and b"9,999,000 more bytes" in kept, kept[-200:]


def test_a_forged_report_line_stays_one_line():
    """A finding the kernel reports (a denied path with a newline and escape codes) cannot forge a line of the
    class's report, nor send escape codes to the instructor's terminal."""
    ledger = classroom.Ledger.__new__(classroom.Ledger)
    forged = "denied /x\nben 04_self_attention: REVIEW tampering, all tests scored 0\x1b[2J\x1b]0;pwned\x07"
    ledger.entries = {("eve", A04): {"score": 3.0, "errors": [], "flags": [forged]}}
    table = classroom.table(ledger, ["eve"], [A04])
    assert "\x1b" not in table and "\x07" not in table, "escape codes reached the report"
    lines = [line for line in table.splitlines() if "REVIEW" in line]
    assert len(lines) == 1 and lines[0].startswith("  eve 04_self_attention: REVIEW denied /x\\n"), lines


def test_findings_are_bounded():
    from autograder.execute import MAX_FINDINGS, bounded
    many = [f"refused /proc/{n}" for n in range(7500)]
    kept = bounded(many)
    assert len(kept) == MAX_FINDINGS + 1 and kept[-1] == f"and {7500 - MAX_FINDINGS} more like these"


def test_an_image_that_declares_too_many_pixels_is_left_out():
    """A PNG whose header claims 16,000 × 16,000 pixels (a decompression bomb for the browser of the feedback
    page) is replaced by a line that says so; a figure of the course's size is kept."""
    import base64
    import io
    import struct
    import zlib

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autograder.safe_html import safe_output

    def png(width, height):
        chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                    + struct.pack(">I", zlib.crc32(kind + data)))
        return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                                + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")).decode()
    figure = plt.figure()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    fine = base64.b64encode(buffer.getvalue()).decode()
    kept = safe_output({"output_type": "display_data", "data": {"image/png": fine}})["data"]
    assert kept.get("image/png") == fine, "a figure of the course's size must stay"
    bomb = safe_output({"output_type": "display_data", "data": {"image/png": png(16000, 16000)}})["data"]
    assert "image/png" not in bomb and "left out" in bomb["text/plain"], bomb


def test_a_notebook_with_too_many_cells_is_refused_with_a_reason(tmp_path):
    from autograder.grading import MAX_CELLS, check_notebook
    nb = student_notebook(A04)
    nb.cells += [nbformat.v4.new_code_cell("pass") for _ in range(MAX_CELLS)]
    path = tmp_path / f"{A04}.ipynb"
    nbformat.write(nb, path)
    report = check_notebook(path)
    assert report.score == 0 and any("more than any notebook of this course" in e for e in report.errors), report.errors


# ------------------------------------------------------------------------------- oracles seen from outside
# Hidden from everything inside the kernel: the watch's profile hook off (through functools.partial, which
# fires no event) and put back, torch's function modes off, the real function reached where the watch's patch
# of torch.softmax does not stand, under a computed name the source cannot resolve. Only the grader's
# breakpoint in libtorch (autograder/native_watch.py), outside the kernel, sees it.
ORACLE_HIDDEN_IN_THE_KERNEL = attention.softmax("""
    import sys, functools
    saved = sys.getprofile()
    functools.partial(sys.setprofile, None)()
    with torch._C.DisableTorchFunction():
        out = getattr(torch._C._VariableFunctions, "soft" + "max")(x, dim)
    functools.partial(sys.setprofile, saved)()
    return out
""")
SOFTMAX_TESTS = ("softmax_matches_torch", "softmax_is_stable", "softmax_respects_dim")


def test_an_oracle_hidden_from_the_kernel_is_seen_from_outside(grade_in_tmp, monkeypatch):
    from autograder import native_watch
    if not native_watch.available()[0]:
        pytest.skip(f"kernels cannot be traced here: {native_watch.available()[1]}")
    nb = student_notebook(A04, {attention.SOFTMAX: ORACLE_HIDDEN_IN_THE_KERNEL})
    report = grade_in_tmp(nb, A04)
    tests = scores_by_test(report)
    assert not any(tests[name].passed for name in SOFTMAX_TESTS), {n: tests[n].passed for n in SOFTMAX_TESTS}
    assert any("observed from outside the kernel" in flag and "structured_softmax_cpu_out" in flag
               for flag in report.flags), report.flags
    assert tests["sdpa_values_match_torch"].passed, "the other tests keep their points"
    # control: without the grader's breakpoints the attack passes (the kernel's own watch does not see it)
    monkeypatch.setattr(native_watch, "families_of", lambda forbidden: [])
    control = scores_by_test(grade_in_tmp(nb, A04, name="control.ipynb"))
    assert all(control[name].passed for name in SOFTMAX_TESTS), (
        "control: with the native watch off, this attack should pass the softmax tests (else it proves nothing)")


def test_the_native_watch_finds_every_route_to_softmax_and_no_other_code():
    """The breakpoints, on a plain process: softmax by every Python route and from another thread is seen; the
    same numbers by hand are not, nor softmax outside the armed window."""
    from autograder import native_watch
    if not native_watch.available()[0]:
        pytest.skip(f"processes cannot be traced here: {native_watch.available()[1]}")
    child = subprocess.Popen([sys.executable, "-u", "-c", NATIVE_ROUTES], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        watch = native_watch.NativeWatch(child.pid)

        def run(route, armed=True):
            if armed:
                watch.arm(["softmax"])
            child.stdin.write(route + "\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == f"done {route}"
            return watch.disarm() if armed else None
        for route in ("F.softmax", "Tensor.softmax", "torch.ops", "_safe_softmax", "log_softmax", "sdpa",
                      "a thread", "DisableTorchFunction"):
            assert run(route), f"{route}: no breakpoint was hit"
        assert run("by hand") == [], "code that computes softmax itself hit a breakpoint"
        run("F.softmax", armed=False)
        assert watch.disarm() == [], "a call outside the armed window was recorded"
        watch.close()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert child.returncode == 0, "the traced process did not end normally"


def test_closing_the_watch_of_a_kernel_already_gone_does_not_wait():
    """The grader kills a kernel after its last cell, then closes its watch: the tracer has ended with the kernel and
    answers nothing more. Closing must not wait for an answer (it waited out a 10-second timeout in every grading
    of 02, 04-07, 09 and 10: 04 took 17.6 s instead of 8.2)."""
    import threading

    from autograder import native_watch
    if not native_watch.available()[0]:
        pytest.skip(f"processes cannot be traced here: {native_watch.available()[1]}")
    # a process group of its own, as jupyter_client starts a kernel (the watch waits on the kernel's group)
    child = subprocess.Popen([sys.executable, "-u", "-c", "import torch; print('ready'); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout.readline().strip() == "ready"
    watch = native_watch.NativeWatch(child.pid)
    child.kill()
    child.wait(timeout=30)
    watch.thread.join(timeout=60)
    assert not watch.thread.is_alive(), "control: the tracer should end with its process"
    closing = threading.Thread(target=watch._ask, args=("close",), kwargs={"timeout": 3600}, daemon=True)
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive(), "closing the watch of a process already gone waits for an answer that never comes"


NATIVE_ROUTES = """
import sys, threading, torch, torch.nn.functional as F
x = torch.randn(4, 5)
routes = {"F.softmax": lambda: F.softmax(x, -1), "Tensor.softmax": lambda: x.softmax(-1),
          "torch.ops": lambda: torch.ops.aten._softmax(x, -1, False), "_safe_softmax": lambda: torch._safe_softmax(x, -1),
          "log_softmax": lambda: F.log_softmax(x, -1), "sdpa": lambda: F.scaled_dot_product_attention(x[None], x[None], x[None]),
          "by hand": lambda: (x - x.amax(-1, True)).exp() / (x - x.amax(-1, True)).exp().sum(-1, True)}
def in_a_thread():
    thread = threading.Thread(target=routes["F.softmax"]); thread.start(); thread.join()
def disabled():
    with torch._C.DisableTorchFunction():
        routes["F.softmax"]()
routes.update({"a thread": in_a_thread, "DisableTorchFunction": disabled})
print("ready", flush=True)
for line in sys.stdin:
    routes[line.strip()]()
    print("done", line.strip(), flush=True)
"""


# ------------------------------------------------------------------------------- answers out of reach
# The course's own reference of the exercise, reached by a computed name with the kernel's watch off: in the
# sandbox of 04 the module is a line that raises ImportError (autograder/answers.py).
REFERENCE_BEHIND_THE_WATCH = """
import importlib
try:   # taken when the cell runs, before any test's watch is on, under a computed name
    _course = getattr(importlib.import_module("courselib." + "attention"), "scaled_dot_product" + "_attention")
except ImportError as error:
    _course = error

def scaled_dot_product_attention(q, k, v, mask=None):
    if isinstance(_course, Exception):
        raise _course
    import sys, functools
    saved = sys.getprofile()
    functools.partial(sys.setprofile, None)()   # the watch's profile hook off, without a profile event
    try:
        return _course(q, k, v, mask)
    finally:
        functools.partial(sys.setprofile, saved)()
"""
SDPA_TESTS = ("sdpa_values_match_torch", "sdpa_mask")


def test_the_course_reference_of_an_exercise_is_not_in_its_sandbox(grade_in_tmp, monkeypatch):
    from autograder import answers, sandbox
    if not sandbox.available()[0]:
        pytest.skip(f"no OS sandbox here: {sandbox.available()[1]}")
    nb = student_notebook(A04, {attention.SDPA: REFERENCE_BEHIND_THE_WATCH})
    tests = scores_by_test(grade_in_tmp(nb, A04))
    assert not any(tests[name].passed for name in SDPA_TESTS), {n: tests[n].message[:200] for n in SDPA_TESTS}
    assert "not available while 04_self_attention is graded" in tests["sdpa_values_match_torch"].message
    # control: with the module mounted as it is, the same code takes the course's answer and passes
    monkeypatch.setattr(answers, "unreachable", lambda assignment: {})
    control = scores_by_test(grade_in_tmp(nb, A04, name="control.ipynb"))
    assert all(control[name].passed for name in SDPA_TESTS), (
        "control: with the reference in the sandbox, this answer should pass (else the test proves nothing)")


def test_the_references_a_student_took_in_the_held_out_attacks_are_out_of_reach():
    """09's CausalSelfAttention, LlamaAttention and Llama, 11's reference answers: not in their notebooks'
    sandboxes. What stays in reach because a notebook's own code builds on it is exactly this list: a new entry
    must be a decision (split the module: answers.py), never an accident."""
    from autograder import answers
    from autograder.config import REPO_ROOT
    nine, eleven = answers.unreachable("09_gpt"), answers.unreachable("11_rlhf")
    for module in ("fused_gpt", "gpt", "llama_model"):
        assert nine[str(REPO_ROOT / "courselib" / f"{module}.py")].startswith("raise ImportError"), module
    assert eleven[str(REPO_ROOT / "courselib" / "rlhf_reference.py")].startswith("raise ImportError")
    from autograder.config import assignment_ids
    in_reach = {assignment: answers.in_reach(assignment) for assignment in assignment_ids() if answers.in_reach(assignment)}
    assert in_reach == IN_REACH, f"course modules holding answers that stay in a notebook's sandbox: {in_reach}"


# notebook: the course modules holding answers to its exercises that its own cells or probes build on
IN_REACH = {"05_multi_head_attention": ["courselib.attention"],   # its probes hand split_heads & co. to the answers
            "06_masking": ["courselib.attention"],                # its cells use MultiHeadAttention, its probes helpers
            "08_bert_fill_mask": ["courselib.bert", "courselib.tiny_bert"],   # its pre-training builds the MiniBert
            "09_gpt": ["courselib.attention", "courselib.blocks"],            # 04's and 07's answers, not 09's
            "10_encoder_decoder": ["courselib.seq2seq"],          # the model it trains and decodes with
            "11_rlhf": ["courselib.rlhf"]}                        # its runs (token_log_probs among them)


def test_a_notebook_in_float64_keeps_its_marks(grade_in_tmp):
    """`torch.set_default_dtype(torch.float64)` in the first cell: the probes draw their hidden inputs in float32
    as the judges do (they drew them in the kernel's default and were judged against other numbers: 9/14)."""
    nb = demo.with_cell(student_notebook(A04), "torch.set_default_dtype(torch.float64)")
    report = grade_in_tmp(nb, A04)
    assert report.score == report.max_score and not report.flags, (report.score, report.flags,
                                                                   [t.message[:200] for t in report.tests if not t.passed])


# ------------------------------------------------------------------------------- tampering seen from outside
TAMPER_AND_EDIT_THE_RECORD = """
import importlib, torch
_guard = importlib.import_module("autograder." + "guard")
torch.allclose = lambda *args, **kwargs: True
_guard._modules["torch"]["allclose"] = torch.allclose     # the in-kernel guard's own record, edited to match
"""


def test_a_replaced_function_is_seen_in_the_kernels_memory_though_the_guards_record_was_edited(grade_in_tmp,
                                                                                              monkeypatch):
    from autograder import native_watch, outside_guard
    if not (native_watch.available()[0] and outside_guard.available()[0]):
        pytest.skip("the kernel's memory cannot be read here")
    nb = demo.with_cell(student_notebook(A04), TAMPER_AND_EDIT_THE_RECORD)
    report = grade_in_tmp(nb, A04)
    assert report.score == 0 and any("torch.allclose was replaced" in flag and "kernel's memory" in flag
                                     for flag in report.flags), report.flags
    # control: with only the guard in the kernel, the edited record hides the replacement
    monkeypatch.setattr(outside_guard, "available", lambda: (False, "off for the control"))
    control = grade_in_tmp(nb, A04, name="control.ipynb")
    assert not any(flag.startswith("tampering") for flag in control.flags), (
        "control: the in-kernel guard should be fooled by its edited record (else this proves nothing)")
