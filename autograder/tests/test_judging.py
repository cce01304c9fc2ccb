"""Attacks on the verdict itself: a determined student who knows how the hidden tests work.

The judges run in the grader's process (autograder/judging.py); the kernel only sends data. Each
case below is a notebook whose answers are wrong (or taken from an oracle) plus the student's own
attack; it must not earn the points it aims at, and where the attack leaves a trace, it is flagged.

The visible tests run in the kernel and can be disarmed (`DISARM_VISIBLE_TESTS`), and the guard's
findings zero a notebook on their own; so the attacks on the judges are also graded with the guard's
verdict switched off (`judges_only`): the judges alone must stop them.
"""
import subprocess
import sys

import nbformat
import pytest

from autograder import demo
from autograder.grading import autograde, max_score, runaway_notes, stretch_points
from autograder.judging import RUN_KEY_ENV
from autograder.submissions import student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import self_attention as attention

A04 = "04_self_attention"

# The visible checks and the guard's in-kernel verification are the kernel's own functions: swap
# their code and they pass anything, while `check_close is courselib.testing.check_close` holds.
DISARM_VISIBLE_TESTS = """\
import courselib.testing
from autograder import guard
courselib.testing.check_close.__code__ = (lambda *args, **kwargs: None).__code__
courselib.testing.check_shape.__code__ = (lambda *args, **kwargs: None).__code__
guard.verify.__code__ = (lambda: None).__code__
"""
SDPA_TESTS = ("sdpa_shapes", "sdpa_values_match_torch", "sdpa_weights_are_probabilities", "sdpa_mask")
# What the wrong answers of demo.WRONG_ANSWERS_04 (no √d_k, softmax of x not exp) fail honestly;
# their shapes, finiteness and row sums are right, so the other tests are theirs to keep.
VALUE_TESTS = ("self_attention_by_hand_values", "softmax_matches_torch", "softmax_is_stable",
               "softmax_respects_dim", "sdpa_values_match_torch", "sdpa_mask")


def earned(report, grade_ids=VALUE_TESTS):
    """The tests among `grade_ids` that the report passed: what an attack gained."""
    tests = scores_by_test(report)
    return [grade_id for grade_id in grade_ids if tests[grade_id].passed]

# Correct outputs computed in the kernel for this very run: read the cell's token (it is in the
# source the kernel receives), rebuild the hidden inputs, answer them with torch's oracle, and send
# the grader a result of one's own.
FORGE_FROM_THE_CELL_SOURCE = """\
import re, torch, torch.nn.functional as F
from autograder import guard, wire
from autograder.checks import common, self_attention as sa

def by_hand(q, k, v, mask):  # no torch oracle: the native watch would see one run in the hidden test
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
    exps = (scores - scores.amax(-1, keepdim=True)).exp()
    weights = exps / exps.sum(-1, keepdim=True)
    return weights @ v, weights

def forged_outcome(token):
    seeds = common.Seeds(token)
    answer = by_hand
    (q, k, v), masks = sa.mask_cases(seeds)
    return wire.encode({"data": [answer(q, k, v, m) for _, m in masks]})

def forge(info):
    found = re.search(r"arm\\('([0-9a-f]+)'\\)", info.raw_cell or "")
    if found and "sdpa_mask" in info.raw_cell:
        guard.publish({guard.PROBE_MIME: {"token": found.group(1), "check": common.sdpa_mask_ref,
                                          "outcome": forged_outcome(found.group(1))}})
common.sdpa_mask_ref = "autograder.checks.self_attention:sdpa_mask"
get_ipython().events.register("pre_run_cell", forge)
"""

# The same answers, but recorded in another run (the token "local") and replayed, with the real
# probe silenced so that only the replay reaches the grader.
REPLAY_ANOTHER_RUNS_ANSWERS = """\
import torch.nn.functional as F
from autograder import guard, wire
from autograder.checks import common, self_attention as sa

(q, k, v), masks = sa.mask_cases(common.Seeds("local"))
identity = __import__("torch").eye(5).expand(2, 2, 5, 5)   # torch's kernel gives the weights on the identity
recorded = wire.encode({"data": [(F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                  F.scaled_dot_product_attention(q, k, identity, attn_mask=m)) for _, m in masks]})

def replay(self, *student):
    token = common._armed.pop("token", None)
    guard.publish({guard.PROBE_MIME: {"token": token, "check": self.ref, "outcome": recorded}})
common.Check.__call__ = replay
"""

# Silence every probe: no data, so nothing can be judged wrong (the student hopes).
SILENCE_THE_PROBES = "from autograder.checks import common\ncommon.Check.__call__ = lambda self, *args: None\n"

# Reach the check's inputs from inside the answer and zero them, so that any output "matches".
ZERO_THE_CHECKS_INPUTS = attention.sdpa("""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if torch.is_tensor(value) and value.is_floating_point():
                value.zero_()
        frame = frame.f_back
    return torch.zeros(*q.shape[:-1], v.shape[-1]), torch.zeros(*q.shape[:-1], k.shape[-2])
""")

