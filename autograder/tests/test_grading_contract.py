"""The grading contract of `python -m autograder check PATH --json`, and bad input handled cleanly."""
import json
import pathlib
import subprocess
import sys

import nbformat
import pytest

from autograder.config import REPO_ROOT
from autograder.grading import check_notebook
from autograder.submissions import released_path, solution_path, student_notebook
from autograder.tests.conftest import scores_by_test
from autograder.tests.variants import self_attention as variants

EXEMPLAR = "04_self_attention"
EXEMPLAR_POINTS = 14.0


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_json_is_one_object_with_the_contract_keys():
    result = run_cli("check", str(released_path(EXEMPLAR).relative_to(REPO_ROOT)), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert list(report) == ["notebook", "score", "max_score", "tests", "errors", "flags",
                            "stretch_score", "stretch_max_score"]
    assert report["notebook"] == EXEMPLAR and report["score"] == 0.0 and report["max_score"] == EXEMPLAR_POINTS
    for test in report["tests"]:
        assert list(test) == ["grade_id", "score", "max_score", "passed", "message"]
        assert test["passed"] is False and "NotImplementedError" in test["message"]


def test_cli_table_is_readable():
    result = run_cli("check", str(solution_path(EXEMPLAR)))
    assert result.returncode == 0, result.stderr
    assert f"{EXEMPLAR}: 14 / 14 points" in result.stdout
    assert "PASS  sdpa_mask" in result.stdout


@pytest.mark.parametrize("content", [b"", b"{not json", b"{\"cells\": 3}", "truncated"])
def test_unreadable_notebook_is_an_error_not_a_crash(tmp_path, content):
    if content == "truncated":
        content = released_path(EXEMPLAR).read_bytes()[:5000]
    path = tmp_path / f"{EXEMPLAR}.ipynb"
    path.write_bytes(content)
    report = check_notebook(path)
    assert report.score == 0 and report.max_score == EXEMPLAR_POINTS
    assert report.errors and "unreadable notebook" in report.errors[0]
    assert all(not t.passed for t in report.tests)


def test_missing_notebook_is_an_error(tmp_path):
    report = check_notebook(tmp_path / f"{EXEMPLAR}.ipynb")
    assert report.score == 0 and report.errors == [f"no notebook at {tmp_path / f'{EXEMPLAR}.ipynb'}"]


def test_unknown_assignment_is_an_error(tmp_path):
    path = tmp_path / "holiday_photos.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), path)
    report = check_notebook(path)
    assert report.score == 0 and "cannot tell which assignment" in report.errors[0]


def test_misnamed_notebook_is_recognised_by_its_cells(grade_in_tmp):
    report = grade_in_tmp(student_notebook(EXEMPLAR), EXEMPLAR, name="Copy of my homework (1).ipynb")
    assert report.notebook == EXEMPLAR and report.score == EXEMPLAR_POINTS


def without_cell(nb, grade_id):
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def cell_by_id(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_deleted_test_cell_is_restored_and_graded(grade_in_tmp):
    nb = without_cell(student_notebook(EXEMPLAR), "softmax_is_stable")
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.score == EXEMPLAR_POINTS
    assert any("softmax_is_stable" in f and "deleted" in f for f in report.flags), report.flags


def test_deleted_test_cell_still_catches_a_wrong_answer(grade_in_tmp):
    unstable = next(v for v in variants.MUTANTS if v.name == "softmax_unstable")
    nb = without_cell(student_notebook(EXEMPLAR, unstable.answers), "softmax_is_stable")
    assert not scores_by_test(grade_in_tmp(nb, EXEMPLAR))["softmax_is_stable"].passed


def test_hand_in_missing_answer_and_test_cells_is_graded_on_the_rest(grade_in_tmp):
    # a copy from before the stretch exercise existed, or a student who deleted an exercise: nbgrader
    # alone crashes (KeyError) placing the missing tests after their missing answer cell
    nb = student_notebook(EXEMPLAR)
    for grade_id in ("online_attention_answer", "stretch_online_attention_values",
                     "stretch_online_attention_memory", "softmax_answer"):
        nb = without_cell(nb, grade_id)
    report = grade_in_tmp(nb, EXEMPLAR)
    assert not report.errors, report.errors
    by_test = scores_by_test(report)
    assert not by_test["softmax_is_stable"].passed, "a deleted answer must not earn its tests' points"
    assert by_test["self_attention_by_hand_values"].passed, "the answers that were handed in must still be graded"
    assert report.stretch_score == 0
    for grade_id in ("online_attention_answer", "softmax_answer"):
        assert any(grade_id in f and "was missing" in f for f in report.flags), report.flags


def test_edited_test_cell_is_restored_from_the_source(grade_in_tmp):
    unstable = next(v for v in variants.MUTANTS if v.name == "softmax_unstable")
    nb = student_notebook(EXEMPLAR, unstable.answers)
    cell_by_id(nb, "softmax_is_stable").source = "pass  # nothing to see here"
    cell_by_id(nb, "softmax_matches_torch").metadata.nbgrader["points"] = 100
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.max_score == EXEMPLAR_POINTS, "points must come from the source, not the submission"
    assert not scores_by_test(report)["softmax_is_stable"].passed, "an emptied test cell must not pass"
    assert any("softmax_is_stable" in f and "edited" in f for f in report.flags), report.flags
    assert any("points changed" in f for f in report.flags), report.flags


def test_duplicated_test_cell_is_flagged_and_counted_once(grade_in_tmp):
    nb = student_notebook(EXEMPLAR)
    nb.cells.append(nbformat.from_dict(dict(cell_by_id(nb, "sdpa_mask"))))
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.score == EXEMPLAR_POINTS and report.max_score == EXEMPLAR_POINTS
    assert any("sdpa_mask" in f and "appears 2 times" in f for f in report.flags), report.flags


def test_infinite_loop_times_out_and_the_rest_is_graded(tmp_path):
    nb = student_notebook(EXEMPLAR, {"self_attention_by_hand_answer": "while True:\n    pass\n"})
    path = tmp_path / f"{EXEMPLAR}.ipynb"
    nbformat.write(nb, path)
    report = check_notebook(path, cell_timeout=20)  # room for a slow `import torch`
    tests = scores_by_test(report)
    assert not tests["self_attention_by_hand_values"].passed
    assert "NameError" in tests["self_attention_by_hand_values"].message
    assert report.score == EXEMPLAR_POINTS - 4, "only exercise 1 (4 points) may be lost"


def test_grading_and_test_kernels_get_sockets_nobody_else_can_take():
    """Over TCP, kernels started side by side can be handed the same port ("Address already in use")."""
    from autograder.config import nbgrader_config
    from autograder.execute import GuardedExecute
    from autograder.kernel_manager import private_socket_validator
    validator = private_socket_validator(config=nbgrader_config())
    executors = [GuardedExecute(config=nbgrader_config()), validator.preprocessors[-1](parent=validator)]
    managers = []
    for executor in executors:
        executor.nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
        managers.append(executor.create_kernel_manager())
    assert [m.transport for m in managers] == ["ipc", "ipc"], "grading kernels should use Unix sockets"
    prefixes = [m.ip for m in managers]
    assert len(set(prefixes)) == 2 and all(pathlib.Path(p).is_absolute() for p in prefixes), (
        f"each kernel needs a socket path of its own, not a shared or relative one: {prefixes}")
    assert all(len(p) < 90 for p in prefixes), f"a Unix socket path must stay short: {prefixes}"


def test_kernel_keys_are_never_kept_in_a_folder_others_can_read(tmp_path, monkeypatch):
    from autograder import kernel_manager
    monkeypatch.setattr(kernel_manager.tempfile, "gettempdir", lambda: str(tmp_path))
    assert kernel_manager.private_socket_prefix().startswith(str(tmp_path))
    kernel_manager.private_socket_folder().chmod(0o755)  # say another user made it first
    with pytest.raises(PermissionError, match="chmod 700"):
        kernel_manager.private_socket_prefix()


def test_kernel_crash_scores_zero_with_a_clear_reason(grade_in_tmp):
    nb = student_notebook(EXEMPLAR, {"softmax_answer": "import os\nos._exit(1)\n"})
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.score == 0 and report.max_score == EXEMPLAR_POINTS
    assert report.errors and "kernel died" in report.errors[0], report.errors


def test_tampering_scores_zero_and_is_flagged_for_review(grade_in_tmp):
    nb = student_notebook(EXEMPLAR, {"softmax_answer": (
        "import torch\nimport autograder.checks.common as grader\n"
        "grader.expect_close = lambda *args, **kwargs: None\ntorch.allclose = lambda *args, **kwargs: True\n"
        "def softmax(x, dim=-1):\n    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))\n")})
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.score == 0, f"tampering earned {report.score} points"
    assert any("answer cell 'softmax_answer' reaches the grader" in f for f in report.flags), report.flags
    assert any("expect_close was replaced or deleted" in f for f in report.flags), report.flags


def test_monkeypatching_a_library_scores_zero_and_is_flagged(grade_in_tmp):
    nb = student_notebook(EXEMPLAR, {"softmax_answer": (
        "import torch\ntorch.allclose = lambda *args, **kwargs: True\n"
        "def softmax(x, dim=-1):\n    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))\n")})
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.score == 0, f"monkeypatching earned {report.score} points"
    assert any("monkeypatching): `torch.allclose = " in f for f in report.flags), report.flags


def test_malformed_cell_metadata_is_graded_not_crashed(grade_in_tmp):
    nb = student_notebook(EXEMPLAR)
    cell_by_id(nb, "sdpa_mask").metadata.nbgrader["points"] = "lots"
    report = grade_in_tmp(nb, EXEMPLAR)
    assert report.max_score == EXEMPLAR_POINTS and report.score == EXEMPLAR_POINTS, report.errors
    assert any("points changed" in f for f in report.flags)


def test_a_test_that_finds_its_answer_undefined_names_the_error_that_stopped_the_answer_cell():
    """An answer cell that stops early (an import that fails) leaves its name undefined; the test's message says
    which error to fix, not only that the name is missing."""
    from autograder.grading import _failure_message

    def code(source, ename=None, evalue=""):
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])] if ename else []
        return cell
    undefined = code("check(FeedForward)", "NameError", "name 'FeedForward' is not defined")
    stopped = code("from courselib.blocks import FeedForward as F\nclass FeedForward(F): pass", "ImportError",
                   "the course's courselib.blocks is not available while 07_encoder is graded")
    visible = code("FeedForward(8, 32)", "NameError", "name 'FeedForward' is not defined")
    message = _failure_message(undefined, [stopped, visible, undefined])
    assert message.startswith("NameError: name 'FeedForward' is not defined: the cell above") and (
        "ImportError: the course's courselib.blocks is not available" in message), message
    # controls: a defining cell that ran, or a name no cell above mentions, give the bare error
    assert _failure_message(undefined, [code("x = 1"), undefined]) == "NameError: name 'FeedForward' is not defined"
    ran = code("class FeedForward: pass")
    assert _failure_message(undefined, [ran, visible, undefined]) == "NameError: name 'FeedForward' is not defined"
