"""Attacks on what sandboxes share: with each other, with the host kernel, with the grader.

One attack per class of docs/sandbox.md's "What two sandboxes share": a verdict oracle (scratch
kept between tests, tests stopped at a wrong answer, the page cache's levers), a return value
that crashes the grader, kernel memory outside every bound (inodes), file locks, inotify, sockets
that ignore the network namespace (vsock, netlink), a process that outlives its test (a zombie
leader whose threads run on), no CPU or memory bound per sandbox, SIGINT to the driver, and
grading that fails open (no bwrap, a stale scratch folder with an absurd name). Each attack got
through before the sandbox held it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from atlas.config.graders import GraderConfig
from atlas.config.study import config_slice, load_config
from atlas.data.schema import TestCase as Case  # not `Test*`: pytest would collect it
from atlas.graders import cgroups
from atlas.graders.lcb import compare_functional, grade_code, grade_many, key_of_tests
from atlas.graders.sandbox import (
    SANDBOX_ENDED,
    Sandbox,
    SandboxLimits,
    lock_path,
    run_program,
    sandboxed_processes,
)
from atlas.runtime.execute import execute_call
from atlas.runtime.tools import CodeBounds, tools_for
from conftest import FIXTURES, REPO, read_jsonl, require_bubblewrap

CFG = GraderConfig(test_timeout_s=3.0, program_timeout_s=20.0, max_output_bytes=4096, memory_mb=256)
LIMITS = SandboxLimits.from_config(CFG)


@pytest.fixture(scope="module", autouse=True)
def sandbox_required():
    require_bubblewrap()


def probe(body: str, limits: SandboxLimits = LIMITS) -> dict:
    """Run `body` (which fills the dict `seen`) in a sandbox; returns `seen`."""
    code = "import json\nseen = {}\n" + body + "\nprint(json.dumps(seen))\n"
    r = run_program(code, limits=limits)
    assert (r.status, r.sandboxed) == ("ok", True), r.stderr
    assert sandboxed_processes() == []
    return json.loads(r.stdout)


ERRNO = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def checked(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), "")
def attempt(name, call):
    try:
        call()
        seen[name] = "allowed"
    except OSError as err:
        seen[name] = errno.errorcode.get(err.errno, str(err.errno))
"""


# --- 1. no verdict oracle ---------------------------------------------------------------------


def test_each_test_starts_with_an_empty_scratch_folder_whatever_the_program_left():
    """The scratch folder carried a program's state from test to test. Each test now finds /tmp
    empty, however the program left it: files, a folder it locked itself out of, a deep chain."""
    code = """import os
print(len(os.listdir("/tmp")))
open("/tmp/guess", "w").write("1")
os.makedirs("/tmp/locked/inner")
os.chmod("/tmp/locked", 0)
path = "/tmp"
for _ in range(300):  # deeper than a recursive removal's comfort, short of PATH_MAX's reach
    path += "/d"
    os.mkdir(path)
os.symlink("/tmp/guess", "/tmp/link")
"""
    v = grade_code(code, [Case("stdin", "", "0")] * 3, func_name=None, cfg=CFG)
    assert [(t.status, t.detail) for t in v.tests] == [("passed", "")] * 3


def test_a_wrong_answer_never_changes_what_runs_next():
    """lcb_runner stops at the first wrong answer, so a program could learn which guess passed
    from whether it ran again. Every test runs; the program is told nothing."""
    code = "import sys\nn = int(sys.stdin.readline())\nprint(n if n % 2 else -1)\n"  # wrong on even n
    tests = [Case("stdin", f"{n}\n", f"{n}\n") for n in (2, 3, 4, 5)]
    v = grade_code(code, tests, func_name=None, cfg=CFG)
    assert [t.status for t in v.tests] == ["wrong_answer", "passed", "wrong_answer", "passed"]
    assert (v.status, v.passed) == ("failed", 2)
    # A timeout or an error, which the program decides, does end its tests.
    crash = "import sys\nn = int(sys.stdin.readline())\nassert n != 3\nprint(n)\n"
    v = grade_code(crash, tests, func_name=None, cfg=CFG)
    assert [t.status for t in v.tests] == ["passed", "error", "skipped", "skipped"]
    assert v.tests[2].detail == "not run: an earlier test ended in an error"


