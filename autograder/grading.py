"""Grade one student notebook with nbgrader's own machinery and report the result.

`check_notebook(path)` is the grading contract behind `python -m autograder check PATH --json`:
it builds a throw-away nbgrader course in a temp folder (gradebook from `generate_assignment` on
solutions/), puts the submission in `submitted/`, runs `autograde` (which restores test cells from
the source by grade_id and executes the notebook), then reads scores from the gradebook and the
teaching messages from the autograded notebook.
"""
import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import sys
import tempfile
import warnings

import nbformat

from autograder.config import SOLUTIONS_DIR, assignment_ids, cache_dir, guard_environment, nbgrader_config
from autograder.submissions import is_answer_cell, released_path

STUDENT_ID = "selfstudy"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class TestResult:
    grade_id: str
    score: float
    max_score: float
    passed: bool
    message: str = ""


@dataclasses.dataclass
class Report:
    """`score` / `max_score` count the required tests; optional stretch tests (grade_id `stretch_...`)
    are counted apart, in `stretch_score` / `stretch_max_score`, so that no total requires them."""
    notebook: str
    score: float
    max_score: float
    tests: list
    errors: list
    flags: list
    stretch_score: float = 0.0
    stretch_max_score: float = 0.0

    @classmethod
    def of(cls, notebook, tests, errors, flags):
        required = [t for t in tests if not is_stretch(t.grade_id)]
        stretch = [t for t in tests if is_stretch(t.grade_id)]
        return cls(notebook, sum(t.score for t in required), sum(t.max_score for t in required), tests,
                   list(errors), list(flags), sum(t.score for t in stretch), sum(t.max_score for t in stretch))

    @property
    def full_marks(self):
        return self.score == self.max_score and self.stretch_score == self.stretch_max_score

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2)

    def to_table(self):
        width = max([len(t.grade_id) for t in self.tests] + [20])
        stretch = (f" (optional stretch: {self.stretch_score:g} / {self.stretch_max_score:g})"
                   if self.stretch_max_score else "")
        lines = [f"{self.notebook}: {self.score:g} / {self.max_score:g} points{stretch}", ""]
        for test in self.tests:
            mark = "PASS" if test.passed else "FAIL"
            lines.append(f"  {mark}  {test.grade_id:<{width}}  {test.score:g}/{test.max_score:g}")
            if test.message:
                lines += [f"        {line}" for line in test.message.splitlines()]
        for title, items in (("Errors", self.errors), ("Flags for review", self.flags)):
            if items:
                lines += ["", f"{title}:"] + [f"  - {printable(item)}" for item in items]
        return "\n".join(lines)


STRETCH_PREFIX = "stretch_"
MAX_NOTE_CHARS = 400


def printable(text, limit=MAX_NOTE_CHARS):
    """`text` as one line a terminal shows as it is: control and format characters (a newline, an escape code, a
    right-to-left mark) written as escapes, and cut at `limit`. Every line of a report that holds something a
    notebook wrote (a finding the kernel reported, a file name) goes through here, so no hand-in can forge a line
    of the class's report or send escape codes to the instructor's terminal."""
    import unicodedata
    text = "".join(ch if unicodedata.category(ch)[0] != "C" and unicodedata.category(ch) not in ("Zl", "Zp")
                   else ascii(ch)[1:-1] for ch in str(text))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def is_stretch(grade_id):
    """An optional ★★★ stretch test: graded, reported, but never part of a required total."""
    return grade_id.startswith(STRETCH_PREFIX)


def stretch_as_extra_credit(gradebook, assignment, student=None):
    """In an nbgrader gradebook, the optional stretch tests of `assignment` as extra credit: worth 0 in its
    maximum (so grades.csv and the feedback's total are the required points), and `student`'s points on
    them kept as `extra_credit`. Doing it twice changes nothing."""
    from nbgrader.api import MissingEntry
    for notebook in gradebook.find_assignment(assignment).notebooks:
        for cell in notebook.grade_cells:
            if is_stretch(cell.name):
                cell.max_score = 0.0
    if student is not None:
        try:
            submission = gradebook.find_submission(assignment, student)
        except MissingEntry:
            submission = None
        for notebook in submission.notebooks if submission else []:
            for grade in notebook.grades:
                if is_stretch(grade.name):
                    stretch_grade_as_extra_credit(grade)
    gradebook.db.commit()


