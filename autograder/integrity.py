"""Integrity decided in the grader, from the hand-in's source: what the student's code reaches.

Nothing here runs the student's code, and nothing the kernel does can change it: it reads the cells
the student wrote (answer cells, and code cells that are not the course's own) as IPython would run
them, and decides two things the grader acts on (autograder/execute.py):

- **routes** (`route_findings`): code that reaches the grader's machinery or reaches code indirectly,
  which no exercise of this course needs: `exec`/`eval`/`compile`, `__import__` and `importlib`,
  attribute names computed at run time (`getattr(torch, name)`, `vars(m)[...]`, `operator.attrgetter`)
  on anything but `self`, dunder attributes beyond the harmless ones (`__dict__`, `__globals__`,
  `__closure__`, `__subclasses__`...), `sys.modules`/`settrace`/`setprofile`/`_getframe`, threads and
  processes, `ctypes`, `gc`, frame inspection, pickles, IPython's shell and its hooks
  (`get_ipython()`, `display_pub`, events, input and AST transformers), torch's function and dispatch
  modes, assignments to library attributes (monkeypatching; `torch.backends.*` settings excepted) and
  the autograder itself. A notebook with a route scores 0 and is flagged for review, naming the cell.
- **taken** (`taken_findings`): a test cell whose check forbids an oracle (the `..._SHORTCUTS` lists
  of its probe, `Check.forbidden`) fails, and is flagged, when the code it tests reaches that oracle in
  the source: the student objects the hidden test is handed, every notebook definition they refer to,
  transitively, and the imports behind their names (`F.softmax`, `from courselib.attention import ...
  as helper`, `x.softmax(-1)`, `torch._safe_softmax`, `F.log_softmax(...).exp()`).

What the kernel reports (the guard, the probes' watch) is added to these findings; it never removes one.
"""
import ast
import functools

from autograder.checks.common import op_family, same_operator
from autograder.source import python_source

# dunder attributes a correct answer may use (construction, type names, protocol methods)
HARMLESS_DUNDERS = {"__init__", "__name__", "__qualname__", "__doc__", "__class__", "__module__", "__len__",
                    "__call__", "__iter__", "__next__", "__getitem__", "__setitem__", "__contains__",
                    "__enter__", "__exit__", "__repr__", "__str__", "__hash__", "__post_init__", "__version__",
                    "__file__", "__annotations__", "__slots__", "__all__", "__main__"}
# methods whose definition could fake a comparison or hijack torch's dispatch (a result's class is
# refused by the wire anyway: this names the intent)
# (comparisons are not among them: a verdict is decided in the grader on plain data, where an object's __eq__
# never runs, and a class of hypotheses ordered by functools.total_ordering is an honest idiom)
HOOK_METHODS = {"__torch_function__", "__torch_dispatch__",
                "__array_function__", "__array_ufunc__", "__instancecheck__", "__subclasscheck__",
                "__getattribute__", "__del__", "__reduce__", "__reduce_ex__", "__init_subclass__", "__set_name__",
                "__class_getitem__"}
CALLS = {  # called by name: the route they are
    "exec": "runs code from a string", "eval": "runs code from a string", "compile": "compiles code",
    "__import__": "imports by name", "globals": "reaches the notebook's namespace as a dict",
    "vars": "reaches an object's namespace as a dict", "breakpoint": "starts a debugger",
    "get_ipython": "reaches IPython's shell",
}
MODULES = {  # imported or reached: the route they are
    "importlib": "imports by name", "runpy": "runs code indirectly", "threading": "starts threads",
    "_thread": "starts threads", "concurrent": "starts threads or processes",
    "multiprocessing": "starts processes", "subprocess": "starts programs", "pty": "starts programs",
    "asyncio": "runs code outside the cell", "signal": "installs signal handlers", "atexit": "runs code at exit",
    "ctypes": "calls C code", "cffi": "calls C code", "gc": "reaches live objects through the garbage collector",
    "marshal": "loads code",
    "pickle": "loads pickles (which run code)", "dill": "loads pickles (which run code)",
    "cloudpickle": "loads pickles (which run code)", "shelve": "loads pickles (which run code)",
    "copyreg": "changes how objects are rebuilt", "builtins": "changes Python's builtins",
    "IPython": "reaches IPython's machinery", "ipykernel": "reaches the kernel's machinery",
    "jupyter_client": "reaches the kernel's machinery", "zmq": "reaches the kernel's sockets",
    "autograder": "reaches the grader", "sqlite3": "opens a database (the gradebook is one)",
}
GRADER_PACKAGES = ("autograder",)     # reached by graded code: taken (taken_findings)
ALLOWED_IMPORTS = ("IPython.display",)   # submodules of the modules above that a correct answer may use
# IPython magics a learner uses honestly; the code that time, timeit and capture run is read as any other
SAFE_MAGICS = {"time": True, "timeit": True, "capture": True, "matplotlib": False, "precision": False,
               "who": False, "whos": False, "pwd": False}     # name: whether its arguments are code
