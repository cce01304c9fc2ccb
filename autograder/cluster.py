"""Class grading's engine: one task per student × notebook, run in this process or on Dask workers.

`python -m autograder grade` (autograder/classroom.py) takes hand-ins in, then hands this module one
`Task` per notebook and merges what comes back. The task carries the hand-in's bytes, the course
folder's key for the hidden tests and the course's identity; it returns the grades as data (the
gradebook rows, the autograded notebook, the feedback HTML, the log), so a worker needs the course
code but no filesystem shared with the client. The client stays the gradebook's only writer.

Engines, one code path:
- `Serial`: the tasks one after the other in this process (`--jobs 1`);
- `Dask`: a `distributed.LocalCluster` of N single-threaded worker processes (`--jobs N`) or an
  existing cluster (`--scheduler tcp://host:8786` or DASK_SCHEDULER_ADDRESS: `dask scheduler` /
  `dask worker`, dask-jobqueue, the Dask Kubernetes operator). Workers are long-lived: torch and
  nbgrader are imported once per worker, not once per notebook.

Before the first task every worker reports its course identity (digests of solutions/, autograder/
but its tests/, demo_class/ and work/, courselib/; the versions of the packages pinned in
environment.yml; Python's version) and whether it can sandbox kernels; a worker that differs from
this machine is refused (`CourseMismatch`, naming it and the files or versions that differ), and
every task checks again on its worker, for workers that join later. A worker that dies mid-task loses
nothing: the scheduler runs the task elsewhere. A task whose workers die again and again (more than
ALLOWED_WORKER_DEATHS times: the scheduler's `distributed.scheduler.allowed-failures`) becomes that
notebook's error. A scheduler that goes away ends the run with `SchedulerLost`.
"""
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import nbformat

from autograder.config import REPO_ROOT, nbgrader_config

COURSE_FOLDERS = ("solutions", "autograder", "courselib")
# Not read by grading: its state (autograder/work/), the test suite and the demo class, caches.
SKIPPED = {("autograder", "work"), ("autograder", "tests"), ("autograder", "demo_class")}
SKIPPED_NAMES = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
# A task is given up after this many of its workers died while running it (so it is tried one more
# time than this). LocalCluster gets it here; an external scheduler needs it in its own configuration:
# DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=2 (Dask's default is 3).
ALLOWED_WORKER_DEATHS = 2
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
MAX_LOG_CHARS = 50_000


class CourseMismatch(RuntimeError):
    """A worker has another version of the course (code, tests, packages) than this machine."""


# A LocalCluster's scheduler and workers serve HTTP whatever the dashboard setting; its routes would tell
# anyone on the machine the workers' addresses, scratch folders and logs (/json/identity.json,
# /info/main/logs.html), and Dask asks nobody who they are. The grader's cluster serves none of them.
NO_HTTP_ROUTES = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


class SchedulerLost(RuntimeError):
    """The Dask scheduler went away in the middle of the run."""


# ------------------------------------------------------------------------------ the course's identity
def course_manifest(root=REPO_ROOT):
    """{path: sha256[:16]} of every file of the course folders that grading reads."""
    root = pathlib.Path(root)
    files = {}
    for folder in COURSE_FOLDERS:
        for directory, subfolders, names in os.walk(root / folder):
            relative = pathlib.Path(directory).relative_to(root)
            subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_NAMES
                                   and (*relative.parts, d) not in SKIPPED)
            for name in sorted(names):
                if name.endswith(".pyc"):
                    continue
                path = pathlib.Path(directory) / name
                files[(relative / name).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return files


def pinned_packages():
    """The names of the packages pinned in environment.yml (via tools/pins.py, the one parser)."""
    spec = importlib.util.spec_from_file_location("course_pins", REPO_ROOT / "tools" / "pins.py")
    pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pins)
    text = (REPO_ROOT / "environment.yml").read_text()
    return sorted(requirement.split("==")[0].strip() for requirement in pins.pip_requirements(text))


