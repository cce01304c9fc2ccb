"""The harness every hidden check uses: a probe in the student's kernel, a judge in the grader.

A hidden check is one grade cell's hidden part, `hidden.<check>(<student's objects>)`, and it has
two halves (see `Check`):
- the **probe** runs in the student's kernel. It builds the seeded hidden inputs, calls the
  student's code through `call`, measures behaviour, and returns plain data (tensors, arrays,
  numbers, strings and containers of them). It may fail the test early for structural reasons
  (`raise AssertionError(...)`): a kernel can always fail itself, never pass itself.
- the **judge** runs in the grader's own process. It rebuilds the same inputs from the same seeds,
  computes the oracle's expected values and compares (`expect_close`, `expect_shape`, ...), raising
  AssertionError with a message that names the misconception. Nothing in the kernel can change an
  expected value or a comparison: the judge only ever sees data (autograder/wire.py).

Under grading, the grader arms each test cell with a token (autograder/judging.py): the probe's
seeds derive from it, so hidden inputs differ from run to run and answers recorded elsewhere are
worthless, and the probe's data goes back to the grader tagged with it. Run anywhere else (the
source notebook in Jupyter), a check judges itself in the kernel with the token "local".

`call` keeps library warnings and stderr out of the test cell (nbgrader scores stderr as a
failure), turns an exception in the student's code into a teaching message, can swap reference
helpers into the student's globals so an exercise is graded on its own, and watches for the
oracle: a `forbidden` torch function (however it is reached: an alias, a reference captured
before the test, a Tensor method, torch.ops) or course reference (courselib code, even wrapped or
copied) used inside the student's code is refused, recorded, flagged for review, and costs the
exercise its points.
"""
import contextlib
import functools
import hashlib
import importlib
import inspect
import io
import logging
import random
import sys
import threading
import unittest.mock
import _thread

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from autograder import guard, wire

LOCAL_TOKEN = "local"
MAX_MESSAGE_CHARS = 4000   # of a failure message that comes from the kernel


class Forbidden(Exception):
    """Raised when the student's code calls a function the exercise asks them to write."""


class Taken(AssertionError):
    """The answer came (partly) from an oracle or a course reference: flagged, and the test fails."""


