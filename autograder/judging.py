"""The grader's half of every hidden test: it arms the test cells, receives the probes' data, and judges.

While `GuardedExecute` (autograder/execute.py) runs a notebook:
1. For each test cell whose hidden part calls a check (`hidden.<name>(...)` after
   `from autograder.checks import <topic> as hidden`), read from the cell as nbgrader restored it
   from the source, the grader derives a token from a secret key of this run, the assignment and
   the grade_id, and runs the cell with one line of its own in front: `arm(token)`. The kernel only
   ever sees tokens, one per cell and run; the key never enters it.
2. The probe seeds its hidden inputs from the token and sends its data back as one display
   message. The grader takes such messages out of the stream (they are never saved in the notebook)
   and files them under the cell that was running when they arrived.
3. After the notebook has run, each armed cell that raised no error is judged here, in the grader's
   process: exactly one message with this cell's token and check, decoded as data (autograder/wire.py),
   then `Check.decide`, which recomputes the hidden inputs from the token, the oracle's values, and
   compares. A failure becomes the cell's error output, which is what nbgrader scores. A missing,
   repeated, forged or malformed message fails the cell; an answer taken from an oracle or a course
   reference, and forged messages, are also flagged for review.
"""
import ast
import functools
import hashlib
import hmac
import importlib
import os
import secrets
import sys
import threading

from nbformat.v4 import new_output

RUN_KEY_ENV = "AUTOGRADER_RUN_KEY"  # set it to grade reproducibly (the test suite does)


def run_key():
    """This run's secret: from the environment when set, else fresh and random."""
    configured = os.environ.get(RUN_KEY_ENV)
    return configured.encode() if configured else secrets.token_bytes(32)


def token(key, *parts):
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def arm_line(cell_token):
    return f"__import__('autograder.checks.common').checks.common.arm({cell_token!r})\n"