def stretch_grade_as_extra_credit(grade):
    """One stretch test's grade (an nbgrader Grade or a dict of its fields): its points moved to extra credit."""
    get = grade.get if isinstance(grade, dict) else lambda name: getattr(grade, name)
    put = grade.__setitem__ if isinstance(grade, dict) else lambda name, value: setattr(grade, name, value)
    put("extra_credit", (get("extra_credit") or 0.0) + (get("auto_score") or 0.0))
    put("auto_score", 0.0 if get("auto_score") is not None else None)
    return grade


def grade_cells(nb):
    """(grade_id, points) of the test cells of a notebook, in order."""
    return [(cell.metadata.nbgrader["grade_id"], float(cell.metadata.nbgrader.get("points", 0)))
            for cell in nb.cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade")]


def source_notebook(assignment_id):
    return nbformat.read(SOLUTIONS_DIR / assignment_id / f"{assignment_id}.ipynb", as_version=4)


@functools.lru_cache(maxsize=None)
def max_score(assignment_id):
    """The points an assignment is worth: the sum over its required test cells in the source."""
    return sum(points for grade_id, points in grade_cells(source_notebook(assignment_id)) if not is_stretch(grade_id))


@functools.lru_cache(maxsize=None)
def stretch_points(assignment_id):
    """The points of an assignment's optional stretch tests."""
    return sum(points for grade_id, points in grade_cells(source_notebook(assignment_id)) if is_stretch(grade_id))


def identify_assignment(path, nb=None):
    """Which assignment a notebook belongs to: by file name, folder name, then by its grade_ids."""
    known = assignment_ids()
    for candidate in (path.stem, path.parent.name):
        if candidate in known:
            return candidate
    if nb is not None:
        ids = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in nb.cells}
        overlaps = {a: len(ids & {g for g, _ in grade_cells(source_notebook(a))}) for a in known}
        best = max(overlaps, key=overlaps.get, default=None)
        if best and overlaps[best]:
            return best
    return None


def integrity_flags(nb, source_nb):
    """Findings about test cells that were deleted, duplicated or edited (all restored from source). What
    the student's own code reaches is read by the grader when it runs the notebook (autograder/integrity.py)."""
    source_tests = {cell.metadata.nbgrader["grade_id"]: cell for cell in source_nb.cells
                    if cell.get("metadata", {}).get("nbgrader", {}).get("grade")}
    seen = {}
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in source_tests:
            seen.setdefault(grade_id, []).append(cell)
    flags = []
    for grade_id, source_cell in source_tests.items():
        copies = seen.get(grade_id, [])
        if not copies:
            flags.append(f"test cell '{grade_id}' was deleted; it was restored from the source")
            continue
        if len(copies) > 1:
            flags.append(f"test cell '{grade_id}' appears {len(copies)} times; only the first is graded")
        visible_source = _visible_part(source_cell.source)
        if _visible_part(copies[0].source).strip() != visible_source.strip():
            flags.append(f"test cell '{grade_id}' was edited; it was restored from the source")
        if str(copies[0].metadata.nbgrader.get("points")) != str(source_cell.metadata.nbgrader["points"]):
            flags.append(f"test cell '{grade_id}' had its points changed; the source's points were used")
    return flags


def sanitize(nb, source_nb):
    """Make nbgrader's metadata trustworthy before nbgrader reads it (it crashes on some edits).

    A cell whose grade_id the source knows gets the source's nbgrader metadata back (points, lock,
    type); later copies of a grade_id and grade_ids the source doesn't know become ordinary cells.
    """
    source_meta = {cell.metadata.nbgrader["grade_id"]: cell.metadata.nbgrader for cell in source_nb.cells
                   if "grade_id" in cell.get("metadata", {}).get("nbgrader", {})}
    seen = set()
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if grade_id in source_meta and grade_id not in seen:
            cell.metadata["nbgrader"] = nbformat.from_dict(dict(source_meta[grade_id]))
            seen.add(grade_id)
            continue
        del cell.metadata["nbgrader"]
        cell.metadata.pop("deletable", None)
        cell.metadata.pop("editable", None)
        cell["id"] = f"ungraded-{index}"


