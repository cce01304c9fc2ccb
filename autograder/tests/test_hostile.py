"""Tampering that the demo class doesn't show: each case must score 0 (or lose the tests it fakes),
with a line that says what happened. The demo class (test_classroom.py) covers the rest."""
import json

import numpy as np
import pytest
import torch

from autograder import demo, guard, wire
from autograder.config import REPO_ROOT, SOLUTIONS_DIR
from autograder.submissions import student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import self_attention as attention

A04 = "04_self_attention"
COURSE_LIBRARY_FILE = REPO_ROOT / "courselib" / "testing.py"

# (name, code in an extra cell of a notebook with wrong answers, words of the flag)
TAMPERING = [
    ("blanks_every_later_cell",
     "get_ipython().input_transformers_cleanup.append(lambda lines: [])",
     "did not report back"),
    ("removes_asserts_with_an_ast_transformer", """\
import ast
class NoChecks(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()
    def visit_Raise(self, node):
        return ast.Pass()
get_ipython().ast_transformers.append(NoChecks())""",
     "AST transformers was changed"),
    ("skips_lines_with_a_trace_function",
     "import sys\nsys.settrace(lambda frame, event, arg: None)",
     "trace function was changed"),
    ("patches_the_hidden_check_harness", """\
import importlib
harness = importlib.import_module("autograder.checks.common")
harness.expect_close = lambda *args, **kwargs: None""",
     "autograder.checks.common.expect_close was replaced"),
    ("patches_numpy_through_an_obfuscated_import",
     "setattr(__import__('nu' + 'mpy'), 'allclose', lambda *args, **kwargs: True)",
     "numpy.allclose was replaced"),
    ("reads_the_solutions",
     f"print(open({str(SOLUTIONS_DIR / A04 / (A04 + '.ipynb'))!r}).read()[:100])",
     "refused: opening"),
    ("runs_a_program_to_read_them",
     f"import subprocess\nsubprocess.run(['cat', {str(SOLUTIONS_DIR / A04 / (A04 + '.ipynb'))!r}])",
     "refused: starting a program"),
    ("rewrites_the_course_library_for_the_next_student",
     f"open({str(COURSE_LIBRARY_FILE)!r}, 'a').write('\\ncheck_close = lambda *a, **k: None\\n')",
     "refused: writing"),
]


@pytest.mark.parametrize("name,code,words", TAMPERING, ids=[case[0] for case in TAMPERING])
def test_tampering_scores_zero_and_is_flagged(grade_in_tmp, name, code, words):
    library_before = COURSE_LIBRARY_FILE.read_bytes()
    nb = demo.with_cell(student_notebook(A04, demo.WRONG_ANSWERS_04), code)
    try:
        report = grade_in_tmp(nb, A04)
        assert COURSE_LIBRARY_FILE.read_bytes() == library_before, "a student's code changed the course library"
    finally:  # never let a failure here poison the other tests
        if COURSE_LIBRARY_FILE.read_bytes() != library_before:
            COURSE_LIBRARY_FILE.write_bytes(library_before)
    assert report.score == 0, f"{name} earned {report.score} points: tampering was rewarded"
    flags = " | ".join(report.flags)
    assert words in flags, f"{name}: expected a flag saying '{words}', got: {flags}"


TENSOR_SUBCLASS = attention.sdpa("""
    class AlwaysClose(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return True if "close" in func.__name__ or "equal" in func.__name__ else \\
                super().__torch_function__(func, types, args, kwargs or {})
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return torch.zeros(*q.shape[:-1], v.shape[-1]).as_subclass(AlwaysClose), weights
""")


def test_tensor_subclass_that_fakes_comparisons_scores_zero_and_is_flagged(grade_in_tmp):
    """The grader reads the hook in the source (autograder/integrity.py); the wire would refuse the
    subclass anyway (test_only_plain_data_crosses_to_the_grader)."""
    report = grade_in_tmp(student_notebook(A04, {attention.SDPA: TENSOR_SUBCLASS}), A04)
    # the subclass's comparisons are never the ones that decide (the checks compare plain data in the grader):
    # the exercise fails on its own merits, the rest of the notebook keeps its points, and the hook goes to review
    assert not scores_by_test(report)["sdpa_values_match_torch"].passed, "a Tensor subclass faked torch.allclose"
    assert any("__torch_function__" in flag and attention.SDPA in flag for flag in report.flags), report.flags


class AlwaysEqual(list):
    def __eq__(self, other):
        return True


class AlwaysClose(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True


@pytest.mark.parametrize("result,words", [
    (AlwaysEqual(), "AlwaysEqual"),
    ([["a", AlwaysEqual()]], "AlwaysEqual"),
    (torch.zeros(2).as_subclass(AlwaysClose), "AlwaysClose"),
    ((torch.zeros(2).as_subclass(AlwaysClose), None), "AlwaysClose"),
    (torch.nn.Linear(2, 2), "Linear"),
    (lambda: 0, "function"),
])
def test_only_plain_data_crosses_to_the_grader(result, words):
    """A result that could fake a comparison never reaches the judge: it cannot be encoded."""
    with pytest.raises(wire.WireError, match=words):
        wire.encode(result)


@pytest.mark.parametrize("result", [[1, 2], {"a": [0.5]}, ("x", None), torch.zeros(2), {("a", "b"): 3},
                                    torch.nn.Parameter(torch.zeros(2)), np.float64(1), np.arange(3),
                                    float("nan"), 2**70, b"bytes", {1, 2}, torch.ones(2, dtype=torch.bfloat16)])
def test_plain_results_cross_unchanged(result):
    back = wire.decode(json.loads(json.dumps(wire.encode(result))))
    assert type(back) is (torch.Tensor if torch.is_tensor(result) else type(result))
    if torch.is_tensor(result):
        assert back.dtype == result.dtype and torch.equal(back, result.detach())
    elif isinstance(result, np.ndarray):
        assert np.array_equal(back, result)
    elif result == result:  # not NaN
        assert back == result


@pytest.mark.parametrize("message", [
    {"$tensor": {"dtype": "float32", "shape": [1000], "data": ""}},           # data shorter than its shape
    {"$tensor": {"dtype": "object", "shape": [1], "data": "AAAA"}},           # a dtype that could hold code
    {"$pickle": "gASV"},                                                      # an unknown tag
    {"$dict": [[[1], 2]]},                                                    # an unhashable key
    {"a": 1, "b": 2},                                                         # a bare JSON object
])
def test_malformed_data_is_refused(message):
    with pytest.raises(wire.WireError):
        wire.decode(message)


def test_audit_hook_refuses_writes_into_read_only_folders_even_under_the_temp_folder(tmp_path):
    """A CI clone lives under /tmp: the temp folder must not make the course writable."""
    hook = guard._make_audit_hook(denied=[str(tmp_path / "solutions")], read_only=[str(tmp_path)])
    hook("open", (str(tmp_path / "courselib" / "testing.py"), "r", 0))  # reading is fine
    with pytest.raises(PermissionError, match="writing"):
        hook("open", (str(tmp_path / "courselib" / "testing.py"), "a", 0))
    with pytest.raises(PermissionError, match="opening"):
        hook("open", (str(tmp_path / "solutions" / "04.ipynb"), "r", 0))
    with pytest.raises(PermissionError, match="starting a program"):
        hook("subprocess.Popen", ("cat", ["cat"], None, None))
    hook("open", (str(tmp_path.parent / "elsewhere.txt"), "w", 0))  # scratch files elsewhere are fine
