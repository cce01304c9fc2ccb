"""Hand-ins belong to their sender: the course's exchange (autograder/hub/exchange.py) against a student
who tries things, each attack beside a control that shows it working on nbgrader's own exchange.

A class of new system users (two students and an instructor, unique names, removed afterwards) is set up
as `make hub` does (hub.setup.setup: the users, the exchange, each role's configuration, 04 released), and
every command runs as the user who would type it, in their server's view of the files (hub.setup.as_user).
The control exchange is nbgrader's stock layout (inbound 2733, feedback 0711) with nbgrader's own plugins,
on the same machine, for the same users.

ben, the attacker, tries: a folder in inbound named for ada (with a timestamp in 2099, so that it wins);
`nbgrader submit --student=<ada>`; a hand-in in his own folder named for ada; a hand-in whose name claims
it was made before the due date; a link to ada's notebook in his hand-in; a malformed name in inbound (which
stops nbgrader's collect for the whole class); reading ada's hand-in, its secret and her feedback.
"""
import contextlib
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile

import nbformat
import pytest

from autograder.config import COURSE_ID
from autograder.hub import exchange
from autograder.hub import setup as hub_setup

pytestmark = pytest.mark.xdist_group("exchange")
ASSIGNMENT = "04_self_attention"
STOCK_PLUGINS = {name: f"nbgrader.exchange.default.{module}.{cls}" for name, module, cls in (
    ("submit", "submit", "ExchangeSubmit"), ("collect", "collect", "ExchangeCollect"),
    ("list", "list", "ExchangeList"), ("fetch_feedback", "fetch_feedback", "ExchangeFetchFeedback"),
    ("release_feedback", "release_feedback", "ExchangeReleaseFeedback"),
    ("fetch_assignment", "fetch_assignment", "ExchangeFetchAssignment"),
    ("release_assignment", "release_assignment", "ExchangeReleaseAssignment"))}
FUTURE = "2099-01-01 00:00:00.000000 UTC"


