"""The feedback service: each hand-in graded as it arrives, its feedback back where Fetch Feedback finds it.

nbgrader grades when the instructor collects, after the deadline. On the hub, this service (a JupyterHub
managed service: jupyterhub_config.py starts it with the hub, and starts it again when it stops) watches the
exchange's `inbound/<student>/` folders, grades each new hand-in of an assignment whose feedback is on with the
course's own grader (the same task as `make grade`: cluster.grade_task on Dask workers, every kernel in the OS
sandbox, the hidden tests with the class folder's key, the integrity findings), and writes that student's feedback
page into `feedback/<student>/` under the name nbgrader's Fetch Feedback looks for (a hash of the hand-in's secret
and the notebook's name), usually within a minute of Submit.

The instructor decides, per assignment (`python -m autograder.hub feedback-mode`, kept in `<hub>/feedback-service/
modes.json`): off (the default: nbgrader's own model), `visible` (the visible tests only; the hidden ones wait for
the deadline) or `full` (the hidden tests too); how many hand-ins per student and hour are graded (the others get a
page that says when the next one will be); which hand-in `nbgrader collect` takes for the grade, the last or the
best before the due date. The gradebook stays the instructor's: `make grade` grades what collect took, and its
report says whether it gave the same score, test by test, as the service did (`agreement_notes`).

Who runs what: the hub (root) starts `python -m autograder.hub feedback-service`, which makes the service's folder,
enters the instructors' view of the files (view.py: the course's Python reachable where it lies in a folder only
root may enter) and becomes the course's owner, the instructor who owns the exchange's course folder and alone may
write `feedback/<student>/`. It never runs as a student, and as root only for those first steps. Its folder
`<hub>/feedback-service/` (2770, the owner's, the instructors' group) holds:

    modes.json     the instructors' settings per assignment (any instructor writes it with feedback-mode)
    ledger.db      every hand-in the service saw, and what became of it (SQLite; the service alone writes it)
    status.json    the queue as the service sees it, rewritten every poll (`feedback-queue` prints it)
    service.log    one line per hand-in queued, graded, refused
    work/ pages/ cache/   the owner's alone: hand-ins being graded, pages not yet published, the grader's cache

Exactly once: a hand-in is queued in the ledger when the service first sees it, marked as being graded when its
task is sent, and its result, page and a `graded` event are committed in one transaction before the page is
published (a page published twice is the same file). A service killed at any point (SIGKILL too) and started
again sends the hand-ins that were being graded again (their results never arrived), publishes the pages that
were graded but not yet published, and grades nothing that the ledger says was graded.
"""
import contextlib
import dataclasses
import datetime
import hashlib
import html
import json
import logging
import os
import pathlib
import pwd
import re
import shutil
import signal
import sqlite3
import sys
import time
import uuid

SERVICE_DIR = "feedback-service"
SERVICE_NAME = "feedback"            # c.JupyterHub.services' name
MODES = {"off": "feedback off: nbgrader's own model (graded when the instructor collects)",
         "visible": "the visible tests only (the hidden tests run when the instructor grades)",
         "full": "the hidden tests too, as the instructor's grading runs them"}
GRADE_CHOICES = {"last": "the last hand-in before the due date", "best": "the best hand-in before the due date"}
DEFAULT_PER_HOUR = 3
WINDOW_SECONDS = 3600
POLL_SECONDS = 1.0
SETTLE_SECONDS = 1.0        # a hand-in is taken once nothing in it has changed for this long (submit copies it whole)
INCOMPLETE_SECONDS = 120    # a folder still without its stamps or notebook after this long is not a hand-in
MAX_ENTRY_FILES = 500       # a hand-in of the course holds a notebook and two stamps
DEFAULT_ESTIMATE_SECONDS = 30.0   # a grading's time before the service has measured any
ENGINE_RETRY_SECONDS = 60
NICE = 5                    # students' servers come first on a shared machine
JOBS_ENV = "COURSE_FEEDBACK_JOBS"
log = logging.getLogger("autograder.feedback")


# ------------------------------------------------------------------------------------------ settings
@dataclasses.dataclass
class Policy:
    mode: str = "off"
    per_hour: int = DEFAULT_PER_HOUR
    grade: str = "last"

    @property
    def on(self):
        return self.mode != "off"

    def describe(self):
        if not self.on:
            return MODES["off"]
        return (f"{MODES[self.mode]}; {self.per_hour} graded hand-in{'s' if self.per_hour != 1 else ''} per student "
                f"per hour; the grade: {GRADE_CHOICES[self.grade]}")


def service_folder(hub_root):
    return pathlib.Path(hub_root) / SERVICE_DIR


def read_policies(folder):
    """{assignment: Policy} from modes.json (an assignment it does not name is off)."""
    try:
        data = json.loads((pathlib.Path(folder) / "modes.json").read_text())
    except (OSError, ValueError):
        return {}
    policies = {}
    for assignment, entry in data.items() if isinstance(data, dict) else ():
        with contextlib.suppress(TypeError, ValueError):
            policy = Policy(**entry)
            if policy.mode in MODES and policy.grade in GRADE_CHOICES and int(policy.per_hour) >= 1:
                policies[assignment] = dataclasses.replace(policy, per_hour=int(policy.per_hour))
    return policies


def write_policy(folder, assignment, mode, per_hour=None, grade=None):
    """Set `assignment`'s feedback (an instructor's command); returns its Policy. Unset options keep their value."""
    from autograder.config import assignment_ids
    folder = pathlib.Path(folder)
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise SystemExit(f"the feedback service's folder {folder} is missing or not yours to write: the hub starts "
                         "the service (make hub), and only the course's instructors may set its modes")
    if assignment not in assignment_ids():
        raise SystemExit(f"{assignment} is not an assignment of this course ({', '.join(assignment_ids())})")
    if mode not in MODES:
        raise SystemExit(f"mode {mode!r}: one of {', '.join(MODES)}")
    policies = read_policies(folder)
    old = policies.get(assignment, Policy())
    policy = Policy(mode, old.per_hour if per_hour is None else int(per_hour), grade or old.grade)
    if policy.per_hour < 1 or policy.grade not in GRADE_CHOICES:
        raise SystemExit("--per-hour must be at least 1, --grade last or best")
    policies[assignment] = policy
    temporary = folder / f".modes.{uuid.uuid4().hex[:8]}"
    temporary.write_text(json.dumps({a: dataclasses.asdict(p) for a, p in sorted(policies.items())}, indent=2) + "\n")
    temporary.chmod(0o660)   # another instructor may change it later; the service (the owner) reads it as one of them
    os.replace(temporary, folder / "modes.json")
    return policy


