"""The hub's feedback service (autograder/hub/service.py): each hand-in graded as it arrives, as real users.

A class of new system users (the demo class's students who handed in 04, three more, and an instructor; unique
names, removed afterwards) is set up as `make hub` does (hub.setup.setup: users, exchange, 04 released), and the
service runs as the hub runs it: `python -m autograder.hub feedback-service`, started as root, which becomes the
course's owner. Hand-ins arrive in the exchange as nbgrader's submit leaves them (inbound/<student>/<student>+
<assignment>+<time>+<random>/, the student's, the instructors' group), made all at once where a burst is the point,
with `nbgrader submit` as the student where the submit itself is.

- a burst: 20 hand-ins of 04 at once (each demo student's, and a first, untouched one of 4 of them) are queued
  and graded in the order they arrived, the instructor sees the queue and each place in it; the service is SIGKILLed
  in the middle and started again, and every hand-in is graded exactly once (the ledger's events), the last within
  the time the queue predicted; every page sits where Fetch Feedback finds it, in its student's folder only;
- `make grade` after the deadline (collect, then make grade as the instructor) gives the same score, test by
  test, as the service gave, and its report says so;
- attacks: hand-ins that flood output, hang their kernel (SIGINT ignored), crash it, fork and exhaust memory, all
  in the queue ahead of an honest one: each costs no more than its own time limit, its student gets an error or a
  note and nothing else, and the honest hand-in's feedback comes no later than those limits allow (the control:
  the same honest hand-in alone);
- the rate limit holds against a student who runs `nbgrader submit` in a loop (control: a higher limit grades
  the next one); `--grade best` makes collect take the best graded hand-in (control: `last` takes the last).
"""
import contextlib
import datetime
import json
import os
import pathlib
import pwd
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from autograder.classroom import DEMO_CLASS_DIR
from autograder.config import COURSE_ID, REPO_ROOT
from autograder.hub import service as feedback
from autograder.hub import setup as hub_setup
from autograder.submissions import released_path, student_notebook
from autograder.tests.variants import self_attention as variants

pytestmark = pytest.mark.xdist_group("feedback_service")
ASSIGNMENT = "04_self_attention"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "feedback-service"
CELL_TIMEOUT_S = 20   # the service's cell limit in these tests (make grade's is 60 s): the attacks' time limit
MUTANT = next(v for v in variants.MUTANTS if v.name == "sdpa_no_sqrt_scaling")


def load_factor():
    """Budgets below are for two idle cores; other work on the machine slows every grading alike."""
    return max(1.0, os.getloadavg()[0] / os.cpu_count())


def demo_hand_ins():
    """{demo student: their 04 hand-in folder} (16 students)."""
    return {p.parent.name: p for p in sorted((DEMO_CLASS_DIR / "submitted").glob(f"*/{ASSIGNMENT}"))}


