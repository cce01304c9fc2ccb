"""Rebuild autograder/released_cells.json from every release of course/ that git has: `python tools/released_cells.py`.

`make release` records each new release itself (autograder/releases.py); this recovers the releases made before
it did, or a manifest lost. It reads `git log` of course/NN/NN.ipynb and adds each committed version's course
cells; nothing is ever removed.
"""
import json
import subprocess
import sys

import nbformat

from autograder import releases
from autograder.config import REPO_ROOT


def versions(path):
    """(commit, notebook JSON) of every committed version of `path` (relative to the checkout)."""
    commits = subprocess.run(["git", "log", "--format=%H", "--", path], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    for commit in commits:
        shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO_ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            yield commit, shown.stdout


def main():
    added = {}
    for notebook in sorted((REPO_ROOT / "course").glob("*/*.ipynb")):
        relative = notebook.relative_to(REPO_ROOT).as_posix()
        assignment = notebook.parent.name
        for _, text in versions(relative):
            try:
                nb = nbformat.reads(text, as_version=4)
            except Exception:
                continue
            added[assignment] = added.get(assignment, 0) + releases.record(assignment, nb)
        added[assignment] = added.get(assignment, 0) + releases.record(assignment, nbformat.read(notebook, as_version=4))
    print(json.dumps(added, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
