"""Run untrusted Python programs in a bubblewrap sandbox, one sandbox per program.

A program's sandbox is a `bwrap` with every namespace of its own and a small driver inside
(driver.py) that runs the program once per test, each time in a child forked from the driver.
The sandbox holds:

- a new user namespace with an unprivileged uid, every capability dropped, no_new_privs (bwrap sets
  it), and no further user namespaces (`--disable-userns`);
- new PID, network, IPC, UTS and cgroup namespaces, the driver the PID namespace's init
  (`--as-pid-1`): the program sees its own processes and the driver, which is not dumpable,
  a network of its own with nothing in it (the host's loopback and sockets are out of reach), and
  a fresh `/proc`; a minimal read-only `/dev`; no `/sys`;
- a seccomp filter in each test's child (driver.DENIED): no ptrace, no descriptors or memory of
  other processes, no memory outside RLIMIT_AS (SysV IPC, POSIX message queues, memfds, xattrs,
  keyrings, io_uring); the driver runs under the same filter but for memfds and pidfds;
- a read-only root with `/usr` and the interpreter's prefix, with every `site-packages` and
  `dist-packages` folder, the grader's virtual environment and its working directory covered by
  empty read-only folders: no project, no workflow, no host `/tmp`, `/dev/shm` or `/run`;
- a private tmpfs at `/tmp` (the working directory and HOME) of `scratch_mb` bytes: gone with the
  sandbox, so nothing is left on the host.

The host uid matters: started as root, bwrap would map the sandbox's user to host root, and the
kernel checks `/proc/sys` against that. As root, the grader therefore starts bwrap as an
unprivileged uid of its own, `sandbox_uid_base` + 2 x the grading thread's id + a slot, 0 or 1
(a thread holds at most two sandboxes: the one grading and the next one, started ahead; thread ids
are unique while the thread lives, so two programs never share a uid and RLIMIT_NPROC counts one
sandbox). Since that uid
cannot reach an interpreter under a private home (pyenv's /root/.pyenv), a first bwrap, still root,
makes a private mount namespace where the interpreter's prefix is bound at /tmp/atlas-python, then
`setpriv` drops to the uid and runs the sandbox's bwrap there; that first bwrap has a PID
namespace of its own, so everything below it dies with its init.

Bounds: the driver kills a test at its time bound and the grader waits HOST_GRACE_S more before it
kills the whole sandbox; per test RLIMIT_AS / CPU / FSIZE / NOFILE; per sandbox RLIMIT_NPROC and the
scratch size. `--die-with-parent` chains every process to the grading thread: a grader killed with
SIGKILL or SIGTERM takes its sandboxes with it, those started ahead of their program included.
Expected outputs never enter the sandbox.

A sandbox can start before its program is known (`Sandbox(mode=..., limits=...)`, then `load`):
bwrap, the interpreter and lcb_runner's imports are then ready when the program comes, which
lcb.grade_many uses to overlap a sandbox's start with the grading before it. It still runs one
program, then it is closed.

Where bwrap cannot start (not installed, no user namespaces), grading is refused
(`require_sandbox`, SandboxUnavailable) unless `allow_unsandboxed` asks for programs to run under
the same driver without it; every result then says `sandboxed=False`.
Those runs use a host scratch folder named after the grader's pid; the next grader sweeps the
folders of graders that are gone.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import marshal
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from atlas.errors import InputError
from atlas.graders import cgroups, driver, prefix

if TYPE_CHECKING:
    from atlas.config.graders import GraderConfig

SCRATCH_PREFIX = "atlas-sandbox-"
SCRATCH_NAME = re.compile(r"atlas-sandbox-(\d{1,10})-[A-Za-z0-9_]{1,16}")  # tempfile.mkdtemp's names
DRIVER_SOURCE = Path(driver.__file__).read_text(encoding="utf-8")
# The driver goes in compiled (the sandbox's interpreter is this one): compiling its text in every
# sandbox cost more than starting the interpreter does. BOOT reads it from its own pipe.
DRIVER_CODE = marshal.dumps(compile(DRIVER_SOURCE, driver.MARK, "exec"))
BOOT = (
    "import gc, marshal, os, sys\n"
    "gc.disable()\n"
    "fd, chunks = int(sys.argv[5]), []\n"
    "while chunk := os.read(fd, 1 << 16):\n    chunks.append(chunk)\n"
    "os.close(fd)\n"
    "exec(marshal.loads(b''.join(chunks)), {'__name__': '__main__'})\n"
)
# -S: no site module, so no site-packages and no .pth file runs (the driver defines exit() and
# quit(), which site would); -P: no script folder on sys.path. Not -E or -I: PYTHONHASHSEED must
# hold, so that set order (so tool output, so trajectories) is the same in identical runs. bwrap
# clears the environment instead.
PYTHON_FLAGS = ("-S", "-P")
PYTHON = os.path.realpath(sys.executable)
PREFIX = os.path.realpath(sys.base_prefix)
STAGE_PYTHON = "/tmp/atlas-python"  # where the root stage binds the prefix for the sandbox's uid
SANDBOX_UID = 65534  # the program's uid and gid as it sees them
UIDS_PER_THREAD = 2  # sandboxes one grading thread holds at once: the one grading, the next one
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
START_TIMEOUT_S = 10.0  # a sandbox that has not started by then is an error
SANDBOX_ENDED = "the sandbox ended before the run did"  # a RunResult's stderr when the driver died
HOST_GRACE_S = 0.3  # past a test's bound, the driver's own kill has had this long to report
KILL_GRACE_S = 5.0
SANDBOX_OVERHEAD_MB = 64  # the driver's interpreter and lcb_runner's imports, in the cgroup's bound
STAGE_SCRATCH = "/tmp/atlas-scratch"  # where the root stage mounts the inode-bounded scratch tmpfs
# The first process of a sandbox: join its cgroups (the files before "--"), make it the kernel's
# first choice when memory runs out, then become the sandbox's bwrap.
JOIN = (
    'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; '
    'echo 1000 >/proc/self/oom_score_adj || exit 125; exec "$@"'
)
# The root stage's scratch: a tmpfs with a size and a count of inodes (bwrap's --size has no
# inode bound), owned by the sandbox's uid.
MOUNT_SCRATCH = (
    'mount -t tmpfs -o "size=$1,nr_inodes=$2,mode=0700,uid=$3,gid=$3" atlas-scratch '
    f'{STAGE_SCRATCH} || exit 125; shift 3; exec "$@"'
)
READ_CHUNK = 1 << 16


class SandboxUnavailable(InputError):
    """The sandbox cannot run here as configured: a stage stops with this message."""


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one program's runs."""

    timeout_s: float  # wall clock of one run
    memory_mb: int  # RLIMIT_AS of a run
    cpu_s: int  # RLIMIT_CPU of a run
    file_size_mb: int  # RLIMIT_FSIZE of a run
    open_files: int  # RLIMIT_NOFILE of a run
    max_output_bytes: int  # stdout and stderr each kept up to this many bytes
    max_processes: int = 8  # processes and threads at once in one sandbox (RLIMIT_NPROC)
    scratch_mb: int = 64  # size of the sandbox's /tmp
    uid_base: int = 1_900_000_000  # host uids of sandboxes start here (when the grader is root)
    allow_unsandboxed: bool = False  # run under the driver alone where bubblewrap cannot start
    cpu_cores: float = 1.0  # CPU quota of the whole sandbox (its cgroup)
    scratch_inodes: int = 4096  # files, folders and links in /tmp at once (when the grader is root)

    @property
    def cgroup_memory_bytes(self) -> int:
        """The sandbox cgroup's memory bound, kernel memory included: a program's RLIMIT_AS, its
        scratch (tmpfs pages are charged to their writer) and the driver's own."""
        return (self.memory_mb + self.scratch_mb + SANDBOX_OVERHEAD_MB) << 20

    @property
    def cgroup_pids(self) -> int:
        """The sandbox cgroup's task bound: the program's `max_processes`, the driver and the bwrap
        processes (the sandbox's monitor, and as root the root stage's two: its monitor and its
        PID namespace's init)."""
        return self.max_processes + (4 if os.geteuid() == 0 else 2)

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
            max_processes=cfg.max_processes,
            scratch_mb=cfg.scratch_mb,
            uid_base=cfg.sandbox_uid_base,
            allow_unsandboxed=cfg.allow_unsandboxed,
            cpu_cores=cfg.cpu_cores,
            scratch_inodes=cfg.scratch_inodes,
        )


