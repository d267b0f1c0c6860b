"""The LCB grader's judgement, value by value: how a run becomes a test outcome, how outcomes
become a verdict, how much stdout is kept, and the summary the policy sees. The runs are real
RunResults (what a sandbox returns); the verdict tests run real programs in real sandboxes."""

import dataclasses
import json
import os
import signal

import pytest

from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase as Case  # not `Test*`: pytest would collect it
from atlas.graders.lcb import (
    TestOutcome,
    Verdict,
    _keep_bytes,
    _number_key,
    _outcome,
    _value_chars,
    compare_functional,
    compare_stdout,
    grade_code,
    summarize,
)
from atlas.graders.sandbox import RunResult, Sandbox, SandboxLimits, isolation_available

CFG = GraderConfig(test_timeout_s=1.0, program_timeout_s=10.0, max_output_bytes=4096)


def run(status="ok", returncode=0, stdout="", stderr="", truncated=False, wall_s=0.25, value=None):
    return RunResult(status, returncode, stdout, stderr, truncated, False, wall_s, True, value)


STDIN = Case("stdin", "", "1\n2\n")
FUNCTIONAL = Case("functional", "[1]", "[1, 2]")


# --- how much stdout is kept -------------------------------------------------------------------


def test_stdout_is_kept_up_to_twice_the_expected_bytes_plus_4_kib():
    """docs/sandbox.md's rule, in bytes of UTF-8: max(max_output_bytes, 2 x expected + 4096)."""
    small = SandboxLimits.from_config(GraderConfig(max_output_bytes=1024))
    assert _keep_bytes(Case("stdin", "", ""), small) == 4096
    assert _keep_bytes(Case("stdin", "", "ab"), small) == 4100
    # 1000 two-byte characters: 2000 bytes, so 2 * 2000 + 4096 (not 2 * 1000 characters)
    assert _keep_bytes(Case("stdin", "", "é" * 1000), small) == 8096
    big = SandboxLimits.from_config(GraderConfig(max_output_bytes=100_000))
    assert _keep_bytes(Case("stdin", "", "é" * 1000), big) == 100_000
    assert _keep_bytes(Case("stdin", "", "x" * 60_000), big) == 124_096


# --- one run, one test outcome -----------------------------------------------------------------


def test_a_run_becomes_its_test_outcome():
    assert _outcome(run(stdout="1\n2\n"), STDIN, 1.0) == TestOutcome("passed", 0.25, "")
    assert _outcome(run(stdout="1\n3\n"), STDIN, 1.0) == TestOutcome(
        "wrong_answer", 0.25, "line 2: expected '2' got '3'"
    )
    timeout = run("timeout", None, wall_s=1.5)
    assert _outcome(timeout, STDIN, 1.23456) == TestOutcome("timeout", 1.5, "no exit within 1.23 s")
    assert _outcome(timeout, STDIN, 6.0) == TestOutcome("timeout", 1.5, "no exit within 6 s")
    crashed = run("error", 2, stdout="1\n2\n", stderr="ValueError: bad\n")
    assert _outcome(crashed, STDIN, 1.0) == TestOutcome("error", 0.25, "exit status 2; ValueError: bad")
    # Output cut at the bound is wrong even when what was kept matches.
    cut = run(stdout="1\n2\n", truncated=True)
    assert _outcome(cut, STDIN, 1.0) == TestOutcome("wrong_answer", 0.25, "output longer than 4 bytes")


def test_a_functional_test_judges_the_value_never_the_stdout():
    assert _outcome(run(stdout="", value="[1,2]"), FUNCTIONAL, 1.0) == TestOutcome("passed", 0.25, "")
    wrong = run(stdout="[1, 2]", value="[2,1]")
    assert _outcome(wrong, FUNCTIONAL, 1.0) == TestOutcome(
        "wrong_answer", 0.25, "expected '[1, 2]' got '[2,1]'"
    )
    # A stdin test judges stdout; a value there is not looked at.
    assert _outcome(run(stdout="1\n2", value="[0]"), STDIN, 1.0).status == "passed"