def restore_answer_cells(nb, assignment_id):
    """Put back the answer cells a hand-in lacks (deleted, or a copy older than the course), as released.

    nbgrader restores missing test cells after the cell that precedes them in the source, and crashes
    (KeyError) when that cell is a missing answer cell; so each one goes back, still raising
    NotImplementedError, after the nearest earlier graded cell the hand-in has. Returns the flags.
    """
    released = [cell for cell in nbformat.read(released_path(assignment_id), as_version=4).cells
                if "grade_id" in cell.get("metadata", {}).get("nbgrader", {})]

    def position(grade_id):
        return next((i for i, cell in enumerate(nb.cells)
                     if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id), None)

    flags = []
    for order, cell in enumerate(released):
        grade_id = cell.metadata.nbgrader["grade_id"]
        if not is_answer_cell(cell) or position(grade_id) is not None:
            continue
        earlier = (position(c.metadata.nbgrader["grade_id"]) for c in reversed(released[:order]))
        anchor = next((i for i in earlier if i is not None), -1)
        restored = nbformat.from_dict(copy.deepcopy(cell))
        restored["id"] = grade_id
        nb.cells.insert(anchor + 1, restored)
        flags.append(f"answer cell '{grade_id}' was missing; the released one was put back, so its tests score 0")
    return flags


def _visible_part(source):
    """A test cell's source as released: the hidden-test region removed."""
    return re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", source, flags=re.S)


UNDEFINED_NAME = re.compile(r"name '(\w+)' is not defined")


def _error_of(cell):
    """The (ename, evalue) of a cell's error output, or None."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), ANSI_ESCAPE.sub("", output.get("evalue", ""))
    return None


def _failure_message(cell, cells=()):
    """What a failed test cell teaches. `cells`: the notebook's cells, to say why a name the test needs is
    undefined (the cell above that defines it stopped with an error: that error is the one to fix)."""
    error = _error_of(cell)
    if error is None:
        return ""
    ename, evalue = error
    if ename == "NotImplementedError" and not evalue:
        return "Not answered yet: the function still raises NotImplementedError."
    if ename == "AssertionError" and evalue:
        return evalue
    if ename == "CellTimeoutError":
        return "This test cell ran out of time: is there an infinite loop in your code?"
    if ename == "NotebookTimeoutError":
        return evalue
    message = f"{ename}: {evalue}".strip(": ")
    undefined = UNDEFINED_NAME.fullmatch(evalue) if ename == "NameError" else None
    above = [c for c in cells[:next((i for i, c in enumerate(cells) if c is cell), 0)]
             if c.get("cell_type") == "code"]
    for earlier in reversed(above if undefined else []):
        cause = _error_of(earlier)
        if cause and cause != error and re.search(rf"\b{undefined.group(1)}\b", "".join(earlier.get("source", ""))):
            return f"{message}: the cell above that defines it stopped with {cause[0]}: {cause[1]}".strip(": ")
    return message


def _zero_report(assignment_id, name, source_nb, errors, flags=()):
    tests = [TestResult(g, 0.0, p, False, "not graded: see errors") for g, p in grade_cells(source_nb)]
    return Report.of(name, tests, errors, flags)


MAX_CELLS = 2000                  # the course's longest notebook has about 250
MAX_NOTEBOOK_BYTES = 100 * 2**20  # a notebook of the course with every output kept is a few MB


def too_large(path=None, nb=None):
    """Why a hand-in is too large to grade (a file of more than MAX_NOTEBOOK_BYTES, or more than MAX_CELLS
    cells), or None. Grading it would hold a worker, or the grader's memory, for nothing."""
    if path is not None and pathlib.Path(path).is_file() and pathlib.Path(path).stat().st_size > MAX_NOTEBOOK_BYTES:
        return (f"{pathlib.Path(path).name} is {pathlib.Path(path).stat().st_size / 2**20:,.0f} MB, more than any "
                f"notebook of this course ({MAX_NOTEBOOK_BYTES // 2**20} MB at most): clear its outputs and hand it in "
                "again; not graded, scored 0")
    if nb is not None and len(nb.cells) > MAX_CELLS:
        return (f"the notebook has {len(nb.cells):,} cells, more than any notebook of this course ({MAX_CELLS:,} at "
                "most): not graded, scored 0")
    return None


