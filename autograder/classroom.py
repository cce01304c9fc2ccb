"""Grade a whole class with nbgrader: `python -m autograder grade [SUBMISSIONS] [--jobs N]`.

The class is an nbgrader course in autograder/work/class/ (sources: solutions/):
1. intake: submissions come from a folder in nbgrader's `submitted/<student>/<assignment>/` layout
   or from an LMS zip, taken in by `nbgrader zip_collect`. Each notebook is checked before nbgrader
   sees it: an unreadable file or a notebook of another assignment becomes an error line, a
   misnamed notebook is renamed, damaged test cells are restored from the source (and flagged).
2. grading: `nbgrader autograde`, per student. With `--jobs 1` one process runs it on the gradebook;
   with more, each student is graded by a worker process in a gradebook of its own, which the main
   process (the gradebook's only writer) merges. A ledger records each finished student, so an
   interrupted run picks up where it stopped, and a crash only costs the notebook that crashed.
3. outputs: `nbgrader generate_feedback` (HTML per student and notebook), `nbgrader export`
   (grades.csv), exercises.csv, a plot of the score distribution per exercise, and a table.
"""
import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile

import nbformat
from nbgrader.plugins import FileNameCollectorPlugin
from traitlets import Unicode

from autograder import grading
from autograder.config import CELL_TIMEOUT_SECONDS, REPO_ROOT, WORK_DIR, assignment_ids, nbgrader_config

CLASS_DIR = WORK_DIR / "class"
DEMO_CLASS_DIR = REPO_ROOT / "autograder" / "demo_class"
LEDGER = "ledger.jsonl"
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
def class_config(root, cell_timeout=None, db_path=None):
    root = pathlib.Path(root)
    config = nbgrader_config(root=root, release=root / "release", work=root)
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
    """`nbgrader generate_assignment` for each assignment the gradebook doesn't have yet, then a
    copy of the gradebook with assignments only: the template of each worker's gradebook."""
    from nbgrader.api import Gradebook
    config = class_config(root)
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
    template = pathlib.Path(root) / "gradebooks" / "template.db"
    if missing or not template.exists():
        template.parent.mkdir(parents=True, exist_ok=True)
        with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
            students = [s.id for s in gradebook.students]
        shutil.copyfile(pathlib.Path(root) / "gradebook.db", template)
        if students:  # the template holds assignments only
            with Gradebook(f"sqlite:///{template}", config.CourseDirectory.course_id) as gradebook:
                for student in students:
                    gradebook.remove_student(student)


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
                strays.append(f"{student_dir.name}: folder '{assignment_dir.name}' is not an assignment "
                              "of this course: not graded")
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
    try:
        nb = nbformat.read(expected, as_version=4)
        nbformat.validate(nb)
    except Exception as error:
        expected.unlink()
        item.errors.append(f"{expected.name} is unreadable ({type(error).__name__}: "
                           f"{str(error).splitlines()[0][:120]}): scored 0")
        return
    source = grading.source_notebook(item.assignment)
    item.flags += grading.integrity_flags(nb, source)
    grading.sanitize(nb, source)
    nbformat.write(nb, expected)


# ---------------------------------------------------------------------------------------- grading
def autograde_student(config, student, assignments):
    """`nbgrader autograde` of one student's assignments; {assignment: {seconds, error}}."""
    api = nbgrader_api(config)
    root = pathlib.Path(config.CourseDirectory.root)
    results = {}
    log_path = root / "logs" / f"{student}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for assignment in assignments:
        start = time.perf_counter()
        with grading.kernel_stderr_to(log_path) as log, grading.environment(grading.kernel_environment(config)):
            result = api.autograde(assignment, student)
        error = None if result["success"] else grading.autograde_error(result, log.read_text())
        results[assignment] = {"seconds": round(time.perf_counter() - start, 2), "error": error}
    return results