# ------------------------------------------------------------------------------------ seeds
class Seeds:
    """The random sources of one check. Each number names an independent stream; the token mixes
    in the run, so the same check sees other inputs in another grading run."""

    def __init__(self, token=LOCAL_TOKEN):
        self.token = token

    def seed(self, n):
        digest = hashlib.sha256(f"{self.token}:{n}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 1

    def generator(self, n):
        return torch.Generator().manual_seed(self.seed(n))

    def numpy(self, n):
        return np.random.default_rng(self.seed(n))

    def random(self, n):
        return random.Random(self.seed(n))


def generator(seed):
    """A torch Generator with a fixed seed, for tests whose tolerance was measured on that seed."""
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ checks
_armed = {}  # {"token": ...} while a test cell armed by the grader runs; consumed by the probe
_running = []  # the Check whose probe is running


def arm(token):
    """Called by the grader's first line in a test cell (see autograder/judging.py)."""
    _armed.clear()
    _armed["token"] = str(token)


@functools.lru_cache(maxsize=None)
def _definitions(module_name):
    """{name: ast node} of a check module's top-level functions and classes, parsed once per module (parsed
    once per check, gpt.py's 1,440 lines cost 09's grader 1.8 s before any cell ran)."""
    import ast
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    return {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


class Check:
    """One grade cell's hidden test: `probe(seeds, *student_objects) -> data` runs in the kernel,
    `judge(seeds, data)` in the grader. Register the judge with `@<check>.judge`."""

    def __init__(self, probe):
        functools.update_wrapper(self, probe)
        self.probe = probe
        self.name = probe.__name__
        self.module = probe.__module__
        self.judge_function = None

    def judge(self, function):
        self.judge_function = function
        return function

    @property
    def ref(self):
        return f"{self.module}:{self.name}"

    @property
    def forbidden(self):
        return self.forbidden_names(complete=False)

    def forbidden_names(self, complete=True):
        """Every oracle this check's probe may forbid: the lists of dotted names (module constants such as
        `LOSS_SHORTCUTS`) that the probe, and the functions of its module it calls, refer to, and what the
        module's `..._shortcuts()` functions it calls return now (`complete=True`: also for libraries not
        imported yet, which a probe leaves out to save their import). The grader decides "taken" on the
        hand-in's source against the complete list (autograder/integrity.py); `call` refuses a list that
        is not in the other one (a course bug)."""
        constants, functions = self._forbidden_sources()
        found = list(constants)
        for function in functions:
            accepts = "complete" in inspect.signature(function).parameters
            found += [name for name in (function(complete=complete) if accepts else function()) if name not in found]
        return tuple(found)

    @functools.lru_cache(maxsize=None)
    def _forbidden_sources(self):
        """(the constant names, the `..._shortcuts` functions) the probe reaches, read from its module's source."""
        import ast
        module = importlib.import_module(self.module)
        functions = _definitions(self.module)
        constants, dynamic, seen, todo = [], [], set(), [self.name]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            value = getattr(module, name, None)
            if name in functions and name.endswith("_shortcuts") and callable(value):
                dynamic.append(value)
            elif name in functions:
                todo += [n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name)]
            elif (isinstance(value, (list, tuple)) and value
                    and all(isinstance(v, str) and "." in v for v in value)):
                constants += [v for v in value if v not in constants]
        return tuple(constants), tuple(dynamic)

    def __call__(self, *student):
        """What the hidden test cell runs, in the student's kernel."""
        token = _armed.pop("token", None)
        outcome = self.run_probe(Seeds(token or LOCAL_TOKEN), *student)
        if token is not None:
            guard.publish({guard.PROBE_MIME: {"token": token, "check": self.ref, "outcome": outcome}})
            return
        self.decide(Seeds(LOCAL_TOKEN), wire.decode(outcome))

    def run_probe(self, seeds, *student):
        """The probe's outcome as wire data: {"data": ...}, {"failed": message}, {"unanswered": true},
        with "taken": [findings] when the watch saw an oracle or a course reference at work."""
        _findings.clear()
        _running[:] = [self]
        # the hidden inputs are drawn as the judge draws them, in float32, whatever default dtype the notebook
        # chose (a learner's torch.set_default_dtype(torch.float64) must not make them other numbers)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            outcome = {"data": self.probe(seeds, *student)}
        except NotImplementedError:
            outcome = {"unanswered": True}
        except AssertionError as error:
            outcome = {"failed": str(error)}
        except Exception as error:  # the probe's own code met something unexpected in the student's
            outcome = {"failed": f"the hidden test could not run your code: {type(error).__name__}: {error}"}
        finally:
            _running.clear()
            torch.set_default_dtype(default_dtype)
        if _findings:
            outcome["taken"] = list(dict.fromkeys(_findings))
        try:
            return wire.encode(outcome)
        except wire.WireError as error:
            return wire.encode({"failed": f"{self.name}: your code returned {error}, which the tests cannot "
                                          "read. Return plain values: tensors, arrays, numbers, strings, "
                                          "and lists, tuples or dicts of them.",
                                "taken": outcome.get("taken", [])})

    def decide(self, seeds, outcome):
        """The verdict on a probe's outcome: returns on a pass, raises on a fail (in the grader)."""
        if type(outcome) is not dict:
            raise AssertionError("the hidden test's results were malformed")
        if outcome.get("taken"):
            taken = list(map(str, outcome["taken"]))
            raise Taken("; ".join(taken[:5])[:MAX_MESSAGE_CHARS] + (f" (and {len(taken) - 5} more)" if len(taken) > 5 else "")
                        + ". This test scores 0 and is flagged for review.")
        if outcome.get("unanswered"):
            raise NotImplementedError()
        if "failed" in outcome:   # the kernel's words: a teaching message, or whatever a notebook put there
            message = str(outcome["failed"])
            raise AssertionError(message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + " …")
        if "data" not in outcome:
            raise AssertionError("the hidden test's results were malformed")
        self.load_judge()(seeds, outcome["data"])

    def load_judge(self):
        """The judge, registered by importing the check's judges module (autograder/judges/<topic>.py),
        which only the grader can import: it is not mounted in the grading sandbox."""
        if self.judge_function is None:
            importlib.import_module(judges_module(self.module))
        if self.judge_function is None:
            raise RuntimeError(f"check {self.ref} has no judge in {judges_module(self.module)}")
        return self.judge_function


def probe(function):
    """Decorator: `function(seeds, *student_objects)` is a check's probe; it becomes the Check."""
    return Check(function)


def resolve(ref):
    """The Check called `module:name` (the grader reads the name from the test cell it restored)."""
    module_name, _, name = ref.partition(":")
    if not module_name.startswith("autograder.checks."):
        raise LookupError(f"{ref} is not a hidden check")
    check = getattr(importlib.import_module(module_name), name, None)
    if not isinstance(check, Check):
        raise LookupError(f"{ref} is not a hidden check")
    check.load_judge()
    return check


def judges_module(checks_module):
    """'autograder.judges.gpt' for 'autograder.checks.gpt': where a topic's judges live."""
    return "autograder.judges." + checks_module.rpartition(".")[2]


# ------------------------------------------------------------------------------------ calling
@contextlib.contextmanager
def quiet():
    """Silence Python warnings, library logging and stderr for the duration."""
    previous_disable = logging.root.manager.disable
    import warnings
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous_disable)