# An array-like that answers whatever it is compared with.
LAZY_ARRAY = attention.sdpa("""
    class Chameleon:
        shape = (*q.shape[:-1], v.shape[-1])
        def __array__(self, dtype=None, copy=None):
            import sys, numpy
            return numpy.asarray(sys._getframe(1).f_locals.get("expected", 0), dtype=dtype)
    return Chameleon(), Chameleon()
""")

# The course's own reference implementation, wrapped; and torch's oracle captured before the test.
WRAP_THE_COURSE_REFERENCE = attention.sdpa("""
    import courselib.attention
    return courselib.attention.scaled_dot_product_attention(q, k, v, mask)
""")
ORACLE_CAPTURED_EARLY = {attention.SDPA: """\
import math
import torch
_fast = torch.nn.functional.scaled_dot_product_attention  # captured before any test runs

def scaled_dot_product_attention(q, k, v, mask=None):
    \"\"\"Scaled dot-product attention.\"\"\"
    identity = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    return _fast(q, k, v, attn_mask=mask), _fast(q, k, identity, attn_mask=mask)
"""}

# A clean integrity report sent before the grader's own, from a hook that reads its token.
FAKE_GUARD_REPORT = """\
import re
from autograder import guard

def clean_report(info):
    found = re.search(r"report\\('([0-9a-f]+)'\\)", info.raw_cell or "")
    if found:
        guard.publish({guard.REPORT_MIME: {"token": found.group(1), "findings": []}})
get_ipython().events.register("pre_run_cell", clean_report)
"""


@pytest.fixture
def judges_only(monkeypatch):
    """The guard's findings are still reported, but no longer zero the notebook."""
    from autograder.execute import ZeroScoresOnTampering

    def record_only(self, nb, resources):
        nb.metadata["autograder"] = {"guard_findings": [], "judge_flags": resources.get("judge_flags") or []}
        return nb, resources
    monkeypatch.setattr(ZeroScoresOnTampering, "preprocess", record_only)


def graded(grade_in_tmp, answers=None, extra_cell=None, disarm=True):
    """04 with every answer wrong (but runnable) unless given, the visible tests disarmed, and an attack."""
    nb = student_notebook(A04, {**demo.WRONG_ANSWERS_04, **(answers or {})})
    return grade_in_tmp(demo.with_cell(nb, (DISARM_VISIBLE_TESTS if disarm else "") + (extra_cell or "")), A04)


def test_disarmed_visible_tests_do_not_pass_wrong_answers(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp)
    assert earned(report) == [], "disarming the visible tests let wrong answers pass"
    kept = {t.grade_id for t in report.tests if t.passed}
    assert kept == {t.grade_id for t in report.tests} - set(VALUE_TESTS), kept


def test_a_code_swap_is_seen_by_the_guard(grade_in_tmp):
    report = graded(grade_in_tmp)
    assert any("courselib.testing.check_close had its code swapped" in flag for flag in report.flags), report.flags


def test_a_forged_result_beside_the_real_one_fails_and_is_flagged(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp, extra_cell=FORGE_FROM_THE_CELL_SOURCE)
    tests = scores_by_test(report)
    assert not tests["sdpa_mask"].passed, "a result forged in the kernel earned sdpa_mask's points"
    assert earned(report) == []
    assert any("results arrived for one test" in flag for flag in report.flags), report.flags


def test_answers_replayed_from_another_run_fail(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp, extra_cell=REPLAY_ANOTHER_RUNS_ANSWERS)
    tests = scores_by_test(report)
    assert not tests["sdpa_mask"].passed, "answers recorded in another run were accepted"
    assert earned(report) == []


def test_silenced_probes_score_nothing(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp, extra_cell=SILENCE_THE_PROBES)
    assert report.score == 0
    missing = [t for t in report.tests if "never reached the grader" in t.message]
    assert missing, [t.message for t in report.tests]


def test_zeroing_the_checks_inputs_from_the_answer_does_not_help(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp, {attention.SDPA: ZERO_THE_CHECKS_INPUTS})
    tests = scores_by_test(report)
    assert not any(tests[t].passed for t in SDPA_TESTS if t != "sdpa_shapes"), \
        [(t, tests[t].message) for t in SDPA_TESTS]


def test_an_array_like_that_reads_the_expected_value_never_reaches_the_judge(grade_in_tmp, judges_only):
    report = graded(grade_in_tmp, {attention.SDPA: LAZY_ARRAY})
    tests = scores_by_test(report)
    assert not any(tests[t].passed for t in SDPA_TESTS)
    messages = [tests[t].message for t in SDPA_TESTS]
    assert any("Chameleon" in message for message in messages), messages


def test_answers_taken_from_a_reference_lose_the_exercise_and_are_flagged(grade_in_tmp, judges_only):
    words = "torch.nn.functional.scaled_dot_product_attention"
    report = graded(grade_in_tmp, ORACLE_CAPTURED_EARLY, disarm=False)  # these answers pass the visible tests
    tests = scores_by_test(report)
    for grade_id in SDPA_TESTS:
        assert not tests[grade_id].passed, f"{grade_id} passed with an answer taken from {words}"
    assert "flagged for review" in tests["sdpa_values_match_torch"].message
    flagged = [flag for flag in report.flags if words in flag]
    assert flagged, report.flags


