"""What an instructor runs on the hub, in a terminal of their server, around `make grade`.

    nbgrader collect 04_self_attention                       # from ~/course: the exchange -> ~/course/submitted
    make -C <course checkout> grade SUBMISSIONS=~/course/submitted GRADE_DIR=~/grading
    python -m autograder.hub release-feedback 04_self_attention

`make grade` writes each student's feedback HTML to ~/grading/feedback/<student>/<assignment>/;
nbgrader's release_feedback also needs the hand-in's timestamp.txt and submission_secret.txt beside
it (the secret names the file a student may fetch), which release_feedback here copies from the
collected submission before it runs nbgrader's own step. Due dates live in the class gradebook
(`python -m autograder.hub duedate`), where grading compares them with the submissions' timestamps.
"""
import contextlib
import datetime
import pathlib
import shutil

SUBMISSION_FILES = ("timestamp.txt", "submission_secret.txt")


def instructor_config():
    """The instructor's nbgrader configuration, found where nbgrader's own commands find it (on the
    hub: ~/.jupyter/nbgrader_config.py, which setup wrote; on Kubernetes: the instructors' ConfigMap)."""
    from nbgrader.apps.baseapp import NbGrader
    app = NbGrader()
    app.load_config_file()
    return app.config


def api(force_release=False):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    config = instructor_config()
    config.ExchangeReleaseAssignment.force = force_release
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config), config


def class_folder(config):
    """The folder `make grade GRADE_DIR=...` grades into: where the configured gradebook is."""
    return pathlib.Path(config.CourseDirectory.db_url.removeprefix("sqlite:///")).parent


def release(assignments, roster=None, force=False):
    """Release each of `assignments` (ids of course/) into the exchange, unless it is there (`force`: replace
    it, after a fix; hand-ins from the first release are still graded as written, autograder/releases.py);
    put the roster's students into the class gradebook. Returns lines to print."""
    from nbgrader.api import Gradebook

    from autograder.config import assignment_ids
    from autograder.hub.roster import read_roster
    nbgrader, config = api(force_release=force)
    outbound = pathlib.Path(config.Exchange.root) / config.CourseDirectory.course_id / "outbound"
    lines = []
    unknown = sorted(set(assignments) - set(assignment_ids()))
    if unknown:
        raise SystemExit(f"not assignments of this course: {', '.join(unknown)} (it has {', '.join(assignment_ids())})")
    for assignment in assignments:
        if (outbound / assignment).is_dir() and not force:
            lines.append(f"{assignment}: already released (--force replaces it with course/'s)")
            continue
        result = nbgrader.release_assignment(assignment)
        if not result["success"]:
            raise RuntimeError(f"nbgrader release_assignment {assignment} failed:\n{result.get('log', '')}"
                               f"\n{result.get('error', '')}")
        lines.append(f"{assignment}: released")
    if roster:
        students = [m for m in read_roster(roster) if m.role == "student"]
        with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
            for member in students:
                gradebook.update_or_create_student(member.username, first_name=member.first_name or None,
                                                   last_name=member.last_name or None,
                                                   email=member.email or None)
        lines.append(f"{len(students)} students in the gradebook")
    return lines


def set_duedate(assignment, when):
    """Set `assignment`'s due date (an ISO time; no zone: UTC) in the class gradebook that `make grade`
    fills, creating its entries first the way grading does; returns the date as stored (UTC)."""
    from nbgrader.api import Gradebook

    from autograder import classroom
    _, config = api()
    classroom.prepare_gradebook(class_folder(config), [assignment])
    due = datetime.datetime.fromisoformat(when)
    if due.tzinfo is not None:
        due = due.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        gradebook.update_or_create_assignment(assignment, duedate=due)
    return due


def release_feedback(assignment):
    """Release the feedback `make grade` wrote for `assignment` to the students who handed it in.
    Returns ({student: (feedback files released, seconds late by the gradebook's due date)}, [a line for
    each student who handed it in and gets nothing, saying why])."""
    nbgrader, config = api()
    feedback_root = pathlib.Path(config.CourseDirectory.feedback_directory)
    submitted_root = pathlib.Path(config.CourseDirectory.submitted_directory)
    released, missing = {}, []
    for handed_in in sorted(submitted_root.glob(f"*/{assignment}")):
        student = handed_in.parent.name
        folder = feedback_root / student / assignment
        if not all((handed_in / name).exists() for name in SUBMISSION_FILES):
            continue  # not collected from this hub's exchange (a zip, a folder): nothing to release to
        if not list(folder.glob("*.html")):
            missing.append(f"{student}: no feedback page in {folder} (was the collected hand-in graded? "
                           f"`make grade SUBMISSIONS={submitted_root} GRADE_DIR={class_folder(config)}`)")
            continue
        for name in SUBMISSION_FILES:
            shutil.copyfile(handed_in / name, folder / name)
        released[student] = sorted(p.name for p in folder.glob("*.html"))
    if released:
        result = nbgrader.release_feedback(assignment)
        if not result["success"]:
            raise RuntimeError(f"nbgrader release_feedback {assignment} failed:\n{result.get('log', '')}\n"
                               f"{result.get('error', '')}")
    for student in list(released):   # what arrived where the student fetches it, not what was meant to
        if not all(exchange_feedback(config, student, assignment, html).is_file() for html in released[student]):
            del released[student]
            missing.append(f"{student}: their feedback folder in the exchange is missing or not yours to write "
                           "(add them to the class: `python -m autograder.hub setup` with the roster, as root)")
    late = {student: seconds for student, _, seconds in late_report(assignment, config)}
    return {student: (files, late.get(student, 0.0)) for student, files in released.items()}, missing


def exchange_feedback(config, student, assignment, html_name):
    """Where a student fetches the feedback page `html_name` of their collected hand-in (exchange.py)."""
    from nbgrader.utils import notebook_hash

    from autograder.hub.exchange import course_folders
    secret = (pathlib.Path(config.CourseDirectory.submitted_directory) / student / assignment
              / "submission_secret.txt").read_text()
    _, _, feedback = course_folders(config.Exchange.root, config.CourseDirectory.course_id)
    return feedback / student / f"{notebook_hash(secret=secret, notebook_id=pathlib.Path(html_name).stem)}.html"


def late_report(assignment, config):
    """(student, timestamp, seconds late) of each graded submission, from the class gradebook."""
    from nbgrader.api import Gradebook, MissingEntry
    rows = []
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        with contextlib.suppress(MissingEntry):
            for submission in gradebook.find_assignment(assignment).submissions:
                rows.append((submission.student.id, submission.timestamp, submission.total_seconds_late))
    return sorted(rows)
