"""Grading a whole class: the demo class, parallel == serial, resuming, LMS zips, outputs."""
import fcntl
import filecmp
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import nbformat
import pytest
from sqlalchemy import text

from autograder import classroom, cluster, demo
from autograder.grading import grade_cells, is_stretch, max_score, source_notebook, stretch_points
from autograder.judging import RUN_KEY_ENV

TIMEOUT = 10  # seconds per cell: the demo's infinite loop costs this much once
# The demo class (graded once, through a scheduler) and the class it is compared with give cells more
# time, so that a loaded machine never cuts a correct import cell.
DEMO_TIMEOUT = 30
# Students whose cases cover a crash, tampering, damaged cells, partial and noisy work.
SMALL_CLASS = ["ben", "gia", "ivy", "lia", "quy"]


def class_of(students, tmp_path):
    """A copy of some of the demo class's students."""
    folder = tmp_path / "hand-ins" / "submitted"
    for student in students:
        shutil.copytree(demo.DEMO_CLASS_DIR / "submitted" / student, folder / student)
    return folder.parent


def grade_command(hand_ins, root, *options, timeout=TIMEOUT):
    return [sys.executable, "-m", "autograder", "grade", str(hand_ins), "--course-dir", str(root),
            "--timeout", str(timeout), *options]


def worker_running(client, prefix="grade-"):
    """(address, task key) of a worker running a task whose key starts with `prefix`, or None. Running,
    as the worker says, not only assigned to it, as the scheduler says: the scheduler may still move an
    assigned task to an idle worker (work stealing), and a worker killed then did not die running it."""
    # local, so sent by value: a worker imports nothing to run it (an import beside its task's can race it)
    def executing(dask_worker):
        return [str(task.key) for task in dask_worker.state.executing]
    for address, keys in client.run(executing, on_error="ignore").items():
        for key in keys:
            if key.startswith(prefix):
                return address, key
    return None


def kill_worker(client, address):
    """SIGKILL the worker process (not its nanny, which starts a new one)."""
    pid = cluster.worker_pids(client)[address]
    os.kill(pid, signal.SIGKILL)
    return pid


