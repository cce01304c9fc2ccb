"""Class grading on a real Dask cluster: `dask scheduler` and `dask worker` as separate processes on
127.0.0.1 (autograder/cluster.py), faults included.

- the demo class graded through `--scheduler`, one worker killed mid-task, equals the serial grading
  test by test, each notebook once;
- a worker with another version of the course is refused by name, with the difference;
- a notebook whose workers keep dying becomes that student's error after a bounded number of tries;
- a scheduler that goes away ends the run with a clear message and a resumable ledger.
Every process is started in a process group of its own and stopped by the fixtures, even on failure.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from autograder import classroom, cluster, demo
from autograder.config import REPO_ROOT, assignment_ids
from autograder.tests.test_classroom import DEMO_TIMEOUT, TIMEOUT, class_of, graded_demo  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not (pathlib.Path(sys.executable).parent / "dask").exists(),
                                reason="the `dask` command is not installed (make env)")


@pytest.fixture
def dask_processes():
    """A scheduler and two workers, separate processes on 127.0.0.1, stopped after the test."""
    with cluster.processes_on_localhost(workers=2) as processes:
        yield processes


@pytest.fixture
def started():
    """Commands started by the test, each in a process group: killed after it, whatever happened."""
    processes = []

    def start(command, log_path):
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(process)
        return process
    yield start
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def grade_command(hand_ins, root, *options, timeout=TIMEOUT):
    return [sys.executable, "-m", "autograder", "grade", str(hand_ins), "--course-dir", str(root),
            "--timeout", str(timeout), *options]


def ledger_lines(root):
    path = pathlib.Path(root) / classroom.LEDGER
    return path.read_text().splitlines() if path.exists() else []


def worker_running(client, prefix="grade-"):
    """(address, task key) of a worker busy with a task whose key starts with `prefix`, or None."""
    for address, keys in client.processing().items():
        for key in keys:
            if str(key).startswith(prefix):
                return address, str(key)
    return None


def kill_worker(client, address):
    """SIGKILL the worker process (not its nanny, which starts a new one)."""
    pid = cluster.worker_pids(client)[address]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_scheduler_and_two_workers_grade_the_demo_class_like_serial_despite_a_killed_worker(
        graded_demo, dask_processes, started, tmp_path):  # noqa: F811
    from distributed import Client
    serial_root, _, _ = graded_demo
    root = tmp_path / "course"
    grader = started(grade_command(demo.DEMO_CLASS_DIR, root, "--scheduler", dask_processes.address,
                                   timeout=DEMO_TIMEOUT), tmp_path / "grade.log")
    killed, busy_since = None, {}
    with Client(dask_processes.address, timeout=30, set_as_default=False) as client:
        deadline = time.monotonic() + 900
        while killed is None and grader.poll() is None and time.monotonic() < deadline:
            busy = worker_running(client)
            if busy:  # mid-task: the same task on the same worker for 10 s (its kernel is running)
                since = busy_since.setdefault(busy, time.monotonic())
                if time.monotonic() - since > 10:
                    kill_worker(client, busy[0])
                    killed = busy
            time.sleep(0.3)
    assert killed, f"no worker was killed mid-task:\n{(tmp_path / 'grade.log').read_text()[-3000:]}"
    returncode = grader.wait(timeout=1800)
    output = (tmp_path / "grade.log").read_text()
    assert returncode == 0, (
        f"grading through the scheduler failed after a worker was killed:\n{output[-4000:]}"
        + ("\n(the course's files changed during the run, and the restarted worker was rightly refused: "
           "run this test where nobody edits solutions/, autograder/ or courselib/ meanwhile)"
           if "another version of the course" in output else ""))

    lines = ledger_lines(root)
    graded = [(json.loads(line)["student"], json.loads(line)["assignment"]) for line in lines]
    entries = classroom.Ledger(root / classroom.LEDGER).entries
    notebooks = sum(1 for p in (demo.DEMO_CLASS_DIR / "submitted").glob("*/*") if p.is_dir())
    assert len(lines) == len(entries) == notebooks, (
        f"{len(lines)} ledger lines for {len(entries)} notebooks of {notebooks}: a notebook was merged "
        f"twice or never ({sorted(graded)})")
    killed_student, killed_assignment = killed[1].split("-")[1], killed[1].split("-")[2]
    assert (killed_student, killed_assignment) in entries, f"the killed task {killed[1]} was never graded"
    assert entries[(killed_student, killed_assignment)]["worker"], "the ledger does not say who graded it"

    serial = classroom.exercise_scores(serial_root, assignment_ids())
    distributed = classroom.exercise_scores(root, assignment_ids())
    assert serial, "the serial grading produced no scores"
    assert len(distributed) == len(set(distributed)), "a test appears twice in the gradebook"
    different = sorted(set(serial) ^ set(distributed))
    cut = sorted({(s, a, f) for ledger in (entries, graded_demo[2].entries) for (s, a), e in ledger.items()
                  for f in e["flags"] if "time limit" in f and s != "hal"})
    assert not different, (f"the scheduler's gradebook and the serial one differ on: {different[:6]}"
                           + (f"\n(cells that ran out of time, on a machine too loaded for DEMO_TIMEOUT: {cut})"
                              if cut else ""))
    assert distributed == serial


def course_copy(target):
    """A checkout of the course next to this one (code, solutions, courselib, pins)."""
    ignore = shutil.ignore_patterns("work", "__pycache__", "*.pyc")
    for folder in cluster.COURSE_FOLDERS + ("tools",):
        shutil.copytree(REPO_ROOT / folder, target / folder, ignore=ignore, symlinks=True)
    shutil.copy(REPO_ROOT / "environment.yml", target / "environment.yml")
    return target


def test_a_worker_with_another_course_is_refused_by_name(tmp_path):
    other = course_copy(tmp_path / "other-checkout")
    check = other / "autograder" / "checks" / "self_attention.py"
    check.write_text(check.read_text() + "\n# a hidden test edited on one machine only\n")
    hand_ins = class_of(["quy"], tmp_path)
    with cluster.processes_on_localhost(workers=1) as processes:
        processes.add_worker("other-checkout", cwd=other, env={"PYTHONPATH": str(other)})
        processes.wait_for_workers(2)
        with pytest.raises(cluster.CourseMismatch) as refused:
            classroom.grade_class(hand_ins, tmp_path / "course", scheduler=processes.address,
                                  cell_timeout=TIMEOUT, quiet=True)
    message = str(refused.value)
    assert "other-checkout" in message and "autograder/checks/self_attention.py (changed)" in message, message
    assert "1 of 2 Dask workers" in message and "worker-0" not in message, message
    assert "nothing was graded" in message, message
    assert not ledger_lines(tmp_path / "course"), "a notebook was graded although a worker was refused"


def test_a_notebook_whose_workers_keep_dying_becomes_its_error(dask_processes, tmp_path):
    """Each time a worker takes zed's notebook, the worker dies (SIGKILL, as the kernel OOM killer
    would): after ALLOWED_WORKER_DEATHS + 1 deaths the scheduler gives it up, and zed gets the error."""
    from distributed import Client
    hand_ins = class_of(["quy"], tmp_path)
    shutil.copytree(hand_ins / "submitted" / "quy", hand_ins / "submitted" / "zed")
    kills, stop = [], threading.Event()

    def killer():
        with Client(dask_processes.address, timeout=30, set_as_default=False) as client:
            while not stop.is_set():
                busy = worker_running(client, "grade-zed-")
                if busy:
                    kills.append(kill_worker(client, busy[0]))
                    time.sleep(1)  # the scheduler notices, the nanny starts a new worker
                time.sleep(0.2)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        classroom.grade_class(hand_ins, tmp_path / "course", scheduler=dask_processes.address,
                              cell_timeout=TIMEOUT, quiet=True)
    finally:
        stop.set()
        thread.join(timeout=60)
    entries = classroom.Ledger(tmp_path / "course" / classroom.LEDGER).entries
    zed = entries[("zed", "04_self_attention")]
    tries = cluster.ALLOWED_WORKER_DEATHS + 1
    assert len(kills) == tries, f"zed's notebook was tried {len(kills)} times, not {tries}"
    assert zed["score"] == 0 and any(f"stopped {tries} Dask workers in a row" in e for e in zed["errors"]), zed
    quy = entries[("quy", "04_self_attention")]
    assert not any("Dask workers" in e for e in quy["errors"]), f"the others did not go on: {quy}"


def test_a_scheduler_that_goes_away_ends_the_run_resumably(started, tmp_path):
    hand_ins = class_of(["ben", "gia", "quy", "cleo"], tmp_path)
    root = tmp_path / "course"
    with cluster.processes_on_localhost(workers=1) as processes:
        grader = started(grade_command(hand_ins, root, "--scheduler", processes.address), tmp_path / "grade.log")
        deadline = time.monotonic() + 600
        while not ledger_lines(root) and grader.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ledger_lines(root), f"nothing was graded:\n{(tmp_path / 'grade.log').read_text()[-3000:]}"
        processes.stop("scheduler", signal.SIGKILL)
        returncode = grader.wait(timeout=300)
    output = (tmp_path / "grade.log").read_text()
    assert returncode == 3, f"exit code {returncode}, not 3 (scheduler lost):\n{output[-3000:]}"
    assert "lost the Dask scheduler" in output and "run the same command again" in output, output[-3000:]
    done = classroom.Ledger(root / classroom.LEDGER).entries
    assert 1 <= len(done) < 6, f"{len(done)} notebooks graded before the scheduler went away"
    graded = {(s, a) for s, a, *_ in classroom.exercise_scores(root, assignment_ids())}
    assert graded <= set(done), f"the gradebook holds notebooks the ledger does not: {graded - set(done)}"
    for (student, assignment), entry in done.items():
        assert classroom.scores_of(root, student, assignment)[0] == entry["score"], (student, assignment)

    summary = classroom.grade_class(hand_ins, root, jobs=1, cell_timeout=TIMEOUT, quiet=True)
    assert summary["notebooks_graded"] == 6 - len(done), "the resumed run did not grade exactly the rest"
    assert len(classroom.Ledger(root / classroom.LEDGER).entries) == 6


def test_the_local_cluster_lets_no_one_else_run_code_as_the_grader():
    """A LocalCluster listens on 127.0.0.1, where every user of the machine can connect: without the
    cluster's own TLS certificates, a client cannot (it would run code as the grader, outside the sandbox)."""
    from distributed import Client
    from distributed.security import Security
    with cluster.Dask(jobs=1, quiet=True) as engine:
        assert engine.address.startswith("tls://"), engine.address
        with pytest.raises((OSError, TimeoutError)):
            Client(engine.address.replace("tls://", "tcp://"), timeout=5, set_as_default=False)
        with pytest.raises((OSError, TimeoutError, TypeError)):  # TLS without certificates: refused at once
            Client(engine.address, timeout=5, set_as_default=False)
        with pytest.raises((OSError, TimeoutError)):  # certificates of one's own: the cluster's CA refuses them
            Client(engine.address, security=Security.temporary(), timeout=5, set_as_default=False)
