"""What a class member's processes can see: a private mount namespace, set up as root, then dropped.

Every server the hub starts, and every command setup runs as an instructor, starts in a mount
namespace of its own (Linux `unshare(CLONE_NEWNS)`, then mounts, all before the process becomes the
user; the same as `unshare --mount` and `mount` in a shell, without the programs):
- the course's Python is reachable: where it lives under a folder others may not enter (pyenv in
  /root on this project's machines), that folder is covered by an empty tmpfs with the Python
  installation bound back into it, and nothing else of it;
- a student does not see the course's answers at all: solutions/, the git history, the grader's tests,
  variants, judges and demo class, its working folders, and the hub's own state are covered by empty
  tmpfs mounts that only root could open (Unix permissions keep other homes and the instructors'
  course folders closed too);
- /tmp is a private tmpfs, so one user's temporary files (Dask's scratch folder, a kernel's) never
  meet another's;
- /proc is a procfs of its own with `hidepid=invisible`: `ps` and /proc show the user their own processes
  only, never a classmate's kernels or the command lines of an instructor's grading.
Mounts made by root are locked in a namespace the user makes later (a user namespace of their own
cannot unmount them to look underneath), and the user has no capability to change them.
"""
import ctypes
import dataclasses
import os
import pathlib
import stat

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
PRIVATE_TMP_SIZE = "2g"


@dataclasses.dataclass
class View:
    """The mounts of one user's namespace (all paths absolute, resolved)."""
    cover: list                      # folders covered by an empty tmpfs (mode 755) ...
    keep: list                       # ... with these folders inside them bound back
    hide: list                       # covered by an empty tmpfs that only root may enter
    private_tmp: bool = True
    hide_processes: bool = True      # /proc shows the user's own processes only

    def to_json(self):
        return dataclasses.asdict(self)


def closed_ancestor(path):
    """The outermost folder above `path` that other users may not enter (no o+x), or None."""
    path = pathlib.Path(os.path.realpath(path))
    for folder in reversed(path.parents):  # from / down
        if folder != path and not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def python_view(prefixes):
    """cover/keep that make every Python prefix in `prefixes` reachable by any user."""
    cover, keep = [], []
    for prefix in prefixes:
        prefix = pathlib.Path(os.path.realpath(prefix))
        blocked = closed_ancestor(prefix)
        if blocked is not None:
            cover.append(str(blocked))
            keep.append(str(prefix))
    return sorted(set(cover)), sorted(set(keep))


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc, source, target, fstype, flags, data=None):
    encode = (lambda s: None if s is None else str(s).encode())
    _call(libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
          f"mount {source} on {target}")


def enter(view):
    """Make `view` this process's view of the files. Runs as root, in the child, before the user is
    dropped to (a Popen preexec_fn): async-signal-safe system calls and no logging."""
    libc = _libc()
    _call(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    # what is kept is opened before its ancestors are covered, then bound back from the open handle
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in view["keep"]}
    for folder in view["cover"]:
        _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path, handle in handles.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC)
        os.close(handle)
    for path in view["hide"]:
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=4k")
        elif os.path.exists(path):  # a file (.git of a worktree): an empty one in its place
            _mount(libc, "/dev/null", path, None, MS_BIND)
    if view["private_tmp"]:
        _mount(libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={PRIVATE_TMP_SIZE}")
    if view.get("hide_processes", True):  # a procfs instance of this namespace's own (Linux 5.8+: options per mount)
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")


def preexec(view, then=None):
    """A Popen preexec_fn: enter `view` (a View's JSON), then run `then` (the user switch)."""
    def run():
        enter(view)
        if then is not None:
            then()
    return run