def grade_through_a_scheduler_killing_a_worker(hand_ins, root, log_path, timeout, env=None):
    """`python -m autograder grade --scheduler` on a scheduler and two `dask worker` processes, as a large
    class is graded, with one worker SIGKILLed once it has been busy with one notebook for 10 s.
    Returns {"returncode", "killed": [worker, task key] or None, "output": the end of the log}."""
    from distributed import Client
    with cluster.processes_on_localhost(workers=2) as processes:
        with open(log_path, "w") as log:
            grader = subprocess.Popen(grade_command(hand_ins, root, "--scheduler", processes.address, timeout=timeout),
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            killed, busy_since = None, {}
            with Client(processes.address, timeout=30, set_as_default=False) as client:
                deadline = time.monotonic() + 900
                while killed is None and grader.poll() is None and time.monotonic() < deadline:
                    busy = worker_running(client)
                    if busy:  # mid-task: the same task on the same worker for 10 s (its kernel is running)
                        since = busy_since.setdefault(busy, time.monotonic())
                        if time.monotonic() - since > 10:
                            kill_worker(client, busy[0])
                            killed = list(busy)
                    time.sleep(0.3)
            returncode = grader.wait(timeout=1800)
        finally:
            if grader.poll() is None:
                os.killpg(grader.pid, signal.SIGKILL)
                grader.wait()
    return {"returncode": returncode, "killed": killed, "output": log_path.read_text()[-4000:]}


@pytest.fixture(scope="module")
def graded_demo(tmp_path_factory):
    """The demo class, graded once per test run as a large class is: through a Dask scheduler and two
    worker processes, one of them killed mid-task (test_cluster.py checks that run; the tests here check
    what every student got, and test_serial_parallel_and_scheduler_grading_agree compares it with grading
    in one process). Shared by the pytest-xdist workers through a lock: the first one that needs it grades.
    Graded under a fresh random key (the suite's fixed one is left out of the grader's environment, so the
    course folder makes its own): ada's hand-ins, the reference answers of every notebook, then meet
    hidden-test inputs no run has seen before, and a correct answer that fails for some keys shows here.
    Returns (course folder, the run: returncode, killed, output and the report, the ledger)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's folder
    root, saved = shared / "demo-class", shared / "demo-class-run.json"
    with open(shared / "demo-class.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            fresh_key = {name: value for name, value in os.environ.items() if name != RUN_KEY_ENV}
            run = grade_through_a_scheduler_killing_a_worker(demo.DEMO_CLASS_DIR, root, shared / "demo-class.log",
                                                             DEMO_TIMEOUT, env=fresh_key)
            report = root / "report.txt"
            run["report"] = report.read_text().rstrip("\n") if report.exists() else ""
            saved.write_text(json.dumps(run))
    return root, json.loads(saved.read_text()), classroom.Ledger(root / classroom.LEDGER)


def demo_key(root):
    """The key the demo class was graded with (its course folder's own)."""
    return (root / classroom.RUN_KEY_FILE).read_text()


def test_committed_demo_class_is_what_the_builder_writes(tmp_path):
    demo.build(tmp_path)
    comparison = filecmp.dircmp(tmp_path / "submitted", demo.DEMO_CLASS_DIR / "submitted")
    stale = []

    def walk(cmp, prefix=""):
        stale.extend(prefix + name for name in cmp.left_only + cmp.right_only + cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{name}/")
    walk(comparison)
    assert not stale, (f"autograder/demo_class is stale ({stale[:5]}): "
                       "run `.venv/bin/python -m autograder.demo` and commit the result")


@pytest.mark.parametrize("student,assignment", sorted(demo.EXPECTED))
def test_demo_student_gets_what_they_deserve(graded_demo, student, assignment):
    root, _, ledger = graded_demo
    outcome, words = demo.EXPECTED[(student, assignment)]
    entry = ledger.entries.get((student, assignment))
    assert entry is not None, f"{student}/{assignment} has no line in the ledger: it was never graded"
    full = max_score(assignment)
    notes = " | ".join(entry["errors"] + entry["flags"])
    key = f"{RUN_KEY_ENV}={demo_key(root)}"  # to grade again with the same inputs
    if outcome == "full":
        assert entry["score"] == full, f"{student}/{assignment}: a correct answer lost points with {key}: {entry}"
        if student == "ada":  # the reference answers, optional stretch ones included
            assert entry["stretch_score"] == stretch_points(assignment), \
                f"ada's optional stretch answers lost points with {key}: {entry}"
            assert not entry["errors"] and not entry["flags"], f"the reference answers raised notes with {key}: {notes}"
    elif outcome == "zero":
        assert entry["score"] == 0, f"{student}/{assignment} should score 0 but got {entry['score']}: {notes}"
    else:
        assert 0 < entry["score"] < full, f"{student}/{assignment} should get partial credit: {entry}"
    if words:
        feedback = root / "feedback" / student / assignment / f"{assignment}.html"
        shown = notes + (feedback.read_text() if feedback.exists() else "")
        assert words in shown, f"{student}/{assignment}: expected '{words}' in the report or feedback: {notes}"


def test_the_demo_class_is_graded_under_a_fresh_key(graded_demo):
    """Not the suite's fixed key (conftest.py), which every other grading here uses: a new one each run."""
    key = demo_key(graded_demo[0])
    assert key != os.environ[RUN_KEY_ENV] and re.fullmatch("[0-9a-f]{64}", key), (
        f"the demo class was graded with {key!r}, not a fresh random key: ada's hand-ins would meet the same "
        "hidden-test inputs every run")


def test_demo_class_report_and_outputs(graded_demo):
    root, summary, ledger = graded_demo
    students = sorted(demo.students())
    report = summary["report"]
    for student in students:
        assert any(line.startswith(student + " ") for line in report.splitlines()), \
            f"no row for {student} in the report:\n{report}"
    for (student, assignment), entry in ledger.entries.items():
        if entry["errors"] or entry["flags"]:
            assert f"{student} {assignment}:" in report, f"{student}'s notes are missing from the report"
    grades = (root / "grades.csv").read_text().splitlines()
    assert grades[0].startswith("assignment,"), "grades.csv is not nbgrader's export"
    exported = {tuple(row.split(",")[:4:3]) for row in grades[1:]}
    assert {(a, s) for s, a in ledger.entries} <= exported, "grades.csv lacks graded students"
    for (student, assignment), entry in ledger.entries.items():
        row = next(r.split(",") for r in grades[1:] if r.split(",")[0] == assignment and r.split(",")[3] == student)
        # nbgrader's export: the optional stretch is extra credit, on top of the required maximum
        assert float(row[9]) == entry["score"] + entry["stretch_score"] and float(row[10]) == max_score(assignment), \
            f"grades.csv disagrees with grading for {student}/{assignment}: {row}"
    html = list((root / "feedback").glob("*/*/*.html"))
    assert len(html) >= sum(1 for e in ledger.entries.values() if not e["errors"]), "feedback HTML is missing"
    assert (root / "score_distribution.png").stat().st_size > 10_000, "the score plot is empty"
    rows = (root / "exercises.csv").read_text().splitlines()
    assert len(rows) > 100 and rows[0] == "student,assignment,exercise,score,max_score"


def test_runaway_output_is_capped_and_memory_bomb_contained(graded_demo):
    root, _, _ = graded_demo
    flooded = root / "autograded" / "kai" / "04_self_attention" / "04_self_attention.ipynb"
    assert flooded.stat().st_size < 2_000_000, f"the flood reached the gradebook's files: {flooded.stat().st_size} bytes"
    bomb = nbformat.read(root / "autograded" / "jon" / "04_self_attention" / "04_self_attention.ipynb", as_version=4)
    errors = [o.get("ename") for c in bomb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert "MemoryError" in errors, f"the memory bomb was not stopped by the kernel's memory cap: {errors}"


def grade_and_time(hand_ins, root, jobs):
    summary = classroom.grade_class(hand_ins, root, jobs=jobs, cell_timeout=DEMO_TIMEOUT, quiet=True)
    return classroom.exercise_scores(root, classroom.assignment_ids()), summary


def test_serial_parallel_and_scheduler_grading_agree(graded_demo, tmp_path, monkeypatch):
    """The same hand-ins graded in this process (JOBS=1), on a Dask LocalCluster of two worker processes
    (JOBS=2), and through a scheduler whose worker was killed mid-task (the demo class): the same score on
    every test cell."""
    hand_ins = class_of(SMALL_CLASS, tmp_path)
    monkeypatch.setenv(RUN_KEY_ENV, demo_key(graded_demo[0]))  # the demo class's inputs
    serial, serial_summary = grade_and_time(hand_ins, tmp_path / "serial", jobs=1)
    parallel, parallel_summary = grade_and_time(hand_ins, tmp_path / "parallel", jobs=2)
    assert serial, "serial grading produced no scores"
    different = sorted(set(serial) ^ set(parallel))
    assert not different, f"JOBS=2 and serial nbgrader autograde disagree on: {different[:6]}"
    through_scheduler = [row for row in classroom.exercise_scores(graded_demo[0], classroom.assignment_ids())
                         if row[0] in SMALL_CLASS]
    different = sorted(set(serial) ^ set(through_scheduler))
    assert not different, f"the scheduler's gradebook and the serial one disagree on: {different[:6]}"
    assert through_scheduler == serial
    record_speed("small class", serial_summary, parallel_summary)


def record_speed(name, serial, parallel):
    artifacts = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    figures = {"class": name, "notebooks": serial["notebooks_graded"],
               "serial_seconds": serial["grading_seconds"], "jobs2_seconds": parallel["grading_seconds"],
               "ratio": round(serial["grading_seconds"] / parallel["grading_seconds"], 2),
               "load_average": os.getloadavg()[0]}
    (artifacts / "grading-speed.json").write_text(json.dumps(figures, indent=2))
    print(figures)


def test_interrupted_grading_resumes_without_regrading(tmp_path):
    hand_ins = class_of(["ben", "gia", "quy", "cleo"], tmp_path)
    root = tmp_path / "course"
    command = [sys.executable, "-m", "autograder", "grade", str(hand_ins), "--course-dir", str(root),
               "--timeout", str(TIMEOUT)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    ledger_path = root / classroom.LEDGER
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None:
        if ledger_path.exists() and ledger_path.read_text().count("\n") >= 2:
            break
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the hardest stop: no clean-up at all
    first.wait()
    done_before = classroom.Ledger(ledger_path).entries
    assert 1 <= len(done_before) < 6, f"the kill came too late to test resuming: {len(done_before)} graded"

    summary = classroom.grade_class(hand_ins, root, jobs=2, cell_timeout=TIMEOUT, quiet=True)
    finished_students = {s for s, _ in done_before
                         if all((s, a) in done_before for s2, a in classroom.Ledger(ledger_path).entries if s2 == s)}
    assert summary["already_graded"] >= len(finished_students), "finished students were graded again"
    assert summary["notebooks_graded"] <= 6 - len(done_before) + 1, "finished notebooks were graded again"
    entries = classroom.Ledger(ledger_path).entries
    assert len(entries) == 6, f"after resuming, {6 - len(entries)} of 6 notebooks are still ungraded"
    for (student, assignment), entry in entries.items():
        outcome, _ = demo.EXPECTED[(student, assignment)]
        score, _, _, _ = classroom.scores_of(root, student, assignment)
        assert score == entry["score"], f"the gradebook and the ledger disagree for {student}/{assignment}"
        assert (score == max_score(assignment)) == (outcome == "full"), f"{student}/{assignment}: {entry}"


def test_a_class_whose_every_notebook_fails_to_grade_still_gets_its_report(tmp_path):
    """No grade at all (here: the only hand-in is not a notebook): the report, the grades and the ledger
    say why, and there is no distribution to draw rather than a crash after grading."""
    folder = tmp_path / "hand-ins" / "submitted" / "una" / "04_self_attention"
    folder.mkdir(parents=True)
    (folder / "04_self_attention.ipynb").write_text("this is not a notebook")
    root = tmp_path / "course"
    (root).mkdir()
    (root / "score_distribution.png").write_bytes(b"a stale picture from an earlier class")
    classroom.grade_class(folder.parents[2], root, cell_timeout=TIMEOUT, quiet=True)
    entry = classroom.Ledger(root / classroom.LEDGER).entries[("una", "04_self_attention")]
    assert entry["score"] == 0 and entry["errors"], entry
    assert "una" in (root / "report.txt").read_text()
    assert (root / "grades.csv").exists() and not (root / "score_distribution.png").exists()


def test_lms_zip_is_taken_in_by_zip_collect(tmp_path):
    """A Canvas-style download: <student>_<ids>_<file name as uploaded>, misnamed files included."""
    archive = tmp_path / "lms-download.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for number, student in enumerate(["ada", "cleo", "dev", "eli"]):
            folder = demo.DEMO_CLASS_DIR / "submitted" / student / "04_self_attention"
            for notebook in folder.glob("*.ipynb"):
                out.write(notebook, f"{student}_{1000 + number}_{2000 + number}_{notebook.name}")
    root = tmp_path / "course"
    classroom.grade_class(archive, root, cell_timeout=TIMEOUT, quiet=True)  # intake is the same for any engine
    assert list((root / "intake" / "downloaded" / "04_self_attention" / "extracted").rglob("*.ipynb")), \
        "zip_collect did not extract the archive"
    entries = classroom.Ledger(root / classroom.LEDGER).entries
    scores = {student: entries[(student, "04_self_attention")]["score"] for student in ["ada", "cleo", "dev", "eli"]}
    assert scores == {"ada": 14, "cleo": 0, "dev": 0, "eli": 14}, f"LMS zip graded wrongly: {scores}"


def test_two_grading_runs_cannot_share_a_course_folder(tmp_path):
    with classroom.course_lock(tmp_path):
        with pytest.raises(classroom.CourseBusy, match="another grading run"):
            with classroom.course_lock(tmp_path):
                pass


def gradebook_contents(root):
    """What a class gradebook knows of the course: every assignment's notebooks, their graded cells with
    their points, their source cells (checksums) and their answer cells."""
    from nbgrader.api import Gradebook
    config = classroom.class_config(root)
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        return {(a.name, nb.name): (sorted((c.name, c.max_score, c.cell_type) for c in nb.grade_cells),
                                    sorted((c.name, c.checksum, c.locked) for c in nb.source_cells),
                                    sorted(c.name for c in nb.solution_cells))
                for a in gradebook.assignments for nb in a.notebooks}


def test_a_new_course_folder_starts_from_the_gradebook_generate_assignment_writes(tmp_path):
    """A new course folder's gradebook is a copy of a template (generating every assignment took about
    7 s of each class grading): the same as generating them there, stretch tests as extra credit."""
    assignments = ["04_self_attention", "03_positional_encoding"]
    generated, copied = tmp_path / "generated", tmp_path / "copied"
    classroom._add_assignments(classroom.class_config(generated), assignments)
    classroom.prepare_gradebook(copied, assignments)
    assert not (copied / "release").exists(), "the course folder's gradebook was generated, not copied"
    contents = gradebook_contents(copied)
    assert contents == gradebook_contents(generated) and len(contents) == 2, contents.keys()
    grade_cells, _, _ = contents[("03_positional_encoding", "03_positional_encoding")]
    stretch = {points for name, points, _ in grade_cells if is_stretch(name)}
    assert stretch == {0}, f"stretch tests should be worth 0 in the class gradebook (extra credit): {stretch}"
    classroom.prepare_gradebook(copied, [*assignments, "01_tokenization"])  # an assignment added later
    assert ("01_tokenization", "01_tokenization") in gradebook_contents(copied)


def test_grade_command_line_help():
    result = subprocess.run([sys.executable, "-m", "autograder", "grade", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--jobs" in result.stdout and "--scheduler" in result.stdout, result.stderr


def test_intake_reports_folders_that_are_not_assignments(tmp_path):
    hand_ins = class_of(["eli"], tmp_path)
    (hand_ins / "submitted" / "eli" / "homework4").mkdir()
    (hand_ins / "submitted" / "eli" / "homework4" / "notes.ipynb").write_text("{}")
    items, strays = classroom.intake(hand_ins, tmp_path / "course", classroom.assignment_ids(), {})
    assert [(i.student, i.assignment) for i in items] == [("eli", "04_self_attention")]
    assert strays == ["eli: folder 'homework4' is not an assignment of this course: not graded"], strays
    assert items[0].flags == ["notebook handed in as 'Copy of my homework.ipynb'; graded as 04_self_attention.ipynb"]


# A classmate who knows exactly where the class is graded (the paths are written into the attack) and
# tries, for 20 s while the victim is graded beside them, every way to reach the victim's grade.
ATTACK_CLASSMATE = '''\
import glob, os, pathlib, sqlite3, time
from ipykernel import get_connection_file
ROOT, HAND_INS, KERNELS = {root!r}, {hand_ins!r}, {kernels!r}
targets = [f"{{ROOT}}/submitted/victim/04_self_attention/04_self_attention.ipynb",
           f"{{ROOT}}/autograded/victim/04_self_attention/04_self_attention.ipynb",
           f"{{HAND_INS}}/submitted/victim/04_self_attention/04_self_attention.ipynb"]
reached = []
deadline = time.time() + 20
while time.time() < deadline:
    for target in targets:                      # rewrite the victim's hand-in or autograded copy
        try:
            pathlib.Path(target).write_text("{{}}")
            reached.append(target)
        except Exception:
            pass
    for db in glob.glob(f"{{ROOT}}/**/*.db", recursive=True):   # lower their grade in the gradebook
        try:
            sqlite3.connect(db).execute("UPDATE grade SET auto_score = 0").connection.commit()
            reached.append(db)
        except Exception:
            pass
    for key in glob.glob(f"{{KERNELS}}*/*/*.json"):   # another kernel's connection key
        if os.path.samefile(key, get_connection_file()):
            continue                            # its own is in reach, and harmless
        try:
            reached.append(key + " " + open(key).read()[:20])
        except Exception:
            pass
    try:                                        # something that outlives this notebook
        if os.fork() == 0:
            time.sleep(10)
            for target in targets:
                pathlib.Path(target).write_text("{{}}")
            os._exit(0)
    except Exception:
        pass
    time.sleep(1)
print("reached:", sorted(set(reached)))
'''


def test_a_hostile_classmate_graded_beside_a_victim_changes_nothing_of_theirs(tmp_path):
    """Class grading with two workers: the victim (reference answers, and a slow cell so that both are
    graded at once) keeps full marks, no flags, their hand-in's bytes and their gradebook rows."""
    from autograder.kernel_manager import private_socket_folder
    from autograder.submissions import student_notebook
    hand_ins, root = tmp_path / "hand-ins", tmp_path / "course"
    victim = hand_ins / "submitted" / "victim" / "04_self_attention" / "04_self_attention.ipynb"
    attacker = hand_ins / "submitted" / "rex" / "04_self_attention" / "04_self_attention.ipynb"
    for path in (victim, attacker):
        path.parent.mkdir(parents=True)
    nbformat.write(demo.with_cell(student_notebook("04_self_attention"), "import time\ntime.sleep(15)"), victim)
    attack = ATTACK_CLASSMATE.format(root=str(root), hand_ins=str(hand_ins), kernels=str(private_socket_folder()))
    nbformat.write(demo.with_cell(student_notebook("04_self_attention"), attack), attacker)
    before = victim.read_bytes()

    classroom.grade_class(hand_ins, root, jobs=2, cell_timeout=TIMEOUT + 20, quiet=True)
    time.sleep(15)  # longer than anything the attacker could have left behind would wait

    entries = classroom.Ledger(root / classroom.LEDGER).entries
    assert entries[("victim", "04_self_attention")]["score"] == 14, entries[("victim", "04_self_attention")]
    assert not entries[("victim", "04_self_attention")]["flags"], entries[("victim", "04_self_attention")]
    assert victim.read_bytes() == before, "the attacker changed the victim's hand-in"
    score, _, findings, _ = classroom.scores_of(root, "victim", "04_self_attention")
    assert score == 14 and not findings, f"the victim's gradebook rows changed: {score}, {findings}"
    graded = root / "autograded" / "victim" / "04_self_attention" / "04_self_attention.ipynb"
    assert nbformat.read(graded, as_version=4).cells, "the victim's autograded notebook was overwritten"
    printed = "".join(o.get("text", "") for c in nbformat.read(
        root / "autograded" / "rex" / "04_self_attention" / "04_self_attention.ipynb", as_version=4).cells
        for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "reached: []" in printed, f"the attacker reached something: {printed[-500:]}"


MERGED = 10_000
MERGE_IN_A_CHILD = """
import sys
from autograder import benchmark, classroom
root = sys.argv[1]
items, ledger = benchmark.synthetic_class(root, {students})
classroom.grade_pending(root, items, ledger, 60, benchmark.SyntheticEngine(), "synthetic", "off", quiet=True)
"""


def test_ten_thousand_results_merge_in_batches_and_a_kill_leaves_the_ledger_exact(tmp_path):
    """10,000 synthetic results (SyntheticEngine: workers that are never the bound) merged by the client in
    batches, killed with SIGKILL mid-run: the gradebook then holds exactly the notebooks of the ledger, each
    whole, ledger.jsonl says the same, and the same call merges the rest. Every score is the one sent."""
    from autograder import benchmark
    root = tmp_path / "course"
    students = MERGED // len(benchmark.MERGE_ASSIGNMENTS)
    child = subprocess.Popen([sys.executable, "-c", MERGE_IN_A_CHILD.format(students=students), str(root)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    mirror = root / classroom.LEDGER
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and child.poll() is None:
        if mirror.exists() and mirror.read_text().count("\n") >= 1000:
            break
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, f"the merge ended before the kill: {child.stderr.read()[-2000:]}"

    ledger = classroom.Ledger(mirror)
    merged = set(ledger.entries)
    assert 1000 <= len(merged) < MERGED, f"the kill came at {len(merged)} merged: too early or too late"
    with classroom.class_gradebook(root) as gradebook:
        rows = gradebook.db.execute(text(
            "SELECT submitted_assignment.student_id, assignment.name, COUNT(grade.id) FROM submitted_assignment "
            "JOIN assignment ON submitted_assignment.assignment_id = assignment.id "
            "JOIN submitted_notebook ON submitted_notebook.assignment_id = submitted_assignment.id "
            "JOIN grade ON grade.notebook_id = submitted_notebook.id GROUP BY submitted_assignment.id")).fetchall()
    in_gradebook = {(student, assignment): count for student, assignment, count in rows}
    assert set(in_gradebook) == merged, (
        f"{len(set(in_gradebook) - merged)} submissions in the gradebook without a ledger entry, "
        f"{len(merged - set(in_gradebook))} ledger entries without a submission")
    cells = {a: len(grade_cells(source_notebook(a))) for a in benchmark.MERGE_ASSIGNMENTS}
    assert all(count == cells[a] for (_, a), count in in_gradebook.items()), "a submission was merged in part"
    lines = [json.loads(line) for line in mirror.read_text().splitlines()]
    assert {(e["student"], e["assignment"]) for e in lines} == merged and len(lines) == len(merged), (
        "ledger.jsonl differs from the ledger in the gradebook")

    items, ledger = benchmark.synthetic_class(root, students)
    pending = [item for item in items if (item.student, item.assignment) not in ledger.done()]
    classroom.grade_pending(root, pending, ledger, 60, benchmark.SyntheticEngine(), "synthetic", "off", quiet=True)
    entries = classroom.Ledger(mirror).entries
    assert len(entries) == MERGED
    points = {a: grade_cells(source_notebook(a)) for a in benchmark.MERGE_ASSIGNMENTS}
    for (student, assignment), entry in entries.items():
        sent = [benchmark.synthetic_score(student, g, p) for g, p in points[assignment]]
        required = sum(s for (g, _), s in zip(points[assignment], sent) if not is_stretch(g))
        assert (entry["score"], entry["stretch_score"]) == (required, sum(sent) - required), (student, assignment)
    assert len(mirror.read_text().splitlines()) == MERGED


def test_the_projection_counts_each_cost_once():
    """The benchmark's projection of a large class: a student's notebooks, times what each costs beyond its
    grading and how much slower grading is beside other workers, shared out over the cores, plus one
    longest notebook; or the client's merges, if those take longer."""
    from autograder import benchmark
    times = {f"0{n}_x": float(n) for n in range(1, 10)}            # 9 assignments measured, 45 s in all
    projected = benchmark.projection(times, overhead=1.1, contention=1.2, merge_seconds=0.0001,
                                     longest_seconds=60, students=1000, notebooks=11, cores=100)
    per_student = 45 + 2 * 9                                        # 2 unmeasured: as dear as the dearest
    assert projected["seconds_per_student_serial"] == per_student, projected
    assert projected["hours"] == round((1000 * per_student * 1.1 * 1.2 / 100 + 60) / 3600, 2), projected
    assert projected["bound_by"] == "workers", projected
    free_starts = benchmark.projection(times, 1.1, 1.2, merge_seconds=0.0001, longest_seconds=60, floor_seconds=1.5,
                                       students=1000, notebooks=11, cores=100)
    assert free_starts["hours"] == projected["hours"], free_starts        # the floor is a what-if, not a cost
    assert free_starts["hours_if_kernel_starts_cost_nothing"] == \
        round((1000 * (per_student - 11 * 1.5) * 1.1 * 1.2 / 100 + 60) / 3600, 2), free_starts
    slow_client = benchmark.projection(times, 1.1, 1.2, merge_seconds=1.0, longest_seconds=60, students=1000,
                                       notebooks=11, cores=100)
    assert slow_client["bound_by"] == "the client's merges" and slow_client["hours"] == round(11_000 / 3600, 2), slow_client


def test_a_feedback_page_nbgrader_cannot_make_is_named_for_the_report(tmp_path, capsys):
    """nbgrader's generate_feedback returns its failure rather than raising it: a hand-in whose page
    cannot be made (malformed widget state in its metadata did that, before safe_html.py) got none,
    and nothing said so. Now the report names it, and the grade stands."""
    assignment = "04_self_attention"
    for student in ("ann", "bob"):
        graded = tmp_path / "autograded" / student / assignment / f"{assignment}.ipynb"
        graded.parent.mkdir(parents=True)
        graded.write_text("{}")

    class NbgraderAPI:
        def generate_feedback(self, assignment, student):
            if student == "bob":
                return {"success": False, "error": "", "log": "KeyError: 'state'"}
            page = tmp_path / "feedback" / student / assignment / f"{assignment}.html"
            page.parent.mkdir(parents=True)
            page.write_text("<html></html>")
            return {"success": True, "error": "", "log": ""}
    missing = classroom.feedback_pages(NbgraderAPI(), tmp_path, ["ann", "bob"], [assignment])
    assert missing == [f"bob {assignment}: no feedback page could be made (see logs/outputs.log); the grade stands"], missing
    assert "KeyError: 'state'" in capsys.readouterr().err, "nbgrader's log of the failure should go to the outputs' log"
