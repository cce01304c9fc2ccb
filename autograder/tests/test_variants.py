"""Test strength: every mutant loses points with a teaching message; every alternative scores 100%.

Each notebook's variants are graded by replay (autograder/replay.py): the notebook filled with the
reference answers runs once through the real path (nbgrader autograde, the OS sandbox, the judges), and
each variant is graded in that same kernel by running the cells it reaches, with the same probes, wire
and judges. Alternatives are graded in batches (`in_batches`: correct answers to different exercises in
one notebook), each mutant on its own. A sample of each notebook's variants (a mutant, and the batch of
an alternative) also goes through the real path on its own (`grading.check_notebook`), and its verdicts
must equal the replay's, test cell by test cell: that is what proves the replay grades as grading does.
All tests of one notebook run in one xdist group (`--dist loadgroup`), so that its replay runs once.
"""
import hashlib
import re

import pytest

from autograder.replay import replay
from autograder.submissions import student_notebook
from autograder.tests.variants import Variant, variants_by_assignment

VARIANTS = variants_by_assignment()
MUTANTS = [(a, v) for a, (mutants, _) in VARIANTS.items() for v in mutants]
ALTERNATIVES = [(a, v) for a, (_, alternatives) in VARIANTS.items() for v in alternatives]


def in_batches(alternatives):
    """The alternatives in groups that replace no answer cell twice (first fit, in the order written), each
    group as one variant. A batch is graded among correct answers only, so full marks for it proves every
    alternative in it; and the cells its alternatives reach (often the notebook's training) run once for all
    of them, not once each."""
    batches = []
    for alternative in alternatives:
        batch = next((b for b in batches if not set(alternative.answers) & {g for v in b for g in v.answers}), None)
        if batch is None:
            batches.append([alternative])
        else:
            batch.append(alternative)
    return [Variant("+".join(v.name for v in batch), {g: s for v in batch for g, s in v.answers.items()})
            for batch in batches]


BATCHES = {a: in_batches(alternatives) for a, (_, alternatives) in VARIANTS.items()}


def batch_of(assignment_id, alternative):
    return next(b for b in BATCHES[assignment_id] if alternative.name in b.name.split("+"))
_replays = {}
EXECUTION_BUDGET_SECONDS = 15
TRAINING_BUDGET_SECONDS = 30  # 07-11 train models while they run
TRAINING_NOTEBOOKS = ("07_", "08_", "09_", "10_", "11_", "12_")


def replayed(assignment_id):
    """(the reference's report, {"mutant:<name>" / "alternatives:<batch's name>": Outcome}, the kernel's CPU
    seconds at the end of the reference run), once per process.

    A mutant is asserted on the tests it names (`loses`), so the replay decides those (and runs what they
    need) and leaves the rest of what it reaches undecided: a mutant of the attention does not train the
    notebook's model. Alternatives, which must keep full marks everywhere, and the sampled mutant, which
    the real path checks cell by cell, are decided on every test cell."""
    if assignment_id not in _replays:
        mutants, _ = VARIANTS[assignment_id]
        variants = {**{f"mutant:{v.name}": v.answers for v in mutants},
                    **{f"alternatives:{b.name}": b.answers for b in BATCHES[assignment_id]}}
        fully = {f"{kind}:{v.name}" for kind, v in sample(assignment_id)}
        wanted = {f"mutant:{v.name}": set(v.loses) for v in mutants if f"mutant:{v.name}" not in fully}
        _replays[assignment_id] = replay(assignment_id, variants, wanted=wanted)
    return _replays[assignment_id]


def grouped(cases, describe):
    return [pytest.param(case, id=describe(case), marks=pytest.mark.xdist_group(case[0])) for case in cases]


def variant_id(case):
    assignment_id, variant = case
    return f"{assignment_id}:{variant.name}"


def sample(assignment_id):
    """One mutant and one alternative of a notebook, the same in every run (chosen by a hash of names), with
    the alternative's batch: [("mutant", mutant), ("alternatives", batch)], keyed as in `replayed`."""
    mutants, alternatives = VARIANTS[assignment_id]

    def pick(variants):
        return min(variants, key=lambda v: hashlib.sha256(f"{assignment_id}:{v.name}".encode()).hexdigest())
    return [("mutant", pick(mutants)), ("alternatives", batch_of(assignment_id, pick(alternatives)))]


def test_alternative_batches_hold_every_alternative_once():
    for assignment_id, (_, alternatives) in VARIANTS.items():
        names = [name for batch in BATCHES[assignment_id] for name in batch.name.split("+")]
        assert sorted(names) == sorted(v.name for v in alternatives), f"{assignment_id}: {names}"
        for batch in BATCHES[assignment_id]:
            cells = [g for name in batch.name.split("+") for v in alternatives if v.name == name for g in v.answers]
            assert len(cells) == len(set(cells)) == len(batch.answers), (
                f"{assignment_id}: the batch {batch.name} replaces an answer cell twice")