def test_no_comparison_runs_before_every_test_has_run_and_the_sandbox_is_gone(monkeypatch):
    """A comparison stops at the first line that differs, so its time told a program, timing the
    gap before its next test, whether its guess was right. Every comparison now starts once the
    sandbox is gone, under the question's lock, and takes the same work right or wrong (below)."""
    from atlas.graders import lcb

    tests = [Case("stdin", f"{n}\n", f"{n}\n") for n in (1, 2, 3)]
    seen = []
    compare = lcb.compare_stdout

    def watched(got, expected):
        seen.append((expected, os.path.exists(lock_path("q-oracle")), tuple(sandboxed_processes())))
        if len(seen) == 1:
            raise ValueError("a comparison that fails")  # the first test's error, judged last
        return compare(got, expected)

    monkeypatch.setattr(lcb, "compare_stdout", watched)
    v = grade_code("print(input())", tests, func_name=None, cfg=CFG, question="q-oracle")
    assert seen == [("1\n", True, ()), ("2\n", True, ()), ("3\n", True, ())]
    assert not os.path.exists(lock_path("q-oracle"))  # let go once the verdict is made
    # an error found by judging stops nothing: the tests had all run by then
    assert [t.status for t in v.tests] == ["error", "passed", "passed"]
    assert v.tests[0].detail == "the output could not be judged (ValueError)"


def test_what_depends_on_the_expected_outputs_is_worked_out_before_the_program_runs(monkeypatch):
    """Between two tests the grader does no work that depends on an expected output: the bounds
    are worked out first, stdout is kept to the program's largest bound and decoded when judged."""
    from atlas.graders import lcb

    events = []
    keep, chars, run = lcb._keep_bytes, lcb._value_chars, Sandbox.run
    monkeypatch.setattr(lcb, "_keep_bytes", lambda *a: events.append("bound") or keep(*a))
    monkeypatch.setattr(lcb, "_value_chars", lambda *a: events.append("bound") or chars(*a))
    monkeypatch.setattr(
        Sandbox, "run", lambda *a, **k: events.append(("run", k["keep_bytes"], k["text"])) or run(*a, **k)
    )
    short, long = Case("functional", "1", "[1]"), Case("functional", "2", json.dumps(list(range(5000))))
    code = "class Solution:\n    def f(self, n):\n        return [1] if n == 1 else list(range(5000))\n"
    v = grade_code(code, [short, long, short], func_name="f", cfg=CFG)
    biggest = 2 * len(long.output) + 4096
    assert events[:6] == ["bound"] * 6 and events[6:9] == [("run", biggest, False)] * 3
    assert v.status == "passed"
    # stdin: each expected output's lines are read (split, digested, their numbers parsed) first too
    lines = lcb._expected_lines
    monkeypatch.setattr(lcb, "_expected_lines", lambda text: events.append("lines") or lines(text))
    events.clear()
    stdin = [Case("stdin", f"{n}\n", f"{n}\n") for n in (1, 2)]
    assert grade_code("print(input())", stdin, func_name=None, cfg=CFG).status == "passed"
    assert [e if isinstance(e, str) else e[0] for e in events][:6] == [
        "bound",
        "bound",
        "lines",
        "lines",
        "run",
        "run",
    ]


def test_judging_does_the_same_work_whether_an_output_is_right_or_wrong(monkeypatch):
    from atlas.graders import lcb

    counts: dict[str, int] = {}
    for name in ("_line_keys", "_number_key", "_same", "_canonical"):
        real = getattr(lcb, name)
        monkeypatch.setattr(
            lcb, name, lambda *a, _n=name, _f=real: counts.__setitem__(_n, counts.get(_n, 0) + 1) or _f(*a)
        )
    digests = []
    real_digest = lcb.hmac.compare_digest
    monkeypatch.setattr(lcb.hmac, "compare_digest", lambda a, b: digests.append(1) or real_digest(a, b))

    def work(compare, got, expected):
        counts.clear()
        digests.clear()
        answer = compare(got, expected)
        return dict(counts), len(digests), answer is None

    expected = "7\n" * 50 + "1 2 3\n"
    right, wrong_first, wrong_last = "7\n" * 50 + "1 2 3", "8\n" + "7\n" * 49 + "1 2 3", "7\n" * 50 + "1 2 4"
    lcb._expected_lines(expected)  # as grade_code does before the program runs: the expected is read
    results = [work(lcb.compare_stdout, got, expected) for got in (right, wrong_first, wrong_last)]
    assert [r[2] for r in results] == [True, False, False]
    assert results[0][:2] == results[1][:2] == results[2][:2]
    assert results[0][0]["_line_keys"] == 51 and results[0][1] == 2 * 51  # the program's lines alone
    lcb._value_chars("[1, [2, 3]]")  # as grade_code does before the program runs
    value_results = [
        work(lcb.compare_functional, got, "[1, [2, 3]]")
        for got in ("[1, [2, 3]]", "[9, [2, 3]]", "[1, [2, 4]]")
    ]
    assert [r[2] for r in value_results] == [True, False, False]
    assert value_results[0][:2] == value_results[1][:2] == value_results[2][:2] == ({"_canonical": 1}, 1)