class Class:
    """Users, the exchange, and the feedback service as the hub starts it (a process of its own)."""

    def __init__(self):
        suffix = secrets.token_hex(3)
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="course-feedback-", dir="/var/tmp"))
        self.folder.chmod(0o755)
        self.demo = {name: f"{name}-{suffix}" for name in demo_hand_ins()}
        self.mal, self.lou, self.hon, self.prof = (f"mal-{suffix}", f"lou-{suffix}", f"hon-{suffix}",
                                                   f"prof-{suffix}")
        self.roster = self.folder / "roster.csv"
        self.roster.write_text("username,role\n" + "".join(f"{u},student\n" for u in self.demo.values())
                               + f"{self.mal},student\n{self.lou},student\n{self.hon},student\n{self.prof},instructor\n")
        self.settings = hub_setup.setup(self.roster, self.folder / "hub", assignments=[ASSIGNMENT],
                                        home_base=self.folder / "home", group_prefix=f"fbtest-{suffix}")
        self.staging = self.folder / "hub" / "staging"   # same filesystem as the exchange: hand-ins move in at once
        self.staging.mkdir(mode=0o700)
        self.process = None
        self.log = ARTIFACTS / "service.log"

    # -- the service
    def start(self, *options):
        self.stop()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autograder.hub", "feedback-service", "--dir", str(self.settings.root),
                 "--jobs", "2", "--cell-timeout", str(CELL_TIMEOUT_S), *options],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if json.loads((self.service / "status.json").read_text())["pid"] == self.process.pid:
                    return
            assert self.process.poll() is None, f"the service exited:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.2)
        pytest.fail(f"the service did not report within 60 s:\n{self.log.read_text()[-3000:]}")

    def wait_ready(self, timeout):
        """Until the service's graders are up (they start once some assignment's feedback is on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status["engine"]["ready"]:
                return status
            assert self.process.poll() is None, f"the service exited:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.5)
        pytest.fail(f"the service's graders were not ready in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig=signal.SIGTERM):
        """Stop the service by its process id (its Dask workers end with it)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, sig)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    @property
    def service(self):
        return feedback.service_folder(self.settings.root)

    def status(self):
        return json.loads((self.service / "status.json").read_text())

    def ledger(self):
        return feedback.Ledger(self.service / "ledger.db", readonly=True)

    def rows(self, entries):
        ledger = self.ledger()
        try:
            return {row["entry"]: row for row in ledger.rows() if row["entry"] in entries}
        finally:
            ledger.close()

    def wait_done(self, entries, timeout, stop_at=None):
        """Until every one of `entries` is graded (or limited) and its page published; returns their rows.
        `stop_at`: return as soon as that many are graded."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(sqlite3.OperationalError):
                rows = self.rows(entries)
                done = [r for r in rows.values() if r["state"] in ("graded", "limited") and r["published"]]
                if stop_at is not None and len(done) >= stop_at or len(done) == len(entries):
                    return rows
            if time.monotonic() > deadline:
                states = {e: (rows.get(e) or {}).get("state") for e in entries}
                pytest.fail(f"not all graded in {timeout:.0f} s: {states}\n{self.log.read_text()[-3000:]}")
            assert self.process is None or self.process.poll() is None, (
                f"the service exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    # -- users
    def run(self, user, argv, check=True):
        result = hub_setup.as_user(self.settings, user, argv, capture_output=True, text=True)
        output = result.stdout + result.stderr
        if check:
            assert result.returncode == 0, f"{user}: {' '.join(map(str, argv))} failed:\n{output[-3000:]}"
        return result.returncode, output

    def home(self, user):
        return self.folder / "home" / user

    @property
    def inbound(self):
        return self.settings.exchange / COURSE_ID / "inbound"

    def feedback_folder(self, user):
        return self.settings.exchange / COURSE_ID / "feedback" / user

    def stage(self, user, notebooks):
        """A hand-in of `user` as nbgrader's submit makes it (`notebooks`: {file name: notebook or folder to copy}),
        staged; `arrive` moves it into the exchange. Returns (staged folder, entry)."""
        import grp
        now = datetime.datetime.now(datetime.timezone.utc)
        name = f"{user}+{ASSIGNMENT}+{now:%Y-%m-%d %H:%M:%S.%f} UTC+{secrets.token_urlsafe(9)}"
        folder = self.staging / name
        folder.mkdir()
        for file_name, notebook in notebooks.items():
            if isinstance(notebook, pathlib.Path):
                shutil.copyfile(notebook, folder / file_name)
            else:
                nbformat.write(notebook, folder / file_name)
        (folder / "timestamp.txt").write_text(f"{now:%Y-%m-%d %H:%M:%S.%f} UTC")
        (folder / "submission_secret.txt").write_text(secrets.token_hex(64))
        uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(self.settings.instructor_group).gr_gid
        for path in [folder, *folder.iterdir()]:
            os.chown(path, uid, gid)
            path.chmod(0o2750 if path.is_dir() else 0o640)
        return folder, f"{user}/{name}"

    def arrive(self, staged):
        """Move staged hand-ins into the exchange, one after the other within milliseconds (a few apart: the file
        system's clock, which dates their arrival, ticks every few milliseconds)."""
        for folder, entry in staged:
            os.rename(folder, self.inbound / entry)
            time.sleep(0.005)
        return [entry for _, entry in staged]

    def page(self, entry):
        """The page Fetch Feedback would find for this hand-in's notebook(s), or None."""
        from nbgrader.utils import notebook_hash
        hand_in = self.inbound / entry
        secret = (hand_in / "submission_secret.txt").read_text()
        pages = [self.feedback_folder(entry.split("/")[0]) / f"{notebook_hash(secret=secret, notebook_id=p.stem)}.html"
                 for p in sorted(hand_in.glob("*.ipynb"))]
        return pages[0].read_text() if pages and pages[0].exists() else None

    def remove(self):
        self.stop(signal.SIGKILL)
        hub_setup.remove(self.settings.root)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def course():
    if os.geteuid() != 0:
        pytest.skip("the feedback service's tests create system users: they run as root (CI and this project's "
                    "machines do)")
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    made = Class()
    try:
        made.start()
        yield made
    finally:
        made.remove()


def record(name, figures):
    path = ARTIFACTS / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{name}: {json.dumps(figures)}", file=sys.stderr)


def scores(row):
    return {t["grade_id"]: t["score"] for t in json.loads(row["tests"])}


# ------------------------------------------------------------------------------------------ the setting
def test_the_instructor_sets_feedback_per_assignment_and_a_student_cannot(course):
    code, out = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode"])
    assert f"{ASSIGNMENT}: feedback off" in out, out
    code, out = course.run(course.mal, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full"],
                           check=False)
    assert code != 0 and "not yours to write" in out, f"a student set the feedback mode:\n{out}"
    code, out = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", "99_nothing", "full"],
                           check=False)
    assert code != 0 and "not an assignment" in out, out
    code, out = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                                         "--per-hour", "3", "--grade", "last"])
    assert "the hidden tests too" in out and "3 graded hand-ins per student per hour" in out, out
    modes = course.service / "modes.json"
    assert oct(modes.stat().st_mode & 0o777) == "0o660", "the instructors' group shares the setting"
    assert json.loads(modes.read_text())[ASSIGNMENT] == {"mode": "full", "per_hour": 3, "grade": "last"}
    # nothing of the service's is a student's to read: its folder is the owner's and the instructors'
    code, out = course.run(course.mal, ["/bin/bash", "-c", f"ls '{course.service}' || cat '{course.service}/ledger.db'"],
                           check=False)
    assert code != 0 and "Permission denied" in out, out
    status = course.status()
    assert status["user"] == course.prof, f"the service runs as the course's owner, not {status['user']}"


