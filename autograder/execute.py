"""nbgrader's Execute, hardened for hostile notebooks, and the preprocessor that acts on what it finds.

`GuardedExecute` runs the notebook in the `course-grading` kernel (limits, the guard and, where the
machine allows, an OS sandbox: see kernel.py and kernel_manager.py), and
- arms every test cell with a hidden check, takes the probes' data out of the message stream, and
  judges each such cell in this process once the notebook has run (autograder/judging.py): the
  verdict never depends on code running beside the student's;
- caps output while it arrives, over every message type (streams, display data and its metadata,
  display updates, results, comms): per cell and per notebook. Errors are always kept (shortened),
  so a flood cannot hide a failing test, and the saved notebook stays small;
- runs one last cell of its own that asks the guard what the notebook changed; the report counts
  only with this run's token, and only once.
`ZeroScoresOnTampering` then fails every test cell of a notebook with findings (tampering the grader saw
happen), with the reason, before nbgrader saves the grades, and records the judges' flags and what the source
only suggests (routes, autograder/integrity.py), which `QueueForReview` puts in nbgrader's manual-grading queue
with every point the notebook earned kept.
"""
import collections
import json
import os
import pathlib
import time

from nbformat.v4 import new_code_cell, new_output
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from jupyter_client.kernelspec import KernelSpecManager
from traitlets import Enum, Integer, Unicode

from autograder import guard, judging
from autograder.kernel_manager import PrivateSocketExecute, PrivateSocketKernelManager, SandboxedKernelManager
from autograder.sandbox import MODES as SANDBOX_MODES

KERNELSPEC_DIR = pathlib.Path(__file__).resolve().parent / "jupyter" / "kernels"
NO_REPORT = ("the grader's final integrity check did not report back: code in the notebook "
             "rewrote, blanked or hid later cells")
FORGED_REPORT = "more than one integrity report arrived: code in the notebook forged one"
MAX_ERROR_CHARS = 20_000      # of one error's message and traceback
MAX_ERRORS_PER_CELL = 3
GRADER_MIMES = (guard.PROBE_MIME, guard.REPORT_MIME)
NOTEBOOK_TIMEOUT = ("the notebook ran past its time budget ({} s of wall-clock time), so this cell did not run: "
                    "look for cells that wait or loop for long")


def code_cells(nb, assignment, skip=()):
    """(index, label, source) of each code cell the grader reads as it would run: the student's (answer cells,
    labelled by grade_id, and cells that are not the course's: "cell N") and the course's own (label None). A
    cell is the course's when its source is exactly as the current source or any release had it (releases.py),
    so a hand-in started before a fix is read as its student wrote it. Test cells and `skip` are left out."""
    from autograder import releases
    from autograder.grading import source_notebook
    current = releases.course_cells(source_notebook(assignment)) if assignment else set()
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or index in skip or utils.is_grade(cell):
            continue
        if utils.is_solution(cell):
            label = f"answer cell '{cell.metadata.nbgrader.get('grade_id', index)}'"
        else:
            course = assignment and releases.is_course_cell(assignment, "code", cell.source, current)
            label = None if course else f"cell {index + 1}"
        cells.append((index, label, cell.source))
    return cells


