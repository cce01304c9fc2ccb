"""The harness every hidden check uses: quiet calls, reference helpers, oracles' comparisons.

A check calls the student's function through `call`, which
- keeps library warnings and stderr out of the test cell (nbgrader would score stderr as a failure),
- turns an exception in the student's code into a teaching message, except `NotImplementedError`
  (an unanswered exercise), which is left as it is,
- can swap named helpers in the student's globals for reference ones, so that one exercise is
  graded independently of another (nbgrader's `del squares` idea, the other way round),
- can forbid library shortcuts (the oracle must not be the answer).
"""
import contextlib
import io
import logging
import unittest.mock
import warnings

import numpy as np
import torch

from autograder import guard


class Forbidden(Exception):
    """Raised when the student's code calls a function the exercise asks them to write."""


@contextlib.contextmanager
def quiet():
    """Silence Python warnings, library logging and stderr for the duration."""
    previous_disable = logging.root.manager.disable
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous_disable)


@contextlib.contextmanager
def reference_globals(fn, **replacements):
    """Temporarily replace names the student's function looks up in its module globals."""
    namespace = getattr(fn, "__globals__", None)
    if namespace is None:
        yield
        return
    missing = object()
    saved = {name: namespace.get(name, missing) for name in replacements}
    try:
        namespace.update(replacements)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


@contextlib.contextmanager
def forbid(targets, advice):
    """Make each dotted `target` (e.g. 'torch.softmax') raise Forbidden while the block runs."""
    def refuse(*args, **kwargs):
        raise Forbidden(advice)

    with contextlib.ExitStack() as stack:
        for target in targets:
            stack.enter_context(unittest.mock.patch(target, refuse))
        yield


def call(fn, *args, name=None, helpers=None, forbidden=(), forbidden_advice="", **kwargs):
    """Call the student's `fn` quietly; return its result or raise a teaching AssertionError."""
    guard.verify()
    name = name or getattr(fn, "__name__", "your function")
    if not callable(fn):
        raise AssertionError(f"{name} should be a function, but it is a {type(fn).__name__}.")
    try:
        with quiet(), reference_globals(fn, **(helpers or {})), forbid(forbidden, forbidden_advice):
            result = fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Forbidden as error:
        raise AssertionError(f"{name}: {error}") from None
    except Exception as error:
        shapes = ", ".join(describe(a) for a in args)
        raise AssertionError(f"{name}({shapes}) raised {type(error).__name__}: {error}") from None
    expect_plain(result, name)
    return result


PLAIN_TYPES = (str, bytes, int, float, complex, bool, type(None), np.generic)


def expect_plain(value, name, depth=0):
    """Refuse results that could fake a comparison: a class defined in the notebook (say, one whose
    `__eq__` is always true) or a tensor/array subclass (whose `__torch_function__` could be)."""
    kind = type(value)
    if isinstance(value, torch.nn.Module) or kind in PLAIN_TYPES or callable(value) and kind.__module__ != "__main__":
        return
    if torch.is_tensor(value) and kind not in (torch.Tensor, torch.nn.Parameter):
        raise AssertionError(f"{name} returned a {kind.__name__}, a subclass of torch.Tensor; "
                             "return a plain torch.Tensor.")
    if isinstance(value, np.ndarray) and kind is not np.ndarray:
        raise AssertionError(f"{name} returned a {kind.__name__}, a subclass of numpy.ndarray; "
                             "return a plain array or tensor.")
    if kind.__module__ == "__main__":
        raise AssertionError(f"{name} returned a {kind.__name__}, a class defined in your notebook. "
                             "Return plain values (a list, str, int, float, dict or torch.Tensor), "
                             "which the tests can compare.")
    if depth < 3 and kind in (list, tuple, set, frozenset, dict):
        items = list(value.items()) if kind is dict else value
        for item in list(items)[:1000]:
            for part in (item if kind is dict else (item,)):
                expect_plain(part, name, depth + 1)


def describe(value):
    if hasattr(value, "shape"):
        return f"{type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, torch.nn.Module):
        return f"a {type(value).__name__}"
    return repr(value)


def to_numpy(value, name):
    """The student's result as a float64 NumPy array, or a message saying what it was."""
    if torch.is_tensor(value):
        return value.detach().cpu().double().numpy()
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"{name} should be an array, but it is a {type(value).__name__}.") from None
    return array


def expect_shape(value, expected, name, hint=""):
    shape = tuple(value.shape) if hasattr(value, "shape") else None
    if shape != tuple(expected):
        found = shape if shape is not None else type(value).__name__
        raise AssertionError(f"{name}'s shape {found} != expected shape {tuple(expected)}. {hint}".strip())


def matches(actual, expected, rtol=1e-4, atol=1e-5):
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    return actual.shape == expected.shape and np.allclose(actual, expected, rtol=rtol, atol=atol)


def expect_close(actual, expected, name, hint="", diagnoses=None, rtol=1e-4, atol=1e-5):
    """Compare with the oracle. On a mismatch, name the misconception whose output it matches."""
    actual_np = to_numpy(actual, name)
    expected_np = np.asarray(expected, dtype=np.float64)
    expect_shape(actual_np, expected_np.shape, name, hint)
    if not np.all(np.isfinite(actual_np)):
        raise AssertionError(f"{name} contains inf or NaN. {hint}".strip())
    if np.allclose(actual_np, expected_np, rtol=rtol, atol=atol):
        return
    for misconception, wrong_answer in (diagnoses or {}).items():
        if matches(actual_np, wrong_answer, rtol, atol):
            raise AssertionError(f"{name} is wrong: {misconception}")
    diff = np.abs(actual_np - expected_np)
    where = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
    raise AssertionError(
        f"{name} is wrong: at index {where} you have {actual_np[where]:.6g}, expected "
        f"{expected_np[where]:.6g} (largest difference {diff.max():.3g}). {hint}".strip())


def generator(seed):
    """A seeded torch Generator. Hidden tests use seeds the visible tests never use."""
    return torch.Generator().manual_seed(seed)