# ------------------------------------------------------------------------------------------ a burst
def test_a_burst_is_graded_in_order_once_each_through_a_sigkill_and_as_make_grade_grades_it(course):
    """20 hand-ins of 04 at once: each demo student's 04 (a full class: perfect, partial, empty, broken, misnamed,
    runaway, crashing, memory-hungry, flooding, tampering), after a first, untouched one of 4 of them (a student's
    two hand-ins in one burst: graded in order, the last one counts)."""
    # FEEDBACK_BURST="students,firsts" makes a smaller burst, for a quicker run while working on the service
    students, firsts = map(int, os.environ.get("FEEDBACK_BURST", "16,4").split(","))
    demo = dict(list(demo_hand_ins().items())[:students])
    firsts = list(demo)[:firsts]
    course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                             "--per-hour", "3", "--grade", "last"])
    course.wait_ready(180 * load_factor())
    untouched = released_path(ASSIGNMENT)
    staged = [course.stage(course.demo[name], {f"{ASSIGNMENT}.ipynb": untouched}) for name in firsts]
    time.sleep(0.01)
    staged += [course.stage(course.demo[name], {p.name: p for p in folder.glob("*.ipynb")})
               for name, folder in demo.items()]
    burst = course.arrive(staged)
    arrived = time.time()
    assert len(burst) == len(firsts) + len(demo)

    # the instructor sees the queue: its length, each student's place and when they should have their feedback
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(course.status()["queue"]) + len(course.status()["grading"]) < len(burst):
        time.sleep(0.3)
    code, shown = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-queue"])
    (ARTIFACTS / "queue-during-the-burst.txt").write_text(shown)
    waiting = re.findall(r"^\s+(\d+)\s+'([^']+)' " + ASSIGNMENT + r", handed in .*, expected by (.*)$", shown, re.M)
    assert len(waiting) >= len(burst) - 2 - 2 and [int(p) for p, _, _ in waiting] == list(range(1, len(waiting) + 1)), (
        f"the queue should list every waiting hand-in with its place:\n{shown}")
    assert f"{len(waiting)} waiting" in shown and "being graded" in shown, shown

    # SIGKILL in the middle; the graders go with it
    course.wait_done(burst, 900 * load_factor(), stop_at=len(burst) // 3)
    course.stop(signal.SIGKILL)
    killed_at = time.time()
    before = course.rows(burst)
    in_flight = [e for e, r in before.items() if r["state"] == "grading"]
    graded_before = [e for e, r in before.items() if r["state"] == "graded"]
    prof_uid = pwd.getpwnam(course.prof).pw_uid
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and hub_setup_processes(prof_uid):
        time.sleep(0.5)
    assert not hub_setup_processes(prof_uid), "the killed service's graders outlived it"

    # started again: the cut-off gradings are sent again, the rest in order, the last when the queue said
    course.start()
    status = course.wait_ready(180 * load_factor())
    while not status["queue"] and not all(r["state"] == "graded" for r in course.rows(burst).values()):
        time.sleep(0.2)
        status = course.status()
    predicted = status["queue"][-1]["predicted"] if status["queue"] else time.time()
    rows = course.wait_done(burst, 900 * load_factor())
    last = max(r["finished"] for r in rows.values())
    ledger = course.ledger()
    try:
        events = ledger.events()
    finally:
        ledger.close()
    graded_events = {e: sum(1 for entry, event, _ in events if entry == e and event == "graded") for e in burst}
    assert all(n == 1 for n in graded_events.values()), f"graded more or less than once: {graded_events}"
    first_sent = []
    for entry, event, _ in events:
        if event == "sent" and entry in burst and entry not in first_sent:
            first_sent.append(entry)
    in_order = sorted(burst, key=lambda e: (rows[e]["arrived"], rows[e]["id"]))
    assert first_sent == in_order, "hand-ins were not sent to the graders in the order they arrived"
    assert all(rows[e]["attempts"] == 2 for e in in_flight) and in_flight, (
        f"the gradings cut off by the kill should be sent once more: {[(e, rows[e]['attempts']) for e in in_flight]}")
    figures = {"hand_ins": len(burst), "graded_before_the_kill": len(graded_before), "in_flight_at_the_kill": len(in_flight),
               "burst_to_kill_s": round(killed_at - arrived, 1), "restart_to_last_s": round(last - killed_at, 1),
               "predicted_last_after_restart_s": round(predicted - killed_at, 1),
               "seconds_per_grading_median": round(sorted(r["finished"] - r["started"] for r in rows.values())[len(rows) // 2], 1),
               "load_average": os.getloadavg()[0]}
    record("burst", figures)
    assert last <= predicted + 0.25 * (predicted - killed_at) + 10 * load_factor(), (
        f"the last hand-in was graded {last - predicted:.0f} s after the queue predicted: {figures}")

    # every page where Fetch Feedback looks, in its student's folder and nowhere else; the scores as expected
    for entry in burst:
        page = course.page(entry)
        assert page and "Feedback on your hand-in" in page, f"no page for {entry}"
    for user in course.demo.values():
        own = {json.loads(r["pages"])[0] for e, r in rows.items() if e.startswith(f"{user}/") and json.loads(r["pages"])}
        assert {p.name for p in course.feedback_folder(user).glob("*.html")} == own, f"{user}'s folder holds others' pages"
    by_student = {}
    for entry in in_order:
        by_student[entry.split("/")[0]] = rows[entry]
    ada = by_student[course.demo["ada"]]
    assert ada["score"] == ada["max_score"] and not json.loads(ada["errors"]), ada
    if "ivy" in demo:   # her notebook kills its kernel: she is told, and nobody else's grade moves
        ivy = by_student[course.demo["ivy"]]
        assert ivy["score"] == 0 and any("kernel died" in e for e in json.loads(ivy["errors"])), ivy
        assert "could not be graded" in course.page(next(e for e, r in rows.items() if r["id"] == ivy["id"]))

    # make grade after the deadline, as the instructor: the same score test by test, and its report says so
    # (the command `make grade SUBMISSIONS=... GRADE_DIR=... JOBS=2` runs, without make's check of the environment)
    code, out = course.run(course.prof, ["/bin/bash", "-c",
                                         f"cd ~/course && nbgrader collect {ASSIGNMENT} && HF_HUB_OFFLINE=1 python -m "
                                         "autograder grade $HOME/course/submitted --jobs 2 --course-dir $HOME/grading"])
    (ARTIFACTS / "make-grade.log").write_text(out)
    report = (course.home(course.prof) / "grading" / "report.txt").read_text()
    assert (f"feedback service: the same score test by test as the service gave for {len(demo)} of the {len(demo)} "
            "collected hand-ins it graded in full") in report, report
    from autograder import classroom
    theirs = {(r["student"]): scores(r) for r in by_student.values()}
    mine = {}
    for student, _, grade_id, score, _ in classroom.exercise_scores(course.home(course.prof) / "grading", [ASSIGNMENT]):
        mine.setdefault(student, {})[grade_id] = score
    differ = {s: (mine.get(s), t) for s, t in theirs.items()
              if {g: mine.get(s, {}).get(g, 0.0) for g in t} != t or set(mine.get(s, {})) - set(t)}
    assert not differ, f"make grade and the service differ (make grade's, the service's): {differ}"
    assert len(theirs) == len(demo)


def hub_setup_processes(uid):
    """Pids of processes whose real uid is `uid`."""
    found = []
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, StopIteration, ValueError):
            line = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
            if int(line.split()[1]) == uid:
                found.append(int(status.parent.name))
    return found


# ------------------------------------------------------------------------------------------ attacks
HANG = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader's interrupt is ignored\ntime.sleep(10**6)"
FORK_BOMB = "import os\nwhile True:\n    os.fork()"


def attack(source):
    """The reference answers, with the student's own cell `source` early in the notebook."""
    nb = student_notebook(ASSIGNMENT)
    nb.cells.insert(2, new_code_cell(source, id="student-attack"))
    return nb


def latency(row):
    """Seconds from the hand-in's arrival in the exchange to its page in the student's feedback folder."""
    return row["published"] - row["arrived"]


def test_a_hand_in_that_hangs_or_forks_delays_nobody_by_more_than_its_own_time_limit(course):
    """Two hand-ins that hang their kernel (SIGINT ignored: the cell cannot be interrupted) take both graders, a
    fork bomb waits behind them, an honest hand-in behind it all. Each attack's grading ends within its own time
    limit, its student gets an error message or a note and nothing else, and the honest feedback is late by no
    more than that limit (control: the same honest hand-in alone, before)."""
    course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                             "--per-hour", "5"])
    course.wait_ready(180 * load_factor())
    honest = student_notebook(ASSIGNMENT)
    control, = course.arrive([course.stage(course.hon, {f"{ASSIGNMENT}.ipynb": honest})])
    alone = course.wait_done([control], 600 * load_factor())[control]
    assert alone["score"] == alone["max_score"], alone
    load = [os.getloadavg()[0]]
    entries = course.arrive([course.stage(course.mal, {f"{ASSIGNMENT}.ipynb": attack(HANG)}),
                             course.stage(course.demo["quy"], {f"{ASSIGNMENT}.ipynb": attack(HANG)}),
                             course.stage(course.mal, {f"{ASSIGNMENT}.ipynb": attack(FORK_BOMB)}),
                             course.stage(course.hon, {f"{ASSIGNMENT}.ipynb": honest})])
    rows = course.wait_done(entries, 900 * load_factor())
    load.append(os.getloadavg()[0])
    hang1, hang2, fork, late = (rows[e] for e in entries)
    own = {name: round(r["finished"] - r["started"], 1) for name, r in (("hang", hang1), ("hang 2", hang2), ("fork", fork))}
    # a hanging cell's limit: the cell's time limit, then the grader's wait for the kernel's last outputs (which a
    # kernel that ignores the interrupt never sends), then the kernel is stopped; on top, what an honest grading takes
    from autograder.config import nbgrader_config
    iopub = nbgrader_config(root=course.folder, work=course.folder / "config").Execute.iopub_timeout
    limit = CELL_TIMEOUT_S + iopub + (alone["finished"] - alone["started"]) * max(1.0, max(load) / os.cpu_count()) + 15
    figures = {"honest_alone_s": round(latency(alone), 1), "honest_behind_the_attacks_s": round(latency(late), 1),
               "attacks_grading_s": own, "attack_limit_s": round(limit, 1), "load_average": load}
    record("attacks", figures)
    assert all(seconds <= limit for seconds in own.values()), f"an attack held a grader past its limit: {figures}"
    assert latency(late) <= latency(alone) + max(own["hang"], own["hang 2"]) + 10 * load_factor(), (
        f"the honest hand-in waited longer than the attacks' own limits allow: {figures}")
    assert late["score"] == late["max_score"] and scores(late) == scores(alone), "the honest hand-in's grade changed"
    for row in (hang1, hang2):
        page = course.page(next(e for e, r in rows.items() if r["id"] == row["id"]))
        assert "could not be graded" in page and "Score: 0 / 14" in page, page[:3000]
    fork_page = course.page(entries[2])
    (ARTIFACTS / "fork-bomb-page.html").write_text(fork_page)
    assert json.loads(fork["errors"]) or feedback.student_notes(json.loads(fork["flags"])), (
        f"the fork bomb's page should say what happened: {fork}")
    assert course.hon not in fork_page and course.demo["quy"] not in fork_page, "an attacker's page names someone else"