# ------------------------------------------------------------------------------------------ the ledger
SCHEMA = """
CREATE TABLE IF NOT EXISTS handins (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    entry TEXT UNIQUE NOT NULL,      -- <student>/<hand-in folder's name>, under the exchange's inbound/
    student TEXT NOT NULL,
    assignment TEXT NOT NULL,
    arrived REAL NOT NULL,           -- when the exchange received its last byte (exchange.arrival), epoch seconds
    seen REAL NOT NULL,
    state TEXT NOT NULL,             -- queued, grading, graded, limited (over the hourly limit), skipped
    mode TEXT, reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    started REAL, finished REAL, seconds REAL,
    score REAL, max_score REAL, stretch_score REAL, stretch_max_score REAL,
    tests TEXT, errors TEXT, flags TEXT,
    secret TEXT,                     -- sha256 of its submission_secret.txt: which collected hand-in it is
    digest TEXT,                     -- of its notebooks (names and bytes)
    pages TEXT,                      -- the feedback pages' names in feedback/<student>/
    published REAL);
CREATE TABLE IF NOT EXISTS events (entry TEXT NOT NULL, event TEXT NOT NULL, at REAL NOT NULL);
"""
COUNTED = ("queued", "grading", "graded")   # what the hourly limit counts


class Ledger:
    def __init__(self, path, readonly=False):
        self.path = pathlib.Path(path)
        if readonly:
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        else:
            self.db = sqlite3.connect(self.path, timeout=30)
            self.db.executescript(SCHEMA)
            self.path.chmod(0o640)   # the instructors read it (collect, make grade); the service alone writes
        self.db.row_factory = sqlite3.Row

    def close(self):
        self.db.close()

    def known(self):
        return {row["entry"] for row in self.db.execute("SELECT entry FROM handins")}

    def rows(self, where="1", args=()):
        return [dict(row) for row in self.db.execute(f"SELECT * FROM handins WHERE {where} ORDER BY arrived, id", args)]

    def add(self, row, event):
        with self.db:
            columns = ", ".join(row)
            self.db.execute(f"INSERT INTO handins ({columns}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
            self.db.execute("INSERT INTO events VALUES (?, ?, ?)", (row["entry"], event, time.time()))

    def update(self, entry, event=None, **fields):
        with self.db:
            sets = ", ".join(f"{name} = ?" for name in fields)
            self.db.execute(f"UPDATE handins SET {sets} WHERE entry = ?", (*fields.values(), entry))
            if event:
                self.db.execute("INSERT INTO events VALUES (?, ?, ?)", (entry, event, time.time()))

    def recover(self):
        """After a stop (even SIGKILL): hand-ins whose grading never returned are queued again. Returns them."""
        lost = [row["entry"] for row in self.rows("state = 'grading'")]
        for entry in lost:
            self.update(entry, "requeued after a restart", state="queued")
        return lost

    def counted_since(self, student, assignment, since, until=None):
        """Arrival times of `student`'s hand-ins of `assignment` that the hourly limit counts, since `since`."""
        until = float("inf") if until is None else until
        return [row["arrived"] for row in self.rows(
            f"student = ? AND assignment = ? AND state IN ({', '.join('?' * len(COUNTED))}) AND arrived > ? "
            "AND arrived <= ?", (student, assignment, *COUNTED, since, min(until, 1e18)))]

    def durations(self, assignment, last=20):
        """Seconds from sending to result of the latest gradings of `assignment`."""
        return [row[0] for row in self.db.execute(
            "SELECT finished - started FROM handins WHERE assignment = ? AND state = 'graded' AND started IS NOT NULL "
            "ORDER BY finished DESC LIMIT ?", (assignment, last))]

    def events(self, entry=None):
        query = "SELECT entry, event, at FROM events" + (" WHERE entry = ?" if entry else "") + " ORDER BY rowid"
        return [tuple(row) for row in self.db.execute(query, (entry,) if entry else ())]


def estimate(durations):
    """A grading's expected time, on the safe side: the 80th percentile of the latest ones."""
    if not durations:
        return DEFAULT_ESTIMATE_SECONDS
    ordered = sorted(durations)
    return ordered[min(len(ordered) - 1, int(0.8 * len(ordered)))]


def predict(now, running, queue, workers, estimates):
    """When each queued hand-in should be graded: `workers` graders, each free when its running grading is
    expected to end (`running`: [(assignment, started)]), take the queue in order. Returns [epoch seconds]."""
    free = sorted(max(now, started + estimates(assignment)) for assignment, started in running)
    free = (free + [now] * workers)[:max(workers, 1)]
    done = []
    for assignment in queue:
        free.sort()
        free[0] = free[0] + estimates(assignment)
        done.append(free[0])
    return done


def digest_secret(secret):
    return hashlib.sha256(secret.encode()).hexdigest()


def notebooks_digest(folder):
    """Names and bytes of the notebooks at the top of a hand-in folder (what collect and the service both copy)."""
    sha = hashlib.sha256()
    for path in sorted(pathlib.Path(folder).glob("*.ipynb")):
        if path.is_file() and not path.is_symlink():
            sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


# ------------------------------------------------------------------------------------------ the engine
class Engine:
    """The course's Dask engine (cluster.Dask: a LocalCluster of `jobs` single-threaded workers, or `scheduler`),
    fed one task per free worker so that hand-ins start in the queue's order."""

    def __init__(self, jobs=2, scheduler=None):
        from autograder import cluster
        self.dask = cluster.Dask(jobs=jobs, scheduler=scheduler, quiet=True)
        self.futures = {}      # key -> (future, entry)
        self.started, self.description = False, None

    def start(self):
        from autograder import cluster
        self.dask.__enter__()
        try:
            self.packages = cluster.pinned_packages()
            self.identity = self.dask.check_workers(self.packages, "required")
        except BaseException:
            self.close()
            raise
        self.started = True
        self.description = self.dask.description
        return self.description

    @property
    def capacity(self):
        if self.started:
            self._capacity = sum(self.dask.client.nthreads().values())
        return getattr(self, "_capacity", 0)

    @property
    def free(self):
        return max(0, self.capacity - len(self.futures))

    def submit(self, task, entry, order):
        from autograder import cluster
        key = f"feedback-{task.student}-{task.assignment}-{uuid.uuid4().hex[:8]}"
        try:
            future = self.dask.client.submit(cluster.grade_task, task.with_files(), key=key, pure=False, retries=0,
                                             priority=-order)
        except Exception as error:
            raise self.dask._lost(error) from None
        self.futures[future.key] = (future, entry)

    def harvest(self, timeout):
        """[(entry, result or None, error or None)] of the tasks that finished, waiting up to `timeout` for one."""
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker

        from autograder import cluster
        deadline = time.monotonic() + timeout
        while not any(f.done() for f, _ in self.futures.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        finished = []
        for key, (future, entry) in list(self.futures.items()):
            if not future.done():
                continue
            del self.futures[key]
            try:
                finished.append((entry, future.result(), None))
            except cluster.CourseMismatch:
                raise
            except KilledWorker as error:
                finished.append((entry, None, f"grading this notebook stopped {error.allowed_failures + 1} workers in "
                                              "a row (each died while running it); given up"))
            except Exception as error:
                if future.status != "error" or self.dask.client.status != "running" or isinstance(
                        error, FutureCancelledError):
                    raise self.dask._lost(error) from None
                finished.append((entry, None, f"grading failed ({type(error).__name__}: {error})"))
            future.release()
        return finished

    def close(self):
        self.futures.clear()
        self.started = False
        self.dask.__exit__(None, None, None)


# ------------------------------------------------------------------------------------------ the service
class Service:
    """The loop: find new hand-ins, queue or refuse them, send the queue's head to free workers, record and
    publish what comes back, tell the instructors how things stand (status.json)."""

    def __init__(self, exchange, course_id, folder, class_folder, jobs=2, scheduler=None, cell_timeout=None,
                 poll_seconds=POLL_SECONDS, engine=None):
        from autograder.config import CELL_TIMEOUT_SECONDS
        from autograder.hub.exchange import course_folders
        _, self.inbound, self.feedback = course_folders(exchange, course_id)
        self.folder = pathlib.Path(folder)
        self.class_folder = pathlib.Path(class_folder)   # its key (gradebooks/run-key) is the one make grade uses
        self.jobs, self.scheduler = jobs, scheduler
        self.cell_timeout = int(cell_timeout or CELL_TIMEOUT_SECONDS)
        self.poll_seconds = poll_seconds
        self.engine = engine
        self.engine_error, self.engine_retry = None, 0.0
        for name in ("work", "pages", "cache"):
            (self.folder / name).mkdir(mode=0o700, exist_ok=True)
        self.ledger = Ledger(self.folder / "ledger.db")
        self.known = self.ledger.known()
        self.waiting = {}        # entries seen but not yet whole: entry -> first seen
        self.policies = {}
        self.stopping = self.starting = False

    # -- finding hand-ins
    def scan(self, now=None):
        """Record every new, whole hand-in: queued when its assignment's feedback is on and the student has
        graded hand-ins left this hour, else limited (a page says when the next is graded) or skipped."""
        from autograder.config import assignment_ids
        from autograder.hub.exchange import _owner
        now = time.time() if now is None else now
        self.policies = read_policies(self.folder)
        known_assignments = set(assignment_ids())
        found, students = [], []
        with contextlib.suppress(OSError):
            students = sorted(self.inbound.iterdir())
        for student_folder in students:
            student = student_folder.name
            if student_folder.is_symlink() or not student_folder.is_dir() or _owner(student_folder) != student:
                continue   # collect sets these aside; nothing in them is anybody's hand-in
            try:
                names = sorted(os.listdir(student_folder))
            except OSError:
                continue
            for name in names:
                entry = f"{student}/{name}"
                if entry in self.known:
                    continue
                try:
                    found += self._look_at(student_folder / name, entry, student, now, known_assignments)
                except Exception as error:   # whatever a student puts in their folder stops nobody's feedback
                    found.append((now, entry, student, "", "skipped", f"could not be read ({type(error).__name__})"))
        # in order of arrival; hand-ins that arrived within the same tick of the file system's clock (a few
        # milliseconds) in the order of the times their names claim
        for arrived, entry, student, assignment, state, reason in sorted(found, key=lambda f: (f[0], _claimed(f[1]), f[1])):
            self._record(now, arrived, entry, student, assignment, state, reason)

    def _look_at(self, path, entry, student, now, known_assignments):
        """[(arrived, entry, student, assignment, state or None, reason)] for a new entry, or [] while it is not whole."""
        from autograder.hub.exchange import _problem, shown
        name = path.name
        parts = name.split("+")
        assignment = parts[1] if len(parts) >= 3 else ""
        problem = _problem(path, student, parts) if _few_files(path) else "it holds too many files"
        if not problem and assignment not in known_assignments:
            problem = f"{shown(assignment)} is not an assignment of this course"
        if problem:
            return [(now, entry, student, assignment, "skipped", problem)]
        arrived = _arrival(path)
        whole = all((path / stamp).is_file() for stamp in ("timestamp.txt", "submission_secret.txt")) and any(
            path.glob("*.ipynb"))
        if not whole or now - arrived < SETTLE_SECONDS:
            first = self.waiting.setdefault(entry, now)
            if not whole and now - first > INCOMPLETE_SECONDS:
                return [(arrived, entry, student, assignment, "skipped",
                         "no timestamp, secret or notebook in it: not a hand-in")]
            return []
        self.waiting.pop(entry, None)
        return [(arrived, entry, student, assignment, None, None)]

    def _record(self, now, arrived, entry, student, assignment, state, reason):
        path = self.inbound / entry
        policy = self.policies.get(assignment, Policy())
        row = {"entry": entry, "student": student, "assignment": assignment, "arrived": arrived, "seen": now,
               "mode": policy.mode}
        if state is None and not policy.on:
            state, reason = "skipped", "feedback is off for this assignment"
        if state is None:
            counted = self.ledger.counted_since(student, assignment, arrived - WINDOW_SECONDS, arrived)
            if len(counted) >= policy.per_hour:
                state = "limited"
                reason = (f"{len(counted)} hand-ins of {assignment} were graded in the hour before it, the limit "
                          f"is {policy.per_hour} per hour")
            else:
                state = "queued"
        if state != "skipped":
            with contextlib.suppress(OSError):
                row["secret"] = digest_secret((path / "submission_secret.txt").read_text())
            with contextlib.suppress(OSError):
                row["digest"] = notebooks_digest(path)
        self.ledger.add({**row, "state": state, "reason": reason}, state)
        self.known.add(entry)
        from autograder.hub.exchange import shown
        log.info(f"{state}: {shown(entry)}" + (f" ({reason})" if reason else ""))
        if state == "limited":
            self._page_for(self.ledger.rows("entry = ?", (entry,))[0], policy, now)

    # -- grading
    def ensure_engine(self):
        if self.engine is not None and self.engine.started:
            return True
        if time.time() < self.engine_retry:
            return False
        try:
            self.engine = self.engine or Engine(self.jobs, self.scheduler)
            log.info(f"starting the graders ({self.jobs} workers)" if not self.scheduler else
                     f"connecting to the Dask scheduler at {self.scheduler}")
            self.engine_error = None
            self.starting = True
            self.write_status()   # the queue as it stands while they start (a minute on a busy machine)
            log.info(f"graders ready: {self.engine.start()}")
            self.starting = False
            return True
        except Exception as error:   # e.g. no sandbox on this machine: say so, keep the queue, try again later
            self.engine, self.engine_error = None, f"{type(error).__name__}: {error}"
            self.starting = False
            self.engine_retry = time.time() + ENGINE_RETRY_SECONDS
            log.error(f"the graders could not start (again in {ENGINE_RETRY_SECONDS} s): {self.engine_error}")
            return False

    def dispatch(self):
        """Send the queue's head to the free workers, in order of arrival (the graders start, once, as soon as some
        assignment's feedback is on, so that the first hand-in does not wait for them)."""
        queue = self.ledger.rows("state = 'queued'")
        if not (queue or any(p.on for p in self.policies.values())) or not self.ensure_engine():
            return
        for row in queue[:self.engine.free]:
            try:
                task = self._task(row)
            except Exception as error:   # e.g. a file its student made unreadable since: their error, nobody else's
                task, failure = None, f"the hand-in could not be read ({type(error).__name__}: {error})"
            self.ledger.update(row["entry"], "sent", state="grading", started=time.time(),
                               attempts=row["attempts"] + 1)
            if task is None:
                self.record(row["entry"], None, failure)
            else:
                self.engine.submit(task, row["entry"], row["id"])

    def _task(self, row):
        """The hand-in as make grade would see it: copied as collect copies it, taken in as intake does
        (classroom.normalise: a misnamed notebook found, damaged test cells restored and flagged)."""
        from autograder import classroom, cluster, grading
        from autograder.config import nbgrader_config
        work = self.folder / "work" / str(row["id"])
        shutil.rmtree(work, ignore_errors=True)
        target = work / row["student"] / row["assignment"]
        ignore = nbgrader_config(root=work, work=work).CourseDirectory.ignore
        shutil.copytree(self.inbound / row["entry"], target, symlinks=True, ignore=_ignore(ignore))
        item = classroom.Item(row["student"], row["assignment"], grading.folder_digest(target))
        classroom.normalise(target, item)
        (work / "item.json").write_text(json.dumps(dataclasses.asdict(item)))
        return cluster.Task(row["student"], row["assignment"], str(target), self.run_key(), self.cell_timeout,
                            "required", self.engine.identity["digest"], self.engine.packages,
                            estimate(self.ledger.durations(row["assignment"])), tests=row["mode"])

    def run_key(self):
        from autograder import classroom
        return classroom.class_run_key(self.class_folder, quiet=True)

    def record(self, entry, result, error, now=None):
        """A grading's outcome into the ledger, with its page (written first, then the transaction that says it
        was graded), then published."""
        now = time.time() if now is None else now
        row = self.ledger.rows("entry = ?", (entry,))[0]
        if row["state"] != "grading":   # a result for something the ledger no longer waits for: never twice
            log.warning(f"ignored a second result for {entry}")
            return
        work = self.folder / "work" / str(row["id"])
        item = {}
        with contextlib.suppress(OSError, ValueError):
            item = json.loads((work / "item.json").read_text())
        outcome = outcome_of(row["assignment"], result, error, item.get("errors", []), item.get("flags", []),
                             row["mode"])
        row.update(outcome, state="graded", finished=now, seconds=(result or {}).get("seconds"))
        policy = self.policies.get(row["assignment"], Policy(mode=row["mode"]))
        page = self._page(row, policy, now, (result or {}).get("feedback", {}))
        (self.folder / "pages" / f"{row['id']}.html").write_text(page)
        self.ledger.update(entry, "graded", state="graded", finished=now, seconds=row["seconds"],
                           **{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in outcome.items()})
        shutil.rmtree(work, ignore_errors=True)
        from autograder.hub.exchange import shown
        log.info(f"graded: {shown(entry)}: {outcome['score']:g}/{outcome['max_score']:g} in "
                 f"{now - row['started']:.1f} s" + (f" ({'; '.join(outcome['errors'])})" if outcome["errors"] else ""))
        self.publish(self.ledger.rows("entry = ?", (entry,))[0])

    # -- pages
    def _page(self, row, policy, now, nbgrader_pages):
        left, next_free = self.allowance(row["student"], row["assignment"], policy, now)
        block = page_block(row, policy, now, left, next_free)
        html_page = next(iter(nbgrader_pages.values()), None) if nbgrader_pages else None
        return with_block(html_page.decode() if html_page else None, block, row["assignment"])

    def _page_for(self, row, policy, now):
        """A limited hand-in's page: not graded, and when the next one will be."""
        page = self._page(row, policy, now, {})
        (self.folder / "pages" / f"{row['id']}.html").write_text(page)
        self.publish(row)

    def allowance(self, student, assignment, policy, now):
        """(graded hand-ins left this hour, when the next one frees up or None)."""
        counted = sorted(self.ledger.counted_since(student, assignment, now - WINDOW_SECONDS))
        left = max(0, policy.per_hour - len(counted))
        return left, (counted[0] + WINDOW_SECONDS if left == 0 and counted else None)

    def publish(self, row):
        """The page into feedback/<student>/, under each name Fetch Feedback looks for (one per notebook the
        hand-in holds). Never over a page already there: the instructor's released feedback wins."""
        from nbgrader.utils import notebook_hash
        page = self.folder / "pages" / f"{row['id']}.html"
        hand_in = self.inbound / row["entry"]
        own = self.feedback / row["student"]
        names = []
        try:
            secret = (hand_in / "submission_secret.txt").read_text()
            stems = sorted(p.stem for p in hand_in.glob("*.ipynb"))
            data = page.read_bytes()
        except OSError as error:
            log.error(f"no page published for {row['entry']}: {error}")
            stems, data = [], b""
        for stem in stems:
            name = f"{notebook_hash(secret=secret, notebook_id=stem)}.html"
            temporary = own / f".{name}.{uuid.uuid4().hex[:8]}"
            try:
                with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640), "wb") as out:
                    out.write(data)
                try:
                    os.link(temporary, own / name)   # fails where a page is already there
                except FileExistsError:
                    log.info(f"{row['entry']}: a page is already in {row['student']}'s feedback folder; left as it is")
                names.append(name)
            except OSError as error:
                log.error(f"no page published for {row['entry']} in {own}: {error}")
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        self.ledger.update(row["entry"], "published", pages=json.dumps(names), published=time.time())
        with contextlib.suppress(OSError):
            page.unlink()

    def publish_pending(self):
        for row in self.ledger.rows("state IN ('graded', 'limited') AND published IS NULL"):
            if (self.folder / "pages" / f"{row['id']}.html").exists():
                self.publish(row)

    # -- what the instructors see
    def status(self, now=None):
        now = time.time() if now is None else now
        queue = self.ledger.rows("state = 'queued'")
        grading = self.ledger.rows("state = 'grading'")
        estimates_cache = {}

        def estimates(assignment):
            if assignment not in estimates_cache:
                estimates_cache[assignment] = estimate(self.ledger.durations(assignment))
            return estimates_cache[assignment]
        engine = self.engine if self.engine is not None and self.engine.started else None
        workers = engine.capacity if engine else self.jobs
        done = predict(now, [(r["assignment"], r["started"]) for r in grading], [r["assignment"] for r in queue],
                       workers, estimates)
        counts = {state: n for state, n in self.ledger.db.execute("SELECT state, COUNT(*) FROM handins GROUP BY state")}
        return {"pid": os.getpid(), "updated": now, "user": pwd.getpwuid(os.getuid()).pw_name,
                "engine": {"ready": engine is not None, "starting": self.starting, "workers": workers,
                           "error": self.engine_error,
                           "description": engine.description if engine else None},
                "policies": {a: dataclasses.asdict(p) for a, p in sorted(self.policies.items())},
                "estimates": {a: round(s, 1) for a, s in estimates_cache.items()},
                "grading": [{"student": r["student"], "assignment": r["assignment"], "entry": r["entry"],
                             "arrived": r["arrived"], "started": r["started"]} for r in grading],
                "queue": [{"place": i + 1, "student": r["student"], "assignment": r["assignment"], "entry": r["entry"],
                           "arrived": r["arrived"], "predicted": round(t, 1)} for i, (r, t) in enumerate(zip(queue, done))],
                "counts": counts}

    def write_status(self):
        temporary = self.folder / f".status.{os.getpid()}"
        temporary.write_text(json.dumps(self.status(), indent=1) + "\n")
        temporary.chmod(0o640)
        os.replace(temporary, self.folder / "status.json")

    # -- the loop
    def run(self):
        lost = self.ledger.recover()
        if lost:
            log.info(f"started again: {len(lost)} hand-ins whose grading was cut off are queued again")
        self.publish_pending()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        try:
            while not self.stopping:
                self.step()
        finally:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
            self.ledger.recover()   # cut off now: queued again, for the next start
            self.write_status()

    def step(self):
        self.scan()
        self.dispatch()
        if self.engine is not None and self.engine.started:
            from autograder import cluster
            try:
                finished = self.engine.harvest(self.poll_seconds)
            except cluster.CourseMismatch as error:
                # the course changed under the graders (a fix deployed, a worker restarted on newer files): grade what
                # was being graded again, on graders started afresh with the course as it now is
                log.warning(f"the course changed while grading; the graders start again: {error}")
                self.engine.close()
                self.engine = None
                self.ledger.recover()
                finished = []
            for entry, result, error in finished:
                self.record(entry, result, error)
        else:
            time.sleep(self.poll_seconds)
        self.write_status()

    def _stop(self, signum, frame):
        self.stopping = True


