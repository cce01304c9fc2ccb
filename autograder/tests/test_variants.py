"""Test strength: every mutant loses points with a teaching message; every alternative scores 100%."""
import pytest

from autograder.submissions import student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import variants_by_assignment

VARIANTS = variants_by_assignment()
MUTANTS = [(a, v) for a, (mutants, _) in VARIANTS.items() for v in mutants]
ALTERNATIVES = [(a, v) for a, (_, alternatives) in VARIANTS.items() for v in alternatives]


def variant_id(case):
    assignment_id, variant = case
    return f"{assignment_id}:{variant.name}"


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


@pytest.mark.parametrize("case", ALTERNATIVES, ids=[variant_id(c) for c in ALTERNATIVES])
def test_alternative_gets_full_marks(case, grade_in_tmp):
    assignment_id, alternative = case
    report = grade_in_tmp(student_notebook(assignment_id, alternative.answers), assignment_id)
    lost = [f"{t.grade_id}: {t.message}" for t in report.tests if not t.passed]
    assert report.full_marks, f"correct alternative {alternative.name} lost points: {lost}"
    assert report.errors == []
