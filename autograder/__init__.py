"""The course's grading: nbgrader configuration, release, `check`, and the hidden-test checks."""
import os
import sys

# nbgrader shells out to `alembic` (and Jupyter to `python`) by name: make sure this environment's
# scripts are found even when it is used as `.venv/bin/python -m autograder` without activation.
_scripts = os.path.dirname(sys.executable)
if _scripts not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _scripts + os.pathsep + os.environ.get("PATH", "")
