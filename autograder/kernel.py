"""The kernel that runs notebooks under grading: ipykernel with limits and the guard installed.

Started through the `course-grading` kernelspec (autograder/jupyter/kernels/), which the grader
selects for every notebook it executes. Before the student's first cell:
- resource limits: address space (a memory bomb raises MemoryError instead of taking the machine),
  file size, and no core dumps;
- `autograder.guard.install`, which records the pristine state the hidden tests rely on.
"""
import os
import resource

from autograder.config import KERNEL_FILE_SIZE_BYTES, KERNEL_MEMORY_BYTES


def apply_limits():
    memory = int(os.environ.get("AUTOGRADER_KERNEL_MEMORY_BYTES", KERNEL_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (KERNEL_FILE_SIZE_BYTES, KERNEL_FILE_SIZE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


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
