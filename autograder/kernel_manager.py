"""Kernels reached through Unix sockets of their own, so no two kernels can race for a TCP port.

Over TCP, jupyter_client asks the system for free ports, closes them, and passes their numbers to
the new kernel, which binds them about a second later. A kernel started by another process in that
second can be handed the same port, and one of them dies with "Address already in use". CI saw it
once: two test workers and class grading start hundreds of kernels side by side. A socket path
made from a random name cannot be taken by anyone else. The sockets live in a private folder under
the system's temp folder (a socket path must stay under about 100 characters) and are removed
when the kernel shuts down.
"""
import os
import pathlib
import tempfile
import uuid

from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbgrader.preprocessors import Execute
from traitlets import default


def private_socket_folder():
    """Where kernels keep their sockets and connection files (keys). Grading kernels may not open it,
    so a notebook graded in parallel cannot reach, or send code to, another student's kernel."""
    return pathlib.Path(tempfile.gettempdir()) / f"course-kernels-{os.getuid()}"


def private_socket_prefix():
    """A fresh path prefix for one kernel's sockets (jupyter_client appends -1 ... -5)."""
    folder = private_socket_folder()
    folder.mkdir(mode=0o700, exist_ok=True)
    status = folder.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to you and be closed to others (chmod 700): "
                              "kernel keys are kept there")
    return str(folder / uuid.uuid4().hex[:16])


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


class PrivateSocketKernelManager(PrivateSockets, AsyncKernelManager):
    """nbclient's (asynchronous) kernel manager on private sockets."""


class BlockingPrivateSocketKernelManager(PrivateSockets, KernelManager):
    """jupyter_client's blocking kernel manager on private sockets (for scripts)."""


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