def test_a_returned_value_longer_than_any_equal_one_is_never_parsed(monkeypatch):
    """marshal shares objects: [{}] * 4_150_000 crosses the pipe in a few bytes of payload and
    16 Mi characters of JSON, and parsing it cost the grader about 350 MiB a test (here a quarter of
    that). A value's JSON longer than three times the expected value's, plus 4 KiB, cannot equal
    it and is not parsed."""
    from atlas.graders import lcb

    compared = []
    compare = lcb.compare_functional
    monkeypatch.setattr(
        lcb,
        "compare_functional",
        lambda value, expected: compared.append(len(value)) or compare(value, expected),
    )
    code = "class Solution:\n    def f(self, n):\n        d = {}\n        return [d] * 1_100_000\n"
    slow = CFG.model_copy(update={"test_timeout_s": 20.0})  # the driver sizes and writes 4.4 Mi characters
    v = grade_code(code, [Case("functional", "1", "[]")], func_name="f", cfg=slow)
    assert [(t.status, t.detail) for t in v.tests] == [
        ("wrong_answer", "return value longer than 4102 characters of JSON")
    ]
    assert compared == []  # the value's JSON text was never parsed
    # values equal to the expected one, spelled longer (1.0 and true for 1, -0.0 for 0), still pass
    many = "[" + ", ".join(["1", "0"] * 5000) + "]"
    for value in ("[1.0, 0.0] * 5000", "[True, False] * 5000", "[1, -0.0] * 5000"):
        code = f"class Solution:\n    def f(self, n):\n        return {value}\n"
        assert grade_code(code, [Case("functional", "1", many)], func_name="f", cfg=CFG).status == "passed", (
            value
        )


def test_the_page_cache_levers_are_refused():
    """Pages of a read-only file carried a program's guesses across gradings. The calls that show
    or change what the page cache holds are refused (reading a file still loads its pages)."""
    seen = probe(
        ERRNO
        + """
import mmap, sys
fd = os.open(sys.executable, os.O_RDONLY)
size = os.fstat(fd).st_size
view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
vec = ctypes.create_string_buffer(size // 4096 + 1)
libc.mmap.restype = ctypes.c_void_p
mapped = ctypes.c_void_p(libc.mmap(None, size, 1, 1, fd, 0))  # PROT_READ, MAP_SHARED
attempt("mincore", lambda: checked(libc.mincore(mapped, ctypes.c_size_t(size), vec)))
attempt("fadvise", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
attempt("readahead", lambda: checked(libc.readahead(fd, ctypes.c_long(0), ctypes.c_size_t(size))))
attempt("nowait_read", lambda: os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT))
attempt("willneed", lambda: view.madvise(mmap.MADV_WILLNEED))
attempt("pageout", lambda: checked(libc.madvise(mapped, ctypes.c_size_t(4096), 21)))
attempt("cachestat", lambda: checked(libc.syscall(451, fd, None, None, 0)))
attempt("read", lambda: os.pread(fd, 4096, 0))
"""
    )
    assert seen == {
        "mincore": "EPERM",
        "fadvise": "EPERM",
        "readahead": "EPERM",
        "nowait_read": "EPERM",
        "willneed": "EPERM",
        "pageout": "EPERM",
        "cachestat": "EPERM",
        "read": "allowed",
    }


# --- 2. the grader never crashes ------------------------------------------------------------------

NESTED = "class Solution:\n    def f(self, x):\n        v = []\n        for _ in range({n}):\n            v = [v]\n        return v\n"
SELF = "class Solution:\n    def f(self, x):\n        v = []\n        v.append(v)\n        return v\n"
# every level of a 950-deep chain, each first met one level down: the depth bound held only for
# the first path to an object, so the deeper levels, met again further down, went through
SHARED = (
    "class Solution:\n    def f(self, x):\n        levels, v = [], []\n        for _ in range(950):\n"
    "            v = [v]\n            levels.append(v)\n        return levels\n"
)


def test_a_deep_or_self_referencing_return_value_is_an_error_not_a_crash():
    tests = [Case("functional", "1", "[]"), Case("functional", "2", "[]")]
    for code, why in [
        (NESTED.format(n=1900), "the return value is too large (it is nested deeper than 100 levels)"),
        (NESTED.format(n=40_000), "the return value (list) is not JSON-serialisable"),  # past marshal's
        (SELF, "the return value is not JSON-serialisable (it contains itself)"),
        (SHARED, "the return value is too large (it is nested deeper than 100 levels)"),
    ]:
        v = grade_code(code, tests, func_name="f", cfg=CFG)
        assert (v.status, v.tests[0].status, v.tests[0].detail) == ("error", "error", f"exit status 1; {why}")
    v = grade_code(
        NESTED.format(n=99), [Case("functional", "1", "[" * 100 + "]" * 100)], func_name="f", cfg=CFG
    )
    assert v.status == "passed"  # 99 wraps of [] are 100 levels: within the bound