def course_identity(packages, manifest=None):
    """What a process grades with: the course folders' files (`manifest`) and their digests, the
    installed versions of `packages`, Python's version; `digest` sums them up."""
    manifest = course_manifest() if manifest is None else manifest
    folders = {folder: _digest({p: h for p, h in manifest.items() if p.startswith(folder + "/")})
               for folder in COURSE_FOLDERS}
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    identity = {"folders": folders, "packages": versions, "python": platform.python_version()}
    return {**identity, "digest": _digest(identity), "manifest": manifest,
            "host": socket.gethostname(), "pid": os.getpid()}


_IDENTITY = {}  # this process's identity, taken once: by prepare_worker, else at its first task


def worker_identity(packages, fresh=False):
    key = tuple(packages)
    if fresh or key not in _IDENTITY:
        _IDENTITY[key] = course_identity(packages)
    return _IDENTITY[key]


def _digest(data):
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def prepare_worker(packages):
    """Run once on every worker before the first task: import what grading needs (torch alone takes
    about 2 s), then report the worker's course identity and whether it can sandbox kernels."""
    import nbconvert.exporters  # noqa: F401  feedback HTML
    import nbgrader.apps  # noqa: F401
    import torch  # noqa: F401  the judges' oracles

    import autograder.execute  # noqa: F401
    from autograder import sandbox
    return {**worker_identity(packages, fresh=True), "sandbox": sandbox.available()}


def differences(mine, theirs):
    """Lines saying how a worker's identity (`theirs`) differs from this machine's (`mine`)."""
    lines = []
    for folder in COURSE_FOLDERS:
        if mine["folders"][folder] == theirs["folders"].get(folder):
            continue
        here = {p: h for p, h in mine["manifest"].items() if p.startswith(folder + "/")}
        there = {p: h for p, h in theirs["manifest"].items() if p.startswith(folder + "/")}
        paths = sorted(p for p in here.keys() | there.keys() if here.get(p) != there.get(p))
        described = [f"{p} ({'changed' if p in here and p in there else 'only here' if p in here else 'only there'})"
                     for p in paths[:8]]
        lines.append(f"{folder}/ differs: " + ", ".join(described)
                     + (f" and {len(paths) - 8} more files" if len(paths) > 8 else ""))
    for name in sorted(mine["packages"].keys() | theirs["packages"].keys()):
        if mine["packages"].get(name) != theirs["packages"].get(name):
            lines.append(f"package {name}: {mine['packages'].get(name) or 'not installed'} here, "
                         f"{theirs['packages'].get(name) or 'not installed'} there")
    if mine["python"] != theirs["python"]:
        lines.append(f"Python {mine['python']} here, {theirs['python']} there")
    return lines