def worker_main(argv):
    """`python -m autograder.classroom worker ROOT STUDENT DB TIMEOUT ASSIGNMENT...`: grade one
    student into the gradebook DB, print the results as JSON."""
    root, student, db_path, timeout, *assignments = argv
    config = class_config(root, cell_timeout=timeout, db_path=db_path)
    results = autograde_student(config, student, assignments)
    print(json.dumps(results))


def merge(worker_db, root, student):
    """Copy one student's submissions from a worker's gradebook into the class gradebook."""
    from nbgrader.api import Gradebook, MissingEntry
    config = class_config(root)
    course = config.CourseDirectory.course_id
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{worker_db}", course) as theirs, \
            Gradebook(config.CourseDirectory.db_url, course) as ours:
        warnings.simplefilter("ignore")  # SQLAlchemy's SAWarning from inside nbgrader's add_submission
        ours.update_or_create_student(student)
        for submission in theirs.find_student(student).submissions:
            assignment = submission.assignment.name
            with contextlib.suppress(MissingEntry):
                ours.remove_submission(assignment, student)
            mine = ours.add_submission(assignment, student, timestamp=submission.timestamp)
            notebooks = {nb.name: nb for nb in mine.notebooks}
            for notebook in submission.notebooks:
                target = notebooks[notebook.name]
                target.flagged = notebook.flagged
                target.late_submission_penalty = notebook.late_submission_penalty
                grades = {g.name: g for g in target.grades}
                for grade in notebook.grades:
                    copy = grades[grade.name]
                    for field in ("auto_score", "manual_score", "extra_credit", "needs_manual_grade"):
                        setattr(copy, field, getattr(grade, field))
                comments = {c.name: c for c in target.comments}
                for comment in notebook.comments:
                    comments[comment.name].auto_comment = comment.auto_comment
                    comments[comment.name].manual_comment = comment.manual_comment
        ours.db.commit()


