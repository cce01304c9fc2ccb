"""Test strength: every mutant loses points with a teaching message; every alternative scores 100%."""
import pytest

from autograder.submissions import student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import variants_by_assignment

VARIANTS = variants_by_assignment()
MUTANTS = [(a, v) for a, (mutants, _) in VARIANTS.items() for v in mutants]


def in_batches(alternatives):
    """The alternatives in groups that replace no answer cell twice. One notebook holding a whole group
    proves each of its alternatives: it is graded among correct answers only, so full marks means that
    every one of them passed (a notebook per alternative took four times as long)."""
    batches = []
    for alternative in alternatives:
        batch = next((b for b in batches if not set(alternative.answers) & {g for v in b for g in v.answers}), None)
        if batch is None:
            batches.append([alternative])
        else:
            batch.append(alternative)
    return batches


ALTERNATIVE_BATCHES = [(a, batch) for a, (_, alternatives) in VARIANTS.items() for batch in in_batches(alternatives)]


def variant_id(case):
    assignment_id, variant = case
    return f"{assignment_id}:{variant.name}"


def batch_id(case):
    assignment_id, batch = case
    return f"{assignment_id}:" + "+".join(v.name for v in batch)


def test_every_notebook_keeps_mutants_and_alternatives():
    from autograder.config import assignment_ids
    for assignment_id in assignment_ids():
        mutants, alternatives = VARIANTS.get(assignment_id, ([], []))
        assert len(mutants) >= 3 and len(alternatives) >= 2, (
            f"{assignment_id} needs known-bug variants and alternative correct answers in tests/variants/")


@pytest.mark.parametrize("case", MUTANTS, ids=[variant_id(c) for c in MUTANTS])
def test_mutant_loses_points(case, grade_in_tmp):
    assignment_id, mutant = case
    report = grade_in_tmp(student_notebook(assignment_id, mutant.answers), assignment_id)
    assert report.errors == [], report.errors
    assert not report.full_marks, f"mutant {mutant.name} got full marks: the tests cannot catch it"
    tests = scores_by_test(report)
    for grade_id in mutant.loses:
        assert not tests[grade_id].passed, f"mutant {mutant.name} should lose points on {grade_id}"
        assert tests[grade_id].message, f"{grade_id} failed without a message"
    first = tests[mutant.loses[0]].message
    assert mutant.message in first, (
        f"{mutant.loses[0]}'s message should name the misconception ({mutant.message!r}); it says: {first}")


@pytest.mark.parametrize("case", ALTERNATIVE_BATCHES, ids=[batch_id(c) for c in ALTERNATIVE_BATCHES])
def test_alternatives_get_full_marks(case, grade_in_tmp):
    assignment_id, batch = case
    answers = {grade_id: source for alternative in batch for grade_id, source in alternative.answers.items()}
    report = grade_in_tmp(student_notebook(assignment_id, answers), assignment_id)
    lost = [f"{t.grade_id}: {t.message}" for t in report.tests if not t.passed]
    names = ", ".join(f"{v.name} ({', '.join(v.answers)})" for v in batch)
    assert report.full_marks, f"correct alternatives lost points: {lost}; the alternatives here: {names}"
    assert report.errors == []


def test_alternative_batches_hold_every_alternative_once():
    for assignment_id, (_, alternatives) in VARIANTS.items():
        batched = [v for a, batch in ALTERNATIVE_BATCHES if a == assignment_id for v in batch]
        assert sorted(v.name for v in batched) == sorted(v.name for v in alternatives), assignment_id
        for a, batch in ALTERNATIVE_BATCHES:
            cells = [g for v in batch for g in v.answers]
            assert len(cells) == len(set(cells)), f"{a}: a batch replaces an answer cell twice: {batch_id((a, batch))}"
