"""Shared helpers for the test suite: build student notebooks and grade them like `check` does.

Grading derives the hidden tests' inputs from a secret key per run (autograder/judging.py). The
suite pins it, so that a mutant is caught on the same inputs every time; the solutions are also
graded with fresh random keys (test_pipeline.py), which proves no check depends on lucky seeds.
"""
import os

import nbformat
import pytest

from autograder.grading import check_notebook
from autograder.judging import RUN_KEY_ENV

os.environ.setdefault(RUN_KEY_ENV, "the test suite's fixed key")


def grade(nb, assignment_id, tmp_path, name=None):
    path = tmp_path / (name or f"{assignment_id}.ipynb")
    nbformat.write(nb, path)
    return check_notebook(path)


def scores_by_test(report):
    return {t.grade_id: t for t in report.tests}


@pytest.fixture
def grade_in_tmp(tmp_path):
    return lambda nb, assignment_id, name=None: grade(nb, assignment_id, tmp_path, name)
