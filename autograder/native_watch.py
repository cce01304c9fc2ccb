"""Oracle use observed from outside the kernel: breakpoints in libtorch, set and read by the grader.

A check forbids an oracle (`F.softmax` for the exercise that asks you to write softmax). Inside the kernel the
watch of autograder/checks/common.py sees most ways to reach it, but it lives where the student's code runs,
and code can hide from it (a torch function mode switched off, the profile hook removed and put back, the
watch's own objects changed). This one does not run there. While the hidden part of a test cell runs, the
grader traces the kernel's process with ptrace (Linux, x86-64) and puts a breakpoint on the first instruction
of each native function that computes the check's forbidden operator (libtorch's CPU kernels: every Python
route to `softmax` ends in `structured_softmax_cpu_out::impl`). A breakpoint that is hit is recorded and taken
out, and the thread goes on; when the hidden part has run, the rest are taken out too. What was hit is the
verdict: the test scores 0 and is flagged, whatever the kernel reports. Nothing in the kernel can see the
breakpoints before they are hit, remove them, or stop the grader from reading the hit.

The grader may trace its own kernels: the kernel runs as the grader's own user in a user namespace the grader
made (bwrap), so the grader holds every capability in it. Where ptrace is not allowed (Yama's ptrace_scope 3,
a container without CAP_SYS_PTRACE) or the machine is not x86-64, `available()` says why, and grading goes on
with the in-kernel watch alone (the report says so).

Symbols: libtorch_cpu.so keeps its full symbol table; the functions are found by name once per torch build and
kept in the grader's cache (config.cache_dir()).
"""
import contextlib
import ctypes
import errno
import functools
import json
import mmap
import os
import pathlib
import platform
import queue
import signal
import struct
import threading
import time

from autograder.checks.common import op_family

# family of a forbidden torch operator (checks.common.op_family) -> parts of the mangled names of the native
# functions every dense CPU route to it passes through. Only operators that are themselves native: a Python
# function (multi_head_attention_forward) computes with operators an answer may use as well, so it is the
# in-kernel watch's alone.
NATIVE_FAMILIES = {
    "softmax": ("26structured_softmax_cpu_out4impl", "30structured_log_softmax_cpu_out4impl"),
    "log_softmax": ("30structured_log_softmax_cpu_out4impl",),
    "scaled_dot_product": ("6native28scaled_dot_product_attention", "6native33_scaled_dot_product_attention_math",
                           "6native41_scaled_dot_product_flash_attention_cpu"),
    "layer_norm": ("6native14layer_norm_cpu",),
    "native_layer_norm": ("6native14layer_norm_cpu",),
    "rms_norm": ("6native15rms_norm_symint", "6native18rms_norm_composite"),
    "one_hot": ("6native7one_hot",),
    "cross_entropy": ("6native25cross_entropy_loss_symint",),
    "embedding": ("6native16embedding_symint",),
    "foreach_norm": ("6native24foreach_tensor_norm_slow", "6native25_foreach_norm_Scalar_out"),
    "clip_grad_norm": ("6native24foreach_tensor_norm_slow",),
    "transformer_encoder_layer_fwd": ("6native33transformer_encoder_layer_forward",),
}

PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 12, 13, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_O_TRACECLONE, PTRACE_O_EXITKILL = 0x8, 0x100000
PTRACE_EVENT_CLONE, PTRACE_EVENT_STOP = 3, 128
WALL, WNOHANG = 0x40000000, 1
RIP = 16                      # index of rip in x86-64's user_regs_struct (27 unsigned longs)
POLL_SECONDS = 0.002
INT3 = b"\xcc"


class Unavailable(RuntimeError):
    """This machine (or this process) cannot trace grading kernels; the message says why."""


@functools.lru_cache(maxsize=None)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.waitpid.restype = ctypes.c_int
    libc.waitpid.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    return libc


def _ptrace(request, pid, addr=0, data=0):
    result = _libc().ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    if result == -1:
        code = ctypes.get_errno()
        if code:
            raise OSError(code, f"ptrace({request}, {pid}): {os.strerror(code)}")
    return result


