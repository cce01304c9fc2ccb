"""Regenerate the student notebooks (course/) from the sources (solutions/) with nbgrader."""
import contextlib
import logging
import pathlib
import shutil
import tempfile

from autograder.config import COURSE_DIR, REPO_ROOT, assignment_ids, nbgrader_config


def release(dest=COURSE_DIR):
    """Run `nbgrader generate_assignment` for every assignment, writing into `dest`.

    The gradebook it needs is thrown away afterwards; folders in `dest` without a source are removed.
    """
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="release-") as work:
        config = nbgrader_config(root=REPO_ROOT, release=dest, work=work)
        config.NbGraderAPI.log_level = logging.ERROR
        with contextlib.redirect_stdout(None):
            api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
        for assignment_id in assignment_ids():
            result = api.generate_assignment(assignment_id, force=True)
            if not result["success"]:
                raise RuntimeError(f"generate_assignment {assignment_id} failed:\n{result.get('error')}")
    for stale in sorted(set(p.name for p in dest.iterdir() if p.is_dir()) - set(assignment_ids())):
        shutil.rmtree(dest / stale)
    return sorted(dest.glob("*/*.ipynb"))
