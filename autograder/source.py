"""What a notebook's code cells bind, read and change, read from their source (never by running them).

`cell_names(source)` parses one cell as IPython runs it (magics and `!` lines become the
`get_ipython()` calls IPython makes of them) and returns its top-level statements in order, each a
`Step`:
- `reads`: the global names it may read: names it loads before the cell binds them, and every name a
  function or class body it defines loads without binding it (looked up when the function runs);
- `binds`: the names it assigns (assignments, imports, `def`, `class`, loop and `with` targets, walrus);
- `uses`: every name it loads (also those the cell bound before it);
- `changes`: the objects it may change in place, each with the names that decide how: `x.attr = ...`,
  `x[i] = ...` and `del x[i]` (decided by the whole statement), the receiver of a method call
  `x.append(y)` and the arguments of a call `f(x, y)` (decided by the names the call uses).
A cell that does not parse is opaque: it reads and changes everything.

`Cell.follow(tainted)` follows a change through a cell: a statement that uses a tainted name taints
what it binds, and each change whose deciding names are tainted taints its object (a call in which
nothing is tainted does what it did before); a statement that uses none binds its `rebinds` afresh,
so they are no longer tainted (a test cell's `model = GPT(...)` after another test's `model`). The test suite's replay (autograder/replay.py) uses it to
find the cells a variant's answers reach.
"""
import ast
import builtins
import dataclasses
import functools

EVERYTHING = frozenset({"*"})
BUILTIN_NAMES = frozenset(dir(builtins))


@dataclasses.dataclass(frozen=True)
class Step:
    reads: frozenset
    binds: frozenset
    uses: frozenset
    changes: tuple     # (deciding names, the name of the object changed)
    rebinds: frozenset = frozenset()   # the names it binds whatever happens (not under an if, loop or try)


@dataclasses.dataclass(frozen=True)
class Cell:
    steps: tuple
    imports: frozenset = frozenset()   # names bound by `import`: modules and library functions

    @property
    def opaque(self):
        return any(step.reads == EVERYTHING for step in self.steps)

    @property
    def reads(self):
        return frozenset().union(*(s.reads for s in self.steps))

    @property
    def binds(self):
        return frozenset().union(*(s.binds for s in self.steps))

    def follow(self, tainted):
        """(does this cell use a tainted name, the names tainted after it runs)."""
        touched, tainted = False, set(tainted)
        for step in self.steps:
            if step.reads == EVERYTHING or "*" in tainted:
                return True, tainted | {"*"}
            if step.uses & tainted:
                touched = True
                tainted |= step.binds
            else:   # a name bound afresh from untainted names is untainted, whatever it held before
                tainted -= step.rebinds
            tainted |= {name for deciding, name in step.changes if deciding & tainted}
        return touched, tainted


def python_source(source):
    """The cell as Python: IPython's transformations (magics, shell escapes) applied."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


@functools.lru_cache(maxsize=4096)
def cell_names(source):
    try:
        tree = ast.parse(python_source(source))
    except (SyntaxError, ValueError):
        return Cell((Step(EVERYTHING, frozenset(), EVERYTHING, ()),))
    bound, steps, imports = set(), [], set()
    for statement in tree.body:
        visitor = _Statement(bound)
        visitor.visit(statement)
        uses = frozenset(visitor.uses - BUILTIN_NAMES)
        changes = tuple(sorted({(frozenset(deciding) if deciding is not None else uses, name)
                                for deciding, name in visitor.changes}, key=repr))
        steps.append(Step(frozenset(visitor.reads - BUILTIN_NAMES), frozenset(visitor.binds), uses, changes,
                          frozenset(_rebinds(statement))))
        bound |= visitor.binds
        imports |= visitor.imports
    return Cell(tuple(steps), frozenset(imports))


def _rebinds(statement):
    """The names a top-level statement binds whenever it completes: plain assignments to names, `def`,
    `class`, imports, and the same inside a `with` block's body. A binding under an if, a loop or a try
    may not happen, so the name may keep what it held."""
    if isinstance(statement, ast.Assign):
        return {n.id for target in statement.targets for n in _name_targets(target)}
    if isinstance(statement, ast.AnnAssign) and statement.value is not None:
        return {n.id for n in _name_targets(statement.target)}
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names if a.name != "*"}
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return set().union(*(_rebinds(inner) for inner in statement.body))
    return set()


def _name_targets(target):
    """The names of an assignment target that is a name or a tuple/list of names; none otherwise
    (`x.a = ...` and `x[i] = ...` change x, they do not bind it)."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, (ast.Name, ast.Starred)) for e in target.elts):
        return [e if isinstance(e, ast.Name) else e.value for e in target.elts if isinstance(e, ast.Name) or
                isinstance(e.value, ast.Name)]
    return []


