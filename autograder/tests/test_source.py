"""autograder/source.py: which cells a variant's answers reach (the replay reruns exactly those)."""
from autograder.source import cell_names


def reached(cells, tainted):
    """The indices of `cells` that use a tainted name, following the taint from cell to cell."""
    found, tainted = [], set(tainted)
    for index, source in enumerate(cells):
        touched, tainted = cell_names(source).follow(tainted)
        if touched:
            found.append(index)
    return found


def test_a_name_bound_afresh_from_untainted_names_is_untainted():
    cells = ["x = answer(3)", "y = x + 1", "x = 1", "z = x * 2"]
    assert reached(cells, {"answer"}) == [0, 1]


def test_a_binding_that_may_not_happen_keeps_the_taint():
    for rebinding in ("if flag:\n    x = 1", "for i in range(3):\n    x = i", "try:\n    x = 1\nexcept Exception:\n    pass"):
        assert reached(["x = answer()", rebinding, "z = x"], {"answer"}) == [0, 2], rebinding


def test_a_binding_inside_a_with_block_happens():
    cells = ["x = answer()", "with context():\n    x = fresh()", "z = x"]
    assert reached(cells, {"answer"}) == [0]


def test_a_rebinding_that_uses_a_tainted_name_stays_tainted():
    cells = ["x = answer()", "x = x + 1", "z = x"]
    assert reached(cells, {"answer"}) == [0, 1, 2]


def test_a_comprehension_variable_is_not_the_global_of_the_same_name():
    cells = ["s = answer()", "rates = [f(s) for s in range(16)]", "total = sum(s for s in rates)"]
    assert reached(cells, {"answer"}) == [0]
    assert reached(["s = answer()", "rates = [f(s, t) for t in range(3)]"], {"answer"}) == [0, 1]


def test_a_function_reads_its_globals_when_it_runs():
    cells = ["def helper():\n    return model(2)", "y = helper()"]
    assert reached(cells, {"model"}) == [0, 1]


def test_a_variant_that_wants_one_verdict_runs_only_what_that_test_needs():
    from autograder.replay import plan
    sources = ["def model(x):\n    return x",            # 0: the answer
               "check_model(model)",                      # 1: its test
               "trained = train(model)",                  # 2: an expensive cell
               "check_training(trained)",                 # 3: a later test that needs it
               "pair = (model(1), model(2))",              # 4
               "check_pair(pair)"]                         # 5: a later test that needs the cell before it
    tests = {1, 3, 5}
    everything = plan(sources, tests, {0: "def model(x):\n    return -x"})
    assert everything.run == [0, 1, 2, 3, 4, 5] and everything.undecided == []
    own = plan(sources, tests, {0: "def model(x):\n    return -x"}, targets={1})
    assert own.run == [0, 1] and own.undecided == [3, 5]
    later = plan(sources, tests, {0: "def model(x):\n    return -x"}, targets={1, 5})
    assert later.run == [0, 1, 4, 5] and later.undecided == [3]
