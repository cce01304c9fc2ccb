"""Kernels reached through Unix sockets of their own, so no two kernels can race for a TCP port.

Over TCP, jupyter_client asks the system for free ports, closes them, and passes their numbers to
the new kernel, which binds them about a second later. A kernel started by another process in that
second can be handed the same port, and one of them dies with "Address already in use". CI saw it
once: two test workers and class grading start hundreds of kernels side by side. A socket path
made from a random name cannot be taken by anyone else. Each kernel's sockets and connection file
(its key) live in a folder of its own, inside a private folder under the system's temp folder (a
socket path must stay under about 100 characters); the folder is removed when the kernel shuts down
or dies.

`SandboxedKernelManager` (the grader's) starts the kernel inside the OS sandbox of
autograder/sandbox.py. There the kernel's sockets and its copy of the connection file are in the
sandbox's own /tmp, which the grader reaches through /proc/<pid>/root: the sandbox sees no host folder
it could write. The kernel's stdout goes where the grader's stderr goes; `BoundedKernelClient` bounds
what a message can make the grader buffer; a pids cgroup caps threads where the grader is root.
"""
import contextlib
import os
import pathlib
import shutil
import sys
import tempfile
import threading

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbgrader.preprocessors import Execute
from traitlets import DottedObjectName, Enum, default

from autograder import sandbox

# A probe's data is at most 16 MiB (autograder/wire.py), 22 MB in base64, inside one message.
MAX_MESSAGE_BYTES = 32 * 2**20
RECEIVE_QUEUE = 16


def private_socket_folder():
    """Where kernels keep their sockets and connection files (keys). Grading kernels may not open it,
    so a notebook graded in parallel cannot reach, or send code to, another student's kernel."""
    return pathlib.Path(tempfile.gettempdir()) / f"course-kernels-{os.getuid()}"


def private_kernel_folder():
    """A fresh folder (random name, mode 700) for one kernel's sockets and connection file."""
    folder = private_socket_folder()
    folder.mkdir(mode=0o700, exist_ok=True)
    status = folder.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to you and be closed to others (chmod 700): "
                              "kernel keys are kept there")
    return pathlib.Path(tempfile.mkdtemp(dir=folder))


def private_socket_prefix():
    """A fresh path prefix for one kernel's sockets (jupyter_client appends -1 ... -5), in a folder
    of its own."""
    return str(private_kernel_folder() / "kernel")


class PrivateSockets:
    """Mixed into a jupyter_client kernel manager: its kernel is reached over private Unix sockets."""

    @default("transport")
    def _transport_default(self):
        return "ipc"

    @default("connection_file")
    def _connection_file_default(self):
        return private_socket_prefix() + ".json"

    @default("ip")
    def _ip_default(self):
        return os.path.splitext(self.connection_file)[0]  # sockets beside the connection file

    def cleanup_connection_file(self):
        """Remove the kernel's folder too (jupyter_client calls this after the kernel has stopped,
        died or been killed, and when the manager is collected; not on a restart)."""
        super().cleanup_connection_file()
        folder = pathlib.Path(self.connection_file).parent
        if folder.parent == private_socket_folder():
            shutil.rmtree(folder, ignore_errors=True)


class PrivateSocketKernelManager(PrivateSockets, AsyncKernelManager):
    """nbclient's (asynchronous) kernel manager on private sockets."""


class BlockingPrivateSocketKernelManager(PrivateSockets, KernelManager):
    """jupyter_client's blocking kernel manager on private sockets (for scripts)."""


