"""Defences inside the grading kernel, set up before the student's first cell runs.

The grader starts each notebook in `autograder.kernel`, which calls `install()` here. Then:
- `snapshot` holds the functions the hidden tests rely on (torch, numpy, their testing modules,
  builtins, the check harness) and IPython's cell machinery (input and AST transformers, exception
  handlers, tracebacks). `changes()` lists everything a student's code has replaced since.
- an audit hook (which Python code cannot remove) refuses to open the grader's files (solutions,
  gradebook, other students' submissions), to write into the course, the grading folder or the
  Python environment (anywhere but the notebook's own folder), and to start programs, and
  remembers each refusal.
- `verify()` is called by every hidden check: a replaced function fails the test with a message.
- `report(token)` is the last cell the grader runs (see `autograder.execute`): it publishes all
  findings as one display message, which the grader reads outside the kernel. A notebook whose
  report is missing (cells blanked or rewritten), repeated (forged) or not empty scores 0 and is
  flagged for review.

This is the inner layer. Verdicts are decided outside the kernel (autograder/judging.py), and the
kernel itself runs in an OS sandbox (autograder/sandbox.py): what the guard still catches is
tampering worth a person's look, not what the grades rest on.
"""
import builtins
import os
import sys
import types

REPORT_MIME = "application/x.transformers-course.guard+json"
PROBE_MIME = "application/x.transformers-course.probe+json"  # a hidden test's data (checks/common.py)

# Environment variables the grader sets for the kernel (paths joined with os.pathsep).
DENY_ENV = "AUTOGRADER_GUARD_DENY"            # never opened, read or write
READ_ONLY_ENV = "AUTOGRADER_GUARD_READ_ONLY"  # readable, never written, renamed or removed

# Programs that libraries start on their own (matplotlib's font search, ctypes' library search).
ALLOWED_PROGRAMS = {"fc-list", "ldconfig", "gcc", "cc", "ld", "objdump", "uname"}
# Attributes IPython and ipykernel themselves rebind in builtins while a cell runs.
IPYTHON_BUILTINS = {"exit", "quit", "get_ipython", "display", "_", "__", "___", "__IPYTHON__",
                    "input", "raw_input"}

# Attributes torch itself rebinds when a correct answer changes a setting: torch.set_default_dtype
# rebinds torch.Storage to the storage class of the new default.
TORCH_MANAGED = {("torch", "Storage")}

_namespaces = {}     # name -> the live module (or class) watched
_modules = {}        # name -> {attribute: object} at install time
_codes = {}          # (name, attribute) -> the function's code at install time
_shell_state = {}    # name -> value at install time
_refusals = []       # what the audit hook refused
_shell = None
_publish = None


def _watched_modules():
    import numpy
    import numpy.testing
    import torch
    import torch.nn.functional
    import torch.testing

    import autograder.checks.common
    import courselib.testing
    return {"builtins": builtins, "torch": torch, "torch.Tensor": torch.Tensor,
            "torch.nn.functional": torch.nn.functional, "torch.testing": torch.testing,
            "numpy": numpy, "numpy.testing": numpy.testing, "math": __import__("math"),
            "autograder.checks.common": autograder.checks.common,
            "courselib.testing": courselib.testing, "autograder.guard": sys.modules[__name__]}


def _shell_now(shell):
    manager = shell.input_transformer_manager
    return {
        "input transformers (cleanup)": [id(f) for f in manager.cleanup_transforms],
        "input transformers (line)": [id(f) for f in manager.line_transforms],
        "input transformers (token)": [id(f) for f in manager.token_transformers],
        "input transformers (post)": [id(f) for f in shell.input_transformers_post],
        "AST transformers": [id(f) for f in shell.ast_transformers],
        "custom exception handler": shell.custom_exceptions,
        "IPython showtraceback": _identity(shell.showtraceback),
        "IPython _showtraceback": _identity(shell._showtraceback),
        "IPython showsyntaxerror": _identity(shell.showsyntaxerror),
        "IPython run_cell": _identity(shell.run_cell),
        "IPython run_ast_nodes": _identity(shell.run_ast_nodes),
        "IPython run_code": _identity(shell.run_code),
        "IPython transform_cell": _identity(shell.transform_cell),
        "trace function": id(sys.gettrace()),
        "profile function": id(sys.getprofile()),
        # where a forger would hook in: before cells run, and on the way out to the grader
        "IPython event hooks defined in the notebook": [
            id(f) for event in ("pre_run_cell", "pre_execute", "post_run_cell", "post_execute")
            for f in shell.events.callbacks.get(event, []) if not _library_code(f)],
        "display publisher": _identity(shell.display_pub.publish),
        "kernel message sender": _identity(getattr(getattr(shell.display_pub, "session", None), "send", None)),
    }


def _library_code(function):
    """Is this callable installed code (IPython's, matplotlib's), not code the notebook defined?"""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    return code is not None and code.co_filename.startswith((sys.prefix, sys.base_prefix))


def _identity(method):
    """Same function bound to the same object: a rebinding on the instance or class changes it."""
    return (id(getattr(method, "__func__", method)), id(getattr(method, "__self__", None)))


