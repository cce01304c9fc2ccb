"""Every hidden check of a solution, under many hidden-test keys: `python tools/sweep_keys.py [--keys 200] [--alternatives] [NN_topic ...]`.

A key decides a check's hidden inputs (autograder/judging.py), and a class is graded with one key: a
check that fails a correct answer on 1 key in 25 costs every student of an unlucky class its points.
This runs each solution notebook once, in this process, under grading (NBGRADER_EXECUTION, so the
notebooks that train take their short runs), in IPython's own shell; where a test cell calls its hidden
check, the check's probe and judge run for every key, on the notebook's state at that cell. It prints
one line per check (keys passed / tried, the first failing key and message) and writes the whole result
to test-artifacts/key-sweep.json. Exit code 1 if any check failed any key.

`--alternatives` also sweeps every alternative correct answer of the suite (autograder/tests/variants):
the solution with that alternative's answer cells, every check from its first answer cell on under every
key (the checks above it see the solution's state, swept already), since a student's correct answer that
differs from the reference in its rounding must pass on every key too.
"""
import argparse
import contextlib
import io
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def sweep(assignment_id, keys, answers=None):
    """{check ref: result} of the solution notebook, with `answers` ({grade_id: source}) in its answer cells."""
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    from autograder import wire
    from autograder.checks import common
    from autograder.submissions import is_answer_cell, solution_path

    results = {}
    original_call = common.Check.__call__
    reached = [not answers]  # sweeping yet? (an alternative: from its first answer cell on)

    def every_key(check, *student):
        if not reached[0]:
            return original_call(check, *student)
        tried, failures, started = 0, [], time.perf_counter()
        for n in range(keys):
            seeds = common.Seeds(f"sweep-{n}")
            tried += 1
            try:
                check.decide(seeds, wire.decode(check.run_probe(seeds, *student)))
            except BaseException as error:  # noqa: BLE001 (a failure of any kind is a finding)
                failures.append((f"sweep-{n}", f"{type(error).__name__}: {str(error)[:300]}"))
        results[check.ref] = {"tried": tried, "failed": len(failures), "failures": failures[:5],
                              "seconds": round(time.perf_counter() - started, 1)}
        first = f"; first: {failures[0][0]}: {failures[0][1][:160]}" if failures else ""
        print(f"  {check.ref.split(':')[1]:<48} {tried - len(failures)}/{tried}{first}", file=sys.__stdout__, flush=True)

    nb = nbformat.read(solution_path(assignment_id), as_version=4)
    answer_ids = {cell.metadata.nbgrader["grade_id"] for cell in nb.cells if is_answer_cell(cell)}
    if set(answers or {}) - answer_ids:
        raise KeyError(f"no answer cells {sorted(set(answers) - answer_ids)} in {assignment_id}")
    shell = InteractiveShell.instance()
    os.chdir(solution_path(assignment_id).parent)
    common.Check.__call__ = every_key
    try:
        for cell in nb.cells:
            if is_answer_cell(cell) and cell.metadata.nbgrader["grade_id"] in (answers or {}):
                cell.source, reached[0] = answers[cell.metadata.nbgrader["grade_id"]], True
            if cell.cell_type == "code":
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its prints
                    outcome = shell.run_cell(cell.source, silent=True)
                if outcome.error_in_exec is not None and "BEGIN HIDDEN TESTS" in cell.source:
                    print(f"  a test cell failed: {outcome.error_in_exec!r}", flush=True)
    finally:
        common.Check.__call__ = original_call
        InteractiveShell.clear_instance()
    return results


def main(argv=None):
    from autograder.config import assignment_ids
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="default: every notebook")
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--alternatives", action="store_true", help="also every alternative correct answer")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    import matplotlib
    matplotlib.use("Agg")
    everything, failed = {}, 0
    for assignment_id in args.assignments or assignment_ids():
        print(f"{assignment_id} ({args.keys} keys per check)", flush=True)
        started = time.perf_counter()
        runs = {assignment_id: None}
        if args.alternatives:
            from autograder.tests.variants import variants_by_assignment
            runs.update({f"{assignment_id} with the alternative {v.name}": v.answers
                         for v in variants_by_assignment().get(assignment_id, ((), ()))[1]})
        for name, answers in runs.items():
            if answers:
                print(f"{name}", flush=True)
            everything[name] = sweep(assignment_id, args.keys, answers)
            failed += sum(1 for r in everything[name].values() if r["failed"])
        print(f"  {sum(len(everything[name]) for name in runs)} checks in {time.perf_counter() - started:.0f} s",
              flush=True)
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "key-sweep.json").write_text(json.dumps({"keys": args.keys, "notebooks": everything}, indent=1))
    print(f"{sum(len(r) for r in everything.values())} checks, {failed} failed at least one key")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