def test_a_long_difference_is_clipped_to_240_characters():
    got = "\x01" * 100  # repr shows each as \x01: four characters
    full = "expected '1' got '" + "\\x01" * 57 + "...'"
    assert len(full) == 250
    outcome = _outcome(run(stdout=got), Case("stdin", "", "1"), 1.0)
    assert outcome == TestOutcome("wrong_answer", 0.25, full[:237] + "...")


def test_stdout_kept_undecoded_is_judged_against_the_tests_own_bound():
    raw = lambda data: dataclasses.replace(run(), stdout_bytes=data)  # noqa: E731 - kept, not decoded
    assert _outcome(raw(b"1\n2\n"), STDIN, 1.0, keep=4) == TestOutcome("passed", 0.25, "")
    assert _outcome(raw(b"1\n2\n"), STDIN, 1.0) == TestOutcome("passed", 0.25, "")  # no bound: all of it
    assert _outcome(raw(b"1\n2\n"), STDIN, 1.0, keep=3) == TestOutcome(
        "wrong_answer", 0.25, "output longer than 3 bytes"
    )
    # bytes that are not UTF-8 are judged as the replacement character, never raise
    assert _outcome(raw(b"1\n\xff\n"), STDIN, 1.0, keep=8) == TestOutcome(
        "wrong_answer", 0.25, "line 2: expected '2' got '\ufffd'"
    )


def test_a_value_longer_than_any_equal_one_is_a_wrong_answer_unread():
    dropped = run(value=None)  # the grader dropped it, unread
    assert _outcome(dropped, FUNCTIONAL, 1.0, value_too_long=True) == TestOutcome(
        "wrong_answer", 0.25, f"return value longer than {3 * len('[1, 2]') + 4096} characters of JSON"
    )


def test_output_that_cannot_be_judged_is_the_tests_error():
    unreadable = run(stdout=None)  # not text: judging it raises TypeError
    assert _outcome(unreadable, STDIN, 1.0) == TestOutcome(
        "error", 0.25, "the output could not be judged (TypeError)"
    )


@pytest.mark.parametrize(
    ("returncode", "stderr", "detail"),
    [
        (None, "", "the sandbox ended before the run did"),
        (-9, "", "killed by SIGKILL (CPU-time or memory limit)"),
        (-9, "MemoryError\n", "killed by SIGKILL (CPU-time or memory limit); MemoryError"),
        (-15, "", "killed by SIGTERM"),
        (-40, "", "killed by signal 40"),  # a real-time signal has no name
        (3, "", "exit status 3"),
        (0, "", "exit status 0"),
        (3, "\n  \n", "exit status 3"),
        (
            1,
            'Traceback (most recent call last):\n  File "solution.py", line 3, in <module>\n'
            "    x = [1][5]\n        ~~~^^^\nIndexError: list index out of range\n",
            'exit status 1; File "solution.py", line 3, in <module>; x = [1][5]; '
            "IndexError: list index out of range",
        ),
        (1, "a ~\n  ^ ~\nb\n", "exit status 1; a ~; b"),  # a line of markers only is dropped
        (1, "^^^\nX\n", "exit status 1; X"),
    ],
)
def test_a_failed_run_is_named_by_its_exit_and_the_end_of_stderr(returncode, stderr, detail):
    assert _outcome(run("error", returncode, stderr=stderr), STDIN, 1.0) == TestOutcome("error", 0.25, detail)


def test_a_long_stderr_keeps_its_end_within_240_characters():
    digits = "".join(f"{i:03d}" for i in range(100))  # 300 characters, 000001...099
    # "exit status 1; " is 15 characters: 225 are left, "..." and the last 222 characters.
    detail = _outcome(run("error", 1, stderr=digits), STDIN, 1.0).detail
    assert detail == "exit status 1; ..." + digits[-222:]
    assert len(detail) == 240 and detail.endswith("097098099")
    exact = digits[:225]  # fits the room exactly: kept whole
    assert _outcome(run("error", 1, stderr=exact), STDIN, 1.0).detail == "exit status 1; " + exact


# --- comparison rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("got", "expected"),
    [
        ("  1  \n\n", "1"),  # the whole text and each line are stripped
        ("1 \n 2", "1\n2"),
        ("1.0 2", "1 2.00"),  # equal as Decimals
        ("-0", "0"),
        ("1\t2", "1 2"),  # tokens split on any whitespace
        ("Yes", "Yes"),  # equal as text, though not numbers
        ("NaN", "NaN"),
        ("", ""),
    ],
)
def test_outputs_that_match(got, expected):
    assert compare_stdout(got, expected) is None


