"""Points are stated where learners read them and agree with what is graded: each exercise's heading,
each notebook's **Points** line and the README table all equal the sum of the test cells' points, and
points follow difficulty (a required ★★★ exercise is worth more than any ★☆☆ one)."""
import re
from dataclasses import dataclass

import nbformat
import pytest

from autograder.config import REPO_ROOT, assignment_ids
from autograder.grading import is_stretch
from autograder.submissions import solution_path

ASSIGNMENTS = assignment_ids()
HEADING = re.compile(r"^### Exercise \d+(?P<optional>[^:`]*optional[^:`]*)?: `(?P<name>\w+)`(?: and `\w+`)?\s*\n+"
                     r"\*\*Difficulty\*\* (?P<stars>[★☆]{3}) .*?\*\*(?P<points>\d+) points?", re.M)
# points a required exercise may be worth, by difficulty (CONTRIBUTING.md, "Points")
POINTS_BY_DIFFICULTY = {"★☆☆": range(1, 5), "★★☆": range(2, 8), "★★★": range(5, 9)}


@dataclass
class Exercise:
    notebook: str
    name: str
    stars: str       # "" for a section's graded result (a training run), which has no difficulty
    stated: int
    optional: bool
    graded: float = 0.0
    stretch_cells: int = 0
    cells: int = 0


def exercises(assignment_id):
    """The exercises of a source notebook, each with the points of the test cells that follow it. A test
    cell in a section (`## ...`) but after no exercise of it (a training run's result) counts as an exercise
    named for the section, and the section's text must state its points (`**2 points**`)."""
    found, current, section = [], None, ""
    for cell in nbformat.read(solution_path(assignment_id), as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## "):
                    current, section = None, ""
            section += cell.source
            for match in HEADING.finditer(cell.source):
                current = Exercise(assignment_id, match["name"], match["stars"], int(match["points"]),
                                   bool(match["optional"]))
                found.append(current)
        grading = cell.metadata.get("nbgrader", {})
        if grading.get("grade"):
            if current is None:
                stated = re.search(r"\*\*(\d+) points?\*\*", section)
                assert stated, (f"{assignment_id}: test cell {grading['grade_id']} follows no exercise heading, "
                                "and its section does not state its points (**N points**)")
                current = Exercise(assignment_id, section.split("\n", 1)[0], "", int(stated[1]), False)
                found.append(current)
            current.graded += float(grading["points"])
            current.cells += 1
            current.stretch_cells += is_stretch(grading["grade_id"])
    return found


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_each_exercise_states_the_points_its_tests_give(assignment_id):
    found = exercises(assignment_id)
    assert found, f"{assignment_id}: no exercise heading matched {HEADING.pattern}"
    for exercise in found:
        assert exercise.cells, f"{assignment_id}: exercise {exercise.name} has no test cell"
        assert exercise.graded == exercise.stated, (
            f"{assignment_id}: exercise {exercise.name} says {exercise.stated} points, its tests give "
            f"{exercise.graded:g}")
        assert exercise.stretch_cells in (0, exercise.cells) and bool(exercise.stretch_cells) == exercise.optional, (
            f"{assignment_id}: exercise {exercise.name}: an optional heading and stretch_ grade_ids go together")
    assert sum(e.optional for e in found) <= 1, f"{assignment_id}: at most one optional stretch exercise"


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_notebook_and_readme_state_the_total(assignment_id):
    found = exercises(assignment_id)
    required = sum(e.graded for e in found if not e.optional)
    optional = sum(e.graded for e in found if e.optional)
    intro = nbformat.read(solution_path(assignment_id), as_version=4).cells[0].source
    stated = re.search(r"\*\*Points:\*\* (\d+)", intro)
    assert stated and int(stated[1]) == required, (
        f"{assignment_id}: the **Points:** line says {stated and stated[1]}, the required tests give {required:g}")
    if optional:
        assert re.search(rf"\b{optional:g} more\b.*optional", intro, re.S), (
            f"{assignment_id}: the **Points:** line should name the {optional:g} optional points")
    readme = (REPO_ROOT / "README.md").read_text()
    row = next((line for line in readme.splitlines() if f"({'course/'}{assignment_id}/" in line), "")
    cell = row.rstrip(" |").rsplit("|", 1)[-1].strip()
    expected = f"{required:g}" + (f" (+{optional:g} optional)" if optional else "")
    assert cell == expected, f"README's row for {assignment_id} says {cell!r} points, the notebook gives {expected!r}"


def test_points_follow_difficulty():
    """Across the course: a ★☆☆ exercise is worth 1-4 points, ★★☆ 2-7, ★★★ 5-8 (optional ones are apart)."""
    required = [e for a in ASSIGNMENTS for e in exercises(a) if not e.optional and e.stars]
    wrong = [f"{e.notebook} {e.name} {e.stars} {e.graded:g}" for e in required
             if e.graded not in POINTS_BY_DIFFICULTY[e.stars]]
    assert not wrong, f"points outside their difficulty's range {POINTS_BY_DIFFICULTY}: {wrong}"
    hardest = min(e.graded for e in required if e.stars == "★★★")
    easiest = max(e.graded for e in required if e.stars == "★☆☆")
    assert hardest > easiest, f"a ★★★ exercise ({hardest:g}) is worth no more than a ★☆☆ one ({easiest:g})"
