"""A stage process ends with the process that started it.

Snakemake runs each job as `bash -c '...; python -m atlas.stages.<rule> ...'`. When Snakemake is
killed (`kill -9`, a lost login), nothing ends that job: it would go on writing outputs beside
the rerun, holding its run's lock, its GPU and its sandboxes. So every stage, from its first
moment (`atlas.stages` calls `die_with_parent` while Python locates the stage module, before the
stage imports torch):

- asks the kernel for SIGTERM when its parent goes (PR_SET_PDEATHSIG: the shell, or torchrun's
  agent for a rank);
- watches the process behind its shells (Snakemake), or, in a rank of a torchrun job, the process
  that started torchrun, and ends itself (SIGTERM) when it goes, a killed starter that nobody has
  reaped yet (a zombie) included: at once through a pidfd, or within a second by reading /proc
  where the kernel has no pidfd_open.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WATCHDOG = "parent-watchdog"  # the watchdog thread's name (15 bytes: the kernel's limit)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "timeout", "env", "nice"})
WATCH_INTERVAL_S = 1.0
_watching = threading.Event()  # set once this process's death signal and watchdog are in place


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


def _alive(pid: int, start: int) -> bool:
    """Whether pid is still the process that started at `start`; a zombie is gone all the same."""
    try:
        _, _, started, state = _stat_fields(pid)
    except (OSError, ValueError, IndexError):
        return False
    return started == start and state not in ("Z", "X")


def die_with_parent() -> None:
    """End this process (SIGTERM) when its parent, or the process behind its shell, is gone; in a
    rank of a torchrun job, also when the process that started torchrun is gone. Once per
    process: a second call does nothing."""
    if _watching.is_set():
        return
    _watching.set()
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
        return  # no /proc, or the ancestors went while read: the death signal alone
    if pid == parent:
        return
    try:  # readable once that very process ends, reaped or not: no polling, no pid reuse
        fd: int | None = os.pidfd_open(pid)
    except OSError:  # no pidfd_open (Linux before 5.3, RHEL 8's 4.18; some seccomp filters): poll /proc
        fd = None
    if not _alive(pid, start):  # gone since the walk above (its pid may be another's by now)
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        libc.prctl(PR_SET_NAME, WATCHDOG.encode(), 0, 0, 0)  # seen in `ps -L`, /proc/<pid>/task/*/comm
        if fd is not None:
            select.select([fd], [], [])
        else:
            while _alive(pid, start):
                time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name=WATCHDOG, daemon=True).start()