@dataclass(frozen=True)
class RunResult:
    """What one run of a program did."""

    status: str  # "ok" (exit 0) | "error" (non-zero exit, killed other than by the bound) | "timeout"
    returncode: int | None  # None on timeout; -N when killed by signal N
    stdout: str  # decoded UTF-8 (errors replaced), at most the bytes kept
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    sandboxed: bool  # True when the run was inside bubblewrap
    value: str | None = None  # functional runs: JSON text of the value the method returned
    stdout_bytes: bytes | None = None  # the kept stdout undecoded, when the run was asked not to decode


# --- what the sandbox sees -----------------------------------------------------------------------


def _inside(path: str, tree: str) -> bool:
    return os.path.commonpath([path, tree]) == tree


def _hidden(trees: list[str]) -> list[str]:
    """Folders inside the bound trees that a program must not see: installed packages, the grader's
    virtual environment, its working directory (the workflow) and this package."""
    candidates = {
        sysconfig.get_path("purelib", vars={"base": PREFIX}),
        sysconfig.get_path("platlib", vars={"platbase": PREFIX}),
        os.path.realpath(sys.prefix),
        os.path.realpath(os.getcwd()),
        str(Path(__file__).resolve().parents[2]),
    }
    for root in ("/usr/lib", "/usr/local/lib"):
        if os.path.isdir(root):
            for name in os.listdir(root):
                if name.startswith("python"):
                    candidates |= {f"{root}/{name}/dist-packages", f"{root}/{name}/site-packages"}
    stdlib = os.path.realpath(sysconfig.get_path("stdlib", vars={"installed_base": PREFIX}))
    hidden = []
    for path in sorted({os.path.realpath(c) for c in candidates}):
        visible = os.path.isdir(path) and any(_inside(path, tree) for tree in trees)
        # A folder holding the interpreter or its standard library stays (the cwd may be "/").
        if visible and not _inside(PYTHON, path) and not _inside(stdlib, path):
            hidden.append(path)
    return hidden