def _few_files(path, limit=MAX_ENTRY_FILES):
    count = 0
    for _ in pathlib.Path(path).rglob("*") if path.is_dir() and not path.is_symlink() else ():
        count += 1
        if count > limit:
            return False
    return True


def _claimed(entry):
    parts = entry.split("/", 1)[-1].split("+")
    return parts[2] if len(parts) >= 3 else ""


def _arrival(path):
    return max(p.lstat().st_ctime for p in [path, *path.rglob("*")])


def _ignore(patterns):
    import fnmatch

    def ignore(directory, names):
        return [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)
                or os.path.getsize(os.path.join(directory, n)) > 100_000 * 1024]   # nbgrader's max_file_size
    return ignore


# ------------------------------------------------------------------------------------------ outcomes
def outcome_of(assignment, result, error, intake_errors=(), intake_flags=(), mode="full"):
    """Scores per test (nbgrader's Grade.score: the auto score plus extra credit, the stretch tests' points
    being extra credit), the teaching messages, errors and findings of one grading, as plain data."""
    import nbformat

    from autograder import grading
    points = grading.grade_cells(grading.source_notebook(assignment))
    result = result or {}
    submission = result.get("submission") or {}
    grades = {}
    for notebook in submission.get("notebooks", []):
        for name, grade in notebook.get("grades", {}).items():
            base = grade.get("manual_score") if grade.get("manual_score") is not None else grade.get("auto_score")
            grades[name] = (base or 0.0) + (grade.get("extra_credit") or 0.0)
    messages = {}
    for name, data in result.get("autograded", {}).items():
        with contextlib.suppress(Exception):
            for cell in nbformat.reads(data.decode(), as_version=4).cells:
                grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if grade_id and grade_id not in messages:
                    messages[grade_id] = grading._failure_message(cell)
    tests = [{"grade_id": grade_id, "score": grades.get(grade_id, 0.0), "max_score": maximum,
              "message": "" if grades.get(grade_id, 0.0) >= maximum else
              (messages.get(grade_id) or ("did not run: see why above" if (result.get("error") or error or not grades)
                                          else "this test did not run"))}
             for grade_id, maximum in points]
    if mode == "visible":   # a test with no visible part proves nothing here: it counts when the instructor grades
        hidden = hidden_only(assignment)
        for test in tests:
            if test["grade_id"] in hidden:
                test.update(hidden_only=True, message="a hidden test only: it runs when your instructor grades")
    errors = list(intake_errors)
    failure = result.get("error") or error
    if failure:
        errors.append(failure)
    required = [t for t in tests if not grading.is_stretch(t["grade_id"]) and not t.get("hidden_only")]
    stretch = [t for t in tests if grading.is_stretch(t["grade_id"]) and not t.get("hidden_only")]
    return {"tests": tests, "errors": errors, "flags": list(intake_flags) + list(result.get("findings", [])),
            "score": sum(t["score"] for t in required), "max_score": sum(t["max_score"] for t in required),
            "stretch_score": sum(t["score"] for t in stretch), "stretch_max_score": sum(t["max_score"] for t in stretch)}