# ------------------------------------------------------------------------------------------ the rate limit
def test_the_rate_limit_holds_against_a_submit_loop_and_best_picks_the_best(course):
    """lou runs `nbgrader submit` six times in a row (the first hand-in right, the others with a mistake): three are
    graded, three get a page saying when the next one will be; Fetch Feedback brings him his pages. Control: a
    higher limit grades his next hand-in. Then collect, with --grade best, takes his best graded hand-in (control:
    --grade last takes the last)."""
    course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                             "--per-hour", "3", "--grade", "best"])
    course.wait_ready(180 * load_factor())
    known = set(course.rows(set(str(p.relative_to(course.inbound)) for p in course.inbound.glob(f"{course.lou}/*"))))
    course.run(course.lou, ["nbgrader", "fetch_assignment", ASSIGNMENT])
    mine = course.home(course.lou) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    right, wrong = course.home(course.lou) / "right.ipynb", course.home(course.lou) / "wrong.ipynb"
    nbformat.write(student_notebook(ASSIGNMENT), right)
    nbformat.write(student_notebook(ASSIGNMENT, MUTANT.answers), wrong)
    subprocess.run(["chown", f"{course.lou}:", str(right), str(wrong)], check=True)
    loop = (f"cd ~ && for i in 1 2 3 4 5 6; do if [ $i = 1 ]; then cp right.ipynb '{mine}'; else cp wrong.ipynb '{mine}'; "
            f"fi; nbgrader submit {ASSIGNMENT} || exit 1; done")
    course.run(course.lou, ["/bin/bash", "-c", loop])
    entries = sorted((str(p.relative_to(course.inbound)) for p in course.inbound.glob(f"{course.lou}/*")))
    entries = [e for e in entries if e not in known]
    assert len(entries) == 6, entries
    rows = course.wait_done(entries, 900 * load_factor())
    ordered = sorted(entries, key=lambda e: (rows[e]["arrived"], rows[e]["id"]))
    states = [rows[e]["state"] for e in ordered]
    assert states == ["graded"] * 3 + ["limited"] * 3, f"three graded, then the limit: {states}"
    assert rows[ordered[0]]["score"] == rows[ordered[0]]["max_score"] > rows[ordered[1]]["score"], "right, then wrong"
    third, refused = course.page(ordered[2]), course.page(ordered[3])
    assert "Graded hand-ins left this hour: <b>0 of 3</b>" in third, third[:3000]
    assert "Not graded" in refused and "the next hand-in is graded from" in refused, refused[:3000]
    code, out = course.run(course.lou, ["nbgrader", "fetch_feedback", ASSIGNMENT])
    fetched = sorted((course.home(course.lou) / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html"))
    assert len(fetched) == 6 and any(MUTANT.message in p.read_text() for p in fetched), (fetched, out[-2000:])

    # control: a higher limit, and his next hand-in is graded
    course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                             "--per-hour", "4", "--grade", "best"])
    course.run(course.lou, ["nbgrader", "submit", ASSIGNMENT])
    seventh = [str(p.relative_to(course.inbound)) for p in course.inbound.glob(f"{course.lou}/*")
               if str(p.relative_to(course.inbound)) not in entries and str(p.relative_to(course.inbound)) not in known]
    assert course.wait_done(seventh, 600 * load_factor())[seventh[0]]["state"] == "graded"

    # the grade: collect takes the best hand-in the service graded (his first), or, as a control, the last
    collected = course.home(course.prof) / "course" / "submitted" / course.lou / ASSIGNMENT
    for choice, expected in (("best", ordered[0]), ("last", seventh[0])):
        course.run(course.prof, [sys.executable, "-m", "autograder.hub", "feedback-mode", ASSIGNMENT, "full",
                                 "--grade", choice])
        course.run(course.prof, ["/bin/bash", "-c", f"cd ~/course && nbgrader collect {ASSIGNMENT} "
                                                    f"--student={course.lou} --update"])
        secret = feedback.digest_secret((collected / "submission_secret.txt").read_text())
        assert secret == course.rows([expected])[expected]["secret"], f"--grade {choice} collected another hand-in"


