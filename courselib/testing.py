"""Checks for the visible tests: each failure says what was expected and what was found.

The hidden tests live in `autograder.checks`; these helpers keep the visible ones short and
readable, in the spirit of d2l's `check_shape`.
"""
import numpy as np
import torch


def _shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else None


def check_shape(x, expected, name="tensor", hint=""):
    """Fail with "name's shape (2, 3) != expected shape (2, 4)" and an optional hint."""
    found = _shape(x)
    if found is None:
        raise AssertionError(f"{name} should be an array or tensor of shape {tuple(expected)}, "
                             f"but it is a {type(x).__name__}. {hint}".rstrip())
    if found != tuple(expected):
        raise AssertionError(f"{name}'s shape {found} != expected shape {tuple(expected)}. {hint}".rstrip())


def check_close(actual, expected, name="result", hint="", rtol=1e-4, atol=1e-5):
    """Fail with the largest difference, where it is, and the hint that names the likely mistake."""
    actual_np = np.asarray(actual.detach().cpu() if torch.is_tensor(actual) else actual, dtype=float)
    expected_np = np.asarray(expected.detach().cpu() if torch.is_tensor(expected) else expected, dtype=float)
    check_shape(actual_np, expected_np.shape, name, hint)
    if not np.all(np.isfinite(actual_np)):
        raise AssertionError(f"{name} contains inf or NaN. {hint}".rstrip())
    if not np.allclose(actual_np, expected_np, rtol=rtol, atol=atol):
        diff = np.abs(actual_np - expected_np)
        where = np.unravel_index(np.argmax(diff), diff.shape)
        raise AssertionError(
            f"{name} is wrong: at index {tuple(int(i) for i in where)} you have {actual_np[where]:.6g}, "
            f"expected {expected_np[where]:.6g} (largest difference {diff.max():.3g}). {hint}".rstrip())


def check_claim(value, low, high, claim):
    """The text says `claim`; this run measured `value`, which must lie in [low, high].

    Used beside a number the prose quotes, so that the prose stays exactly as true as the code shows:
    if a library update or an edit moves the number, the notebook stops here and says which sentence
    to fix. Returns the value, for printing."""
    if not low <= value <= high:
        raise AssertionError(f"The text says {claim}, but this run measured {value:.4g} (expected "
                             f"between {low:g} and {high:g}): update the text or the code.")
    return value