def test_a_return_value_the_comparison_cannot_parse_is_that_tests_error():
    deep = "[" * 100_000 + "]" * 100_000
    assert compare_functional(deep, "[]") == "the return value could not be compared (RecursionError)"
    assert compare_functional("[]", "[]") is None


def test_a_crashing_value_ends_no_rollout():
    """execute_call is what a rollout calls: a submit whose value once raised RecursionError there
    comes back as a tool error with a score of 0."""
    question = {"source": "lcb", "func_name": "countPairs", "question_uid": "lcb-nested-value"}
    code = NESTED.format(n=1900).replace("def f(self, x)", "def countPairs(self, nums)")
    tests = [(Case("functional", "[1, 2]", "0"), "public")]
    offered = tools_for("lcb", CodeBounds(run=4000, escapes=400))
    result = execute_call(
        {"name": "submit", "arguments": {"code": code}}, None, offered, question, tests, CFG, 400
    )
    assert (result.status, result.score, result.ends_episode) == ("error", 0.0, True)
    assert "nested deeper than 100 levels" in result.output


# --- 3. kernel memory outside every bound: inodes ------------------------------------------------


def test_the_scratch_folder_holds_a_bounded_number_of_inodes():
    """Symlinks take no tmpfs bytes but kernel memory: 450k of them cost the host 600 MiB."""
    if os.geteuid() != 0:
        pytest.skip("the scratch tmpfs's inode bound needs the root stage; the cgroup bounds it otherwise")
    limits = SandboxLimits.from_config(CFG.model_copy(update={"scratch_inodes": 300}))
    seen = probe(
        ERRNO
        + """
made = 0
try:
    for made in range(100_000):
        os.symlink("x", f"/tmp/{made}")
except OSError as err:
    seen["stopped"] = errno.errorcode[err.errno]
seen["made"] = made
""",
        limits,
    )
    assert seen == {"stopped": "ENOSPC", "made": 299}  # the folder itself is the 300th inode


# --- 4, 5, 6. nothing shared between sandboxes or with the host's kernel -----------------------


def test_two_sandboxes_graded_at_once_cannot_signal_through_file_locks():
    """One program locked a byte of a shared read-only file at an offset that encoded its answer;
    the other, graded at the same time, read it back with F_GETLK and passed without computing."""
    writer = """import fcntl, os, sys, time, errno
fd = os.open(sys.executable, os.O_RDONLY)
try:
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 4242)
    print("locked")
except OSError as err:
    print(errno.errorcode[err.errno])
time.sleep(1.0)
"""
    reader = """import fcntl, os, struct, sys, time, errno
fd = os.open(sys.executable, os.O_RDONLY)
found = "none"
for _ in range(60):
    query = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)
    try:
        kind, _, start, _, _ = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError as err:
        found = errno.errorcode[err.errno]
        break
    if kind != fcntl.F_UNLCK:
        found = str(start)
        break
    time.sleep(0.02)
print(found)
"""
    cfg = CFG.model_copy(update={"workers": 2})
    tests = [Case("stdin", "", "x")]
    verdicts = grade_many([(writer, tests, None), (reader, tests, None)], cfg=cfg)
    assert [v.tests[0].detail for v in verdicts] == ["expected 'x' got 'EPERM'", "expected 'x' got 'EPERM'"]


def test_inotify_fanotify_and_dnotify_are_refused():
    """A watch on a shared read-only folder showed what the neighbouring sandbox imported."""
    seen = probe(
        ERRNO
        + """
import fcntl, sys
attempt("inotify_init1", lambda: checked(libc.inotify_init1(0)))
attempt("inotify_init", lambda: checked(libc.syscall(253)))
attempt("fanotify_init", lambda: checked(libc.fanotify_init(0, 0)))
folder = os.open(os.path.dirname(os.__file__), os.O_RDONLY)
attempt("dnotify", lambda: fcntl.fcntl(folder, fcntl.F_NOTIFY, fcntl.DN_ACCESS))
attempt("lease", lambda: fcntl.fcntl(folder, fcntl.F_SETLEASE, fcntl.F_RDLCK))
attempt("flock", lambda: fcntl.flock(folder, fcntl.LOCK_SH))
attempt("getfl", lambda: fcntl.fcntl(folder, fcntl.F_GETFL))
"""
    )
    assert seen == {
        "inotify_init1": "EPERM",
        "inotify_init": "EPERM",
        "fanotify_init": "EPERM",
        "dnotify": "EPERM",
        "lease": "EPERM",
        "flock": "EPERM",
        "getfl": "allowed",  # fcntl itself stays: only its lock, lease and notify commands go
    }