# ------------------------------------------------------------------------------------------ the queue alone
class FakeEngine:
    """Grades nothing: each task 'takes' `seconds` and scores every test full, but for a message of the student's
    own making (`message`), which the page must show as text. What it proves is the queue's, not the grader's."""
    started, description, identity, packages = True, "a fake engine", {"digest": "fake"}, []

    def __init__(self, capacity=2, seconds=0.3, message=""):
        self.capacity, self.seconds, self.message, self.running, self.sent = capacity, seconds, message, {}, []

    @property
    def free(self):
        return self.capacity - len(self.running)

    def submit(self, task, entry, order):
        self.running[entry] = time.time()
        self.sent.append(entry)

    def harvest(self, timeout):
        from autograder import grading
        time.sleep(min(timeout, 0.05))
        finished = []
        for entry, started in list(self.running.items()):
            if time.time() - started >= self.seconds:
                del self.running[entry]
                grades = {g: {"auto_score": p, "manual_score": None, "extra_credit": None}
                          for g, p in grading.grade_cells(grading.source_notebook(ASSIGNMENT))}
                finished.append((entry, {"submission": {"notebooks": [{"grades": grades}]}, "autograded": {},
                                         "feedback": {}, "findings": ["review: " + self.message], "error": self.message,
                                         "seconds": self.seconds}, None))
        return finished

    def close(self):
        pass