@contextlib.contextmanager
def reference_globals(fn, **replacements):
    """Temporarily replace names the student's function looks up in its module globals."""
    namespace = getattr(fn, "__globals__", None)
    if namespace is None:
        yield
        return
    missing = object()
    saved = {name: namespace.get(name, missing) for name in replacements}
    try:
        namespace.update(replacements)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


_findings = []  # what the watch saw during the current probe


def call(fn, *args, name=None, helpers=None, forbidden=(), forbidden_advice="", forbidden_modules=(), capture=None,
         **kwargs):
    """Probe side: call the student's `fn` quietly and return its result, or raise a teaching
    AssertionError. `forbidden` names the oracles of this exercise (dotted names of torch
    functions, or of courselib functions and classes); `forbidden_modules` names modules holding
    oracles that are too dear to import for every student (so not watched): importing one while `fn`
    runs is the finding instead. So is importing the package of a `forbidden` name that the kernel has
    not imported before the call (nothing of it can have been reached earlier). `helpers` are reference
    helpers swapped into the student's globals, trusted to use them. The result is copied to plain data
    (`plain`) while the watch is still on, so that nothing of it runs later, unwatched; `capture()`, if
    given, reads what else the probe needs (a cache the function filled) the same way: then the call
    returns (result, captured)."""
    guard.verify()
    name = name or getattr(fn, "__name__", "your function")
    if _running and not set(forbidden) <= set(_running[0].forbidden):
        raise RuntimeError(f"course bug: {_running[0].ref} forbids {sorted(set(forbidden) - set(_running[0].forbidden))} "
                           "outside a module-level list of dotted names, so the grader cannot check its source")
    if not callable(fn):
        raise AssertionError(f"{name} should be a function, but it is a {type(fn).__name__}.")
    # A library the kernel has not imported (transformers, in notebooks that only compare with it while
    # the student works) is not imported here to be watched: importing it while fn runs is the finding.
    unloaded = {package for package in map(_unloaded_package, forbidden) if package}
    forbidden_modules = [*forbidden_modules, *sorted(unloaded - set(forbidden_modules))]
    watch = Watch([d for d in forbidden if not _unloaded_package(d)], forbidden_advice) if forbidden else None
    helpers = {key: watch.trusted(value) if watch else value for key, value in (helpers or {}).items()}
    loaded = set()
    try:
        with quiet(), reference_globals(fn, **helpers), _loads_seen(forbidden_modules) as loaded, \
                watch or contextlib.nullcontext():
            result = plain(fn(*args, **kwargs), name)
            if capture is not None:
                result = (result, plain(capture(), name))
    except (NotImplementedError, NotPlain):
        raise
    except Forbidden as error:
        raise AssertionError(f"{name}: {error}") from None
    except Exception as error:
        shapes = ", ".join(describe(a) for a in args)
        raise AssertionError(f"{name}({shapes}) raised {type(error).__name__}: {error}") from None
    finally:
        if watch:
            _findings.extend(f"{name} {finding} ({watch.advice})" for finding in watch.findings)
        _findings.extend(f"{name} imported {module} while it ran ({forbidden_advice})"
                         for module in forbidden_modules if module in loaded)
    return result


