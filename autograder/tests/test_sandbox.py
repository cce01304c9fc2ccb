"""The OS sandbox around grading kernels (autograder/sandbox.py), attacked as a determined student would.

Hostile notebooks are graded through the real path (`check_notebook`, with the autograded notebook
captured on its way back so that each attack's outcome can be read). In the main hostile notebook the
guard's file rules are switched off, so that what stops each attack is the sandbox alone; every
notebook also carries the reference answers, which must still score: the sandbox stops the attack
and leaves grading alone. The fallbacks (no bwrap, no namespaces) are proven by pointing the binary
at `false`.
"""
import asyncio
import contextlib
import glob
import json
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

from autograder import classroom, demo, grading, integrity, sandbox
from autograder.config import REPO_ROOT, SOLUTIONS_DIR, nbgrader_config
from autograder.execute import KERNELSPEC_DIR, GuardedExecute
from autograder.judging import RUN_KEY_ENV
from autograder.kernel_manager import SandboxedKernelManager, private_socket_folder
from autograder.submissions import solution_path, student_notebook

# One worker runs the whole module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_sandbox")

A04 = "04_self_attention"
FULL_MARKS = 14.0
SOLUTION = SOLUTIONS_DIR / A04 / f"{A04}.ipynb"
VARIANTS = REPO_ROOT / "autograder" / "tests" / "variants" / "self_attention.py"
LIBRARY_FILE = REPO_ROOT / "courselib" / "testing.py"
TOKEN = secrets.token_hex(4)      # names this run's markers, leftovers and processes
SECRET_ENV = "COURSE_TEST_GRADER_SECRET"

needs_sandbox = pytest.mark.skipif(not sandbox.available()[0],
                                   reason=f"this machine cannot run the sandbox: {sandbox.available()[1]}")

# Prepended to every hostile cell: each attack prints one line, ATTACK {"name", "outcome"}.
HARNESS = """\
import ctypes, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, action):
    try:
        outcome = "GOT " + repr(action())
    except BaseException as error:
        outcome = f"STOPPED {type(error).__name__}: {error}"
    print("ATTACK " + json.dumps({"name": name, "outcome": outcome[:2000]}), flush=True)
def c_call(function, *args):  # the C library directly: no audit hook sees it
    result = function(*args)
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result
"""


def hostile_notebook(code):
    return demo.with_cell(student_notebook(A04), HARNESS + code)


def grade_capturing(nb, tmp_path, monkeypatch, guard_file_rules=True, name=f"{A04}.ipynb"):
    """check_notebook on `nb`; returns the Report and {attack name: outcome} from its hostile cell."""
    captured = {}
    real_autograde, real_environment = grading._autograde, grading.kernel_environment

    def autograde(nb, assignment_id, work, *args, **kwargs):
        result = real_autograde(nb, assignment_id, work, *args, **kwargs)
        captured["nb"] = result[0]
        captured["written"] = [str(p) for p in work.rglob(f"written-{TOKEN}")]  # before the folder goes
        return result

    def without_guard_file_rules(config):
        return {k: v for k, v in real_environment(config).items() if not k.startswith("AUTOGRADER_GUARD")}

    monkeypatch.setattr(grading, "_autograde", autograde)
    # what stops each attack here must be the sandbox: the grader's reading of the source, which would
    # zero these notebooks for their routes (ctypes, os.fork...) before anything runs, is test_integrity's
    monkeypatch.setattr(integrity, "route_findings", lambda cells: [])
    if not guard_file_rules:
        monkeypatch.setattr(grading, "kernel_environment", without_guard_file_rules)
    path = tmp_path / name
    nbformat.write(nb, path)
    report = grading.check_notebook(path)
    monkeypatch.undo()
    outcomes = {}
    for cell in captured["nb"].cells if captured.get("nb") else []:
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if line.startswith("ATTACK "):
                    attack = json.loads(line[len("ATTACK "):])
                    outcomes[attack["name"]] = attack["outcome"]
    assert not captured.get("written"), f"the kernel wrote into the grading folder: {captured['written']}"
    return report, outcomes


def assert_still_graded(report, what):
    assert report.score == FULL_MARKS, (
        f"{what}: the reference answers in the same notebook scored {report.score}/{FULL_MARKS}, so the "
        f"sandbox broke grading. Errors: {report.errors}; flags: {report.flags}")