def hidden_check_ref(source):
    """'autograder.checks.<topic>:<name>' for a test cell that calls one hidden check, else None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "autograder.checks":
            aliases.update({alias.asname or alias.name: alias.name for alias in node.names})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in aliases):
            return f"autograder.checks.{aliases[node.func.value.id]}:{node.func.attr}"
    return None


_PARSE_LOCK = threading.RLock()


def parse_one_at_a_time():
    """Make every `ast.parse` in this process (`ast.literal_eval` and `inspect.signature` go through it) take
    one lock. Python 3.11 builds the tree's objects in interpreter-wide state: two threads parsing at once can
    fail with "SystemError: AST constructor recursion depth mismatch", which once failed a correct hand-in
    (its grader's main thread parsed a cell while the loader below imported matplotlib). 3.12.1 and 3.13.0 do not
    fail so (checked); autograder/tests/test_judging.py shows the failure and its cure."""
    if sys.version_info >= (3, 12) or getattr(ast.parse, "one_at_a_time", False):
        return
    parse = ast.parse

    @functools.wraps(parse)
    def locked_parse(*args, **kwargs):
        with _PARSE_LOCK:
            return parse(*args, **kwargs)
    locked_parse.one_at_a_time = True
    ast.parse = locked_parse


def load_checks_in_background(refs):
    """Import the check modules and their judges (and torch with them) in a thread; join it before judging."""
    from autograder.checks.common import judges_module
    parse_one_at_a_time()
    probes = sorted({ref.partition(":")[0] for ref in refs})
    modules = [name for module in probes for name in (module, judges_module(module))]

    def load():
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:
                pass  # resolve_check reports it when the cell is judged
    thread = threading.Thread(target=load, name="load-hidden-checks", daemon=True)
    thread.start()
    return thread


def load_every_check():
    """Import every topic's hidden checks and judges now, in this thread (about 2.5 s, torch and
    transformers with them): where a grading process is after its first notebook of each topic
    (`make grade-benchmark` measures notebooks from there)."""
    import pkgutil

    import autograder.checks
    refs = [f"autograder.checks.{module.name}:" for module in pkgutil.iter_modules(autograder.checks.__path__)
            if module.name != "common"]
    load_checks_in_background(refs).join()


def resolve_check(ref):
    """The Check object with its judge. A check that cannot be found or loaded is the course's bug, said
    plainly (the cell fails: a test the grader cannot judge never passes)."""
    from autograder.checks.common import resolve
    try:
        return resolve(ref)
    except Exception as error:
        raise RuntimeError(f"the hidden test {ref} could not be loaded: {type(error).__name__}: {error}") from None


class Verdict:
    """The outcome of judging one test cell: None (passed), or the error output and any flag."""

    def __init__(self, ename=None, message="", flag=None):
        self.ename, self.message, self.flag = ename, message, flag

    @property
    def passed(self):
        return self.ename is None

    def output(self):
        return new_output("error", ename=self.ename, evalue=self.message,
                          traceback=[f"{self.ename}: {self.message}" if self.message else self.ename])


MISSING = ("the hidden test's results never reached the grader: the test did not run to its end, "
           "or code in the notebook stopped or hid it")
FORGED = ("the grader received results for this test that the test did not send (repeated, or "
          "from another test); it scores 0 and is flagged for review")


def judge_cell(grade_id, ref, cell_token, messages):
    """Decide one armed test cell from the probe messages that arrived while it ran."""
    from autograder import wire
    from autograder.checks.common import Seeds, Taken, quiet
    try:
        check = resolve_check(ref)
    except RuntimeError as error:
        return Verdict("AssertionError", str(error), flag=f"test '{grade_id}': {error}")
    mine = [m for m in messages if m.get("token") == cell_token and m.get("check") == ref]
    if len(mine) != 1 or len(messages) != 1:
        if not messages:
            return Verdict("AssertionError", MISSING)
        return Verdict("AssertionError", FORGED,
                       flag=f"test '{grade_id}': {len(messages)} results arrived for one test, "
                            f"{len(mine)} of them with its token (forged results)")
    try:
        outcome = wire.decode(mine[0].get("outcome"))
    except wire.WireError as error:
        return Verdict("AssertionError", f"the hidden test's results were malformed ({error})",
                       flag=f"test '{grade_id}': malformed results ({error})")
    try:
        with quiet():
            check.decide(Seeds(cell_token), outcome)
    except Taken as error:
        return Verdict("AssertionError", str(error), flag=f"test '{grade_id}': {error}")
    except NotImplementedError:
        return Verdict("NotImplementedError")
    except AssertionError as error:
        return Verdict("AssertionError", str(error))
    except Exception as error:  # the judge met data it did not expect: fail the test, say why
        return Verdict("AssertionError", f"the grader could not judge this test's results "
                                         f"({type(error).__name__}: {error})")
    return Verdict()


def split_hidden(source):
    """(the visible part of a test cell, its hidden part): the hidden-tests region, cut out of the cell. Code
    after the region stays with the visible part's (it runs before the hidden part, which comes last)."""
    before, begin, rest = source.partition("### BEGIN HIDDEN TESTS")
    if not begin:
        return source, ""
    hidden, end, after = rest.partition("### END HIDDEN TESTS")
    return before + after, begin + hidden + end


def native_verdict(grade_id, functions):
    """A test during whose hidden part the kernel entered native code of the check's oracle, as the grader saw
    from outside the kernel (autograder/native_watch.py)."""
    from autograder.native_watch import demangled
    said = ", ".join(sorted({demangled(name) for name in functions}))
    return Verdict("AssertionError", f"while the hidden test ran your code, the grader saw torch's own {said} run "
                                     "(observed from outside the kernel): the exercise asks you to compute it yourself. "
                                     "This test scores 0 and is flagged for review.",
                   flag=f"test '{grade_id}': torch's {said} ran while the hidden test ran (observed from outside the kernel)")


def taken_verdict(grade_id, findings):
    """A test whose code reaches a forbidden oracle in its source (autograder/integrity.py)."""
    said = "; ".join(findings)
    return Verdict("AssertionError", f"the code this test grades reaches an oracle the exercise asks you to write "
                                     f"yourself: {said}. This test scores 0 and is flagged for review.",
                   flag=f"test '{grade_id}': {said}")


def has_error(cell):
    return any(output.get("output_type") == "error" for output in cell.get("outputs", []))