def hidden_only(assignment):
    """The tests of `assignment` that have no visible part."""
    from autograder import grading
    return {cell.metadata.nbgrader["grade_id"] for cell in grading.source_notebook(assignment).cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade") and not grading._visible_part(cell.source).strip()}


def _utc(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def student_notes(flags):
    """What a student is told of the findings: the restored cells and the runaway notes as they are; of a review
    or tampering finding only that there is one (its details are for the instructor)."""
    shown, review = [], False
    for flag in flags:
        if flag.startswith(("tampering", "review")):
            review = True
        else:
            shown.append(flag)
    if review:
        shown.append("this hand-in is flagged for your instructor's review")
    return shown


def page_block(row, policy, now, left, next_free):
    """The service's part of a student's feedback page (every word of the student's own escaped)."""
    from autograder import grading
    e = html.escape
    lines = [f'<div id="course-feedback-service" style="border:2px solid #2a7f62;border-radius:6px;padding:10px 16px;'
             'margin:12px;font-family:sans-serif;background:#f4fbf8">',
             f"<h2>Feedback on your hand-in of {e(row['assignment'])}</h2>",
             f"<p>Handed in {_utc(row['arrived'])}."]
    if row["state"] == "limited":
        lines[-1] += " <b>Not graded</b>: " + e(row["reason"] or "over the hourly limit") + ".</p>"
        lines.append(f"<p>Graded hand-ins left this hour: <b>0 of {policy.per_hour}</b>"
                     + (f"; the next hand-in is graded from <b>{_utc(next_free)}</b>" if next_free else "") + ".</p>")
    else:
        tests = json.loads(row["tests"]) if isinstance(row["tests"], str) else row["tests"]
        errors = json.loads(row["errors"]) if isinstance(row["errors"], str) else row["errors"]
        flags = json.loads(row["flags"]) if isinstance(row["flags"], str) else row["flags"]
        lines[-1] += (f" Graded {_utc(now)} ({now - row['arrived']:.0f} s later), with "
                      f"<b>{e(MODES[row['mode']])}</b>.</p>")
        stretch = (f" (optional stretch: {row['stretch_score']:g} / {row['stretch_max_score']:g})"
                   if row["stretch_max_score"] else "")
        lines.append(f"<p class=\"course-feedback-score\"><b>Score: {row['score']:g} / {row['max_score']:g}</b>{stretch}</p>")
        if errors:
            lines.append("<p><b>Your hand-in could not be graded in full:</b></p><ul>"
                         + "".join(f"<li>{e(grading.printable(m))}</li>" for m in errors) + "</ul>")
        lines.append("<table style=\"border-collapse:collapse\"><tr><th align=left>Test</th><th>Points</th>"
                     "<th align=left>What it says</th></tr>")
        for test in tests:
            mark = "&ndash;" if test.get("hidden_only") else "&#10003;" if test["score"] >= test["max_score"] else "&#10007;"
            lines.append(f"<tr><td style=\"padding:2px 8px\"><code>{e(test['grade_id'])}</code>"
                         + (" (optional)" if grading.is_stretch(test["grade_id"]) else "")
                         + f"</td><td style=\"padding:2px 8px\">{mark} {test['score']:g} / {test['max_score']:g}</td>"
                         f"<td style=\"padding:2px 8px;white-space:pre-wrap\">{e(grading.printable(test['message'], 1500))}"
                         "</td></tr>")
        lines.append("</table>")
        notes = student_notes(flags)
        if notes:
            lines.append("<p>Notes:</p><ul>" + "".join(f"<li>{e(grading.printable(n))}</li>" for n in notes) + "</ul>")
        lines.append(f"<p>Graded hand-ins left this hour: <b>{left} of {policy.per_hour}</b>"
                     + (f" (the next one frees up at {_utc(next_free)})" if next_free else "") + ".</p>")
    lines.append(f"<p><small>This is feedback, not yet your grade: your instructor grades "
                 f"{e(GRADE_CHOICES[policy.grade])} with the course's tests; their feedback replaces this page when "
                 "they release it.</small></p></div>")
    return "\n".join(lines)


BODY = re.compile(r"<body[^>]*>", re.IGNORECASE)


def with_block(nbgrader_page, block, assignment):
    """nbgrader's feedback page (the notebook with its score per cell) with the service's block at its top; a page
    of the block alone where nbgrader made none (an error, a hand-in over the limit)."""
    if nbgrader_page and BODY.search(nbgrader_page):
        found = BODY.search(nbgrader_page)
        return nbgrader_page[:found.end()] + "\n" + block + "\n" + nbgrader_page[found.end():]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(assignment)}: feedback</title>"
            f"</head><body>\n{block}\n</body></html>\n")


