"""Run one untrusted Python program and report what it did, without letting it hurt the caller.

Every run is a fresh `python -s -P` (this interpreter; isolated mode but for the environment, which
is scrubbed instead, so PYTHONHASHSEED holds) in a fresh scratch directory,
started as

    prlimit --as --cpu --fsize --nofile --core=0 -- unshare --net --pid --fork --kill-child -- python -s -P main.py

in its own session and process group, with a scrubbed environment (PATH, LANG, PYTHONHASHSEED and
HOME = TMPDIR = the scratch directory). What each part buys:

- `prlimit` sets the resource limits in the child before anything of the program runs. It replaces
  a `preexec_fn`, which Python documents as unsafe in a threaded parent (the child can deadlock
  between fork and exec), and graders run from a thread pool.
- `unshare --net` gives the program a network namespace with nothing but a downed loopback: no
  connection leaves it, not even to localhost.
- `unshare --pid --fork --kill-child` makes the program PID 1 of its own PID namespace. When it
  exits or is killed, the kernel kills and reaps every process it left behind, including ones that
  called setsid() to leave the process group. A quirk: signals the program sends itself with a
  default action are ignored, as for any init process.
- At the wall-clock timeout the group is frozen (SIGSTOP: a fork bomb stops growing), the
  namespace's init is killed (the kernel kills and reaps everything inside; its parent `unshare`
  reaps it, so no zombie is handed to the system's init), then `killpg` SIGKILL and `wait()`.
- stdout and stderr are read as they arrive and kept up to `max_output_bytes` each; the rest is
  read and dropped, so a program printing gigabytes costs no memory here.

Where `unshare` is not permitted the program runs without the namespaces, `sandboxed=False` is
recorded, and leftovers are killed by process group alone (a setsid() escapee survives); with
`require_network_isolation` the run is refused instead.

- `unshare --mount` (where it works; probed once): before the program starts, a small shell
  script binds the scratch directory, covers the grader's working directory (the workflow, whose
  results/ hold correct letters and private tests) with an empty read-only tmpfs, and remounts
  every other mount read-only. A write outside the scratch directory fails with EROFS. The
  interpreter is run by its real path, since a venv link to it may sit in the hidden folder.

What is NOT contained: the program still runs as our user (root here) inside those namespaces,
so it can read files outside the hidden folder (read-only), and /proc, /sys and /dev stay as
they are. RLIMIT_NPROC is not set: root ignores it, and for other users it counts every task of
the user (the grader's own threads included), so a limit low enough to stop a fork bomb would
break ordinary runs on a busy host. A fork bomb is therefore bounded only by the timeout, and
killed whole.
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atlas.config import GraderConfig

PROGRAM_FILE = "main.py"
SCRATCH_PREFIX = "atlas-sandbox-"
# Isolated mode without -E: `-I` would also ignore PYTHONHASHSEED, and string hashing (so set and
# dict order, so tool output, so trajectories) would differ between identical runs. The
# environment is scrubbed instead; -s drops user site-packages, -P the script dir from sys.path.
PYTHON_FLAGS = ("-s", "-P")
# The interpreter itself, not a venv's link to it: the link may sit in a folder the run hides.
# Programs need only the standard library.
PYTHON = os.path.realpath(sys.executable)
# Namespaces a run tries, in order: as root the plain ones; as another user, inside a user
# namespace that maps the caller to root (where unprivileged user namespaces are enabled).
ISOLATION_FLAGS = (
    ("--net", "--pid", "--fork", "--kill-child"),
    ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"),
)
# util-linux before 2.39: when the program dies of SIGKILL (CPU limit, our timeout), `unshare --fork`
# fails to re-raise it (SIGKILL's handler cannot be reset) and exits 1 with this line instead.
UNSHARE_SIGKILL_LINE = b"unshare: sigprocmask unblock failed: Invalid argument\n"
POLL_S = 0.05  # how often a run whose pipes stay open checks whether its main process has exited
KILL_GRACE_S = 5.0  # how long killed processes may take to die before the run is a hard error
READ_CHUNK = 1 << 16


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here as configured (no `unshare` permission, no `prlimit`)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one program run."""

    timeout_s: float  # wall clock of this one run
    memory_mb: int  # RLIMIT_AS
    cpu_s: int  # RLIMIT_CPU
    file_size_mb: int  # RLIMIT_FSIZE
    open_files: int  # RLIMIT_NOFILE
    max_output_bytes: int  # stdout and stderr each kept up to this many bytes
    require_network_isolation: bool = False

    @classmethod
    def from_config(cls, cfg: GraderConfig, timeout_s: float | None = None) -> SandboxLimits:
        """The limits the `graders` config section sets; `timeout_s` defaults to test_timeout_s."""
        return cls(
            timeout_s=cfg.test_timeout_s if timeout_s is None else timeout_s,
            memory_mb=cfg.memory_mb,
            cpu_s=cfg.cpu_s,
            file_size_mb=cfg.file_size_mb,
            open_files=cfg.open_files,
            max_output_bytes=cfg.max_output_bytes,
            require_network_isolation=cfg.require_network_isolation,
        )