@pytest.mark.parametrize(
    ("got", "expected", "difference"),
    [
        ("1\n4", "1\n3", "line 2: expected '3' got '4'"),
        ("4\n3", "1\n3", "line 1: expected '1' got '4'"),
        ("1 2", "1 2 3", "expected '1 2 3' got '1 2'"),
        ("1", "a", "expected 'a' got '1'"),
        ("a", "1", "expected '1' got 'a'"),
        ("", "0", "expected '0' got ''"),
        ("sNaN 1", "sNaN 1.0", "expected 'sNaN 1.0' got 'sNaN 1'"),
        ("1\n\n2", "1\n2", "expected 2 lines, got 3: expected '1\\n2' got '1\\n\\n2'"),
        ("1\n2\n3", " 1\n2 \n", "expected 2 lines, got 3: expected '1\\n2' got '1\\n2\\n3'"),
        ("b", "a" * 60, "expected '" + "a" * 60 + "' got 'b'"),  # 60 characters: kept whole
        ("b", "a" * 61, "expected '" + "a" * 57 + "...' got 'b'"),
        ("b" * 61, "a", "expected 'a' got '" + "b" * 57 + "...'"),
    ],
)
def test_outputs_that_differ_name_the_difference(got, expected, difference):
    assert compare_stdout(got, expected) == difference


def test_functional_values_compare_as_json():
    assert compare_functional("[1,2]", " [1, 2] \n") is None
    assert compare_functional('[[1, 2], {"a": 1}]', '[[1,2],{"a":1}]') is None
    assert compare_functional(None, "1") == "no return value (the program exited before the method returned)"
    assert compare_functional(" [2, 1]", " [1, 2] \n") == "expected '[1, 2]' got ' [2, 1]'"
    assert compare_functional("[1", "[1]") == "the return value could not be compared (JSONDecodeError)"
    deep = "[" * 100_000 + "]" * 100_000
    assert compare_functional(deep, "[]") == "the return value could not be compared (RecursionError)"
    long = "[" + ", ".join(["1"] * 40) + "]"  # 118 characters
    assert compare_functional(long, "[]") == "expected '[]' got '" + long[:57] + "...'"


# --- the summary the policy sees -----------------------------------------------------------------


def verdict(*tests: TestOutcome, status: str) -> Verdict:
    passed = sum(t.status == "passed" for t in tests)
    return Verdict(passed, len(tests), list(tests), status, 1.0, True)


PASSED = TestOutcome("passed", 0.1, "")


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (TestOutcome("wrong_answer", 0.1, "expected '1' got '2'"), "wrong answer: expected '1' got '2'"),
        (TestOutcome("timeout", 1.0, "no exit within 1 s"), "timeout: no exit within 1 s"),
        (TestOutcome("error", 0.1, "exit status 1"), "error: exit status 1"),
        (TestOutcome("skipped", 0.0, "not run: x"), "skipped: not run: x"),
    ],
)
def test_the_summary_names_the_first_test_that_did_not_pass(outcome, text):
    later = TestOutcome("error", 0.1, "exit status 9")
    v = verdict(PASSED, outcome, later, status="failed")
    assert summarize(v, 1000) == f"1/3 tests passed; test 2: {text}"


def test_the_summary_of_a_pass_and_its_cap():
    assert summarize(verdict(PASSED, PASSED, status="passed"), 1000) == "2/2 tests passed"
    v = verdict(TestOutcome("error", 0.1, "exit status 1"), status="error")
    full = "0/1 tests passed; test 1: error: exit status 1"
    assert len(full) == 46
    assert summarize(v, 46) == full
    assert summarize(v, 45) == "0/1 tests passed; test 1: error: exit stat..."


# --- the verdict of a program ------------------------------------------------------------------

# Reads one number n; prints it, except: 1 -> 9 (wrong), 2 -> exit status 5, 3 -> sleeps.
PROGRAM = """import sys, time
n = int(input())
if n == 1:
    print(9)
elif n == 2:
    sys.exit(5)
elif n == 3:
    time.sleep(30)
else:
    print(n)
"""