# ------------------------------------------------------------------------------------------ a task
@dataclasses.dataclass
class Task:
    """One student's notebook to grade, with everything the worker needs."""
    student: str
    assignment: str
    folder: str            # the hand-in, on the client: read into `files` just before the task is sent
    run_key: str           # the course folder's key for the hidden tests (autograder/judging.py)
    cell_timeout: int
    sandbox: str           # GuardedExecute.sandbox: "required" (course default), "preferred" or "off"
    identity: str          # the client's course identity digest
    packages: list
    expected_seconds: float = 0.0
    files: dict = None     # path inside the hand-in folder -> bytes
    tests: str = "full"    # "visible": the visible tests only (the hub's feedback service, autograder/hub/service.py)

    @property
    def name(self):
        return f"{self.student}/{self.assignment}"

    def with_files(self):
        """This task with its hand-in's bytes (read at the last moment: a class of thousands never
        sits in the client's memory at once)."""
        if self.files is not None:
            return self
        folder = pathlib.Path(self.folder)
        files = {p.relative_to(folder).as_posix(): p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else {}
        return dataclasses.replace(self, files=files)


_ONE_AT_A_TIME = threading.Lock()  # environment and stderr are per process: a worker with more threads waits


def grade_task(task):
    """Grade one notebook in a throw-away nbgrader course; return the grades as data.

    Runs on a worker (or in the client with the Serial engine). Raises CourseMismatch on a worker
    whose course differs from the client's (a worker that joined after the check); a bad submission
    never raises (its error is data)."""
    identity = worker_identity(task.packages)
    for _ in range(3):  # a worker that joined late, or a file being saved right now: look again
        if identity["digest"] == task.identity:
            break
        time.sleep(1)
        identity = worker_identity(task.packages, fresh=True)
    else:
        raise CourseMismatch(f"worker {_worker_name()} on {identity['host']} has another version of the "
                             f"course (identity {identity['digest']}, the client's is {task.identity}); "
                             "it must not grade")
    with _ONE_AT_A_TIME, tempfile.TemporaryDirectory(prefix="grade-", dir=_scratch_folder()) as tmp:
        return _grade(task, pathlib.Path(tmp))


def _grade(task, work):
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    from autograder import grading
    from autograder.judging import RUN_KEY_ENV

    config = nbgrader_config(root=work, release=work / "release", work=work)
    config.Execute.timeout = int(task.cell_timeout)
    config.GuardedExecute.sandbox = task.sandbox
    config.NbGraderAPI.log_level = logging.ERROR
    api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    shutil.copyfile(grading.generated_gradebook(task.assignment, visible_only=task.tests == "visible"),
                    work / "gradebook.db")
    folder = work / "submitted" / task.student / task.assignment
    folder.mkdir(parents=True)
    for relative, data in task.files.items():
        target = (folder / relative).resolve()
        if folder.resolve() not in target.parents:
            raise ValueError(f"{task.name}: file name {relative!r} leaves the hand-in folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    start = time.perf_counter()
    log_path = work / "grading.log"
    with grading.kernel_stderr_to(log_path) as log, \
            grading.environment({**grading.kernel_environment(config), RUN_KEY_ENV: task.run_key}):
        result = api.autograde(task.assignment, task.student)
        log_text = log.read_text()
    seconds = round(time.perf_counter() - start, 2)
    error = None if result["success"] else grading.autograde_error(result, log_text)

    submission = None
    with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gradebook:
        # optional stretch tests as extra credit before anything reads the grades: the feedback's total
        # and the rows sent back count the required points only
        grading.stretch_as_extra_credit(gradebook, task.assignment, task.student)
        with contextlib.suppress(MissingEntry):
            submission = submission_rows(gradebook.find_submission(task.assignment, task.student))

    autograded = work / "autograded" / task.student / task.assignment
    feedback = work / "feedback" / task.student / task.assignment
    if list(autograded.glob("*.ipynb")):  # what nbgrader's feedback shows, failures included
        with contextlib.redirect_stdout(None), grading.kernel_stderr_to(work / "feedback.log"), \
                contextlib.suppress(Exception):  # no HTML: the client's outputs step tries again
            api.generate_feedback(task.assignment, task.student)
    graded = sorted(autograded.glob("*.ipynb"))
    findings = grading.graded_findings(nbformat.read(graded[0], as_version=4)) if graded else []
    return {"student": task.student, "assignment": task.assignment, "seconds": seconds, "error": error,
            "submission": submission, "findings": findings,
            "autograded": {p.name: p.read_bytes() for p in sorted(autograded.glob("*.ipynb"))},
            "feedback": {p.name: p.read_bytes() for p in sorted(feedback.glob("*.html"))},
            "log": log_text[-MAX_LOG_CHARS:], "worker": f"{_worker_name()} ({socket.gethostname()})"}


def submission_rows(submission):
    """A gradebook submission as plain data: what `merge_submission` writes into another gradebook."""
    return {"timestamp": submission.timestamp.isoformat() if submission.timestamp else None,
            "notebooks": [{"name": nb.name, "flagged": nb.flagged,
                           "late_submission_penalty": nb.late_submission_penalty,
                           "grades": {g.name: {f: getattr(g, f) for f in
                                               ("auto_score", "manual_score", "extra_credit", "needs_manual_grade")}
                                      for g in nb.grades},
                           "comments": {c.name: {"auto_comment": c.auto_comment, "manual_comment": c.manual_comment}
                                        for c in nb.comments}}
                          for nb in submission.notebooks]}


def _scratch_folder():
    """A Dask worker's own folder (the next worker purges it if this one is killed), else the temp folder."""
    with contextlib.suppress(ImportError, ValueError):
        from distributed import get_worker
        return get_worker().local_directory
    return None


def _worker_name():
    with contextlib.suppress(ImportError, ValueError):
        from distributed import get_worker
        return get_worker().address
    return f"pid {os.getpid()}"


# ----------------------------------------------------------------------------------------- engines
@dataclasses.dataclass
class Outcome:
    """What became of a task: its result (grade_task's dict) or the reason it has none."""
    task: Task
    result: dict = None
    error: str = None


class Serial:
    """The tasks one after the other, in this process."""
    description = "serially in this process"
    dashboard = None

    def __init__(self, quiet=False):
        self.quiet = quiet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def check_workers(self, packages, sandbox_mode):
        """The course identity that tasks carry (this process is the only worker; grade_class
        checked its sandbox)."""
        return course_identity(packages)

    def run(self, tasks):
        for task in tasks:
            try:
                yield Outcome(task, result=grade_task(task.with_files()))
            except CourseMismatch:
                raise
            except Exception as error:  # the grader itself failed on this notebook: it scores 0, the class goes on
                yield Outcome(task, error=f"grading failed ({type(error).__name__}: {error})")


class Dask:
    """Tasks on Dask workers: a LocalCluster of `jobs` single-threaded processes, or `scheduler`."""

    def __init__(self, jobs=2, scheduler=None, quiet=False, connect_timeout=30):
        self.jobs, self.scheduler, self.quiet = jobs, scheduler, quiet
        self.connect_timeout = connect_timeout
        self.cluster = self.client = self.scratch = None
        self.description = self.dashboard = None

    def __enter__(self):
        import dask
        from distributed import Client, LocalCluster
        try:
            if self.scheduler:
                self.client = Client(self.scheduler, timeout=self.connect_timeout, set_as_default=False)
                self.address = self.scheduler
            else:
                self.scratch = tempfile.mkdtemp(prefix="dask-")
                with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_WORKER_DEATHS,
                                      "temporary-directory": self.scratch,  # nannies' locks too
                                      **NO_HTTP_ROUTES}):
                    self.cluster = LocalCluster(local_directory=self.scratch,
                        n_workers=self.jobs, threads_per_worker=1, processes=True,
                        # TLS with certificates made for this cluster only: Dask asks no one who connects,
                        # and another user of the machine could otherwise run code as the grader
                        security=True,
                        # its HTTP server on loopback, a free port, and answering nothing (NO_HTTP_ROUTES)
                        host="127.0.0.1", dashboard_address="127.0.0.1:0", worker_dashboard_address=None,
                        memory_limit=0,  # each grading kernel has its own cap (autograder/kernel.py)
                        silence_logs=logging.ERROR)
                self.client = Client(self.cluster, set_as_default=False)
                self.address = self.cluster.scheduler_address
        except OSError as error:
            self.__exit__(None, None, None)
            if not self.scheduler:
                raise
            raise SchedulerLost(f"cannot reach the Dask scheduler at {self.scheduler}: {error}") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        services = self.client.scheduler_info().get("services", {})
        if "dashboard" in services and self.client.run_on_scheduler(_has_bokeh):
            self.dashboard = self.client.dashboard_link
        where = f"the scheduler at {self.scheduler}" if self.scheduler else f"a LocalCluster ({self.jobs} processes)"
        self.description = f"on Dask workers of {where}"
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(Exception):
            if self.client is not None:
                self.client.close(timeout=10)
        with contextlib.suppress(Exception):
            if self.cluster is not None:
                self.cluster.close(timeout=30)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return False

    def check_workers(self, packages, sandbox_mode, wait_seconds=60, attempts=2):
        """Every worker's course identity against this machine's, and its sandbox when grading
        requires one: refuse the run, before any task, if a worker differs. Returns the identity
        that the tasks carry. (A difference is looked at twice, a few seconds apart: a file saved
        while the workers were asked is not a different course.)"""
        try:
            self.client.wait_for_workers(1, timeout=wait_seconds)
        except TimeoutError:
            raise SchedulerLost(f"no Dask worker joined the scheduler at {self.address} within "
                                f"{wait_seconds} s: start some (`dask worker {self.address} --nthreads 1`)") from None
        for attempt in range(attempts):
            identity = course_identity(packages)
            reports = self.client.run(prepare_worker, packages)
            if all(theirs["digest"] == identity["digest"] for theirs in reports.values()):
                break
            time.sleep(3)
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        refused = []
        for address, theirs in sorted(reports.items()):
            if theirs["digest"] == identity["digest"]:
                continue
            name = str(workers.get(address, {}).get("name", ""))
            refused.append(f"worker {address}" + (f" ({name})" if name not in ("", address) else "")
                           + f" on {theirs['host']}:\n"
                           + "".join(f"    {line}\n" for line in differences(identity, theirs)))
        unsandboxed = [f"worker {address} on {theirs['host']}: {theirs['sandbox'][1]}"
                       for address, theirs in sorted(reports.items()) if not theirs["sandbox"][0]]
        if sandbox_mode == "required" and unsandboxed:
            from autograder.sandbox import SandboxUnavailableError
            raise SandboxUnavailableError(
                f"refused: {len(unsandboxed)} of {len(reports)} Dask workers cannot run grading kernels in the "
                "OS sandbox, so nothing was graded:\n" + "".join(f"  {line}\n" for line in unsandboxed)
                + "Fix those machines or stop their workers (or grade with --unsandboxed).")
        if refused:
            raise CourseMismatch(
                f"refused: {len(refused)} of {len(reports)} Dask workers have another version of the course "
                f"than this machine ({socket.gethostname()}), so nothing was graded: no student may be "
                "graded against other tests.\n" + "".join(f"  {r}" for r in refused)
                + "Give every worker the course at the same commit and run `make env` there, or stop it; "
                  "then run the same command again.")
        nthreads = self.client.nthreads()
        if not self.quiet and any(n > 1 for n in nthreads.values()):
            print("note: some workers have more than one thread; each grades one notebook at a time "
                  "(start them with `dask worker --nthreads 1`, and more processes with --nworkers)",
                  file=sys.stderr)
        self.workers = len(reports)
        return identity

    def run(self, tasks):
        """Yield an Outcome per task as tasks finish, submitting longest first, a bounded number at a
        time (the scheduler never holds the whole class's bytes)."""
        from distributed import as_completed
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker

        queue = list(tasks)
        window = max(16, 4 * sum(self.client.nthreads().values()))
        by_key = {}
        completed = as_completed(loop=self.client.loop)

        def submit_next():
            if not queue:
                return
            task = queue.pop(0)
            key = f"grade-{task.student}-{task.assignment}-{uuid.uuid4().hex[:8]}"
            try:
                future = self.client.submit(grade_task, task.with_files(), key=key, pure=False, retries=0,
                                            priority=int(task.expected_seconds * 10))
            except Exception as error:
                raise self._lost(error) from None
            by_key[future.key] = task
            completed.add(future)

        for _ in range(window):
            submit_next()
        for future in completed:
            task = by_key.pop(future.key)
            try:
                outcome = Outcome(task, result=future.result())
            except CourseMismatch as error:
                raise CourseMismatch(
                    f"{error}. A worker that joined during the run (or was restarted) found another course "
                    "than the one checked at the start: files changed on its machine or on this one while "
                    "grading. The notebooks merged so far are in the ledger; make every checkout the same "
                    "and run the same command again.") from None
            except KilledWorker as error:
                outcome = Outcome(task, error=(
                    f"grading this notebook stopped {error.allowed_failures + 1} Dask workers in a row (each "
                    f"died while running it, the last {error.last_worker.address}); given up"))
            except Exception as error:
                # the task itself raised (its status says so): that notebook's error, whatever the exception's
                # type (a PermissionError on the worker is not a lost scheduler); anything else is the connection
                if future.status != "error" or self.client.status != "running" or isinstance(
                        error, FutureCancelledError):
                    raise self._lost(error) from None
                outcome = Outcome(task, error=f"grading failed on a worker ({type(error).__name__}: {error})")
            future.release()
            yield outcome
            submit_next()

    def _lost(self, error):
        reason = getattr(error, "reason", None) or f"{type(error).__name__}: {error}"
        return SchedulerLost(f"lost the Dask scheduler at {self.address} ({reason})")


