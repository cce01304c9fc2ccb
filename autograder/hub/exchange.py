"""nbgrader's file exchange, laid out so that a hand-in belongs to the user who made it.

nbgrader's own exchange puts every hand-in in one `inbound/` that every user may write (2733): a
student could create `inbound/<classmate>+<assignment>+<timestamp>+<random>` and collect would take it
as the classmate's (it only warns), `nbgrader submit --student=<classmate>` does the same, one folder with
a name nbgrader cannot parse stops the collection of the whole class, the files inside are world-readable,
and a feedback file's name is a hash of a secret that sits world-readable beside the hand-in. Here the
operating system decides instead (`python -m autograder.hub setup` makes the folders, as root):

    <exchange>/<course id>/
        outbound/             0755  the owner's: nbgrader's release_assignment, unchanged
        inbound/              0711  the owner's: nobody else creates anything here
        inbound/<student>/    2750  <student>:<instructors>: only that student writes here; instructors
                                    read (setgid: everything inside belongs to the instructors' group)
        feedback/             0711  the owner's
        feedback/<student>/   2750  <owner>:<the student's own group>: the owner writes, only that student reads

The classes below are nbgrader's exchange plugins for that layout (`EXCHANGE_PLUGINS`, set in every role's
nbgrader configuration). A student hands in as the user their server runs as, never as a name they type.
Collect takes from `inbound/<student>/` only what that student made: an entry owned by someone else, named
for someone else, a symlink, a file, or a name that does not parse is set aside (copied to
`~/course/set_aside/`, listed in its `log.jsonl`, which `make grade` reports) and never stops anybody else's
collection. A hand-in's time is when the exchange received its last byte (the latest inode change in it,
which no user can set back): a timestamp that claims otherwise is replaced, and said.
"""
import base64
import datetime
import glob
import json
import os
import pathlib
import pwd
import secrets
import shutil
import stat

from nbgrader.exchange.default import (ExchangeCollect, ExchangeFetchAssignment, ExchangeFetchFeedback,
                                       ExchangeList, ExchangeReleaseAssignment, ExchangeReleaseFeedback,
                                       ExchangeSubmit)
from nbgrader.utils import ignore_patterns, notebook_hash, parse_utc

EXCHANGE_PLUGINS = {name: f"autograder.hub.exchange.{cls}" for name, cls in (
    ("submit", "CourseSubmit"), ("collect", "CourseCollect"), ("list", "CourseList"),
    ("fetch_feedback", "CourseFetchFeedback"), ("release_feedback", "CourseReleaseFeedback"),
    ("fetch_assignment", "CourseFetchAssignment"), ("release_assignment", "CourseReleaseAssignment"))}
# A hand-in's name may claim a time this far from when the exchange received it (copying takes well under a second)
CLOCK_TOLERANCE = datetime.timedelta(seconds=60)
SET_ASIDE = "set_aside"   # in the collecting instructor's course folder: what collect did not take, and why


def os_user():
    """The user this process runs as (never an environment variable or a command-line option)."""
    return pwd.getpwuid(os.getuid()).pw_name


def course_folders(root, course_id):
    course = pathlib.Path(root) / course_id
    return course, course / "inbound", course / "feedback"


def nbgrader_timestamp(moment):
    """A UTC time the way nbgrader writes timestamp.txt."""
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


class CourseExchange:
    """The exchange's root is setup's (0755, root's): nbgrader's own plugins want it writable by everyone
    (submit refuses otherwise, release_assignment chmods it 0777). Here it need only exist."""

    def ensure_root(self):
        if not os.path.isdir(self.root) or not os.access(self.root, os.X_OK):
            self.fail(f"The course's exchange is missing or closed to you: {self.root} (ask your instructor)")


# ------------------------------------------------------------------------------------- students
class CourseFetchAssignment(CourseExchange, ExchangeFetchAssignment):
    """nbgrader's fetch, from an exchange whose root nobody but root writes."""


