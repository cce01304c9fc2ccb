"""Class grading on a real Dask cluster: `dask scheduler` and `dask worker` as separate processes on
127.0.0.1 (autograder/cluster.py), faults included.

- the demo class graded through `--scheduler`, one worker killed mid-task: each notebook merged once (what
  each student got, and that it equals grading in one process, is checked in test_classroom.py);
- a worker with another version of the course is refused by name, with the difference;
- a notebook whose workers keep dying becomes that student's error after a bounded number of tries;
- a scheduler that goes away ends the run with a clear message and a resumable ledger.
Every process is started in a process group of its own and stopped by the fixtures, even on failure.
"""
import gc
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
from autograder.tests.test_classroom import (  # noqa: F401  (graded_demo: a fixture)
    TIMEOUT, class_of, grade_command, graded_demo, kill_worker, worker_running)

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


def ledger_lines(root):
    path = pathlib.Path(root) / classroom.LEDGER
    return path.read_text().splitlines() if path.exists() else []


def test_the_demo_class_graded_through_a_scheduler_survives_a_killed_worker(graded_demo):  # noqa: F811
    """The demo class is graded through `--scheduler` with a worker killed mid-task (test_classroom's
    graded_demo, whose students' grades the tests there check): the run ends well, and every notebook is
    merged exactly once, the killed one included, with the worker that graded it."""
    root, run, ledger = graded_demo
    assert run["killed"], f"no worker was killed mid-task:\n{run['output']}"
    assert run["returncode"] == 0, (
        f"grading through the scheduler failed after a worker was killed:\n{run['output']}"
        + ("\n(the course's files changed during the run, and the restarted worker was rightly refused: "
           "run this test where nobody edits solutions/, autograder/ or courselib/ meanwhile)"
           if "another version of the course" in run["output"] else ""))
    lines = ledger_lines(root)
    graded = [(json.loads(line)["student"], json.loads(line)["assignment"]) for line in lines]
    notebooks = sum(1 for p in (demo.DEMO_CLASS_DIR / "submitted").glob("*/*") if p.is_dir())
    assert len(lines) == len(ledger.entries) == notebooks, (
        f"{len(lines)} ledger lines for {len(ledger.entries)} notebooks of {notebooks}: a notebook was merged "
        f"twice or never ({sorted(graded)})")
    killed_student, killed_assignment = run["killed"][1].split("-")[1], run["killed"][1].split("-")[2]
    assert (killed_student, killed_assignment) in ledger.entries, f"the killed task {run['killed'][1]} was never graded"
    assert ledger.entries[(killed_student, killed_assignment)]["worker"], "the ledger does not say who graded it"
    distributed = classroom.exercise_scores(root, assignment_ids())
    assert len(distributed) == len(set(distributed)), "a test appears twice in the gradebook"


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


def refused(address, errors, **options):
    """A Client to `address` must fail with one of `errors`. distributed's Client.__del__ takes a lock
    (LoopRunner's, one for the whole process) that a new Client holds while it starts: were the half-made
    client collected there, the test would hang. So it is collected here, and the collector is off while
    the client starts."""
    from distributed import Client
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(errors):
            Client(address, timeout=5, set_as_default=False, **options)
    finally:
        gc.enable()
        gc.collect()


def test_the_local_cluster_lets_no_one_else_run_code_as_the_grader():
    """A LocalCluster listens on 127.0.0.1, where every user of the machine can connect: without the
    cluster's own TLS certificates, a client cannot (it would run code as the grader, outside the sandbox)."""
    from distributed.security import Security
    with cluster.Dask(jobs=1, quiet=True) as engine:
        assert engine.address.startswith("tls://"), engine.address
        refused(engine.address.replace("tls://", "tcp://"), (OSError, TimeoutError))
        refused(engine.address, (OSError, TimeoutError, TypeError))  # TLS without certificates: refused at once
        # certificates of one's own: the cluster's CA refuses them
        refused(engine.address, (OSError, TimeoutError), security=Security.temporary())


def test_the_local_clusters_http_server_tells_nobody_anything():
    """`make grade JOBS=N`'s LocalCluster: its scheduler's HTTP server listens on loopback only and answers
    nothing (cluster.NO_HTTP_ROUTES). Control: Dask's default routes, on a cluster of the same settings,
    give anyone on the machine the workers' addresses and scratch folders (/json/identity.json)."""
    import urllib.error
    import urllib.request

    import dask
    from distributed import LocalCluster

    def identity(cluster_):
        address = cluster_.scheduler.http_server._sockets
        host, port = next(iter(address.values())).getsockname()[:2]
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/json/identity.json", timeout=10) as reply:
                return host, reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return host, error.code, b""

    with cluster.Dask(jobs=1, quiet=True) as engine:
        host, status, body = identity(engine.cluster)
    assert host == "127.0.0.1", f"the grader's cluster serves HTTP on {host}, beyond this machine"
    assert status == 404 and b"workers" not in body, f"the grader's cluster answers /json/identity.json ({status})"
    with dask.config.set({"distributed.scheduler.http.routes": dask.config.get("distributed.scheduler.http.routes")}):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tcp",
                          dashboard_address="127.0.0.1:0") as control:
            _, status, body = identity(control)
    assert status == 200 and b"workers" in body, f"control: Dask's own routes should answer ({status})"