def _root_binds(prefix_source: str) -> list[str]:
    """bwrap arguments for the read-only root: /usr, the top-level links into it, the prefix."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    trees = ["/usr"]
    if not _inside(PREFIX, "/usr"):
        args += ["--ro-bind", prefix_source, PREFIX]
        trees.append(PREFIX)
    for path in _hidden(trees):
        args += ["--tmpfs", path, "--remount-ro", path]
    return args


# Top-level entries of /proc that a program may see: the folders of its own processes (through
# these links), and what holds no count that moves with what other processes do (fixed while the
# host runs, the program's own, or readable by root alone). Every other entry, and any a newer
# kernel adds, is covered.
PROC_KEPT = frozenset(
    "self thread-self cmdline config.gz consoles crypto devices dma execdomains filesystems iomem "
    "ioports kallsyms keys misc mtrr partitions version acpi bus driver sysvipc tty".split()
)


def _proc_cover_args() -> tuple[str, ...]:
    """bwrap arguments that cover the top-level entries of the sandbox's /proc that hold counters
    the whole host shares (stat, loadavg, meminfo, sys/fs/file-nr, sys/kernel/pty/nr, ...), which
    a program could move and a neighbour read. The entries are read from this host's /proc (the
    same kernel's): folders get an empty read-only tmpfs, files /dev/null (on a mount that opens
    no device), links (mounts, net: into self) stay, and so do files only root may read."""
    names = sorted(os.listdir("/proc"))
    if "stat" not in names:  # a /proc mounted with subset=pid hides what a fresh one shows
        raise SandboxUnavailable(
            "this host's /proc hides its global entries (subset=pid?): cannot tell which to cover"
        )
    args: list[str] = []
    for name in names:
        path = f"/proc/{name}"
        if name.isdigit() or name in PROC_KEPT or os.path.islink(path):
            continue
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            args += ["--tmpfs", path, "--remount-ro", path]
        elif info.st_mode & stat.S_IROTH:
            args += ["--ro-bind", "/dev/null", path]
    return tuple(args)


_proc_covers = functools.cache(_proc_cover_args)  # read once per process


def _bwrap_command(limits: SandboxLimits, info_fd: int, driver_args: list[str], uid: int | None) -> list[str]:
    """The whole command line of one program's sandbox; `uid`: the host uid to run it as (when the
    grader is root)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bwrap (Debian package bubblewrap) is not on PATH")
    as_root = os.geteuid() == 0
    inner = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--as-pid-1",  # the driver is the PID namespace's init: no bwrap process inside to attack
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        *_root_binds(STAGE_PYTHON if as_root else PREFIX),
        "--proc",
        "/proc",
        *_proc_covers(),
        "--dev",
        "/dev",
        # no pseudo-terminals: each draws on a count the whole host shares
        "--tmpfs",
        "/dev/pts",
        "--remount-ro",
        "/dev/pts",
        "--remount-ro",
        "/dev",
        *(
            ["--bind", STAGE_SCRATCH, "/tmp"]
            if as_root
            else ["--size", str(limits.scratch_mb << 20), "--tmpfs", "/tmp"]
        ),
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        *[
            arg
            for key, value in {**ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}.items()
            for arg in ("--setenv", key, value)
        ],
        "--",
        *driver_args,
    ]
    info = ["--info-fd", str(info_fd)]  # the host pid of the outermost PID namespace's init
    if not as_root:
        return [inner[0], *info, *inner[1:]]
    # The root stage has a PID namespace of its own: its init dies with the grading thread
    # (--die-with-parent), and the kernel then kills everything below, the unprivileged bwrap
    # (whose parent-death signal the uid change cleared) included.
    stage = [bwrap, *info, "--unshare-pid", "--dev-bind", "/", "/", "--tmpfs", "/tmp"]
    stage += ["--ro-bind", PREFIX, STAGE_PYTHON, "--dir", STAGE_SCRATCH]
    scratch = [shutil.which("sh") or "/bin/sh", "-c", MOUNT_SCRATCH, "atlas-scratch"]
    scratch += [str(limits.scratch_mb << 20), str(limits.scratch_inodes), str(uid)]
    drop = [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--pdeathsig=SIGKILL",
    ]
    return [*stage, "--die-with-parent", "--", *scratch, *drop, "--", *inner]


