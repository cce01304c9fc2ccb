"""The demo class that `make grade` grades: autograder/demo_class/submitted/<student>/<assignment>/.

Built from the course's own notebooks (`python -m autograder.demo` rewrites it; the test suite
fails if the committed copy is stale). Every student stands for a case an instructor meets:
a perfect class member, partial and empty work, broken files, runaway code and tampering.
`EXPECTED` says what each must get; the test suite grades the class and holds it to that.
"""
import copy
import pathlib
import shutil
import sys

import nbformat
from nbformat.v4 import new_code_cell

from autograder.config import REPO_ROOT, assignment_ids
from autograder.submissions import released_path, student_notebook
from autograder.tests.variants import self_attention as attention
from autograder.tests.variants import tokenization

DEMO_CLASS_DIR = REPO_ROOT / "autograder" / "demo_class"
A04, A01 = "04_self_attention", "01_tokenization"


def mutant(module, name):
    return next(v.answers for v in module.MUTANTS if v.name == name)


def alternative(module, name):
    return next(v.answers for v in module.ALTERNATIVES if v.name == name)


# Every answer of 04 wrong but runnable: what a tampering student hopes to pass with.
WRONG_ANSWERS_04 = {**mutant(attention, "by_hand_no_sqrt_scaling"),
                    **mutant(attention, "softmax_normalises_x_not_exp"),
                    **mutant(attention, "sdpa_no_sqrt_scaling")}


def with_cell(nb, source, after=1):
    """`nb` with an extra code cell (the student's own) after cell number `after`."""
    nb = copy.deepcopy(nb)
    nb.cells.insert(after + 1, new_code_cell(source, id="student-extra-cell"))
    return nb


def damaged_test_cells(nb):
    """Test cells deleted, edited, duplicated, re-pointed and unlocked: all restored by grading."""
    nb = copy.deepcopy(nb)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    nb.cells.remove(by_id["softmax_matches_torch"])
    by_id["sdpa_mask"].source = "# the test was in my way\npass"
    by_id["self_attention_by_hand_values"].metadata.nbgrader["points"] = 100
    by_id["sdpa_shapes"].metadata.nbgrader["locked"] = False
    duplicate = copy.deepcopy(by_id["sdpa_shapes"])
    duplicate.id = "sdpa-shapes-copy"
    nb.cells.insert(nb.cells.index(by_id["sdpa_shapes"]) + 1, duplicate)
    return nb


MONKEYPATCH = """\
import builtins, numpy, torch
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
numpy.testing.assert_allclose = lambda *args, **kwargs: None
builtins.all = lambda iterable: True
"""
BLANK_TEST_CELLS = """\
def skip_tests(lines):
    text = "".join(lines)
    return ["pass\\n"] if ("assert" in text or "check_" in text or "hidden" in text) else lines

get_ipython().input_transformers_cleanup.append(skip_tests)
"""
HIDE_TRACEBACKS = """\
ip = get_ipython()
ip.showtraceback = lambda *args, **kwargs: None
ip.set_custom_exc((Exception,), lambda *args, **kwargs: None)
"""
READ_GRADER_FILES = """\
import pathlib, sqlite3
for folder in pathlib.Path.cwd().parents:
    solution = folder / "solutions" / "04_self_attention" / "04_self_attention.ipynb"
    if solution.exists():
        print(solution.read_text()[:200])
    gradebook = folder / "gradebook.db"
    if gradebook.exists():
        sqlite3.connect(gradebook).execute("UPDATE grade SET manual_score = 100")
"""
ALWAYS_EQUAL = """\
class Anything(list):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

def bpe_encode(word, merges):
    return Anything()
"""


def truncated(nb):
    return nbformat.writes(nb)[:2500]