@functools.lru_cache(maxsize=None)
def available():
    """(True, "") where grading kernels can be traced here, else (False, why)."""
    if platform.machine() != "x86_64":
        return False, f"breakpoints are implemented for x86-64, and this machine is {platform.machine()}"
    with contextlib.suppress(OSError, ValueError):
        if int(pathlib.Path("/proc/sys/kernel/yama/ptrace_scope").read_text()) >= 3:
            return False, "Yama's kernel.yama.ptrace_scope is 3: no process may trace another"
    try:
        library()
    except Unavailable as why:
        return False, str(why)
    return True, ""


_warned = []


def warn_once(reason):
    """One line on the grader's stderr, once per process, where kernels cannot be watched from outside."""
    if not _warned:
        _warned.append(reason)
        import sys
        print(f"note: oracles are watched inside the grading kernel only ({reason})", file=sys.stderr, flush=True)


def library():
    """libtorch_cpu.so of the torch the grader imports."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    path = pathlib.Path(spec.origin).parent / "lib" / "libtorch_cpu.so"
    if not path.is_file():
        raise Unavailable(f"no libtorch_cpu.so beside torch ({path})")
    return path.resolve()


# ------------------------------------------------------------------------------------------- symbols
def _elf_functions(path, needles):
    """{mangled name: (address in the file's layout, size)} of the FUNC symbols of the ELF file at `path`
    whose names contain one of `needles`, from its full symbol table (.symtab), else its dynamic one."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2:
            raise Unavailable(f"{path} is not a 64-bit ELF file")
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        by_type = {}
        for section in sections:
            by_type.setdefault(section[1], []).append(section)
        table = (by_type.get(2) or by_type.get(11) or [None])[0]      # SHT_SYMTAB, else SHT_DYNSYM
        if table is None:
            raise Unavailable(f"{path} has no symbol table")
        strings = sections[table[6]]                                   # sh_link: its string table
        found = {}
        encoded = [n.encode() for n in needles]
        for offset in range(table[4], table[4] + table[5], 24):       # Elf64_Sym
            name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, offset)
            if info & 0xF != 2 or shndx == 0 or value == 0:           # STT_FUNC, defined
                continue
            start = strings[4] + name
            end = data.find(b"\0", start)
            text = data[start:end]
            if text.endswith(b".cold") or not text.startswith(b"_ZN"):  # a cold part; a local lambda
                continue
            if any(n in text for n in encoded):
                found[text.decode()] = (value, size)
        return found


def _load_bias(path):
    """The lowest p_vaddr of the file's PT_LOAD segments (0 for a shared library as built)."""
    with open(path, "rb") as handle:
        header = handle.read(64)
        phoff, = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    loads = [struct.unpack_from("<IIQQ", table, i * phentsize) for i in range(phnum)]
    return min((vaddr for kind, _, _, vaddr in loads if kind == 1), default=0) & ~0xFFF


@functools.lru_cache(maxsize=None)
def symbols():
    """{family: [(name, offset from the library's load address)]} for NATIVE_FAMILIES, read once per torch build
    and cached in the grader's cache folder."""
    from autograder.config import cache_dir
    path = library()
    status = path.stat()
    cached = cache_dir() / "native-symbols" / f"{path.name}-{status.st_size}-{int(status.st_mtime)}.json"
    if cached.is_file():
        with contextlib.suppress(ValueError, OSError):
            return {family: [tuple(entry) for entry in entries]
                    for family, entries in json.loads(cached.read_text()).items()}
    needles = sorted({needle for family in NATIVE_FAMILIES.values() for needle in family})
    functions = _elf_functions(path, needles)
    bias = _load_bias(path)
    table = {family: sorted((name, value - bias) for name, (value, _) in functions.items()
                            if any(needle in name for needle in parts))
             for family, parts in NATIVE_FAMILIES.items()}
    cached.parent.mkdir(parents=True, exist_ok=True)
    temporary = cached.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(table, indent=0))
    os.replace(temporary, cached)
    return table