def test_the_queue_limits_orders_predicts_and_survives_a_kill(tmp_path):
    """The service's queue with a faked engine, in this process: six hand-ins at once from one student with a
    limit of three (three graded in order, three limited, each with its page); a service dropped in the middle
    of a grading (as a SIGKILL leaves it) and made again grades that one once and nothing twice; the queue's
    prediction; nothing a student wrote reaches the page as markup."""
    student = "nobody"   # a real user (the service checks that a hand-in belongs to the folder's student)
    uid = pwd.getpwnam(student).pw_uid
    exchange = tmp_path / "exchange"
    inbound, pages = (exchange / COURSE_ID / "inbound" / student, exchange / COURSE_ID / "feedback" / student)
    for folder in (inbound, pages):
        folder.mkdir(parents=True)
    os.chown(inbound, uid, 0)
    folder = tmp_path / "service"
    folder.mkdir()
    feedback.write_policy(folder, ASSIGNMENT, "full", per_hour=3)
    secrets_of = {}

    def hand_in():
        now = datetime.datetime.now(datetime.timezone.utc)
        name = f"{student}+{ASSIGNMENT}+{now:%Y-%m-%d %H:%M:%S.%f} UTC+{secrets.token_urlsafe(9)}"
        entry = inbound / name
        entry.mkdir()
        shutil.copyfile(released_path(ASSIGNMENT), entry / f"{ASSIGNMENT}.ipynb")
        (entry / "timestamp.txt").write_text(f"{now:%Y-%m-%d %H:%M:%S.%f} UTC")
        secrets_of[name] = secrets.token_hex(16)
        (entry / "submission_secret.txt").write_text(secrets_of[name])
        for path in [entry, *entry.iterdir()]:
            os.chown(path, uid, 0)
        return f"{student}/{name}"

    script = "<script>alert(1)</script>"
    engine = FakeEngine(capacity=1, seconds=0.5, message=script)
    service = feedback.Service(exchange, COURSE_ID, folder, tmp_path / "grading", engine=engine, poll_seconds=0.05)
    entries = [hand_in() for _ in range(6)]
    time.sleep(feedback.SETTLE_SECONDS + 0.1)
    service.scan()
    rows = {r["entry"]: r for r in service.ledger.rows()}
    assert [rows[e]["state"] for e in entries] == ["queued"] * 3 + ["limited"] * 3
    service.dispatch()
    assert engine.sent == entries[:1]
    # dropped mid-grading, as a SIGKILL leaves it; made again with a new engine of two graders
    service.ledger.close()
    engine = FakeEngine(capacity=2, seconds=0.5, message=script)
    service = feedback.Service(exchange, COURSE_ID, folder, tmp_path / "grading", engine=engine, poll_seconds=0.05)
    assert service.ledger.recover() == entries[:1]
    service.dispatch()
    status = service.status()
    assert [q["place"] for q in status["queue"]] == [1] and len(status["grading"]) == 2, status
    predicted = status["queue"][0]["predicted"]
    while service.ledger.rows("state IN ('queued', 'grading')"):
        service.step()
    rows = {r["entry"]: r for r in service.ledger.rows()}
    events = service.ledger.events()
    assert [sum(1 for e, event, _ in events if e == entry and event == "graded") for entry in entries] == [1, 1, 1, 0, 0, 0]
    assert engine.sent == entries[:3] and rows[entries[0]]["attempts"] == 2, (engine.sent, rows[entries[0]])
    # the default estimate (no grading measured yet) is on the safe side of the fake's half second
    assert rows[entries[2]]["finished"] <= predicted
    assert feedback.predict(100.0, [("a", 99.0)], ["a", "a", "a"], 2, lambda _: 2.0) == [102.0, 103.0, 104.0]
    from nbgrader.utils import notebook_hash
    for entry in entries:
        name = entry.split("/")[1]
        page = (pages / f"{notebook_hash(secret=secrets_of[name], notebook_id=ASSIGNMENT)}.html").read_text()
        assert script not in page and (entry in entries[3:] or "&lt;script&gt;" in page and "flagged for your" in page)
        assert ("Score: 14 / 14" in page) == (entry in entries[:3]) and ("Not graded" in page) == (entry in entries[3:])
    assert "Graded hand-ins left this hour: <b>0 of 3</b>" in page
    service.ledger.close()


