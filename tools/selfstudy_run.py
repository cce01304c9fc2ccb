"""Run a notebook's self-study path, as a learner's JupyterLab runs it, and report its training runs.

    python tools/selfstudy_run.py                          # solutions/09_gpt/09_gpt.ipynb
    python tools/selfstudy_run.py PATH --save executed.ipynb
    python tools/selfstudy_run.py --sweeps                 # 09 with its optional seed sweeps (RUN_SWEEPS = True)

Grading (`NBGRADER_EXECUTION`) shortens every training run; this runs the notebook without it, in a plain
kernel beside its own folder (so that notebook 09's seam finds notebooks 03, 05 and 07 beside it), and prints
the wall-clock and kernel CPU time of the whole notebook and the lines the training cells print: steps,
tokens per second, minutes, held-out perplexity, bits per byte, tokens per parameter, and (with --sweeps, which
turns on notebook 09's optional section 10) the sweeps' table and cost. Nothing is written unless --save is given.
"""
import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
REPORTED = ("steps,", "held-out loss", "perplexity on held-out", "parameters, held-out loss", "largest difference",
            "logits at initialisation", "loss at initialisation", ": yours, from", ": courselib's reference",
            "bits per byte", "tokens per parameter", "more parameters than", "the step took", "steps for the batch",
            "RUN_SWEEPS", "runs in", "±", "parameters: ", "held-out loss after", "the peak learning rate",
            "one change to the recipe", "GPT-2 against Llama")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", default=str(REPO / "solutions" / "09_gpt" / "09_gpt.ipynb"))
    parser.add_argument("--save", help="write the executed notebook here (outside the repository)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--sweeps", action="store_true", help="run notebook 09's optional seed sweeps too")
    args = parser.parse_args(argv)

    import nbformat

    sys.path.insert(0, str(REPO))
    from autograder.execute import run_as_learner

    path = pathlib.Path(args.notebook).resolve()
    run_path = path
    if args.sweeps:   # a copy beside the notebook (the seam reads its neighbours), with the sweeps turned on
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            cell.source = cell.source.replace("RUN_SWEEPS = False", "RUN_SWEEPS = True")
        run_path = path.with_name(f".{path.stem}-sweeps.ipynb")
        nbformat.write(nb, run_path)
    start = time.perf_counter()
    try:
        nb = run_as_learner(run_path, args.timeout,
                            extra_cells=["import time\nprint('kernel CPU seconds:', time.process_time())"])
    finally:
        if run_path != path:
            run_path.unlink()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        for line in text.splitlines():
            if any(marker in line for marker in REPORTED):
                print(f"[{cell.get('id', '?')}] {line}")
    cpu = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    print(f"{path.name}: executed in {elapsed / 60:.1f} minutes of wall-clock time, {cpu.strip()}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.save:
        nbformat.write(nb, args.save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