def cases(*ns: int) -> list[Case]:
    return [Case("stdin", f"{n}\n", f"{n}\n") for n in ns]


def statuses(v: Verdict) -> list[tuple[str, str]]:
    return [(t.status, t.detail) for t in v.tests]


def test_an_error_stops_the_tests_and_the_first_failure_is_the_verdict():
    v = grade_code(PROGRAM, cases(4, 1, 2, 5), func_name=None, cfg=CFG)
    assert statuses(v) == [
        ("passed", ""),
        ("wrong_answer", "expected '1' got '9'"),
        ("error", "exit status 5"),
        ("skipped", "not run: an earlier test ended in an error"),
    ]
    assert (v.passed, v.total, v.status, v.sandboxed) == (1, 4, "failed", True)
    v = grade_code(PROGRAM, cases(4, 2, 1), func_name=None, cfg=CFG)
    assert [t.status for t in v.tests] == ["passed", "error", "skipped"]
    assert (v.passed, v.total, v.status) == (1, 3, "error")
    v = grade_code(PROGRAM, cases(4, 5), func_name=None, cfg=CFG)
    assert statuses(v) == [("passed", ""), ("passed", "")]
    assert (v.passed, v.total, v.status) == (2, 2, "passed")
    assert 0 < v.wall_s < 60


def test_a_timeout_stops_the_tests_and_a_spent_budget_is_the_programs_timeout():
    cfg = GraderConfig(test_timeout_s=0.5, program_timeout_s=10.0)
    v = grade_code(PROGRAM, cases(4, 3, 4), func_name=None, cfg=cfg)
    assert statuses(v) == [
        ("passed", ""),
        ("timeout", "no exit within 0.5 s"),
        ("skipped", "not run: an earlier test timed out"),
    ]
    assert (v.passed, v.status) == (1, "timeout")
    assert v.wall_s >= 0.5
    # The program's budget ends the sleeper before its own bound: cut short, the rest skipped.
    cfg = GraderConfig(test_timeout_s=5.0, program_timeout_s=0.5)
    v = grade_code(PROGRAM, cases(3, 4), func_name=None, cfg=cfg)
    assert statuses(v) == [
        ("timeout", "cut short: the program's 0.5 s budget ran out"),
        ("skipped", "not run: the program's 0.5 s budget ran out"),
    ]
    assert (v.passed, v.total, v.status) == (0, 2, "program_timeout")


def test_a_sandbox_started_ahead_runs_the_program_and_is_closed():
    limits = SandboxLimits.from_config(CFG)
    box = Sandbox(mode="stdin", limits=limits)
    v = grade_code(PROGRAM, cases(4, 1), func_name=None, cfg=CFG, sandbox=box)
    assert statuses(v) == [("passed", ""), ("wrong_answer", "expected '1' got '9'")]
    assert not box.alive
    # Refused tests close it too.
    box = Sandbox(mode="stdin", limits=limits)
    with pytest.raises(ValueError, match="^grade_code needs at least one test$"):
        grade_code(PROGRAM, [], func_name=None, cfg=CFG, sandbox=box)
    assert not box.alive


def test_tests_of_one_known_type_and_a_method_name_are_required():
    with pytest.raises(
        ValueError, match=r"^tests of types \['functional', 'stdin'\]: expected all stdin or all functional$"
    ):
        grade_code("", [STDIN, FUNCTIONAL], func_name="f", cfg=CFG)
    with pytest.raises(
        ValueError, match=r"^tests of types \['file'\]: expected all stdin or all functional$"
    ):
        grade_code("", [Case("file", "", "")], func_name=None, cfg=CFG)
    for name in (None, ""):
        with pytest.raises(
            ValueError, match=r"^functional tests need func_name \(the Solution method to call\)$"
        ):
            grade_code("", [FUNCTIONAL], func_name=name, cfg=CFG)


