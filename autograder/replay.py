"""Grade many variants of one notebook in one grading kernel: how the test suite proves its mutants fast.

The suite holds hundreds of variants (autograder/tests/variants/): mutants that must lose points with a
teaching message, alternatives that must keep full marks. Graded one by one through the real path
(`grading.check_notebook`), each starts a sandboxed kernel, imports torch and runs every cell of its
notebook, training included: most of what it runs is the same for every variant of that notebook.

`replay(assignment_id, variants)` runs the same real path once, for the notebook filled with the
reference answers: nbgrader's autograde in the OS sandbox, the course's `GuardedExecute`, the judges,
the gradebook. Then, in that same kernel, before it shuts down, `ReplayExecute` grades each variant by
running only the cells the variant reaches:
1. the answer cells it replaces, with its sources;
2. every later test cell that reads or changes, directly or through earlier cells, a name those answers
   bind (autograder/source.py reads this off the sources), and the cells such test cells need; or, for
   a variant whose caller wants only some verdicts (a mutant's own tests), those test cells among them;
3. each cell starts from the random state (torch, NumPy, `random`) that the reference run had at that
   cell, so that a test with unseeded inputs sees the inputs a full run would give it;
4. test cells are armed with the tokens a full grading run with the same key would give them, their
   probes' data are judged by the same judges (`GuardedExecute._judge` and autograder/judging.py), the
   guard reports with a token of the variant's own, and the scores come from nbgrader's own
   `determine_grade` after the course's own post-processors (stderr relabelled, tampering zeroes);
   test cells the variant does not reach keep the reference run's verdicts;
5. before the next variant, the reference sources of the cells the last one left changed, and that the
   next one does not run itself, run again: the kernel is as the reference left it wherever the next
   variant reads it (mutants of one answer follow each other, so most need nothing put back), and a
   name a variant bound that its reference cell does not (a class of its own beside the answer) gets
   its value from before the variant back;
A variant that makes the guard report anything (tampering leaves the kernel changed) or kills the
kernel ends the replay: the remaining variants get a fresh kernel and a fresh reference run.

What this does not prove, the real path does: the suite grades every solution and release, the demo
class, the hostile suites and a sample of each notebook's mutants through `check_notebook`, and
checks that the replay's verdicts equal the real path's, test cell by test cell, for that sample
(autograder/tests/test_variants.py).
"""
import collections
import copy
import dataclasses
import logging
import pathlib
import tempfile
import time

import nbformat
from nbgrader import utils

from autograder import judging
from autograder.execute import GuardedExecute, guard_cell
from autograder.source import cell_names

RNG_STORE = "__autograder_replay_random_states__"  # in the kernel's namespace: the reference run's states
SHADOW_STORE = "__autograder_replay_shadowed__"   # the values of the names a variant is about to rebind


@dataclasses.dataclass
class Plan:
    """Which cells one variant runs (ascending indices), which of them put the kernel back after, and
    which reached test cells it leaves undecided (not among its targets, and needed by none of them)."""
    run: list
    restore: list
    undecided: list = dataclasses.field(default_factory=list)


