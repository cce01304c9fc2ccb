"""Student notebooks made from the course's own files: the released notebook with answers filled in.

Used by the test suite (mutants, alternatives, bad input) and by the demo class (autograder/demo.py).
"""
import re

import nbformat

from autograder.config import COURSE_DIR, SOLUTIONS_DIR

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
    reference = reference_answers(assignment_id)
    unknown = set(answers or {}) - set(reference)
    if unknown:
        raise KeyError(f"no answer cells with grade_ids {sorted(unknown)} in {assignment_id}")
    filled = {**reference, **(answers or {})}
    for cell in nb.cells:
        if is_answer_cell(cell):
            cell.source = filled[cell.metadata.nbgrader["grade_id"]]
    return nb