class CourseSubmit(CourseExchange, ExchangeSubmit):
    """Hand in into inbound/<you>/, as the user the server runs as."""

    def init_dest(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        user = os_user()
        if self.coursedir.student_id not in ("*", "", user):
            self.fail(f"you hand in as yourself ({user}), never as {self.coursedir.student_id!r}")
        _, inbound, _ = course_folders(self.root, self.coursedir.course_id)
        self.inbound_path = str(inbound / user)
        if not os.path.isdir(self.inbound_path) or not os.access(self.inbound_path, os.W_OK | os.X_OK):
            self.fail(f"you have no hand-in folder in this course's exchange ({user}): ask your instructor to "
                      "add you to the class (`python -m autograder.hub setup` with the roster)")
        self.cache_path = os.path.join(self.cache, self.coursedir.course_id)
        random_str = base64.urlsafe_b64encode(os.urandom(9)).decode("ascii")
        self.assignment_filename = f"{user}+{self.coursedir.assignment_id}+{self.timestamp}+{random_str}"

    def copy_files(self):
        """nbgrader's submit, with modes that keep the hand-in to its owner and the instructors (files 0640,
        folders 2750), and no log line naming where it went."""
        self.init_release()
        submission_secret = secrets.token_hex(64)
        dest_path = os.path.join(self.inbound_path, self.assignment_filename)
        cache_path = os.path.join(self.cache_path, self.assignment_filename.rsplit("+", 1)[0])
        self.check_filename_diff()
        # the cache copy first, stamps included, then all of it into the exchange in one copy: every file is
        # created inside inbound/<you>/ (setgid), so it belongs to the instructors' group; a file written
        # there later would not (copytree's last chmod drops setgid, and a student cannot chgrp to that group)
        os.makedirs(self.cache_path, exist_ok=True)
        self.do_copy(self.src_path, cache_path)
        _write_stamps(cache_path, self.timestamp, submission_secret)
        shutil.copytree(cache_path, dest_path, symlinks=True)
        self.set_perms(dest_path, fileperms=0o640, dirperms=0o750)
        self.log.info(f"Submitted as: {self.coursedir.course_id} {self.coursedir.assignment_id} {self.timestamp}")


def _write_stamps(folder, timestamp, secret):
    with open(os.path.join(folder, "timestamp.txt"), "w") as fh:
        fh.write(timestamp)
    with open(os.path.join(folder, "submission_secret.txt"), "w") as fh:
        fh.write(secret)


class CourseList(CourseExchange, ExchangeList):
    """nbgrader's listing, with hand-ins under inbound/<student>/ and feedback under feedback/<student>/."""

    def init_dest(self):
        if not self.inbound:
            return super().init_dest()
        course_id = self.coursedir.course_id or "*"
        assignment_id = self.coursedir.assignment_id or "*"
        student_id = self.coursedir.student_id or "*"
        pattern = pathlib.Path(self.root) / course_id / "inbound" / student_id
        self.assignments = sorted(str(p) for p in pattern.parent.glob(f"{student_id}/{student_id}+{assignment_id}+*"))

    def parse_assignment(self, assignment):
        if self.inbound:  # <root>/<course>/inbound/<student>/<student>+<assignment>+<timestamp>+<random>
            path = pathlib.Path(assignment)
            student, assignment_id, timestamp, *_ = path.name.split("+") + ["", ""]
            return {"course_id": path.parent.parent.parent.name, "student_id": student,
                    "assignment_id": assignment_id, "timestamp": timestamp}
        return super().parse_assignment(assignment)

    def parse_assignments(self):
        assignments = super().parse_assignments()
        if not self.cached:
            return assignments
        user = os_user()
        for assignment in assignments:   # feedback is under feedback/<you>/, not nbgrader's feedback/
            for info in assignment["submissions"]:
                _, _, feedback = course_folders(self.root, info["course_id"])
                secret_path = pathlib.Path(info["path"]) / "submission_secret.txt"
                secret = secret_path.read_text() if secret_path.is_file() else None
                for nb in info["notebooks"]:
                    path = feedback / user / f"{notebook_hash(secret=secret, notebook_id=nb['notebook_id'])}.html" \
                        if secret else None
                    nb["has_exchange_feedback"] = bool(path and path.is_file())
                    nb["feedback_updated"] = bool(nb["has_local_feedback"] and nb["has_exchange_feedback"] and
                                                  _checksum(path) != _checksum(nb["local_feedback_path"]))
                notebooks = info["notebooks"]
                info["has_exchange_feedback"] = bool(notebooks) and all(n["has_exchange_feedback"] for n in notebooks)
                info["feedback_updated"] = any(n["feedback_updated"] for n in notebooks)
        return assignments


def _checksum(path):
    import hashlib
    return hashlib.md5(pathlib.Path(path).read_bytes()).hexdigest()


class CourseFetchFeedback(CourseExchange, ExchangeFetchFeedback):
    """Fetch your feedback from feedback/<you>/ (named by a hash of your hand-in's secret, as nbgrader does)."""

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        user = os_user()
        _, _, feedback = course_folders(self.root, self.coursedir.course_id)
        self.src_path = self.outbound_path = str(feedback / user)
        self.cache_path = os.path.join(self.cache, self.coursedir.course_id)
        if not os.path.isdir(self.src_path):
            self._assignment_not_found(self.src_path, str(feedback / "*"))
        assignment_id = self.coursedir.assignment_id or "*"
        self.feedback_files = []
        for submission in sorted(pathlib.Path(self.cache_path).glob(f"*+{assignment_id}+*")):
            _, assignment, timestamp = submission.name.split("+", 2)
            secret_path = submission / "submission_secret.txt"
            if not secret_path.is_file():
                continue
            secret = secret_path.read_text()
            for notebook in sorted(submission.glob("*.ipynb")):
                path = pathlib.Path(self.src_path) / f"{notebook_hash(secret=secret, notebook_id=notebook.stem)}.html"
                if path.is_file():
                    self.feedback_files.append((notebook.stem, timestamp, str(path)))
                    self.log.info(f"Found feedback for '{self.coursedir.course_id}/{assignment}/{notebook.stem}' "
                                  f"submitted at {timestamp}")


# ----------------------------------------------------------------------------------- instructors
class CourseReleaseFeedback(CourseExchange, ExchangeReleaseFeedback):
    """Release each student's feedback into feedback/<student>/, which only they (and the owner) can read."""

    def init_dest(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        _, _, self.dest_path = course_folders(self.root, self.coursedir.course_id)

    def copy_files(self):
        exclude = set(filter(None, (self.coursedir.student_id_exclude or "").split(",")))
        feedback_root = pathlib.Path(self.coursedir.feedback_directory)
        for html in sorted(map(pathlib.Path, glob.glob(os.path.join(self.src_path, "*.html")))):
            folder = html.parent
            student = folder.parent.name
            if folder.parent.parent != feedback_root or student in exclude:
                continue
            own = pathlib.Path(self.dest_path) / student
            if not own.is_dir() or not os.access(own, os.W_OK | os.X_OK):
                self.log.error(f"no feedback folder of {student}'s that you may write ({own}): add them to the "
                               "class (`python -m autograder.hub setup` with the roster, as root)")
                continue
            secret = (folder / "submission_secret.txt").read_text()
            timestamp = (folder / "timestamp.txt").read_text()
            name = f"{notebook_hash(secret=secret, notebook_id=html.stem)}.html"
            temporary = own / f".{name}.{secrets.token_hex(4)}"
            with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640), "wb") as out:
                out.write(html.read_bytes())
            os.replace(temporary, own / name)   # atomic: a student never fetches half a page
            self.log.info(f"Releasing feedback for student '{student}' on assignment "
                          f"'{self.coursedir.course_id}/{self.coursedir.assignment_id}/{html.stem}' ({timestamp})")