class SandboxedKernelManager(PrivateSocketKernelManager):
    """The grader's kernel manager: the kernel runs in the OS sandbox (autograder/sandbox.py), with
    its socket folder the only host folder it can write, in a copy of the notebook's folder.

    `sandbox`: "required" refuses to start a kernel where the machine cannot sandbox it,
    "preferred" starts it unsandboxed there (the caller says so), "off" never sandboxes."""

    sandbox = Enum(list(sandbox.MODES), default_value="required",
                   help="run the kernel in the OS sandbox: required, preferred or off").tag(config=True)

    def sandboxed(self):
        """Will (did) this manager start its kernel in the sandbox? Raises SandboxUnavailableError if it
        must and cannot."""
        if self.sandbox == "off":
            return False
        ok, reason = sandbox.available()
        if not ok and self.sandbox == "required":
            raise sandbox.SandboxUnavailableError(f"grading kernels must run in the OS sandbox, and this machine "
                                             f"cannot run it: {reason}")
        if not ok:
            self.log.warning("grading kernel started without the OS sandbox: %s", reason)
        return ok

    client_class = DottedObjectName("autograder.kernel_manager.BoundedKernelClient")
    cgroup = None        # the kernel's pids cgroup (sandbox.pids_cgroup), where the grader is root
    sandbox_pid = None   # the host pid of the sandbox's first process
    overlays = None      # {course file: text mounted over it}: the answers this kernel must not reach (answers.py)

    @default("client_factory")
    def _bounded_client(self):
        # AsyncKernelManager gives client_factory a default of its own, so client_class alone never took
        # effect: the grader's clients were unbounded (a 500 MB message was buffered whole)
        return BoundedKernelClient

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        # the kernel's own output (its fds 1 and 2) never reaches the grader's stdout (nothing it prints can
        # precede or forge the grading contract's JSON), and at most KERNEL_LOG_BYTES of it reach the grader's
        # stderr (its log while grading): a kernel that floods fd 1 fills nobody's disk
        reader, writer = os.pipe()
        kw = {**kw, "stdout": writer, "stderr": writer}
        log = os.dup(sys.stderr.fileno())   # the log as it is now: grading may restore stderr before the kernel ends
        threading.Thread(target=_forward_bounded, args=(reader, log, KERNEL_LOG_BYTES), daemon=True,
                         name="kernel-output").start()
        try:
            await self._launch_kernel_in_sandbox(kernel_cmd, kw)
        finally:
            os.close(writer)   # the kernel holds its own copy; the reader ends when the kernel does

    async def _launch_kernel_in_sandbox(self, kernel_cmd, kw):
        if not self.sandboxed():  # the grader's environment, less the hidden tests' key
            from autograder.judging import RUN_KEY_ENV
            env = {name: value for name, value in (kw.get("env") or os.environ).items() if name != RUN_KEY_ENV}
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "env": env})
        info = {**self.get_connection_info(), "key": self.session.key.decode()}
        with sandbox.kernel_command(kernel_cmd, info, kw.get("cwd"), kw.get("env") or {}, self.overlays) as launch:
            self.cgroup = launch.cgroup
            kw = {**kw, "env": launch.env, "pass_fds": launch.fds, "preexec_fn": launch.preexec}
            await super()._async_launch_kernel(launch.argv, **kw)
            # its sockets are in its own /tmp: reached through the sandbox's root, never a host folder
            self.sandbox_pid = launch.sandbox_pid()
            self.ip = f"/proc/{self.sandbox_pid}/root{sandbox.KERNEL_SOCKETS}"

    def cleanup_connection_file(self):
        """Also the kernel's pids cgroup (after a shutdown, a crash or a kill, as the key's folder)."""
        super().cleanup_connection_file()
        sandbox.remove_cgroup(self.cgroup)


KERNEL_LOG_BYTES = 256 * 2**10    # of a kernel's own fds 1 and 2 kept in the grader's log (a crash's traceback)


def _forward_bounded(reader, log, limit):
    """Copy what a kernel writes on its fds 1 and 2 to `log` (a descriptor, closed at the end), the first `limit`
    bytes of it, then read and drop the rest (so the kernel never blocks on a full pipe) until it ends."""
    kept, dropped = 0, 0
    with open(reader, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            part = chunk[:max(0, limit - kept)]
            if part:
                kept += len(part)
                with contextlib.suppress(OSError):
                    os.write(log, part)
            dropped += len(chunk) - len(part)
    with contextlib.suppress(OSError):
        if dropped:
            os.write(log, f"\n[grader] the kernel wrote {dropped:,} more bytes on its own output, dropped\n".encode())
        os.close(log)


class BoundedKernelClient(AsyncKernelClient):
    """The grader's client: a message larger than MAX_MESSAGE_BYTES ends the connection before it is
    buffered, and at most RECEIVE_QUEUE messages wait on a channel, so a notebook cannot make the grader
    hold more than MAX_MESSAGE_BYTES x RECEIVE_QUEUE per channel (the grader's output caps apply after)."""

    def _context_default(self):
        context = super()._context_default()  # this client's own: the defaults apply to its sockets only
        context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        return context


class PrivateSocketExecute(Execute):
    """nbgrader's Execute on private sockets. (nbgrader passes its kernel manager class as an
    argument, which outranks configuration, so the class is chosen here instead.)"""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", PrivateSocketKernelManager)
        super().__init__(*args, **kwargs)

    @default("shutdown_kernel")
    def _shutdown_kernel_default(self):
        # Once the last cell has run, nothing more is wanted from the kernel: killed at once, it does not
        # spend about 0.6 s (a third of the floor) tearing torch down under a polite shutdown request, and
        # no exit hook of the notebook's runs. The sandbox dies with it (bwrap --die-with-parent).
        return "immediate"


def private_socket_validator(**kwargs):
    """nbgrader's Validator (what JupyterLab's Validate button runs), its kernels on private sockets."""
    from nbgrader.validator import Validator
    validator = Validator(**kwargs)
    validator.preprocessors = [PrivateSocketExecute if step is Execute else step for step in validator.preprocessors]
    return validator