class Class:
    """Users, the course's exchange, and nbgrader's stock exchange beside it for the controls."""

    def __init__(self):
        suffix = secrets.token_hex(3)
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="course-exchange-", dir="/var/tmp"))
        self.folder.chmod(0o755)
        self.ada, self.ben, self.prof = f"ada-{suffix}", f"ben-{suffix}", f"prof-{suffix}"
        self.roster = self.folder / "roster.csv"
        self.roster.write_text(f"username,role\n{self.ada},student\n{self.ben},student\n{self.prof},instructor\n")
        self.settings = hub_setup.setup(self.roster, self.folder / "hub", assignments=[ASSIGNMENT],
                                        home_base=self.folder / "home", group_prefix=f"xtest-{suffix}")
        self.stock = self.folder / "stock-exchange"
        self.stock.mkdir()
        self.stock.chmod(0o1777)
        self.run(self.prof, ["nbgrader", "release_assignment", ASSIGNMENT, *self.stock_flags()], check=True)

    def stock_flags(self):
        return [f"--Exchange.root={self.stock}",
                *(f"--ExchangeFactory.{name}={cls}" for name, cls in STOCK_PLUGINS.items())]

    def home(self, user):
        return self.folder / "home" / user

    def run(self, user, argv, check=False):
        """`argv` as `user`, from their home, in their server's view and environment; (exit code, output)."""
        result = hub_setup.as_user(self.settings, user, argv, capture_output=True, text=True)
        output = result.stdout + result.stderr
        if check:
            assert result.returncode == 0, f"{user}: {' '.join(map(str, argv))} failed:\n{output[-3000:]}"
        return result.returncode, output

    def shell(self, user, script):
        return self.run(user, ["/bin/bash", "-c", script])

    @property
    def inbound(self):
        return self.settings.exchange / COURSE_ID / "inbound"

    def stock_course(self):
        return self.stock / COURSE_ID

    def remove(self):
        hub_setup.remove(self.settings.root)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def course():
    if os.geteuid() != 0:
        pytest.skip("the exchange tests create system users: they run as root (CI and this project's machines do)")
    made = Class()
    try:
        made.run(made.ada, ["nbgrader", "fetch_assignment", ASSIGNMENT], check=True)
        mark(made.home(made.ada) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", "ada's own work")
        made.run(made.ben, ["nbgrader", "fetch_assignment", ASSIGNMENT], check=True)
        mark(made.home(made.ben) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", "ben's work")
        yield made
    finally:
        made.remove()


def mark(path, text):
    """Put `text` in the notebook's first cell (as its owner would: the file keeps its owner)."""
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = text
    status = path.stat()
    nbformat.write(nb, path)
    os.chown(path, status.st_uid, status.st_gid)


def first_cell(folder):
    return nbformat.read(pathlib.Path(folder) / f"{ASSIGNMENT}.ipynb", as_version=4).cells[0].source


def collected(course, student):
    return course.home(course.prof) / "course" / "submitted" / student / ASSIGNMENT


def stock_hand_in(course, student):
    """`student`'s own latest hand-in in the control exchange (not a folder someone forged in their name)."""
    import pwd
    uid = pwd.getpwnam(student).pw_uid
    own = sorted(p for p in (course.stock_course() / "inbound").glob(f"{student}+*") if p.stat().st_uid == uid)
    return own[-1] if own else None


def forge(course, user, folder, name, source_notebook, timestamp=FUTURE):
    """As `user`: a hand-in folder `folder/name` holding `source_notebook` and the stamps nbgrader writes."""
    script = (f"set -e; mkdir -p '{folder}/{name}'; cp '{source_notebook}' '{folder}/{name}/{ASSIGNMENT}.ipynb'; "
              f"printf '%s' '{timestamp}' > '{folder}/{name}/timestamp.txt'; "
              f"printf '%s' forged > '{folder}/{name}/submission_secret.txt'")
    return course.shell(user, script)


# ------------------------------------------------------------------------------ the attacks, each with a control
def test_a_hand_in_under_a_classmates_name_counts_for_no_one(course):
    ben_nb = course.home(course.ben) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    forged = f"{course.ada}+{ASSIGNMENT}+{FUTURE}+AAAAAAAAAAAA"

    # control: nbgrader's exchange takes ben's folder, named for ada, as ada's hand-in (only a warning)
    code, out = forge(course, course.ben, course.stock_course() / "inbound", forged, ben_nb)
    assert code == 0, f"control: ben could not create a folder in the stock inbound (2733?):\n{out}"
    course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, "--update", *course.stock_flags()], check=True)
    assert first_cell(collected(course, course.ada)) == "ben's work", (
        "control: nbgrader's own collect should take the forged folder as ada's hand-in (the attack works there)")
    shutil.rmtree(course.home(course.prof) / "course" / "submitted")

    # the course's exchange: nobody but the owner creates anything at inbound's top; not in ada's folder either
    for where in (course.inbound, course.inbound / course.ada):
        code, out = forge(course, course.ben, where, forged, ben_nb)
        assert code != 0 and "Permission denied" in out, f"ben created {where}/{forged}:\n{out}"
    # `nbgrader submit --student=<ada>` hands in as ben or not at all
    code, out = course.run(course.ben, ["nbgrader", "submit", ASSIGNMENT, f"--student={course.ada}"])
    assert code != 0 and "you hand in as yourself" in out, out
    # a hand-in in his own folder named for ada is set aside, said, and never hers
    forge(course, course.ben, course.inbound / course.ben, forged, ben_nb)
    course.run(course.ada, ["nbgrader", "submit", ASSIGNMENT], check=True)
    code, out = course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, "--update"], check=True)
    assert first_cell(collected(course, course.ada)) == "ada's own work", "ada's grade must be her own work's"
    assert not collected(course, course.ben).exists(), "ben handed in nothing of his own under his name"
    notes = exchange.set_aside_notes(collected(course, course.ada).parent.parent)
    assert any(course.ben in n and "under the name of" in n for n in notes), notes
    assert "set aside" in out, f"collect should say what it set aside:\n{out}"


def test_a_malformed_entry_stops_nobody_elses_collection(course):
    ben_nb = course.home(course.ben) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    # control: one malformed name in nbgrader's inbound fails `nbgrader collect` for the whole class
    forge(course, course.ben, course.stock_course() / "inbound", f"x+{ASSIGNMENT}+not-a-time+1", ben_nb)
    code, out = course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, *course.stock_flags()])
    assert code != 0, f"control: nbgrader's collect should fail on a malformed name:\n{out[-2000:]}"
    # the course's exchange: set aside and reported; ada's hand-in is collected
    forge(course, course.ben, course.inbound / course.ben, f"{course.ben}+{ASSIGNMENT}+not-a-time+1", ben_nb)
    course.shell(course.ben, f"touch '{course.inbound / course.ben}/stray-file'")
    code, out = course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, "--update"])
    assert code == 0, f"collect should go on past a malformed entry:\n{out[-2000:]}"
    assert first_cell(collected(course, course.ada)) == "ada's own work"
    notes = "\n".join(exchange.set_aside_notes(collected(course, course.ada).parent.parent))
    assert "not a time" in notes and "not a hand-in folder" in notes, notes


