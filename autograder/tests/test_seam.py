"""courselib.seam: a later notebook reaches the learner's earlier answers, or falls back on the references, and
says which (notebook 09 uses it for 03's RoPE, 05's GQA and 07's RMSNorm and SwiGLU)."""
import json

import nbformat
import pytest
import torch

from courselib import llama, seam
from autograder.submissions import released_path, solution_path

PIECES = [("03_positional_encoding", ("apply_rope",)), ("05_multi_head_attention", ("grouped_query_attention",)),
          ("07_encoder", ("RMSNorm", "SwiGLUFeedForward"))]


def place(folder, notebook, nb):
    (folder / notebook).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / notebook / f"{notebook}.ipynb")


def answer_cell(nb, name):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and f" {name}(" in c.source)


@pytest.fixture(autouse=True)
def self_study(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)


@pytest.mark.parametrize("notebook, names", PIECES)
def test_the_learners_finished_version_is_found_and_used(tmp_path, notebook, names, capsys):
    place(tmp_path, notebook, nbformat.read(solution_path(notebook), as_version=4))
    torch.manual_seed(3)
    expected_draw = torch.rand(4)
    torch.manual_seed(3)
    threads = torch.get_num_threads()
    found = seam.earlier(notebook, *names, root=tmp_path)
    found = found if isinstance(found, tuple) else (found,)
    assert torch.equal(torch.rand(4), expected_draw), "the notebook's import cell moved this notebook's random seed"
    assert torch.get_num_threads() == threads
    printed = capsys.readouterr().out.splitlines()
    for name, obj in zip(names, found):
        assert obj is not getattr(llama, name), f"{name}: the reference was used although the notebook is finished"
        assert obj.__module__ == f"earlier_{notebook}", obj.__module__
        assert any(line.startswith(f"{name}: yours, from {notebook}") for line in printed), printed


def test_an_unfinished_notebook_falls_back_with_the_reason(tmp_path, capsys):
    place(tmp_path, "07_encoder", nbformat.read(released_path("07_encoder"), as_version=4))
    norm, swiglu = seam.earlier("07_encoder", "RMSNorm", "SwiGLUFeedForward", root=tmp_path)
    assert norm is llama.RMSNorm and swiglu is llama.SwiGLUFeedForward
    printed = capsys.readouterr().out
    assert "RMSNorm: courselib's reference (07_encoder's answer raises NotImplementedError" in printed
    assert "SwiGLUFeedForward: courselib's reference" in printed


def test_a_missing_notebook_falls_back_with_the_reason(tmp_path, capsys):
    assert seam.earlier("03_positional_encoding", "apply_rope", root=tmp_path) is llama.apply_rope
    assert "apply_rope: courselib's reference (03_positional_encoding/03_positional_encoding.ipynb not found" in (
        capsys.readouterr().out)


def test_a_wrong_answer_falls_back_and_says_by_how_much(tmp_path, capsys):
    nb = nbformat.read(solution_path("07_encoder"), as_version=4)
    cell = answer_cell(nb, "RMSNorm")
    cell.source = cell.source.replace("torch.sqrt(mean_square + self.eps)", "(torch.sqrt(mean_square) + self.eps)")
    assert "(torch.sqrt(mean_square) + self.eps)" in cell.source, "07's RMSNorm answer changed: update this test"
    place(tmp_path, "07_encoder", nb)
    norm, swiglu = seam.earlier("07_encoder", "RMSNorm", "SwiGLUFeedForward", root=tmp_path)
    assert norm is llama.RMSNorm and swiglu is not llama.SwiGLUFeedForward
    assert "RMSNorm: courselib's reference (yours differs from it by" in capsys.readouterr().out


def test_a_broken_notebook_falls_back(tmp_path, capsys):
    (tmp_path / "05_multi_head_attention").mkdir()
    (tmp_path / "05_multi_head_attention" / "05_multi_head_attention.ipynb").write_text("{ truncated")
    assert seam.earlier("05_multi_head_attention", "grouped_query_attention", root=tmp_path) is (
        llama.grouped_query_attention)
    assert "is unreadable" in capsys.readouterr().out


def test_grading_always_takes_the_references(tmp_path, monkeypatch, capsys):
    place(tmp_path, "03_positional_encoding", nbformat.read(solution_path("03_positional_encoding"), as_version=4))
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert seam.earlier("03_positional_encoding", "apply_rope", root=tmp_path) is llama.apply_rope
    assert "graded runs use the references" in capsys.readouterr().out


def test_the_default_root_is_the_parent_of_the_current_folder(tmp_path, monkeypatch, capsys):
    place(tmp_path, "03_positional_encoding", nbformat.read(solution_path("03_positional_encoding"), as_version=4))
    (tmp_path / "09_gpt").mkdir()
    monkeypatch.chdir(tmp_path / "09_gpt")
    assert seam.earlier("03_positional_encoding", "apply_rope") is not llama.apply_rope


def test_only_known_names_are_served():
    with pytest.raises(KeyError):
        seam.earlier("03_positional_encoding", "sinusoidal_positional_encoding")


def test_every_reference_agrees_with_itself():
    """The smoke tests pass the references themselves (a smoke test that failed them would refuse every learner)."""
    for name in seam.REFERENCES:
        assert seam.vet(name, seam.reference(name), "a notebook") is seam.reference(name)


def test_answer_cells_named_in_the_references_exist():
    for name, (notebook, _) in seam.REFERENCES.items():
        cells = json.loads(solution_path(notebook).read_text())["cells"]
        assert any(c["metadata"].get("nbgrader", {}).get("solution") and f"{name}(" in "".join(c["source"])
                   for c in cells), f"{notebook} has no answer cell defining {name}"
