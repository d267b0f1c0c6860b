"""One writer per run folder, and no writer outliving the process that started it.

    results/checkpoints/<run>.lock     flock(LOCK_EX) held by the training job for its whole
                                       life; holds the pid of its holder

A second job on the same run (a rerun beside an orphan, two Snakemake processes on two targets)
is refused at once, naming the pid that holds the lock; it writes nothing and touches nothing.
The lock file sits beside the checkpoint folder, not in it, so moving the folder aside (a stale
fingerprint, atlas.rl.journal) never moves the lock.

A training job dies with its parent: PR_SET_PDEATHSIG (SIGTERM) covers the direct parent, and a
watchdog thread covers the process that started the job through a shell (Snakemake runs
`bash -c '...; python -m atlas.rl.train ...'`): when that ancestor is gone, the job ends itself.
Every rank of a torchrun job does the same: its parent is torchrun's agent (the death signal), and
the watchdog looks past the agent to the process that started torchrun.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import threading
from pathlib import Path

from atlas.errors import InputError

PR_SET_PDEATHSIG = 1
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "timeout", "env", "nice"})
WATCH_INTERVAL_S = 1.0
_held: dict[str, int] = {}  # lock path -> fd, kept open for the life of the process


class RunLockedError(InputError):
    """Another process writes this run."""


def lock_path(root: str | Path) -> Path:
    root = Path(root)
    return root.with_name(f"{root.name}.lock")


def claim(root: str | Path, run: str) -> Path:
    """Take the run's lock for the rest of this process's life, or raise RunLockedError naming
    the holder's pid. Idempotent within one process."""
    path = lock_path(root)
    if str(path) in _held:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise RunLockedError(
            f"{path}: run {run} is being written by pid {holder}, which holds this lock; refusing "
            f"to write {root} beside it (wait for it, or end it: kill {holder})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[str(path)] = fd
    return path


def _stat_fields(pid: int) -> tuple[str, int, int, str]:
    """(comm, ppid, start time, state) of pid from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    rest = text[text.rindex(")") + 2 :].split()
    return comm, int(rest[1]), int(rest[19]), rest[0]


def starter(pid: int | None = None) -> tuple[int, int]:
    """The process that started this one, seen through shell wrappers: (pid, start time)."""
    at = os.getppid() if pid is None else pid
    while True:
        comm, ppid, start, _ = _stat_fields(at)
        if comm not in SHELLS or ppid <= 1:
            return at, start
        at = ppid


def die_with_parent() -> None:
    """End this process (SIGTERM) when its parent, or the process behind its shell, is gone; in a
    rank of a torchrun job, also when the process that started torchrun is gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)
    try:
        # torchrun sets TORCHELASTIC_RUN_ID for the ranks it starts: the parent is its agent
        pid, start = starter(_stat_fields(parent)[1] if "TORCHELASTIC_RUN_ID" in os.environ else parent)
    except (OSError, ValueError, IndexError):
        return  # no /proc: the death signal alone
    if pid == parent:
        return

    def watch() -> None:
        while not _stop.wait(WATCH_INTERVAL_S):
            try:  # a killed starter that nobody has reaped yet is a zombie: gone all the same
                _, _, started, state = _stat_fields(pid)
                alive = started == start and state not in ("Z", "X")
            except (OSError, ValueError, IndexError):
                alive = False
            if not alive:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


_stop = threading.Event()


def guard(root: str | Path, run: str) -> Path:
    """What a training job does first: die with its parent, then hold its run's lock."""
    die_with_parent()
    return claim(root, run)
