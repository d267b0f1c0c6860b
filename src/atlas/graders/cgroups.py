"""One cgroup per sandbox: a memory bound that counts kernel memory, a process count, a CPU quota,
and a way to kill everything in it at once.

Where the cgroups go is found once per process (`layout`), for each of the memory, pids and cpu
controllers:

- cgroup v2 (the unified hierarchy holds the controllers): children of ATLAS_SANDBOX_CGROUP, a
  cgroup delegated to the grader (systemd: `Delegate=yes`), else of the grader's own cgroup when
  it can give its children the controllers (the root cgroup can; a cgroup that holds processes
  cannot, the kernel's rule of no internal processes);
- cgroup v1 (a hierarchy per controller, as on hybrid hosts): children of the grader's own cgroup
  in each hierarchy;
- the unified hierarchy, with or without controllers: a child there gives `cgroup.kill`.

What is missing is said once (`layout().missing`); the sandbox's other bounds (per-process
RLIMIT_AS, the process count of its uid, the scratch size) still hold. Each sandbox's cgroups are
named `atlas-sandbox-<pid namespace>-<grader pid>-<n>`; a grader sweeps those of graders of its
own pid namespace that are gone. A pid means nothing outside its namespace, and containers on one
host may share a cgroup tree: a sandbox of another namespace is never swept.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids", "cpu")
PARENT_ENV = "ATLAS_SANDBOX_CGROUP"  # a delegated cgroup v2 folder to make sandbox cgroups in
PREFIX = "atlas-sandbox-"
NAME = re.compile(r"atlas-sandbox-(\d{1,20})-(\d{1,10})-\d{1,12}")
CPU_PERIOD_US = 100_000
REMOVE_S = 2.0  # how long a cgroup's last processes may take to be released before rmdir gives up


@dataclass(frozen=True)
class Layout:
    """Where sandbox cgroups are made here."""

    parents: dict[str, str]  # controller -> folder its sandbox cgroups go in
    v2: frozenset[str]  # the controllers of `parents` that live in the unified hierarchy
    unified: str | None  # folder for the cgroup.kill-only child (v1 hosts with a unified mount)
    missing: str  # what is not bounded here, and why ('' when nothing is missing)


def _own_folders(
    mountinfo: str = "/proc/self/mountinfo", membership: str = "/proc/self/cgroup"
) -> dict[str, str]:
    """controller ('' for the unified hierarchy) -> this process's cgroup folder, from the mount
    table and the cgroup membership (this process's by default). Both hold paths as the kernel
    stores them, bytes: they are read as the file system's names are, whatever the locale."""
    names = {"encoding": sys.getfilesystemencoding(), "errors": sys.getfilesystemencodeerrors()}
    mounts: dict[str, tuple[str, str]] = {}
    with open(mountinfo, **names) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if len(fields) < 5 or len(extra) < 3:
                continue
            root, point = fields[3], fields[4]
            if extra[0] == "cgroup2":
                mounts.setdefault("", (root, point))
            elif extra[0] == "cgroup":
                for option in extra[2].split(","):
                    if option in CONTROLLERS:
                        mounts.setdefault(option, (root, point))
    folders = {}
    with open(membership, **names) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for key in controllers.split(",") if controllers else [""]:
                if key not in mounts:
                    continue
                root, point = mounts[key]
                if root != "/" and (path == root or path.startswith(root + "/")):
                    path = path[len(root) :]
                folder = point.rstrip("/") + path
                if os.path.isdir(folder):
                    folders[key] = folder.rstrip("/")
    return folders


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _v2_parent(own: str | None) -> tuple[str | None, str]:
    """A unified folder whose children get memory, pids and cpu, or None and why not."""
    parent = os.environ.get(PARENT_ENV) or own
    if parent is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        with open(f"{parent}/cgroup.controllers", encoding="ascii") as f:
            available = set(f.read().split())
        lacking = [c for c in CONTROLLERS if c not in available]
        if lacking:
            return None, f"cgroup v2 at {parent} does not offer {', '.join(lacking)}"
        with open(f"{parent}/cgroup.subtree_control", encoding="ascii") as f:
            enabled = set(f.read().split())
        if not set(CONTROLLERS) <= enabled:
            _write(f"{parent}/cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as err:
        return None, (
            f"cgroup v2 at {parent} cannot give its children {', '.join(CONTROLLERS)} ({err.strerror}); "
            f"set {PARENT_ENV} to a cgroup delegated to the grader (systemd: Delegate=yes)"
        )
    return parent, ""


@functools.cache
def layout() -> Layout:
    """Where sandbox cgroups go here (found once per process; stale ones are swept then)."""
    try:
        own = _own_folders()
    except OSError as err:
        return Layout({}, frozenset(), None, f"no cgroups: {err}")
    parents: dict[str, str] = {}
    v2: set[str] = set()
    why = []
    v1 = [c for c in CONTROLLERS if c in own]
    if len(v1) < len(CONTROLLERS):  # some controllers are not on a v1 hierarchy: try v2 for them
        parent, problem = _v2_parent(own.get(""))
        if parent is not None:
            for c in CONTROLLERS:
                if c not in own:
                    parents[c] = parent
                    v2.add(c)
        else:
            why.append(problem)
    for c in v1:
        if os.access(own[c], os.W_OK):
            parents[c] = own[c]
        else:
            why.append(f"the cgroup v1 {c} hierarchy at {own[c]} is not writable by this user")
    unified = None
    if not v2 and "" in own and os.access(own[""], os.W_OK):
        unified = own[""]
    lacking = [c for c in CONTROLLERS if c not in parents]
    missing = ""
    if lacking:
        missing = f"no per-sandbox {', '.join(lacking)} bound: " + "; ".join(why or ["no cgroup hierarchy"])
    found = Layout(parents, frozenset(v2), unified, missing)
    sweep(found)
    return found


_said = threading.Lock()
_told = False


def say_missing_once() -> None:
    """Print, once per process, what this host's cgroups cannot bound."""
    global _told
    missing = layout().missing
    with _said:
        if missing and not _told:
            _told = True
            print(f"atlas sandbox: {missing}", file=sys.stderr, flush=True)


_counter = itertools.count()
# Cgroups of this grader's closed sandboxes that could not be removed yet (a process of theirs
# slept in the kernel past REMOVE_S): each new sandbox tries them again, so a living grader leaves
# none behind for long.
_left: list[str] = []
_left_lock = threading.Lock()


def _retry_left() -> None:
    with _left_lock:
        waiting = list(_left)
        _left.clear()
    for folder in waiting:
        _kill_all(folder)
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:
            with _left_lock:
                _left.append(folder)


class Cgroup:
    """The cgroups of one sandbox, one per hierarchy: made with their bounds, joined by the
    sandbox's first process (`procs_files`), killed and removed by `close`."""

    def __init__(self, memory_bytes: int, max_pids: int, cpu_cores: float):
        _retry_left()
        self.layout = found = layout()
        self.name = f"{PREFIX}{pid_namespace()}-{os.getpid()}-{next(_counter)}"
        self.folders: list[str] = []
        try:
            for folder in sorted({*found.parents.values(), *([found.unified] if found.unified else [])}):
                path = f"{folder}/{self.name}"
                os.mkdir(path)
                self.folders.append(path)
                held = {c for c, p in found.parents.items() if p == folder}
                self._bound(path, held, memory_bytes, max_pids, cpu_cores)
        except OSError:
            self.close()
            raise

    def _bound(self, path: str, held: set[str], memory_bytes: int, max_pids: int, cpu_cores: float) -> None:
        v2 = bool(held & self.layout.v2)
        quota = max(1000, int(cpu_cores * CPU_PERIOD_US))
        if "memory" in held:
            if v2:
                _write(f"{path}/memory.max", str(memory_bytes))
                if os.path.exists(f"{path}/memory.swap.max"):
                    _write(f"{path}/memory.swap.max", "0")
            else:  # v1 charges kernel memory (inodes, dentries, page tables) to this limit too
                _write(f"{path}/memory.limit_in_bytes", str(memory_bytes))
                if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):
                    _write(f"{path}/memory.memsw.limit_in_bytes", str(memory_bytes))
        if "pids" in held:
            _write(f"{path}/pids.max", str(max_pids))
        if "cpu" in held:
            if v2:
                _write(f"{path}/cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(f"{path}/cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(f"{path}/cpu.cfs_quota_us", str(quota))

    @property
    def procs_files(self) -> list[str]:
        return [f"{folder}/cgroup.procs" for folder in self.folders]

    def file(self, controller: str, name: str) -> str | None:
        """The path of a bound's file (for a check), or None where the controller is missing."""
        parent = self.layout.parents.get(controller)
        return None if parent is None else f"{parent}/{self.name}/{name}"

    def close(self) -> None:
        """Kill whatever is still in the cgroups and remove them; never raises."""
        for folder in self.folders:
            _kill_all(folder)
        for folder in self.folders:
            _remove(folder)
        self.folders = []


def _pids(folder: str) -> list[int]:
    try:
        with open(f"{folder}/cgroup.procs", encoding="ascii") as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []


def _kill_all(folder: str) -> None:
    try:
        _write(f"{folder}/cgroup.kill", "1")
        return
    except OSError:
        pass
    for pid in _pids(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _remove(folder: str) -> None:
    give_up = time.monotonic() + REMOVE_S
    while True:
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY while the last killed processes are released
            if time.monotonic() >= give_up:
                with _left_lock:
                    _left.append(folder)
                return
            _kill_all(folder)
            time.sleep(0.005)


@functools.cache
def pid_namespace() -> int:
    """The inode of this process's pid namespace: the namespace a pid in a cgroup's name means."""
    return os.stat("/proc/self/ns/pid").st_ino


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def sweep(found: Layout) -> list[str]:
    """Kill and remove the sandbox cgroups of graders that are gone; never raises."""
    removed = []
    for folder in {*found.parents.values(), *([found.unified] if found.unified else [])}:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            match = NAME.fullmatch(name)
            if match is None or int(match.group(1)) != pid_namespace():
                continue  # not a sandbox's, or a sandbox of a grader whose pids we cannot see
            pid = int(match.group(2))
            if pid == os.getpid() or _alive(pid):
                continue
            _kill_all(f"{folder}/{name}")
            _remove(f"{folder}/{name}")
            if not os.path.exists(f"{folder}/{name}"):
                removed.append(f"{folder}/{name}")
    return removed