class CourseReleaseAssignment(CourseExchange, ExchangeReleaseAssignment):
    """nbgrader's release, into the course folder setup made (its root nobody but root writes)."""


class CourseCollect(CourseExchange, ExchangeCollect):
    """Collect from inbound/<student>/ only what that student made; set aside the rest, and say why."""

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        _, inbound, _ = course_folders(self.root, self.coursedir.course_id)
        self.inbound_path = str(inbound)
        if not os.access(inbound, os.X_OK):
            self.fail(f"You may not enter the course's inbound folder: {inbound}")
        wanted = self.coursedir.student_id if self.coursedir.student_id not in ("", "*") else None
        records, set_aside = hand_ins(inbound, self.coursedir.assignment_id, wanted)
        self.set_aside = set_aside
        keep_set_aside(pathlib.Path(self.coursedir.root) / SET_ASIDE, inbound, set_aside, self.log)
        self.retimed = [r for r in records if r.get("note")]
        by_student = {}
        for record in records:
            by_student.setdefault(record["username"], []).append(record)
        from nbgrader.api import Gradebook, MissingEntry

        from autograder.hub.service import choose_hand_in
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gradebook:
            try:
                self.duedate = gradebook.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for own in by_student.values():
            own = self._sort_by_timestamp(own)
            if self.duedate is not None and self.before_duedate:
                on_time = [r for r in own if r["timestamp"] <= self.duedate]
                own = on_time or own
            # where the feedback service is on: the last or the best hand-in before the due date (service.py)
            self.src_records.append(choose_hand_in(self.root, self.coursedir.assignment_id, own, self.duedate) or own[0])

    def do_copy(self, src, dest, log=None):
        """Copy a hand-in without following links; one that gained a link since it was looked at (a student
        may change their own folder while collect runs) is not taken."""
        shutil.copytree(src, dest, symlinks=True, ignore=ignore_patterns(
            exclude=self.coursedir.ignore, include=self.coursedir.include,
            max_file_size=self.coursedir.max_file_size, log=self.log))
        links = [p for p in pathlib.Path(dest).rglob("*") if p.is_symlink()]
        if links:
            shutil.rmtree(dest)
            self.log.error(f"not collected: {shown(src)} gained a link while it was collected ({shown(links[0].name)})")

    def copy_files(self):
        super().copy_files()
        # a hand-in whose claimed time was not when it arrived is graded as received (and it is said)
        for record in self.src_records:
            if record.get("note"):
                dest = pathlib.Path(self.coursedir.format_path(self.coursedir.submitted_directory,
                                                               record["username"], self.coursedir.assignment_id))
                (dest / "timestamp.txt").write_text(nbgrader_timestamp(record["timestamp"]))
                self.log.warning(f"{record['username']}: {record['note']}")


