"""Released notebooks score 0 and still run, course/ is what release makes, solutions pass nbgrader's validator.

That the reference answers score 100% is proven where they are graded anyway: by test_variants.py's replay
(the released notebook with the reference answers typed in, through the real path, its CPU budget measured)
and by ada's hand-ins in the demo class (test_classroom.py), which are graded under a fresh random key every
run."""
import filecmp
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from sqlalchemy import text

from autograder.config import COURSE_DIR, SOLUTIONS_DIR, assignment_ids, nbgrader_config
from autograder.execute import run_as_learner
from autograder.grading import autograde
from autograder.kernel_manager import private_socket_validator
from autograder.release import release
from autograder.submissions import is_answer_cell, reference_answers, released_path, solution_path, student_notebook

ASSIGNMENTS = assignment_ids()


def test_there_are_assignments():
    assert "04_self_attention" in ASSIGNMENTS, f"expected the exemplar notebook among {ASSIGNMENTS}"


# Notebooks whose graded runs skip what no test reads: transformers (a second or more to import) where only the
# learner's comparisons need it, and experiments that train more models (07's pre-LN against post-LN and 10's
# label smoothing, each over five seeds). The suite runs their learner's path here, with what it must
# print; the claims those cells check (`check_claim`) are then checked at the learner's settings.
LEARNER_PATH_PRINTS = {
    "01_tokenization": ["BERT (WordPiece) vocabulary: 30522 · GPT-2 (byte-level BPE) vocabulary: 50257",
                        "BertTokenizerFast, same input_ids and attention_mask as the oracle: True"],
    "03_positional_encoding": [],   # its learner-only cells are visible tests: they must not raise
    # 07 and 10 compare training runs over five seeds (their prose's rankings are `check_claim`s in those cells, so
    # this test fails when a ranking breaks)
    "07_encoder": ["5 seeds, 80 steps each, mean ± standard deviation", "post-LN, no warm-up: last 10 losses",
                   "pre-LN, no warm-up: last 10 losses", "post-LN, 30 warm-up steps: last 10 losses",
                   "pre-LN ends below warmed-up post-LN in"],
    "10_encoder_decoder": ["5 seeds, 200 steps each, on 300 held-out dates", "exact match, mean ± standard deviation",
                           "held-out CE, mean ± standard deviation", "exact match with smoothing minus without"],
}
# 10's label-smoothing cell trains nine models (about a minute of CPU): room for a loaded machine
LEARNER_PATH_CELL_TIMEOUT = {"10_encoder_decoder": 900}


@pytest.mark.parametrize("assignment_id", sorted(LEARNER_PATH_PRINTS))
def test_the_learners_path_runs_where_grading_skips_work(assignment_id, tmp_path):
    """The released notebook with the reference answers, run as in JupyterLab (no NBGRADER_EXECUTION)."""
    shutil.copytree(released_path(assignment_id).parent, tmp_path, dirs_exist_ok=True)
    path = tmp_path / released_path(assignment_id).name
    nbformat.write(student_notebook(assignment_id), path)
    nb = run_as_learner(path, timeout=LEARNER_PATH_CELL_TIMEOUT.get(assignment_id, 300))
    printed = "".join(output.get("text", "") for cell in nb.cells for output in cell.get("outputs", [])
                      if output.get("output_type") == "stream")
    for line in LEARNER_PATH_PRINTS[assignment_id]:
        assert line in printed, f"{assignment_id}, run as a learner runs it, did not print {line!r}"


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_released_notebook_scores_zero_and_only_stubs_fail(assignment_id):
    nb = nbformat.read(released_path(assignment_id), as_version=4)
    autograded, grades, errors = autograde(nb, assignment_id)
    assert errors == [], errors
    assert grades and sum(grades.values()) == 0, f"the untouched release earned points: {grades}"
    for cell in autograded.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                assert output.ename == "NotImplementedError", (
                    f"the released notebook fails with {output.ename}: {output.evalue} in cell:\n{cell.source[:300]}")


def test_course_is_exactly_what_release_generates(tmp_path):
    release(dest=tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(COURSE_DIR) for p in COURSE_DIR.rglob("*") if p.is_file())
    assert generated == committed, "course/ lists different files from a fresh release: run `make release`"
    for relative in generated:
        assert filecmp.cmp(tmp_path / relative, COURSE_DIR / relative, shallow=False), (
            f"course/{relative} differs from what `make release` generates: never edit course/ by hand")