class GuardedExecute(PrivateSocketExecute):

    kernel_name = Unicode("course-grading", help="the grading kernel (autograder/kernel.py)").tag(config=True)
    max_output_bytes_per_cell = Integer(1_000_000, help="output kept per cell; the rest is dropped").tag(config=True)
    max_output_bytes_per_notebook = Integer(4_000_000, help="output kept per notebook").tag(config=True)
    max_probe_bytes_per_notebook = Integer(64_000_000, help="hidden tests' data received per notebook").tag(config=True)
    notebook_timeout = Integer(240, help="seconds of wall-clock time for the whole notebook: later cells do not "
                                         "run").tag(config=True)

    sandbox = Enum(list(SANDBOX_MODES), default_value="required",
                   help="run each kernel in the OS sandbox (autograder/sandbox.py): required, preferred "
                        "(unsandboxed where the machine cannot) or off").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        # Only the course's own kernelspec: never one named like it in a folder a student could write.
        km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[str(KERNELSPEC_DIR)], parent=km)
        if isinstance(km, SandboxedKernelManager):
            km.sandbox = self.sandbox
            if getattr(self, "_assignment", None):   # the course's answers to this notebook are not in its sandbox
                from autograder import answers
                km.overlays = answers.unreachable(self._assignment)
        return km

    def preprocess(self, nb, resources=None, km=None):
        self._assignment = (resources or {}).get("nbgrader", {}).get("assignment")
        self._started = time.perf_counter()
        self._timings = collections.Counter()   # where the notebook's grading time goes (make grade-benchmark)
        key = judging.run_key()
        self._output_bytes = collections.Counter()
        self._errors = collections.Counter()
        self._probe_bytes = 0
        self._received = collections.defaultdict(list)  # cell index -> probe messages
        self._reports = []
        self._armed = {}  # cell index -> (grade_id, check ref, token)
        for index, cell in enumerate(nb.cells):
            ref = judging.hidden_check_ref(cell.source) if utils.is_grade(cell) and cell.cell_type == "code" else None
            if ref:
                grade_id = cell.metadata.nbgrader["grade_id"]
                self._armed[index] = (grade_id, ref, judging.token(key, grade_id, ref))
        self._key = key
        self._native, self._native_hits, self._native_unavailable = None, {}, None
        self._deadline = time.monotonic() + self.notebook_timeout
        self._routes, self._taken = self.read_source(nb, resources)
        self._report_token = judging.token(key, "guard report")
        # The judges need torch (about 2 s to import): load them while the kernel starts and runs.
        self._warm_up = judging.load_checks_in_background(ref for _, ref, _ in self._armed.values())
        nb.cells.append(guard_cell(self._report_token))
        self._guard_index = len(nb.cells) - 1
        self._finished = None
        try:
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            nb.cells.pop()
            self.close_native_watch()
        if self._finished is None:  # the guard's cell never ran to its end
            self._finished = self.finish(nb)
        resources["guard_findings"], resources["judge_flags"] = self._finished
        resources["review"] = list(self._routes)
        self._timings["total"] = time.perf_counter() - self._started
        resources["timings"] = {name: round(seconds, 3) for name, seconds in self._timings.items()}
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        if "kernel_start" not in self._timings:   # the kernel started, its imports not yet made
            self._timings["kernel_start"] = time.perf_counter() - self._started
            self._take_baseline()
        started = time.perf_counter()
        result = self.execute_armed(cell, resources, index)
        kind = ("guard" if index == self._guard_index else "tests" if index in self._armed
                else "answer_cells" if utils.is_solution(cell) else "course_cells")
        self._timings[kind] += time.perf_counter() - started
        if index == self._guard_index:
            self._finished = self.finish(self.nb, resources)  # the kernel is still there (see replay.py)
        return result

    def execute_armed(self, cell, resources, index):
        """Run one cell; a test cell runs with the grader's `arm(token)` line in front. Past the notebook's
        budget a cell does not run (the guard's report, last, always does)."""
        if cell.cell_type == "code" and index != self._guard_index and time.monotonic() > self._deadline:
            cell.outputs = [new_output("error", ename="NotebookTimeoutError", evalue=NOTEBOOK_TIMEOUT.format(
                self.notebook_timeout), traceback=[NOTEBOOK_TIMEOUT.format(self.notebook_timeout)])]
            return cell, resources
        if index not in self._armed:
            return super().preprocess_cell(cell, resources, index)
        source = cell.source
        families = self._native_families(index)
        if not families:
            cell.source = judging.arm_line(self._armed[index][2]) + source
            try:
                return super().preprocess_cell(cell, resources, index)
            finally:
                cell.source = source
        # the hidden part alone, with the grader's breakpoints on the check's oracles (native_watch.py)
        visible, hidden = judging.split_hidden(source)
        outputs = []
        try:
            if visible.strip():
                cell.source = visible
                super().preprocess_cell(cell, resources, index)
                outputs = list(cell.outputs)
            if not judging.has_error(cell):
                cell.source = judging.arm_line(self._armed[index][2]) + hidden
                watched = time.perf_counter()
                self._native.arm(families)
                self._timings["native_watch"] += time.perf_counter() - watched
                try:
                    super().preprocess_cell(cell, resources, index)
                finally:
                    watched = time.perf_counter()
                    hits = self._native.disarm()
                    self._timings["native_watch"] += time.perf_counter() - watched
                if hits:
                    self._native_hits[index] = hits
                cell.outputs = outputs + list(cell.outputs)
            return cell, resources
        finally:
            cell.source = source

    def _native_families(self, index):
        """The native operators a test cell's check forbids, where the grader can watch them from outside the
        kernel (native_watch.py); () where there are none, or no watch. The watch starts with the first."""
        from autograder import native_watch
        grade_id, ref, _ = self._armed[index]
        try:
            families = native_watch.families_of(judging.resolve_check(ref).forbidden_names(complete=True))
        except RuntimeError:
            return ()
        if not families or self._native is False:
            return ()
        if self._native is None:
            ok, why = native_watch.available()
            watched = time.perf_counter()
            try:
                if not ok:
                    raise native_watch.Unavailable(why)
                self._native = native_watch.NativeWatch(native_watch.kernel_process(self._kernel_pid()))
                self._timings["native_watch"] += time.perf_counter() - watched
            except native_watch.Unavailable as error:
                self._native = False
                self._native_unavailable = str(error)
                native_watch.warn_once(str(error))
                return ()
        return families

    def _kernel_pid(self):
        """The host pid under which the kernel runs: the sandbox's first process, or the kernel itself."""
        pid = getattr(self.km, "sandbox_pid", None) or getattr(getattr(self.km, "provisioner", None), "pid", None)
        if not pid:
            from autograder import native_watch
            raise native_watch.Unavailable("the kernel's process is not known")
        return pid

    def close_native_watch(self):
        if self._native:
            self._native.close()
        self._native = None

    def _get_timeout(self, cell):
        """A cell's limit, cut to what is left of the notebook's budget."""
        limit = super()._get_timeout(cell)
        left = max(1, int(self._deadline - time.monotonic()) + 1)
        return left if limit is None or limit < 0 else min(limit, left)

    def finish(self, nb, resources=None):
        """After the last cell: the tampering the guard saw happen, and the judges' verdicts, as (findings,
        flags). What the source only suggests (self._routes) is kept apart: it is for review, not a zero."""
        findings = self._guard_findings()
        self._warm_up.join()
        judged = time.perf_counter()
        flags = self._judge(nb)
        self._timings["judges"] += time.perf_counter() - judged
        return findings, flags

    def read_source(self, nb, resources=None):
        """The grader's own reading of the hand-in (autograder/integrity.py), before anything runs:
        (routes: what the instructor should review, {test cell index: findings that fail it})."""
        from autograder import integrity
        assignment = (resources or {}).get("nbgrader", {}).get("assignment")
        cells = code_cells(nb, assignment, skip=self._armed)
        routes = integrity.route_findings([(label, source) for _, label, source in cells])
        calls = {index: (ref, integrity.hidden_call_arguments(nb.cells[index].source))
                 for index, (_, ref, _) in self._armed.items()}

        def forbidden(ref):
            try:
                return judging.resolve_check(ref).forbidden_names(complete=True)
            except RuntimeError:
                return ()
        return routes, integrity.taken_findings(cells, calls, forbidden)

    def process_message(self, msg, cell, cell_index):
        msg_type, content = msg["msg_type"], msg["content"]
        if msg_type in ("status", "execute_input", "clear_output"):
            return super().process_message(msg, cell, cell_index)
        data = content.get("data") if isinstance(content, dict) else None
        if isinstance(data, dict) and any(mime in data for mime in GRADER_MIMES):
            self._receive(msg_type, data, cell_index)
            return None
        if msg_type == "error":
            return self._keep_error(msg, cell, cell_index)
        size = len(json.dumps(content, default=str))
        used = self._output_bytes[cell_index]
        self._output_bytes[cell_index] += size
        self._output_bytes["notebook"] += size
        if used + size > self.max_output_bytes_per_cell or self._output_bytes["notebook"] > self.max_output_bytes_per_notebook:
            if used <= self.max_output_bytes_per_cell and not self._errors[("dropped", cell_index)]:
                self._errors[("dropped", cell_index)] += 1
                cell.outputs.append(new_output("stream", name="stdout", text=(
                    f"\n[grader] output beyond {self.max_output_bytes_per_cell:,} bytes in this cell "
                    f"(or {self.max_output_bytes_per_notebook:,} in the notebook) was dropped\n")))
            return None
        return super().process_message(msg, cell, cell_index)

    def _receive(self, msg_type, data, cell_index):
        """A message for the grader: kept aside (never saved), counted, only as display data."""
        if msg_type != "display_data":
            return  # a probe or report is only ever sent as display data: anything else is forged
        size = len(json.dumps(data, default=str))
        self._probe_bytes += size
        if self._probe_bytes > self.max_probe_bytes_per_notebook:
            return
        if guard.PROBE_MIME in data:
            probe = data[guard.PROBE_MIME]
            self._received[cell_index].append(probe if isinstance(probe, dict) else {})
        if guard.REPORT_MIME in data:
            self._reports.append(data[guard.REPORT_MIME] if isinstance(data[guard.REPORT_MIME], dict) else {})

    def _keep_error(self, msg, cell, cell_index):
        """Errors always count (a flood cannot hide a failing test), shortened, a few per cell."""
        self._errors[cell_index] += 1
        if self._errors[cell_index] > MAX_ERRORS_PER_CELL:
            return None
        content = msg["content"]
        content["evalue"] = str(content.get("evalue", ""))[:MAX_ERROR_CHARS]
        traceback, kept = [], 0
        for line in content.get("traceback", []) if isinstance(content.get("traceback"), list) else []:
            kept += len(str(line))
            if kept > MAX_ERROR_CHARS:
                traceback.append("[grader] traceback shortened")
                break
            traceback.append(str(line))
        content["traceback"] = traceback
        return super().process_message(msg, cell, cell_index)

    def _guard_findings(self):
        outside = self._outside_findings()
        reports = [r for r in self._reports if r.get("token") == self._report_token]
        if not reports:
            return [NO_REPORT] + outside
        findings = [str(f) for f in reports[0].get("findings", [])] if isinstance(reports[0].get("findings"), list) else [NO_REPORT]
        return findings + ([FORGED_REPORT] if len(self._reports) > 1 else []) + outside

    def _take_baseline(self):
        """The grader's own record of the watched namespaces (outside_guard.py), taken before any code of the
        notebook runs: where each dict is and what each name holds. None where it cannot be read later."""
        from autograder import native_watch, outside_guard
        self._baseline = None
        if not (outside_guard.available()[0] and native_watch.available()[0]):
            return
        try:
            self._kernel_process = native_watch.kernel_process(self._kernel_pid())
            reply = self.wait_for_reply(self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                                        user_expressions={"b": outside_guard.BASELINE_CODE}))
            self._baseline = outside_guard.parse_baseline(
                reply["content"]["user_expressions"]["b"]["data"]["text/plain"])
        except Exception as error:  # noqa: BLE001 (the in-kernel guard still reports; say why this did not)
            native_watch.warn_once(f"the watched namespaces cannot be read from outside: {error}")

    def _outside_findings(self):
        """Replacements in the watched namespaces, read from the kernel's memory by the grader."""
        from autograder import outside_guard
        if not getattr(self, "_baseline", None):
            return []
        try:
            return outside_guard.changes(self._kernel_process, self._baseline)
        except OSError as error:   # the kernel is gone (it crashed): what it did is said elsewhere
            return [] if not os.path.exists(f"/proc/{self._kernel_process}") else [
                f"the grader could not read the kernel's namespaces ({error})"]

    def _judge(self, nb, indices=None):
        """Decide every armed test cell (of `indices`) that ran without an error; return the flags for review."""
        flags = []
        for index, (grade_id, ref, cell_token) in self._armed.items():
            if indices is not None and index not in indices:
                continue
            cell = nb.cells[index]
            if index in self._native_hits:  # seen from outside the kernel: whatever it reported
                verdict = judging.native_verdict(grade_id, self._native_hits[index])
                cell.outputs.append(verdict.output())
                flags.append(verdict.flag)
                continue
            if index in self._taken:  # decided on the source, whatever the kernel reported
                verdict = judging.taken_verdict(grade_id, self._taken[index])
                if not judging.has_error(cell):
                    cell.outputs.append(verdict.output())
                flags.append(verdict.flag)
                continue
            if judging.has_error(cell):
                continue  # failing already (the visible part, or an unanswered exercise)
            verdict = judging.judge_cell(grade_id, ref, cell_token, self._received.get(index, []))
            if not verdict.passed:
                cell.outputs.append(verdict.output())
            if verdict.flag:
                flags.append(verdict.flag)
        return flags


