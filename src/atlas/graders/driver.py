"""The driver inside a program's sandbox: started once per program, it runs each test in a child.

Standard library only: the sandbox holds the interpreter's standard library and nothing else. The
grader (sandbox.py) runs this file, compiled once and marshalled, as

    python -S -P -c <BOOT> atlas-sandbox-driver REQUEST_FD REPLY_FD CONTAINED CODE_FD

(BOOT reads the code object from CODE_FD and runs it) and talks to it in frames (one type byte, a
4-byte big-endian length, the payload):

    grader -> driver   S setup (bounds), then P the program (code, mode, func_name, filename, and
                       the part of lcb_runner's import prefix it needs), then T per test (input,
                       timeout_s); each a marshalled dict (marshal reads only what the grader wrote)
    driver -> grader   R ready (after S); per test O stdout bytes (as they come), then D done (JSON:
                       the grader reads nothing from a sandbox but JSON and bytes)

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

import _signal as signal  # the C module: `signal` would import enum
import atexit
import gc
import marshal
import os
import resource
import select
import struct
import sys
import time

MARK = "atlas-sandbox-driver"
HEADER = struct.Struct(">cI")
READ_CHUNK = 1 << 16
FORWARD_CAP = 64 << 20  # stdout bytes forwarded per test; the grader keeps what a comparison needs
VALUE_CAP = 64 << 20  # bytes of one marshalled return value
REAP_S = 1.0  # how long killing what a test left behind may take before the driver gives up

COMPILER_WARM_UP = "import sys\nn = int(input())\nprint([i * 2 for i in range(n)], f'{n}')\n"
PREFIX_RECURSION = 50000  # the prefix's recursion limit, set again in each test's child
# Captured before any program runs: a program that patches marshal or json changes its own copy of
# the module attribute, not these references.
_marshal_dumps = marshal.dumps
_write = os.write
_exit = os._exit  # a program that replaces os._exit must not fall back into the driver's code
VALUE_JSON_CAP = 16 << 20  # characters of a returned value's JSON text, counted while it is built
VALUE_DEPTH_CAP = 100  # nesting of a returned value: deeper is an error (the grader's json.loads
# and this driver's own recursion both stay far from their limits)
DRIVER_RECURSION = 1000  # the driver's recursion limit; a test's child sets the prefix's 50000
DRIVER_HEADROOM_MB = 512  # the driver's own RLIMIT_AS is the program's memory_mb plus this

# --- the seccomp filters of the driver and of a test's child --------------------------------------
# System calls a program never needs, each refused with EPERM:
# - ptrace and cross-process memory, descriptors taken from other processes;
# - memory outside RLIMIT_AS (SysV shm / msg / sem, POSIX message queues, memfds, tmpfs xattrs,
#   keyrings, io_uring buffers); kernel interfaces (perf, bpf, userfaultfd); namespaces and mounts
#   (already refused for want of capabilities);
# - what two sandboxes share through the host kernel: file locks and leases (flock, the fcntl lock
#   commands, which work on the read-only files every sandbox sees), inotify, fanotify and dnotify
#   (what a neighbour opens), and the page cache's probes and levers (mincore, cachestat,
#   RWF_NOWAIT reads, readahead, fadvise, the madvise advice that reads ahead or pages out),
#   the host-wide counts sysinfo gives (processes, shared memory), SO_COOKIE (a counter of the
#   whole host's sockets), sched_setaffinity (a program pinned to one CPU reads the counters the
#   kernel keeps per CPU more exactly), and PR_SET_DUMPABLE (a dumpable child reads which pages
#   of a shared file are cached through /proc/self/pagemap);
# - what makes the host's disks work for a program beyond its bounds: sync, syncfs, and fsync,
#   fdatasync, sync_file_range and msync, which flush the disk even for a file opened read-only,
#   and the kernel's AIO (io_setup, io_submit, ...): a process with reads in flight cannot be
#   killed until they end, and io_setup takes from a pool the whole host shares;
# - sockets of any family but AF_UNIX: AF_VSOCK ignores network namespaces, AF_NETLINK reaches
#   the kernel, and the sandbox's own network namespace holds nothing for the others.
# The driver runs under the same filter but for DRIVER_NEEDS: it creates each test's stdin memfd
# and pidfd before the fork; the child then adds the whole filter.
DENIED = (
    "ptrace process_vm_readv process_vm_writev pidfd_getfd pidfd_open kcmp shmget shmat shmctl "
    "msgget semget mq_open setxattr lsetxattr fsetxattr add_key request_key keyctl memfd_create "
    "memfd_secret "
    "perf_event_open bpf userfaultfd io_uring_setup io_uring_enter io_uring_register unshare setns "
    "mount open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr "
    "flock inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark "
    "mincore cachestat readahead fadvise64 preadv2 pwritev2 process_madvise "
    "sync syncfs fsync fdatasync sync_file_range msync sysinfo sched_setaffinity "
    "io_setup io_submit io_getevents io_pgetevents io_cancel io_destroy"
).split()
DRIVER_NEEDS = ("memfd_create", "pidfd_open")
AF_UNIX = 1
# fcntl commands refused: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW,
# F_SETLEASE, F_GETLEASE, F_NOTIFY (dnotify).
FCNTL_DENIED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
# madvise advice refused: MADV_WILLNEED, MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ / _WRITE.
MADVISE_DENIED = (3, 20, 21, 22, 23)
# System calls judged by one argument (its low 32 bits, all the kernel reads of an int):
# (name, argument index, values, whether the values are the only ones allowed or the ones refused).
SO_COOKIE = 57  # getsockopt(SOL_SOCKET, SO_COOKIE): a number from a counter the whole host shares
PR_SET_DUMPABLE = 4
ARGUMENT_RULES = (
    ("socket", 0, (AF_UNIX,), "allow"),
    ("socketpair", 0, (AF_UNIX,), "allow"),
    ("fcntl", 1, FCNTL_DENIED, "deny"),
    ("madvise", 2, MADVISE_DENIED, "deny"),
    ("getsockopt", 2, (SO_COOKIE,), "deny"),
    ("prctl", 0, (PR_SET_DUMPABLE,), "deny"),
)
_COMMON = {  # numbers shared by every architecture since Linux 5.1
    "pidfd_getfd": 438, "pidfd_open": 434, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "memfd_secret": 447, "cachestat": 451,
    "process_madvise": 440,
}  # fmt: skip
# (AUDIT_ARCH_*, numbers) from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h (aarch64, which has no inotify_init: it is left out there).
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "shmget": 29,
        "shmat": 30, "shmctl": 31, "msgget": 68, "semget": 64, "mq_open": 240, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "add_key": 248, "request_key": 249, "keyctl": 250,
        "memfd_create": 319, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "unshare": 272,
        "setns": 308, "mount": 165, "flock": 73, "inotify_init": 253, "inotify_init1": 294,
        "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301, "mincore": 27,
        "readahead": 187, "fadvise64": 221, "preadv2": 327, "pwritev2": 328, "socket": 41,
        "socketpair": 53, "fcntl": 72, "madvise": 28, "sync": 162, "syncfs": 306, "sysinfo": 99,
        "fsync": 74, "fdatasync": 75, "sync_file_range": 277, "msync": 26, "sched_setaffinity": 203,
        "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
        "io_pgetevents": 333, "getsockopt": 55, "prctl": 157, **_COMMON,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "shmget": 194, "shmat": 196, "shmctl": 195, "msgget": 186, "semget": 190, "mq_open": 180,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "add_key": 217, "request_key": 218,
        "keyctl": 219, "memfd_create": 279, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
        "unshare": 97, "setns": 268, "mount": 40, "flock": 32, "inotify_init1": 26,
        "inotify_add_watch": 27, "fanotify_init": 262, "fanotify_mark": 263, "mincore": 232,
        "readahead": 213, "fadvise64": 223, "preadv2": 286, "pwritev2": 287, "socket": 198,
        "socketpair": 199, "fcntl": 25, "madvise": 233, "sync": 81, "syncfs": 267, "sysinfo": 179,
        "fsync": 82, "fdatasync": 83, "sync_file_range": 84, "msync": 227, "sched_setaffinity": 122,
        "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4,
        "io_pgetevents": 292, "getsockopt": 209, "prctl": 167, **_COMMON,
    }),
}  # fmt: skip
X32_BIT = 0x40000000  # x86_64 system calls of the x32 ABI: refused as a whole
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_ARGS_AT = 16  # offsetof(struct seccomp_data, args): each argument 8 bytes, low word first here


def seccomp_program(machine: str, names: tuple[str, ...] | list[str] = tuple(DENIED)) -> bytes:
    """The classic BPF program (struct sock_filter array) refusing the system calls `names` (by
    default DENIED, the child's filter) and the argument values of ARGUMENT_RULES on `machine`.

    A call made under another audit arch than the machine's own (a 32-bit `int 0x80` on x86_64)
    is refused whatever its number, since the numbers below would not apply to it."""
    arch, numbers = SYSCALLS[machine]
    denied = sorted({numbers[name] for name in names if name in numbers})
    # Instructions with symbolic jump targets ("deny", "allow" or a rule's label), resolved below.
    code: list[tuple[int, object, object, int]] = []
    labels: dict[str, int] = {}

    def emit(op: int, k: int, jt: object = 0, jf: object = 0) -> None:
        code.append((op, jt, jf, k))

    emit(_BPF_LD_W_ABS, 4)
    emit(_BPF_JEQ_K, arch, 0, "deny")
    emit(_BPF_LD_W_ABS, 0)
    if machine == "x86_64":
        emit(_BPF_JGE_K, X32_BIT, "deny", 0)
    for nr in denied:
        emit(_BPF_JEQ_K, nr, "deny", 0)
    for name, _, _, _ in ARGUMENT_RULES:
        emit(_BPF_JEQ_K, numbers[name], name, 0)
    emit(_BPF_RET_K, _ALLOW)
    for name, index, values, kind in ARGUMENT_RULES:
        labels[name] = len(code)
        emit(_BPF_LD_W_ABS, _ARGS_AT + 8 * index)
        hit = "allow" if kind == "allow" else "deny"
        for value in values:
            emit(_BPF_JEQ_K, value, hit, 0)
        emit(_BPF_RET_K, _EPERM if kind == "allow" else _ALLOW)
    labels["allow"] = len(code)
    emit(_BPF_RET_K, _ALLOW)
    labels["deny"] = len(code)
    emit(_BPF_RET_K, _EPERM)

    op = struct.Struct("=HBBI").pack
    out = []
    for at, (opcode, jt, jf, k) in enumerate(code):
        jumps = [labels[j] - at - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= j <= 255 for j in jumps), "a jump past the reach of classic BPF"
        out.append(op(opcode, jumps[0], jumps[1], k))
    return b"".join(out)


class _Prctl:
    """prctl(2) through `_ctypes`, the C module under `ctypes`: importing `ctypes` itself (its
    types, its struct layouts) cost every sandbox's start several milliseconds, about a fifth of
    it, for the one function the driver calls."""

    def __init__(self):
        import _ctypes

        class Long(_ctypes._SimpleCData):
            _type_ = "l"

        class ULong(_ctypes._SimpleCData):
            _type_ = "L"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = Long
            _argtypes_ = (Long, ULong, ULong, ULong, ULong)

        class Libc:  # what CFuncPtr((name, library)) reads of a library: its dlopen handle
            _handle = _ctypes.dlopen(None)

        self.ctypes, self.function = _ctypes, Function(("prctl", Libc))

    def __call__(self, option: int, arg2: int = 0, arg3: int = 0) -> None:
        if self.function(option, arg2, arg3, 0, 0) != 0:
            raise OSError(self.ctypes.get_errno(), f"prctl({option}) failed")

    def buffer(self, data: bytes) -> tuple[object, int]:
        """A C copy of `data` and its address (the copy must outlive every use of the address)."""

        class Char(self.ctypes._SimpleCData):
            _type_ = "c"

        class Bytes(self.ctypes.Array):
            _type_, _length_ = Char, max(len(data), 1)

        copy = Bytes.from_buffer_copy(data.ljust(1, b"\0"))
        return copy, self.ctypes.addressof(copy)


class Seccomp:
    """A filter made ready once (the BPF program and its struct sock_fprog in C memory): each
    test's child only installs it."""

    def __init__(self, program: bytes, prctl: _Prctl):
        self.prctl = prctl
        self.program, address = prctl.buffer(program)
        # struct sock_fprog: an unsigned short count and the pointer, in the C compiler's layout
        self.fprog, self.address = prctl.buffer(struct.pack("@HP", len(program) // 8, address))

    def install(self) -> None:
        """Install the filter on this process (and what it forks); no_new_privs first, as the kernel
        requires of an unprivileged filter (bwrap has set it already inside the sandbox)."""
        try:
            self.prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
            self.prctl(22, 2, self.address)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        except OSError as err:
            raise OSError(err.errno, "the seccomp filter could not be installed") from None


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
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the driver ignores it; a program does not
    if setup["mode"] != "script":
        sys.setrecursionlimit(PREFIX_RECURSION)
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
            import json  # the driver loaded it for a functional program: no import per test

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
    import json  # a functional program's driver loaded it with the program

    known: dict[int, tuple[int, int]] = {}  # id -> (JSON length, levels of nesting below it)
    open_: set[int] = set()  # containers being sized: meeting one again is a cycle

    def size(v, depth: int = 0) -> int:
        """The JSON length of `v` met `depth` levels down; every path to an object counts, so an
        object shared between levels is as deep as its deepest place."""
        n, height = measure(v, depth)
        if depth + height > VALUE_DEPTH_CAP:
            raise _TooLarge(f"it is nested deeper than {VALUE_DEPTH_CAP} levels")
        return n

    def measure(v, depth: int) -> tuple[int, int]:
        if id(v) in known:
            return known[id(v)]
        if depth > VALUE_DEPTH_CAP:
            raise _TooLarge(f"it is nested deeper than {VALUE_DEPTH_CAP} levels")
        if id(v) in open_:
            raise ValueError("it contains itself")
        kind = type(v)
        height = 0
        if v is None or kind in (bool, int, str):
            n = len(json.dumps(v))
        elif kind is float:
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("float")
            n = len(json.dumps(v))
        elif kind in (list, tuple, dict):
            if kind is dict and not all(type(k) is str for k in v):
                raise ValueError("dict with non-string keys")
            items = list(v.values()) if kind is dict else v
            open_.add(id(v))
            n = 2 + 2 * max(len(v) - 1, 0)
            if kind is dict:
                n += sum(len(json.dumps(k)) + 2 for k in v)
            for item in items:
                n += size(item, depth + 1)
                height = max(height, 1 + known[id(item)][1])
            open_.discard(id(v))
        else:
            raise ValueError(kind.__name__)
        known[id(v)] = (n, height)  # every object stays alive in `value` meanwhile: ids are not reused
        return n, height

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


def _kill_leftovers(pid: int, contained: bool) -> bool:
    """Kill the test's process group and, inside a PID namespace of its own, every process but the
    driver, then reap them; whether nothing is left. There the driver is the namespace's init:
    kill(-1) reaches every other process in it, whatever its group or session (setsid()
    escapees, and zombies whose other threads live on, included), and every process of the
    namespace is the driver's child or an orphan the driver reaps, so once waitpid has no child
    left, nothing of the test runs. A process that does not die within REAP_S (one asleep in the
    kernel, which no signal ends) leaves the sandbox spent. The test's child is reaped here too:
    the caller has taken its status, or no longer needs it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not contained:
        return True
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:  # nothing but the driver
        pass
    give_up = time.monotonic() + REAP_S
    while True:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if reaped == 0:
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.001)


def wipe(root: int) -> None:
    """Remove everything in the folder open as `root`, whatever modes a program gave it, depth
    first and without recursion (a program can nest folders deeper than any recursion limit).
    Every process of the test is gone by then, so nothing changes the tree meanwhile."""
    stack: list[tuple[int, str]] = [(root, "")]
    while stack:
        fd = stack[-1][0]
        sub = None
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    sub = entry.name
                    break
                os.unlink(entry.name, dir_fd=fd)
        if sub is not None:
            os.chmod(sub, 0o700, dir_fd=fd)  # a folder, not a link: a program may have taken its modes
            stack.append((os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), sub))
            continue
        _, name = stack.pop()
        if stack:
            os.close(fd)
            os.rmdir(name, dir_fd=stack[-1][0])


def run_test(setup: dict, test: dict, reply: int, contained: bool, scratch: tuple[int, int]) -> None:
    """Run one test in a child, forward its stdout, kill what it left, empty the scratch folder
    (`scratch`: its descriptor and mode), then send the D frame. A scratch folder that cannot be
    emptied makes the D frame say the sandbox is spent: the grader ends it."""
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
    cleared = True
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
                cleared = _kill_leftovers(pid, contained)  # their pipe ends close: the reads below end
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
        cleared = _kill_leftovers(pid, contained)
        if not contained:
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
        "spent": not cleared,  # a process of the test lives on: the grader ends the sandbox
    }
    if functional and finished == "ok":
        done["value"], why = _value_of(bytes(kept["value"]))
        if why:
            done.update(status="error", returncode=1, stderr=done["stderr"] + why + "\n")
    try:
        os.fchmod(scratch[0], scratch[1])  # a program may have taken the folder's own modes
        wipe(scratch[0])
    except OSError:
        done["spent"] = True
    send(reply, b"D", done_json(done).encode("ascii"))


def done_json(done: dict) -> str:
    """A D frame's JSON: a flat dict of None, bools, ints, finite floats and strings. Written here,
    not by `json`, whose import (re, enum, collections) would cost every driver more than a test."""
    from _json import encode_basestring_ascii as string  # json.dumps's own string encoder

    parts = []
    for key, value in done.items():
        if value is None or type(value) is bool:
            text = {None: "null", True: "true", False: "false"}[value]
        elif type(value) in (int, float):
            text = repr(value)  # ints, and wall_s, which is finite: repr is JSON
        else:
            text = string(value)
        parts.append(f"{string(key)}: {text}")
    return "{" + ", ".join(parts) + "}"


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
    # The sandbox's init ignores what it has no handler for, but Python installs one for SIGINT:
    # a program's kill(1, SIGINT) would end the driver. Each test's child restores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    scratch = os.open(".", os.O_RDONLY | os.O_DIRECTORY)  # the working folder: /tmp, or the host's
    scratch_mode = os.fstat(scratch).st_mode & 0o7777
    request, reply, contained = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    frame = read_frame(request)
    if frame is None or frame[0] != b"S":
        sys.exit("atlas sandbox driver: expected a setup frame")
    setup = marshal.loads(frame[1])
    # The kernel counts the tasks of the sandbox's user namespace and uid: the driver and the
    # program's processes and threads (bwrap's monitor sits outside the namespace).
    limit = setup["max_processes"] + 1
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    prctl = _Prctl()
    if contained:  # a program cannot ptrace the driver or open its descriptors or memory via /proc
        prctl(4, 0)  # PR_SET_DUMPABLE
    global _filter
    machine = os.uname().machine
    if machine in SYSCALLS:
        _filter = Seccomp(seccomp_program(machine), prctl)
        Seccomp(seccomp_program(machine, [n for n in DENIED if n not in DRIVER_NEEDS]), prctl).install()
    elif contained:
        sys.exit(f"atlas sandbox driver: no seccomp system call table for {machine}")
    memory = (setup["memory_mb"] + DRIVER_HEADROOM_MB) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    send(reply, b"R", b"")
    frame = read_frame(request)
    if frame is None:
        return  # never given a program: a sandbox started ahead and not needed
    if frame[0] != b"P":
        sys.exit("atlas sandbox driver: expected a program frame")
    setup.update(marshal.loads(frame[1]))
    if setup["prefix"]:  # the part of lcb_runner's import prefix that this program can name
        exec(setup["prefix"], _prefix)  # once here: each test's child starts from this namespace
        sys.setrecursionlimit(DRIVER_RECURSION)  # the prefix's 50000 is for the program (child)
    if setup["mode"] == "functional":
        import json  # noqa: F401  (each test's child reads its arguments with it)
    # The compiler's first use in a process sets up its state: done here once, not in every test's
    # child (where it cost more than the rest of a short test).
    compile(COMPILER_WARM_UP, "<warm-up>", "exec")
    # What the driver has loaded lives as long as it does: frozen, a collection in a test's child
    # never walks it (and never makes the fork copy its pages). BOOT turned collection off while
    # the interpreter loaded it.
    gc.freeze()
    gc.enable()
    while True:
        frame = read_frame(request)
        if frame is None:
            return
        run_test(setup, marshal.loads(frame[1]), reply, contained, (scratch, scratch_mode))


if __name__ == "__main__" and sys.argv[1:2] == [MARK]:
    main()