def plan(sources, armed, replaced, targets=None):
    """The cells a variant that replaces the answer cells `replaced` ({index: new source}) must run.

    `sources` are the notebook's cells as graded (None for markdown), `armed` the indices of its test
    cells, `targets` those whose verdicts the caller wants (all of them by default). The names the
    replaced cells bind or change are tainted, and a later cell that uses a tainted name is reached
    (autograder/source.py); names bound by imports are library code, never tainted. Reached target
    cells run; any other reached cell runs only when a cell that runs after it reads what it taints.
    Afterwards the kernel gets back what the variant tainted and later cells read: the cells that ran,
    but test cells only when they bind a name that a cell reads before binding it."""
    targets = set(armed) if targets is None else set(targets)
    cells = {i: cell_names(s) for i, s in enumerate(sources) if s is not None}
    library = set().union(*(c.imports for c in cells.values())) - {"*"}
    tainted = set()
    for index, source in replaced.items():
        for version in (sources[index], source):
            found = cell_names(version)
            tainted |= set(found.binds) | {name for step in found.steps for _, name in step.changes}
            tainted |= {"*"} if found.opaque else set()
    tainted -= library
    reached = {}  # index -> the names it taints
    for index in range(min(replaced) + 1, len(sources)):
        if index in replaced or index not in cells:
            continue
        touched, after = cells[index].follow(tainted)
        if touched:
            reached[index] = after - tainted - library
            tainted = (after - library) | (after & {"*"})
    needed, wanted = set(), set()
    for index in sorted(reached, reverse=True):
        if index in targets or cells[index].opaque or "*" in wanted or reached[index] & wanted:
            needed.add(index)
            wanted |= cells[index].reads
    run = sorted(set(replaced) | needed)
    read_somewhere = set().union(*(c.reads for c in cells.values()))
    restore = [i for i in run if i not in armed or "*" in read_somewhere or reached.get(i, set()) & read_somewhere]
    return Plan(run, restore, sorted(i for i in reached if i in armed and i not in needed))


def shadowed_names(sources, replaced):
    """The names the variant's cells bind and the reference's cells in their place do not: a later put-back
    of those cells would leave them bound to the variant's objects."""
    names = set()
    for index, source in replaced.items():
        names |= cell_names(source).binds - cell_names(sources[index]).binds
    return sorted(names)


@dataclasses.dataclass
class Outcome:
    """One variant's grading: scores and messages per test cell, the notebook's flags, and errors."""
    scores: dict        # grade_id -> (score, max_score)
    messages: dict      # grade_id -> failure message ("" when passed)
    flags: list
    errors: list
    cells_run: int


class Restart(Exception):
    """The kernel is no longer as the reference left it (tampering found, or it died)."""