def check_notebook(path, assignment_id=None, cell_timeout=None, sandbox_mode="preferred", executor=None,
                   notebook_timeout=None):
    """Grade the notebook at `path` and return a Report. Never raises on a bad submission.
    `sandbox_mode` (autograder/sandbox.py): "preferred" grades unsandboxed, with a warning, where the
    machine has no sandbox. `executor`: a subclass of GuardedExecute to run it (the suite's replay)."""
    path = pathlib.Path(path)
    errors = []
    try:
        if too_large(path):
            raise ValueError(too_large(path))
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        if too_large(nb=nb):
            raise ValueError(too_large(nb=nb))
    except FileNotFoundError:
        nb, errors = None, [f"no notebook at {path}"]
    except ValueError as error:
        nb, errors = None, [str(error) if "not graded" in str(error) else
                            f"unreadable notebook {path.name}: {type(error).__name__}: {error}"]
    except Exception as error:  # unreadable JSON, truncated file, wrong schema...
        nb, errors = None, [f"unreadable notebook {path.name}: {type(error).__name__}: {error}"]

    assignment_id = assignment_id or identify_assignment(path, nb)
    if assignment_id is None:
        errors.append(f"cannot tell which assignment {path.name} belongs to; "
                      f"expected one of: {', '.join(assignment_ids())}")
        return Report(path.stem, 0.0, 0.0, [], errors, [])
    source_nb = source_notebook(assignment_id)
    if nb is None:
        return _zero_report(assignment_id, assignment_id, source_nb, errors)

    try:
        flags = integrity_flags(nb, source_nb)
        sanitize(nb, source_nb)
        flags += restore_answer_cells(nb, assignment_id)
        autograded_nb, grades, run_errors = autograde(nb, assignment_id, cell_timeout, sandbox_mode, executor,
                                                      notebook_timeout)
    except Exception as error:  # a submission must never crash the grader
        return _zero_report(assignment_id, assignment_id, source_nb,
                            errors + [f"could not grade {path.name}: {type(error).__name__}: {error}"])
    errors += run_errors
    flags += graded_findings(autograded_nb)
    if grades is None:
        return _zero_report(assignment_id, assignment_id, source_nb, errors, flags)

    cells_by_id = {}
    for cell in (autograded_nb.cells if autograded_nb else []):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        cells_by_id.setdefault(grade_id, cell)
    tests = []
    for grade_id, max_score in grade_cells(source_nb):
        score = grades.get(grade_id, 0.0)
        passed = score >= max_score
        message = "" if passed else (_failure_message(cells_by_id.get(grade_id, {}), autograded_nb.cells if autograded_nb else ())
                                     or "this test did not run")
        tests.append(TestResult(grade_id, score, max_score, passed, message))
    return Report.of(assignment_id, tests, errors, flags)


def autograde(nb, assignment_id, cell_timeout=None, sandbox_mode="preferred", executor=None, notebook_timeout=None):
    """nbgrader generate_assignment + autograde of `nb` in a throw-away course folder.

    Returns (the autograded notebook or None, {grade_id: score} or None, [errors]).
    """
    with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
        return _autograde(nb, assignment_id, pathlib.Path(tmp), cell_timeout, sandbox_mode, executor, notebook_timeout)


