"""Grade a whole class with nbgrader: `python -m autograder grade [SUBMISSIONS] [--jobs N | --scheduler ADDRESS]`.

The class is an nbgrader course in autograder/work/class/ (sources: solutions/):
1. intake: submissions come from a folder in nbgrader's `submitted/<student>/<assignment>/` layout
   or from an LMS zip, taken in by `nbgrader zip_collect`. Each notebook is checked before nbgrader
   sees it: an unreadable file or a notebook of another assignment becomes an error line, a
   misnamed notebook is renamed, damaged test cells are restored from the source (and flagged).
2. grading: one task per student × notebook (autograder/cluster.py), longest first: `nbgrader
   autograde` in a throw-away course wherever the task runs, in this process (`--jobs 1`) or on
   Dask workers (a LocalCluster for `--jobs N`, an existing cluster for `--scheduler`). A task takes
   the hand-in's bytes and returns the grades as data; this process, the gradebook's only writer,
   merges each result as it arrives and then appends its line to the ledger, so an interrupted run
   picks up where it stopped. The hidden tests' inputs come from one key per course folder
   (`gradebooks/run-key`), so a resume or a regrade in the same folder grades alike.
3. outputs: feedback HTML per student and notebook (`nbgrader generate_feedback`, made by the
   task), `nbgrader export` (grades.csv), exercises.csv, a plot of the score distribution per
   exercise, and a table.
"""
import argparse
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import functools
import getpass
import json
import logging
import os
import pathlib
import shutil
import secrets
import sys
import time
import warnings
import zipfile

import nbformat
from nbgrader.plugins import FileNameCollectorPlugin
from sqlalchemy import and_, delete, insert, or_, select
from traitlets import Unicode

from autograder import cluster, grading, sandbox
from autograder.config import (CELL_TIMEOUT_SECONDS, REPO_ROOT, WORK_DIR, assignment_ids, cache_dir,
                               nbgrader_config, writable)
from autograder.judging import RUN_KEY_ENV

CLASS_DIR = WORK_DIR / "class"
DEMO_CLASS_DIR = REPO_ROOT / "autograder" / "demo_class"
LEDGER = "ledger.jsonl"
# The key of the hidden tests' inputs for this course folder: beside the gradebook, in the folder that
# grading kernels may not open (config.guard_environment) and that the sandbox does not contain.
RUN_KEY_FILE = pathlib.Path("gradebooks") / "run-key"
# Canvas-style LMS file names: <student>[_late]_<numbers>_<file name as uploaded>
LMS_FILE_NAME = r"(?P<student_id>[A-Za-z0-9.\-]+?)(_LATE|_late)?_\d+(_\d+)?_(?P<file_id>.+\.ipynb)$"


@dataclasses.dataclass
class Item:
    """One student's hand-in for one assignment, and what intake found."""
    student: str
    assignment: str
    digest: str
    errors: list = dataclasses.field(default_factory=list)
    flags: list = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------------------------- the course
def class_config(root, cell_timeout=None, db_path=None, sandbox_mode="required"):
    root = pathlib.Path(root)
    config = nbgrader_config(root=root, release=root / "release", work=root)
    config.GuardedExecute.sandbox = sandbox_mode  # "off" with --unsandboxed
    if db_path is not None:
        config.CourseDirectory.db_url = f"sqlite:///{db_path}"
    if cell_timeout is not None:
        config.Execute.timeout = int(cell_timeout)
    config.NbGraderAPI.log_level = logging.ERROR
    return config


def nbgrader_api(config):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def prepare_gradebook(root, assignments):
    """The class gradebook with every assignment of `assignments`: where there is none yet, a copy of the
    course's gradebook for them (`gradebook_template`); then `nbgrader generate_assignment` for each
    assignment it doesn't have yet."""
    config = class_config(root)
    path = pathlib.Path(config.CourseDirectory.db_url.removeprefix("sqlite:///"))
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gradebook_template(tuple(assignments)), path)
    _add_assignments(config, assignments)


def gradebook_template(assignments):
    """A class gradebook holding `assignments` and nothing else, made once per version of their sources
    (generating the eleven takes about 7 s, which every new course folder paid)."""
    return grading.cached_gradebook("class", assignments, lambda folder: _add_assignments(class_config(folder),
                                                                                           assignments))


def _add_assignments(config, assignments):
    from nbgrader.api import Gradebook
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        known = {a.name for a in gradebook.assignments}
    missing = [a for a in assignments if a not in known]
    if missing:
        api = nbgrader_api(config)
        with contextlib.redirect_stdout(None):
            for assignment in missing:
                result = api.generate_assignment(assignment)
                if not result["success"]:
                    raise RuntimeError(f"generate_assignment {assignment} failed: {result.get('error')}")
        stretch_as_extra_credit(config, missing)


def stretch_as_extra_credit(config, assignments):
    """Optional stretch tests are nbgrader's extra credit in the class gradebook: worth 0 in its maximum,
    their points kept in `extra_credit` (merge_submission), so grades.csv's max_score is the required total."""
    from nbgrader.api import Gradebook
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        for assignment in assignments:
            grading.stretch_as_extra_credit(gradebook, assignment)