# ------------------------------------------------------------------------------------------ for collect and make grade
def ledger_of(exchange_root):
    """The service's ledger of the hub whose exchange is `exchange_root`, read-only, or None."""
    path = service_folder(pathlib.Path(exchange_root).parent) / "ledger.db"
    if not path.is_file() or not os.access(path, os.R_OK):
        return None
    try:
        return Ledger(path, readonly=True)
    except sqlite3.Error:
        return None


def choose_hand_in(exchange_root, assignment, records, duedate):
    """Which of one student's hand-in `records` (exchange.hand_ins's, newest first) collect takes, where the
    assignment's feedback is on: the last before the due date, or the best the service graded before it (ties:
    the later); None (nbgrader's own choice) where feedback is off."""
    policy = read_policies(service_folder(pathlib.Path(exchange_root).parent)).get(assignment, Policy())
    if not policy.on or not records:
        return None
    on_time = [r for r in records if duedate is None or r["timestamp"] <= duedate] or records
    if policy.grade == "last":
        return on_time[0]
    ledger = ledger_of(exchange_root)
    if ledger is None:
        return on_time[0]
    try:
        scored = {row["entry"]: row["score"] for row in ledger.rows("assignment = ? AND state = 'graded'", (assignment,))}
    finally:
        ledger.close()
    graded = [r for r in on_time if r["filename"] in scored]
    if not graded:
        return on_time[0]
    return max(reversed(graded), key=lambda r: scored[r["filename"]])   # reversed: the later wins a tie