def _base_name(node):
    """`x` for x, x.a.b, x[i], x.a[i].b, *x; None for anything else (a call's result, a literal)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Statement(ast.NodeVisitor):
    """One top-level statement: what it reads (given what the cell bound before it), binds and changes."""

    def __init__(self, bound_before):
        self.bound = set(bound_before)
        self.binds, self.reads, self.uses, self.imports = set(), set(), set(), set()
        self.changes = []   # (deciding names or None for the whole statement, name)

    def _bind(self, name):
        self.binds.add(name)
        self.bound.add(name)

    def _bind_target(self, target):
        if isinstance(target, ast.Name):
            self._bind(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind_target(element)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value)
        else:  # x.attr = ..., x[i] = ...: changes x in place, and reads what the target reads
            self._change(target, None)
            self._read(target)

    def _read(self, node):
        # a comprehension's own variables are local to it: `[f(s) for s in xs]` reads xs and f, not a global s
        local = {n.id for c in ast.walk(node) if isinstance(c, ast.comprehension)
                 for n in ast.walk(c.target) if isinstance(n, ast.Name)}
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id in local:
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                self.uses.add(child.id)
                if child.id not in self.bound:
                    self.reads.add(child.id)
            elif isinstance(child, ast.NamedExpr):
                self._bind(child.target.id)
            elif isinstance(child, ast.Call):  # x.method(y) may change x, f(x, y) x and y: as the call decides
                deciding = {n.id for n in ast.walk(child) if isinstance(n, ast.Name)}
                if isinstance(child.func, ast.Attribute):
                    self._change(child.func, deciding)
                for argument in [*child.args, *(k.value for k in child.keywords)]:
                    self._change(argument, deciding)

    def _change(self, node, deciding):
        base = _base_name(node)
        if base:
            self.changes.append((deciding, base))

    def visit_Assign(self, node):
        self._read(node.value)
        for target in node.targets:
            self._bind_target(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._read(node.value)
        self._bind_target(node.target)

    def visit_AugAssign(self, node):
        self._read(node.value)
        self._read(node.target if not isinstance(node.target, ast.Name) else ast.Name(node.target.id, ast.Load()))
        self._change(node.target, None)
        if isinstance(node.target, ast.Name):
            self._bind(node.target.id)

    def visit_Import(self, node):
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            self.imports.add(name)
            self._bind(name)

    def visit_ImportFrom(self, node):
        for alias in node.names:
            name = "*" if alias.name == "*" else alias.asname or alias.name
            self.imports.add(name)
            self._bind(name)

    def visit_FunctionDef(self, node):
        for expression in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expression is not None:
                self._read(expression)
        free = _free_in_body(node)  # looked up when it runs, whatever binds them then
        self.reads |= free
        self.uses |= free
        self._bind(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for expression in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self._read(expression)
        free = _free_in_body(node)
        self.reads |= free
        self.uses |= free
        self._bind(node.name)

    def visit_For(self, node):
        self._read(node.iter)
        self._bind_target(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node):
        for item in node.items:
            self._read(item.context_expr)
            if item.optional_vars is not None:
                self._bind_target(item.optional_vars)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_Delete(self, node):
        for target in node.targets:
            self._change(target, None)

    def visit_Global(self, node):
        for name in node.names:
            self._bind(name)

    def generic_visit(self, node):
        """if/while/try/match/expressions: read every expression, visit nested statements in order."""
        for _, value in ast.iter_fields(node):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, ast.stmt):
                    self.visit(item)
                elif isinstance(item, ast.excepthandler):
                    if item.type is not None:
                        self._read(item.type)
                    if item.name:
                        self._bind(item.name)
                    for statement in item.body:
                        self.visit(statement)
                elif isinstance(item, ast.match_case):
                    for statement in item.body:
                        self.visit(statement)
                elif isinstance(item, ast.expr):
                    self._read(item)


def _free_in_body(node):
    """Names a function's or class's body loads without binding them locally: globals, read when it runs."""
    local, loads = set(), set()
    for child in ast.walk(node):
        if isinstance(child, ast.arg):
            local.add(child.arg)
        elif isinstance(child, ast.Name):
            (local if isinstance(child.ctx, (ast.Store, ast.Del)) else loads).add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child is not node:
            local.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in child.names)
        elif isinstance(child, ast.Global):
            loads.update(child.names)
    return (loads - local) - BUILTIN_NAMES