def install(shell):
    """Record the pristine state and start the audit hook. Call once, before any student code."""
    global _shell, _publish
    _shell = shell
    _publish = _direct_sender(shell.display_pub)
    _namespaces.update(_watched_modules())
    for name, namespace in _namespaces.items():
        _modules[name] = dict(vars(namespace))
        _codes.update({(name, attribute): value.__code__ for attribute, value in _modules[name].items()
                       if isinstance(value, types.FunctionType)})
    _shell_state.update(_shell_now(shell))
    sys.addaudithook(_make_audit_hook(_paths(DENY_ENV), _paths(READ_ONLY_ENV)))


def _paths(variable):
    return [os.path.realpath(p) for p in os.environ.get(variable, "").split(os.pathsep) if p]


def _inside(path, roots):
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _make_audit_hook(denied, read_only):
    own = [os.path.realpath(os.getcwd())]  # the notebook's own folder: anything goes
    realpath, inside, refusals = os.path.realpath, _inside, _refusals

    def refuse(what):
        refusals.append(what)
        raise PermissionError(f"not allowed while grading: {what}")

    def check_path(path, writing, action):
        if not isinstance(path, (str, bytes)):
            return  # an open file descriptor
        full = realpath(os.fsdecode(path))
        if inside(full, own):
            return
        if inside(full, denied) or (writing and inside(full, read_only)):
            refuse(f"{action} {full}")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = bool(mode and any(c in mode for c in "wax+")) or bool(
                (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            check_path(path, writing, "writing" if writing else "opening")
        elif event in ("os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate",
                       "os.chmod", "os.symlink", "os.link", "shutil.move", "os.replace"):
            check_path(args[0], True, event)
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                       "os.fork", "os.forkpty", "pty.spawn"):
            program = args[0] if args else ""
            if event == "subprocess.Popen" and isinstance(program, (str, bytes)):
                if os.path.basename(os.fsdecode(program)) in ALLOWED_PROGRAMS:
                    return
            refuse(f"starting a program ({event} {program!r})")
        elif event == "sqlite3.connect":
            refuse("opening an SQLite database (the gradebook is off limits)")

    return hook


def changes():
    """What student code has replaced since install(), as sentences. Empty when untouched."""
    if not _modules:
        return []
    found = []
    for module_name, saved in _modules.items():
        live = vars(_namespaces[module_name])
        for attribute, original in saved.items():
            if module_name == "builtins" and attribute in IPYTHON_BUILTINS:
                continue
            if (module_name, attribute) in TORCH_MANAGED:
                continue
            now = live.get(attribute, _MISSING)
            if now is not original and not _library_wrapper(now, original):
                found.append(f"{module_name}.{attribute} was replaced or deleted")
            elif now is original and getattr(now, "__code__", None) is not _codes.get((module_name, attribute),
                                                                                      getattr(now, "__code__", None)):
                found.append(f"{module_name}.{attribute} had its code swapped")
    now = _shell_now(_shell)
    found += [f"{what} was changed" for what, value in _shell_state.items() if now[what] != value]
    return found


_MISSING = object()


def _library_wrapper(new, original):
    """torch wraps some of its own functions later (importing torch._dynamo wraps manual_seed)."""
    code = getattr(new, "__code__", None)
    return (getattr(new, "__wrapped__", None) is original and code is not None
            and code.co_filename.startswith(os.path.dirname(_namespaces["torch"].__file__)))


def verify():
    """Raise AssertionError if the grading environment was tampered with (hidden checks call it)."""
    found = changes() + [f"refused: {what}" for what in _refusals]
    if found:
        raise AssertionError(
            "The grading environment was changed by code in this notebook, so no test can be "
            "trusted: " + "; ".join(found[:5]) + ". This scores 0 and is flagged for review.")


def report(token):
    """Publish every finding for the grader, with the token of this run's report cell (the grader
    reads this message outside the kernel, and only once)."""
    findings = changes() + [f"refused: {what}" for what in _refusals]
    publish({REPORT_MIME: {"token": token, "findings": findings}})


def publish(data):
    """Send `data` (mime type -> JSON) to the grader as display data, through the sender recorded at
    install (outside the grading kernel: IPython's own publisher)."""
    if _publish is not None:
        _publish(data)
    else:
        from IPython.display import publish_display_data
        publish_display_data(data)


def _direct_sender(display_pub):
    """Send display data as ipykernel's publisher does, but past its transform hooks (which code in the
    notebook can register to drop or rewrite messages), with the session's methods as they were at
    install. (The grader also reads any reach for the publisher in the source: autograder/integrity.py.)"""
    session = getattr(display_pub, "session", None)
    if session is None or not hasattr(display_pub, "pub_socket"):
        return display_pub.publish
    make, send, socket, topic = session.msg, session.send, display_pub.pub_socket, display_pub.topic
    parent_of = type(display_pub).parent_header.fget

    def publish(data):
        message = make("display_data", {"data": data, "metadata": {}, "transient": {}},
                       parent=parent_of(display_pub))
        send(socket, message, ident=topic)
    return publish