def agreement_notes(class_folder, submitted, assignments):
    """Lines for make grade's report: for each collected hand-in the feedback service graded, whether make grade
    gave it the same score, test by test. Empty off the hub, or where the service graded none."""
    try:
        return _agreement(class_folder, submitted, assignments)
    except Exception as error:   # the report must never fail for this
        return [f"feedback service: not compared ({type(error).__name__}: {error})"]


def _agreement(class_folder, submitted, assignments):
    from autograder import classroom, grading
    from autograder.hub.setup import HUB_DIR_ENV, Settings
    hub = os.environ.get(HUB_DIR_ENV)
    if not hub or not (service_folder(hub) / "ledger.db").is_file():
        return []
    ledger = ledger_of(Settings.load(hub).exchange)
    if ledger is None:
        return []
    mine = {}
    for student, assignment, grade_id, score, _ in classroom.exercise_scores(class_folder, assignments):
        mine.setdefault((student, assignment), {})[grade_id] = score
    same, notes = [], []
    try:
        for folder in sorted(pathlib.Path(submitted).glob("*/*/submission_secret.txt")):
            student, assignment = folder.parent.parent.name, folder.parent.name
            if assignment not in assignments:
                continue
            rows = ledger.rows("secret = ? AND student = ? AND state = 'graded'",
                               (digest_secret(folder.read_text()), student))
            if not rows:
                continue
            row = rows[-1]
            who = f"{grading.printable(student)} {assignment}"
            if row["mode"] != "full":
                notes.append(f"{who}: the feedback service ran the visible tests only; not compared")
                continue
            if row["digest"] and row["digest"] != notebooks_digest(folder.parent):
                notes.append(f"{who}: REVIEW the hand-in changed after the feedback service graded it")
                continue
            theirs = {t["grade_id"]: t["score"] for t in json.loads(row["tests"])}
            ours = mine.get((student, assignment), {})
            differ = [g for g in sorted(theirs.keys() | ours.keys()) if abs(theirs.get(g, 0.0) - ours.get(g, 0.0)) > 1e-9]
            if differ:
                notes.append(f"{who}: REVIEW the feedback service gave another score ({row['score']:g}) at "
                             f"{_utc(row['finished'])}: " + ", ".join(
                                 f"{g} {ours.get(g, 0.0):g} here, {theirs.get(g, 0.0):g} there" for g in differ[:6]))
            else:
                same.append(who)
    finally:
        ledger.close()
    if same:
        notes.insert(0, f"feedback service: the same score test by test as the service gave for {len(same)} of the "
                        f"{len(same) + len([n for n in notes if 'REVIEW' in n])} collected hand-ins it graded in full")
    return notes