def test_a_link_in_a_hand_in_is_never_followed(course):
    ada_nb = course.home(course.ada) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    # control: in nbgrader's exchange ada's hand-in is world-readable, and a link to it is followed by collect
    course.run(course.ada, ["nbgrader", "submit", ASSIGNMENT, *course.stock_flags()], check=True)
    stock_ada = stock_hand_in(course, course.ada)
    name = f"{course.ben}+{ASSIGNMENT}+2026-01-01 00:00:00.000000 UTC+BBBBBBBBBBBB"
    course.shell(course.ben, f"mkdir '{course.stock_course()}/inbound/{name}' && ln -s "
                             f"'{stock_ada}/{ASSIGNMENT}.ipynb' '{course.stock_course()}/inbound/{name}/{ASSIGNMENT}.ipynb'"
                             f" && printf x > '{course.stock_course()}/inbound/{name}/timestamp.txt'")
    shutil.rmtree(course.home(course.prof) / "course" / "submitted", ignore_errors=True)
    course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, f"--student={course.ben}", *course.stock_flags()])
    assert first_cell(collected(course, course.ben)) == "ada's own work", (
        "control: nbgrader's collect copies what a link in ben's hand-in points at (ada's notebook)")
    shutil.rmtree(course.home(course.prof) / "course" / "submitted")
    # the course's exchange: the link is never followed, and ben cannot even read ada's hand-in to link it
    ada_own = next((course.inbound / course.ada).glob(f"{course.ada}+*"), None) or next(
        (course.inbound / course.ada).iterdir(), None)
    code, out = course.shell(course.ben, f"ls '{course.inbound / course.ada}' || cat '{ada_nb}'")
    assert code != 0 and "Permission denied" in out, f"ben reached ada's hand-ins:\n{out}"
    linked = course.inbound / course.ben / f"{course.ben}+{ASSIGNMENT}+2026-01-01 00:00:00.000000 UTC+CCCCCCCCCCCC"
    course.shell(course.ben, f"mkdir '{linked}' && ln -s '{ada_own}/{ASSIGNMENT}.ipynb' '{linked}/{ASSIGNMENT}.ipynb'")
    course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, "--update"], check=True)
    assert not collected(course, course.ben).exists() or first_cell(collected(course, course.ben)) != "ada's own work"
    notes = "\n".join(exchange.set_aside_notes(collected(course, course.ada).parent.parent))
    assert "link" in notes, notes


def test_a_hand_in_is_dated_when_it_arrived(course):
    """A name that claims an earlier time (to look on time) is graded as received, and said."""
    ben_nb = course.home(course.ben) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    early = "2020-01-01 00:00:00.000000 UTC"
    # control: nbgrader's collect believes the name
    name = f"{course.ben}+{ASSIGNMENT}+{early}+DDDDDDDDDDDD"
    for earlier in (course.stock_course() / "inbound").glob(f"{course.ben}+*"):   # an earlier test's
        shutil.rmtree(earlier)
    forge(course, course.ben, course.stock_course() / "inbound", name, ben_nb, timestamp=early)
    shutil.rmtree(course.home(course.prof) / "course" / "submitted", ignore_errors=True)
    course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, f"--student={course.ben}", "--update",
                             *course.stock_flags()], check=True)
    assert (collected(course, course.ben) / "timestamp.txt").read_text().startswith("2020"), "control"
    shutil.rmtree(course.home(course.prof) / "course" / "submitted")
    # the course's exchange: the time the exchange received it
    forge(course, course.ben, course.inbound / course.ben, name, ben_nb, timestamp=early)
    code, out = course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, f"--student={course.ben}"], check=True)
    stamp = (collected(course, course.ben) / "timestamp.txt").read_text()
    assert not stamp.startswith("2020"), f"ben's backdated hand-in kept its claimed time: {stamp}"
    assert "graded as received" in out, out