def families_of(forbidden):
    """The native families a check's forbidden names reach (its torch names only)."""
    found = []
    for name in forbidden:
        if not name.startswith("torch."):
            continue
        family = op_family(name.split(".")[-1].removesuffix("_"))
        for known in NATIVE_FAMILIES:
            if family == known or family == op_family(known):
                found.append(known)
    return sorted(set(found))


# --------------------------------------------------------------------------------------------- the tracer
def kernel_process(root_pid, timeout=30):
    """The host pid of the kernel's Python under the sandbox's first process `root_pid` (itself, unsandboxed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        todo = [root_pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                program = os.path.basename(command[0]) if command else b""
                if program.startswith(b"python") and (b"autograder.kernel" in command
                                                      or b"ipykernel_launcher" in command):
                    return pid
                for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(child) for child in (task / "children").read_text().split()]
        time.sleep(0.05)
    raise Unavailable(f"no kernel process found under pid {root_pid}")


class NativeWatch:
    """A tracer of one kernel process: `arm(families)` before the code to watch runs, `disarm()` after it,
    which returns the names of the native functions that were entered in between. All ptrace calls happen on
    this object's own thread (a tracee answers only to the thread that attached it)."""

    def __init__(self, pid):
        self.pid = pid
        self.requests = queue.Queue()
        self.error = None
        self.threads = set()
        self.patched = {}            # address -> (original byte, name)
        self.hits = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"native-watch-{pid}", daemon=True)
        self.thread.start()
        self.ready.wait(30)
        if self.error:
            raise Unavailable(self.error)

    # -- the grader's side
    def arm(self, families):
        return self._ask("arm", families)

    def disarm(self):
        return self._ask("disarm")

    def close(self):
        with contextlib.suppress(Exception):
            self._ask("close", timeout=10)

    def _ask(self, what, argument=None, timeout=30):
        """The tracer thread's answer. A tracer that has ended (its kernel gone: the grader kills it after the last
        cell) answers nothing more, so waiting stops with it instead of running out the timeout."""
        answer = queue.Queue(maxsize=1)
        self.requests.put((what, argument, answer))
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = answer.get(timeout=0.05)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    self._drain_requests()     # answers what came after the tracer's last look, this request too
                    result = answer.get_nowait()
                    break
                if time.monotonic() > deadline:
                    raise Unavailable(f"the native watch of pid {self.pid} did not answer") from None
        if isinstance(result, BaseException):
            raise result
        return result

    # -- the tracer's thread
    def _run(self):
        try:
            self.base = self._library_base()
            self.table = symbols()
            self.mem = os.open(f"/proc/{self.pid}/mem", os.O_RDWR)
            for task in sorted(os.listdir(f"/proc/{self.pid}/task")):
                self._seize(int(task))
            self.group = os.getpgid(self.pid)
        except (OSError, Unavailable, ValueError) as error:
            self.error = f"cannot trace the kernel (pid {self.pid}): {error}"
            self.ready.set()
            return
        self.ready.set()
        while self.threads:
            self._serve_requests()
            self._handle_stops()
            time.sleep(POLL_SECONDS)
        with contextlib.suppress(OSError):
            os.close(self.mem)
        self._drain_requests()

    def _library_base(self):
        """Where the kernel mapped libtorch_cpu.so, found by the file's inode (the sandbox shows the kernel its
        files under paths of its own)."""
        path = library()
        inode = path.stat().st_ino
        for line in pathlib.Path(f"/proc/{self.pid}/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[4] == str(inode) and parts[5].endswith(path.name) and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
        raise Unavailable(f"the kernel has not mapped {path}")

    def _seize(self, tid):
        with contextlib.suppress(OSError):   # a thread that just ended
            _ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACECLONE | PTRACE_O_EXITKILL)
            self.threads.add(tid)

    def _serve_requests(self):
        while True:
            try:
                what, argument, answer = self.requests.get_nowait()
            except queue.Empty:
                return
            try:
                if what == "arm":
                    self.hits = []
                    for family in argument:
                        for name, offset in self.table.get(family, []):
                            self._patch(self.base + offset, name)
                    answer.put(sorted({name for _, name in self.patched.values()}))
                elif what == "disarm":
                    for address in list(self.patched):
                        self._unpatch(address)
                    answer.put(sorted(set(self.hits)))
                elif what == "close":
                    for address in list(self.patched):
                        self._unpatch(address)
                    for tid in list(self.threads):
                        self._detach(tid)
                    answer.put(None)
            except OSError as error:
                answer.put(Unavailable(f"the native watch failed: {error}"))

    def _drain_requests(self):
        while True:
            try:
                what, _, answer = self.requests.get_nowait()
            except queue.Empty:
                return
            answer.put(sorted(set(self.hits)) if what == "disarm" else None)

    def _patch(self, address, name):
        if address in self.patched:
            return
        original = os.pread(self.mem, 1, address)
        os.pwrite(self.mem, INT3, address)
        self.patched[address] = (original, name)

    def _unpatch(self, address):
        original, _ = self.patched.pop(address)
        with contextlib.suppress(OSError):
            os.pwrite(self.mem, original, address)

    def _detach(self, tid):
        with contextlib.suppress(OSError):
            _ptrace(PTRACE_INTERRUPT, tid)
            status = ctypes.c_int()
            _libc().waitpid(tid, ctypes.byref(status), WALL)
            _ptrace(PTRACE_DETACH, tid)
        self.threads.discard(tid)

    def _handle_stops(self):
        status = ctypes.c_int()
        while True:
            tid = _libc().waitpid(-self.group, ctypes.byref(status), WALL | WNOHANG)
            if tid <= 0:
                if (tid < 0 and ctypes.get_errno() == errno.ECHILD) or not os.path.exists(f"/proc/{self.pid}"):
                    self.threads.clear()   # every traced thread has ended (or its parent reaped the process first)
                return
            value = status.value
            if os.WIFEXITED(value) or os.WIFSIGNALED(value):
                self.threads.discard(tid)
                continue
            if not os.WIFSTOPPED(value):
                continue
            stop, event = os.WSTOPSIG(value), value >> 16
            if event == PTRACE_EVENT_CLONE:
                new = ctypes.c_ulong()
                with contextlib.suppress(OSError):
                    _ptrace(0x4201, tid, 0, ctypes.addressof(new))   # PTRACE_GETEVENTMSG: the new thread
                    self.threads.add(int(new.value))
                self._continue(tid)
            elif event == PTRACE_EVENT_STOP:
                self.threads.add(tid)                                # a new thread's first stop
                self._continue(tid)
            elif stop == signal.SIGTRAP and self._breakpoint(tid):
                self._continue(tid)
            else:
                self._continue(tid, stop)                            # the signal was the kernel's: deliver it

    def _breakpoint(self, tid):
        """A thread stopped at one of our breakpoints: record it, take it out, step the thread back onto the
        original instruction. False when the trap was not ours."""
        regs = (ctypes.c_ulong * 27)()
        _ptrace(PTRACE_GETREGS, tid, 0, ctypes.addressof(regs))
        address = regs[RIP] - 1
        if address not in self.patched:
            return False
        self.hits.append(self.patched[address][1])
        self._unpatch(address)
        regs[RIP] = address
        _ptrace(PTRACE_SETREGS, tid, 0, ctypes.addressof(regs))
        return True

    def _continue(self, tid, deliver=0):
        with contextlib.suppress(OSError):
            _ptrace(PTRACE_CONT, tid, 0, deliver)


def demangled(name):
    """A readable form of a mangled native name: its nested names joined by '::' (no types)."""
    parts, index = [], name.find("N") + 1 if name.startswith("_ZN") else 2
    while index < len(name) and name[index].isdigit():
        digits = ""
        while name[index].isdigit():
            digits += name[index]
            index += 1
        parts.append(name[index:index + int(digits)])
        index += int(digits)
    return "::".join(parts) or name