# ------------------------------------------------------------------------------------------ commands
COMMANDS = ("feedback-service", "feedback-mode", "feedback-queue")


def add_commands(command):
    """The service's commands, on `python -m autograder.hub`'s parser (`command` makes a sub-parser with --dir)."""
    sub = command("feedback-service", "(the hub starts it) grade each hand-in as it arrives, return its feedback")
    sub.add_argument("--jobs", type=int, default=int(os.environ.get(JOBS_ENV) or 2),
                     help=f"grading worker processes (default ${JOBS_ENV} or 2)")
    sub.add_argument("--scheduler", default=os.environ.get("DASK_SCHEDULER_ADDRESS") or None,
                     help="grade on an existing Dask cluster (as make grade SCHEDULER=...)")
    sub.add_argument("--cell-timeout", type=int, help="seconds allowed per cell (default: make grade's)")
    sub.add_argument("--poll", type=float, default=POLL_SECONDS, help="seconds between looks at the exchange")
    sub = command("feedback-mode", "(instructor) per assignment: off, visible or full feedback on each hand-in")
    sub.add_argument("assignment", nargs="?", help="e.g. 04_self_attention (none: list the settings)")
    sub.add_argument("mode", nargs="?", choices=list(MODES), help="; ".join(f"{m}: {d}" for m, d in MODES.items()))
    sub.add_argument("--per-hour", type=int, help=f"graded hand-ins per student and hour (default {DEFAULT_PER_HOUR})")
    sub.add_argument("--grade", choices=list(GRADE_CHOICES),
                     help="which hand-in collect takes for the grade: the last (default) or the best before the due date")
    command("feedback-queue", "(instructor) the feedback service's queue: who waits, in which place, until when")


def run(args):
    settings = _settings(args.dir)
    folder = service_folder(settings.root)
    if args.command == "feedback-service":
        return serve(settings, args.jobs, args.scheduler, args.cell_timeout, args.poll)
    if args.command == "feedback-mode":
        if args.assignment and args.mode:
            policy = write_policy(folder, args.assignment, args.mode, args.per_hour, args.grade)
            print(f"{args.assignment}: {policy.describe()}")
        elif args.assignment or args.per_hour or args.grade:
            raise SystemExit("give the assignment and its mode: feedback-mode 04_self_attention full [--per-hour 3] "
                             "[--grade last]")
        else:
            policies = read_policies(folder)
            from autograder.config import assignment_ids
            for assignment in assignment_ids():
                print(f"{assignment}: {policies.get(assignment, Policy()).describe()}")
        return 0
    print(queue_text(folder))
    return 0


