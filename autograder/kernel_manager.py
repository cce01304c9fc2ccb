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
autograder/sandbox.py, where that one folder is the only host folder it can see and write.
"""
import os
import pathlib
import shutil
import tempfile

from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbgrader.preprocessors import Execute
from traitlets import Enum, default

from autograder import sandbox


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

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if not self.sandboxed():  # the grader's environment, less the hidden tests' key
            from autograder.judging import RUN_KEY_ENV
            env = {name: value for name, value in (kw.get("env") or os.environ).items() if name != RUN_KEY_ENV}
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "env": env})
        folder = pathlib.Path(self.connection_file).parent
        if folder.parent != private_socket_folder():
            raise sandbox.SandboxError(f"a sandboxed kernel keeps its connection file in a private folder of "
                                       f"its own under {private_socket_folder()}, not in {folder}")
        with sandbox.kernel_command(kernel_cmd, folder, kw.get("cwd"), kw.get("env") or {}) as launch:
            kw = {**kw, "env": launch.env, "pass_fds": launch.fds}
            return await super()._async_launch_kernel(launch.argv, **kw)


class PrivateSocketExecute(Execute):
    """nbgrader's Execute on private sockets. (nbgrader passes its kernel manager class as an
    argument, which outranks configuration, so the class is chosen here instead.)"""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", PrivateSocketKernelManager)
        super().__init__(*args, **kwargs)


def private_socket_validator(**kwargs):
    """nbgrader's Validator (what JupyterLab's Validate button runs), its kernels on private sockets."""
    from nbgrader.validator import Validator
    validator = Validator(**kwargs)
    validator.preprocessors = [PrivateSocketExecute if step is Execute else step for step in validator.preprocessors]
    return validator
