"""Shared helpers for the test suite: build student notebooks and grade them like `check` does.

Grading derives the hidden tests' inputs from a secret key per run (autograder/judging.py). The
suite pins it, so that a mutant is caught on the same inputs every time; the demo class, whose student
ada hands in the reference answers of every notebook, is graded under a fresh random key every run
(test_classroom.graded_demo), which proves over many runs that no check depends on lucky seeds.
"""
import os
import time

import nbformat
import pytest

from autograder.grading import check_notebook
from autograder.judging import RUN_KEY_ENV

os.environ.setdefault(RUN_KEY_ENV, "the test suite's fixed key")


# Both clocks at the start of the session. On a virtual machine they part while the host pauses the guest:
# the wall clock catches up afterwards, the monotonic one (pytest's durations) does not count the pause.
SESSION_CLOCKS = {}


def pytest_sessionstart(session):
    SESSION_CLOCKS.update(wall=time.time(), monotonic=time.monotonic())
    if not hasattr(session.config, "workerinput"):   # the controller, once
        CHECKOUT_BEFORE.update(ignored_files())


# Nothing the suite runs writes into the checkout (a class's instructor may not write it, and a cache left
# there by root's runs once made the hub test pass where a new instructor failed): files that appear during
# the run, outside what the suite itself writes (test-artifacts/) and the environment (.venv/), fail it.
CHECKOUT_BEFORE = set()
WRITTEN_BY_THE_SUITE = (".venv/", "test-artifacts/")


def ignored_files():
    import subprocess

    from autograder.config import REPO_ROOT
    listed = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    # ignored files: what a program writes (a cache, a work folder, bytecode), not a file someone is adding
    return {line[3:] for line in listed.stdout.splitlines()
            if line[:2] == "!!" and not line[3:].startswith(WRITTEN_BY_THE_SUITE)}


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return
    new = sorted(ignored_files() - CHECKOUT_BEFORE)
    if new:
        print(f"\nthe run wrote into the checkout ({len(new)} files), which nothing may do: {new[:10]}")
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    paused = (time.time() - SESSION_CLOCKS["wall"]) - (time.monotonic() - SESSION_CLOCKS["monotonic"])
    if paused > 5:
        terminalreporter.write_line(
            f"note: the wall clock ran {paused:.0f} s ahead of the monotonic clock during this run: the machine "
            "was paused that long (a virtual machine's host?), and the duration pytest prints leaves it out")


def grade(nb, assignment_id, tmp_path, name=None):
    path = tmp_path / (name or f"{assignment_id}.ipynb")
    nbformat.write(nb, path)
    return check_notebook(path)


def scores_by_test(report):
    return {t.grade_id: t for t in report.tests}


@pytest.fixture
def grade_in_tmp(tmp_path):
    return lambda nb, assignment_id, name=None: grade(nb, assignment_id, tmp_path, name)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The tests that read the graded demo class run on one pytest-xdist worker, so that the other
    worker never waits on the lock while the class is graded (test_classroom.graded_demo)."""
    for item in items:
        if "graded_demo" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("demo-class"))


@pytest.hookimpl(trylast=True)  # after pytest-xdist has written the groups into the node ids
def pytest_collection_finish(session):
    """`--dist loadgroup` sends each xdist_group to one worker by the `@group` suffix pytest-xdist adds
    to node ids. Were that lost (a pytest that ignores it), every worker would replay every notebook:
    stop the run rather than let it silently take twice as long."""
    if not getattr(session.config.option, "loadgroup", False):  # set on the workers of --dist loadgroup
        return
    lost = [item.nodeid for item in session.items
            if any(True for _ in item.iter_markers("xdist_group")) and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist's groups are not in the node ids (e.g. {lost[0]}): this pytest "
                                "and pytest-xdist do not work together; see environment.yml's pins")