# ------------------------------------------------------------------------------------------ visible tests only
def test_visible_mode_grades_with_the_visible_tests_alone(tmp_path):
    """The task the service sends in `visible` mode (the course's grader, with a gradebook whose test cells have
    no hidden part): the reference answers score in full, and nothing of the hidden tests runs or reaches the
    page (no test cell calls a hidden check; the page says which tests ran). Control: the same task in `full`
    mode runs the hidden checks."""
    from autograder import cluster, judging
    folder = tmp_path / "hand-in"
    folder.mkdir()
    nbformat.write(student_notebook(ASSIGNMENT), folder / f"{ASSIGNMENT}.ipynb")
    packages = cluster.pinned_packages()
    identity = cluster.course_identity(packages)["digest"]
    calls = {}
    for tests in ("visible", "full"):
        task = cluster.Task("visible-check", ASSIGNMENT, str(folder), "a key", 60, "required", identity, packages,
                            tests=tests)
        result = cluster.grade_task(task.with_files())
        assert result["error"] is None, result["log"][-2000:]
        graded = nbformat.reads(result["autograded"][f"{ASSIGNMENT}.ipynb"].decode(), as_version=4)
        calls[tests] = [judging.hidden_check_ref(c.source) for c in graded.cells
                        if c.get("metadata", {}).get("nbgrader", {}).get("grade") and judging.hidden_check_ref(c.source)]
        outcome = feedback.outcome_of(ASSIGNMENT, result, None, mode=tests)
        assert outcome["score"] == outcome["max_score"] == 14, outcome
        if tests == "visible":
            row = {"assignment": ASSIGNMENT, "arrived": time.time() - 5, "state": "graded", "mode": tests,
                   "reason": None, **outcome}
            page = feedback.with_block(result["feedback"][f"{ASSIGNMENT}.html"].decode(),
                                       feedback.page_block(row, feedback.Policy("visible"), time.time(), 2, None),
                                       ASSIGNMENT)
            assert "the visible tests only" in page and "autograder.checks" not in page, "a hidden test reached the page"
    assert calls["visible"] == [] and len(calls["full"]) >= 10, calls