def assert_stopped(outcomes, name, *reasons):
    assert name in outcomes, f"the attack '{name}' never reported: {sorted(outcomes)}"
    outcome = outcomes[name]
    assert outcome.startswith("STOPPED") and any(r in outcome for r in reasons), (
        f"the attack '{name}' was not stopped by the sandbox as expected ({' or '.join(reasons)}): {outcome}")


def kernel_folders():
    """The kernels' folders on the host (each holds one kernel's sockets and key)."""
    folder = private_socket_folder()
    return {str(p) for p in folder.iterdir() if p.is_dir()} if folder.exists() else set()


def host_processes_named(mark):
    """Host pids of processes whose name or command line carries `mark`."""
    found = []
    for folder in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):
            if (pathlib.Path(folder, "comm").read_text().strip() == mark
                    or mark.encode() in pathlib.Path(folder, "cmdline").read_bytes()):
                found.append(int(folder.split("/")[2]))
    return [pid for pid in found if pid != os.getpid()]


# ------------------------------------------------------------------ files, network, processes, memory
@pytest.fixture(scope="module")
def grader_listens():
    """A TCP port on 127.0.0.1 and an abstract Unix socket, listened on by the grader's process."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.settimeout(0.1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0course-test-{TOKEN}")
    abstract.listen()
    abstract.settimeout(0.1)
    accepted, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            for listener in (tcp, abstract):
                with contextlib.suppress(OSError):
                    accepted.append(listener.accept())
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield tcp.getsockname()[1], f"course-test-{TOKEN}", accepted
    stop.set()
    thread.join()
    tcp.close()
    abstract.close()


@pytest.fixture(scope="module")
def marker_folder(tmp_path_factory):
    """A host folder anyone may write: a process that escaped the sandbox would leave a marker."""
    folder = tmp_path_factory.mktemp("escape-markers")
    folder.chmod(0o777)
    return folder


@pytest.fixture(scope="module")
def hostile(grader_listens, marker_folder, tmp_path_factory):
    port, abstract_name, accepted = grader_listens
    grader_home = os.path.expanduser("~")
    secret = f"grader-secret-{TOKEN}"  # set in the grader's environment while it grades
    code = f"""
SOLUTION, REPO, VARIANTS, LIBRARY = {str(SOLUTION)!r}, {str(REPO_ROOT)!r}, {str(VARIANTS)!r}, {str(LIBRARY_FILE)!r}
GRADER_PID, GRADER_HOME, MARKER, TOKEN = {os.getpid()}, {grader_home!r}, {str(marker_folder / 'escaped')!r}, {TOKEN!r}
SECRETS = [{secret!r}, {os.environ[RUN_KEY_ENV]!r}]
attempt("open solutions", lambda: open(SOLUTION).read(100))
def by_dir_fd():
    parent = os.open(REPO, os.O_RDONLY | os.O_DIRECTORY)
    return os.read(os.open(os.path.relpath(SOLUTION, REPO), os.O_RDONLY, dir_fd=parent), 100)
attempt("solutions through dir_fd", by_dir_fd)
attempt("solutions through /proc/self/root", lambda: open("/proc/self/root" + SOLUTION).read(100))
def by_symlink():
    os.symlink(SOLUTION, "peek.ipynb")
    return open("peek.ipynb").read(100)
attempt("solutions through a symlink", by_symlink)
attempt("solutions through libc open", lambda: c_call(libc.open, SOLUTION.encode(), 0))
attempt("list the checkout", lambda: sorted(os.listdir(REPO)))
attempt("list the autograder package", lambda: sorted(os.listdir(os.path.join(REPO, "autograder"))))
attempt("read a variant (correct answers)", lambda: open(VARIANTS).read(100))
attempt("read the gradebook", lambda: open("../../../gradebook.db", "rb").read(100))
attempt("read the submitted copy", lambda: os.listdir("../../../submitted"))
attempt("write the course library", lambda: open(LIBRARY, "a").write("check_close = None"))
attempt("write the virtualenv", lambda: open(os.path.join(sys.prefix, "zz-evil.pth"), "w").write("import os"))
attempt("write the grading folder", lambda: open(f"../../../written-{{TOKEN}}", "w").write("0"))
attempt("write the grader's kernelspecs", lambda: os.makedirs(
    os.path.join(GRADER_HOME, ".local/share/jupyter/kernels/course-grading")))