def class_run_key(root, quiet=False):
    """The course folder's key for the hidden tests' inputs (autograder/judging.py): made once (from
    AUTOGRADER_RUN_KEY when set, else random) and kept, so that every notebook of the folder, on any
    worker, in any run, resumed or regraded, is graded with the same inputs."""
    path = pathlib.Path(root) / RUN_KEY_FILE
    configured = os.environ.get(RUN_KEY_ENV)
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(configured or secrets.token_hex(32))
    key = path.read_text()
    if configured and configured != key and not quiet:
        print(f"note: {RUN_KEY_ENV} is set but this course folder has its own key ({path}), which is used "
              "so that all its notebooks are graded alike; --restart starts over with a new one", file=sys.stderr)
    return key


# ----------------------------------------------------------------------------------------- intake
def find_submitted_folder(path):
    """The folder whose children are students: `path/submitted` if it exists, else `path`."""
    path = pathlib.Path(path)
    return path / "submitted" if (path / "submitted").is_dir() else path


def collect_zip(zip_path, root):
    """Take an LMS download in through `nbgrader zip_collect`; return the folder of students."""
    from nbgrader.apps import ZipCollectApp
    staging = pathlib.Path(root) / "intake"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as archive:
        names = [pathlib.PurePosixPath(n).name for n in archive.namelist() if n.endswith(".ipynb")]
    assignments = sorted({a for a in assignment_ids() if any(a in name for name in names)}) or assignment_ids()
    for assignment in assignments:
        config = nbgrader_config(root=staging, release=staging / "release", work=staging)
        config.ZipCollectApp.collector_plugin = LmsCollector
        config.ZipCollectApp.force = True
        config.LmsCollector.named_regexp = LMS_FILE_NAME
        config.LmsCollector.assignment = assignment
        archive_dir = staging / "downloaded" / assignment / "archive"
        archive_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(zip_path, archive_dir)
        app = ZipCollectApp(config=config)
        app.log.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(None), grading.kernel_stderr_to(staging / "zip_collect.log"):
            app.initialize([assignment])
            app.start()
    return staging / "submitted"


class LmsCollector(FileNameCollectorPlugin):
    """Collects the files of one assignment from an LMS download, renamed to the source's name."""
    assignment = Unicode("", help="the assignment being collected").tag(config=True)

    def collect(self, submitted_file):
        found = self._match(os.path.basename(submitted_file)) if submitted_file.endswith(".ipynb") else None
        if not found:
            return None
        which = identify(pathlib.Path(submitted_file), found["file_id"])
        if which != self.assignment:
            return None  # another assignment's file: collected when that one is
        found["file_id"] = f"{self.assignment}.ipynb"
        return found


def identify(path, name=None):
    """The assignment a notebook file belongs to, by name, else by its test cells' grade_ids."""
    name = pathlib.Path(name or path.name)
    for assignment in assignment_ids():
        if assignment in name.stem:
            return assignment
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:
        return None
    return grading.identify_assignment(pathlib.Path("unknown.ipynb"), nb)