# --- host uids of sandboxes (when the grader is root) ----------------------------------------------

_uid_lock = threading.Lock()
_uids_taken: set[int] = set()


def _claim_uid(base: int) -> int:
    """A host uid for a new sandbox of this thread: `base` + UIDS_PER_THREAD x the thread's id +
    the first slot this thread has free. Thread ids are unique on the machine while the thread
    lives, and a thread's sandboxes die with it, so no two live sandboxes share a uid, and
    RLIMIT_NPROC counts the processes of one sandbox only."""
    first = base + UIDS_PER_THREAD * threading.get_native_id()
    with _uid_lock:
        for uid in range(first, first + UIDS_PER_THREAD):
            if uid not in _uids_taken:
                _uids_taken.add(uid)
                return uid
    raise RuntimeError(f"a grading thread holds at most {UIDS_PER_THREAD} sandboxes at once")


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_taken.discard(uid)


# --- one question's programs, one at a time ------------------------------------------------------

LOCKS_PREFIX = "atlas-grading-"  # + the euid: the folder of the question locks
# Where that folder goes: the first of these that exists, the same for every grader of a user on
# a host whatever its environment ($TMPDIR differs between jobs; a job's /tmp may be its own).
LOCK_PARENTS = ("/run/lock", "/dev/shm", "/var/tmp", "/tmp")