def test_a_spent_budget_skips_every_test_before_any_runs():
    """A budget already spent when the first test would start: nothing runs, each test is skipped
    with the budget's note, and the verdict is the program's timeout; a sandbox started ahead is
    closed, and without one none is started."""
    cfg = GraderConfig(test_timeout_s=1.0, program_timeout_s=1e-9)
    box = Sandbox(mode="stdin", limits=SandboxLimits.from_config(cfg))
    note = "not run: the program's 1e-09 s budget ran out"
    for ahead in (box, None):
        v = grade_code(PROGRAM, cases(4, 5, 6), func_name=None, cfg=cfg, sandbox=ahead)
        assert v.tests == [TestOutcome("skipped", 0.0, note)] * 3
        assert (v.passed, v.total, v.status) == (0, 3, "program_timeout")
    assert not box.alive


def test_the_budget_left_bounds_the_next_test():
    """2.1 s for the program, 2 s a test: the first test sleeps 0.15 s and passes (with 1.85 s to
    spare on a busy machine), so the second gets at most 1.95 s; its sleep is cut there, short of
    its own bound."""
    code = "import time\nn = int(input())\ntime.sleep(0.15 if n == 4 else 30)\nprint(n)\n"
    cfg = GraderConfig(test_timeout_s=2.0, program_timeout_s=2.1)
    v = grade_code(code, cases(4, 5, 6), func_name=None, cfg=cfg)
    assert statuses(v) == [
        ("passed", ""),
        ("timeout", "cut short: the program's 2.1 s budget ran out"),
        ("skipped", "not run: the program's 2.1 s budget ran out"),
    ]
    assert v.status == "program_timeout"


def test_a_budget_under_a_second_cuts_the_first_test_there():
    """0.4 s for the program, 2 s a test: the first test, which would sleep 0.8 s, is cut at the
    budget, however short, not at some floor above it."""
    code = "import time\ntime.sleep(0.8)\nprint(input())\n"
    cfg = GraderConfig(test_timeout_s=2.0, program_timeout_s=0.4)
    v = grade_code(code, cases(4, 5), func_name=None, cfg=cfg)
    assert statuses(v) == [
        ("timeout", "cut short: the program's 0.4 s budget ran out"),
        ("skipped", "not run: the program's 0.4 s budget ran out"),
    ]
    assert v.tests[0].wall_s < 0.8


def test_one_sandbox_runs_every_test_of_a_program(monkeypatch):
    isolation_available()  # the probe's own sandbox, made once per process, is not the program's
    spawned = []
    spawn = Sandbox._spawn
    monkeypatch.setattr(Sandbox, "_spawn", lambda box: (spawned.append(box), spawn(box)))
    v = grade_code(PROGRAM, cases(4, 5, 6), func_name=None, cfg=CFG)
    assert statuses(v) == [("passed", "")] * 3
    assert len(spawned) == 1


def test_a_sandbox_that_dies_between_tests_is_closed_and_replaced(monkeypatch):
    """A sandbox can end under its program (its driver killed by the kernel's OOM killer): the
    next test gets a new one, and the dead one is closed (its host uid given back: a grading
    thread holds two at most)."""
    used = []
    run_test = Sandbox.run

    def run_then_die(box, *args, **kwargs):
        result = run_test(box, *args, **kwargs)
        used.append(box)
        if len(used) < 3:
            os.kill(box._init_pid(), signal.SIGKILL)  # everything in the sandbox dies with its init
            box.proc.wait(timeout=10)
        return result

    monkeypatch.setattr(Sandbox, "run", run_then_die)
    v = grade_code(PROGRAM, cases(4, 5, 6), func_name=None, cfg=CFG)
    assert statuses(v) == [("passed", "")] * 3
    assert len({id(box) for box in used}) == 3 and not any(box.alive for box in used)


def test_a_functional_program_runs_in_a_sandbox_started_ahead():
    """grade_many starts every sandbox ahead in stdin mode; the program's own mode and method
    name go with it when it is loaded."""
    code = "class Solution:\n    def push(self, nums, x):\n        return [x] + nums\n"
    tests = [Case("functional", "[1, 2]\n3", "[3, 1, 2]"), Case("functional", "[]\n5", "[5]")]
    box = Sandbox(mode="stdin", limits=SandboxLimits.from_config(CFG))
    v = grade_code(code, tests, func_name="push", cfg=CFG, sandbox=box)
    assert statuses(v) == [("passed", ""), ("passed", "")]
    assert (v.status, v.sandboxed) == ("passed", True)