def test_only_unix_sockets_can_be_made():
    """vsock ignores network namespaces (a VM host's agent listens there); netlink talks to the
    kernel. Only AF_UNIX sockets, which reach nothing outside the sandbox, are made."""
    seen = probe(
        ERRNO
        + """
import socket
for name, family, kind in [
    ("vsock", 40, socket.SOCK_STREAM),
    ("netlink", 16, socket.SOCK_RAW),
    ("packet", 17, socket.SOCK_RAW),
    ("inet", socket.AF_INET, socket.SOCK_STREAM),
    ("inet6", socket.AF_INET6, socket.SOCK_DGRAM),
    ("unix", socket.AF_UNIX, socket.SOCK_STREAM),
]:
    attempt(name, lambda: socket.socket(family, kind).close())
def raw_socket(family):  # the system call itself, with bits above the int the kernel reads
    fd = libc.syscall(41 if os.uname().machine == "x86_64" else 198, ctypes.c_long(family), 1, 0)
    checked(fd)
    os.close(fd)
attempt("vsock_high_bits", lambda: raw_socket(40 | (1 << 32)))
attempt("unix_pair", lambda: [s.close() for s in socket.socketpair()])
"""
    )
    assert seen == {
        "vsock": "EPERM",
        "netlink": "EPERM",
        "packet": "EPERM",
        "inet": "EPERM",
        "inet6": "EPERM",
        "unix": "allowed",
        "vsock_high_bits": "EPERM",
        "unix_pair": "allowed",
    }


def test_the_hosts_global_counters_are_out_of_reach():
    """Counters the kernel keeps for the whole host (ptys in use, forks since boot, open files,
    shared memory) moved by exactly what one program did, and a program graded beside it read
    them: it passed without computing. /proc shows a program its own processes only, there are
    no pseudo-terminals, and sysinfo is refused; /proc/self and /dev/stdin still work."""
    seen = probe(
        ERRNO
        + """
for path in ("/proc/stat", "/proc/loadavg", "/proc/meminfo", "/proc/vmstat", "/proc/uptime",
             "/proc/locks", "/proc/sys/fs/file-nr", "/proc/sys/kernel/pty/nr", "/dev/ptmx"):
    attempt(path, lambda: os.close(os.open(path, os.O_RDONLY | os.O_NOCTTY)))
seen["/proc/sys"] = os.listdir("/proc/sys")
seen["/proc"] = sorted(name for name in os.listdir("/proc") if not name.isdigit() and name not in ("self", "thread-self", "mounts", "net"))[:1]
attempt("sysinfo", lambda: checked(libc.sysinfo(ctypes.create_string_buffer(256))))
seen["self"] = open("/proc/self/status").readline().split()[0]
"""
    )
    refused = {"/dev/ptmx": "ENOENT", "/proc/sys/fs/file-nr": "ENOENT", "/proc/sys/kernel/pty/nr": "ENOENT"}
    for path in (
        "/proc/stat",
        "/proc/loadavg",
        "/proc/meminfo",
        "/proc/vmstat",
        "/proc/uptime",
        "/proc/locks",
    ):
        refused[path] = "EACCES"  # covered by /dev/null on a mount that allows no devices
    assert seen == {**refused, "/proc/sys": [], "/proc": ["acpi"], "sysinfo": "EPERM", "self": "Name:"}
    r = run_program("print(open('/dev/stdin').read().upper())", "fed\n", limits=LIMITS)
    assert (r.status, r.stdout) == ("ok", "FED\n\n")


def test_a_program_cannot_make_the_host_write_out_its_disks():
    """sync() wrote out every filesystem of the host, and its caller slept in the kernel, beyond
    any signal, past its test's bound and its sandbox's close. sync and syncfs are refused."""
    seen = probe(
        ERRNO
        + """
number = {"x86_64": (162, 306), "aarch64": (81, 267)}[os.uname().machine]
attempt("sync", lambda: checked(libc.syscall(number[0])))
usr = os.open("/usr", os.O_RDONLY)
attempt("syncfs", lambda: checked(libc.syscall(number[1], usr)))
library = os.open(os.__file__, os.O_RDONLY)  # read-only, and a flush of the host's disk all the same
attempt("fsync", lambda: os.fsync(library))
attempt("fdatasync", lambda: os.fdatasync(library))
"""
    )
    assert seen == {"sync": "EPERM", "syncfs": "EPERM", "fsync": "EPERM", "fdatasync": "EPERM"}