def _has_bokeh():
    return importlib.util.find_spec("bokeh") is not None


# ------------------------------------------------------------- a cluster of separate local processes
@dataclasses.dataclass
class LocalProcesses:
    """`dask scheduler` and `dask worker` processes on 127.0.0.1 (see `processes_on_localhost`)."""
    address: str
    folder: pathlib.Path
    processes: dict = dataclasses.field(default_factory=dict)  # name -> Popen

    def add_worker(self, name, cwd=None, env=None):
        """Start `dask worker` (a nanny and its worker process) as a process group of its own."""
        local = self.folder / name
        local.mkdir()
        command = [_dask_command(), "worker", self.address, "--nthreads", "1", "--nworkers", "1",
                   "--name", name, "--local-directory", str(local), "--no-dashboard", "--death-timeout", "60"]
        self.processes[name] = _start(command, self.folder / f"{name}.log", cwd=cwd,
                                      env={**_local_env(self.folder), **(env or {})})
        return self.processes[name]

    def wait_for_workers(self, count, timeout=120):
        from distributed import Client
        with Client(self.address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(count, timeout=timeout)

    def log(self, name):
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, name, sig=signal.SIGTERM):
        process = self.processes.pop(name, None)
        if process is not None:
            _stop(process, sig)


@contextlib.contextmanager
def processes_on_localhost(workers=2, allowed_failures=ALLOWED_WORKER_DEATHS):
    """A Dask cluster as separate processes on 127.0.0.1: `dask scheduler` and `workers` times
    `dask worker --nthreads 1`, each in its own process group, all stopped on exit (even when the
    body fails), and their folder (logs, worker scratch, kernel sockets) removed."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="dask-"))  # short: kernels' Unix socket paths live under it
    scheduler_file = folder / "scheduler.json"
    cluster = None
    scheduler = _start([_dask_command(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                        "--scheduler-file", str(scheduler_file), "--no-dashboard"],
                       folder / "scheduler.log",
                       env={**_local_env(folder),
                            "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures)})
    try:
        deadline = time.monotonic() + 120
        while not scheduler_file.exists() and time.monotonic() < deadline:
            if scheduler.poll() is not None:
                raise RuntimeError(f"`dask scheduler` exited: {(folder / 'scheduler.log').read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written whole just after it appears
        cluster = LocalProcesses(json.loads(scheduler_file.read_text())["address"], folder,
                                 {"scheduler": scheduler})
        for index in range(workers):
            cluster.add_worker(f"worker-{index}")
        if workers:
            cluster.wait_for_workers(workers)
        yield cluster
    finally:
        for process in reversed(list(cluster.processes.values()) if cluster else [scheduler]):
            _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _dask_command():
    return str(pathlib.Path(sys.executable).parent / "dask")


def _local_env(folder):
    # Workers' temp files (kernel socket folders included) go under `folder`, removed with it.
    return {**os.environ, "TMPDIR": str(folder), "PYTHONDONTWRITEBYTECODE": "1"}


def _start(command, log_path, cwd=None, env=None):
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=env, start_new_session=True)


def _stop(process, sig=signal.SIGTERM):
    """Stop a process group: `sig`, then SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def worker_pids(client):
    """{worker address: pid of the worker process} (a nanny's child, not the nanny)."""
    return client.run(os.getpid)