def guard_cell(report_token):
    """The grader's last cell: the guard reports what the notebook changed, with this run's token."""
    return new_code_cell(f"__import__('autograder.guard').guard.report({report_token!r})", id="autograder-guard")


class ZeroScoresOnTampering(NbGraderPreprocessor):
    """Fail every test cell of a notebook whose guard reported findings, saying why; keep the
    judges' flags and the source's suggestions for review beside them for the report."""

    def preprocess(self, nb, resources):
        findings = bounded(resources.get("guard_findings") or [])
        nb.metadata["autograder"] = {"guard_findings": findings, "judge_flags": bounded(resources.get("judge_flags") or []),
                                     "review": bounded(resources.get("review") or []),
                                     "timings": resources.get("timings") or {}}
        if findings:
            reason = ("The grading environment was changed by code in this notebook, so no test can "
                      "be trusted: " + "; ".join(findings[:5]) + ". The notebook scores 0 and is "
                      "flagged for review.")
            for cell in nb.cells:
                if cell.cell_type == "code" and utils.is_grade(cell):
                    cell.outputs.append(new_output("error", ename="GradingEnvironmentChanged",
                                                   evalue=reason, traceback=[reason]))
        return nb, resources


MAX_FINDINGS = 20   # findings of one kind kept per notebook (a hostile notebook can make thousands)