def _unloaded_package(dotted):
    """The top-level package of the dotted name if this process has not imported it, else None."""
    package = dotted.partition(".")[0]
    return None if package in sys.modules else package


class _LoadRecorder:
    """A finder first on sys.meta_path that finds nothing: it records which of `names` Python looked for,
    that is, loaded (by `import`, importlib or after a deletion from sys.modules)."""

    def __init__(self, names):
        self.names, self.seen = set(names), set()

    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            self.seen.add(name)
        return None


@contextlib.contextmanager
def _loads_seen(names):
    """The set of `names` loaded while the block runs."""
    if not names:
        yield set()
        return
    recorder = _LoadRecorder(names)
    sys.meta_path.insert(0, recorder)
    try:
        yield recorder.seen
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(recorder)


class NotPlain(AssertionError):
    """The student's code returned data of a class of its own (a subclass of a container or number)."""


def plain(value, name="your function", depth=0):
    """`value` with every container and number copied to its plain built-in type (a namedtuple or
    torch.return_types to a tuple, an OrderedDict to a dict, a NumPy scalar to a Python number, a
    tensor subclass to a tensor): whatever runs to read it runs now. Objects that are not data (a
    module, a function) are handed back as they are: the probe calls them through `call` again."""
    kind = type(value)
    if depth > 12 or value is None or kind in (bool, int, float, complex, str, bytes, torch.Tensor, torch.nn.Parameter,
                                               np.ndarray):
        return value
    if isinstance(value, np.generic):
        return value.item() if kind.__module__ != "numpy" else value
    if isinstance(value, torch.Tensor):
        return value.as_subclass(torch.Tensor)
    if isinstance(value, dict):
        return {plain(k, name, depth + 1): plain(v, name, depth + 1) for k, v in dict.items(value)}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(plain(item, name, depth + 1) for item in value)
    for base in (bool, int, float, str, bytes):
        if isinstance(value, base):
            return base(value)
    if inspect.isgenerator(value) or kind.__name__ in ("map", "filter", "zip", "list_iterator", "tuple_iterator"):
        raise NotPlain(f"{name} returned a {kind.__name__}, which is read only later: return a list, a tuple or a "
                       "tensor.")
    return value


