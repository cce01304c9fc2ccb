"""Answers the grading kernel cannot reach: the course's own references of a notebook's exercises are not in
its sandbox.

courselib holds reference implementations that later notebooks build on (09's GPT for 11 and 13, 04's attention
for 05-07). While notebook N is graded, a course module that holds an answer to one of N's exercises (a
`courselib.*` name its checks forbid) and that N's code never imports (its cells, the probes of its tests, and
what they import, followed through the course's own modules) is mounted in N's sandbox as one line that raises
ImportError with the reason (sandbox.py): an in-kernel watch can be evaded, a file that is not there cannot be
read, however the import is written.

A module that N's own code imports stays: 05 and 06 build on `courselib.attention`, whose references the
probes hand to the student's code on purpose (`helpers=`, so that merge_heads is graded with a correct
split_heads), 08 on `courselib.bert`, 10 on `courselib.seq2seq`. `in_reach(N)` lists them; there the in-kernel
watch, the native watch (torch's own operators, autograder/native_watch.py) and the source's reading decide,
and the suite holds the list to what it is (a new entry is a decision, not an accident).
"""
import ast
import functools
import importlib.util
import pathlib

import nbformat

from autograder.config import REPO_ROOT

COURSE_PACKAGE = "courselib"


@functools.lru_cache(maxsize=None)
def _imports(path):
    """The modules a Python module imports when it is imported (absolute dotted names; an import inside a
    function happens only if the function is called: if the notebook calls it, its reference run shows it)."""
    try:
        tree = ast.parse(pathlib.Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(_imports_of(tree, top_level=True))


def _walk_top_level(tree):
    """ast.walk, without going into function bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo += [child for child in ast.iter_child_nodes(node)
                 if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]


def _imports_of(tree, top_level=False):
    found = set()
    for node in (_walk_top_level(tree) if top_level else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def _module_file(name):
    """The file of a course module (courselib.x), or None for anything else."""
    if not name.startswith(COURSE_PACKAGE + "."):
        return None
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        path = REPO_ROOT.joinpath(*parts[:cut]).with_suffix(".py")
        if path.is_file():
            return path
    return None


def imported_modules(notebook_sources, check_modules):
    """The course modules (dotted) that a notebook's code can import: its cells, its checks' modules, followed
    through every course module they import."""
    found = set()
    todo = set()
    for source in notebook_sources:
        try:
            tree = ast.parse(_python(source))
        except SyntaxError:
            continue
        todo |= _imports_of(tree)
    for module in check_modules:
        spec = importlib.util.find_spec(module)
        if spec and spec.origin:
            todo |= _imports(spec.origin)
            todo |= {"autograder.checks.common"}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None:
            if name.startswith("autograder.checks."):
                try:
                    spec = importlib.util.find_spec(name)
                except (ImportError, ValueError, AttributeError):   # a name imported from a module
                    spec = None
                if spec and spec.origin and name not in found:
                    found.add(name)
                    todo |= _imports(spec.origin)
            continue
        dotted = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if dotted not in found:
            found.add(dotted)
            todo |= _imports(path)
    return {name for name in found if name.startswith(COURSE_PACKAGE + ".")}


def _python(source):
    from autograder.source import python_source
    return python_source(source)


@functools.lru_cache(maxsize=None)
def _forbidden_modules(assignment_id):
    """({course module: its path} holding names `assignment_id`'s checks forbid, the course modules its code imports)."""
    from nbgrader import utils

    from autograder import judging
    from autograder.grading import source_notebook
    nb = source_notebook(assignment_id)
    refs = {judging.hidden_check_ref(c.source) for c in nb.cells if c.cell_type == "code" and utils.is_grade(c)} - {None}
    modules = {}
    for ref in refs:
        try:
            names = judging.resolve_check(ref).forbidden_names(complete=True)
        except RuntimeError:
            continue
        for name in names:
            path = _module_file(name)
            if path is not None:
                modules[".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)] = path
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    return modules, imported_modules(sources, {ref.partition(":")[0] for ref in refs})


@functools.lru_cache(maxsize=None)
def unreachable(assignment_id):
    """{path of a course module: the source the sandbox mounts over it} while `assignment_id` is graded."""
    modules, needed = _forbidden_modules(assignment_id)
    return {str(path): f"raise ImportError({reason(module, assignment_id)!r})\n"
            for module, path in sorted(modules.items()) if module not in needed}


def in_reach(assignment_id):
    """The course modules holding answers to `assignment_id`'s exercises that its own code imports, so they stay."""
    modules, needed = _forbidden_modules(assignment_id)
    return sorted(module for module in modules if module in needed)


def reason(module, assignment_id):
    return (f"the course's {module} is not available while {assignment_id} is graded: its exercises ask you to "
            "write what it holds")
