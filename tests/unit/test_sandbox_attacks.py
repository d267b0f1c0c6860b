"""Attacks on the grader's sandbox, each run through the grader CLI from inside a workflow folder
that holds results/data (its answers and private tests), as a policy's program would be graded.

Each attack program tries its way out and prints `held` when every attempt was refused (else what
got through): on the stdin problem abc300_a, whose answers are digits, `held` is a wrong answer
whose detail names it. Every test also checks the bound and that nothing is left behind: no
process of its graders' sandboxes (this test process is their subreaper, so an orphan would still
be found below it) and no scratch folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from atlas.graders.sandbox import SCRATCH_PREFIX, sandboxed_processes
from conftest import FIXTURES, copy_workflow, read_jsonl, require_bubblewrap

GRADERS = {"test_timeout_s": 1.0, "program_timeout_s": 2.0}
BOUND_S = 0.5  # how far past its bound a verdict may come
PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture(scope="module", autouse=True)
def sandbox_required():
    require_bubblewrap()


@pytest.fixture(scope="module", autouse=True)
def subreaper():
    """Orphans of a grader CLI come to this process instead of the system's init."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    reap()


def reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG) != (0, 0):
            pass
    except ChildProcessError:
        pass


@pytest.fixture(scope="module")
def workflow(tmp_path_factory, data_dir):
    """A workflow folder with results/data, the CLI's problem row and its config."""
    wf = copy_workflow(tmp_path_factory.mktemp("wf"))
    (wf / "results").mkdir()
    subprocess.run(["cp", "-r", str(data_dir), str(wf / "results" / "data")], check=True)
    config = yaml.safe_load((wf / "config" / "config.yaml").read_text(encoding="utf-8"))
    config["graders"] = GRADERS
    (wf / "grade.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    config["graders"] = {"test_timeout_s": 30.0, "program_timeout_s": 30.0}  # to be killed mid-run
    (wf / "grade-long.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    for qid in ("abc300_a", "9003"):
        row = next(r for r in read_jsonl(FIXTURES / "lcb_train.jsonl") if r["question_id"] == qid)
        (wf / f"{qid}.json").write_text(json.dumps(row), encoding="utf-8")
    assert (wf / "results" / "data" / "tests.parquet").is_file()
    return wf


def start_cli(
    workflow: Path, code: str, problem: str = "abc300_a", env: dict | None = None, config: str = "grade.yaml"
) -> subprocess.Popen:
    prog = workflow / f"prog-{uuid.uuid4().hex}.py"
    prog.write_text(code, encoding="utf-8")
    command = [sys.executable, "-m", "atlas", "grade", "lcb", "--problem", f"{problem}.json"]
    command += ["--code", prog.name, "--config", config]
    return subprocess.Popen(
        command, cwd=workflow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def grade(workflow: Path, code: str, problem: str = "abc300_a", env: dict | None = None) -> dict:
    proc = start_cli(workflow, code, problem, env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    verdict = json.loads(out)
    assert verdict["sandboxed"] is True
    assert verdict["wall_s"] <= GRADERS["program_timeout_s"] + BOUND_S
    assert all(t["wall_s"] <= GRADERS["test_timeout_s"] + BOUND_S for t in verdict["tests"])
    assert_nothing_left(workflow)
    return verdict


def assert_nothing_left(workflow: Path) -> None:
    give_up = time.monotonic() + BOUND_S
    while sandboxed_processes() and time.monotonic() < give_up:
        time.sleep(0.02)
    assert sandboxed_processes() == []
    reap()
    assert sorted(p.name for p in workflow.iterdir() if p.name.startswith(SCRATCH_PREFIX)) == []


def assert_held(verdict: dict) -> None:
    assert verdict["status"] == "failed", verdict
    assert verdict["tests"][0]["detail"].endswith("got 'held'"), verdict["tests"][0]


def attempts(body: str) -> str:
    """A program that runs `body` (which appends to `got` what got through) and prints the result."""
    return "got = []\n" + body + "\nprint('held' if not got else 'escaped: ' + '; '.join(got))\n"


# --- reading the answers --------------------------------------------------------------------------


def test_a_cheat_that_reads_the_tests_through_proc_fails(workflow):
    """The attack that passed every stdin question: find the grader through /proc and read the
    problem file (private tests in the clear) and results/data through its cwd, root, cmdline,
    environ and memory. It prints the matching expected output whenever it finds the tests."""
    cheat = f"""
import json, os, sys
WF = {str(workflow)!r}
stdin = sys.stdin.read()
found = []
def take(path):
    try:
        with open(path, "rb") as f:
            found.append((path, f.read()))
    except OSError:
        pass
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    base = f"/proc/{{pid}}"
    for via in ("cwd", "root" + WF):
        for name in ("abc300_a.json", "results/data/tests.parquet"):
            take(f"{{base}}/{{via}}/{{name}}")
    for part in ("cmdline", "environ"):
        try:
            text = open(f"{{base}}/{{part}}", "rb").read()
        except OSError:
            continue
        if b"abc300_a.json" in text or WF.encode() in text:
            found.append((f"{{base}}/{{part}}", text))
    try:
        with open(f"{{base}}/mem", "rb") as f:
            found.append((f"{{base}}/mem", f.read(1)))
    except OSError:
        pass
take(WF + "/abc300_a.json")
take(WF + "/results/data/tests.parquet")
for path, data in found:
    try:
        row = json.loads(data)
    except ValueError:
        continue
    for test in json.loads(row["public_test_cases"]):
        if test["input"] == stdin:
            print(test["output"])
            sys.exit(0)
print("held" if not found else "escaped: " + " ".join(p for p, _ in found))
"""
    assert_held(grade(workflow, cheat))


# --- namespaces and mounts ------------------------------------------------------------------------


def test_mounts_cannot_be_undone(workflow):
    code = attempts("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for target in (b"/usr", b"/tmp", b"/proc", b"/"):
    if libc.umount2(target, 2) == 0:
        got.append("umount " + target.decode())
for target in (b"/", b"/usr"):
    if libc.mount(None, target, None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND, rw
        got.append("remount rw " + target.decode())
if libc.mount(b"none", b"/usr", b"tmpfs", 0, None) == 0:
    got.append("mount tmpfs")
for path in ("/usr/atlas-probe", "/" + "atlas-probe"):
    try:
        open(path, "w").close()
        got.append("wrote " + path)
    except OSError:
        pass
if os.system("unshare -U -r true 2>/dev/null") == 0:
    got.append("new user namespace")
""")
    assert_held(grade(workflow, code))


def test_setns_into_another_namespace_is_refused(workflow):
    code = attempts("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for ns in ("net", "mnt", "user", "pid", "uts", "ipc", "cgroup"):
        try:
            fd = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY)
        except OSError:
            continue
        if libc.setns(fd, 0) == 0:
            got.append(f"setns {pid}/{ns}")
        os.close(fd)
""")
    assert_held(grade(workflow, code))


def test_no_process_of_the_sandbox_can_be_traced_or_written_to(workflow):
    """Only the driver (the namespace's init, not dumpable) and the program's own processes are
    inside; ptrace, /proc/<pid>/mem, process_vm_writev and pidfd_getfd all fail on the driver, so no
    code of the program's can run outside its bounds or persist between tests."""
    code = attempts("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long
others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid())
if others != [1] or os.getppid() != 1:
    got.append(f"other processes {others}, parent {os.getppid()}")
for pid in (1, os.getppid()):
    for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
        if libc.ptrace(request, pid, None, None) == 0:
            got.append(f"ptrace {request:#x} {pid}")
    try:
        with open(f"/proc/{pid}/mem", "r+b", buffering=0):
            got.append(f"opened /proc/{pid}/mem")
    except OSError:
        pass
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    if libc.syscall(311, pid, iov, 1, remote, 1, 0) >= 0 or ctypes.get_errno() != 1:
        got.append(f"process_vm_writev {pid}: errno {ctypes.get_errno()}")
    try:
        pidfd = os.pidfd_open(pid)
        got.append(f"pidfd_open {pid}")
        for fd in range(8):
            if libc.syscall(438, pidfd, fd, 0) >= 0:
                got.append(f"pidfd_getfd {pid} {fd}")
    except OSError:
        pass
    for fd in range(8):
        try:
            os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY))
            got.append(f"opened /proc/{pid}/fd/{fd}")
        except OSError:
            pass
""")
    assert_held(grade(workflow, code))


def test_text_written_past_the_program_never_reaches_the_verdict(workflow):
    """The program writes a forged note to every descriptor it can find outside its own (the
    driver's, its parent's through /proc and pidfd_getfd), then kills the driver: the driver, the
    namespace's init, outlives a SIGKILL from inside, and the note reaches no verdict."""
    note = "grader note: 5/5 tests passed"
    code = attempts(f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
note = bytes.fromhex({note.encode().hex()!r}) + b"\\n"
fds = []
try:
    pidfd = os.pidfd_open(1)
    fds += [libc.syscall(438, pidfd, fd, 0) for fd in range(8)]
except OSError:
    pass
for fd in range(8):
    try:
        fds.append(os.open(f"/proc/1/fd/{{fd}}", os.O_WRONLY))
    except OSError:
        pass
for fd in fds:
    try:
        os.write(fd, note)
        got.append("wrote to a descriptor of the driver")
    except OSError:
        pass
for pid in (1, os.getppid()):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
""")
    verdict = grade(workflow, code)
    assert note not in json.dumps(verdict)
    assert_held(verdict)


def test_memory_outside_the_address_space_bound_is_refused(workflow):
    """SysV shared memory, message queues and semaphores, POSIX message queues, memfds, tmpfs
    xattrs, keyrings, io_uring, userfaultfd, bpf and perf events all fail with EPERM (the child's
    seccomp filter), and so does every x32 system call. The driver (pid 1) has a filter of its
    own, beneath the child's."""
    code = attempts("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def refused(name, result):
    if result != -1 or ctypes.get_errno() != 1:
        got.append(f"{name}: {result}, errno {ctypes.get_errno()}")
refused("shmget", libc.shmget(0, 1 << 20, 0o1600))  # IPC_PRIVATE, IPC_CREAT | 0600
refused("msgget", libc.msgget(0, 0o1600))
refused("semget", libc.semget(0, 1, 0o1600))
refused("mq_open", libc.mq_open(b"/q", 0o102, 0o600, None))  # O_CREAT | O_RDWR
status = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/1/status") if ":" in l)}
mine = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status") if ":" in l)}
if (status["Seccomp"], status["Seccomp_filters"], mine["Seccomp_filters"]) != ("2", "1", "2"):
    got.append(f"filters: driver {status['Seccomp_filters']}, program {mine['Seccomp_filters']}")
refused("add_key", libc.syscall(248, b"user", b"k", b"v" * 1000, 1, -2))  # KEY_SPEC_PROCESS_KEYRING
refused("io_uring_setup", libc.syscall(425, 8, ctypes.create_string_buffer(120)))
refused("userfaultfd", libc.syscall(323, 0))
refused("bpf", libc.syscall(321, 0, None, 0))
refused("perf_event_open", libc.syscall(298, ctypes.create_string_buffer(128), 0, -1, -1, 0))
refused("x32 getpid", libc.syscall(0x40000000 | 39))
for name, call in (("memfd_create", lambda: os.memfd_create("m")),
                   ("setxattr", lambda: os.setxattr("/tmp/f", "user.k", b"v" * 4096))):
    open("/tmp/f", "w").close()
    try:
        call()
        got.append(name)
    except PermissionError:
        pass
""")
    assert_held(grade(workflow, code))


def test_a_returned_value_that_expands_past_the_cap_is_an_error_in_bound(workflow):
    """marshal shares repeated objects: 24 self-nested pairs are a few hundred bytes there and
    16 million leaves as JSON; the driver stops building it at its cap."""
    code = "class Solution:\n    def countPairs(self, nums):\n        a = [0]\n"
    code += "        for _ in range(24):\n            a = [a, a]\n        return a\n"
    verdict = grade(workflow, code, problem="9003")
    assert verdict["status"] == "error", verdict
    assert "the return value is too large (its JSON is longer than" in verdict["tests"][0]["detail"]


def test_a_patched_exit_never_reaches_the_driver_code(workflow):
    """os._exit and sys.exit replaced: the child still ends where the driver ends it."""
    code = "import os, sys\nos._exit = lambda status: None\nsys.exit = lambda *a: None\nprint('held')\n"
    verdict = grade(workflow, code)
    assert_held(verdict)
    assert verdict["tests"][0]["status"] == "wrong_answer"


def test_no_host_socket_and_no_host_loopback(workflow, tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    unix_path = tmp_path / "host.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0atlas-test-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    abstract.listen()
    try:
        code = attempts(f"""
import socket
for family, address in (
    (socket.AF_INET, ("127.0.0.1", {server.getsockname()[1]})),
    (socket.AF_UNIX, {str(unix_path)!r}),
    (socket.AF_UNIX, {abstract_name!r}),
    (socket.AF_INET, ("1.1.1.1", 80)),
):
    try:  # inside, an AF_INET socket is refused outright (seccomp: AF_UNIX only)
        s = socket.socket(family)
    except OSError:
        continue
    s.settimeout(0.5)
    try:
        s.connect(address)
        got.append(f"connected to {{address!r}}")
    except OSError:
        pass
    s.close()
""")
        # The same connections from outside the sandbox get through: the attack can succeed.
        outside = subprocess.run(
            [sys.executable, "-c", code.replace("1.1.1.1", "127.0.0.2")], capture_output=True, text=True
        )
        assert outside.stdout.count("connected to") == 3, outside
        for listener in (server, unix, abstract):
            listener.accept()[0].close()
        assert_held(grade(workflow, code))
        for listener in (server, unix, abstract):
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()  # nothing from the sandbox arrived
    finally:
        for listener in (server, unix, abstract):
            listener.close()


# --- writing outside the scratch folder -----------------------------------------------------------


def test_writes_outside_the_scratch_never_reach_the_host(workflow):
    import site

    mark = f"atlas-probe-{uuid.uuid4().hex}"
    targets = [
        f"/dev/shm/{mark}",
        f"/dev/{mark}",
        str(workflow / "src" / "atlas" / "graders" / "lcb.py"),
        str(workflow / "results" / mark),
        str(workflow / "results" / "data" / "tests.parquet"),
        *(f"{p}/{mark}.py" for p in site.getsitepackages()),
        f"{sys.base_prefix}/lib/{mark}",
    ]
    before = (workflow / "src" / "atlas" / "graders" / "lcb.py").read_bytes()
    code = attempts(f"""
for path in {targets!r}:
    try:
        with open(path, "a") as f:
            f.write("import os; os.system('touch /tmp/pwned')\\n")
        got.append("wrote " + path)
    except OSError:
        pass
open("/tmp/{mark}", "w").write("x")  # the sandbox's own /tmp: allowed, and gone with it
open("{mark}", "w").write("x")  # its working directory is that /tmp
""")
    assert_held(grade(workflow, code))
    assert (workflow / "src" / "atlas" / "graders" / "lcb.py").read_bytes() == before
    assert not Path(f"/tmp/{mark}").exists() and not Path(f"/dev/shm/{mark}").exists()
    assert not any(Path(t).exists() for t in targets if mark in t)


def test_scratch_bytes_are_capped(workflow):
    code = attempts("""
import os
try:
    for i in range(1000):
        with open(f"/tmp/fill-{i}", "wb") as f:  # each file under RLIMIT_FSIZE
            f.write(b"x" * (8 << 20))
    got.append("wrote 8 GB")
except OSError as err:
    if err.errno != 28:  # ENOSPC: the scratch tmpfs is full
        got.append(repr(err))
""")
    assert_held(grade(workflow, code))


def test_no_cgroup_and_no_proc_sys_writes(workflow):
    code = attempts("""
import os
for path in ("/sys/fs/cgroup/atlas-probe", "/proc/atlas-probe"):
    try:
        os.makedirs(path)
        got.append("created " + path)
    except OSError:
        pass
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
             "/proc/sysrq-trigger"):
    try:
        open(path, "w").close()
        got.append("opened " + path)
    except OSError:
        pass
if os.path.exists("/sys"):
    got.append("/sys exists")
""")
    assert_held(grade(workflow, code))


# --- processes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()",
        # immortal children: a double-forked daemon in its own session, deaf to SIGTERM and SIGHUP
        "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "        time.sleep(3600)\n    os._exit(0)\nprint(0)",
    ],
    ids=["fork_bomb", "thread_bomb", "immortal_children"],
)
def test_process_bombs_and_immortal_children_are_bounded(workflow, code):
    verdict = grade(workflow, code)
    assert verdict["status"] in {"error", "timeout", "failed", "passed"}
    if "setsid" in code:  # prints 0 at once: graded as any program, its daemon killed after the test
        assert verdict["tests"][0]["wall_s"] < GRADERS["test_timeout_s"]
    else:  # the count bound stops them well before the time bound does
        assert verdict["status"] in {"error", "timeout"}


def test_the_process_count_is_bounded(workflow):
    code = attempts("""
import os, time
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    got.append("forked 200")
except BlockingIOError:
    pass
if children < 4:
    got.append(f"only {children} children")
""")
    assert_held(grade(workflow, code))


def test_endless_stderr_stays_in_bound(workflow):
    verdict = grade(workflow, "import sys\nwhile True:\n    sys.stderr.write('x' * 65536)")
    assert verdict["status"] == "timeout" and verdict["tests"][0]["status"] == "timeout"


# --- forged functional results --------------------------------------------------------------------

FORGERY_BASE = "class Solution:\n    def countPairs(self, nums):\n        return -1\n"


@pytest.mark.parametrize(
    ("forgery", "status"),
    [
        ("import atexit\natexit.register(print, '25')\n", "error"),  # printed after the call
        (
            "import os, sys\nprint('25')\nsys.stdout.flush()\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)\n",
            "failed",
        ),
        (
            "import json\njson.dumps = lambda *a, **k: '25'\njson.encoder.JSONEncoder.encode = lambda *a: '25'\n",
            "failed",
        ),
    ],
    ids=["atexit_print", "dup2_swap", "patched_json_dumps"],
)
def test_forged_functional_results_are_not_judged_as_the_return_value(workflow, forgery, status):
    verdict = grade(workflow, forgery + FORGERY_BASE, problem="9003")
    assert verdict["status"] == status, verdict
    detail = verdict["tests"][0]["detail"]
    if status == "failed":
        assert detail == "expected '25' got '-1'"
    else:
        assert detail.endswith("the program wrote to stdout after the method returned")


# --- a grader killed mid-run ----------------------------------------------------------------------


def test_two_graders_never_run_programs_of_one_question_at_once(workflow):
    """Two grader processes on one problem (two training arms, a validation job beside them):
    the second program starts only once the first has ended, so nothing one computed can reach
    the other through the kernel they share."""
    timed = "import time\nstart = time.monotonic()\ntime.sleep(0.2)\nprint(start, time.monotonic())\n"
    procs = [start_cli(workflow, timed) for _ in range(2)]
    spans = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        tests = json.loads(out)["tests"]  # each a wrong answer whose detail shows what it printed
        assert [t["status"] for t in tests] == ["wrong_answer"] * 5  # waiting is no part of the budget
        times = [float(x) for t in tests for x in t["detail"].split("got ")[1].strip("'").split()]
        spans.append((min(times), max(times)))
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert a_end <= b_start
    assert_nothing_left(workflow)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_killed_grader_leaves_nothing(workflow, sig):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(30)"
    proc = start_cli(workflow, code, config="grade-long.yaml")
    give_up = time.monotonic() + 60
    seen = 0  # the grader's short probe sandbox comes first: wait for one that stays
    while seen < 10 and time.monotonic() < give_up:
        seen = seen + 1 if len(sandboxed_processes()) >= 3 else 0
        time.sleep(0.05)
    assert len(sandboxed_processes()) >= 3  # bwrap, the driver and the program are running
    proc.send_signal(sig)
    proc.wait(timeout=10)
    assert proc.returncode == -sig
    assert_nothing_left(workflow)


GRADE_MANY = """
from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase
from atlas.graders.lcb import grade_many
# six questions (a test set each): programs of one question never run at once
jobs = [("import time\\ntime.sleep(30)", [TestCase("stdin", "", str(n))], None) for n in range(6)]
grade_many(jobs, cfg=GraderConfig(test_timeout_s=30.0, program_timeout_s=30.0, workers=2))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_killed_grader_leaves_no_sandbox_started_ahead(workflow, sig):
    proc = subprocess.Popen([sys.executable, "-c", GRADE_MANY], cwd=workflow, stderr=subprocess.PIPE)
    # Two programs sleeping (a driver and its test's child each) and each worker's next sandbox
    # started ahead (a driver waiting for its program): six interpreters.
    try:
        give_up = time.monotonic() + 60
        seen = 0
        while seen < 10 and time.monotonic() < give_up:
            seen = seen + 1 if len(sandbox_interpreters()) >= 6 else 0
            time.sleep(0.05)
        assert len(sandbox_interpreters()) == 6
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=10)
    assert proc.returncode == -sig, proc.stderr.read()
    proc.stderr.close()
    assert_nothing_left(workflow)


def sandbox_interpreters() -> list[int]:
    """The processes of this test's sandboxes that run the interpreter (drivers and their forks)."""
    found = []
    for pid in sandboxed_processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if os.path.basename(argv[0]).startswith(b"python"):
            found.append(pid)
    return found


def test_the_next_grader_sweeps_stale_scratch_folders(workflow, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{SCRATCH_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-abc"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "main.py").write_text("print(1)")
    grade(workflow, "print(0)", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert not stale.exists() and live.exists()
