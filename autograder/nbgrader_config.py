# nbgrader's command line reads this file: run nbgrader from this folder (autograder/) or pass
# --config autograder/nbgrader_config.py. The settings themselves live in autograder/config.py.
import os

from autograder.config import guard_environment, nbgrader_config

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)
c.merge(nbgrader_config())
# Plain `nbgrader autograde` too: its grading kernels learn which files are off limits.
os.environ.update(guard_environment(c))
