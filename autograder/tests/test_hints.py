"""No hint gives the answer away: no hint of any notebook in solutions/ contains a distinctive line of its
exercise's reference answer.

A hint guides (the idea, the shapes or the API, then the key step or, on a short exercise, a diagnostic: a shape
to print, a value to expect, the symptom of the common mistake); it never holds the answer's code. The check reads
each exercise's hints (the `<details>` blocks of the markdown cell right before its answer cell) and every line of
the answer's `### BEGIN SOLUTION` region, compared with all whitespace removed:
- a line is skipped when it is trivial: an import, `pass`, `break`, `continue`, `else:`, `return` of a name, a bare
  name, attribute or call without arguments (`model.eval()`), `self.x = x`, a loop over `range(n)`, or under 12
  characters once its comment and whitespace are gone;
- a distinctive line is found in a hint whole, or by its expression: what follows `return`, or the right-hand side
  of an assignment (`x = F.one_hot(ids, V)` is given away by a hint that says `F.one_hot(ids, V)`), when that
  expression is itself 12 characters or more.
(test_pipeline.test_no_solution_code_or_hidden_tests_in_course checks the release for whole lines with their
spacing; this test reads the hints for the code inside them, however it is spaced or embedded in prose.)
"""
import io
import re
import tokenize

import nbformat
import pytest

from autograder.config import SOLUTIONS_DIR
from autograder.submissions import is_answer_cell

HINT = re.compile(r"<details><summary>(Hint \d+: [^<]+)</summary>(.+?)</details>", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
MINIMUM = 12   # characters, whitespace removed: shorter lines (`x = x.T`, `i += 2`) say nothing distinctive
TRIVIAL = re.compile(r"(import |from \S+ import |pass$|break$|continue$|else:$|try:$|finally:$|return [\w.]+$"
                     r"|super\(\)\.__init__\(\)$|with [\w.]+\(\):$|self\.(\w+) = (\w+)$"
                     r"|for [\w, ]+ in range\([\w.]+\)[):]*$)")   # ... `for _ in range(num_layers))`: a loop over a count
BARE = re.compile(r"[\w.]+(\(\))?$")   # a name, an attribute, a call without arguments: `hf.embeddings`, `model.eval()`
ASSIGNMENT = re.compile(r"^[\w.\[\], ()*]+?\s*(?:[-+*/@|&]?=)(?!=)\s*(.+)$")



def without_comment(line):
    """The line without its `#` comment (a `#` inside a string stays), by Python's own tokenizer where the line
    tokenizes on its own, else by a scan of the quotes."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
        comments = [t for t in tokens if t.type == tokenize.COMMENT]
        return (line.strip()[:comments[0].start[1]] if comments else line.strip()).strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        quote = None
        for i, char in enumerate(line):
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "#":
                return line[:i].strip()
        return line.strip()


def squeeze(text):
    return re.sub(r"\s+", "", text)


def distinctive(answer_source):
    """{squeezed text: the answer line it comes from} for each distinctive line and its expression."""
    found = {}
    for region in SOLUTION.findall(answer_source):
        for raw in region.splitlines():
            line = without_comment(raw)
            if not line or TRIVIAL.match(line) or BARE.match(line) or line.startswith(("'''", '"""')):
                continue
            candidates = [line]
            if line.startswith("return "):
                candidates.append(line[len("return "):])
            elif match := ASSIGNMENT.match(line):
                candidates.append(match.group(1))
            for candidate in candidates:
                if len(squeeze(candidate)) >= MINIMUM and not BARE.match(candidate.strip()):
                    found.setdefault(squeeze(candidate), line)
    return found


def exercises(nb):
    """(grade_id, [(hint title, hint text)], answer source) for every answer cell of the notebook."""
    for index, cell in enumerate(nb.cells):
        if is_answer_cell(cell) and not cell.metadata.nbgrader.get("grade"):
            before = nb.cells[index - 1] if index else None
            hints = HINT.findall(before.source) if before is not None and before.cell_type == "markdown" else []
            yield cell.metadata.nbgrader["grade_id"], hints, cell.source


def leaks(nb):
    """[(grade_id, hint title, answer line)] for every hint that holds a distinctive line of its answer."""
    found = []
    for grade_id, hints, answer in exercises(nb):
        lines = distinctive(answer)
        for title, text in hints:
            hint = squeeze(text)
            found += sorted({(grade_id, title, line) for candidate, line in lines.items() if candidate in hint})
    return found


NOTEBOOKS = sorted(SOLUTIONS_DIR.glob("*/*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_no_hint_holds_a_line_of_its_answer(path):
    found = leaks(nbformat.read(path, as_version=4))
    assert not found, f"{path.parent.name}: hints that give the answer's code away:\n" + "\n".join(
        f"  {grade_id}, {title}: {line}" for grade_id, title, line in found)


def test_every_notebook_is_read():
    assert len(NOTEBOOKS) >= 11
    for path in NOTEBOOKS:
        assert list(exercises(nbformat.read(path, as_version=4))), f"{path}: no answer cells found"


def fake_notebook(hint_text):
    answer = ("def one_hot(ids, vocab_size):\n    \"\"\"(...,) -> (..., V)\"\"\"\n    ### BEGIN SOLUTION\n"
              "    import torch\n    positions = torch.arange(vocab_size)                # (V,)\n"
              "    return (ids.unsqueeze(-1) == positions).float()     # (..., 1) == (V,)\n"
              "    ### END SOLUTION\n")
    markdown = ("### Exercise 1: `one_hot`\n\n<details><summary>Hint 1: the idea</summary>\n\nCompare.\n\n</details>\n\n"
                f"<details><summary>Hint 2: the key step</summary>\n\n{hint_text}\n\n</details>")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), nbformat.v4.new_code_cell(answer)]
    nb.cells[1].metadata["nbgrader"] = {"grade": False, "grade_id": "one_hot_answer", "locked": False,
                                        "schema_version": 3, "solution": True, "task": False}
    return nb


@pytest.mark.parametrize("hint_text, leaked", [
    ("Write `return (ids.unsqueeze(-1) == positions).float()`.", "return (ids.unsqueeze(-1) == positions).float()"),
    ("Compare `(ids.unsqueeze(-1)==positions).float()` : a float tensor.", "return (ids.unsqueeze(-1) == positions).float()"),
    ("Start from\n`positions = torch.arange(\n    vocab_size)`.", "positions = torch.arange(vocab_size)"),
])
def test_the_check_finds_an_answer_line_in_a_hint(hint_text, leaked, tmp_path):
    """The check fails a notebook whose hint holds a line of the answer (whole, re-spaced, or its expression), read
    back from a notebook file as the real ones are."""
    path = tmp_path / "leaky.ipynb"
    nbformat.write(fake_notebook(hint_text), path)
    assert [line for _, _, line in leaks(nbformat.read(path, as_version=4))] == [leaked]
    with pytest.raises(AssertionError, match="give the answer's code away"):
        test_no_hint_holds_a_line_of_its_answer(path)


def test_the_check_passes_a_hint_that_points_to_a_diagnostic(tmp_path):
    path = tmp_path / "diagnostic.ipynb"
    nbformat.write(fake_notebook("Print `one_hot(torch.tensor([2, 0]), 4)`: expect `[[0, 0, 1, 0], [1, 0, 0, 0]]` in "
                                 "float32. A row of zeros means an id matched no column."), path)
    assert leaks(nbformat.read(path, as_version=4)) == []
    test_no_hint_holds_a_line_of_its_answer(path)