class ReplayExecute(GuardedExecute):
    """`GuardedExecute` that, once the reference notebook has run and been judged, grades the variants
    of `ReplayExecute.pending` in the same kernel (see the module's docstring)."""

    pending = None      # [(name, {answer grade_id: source}, the test grade_ids wanted or None for all)], set by
                        # replay() for the next autograde here
    results = None      # name -> Outcome, filled in as variants are graded
    reference_cpu_seconds = None  # the kernel's CPU seconds (imports included) once the reference run is judged

    def preprocess(self, nb, resources=None, km=None):
        self._pristine = [copy.deepcopy(cell) for cell in nb.cells]
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        if ReplayExecute.pending is not None and index < len(self._pristine):
            self._silent(f"{RNG_STORE} = globals().get({RNG_STORE!r}, {{}}); {RNG_STORE}[{index}] = ("
                         "__import__('torch').get_rng_state(), __import__('numpy').random.get_state(), "
                         "__import__('random').getstate())")
        return super().preprocess_cell(cell, resources, index)

    def finish(self, nb, resources=None):
        reference = super().finish(nb, resources)
        if ReplayExecute.pending is not None:
            if ReplayExecute.reference_cpu_seconds is None:
                ReplayExecute.reference_cpu_seconds = self._kernel_cpu_seconds()
            self._grade_variants(nb, resources, reference)
        return reference

    # ------------------------------------------------------------------------------- the variants
    def _grade_variants(self, nb, resources, reference):
        judged = copy.deepcopy(nb)  # the reference's cells, judged: what unreached test cells keep
        judged.cells.pop()          # the guard's cell
        sources = [cell.source if cell.cell_type == "code" else None for cell in self._pristine]
        answer_at = {cell.metadata.nbgrader["grade_id"]: i for i, cell in enumerate(self._pristine)
                     if utils.is_solution(cell)}
        saved = (self._received, self._reports, self._report_token, self._output_bytes, self._errors,
                 self._probe_bytes)
        graded_cells = list(nb.cells)  # nbclient puts each cell it runs back into the notebook: keep these
        dirty = []  # cells the last variant left as it ran them, to put back before a variant that reads them
        try:
            while ReplayExecute.pending:
                name, answers, wanted = ReplayExecute.pending[0]
                replaced = {answer_at[grade_id]: source for grade_id, source in answers.items()}
                targets = None if wanted is None else {i for i, (grade_id, _, _) in self._armed.items()
                                                       if grade_id in wanted}
                steps = plan(sources, set(self._armed), replaced, targets)
                # a cell the next variant runs anyway needs no putting back: mutants of one answer follow
                # each other, and each runs the cells the last one left
                self._put_back([index for index in dirty if index not in steps.run], resources)
                shadowed = shadowed_names(sources, replaced)
                self._silent(f"{SHADOW_STORE} = {{n: v for n, v in globals().items() if n in {shadowed!r}}}")
                try:
                    ReplayExecute.results[name] = self._grade_one(name, replaced, steps, judged, resources)
                    ReplayExecute.pending.pop(0)
                    dirty = steps.restore
                    # what the variant bound that its cell's reference does not (e.g. an RMSNorm of its own
                    # beside its Llama) gets its old value back, or goes if the name was not bound before
                    self._silent(f"[globals().pop(n, None) for n in {shadowed!r}]; "
                                 f"globals().update({SHADOW_STORE}); del {SHADOW_STORE}")
                except Restart as error:
                    ReplayExecute.pending.pop(0)
                    if error.args and isinstance(error.args[0], Outcome):
                        ReplayExecute.results[name] = error.args[0]
                    return
        finally:
            (self._received, self._reports, self._report_token, self._output_bytes, self._errors,
             self._probe_bytes) = saved
            nb.cells[:] = graded_cells

    def _fresh_capture(self, report_token):
        self._native_hits = {}
        self._received = collections.defaultdict(list)
        self._reports = []
        self._report_token = report_token
        self._output_bytes = collections.Counter()
        self._errors = collections.Counter()
        self._probe_bytes = 0

    def _grade_one(self, name, replaced, steps, judged, resources):
        self._fresh_capture(judging.token(self._key, "guard report", name))
        self._deadline = time.monotonic() + self.notebook_timeout  # each variant has the notebook's budget
        ran = {}
        try:
            # what the reference's versions of the replaced cells bound goes first: a variant whose cell fails
            # before it binds a name must not find the reference's object under it (a fresh kernel would not)
            unbound = sorted(set().union(*(cell_names(self._pristine[i].source).binds for i in replaced)))
            if unbound:
                self._silent(f"[globals().pop(n, None) for n in {unbound!r}]")
            for index in steps.run:
                cell = copy.deepcopy(self._pristine[index])
                if index in replaced:
                    cell.source = replaced[index]
                ran[index] = self._run(cell, resources, index)
            self.execute_armed(guard_cell(self._report_token), resources, self._guard_index)
        except Exception as error:  # the kernel died or stopped answering: no later variant may use it
            raise Restart(Outcome({}, {}, [], [f"the kernel could not run this variant: {type(error).__name__}: "
                                               f"{error}"], len(ran))) from None
        graded = copy.deepcopy(judged)
        for index, cell in ran.items():
            graded.cells[index] = cell
        saved = self._routes, self._taken
        self._routes, self._taken = self.read_source(graded, resources)   # the variant's own source
        try:
            findings = self._guard_findings()
            flags = self._judge(graded, indices=set(ran))
            review = list(self._routes)
        finally:
            self._routes, self._taken = saved
        outcome = score(graded, findings, flags, self.config, len(ran), review)
        for index in steps.undecided:  # reached, but no target needed it: its verdict is not known
            grade_id = self._armed[index][0]
            del outcome.scores[grade_id], outcome.messages[grade_id]
        if findings:
            raise Restart(outcome)
        return outcome

    def _put_back(self, indices, resources):
        """Run the reference's version of these cells again (each from the reference's random state)."""
        self._fresh_capture("none")
        self._deadline = time.monotonic() + self.notebook_timeout
        for index in sorted(indices):
            self._run(copy.deepcopy(self._pristine[index]), resources, index)

    def _run(self, cell, resources, index):
        """Run one cell as the grader does (armed if it is a test), from the reference's random state."""
        self._silent(f"_s = {RNG_STORE}[{index}]; __import__('torch').set_rng_state(_s[0]); "
                     "__import__('numpy').random.set_state(_s[1]); __import__('random').setstate(_s[2]); del _s")
        cell.outputs = []
        self.execute_armed(cell, resources, index)
        return cell

    def _kernel_cpu_seconds(self):
        """The kernel's CPU time so far, as the kernel itself reads it (`time.process_time()`)."""
        reply = self.wait_for_reply(self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                                    user_expressions={"cpu": "__import__('time').process_time()"}))
        if reply is None or reply["content"]["status"] != "ok":
            raise RuntimeError(f"the replay could not read the kernel's CPU time: {reply and reply['content']}")
        return float(reply["content"]["user_expressions"]["cpu"]["data"]["text/plain"])

    def _silent(self, code):
        """Run grader code in the kernel with no output and no trace in the notebook."""
        reply = self.wait_for_reply(self.kc.execute(code, silent=True, store_history=False, allow_stdin=False))
        if reply is None or reply["content"]["status"] != "ok":
            raise RuntimeError(f"the replay's own code failed in the kernel: {reply and reply['content']}")