def hand_ins(inbound, assignment, student=None):
    """(records, set aside) for `assignment` in `inbound`: a record {username, filename, timestamp} per hand-in
    its student made (filename relative to inbound; timestamp when it arrived), and a dict per entry that
    collect must not take {owner, entry, reason}."""
    inbound = pathlib.Path(inbound)
    records, set_aside = [], []
    for folder in sorted(inbound.iterdir()):
        owner = _owner(folder)
        if folder.is_symlink() or not folder.is_dir():
            set_aside.append({"owner": owner, "entry": folder.name, "reason": "not a student's hand-in folder"})
            continue
        if student and folder.name != student:
            continue
        if owner != folder.name:
            set_aside.append({"owner": owner, "entry": folder.name,
                              "reason": f"hand-in folder '{folder.name}' belongs to {owner}"})
            continue
        try:
            entries = sorted(folder.iterdir())
        except PermissionError:
            set_aside.append({"owner": owner, "entry": folder.name, "reason": "unreadable: the student changed its "
                              "permissions, so nothing of theirs could be collected"})
            continue
        for entry in entries:
            parts = entry.name.split("+")
            if len(parts) >= 3 and parts[1] != assignment and parts[0] == folder.name:
                continue   # another assignment's hand-in: collected with that one
            problem = _problem(entry, folder.name, parts)
            if problem:
                set_aside.append({"owner": owner, "entry": f"{folder.name}/{entry.name}", "reason": problem})
                continue
            claimed = parse_utc(parts[2])
            received = arrival(entry)
            record = {"username": folder.name, "filename": f"{folder.name}/{entry.name}", "timestamp": claimed}
            if abs(claimed - received) > CLOCK_TOLERANCE:
                record["timestamp"] = received
                record["note"] = (f"hand-in {shown(entry.name.rsplit('+', 1)[0])} claims to be made at {claimed:%Y-%m-%d %H:%M:%S} "
                                  f"UTC, but the exchange received it at {received:%Y-%m-%d %H:%M:%S} UTC: graded as received")
            records.append(record)
    return records, set_aside


