"""Shared helpers for the test suite: build student notebooks and grade them like `check` does."""
import re

import nbformat
import pytest

from autograder.config import COURSE_DIR, SOLUTIONS_DIR
from autograder.grading import check_notebook

SOLUTION_MARKER_LINE = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.M)


def is_answer_cell(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)


def solution_path(assignment_id):
    return SOLUTIONS_DIR / assignment_id / f"{assignment_id}.ipynb"


def released_path(assignment_id):
    return COURSE_DIR / assignment_id / f"{assignment_id}.ipynb"


def reference_answers(assignment_id):
    """{grade_id: source} of the answer cells in the solution, without the nbgrader markers."""
    nb = nbformat.read(solution_path(assignment_id), as_version=4)
    return {cell.metadata.nbgrader["grade_id"]: SOLUTION_MARKER_LINE.sub("", cell.source)
            for cell in nb.cells if is_answer_cell(cell)}


def student_notebook(assignment_id, answers=None):
    """The released notebook as a student hands it in: reference answers, except `answers`."""
    nb = nbformat.read(released_path(assignment_id), as_version=4)
    filled = {**reference_answers(assignment_id), **(answers or {})}
    unknown = set(answers or {}) - set(filled) | set(answers or {}) - set(reference_answers(assignment_id))
    assert not unknown, f"variant names answer cells that don't exist: {unknown}"
    for cell in nb.cells:
        if is_answer_cell(cell):
            cell.source = filled[cell.metadata.nbgrader["grade_id"]]
    return nb


def grade(nb, assignment_id, tmp_path, name=None):
    path = tmp_path / (name or f"{assignment_id}.ipynb")
    nbformat.write(nb, path)
    return check_notebook(path)


def scores_by_test(report):
    return {t.grade_id: t for t in report.tests}


@pytest.fixture
def grade_in_tmp(tmp_path):
    return lambda nb, assignment_id, name=None: grade(nb, assignment_id, tmp_path, name)