def test_hand_ins_and_feedback_are_their_owners(course):
    """ben reads neither ada's hand-in, its secret, nor her feedback (control: all world-readable in nbgrader's
    exchange once a name is known); ada fetches hers."""
    stock_ada = stock_hand_in(course, course.ada)
    if stock_ada is None:
        course.run(course.ada, ["nbgrader", "submit", ASSIGNMENT, *course.stock_flags()], check=True)
        stock_ada = stock_hand_in(course, course.ada)
    code, out = course.shell(course.ben, f"cat '{stock_ada}/submission_secret.txt'")
    assert code == 0 and len(out.strip()) == 128, f"control: the stock secret should be world-readable:\n{out}"

    course.run(course.ada, ["nbgrader", "submit", ASSIGNMENT], check=True)
    course.run(course.prof, ["nbgrader", "collect", ASSIGNMENT, "--update"], check=True)
    feedback = course.home(course.prof) / "grading" / "feedback" / course.ada / ASSIGNMENT
    feedback.mkdir(parents=True, exist_ok=True)
    (feedback / f"{ASSIGNMENT}.html").write_text("<html>ada's feedback</html>")
    subprocess.run(["chown", "-R", f"{course.prof}:", str(course.home(course.prof) / "grading")], check=True)
    code, out = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "release-feedback", ASSIGNMENT])
    assert code == 0 and f"{course.ada}: {ASSIGNMENT}.html" in out, out
    own = course.settings.exchange / COURSE_ID / "feedback" / course.ada
    released = list(own.glob("*.html"))
    assert len(released) == 1, released
    for path in (released[0], *(course.inbound / course.ada).glob("*/submission_secret.txt")):
        code, out = course.shell(course.ben, f"cat '{path}'")
        assert code != 0 and "Permission denied" in out, f"ben read {path}:\n{out}"
    course.run(course.ada, ["nbgrader", "fetch_feedback", ASSIGNMENT], check=True)
    fetched = list((course.home(course.ada) / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html"))
    assert fetched and "ada's feedback" in fetched[0].read_text(), fetched


def test_release_feedback_that_releases_nothing_fails_and_says_why(course):
    """A student collected but never graded gets no feedback: the command says who, and exits non-zero."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(course.home(course.prof) / "grading" / "feedback")
    code, out = course.run(course.prof, [sys.executable, "-m", "autograder.hub", "release-feedback", ASSIGNMENT])
    assert code != 0 and "no feedback page" in out and "nothing was released" in out, out


def test_the_layout_setup_makes(course):
    """Modes and owners of the course's exchange, read off the folders (exchange.py's table says the same)."""
    import grp
    import pwd
    course_folder = course.settings.exchange / COURSE_ID
    owner = course.prof

    def described(path):
        status = path.stat()
        return (oct(status.st_mode & 0o7777), pwd.getpwuid(status.st_uid).pw_name, grp.getgrgid(status.st_gid).gr_name)
    instructors = course.settings.instructor_group
    expected = {course.settings.exchange: ("0o755", "root", "root"),
                course_folder / "inbound": ("0o711", owner, owner),
                course_folder / "feedback": ("0o711", owner, owner),
                course_folder / "inbound" / course.ada: ("0o2750", course.ada, instructors),
                course_folder / "feedback" / course.ada: ("0o2750", owner, course.ada)}
    found = {path: described(path) for path in expected}
    assert found == expected, {str(p): (found[p], expected[p]) for p in expected if found[p] != expected[p]}


def test_a_login_shell_finds_the_course(course):
    """`su - <instructor>` (as ssh would): the profile setup wrote sets $TRANSFORMERS_COURSE and either puts the
    course's Python on PATH or says that only the hub's terminals reach it (never a silent 'command not found')."""
    result = subprocess.run(["su", "-", course.prof, "-c", "echo course=$TRANSFORMERS_COURSE; command -v nbgrader"],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert f"course={course.settings.checkout}" in output, output
    python = pathlib.Path(sys.prefix) / "bin"
    assert str(python / "nbgrader") in output or "reachable in the hub's terminals only" in output, output


def test_tearing_down_another_hub_leaves_this_hubs_login_profile(course, tmp_path):
    """Two hubs on one machine (here: this class and the suite's other hubs) each keep their own profile file;
    one hub's teardown removes its file only (one shared file made a login shell lose the course mid-class)."""
    other = hub_setup.Settings(dir=str(tmp_path / "other-hub"))
    (other.state).mkdir(parents=True)
    written = hub_setup.write_login_profile(other)
    assert written and pathlib.Path(written).exists(), "setup writes a profile for the other hub"
    (other.state / "created.json").write_text(json.dumps({"users": [], "groups": [], "profile": written}))
    mine = hub_setup.login_profile(course.settings)
    assert mine.exists() and mine != pathlib.Path(written), (mine, written)
    hub_setup.remove(other.dir)
    assert not pathlib.Path(written).exists(), "the other hub's teardown removes its own profile"
    assert mine.exists(), "another hub's teardown removed this hub's login profile"
    # a hub set up before profiles were one per hub recorded `true` for the one shared file: its teardown removes that
    (other.state).mkdir(parents=True)
    hub_setup.LEGACY_PROFILE.write_text("# a profile from an earlier setup\n")
    (other.state / "created.json").write_text(json.dumps({"users": [], "groups": [], "profile": True}))
    hub_setup.remove(other.dir)
    assert not hub_setup.LEGACY_PROFILE.exists(), "an earlier hub's teardown left its shared profile behind"
    assert mine.exists(), "an earlier hub's teardown removed this hub's login profile"