def test_gradebooks_get_the_schema_revision_alembic_prints(tmp_path, monkeypatch):
    """nbgrader_config() hands nbgrader an in-process reading of its gradebook schema's revision (no
    `alembic` process: none is on the PATH here); it must be what nbgrader's own way (an `alembic heads`
    process) reads, or new gradebooks would be stamped with a revision nbgrader's migrations do not know."""
    from nbgrader.api import Gradebook
    from nbgrader.dbutil import _temp_alembic_ini
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as alembic_ini:
        printed = subprocess.run([str(pathlib.Path(sys.executable).parent / "alembic"), "-c", alembic_ini, "heads"],
                                 capture_output=True, text=True, check=True).stdout
    expected = printed.split("\n")[0].split(" ")[0]
    nbgrader_config(root=tmp_path, work=tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "course") as gradebook:
        stamped = gradebook.db.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert stamped == expected, f"a new gradebook is stamped {stamped!r}; `alembic heads` prints {expected!r}"


def test_solutions_and_course_list_the_same_assignments():
    solutions = sorted(p.name for p in SOLUTIONS_DIR.iterdir() if p.is_dir())
    course = sorted(p.name for p in COURSE_DIR.iterdir() if p.is_dir())
    assert solutions == course


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_no_solution_code_or_hidden_tests_in_course(assignment_id):
    text = released_path(assignment_id).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "autograder.checks"):
        assert marker not in text, f"course/{assignment_id} contains '{marker}'"
    released = nbformat.read(released_path(assignment_id), as_version=4)
    released_code = "\n".join(cell.source for cell in released.cells)
    solution = nbformat.read(solution_path(assignment_id), as_version=4)
    for cell in solution.cells:
        for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", cell.source, flags=re.S):
            for line in region.splitlines():
                if len(line.strip()) > 12:
                    assert line.strip() not in released_code, f"solution line leaked into course/: {line.strip()}"


@pytest.mark.parametrize("path", sorted(SOLUTIONS_DIR.glob("*/*.ipynb")) + sorted(COURSE_DIR.glob("*/*.ipynb")),
                         ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_committed_notebooks_carry_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs in a cell starting {cell.source[:60]!r}: clear outputs before committing")


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_every_exercise_has_an_answer_cell_and_graded_tests(assignment_id):
    nb = nbformat.read(solution_path(assignment_id), as_version=4)
    answers = [c for c in nb.cells if is_answer_cell(c)]
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert answers and tests
    for cell in tests:
        meta = cell.metadata.nbgrader
        assert meta.get("locked") and meta.get("points", 0) > 0, f"{meta['grade_id']} must be locked with points"
        assert "### BEGIN HIDDEN TESTS" in cell.source, f"{meta['grade_id']} has no hidden tests"
        assert re.fullmatch(r"[a-z][a-z0-9_]+", meta["grade_id"]), f"grade_id {meta['grade_id']} is not meaningful"
    assert set(reference_answers(assignment_id)) == {c.metadata.nbgrader["grade_id"] for c in answers}


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_nbgrader_validator_passes_solution_and_fails_release(assignment_id):
    """nbgrader's Validator (behind JupyterLab's "Validate" button): an empty result means success. Every
    solution passes it. That it fails an untouched release is shown on the exemplar only: that every test of
    every release fails is test_released_notebook_scores_zero_and_only_stubs_fail's proof, without
    two more runs of every notebook here."""
    assert private_socket_validator().validate(str(solution_path(assignment_id))) == {}, (
        "the solution fails validation")
    if assignment_id != "04_self_attention":
        return
    released = private_socket_validator().validate(str(released_path(assignment_id)))
    assert released.get("failed"), "the untouched release should fail its visible tests"
    assert private_socket_validator(invert=True).validate(str(released_path(assignment_id))) == {}, (
        "`validate --invert`: no test of the untouched release may pass")


HINT = re.compile(r"<details><summary>Hint \d+: [^<]+</summary>\n\n.+?\n\n</details>", re.S)


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_every_exercise_has_hints_that_guide_without_the_answer(assignment_id):
    """Under every exercise, in the markdown cell right before its answer cell: two or three progressive
    hints, each a collapsible <details> block. (test_no_solution_code_or_hidden_tests_in_course proves
    that no line of an answer appears in the release, hints included.)"""
    nb = nbformat.read(solution_path(assignment_id), as_version=4)
    for index, cell in enumerate(nb.cells):
        if not is_answer_cell(cell):
            continue
        before = nb.cells[index - 1]
        hints = HINT.findall(before.source) if before.cell_type == "markdown" else []
        assert 2 <= len(hints) <= 3, (
            f"{assignment_id}: {cell.metadata.nbgrader['grade_id']} needs 2-3 hints in the markdown cell right before "
            f"it, each '<details><summary>Hint N: ...</summary>' ... '</details>'; found {len(hints)}")
