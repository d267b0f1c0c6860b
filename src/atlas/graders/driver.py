"""The driver inside a program's sandbox: started once per program, it runs each test in a child.

Standard library only: the sandbox holds the interpreter's standard library and nothing else. The
grader (sandbox.py) runs this file, compiled once and marshalled, as

    python -S -P -c <BOOT> atlas-sandbox-driver REQUEST_FD REPLY_FD CONTAINED CODE_FD

(BOOT reads the code object from CODE_FD and runs it) and talks to it in frames (one type byte, a
4-byte big-endian length, the payload):

    grader -> driver   S setup (JSON: bounds, whether to import lcb_runner's prefix), then P the
                       program (JSON: code, mode, func_name, filename), then T per test (JSON:
                       input, timeout_s)
    driver -> grader   R ready (after S); per test O stdout bytes (as they come), then D done (JSON)

A sandbox can thus be started, and its driver set up, before its program is known; it still runs
one program only.

The driver never receives an expected output: it returns what the program printed (stdin tests)
or what the method returned (functional tests), and the grader compares. Each test runs in a child
forked from the driver, which has already imported the standard modules, under the per-test time,
memory, CPU, file-size and descriptor bounds; the process count is bounded for the whole sandbox.

A functional result is the value the call returned, marshalled by the child right after the call
and written to a pipe of its own; the driver turns it into JSON. A raise, a value that is not JSON
(a set, an object, NaN), or anything written to stdout after the call returned, is an error.
Where the sandbox has its own PID namespace (CONTAINED=1), the driver is its init (bwrap
--as-pid-1), so no process inside but the driver can be traced or written to (it is not dumpable),
and every process but the driver is killed after each test, so nothing a test leaves running sees
the next test. The driver runs under a seccomp filter, and each test's child adds a stricter one
before the program runs (DENIED and DRIVER_NEEDS below).
"""

import atexit
import gc
import json
import marshal
import os
import resource
import select
import signal
import struct
import sys
import time

MARK = "atlas-sandbox-driver"
HEADER = struct.Struct(">cI")
READ_CHUNK = 1 << 16
FORWARD_CAP = 64 << 20  # stdout bytes forwarded per test; the grader keeps what a comparison needs
VALUE_CAP = 64 << 20  # bytes of one marshalled return value
REAP_S = 1.0  # how long killing what a test left behind may take before the driver gives up

# lcb_runner's `import_string` (lcb_runner/evaluation/testing_util.py), run before an LCB program.
IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\n"
    "import statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\n"
    "import json\nsys.setrecursionlimit(50000)\n"
)
# Captured before any program runs: a program that patches marshal or json changes its own copy of
# the module attribute, not these references.
_marshal_dumps = marshal.dumps
_write = os.write
_exit = os._exit  # a program that replaces os._exit must not fall back into the driver's code
VALUE_JSON_CAP = 16 << 20  # characters of a returned value's JSON text, counted while it is built
DRIVER_HEADROOM_MB = 512  # the driver's own RLIMIT_AS is the program's memory_mb plus this

# --- the seccomp filters of the driver and of a test's child --------------------------------------
# System calls a program never needs, each refused with EPERM: ptrace and cross-process memory,
# descriptors taken from other processes, memory outside RLIMIT_AS (SysV shm / msg / sem, POSIX
# message queues, memfds, tmpfs xattrs, keyrings, io_uring buffers), kernel interfaces (perf, bpf,
# userfaultfd), and namespaces and mounts (already refused for want of capabilities). The driver
# runs under the same filter but for DRIVER_NEEDS: it creates each test's stdin memfd and pidfd
# before the fork; the child then adds the whole filter.
DENIED = (
    "ptrace process_vm_readv process_vm_writev pidfd_getfd pidfd_open kcmp shmget shmat shmctl "
    "msgget semget mq_open setxattr lsetxattr fsetxattr add_key request_key keyctl memfd_create "
    "memfd_secret "
    "perf_event_open bpf userfaultfd io_uring_setup io_uring_enter io_uring_register unshare setns "
    "mount open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr"
).split()
DRIVER_NEEDS = ("memfd_create", "pidfd_open")
_COMMON = {  # numbers shared by every architecture since Linux 5.1
    "pidfd_getfd": 438, "pidfd_open": 434, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "memfd_secret": 447,
}  # fmt: skip
# (AUDIT_ARCH_*, numbers) from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h (aarch64).
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "shmget": 29,
        "shmat": 30, "shmctl": 31, "msgget": 68, "semget": 64, "mq_open": 240, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "add_key": 248, "request_key": 249, "keyctl": 250,
        "memfd_create": 319, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "unshare": 272,
        "setns": 308, "mount": 165, **_COMMON,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "shmget": 194, "shmat": 196, "shmctl": 195, "msgget": 186, "semget": 190, "mq_open": 180,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "add_key": 217, "request_key": 218,
        "keyctl": 219, "memfd_create": 279, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
        "unshare": 97, "setns": 268, "mount": 40, **_COMMON,
    }),
}  # fmt: skip
X32_BIT = 0x40000000  # x86_64 system calls of the x32 ABI: refused as a whole
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM


def seccomp_program(machine: str, names: tuple[str, ...] | list[str] = tuple(DENIED)) -> bytes:
    """The classic BPF program (struct sock_filter array) refusing the system calls `names` (by
    default DENIED, the child's filter) on `machine`.

    A call made under another audit arch than the machine's own (a 32-bit `int 0x80` on x86_64)
    is refused whatever its number, since the numbers below would not apply to it."""
    arch, numbers = SYSCALLS[machine]
    denied = sorted({numbers[name] for name in names})
    op = struct.Struct("=HBBI").pack
    deny_at = 3 + len(denied) + 1 + (machine == "x86_64")  # index of the final RET EPERM
    prog = [op(_BPF_LD_W_ABS, 0, 0, 4), op(_BPF_JEQ_K, 0, deny_at - 2, arch), op(_BPF_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        prog.append(op(_BPF_JGE_K, deny_at - len(prog) - 1, 0, X32_BIT))
    for nr in denied:
        prog.append(op(_BPF_JEQ_K, deny_at - len(prog) - 1, 0, nr))
    prog += [op(_BPF_RET_K, 0, 0, _ALLOW), op(_BPF_RET_K, 0, 0, _EPERM)]
    assert len(prog) == deny_at + 1
    return b"".join(prog)


class Seccomp:
    """A filter made ready once (libc, the struct sock_fprog): each test's child only installs it."""

    def __init__(self, program: bytes):
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        self.ctypes, self.program = ctypes, program  # the struct points into `program`: keep it
        self.libc = ctypes.CDLL(None, use_errno=True)
        argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        self.libc.prctl.argtypes = argtypes
        self.fprog = SockFprog(len(program) // 8, program)

    def install(self) -> None:
        """Install the filter on this process (and what it forks); no_new_privs first, as the kernel
        requires of an unprivileged filter (bwrap has set it already inside the sandbox)."""
        prctl, address = self.libc.prctl, self.ctypes.addressof(self.fprog)
        # PR_SET_NO_NEW_PRIVS = 38; PR_SET_SECCOMP = 22 with SECCOMP_MODE_FILTER = 2
        if prctl(38, 1, None, 0, 0) != 0 or prctl(22, 2, address, 0, 0) != 0:
            raise OSError(self.ctypes.get_errno(), "the seccomp filter could not be installed")


def _read_exact(fd: int, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(fd: int) -> tuple[bytes, bytes] | None:
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    payload = _read_exact(fd, size)
    return None if payload is None else (kind, payload)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def send(fd: int, kind: bytes, payload: bytes) -> None:
    write_all(fd, HEADER.pack(kind, len(payload)) + payload)


_filter: "Seccomp | None" = None  # the filter every test's child installs (set by main)
_prefix: dict = {}  # the names lcb_runner's import prefix defines (set by main)


# --- the child: one test -------------------------------------------------------------------------


def _print_exception(exc: BaseException, filename: str, code: str) -> None:
    """The interpreter's message for an uncaught exception, from the program's first frame on,
    with the program's source lines. traceback and linecache are imported only here: no other
    module the sandbox loads needs them, and a passing test never does."""
    import linecache
    import traceback

    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        tb = None
    traceback.print_exception(type(exc), exc, tb)


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # the program replaced or closed it: what it held is its own loss
            pass


def _finish(status: int) -> None:
    """End the child as the interpreter would: flush, run the atexit hooks, flush again."""
    _flush()
    atexit._run_exitfuncs()
    _flush()
    _exit(status)


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    _finish(1)


def _bound(setup: dict) -> None:
    mb = 1 << 20
    for limit, value in (
        (resource.RLIMIT_AS, setup["memory_mb"] * mb),
        (resource.RLIMIT_CPU, setup["cpu_s"]),
        (resource.RLIMIT_FSIZE, setup["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, setup["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def child(setup: dict, text: str, fds: tuple[int, int, int, int | None]) -> None:
    """Run the program on one test; never returns."""
    stdin_fd, out_w, err_w, value_w = fds
    os.setpgid(0, 0)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    if value_w is not None:
        os.dup2(value_w, 3)
        value_w = 3
    os.closerange(3 if value_w is None else 4, 1 << 16)  # the driver's channels stay out of reach
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _bound(setup)
    if _filter is not None:
        try:
            _filter.install()
        except OSError as err:
            _fail(f"atlas sandbox driver: {err}")
    filename, code = setup["filename"], setup["code"]
    sys.argv = [filename]
    mode = setup["mode"]
    # This child's own copy of the prefix's namespace (the fork copied it): copying its names into
    # a new dict would touch thousands of objects, each a page the fork would then copy.
    namespace = _prefix if mode != "script" else {}
    namespace["__name__"] = "solution" if mode == "functional" else "__main__"
    try:
        if mode == "functional":
            args = [json.loads(line) for line in text.split("\n") if line.strip()]
        exec(compile(code, filename, "exec"), namespace)
        if mode != "functional":
            _finish(0)
        if "Solution" not in namespace:
            _fail("the program defines no class Solution")
        method = getattr(namespace["Solution"](), setup["func_name"], None)
        if not callable(method):
            _fail(f"class Solution has no method {setup['func_name']}")
        value = method(*args)
    except SystemExit as exc:
        _finish(_exit_status(exc))
    except BaseException as exc:
        _print_exception(exc, filename, code)
        _finish(1)
    # The call returned. Its value goes out on its own pipe; stdout is then pointed at that pipe,
    # so whatever is printed from here on (an atexit hook) lands behind the value: an error.
    try:
        payload = _marshal_dumps(value)
    except (ValueError, TypeError):
        _fail(f"the return value ({type(value).__name__}) is not JSON-serialisable")
    _flush()
    write_all(value_w, struct.pack(">Q", len(payload)) + payload)
    os.dup2(value_w, 1)
    _finish(0)


# --- the driver: tests one at a time -------------------------------------------------------------


class _TooLarge(ValueError):
    pass


def to_json(value, cap: int = VALUE_JSON_CAP) -> str:
    """The JSON text of what marshal carried back; ValueError for anything JSON has not, or for a
    text longer than `cap`. marshal shares repeated objects, so a payload of a few hundred bytes
    can stand for a list of millions: the length is summed over distinct objects first (once per
    object), and the text is built only when it fits."""
    sizes: dict[int, int] = {}

    def size(v) -> int:
        known = sizes.get(id(v))
        if known is not None:
            return known
        kind = type(v)
        if v is None or kind in (bool, int, str):
            n = len(json.dumps(v))
        elif kind is float:
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("float")
            n = len(json.dumps(v))
        elif kind in (list, tuple):
            n = 2 + 2 * max(len(v) - 1, 0) + sum(size(item) for item in v)
        elif kind is dict:
            if not all(type(k) is str for k in v):
                raise ValueError("dict with non-string keys")
            n = 2 + 2 * max(len(v) - 1, 0) + sum(size(k) + 2 + size(item) for k, item in v.items())
        else:
            raise ValueError(kind.__name__)
        sizes[id(v)] = n  # every object stays alive in `value` meanwhile: ids are not reused
        return n

    if size(value) > cap:
        raise _TooLarge(f"its JSON is longer than {cap} characters")
    return json.dumps(value)


def _value_of(raw: bytes) -> tuple[str | None, str]:
    """(JSON text of the returned value or None, why not) from what the child wrote."""
    if len(raw) < 8:
        return None, ""
    (size,) = struct.unpack(">Q", raw[:8])
    payload, after = raw[8 : 8 + size], raw[8 + size :]
    if len(payload) < size:
        return None, "the return value was cut off"
    if after:
        return None, "the program wrote to stdout after the method returned"
    try:
        return to_json(marshal.loads(payload)), ""
    except _TooLarge as err:
        return None, f"the return value is too large ({err})"
    except (ValueError, EOFError, TypeError, RecursionError) as err:
        return None, f"the return value is not JSON-serialisable ({err})"


def _sandbox_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _kill_leftovers(pid: int, contained: bool) -> None:
    """Kill the test's process group and, inside a PID namespace of its own, every process but the
    driver (setsid() escapees included), and reap the orphans: there the driver is pid 1."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not contained:
        return
    spared = {1, os.getpid()}
    give_up = time.monotonic() + REAP_S
    while time.monotonic() < give_up:
        alive = []
        for other in _sandbox_pids():
            if other in spared:
                continue
            try:
                with open(f"/proc/{other}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
                if state != b"Z":
                    os.kill(other, signal.SIGKILL)
                    alive.append(other)
                elif other != pid:  # an orphan: the driver is the namespace's init, its reaper
                    os.waitpid(other, os.WNOHANG)
            except (FileNotFoundError, ProcessLookupError, ChildProcessError):
                continue
        if not alive:
            return
        time.sleep(0.001)


def run_test(setup: dict, test: dict, reply: int, contained: bool) -> None:
    text = test["input"]
    timeout_s = test["timeout_s"]
    functional = setup["mode"] == "functional"
    stdin_fd = os.memfd_create("stdin")
    if not functional:
        write_all(stdin_fd, text.encode("utf-8"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    value_r, value_w = os.pipe() if functional else (None, None)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child(setup, text, (stdin_fd, out_w, err_w, value_w))
        finally:
            _exit(70)
    for fd in (stdin_fd, out_w, err_w, value_w):
        if fd is not None:
            os.close(fd)
    pidfd = os.pidfd_open(pid)
    streams = {out_r: "out", err_r: "err", **({value_r: "value"} if functional else {})}
    kept = {"out": 0, "err": bytearray(), "value": bytearray()}
    dropped = {"out": False, "err": False, "value": False}
    err_cap = setup["max_output_bytes"]
    deadline = start + timeout_s
    status = None
    poller = select.poll()
    for fd in (*streams, pidfd):
        poller.register(fd, select.POLLIN)
    exited_at = None
    while True:
        now = time.monotonic()
        if exited_at is None:
            if now >= deadline:
                break
            wait_s = deadline - now
        else:
            # Once the child is gone, read what is left; a process that escaped its group (only
            # possible outside a PID namespace) may hold a pipe open: stop waiting for it soon.
            if not streams or now >= exited_at + 0.05:
                break
            wait_s = exited_at + 0.05 - now
        for fd, _ in poller.poll(int(wait_s * 1000) + 1):
            if fd == pidfd:
                poller.unregister(pidfd)
                _, wait_status = os.waitpid(pid, 0)
                status = os.waitstatus_to_exitcode(wait_status)
                exited_at = time.monotonic()
                _kill_leftovers(pid, contained)  # their pipe ends close: the reads below end
                continue
            name = streams.get(fd)
            if name is None:
                continue
            data = os.read(fd, READ_CHUNK)
            if not data:
                poller.unregister(fd)
                del streams[fd]
                continue
            if name == "out":
                room = FORWARD_CAP - kept["out"]
                if room > 0:
                    send(reply, b"O", data[:room])
                    kept["out"] += min(room, len(data))
                dropped["out"] |= len(data) > room
            else:
                cap = err_cap if name == "err" else VALUE_CAP
                room = cap - len(kept[name])
                kept[name] += data[: max(room, 0)]
                dropped[name] |= len(data) > room
    wall_s = time.monotonic() - start
    if status is None:
        _kill_leftovers(pid, contained)
        os.waitpid(pid, 0)
        finished = "timeout"
    else:
        finished = "ok" if status == 0 else "error"
    for fd in (pidfd, out_r, err_r, *([value_r] if functional else [])):
        os.close(fd)
    done = {
        "status": finished,
        "returncode": status,
        "wall_s": wall_s,
        "stderr": bytes(kept["err"]).decode("utf-8", errors="replace"),
        "stdout_truncated": dropped["out"],
        "stderr_truncated": dropped["err"],
        "value": None,
    }
    if functional and finished == "ok":
        done["value"], why = _value_of(bytes(kept["value"]))
        if why:
            done.update(status="error", returncode=1, stderr=done["stderr"] + why + "\n")
    send(reply, b"D", json.dumps(done).encode("utf-8"))


class _Quitter:
    """exit() and quit(), which the site module would define (the driver runs without it)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def main() -> None:
    import builtins

    builtins.exit, builtins.quit = _Quitter("exit"), _Quitter("quit")
    request, reply, contained = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    frame = read_frame(request)
    if frame is None or frame[0] != b"S":
        sys.exit("atlas sandbox driver: expected a setup frame")
    setup = json.loads(frame[1])
    # Every process and thread of the sandbox's uid counts, the driver and bwrap's monitor included.
    limit = setup["max_processes"] + 2
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    if contained:  # a program cannot ptrace the driver or open its descriptors or memory via /proc
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    global _filter
    machine = os.uname().machine
    if machine in SYSCALLS:
        _filter = Seccomp(seccomp_program(machine))
        Seccomp(seccomp_program(machine, [n for n in DENIED if n not in DRIVER_NEEDS])).install()
    elif contained:
        sys.exit(f"atlas sandbox driver: no seccomp system call table for {machine}")
    memory = (setup["memory_mb"] + DRIVER_HEADROOM_MB) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if setup["imports"]:
        exec(IMPORTS, _prefix)  # once here: each test's child starts from this namespace
    # What the driver has loaded lives as long as it does: frozen, a collection in a test's child
    # never walks it (and never makes the fork copy its pages). BOOT turned collection off while
    # the interpreter loaded it.
    gc.freeze()
    gc.enable()

    send(reply, b"R", b"")
    frame = read_frame(request)
    if frame is None:
        return  # never given a program: a sandbox started ahead and not needed
    if frame[0] != b"P":
        sys.exit("atlas sandbox driver: expected a program frame")
    setup.update(json.loads(frame[1]))
    while True:
        frame = read_frame(request)
        if frame is None:
            return
        run_test(setup, json.loads(frame[1]), reply, contained)


if __name__ == "__main__" and sys.argv[1:2] == [MARK]:
    main()