def shown(text):
    """A name a student chose, safe to print (no newline or escape code can forge a line of a report)."""
    return repr(str(text))


def _problem(entry, student, parts):
    """Why collect must not take `entry` from `student`'s folder, or None."""
    if entry.is_symlink() or not entry.is_dir():
        return "not a hand-in folder (a file or a link)"
    if len(parts) < 3:
        return "its name is not <student>+<assignment>+<timestamp>+<random>"
    if parts[0] != student:
        return f"handed in from {student}'s folder under the name of {parts[0]!r}"
    try:
        parse_utc(parts[2])
    except Exception:
        return f"its timestamp {parts[2][:40]!r} is not a time"
    uid = pwd.getpwnam(student).pw_uid
    for path in [entry, *entry.rglob("*")]:
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            return f"it holds a link ({shown(path.relative_to(entry))}), which collect never follows"
        if status.st_uid != uid:
            return f"it holds {shown(path.relative_to(entry))} of another user's ({_name(status.st_uid)})"
    return None


def arrival(entry):
    """When the exchange received the last of `entry` (UTC): its latest inode change, which no user can set back."""
    latest = max(p.lstat().st_ctime for p in [entry, *entry.rglob("*")])
    return datetime.datetime.fromtimestamp(latest, datetime.timezone.utc).replace(tzinfo=None)


def _owner(path):
    try:
        return _name(path.lstat().st_uid)
    except OSError:
        return "unknown"


def _name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def keep_set_aside(folder, inbound, set_aside, log):
    """Copy what collect set aside to `folder`/<owner>/<entry> (links kept as links) and append a line per entry
    to `folder`/log.jsonl, which `make grade` reports; say each on the log."""
    if not set_aside:
        return
    folder.mkdir(parents=True, exist_ok=True)
    when = nbgrader_timestamp(datetime.datetime.now(datetime.timezone.utc))
    with open(folder / "log.jsonl", "a") as out:
        for item in set_aside:
            log.warning(f"set aside, not collected: {shown(item['entry'])} ({item['owner']}): {item['reason']}")
            source = inbound / item["entry"]
            target = folder / item["owner"] / item["entry"].replace("/", "_")
            if not target.exists():
                try:
                    if source.is_dir() and not source.is_symlink():
                        shutil.copytree(source, target, symlinks=True)
                    else:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy(source, target, follow_symlinks=False)
                except OSError as error:
                    item = {**item, "copy": f"not copied: {error.strerror}"}
            out.write(json.dumps({**item, "collected_at": when}) + "\n")


def set_aside_notes(submitted):
    """Lines for the grading report: what collect set aside beside the `submitted` folder (~/course/set_aside)."""
    log = pathlib.Path(submitted).parent / SET_ASIDE / "log.jsonl"
    if not log.is_file():
        return []
    seen, notes = set(), []
    for line in log.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        key = (item.get("owner"), item.get("entry"), item.get("reason"))
        if key not in seen:
            seen.add(key)
            # the log is the instructor's (collect wrote it); the entry's name is the student's own choice
            notes.append(f"{item.get('owner')}: REVIEW set aside at collect, not graded: "
                         f"{shown(item.get('entry'))}: {item.get('reason')}")
    return notes
