"""Tampering decided outside the kernel: the grader reads the watched modules' namespaces from the kernel's memory.

The guard inside the kernel (guard.py) compares the functions the tests rely on (torch's, numpy's, builtins'...)
with a record it keeps in its own module, which the notebook can edit like anything else in the kernel. Here the
record is the grader's: before any code of the notebook runs, the kernel tells the grader where each watched
module's namespace dict is and which object each of its names holds (addresses: `id()`), and the grader keeps
that. After the last cell, the grader reads those dicts itself, from /proc/<kernel>/mem (the same access the
native watch uses), and compares. A name that holds another object than at the start is a finding, whatever the
kernel says: a replaced `torch.allclose` with the guard's record edited to match is still a replaced
`torch.allclose`.

What the layout of a dict is, is CPython's (3.11, 64-bit: Include/cpython/dictobject.h, Objects/dictobject.c);
`available()` refuses any other. New names are not findings (torch adds submodules as they are imported); the
names the guard itself lets change (IPython's builtins, torch.Storage) are not either.
"""
import json
import os
import struct
import sys

from autograder.guard import IPYTHON_BUILTINS, TORCH_MANAGED

# Names torch rebinds itself: importing torch._dynamo (torch.optim does) wraps torch.manual_seed. (The in-kernel
# guard checks that wrapper; no hidden input is drawn with it: checks.common.Seeds seeds Generators of its own.)
TORCH_REBINDS = {("torch", "manual_seed")}
WATCHED = ("builtins", "torch", "torch.nn.functional", "torch.testing", "numpy", "numpy.testing", "math",
           "autograder.checks.common", "courselib.testing")
DICT_KEYS_GENERAL, DICT_KEYS_UNICODE = 0, 1

# The kernel's side: run once, before the notebook's first cell, as a silent request of the grader's.
BASELINE_CODE = (
    "__import__('json').dumps({n: [id(vars(m)), [[id(k), id(v), k] for k, v in vars(m).items() if type(k) is str]]"
    " for n, m in ((n, __import__('sys').modules.get(n)) for n in %r) if m is not None})" % (WATCHED,))


def available():
    if sys.version_info[:2] != (3, 11) or struct.calcsize("P") != 8:
        return False, f"the kernel's dicts are read for CPython 3.11 on 64 bits, not {sys.version.split()[0]}"
    return True, ""


def parse_baseline(text):
    """The kernel's baseline (the repr of a JSON string, as user_expressions return it) as
    {module: (dict address, {key address: (value address, name)})}."""
    import ast
    data = json.loads(ast.literal_eval(text))
    return {module: (address, {key: (value, name) for key, value, name in entries})
            for module, (address, entries) in data.items()}


class Memory:
    """Reads another process's memory (/proc/<pid>/mem)."""

    def __init__(self, pid):
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def read(self, address, size):
        data = os.pread(self.fd, size, address)
        if len(data) != size:
            raise OSError(f"read {len(data)} of {size} bytes at {address:#x}")
        return data

    def word(self, address):
        return struct.unpack("<Q", self.read(address, 8))[0]

    def close(self):
        os.close(self.fd)


def dict_items(memory, address):
    """{key address: value address} of the dict at `address`, read from the kernel's memory."""
    keys = memory.word(address + 32)                 # PyDictObject.ma_keys
    if memory.word(address + 40):                    # ma_values: a split table (never a module's)
        raise OSError("a split dict")
    header = memory.read(keys, 32)
    log2_index_bytes, kind = header[9], header[10]
    entries_count = struct.unpack_from("<q", header, 24)[0]   # dk_nentries
    entries = keys + 32 + (1 << log2_index_bytes)
    width = 16 if kind == DICT_KEYS_UNICODE else 24
    if kind not in (DICT_KEYS_GENERAL, DICT_KEYS_UNICODE) or not 0 <= entries_count < 1 << 20:
        raise OSError(f"an unexpected dict layout (kind {kind}, {entries_count} entries)")
    raw = memory.read(entries, width * entries_count)
    found = {}
    for index in range(entries_count):
        if kind == DICT_KEYS_UNICODE:
            key, value = struct.unpack_from("<QQ", raw, index * 16)
        else:
            _, key, value = struct.unpack_from("<qQQ", raw, index * 24)
        if key and value:
            found[key] = value
    return found


def changes(pid, baseline):
    """What the notebook replaced or deleted in the watched namespaces, read from the kernel's memory."""
    memory = Memory(pid)
    try:
        found = []
        for module, (address, names) in baseline.items():
            now = dict_items(memory, address)
            for key, (value, name) in names.items():
                if (module == "builtins" and name in IPYTHON_BUILTINS or (module, name) in TORCH_MANAGED
                        or (module, name) in TORCH_REBINDS):
                    continue
                if now.get(key) != value:
                    found.append(f"{module}.{name} was replaced or deleted (read from the kernel's memory by the grader)")
        return found
    finally:
        memory.close()