def _autograde(nb, assignment_id, work, cell_timeout, sandbox_mode="preferred", executor=None, notebook_timeout=None):
    from autograder.sandbox import warn_if_unsandboxed
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = nbgrader_config(root=work, release=work / "release", work=work)
    if cell_timeout is not None:
        config.Execute.timeout = int(cell_timeout)
    if notebook_timeout is not None:
        config.GuardedExecute.notebook_timeout = int(notebook_timeout)
    config.NbGraderAPI.log_level = logging.ERROR
    config.GuardedExecute.sandbox = sandbox_mode
    if executor is not None:
        config.Autograde.autograde_preprocessors = [executor if step.__name__ == "GuardedExecute" else step
                                                    for step in config.Autograde.autograde_preprocessors]
    warn_if_unsandboxed(sandbox_mode)  # before stderr goes to the kernel's log
    coursedir = CourseDirectory(config=config)
    api = NbGraderAPI(coursedir=coursedir, config=config)
    try:
        shutil.copyfile(generated_gradebook(assignment_id), work / "gradebook.db")
    except RuntimeError as error:
        return None, None, [str(error)]

    submitted = work / "submitted" / STUDENT_ID / assignment_id / f"{assignment_id}.ipynb"
    submitted.parent.mkdir(parents=True)
    nbformat.write(nb, submitted)
    with kernel_stderr_to(work / "kernel-stderr.log") as kernel_log, \
            environment(kernel_environment(config)):
        result = api.autograde(assignment_id, STUDENT_ID)
    errors = [] if result["success"] else [autograde_error(result, kernel_log.read_text())]

    autograded_path = work / "autograded" / STUDENT_ID / assignment_id / f"{assignment_id}.ipynb"
    autograded_nb = nbformat.read(autograded_path, as_version=4) if autograded_path.exists() else None
    if not result["success"]:
        return autograded_nb, None, errors
    with Gradebook(coursedir.db_url, coursedir.course_id) as gradebook:
        submission = gradebook.find_submission_notebook(assignment_id, assignment_id, STUDENT_ID)
        grades = {grade.name: float(grade.score) for grade in submission.grades}
    return autograded_nb, grades, errors


def kernel_environment(config):
    """What grading kernels inherit: the guard's lists of files, and two speed settings."""
    return {
        # The notebooks' tensors are tiny: one BLAS/OpenMP thread per kernel is as fast alone and
        # much faster when several kernels share the cores (parallel grading, the test suite).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # No test reads a picture: figures are drawn but not rendered to PNG while grading.
        "MPLBACKEND": os.environ.get("MPLBACKEND", "Agg"),
        **guard_environment(config),
    }


def folder_digest(folder):
    """A short hash of every file under `folder` (names and bytes)."""
    sha = hashlib.sha256()
    for path in sorted(p for p in pathlib.Path(folder).rglob("*") if p.is_file()):
        sha.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def generated_gradebook(assignment_id, visible_only=False):
    """A gradebook holding only `assignment_id`, made by `nbgrader generate_assignment` (about 1.7 s
    saved per check). `visible_only`: its test cells without their hidden part, so that autograde, which puts
    the gradebook's test cells back into the notebook, runs the visible tests alone (the feedback service's
    "visible" mode)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    def generate(work):
        source = SOLUTIONS_DIR
        if visible_only:
            source = work / "visible-source"
            shutil.copytree(SOLUTIONS_DIR / assignment_id, source / assignment_id)
            path = source / assignment_id / f"{assignment_id}.ipynb"
            nb = nbformat.read(path, as_version=4)
            for cell in nb.cells:
                if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                    cell.source = _visible_part(cell.source)
            nbformat.write(nb, path)
        config = nbgrader_config(root=work, source=source, release=work / "release", work=work)
        config.NbGraderAPI.log_level = logging.ERROR
        with contextlib.redirect_stdout(None):
            api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
            generated = api.generate_assignment(assignment_id)
        if not generated["success"]:
            raise RuntimeError(f"could not build the gradebook for {assignment_id}: {generated.get('error')}")
    return cached_gradebook(("visible-" if visible_only else "") + assignment_id, [assignment_id], generate)


def cached_gradebook(name, assignments, generate):
    """The gradebook.db that `generate(folder)` writes in an empty folder, made once per version of the
    source folders of `assignments` and kept in the user's cache (config.cache_dir(), never the checkout)
    as gradebooks/<name>-<digest>.db."""
    key = hashlib.sha256(" ".join(f"{a}:{folder_digest(SOLUTIONS_DIR / a)}" for a in assignments).encode())
    cached = cache_dir() / "gradebooks" / f"{name}-{key.hexdigest()[:16]}.db"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="generate-", dir=cached.parent) as tmp:
            generate(pathlib.Path(tmp))
            os.replace(pathlib.Path(tmp) / "gradebook.db", cached)  # atomic: parallel runs never see half a file
    return cached


def graded_findings(autograded_nb):
    """What grading found in a notebook it ran, for the report: tampering, judges' flags, runaway cells."""
    return guard_flags(autograded_nb) + runaway_notes(autograded_nb)


