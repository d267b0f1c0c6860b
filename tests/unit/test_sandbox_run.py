"""One run in a real sandbox, as the grader sees it: each status and what a RunResult holds (the
output kept and its truncation, stderr, the return code, the functional value), a driver that dies
or hangs, a sandbox given a second program or a program of the other kind, and the start-up check
that fails closed. Every expected value is written out."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from atlas.graders import sandbox
from atlas.graders.sandbox import (
    HOST_GRACE_S,
    SANDBOX_ENDED,
    RunResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    require_sandbox,
    run_program,
)
from conftest import waits_for_question

LIMITS = SandboxLimits(
    timeout_s=2.0, memory_mb=512, cpu_s=5, file_size_mb=8, open_files=64, max_output_bytes=64
)


def ran(result: RunResult) -> tuple:
    """A RunResult less its wall time."""
    return (
        result.status,
        result.returncode,
        result.stdout,
        result.stderr,
        result.stdout_truncated,
        result.stderr_truncated,
        result.sandboxed,
        result.value,
    )


def test_a_run_that_ends_well_or_badly_says_so_with_its_output_and_return_code():
    with Sandbox("import sys\nprint(sys.stdin.read()[::-1], end='')", mode="stdin", limits=LIMITS) as box:
        assert ran(box.run("abc", timeout_s=2.0, keep_bytes=100)) == (
            "ok",
            0,
            "cba",
            "",
            False,
            False,
            True,
            None,
        )
    code = "import sys\nprint('out')\nsys.stderr.write('why')\nsys.exit(3)"
    with Sandbox(code, mode="stdin", limits=LIMITS) as box:
        assert ran(box.run("", timeout_s=2.0, keep_bytes=100)) == (
            "error",
            3,
            "out\n",
            "why",
            False,
            False,
            True,
            None,
        )


def test_what_is_kept_of_stdout_is_the_runs_own_bound_and_of_stderr_the_sandboxs():
    code = "import sys\nprint('x' * 100, end='')\nsys.stderr.write('é' * 40)"
    with Sandbox(code, mode="stdin", limits=LIMITS) as box:
        result = box.run("", timeout_s=2.0, keep_bytes=10)
    # stderr: 64 bytes of 80 (two bytes a character) are 32 characters
    assert ran(result) == ("ok", 0, "x" * 10, "é" * 32, True, True, True, None)
    with Sandbox("print('y' * 200_000)", mode="stdin", limits=LIMITS) as box:  # many reads of the pipe
        result = box.run("", timeout_s=2.0, keep_bytes=300_000)
    assert (result.stdout, result.stdout_truncated) == ("y" * 200_000 + "\n", False)


def test_a_run_past_its_bound_is_a_timeout_with_what_it_printed_before():
    with Sandbox("print('started', flush=True)\nwhile True: pass", mode="stdin", limits=LIMITS) as box:
        start = time.monotonic()
        result = box.run("", timeout_s=0.5, keep_bytes=100)
        took = time.monotonic() - start
    assert ran(result)[:3] == ("timeout", None, "started\n") and result.sandboxed
    assert 0.5 <= result.wall_s <= took < 0.5 + HOST_GRACE_S + 1.0


def test_a_functional_run_returns_the_methods_value_as_json():
    code = "class Solution:\n    def pair(self, a, b):\n        return [b, {'sum': a + b}]"
    with Sandbox(code, mode="functional", func_name="pair", limits=LIMITS) as box:
        assert ran(box.run("2\n3", timeout_s=2.0, keep_bytes=100)) == (
            "ok", 0, "", "", False, False, True, '[3, {"sum": 5}]'
        )  # fmt: skip


def sandbox_processes(box: Sandbox) -> list[int]:
    pids = []
    for folder in box.cgroup.folders:
        with open(f"{folder}/cgroup.procs") as f:
            pids += [int(line) for line in f if line.strip()]
    return sorted(set(pids))


def test_a_driver_that_dies_ends_the_sandbox_as_an_error_and_one_that_hangs_as_a_timeout():
    with Sandbox("print(1)", mode="stdin", limits=LIMITS) as box:
        os.kill(box._init_pid(), signal.SIGKILL)
        box.proc.wait(5)
        result = box.run("", timeout_s=2.0, keep_bytes=100)
        assert ran(result) == ("error", None, "", SANDBOX_ENDED, False, False, True, None)
        assert result.wall_s < 2.0 and not box.alive
    with Sandbox("print(1)", mode="stdin", limits=LIMITS) as box:
        for pid in sandbox_processes(box):
            os.kill(pid, signal.SIGSTOP)  # nothing of the sandbox answers
        result = box.run("", timeout_s=0.3, keep_bytes=100)
        assert ran(result) == ("timeout", None, "", SANDBOX_ENDED, False, False, True, None)
        assert 0.3 + HOST_GRACE_S <= result.wall_s < 5 and not box.alive


def test_a_sandbox_runs_one_program_of_the_kind_it_was_started_for():
    with Sandbox(mode="stdin", limits=LIMITS) as box:
        with pytest.raises(
            ValueError, match="a sandbox started for mode 'stdin' cannot run a 'script' program"
        ):
            box.load("print(1)", mode="script")
        box.load("class Solution:\n    def f(self, a):\n        return a", mode="functional", func_name="f")
        assert box.run("7", timeout_s=2.0, keep_bytes=100).value == "7"
        with pytest.raises(RuntimeError, match="^a sandbox runs one program only$"):
            box.load("print(2)")
    with Sandbox(mode="script", limits=LIMITS) as box:
        with pytest.raises(
            ValueError, match="a sandbox started for mode 'script' cannot run a 'stdin' program"
        ):
            box.load("print(1)", mode="stdin")


def test_a_sandbox_whose_driver_is_gone_before_its_program_is_refused_and_closed():
    box = Sandbox(mode="stdin", limits=LIMITS)
    try:
        give_up = time.monotonic() + 10
        while box._init_pid() is None and time.monotonic() < give_up:  # bwrap has not said it yet
            time.sleep(0.01)
        os.kill(box._init_pid(), signal.SIGKILL)
        box.proc.wait(5)
        with pytest.raises(SandboxUnavailable, match="^the sandbox did not start: no reply from its driver$"):
            box.load("print(1)")
        assert box.request is None and box.cgroup is None  # closed
    finally:
        box.close()


def test_run_program_runs_a_script_on_its_stdin_under_the_limits_bounds():
    assert ran(run_program("import sys\nprint(sys.stdin.read().upper())", "abc", limits=LIMITS)) == (
        "ok", 0, "ABC\n", "", False, False, True, None
    )  # fmt: skip
    assert ran(run_program("print('z' * 100)", limits=LIMITS))[2:5] == ("z" * 64, "", True)
    short = SandboxLimits(0.3, 512, 5, 8, 64, 64)
    assert run_program("while True: pass", limits=short).status == "timeout"
    # a script is __main__, and its traceback names main.py
    assert run_program("print(__name__)", limits=LIMITS).stdout == "__main__\n"
    assert 'File "main.py", line 2' in run_program("x = 1\nraise KeyError", limits=LIMITS).stderr


def test_grading_stops_at_start_without_bubblewrap_unless_running_without_it_is_asked_for(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe", lambda: (False, "bwrap: not found"))
    with pytest.raises(SandboxUnavailable) as err:
        require_sandbox(False)
    assert str(err.value) == (
        "bubblewrap cannot start here (bwrap: not found); graded code runs only inside it. Install "
        "bubblewrap (scripts/setup.sh) and allow user namespaces, or set graders.allow_unsandboxed: true "
        "to run programs without it (every verdict then says sandboxed: false)"
    )
    assert require_sandbox(True) is False
    monkeypatch.setattr(sandbox, "_probe", lambda: (True, ""))
    assert require_sandbox(False) is True


def test_one_sandbox_runs_its_program_again_on_each_test_without_stdin_by_default():
    code = "import os, sys\nprint(repr(sys.stdin.read()), sorted(os.listdir('.')))\nopen('left', 'w').close()"
    with Sandbox(code, mode="stdin", limits=LIMITS) as box:
        first = box.run(timeout_s=2.0, keep_bytes=100)
        second = box.run("x", timeout_s=2.0, keep_bytes=100)
        assert (first.stdout, second.stdout, box.alive) == ("'' []\n", "'x' []\n", True)
    assert run_program("import sys\nprint(repr(sys.stdin.read()))", limits=LIMITS).stdout == "''\n"


def test_stderr_is_cut_at_the_byte_bound_whole_characters_or_not():
    exact = SandboxLimits(2.0, 512, 5, 8, 64, 64)
    with Sandbox("import sys\nsys.stderr.write('e' * 64)", mode="stdin", limits=exact) as box:
        assert ran(box.run("", timeout_s=2.0, keep_bytes=100))[3:6] == ("e" * 64, False, False)
    odd = SandboxLimits(2.0, 512, 5, 8, 64, 63)  # 63 bytes end inside a two-byte character
    with Sandbox("import sys\nsys.stderr.write('é' * 40)", mode="stdin", limits=odd) as box:
        result = box.run("", timeout_s=2.0, keep_bytes=100)
    assert (result.stderr, result.stderr_truncated) == ("é" * 31 + "\ufffd", True)


def test_an_lcb_program_runs_after_the_prefix_it_needs_as_solution_py_and_a_script_as_it_is():
    with Sandbox("print(math.sqrt(16))\nraise KeyError(1)", mode="stdin", limits=LIMITS) as box:
        result = box.run("", timeout_s=2.0, keep_bytes=100)
    assert (result.stdout, result.returncode) == ("4.0\n", 1)  # math came from lcb_runner's prefix
    assert 'File "solution.py", line 2' in result.stderr
    script = run_program("print(math.sqrt(16))", limits=SandboxLimits(2.0, 512, 5, 8, 64, 4096))
    assert script.status == "error" and script.stderr.endswith("NameError: name 'math' is not defined\n")


@pytest.mark.parametrize("start", ["sandbox", "run_program"])
def test_a_program_that_names_its_question_waits_for_that_questions_lock(start):
    def go():
        if start == "sandbox":
            with Sandbox("print(1)", mode="stdin", limits=LIMITS, question="q-sandbox-run") as box:
                box.run("", timeout_s=2.0, keep_bytes=10)
        else:
            run_program("print(1)", limits=LIMITS, question="q-sandbox-run")

    waits_for_question("q-sandbox-run", go)


def test_a_driver_killed_while_its_test_runs_ends_the_run_at_once_as_an_error():
    with Sandbox("import time\nprint('up', flush=True)\ntime.sleep(5)", mode="stdin", limits=LIMITS) as box:
        killer = threading.Timer(0.5, lambda: os.kill(box._init_pid(), signal.SIGKILL))
        killer.start()
        result = box.run("", timeout_s=4.0, keep_bytes=100)
        killer.join()
    assert ran(result) == ("error", None, "up\n", SANDBOX_ENDED, False, False, True, None)
    assert result.wall_s < 3.0  # the pipe's end, not the deadline, ended it


def test_a_request_the_driver_does_not_read_gives_up_at_its_deadline():
    with Sandbox("print(1)", mode="stdin", limits=LIMITS) as box:
        for pid in sandbox_processes(box):
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        assert box._send(b"T", b"x" * (4 << 20), start + 0.3) is False  # more than the pipe holds
        assert 0.3 <= time.monotonic() - start < 3
    with Sandbox("print(1)", mode="stdin", limits=LIMITS) as box:
        os.kill(box._init_pid(), signal.SIGKILL)
        box.proc.wait(5)
        assert box._send(b"T", b"x" * (4 << 20), time.monotonic() + 5) is False  # a broken pipe


def test_a_driver_that_cannot_start_is_named_by_what_it_said(monkeypatch):
    assert sandbox.isolation_available()  # probed (once per process) before the interpreter is broken
    monkeypatch.setattr(sandbox, "PYTHON_FLAGS", [*sandbox.PYTHON_FLAGS, "--no-such-option"])
    with pytest.raises(SandboxUnavailable) as err:
        Sandbox("print(1)", mode="stdin", limits=LIMITS)
    assert str(err.value).startswith("the sandbox did not start: unknown option --no-such-option")


def test_a_run_asked_not_to_decode_keeps_its_stdout_as_bytes():
    code = "import sys\nsys.stdout.buffer.write(b'ok \\xff' * 3)\nsys.stdout.flush()"
    with Sandbox(code, mode="stdin", limits=LIMITS) as box:
        result = box.run("", timeout_s=2.0, keep_bytes=8, text=False)
    assert (result.stdout, result.stdout_bytes, result.stdout_truncated) == ("", b"ok \xffok \xff", True)
    with Sandbox(code, mode="stdin", limits=LIMITS) as box:
        result = box.run("", timeout_s=2.0, keep_bytes=100)
    assert (result.stdout, result.stdout_bytes) == ("ok \ufffd" * 3, None)
    # and when the driver dies before the run ends
    slow = "import sys, time\nsys.stdout.buffer.write(b'up\\xff')\nsys.stdout.flush()\ntime.sleep(5)"
    for text, kept in ((False, ("", b"up\xff")), (True, ("up\ufffd", None))):
        with Sandbox(slow, mode="stdin", limits=LIMITS) as box:
            killer = threading.Timer(0.5, lambda box=box: os.kill(box._init_pid(), signal.SIGKILL))
            killer.start()
            result = box.run("", timeout_s=4.0, keep_bytes=100, text=text)
            killer.join()
        assert (result.status, result.stderr, (result.stdout, result.stdout_bytes)) == (
            "error",
            SANDBOX_ENDED,
            kept,
        )