def test_the_course_reference_of_the_exercise_is_not_there_to_take(grade_in_tmp, judges_only):
    """courselib.attention holds 04's answers: out of 04's sandbox (autograder/answers.py), the import that wraps
    it fails, and the tests say so."""
    report = graded(grade_in_tmp, {attention.SDPA: WRAP_THE_COURSE_REFERENCE}, disarm=False)
    tests = scores_by_test(report)
    for grade_id in SDPA_TESTS:
        assert not tests[grade_id].passed, f"{grade_id} passed with an answer taken from courselib.attention"
    assert "courselib.attention is not available while 04_self_attention is graded" in (
        tests["sdpa_values_match_torch"].message), tests["sdpa_values_match_torch"].message


def test_a_fake_integrity_report_is_caught(grade_in_tmp):
    report = graded(grade_in_tmp, extra_cell=FAKE_GUARD_REPORT)
    assert report.score == 0, "the notebook's own integrity report did not count: it scores 0"
    assert any("forged one" in flag for flag in report.flags), report.flags


# Output that goes around a per-message cap: huge metadata, and updates of one display in place.
FLOODS = {
    "display_metadata": """\
from IPython.display import display
for _ in range(50):
    display({"text/plain": "x"}, raw=True, metadata={"padding": "y" * 2_000_000})
""",
    "display_updates": """\
from IPython.display import display, update_display
display({"text/plain": "start"}, raw=True, display_id="flood")
for _ in range(200):
    update_display({"text/plain": "z" * 1_000_000}, raw=True, display_id="flood")
""",
}


@pytest.mark.parametrize("kind", sorted(FLOODS))
def test_output_floods_are_capped_per_notebook_whatever_the_message(kind):
    autograded, grades, errors = autograde(demo.with_cell(student_notebook(A04), FLOODS[kind]), A04)
    assert errors == [] and sum(grades.values()) == max_score(A04) + stretch_points(A04), \
        f"the honest answers beside the flood must keep their points: {grades} {errors}"
    assert any("printed too much" in note for note in runaway_notes(autograded))
    size = len(nbformat.writes(autograded))
    assert size < 6_000_000, f"the autograded notebook is {size:,} bytes: the output cap was bypassed"


@pytest.mark.parametrize("sandbox_mode", ["required", "off"])
def test_the_run_key_never_reaches_the_kernel(sandbox_mode, monkeypatch):
    """With the key, a kernel could derive every cell's token and precompute the hidden inputs."""
    monkeypatch.setenv(RUN_KEY_ENV, "a key the kernel must not see")
    looks = "import os\nprint('KEY SEEN' if any('must not see' in v for v in os.environ.values()) else 'no key')"
    autograded, _, errors = autograde(demo.with_cell(student_notebook(A04), looks), A04, sandbox_mode=sandbox_mode)
    printed = [o.get("text", "") for c in autograded.cells if c.get("id") == "student-extra-cell" for o in c.outputs]
    assert printed == ["no key\n"], printed


# Two threads of the grader parse Python at once: the loader of the hidden checks (importing matplotlib,
# whose settings go through `ast.literal_eval`, and `inspect.signature`) and the main thread reading the
# notebook's cells. A garbage collection in the middle of a parse lets the other thread in: this makes one
# happen at every chance, and starts both parses together, twenty times.
PARSE_IN_TWO_THREADS = """\
import ast, gc, sys, threading, time
from autograder import judging
if sys.argv[1] == "locked":
    judging.load_checks_in_background([]).join()  # what the grader does before its loader thread starts
source = "\\n".join(f"def f{i}(a, b):\\n    return [x + {i} for x in (a, b) if x]\\n" for i in range(50))
gc.set_threshold(50, 1, 1)
gc.callbacks.append(lambda phase, info: time.sleep(0))
errors = []
def parse(together):
    together.wait()
    try:
        ast.parse(source)
    except SystemError as error:
        errors.append(str(error))
for _ in range(20):
    together = threading.Barrier(2)
    threads = [threading.Thread(target=parse, args=(together,)) for _ in range(2)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
print(len(errors), errors[:1])
"""


@pytest.mark.parametrize("parsing", ["unlocked", "locked"])
def test_the_graders_threads_parse_one_at_a_time(parsing):
    if parsing == "unlocked" and sys.version_info >= (3, 12):
        pytest.skip("Python 3.12 does not fail two parses at once: nothing to show")
    run = subprocess.run([sys.executable, "-c", PARSE_IN_TWO_THREADS, parsing], capture_output=True, text=True,
                         timeout=120, check=True)
    failures = int(run.stdout.split()[0])
    if parsing == "unlocked":
        assert failures > 0, ("the control should show Python 3.11's race (two threads parsing at once fail with "
                              f"SystemError), or the locked case below proves nothing: {run.stdout}")
    else:
        assert failures == 0, ("once the grader's loader thread has started (judging.parse_one_at_a_time), two "
                               "threads still broke each other's parse, which fails a correct hand-in with a "
                               f"SystemError: {run.stdout}")