def _settings(folder):
    from autograder.hub.setup import Settings
    return Settings.load(folder)


def queue_text(folder, now=None):
    """The feedback-queue command's report, from status.json."""
    now = time.time() if now is None else now
    try:
        status = json.loads((pathlib.Path(folder) / "status.json").read_text())
    except (OSError, ValueError):
        return f"the feedback service has not reported yet ({folder}/status.json): is the hub running?"
    from autograder.hub.exchange import shown
    age = now - status["updated"]
    engine = status["engine"]
    lines = [f"feedback service: pid {status['pid']} as {status['user']}, last report {age:.0f} s ago"
             + (" (STOPPED? it reports every second)" if age > 30 else "") + "; graders: "
             + ("ready, " + (engine["description"] or "") if engine["ready"] else "starting" if engine.get("starting")
                else f"not started ({engine['error']})" if engine["error"] else
                "not started (no assignment's feedback is on)")]
    for assignment, policy in status["policies"].items():
        lines.append(f"  {assignment}: {Policy(**policy).describe()}")
    counts = status.get("counts", {})
    lines.append(f"hand-ins: {counts.get('graded', 0)} graded, {counts.get('limited', 0)} over the hourly limit, "
                 f"{counts.get('skipped', 0)} skipped (feedback off, not hand-ins); "
                 f"{len(status['grading'])} being graded, {len(status['queue'])} waiting"
                 + (f"; the last should be graded by {_utc(status['queue'][-1]['predicted'])} "
                    f"(in {max(0, status['queue'][-1]['predicted'] - now):.0f} s)" if status["queue"] else ""))
    if status["estimates"]:
        lines.append("a grading takes about " + ", ".join(f"{s:g} s ({a})" for a, s in status["estimates"].items()))
    for item in status["grading"]:
        lines.append(f"  grading  {shown(item['student'])} {item['assignment']}, handed in {_utc(item['arrived'])}, "
                     f"for {now - item['started']:.0f} s")
    for item in status["queue"]:
        lines.append(f"  {item['place']:>7}  {shown(item['student'])} {item['assignment']}, handed in "
                     f"{_utc(item['arrived'])}, expected by {_utc(item['predicted'])}")
    return "\n".join(lines)


def prepare_folder(settings):
    """As root: the service's folder, the course owner's, shared with the instructors' group (2770)."""
    import grp
    owner = pwd.getpwnam(settings.owner)
    group = grp.getgrnam(settings.instructor_group).gr_gid
    folder = service_folder(settings.root)
    folder.mkdir(exist_ok=True)
    os.chown(folder, owner.pw_uid, group)
    folder.chmod(0o2770)
    for name in ("work", "pages", "cache"):
        (folder / name).mkdir(mode=0o700, exist_ok=True)
        os.chown(folder / name, owner.pw_uid, group)
        (folder / name).chmod(0o700)
    for path in folder.iterdir():   # files a root run left behind, if any
        if path.is_file():
            os.chown(path, owner.pw_uid, group)
    return folder


def become_owner(settings):
    """As root: enter the instructors' view of the files (view.py) and become the course's owner, with the
    environment of their server; the grader's cache is the service's own (never the owner's ~/.cache)."""
    from jupyterhub.spawner import set_user_setuid

    from autograder.hub import view
    from autograder.hub.setup import server_environment
    entry = pwd.getpwnam(settings.owner)
    keep = {k: os.environ[k] for k in ("DASK_SCHEDULER_ADDRESS", JOBS_ENV, "JUPYTERHUB_API_TOKEN",
                                         "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME") if k in os.environ}
    env = {**server_environment(settings, settings.owner), **keep, "HOME": entry.pw_dir, "USER": settings.owner,
           "LOGNAME": settings.owner, "AUTOGRADER_CACHE_DIR": str(service_folder(settings.root) / "cache")}
    view.enter(settings.views["instructor"])
    set_user_setuid(settings.owner, chdir=False)()
    os.chdir(entry.pw_dir)
    os.environ.clear()
    os.environ.update(env)


def serve(settings, jobs=2, scheduler=None, cell_timeout=None, poll=POLL_SECONDS):
    """`python -m autograder.hub feedback-service`: started by the hub as root (see the module's docstring), or by
    the course's owner by hand."""
    folder = service_folder(settings.root)
    if os.geteuid() == 0:
        prepare_folder(settings)
        become_owner(settings)
    elif pwd.getpwuid(os.getuid()).pw_name != settings.owner:
        raise SystemExit(f"the feedback service runs as the course's owner, {settings.owner} (it writes their students' "
                         "feedback folders): the hub starts it as root, which becomes them")
    os.umask(0o027)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    handler = logging.FileHandler(folder / "service.log")
    for out in (handler, logging.StreamHandler(sys.stderr)):
        out.setFormatter(logging.Formatter("%(asctime)s feedback %(levelname)s %(message)s"))
        log.addHandler(out)
    log.setLevel(logging.INFO)
    service = Service(settings.exchange, settings.course_id, folder,
                      pathlib.Path(pwd.getpwnam(settings.owner).pw_dir) / "grading", jobs=jobs, scheduler=scheduler,
                      cell_timeout=cell_timeout, poll_seconds=poll)
    log.info(f"watching {service.inbound} as {settings.owner} (pid {os.getpid()})")
    service.run()
    return 0


def hub_service(settings):
    """The service's entry in c.JupyterHub.services: managed by the hub, which starts it again when it stops. It
    starts as root and becomes the course's owner itself (become_owner): JupyterHub's own `user` key would run the
    course's Python as the owner before they could reach it, where it lies under a folder only root may enter."""
    return {"name": SERVICE_NAME, "command": [sys.executable, "-B", "-m", "autograder.hub", "feedback-service",
                                              "--dir", str(settings.root)],
            # JupyterHub passes a service few of its own variables: nothing writes bytecode into the checkout
            "environment": {"PYTHONDONTWRITEBYTECODE": "1"}}