attempt("write the virtualenv's kernelspecs", lambda: os.makedirs(
    os.path.join(sys.prefix, "share/jupyter/kernels/course-grading")))
attempt("list the grader's HOME", lambda: sorted(os.listdir(GRADER_HOME)))
attempt("TCP to the grader on loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
def abstract_unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect("\\0" + {abstract_name!r})
    return s
attempt("abstract Unix socket of the grader", abstract_unix)
def outbound():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # connect() on UDP sends nothing: a route lookup
    s.connect(("192.0.2.1", 9))
    return s.getsockname()
attempt("outbound address", outbound)
attempt("network interfaces", socket.if_nameindex)
attempt("the grader's memory", lambda: open(f"/proc/{{GRADER_PID}}/mem", "rb").read(1))
attempt("processes in sight", lambda: sorted(p for p in os.listdir("/proc") if p.isdigit()))
def secrets_anywhere():
    seen = []
    for entry in os.listdir("/proc"):
        for part in ("environ", "cmdline"):
            try:
                seen.append(open(f"/proc/{{entry}}/{{part}}", "rb").read().decode(errors="replace"))
            except OSError:
                pass
    seen.append(repr(dict(os.environ)))
    return [s for s in SECRETS if s and any(s in text for text in seen)]
attempt("the grader's secrets in any environment", secrets_anywhere)
attempt("/proc/1/environ", lambda: open("/proc/1/environ", "rb").read())
def background_by_fork():
    pid = c_call(libc.fork)
    if pid == 0:
        libc.prctl(15, ("bg" + TOKEN).encode(), 0, 0, 0)  # PR_SET_NAME: findable from the host
        while True:
            try:
                open(MARKER, "w").write("escaped")
            except OSError:
                pass
            libc.sleep(1)
    return pid
attempt("background process by fork", background_by_fork)
def background_by_posixsubprocess():
    import _posixsubprocess
    read_end, write_end = os.pipe()
    return _posixsubprocess.fork_exec(
        [b"/bin/sh", b"-c", ("exec -a bg" + TOKEN + " sleep 600").encode()], [b"/bin/sh"], True, (), None,
        None, -1, -1, -1, -1, -1, -1, read_end, write_end, True, True, -1, None, None, None, -1, None, False)
attempt("background process by _posixsubprocess", background_by_posixsubprocess)
def background_by_system():
    status = c_call(libc.system, ("sh -c 'sleep 600; : bg" + TOKEN + "' &").encode())
    if status == 127 << 8:  # glibc's answer when it could not start the shell
        raise OSError(1, "Operation not permitted: system() could not start a shell (status 127)")
    return status
attempt("background process by libc system", background_by_system)
def leave(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write(text)
    return path
attempt("leave a file in /tmp", lambda: leave(f"/tmp/leftover-{{TOKEN}}", "x"))
attempt("leave a file in /dev/shm", lambda: leave(f"/dev/shm/leftover-{{TOKEN}}", "x"))
attempt("leave an IPython startup file", lambda: leave(os.path.expanduser(
    "~/.ipython/profile_default/startup/00-leftover.py"), "import builtins; builtins.LEFTOVER = True"))
attempt("leave a user kernelspec", lambda: leave(os.path.expanduser(
    "~/.local/share/jupyter/kernels/course-grading/kernel.json"), '{{"argv": ["false"], "display_name": "x"}}'))
import threading
def many_threads():
    started, release = [], threading.Event()
    try:
        for _ in range(1500):
            thread = threading.Thread(target=release.wait)
            thread.start()
            started.append(thread)
    except RuntimeError as error:
        raise RuntimeError(f"{{error}} after {{len(started)}} threads") from None
    finally:
        release.set()
    return len(started)
attempt("1,500 threads", many_threads)
attempt("ptrace the sandbox's first process", lambda: c_call(libc.ptrace, 16, 1, None, None))  # PTRACE_ATTACH
attempt("io_uring_setup", lambda: c_call(libc.syscall, 425, 8, ctypes.create_string_buffer(120)))
attempt("process_vm_readv", lambda: c_call(libc.syscall, 310, 1, None, 0, None, 0, 0))
def read_write_host_mounts():
    found = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        kind = fields[fields.index("-") + 1]
        if fields[5].split(",")[0] == "rw" and kind not in ("tmpfs", "proc", "devpts", "mqueue", "devtmpfs"):
            found.append((fields[4], kind))
    return found
attempt("read-write host mounts", read_write_host_mounts)
def fill_the_socket_folder():
    folder = os.path.dirname(__import__("ipykernel.connect").connect.get_connection_file())
    written = 0
    try:
        for i in range(12):
            with open(os.path.join(folder, f"fill-{{i}}"), "wb") as out:
                for _ in range(50):
                    out.write(bytes(2**20))
                    written += 1
    except OSError as error:
        raise OSError(error.errno, f"{{error.strerror}} after {{written}} MB in {{folder}}") from None
    finally:
        for i in range(12):
            try:
                os.remove(os.path.join(folder, f"fill-{{i}}"))
            except OSError:
                pass
    return f"{{written}} MB in {{folder}}"
attempt("600 MB beside the kernel's sockets", fill_the_socket_folder)
"""
    library_before = LIBRARY_FILE.read_bytes()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_ENV, secret)
        report, outcomes = grade_capturing(hostile_notebook(code), tmp_path_factory.mktemp("hostile"), patch,
                                           guard_file_rules=False)
    assert LIBRARY_FILE.read_bytes() == library_before, "a notebook changed the course library"
    return report, outcomes, accepted


@needs_sandbox
def test_hostile_notebook_is_still_graded(hostile):
    report, outcomes, _ = hostile
    assert outcomes, "the hostile cell never ran"
    assert_still_graded(report, "a notebook full of attacks")
    assert not any("tampering" in f for f in report.flags), f"the guard's file rules were off: {report.flags}"


@needs_sandbox
@pytest.mark.parametrize("route", ["open solutions", "solutions through dir_fd", "solutions through /proc/self/root",
                                   "solutions through a symlink", "solutions through libc open",
                                   "read a variant (correct answers)", "read the gradebook", "read the submitted copy"])
def test_grader_files_do_not_exist_in_the_sandbox(hostile, route):
    assert_stopped(hostile[1], route, "No such file or directory")


@needs_sandbox
def test_only_the_course_code_the_kernel_imports_is_mounted(hostile):
    outcomes = hostile[1]
    assert outcomes["list the checkout"].startswith("GOT"), outcomes["list the checkout"]
    for hidden in ("solutions", "course", ".git"):
        assert f"'{hidden}'" not in outcomes["list the checkout"], f"{hidden}/ is visible: {outcomes['list the checkout']}"
    for hidden in ("tests", "work", "demo_class"):
        assert f"'{hidden}'" not in outcomes["list the autograder package"], (
            f"autograder/{hidden}/ is visible in the sandbox: {outcomes['list the autograder package']}")
    assert "'.pyenv'" in outcomes["list the grader's HOME"] or "No such file" in outcomes["list the grader's HOME"]
    home = outcomes["list the grader's HOME"]
    assert "'.cache'" not in home, f"the grader's HOME is visible: {home}"


@needs_sandbox
@pytest.mark.parametrize("route", ["write the course library", "write the virtualenv",
                                   "write the grader's kernelspecs", "write the virtualenv's kernelspecs"])
def test_course_environment_and_grading_folders_are_read_only(hostile, route):
    assert_stopped(hostile[1], route, "Read-only file system", "No such file or directory")


@needs_sandbox
def test_writing_beside_the_notebooks_folder_never_reaches_the_grading_folder(hostile):
    """check grades under the temp folder, so the grading folder's path lies in the sandbox's private
    /tmp: a write there may succeed, into that tmpfs. grade_capturing asserts that no such file
    appeared in the real grading folder."""
    assert "write the grading folder" in hostile[1], "the attack did not run"


@needs_sandbox
def test_no_network(hostile):
    outcomes, accepted = hostile[1], hostile[2]
    assert_stopped(outcomes, "TCP to the grader on loopback", "Connection refused")
    assert_stopped(outcomes, "abstract Unix socket of the grader", "Connection refused")
    assert_stopped(outcomes, "outbound address", "Network is unreachable")
    assert outcomes["network interfaces"] == "GOT [(1, 'lo')]", outcomes["network interfaces"]
    assert not accepted, f"the grader's listeners accepted connections from the kernel: {accepted}"


@needs_sandbox
def test_grader_memory_environment_and_processes_are_out_of_sight(hostile):
    outcomes = hostile[1]
    assert_stopped(outcomes, "the grader's memory", "No such file or directory")
    leaked = outcomes["the grader's secrets in any environment"]
    assert leaked == "GOT []", f"the grader's secret or run key reached the sandbox: {leaked}"
    pids = json.loads(outcomes["processes in sight"][4:].replace("'", '"'))
    assert str(os.getpid()) not in pids and len(pids) <= 3, f"/proc shows more than the sandbox: {pids}"


@needs_sandbox
@pytest.mark.parametrize("route", ["background process by fork", "background process by _posixsubprocess",
                                   "background process by libc system"])
def test_no_process_outlives_grading(hostile, marker_folder, route):
    assert_stopped(hostile[1], route, "Operation not permitted")
    time.sleep(1)  # a survivor would write its marker every second
    assert not (marker_folder / "escaped").exists(), "a process started by the notebook wrote on the host"
    assert not host_processes_named(f"bg{TOKEN}"), "a process started by the notebook is still running"


@needs_sandbox
def test_threads_are_capped_even_for_roots_mapped_uid(hostile):
    outcome = hostile[1]["1,500 threads"]
    assert outcome.startswith("STOPPED RuntimeError: can't start new thread"), (
        f"a notebook started 1,500 threads under a cap of {sandbox.KERNEL_PROCESSES}: {outcome}")
    started = int(outcome.split(" after ")[1].split()[0])
    assert started < sandbox.KERNEL_PROCESSES, f"{started} threads started under a cap of {sandbox.KERNEL_PROCESSES}"


@needs_sandbox
@pytest.mark.parametrize("route", ["ptrace the sandbox's first process", "io_uring_setup", "process_vm_readv"])
def test_ptrace_io_uring_and_other_processes_memory_are_refused(hostile, route):
    assert_stopped(hostile[1], route, "Operation not permitted")


@needs_sandbox
def test_nothing_the_kernel_can_write_is_a_host_folder(hostile):
    """The kernel's sockets and key live in its own /tmp (a capped tmpfs), not in a host folder bound
    read-write: 600 MB written beside them stop at the tmpfs's cap and never reach the host's disk."""
    outcomes = hostile[1]
    assert outcomes["read-write host mounts"] == "GOT []", f"host folders are writable: {outcomes['read-write host mounts']}"
    outcome = outcomes["600 MB beside the kernel's sockets"]
    assert outcome.startswith("STOPPED OSError") and "No space left on device" in outcome, outcome
    assert f"in {os.path.dirname(sandbox.KERNEL_SOCKETS)}" in outcome, outcome
    written = int(outcome.split(" after ")[1].split()[0])
    assert written <= sandbox.TMP_BYTES // 2**20, f"{written} MB written, more than the sandbox's /tmp holds"


@needs_sandbox
def test_nothing_written_in_tmp_shm_or_home_reaches_a_later_notebook(hostile, tmp_path, monkeypatch):
    for leftover in ("leave a file in /tmp", "leave a file in /dev/shm", "leave an IPython startup file",
                     "leave a user kernelspec"):
        assert hostile[1][leftover].startswith("GOT"), f"the notebook could not even write its own {leftover}"
    for path in (f"/tmp/leftover-{TOKEN}", f"/dev/shm/leftover-{TOKEN}"):
        assert not os.path.exists(path), f"{path} written in the sandbox appeared on the host"
    later = hostile_notebook(f"""
for path in ["/tmp/leftover-{TOKEN}", "/dev/shm/leftover-{TOKEN}",
             os.path.expanduser("~/.ipython/profile_default/startup/00-leftover.py"),
             os.path.expanduser("~/.local/share/jupyter/kernels/course-grading/kernel.json")]:
    attempt("still there: " + path, lambda: open(path).read())
attempt("startup file ran", lambda: __import__("builtins").LEFTOVER)
""")
    report, outcomes = grade_capturing(later, tmp_path, monkeypatch)
    assert_still_graded(report, "a notebook graded after a hostile one")
    assert len(outcomes) == 5, f"the later notebook's checks did not all run: {outcomes}"
    for name, outcome in outcomes.items():
        assert outcome.startswith("STOPPED"), f"a later notebook saw what an earlier one left: {name}: {outcome}"


# ------------------------------------------------------------------------------- kernels side by side
@needs_sandbox
def test_a_kernel_cannot_see_another_kernels_folder_while_both_run(tmp_path, monkeypatch):
    """A victim (reference answers, and a slow cell) graded in another process while the attacker
    watches the kernel-key folders for 15 s: it sees only its own, and the victim keeps its marks."""
    victim_path = tmp_path / "victim" / f"{A04}.ipynb"
    victim_path.parent.mkdir()
    nbformat.write(demo.with_cell(student_notebook(A04), "import time\ntime.sleep(25)"), victim_path)
    before = kernel_folders()
    victim = subprocess.Popen([sys.executable, "-m", "autograder", "check", str(victim_path), "--json"],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not kernel_folders() - before:
            time.sleep(0.2)  # until the victim's kernel has its folder
        host_seen, stop = set(), threading.Event()

        def watch_host():
            while not stop.is_set():
                host_seen.update(kernel_folders())
                time.sleep(0.2)
        watcher = threading.Thread(target=watch_host, daemon=True)
        watcher.start()
        attacker = hostile_notebook("""
import glob, time
own = os.path.dirname(__import__("ipykernel.connect").connect.get_connection_file())
seen, keys = set(), []
for _ in range(75):
    for folder in glob.glob("/tmp/course-kernels-*/*"):
        seen.add(folder)
        for key in glob.glob(folder + "/*.json"):
            if os.path.dirname(key) != own:
                keys.append(open(key).read())
    time.sleep(0.2)
attempt("own folder", lambda: own)
attempt("folders seen", lambda: sorted(seen))
attempt("other kernels' keys", lambda: keys)
""")
        report, outcomes = grade_capturing(attacker, tmp_path, monkeypatch)
        stop.set()
        watcher.join()
        out, err = victim.communicate(timeout=300)
    finally:
        if victim.poll() is None:
            victim.kill()
    own = outcomes["own folder"][5:-1]
    assert_still_graded(report, "the attacker")
    assert own == os.path.dirname(sandbox.KERNEL_SOCKETS), f"the kernel's key is not in its own /tmp: {own}"
    assert outcomes["folders seen"] == "GOT []", (
        f"a kernel saw the host's kernel folders: {outcomes['folders seen']}")
    assert outcomes["other kernels' keys"] == "GOT []", outcomes["other kernels' keys"]
    others = host_seen - {own}
    assert others, "no other kernel ran on the host during the attack, so the test proved nothing"
    assert json.loads(out)["score"] == FULL_MARKS, f"the victim lost marks: {out[-2000:]} {err[-2000:]}"


# ------------------------------------------------------------------------------------- fork bomb
@needs_sandbox
def test_fork_bomb_is_stopped_and_the_grader_is_unharmed(tmp_path, monkeypatch):
    bomb = hostile_notebook(f"""
def bomb():
    made = 0
    for _ in range(100_000):
        pid = libc.fork()
        if pid == 0:  # every child forks on, forever
            libc.prctl(15, b"bomb{TOKEN}", 0, 0, 0)
            while True:
                libc.fork()
        if pid < 0:
            break
        made += 1
    return made
attempt("fork bomb", bomb)
""")
    started = time.perf_counter()
    report, outcomes = grade_capturing(bomb, tmp_path, monkeypatch)
    assert outcomes.get("fork bomb") == "GOT 0", f"the fork bomb started processes: {outcomes}"
    assert_still_graded(report, "a fork bomb")
    assert time.perf_counter() - started < 120, "the fork bomb slowed grading down"
    assert not host_processes_named(f"bomb{TOKEN}"), "processes of the fork bomb are still running"
    assert subprocess.run(["true"]).returncode == 0, "the grader can no longer start programs"


# ---------------------------------------------------------------------------------- the kernelspec
@needs_sandbox
def test_a_user_kernelspec_named_like_the_grading_kernel_is_never_used(tmp_path, monkeypatch, marker_folder):
    data = tmp_path / "jupyter-data"
    spec = data / "kernels" / "course-grading"
    spec.mkdir(parents=True)
    marker = marker_folder / f"impostor-{TOKEN}"
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"],
        "display_name": "impostor", "language": "python"}))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    report, _ = grade_capturing(student_notebook(A04), tmp_path, monkeypatch)
    assert not marker.exists(), "grading started a kernelspec from the user's Jupyter folders"
    assert_still_graded(report, "a notebook graded beside an impostor kernelspec")


# ------------------------------------------------------------------- the kernel manager, up close
def run_kernel(code, cwd, mode="required", then=None):
    """Start a grading kernel in `cwd`, run `code`, call then(manager), shut it down. Returns
    (its stdout, the manager)."""
    async def main():
        km = SandboxedKernelManager(kernel_name="course-grading", sandbox=mode)
        km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[str(KERNELSPEC_DIR)])
        await km.start_kernel(cwd=str(cwd))
        client = km.client()
        client.start_channels()
        printed = []
        try:
            await client.wait_for_ready(timeout=60)
            await client.execute_interactive(code, timeout=60, output_hook=lambda msg: printed.append(
                msg["content"].get("text", "")) if msg["msg_type"] == "stream" else None)
            if then:
                await then(km)
        finally:
            client.stop_channels()
            await km.shutdown_kernel(now=True)
        return "".join(printed), km
    return asyncio.run(main())


def running(pid, wait=5.0):
    """Is `pid` still running (not gone, not a zombie) after up to `wait` seconds?"""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.1)
    return True


def sandbox_processes(first):
    """Host pids of the sandbox whose first process is `first`: it and its descendants."""
    found, children = [first], {}
    for status in glob.glob("/proc/[0-9]*/status"):
        with contextlib.suppress(OSError):
            parent = next(int(line.split()[1]) for line in open(status) if line.startswith("PPid:"))
            children.setdefault(parent, []).append(int(status.split("/")[2]))
    for pid in found:
        found += children.get(pid, [])
    return found


@needs_sandbox
def test_the_notebook_works_on_a_copy_of_its_folder(tmp_path):
    folder = tmp_path / "student" / "assignment"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "corpus.txt").write_text("low lower lowest\n")
    (folder / "link").symlink_to(SOLUTION)  # never followed: a symlink inside, to nothing
    before = sorted((p.relative_to(folder), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                    for p in folder.rglob("*"))
    out, _ = run_kernel("""
import os
print(open("data/corpus.txt").read().strip())
open("data/corpus.txt", "a").write("changed")
open("new.txt", "w").write("new")
print(os.getcwd(), os.path.exists("link"))
""", folder)
    assert "low lower lowest" in out and f"{folder} False" in out, f"the kernel did not see its folder's copy: {out}"
    after = sorted((p.relative_to(folder), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                   for p in folder.rglob("*"))
    assert after == before, "the kernel wrote into the grader's folder"


@needs_sandbox
@pytest.mark.parametrize("how", ["os._exit", "SIGKILL from the host"])
def test_kernel_folder_is_removed_after_a_crash(tmp_path, how):
    async def crash(km):
        if how == "os._exit":
            client = km.client()
            client.start_channels()
            client.execute("import os; os._exit(1)")
            await asyncio.sleep(1)
            client.stop_channels()
        else:
            kernels = [pid for pid in sandbox_processes(km.sandbox_pid)
                       if b"autograder.kernel" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()]
            assert kernels, "could not find the kernel's process on the host"
            for pid in kernels:
                with contextlib.suppress(ProcessLookupError):   # one of them (a short-lived child) may be gone
                    os.kill(pid, 9)
        for _ in range(50):
            if not await km.is_alive():
                break
            await asyncio.sleep(0.1)
        assert not await km.is_alive(), f"the kernel survived {how}"
    _, km = run_kernel("x = 1", tmp_path, then=crash)
    folder = pathlib.Path(km.connection_file).parent
    assert not folder.exists(), f"{folder} (the kernel's key) outlived the kernel ({how})"
    assert not running(km.sandbox_pid), f"the sandbox outlived the kernel ({how})"
    assert km.cgroup is None or not os.path.exists(km.cgroup), f"its pids cgroup outlived the kernel ({how})"


@needs_sandbox
def test_whatever_the_kernel_starts_dies_with_it_even_without_the_process_filter(tmp_path, monkeypatch):
    """The second layer: if a process got started (here the seccomp filter is left out), the PID
    namespace ends it with the kernel."""
    monkeypatch.setattr(sandbox, "no_new_processes_filter", lambda machine=None: None)
    name = f"orphan{TOKEN}"
    out, km = run_kernel(f"""
import ctypes, os
libc = ctypes.CDLL(None)
pid = libc.fork()
if pid == 0:
    libc.prctl(15, b"{name}", 0, 0, 0)
    libc.setsid()
    while True:
        libc.sleep(1)
print("started", pid)
""", tmp_path)
    assert "started" in out and "started -1" not in out, f"the test could not start a process: {out}"
    time.sleep(1)
    assert not host_processes_named(name), "a process the kernel started outlived it"


# -------------------------------------------------------------------------------------- fallbacks
def test_course_config_requires_the_sandbox_for_plain_nbgrader_autograde():
    config = nbgrader_config()
    assert config.GuardedExecute.sandbox == "required", "plain `nbgrader autograde` would run unsandboxed"
    executor = GuardedExecute(config=config)
    executor.nb = nbformat.v4.new_notebook()
    km = executor.create_kernel_manager()
    assert isinstance(km, SandboxedKernelManager) and km.sandbox == "required", (
        f"GuardedExecute's kernels must be sandboxed: {type(km).__name__}, {getattr(km, 'sandbox', None)}")
    assert km.kernel_spec_manager.kernel_dirs == [str(KERNELSPEC_DIR)], (
        f"the grading kernelspec must come from the course only: {km.kernel_spec_manager.kernel_dirs}")


def test_unavailable_bwrap_is_detected_with_a_reason_and_a_way_out(monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_ENV, shutil.which("false"))
    ok, reason = sandbox.available()
    assert not ok, "`false` passed for a working bwrap"
    assert "false" in reason and "apparmor_restrict_unprivileged_userns" in reason, reason
    km = SandboxedKernelManager(kernel_name="course-grading", sandbox="required")
    km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[str(KERNELSPEC_DIR)])
    with pytest.raises(sandbox.SandboxUnavailableError, match="must run in the OS sandbox"):
        asyncio.run(km.start_kernel())
    assert not km.has_kernel, "a kernel was started although the sandbox is required and unavailable"
    km.cleanup_connection_file()


def run_cli(*args, bwrap="false"):
    env = {**os.environ, sandbox.BWRAP_ENV: shutil.which(bwrap), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_self_study_check_falls_back_with_one_warning_line():
    result = run_cli("check", str(solution_path(A04)), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["score"] == FULL_MARKS, result.stdout[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: grading without the OS sandbox"), (
        f"expected one warning line on stderr, got: {result.stderr}")


def test_class_grading_refuses_without_the_sandbox_unless_told(tmp_path):
    submissions = tmp_path / "hand-ins" / "submitted" / "ada"
    (submissions / A04).mkdir(parents=True)
    nbformat.write(student_notebook(A04), submissions / A04 / f"{A04}.ipynb")
    course = tmp_path / "course"
    refused = run_cli("grade", str(submissions.parent.parent), "--course-dir", str(course))
    assert refused.returncode == 2, f"class grading went ahead without the sandbox: {refused.stdout[-1000:]}"
    assert "--unsandboxed" in refused.stderr and "apparmor_restrict_unprivileged_userns" in refused.stderr, refused.stderr
    assert not (course / classroom.LEDGER).exists(), "something was graded before the refusal"
    graded = run_cli("grade", str(submissions.parent.parent), "--course-dir", str(course), "--jobs", "1",
                     "--unsandboxed")
    assert graded.returncode == 0, graded.stderr[-2000:]
    entry = classroom.Ledger(course / classroom.LEDGER).entries[("ada", A04)]
    assert entry["score"] >= entry["max_score"] == FULL_MARKS, f"--unsandboxed grading lost marks: {entry}"


def test_no_new_processes_filter_is_well_formed():
    for machine in ("x86_64", "aarch64"):
        program = sandbox.no_new_processes_filter(machine)
        assert program and len(program) % 8 == 0 and len(program) // 8 < 64, f"{machine}: {program!r}"
    assert sandbox.no_new_processes_filter("sparc") is None
