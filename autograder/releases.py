"""Every release of every assignment, as hashes of its course cells, so that a hand-in started from an earlier
release is graded as its student wrote it.

Instructors fix notebooks during a term. The grader tells the course's own cells from a student's by their
source (integrity.py reads only the student's code; safe_html.py renders only the course's markdown as
markdown): a cell of an earlier release, changed since, would otherwise read as the student's own, and a
course cell that uses, say, `globals()` would put the student's notebook up for review. `make release`
(`python -m autograder release`) records the course cells of what it releases in `released_cells.json`
(sha256 of the cell's type and source, per assignment; appended, never rewritten), and the grader takes a
cell for the course's when its source is exactly one of a release's. A course cell the student edited, or
pasted with a change, is theirs. `python tools/released_cells.py` rebuilds the file from the git history of
course/ (every release ever committed).
"""
import fcntl
import functools
import hashlib
import json
import os
import pathlib

from autograder.config import REPO_ROOT

MANIFEST = REPO_ROOT / "autograder" / "released_cells.json"


def cell_key(cell_type, source):
    """A course cell's fingerprint: its type and its source (code compared without surrounding whitespace, as
    the grader reads it; markdown and raw cells exactly, as they render)."""
    text = source.strip() if cell_type == "code" else source
    return hashlib.sha256(f"{cell_type}\n{text}".encode()).hexdigest()


def course_cells(nb):
    """The fingerprints of a notebook's course cells: neither an answer nor a test (nbgrader's metadata)."""
    keys = set()
    for cell in nb.cells:
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if grading.get("solution") or grading.get("grade"):
            continue
        keys.add(cell_key(cell.cell_type, cell.source))
    return keys


def record(assignment, nb, manifest=None):
    """Add the course cells of `nb`, a release of `assignment`, to the manifest (under a lock: releases of
    several assignments may run at once); returns how many were new."""
    path = pathlib.Path(manifest or MANIFEST)
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        text = handle.read()
        known = json.loads(text) if text.strip() else {}
        before = set(known.get(assignment, []))
        after = before | course_cells(nb)
        if after != before:
            known[assignment] = sorted(after)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
    released.cache_clear()
    return len(after - before)


@functools.lru_cache(maxsize=None)
def released(assignment, manifest=None):
    """Fingerprints of the course cells of every recorded release of `assignment`."""
    path = pathlib.Path(manifest or MANIFEST)
    try:
        return frozenset(json.loads(path.read_text()).get(assignment, []))
    except (OSError, ValueError):
        return frozenset()


def is_course_cell(assignment, cell_type, source, current=frozenset()):
    """Whether a hand-in's cell is one of the course's, as some release of `assignment` had it (or as the
    current source has it: `current`, fingerprints of the source's course cells)."""
    key = cell_key(cell_type, source)
    return key in current or key in released(assignment)