SYS_ROUTES = {"modules", "settrace", "setprofile", "gettrace", "getprofile", "_getframe", "_current_frames",
              "meta_path", "path_hooks", "path_importer_cache", "addaudithook", "excepthook", "displayhook",
              "breakpointhook", "monitoring"}
TYPES_ROUTES = {"FunctionType", "CodeType", "MethodType", "ModuleType", "LambdaType", "FrameType", "CellType",
                "TracebackType", "BuiltinFunctionType"}
INSPECT_ROUTES = {"currentframe", "stack", "getouterframes", "getinnerframes", "trace", "getmembers",
                  "getmembers_static", "getclosurevars", "getattr_static", "getframeinfo"}
OS_ROUTES = {"system", "popen", "fork", "forkpty", "execv", "execve", "execl", "execle", "execlp", "execvp",
             "execvpe", "spawnv", "spawnl", "spawnve", "posix_spawn", "posix_spawnp", "kill", "killpg", "_exit",
             "dup2", "write", "fdopen", "openpty", "startfile"}
TORCH_ROUTES = ("overrides", "_C._set_torch_function_mode", "_C._push_on_torch_function_stack",
                "_C._pop_torch_function_stack", "_C._get_function_stack_at", "utils._python_dispatch",
                "_C._set_dispatch_mode", "_C._push_on_torch_dispatch_stack", "_dynamo",
                "_C._DisableTorchDispatch", "_C.DisableTorchFunction", "_C.DisableTorchFunctionSubclass",
                "library", "_C._functorch", "ops.load_library")
LIBRARY_SETTINGS = ("torch.backends.",)          # assignments a correct answer may make (determinism, TF32)