def test_values_compare_as_pythons_equality_sees_them():
    same = [
        ('{"b": 2, "a": 1}', '{"a": 1, "b": 2}'),  # key order
        ("[true, false]", "[1, 0]"),
        ("[-0.0, 1.0]", "[0, 1]"),
        ("10000000000000000000000", "1e22"),  # 10**22 == 1e22
        ("[1.5]", "[1.5000]"),
        ('["\\u00e9"]', '["é"]'),
    ]
    for got, expected in same:
        assert compare_functional(got, expected) is None, (got, expected)
    different = [
        ("[1, 2]", "[2, 1]"),
        ("10000000000000000000001", "1e22"),
        ("[1]", "[1.0000000000000002]"),
        ('"a"', '"b"'),
        ('{"a": 1}', '{"a": 1, "b": 2}'),
        ("[[1]]", "[1]"),
        ('"1"', "1"),
    ]
    for got, expected in different:
        assert compare_functional(got, expected) is not None, (got, expected)
    # the bound on a value's JSON counts integral numbers as integers: 1e22 may come back as 10**22
    assert _value_chars(json.dumps([1e22] * 2000)) == 3 * len(json.dumps([10**22] * 2000)) + 4096


def test_a_number_has_one_spelling_and_a_nan_none():
    spellings = {
        key: _number_key(key)
        for key in ("1", "1.0", "1e0", "10E-1", "0.50", ".5", "12", "1.2e1", "100", "1E+2")
    }
    assert spellings == {
        "1": "1e0", "1.0": "1e0", "1e0": "1e0", "10E-1": "1e0", "0.50": "5e-1", ".5": "5e-1",
        "12": "12e0", "1.2e1": "12e0", "100": "1e2", "1E+2": "1e2",
    }  # fmt: skip
    assert [_number_key(t) for t in ("0", "-0", "0.000", "-1.5", "Infinity", "-inf", "NaN", "sNaN", "1x")] == [
        "0", "0", "0", "-15e-1", "inf", "-inf", None, None, None
    ]  # fmt: skip
    assert compare_stdout("1e2 -0 .5", "100 0 0.50") is None
    assert compare_stdout("NaN", "NaN") is None  # equal as text
    assert compare_stdout("1 NaN", "1.0 NaN") == "expected '1.0 NaN' got '1 NaN'"  # a NaN equals no number


def test_each_test_is_judged_against_its_own_stdout_bound():
    """One run keeps stdout up to the program's largest bound (here test 2's, 2 x 12,001 + 4096
    bytes), but each test is judged against its own: test 1's answer followed by 6,000 blank
    lines passes under test 2's bound and is cut at test 1's 4,100 bytes."""
    code = "n = int(input())\nprint('1' + '\\n' * 6000 if n == 1 else 'y' * 12000)\n"
    tests = [Case("stdin", "1\n", "1\n"), Case("stdin", "2\n", "y" * 12000 + "\n")]
    v = grade_code(code, tests, func_name=None, cfg=CFG)
    assert statuses(v) == [("wrong_answer", "output longer than 4100 bytes"), ("passed", "")]
    assert (v.passed, v.status) == (1, "failed")
    # the same answer alone, under its own bound only: the blank lines are what cut it
    v = grade_code("input()\nprint('1' + '\\n' * 2000)\n", tests[:1], func_name=None, cfg=CFG)
    assert statuses(v) == [("passed", "")]


def test_a_value_exactly_at_its_bound_is_judged_and_one_past_it_is_not():
    """[1, 2]'s bound is 3 x 6 + 4096 = 4114 characters of JSON: a string of 4112 characters (4114
    with its quotes) is compared, one of 4113 is dropped unread."""
    code = "class Solution:\n    def f(self, n):\n        return 'a' * n\n"
    tests = [Case("functional", "4112", "[1, 2]"), Case("functional", "4113", "[1, 2]")]
    v = grade_code(code, tests, func_name="f", cfg=CFG)
    assert [t.status for t in v.tests] == ["wrong_answer", "wrong_answer"]
    assert v.tests[0].detail == "expected '[1, 2]' got '\"" + "a" * 56 + "...'"
    assert v.tests[1].detail == "return value longer than 4114 characters of JSON"