def test_the_kernels_shared_pools_counters_and_page_probes_are_refused():
    """Round two: AIO reads in flight kept a killed sandbox alive for seconds, reading the host's
    disk, and io_setup took the host's whole AIO pool; SO_COOKIE numbered sockets from a counter
    the whole host shares (one sample of a question left its answer there for the next, pinned to
    one CPU); a child that made itself dumpable again read which pages of a shared file were
    cached through /proc/self/pagemap; /proc/irq showed the host's interrupt counts."""
    seen = probe(
        ERRNO
        + """
import socket
x86 = os.uname().machine == "x86_64"
context = ctypes.c_ulong()
attempt("io_setup", lambda: checked(libc.syscall(206 if x86 else 0, 16, ctypes.byref(context))))
unix = socket.socket(socket.AF_UNIX)
attempt("SO_COOKIE", lambda: unix.getsockopt(socket.SOL_SOCKET, 57, 8))
attempt("SO_TYPE", lambda: unix.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
attempt("PR_SET_DUMPABLE", lambda: checked(libc.prctl(4, 1, 0, 0, 0)))
attempt("pagemap", lambda: os.close(os.open("/proc/self/pagemap", os.O_RDONLY)))
attempt("sched_setaffinity", lambda: os.sched_setaffinity(0, {0}))
attempt("sched_getaffinity", lambda: os.sched_getaffinity(0))
seen["/proc/irq"] = os.listdir("/proc/irq")
"""
    )
    assert seen == {
        "io_setup": "EPERM",
        "SO_COOKIE": "EPERM",
        "SO_TYPE": "allowed",
        "PR_SET_DUMPABLE": "EPERM",
        "pagemap": "EACCES",  # the child is as undumpable as the driver it was forked from
        "sched_setaffinity": "EPERM",
        "sched_getaffinity": "allowed",
        "/proc/irq": [],
    }


def test_a_cgroup_left_by_a_process_that_would_not_die_is_removed_by_the_next_sandbox():
    """A process asleep in the kernel outlived its sandbox's close, and its cgroups stayed for as
    long as the grader lived. Each new sandbox tries them again."""
    layout = cgroups.layout()
    assert layout.missing == "", layout.missing
    stuck = cgroups.Cgroup(64 << 20, 8, 1.0)
    folders, stuck.folders = stuck.folders, []  # its close gave up on them, as on a sleeping process
    cgroups._left.extend(folders)
    try:
        with Sandbox("print(1)", mode="script", limits=LIMITS):
            assert [f for f in folders if os.path.isdir(f)] == []
            assert cgroups._left == []
    finally:
        for folder in folders:
            if os.path.isdir(folder):
                os.rmdir(folder)


TIMED = """import time
start = time.monotonic()
time.sleep({sleep})
print(f"{{start:.4f}} {{time.monotonic():.4f}}")
"""


def spans(verdicts) -> list[tuple[float, float]]:
    """(start, end) of each program, from the output its wrong answer's detail shows."""
    got = [v.tests[0].detail.split("got ")[1].strip("'") for v in verdicts]
    return [tuple(map(float, text.split())) for text in got]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_two_programs_of_one_question_never_run_at_once():
    """Two programs graded at once copied through the kernel (a pty count, a lock): one solved, the
    other passed without computing. Programs of one question now run one after the other, in one
    grader or several; programs of different questions still run at once."""
    program = TIMED.format(sleep=0.4)
    first, second = [Case("stdin", "", "first")], [Case("stdin", "", "second")]
    jobs = [(program, first, None), (program, first, None), (program, second, None), (program, second, None)]
    times = spans(grade_many(jobs, cfg=CFG.model_copy(update={"workers": 2})))
    assert not overlap(times[0], times[1]) and not overlap(times[2], times[3])
    assert any(overlap(a, b) for a in times[:2] for b in times[2:])  # two workers, two questions
    # The python tool of one GPQA question: two samples' programs, from two threads
    question = {"source": "gpqa", "question_uid": "gpqa:same", "correct_letter": "A"}
    offered = tools_for("gpqa", CodeBounds(run=4000, escapes=400))
    call = {"name": "python", "arguments": {"code": program}}
    from concurrent.futures import ThreadPoolExecutor

    def run(uid: str) -> tuple[float, float]:
        result = execute_call(call, None, offered, {**question, "question_uid": uid}, [], CFG, 400)
        assert result.status == "ok", result.output
        return tuple(map(float, result.output.split()))

    with ThreadPoolExecutor(2) as pool:
        same = list(pool.map(run, ["gpqa:same", "gpqa:same"]))
        other = list(pool.map(run, ["gpqa:one", "gpqa:another"]))
    assert not overlap(*same) and overlap(*other)
    # each lock's file goes with its last holder: the folder holds the locks held now
    keys = ["gpqa:same", "gpqa:one", "gpqa:another", key_of_tests(first), key_of_tests(second)]
    assert [os.path.exists(lock_path(key)) for key in keys] == [False] * 5


