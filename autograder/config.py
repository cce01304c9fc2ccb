"""The course's nbgrader configuration: one source for `nbgrader_config.py` and the Python API.

Layout: solutions/<id>/<id>.ipynb (nbgrader source) -> course/<id>/<id>.ipynb (release).
nbgrader's working folders (gradebook, submitted, autograded, feedback) live in autograder/work/,
which git ignores, unless a command is given another folder (`make grade GRADE_DIR=...`). What the
grader can rebuild and keeps between runs lives in the user's own cache (`cache_dir()`): grading never
writes into the checkout, which on a shared machine belongs to someone else.
"""
import functools
import os
import pathlib
import sys

from traitlets.config import Config

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = REPO_ROOT / "solutions"
COURSE_DIR = REPO_ROOT / "course"
WORK_DIR = REPO_ROOT / "autograder" / "work"
CACHE_ENV = "AUTOGRADER_CACHE_DIR"
COURSE_ID = "transformers-from-the-ground-up"

# A cell that runs longer than this is interrupted and the rest of the notebook still runs.
CELL_TIMEOUT_SECONDS = 60
# A whole notebook's wall-clock budget: cells that start after it are not run (their tests fail), so
# cells that sleep just under the cell limit cannot hold a grading worker for long. The slowest
# notebook takes under 30 s of CPU; this leaves room for a loaded machine.
NOTEBOOK_TIMEOUT_SECONDS = 240
# Limits of each grading kernel (autograder/kernel.py). A kernel importing torch and transformers
# maps about 0.8 GB; a memory bomb gets MemoryError at the cap instead of taking the machine down.
KERNEL_MEMORY_BYTES = 4 * 2**30
KERNEL_FILE_SIZE_BYTES = 256 * 2**20
# CPU seconds of a grading kernel: a generous backstop behind the per-cell timeout (notebooks take < 1 min).
KERNEL_CPU_SECONDS = 20 * 60
# Output kept per cell while a notebook runs (autograder/execute.py); nbgrader's LimitOutput then
# trims what is kept to 1000 lines.
MAX_OUTPUT_BYTES_PER_CELL = 1_000_000


def cache_dir():
    """The grader's cache (gradebooks generated from the sources, keyed by their digest): $AUTOGRADER_CACHE_DIR,
    else $XDG_CACHE_HOME/transformers-course, else ~/.cache/transformers-course. Per user and outside the
    checkout, so an instructor who may not write the course's checkout grades from a pristine install, and no
    run of someone else's (root's tests) warms a cache that another user then relies on."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return pathlib.Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "transformers-course"


def writable(folder):
    """Whether this user may create `folder` (or write in it, where it exists)."""
    folder = pathlib.Path(folder)
    while not folder.exists():
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK)


def assignment_ids():
    """The assignments, one per source notebook, in course order."""
    return sorted(p.name for p in SOLUTIONS_DIR.iterdir()
                  if p.is_dir() and (p / f"{p.name}.ipynb").exists())


def nbgrader_config(root=REPO_ROOT, source=SOLUTIONS_DIR, release=COURSE_DIR, work=WORK_DIR):
    """A traitlets Config for nbgrader. Paths may point elsewhere (tests grade in temp folders)."""
    work = pathlib.Path(work)
    c = Config()
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.source_directory = str(source)
    c.CourseDirectory.release_directory = str(release)
    c.CourseDirectory.submitted_directory = str(work / "submitted")
    c.CourseDirectory.autograded_directory = str(work / "autograded")
    c.CourseDirectory.feedback_directory = str(work / "feedback")
    c.CourseDirectory.db_url = f"sqlite:///{work / 'gradebook.db'}"
    if writable(work):  # a checkout someone else owns stays untouched (the hub's instructors use their own)
        (work / "exchange").mkdir(parents=True, exist_ok=True)
    c.Exchange.root = str(work / "exchange")  # unused (no JupyterHub exchange), but must be writable
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.bak"]
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
    c.Execute.timeout = CELL_TIMEOUT_SECONDS
    c.GuardedExecute.notebook_timeout = NOTEBOOK_TIMEOUT_SECONDS
    c.Execute.interrupt_on_timeout = True
    # After a cell's reply, nbclient waits this long for its last outputs, then fails the whole
    # notebook; the default (4 s) is too short on a loaded grading machine.
    c.Execute.iopub_timeout = 30
    c.GuardedExecute.max_output_bytes_per_cell = MAX_OUTPUT_BYTES_PER_CELL
    # Every grading kernel runs in the OS sandbox (autograder/sandbox.py); nbgrader autograde fails a
    # notebook rather than grade it unsandboxed. Self-study `check` and `grade --unsandboxed` relax it.
    c.GuardedExecute.sandbox = "required"
    # A deleted test cell is put back from the source, as the instructor wrote it.
    c.OverwriteCells.add_missing_cells = True
    # A library warning on stderr must never cost a correct answer its points (see stderr.py).
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
    from autograder.feedback import FeedbackHTMLExporter
    c.GenerateFeedback.exporter_class = FeedbackHTMLExporter   # nbconvert's, without a costly pass (see there)
    import nbgrader.api
    nbgrader.api.get_alembic_version = gradebook_schema_revision  # see there: nbgrader's own costs a process
    return c


@functools.cache
def gradebook_schema_revision():
    """The revision of nbgrader's gradebook schema, as `alembic heads` prints it, read in this process.
    nbgrader starts an `alembic` process for it each time it creates a gradebook (2.6 s of CPU, 17
    times in a run of the suite); `nbgrader_config()` gives nbgrader this function in its place."""
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR
    alembic = AlembicConfig()
    alembic.set_main_option("script_location", ALEMBIC_DIR)
    return ScriptDirectory.from_config(alembic).get_current_head()


def autograde_preprocessors():
    """nbgrader's autograde pipeline, with the hardened Execute and three steps of the course's."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern,
                                        LimitOutput, SaveAutoGrades)

    from autograder.execute import GuardedExecute, QueueForReview, ZeroScoresOnTampering
    from autograder.safe_html import SafeForViewers
    from autograder.stderr import KeepStderrFromFailingTests
    return [GuardedExecute, KeepStderrFromFailingTests, IgnorePattern, ClearMetadataPreprocessor,
            LimitOutput, ZeroScoresOnTampering, SaveAutoGrades, QueueForReview, AssignLatePenalties,
            CheckCellMetadata, SafeForViewers]   # the last: what browsers render of it (safe_html.py)


def guard_environment(config):
    """What the grading kernel may not open, and may not write (see autograder/guard.py)."""
    from autograder import guard
    from autograder.kernel_manager import private_socket_folder
    course = config.CourseDirectory
    root = pathlib.Path(course.root)
    denied = [SOLUTIONS_DIR, REPO_ROOT / "autograder" / "tests", WORK_DIR, cache_dir(), root / "gradebooks",
              pathlib.Path(course.source_directory), pathlib.Path(course.submitted_directory),
              pathlib.Path(course.autograded_directory), pathlib.Path(course.feedback_directory),
              root / "gradebook.db", root / "gradebook.db-journal", private_socket_folder()]
    read_only = [REPO_ROOT, root, pathlib.Path(sys.prefix)]
    return {guard.DENY_ENV: os.pathsep.join(map(str, denied)),
            guard.READ_ONLY_ENV: os.pathsep.join(map(str, read_only))}
