"""`make grade-benchmark`: grade the demo class serially and with JOBS=2 in one run, and compare.

Prints and writes test-artifacts/grading-benchmark.json: wall time of each run, the ratio, whether
the two gradebooks agree test by test, seconds per notebook, and the floor (start a grading kernel
and run one cell), next to the median time per notebook of each assignment.
"""
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from autograder.classroom import DEMO_CLASS_DIR, Ledger, LEDGER, exercise_scores, grade_class
from autograder.config import REPO_ROOT, assignment_ids
from autograder.execute import KERNELSPEC_DIR


def kernel_floor_seconds(repeats=3):
    """Start the grading kernel (limits, guard, torch imported), run one cell, shut it down."""
    from autograder.kernel_manager import BlockingPrivateSocketKernelManager
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        manager = BlockingPrivateSocketKernelManager(kernel_name="course-grading")
        manager.kernel_spec_manager.kernel_dirs.append(str(KERNELSPEC_DIR))
        manager.start_kernel()
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        client.execute_interactive("import torch", timeout=60)
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 2)


def main(submissions=DEMO_CLASS_DIR):
    figures = {"load_average_before": os.getloadavg()[0], "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        runs = {}
        for jobs in (1, 2):
            root = pathlib.Path(tmp) / f"jobs{jobs}"
            summary = grade_class(submissions, root, jobs=jobs, quiet=True)
            runs[jobs] = (summary, exercise_scores(root, assignment_ids()), Ledger(root / LEDGER))
            print(f"JOBS={jobs}: {summary['notebooks_graded']} notebooks in {summary['grading_seconds']} s "
                  f"({summary['seconds_per_notebook']} s per notebook)", flush=True)
        serial, parallel = runs[1], runs[2]
        per_assignment = {}
        for (student, assignment), entry in serial[2].entries.items():
            if not entry["errors"] and not any("time limit" in f for f in entry["flags"]):
                per_assignment.setdefault(assignment, []).append(entry["seconds"])
        figures.update({
            "notebooks": serial[0]["notebooks_graded"], "students": serial[0]["students"],
            "serial_seconds": serial[0]["grading_seconds"], "jobs2_seconds": parallel[0]["grading_seconds"],
            "ratio_serial_over_jobs2": round(serial[0]["grading_seconds"] / parallel[0]["grading_seconds"], 2),
            "seconds_per_notebook_serial": serial[0]["seconds_per_notebook"],
            "seconds_per_notebook_jobs2": parallel[0]["seconds_per_notebook"],
            "same_scores_test_by_test": serial[1] == parallel[1],
            "tests_compared": len(serial[1]),
            "median_seconds_per_notebook": {a: round(statistics.median(t), 2)
                                            for a, t in sorted(per_assignment.items())},
            "floor_kernel_start_and_torch_import": kernel_floor_seconds(),
            "load_average_after": os.getloadavg()[0],
        })
    print(json.dumps(figures, indent=2))
    artifacts = REPO_ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "grading-benchmark.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["same_scores_test_by_test"] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