def test_every_notebook_keeps_mutants_and_alternatives():
    from autograder.config import assignment_ids
    for assignment_id in assignment_ids():
        mutants, alternatives = VARIANTS.get(assignment_id, ([], []))
        assert len(mutants) >= 3 and len(alternatives) >= 2, (
            f"{assignment_id} needs known-bug variants and alternative correct answers in tests/variants/")


@pytest.mark.parametrize("assignment_id", grouped([(a,) for a in VARIANTS], lambda c: c[0]))
def test_reference_answers_score_full_marks_within_their_budget(assignment_id):
    """The replay's reference run is the real path (autograde in the sandbox) on the released notebook
    with the reference answers typed in: full marks, no flags, no errors. (Under a fresh random key every
    run: ada's hand-ins in the demo class, test_classroom.py.) The same run measures the budget: the
    kernel's CPU seconds, imports included, once the notebook has run and been judged, under grading (the
    notebooks that train shorten their runs, `courselib.training.grading()`). CPU time is what a loaded
    machine does not inflate the way it inflates wall-clock time. The self-study runs, minutes long by
    design, are measured apart (tools/selfstudy_run.py)."""
    (assignment_id,) = assignment_id
    report, _, cpu = replayed(assignment_id)
    assert report.full_marks, [f"{t.grade_id}: {t.message}" for t in report.tests if not t.passed]
    assert report.flags == [] and report.errors == [], (report.flags, report.errors)
    print(f"{assignment_id}: {cpu:.1f} s of kernel CPU under grading")
    budget = TRAINING_BUDGET_SECONDS if assignment_id.startswith(TRAINING_NOTEBOOKS) else EXECUTION_BUDGET_SECONDS
    assert cpu < budget, f"{assignment_id} took {cpu:.1f} s of CPU under grading (budget {budget} s)"


@pytest.mark.parametrize("case", grouped(MUTANTS, variant_id))
def test_mutant_loses_points(case):
    assignment_id, mutant = case
    outcome = replayed(assignment_id)[1][f"mutant:{mutant.name}"]
    assert outcome.errors == [], outcome.errors
    assert any(earned < worth for earned, worth in outcome.scores.values()), (
        f"mutant {mutant.name} got full marks: the tests cannot catch it")
    for grade_id in mutant.loses:
        assert grade_id in outcome.scores, f"{grade_id} is not a test cell of {assignment_id}"
        earned, worth = outcome.scores[grade_id]
        assert earned < worth, f"mutant {mutant.name} should lose points on {grade_id}"
        assert outcome.messages[grade_id], f"{grade_id} failed without a message"
    first = outcome.messages[mutant.loses[0]]
    assert mutant.message in first, (
        f"{mutant.loses[0]}'s message should name the misconception ({mutant.message!r}); it says: {first}")


@pytest.mark.parametrize("case", grouped(ALTERNATIVES, variant_id))
def test_alternative_gets_full_marks(case):
    assignment_id, alternative = case
    batch = batch_of(assignment_id, alternative)
    outcome = replayed(assignment_id)[1][f"alternatives:{batch.name}"]
    lost = [f"{g}: {outcome.messages[g]}" for g, (earned, worth) in outcome.scores.items() if earned < worth]
    together = f"graded in one notebook with the correct alternatives {batch.name} (answers {', '.join(batch.answers)})"
    assert not lost, f"the correct alternative {alternative.name} ({', '.join(alternative.answers)}) lost points, " \
                     f"{together}: {lost}"
    assert outcome.errors == [] and outcome.flags == [], (together, outcome.errors, outcome.flags)


def without_figures(message):
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", message or "")


@pytest.mark.parametrize("assignment_id", grouped([(a,) for a in VARIANTS], lambda c: c[0]))
def test_the_real_path_agrees_with_the_replay(assignment_id, grade_in_tmp):
    """A sample of variants graded on their own, each in a fresh sandboxed kernel through nbgrader
    autograde: the same score on every test cell, the same messages and the same flags as the replay."""
    (assignment_id,) = assignment_id
    outcomes = replayed(assignment_id)[1]
    for kind, variant in sample(assignment_id):
        report = grade_in_tmp(student_notebook(assignment_id, variant.answers), assignment_id,
                              name=f"sampled-{kind}.ipynb")
        outcome = outcomes[f"{kind}:{variant.name}"]
        real = {t.grade_id: (t.score, t.max_score) for t in report.tests}
        assert real == outcome.scores, f"{kind} {variant.name}: real path {real} != replay {outcome.scores}"
        # The figures in a message may differ: the replay restores each cell's random state as the
        # reference left it, while a variant's own earlier cells may have drawn more or fewer numbers.
        messages = {t.grade_id: without_figures(t.message) for t in report.tests}
        replayed_messages = {grade_id: without_figures(m) for grade_id, m in outcome.messages.items()}
        assert messages == replayed_messages, f"{kind} {variant.name}: messages differ"
        assert report.flags == outcome.flags and report.errors == outcome.errors, (
            f"{kind} {variant.name}: real path flags {report.flags} errors {report.errors}, "
            f"replay flags {outcome.flags} errors {outcome.errors}")
