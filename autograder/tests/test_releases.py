"""Hand-ins from any earlier release are graded as their students wrote them (autograder/releases.py).

An instructor fixes a notebook mid-term and releases it again; students who started from the first release hand
in its course cells. The grader knows the course cells of every release (released_cells.json, which `make
release` appends to), so such a cell is the course's, not the student's: a course cell that reaches `globals()`
(as the course's own test cells do) must not put the student's notebook up for review, nor cost a point. A
course cell pasted with a change is the student's own.
"""
import copy

import nbformat
import pytest

from autograder import integrity, releases
from autograder.config import assignment_ids
from autograder.execute import code_cells
from autograder.submissions import released_path, student_notebook

ASSIGNMENT = "04_self_attention"
FIX = '\ntimings = globals().setdefault("timings", {})   # a course cell of the first release'


@pytest.mark.parametrize("assignment", assignment_ids())
def test_every_release_is_recorded(assignment):
    """The released notebook's course cells are in the manifest (`make release` records them; a course/
    edited by hand, or a release that did not record, fails here)."""
    course = releases.course_cells(nbformat.read(released_path(assignment), as_version=4))
    missing = course - releases.released(assignment)
    assert not missing, (f"{len(missing)} course cells of course/{assignment} are not in {releases.MANIFEST.name}: "
                         "release with `python -m autograder release` (it records them)")


def first_release(nb):
    """`nb` as an earlier release had it: its first course code cell then ended with FIX."""
    earlier = copy.deepcopy(nb)
    cell = next(c for c in earlier.cells if c.cell_type == "code"
                and not c.metadata.get("nbgrader", {}).get("solution") and not c.metadata.get("nbgrader", {}).get("grade"))
    cell.source += FIX
    return earlier, cell


@pytest.fixture
def manifest(tmp_path, monkeypatch):
    """A copy of the manifest to record in, put back (and the cache cleared) afterwards."""
    path = tmp_path / "released_cells.json"
    path.write_text(releases.MANIFEST.read_text())
    monkeypatch.setattr(releases, "MANIFEST", path)
    releases.released.cache_clear()
    yield path
    releases.released.cache_clear()


def routes_of(nb):
    return integrity.route_findings([(label, source) for _, label, source in code_cells(nb, ASSIGNMENT)])


def test_a_hand_in_from_an_earlier_release_is_read_as_written(manifest, grade_in_tmp):
    hand_in, _ = first_release(student_notebook(ASSIGNMENT))
    # control: a release the grader does not know, so its changed cell reads as the student's own code
    assert routes_of(hand_in), "control: the first release's cell, unknown, should read as the student's globals()"
    earlier, _ = first_release(nbformat.read(released_path(ASSIGNMENT), as_version=4))
    assert releases.record(ASSIGNMENT, earlier, manifest) == 1, "the first release adds one course cell"
    assert not routes_of(hand_in), "a course cell of a recorded release is the course's"
    report = grade_in_tmp(hand_in, ASSIGNMENT)
    assert report.score == report.max_score and not report.flags, (
        f"a hand-in from the first release scores what its answers earn: {report.score}/{report.max_score}, "
        f"flags {report.flags}")


def test_a_pasted_course_cell_with_a_change_is_the_students(manifest):
    earlier, _ = first_release(nbformat.read(released_path(ASSIGNMENT), as_version=4))
    releases.record(ASSIGNMENT, earlier, manifest)
    hand_in, cell = first_release(student_notebook(ASSIGNMENT))
    cell.source = cell.source.replace("timings = ", "timings  = ")   # one character more
    labels = [label for _, label, source in code_cells(hand_in, ASSIGNMENT) if source == cell.source]
    assert labels and labels[0] is not None, "a course cell changed by a character is the student's code"
    assert routes_of(hand_in), "and what it does is read as theirs"