def test_a_lock_folder_that_is_not_this_users_stops_grading_at_start(tmp_path, monkeypatch):
    from atlas.graders import sandbox

    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    monkeypatch.setattr(sandbox, "LOCK_PARENTS", (str(tmp_path),))
    folder = tmp_path / f"{sandbox.LOCKS_PREFIX}{os.geteuid()}"
    folder.mkdir()
    os.chown(folder, 12345, 12345)
    with pytest.raises(sandbox.SandboxUnavailable, match=f"{folder}: not a folder of this user"):
        sandbox.require_sandbox(False)
    folder.rmdir()
    folder.symlink_to(tmp_path)  # a link, even to a folder of this user
    with pytest.raises(sandbox.SandboxUnavailable, match="not a folder of this user"):
        sandbox.require_sandbox(False)


def test_the_lock_folder_is_the_same_whatever_the_environment(tmp_path, monkeypatch):
    """Graders with different temp folders (two jobs, each its own $TMPDIR) took no turns."""
    here = lock_path("q")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert lock_path("q") == here and not here.startswith(str(tmp_path))
    folder = os.path.dirname(here)
    os.chmod(folder, 0o777)  # widened by something of this user (a program run unsandboxed)
    try:
        assert lock_path("q") == here
        assert os.stat(folder).st_mode & 0o777 == 0o700
    finally:
        os.chmod(folder, 0o700)


# --- 7. a process that outlives its test -------------------------------------------------------


def test_a_zombie_leader_whose_threads_run_on_is_killed_after_its_test():
    """A process whose main thread has exited shows as a zombie while its threads run; the
    after-test kill skipped zombies, so it ran on into the next test."""
    code = """import ctypes, os, threading, time
print(len([p for p in os.listdir("/proc") if p.isdigit()]))  # the driver and this program
if os.fork() == 0:
    os.setsid()
    threading.Thread(target=lambda: time.sleep(60)).start()
    ctypes.CDLL(None).syscall(60 if os.uname().machine == "x86_64" else 93, 0)  # exit: this thread only
time.sleep(0.2)  # the leader is a zombie by now, its thread alive
"""
    v = grade_code(code, [Case("stdin", "", "2")] * 3, func_name=None, cfg=CFG)
    assert [(t.status, t.detail) for t in v.tests] == [("passed", "")] * 3
    assert sandboxed_processes() == []


# --- 8. CPU and memory bounds per sandbox ----------------------------------------------------------


def test_a_program_runs_at_most_max_processes_tasks():
    """The process bound counted bwrap's monitor, which lives outside the sandbox's user namespace,
    where the kernel does not count it: a program got one process more than max_processes."""
    limits = SandboxLimits.from_config(CFG.model_copy(update={"max_processes": 4}))
    seen = probe(
        """
import os, time
children = []
try:
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except BlockingIOError:
    pass
seen["children"] = len(children)
""",
        limits,
    )
    assert seen == {"children": 3}  # the program itself and three children: four tasks


def test_a_sandbox_lives_in_cgroups_that_hold_its_bounds():
    layout = cgroups.layout()
    assert layout.missing == "", layout.missing  # CI's hosts give cgroups; say so if not
    limits = SandboxLimits.from_config(CFG.model_copy(update={"cpu_cores": 0.5, "max_processes": 5}))
    with Sandbox("print(1)", mode="script", limits=limits) as box:  # loaded: its driver is up
        read = lambda controller, name: Path(box.cgroup.file(controller, name)).read_text().split()  # noqa: E731
        memory = read("memory", "memory.max" if "memory" in layout.v2 else "memory.limit_in_bytes")
        assert memory == [str((256 + 64 + 64) << 20)]  # memory_mb + scratch_mb + the driver's 64 MiB
        assert read("pids", "pids.max") == ["9"]  # max_processes + the driver and three bwraps (root)
        if "cpu" in layout.v2:
            assert read("cpu", "cpu.max") == ["50000", "100000"]
        else:
            assert read("cpu", "cpu.cfs_quota_us") + read("cpu", "cpu.cfs_period_us") == ["50000", "100000"]
        assert str(box.proc.pid) in read("memory", "cgroup.procs")  # bwrap, the sandbox's first process
        folders = list(box.cgroup.folders)
        assert folders and all(os.path.isdir(f) for f in folders)
    assert not any(os.path.exists(f) for f in folders)  # removed with the sandbox


def test_memory_is_bounded_per_sandbox_not_per_process():
    """Four processes under RLIMIT_AS each reached 1.8 GiB together against memory_mb 1024."""
    code = """import os
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os._exit(0)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
print(open("/proc/self/oom_score_adj").read().strip())
"""
    r = run_program(code, limits=LIMITS)  # memory_mb 256: the sandbox holds 384 MiB in all
    killed, adj = r.stdout.split("\n")[:2]
    assert sorted(set(json.loads(killed))) == [-9, 0]  # some held their 200 MiB, the rest were killed
    assert adj == "1000"  # the kernel's first choice when memory runs out, before the trainer