def _locks_folder() -> str:
    """This user's folder of question locks (made on first use), refused unless it is a folder of
    this user; its mode is put back to 0700 if something of this user widened it."""
    parent = next((p for p in LOCK_PARENTS if os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)), None)
    if parent is None:
        raise SandboxUnavailable(
            f"none of {', '.join(LOCK_PARENTS)} is a writable folder for the question locks"
        )
    path = os.path.join(parent, f"{LOCKS_PREFIX}{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise SandboxUnavailable(f"{path}: not a folder of this user, so no question lock can live there")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def lock_path(key: str) -> str:
    """The file whose flock is the question lock of `key`."""
    return os.path.join(_locks_folder(), hashlib.sha256(key.encode("utf-8")).hexdigest()[:32])


class QuestionLock:
    """Held while a program of one question runs: no other program of the same question runs on this
    host meanwhile, in this process or another (training arms, validation, a verl job beside it).
    Whatever two sandboxes graded at once could tell each other through the kernel they share
    (timing, counters the kernel keeps for the whole host) is then about another question: no
    program can copy an answer a concurrent attempt at its own question computed.

    An exclusive flock on a file named by the key's hash, which the holder removes when it lets
    go, so the folder holds only the locks held now; a waiter that wakes on a file already
    removed (or replaced) starts again. Closing the descriptor releases the lock, also when the
    grader dies."""

    def __init__(self, key: str):
        self.path = lock_path(key)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    named = os.stat(self.path, follow_symlinks=False)
                except FileNotFoundError:
                    named = None
            except BaseException:
                os.close(fd)
                raise
            if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                self.fd: int | None = fd
                return
            os.close(fd)  # the holder before us removed it: the lock is the file there now

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # still ours: only a holder removes the file
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None


# --- scratch folders of unsandboxed runs ---------------------------------------------------------


def scratch_prefix(owner: int | None = None) -> str:
    """Names of the scratch folders of unsandboxed runs by process `owner` (default: this one)."""
    return f"{SCRATCH_PREFIX}{os.getpid() if owner is None else owner}-"


def sweep_stale_scratch(root: str | None = None) -> list[str]:
    """Remove the scratch folders of unsandboxed runs whose grader process is gone: only folders
    named as this module names them, owned by this user, never a link. Never raises."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = SCRATCH_NAME.fullmatch(name)
        if match is None or cgroups._alive(int(match.group(1))):
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


@functools.cache
def _swept() -> None:
    sweep_stale_scratch()


# --- one program's sandbox -----------------------------------------------------------------------


class _Frames:
    """Frames from the driver's reply pipe, read under a deadline."""

    def __init__(self, fd: int, stderr_fd: int):
        self.fd, self.buffer = fd, bytearray()
        self.selector = selectors.DefaultSelector()
        self.selector.register(fd, selectors.EVENT_READ)
        self.selector.register(stderr_fd, selectors.EVENT_READ)
        self.stderr_fd, self.stderr = stderr_fd, bytearray()
        self.closed = False

    def next(self, deadline: float) -> tuple[bytes, bytes] | None:
        """The next frame, or None when the driver is gone or the deadline passed."""
        size = driver.HEADER.size
        while True:
            if len(self.buffer) >= size:
                kind, length = driver.HEADER.unpack(self.buffer[:size])
                if len(self.buffer) >= size + length:
                    payload = bytes(self.buffer[size : size + length])
                    del self.buffer[: size + length]
                    return kind, payload
            now = time.monotonic()
            if self.closed or now >= deadline:
                return None
            for key, _ in self.selector.select(deadline - now):
                data = os.read(key.fd, READ_CHUNK)
                if key.fd == self.stderr_fd:
                    self.stderr += data[: max(0, 4096 - len(self.stderr))]
                    if not data:
                        self.selector.unregister(self.stderr_fd)
                elif data:
                    self.buffer += data
                else:
                    self.closed = True


class _Capped:
    """The first `limit` bytes of a stream; the rest is counted as truncation and dropped."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.truncated = limit, bytearray(), False

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.truncated |= len(data) > room

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


class Sandbox:
    """One program's sandbox: its driver starts once, then runs one test at a time.

    mode: "stdin" (an LCB program reading its input), "functional" (`Solution().func_name`), or
    "script" (a plain program: the python tool). Without `code`, the sandbox starts ahead of its
    program (bwrap, the interpreter, lcb_runner's imports) and `load` gives it the one program it
    will run. Use as a context manager; `close` kills whatever is left and returns once every
    process of the sandbox is gone."""

    lock: QuestionLock | None = None  # held from `load` to `close` when the program names its question

    def __init__(
        self,
        code: str | None = None,
        *,
        mode: str,
        limits: SandboxLimits,
        func_name: str | None = None,
        question: str | None = None,
    ):
        _swept()
        self.limits, self.mode = limits, mode
        self.sandboxed = require_sandbox(limits.allow_unsandboxed)
        self._spawn()
        if code is not None:
            self.load(code, func_name=func_name, question=question)

    def _spawn(self) -> None:
        """Start the sandbox and send the driver its setup; `load` reads its ready reply."""
        request_r, self.request = os.pipe()
        self.reply, reply_w = os.pipe()
        info_r, info_w = os.pipe()
        code_r, code_w = os.pipe()
        if len(DRIVER_CODE) > fcntl.fcntl(code_w, fcntl.F_GETPIPE_SZ):
            fcntl.fcntl(code_w, fcntl.F_SETPIPE_SZ, len(DRIVER_CODE))
        try:
            os.write(code_w, DRIVER_CODE)  # whole: it fits the pipe, and no one reads it yet
        finally:
            os.close(code_w)
        fds = (request_r, reply_w, info_w, code_r)
        driver_args = [PYTHON, *PYTHON_FLAGS, "-c", BOOT, driver.MARK, str(request_r), str(reply_w)]
        driver_args += ["1" if self.sandboxed else "0", str(code_r)]
        self.scratch, self.uid, self.loaded, self.cgroup = None, None, False, None
        env = dict(ENV)
        try:
            self.cgroup = cgroups.Cgroup(
                self.limits.cgroup_memory_bytes, self.limits.cgroup_pids, self.limits.cpu_cores
            )
            if self.sandboxed:
                self.uid = _claim_uid(self.limits.uid_base) if os.geteuid() == 0 else None
                command, cwd = _bwrap_command(self.limits, info_w, driver_args, self.uid), "/"
            else:
                self.scratch = tempfile.mkdtemp(prefix=scratch_prefix())
                command, cwd = driver_args, self.scratch
                env.update(HOME=self.scratch, TMPDIR=self.scratch)
            join = [shutil.which("sh") or "/bin/sh", "-c", JOIN, "atlas-sandbox-join"]
            self.proc = subprocess.Popen(
                [*join, *self.cgroup.procs_files, "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=fds,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            for fd in (info_r, self.request, self.reply):
                os.close(fd)
            if self.uid is not None:
                _release_uid(self.uid)
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
            if self.cgroup is not None:
                self.cgroup.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self.info, self.init_pid = info_r, None
        self.frames = _Frames(self.reply, self.proc.stderr.fileno())
        setup = {
            "memory_mb": self.limits.memory_mb,
            "cpu_s": self.limits.cpu_s,
            "file_size_mb": self.limits.file_size_mb,
            "open_files": self.limits.open_files,
            "max_output_bytes": self.limits.max_output_bytes,
            "max_processes": self.limits.max_processes,
        }
        # Into an empty pipe: this never waits for the driver.
        self.setup_sent = self._send(b"S", marshal.dumps(setup), time.monotonic() + START_TIMEOUT_S)

    def load(
        self, code: str, *, func_name: str | None = None, mode: str | None = None, question: str | None = None
    ) -> None:
        """Give the sandbox its program (`mode` defaults to the one it was started for: "stdin" and
        "functional" are interchangeable, "script" is not). Once only: a sandbox runs one program.
        `question`: what the program is an attempt at (a question's uid, a test set's hash); the
        program waits here until no other program of it runs on this host, and holds it until
        `close` (QuestionLock)."""
        mode = mode or self.mode
        if self.loaded:
            raise RuntimeError("a sandbox runs one program only")
        if (mode == "script") != (self.mode == "script"):
            raise ValueError(f"a sandbox started for mode {self.mode!r} cannot run a {mode!r} program")
        self.mode, self.loaded = mode, True
        if question is not None:
            try:
                self.lock = QuestionLock(question)
            except BaseException:
                self.close()
                raise
        program = {
            "code": code,
            "mode": mode,
            "func_name": func_name,
            "filename": "main.py" if mode == "script" else "solution.py",
            "prefix": "" if mode == "script" else prefix.needed(code),
        }
        deadline = time.monotonic() + START_TIMEOUT_S
        frame = self.frames.next(deadline) if self.setup_sent else None
        ready = frame is not None and frame[0] == b"R"
        if not ready or not self._send(b"P", marshal.dumps(program), deadline):
            why = self.frames.stderr.decode("utf-8", errors="replace").strip()
            self.close()
            raise SandboxUnavailable(f"the sandbox did not start: {why or 'no reply from its driver'}")

    def _send(self, kind: bytes, payload: bytes, deadline: float) -> bool:
        data = memoryview(driver.HEADER.pack(kind, len(payload)) + payload)
        os.set_blocking(self.request, False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.request, selectors.EVENT_WRITE)
            while data:
                if time.monotonic() >= deadline or not selector.select(deadline - time.monotonic()):
                    return False
                try:
                    data = data[os.write(self.request, data) :]
                except BrokenPipeError:
                    return False
        return True

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self.frames.closed

    def run(self, stdin: str = "", *, timeout_s: float, keep_bytes: int, text: bool = True) -> RunResult:
        """One run of the program on `stdin` (a functional test: its JSON argument lines).

        Keeps `keep_bytes` of stdout (the grader knows how much a comparison needs; the sandbox
        never does), decoded, or as bytes in `stdout_bytes` (`text=False`: a grader that decodes
        later). A sandbox that fails to answer in time is killed: see `alive`."""
        start = time.monotonic()
        deadline = start + timeout_s + HOST_GRACE_S
        out = _Capped(keep_bytes)
        test = marshal.dumps({"input": stdin, "timeout_s": timeout_s})
        done = None
        if self._send(b"T", test, deadline):
            while (frame := self.frames.next(deadline)) is not None:
                if frame[0] == b"O":
                    out.add(frame[1])
                elif frame[0] == b"D":
                    done = json.loads(frame[1])
                    break
        wall_s = time.monotonic() - start
        if done is None:  # the driver hung or died (a program can kill it): end the sandbox
            timed_out = wall_s >= timeout_s
            self.close()
            # Not the driver's stderr: text there is no verdict's business (the program's own
            # stderr comes in the D frame, capped).
            why = SANDBOX_ENDED
            return RunResult(
                "timeout" if timed_out else "error",
                None,
                out.text() if text else "",
                why,
                out.truncated,
                False,
                wall_s,
                self.sandboxed,
                stdout_bytes=None if text else bytes(out.kept),
            )
        if done.get("spent"):  # its scratch could not be emptied: the next test gets a new sandbox
            self.close()
        err = done["stderr"].encode("utf-8")
        cap = self.limits.max_output_bytes
        return RunResult(
            status=done["status"],
            returncode=done["returncode"],
            stdout=out.text() if text else "",
            stderr=err[:cap].decode("utf-8", errors="replace"),
            stdout_truncated=out.truncated or done["stdout_truncated"],
            stderr_truncated=done["stderr_truncated"] or len(err) > cap,
            wall_s=wall_s,
            sandboxed=self.sandboxed,
            value=done["value"],
            stdout_bytes=None if text else bytes(out.kept),
        )

    def _init_pid(self) -> int | None:
        """The host pid of the sandbox's init (bwrap's --info-fd), once bwrap has written it."""
        if self.init_pid is None and self.sandboxed:
            os.set_blocking(self.info, False)
            try:
                data = os.read(self.info, 4096)
                self.init_pid = json.loads(data)["child-pid"] if data else None
            except (BlockingIOError, ValueError, KeyError):
                pass
        return self.init_pid

    def close(self) -> None:
        """Kill the sandbox and wait until every process of it is gone."""
        if self.proc.poll() is None:
            # Killing the PID namespace's init makes the kernel kill and reap everything inside;
            # then the bwrap processes above it exit on their own, the first one last.
            init = self._init_pid()
            try:
                if init is not None:
                    os.kill(init, signal.SIGKILL)
                else:
                    os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=KILL_GRACE_S)
        if not self.sandboxed:
            try:  # what an unsandboxed run left in its session
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in (self.request, self.reply, self.info):
            if fd is not None:
                os.close(fd)
        self.request = self.reply = self.info = None
        if self.uid is not None:  # every process of the sandbox is gone: the uid is free
            _release_uid(self.uid)
            self.uid = None
        self.frames.closed = True
        self.proc.stderr.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if self.cgroup is not None:  # what escaped the kill above, then the cgroups themselves
            self.cgroup.close()
            self.cgroup = None
        if self.lock is not None:  # nothing of the program runs: the next one of its question may
            self.lock.release()
            self.lock = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- availability --------------------------------------------------------------------------------

_probe_lock = threading.Lock()


@functools.cache
def _probe_once() -> tuple[bool, str]:
    limits = SandboxLimits(5.0, 256, 5, 1, 16, 4096)
    box = Sandbox.__new__(Sandbox)
    box.limits, box.mode, box.sandboxed = limits, "script", True
    try:
        box._spawn()
        box.load("print('ok')")
    except (SandboxUnavailable, OSError) as err:
        return False, str(err)
    try:
        run = box.run(timeout_s=5.0, keep_bytes=64)
    finally:
        box.close()
    if (run.status, run.stdout) != ("ok", "ok\n"):
        return False, f"a probe program gave {run.status}: {run.stderr.strip()[-200:]}"
    return True, ""


def _probe() -> tuple[bool, str]:
    with _probe_lock:
        return _probe_once()


def isolation_available() -> bool:
    """Whether programs run inside bubblewrap here (probed once per process)."""
    return _probe()[0]


def isolation_problem() -> str:
    """Why bubblewrap cannot start here ('' when it can)."""
    return _probe()[1]


def require_sandbox(allow_unsandboxed: bool) -> bool:
    """Whether programs run sandboxed here; raises SandboxUnavailable when bubblewrap cannot start
    and running without it was not asked for (graders.allow_unsandboxed), or when the question
    locks have no folder of this user's. Says once what this host's cgroups cannot bound. Grading
    stages call it first, so a missing or broken bwrap stops them at start."""
    _locks_folder()
    if not isolation_available() and not allow_unsandboxed:
        raise SandboxUnavailable(
            f"bubblewrap cannot start here ({isolation_problem()}); graded code runs only inside it. "
            "Install bubblewrap (scripts/setup.sh) and allow user namespaces, or set "
            "graders.allow_unsandboxed: true to run programs without it (every verdict then says "
            "sandboxed: false)"
        )
    cgroups.say_missing_once()
    return isolation_available()


def run_program(
    code: str, stdin: str = "", *, limits: SandboxLimits, question: str | None = None
) -> RunResult:
    """Run `code` as a plain Python program (`__main__`, file main.py) on `stdin`, in a sandbox of
    its own, and keep `max_output_bytes` of its output; `question` as in `Sandbox.load`."""
    with Sandbox(code, mode="script", limits=limits, question=question) as box:
        return box.run(stdin, timeout_s=limits.timeout_s, keep_bytes=limits.max_output_bytes)


# --- what is left running ------------------------------------------------------------------------


def _table() -> dict[int, tuple[str, int]]:
    """pid -> (state, ppid) of every process, from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    raw = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            fields = raw[raw.rindex(b")") + 2 :].split()
            table[int(name)] = (fields[0].decode(), int(fields[1]))
    return table


def _marked(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return driver.MARK.encode() in f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


def sandboxed_processes(owner: int | None = None) -> list[int]:
    """Live processes of the sandboxes that process `owner` (default: this one) started, at any
    depth below it: bwrap, the driver, and whatever the programs started. Other graders' sandboxes
    are not counted."""
    owner = os.getpid() if owner is None else owner
    table = _table()
    found = []
    for pid, (state, _) in table.items():
        if state == "Z" or pid == owner:
            continue
        marked, cursor = False, pid
        while cursor in table and cursor != owner and cursor > 1:
            marked = marked or _marked(cursor)
            cursor = table[cursor][1]
        if cursor == owner and marked:
            found.append(pid)
    return sorted(found)