def score(nb, findings, flags, config, cells_run, review=()):
    """Scores and messages of a graded notebook, by the course's post-processors and nbgrader's
    `determine_grade`, as `nbgrader autograde` computes them before it saves them."""
    from autograder.config import autograde_preprocessors
    from autograder.grading import _failure_message, graded_findings
    resources = {"guard_findings": findings, "judge_flags": flags, "review": list(review)}
    for step in autograde_preprocessors():
        if step.__name__ in ("GuardedExecute", "ClearMetadataPreprocessor", "SaveAutoGrades", "QueueForReview",
                             "AssignLatePenalties", "CheckCellMetadata", "SafeForViewers"):
            continue
        nb, resources = step(config=config).preprocess(nb, resources)
    scores, messages = {}, {}
    for cell in nb.cells:
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            grade_id = cell.metadata.nbgrader["grade_id"]
            earned, worth = utils.determine_grade(cell, logging.getLogger("replay"))
            scores[grade_id] = (float(earned), float(worth))
            messages[grade_id] = "" if earned >= worth else (_failure_message(cell, nb.cells) or "this test did not run")
    return Outcome(scores, messages, graded_findings(nb), [], cells_run)


def replay(assignment_id, variants, cell_timeout=None, wanted=None):
    """Grade `variants` ({name: {answer grade_id: source}}) of one notebook; returns (the reference's
    Report from the real path, {name: Outcome}, the kernel's CPU seconds at the end of the reference run,
    imports included). Variants that need a fresh kernel get one.

    `wanted` ({name: test grade_ids}) limits a variant to the verdicts of those test cells (and of the
    cells they need): a mutant that must lose on its own exercise's tests does not also train the
    notebook's model. Its Outcome then leaves out every test cell it reached without deciding; the
    others (all, for a variant not in `wanted`) are decided as a full grading run decides them."""
    wanted = wanted or {}
    from autograder import grading
    from autograder.submissions import student_notebook
    source_nb = grading.source_notebook(assignment_id)
    results, remaining, reference = {}, dict(variants), None
    ReplayExecute.reference_cpu_seconds = None
    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        path = pathlib.Path(tmp) / f"{assignment_id}.ipynb"
        nbformat.write(student_notebook(assignment_id), path)
        while remaining or reference is None:
            ReplayExecute.pending = [(name, answers, wanted.get(name)) for name, answers in remaining.items()]
            ReplayExecute.results = results
            try:
                report = grading.check_notebook(path, assignment_id, cell_timeout, executor=ReplayExecute)
            finally:
                ReplayExecute.pending = None
            reference = reference or report
            graded_now = [name for name in remaining if name in results]
            if remaining and not graded_now:
                raise RuntimeError(f"the replay of {assignment_id} graded no variant: {report.errors}")
            for name in graded_now:
                del remaining[name]
    for name, answers in variants.items():
        results[name].flags[:0] = grading.integrity_flags(student_notebook(assignment_id, answers), source_nb)
    return reference, results, ReplayExecute.reference_cpu_seconds