class Ledger:
    """One JSON line per graded (student, assignment), appended after its grades are saved."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.entries = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
                    entry = json.loads(line)
                    self.entries[(entry["student"], entry["assignment"])] = entry

    def done(self):
        return {key: entry["digest"] for key, entry in self.entries.items()}

    def add(self, entry):
        self.entries[(entry["student"], entry["assignment"])] = entry
        with open(self.path, "a") as ledger:
            ledger.write(json.dumps(entry) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())


def scores_of(root, student, assignment):
    """(score, max_score, guard findings) of a graded notebook, from the gradebook and autograded/."""
    from nbgrader.api import Gradebook, MissingEntry
    config = class_config(root)
    max_score = grading.max_score(assignment)
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        try:
            score = gradebook.find_submission(assignment, student).score
        except MissingEntry:
            score = 0.0
    autograded = pathlib.Path(root) / "autograded" / student / assignment / f"{assignment}.ipynb"
    findings = []
    if autograded.exists():
        nb = nbformat.read(autograded, as_version=4)
        findings = grading.guard_flags(nb) + grading.runaway_notes(nb)
    return float(score), max_score, findings


def record(ledger, root, item, result):
    score, max_score, findings = scores_of(root, item.student, item.assignment)
    errors = list(item.errors)
    if result.get("error") and not any("scored 0" in e for e in errors):
        errors.append(result["error"] + ": scored 0")
    ledger.add({"student": item.student, "assignment": item.assignment, "digest": item.digest,
                "score": score, "max_score": max_score, "seconds": result.get("seconds", 0.0),
                "errors": errors, "flags": item.flags + findings})


def grade_serially(root, pending, ledger, timeout, progress):
    config = class_config(root, cell_timeout=timeout)
    for student, items in pending.items():
        results = autograde_student(config, student, [i.assignment for i in items])
        for item in items:
            record(ledger, root, item, results[item.assignment])
        progress(student)


def grade_in_parallel(root, pending, ledger, timeout, jobs, progress):
    """Workers grade students into their own gradebooks; this process merges them one at a time."""
    running = {}  # student -> (process, db path, stdout file)
    queue = sorted(pending, key=lambda s: -len(pending[s]))  # longest first keeps the cores busy
    template = pathlib.Path(root) / "gradebooks" / "template.db"
    try:
        while queue or running:
            while queue and len(running) < jobs:
                student = queue.pop(0)
                db_path = pathlib.Path(root) / "gradebooks" / f"{student}.db"
                shutil.copyfile(template, db_path)
                out = tempfile.TemporaryFile(mode="w+")
                command = [sys.executable, "-m", "autograder.classroom", "worker", str(root), student,
                           str(db_path), str(timeout), *[i.assignment for i in pending[student]]]
                process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
                running[student] = (process, db_path, out)
            finished = [s for s, (p, _, _) in running.items() if p.poll() is not None]
            if not finished:
                time.sleep(0.2)
                continue
            for student in finished:
                process, db_path, out = running.pop(student)
                out.seek(0)
                try:
                    results = json.loads(out.read().strip().splitlines()[-1])
                    merge(db_path, root, student)
                except Exception as error:  # the worker itself died: its notebooks score 0
                    reason = (f"grading worker for {student} stopped (exit code {process.returncode}, "
                              f"{type(error).__name__})")
                    results = {i.assignment: {"seconds": 0.0, "error": reason} for i in pending[student]}
                out.close()
                for item in pending[student]:
                    record(ledger, root, item, results[item.assignment])
                db_path.unlink(missing_ok=True)
                progress(student)
    finally:
        for process, _, _ in running.values():  # interrupted: stop the workers and their kernels
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)


# ---------------------------------------------------------------------------------------- outputs
def write_outputs(root, students, assignments):
    """Feedback HTML, grades.csv (nbgrader export), exercises.csv and the distribution plot."""
    config = class_config(root)
    api = nbgrader_api(config)
    root = pathlib.Path(root)
    with contextlib.redirect_stdout(None), grading.kernel_stderr_to(root / "logs" / "outputs.log"):
        for assignment in assignments:
            for student in students:
                graded = root / "autograded" / student / assignment / f"{assignment}.ipynb"
                html = root / "feedback" / student / assignment / f"{assignment}.html"
                if graded.exists() and (not html.exists() or html.stat().st_mtime < graded.stat().st_mtime):
                    api.generate_feedback(assignment, student)
        from nbgrader.apps import ExportApp
        export = ExportApp(config=config)
        export.initialize(["--to", str(root / "grades.csv")])
        export.start()
    rows = exercise_scores(root, assignments)
    with open(root / "exercises.csv", "w") as out:
        out.write("student,assignment,exercise,score,max_score\n")
        out.writelines(f"{s},{a},{e},{v:g},{m:g}\n" for s, a, e, v, m in rows)
    plot_distribution(rows, root / "score_distribution.png")


def exercise_scores(root, assignments):
    """(student, assignment, test grade_id, score, max) for every graded test cell."""
    from nbgrader.api import Gradebook
    config = class_config(root)
    rows = []
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        for assignment in assignments:
            for submission in gradebook.find_assignment(assignment).submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        rows.append((submission.student.id, assignment, grade.name,
                                     float(grade.score), float(grade.max_score)))
    return sorted(rows)


def plot_distribution(rows, path):
    """Per assignment, one horizontal bar per test: the share of students with full, partial and no
    marks, in the notebook's order (a wall of red shows the exercise to teach again)."""
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
        cells, total, maximum = [], 0.0, 0.0
        for assignment in assignments:
            entry = ledger.entries.get((student, assignment))
            maximum += grading.max_score(assignment)
            if entry is None:
                cells.append(f"{'-':>5}")
                continue
            total += entry["score"]
            mark = "!" if entry["errors"] or entry["flags"] else " "
            cells.append(f"{entry['score']:>4g}{mark}")
            notes += [f"{student} {assignment}: ERROR {e}" for e in entry["errors"]]
            notes += [f"{student} {assignment}: REVIEW {f}" for f in entry["flags"]]
        lines.append(f"{student:<{width}}  " + "  ".join(cells) + f"  {total:g}/{maximum:g}")
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
                restart=False, quiet=False):
    """Grade every hand-in under `submissions` (folder or LMS zip); return a summary dict."""
    root = pathlib.Path(root)
    if restart:
        shutil.rmtree(root, ignore_errors=True)
    with course_lock(root):
        return _grade_class(pathlib.Path(submissions), root, jobs, cell_timeout, quiet)