def bounded(findings, limit=MAX_FINDINGS):
    """At most `limit` findings, and a line that counts the rest: a report stays readable and small."""
    findings = list(dict.fromkeys(map(str, findings)))
    return findings if len(findings) <= limit else [*findings[:limit], f"and {len(findings) - limit} more like these"]


class QueueForReview(NbGraderPreprocessor):
    """A notebook the grader only has suspicions about (its source reaches the grader's machinery or runs code
    indirectly: `exec`, `globals()`, a magic, a pickle) keeps every point it earned, and goes into nbgrader's
    manual-grading queue: the submitted notebook is flagged, its tests are marked as needing a manual grade
    (formgrader lists them; the instructor confirms or changes each score), and the first answer cell's
    comment says what to look at, cell by cell. Runs after SaveAutoGrades, on the same gradebook."""

    def preprocess(self, nb, resources):
        review = nb.metadata.get("autograder", {}).get("review") or []
        if not review:
            return nb, resources
        from nbgrader.api import Gradebook, MissingEntry
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gradebook:
            try:
                submitted = gradebook.find_submission_notebook(info["notebook"], info["assignment"], info["student"])
            except MissingEntry:
                return nb, resources
            submitted.flagged = True
            for grade in submitted.grades:
                grade.needs_manual_grade = True
            answers = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if utils.is_solution(c)]
            if answers:
                comment = gradebook.find_comment(answers[0], info["notebook"], info["assignment"], info["student"])
                comment.auto_comment = ("Flagged for review (every point earned is kept): "
                                        + "; ".join(review) + ".")
            gradebook.db.commit()
        return nb, resources


def run_as_learner(path, timeout=1800, extra_cells=()):
    """Execute the notebook at `path` as a learner's JupyterLab runs it: a plain kernel beside the notebook's
    own folder, without NBGRADER_EXECUTION, so every `courselib.training.grading()` branch takes the
    learner's path. `extra_cells` (sources) run after the notebook's own. Returns the executed notebook;
    raises nbclient's CellExecutionError at the first error."""
    import nbformat
    from nbclient import NotebookClient

    from autograder.grading import environment

    path = pathlib.Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    nb.cells += [new_code_cell(source) for source in extra_cells]
    with environment({"NBGRADER_EXECUTION": None, "HF_HUB_OFFLINE": "1"}):
        NotebookClient(nb, timeout=timeout, kernel_name="python3", kernel_manager_class=PrivateSocketKernelManager,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb
