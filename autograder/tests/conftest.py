"""Shared helpers for the test suite: build student notebooks and grade them like `check` does."""
import nbformat
import pytest

from autograder.grading import check_notebook


def grade(nb, assignment_id, tmp_path, name=None):
    path = tmp_path / (name or f"{assignment_id}.ipynb")
    nbformat.write(nb, path)
    return check_notebook(path)


def scores_by_test(report):
    return {t.grade_id: t for t in report.tests}


@pytest.fixture
def grade_in_tmp(tmp_path):
    return lambda nb, assignment_id, name=None: grade(nb, assignment_id, tmp_path, name)