def guard_flags(autograded_nb):
    """The grading kernel's findings (autograder/guard.py), which zero the notebook, the judges'
    flags (autograder/judging.py), which cost one test each, and what the source only suggests, which costs
    nothing and is for the instructor's review, as flags."""
    if autograded_nb is None:
        return []
    from autograder.execute import bounded
    found = autograded_nb.metadata.get("autograder", {})
    return ([f"tampering, all tests scored 0: {finding}" for finding in bounded(found.get("guard_findings", []))]
            + [f"review: {flag}" for flag in bounded(found.get("judge_flags", []))]
            + [f"review, every point kept: {flag}" for flag in bounded(found.get("review", []))])


def runaway_notes(autograded_nb):
    """Cells that were stopped (time limit, memory cap) or whose output was cut, for the report."""
    notes = []
    for index, cell in enumerate(autograded_nb.cells if autograded_nb else []):
        if cell.get("cell_type") != "code":
            continue
        where = f"cell {index + 1}"
        for output in cell.get("outputs", []):
            name = output.get("ename")
            if name == "CellTimeoutError":
                notes.append(f"{where} ran past the time limit and was interrupted; grading went on")
            elif name == "NotebookTimeoutError":
                notes.append(f"the notebook ran past its time budget: {where} and the cells after it did not run")
                return notes
            elif name == "MemoryError":
                notes.append(f"{where} ran out of memory (the grading kernel's cap); grading went on")
            elif "output beyond" in output.get("text", "") and "[grader]" in output.get("text", ""):
                notes.append(f"{where} printed too much: its output was cut")
    return notes


@contextlib.contextmanager
def environment(variables):
    """Set environment variables (inherited by the kernels nbgrader starts) for the duration; a value of
    None unsets the variable."""
    saved = {name: os.environ.get(name) for name in variables}
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def kernel_stderr_to(log_path):
    """Send stderr (the kernel inherits it) and library warnings to a log while grading."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with open(log_path, "w+") as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. SQLAlchemy's SAWarning from inside nbgrader
        os.dup2(log.fileno(), 2)
        try:
            yield log_path
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def autograde_error(result, kernel_stderr=""):
    text = result.get("error", "") + result.get("log", "") + kernel_stderr
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the kernel died while running the notebook (a crash, os._exit or running out of memory)"
    if "CellTimeoutError" in text and "IOPub" in text:
        return ("the kernel stopped answering after a cell (code in the notebook broke the kernel "
                "or blocked it); the notebook could not be graded")
    if "CellTimeoutError" in text or "UnresponsiveKernelError" in text:
        return "a cell ran past the time limit and could not be interrupted; the notebook could not be graded"
    causes = [line.strip() for line in text.splitlines()
              if re.match(r"\s*[\w.]+(Error|Exception): ", line) and "NbGraderException" not in line]
    last = causes[-1:] or [line for line in text.strip().splitlines() if line.strip()][-1:] or ["unknown error"]
    return f"nbgrader autograde failed: {last[0]}"