@dataclass(frozen=True)
class RunResult:
    """What one program run did."""

    status: str  # "ok" (exit 0) | "error" (non-zero exit, or killed other than by our timeout) | "timeout"
    returncode: int | None  # None on timeout; -N when killed by signal N
    stdout: str  # decoded UTF-8 (errors replaced), at most max_output_bytes of it
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    sandboxed: bool  # True when the program ran in its own network and PID namespaces
    pgid: int | None = None  # process group (and session) of the run; no live process is left in it


@functools.cache
def _isolation_prefix() -> tuple[str, ...] | None:
    """The `unshare ... --` command prefix that works here, or None. Probed once per process."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for flags in ISOLATION_FLAGS:
        probe = subprocess.run([unshare, *flags, "--", "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return (unshare, *flags, "--")
    return None


# Run inside the namespaces, before the program: everything the program could write outside its
# scratch directory becomes read-only, and the grader's working directory (the workflow, with
# results/: answers and private tests) is covered by an empty read-only tmpfs. $1 = scratch,
# then the folders to hide, then "--" and the program's command.
FS_SCRIPT = r"""
scratch="$1"; shift
mount --bind "$scratch" "$scratch" || exit 97
while [ "$1" != "--" ]; do mount -t tmpfs -o size=4k,mode=0555,ro atlas-hidden "$1" || exit 97; shift; done
shift
for m in $(cut -d' ' -f2 /proc/self/mounts); do
  case "$m" in "$scratch"|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null ;; esac
done
mount -o remount,bind,ro / || exit 97
cd "$scratch" && unset PWD OLDPWD && exec "$@"
"""
FS_SETUP_FAILED = 97


@functools.cache
def _fs_isolation() -> bool:
    """Whether a mount namespace with a read-only root works here (probed once per process)."""
    prefix = _isolation_prefix()
    if prefix is None:
        return False
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
        probe = subprocess.run(
            [prefix[0], "--mount", *prefix[1:], "/bin/sh", "-c", FS_SCRIPT, "sh", scratch, "--", "true"],
            capture_output=True,
            timeout=30,
        )
    return probe.returncode == 0


def _hidden_folders(scratch: str) -> list[str]:
    """The grader's working directory, unless hiding it would hide the scratch or the interpreter."""
    cwd = os.path.realpath(os.getcwd())
    inside = lambda path: os.path.commonpath([cwd, os.path.realpath(path)]) == cwd  # noqa: E731
    if cwd == "/" or inside(scratch) or inside(PYTHON) or inside(sys.base_prefix):
        return []
    return [cwd]


def network_isolation_available() -> bool:
    """Whether programs can run without network (and in their own PID namespace) here."""
    return _isolation_prefix() is not None


