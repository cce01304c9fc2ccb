"""nbgrader's Execute, hardened for hostile notebooks, and the preprocessor that acts on what it finds.

`GuardedExecute` runs the notebook in the `course-grading` kernel (limits + `autograder.guard`,
reached over private sockets: see kernel_manager.py),
caps each cell's output while it arrives (a print loop cannot fill the grader's memory; errors are
always kept, so a flood cannot hide a failing test), and runs one last cell of its own that asks the
guard what the notebook changed. `ZeroScoresOnTampering` then fails every test cell of a notebook
with findings, with the reason, before nbgrader saves the grades.
"""
import pathlib

from nbformat.v4 import new_code_cell, new_output
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, Unicode

from autograder import guard
from autograder.kernel_manager import PrivateSocketExecute

KERNELSPEC_DIR = pathlib.Path(__file__).resolve().parent / "jupyter" / "kernels"
GUARD_CELL_SOURCE = "__import__('autograder.guard').guard.report()"
NO_REPORT = ("the grader's final integrity check did not report back: code in the notebook "
             "rewrote, blanked or hid later cells")


class GuardedExecute(PrivateSocketExecute):

    kernel_name = Unicode("course-grading", help="the grading kernel (autograder/kernel.py)").tag(config=True)
    max_output_bytes_per_cell = Integer(1_000_000, help="output kept per cell; the rest is dropped").tag(config=True)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        km.kernel_spec_manager.kernel_dirs.append(str(KERNELSPEC_DIR))
        return km

    def preprocess(self, nb, resources=None, km=None):
        self._output_bytes = {}
        nb.cells.append(new_code_cell(GUARD_CELL_SOURCE, id="autograder-guard"))
        try:
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            guard_cell = nb.cells.pop()
        reports = [output["data"][guard.REPORT_MIME] for output in guard_cell.get("outputs", [])
                   if guard.REPORT_MIME in output.get("data", {})]
        findings = reports[0]["findings"] if reports else [NO_REPORT]
        resources["guard_findings"] = list(findings)
        return nb, resources

    def output(self, outs, msg, display_id, cell_index):
        if msg["msg_type"] != "error":
            size = _size(msg["content"])
            used = self._output_bytes.get(cell_index, 0)
            self._output_bytes[cell_index] = used + size
            if used + size > self.max_output_bytes_per_cell:
                if used <= self.max_output_bytes_per_cell:
                    outs.append(new_output("stream", name="stdout", text=(
                        f"\n[grader] output beyond {self.max_output_bytes_per_cell:,} bytes "
                        "in this cell was dropped\n")))
                return None
        return super().output(outs, msg, display_id, cell_index)


def _size(content):
    if "text" in content:
        return len(content["text"])
    return sum(len(str(value)) for value in content.get("data", {}).values())


class ZeroScoresOnTampering(NbGraderPreprocessor):
    """Fail every test cell of a notebook whose guard reported findings, saying why."""

    def preprocess(self, nb, resources):
        findings = resources.get("guard_findings") or []
        nb.metadata["autograder"] = {"guard_findings": findings}
        if findings:
            reason = ("The grading environment was changed by code in this notebook, so no test can "
                      "be trusted: " + "; ".join(findings[:5]) + ". The notebook scores 0 and is "
                      "flagged for review.")
            for cell in nb.cells:
                if cell.cell_type == "code" and utils.is_grade(cell):
                    cell.outputs.append(new_output("error", ename="GradingEnvironmentChanged",
                                                   evalue=reason, traceback=[reason]))
        return nb, resources
