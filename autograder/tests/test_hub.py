"""The class on a real JupyterHub, in Chromium: release, fetch, submit, collect, grade, feedback.

`make hub` (as root, like CI) on 127.0.0.1 with a roster of two students and an instructor, all
new system users with unique names, deleted afterwards with their processes and folders, even when
a step fails. Three browsers (one per user) then do what a class does:
- each student logs in, fetches 04 from the Assignments tab, writes the answers into the
  notebook's cells (ada the reference answers, ben one exercise wrong: no 1/sqrt(d_k)), saves and
  submits; the instructor sets the due date between the two hand-ins, so ben's is late;
- the instructor, in a terminal of their server: `nbgrader collect`, `make grade` (Dask,
  sandboxed kernels), `python -m autograder.hub release-feedback`, the Canvas export;
- each student fetches feedback and reads their own score and teaching messages, and nobody
  else's; a student cannot list or read the exchange's submissions and feedback, other homes, the
  instructor's course, the answers (solutions/, the git history) or the hub's state, neither in a
  terminal nor through the server's API; formgrader is the instructor's only.
The instructor is an unprivileged user on a checkout they may not write, with no cache of their own (a
pristine install, as a new instructor has it): their grading writes nothing into the checkout (asserted).
ben also tries things from his terminal: a hand-in in ada's name (inbound is closed; one in his own folder is
set aside and reported, never ada's), `ps` (he sees his own processes only), the hub's user list (the
instructors' admin page is theirs). A third student, cy, logs in and leaves: the idle culler stops her server.
Also: `make lab` starts as root, with its note (JupyterLab refuses root without --allow-root); a memory bomb
in a user's cgroup is killed there and nowhere else (limits.py), with a control.
Screenshots, logs and timings.json go to test-artifacts/hub/.
"""
import contextlib
import csv
import datetime
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import nbformat
import pytest

from autograder.config import REPO_ROOT
from autograder.hub import setup as hub_setup
from autograder.submissions import reference_answers
from autograder.tests.test_browser import CHROMIUM, CHROMIUM_FLAGS, Browser, descendants, free_port
from autograder.tests.variants import self_attention as variants

ARTIFACTS = REPO_ROOT / "test-artifacts" / "hub"
ASSIGNMENT = "04_self_attention"
MUTANT = next(v for v in variants.MUTANTS if v.name == "sdpa_no_sqrt_scaling")  # ben's mistake
# Budgets on this 2-core machine when the test has it to itself. Other work on the machine (the rest
# of the suite beside it under xdist) slows every step alike: the loop's budget grows with the load
# average per core, measured at both ends of the loop (never below the budget itself).
HUB_UP_BUDGET_S = 60
LOOP_BUDGET_S = 180
GRADING_TIMEOUT_S = 600  # a guard against a hang, not the budget (LOOP_BUDGET_S)
UI_TIMEOUT_MS = 60_000
CULL_IDLE_S = 45
SCORE_LINE = re.compile(r"\(Score: ([\d.]+) / ([\d.]+)\)")   # nbgrader's feedback: "(Score: 9.0 / 14.0)"


# ------------------------------------------------------------------------------------- the hub
class Hub:
    """`make hub` for a class of new system users, stopped and removed by its own ids."""

    def __init__(self):
        suffix = secrets.token_hex(3)
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="course-hub-", dir="/var/tmp"))  # not /tmp: servers get a private one
        self.folder.chmod(0o755)
        self.ada, self.ben, self.cy, self.prof = (f"ada-{suffix}", f"ben-{suffix}", f"cy-{suffix}",
                                                  f"prof-{suffix}")
        self.roster = self.folder.parent / f"{self.folder.name}-roster.csv"
        self.roster.write_text("username,role,first_name,last_name,email,section,sis_user_id\n"
                               f"{self.ada},student,Ada,Lovelace,ada@example.org,A,S1\n"
                               f"{self.ben},student,Ben,Okafor,ben@example.org,A,S2\n"
                               f"{self.cy},student,Cy,Young,cy@example.org,A,S3\n"
                               f"{self.prof},instructor,Grace,Hopper,,,\n")
        self.group_prefix = f"hubtest-{suffix}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None
        self.log_path = ARTIFACTS / "make-hub.log"

    def start(self):
        self.log = open(self.log_path, "w")
        # cy's idle server is culled within the loop; activity is reported every 10 s so that nobody active is
        command = ["make", "--no-print-directory", "hub", f"ROSTER={self.roster}", f"HUB_DIR={self.folder}",
                   f"HUB_PORT={self.port}", f"RELEASE={ASSIGNMENT}", f"HUB_ARGS=--home-base {self.folder / 'home'} "
                   f"--group-prefix {self.group_prefix} --cull-idle {CULL_IDLE_S} --activity-interval 10"]
        self.launched = time.perf_counter()
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def wait_until_up(self):
        deadline = time.monotonic() + 2 * HUB_UP_BUDGET_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"make hub exited with {self.process.returncode}:\n{self.log_path.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/hub/login", timeout=2) as reply:
                    if reply.status == 200:
                        return round(time.perf_counter() - self.launched, 2)
            time.sleep(0.25)
        pytest.fail(f"the hub did not answer on {self.url} in {2 * HUB_UP_BUDGET_S} s:\n"
                    f"{self.log_path.read_text()[-4000:]}")

    @property
    def settings(self):
        return hub_setup.Settings.load(self.folder)

    def password(self, user):
        with open(self.folder / "state" / "passwords.csv") as handle:
            return {row["username"]: row["initial_password"] for row in csv.DictReader(handle)}[user]

    def home(self, user):
        return self.folder / "home" / user

    def uid(self, user):
        import pwd
        return pwd.getpwnam(user).pw_uid

    def stop(self):
        """SIGTERM to make's process group lets JupyterHub stop every server and its proxy; whatever is
        left dies by pid; then setup's users, groups and folder go (hub.setup.remove, which also ends any
        process of those users)."""
        if self.process is not None:
            started = descendants(self.process.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)  # its own group (start_new_session)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
            for pid in [self.process.pid, *started]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.log.close()  # make-hub.log: setup's output, then JupyterHub's and the servers' logs
        hub_setup.remove(self.folder)
        self.roster.unlink(missing_ok=True)


@pytest.fixture
def hub():
    if os.geteuid() != 0:
        pytest.skip("the hub test creates system users: it runs as root (CI and this project's machines do)")
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    server = Hub()
    try:
        server.start()
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------------- the browsers
class HubBrowser(Browser):
    """One user's Chromium page on the hub: the lab steps of test_browser, and the hub's own."""

    def __init__(self, page, hub, user):
        super().__init__(page, hub)
        self.hub, self.user = hub, user
        self.base = f"{hub.url}/user/{user}"

    def screenshot(self, name, whole=None):
        self.shots += 1
        path = ARTIFACTS / f"{self.user.split('-')[0]}-{self.shots:02d}-{name}.png"
        self.page.screenshot(path=path)
        return path

    def log_in(self):
        """Send the login form; the hub starts the user's server (wait_for_lab waits for it)."""
        self.page.goto(f"{self.hub.url}/hub/login")
        self.page.fill("#username_input", self.user)
        self.page.fill("#password_input", self.hub.password(self.user))
        self.page.click("#login_submit")

    def wait_for_lab(self):
        self.page.wait_for_url(re.compile(f".*/user/{re.escape(self.user)}/lab.*"), timeout=120_000)
        self.page.locator("#filebrowser").wait_for()

    def menu(self, top, item):
        self.page.locator(".lm-MenuBar-item", has_text=top).click()
        self.page.locator(".lm-Menu-item:visible", has_text=re.compile(f"^{re.escape(item)}")).click()

    def menu_items(self, top):
        self.page.locator(".lm-MenuBar-item", has_text=top).click()
        items = self.page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel").all_inner_texts()
        self.page.keyboard.press("Escape")
        return [i for i in items if i.strip()]

    def assignments(self):
        """The Assignments tab (nbgrader's assignment list), opened afresh so that it lists what is new."""
        tab = self.page.locator(".lm-TabBar-tab", has_text=re.compile("^Assignments$"))
        if tab.count():
            tab.locator(".lm-TabBar-tabCloseIcon").click()
            tab.wait_for(state="detached")
        self.menu("Nbgrader", "Assignment List")
        self.page.locator("#released_assignments_list").wait_for()
        for listing in ("released", "fetched", "submitted"):
            self.page.locator(f"#{listing}_assignments_list_loading").wait_for(state="hidden")

    def click_in_list(self, listing, label, done):
        row = self.page.locator(f"#{listing}_assignments_list .list_item", has_text=ASSIGNMENT)
        row.locator("button", has_text=re.compile(f"^{label}$")).first.click()
        self.page.locator(done[0], has_text=done[1]).first.wait_for(timeout=UI_TIMEOUT_MS)

    def write_answers(self, answers):
        """Type each answer into its cell of the open notebook (select all, insert the text)."""
        nb = nbformat.read(self.notebook_path, as_version=4)
        for index, cell in enumerate(nb.cells):
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id not in answers:
                continue
            editor = self.notebook.locator(".jp-Cell").nth(index).locator(".cm-content")
            self.show(editor)
            editor.click()
            self.page.keyboard.press("Control+a")
            self.page.keyboard.insert_text(answers[grade_id])
        self.page.keyboard.press("Escape")

    @property
    def notebook_path(self):
        return self.hub.home(self.user) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"

    def terminal(self, command, marker, timeout_s):
        """Type `command` into a new terminal of this user's lab; it must write its exit code to
        ~/`marker`. Returns (exit code, the log ~/`marker`.log)."""
        from playwright.sync_api import Error as PlaywrightError
        self.page.locator(".lm-MenuBar-item", has_text="File").click()
        self.page.locator(".lm-Menu-item[data-type='submenu']:visible", has_text="New").click()
        self.page.locator(".lm-Menu-item[data-command='terminal:create-new']:visible").click()
        screen = self.page.locator(".jp-Terminal:visible .xterm-screen").last   # the new one, not an earlier tab's
        screen.wait_for()
        # force: a busy machine can keep xterm's canvas "scrolling into view" past any timeout; the click
        # only gives the terminal the keyboard. Tried again while the new tab settles: xterm can redraw its
        # screen between the locator's match and the click ("Element is not visible").
        deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
        while True:
            try:
                screen.click(force=True, timeout=5_000)
                break
            except PlaywrightError:
                if time.monotonic() > deadline:
                    raise
                self.page.wait_for_timeout(500)
        time.sleep(0.5)  # the shell's prompt
        home = self.hub.home(self.user)
        # as pasted text: typed key by key, a long line takes a second per 40 characters on a busy machine
        self.page.keyboard.insert_text(f"({command}) > ~/{marker}.log 2>&1; echo $? > ~/{marker}.rc")
        self.page.keyboard.press("Enter")
        deadline = time.monotonic() + timeout_s
        while not (home / f"{marker}.rc").exists() and time.monotonic() < deadline:
            self.page.wait_for_timeout(250)
        log = (home / f"{marker}.log").read_text() if (home / f"{marker}.log").exists() else ""
        assert (home / f"{marker}.rc").exists(), f"'{command}' did not finish in {timeout_s} s:\n{log[-3000:]}"
        return int((home / f"{marker}.rc").read_text()), log

    def api_get(self, path):
        return self.page.request.get(f"{self.base}/{path}").status


@pytest.fixture
def browsers(hub):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM} (`make test` installs Debian's chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            pages = {}
            for user in (hub.ada, hub.ben, hub.cy, hub.prof):  # one context each: their own cookies
                context = chromium.new_context(viewport={"width": 1440, "height": 900})
                page = context.new_page()
                page.set_default_timeout(UI_TIMEOUT_MS)
                pages[user] = HubBrowser(page, hub, user)
            yield pages
        finally:
            chromium.close()


def _uid_of(status_path):
    with contextlib.suppress(OSError, StopIteration, ValueError):
        return int(next(l for l in status_path.read_text().splitlines() if l.startswith("Uid:")).split()[1])
    return None


def submission_time(hub, user):
    """The timestamp of `user`'s last submission, from their nbgrader cache (as nbgrader wrote it)."""
    from nbgrader.utils import parse_utc
    cache = hub.home(user) / ".local" / "share" / "jupyter" / "nbgrader_cache" / hub.settings.course_id
    stamps = sorted(cache.glob(f"{user}+{ASSIGNMENT}+*/timestamp.txt"))
    assert stamps, f"{user} has no submission of {ASSIGNMENT} in their nbgrader cache"
    return parse_utc(stamps[-1].read_text())


def latest_submission(hub, user):
    """The timestamp of `user`'s last submission as the Assignments tab shows it (feedback service step)."""
    cache = hub.home(user) / ".local" / "share" / "jupyter" / "nbgrader_cache" / hub.settings.course_id
    stamps = sorted(cache.glob(f"{user}+{ASSIGNMENT}+*/timestamp.txt"))
    assert stamps, f"{user} has no submission of {ASSIGNMENT} in their nbgrader cache"
    return stamps[-1].read_text().strip()


def feedback_html(browser):
    """The feedback HTML the student fetched, as text (nbgrader puts it under the assignment's folder)."""
    found = sorted((browser.hub.home(browser.user) / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html"))
    assert len(found) == 1, f"{browser.user} should have fetched exactly one feedback file, found {found}"
    return found[0]


# ----------------------------------------------------------------------------------------- the loop
def test_class_loop_on_jupyterhub(hub, browsers):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    ada, ben, cy, prof = browsers[hub.ada], browsers[hub.ben], browsers[hub.cy], browsers[hub.prof]
    timings = {}
    reference = reference_answers(ASSIGNMENT)
    answers = {hub.ada: reference, hub.ben: {**reference, **MUTANT.answers}}
    try:
        with prof.step("make hub is up"):
            timings["make_hub_up_s"] = hub.wait_until_up()
        loop_start = time.perf_counter()
        loads = [os.getloadavg()[0]]

        # -- everyone logs in at once (the hub starts three servers side by side)
        for user in (ada, ben, cy, prof):
            with user.step("log in"):
                user.log_in()
        for user in (ada, ben, cy, prof):
            with user.step("lab usable"):
                user.wait_for_lab()
        timings["all_logged_in_s"] = round(time.perf_counter() - loop_start, 2)
        with cy.step("cy leaves (her page closed): nothing of hers is active"):
            cy.page.close()
        with prof.step("make hub released only what it was told"):
            outbound = hub.settings.exchange / hub.settings.course_id / "outbound"
            assert sorted(p.name for p in outbound.iterdir()) == [ASSIGNMENT], sorted(outbound.iterdir())
        # -- the students: fetch, answer, save, submit; the deadline falls between the two hand-ins
        for student in (ada, ben):
            with student.step("formgrader is not a student's"):
                assert student.menu_items("Nbgrader") == ["Assignment List"], (
                    f"a student's Nbgrader menu should offer the assignment list only: {student.menu_items('Nbgrader')}")
                assert student.api_get("formgrader") == 404, "a student's server serves formgrader"
            with student.step("fetch from the Assignments tab", timing="fetch_s"):
                student.assignments()
                student.click_in_list("released", "Fetch", ("#fetched_assignments_list .list_item", ASSIGNMENT))
                student.screenshot("fetched")
            with student.step("answer and save", timing="answer_and_save_s"):
                student.open_notebook(ASSIGNMENT, f"{ASSIGNMENT}.ipynb")
                student.write_answers(answers[student.user])
                saved = student.save(student.notebook_path)
                written = {c.metadata.nbgrader["grade_id"]: c.source for c in saved.cells
                           if c.metadata.get("nbgrader", {}).get("solution")}
                assert written == answers[student.user], (
                    "the notebook saved from the browser differs from the answers typed: "
                    f"{[g for g in written if written[g] != answers[student.user].get(g)]}")
                student.screenshot("answered")
            if student is ben:  # ben hands in after the deadline: wait until it has passed
                while datetime.datetime.utcnow() <= due:
                    time.sleep(0.2)
            with student.step("submit", timing="submit_s"):
                student.assignments()
                student.click_in_list("fetched", "Submit", ("#submitted_assignments_list .list_item", ASSIGNMENT))
                student.screenshot("submitted")
            if student is ada:
                with prof.step("instructor sets the due date after ada's hand-in", timing="duedate_s"):
                    due = submission_time(hub, hub.ada) + datetime.timedelta(seconds=1)
                    code, log = prof.terminal(f"python -m autograder.hub duedate {ASSIGNMENT} {due.isoformat()}",
                                              "duedate", 60)
                    assert code == 0, f"setting the due date failed:\n{log}"
        timings["students_submitted_s"] = round(time.perf_counter() - loop_start, 2)

        # -- ben tries things from his terminal: a hand-in in ada's name, other users' processes, the class list
        with ben.step("ben's attacks from his terminal", timing="attacks_s"):
            inbound = hub.settings.exchange / hub.settings.course_id / "inbound"
            own_hand_in = next((inbound / hub.ben).iterdir())   # as root: the name ben's submit chose
            forged = f"{hub.ada}+{ASSIGNMENT}+2099-01-01 00:00:00.000000 UTC+AAAAAAAAAAAA"
            code, log = ben.terminal(
                f"mkdir '{inbound}/{forged}' && echo TOP-OPEN; mkdir '{inbound / hub.ada}/{forged}' && echo ADA-OPEN; "
                f"cp -r '{own_hand_in}' '{inbound / hub.ben}/{forged}' && echo OWN-FORGED; "
                "ps -eo uid= | sort -u; echo PS-DONE", "attacks", 60)
            assert "TOP-OPEN" not in log and "ADA-OPEN" not in log, f"ben wrote into inbound or ada's folder:\n{log}"
            assert "OWN-FORGED" in log, f"ben could not copy his own hand-in (the attack below is void):\n{log}"
            users = log.split("PS-DONE")[0].split("OWN-FORGED")[-1].split()
            assert users == [str(hub.uid(hub.ben))], f"ben's `ps` shows other users' processes: {users}"
            assert ben.page.request.get(f"{hub.url}/hub/api/users").status == 403, "a student lists the class"

        # -- the instructor: collect, grade with make grade (Dask, sandboxed), release, export
        with prof.step("formgrader is the instructor's"):
            assert "Formgrader" in prof.menu_items("Nbgrader")
            assert prof.api_get("formgrader") == 200, "the instructor's server does not serve formgrader"
        with prof.step("the instructor administers the class from the hub"):
            reply = prof.page.request.get(f"{hub.url}/hub/api/users")
            assert reply.status == 200 and {hub.ada, hub.ben}.issubset({u["name"] for u in reply.json()}), reply.status
            assert prof.page.request.get(f"{hub.url}/hub/admin").status == 200, "the admin page is the instructor's"
        with prof.step("a pristine install: the instructor's cache is empty, the checkout not theirs to write"):
            assert not (hub.home(hub.prof) / ".cache" / "transformers-course").exists(), (
                "the instructor already has a grading cache: this test must start where a new instructor does")
            assert os.stat(REPO_ROOT).st_uid != hub.uid(hub.prof) and not os.stat(REPO_ROOT).st_mode & 0o002
        with prof.step("collect, make grade, release feedback", timing="grade_and_release_s"):
            roster = hub.home(hub.prof) / "course" / "roster.csv"
            # exactly the README's commands: $TRANSFORMERS_COURSE is the checkout the hub runs from
            code, log = prof.terminal(
                f"cd ~/course && nbgrader collect {ASSIGNMENT} && "
                f"make -C \"$TRANSFORMERS_COURSE\" grade SUBMISSIONS=$HOME/course/submitted GRADE_DIR=$HOME/grading "
                "JOBS=2 && "
                f"python -m autograder.hub release-feedback {ASSIGNMENT} && "
                f"python -m autograder.lms_export --roster {roster} --class-dir ~/grading --canvas ~/canvas.csv",
                "loop", GRADING_TIMEOUT_S)
            (ARTIFACTS / "instructor-terminal.log").write_text(log)
            prof.screenshot("graded")
            # make grade refuses to grade outside the OS sandbox (no --unsandboxed here): 0 means sandboxed
            assert code == 0, f"the instructor's commands failed:\n{log[-4000:]}"
            written = [str(p) for p in REPO_ROOT.rglob("*")
                       if not p.is_symlink() and p.lstat().st_uid == hub.uid(hub.prof)]
            assert not written, f"the instructor's commands wrote into the checkout: {written[:10]}"
            assert (hub.home(hub.prof) / ".cache" / "transformers-course").is_dir(), "the grader's cache is the instructor's"
            report = (hub.home(hub.prof) / "grading" / "report.txt").read_text()
            assert f"{hub.ben}: REVIEW set aside at collect" in report and "under the name of" in report, (
                f"the hand-in ben forged in ada's name should be named in the grading report:\n{report}")
        with prof.step("grades: ada full marks, ben partial and late"):
            grading = hub.home(hub.prof) / "grading"
            ledger = {(e["student"], e["assignment"]): e for e in
                      map(json.loads, (grading / "ledger.jsonl").read_text().splitlines())}
            full = ledger[(hub.ada, ASSIGNMENT)]
            partial = ledger[(hub.ben, ASSIGNMENT)]
            assert full["score"] == full["max_score"] and not full["errors"], f"ada: {full}"
            assert 0 < partial["score"] < partial["max_score"], f"ben: {partial}"
            released = dict(re.findall(rf"^({hub.ada}|{hub.ben}): {ASSIGNMENT}\.html \((.*)\)$", log, re.M))
            assert released.get(hub.ada) == "on time" and "late" in released.get(hub.ben, ""), (
                f"ada handed in before the due date, ben after it; release-feedback says:\n{log[-2000:]}")
            with open(hub.home(hub.prof) / "canvas.csv") as handle:
                canvas = list(csv.reader(handle))
            assert canvas[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], canvas[0]
            by_sis = {row[2]: row for row in canvas[2:]}
            column = canvas[0].index(ASSIGNMENT)
            assert by_sis["S1"][column] == f"{full['score']:g}" and by_sis["S2"][column] == f"{partial['score']:g}", canvas

        # -- the students: fetch feedback, read their own, and nothing of anyone else's
        for student, other, entry in ((ada, ben, full), (ben, ada, partial)):
            with student.step("fetch feedback", timing="fetch_feedback_s"):
                student.assignments()
                student.click_in_list("submitted", "Fetch Feedback",
                                      ("#submitted_assignments_list .list_item", "view feedback"))
                path = feedback_html(student)
            with student.step("read own feedback in the lab", timing="read_feedback_s"):
                student.page.locator("#submitted_assignments_list a", has_text="view feedback").first.click()
                student.page.locator("#filebrowser .jp-DirListing-itemText",
                                     has_text=f"{ASSIGNMENT}.html").dblclick()
                frame = student.page.frame_locator(".jp-HTMLViewer iframe")
                # the viewer's iframe has an empty body until the page is in: wait for the score line
                with contextlib.suppress(PlaywrightTimeout):   # none: the assertion below says what it shows
                    frame.locator("body").filter(has_text=SCORE_LINE).wait_for()
                text = frame.locator("body").inner_text()
                student.screenshot("feedback")
                shown = SCORE_LINE.search(text)
                assert shown, f"{student.user}'s feedback shows no score:\n{text[:1500]}"
                score, out_of = map(float, shown.groups())
                # the optional stretch counts as extra credit in the feedback (ada's 14 + 3 of 14)
                expected = (entry["score"] + entry.get("stretch_score", 0), entry["max_score"])
                assert (score, out_of) == expected and score > 0, (
                    f"{student.user}'s feedback shows {score:g}/{out_of:g}; their grade is {entry['score']:g}/"
                    f"{entry['max_score']:g} with {entry.get('stretch_score', 0):g} stretch points as extra credit:"
                    f"\n{text[:1500]}")
                if student is ben:
                    assert MUTANT.message in text, (
                        f"ben's feedback should teach what went wrong ({MUTANT.message!r}):\n{text[:3000]}")
                html = path.read_text()
                assert other.user not in html, f"{student.user}'s feedback mentions {other.user}"

        # -- what a student can reach through the hub: their own files, not anyone else's
        with ben.step("a student cannot read others' work or the answers", timing="access_probes_s"):
            settings = hub.settings
            course = settings.exchange / settings.course_id
            folders = sorted(p.name for p in (course / "inbound").iterdir())
            assert folders == sorted([hub.ada, hub.ben, hub.cy]), f"one hand-in folder per student: {folders}"
            ada_hand_in = next((course / "inbound" / hub.ada).iterdir())
            assert re.fullmatch(rf"{re.escape(hub.ada)}\+{ASSIGNMENT}\+[^+]+\+[A-Za-z0-9_-]{{12}}", ada_hand_in.name), (
                ada_hand_in.name)
            closed = {"list": [course / "inbound", course / "feedback", course / "inbound" / hub.ada,
                               course / "feedback" / hub.ada, hub.home(hub.ada), hub.home(hub.prof),
                               REPO_ROOT / ".git", REPO_ROOT / "solutions", REPO_ROOT / "autograder" / "demo_class",
                               REPO_ROOT / "autograder" / "tests", settings.state],
                      "read": [hub.home(hub.ada) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                               ada_hand_in / "submission_secret.txt", ada_hand_in / f"{ASSIGNMENT}.ipynb",
                               *(course / "feedback" / hub.ada).glob("*.html"),
                               hub.home(hub.prof) / "grading" / "gradebook.db",
                               hub.home(hub.prof) / "course" / "roster.csv",
                               REPO_ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                               settings.state / "passwords.csv"]}
            open_ = {"list": [hub.home(hub.ben), course / "outbound" / ASSIGNMENT, course / "inbound" / hub.ben],
                     "read": [course / "outbound" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", REPO_ROOT / "Makefile"]}
            probes = [f"ls {p} >/dev/null 2>&1 && echo 'OPEN {p}' || echo 'CLOSED {p}'" for p in closed["list"] + open_["list"]]
            probes += [f"cat {p} >/dev/null 2>&1 && echo 'OPEN {p}' || echo 'CLOSED {p}'" for p in closed["read"] + open_["read"]]
            code, log = ben.terminal("; ".join(probes), "access", 30)
            found = dict(reversed(line.split(" ", 1)) for line in log.splitlines() if line.startswith(("OPEN", "CLOSED")))
            leaks = [p for p in map(str, closed["list"] + closed["read"]) if found.get(p) != "CLOSED"]
            assert not leaks, f"a student's terminal reaches {leaks}:\n{log}"
            missing = [p for p in map(str, open_["list"] + open_["read"]) if found.get(p) != "OPEN"]
            assert not missing, f"a student's terminal should reach {missing} (the probe is broken?):\n{log}"
            for path in (f"api/contents/../{hub.ada}", f"files/../{hub.ada}/{ASSIGNMENT}/{ASSIGNMENT}.ipynb"):
                assert ben.api_get(path) in (403, 404), f"{ben.user}'s server serves {path}"
        with prof.step("the culler stopped cy's idle server; everyone active kept theirs", timing="culled_s"):
            deadline = time.monotonic() + 3 * CULL_IDLE_S
            while time.monotonic() < deadline:
                servers = {u["name"]: u.get("servers", {}) for u in prof.page.request.get(
                    f"{hub.url}/hub/api/users").json()}
                if not servers.get(hub.cy):
                    break
                time.sleep(2)
            assert not servers.get(hub.cy), f"cy's server, idle since she left, still runs: {servers.get(hub.cy)}"
            assert all(servers.get(u) for u in (hub.ada, hub.ben, hub.prof)), f"an active server was culled: {servers}"
        with ben.step("ben's server runs in his cgroup, under the class's limits"):
            from autograder.hub import limits
            pid = next(int(p.parent.name) for p in pathlib.Path("/proc").glob("[0-9]*/status")
                       if _uid_of(p) == hub.uid(hub.ben))
            memberships = pathlib.Path(f"/proc/{pid}/cgroup").read_text()
            assert f"/{limits.ROOT_NAME}/{hub.ben}" in memberships, f"ben's processes are not in his cgroup:\n{memberships}"
        timings["loop_s"] = round(time.perf_counter() - loop_start, 2)
        loads.append(os.getloadavg()[0])
        timings["load_average"] = loads
        timings["loop_budget_s"] = round(LOOP_BUDGET_S * max(1.0, max(loads) / os.cpu_count()), 1)
        assert timings["make_hub_up_s"] < HUB_UP_BUDGET_S, f"make hub took {timings['make_hub_up_s']} s to be up"
        assert timings["loop_s"] < timings["loop_budget_s"], (
            f"the class loop took {timings['loop_s']} s, over its budget of {timings['loop_budget_s']} s "
            f"({LOOP_BUDGET_S} s on an idle machine; load average {loads})")

        # -- feedback within a minute of Submit (autograder/hub/service.py; README "Feedback within a minute of Submit").
        #    The instructor turns it on for 04; ada and ben submit again, in the same second; each reads their own
        #    score per test in the feedback the service wrote (the same notebooks' grades as make grade's above),
        #    the time from their click on Submit measured, and nothing of the other's.
        feedback_budget_s, feedback_ready_timeout_s = 60, 600   # budget: from Submit to the score read, two idle cores
        with prof.step("the instructor turns on feedback for 04; the service's graders are ready", timing="feedback_on_s"):
            code, log = prof.terminal(
                f"python -m autograder.hub feedback-mode {ASSIGNMENT} full --per-hour 3 && until python -m "
                "autograder.hub feedback-queue | grep -q 'graders: ready'; do sleep 1; done; "
                "python -m autograder.hub feedback-queue", "feedback-on", feedback_ready_timeout_s)
            (ARTIFACTS / "feedback-on.log").write_text(log)
            assert code == 0 and "graders: ready" in log, f"the feedback service is not ready:\n{log[-3000:]}"
        for student in (ada, ben):
            with student.step("the Assignments tab, Submit at hand"):
                student.assignments()
        clicked = {}
        with ada.step("ada and ben submit in the same second"):
            for student in (ada, ben):
                row = student.page.locator("#fetched_assignments_list .list_item", has_text=ASSIGNMENT)
                row.locator("button", has_text=re.compile("^Submit$")).first.click()
                clicked[student.user] = time.perf_counter()
            assert clicked[ben.user] - clicked[ada.user] < 1.0, "the two clicks were more than a second apart"
        budget = feedback_budget_s * max(1.0, os.getloadavg()[0] / os.cpu_count())
        seconds, texts = {}, {}
        waiting = {ada.user: (ada, full), ben.user: (ben, partial)}
        deadline = time.monotonic() + 2 * budget
        while waiting and time.monotonic() < deadline:
            for user, (student, entry) in list(waiting.items()):
                with student.step("poll the Assignments tab for feedback"):
                    stamp = latest_submission(hub, user)
                    student.assignments()
                    mine = student.page.locator("#submitted_assignments_list .nested_list_item", has_text=stamp)
                    if "feedback available to fetch" not in mine.inner_text():
                        continue
                with student.step("fetch and read the new feedback"):
                    row = student.page.locator("#submitted_assignments_list .list_item", has_text=ASSIGNMENT)
                    row.locator("button", has_text=re.compile("^Fetch Feedback$")).first.click()
                    fetched = mine.filter(has_text="view feedback")
                    fetched.wait_for()
                    fetched.locator("a", has_text="view feedback").click()
                    # the file browser shows this hand-in's feedback folder (named by its time), not the earlier one
                    student.page.locator("#filebrowser .jp-BreadCrumbs").filter(has_text=stamp).wait_for()
                    student.page.locator("#filebrowser .jp-DirListing-itemText", has_text=f"{ASSIGNMENT}.html").dblclick()
                    frame = student.page.frame_locator(".jp-HTMLViewer:visible iframe")
                    frame.locator("body").filter(has_text="Graded hand-ins left this hour").wait_for()
                    texts[user] = frame.locator("body").inner_text()
                    seconds[user] = round(time.perf_counter() - clicked[user], 1)
                    student.screenshot("feedback-within-a-minute")
                    del waiting[user]
            time.sleep(1)
        timings["feedback_from_submit_s"] = seconds
        timings["feedback_budget_s"] = round(budget, 1)
        assert not waiting, f"no feedback for {sorted(waiting)} within {2 * budget:.0f} s of Submit: {seconds}"
        for student, other, entry in ((ada, ben, full), (ben, ada, partial)):
            text = texts[student.user]
            from autograder.grading import stretch_points
            stretch = f" (optional stretch: {entry.get('stretch_score', 0):g} / {stretch_points(ASSIGNMENT):g})"
            assert f"Score: {entry['score']:g} / {entry['max_score']:g}{stretch}" in text, (
                f"{student.user}'s feedback should show make grade's score for the same notebook:\n{text[:2000]}")
            assert "Graded hand-ins left this hour: 2 of 3" in text, text[:2000]
            assert other.user not in text, f"{student.user}'s feedback mentions {other.user}"
        assert MUTANT.message in texts[ben.user], f"ben's feedback should teach the √d_k:\n{texts[ben.user][:3000]}"
        assert max(seconds.values()) < budget, (
            f"feedback came {seconds} s after Submit, over the budget of {budget:.0f} s ({feedback_budget_s} s idle)")
        with ben.step("the service's folder is closed to a student"):
            folder = hub.folder / "feedback-service"
            code, log = ben.terminal(f"ls {folder} || cat {folder}/ledger.db", "service-probe", 30)
            assert code != 0 and "Permission denied" in log, log
    finally:
        for browser in browsers.values():
            timings.update({f"{browser.user.split('-')[0]}_{k}": v for k, v in browser.timings.items()})
        (ARTIFACTS / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
        print("hub timings (s):", json.dumps(timings), file=sys.stderr)


# ------------------------------------------------------------------------------------ make lab as root
def test_make_lab_starts_as_root(tmp_path):
    """`make lab` as root (a container, a cloud notebook, CI): JupyterLab starts, says why it allowed
    root, serves the lab page, and stops by its process id."""
    if os.geteuid() != 0:
        pytest.skip("this test proves `make lab` as root: it runs as root (CI and this project's machines do)")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "IPYTHONDIR": str(tmp_path / "ipython")}
    log_path = tmp_path / "make-lab.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(["make", "--no-print-directory", "lab",
                                    f"LAB_ARGS=--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 "
                                    f"--ServerApp.token={token}"],
                                   cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, page = time.monotonic() + 60, None
        while time.monotonic() < deadline and page is None:
            assert process.poll() is None, f"make lab exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=2) as reply:
                    page = reply.read().decode()
            time.sleep(0.25)
        assert page is not None, f"make lab did not serve the lab page in 60 s:\n{log_path.read_text()[-3000:]}"
        assert "JupyterLab" in page, f"the page at /lab is not JupyterLab's:\n{page[:500]}"
        assert "note: running as root" in log_path.read_text(), "make lab should say why it passes --allow-root"
    finally:
        started = descendants(process.pid)
        for pid in [process.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------ the pieces
def test_role_configurations(tmp_path):
    """Students' servers: the course and exchange for the Assignments tab, formgrader off (server and
    lab extensions, nbgrader's way); instructors': nothing off."""
    settings = hub_setup.Settings(dir=str(tmp_path))
    hub_setup.write_role_configs(settings)
    student, instructor = settings.config_dir("student"), settings.config_dir("instructor")
    server = json.loads((student / "jupyter_server_config.json").read_text())["ServerApp"]
    assert server["jpserver_extensions"] == {"nbgrader.server_extensions.formgrader": False}
    page = json.loads((student / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"]["@jupyter/nbgrader:formgrader"] is True
    assert json.loads((instructor / "labconfig" / "page_config.json").read_text())["disabledExtensions"] == {}
    config = {}
    exec((student / "nbgrader_config.py").read_text(), {"get_config": lambda: _Config(config)})
    from autograder.hub.exchange import EXCHANGE_PLUGINS
    assert config == {"CourseDirectory.course_id": settings.course_id, "Exchange.root": str(settings.exchange),
                      **{f"ExchangeFactory.{name}": cls for name, cls in EXCHANGE_PLUGINS.items()}}, (
        "a student's server uses the course's exchange plugins (hand-ins as the server's own user)")
    assert oct((student / "nbgrader_config.py").stat().st_mode & 0o777) == "0o644", "servers run as other users"


class _Config:
    """Records `c.Section.name = value` as {"Section.name": value}."""

    def __init__(self, record, prefix=""):
        object.__setattr__(self, "_record", record)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name):
        return _Config(self._record, f"{self._prefix}{name}.")

    def __setattr__(self, name, value):
        self._record[f"{self._prefix}{name}"] = value


def test_python_view_reaches_only_a_python_under_a_closed_folder():
    from autograder.hub import view
    root = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp"))  # pytest's tmp_path sits in a closed folder itself
    try:
        root.chmod(0o755)
        closed = root / "home-of-root"
        prefix = closed / ".pyenv" / "versions" / "3.11"
        prefix.mkdir(parents=True)
        closed.chmod(0o700)
        assert view.python_view([prefix]) == ([str(closed)], [str(prefix)]), (
            "a Python under a folder others may not enter: that folder is covered, the Python bound back")
        closed.chmod(0o755)
        assert view.python_view([prefix]) == ([], []), "a Python everyone reaches needs no mounts"
    finally:
        shutil.rmtree(root)


# ------------------------------------------------------------------------------------ limits per server
def _run_in_cgroup(folders, code):
    """Run `code` in a fresh Python that first joins `folders` (as the spawner's preexec does); its exit code."""
    from autograder.hub import limits
    return subprocess.run([sys.executable, "-c", code], preexec_fn=(lambda: limits.join(folders)) if folders else None,
                          capture_output=True, timeout=120).returncode


def test_a_memory_bomb_is_stopped_in_its_own_cgroup():
    """A user's cgroup (limits.py, as the spawner makes it) with 200 MB: a process there that fills 400 MB is
    killed by the kernel, and this process (the hub's place) is untouched. Control: the same process outside
    any such cgroup fills its 400 MB and exits normally."""
    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root (the hub runs as root)")
    from autograder.hub import limits
    user = f"limits-test-{secrets.token_hex(3)}"
    if "memory" not in limits.parents():
        pytest.skip(f"this machine lets root limit no memory: {limits.describe()}")
    folders = limits.prepare(user, limits.Limits(memory_bytes=200 * 2**20, cpus=1.0, pids=64))
    if not folders:
        pytest.skip(f"this machine lets root limit no memory: {limits.describe()}")
    bomb = "x = b'x' * (400 * 2**20); print(len(x))"
    try:
        assert _run_in_cgroup([], bomb) == 0, "control: 400 MB should be fine outside the user's cgroup"
        code = _run_in_cgroup(folders, bomb)
        assert code == -signal.SIGKILL, f"the bomb in a 200 MB cgroup should be killed by the kernel (got {code})"
    finally:
        for folder in folders:
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def test_a_busy_loop_gets_its_cpu_share_and_no_more():
    """A cgroup with 0.2 CPU: a busy loop needs at least 1.8 s of wall time to use 0.4 s of CPU there (at most 0.2 s
    of CPU per second; other load can only make it slower, never faster). Control: outside it the same 0.4 s of CPU
    takes less wall time than that (the fastest of a few tries, so that a moment of load elsewhere does not decide)."""
    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root (the hub runs as root)")
    from autograder.hub import limits
    user = f"limits-test-{secrets.token_hex(3)}"
    if "cpu" not in limits.parents():
        pytest.skip(f"this machine lets root limit no CPU: {limits.describe()}")
    folders = limits.prepare(user, limits.Limits(memory_bytes=2**30, cpus=0.2, pids=64))
    if not folders:
        pytest.skip(f"this machine lets root limit no CPU: {limits.describe()}")
    cpu_seconds, share = 0.4, 0.2
    least_wall = 0.9 * cpu_seconds / share     # one period's burst of slack
    spin = ("import time, resource, sys\nstart = time.monotonic()\n"
            "used = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])\nbase = used()\n"
            f"while used() - base < {cpu_seconds} and time.monotonic() - start < 60: pass\n"
            "sys.exit(min(255, int(10 * (time.monotonic() - start))))")
    try:
        inside = _run_in_cgroup(folders, spin) / 10
        assert inside >= least_wall, (
            f"{cpu_seconds} s of CPU took {inside:.1f} s of wall time in a {share}-CPU cgroup: the cap would make it "
            f"at least {least_wall:.1f} s, so the cgroup's cpu.max is not applied")
        outside = min(_run_in_cgroup([], spin) / 10 for _ in range(3))
        assert outside < least_wall, (
            f"control: outside the cgroup {cpu_seconds} s of CPU took {outside:.1f} s of wall time at best (3 tries), "
            "so this measurement cannot tell the cap from the machine's load")
    finally:
        for folder in folders:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