def test_cpu_is_bounded_per_sandbox():
    """One program used 1.4 cores of 2. Two busy processes get the sandbox's quota together."""
    code = """import os, time
start, cpu = time.monotonic(), os.times()
pid = os.fork()
end = start + 1.0
while time.monotonic() < end:
    pass
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
t = os.times()
used = (t.user + t.system + t.children_user + t.children_system) - (cpu.user + cpu.system)
print(round(used / (time.monotonic() - start), 2))
"""
    limits = SandboxLimits.from_config(CFG.model_copy(update={"cpu_cores": 0.25}))
    r = run_program(code, limits=limits)
    assert r.status == "ok", r.stderr
    assert float(r.stdout) <= 0.4  # 0.25 cores, by the cgroup's quota; 2 processes would use 2


# --- 9. SIGINT ------------------------------------------------------------------------------------


def test_sigint_to_the_driver_changes_nothing():
    code = "import os, signal, time\nos.kill(1, signal.SIGINT)\ntime.sleep(0.1)\nprint(7)\n"
    v = grade_code(code, [Case("stdin", "", "7")] * 2, func_name=None, cfg=CFG)
    assert [(t.status, t.detail) for t in v.tests] == [("passed", "")] * 2
    # The program's own SIGINT is still Python's KeyboardInterrupt.
    v = grade_code(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n",
        [Case("stdin", "", "7")],
        func_name=None,
        cfg=CFG,
    )
    assert v.status == "error" and v.tests[0].detail.endswith("KeyboardInterrupt")


def test_a_driver_that_died_is_named_so_not_blamed_on_a_limit():
    from atlas.graders.lcb import _failure_detail
    from atlas.graders.sandbox import RunResult

    run = RunResult("error", None, "", SANDBOX_ENDED, False, False, 0.1, True)
    assert _failure_detail(run) == "the sandbox ended before the run did"


# --- 10. fail closed ------------------------------------------------------------------------------


def grade_cli(tmp_path: Path, graders: dict, path: str) -> subprocess.CompletedProcess:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    config["graders"] = graders
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    row = next(r for r in read_jsonl(FIXTURES / "lcb_train.jsonl") if r["question_id"] == "abc300_a")
    (tmp_path / "row.json").write_text(json.dumps(row), encoding="utf-8")
    (tmp_path / "prog.py").write_text("print(0)\n", encoding="utf-8")
    command = [sys.executable, "-m", "atlas", "grade", "lcb", "--problem", str(tmp_path / "row.json")]
    command += ["--code", str(tmp_path / "prog.py"), "--config", str(tmp_path / "config.yaml")]
    env = {**os.environ, "PATH": path}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


def no_bwrap_path(tmp_path: Path) -> str:
    """PATH with the tools a grader needs (sh, setpriv, mount) and no bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "setpriv", "mount"):
        found = subprocess.run(
            ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if found:
            os.symlink(found, bin_dir / tool)
    return str(bin_dir)


def test_without_bwrap_grading_stops_with_a_clear_error(tmp_path):
    proc = grade_cli(tmp_path, {"test_timeout_s": 1.0}, no_bwrap_path(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(
        "error: bubblewrap cannot start here (bwrap (Debian package bubblewrap) is not on PATH); "
        "graded code runs only inside it."
    ), proc.stderr
    assert "graders.allow_unsandboxed: true" in proc.stderr


def test_unsandboxed_grading_only_when_asked_and_the_verdict_says_so(tmp_path):
    proc = grade_cli(tmp_path, {"test_timeout_s": 1.0, "allow_unsandboxed": True}, no_bwrap_path(tmp_path))
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert (verdict["sandboxed"], verdict["total"]) == (False, 5)


def test_a_training_stage_stops_at_start_without_bwrap(tmp_path):
    """The smoke stage refuses before it loads a model (its model path does not even exist)."""
    s = config_slice(load_config(REPO / "config" / "config.yaml"), "smoke")
    command = [sys.executable, "-m", "atlas.stages.smoke", "--config-slice", json.dumps(s)]
    command += ["--out", str(tmp_path / "out"), "--val", str(tmp_path / "val.parquet")]
    command += ["--tests", str(tmp_path / "tests.parquet"), "--model", str(tmp_path / "no-model")]
    env = {**os.environ, "PATH": no_bwrap_path(tmp_path)}
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: bubblewrap cannot start here"), proc.stderr
    assert not (tmp_path / "out").exists()