class _Attempt:
    """`fn(*args)` for `call`, with the exception it raises as its result (where raising may be the
    right answer). It carries fn's globals, so that `call` swaps helpers into the student's namespace."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        if hasattr(fn, "__globals__"):
            self.__globals__ = fn.__globals__

    def __call__(self):
        try:
            return ("returned", self.fn(*self.args, **self.kwargs))
        except (NotImplementedError, Forbidden):
            raise
        except Exception as error:  # the judge decides whether this was the right exception
            return ("raised", error)


def attempt(fn, *args, name, forbidden=(), forbidden_advice="", helpers=None, **kwargs):
    """Probe side, where raising may be the right answer: what `fn(*args)` did, as data:
    {"error": None or the exception's type name, "value_error": bool, "message": str,
    "shape": the result's shape or None}."""
    kind, value = call(_Attempt(fn, args, kwargs), name=name, forbidden=forbidden,
                       forbidden_advice=forbidden_advice, helpers=helpers)
    if kind == "raised":
        return {"error": type(value).__name__, "value_error": isinstance(value, ValueError),
                "message": str(value), "shape": None}
    try:
        shape = tuple(int(n) for n in value.shape)
    except (AttributeError, TypeError, ValueError):
        shape = None
    return {"error": None, "value_error": False, "message": "", "shape": shape}


def describe(value):
    if hasattr(value, "shape"):
        return f"{type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, torch.nn.Module):
        return f"a {type(value).__name__}"
    return repr(value)[:80]


# ------------------------------------------------------------------------------------ the watch
_TORCH_DIR = torch.__file__.rsplit("/", 1)[0] + "/"


def _in_torch(frame):
    """Is this frame torch's own code (which switches its function modes as it works)?"""
    return frame.f_code.co_filename.startswith(_TORCH_DIR)


def _op_name(func):
    """softmax for torch.softmax, Tensor.softmax, torch._softmax, torch.ops.aten._softmax.default..."""
    name = getattr(func, "__name__", None) or str(func)
    return name.split("::")[-1].split(".")[0].lstrip("_")


def op_family(name):
    """The root of a torch operator's name: softmax for _softmax and softmax.default; every
    scaled_dot_product_* kernel is scaled_dot_product."""
    name = name.split("::")[-1].split(".")[0].strip("_")
    return "scaled_dot_product" if name.startswith("scaled_dot_product") else name


def same_operator(forbidden, called):
    """Is `called` (an operator's name) the forbidden one under another name? The same family, or a
    family of seven letters or more inside it: _safe_softmax and log_softmax are softmax;
    _scaled_dot_product_attention_math is scaled_dot_product_attention."""
    forbidden, called = op_family(forbidden), op_family(called)
    return forbidden == called or (len(forbidden) >= 7 and forbidden in called)


@functools.lru_cache(maxsize=None)
def _resolve_parent(dotted):
    """(the object that holds the last name of `dotted`, that name): imported once per process."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            obj = getattr(obj, part)
        return obj, parts[-1]
    raise ImportError(dotted)


def _resolve(dotted):
    parent, name = _resolve_parent(dotted)
    return getattr(parent, name)


def _reachable(dotted):
    """Whether the kernel can reach `dotted` at all: the course's answers to the notebook being graded are not
    in its sandbox (autograder/answers.py), and there is nothing to watch where there is nothing."""
    try:
        _resolve(dotted)
    except (ImportError, AttributeError):
        return False
    return True


def _subclasses(cls):
    found = []
    for subclass in cls.__subclasses__():
        found += [subclass, *_subclasses(subclass)]
    return found


def _c_names(obj, owner=None):
    """Qualified names of a compiled callable, or of every method of a compiled class (tokenizers),
    as they arrive at the profile hook: a method inherited by a subclass is called as `Sub.method`."""
    if isinstance(obj, type):
        return {f"{cls.__qualname__}.{name}" for cls in (obj, *_subclasses(obj))
                for name, value in vars(obj).items() if callable(value)}
    name = getattr(obj, "__qualname__", repr(obj))
    if isinstance(owner, type):
        method = name.rpartition(".")[2]
        return {name, *(f"{cls.__qualname__}.{method}" for cls in _subclasses(owner))}
    return {name}


def _code_objects(obj):
    """The code of a Python function, or of every function of a class (a course reference)."""
    if isinstance(obj, type):
        return [code for value in vars(obj).values() for code in _code_objects(value)]
    function = getattr(obj, "__func__", obj)
    code = getattr(function, "__code__", None)
    return [code] if code is not None else []


class Watch(TorchFunctionMode):
    """While the student's code runs: refuse and record torch oracles (a torch function mode sees
    every entry point, including references captured earlier), record calls into course references
    (a profile hook sees their code, even wrapped or copied), and record threads started or the
    watch switched off (ways around both)."""

    def __init__(self, forbidden, advice):
        super().__init__()
        self.advice = advice or "the exercise asks you to write this yourself"
        self.forbidden = list(forbidden)
        self.op_names, self.codes, self.c_names = {}, {}, {}
        self.forbidden = [dotted for dotted in self.forbidden if _reachable(dotted)]
        for dotted in self.forbidden:
            obj = _resolve(dotted)
            if dotted.startswith("torch."):
                self.op_names[_op_name(obj)] = dotted   # every entry point torch dispatches
            codes = _code_objects(obj)
            self.codes.update({code: dotted for code in codes})
            # compiled callables: tokenizers' methods, and torch's classes that no torch function mode sees
            # (torch._C._ImperativeEngine, autograd's engine)
            if not codes and (not dotted.startswith("torch.") or isinstance(obj, type)):
                self.c_names.update({name: dotted for name in _c_names(obj, _resolve_parent(dotted)[0])})
        self.findings = []
        self._trusted = 0
        self._profiler = None
        self._thread_start = threading.Thread.start.__code__

    def trusted(self, helper):
        """A reference helper handed to the student's code: what it calls is not the student's."""
        @functools.wraps(helper)
        def run(*args, **kwargs):
            self._trusted += 1
            try:
                return helper(*args, **kwargs)
            finally:
                self._trusted -= 1
        return run

    def note(self, finding):
        if finding not in self.findings:
            self.findings.append(finding)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self._trusted:
            called = _op_name(func)
            hit = self.op_names.get(called) or next(
                (dotted for op, dotted in self.op_names.items() if same_operator(op, called)), None)
            if hit:
                self.note(f"called {hit}")
                raise Forbidden(self.advice)
        return func(*args, **(kwargs or {}))

    def _profile(self, frame, event, arg):
        if self._trusted or self._closing:
            return
        if event == "call":
            code = frame.f_code
            if code in self.codes:
                dotted = self.codes[code]
                self.note(f"used the course's reference {dotted}" if dotted.startswith("courselib.")
                          else f"called {dotted}")
            elif code is self._thread_start:
                self.note("started a thread (where the grader cannot watch it)")
        elif event == "c_call":
            if getattr(arg, "__qualname__", None) in self.c_names:
                self.note(f"called {self.c_names[arg.__qualname__]}")
            elif arg is _thread.start_new_thread:
                self.note("started a thread (where the grader cannot watch it)")
            elif arg in (sys.setprofile, sys.settrace, threading.setprofile):
                self.note("switched off the grader's watch")
            elif (getattr(arg, "__module__", "") == "torch._C" and "mode" in getattr(arg, "__name__", "")
                  or "torch_function" in getattr(arg, "__name__", "")) and not _in_torch(frame):
                self.note("changed torch's function modes (the grader's watch)")

    def _refuse_and_note(self, dotted):
        original = _resolve(dotted)

        def refuse(*args, **kwargs):
            if self._trusted:
                return original(*args, **kwargs)
            self.note(f"called {dotted}")
            raise Forbidden(self.advice)
        return refuse

    def __enter__(self):
        if notebook_threads():
            self.note("ran while a thread the notebook started was running (where the grader cannot watch it)")
        self._patches = contextlib.ExitStack()
        for dotted in self.forbidden:  # the plain route, refused with the exercise's advice
            parent, name = _resolve_parent(dotted)
            if isinstance(getattr(parent, name), type) and _code_objects(getattr(parent, name)):
                continue  # a Python class stays a class (its methods are watched by their code)
            self._patches.enter_context(unittest.mock.patch.object(parent, name, self._refuse_and_note(dotted)))
        self._profiler, self._closing = self._profile, False
        self._previous = sys.getprofile()
        sys.setprofile(self._profiler)
        if self.op_names:
            super().__enter__()
        return self

    def __exit__(self, *exc):
        self._patches.close()
        if sys.getprofile() is not self._profiler:
            self.note("switched off the grader's watch")
        self._closing = True
        sys.setprofile(self._previous)
        if self.op_names:
            from torch.overrides import _get_current_function_mode
            if _get_current_function_mode() is not self:
                self.note("changed torch's function modes (the grader's watch)")
                return False
            return super().__exit__(*exc)
        return False


def notebook_threads():
    """Live threads running code the notebook defined (not a library's own, such as tqdm's monitor)."""
    found = []
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        code = getattr(getattr(target, "__func__", target), "__code__", None)
        if code is None:
            run = getattr(type(thread), "run", None)
            code = getattr(run, "__code__", None) if run is not threading.Thread.run else None
        if code is not None and not code.co_filename.startswith(_LIBRARY_PREFIXES):
            found.append(thread)
    return found


_LIBRARY_PREFIXES = tuple({sys.prefix, sys.base_prefix, _TORCH_DIR, __file__.rsplit("/", 3)[0] + "/"})


# ------------------------------------------------------------------------------------ judging
def to_numpy(value, name):
    """The student's result as a float64 NumPy array, or a message saying what it was."""
    if torch.is_tensor(value):
        return value.detach().cpu().double().numpy()
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"{name} should be an array, but it is a {type(value).__name__}.") from None
    return array