# student -> {assignment: (file name, notebook or text)}
def students():
    perfect_04 = student_notebook(A04)
    return {
        "ada": {a: (f"{a}.ipynb", student_notebook(a)) for a in assignment_ids()},
        "ben": {A04: (f"{A04}.ipynb", student_notebook(A04, {
                    **mutant(attention, "sdpa_no_sqrt_scaling"),
                    attention.SOFTMAX: _released_answer(A04, attention.SOFTMAX)})),
                A01: (f"{A01}.ipynb", student_notebook(A01, {
                    **mutant(tokenization, "encode_merges_first_known_pair_from_the_left"),
                    tokenization.BERT: _released_answer(A01, tokenization.BERT)}))},
        "cleo": {A04: (f"{A04}.ipynb", nbformat.read(released_path(A04), as_version=4)),
                 A01: (f"{A01}.ipynb", nbformat.read(released_path(A01), as_version=4))},
        "dev": {A04: (f"{A04}.ipynb", truncated(perfect_04))},
        "eli": {A04: ("Copy of my homework.ipynb", perfect_04)},
        "fin": {A04: ("05_multi_head_attention.ipynb", student_notebook("05_multi_head_attention"))},
        "gia": {A04: (f"{A04}.ipynb", damaged_test_cells(perfect_04))},
        "hal": {A04: (f"{A04}.ipynb", with_cell(perfect_04, "while True:  # oops\n    pass"))},
        "ivy": {A04: (f"{A04}.ipynb", with_cell(perfect_04, "import os\nos._exit(1)"))},
        "jon": {A04: (f"{A04}.ipynb", with_cell(perfect_04, "hog = bytearray(6 * 2**30)"))},
        "kai": {A04: (f"{A04}.ipynb", with_cell(perfect_04, (
                    "for i in range(300_000):\n    print('flooding the grader', i, '=' * 100)")))},
        "lia": {A04: (f"{A04}.ipynb", with_cell(student_notebook(A04, WRONG_ANSWERS_04), MONKEYPATCH))},
        "max": {A01: (f"{A01}.ipynb", student_notebook(A01, {tokenization.ENCODE: ALWAYS_EQUAL}))},
        "nia": {A04: (f"{A04}.ipynb", with_cell(student_notebook(A04, WRONG_ANSWERS_04), BLANK_TEST_CELLS))},
        "oto": {A04: (f"{A04}.ipynb", with_cell(student_notebook(A04, WRONG_ANSWERS_04), HIDE_TRACEBACKS))},
        "pia": {A04: (f"{A04}.ipynb", with_cell(nbformat.read(released_path(A04), as_version=4),
                                                READ_GRADER_FILES))},
        "quy": {A04: (f"{A04}.ipynb", student_notebook(A04, alternative(attention, "all_correct_but_noisy_on_stderr")))},
    }


def _released_answer(assignment, grade_id):
    nb = nbformat.read(released_path(assignment), as_version=4)
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


# What grading must conclude: (score "full" | "zero" | "partial", words the report line must contain)
EXPECTED = {
    ("ada", a): ("full", None) for a in assignment_ids()
} | {
    ("ben", A04): ("partial", None),
    ("ben", A01): ("partial", None),
    ("cleo", A04): ("zero", None),
    ("cleo", A01): ("zero", None),
    ("dev", A04): ("zero", "unreadable"),
    ("eli", A04): ("full", "handed in as 'Copy of my homework.ipynb'"),
    ("fin", A04): ("zero", "is the notebook of 05_multi_head_attention"),
    ("gia", A04): ("full", "was deleted; it was restored"),
    ("hal", A04): ("full", "ran past the time limit and was interrupted"),
    ("ivy", A04): ("zero", "kernel died"),
    ("jon", A04): ("full", "ran out of memory"),
    ("kai", A04): ("full", "printed too much"),
    ("lia", A04): ("zero", "torch.allclose was replaced"),
    # her encoder returns a list whose __eq__ is always true: the probe sends plain data, the judge compares it in
    # the grader, where that __eq__ never runs; so she loses that test and keeps the others (nothing to review)
    ("max", A01): ("partial", None),
    ("nia", A04): ("zero", "input transformers (cleanup) was changed"),
    ("oto", A04): ("zero", "custom exception handler was changed"),
    # In the OS sandbox the solutions and the gradebook are not there to open (unsandboxed, the guard
    # refuses them); either way the grader reads in her code that it opens a database.
    ("pia", A04): ("zero", "opens a database (the gradebook is one)"),
    ("quy", A04): ("full", None),
}


def build(target=DEMO_CLASS_DIR):
    """Write the demo class under target/submitted/ (replacing what was there)."""
    target = pathlib.Path(target)
    shutil.rmtree(target / "submitted", ignore_errors=True)
    for student, hand_ins in students().items():
        for assignment, (file_name, content) in hand_ins.items():
            path = target / "submitted" / student / assignment / file_name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                path.write_text(content)
            else:
                nbformat.write(content, path)
    return target


if __name__ == "__main__":
    print(f"wrote {build(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEMO_CLASS_DIR)}")
