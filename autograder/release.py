"""Regenerate the student notebooks (course/) from the sources (solutions/) with nbgrader."""
import contextlib
import logging
import pathlib
import shutil
import tempfile

import nbformat

from autograder import releases
from autograder.config import COURSE_DIR, REPO_ROOT, assignment_ids, nbgrader_config


def release(dest=COURSE_DIR, only=None, record=None):
    """Run `nbgrader generate_assignment` for every assignment (or those in `only`) into `dest`.

    The gradebook it needs is thrown away afterwards. On a full release, folders in `dest` without
    a source are removed. The course cells of what it releases are recorded (releases.py), unless `record`
    is False (default: when it releases into course/).
    """
    record = (pathlib.Path(dest).resolve() == COURSE_DIR.resolve()) if record is None else record
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="release-") as work:
        config = nbgrader_config(root=REPO_ROOT, release=dest, work=work)
        config.NbGraderAPI.log_level = logging.ERROR
        with contextlib.redirect_stdout(None):
            api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
        for assignment_id in only or assignment_ids():
            result = api.generate_assignment(assignment_id, force=True)
            if not result["success"]:
                raise RuntimeError(f"generate_assignment {assignment_id} failed:\n{result.get('error')}")
    for stale in [] if only else sorted(set(p.name for p in dest.iterdir() if p.is_dir()) - set(assignment_ids())):
        shutil.rmtree(dest / stale)
    released = sorted(p for p in dest.glob("*/*.ipynb") if not only or p.parent.name in only)
    if record:   # every release's course cells, so that hand-ins from it are graded as written (releases.py)
        for path in released:
            releases.record(path.parent.name, nbformat.read(path, as_version=4))
    return released
