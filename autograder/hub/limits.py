"""CPU, memory and process limits for each class member's server: one cgroup per user, made by the hub.

The hub (root) makes `transformers-course/<user>` in each controller's hierarchy (cgroup v1: memory, cpu and
pids each have their own; v2: one folder in the unified tree where those controllers are enabled) with the
limits written into it, and every process the spawner starts for that user joins it before it becomes the
user (`join`, in the Popen preexec_fn). Whatever that user then runs (the server, its kernels, terminals,
`make grade`'s workers) stays in it: a memory bomb is killed by the kernel's OOM killer inside that cgroup,
never the hub's or a classmate's processes, and a busy loop gets its share of the CPU and no more. A user
cannot leave it (its files are root's).
"""
import contextlib
import dataclasses
import os
import pathlib
import time

ROOT_NAME = "transformers-course"
CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000


@dataclasses.dataclass(frozen=True)
class Limits:
    memory_bytes: int = 3 * 2**30      # a server, a kernel that trains 09's GPT and `make grade` fit in 3 GiB
    cpus: float = 1.0                  # cores' worth of CPU time
    pids: int = 1024                   # processes and threads

    @classmethod
    def parse(cls, memory="3G", cpus=1.0, pids=1024):
        return cls(parse_bytes(memory), float(cpus), int(pids))


def parse_bytes(text):
    """'3G', '512M', '1073741824' -> bytes."""
    text = str(text).strip().upper().removesuffix("B").removesuffix("I")
    factor = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(text[-1:], 1)
    return int(float(text[:-1] if factor > 1 else text) * factor)


def _mounts():
    """{controller or 'unified': mount point} of this machine's cgroup hierarchies."""
    mounts = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as table:
        for line in table:
            _, point, kind, options, *_ = line.split()
            if kind == "cgroup2":
                mounts["unified"] = point
            elif kind == "cgroup":
                for controller in CONTROLLERS:
                    if controller in options.split(","):
                        mounts[controller] = point
    return mounts


def _own_paths():
    """{controller or 'unified': this process's path in that hierarchy}."""
    paths = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as table:
        for line in table:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                paths["unified"] = path
            for controller in controllers.split(","):
                paths[controller] = path
    return paths


def parents():
    """{controller: the folder under which users' cgroups go}, for each controller this machine lets root limit.
    v1 hierarchies first (a controller bound to v1 is not available in the unified tree)."""
    mounts, own = _mounts(), _own_paths()
    found = {}
    for controller in CONTROLLERS:
        if controller in mounts and controller in own:
            folder = pathlib.Path(mounts[controller] + own[controller].rstrip("/"))
            if os.access(folder, os.W_OK):
                found[controller] = folder / ROOT_NAME
    missing = [c for c in CONTROLLERS if c not in found]
    if missing and "unified" in mounts and "unified" in own:
        folder = pathlib.Path(mounts["unified"] + own["unified"].rstrip("/"))
        with contextlib.suppress(OSError):
            available = (folder / "cgroup.controllers").read_text().split()
            for controller in missing:
                if controller in available and os.access(folder, os.W_OK):
                    found[controller] = folder / ROOT_NAME
    return found


def _write(path, value):
    with open(path, "w") as out:
        out.write(str(value))


def prepare(username, limits):
    """The cgroup folders of `username` with `limits` written, made where missing; returns them (one per
    hierarchy). A controller this machine does not let root use is left out (`describe` says which)."""
    folders = {}
    for controller, parent in parents().items():
        folder = parent / username
        if folder in folders.values():
            continue
        if not folder.is_dir():
            parent.mkdir(exist_ok=True)
            if (parent.parent / "cgroup.subtree_control").exists():   # v2: hand the controllers down
                with contextlib.suppress(OSError):
                    _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
            folder.mkdir(exist_ok=True)
        folders[controller] = folder
    for controller, folder in folders.items():
        if controller == "memory":
            limit = folder / ("memory.max" if (folder / "memory.max").exists() else "memory.limit_in_bytes")
            _write(limit, limits.memory_bytes)
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", 0)
        elif controller == "cpu":
            quota = int(limits.cpus * CPU_PERIOD_US)
            if (folder / "cpu.max").exists():
                _write(folder / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(folder / "cpu.cfs_period_us", CPU_PERIOD_US)
                _write(folder / "cpu.cfs_quota_us", quota)
        elif controller == "pids":
            _write(folder / "pids.max", limits.pids)
    return sorted(set(map(str, folders.values())))


def join(folders):
    """Move this process into `folders` (a Popen preexec_fn, as root, before it becomes the user)."""
    for folder in folders:
        _write(os.path.join(folder, "cgroup.procs"), os.getpid())


def describe():
    """What this machine lets the hub limit, for setup's output."""
    found = parents()
    missing = [c for c in CONTROLLERS if c not in found]
    return ("limits per server: " + ", ".join(sorted(found)) if found else "no limits per server") + (
        f" (not available here: {', '.join(missing)})" if missing else "")


def remove_all():
    """Every user's cgroup and the course's folder, once their processes have ended (teardown)."""
    for parent in set(parents().values()):
        if not parent.is_dir():
            continue
        for folder in [p for p in parent.iterdir() if p.is_dir()] + [parent]:
            for _ in range(20):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
