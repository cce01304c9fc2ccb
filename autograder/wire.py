"""Data, and only data, from the student's kernel to the grader: a JSON form that cannot carry code.

A probe (autograder/checks/common.py) returns what the student's code produced; `encode` turns it
into JSON that the grader reads back with `decode`. Only these types cross, matched by exact type
(a subclass could fake comparisons, so it is refused, as is anything else):
  None, bool, int, float (inf and NaN too), str, bytes, list, tuple, set, dict (any encodable keys),
  torch.Tensor and nn.Parameter (as plain tensors), numpy arrays and scalars of numeric or bool dtype.
Tensors travel as their raw little-endian bytes with dtype and shape, checked on the way back; no
pickle is involved anywhere. Sizes and nesting are bounded, so a hostile kernel cannot make the
grader build a huge object.
"""
import base64
import math

import numpy as np
import torch

MAX_DEPTH = 12
MAX_BYTES = 16 * 2**20  # raw tensor bytes per message (kernel_manager.MAX_MESSAGE_BYTES bounds the message)

# dtype name -> (numpy dtype used on the wire, torch dtype)
DTYPES = {
    "bool": (np.bool_, torch.bool), "uint8": (np.uint8, torch.uint8), "int8": (np.int8, torch.int8),
    "int16": (np.int16, torch.int16), "int32": (np.int32, torch.int32), "int64": (np.int64, torch.int64),
    "float16": (np.float16, torch.float16), "float32": (np.float32, torch.float32),
    "float64": (np.float64, torch.float64), "complex64": (np.complex64, torch.complex64),
    "complex128": (np.complex128, torch.complex128),
    "bfloat16": (np.float32, torch.bfloat16),  # numpy has no bfloat16: carried as float32, exactly
}
TORCH_NAMES = {torch_dtype: name for name, (_, torch_dtype) in DTYPES.items()}
NUMPY_NAMES = {np.dtype(numpy_dtype): name for name, (numpy_dtype, _) in DTYPES.items() if name != "bfloat16"}


class WireError(ValueError):
    """A value that cannot cross to the grader, or a message that is not well formed."""


def encode(value):
    """`value` as JSON-able data. Raises WireError for anything that is not plain data."""
    budget = [MAX_BYTES]
    return _encode(value, 0, budget)


def _encode(value, depth, budget):
    if depth > MAX_DEPTH:
        raise WireError(f"values nested more than {MAX_DEPTH} deep")
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if abs(value) < 2**53 else {"$int": str(value)}
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if kind is bytes:
        return {"$bytes": _b64(value, budget)}
    if kind in (list, tuple, set, frozenset):
        items = sorted(value, key=repr) if kind in (set, frozenset) else value
        encoded = [_encode(item, depth + 1, budget) for item in items]
        return encoded if kind is list else {"$" + ("tuple" if kind is tuple else "set"): encoded}
    if kind is dict:
        return {"$dict": [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)]
                          for k, v in value.items()]}
    if kind in (torch.Tensor, torch.nn.Parameter):
        return {"$tensor": _tensor_fields(value, budget)}
    if kind is np.ndarray or isinstance(value, np.generic) and kind.__module__ == "numpy":
        array = np.asarray(value)
        if array.dtype not in NUMPY_NAMES:
            raise WireError(f"a numpy array of dtype {array.dtype}")
        fields = _array_fields(array, NUMPY_NAMES[array.dtype], budget)
        return {"$ndarray" if kind is np.ndarray else "$npscalar": fields}
    raise WireError(f"a {kind.__module__}.{kind.__qualname__}")


def _tensor_fields(tensor, budget):
    tensor = tensor.detach()
    if tensor.layout != torch.strided or tensor.device.type != "cpu" or tensor.is_quantized:
        raise WireError("a tensor that is not a plain CPU tensor")
    name = TORCH_NAMES.get(tensor.dtype)
    if name is None:
        raise WireError(f"a tensor of dtype {tensor.dtype}")
    carried = tensor.float() if name == "bfloat16" else tensor
    return _array_fields(carried.contiguous().numpy(), name, budget)


def _array_fields(array, name, budget):
    wire_dtype = np.dtype(DTYPES[name][0]).newbyteorder("<")
    return {"dtype": name, "shape": list(array.shape), "data": _b64(np.ascontiguousarray(array, wire_dtype).tobytes(), budget)}


def _b64(raw, budget):
    budget[0] -= len(raw)
    if budget[0] < 0:
        raise WireError(f"more than {MAX_BYTES // 2**20} MB of data")
    return base64.b64encode(raw).decode("ascii")


def decode(data):
    """The value `encode` was given, rebuilt from JSON data. Raises WireError if malformed."""
    return _decode(data, 0, [MAX_BYTES])


def _decode(data, depth, budget):
    if depth > MAX_DEPTH + 1:
        raise WireError("nested too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [_decode(item, depth + 1, budget) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise WireError(f"unexpected {type(data).__name__} in a probe message")
    (tag, body), = data.items()
    if tag == "$int" and type(body) is str and len(body) < 400:
        return int(body)
    if tag == "$float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag == "$bytes":
        return _unb64(body, budget)
    if tag in ("$tuple", "$set") and type(body) is list:
        items = [_decode(item, depth + 1, budget) for item in body]
        return tuple(items) if tag == "$tuple" else set(items)
    if tag == "$dict" and type(body) is list:
        pairs = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("a malformed dict")
            pairs.append((_decode(pair[0], depth + 1, budget), _decode(pair[1], depth + 1, budget)))
        try:
            return dict(pairs)
        except TypeError:
            raise WireError("a dict with unhashable keys") from None
    if tag in ("$tensor", "$ndarray", "$npscalar") and type(body) is dict:
        array, name = _array(body, budget)
        if tag == "$ndarray":
            return array
        if tag == "$npscalar":
            return array[()]
        tensor = torch.from_numpy(array.copy())
        return tensor.to(torch.bfloat16) if name == "bfloat16" else tensor
    raise WireError(f"unknown tag {tag!r} in a probe message")


def _array(body, budget):
    if set(body) != {"dtype", "shape", "data"} or body["dtype"] not in DTYPES:
        raise WireError("a malformed array")
    shape = body["shape"]
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 16:
        raise WireError("an array with a malformed shape")
    dtype = np.dtype(DTYPES[body["dtype"]][0]).newbyteorder("<")
    raw = _unb64(body["data"], budget)
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise WireError("an array whose data does not match its shape")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape), body["dtype"]


def _unb64(text, budget):
    if type(text) is not str:
        raise WireError("malformed bytes")
    budget[0] -= len(text) * 3 // 4
    if budget[0] < 0:
        raise WireError(f"more than {MAX_BYTES // 2**20} MB of data")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise WireError("malformed base64") from None