@functools.cache
def _prlimit() -> str:
    path = shutil.which("prlimit")
    if path is None:
        raise SandboxUnavailable("prlimit (util-linux) is not on PATH; it sets each program's rlimits")
    return path


def _rlimit_prefix(limits: SandboxLimits) -> list[str]:
    mb = 1 << 20
    return [
        _prlimit(),
        f"--as={limits.memory_mb * mb}",
        f"--cpu={limits.cpu_s}",
        f"--fsize={limits.file_size_mb * mb}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


def _write_files(scratch: str, code: str, files: dict[str, str] | None) -> None:
    for name, text in (files or {}).items():
        if name == PROGRAM_FILE or os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(
                f"extra file name {name!r}: expected a plain file name other than {PROGRAM_FILE}"
            )
        with open(os.path.join(scratch, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(scratch, PROGRAM_FILE), "w", encoding="utf-8") as f:
        f.write(code)


class _Capped:
    """The first `limit` bytes of a stream; the rest is counted as truncation and dropped."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept = bytearray()
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        if len(data) > room:
            self.truncated = True

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


def _read_until(proc: subprocess.Popen, deadline: float, out: _Capped, err: _Capped) -> None:
    """Drain stdout and stderr into `out` and `err` until both close or the deadline passes.

    A pipe stays open while anything holds it; in an unsandboxed run a leftover background process
    can, so once the main process has exited its group is killed to let the pipes close."""
    sinks = {proc.stdout: out, proc.stderr: err}
    with selectors.DefaultSelector() as selector:
        for stream in sinks:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                return
            for key, _ in selector.select(timeout=min(deadline - now, POLL_S)):
                data = os.read(key.fd, READ_CHUNK)
                if data:
                    sinks[key.fileobj].add(data)
                else:
                    selector.unregister(key.fileobj)
            if proc.poll() is not None:
                _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to every process in the group; False when the group is already empty."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0].decode(), int(fields[1]), int(fields[2])


def _processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def scratch_prefix(owner: int | None = None) -> str:
    """Scratch directory names of the programs process `owner` (default: this one) runs; grading
    threads share their process's pid, so a stage's programs all carry its own."""
    return f"{SCRATCH_PREFIX}{os.getpid() if owner is None else owner}-"


def sandboxed_processes(owner: int | None = None) -> list[int]:
    """Live processes whose working directory is a sandbox scratch directory: of any run, or with
    `owner` only of the programs that process started (other jobs may be grading beside it).

    A program's command line is just `python ... main.py`; its working directory names the run."""
    prefix = SCRATCH_PREFIX if owner is None else scratch_prefix(owner)
    found = []
    for pid in _processes():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone since the listing, or a kernel thread
        state = _stat(pid)
        if os.path.basename(cwd).startswith(prefix) and state is not None and state[0] != "Z":
            found.append(pid)
    return found


def group_processes(pgid: int) -> dict[int, str]:
    """pid -> state letter ("Z": a zombie) of every process in group `pgid`, from a scan of /proc."""
    found = {}
    for pid in _processes():
        stat = _stat(pid)
        if stat is not None and stat[2] == pgid:
            found[pid] = stat[0]
    return found


def _child_of(parent: int) -> int | None:
    """The child of `parent` (unshare has one: the namespace's init), or None once it is gone."""
    # unshare forks right after it starts, so the child is nearly always the next pid.
    for pid in (parent + 1, *_processes()):
        stat = _stat(pid)
        if stat is not None and stat[1] == parent:
            return pid
    return None


def _end(proc: subprocess.Popen, isolated: bool) -> None:
    """Kill whatever is left of a run and reap its child. Runs after every run, however it ended."""
    if proc.poll() is None:
        if isolated:
            # Freeze the group (a fork bomb stops growing), then kill the namespace's init alone:
            # the kernel kills and reaps everything inside, and unshare, woken, reaps init, so no
            # orphan is handed to the system's init.
            _signal_group(proc.pid, signal.SIGSTOP)
            init = _child_of(proc.pid)
            if init is not None:
                try:
                    os.kill(init, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # it died on its own (a CPU-limit kill) since the scan: the same outcome
            os.kill(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass  # the group kill below takes unshare too
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"sandboxed process {proc.pid} survived SIGKILL for {KILL_GRACE_S} s"
            ) from None
    # Leftovers of an unsandboxed run die with their group (a sandboxed run has none left). Wait
    # until none is alive, so no stray process outlives run_program. Their zombies are orphans: the
    # system's init reaps them, in its own time.
    give_up = time.monotonic() + KILL_GRACE_S
    while _signal_group(proc.pid, signal.SIGKILL):
        if set(group_processes(proc.pid).values()) <= {"Z"}:
            break
        if time.monotonic() > give_up:
            raise RuntimeError(f"processes of group {proc.pid} survived SIGKILL for {KILL_GRACE_S} s")
        time.sleep(0.01)
    proc.stdout.close()
    proc.stderr.close()


def run_program(
    code: str,
    stdin: str = "",
    *,
    limits: SandboxLimits,
    argv_extra: Sequence[str] = (),
    files: dict[str, str] | None = None,
) -> RunResult:
    """Run `code` as a Python program with `stdin` as its input, inside the limits.

    `files` are written next to the program (plain names only); `argv_extra` follows the program
    file on its command line. Safe to call from many threads at once: runs share nothing."""
    prefix = _isolation_prefix()
    if prefix is None and limits.require_network_isolation:
        raise SandboxUnavailable(
            "graders.require_network_isolation is true, but `unshare --net --pid` is not permitted "
            "here; expected root, or unprivileged user namespaces"
        )
    command_head = [*_rlimit_prefix(limits), *(prefix or ())]
    fs_isolated = prefix is not None and _fs_isolation()
    scratch = tempfile.mkdtemp(prefix=scratch_prefix())
    if fs_isolated:
        command_head = [
            prefix[0],
            "--mount",
            *prefix[1:],
            "/bin/sh",
            "-c",
            FS_SCRIPT,
            "sh",
            scratch,
            *_hidden_folders(scratch),
            "--",
        ]
        command_head = [*_rlimit_prefix(limits), *command_head]
    try:
        _write_files(scratch, code, files)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "HOME": scratch,
            "TMPDIR": scratch,
        }
        out, err = _Capped(limits.max_output_bytes), _Capped(limits.max_output_bytes)
        with tempfile.TemporaryFile(dir=scratch) as stdin_file:  # unlinked: the program never sees it
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            start = time.monotonic()
            proc = subprocess.Popen(
                [*command_head, PYTHON, *PYTHON_FLAGS, PROGRAM_FILE, *argv_extra],
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=scratch,
                env=env,
                start_new_session=True,
            )
        deadline = start + limits.timeout_s
        try:
            _read_until(proc, deadline, out, err)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            _end(proc, isolated=prefix is not None)
        wall_s = time.monotonic() - start
    finally:
        shutil.rmtree(scratch)

    returncode = proc.returncode
    if prefix is not None and returncode == 1 and err.kept.endswith(UNSHARE_SIGKILL_LINE):
        returncode = -signal.SIGKILL
        del err.kept[-len(UNSHARE_SIGKILL_LINE) :]
    if timed_out:
        status, returncode = "timeout", None
    else:
        status = "ok" if returncode == 0 else "error"
    # The scratch path is random; a traceback naming it would make tool outputs, and so the
    # trajectories that contain them, differ between identical runs. Programs see it as ".".
    return RunResult(
        status=status,
        returncode=returncode,
        stdout=out.text().replace(scratch, "."),
        stderr=err.text().replace(scratch, "."),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        wall_s=wall_s,
        sandboxed=prefix is not None,
        pgid=proc.pid,
    )