def intake(source, root, assignments, done):
    """Copy hand-ins into the class's `submitted/`, checked and normalised; return the Items and
    lines about folders that are not assignments.

    Students whose hand-in is unchanged since it was graded (`done`: (student, assignment) ->
    digest) are left alone.
    """
    items, strays = [], []
    submitted = pathlib.Path(root) / "submitted"
    for student_dir in sorted(p for p in find_submitted_folder(source).iterdir() if p.is_dir()):
        for assignment_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if assignment_dir.name not in assignments:
                strays.append(f"{grading.printable(student_dir.name)}: folder {grading.printable(repr(assignment_dir.name))} "
                              "is not an assignment of this course: not graded")
                continue
            item = Item(student_dir.name, assignment_dir.name, grading.folder_digest(assignment_dir))
            items.append(item)
            if done.get((item.student, item.assignment)) == item.digest:
                continue
            target = submitted / item.student / item.assignment
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(assignment_dir, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            normalise(target, item)
    return items, strays


def normalise(folder, item):
    """Make `folder/<assignment>.ipynb` the notebook to grade, or explain why there is none."""
    expected = folder / f"{item.assignment}.ipynb"
    notebooks = sorted(folder.glob("*.ipynb"))
    if not expected.exists():
        mine = [p for p in notebooks if identify(p) == item.assignment]
        others = {p.name: identify(p) for p in notebooks if p not in mine}
        if mine:
            mine[0].rename(expected)
            item.flags.append(f"notebook handed in as '{mine[0].name}'; graded as {expected.name}")
        for name, other in others.items():
            item.errors.append(f"'{name}' is the notebook of {other}, not {item.assignment}: not graded here"
                               if other else f"'{name}' is not a notebook of this course: not graded")
        if not mine:
            item.errors.append(f"no {item.assignment} notebook handed in: scored 0")
            return
    large = grading.too_large(expected)
    try:
        nb = None if large else nbformat.read(expected, as_version=4)
        if nb is not None:
            nbformat.validate(nb)
            large = grading.too_large(nb=nb)
    except Exception as error:
        expected.unlink()
        item.errors.append(f"{expected.name} is unreadable ({type(error).__name__}: "
                           f"{grading.printable(str(error).splitlines()[0][:120])}): scored 0")
        return
    if large:
        expected.unlink()
        item.errors.append(large)
        return
    source = grading.source_notebook(item.assignment)
    item.flags += grading.integrity_flags(nb, source)
    grading.sanitize(nb, source)
    item.flags += grading.restore_answer_cells(nb, item.assignment)
    nbformat.write(nb, expected)


# ---------------------------------------------------------------------------------------- grading
def tasks_for(root, pending, run_key, timeout, sandbox_mode, identity, packages, ledger):
    """One cluster.Task per pending notebook, longest first (its hand-in read when it is sent)."""
    estimates = expected_seconds(ledger)
    tasks = []
    for item in pending:
        folder = pathlib.Path(root) / "submitted" / item.student / item.assignment
        tasks.append(cluster.Task(item.student, item.assignment, str(folder), run_key, timeout, sandbox_mode,
                                  identity["digest"], packages, estimates(item.assignment)))
    tasks.sort(key=lambda t: (-t.expected_seconds, t.student, t.assignment))
    return tasks


def expected_seconds(ledger):
    """How long an assignment's notebook takes to grade: the median of this folder's earlier runs,
    else a guess from the size of the source's code (a first run has nothing better)."""
    seen = {}
    for entry in ledger.entries.values():
        if not entry["errors"] and entry.get("seconds"):
            seen.setdefault(entry["assignment"], []).append(entry["seconds"])

    @functools.lru_cache(maxsize=None)
    def estimate(assignment):
        if seen.get(assignment):
            times = sorted(seen[assignment])
            return times[len(times) // 2]
        source = grading.source_notebook(assignment)
        return sum(len(c.source) for c in source.cells if c.cell_type == "code") / 1000
    return estimate


# ---------------------------------------------------------------------------------------- merging
# A batch of results goes into the class in one transaction: every result's gradebook rows and its
# ledger entry (a table of the gradebook's own database), so that a kill at any point leaves the gradebook
# holding exactly the notebooks of the ledger, each whole. ledger.jsonl is a readable copy, written after
# each commit and rewritten from the database when a kill came between the two.
LEDGER_TABLE = "autograder_ledger"
BATCH_SIZE = 500          # results per transaction, at most
BATCH_SECONDS = 1.0       # a result waits at most this long (or until the next result arrives) to be merged


def _ledger_table():
    from sqlalchemy import Column, MetaData, String, Table, Text
    return Table(LEDGER_TABLE, MetaData(), Column("student", String(128), primary_key=True),
                 Column("assignment", String(128), primary_key=True), Column("entry", Text(), nullable=False))


def gradebook_path(root):
    return pathlib.Path(root) / "gradebook.db"


def write_files(root, result):
    """A result's autograded notebook, feedback HTML and log, in the class's folders (before its rows)."""
    root = pathlib.Path(root)
    student, assignment = result["student"], result["assignment"]
    for folder, files in (("autograded", result["autograded"]), ("feedback", result["feedback"])):
        target = root / folder / student / assignment
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name, data in files.items():
            (target / pathlib.Path(name).name).write_bytes(data)
    log = root / "logs" / f"{student}-{assignment}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(result["log"])


@contextlib.contextmanager
def class_gradebook(root):
    """The class's gradebook, opened once (nbgrader checks its schema version in a subprocess each time)."""
    from nbgrader.api import Gradebook
    config = class_config(root)
    with warnings.catch_warnings(), Gradebook(config.CourseDirectory.db_url,
                                              config.CourseDirectory.course_id) as gradebook:
        warnings.simplefilter("ignore")  # SQLAlchemy's SAWarnings from inside nbgrader's models
        yield gradebook


def merge_batch(root, ledger, batch, gradebook):
    """Merge `batch`, a list of (Item, cluster.Outcome): files first (written side by side: the disk, not
    the processor, is what they wait for), then one transaction holding every result's gradebook rows (a
    result with none: no submission, a 0 and the reason) and its ledger entry, then the ledger's copy."""
    root = pathlib.Path(root)

    def files(pair):
        item, outcome = pair
        if outcome.result is not None:
            write_files(root, outcome.result)
        else:
            for folder in ("autograded", "feedback"):
                shutil.rmtree(root / folder / item.student / item.assignment, ignore_errors=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(files, batch))
    db = gradebook.db
    try:
        table = _ledger_table()
        table.create(db.connection(), checkfirst=True)
        _replace_submissions(gradebook, [(item.student, item.assignment, (outcome.result or {}).get("submission"))
                                         for item, outcome in batch])
        scores = _scores(gradebook, {(item.student, item.assignment) for item, _ in batch})
        entries = [_entry(item, outcome, scores.get((item.student, item.assignment), (0.0, 0.0)))
                   for item, outcome in batch]
        keys = [(e["student"], e["assignment"]) for e in entries]
        for chunk in _chunks(keys, 200):
            db.execute(delete(table).where(or_(*(and_(table.c.student == s, table.c.assignment == a)
                                                 for s, a in chunk))))
        db.execute(table.insert(), [{"student": e["student"], "assignment": e["assignment"], "entry": json.dumps(e)}
                                    for e in entries])
        db.commit()
    except BaseException:
        db.rollback()
        raise
    ledger.added(entries)
    return entries


def _entry(item, outcome, scores):
    result = outcome.result or {}
    errors = list(item.errors)
    error = result.get("error") or outcome.error
    if error and not any("scored 0" in e for e in errors):
        errors.append(error + ": scored 0")
    score, stretch = scores
    return {"student": item.student, "assignment": item.assignment, "digest": item.digest,
            "score": score, "max_score": grading.max_score(item.assignment), "stretch_score": stretch,
            "seconds": result.get("seconds", 0.0), "errors": errors,
            "flags": item.flags + list(result.get("findings", [])), "worker": result.get("worker")}


def _replace_submissions(gradebook, submissions):
    """Replace each (student, assignment)'s submission by its rows (cluster.submission_rows; None: no
    submission), with set-wise statements: a batch of hundreds costs a few dozen statements."""
    from nbgrader import utils
    from nbgrader.api import (Comment, Grade, Student, SubmittedAssignment, SubmittedNotebook, new_uuid)
    db = gradebook.db
    students = sorted({student for student, _, _ in submissions})
    db.execute(insert(Student.__table__).prefix_with("OR IGNORE"), [{"id": s} for s in students])
    course = {}  # assignment name -> (assignment id, [(notebook, {cell name: id} per kind)])
    for _, assignment, _ in submissions:
        if assignment not in course:
            found = gradebook.find_assignment(assignment)
            course[assignment] = (found.id, [(nb.id, nb.name, {c.name: c.id for c in nb.grade_cells},
                                               {c.name: c.id for c in nb.solution_cells},
                                               {c.name: c.id for c in nb.task_cells}) for nb in found.notebooks])
    pairs = [and_(SubmittedAssignment.student_id == student, SubmittedAssignment.assignment_id == course[a][0])
             for student, a, _ in submissions]
    old = [row[0] for chunk in _chunks(pairs, 200)
           for row in db.execute(select(SubmittedAssignment.id).where(or_(*chunk)))]
    for chunk in _chunks(old, 500):
        notebooks = select(SubmittedNotebook.id).where(SubmittedNotebook.assignment_id.in_(chunk))
        db.execute(delete(Grade).where(Grade.notebook_id.in_(notebooks)))
        db.execute(delete(Comment).where(Comment.notebook_id.in_(notebooks)))
        db.execute(delete(SubmittedNotebook).where(SubmittedNotebook.assignment_id.in_(chunk)))
        db.execute(delete(SubmittedAssignment).where(SubmittedAssignment.id.in_(chunk)))
    rows = {"submitted_assignment": [], "submitted_notebook": [], "grade": [], "comment": []}
    for student, assignment, data in submissions:
        if data is None:
            continue
        assignment_id, notebooks = course[assignment]
        submission_id = new_uuid()
        rows["submitted_assignment"].append({"id": submission_id, "assignment_id": assignment_id,
                                             "student_id": student, "extension": None,
                                             "timestamp": utils.parse_utc(data["timestamp"]) if data["timestamp"] else None})
        theirs = {nb["name"]: nb for nb in data["notebooks"]}
        for notebook_id, name, grade_cells, solution_cells, task_cells in notebooks:
            nb = theirs.get(name, {"flagged": False, "late_submission_penalty": None, "grades": {}, "comments": {}})
            mine = new_uuid()
            rows["submitted_notebook"].append({"id": mine, "assignment_id": submission_id, "notebook_id": notebook_id,
                                               "flagged": nb["flagged"],
                                               "late_submission_penalty": nb["late_submission_penalty"]})
            for cell, cell_id in {**grade_cells, **task_cells}.items():
                grade = {"auto_score": None, "manual_score": None, "extra_credit": None, "needs_manual_grade": False,
                         **nb["grades"].get(cell, {})}
                if grading.is_stretch(cell) and grade["auto_score"]:  # a worker that has not moved them yet
                    grading.stretch_grade_as_extra_credit(grade)
                rows["grade"].append({"id": new_uuid(), "cell_id": cell_id, "notebook_id": mine, **grade})
            for cell, cell_id in {**solution_cells, **task_cells}.items():
                comment = {"auto_comment": None, "manual_comment": None, **nb["comments"].get(cell, {})}
                rows["comment"].append({"id": new_uuid(), "cell_id": cell_id, "notebook_id": mine, **comment})
    for model in (SubmittedAssignment, SubmittedNotebook, Grade, Comment):
        if rows[model.__tablename__]:
            db.execute(insert(model.__table__), rows[model.__tablename__])


def _scores(gradebook, pairs):
    """{(student, assignment): (required score, optional stretch score)}, by nbgrader's own Grade.score."""
    from nbgrader.api import Assignment, Grade, GradeCell, SubmittedAssignment, SubmittedNotebook
    found = {}
    query = (select(SubmittedAssignment.student_id, Assignment.name, GradeCell.name, Grade.score)
             .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
             .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
             .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
             .join(GradeCell, Grade.cell_id == GradeCell.id))
    students = sorted({s for s, _ in pairs})
    for chunk in _chunks(students, 500):
        for student, assignment, cell, score in gradebook.db.execute(
                query.where(SubmittedAssignment.student_id.in_(chunk))):
            if (student, assignment) in pairs:
                required, stretch = found.get((student, assignment), (0.0, 0.0))
                found[(student, assignment)] = ((required, stretch + float(score)) if grading.is_stretch(cell)
                                                else (required + float(score), stretch))
    return found


def _chunks(items, size):
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


class Ledger:
    """What has been graded: one entry per (student, assignment), kept in the gradebook's database (in the
    transaction that merged its grades) and copied, one JSON line each, to `path` (ledger.jsonl)."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.entries = {}
        database = gradebook_path(self.path.parent)
        stored = _stored_entries(database) if database.exists() else None
        if stored is None:  # a course folder from before the table: its ledger.jsonl is the record
            stored = []
            if self.path.exists():
                for line in self.path.read_text().splitlines():
                    with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
                        stored.append(json.loads(line))
            self._migrate = bool(stored)
        else:
            self._migrate = False
        for entry in stored:
            self.entries[(entry["student"], entry["assignment"])] = entry
        if not self._migrate and self._copy_differs():
            self._rewrite_copy()

    def done(self):
        return {key: entry["digest"] for key, entry in self.entries.items()}

    def added(self, entries):
        """After a commit: remember the entries and append them to the copy."""
        for entry in entries:
            self.entries[(entry["student"], entry["assignment"])] = entry
        with open(self.path, "a") as copy:
            copy.writelines(json.dumps(entry) + "\n" for entry in entries)
            copy.flush()
            os.fsync(copy.fileno())

    def migrate(self, root):
        """Entries of a folder graded before the ledger's table: into the table, once."""
        if self._migrate:
            _store_entries(gradebook_path(root), list(self.entries.values()))
            self._migrate = False

    def _copy_differs(self):
        if not self.path.exists():
            return bool(self.entries)
        lines = self.path.read_text().splitlines()
        return len(lines) != len(self.entries) or any(not line.endswith("}") for line in lines)

    def _rewrite_copy(self):
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text("".join(json.dumps(e) + "\n" for e in self.entries.values()))
        os.replace(temporary, self.path)


def _stored_entries(database):
    import sqlite3
    with contextlib.closing(sqlite3.connect(database)) as connection:
        try:
            rows = connection.execute(f"SELECT entry FROM {LEDGER_TABLE}").fetchall()
        except sqlite3.OperationalError:  # no such table (yet)
            return None
    return [json.loads(entry) for (entry,) in rows]


def _store_entries(database, entries):
    import sqlite3
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (student VARCHAR(128) NOT NULL, "
                           "assignment VARCHAR(128) NOT NULL, entry TEXT NOT NULL, PRIMARY KEY (student, assignment))")
        connection.executemany(f"INSERT OR REPLACE INTO {LEDGER_TABLE} VALUES (?, ?, ?)",
                               [(e["student"], e["assignment"], json.dumps(e)) for e in entries])


def scores_of(root, student, assignment):
    """(score, max_score, guard findings, stretch score) of a graded notebook, from the gradebook and
    autograded/: the score counts the required tests, the optional stretch tests' points come apart."""
    with class_gradebook(root) as gradebook:
        score, stretch = _scores(gradebook, {(student, assignment)}).get((student, assignment), (0.0, 0.0))
    autograded = pathlib.Path(root) / "autograded" / student / assignment / f"{assignment}.ipynb"
    findings = []
    if autograded.exists():
        findings = grading.graded_findings(nbformat.read(autograded, as_version=4))
    return score, grading.max_score(assignment), findings, stretch


def engine_for(jobs, scheduler, quiet):
    """Where the tasks run: this process (jobs 1, no scheduler) or Dask (a LocalCluster or `scheduler`)."""
    if scheduler:
        return cluster.Dask(scheduler=scheduler, quiet=quiet)
    if jobs > 1:
        return cluster.Dask(jobs=jobs, quiet=quiet)
    return cluster.Serial(quiet=quiet)


def grade_pending(root, pending, ledger, timeout, engine, run_key, sandbox_mode, quiet):
    """Check the workers, then grade every pending Item with `engine`, merging each result as it
    arrives and appending its ledger line."""
    packages = cluster.pinned_packages()
    identity = engine.check_workers(packages, sandbox_mode)
    tasks = tasks_for(root, pending, run_key, timeout, sandbox_mode, identity, packages, ledger)
    items = {(i.student, i.assignment): i for i in pending}
    if not quiet:
        print(f"grading {len(pending)} notebooks {engine.description}"
              + (f"; Dask dashboard: {engine.dashboard}" if engine.dashboard else ""), file=sys.stderr)
    progress = _progress_bar(len(tasks), quiet)
    merging = 0.0  # the client's own time: the bound on how many workers one client can feed
    batch, since = [], None
    try:
        with class_gradebook(root) as gradebook:
            for outcome in engine.run(tasks):
                batch.append((items[(outcome.task.student, outcome.task.assignment)], outcome))
                since = since or time.monotonic()
                if len(batch) >= BATCH_SIZE or time.monotonic() - since >= BATCH_SECONDS:
                    merging += _merge(root, ledger, batch, gradebook, progress)
                    batch, since = [], None
            if batch:
                merging += _merge(root, ledger, batch, gradebook, progress)
    finally:
        progress.close()
    return merging


def _merge(root, ledger, batch, gradebook, progress):
    start = time.perf_counter()
    merge_batch(root, ledger, batch, gradebook)
    for _, outcome in batch:
        progress(outcome.task.name)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------- outputs
def write_outputs(root, students, assignments):
    """Feedback HTML, grades.csv (nbgrader export), exercises.csv and the distribution plot. Returns a
    line for each feedback page that could not be made, for the report."""
    config = class_config(root)
    api = nbgrader_api(config)
    root = pathlib.Path(root)
    (root / "logs").mkdir(parents=True, exist_ok=True)  # no result wrote a log when every notebook failed
    with contextlib.redirect_stdout(None), grading.kernel_stderr_to(root / "logs" / "outputs.log"):
        missing = feedback_pages(api, root, students, assignments)
        from nbgrader.apps import ExportApp
        export = ExportApp(config=config)
        export.initialize(["--to", str(root / "grades.csv")])
        export.start()
    rows = exercise_scores(root, assignments)
    with open(root / "exercises.csv", "w") as out:
        out.write("student,assignment,exercise,score,max_score\n")
        out.writelines(f"{s},{a},{e},{v:g},{m:g}\n" for s, a, e, v, m in rows)
    plot_distribution(rows, root / "score_distribution.png")
    return missing


def feedback_pages(api, root, students, assignments):
    """nbgrader's feedback page for each autograded notebook newer than its page; a line for each that
    nbgrader could not make (its error is in logs/outputs.log), which would otherwise go unseen."""
    missing = []
    for assignment in assignments:
        for student in students:
            graded = root / "autograded" / student / assignment / f"{assignment}.ipynb"
            html = root / "feedback" / student / assignment / f"{assignment}.html"
            if graded.exists() and (not html.exists() or html.stat().st_mtime < graded.stat().st_mtime):
                result = api.generate_feedback(assignment, student)
                if not result.get("success") or not html.exists():
                    print(result.get("log") or result.get("error") or "", file=sys.stderr)
                    missing.append(f"{student} {assignment}: no feedback page could be made (see logs/outputs.log); "
                                   "the grade stands")
    return missing


def exercise_scores(root, assignments):
    """(student, assignment, test grade_id, score, max) for every graded test cell (an optional stretch
    test's max is its points, although the gradebook counts it as extra credit)."""
    from nbgrader.api import Gradebook
    config = class_config(root)
    rows = []
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        for assignment in assignments:
            points = dict(grading.grade_cells(grading.source_notebook(assignment)))
            for submission in gradebook.find_assignment(assignment).submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        rows.append((submission.student.id, assignment, grade.name,
                                     float(grade.score), points.get(grade.name, float(grade.max_score))))
    return sorted(rows)


def plot_distribution(rows, path):
    """Per assignment, one horizontal bar per test: the share of students with full, partial and no
    marks, in the notebook's order (a wall of red shows the exercise to teach again)."""
    if not rows:  # every notebook failed to grade (its reason is in the report): nothing to draw
        pathlib.Path(path).unlink(missing_ok=True)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    assignments = sorted({a for _, a, *_ in rows})
    columns = min(3, len(assignments))
    grid_rows = -(-len(assignments) // columns)
    fig, axes = plt.subplots(grid_rows, columns, squeeze=False, figsize=(5.2 * columns, 4.2 * grid_rows))
    colours = {"full marks": "#2a9d8f", "partial": "#e9c46a", "zero": "#e76f51"}
    for ax, assignment in zip(axes.flat, assignments):
        tests = [grade_id for grade_id, _ in grading.grade_cells(grading.source_notebook(assignment))]
        scores = {test: [(v, m) for _, a, e, v, m in rows if a == assignment and e == test] for test in tests}
        students = max(len(s) for s in scores.values())
        left = [0.0] * len(tests)
        for label, colour in colours.items():
            share = [sum(_band(v, m) == label for v, m in scores[t]) / max(1, len(scores[t])) for t in tests]
            ax.barh(range(len(tests)), share, left=left, color=colour, label=label)
            left = [a + b for a, b in zip(left, share)]
        ax.set_yticks(range(len(tests)), tests, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of students", fontsize=8)
        ax.set_title(f"{assignment} ({students} student{'s' if students != 1 else ''})", fontsize=9, loc="left")
    for ax in list(axes.flat)[len(assignments):]:
        ax.axis("off")
    axes[0, 0].legend(loc="lower left", bbox_to_anchor=(0, 1.08), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _band(score, max_score):
    return "full marks" if score >= max_score else "partial" if score > 0 else "zero"


def table(ledger, students, assignments):
    """The per-student, per-notebook table, then one line per error or flag."""
    width = max([len(s) for s in students] + [7])
    short = [a[:2] for a in assignments]
    lines = [f"{'student':<{width}}  " + "  ".join(f"{s:>5}" for s in short) + "  total"]
    notes = []
    for student in students:
        cells, total, maximum, stretch = [], 0.0, 0.0, 0.0
        for assignment in assignments:
            entry = ledger.entries.get((student, assignment))
            maximum += grading.max_score(assignment)
            if entry is None:
                cells.append(f"{'-':>5}")
                continue
            total += entry["score"]
            stretch += entry.get("stretch_score", 0.0)
            mark = "!" if entry["errors"] or entry["flags"] else " "
            cells.append(f"{entry['score']:>4g}{mark}")
            notes += [f"{student} {assignment}: ERROR {grading.printable(e)}" for e in entry["errors"]]
            notes += [f"{student} {assignment}: REVIEW {grading.printable(f)}" for f in entry["flags"]]
        lines.append(f"{grading.printable(student):<{width}}  " + "  ".join(cells) + f"  {total:g}/{maximum:g}"
                     + (f" (+{stretch:g} optional)" if stretch else ""))
    lines.append(f"{'out of':<{width}}  " + "  ".join(
        f"{grading.max_score(a):>5g}" for a in assignments))
    if notes:
        lines += ["", "! = see the notes:"] + [f"  {note}" for note in notes]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- main
class CourseBusy(RuntimeError):
    """Another grading run holds the course folder."""


@contextlib.contextmanager
def course_lock(root):
    """One grading run per course folder at a time (two would interleave their gradebook writes)."""
    pathlib.Path(root).mkdir(parents=True, exist_ok=True)
    with open(pathlib.Path(root) / ".grading.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CourseBusy(f"another grading run is using {root}; wait for it or use --course-dir") from None
        yield


def grade_class(submissions=DEMO_CLASS_DIR, root=CLASS_DIR, jobs=1, cell_timeout=None,
                restart=False, quiet=False, sandbox_mode="required", scheduler=None):
    """Grade every hand-in under `submissions` (folder or LMS zip); return a summary dict.

    `jobs` > 1: a Dask LocalCluster of that many worker processes; `scheduler`: an existing Dask
    cluster (its address). Every kernel runs in the OS sandbox: where the machine cannot,
    SandboxUnavailableError says why, before anything is graded, unless `sandbox_mode` is "off"
    (--unsandboxed). Raises cluster.CourseMismatch (a worker with another course) and
    cluster.SchedulerLost; what was merged before stays, and the same call goes on from there."""
    if sandbox_mode == "required" and not scheduler and not sandbox.available()[0]:
        raise sandbox.SandboxUnavailableError(
            f"class grading runs every notebook in the OS sandbox, and this machine cannot: "
            f"{sandbox.available()[1]}. To grade without it (the notebooks then run with your access to "
            f"files and network), pass --unsandboxed.")
    root = pathlib.Path(root)
    if restart:
        shutil.rmtree(root, ignore_errors=True)
    with course_lock(root):
        return _grade_class(pathlib.Path(submissions), root, jobs, cell_timeout, quiet, sandbox_mode, scheduler)


def _grade_class(submissions, root, jobs, cell_timeout, quiet, sandbox_mode="required", scheduler=None):
    started = time.perf_counter()
    assignments = assignment_ids()
    prepare_gradebook(root, assignments)
    run_key = class_run_key(root, quiet)
    ledger = Ledger(root / LEDGER)
    ledger.migrate(root)
    if submissions.suffix == ".zip":
        submissions = collect_zip(submissions, root)
    items, strays = intake(submissions, root, assignments, ledger.done())
    from autograder.hub.exchange import set_aside_notes
    strays += set_aside_notes(find_submitted_folder(submissions))   # what the hub's collect did not take
    students = sorted({i.student for i in items})
    pending = [i for i in items if ledger.done().get((i.student, i.assignment)) != i.digest]
    skipped = len(items) - len(pending)

    timeout = cell_timeout or CELL_TIMEOUT_SECONDS
    engine = engine_for(jobs, scheduler, quiet)
    grade_start = time.perf_counter()
    if pending:
        with engine:
            engine_seconds = time.perf_counter() - grade_start
            merge_seconds = grade_pending(root, pending, ledger, timeout, engine, run_key, sandbox_mode, quiet)
    else:
        engine_seconds = merge_seconds = 0.0
    grading_seconds = time.perf_counter() - grade_start

    graded = sorted({i.assignment for i in items})
    missing_feedback = write_outputs(root, students, graded)
    from autograder.hub.service import agreement_notes
    strays += agreement_notes(root, find_submitted_folder(submissions), graded)   # the hub's feedback service
    report = table(ledger, students, graded) + "".join(f"\n  {line}" for line in strays + missing_feedback)
    (root / "report.txt").write_text(report + "\n")
    notebooks = len(pending)
    workers = getattr(engine, "workers", 1)
    summary = {"students": len(students), "already_graded": skipped, "notebooks_graded": notebooks,
               "grading_seconds": round(grading_seconds, 1),
               "engine_start_seconds": round(engine_seconds, 1), "merge_seconds": round(merge_seconds, 2),
               "seconds_per_notebook": round(grading_seconds / notebooks, 2) if notebooks else None,
               "notebooks_per_minute": round(60 * notebooks / grading_seconds, 2) if notebooks else None,
               "total_seconds": round(time.perf_counter() - started, 1), "jobs": jobs,
               "scheduler": scheduler, "workers": workers, "engine": type(engine).__name__,
               "report": report, "root": str(root)}
    if not quiet:
        print(report)
        print(f"\n{len(students)} students; {notebooks} notebooks graded ({skipped} already graded, "
              f"skipped) in {grading_seconds:.1f} s {engine.description or ''}"
              + (f", {summary['notebooks_per_minute']} notebooks per minute" if notebooks else ""))
        for name in ("grades.csv", "exercises.csv", "score_distribution.png", "feedback", "report.txt"):
            print(f"  {root / name}")
    return summary


def _progress_bar(total, quiet):
    """Notebooks graded, with tqdm's rate and time left."""
    from tqdm import tqdm
    bar = tqdm(total=total, unit="notebook", desc="grading", disable=quiet or total == 0,
               file=sys.stderr, smoothing=0.1)

    def step(name):
        bar.set_postfix_str(name)
        bar.update()

    step.close = bar.close
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder grade")
    parser.add_argument("submissions", nargs="?", default=str(DEMO_CLASS_DIR),
                        help="a folder of submitted/<student>/<assignment>/ or an LMS zip "
                             "(default: the demo class)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks graded at once on this machine: N > 1 starts a Dask LocalCluster "
                             "of N worker processes (default 1: serially, in this process)")
    parser.add_argument("--scheduler", default=os.environ.get(cluster.SCHEDULER_ENV) or None,
                        metavar="ADDRESS",
                        help="grade on an existing Dask cluster, e.g. tcp://host:8786 "
                             f"(default: ${cluster.SCHEDULER_ENV} when set)")
    parser.add_argument("--timeout", type=int, help="seconds allowed per cell")
    parser.add_argument("--course-dir", help=f"the nbgrader course folder (default {CLASS_DIR}, where you may "
                                             "write it; make grade GRADE_DIR=...)")
    parser.add_argument("--restart", action="store_true", help="forget earlier grading and start over")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="grade where the machine cannot run the OS sandbox (README: what then still holds)")
    args = parser.parse_args(argv)
    if not pathlib.Path(args.submissions).exists():
        parser.error(f"no such folder or zip: {args.submissions}")
    if args.course_dir is None and not writable(CLASS_DIR):
        print(f"the class folder defaults to {CLASS_DIR}, inside the course's checkout, which {getpass.getuser()} "
              "may not write: give the class a folder of yours, e.g. `make grade GRADE_DIR=~/grading` "
              "(or --course-dir ~/grading)", file=sys.stderr)
        return 2
    args.course_dir = args.course_dir or str(CLASS_DIR)
    try:
        grade_class(args.submissions, args.course_dir, args.jobs, args.timeout, args.restart,
                    sandbox_mode="off" if args.unsandboxed else "required", scheduler=args.scheduler)
    except (CourseBusy, sandbox.SandboxUnavailableError, cluster.CourseMismatch) as error:
        print(error, file=sys.stderr)
        return 2
    except PermissionError as error:  # a folder of someone else's: say which, never blame the engine
        print(f"stopped: {getpass.getuser()} may not write {error.filename or 'a file'} ({error.strerror}). "
              f"Grading writes only into the class folder ({args.course_dir}) and the grader's cache "
              f"({cache_dir()}); notebooks merged before this are kept.", file=sys.stderr)
        return 2
    except cluster.SchedulerLost as error:
        ledger = Ledger(pathlib.Path(args.course_dir) / LEDGER)
        print(f"\nstopped: {error}. The gradebook holds every notebook in the ledger ({len(ledger.entries)} "
              f"lines, {ledger.path}), each merged whole; run the same command again, with a scheduler or "
              "without, to grade the rest.", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("\ninterrupted: finished notebooks are kept; run the same command again to go on",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