def _dotted(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


@functools.lru_cache(maxsize=2048)
def _tree(source):
    try:
        return ast.parse(python_source(source))
    except (SyntaxError, ValueError):
        return None


# ----------------------------------------------------------------------------------------- imports
class Aliases:
    """What each name a notebook binds by `import` stands for, in cell order (last binding wins)."""

    def __init__(self):
        self.names = {}

    def learn(self, tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.names[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def learn_cell(self, source):
        """`learn` for a whole cell, from the cell's own bindings worked out once per source."""
        self.names.update(_cell_imports(source))

    def resolve(self, dotted):
        """'torch.nn.functional.softmax' for 'F.softmax' when F is torch.nn.functional; None if the first
        name is not an import."""
        head, _, rest = dotted.partition(".")
        if head not in self.names:
            return None
        return self.names[head] + ("." + rest if rest else "")


@functools.lru_cache(maxsize=4096)
def _cell_imports(source):
    """What a cell's imports bind ({name: what it stands for}), read once per source: the grader reads the
    same cells again for every test cell after them, and the replay for every variant."""
    aliases = Aliases()
    aliases.learn(_tree(source))
    return aliases.names


@functools.lru_cache(maxsize=4096)
def _cell_definitions(source):
    """(name, statement) for every name a cell's top-level statements bind, in order, read once per source."""
    return tuple((name, statement) for statement in _tree(source).body for name in _bound_names(statement))


@functools.lru_cache(maxsize=4096)
def _method_names(statement):
    """The names of the methods of the classes a statement defines (a statement of a cached tree)."""
    return frozenset(n.name for c in ast.walk(statement) if isinstance(c, ast.ClassDef)
                     for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


# ------------------------------------------------------------------------------------------- routes
def route_findings(cells):
    """Findings (sentences naming the cell and the route) for `cells`: [(label, source)] of the code the
    student wrote, in order; the imports of every cell before them must be known: pass them too with
    label None (the course's cells), so that `F` or `np` resolve."""
    aliases, findings = Aliases(), []
    for label, source in cells:
        tree = _tree(source)
        if tree is None:
            if label is not None:
                findings.append(f"{label} does not parse as Python, so its code cannot be checked")
            continue
        if label is not None:
            said = set()
            for route, code in _cell_routes(source, tuple(aliases.names.items())):
                if route not in said:  # one finding per route and cell, with its first place
                    said.add(route)
                    findings.append(f"{label} {route}: `{code}`")
        aliases.learn_cell(source)
    return findings


@functools.lru_cache(maxsize=4096)
def _cell_routes(source, known_imports):
    """`_routes` of a cell that parses, after cells whose imports bound `known_imports` ((name, target)
    pairs): the same cell after the same imports, as in every variant the replay grades, is read once."""
    aliases = Aliases()
    aliases.names = dict(known_imports)
    return tuple(_routes(_tree(source), aliases))


def _routes(tree, aliases):
    local = Aliases()
    local.names = dict(aliases.names)
    local.learn(tree)  # its own imports, whatever the order inside the cell

    def resolved(node):
        dotted = _dotted(node)
        return (local.resolve(dotted) or dotted) if dotted else None

    # names the notebook binds to a library by plain assignment (`m = torch`, `f = F`): still the library
    library_aliases = {target.id for statement in ast.walk(tree) if isinstance(statement, ast.Assign)
                       for target in statement.targets if isinstance(target, ast.Name)
                       and _is_library(resolved(statement.value), local)}
    harmless = _harmless_calls(tree)

    for node in ast.walk(tree):
        if node in harmless:
            for code in harmless[node]:   # the code a safe magic runs, read as the cell's own
                yield from _routes(code, local)
            continue
        code = ast.unparse(node)[:120] if isinstance(node, (ast.expr, ast.stmt)) else ""
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [f"{node.module or ''}.{a.name}" for a in node.names])
            for module in modules:
                route = _module_route(module)
                if route:
                    yield route, ast.unparse(node)[:120]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
            if local.names.get(node.func.id, node.func.id) == node.func.id:  # not an import of that name
                yield CALLS[node.func.id], code
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "setattr", "delattr", "hasattr"):
            if len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant) and _dynamic_target(
                    node.args[0], local, library_aliases):
                yield "reaches an attribute of a library whose name is computed at run time", code
            elif node.func.id in ("setattr", "delattr") and node.args and _is_library(resolved(node.args[0]), local):
                yield "changes a library's attribute (monkeypatching)", code
        elif isinstance(node, ast.Attribute):
            if (node.attr.startswith("__") and node.attr.endswith("__") and node.attr not in HARMLESS_DUNDERS
                    and not (node.attr == "__dict__" and isinstance(node.value, ast.Name) and node.value.id == "self")):
                yield f"reaches `{node.attr}`", code
            full = resolved(node)
            route = _attribute_route(full) if full else None
            if route:
                yield route, code
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in ("__builtins__", "__loader__", "__spec__"):
                yield f"reaches `{node.id}`", code
            full = local.resolve(node.id)
            if full and full != node.id:
                route = _attribute_route(full)
                if route:
                    yield route, code
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HOOK_METHODS:
            yield f"defines `{node.name}`, a hook that could fake a test", f"def {node.name}(...)"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                    if isinstance(part, ast.Attribute):
                        full = resolved(part)
                        if full and full.startswith("sys."):
                            yield "rebinds part of `sys`", code
                        elif _is_library(full, local) and not full.startswith(LIBRARY_SETTINGS):
                            yield "changes a library's attribute (monkeypatching)", code
                    elif isinstance(part, ast.Subscript):
                        base = resolved(part.value)
                        if base and base.startswith("sys."):
                            yield "changes part of `sys`", code


def _harmless_calls(tree):
    """{call node: [trees of the code it runs]} for calls that only look like routes: `get_ipython()` in a
    magic of SAFE_MAGICS (`%timeit f(x)`, `%%time`), whose code is read instead, and `globals()` whose only use
    is a membership test (`if "timings" not in globals():`, as the course's own cells write it)."""
    found = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run_line_magic", "run_cell_magic")
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id == "get_ipython" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in SAFE_MAGICS
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
            texts = [_magic_code(a.value) for a in node.args[1:]] if SAFE_MAGICS[node.args[0].value] else []
            trees = [_tree(text) for text in texts if text.strip()]
            if all(t is not None for t in trees):
                found[node] = trees
                found[node.func.value] = []
                found[node.func] = []
        elif isinstance(node, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            for side in node.comparators:
                if (isinstance(side, ast.Call) and isinstance(side.func, ast.Name) and side.func.id == "globals"
                        and not side.args and not side.keywords):
                    found[side] = []
    return found


def _magic_code(text):
    """The Python code of a time/timeit/capture magic's arguments, its options left out (`-n 3 -r 1 f(x)`)."""
    words = text.split(" ")
    while words and (words[0].startswith("-") or (words[0].isdigit() and len(words) > 1)):
        words.pop(0)
    return " ".join(words)


def _dynamic_target(node, aliases, library_aliases):
    """Is getattr's object a library (an import, or a name bound to one)? An object the notebook made or
    was handed (`getattr(layer, name)`, `getattr(self.blocks[i], name)`) is not. (`sys.modules[...]`,
    `importlib` and `vars` are routes of their own.)"""
    dotted = _dotted(node)
    if dotted is None:
        return False
    return dotted.split(".")[0] in library_aliases or _is_library(aliases.resolve(dotted), aliases)


def _is_self(node):
    return isinstance(node, ast.Name) and node.id in ("self", "cls") or (
        isinstance(node, ast.Attribute) and _is_self(node.value))


def _is_library(full, aliases):
    """Is `full` an imported module or one of its attributes (not an object the notebook made)?"""
    return bool(full) and full.split(".")[0] in {v.split(".")[0] for v in aliases.names.values()}


def _module_route(module):
    return _attribute_route(module.strip("."))


def _attribute_route(full):
    """The route a dotted library name is, or None."""
    parts = full.split(".")
    top = parts[0]
    if any(full == allowed or full.startswith(allowed + ".") for allowed in ALLOWED_IMPORTS):
        return None
    if top in MODULES:
        return MODULES[top]
    if top == "types" and len(parts) > 1 and parts[1] in TYPES_ROUTES:
        return "builds functions or code objects"
    if top == "inspect" and len(parts) > 1 and parts[1] in INSPECT_ROUTES:
        return "inspects frames and live objects"
    if top == "sys" and len(parts) > 1 and parts[1] in SYS_ROUTES:
        return f"reaches `sys.{parts[1]}`"
    if top == "os" and len(parts) > 1 and parts[1] in OS_ROUTES:
        return f"reaches `os.{parts[1]}` (processes or the grader's descriptors)"
    if top == "operator" and len(parts) > 1 and parts[1] in ("attrgetter", "methodcaller"):
        return "reaches attributes by computed names"
    if top == "weakref" and len(parts) > 1 and parts[1] == "finalize":
        return "runs code when an object dies"
    if top == "torch" and len(parts) > 1:
        rest = ".".join(parts[1:])
        if any(rest == r or rest.startswith(r + ".") for r in TORCH_ROUTES):
            return "changes how torch dispatches its functions (the grader's watch)"
    return None


# -------------------------------------------------------------------------------------------- taken
def _forbidden_match(full, forbidden):
    """The forbidden name `full` (a resolved dotted name) reaches, or None."""
    for name in forbidden:
        if full == name or full.startswith(name + "."):
            return name
        if name.startswith("torch.") and full.startswith("torch.") and same_operator(name.split(".")[-1],
                                                                                     full.split(".")[-1]):
            return name
    return None


def _tensor_methods(forbidden):
    """Method families a check forbids on tensors (`torch.Tensor.softmax` forbids x.softmax(), x.log_softmax()...)."""
    return {op_family(name.split(".")[-1]) for name in forbidden if name.startswith("torch.Tensor.")}


def taken_findings(cells, test_calls, forbidden_of):
    """{test cell index: [findings]}: `cells` [(index, label or None for the course's, source)] in order,
    `test_calls` {test cell index: (check ref, [argument source])}, `forbidden_of(ref)` the check's list."""
    found = {}
    for test_index, (ref, arguments) in test_calls.items():
        # the grader's own modules are no answer to anything: the hidden checks' module is importable in the
        # kernel (its probes run there), with the reference helpers it hands to answers, and code a test grades
        # that reaches into it is taken, whatever the check lists
        forbidden = (*forbidden_of(ref), *GRADER_PACKAGES)
        findings = _taken_before(tuple((label, source) for index, label, source in cells if index < test_index),
                                 tuple(arguments), tuple(forbidden))
        if findings:
            found[test_index] = list(findings)
    return found


@functools.lru_cache(maxsize=4096)
def _taken_before(cells, arguments, forbidden):
    """The findings of one test cell: what the `arguments` it hands its check reach, through the
    definitions of `cells` ((label, source) before it), among `forbidden`. Decided once per set of
    inputs: the replay's variants share the cells before their own answer."""
    definitions, aliases = {}, Aliases()
    for label, source in cells:
        tree = _tree(source)
        if tree is None:
            continue
        aliases.learn_cell(source)
        if label is None:
            continue  # the course's own cells are not the student's answer
        for name, statement in _cell_definitions(source):
            definitions[name] = (label, statement)
    seen, todo, findings = set(), [a for a in arguments], []
    methods = _tensor_methods(forbidden)
    own_methods = {name for _, statement in definitions.values() for name in _method_names(statement)}
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        label, statement = definitions[name]
        free = _global_names(statement)   # a function's locals are not the notebook's names
        todo += sorted(free)
        local = Aliases()
        local.names = {k: v for k, v in aliases.names.items() if k in free}
        for node in ast.walk(statement):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                local.learn(node)
                for alias in node.names:
                    module = f"{getattr(node, 'module', '') or ''}.{alias.name}".strip(".")
                    match = _forbidden_match(module if isinstance(node, ast.ImportFrom) else alias.name, forbidden)
                    if match:
                        findings.append(f"{label} uses {match} (`{ast.unparse(node)[:100]}`)")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                full = local.resolve(node.id)
                match = _forbidden_match(full, forbidden) if full else None
                if match:
                    findings.append(f"{label} uses {match} (`{node.id}`)")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                full = local.resolve(dotted) if dotted else None
                match = _forbidden_match(full, forbidden) if full else None
                if not match and not _is_self(node.value) and node.attr not in own_methods:
                    match = next((f"torch.Tensor.{node.attr}" for m in methods if same_operator(m, node.attr)), None)
                if match:
                    findings.append(f"{label} uses {match} (`{ast.unparse(node)[:100]}`)")
    return tuple(dict.fromkeys(findings))


def _global_names(statement):
    """The notebook-level names a statement refers to: for a function or class, the names its body loads
    without binding them (and those of its decorators, bases and defaults); else every name it loads."""
    from autograder.source import _free_in_body
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        outer = [*statement.decorator_list, *getattr(statement, "bases", []),
                 *(k.value for k in getattr(statement, "keywords", []))]
        if not isinstance(statement, ast.ClassDef):
            outer += [d for d in [*statement.args.defaults, *statement.args.kw_defaults] if d is not None]
        return set(_free_in_body(statement)) | {n.id for e in outer for n in ast.walk(e) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound_names(statement):
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in statement.names]
    names = []
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
    return names


def hidden_call_arguments(source):
    """The sources of the arguments a test cell hands its hidden check: `hidden.check(a, b)` -> [a, b]'s names."""
    tree = _tree(source)
    names = []
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "hidden":
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                names += [n.id for n in ast.walk(argument) if isinstance(n, ast.Name)]
    return names
