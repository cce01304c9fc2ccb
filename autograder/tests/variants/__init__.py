"""Known-bug variants (mutants) and alternative correct answers, one module per notebook.

A variant replaces the source of answer cells (by grade_id) in the released notebook; every other
answer cell is filled with the reference solution, as a student who got the rest right would.
- A mutant must lose points on each test in `loses`, and the failure message of the first of
  them must contain `message` (the teaching message names the misconception).
- An alternative is another correct implementation: it must get full marks.
"""
import dataclasses
import importlib
import pkgutil

# Put at the top of a function body: a correct answer whose libraries write warnings to stderr.
# The alternative that uses it proves that such an answer loses no points (nbgrader would give 0).
WARN_AND_PRINT = """
    import logging, sys, warnings
    warnings.warn("a library deprecation warning", UserWarning)
    print("a library writing to stderr", file=sys.stderr)
    logger = logging.getLogger("some.library")
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
    logger.warning("a library logging a warning")
"""


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    answers: dict          # grade_id of an answer cell -> replacement source
    loses: tuple = ()      # grade_ids of tests that must lose points (mutants only)
    message: str = ""      # text the first lost test's message must contain


def variants_by_assignment():
    """{assignment_id: (mutants, alternatives)} gathered from the modules in this package."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        found[module.ASSIGNMENT] = (module.MUTANTS, module.ALTERNATIVES)
    return found
