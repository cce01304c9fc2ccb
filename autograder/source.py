"""What a notebook's code cells bind, read and change, read from their source (never by running them).

`cell_names(source)` parses one cell as IPython would run it (magics and `!` lines become the
`get_ipython()` calls IPython makes of them) and returns `Names`:
- `binds`: the names the cell assigns at its top level (assignments, imports, `def`, `class`, loop and
  `with` targets, the walrus);
- `reads`: the global names it may read from earlier cells: names loaded at its top level before the
  cell binds them, and every name a function or class body of the cell loads without binding it
  (those are looked up when the function runs, which may be later);
- `changes`: the names whose objects it may change in place: `x.attr = ...`, `x[i] = ...`, `del x[i]`,
  `x += ...` on an attribute or item, method calls `x.step()`, and names handed to a call as arguments.

A cell that does not parse reads and changes everything (`Names.opaque`). The test suite's replay
(autograder/replay.py) uses this to decide which cells a changed answer reaches.
"""
import ast
import builtins
import dataclasses
import functools

EVERYTHING = frozenset({"*"})
BUILTIN_NAMES = frozenset(dir(builtins))


@dataclasses.dataclass(frozen=True)
class Names:
    binds: frozenset
    reads: frozenset
    changes: frozenset
    imports: frozenset = frozenset()   # the names it binds with `import` (modules and library functions)

    @property
    def opaque(self):
        return self.reads == EVERYTHING

    def touches(self, names):
        """Does this cell read or change any of `names`?"""
        return self.opaque or "*" in names or bool((self.reads | self.changes) & names)


def python_source(source):
    """The cell as Python: IPython's transformations (magics, shell escapes) applied."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


@functools.lru_cache(maxsize=4096)
def cell_names(source):
    try:
        tree = ast.parse(python_source(source))
    except (SyntaxError, ValueError):
        return Names(frozenset(), EVERYTHING, EVERYTHING)
    visitor = _TopLevel()
    for statement in tree.body:
        visitor.visit(statement)
    return Names(frozenset(visitor.binds), frozenset(visitor.reads - BUILTIN_NAMES), frozenset(visitor.changes),
                 frozenset(visitor.imports))


def _base_name(node):
    """`x` for x, x.a.b, x[i], x.a[i].b; None for anything else (a call's result, a literal)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _TopLevel(ast.NodeVisitor):
    """Walks a cell's top-level statements in order."""

    def __init__(self):
        self.binds, self.reads, self.changes, self.imports = set(), set(), set(), set()

    # -- binding
    def _bind_target(self, target):
        if isinstance(target, ast.Name):
            self.binds.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind_target(element)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value)
        else:  # x.attr = ..., x[i] = ...: changes x in place, and reads what the target reads
            base = _base_name(target)
            if base:
                self.changes.add(base)
            self._read_expression(target, skip_base=True)

    def _read_expression(self, node, skip_base=False):
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id not in self.binds:
                self.reads.add(child.id)
            elif isinstance(child, ast.NamedExpr):
                self.binds.add(child.target.id)
            elif isinstance(child, ast.Call):
                self._note_call(child)
        if skip_base:
            base = _base_name(node)
            if base and base not in self.binds:
                self.reads.add(base)

    def _note_call(self, call):
        if isinstance(call.func, ast.Attribute):  # x.method(...): may change x
            base = _base_name(call.func)
            if base:
                self.changes.add(base)
        for argument in [*call.args, *(k.value for k in call.keywords)]:
            base = _base_name(argument)
            if base:
                self.changes.add(base)  # handed to a function: it may change the object

    # -- statements
    def visit_Assign(self, node):
        self._read_expression(node.value)
        for target in node.targets:
            self._bind_target(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._read_expression(node.value)
        self._bind_target(node.target)

    def visit_AugAssign(self, node):
        self._read_expression(node.value)
        self._read_expression(node.target, skip_base=True)
        base = _base_name(node.target)
        if base:
            self.changes.add(base)
            if isinstance(node.target, ast.Name):
                self.binds.add(base)

    def visit_Import(self, node):
        for alias in node.names:
            self.imports.add((alias.asname or alias.name).split(".")[0])
        self.binds |= self.imports

    def visit_ImportFrom(self, node):
        for alias in node.names:
            self.imports.add("*" if alias.name == "*" else alias.asname or alias.name)
        self.binds |= self.imports

    def visit_FunctionDef(self, node):
        for decorator in node.decorator_list:
            self._read_expression(decorator)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self._read_expression(default)
        self.reads |= _free_in_body(node)  # looked up when it runs, whatever binds them then
        self.binds.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for expression in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self._read_expression(expression)
        self.reads |= _free_in_body(node)
        self.binds.add(node.name)

    def visit_For(self, node):
        self._read_expression(node.iter)
        self._bind_target(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node):
        for item in node.items:
            self._read_expression(item.context_expr)
            if item.optional_vars is not None:
                self._bind_target(item.optional_vars)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_Delete(self, node):
        for target in node.targets:
            base = _base_name(target)
            if base:
                self.changes.add(base)

    def visit_Global(self, node):
        self.binds.update(node.names)

    def generic_visit(self, node):
        """if/while/try/expressions...: read every expression, visit nested statements in order."""
        for field, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, ast.stmt):
                    self.visit(item)
                elif isinstance(item, ast.excepthandler):
                    if item.type is not None:
                        self._read_expression(item.type)
                    if item.name:
                        self.binds.add(item.name)
                    for statement in item.body:
                        self.visit(statement)
                elif isinstance(item, ast.expr):
                    self._read_expression(item)
                elif isinstance(item, (ast.match_case,)):
                    for statement in item.body:
                        self.visit(statement)


def _free_in_body(node):
    """Names a function's or class's body loads without binding them locally: globals, read when it runs."""
    local = set()
    loads = set()
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
    return loads - local
