"""The kernel that runs notebooks under grading: ipykernel with limits and the guard installed.

Started through the `course-grading` kernelspec (autograder/jupyter/kernels/), which the grader
selects for every notebook it executes. Before the student's first cell:
- resource limits: address space (a memory bomb raises MemoryError instead of taking the machine),
  file size, CPU time (a backstop behind the per-cell timeout), no core dumps, and in the OS
  sandbox (autograder/sandbox.py, which says so in the environment) the number of processes and
  threads, counted there per sandbox because it has a user namespace of its own;
- `autograder.guard.install`, which records the pristine state the hidden tests rely on.
"""
import os
import resource

from autograder.config import KERNEL_CPU_SECONDS, KERNEL_FILE_SIZE_BYTES, KERNEL_MEMORY_BYTES
from autograder.sandbox import PROCESSES_ENV


def apply_limits():
    memory = int(os.environ.get("AUTOGRADER_KERNEL_MEMORY_BYTES", KERNEL_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (KERNEL_FILE_SIZE_BYTES, KERNEL_FILE_SIZE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # SIGXCPU at the soft limit stops the kernel; SIGKILL at the hard one if it is caught.
    resource.setrlimit(resource.RLIMIT_CPU, (KERNEL_CPU_SECONDS, KERNEL_CPU_SECONDS + 10))
    if os.environ.get(PROCESSES_ENV):
        # Outside the sandbox RLIMIT_NPROC would count every process of the grading user. (The kernel
        # exempts real root from it: there the sandbox's seccomp filter, which refuses new processes,
        # is what stops a fork bomb.)
        processes = int(os.environ[PROCESSES_ENV])
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def main():
    apply_limits()
    from ipykernel.kernelapp import IPKernelApp

    from autograder import guard
    app = IPKernelApp.instance()
    app.initialize()
    guard.install(app.shell)
    app.start()


if __name__ == "__main__":
    main()
