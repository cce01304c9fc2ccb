"""The class on JupyterHub, on one machine: `make hub` (`python -m autograder.hub up`).

- setup.py: the roster's system users, the hub's folder, nbgrader's exchange, each role's Jupyter
  configuration, the instructors' course folders, and the release of course/ into the exchange;
- spawner.py and jupyterhub_config.py: the hub (PAM logins, one server per user, started in the
  user's own view of the files: view.py);
- instructor.py: what an instructor runs around `make grade` (release, duedate, release-feedback);
- roster.py: the class list (CSV), shared with the LMS export (autograder/lms_export.py);
- __main__.py: the command line (`python -m autograder.hub --help`).
The README's "The class on JupyterHub" section says how a class runs on it.
"""
