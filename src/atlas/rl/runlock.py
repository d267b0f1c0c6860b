"""One writer per run folder, and no writer outliving the process that started it.

    results/checkpoints/<run>.lock     flock(LOCK_EX) held by the training job for its whole
                                       life; holds the pid of its holder

A second job on the same run (a rerun beside an orphan, two Snakemake processes on two targets)
is refused at once, naming the pid that holds the lock; it writes nothing and touches nothing.
The lock file sits beside the checkpoint folder, not in it, so moving the folder aside (a stale
fingerprint, atlas.rl.journal) never moves the lock.

A training job also dies with the process that started it (atlas.lifetime, which every stage
sets up before it loads torch): a lock is never held by an orphan.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from atlas.errors import InputError
from atlas.lifetime import die_with_parent

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


def guard(root: str | Path, run: str) -> Path:
    """What a training job does first: die with its parent, then hold its run's lock."""
    die_with_parent()
    return claim(root, run)
