"""Regenerate the student notebooks (course/) from the sources (solutions/) with nbgrader."""
import contextlib
import logging
import pathlib
import shutil
import tempfile

from autograder.config import COURSE_DIR, REPO_ROOT, assignment_ids, nbgrader_config


def release(dest=COURSE_DIR, only=None):
    """Run `nbgrader generate_assignment` for every assignment (or those in `only`) into `dest`.

    The gradebook it needs is thrown away afterwards. On a full release, folders in `dest` without
    a source are removed.
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
        for assignment_id in only or assignment_ids():
            result = api.generate_assignment(assignment_id, force=True)
            if not result["success"]:
                raise RuntimeError(f"generate_assignment {assignment_id} failed:\n{result.get('error')}")
    for stale in [] if only else sorted(set(p.name for p in dest.iterdir() if p.is_dir()) - set(assignment_ids())):
        shutil.rmtree(dest / stale)
    return sorted(p for p in dest.glob("*/*.ipynb") if not only or p.parent.name in only)
