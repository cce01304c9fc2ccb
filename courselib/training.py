"""Training-loop helpers shared by the notebooks that train (07–11): a progress bar, a loss curve that
redraws in place, and the command line of the course's shipped checkpoints (`checkpoint_cli`).

    plot = LiveLossPlot("MLM loss")
    for step in progress(range(200), desc="training"):
        loss = ...
        plot.update(step, loss.item())
    plot.close()

Under nbgrader (`NBGRADER_EXECUTION` is set while autograding or validating) the curve is drawn
once at the end, so grading stays fast.
"""
import argparse
import os

import matplotlib.pyplot as plt
from tqdm.auto import tqdm


def grading():
    """True while nbgrader executes the notebook (autograde or validate)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def progress(iterable, **kwargs):
    """A tqdm progress bar (a widget in JupyterLab), silent under grading."""
    kwargs.setdefault("disable", grading())
    return tqdm(iterable, **kwargs)


class LiveLossPlot:
    """One figure of loss against step, updated in place rather than printed once per step."""

    def __init__(self, title="Training loss", ylabel="loss", redraw_every=10, logy=False):
        self.steps, self.losses = [], []
        self.redraw_every = redraw_every
        self.figure, self.ax = plt.subplots(figsize=(6, 3.5))
        self.ax.set_title(title)
        self.ax.set_xlabel("step")
        self.ax.set_ylabel(ylabel)
        if logy:
            self.ax.set_yscale("log")
        self.ax.grid(alpha=0.3)
        (self.line,) = self.ax.plot([], [])
        plt.close(self.figure)  # shown through the display handle only, never twice
        self.handle = None
        if not grading():
            try:
                from IPython.display import display
                self.handle = display(self.figure, display_id=True)
            except ImportError:  # plain Python: draw at close()
                self.handle = None

    def update(self, step, loss):
        self.steps.append(step)
        self.losses.append(float(loss))
        if self.handle is not None and len(self.steps) % self.redraw_every == 0:
            self._redraw()

    def _redraw(self):
        self.line.set_data(self.steps, self.losses)
        self.ax.relim()
        self.ax.autoscale_view()
        if self.handle is not None:
            self.handle.update(self.figure)

    def close(self):
        """Final drawing; returns the figure (displayed once more when no live handle exists)."""
        self._redraw()
        if self.handle is None:
            try:
                from IPython.display import display
                display(self.figure)
            except ImportError:
                pass
        return self.figure


def checkpoint_cli(argv, *, prog, description, model_dir, steps, sample, rebuild):
    """The command line of a module that ships a checkpoint (tiny_bert, gpt, seq2seq): `--rebuild` retrains
    it from scratch with `rebuild(out, steps)`, `--sample N` prints N examples of its data with `sample(N)`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rebuild", action="store_true", help=f"rebuild {model_dir} from scratch")
    parser.add_argument("--out", default=str(model_dir), help="where to write the checkpoint")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default: torch's choice; 1 is faster on a busy shared machine)")
    parser.add_argument("--sample", type=int, default=0, help="print this many examples of the data and stop")
    args = parser.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.sample:
        sample(args.sample)
    elif args.rebuild:
        rebuild(args.out, args.steps)
    else:
        parser.print_help()
    return 0


class TrainingMonitor(LiveLossPlot):
    """A progress bar (loss, tokens/s, time left) and a live plot of the training loss with the held-out loss on
    it, for a training loop to report to:

        monitor = TrainingMonitor(steps, tokens_per_step=B * T, title="my GPT")
        ... monitor.update(step, loss) after each step, monitor.held_out(step, loss) after each measurement ...
        monitor.close()

    Under grading the bar is silent and the plot is drawn once at close(), like LiveLossPlot's.
    """

    def __init__(self, total_steps, tokens_per_step, title="Training", ylabel="next-token loss", redraw_every=10,
                 initial_step=0):
        super().__init__(title, ylabel=ylabel, redraw_every=redraw_every)
        self.line.set_label("training loss")
        (self.held_out_line,) = self.ax.plot([], [], marker="o", label="held-out loss")
        self.held_out_steps, self.held_out_losses = [], []
        self.ax.legend()
        self.tokens_per_step = tokens_per_step
        self.bar = progress(None, total=total_steps, initial=initial_step, desc=title, unit="step")
        self.started = None

    def update(self, step, loss):
        import time
        now = time.perf_counter()
        if self.started is None:
            self.started, self.first_step = now, step - 1
        elapsed = max(now - self.started, 1e-9)
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(loss=f"{float(loss):.3f}",
                             tokens_per_s=f"{(step - self.first_step) * self.tokens_per_step / elapsed:,.0f}",
                             refresh=False)
        super().update(step, loss)

    def held_out(self, step, loss):
        self.held_out_steps.append(step)
        self.held_out_losses.append(float(loss))

    def _redraw(self):
        self.held_out_line.set_data(self.held_out_steps, self.held_out_losses)
        super()._redraw()

    def close(self):
        self.bar.close()
        return super().close()