def expect_shape(value, expected, name, hint=""):
    shape = tuple(value.shape) if hasattr(value, "shape") else None
    if shape != tuple(expected):
        found = shape if shape is not None else type(value).__name__
        raise AssertionError(f"{name}'s shape {found} != expected shape {tuple(expected)}. {hint}".strip())


def matches(actual, expected, rtol=1e-4, atol=1e-5):
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    return actual.shape == expected.shape and np.allclose(actual, expected, rtol=rtol, atol=atol)


def diagnoses_of(diagnoses):
    """{misconception: its output} from a judge's `diagnoses`: the dict, a function that returns it (worked out
    only on a mismatch: the wrong versions can cost more than the check), or None."""
    return (diagnoses() if callable(diagnoses) else diagnoses) or {}


def expect_close(actual, expected, name, hint="", diagnoses=None, rtol=1e-4, atol=1e-5):
    """Compare with the oracle. On a mismatch, name the misconception whose output it matches.
    `diagnoses`: see `diagnoses_of`."""
    actual_np = to_numpy(actual, name)
    expected_np = np.asarray(expected, dtype=np.float64)
    expect_shape(actual_np, expected_np.shape, name, hint)
    if not np.all(np.isfinite(actual_np)):
        raise AssertionError(f"{name} contains inf or NaN. {hint}".strip())
    if np.allclose(actual_np, expected_np, rtol=rtol, atol=atol):
        return
    for misconception, wrong_answer in diagnoses_of(diagnoses).items():
        if matches(actual_np, wrong_answer, rtol, atol):
            raise AssertionError(f"{name} is wrong: {misconception}")
    diff = np.abs(actual_np - expected_np)
    where = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
    raise AssertionError(
        f"{name} is wrong: at index {where} you have {actual_np[where]:.6g}, expected "
        f"{expected_np[where]:.6g} (largest difference {diff.max():.3g}). {hint}".strip())