def _grade_class(submissions, root, jobs, cell_timeout, quiet):
    started = time.perf_counter()
    assignments = assignment_ids()
    prepare_gradebook(root, assignments)
    ledger = Ledger(root / LEDGER)
    if submissions.suffix == ".zip":
        submissions = collect_zip(submissions, root)
    items, strays = intake(submissions, root, assignments, ledger.done())
    students = sorted({i.student for i in items})
    pending = {}
    for item in items:
        if ledger.done().get((item.student, item.assignment)) != item.digest:
            pending.setdefault(item.student, []).append(item)
    skipped = len(students) - len(pending)

    progress = _progress_bar(len(pending), quiet)
    grade_start = time.perf_counter()
    timeout = cell_timeout or CELL_TIMEOUT_SECONDS
    if jobs <= 1:
        grade_serially(root, pending, ledger, timeout, progress)
    else:
        grade_in_parallel(root, pending, ledger, timeout, jobs, progress)
    grading_seconds = time.perf_counter() - grade_start
    progress.close()

    graded = sorted({i.assignment for i in items})
    write_outputs(root, students, graded)
    report = table(ledger, students, graded) + "".join(f"\n  {line}" for line in strays)
    (root / "report.txt").write_text(report + "\n")
    notebooks = sum(len(v) for v in pending.values())
    summary = {"students": len(students), "already_graded": skipped, "notebooks_graded": notebooks,
               "grading_seconds": round(grading_seconds, 1),
               "seconds_per_notebook": round(grading_seconds / notebooks, 2) if notebooks else None,
               "total_seconds": round(time.perf_counter() - started, 1), "jobs": jobs,
               "report": report, "root": str(root)}
    if not quiet:
        print(report)
        print(f"\n{len(students)} students ({skipped} already graded, skipped); {notebooks} notebooks "
              f"graded in {grading_seconds:.1f} s with {jobs} job(s)"
              + (f", {summary['seconds_per_notebook']} s per notebook" if notebooks else ""))
        for name in ("grades.csv", "exercises.csv", "score_distribution.png", "feedback", "report.txt"):
            print(f"  {root / name}")
    return summary


def _progress_bar(total, quiet):
    from tqdm import tqdm
    bar = tqdm(total=total, unit="student", desc="grading", disable=quiet or total == 0,
               file=sys.stderr)

    def step(student):
        bar.set_postfix_str(student)
        bar.update()

    step.close = bar.close
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder grade")
    parser.add_argument("submissions", nargs="?", default=str(DEMO_CLASS_DIR),
                        help="a folder of submitted/<student>/<assignment>/ or an LMS zip "
                             "(default: the demo class)")
    parser.add_argument("--jobs", type=int, default=1, help="students graded at once")
    parser.add_argument("--timeout", type=int, help="seconds allowed per cell")
    parser.add_argument("--course-dir", default=str(CLASS_DIR), help="the nbgrader course folder")
    parser.add_argument("--restart", action="store_true", help="forget earlier grading and start over")
    args = parser.parse_args(argv)
    if not pathlib.Path(args.submissions).exists():
        parser.error(f"no such folder or zip: {args.submissions}")
    try:
        grade_class(args.submissions, args.course_dir, args.jobs, args.timeout, args.restart)
    except CourseBusy as error:
        print(error, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished notebooks are kept; run the same command again to go on",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    else:
        sys.exit(main())