def expect_tensor(value, name):
    """Judge side: a tensor came back (decoded data is never a subclass)."""
    if not torch.is_tensor(value):
        raise AssertionError(f"{name} should be a torch tensor, but it is a {type(value).__name__}.")
    return value


# ---------------------------------------------------------------------- probe side: the student's modules
def build(cls, *args, name, helpers=None, forbidden=(), advice="", **kwargs):
    """Instantiate the student's class quietly, in eval mode, with reference classes swapped into its namespace."""
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise AssertionError(f"{name} should be a class deriving from nn.Module, but it is a {type(cls).__name__}.")
    own_function = next((f for f in vars(cls).values() if inspect.isfunction(f)), None)
    with reference_globals(own_function, **(helpers or {})), torch.random.fork_rng(devices=[]):
        # fork_rng: the check's modules leave the notebook's random numbers as they were
        module = call(cls, *args, name=name, forbidden=forbidden, forbidden_advice=advice, **kwargs)
    return module.eval()


def run(fn, *args, name, forbidden=(), advice="", **kwargs):
    """fn(*args) quietly, without gradients; the result must be a tensor."""
    with torch.no_grad():
        result = call(fn, *args, name=name, forbidden=forbidden, forbidden_advice=advice, **kwargs)
    if not torch.is_tensor(result):
        raise AssertionError(f"{name} should return a tensor, but it returned {type(result).__name__}.")
    return result


def submodule(module, path, owner, expected):
    """module.<path>, or a message that says which names the notebook asks for."""
    found = module
    for part in path.split("."):
        found = getattr(found, part, None)
        if found is None:
            names = ", ".join(name for name, _ in module.named_children()) or "none"
            raise AssertionError(f"{owner} has no `{path}`: the exercise asks for {expected}. "
                                 f"Its submodules are: {names}.")
    return found


def load_weights(module, weights, owner, expected):
    """Copy the check's weights into the student's module, by the parameter names the exercise asks for."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            param = params.get(name)
            if param is None:
                raise AssertionError(f"{owner} has no parameter `{name}`: the exercise asks for {expected}. "
                                     f"Its parameters are: {', '.join(params) or 'none'}.")
            if tuple(param.shape) != tuple(value.shape):
                raise AssertionError(f"{owner}.{name} has shape {tuple(param.shape)}; the exercise's sizes give "
                                     f"{tuple(value.shape)}.")
            param.copy_(value)
    return module


def count(module):
    return sum(p.numel() for p in module.parameters())


__all__ = ["Check", "Forbidden", "NotPlain", "Seeds", "Taken", "arm", "attempt", "build", "call", "count", "describe",
           "expect_close",
           "expect_shape", "expect_tensor", "generator", "load_weights", "matches", "probe", "quiet",
           "reference_globals", "resolve", "run", "submodule", "to_numpy"]
