"""LiveCodeBench grader: run a program on a problem's tests in the sandbox, with lcb_runner's rules.

- stdin tests: the program reads the test input on stdin; its stdout must equal the expected
  output line by line, after stripping each line and the whole text. Lines that differ as text
  still match when every token of both parses as a Decimal and the Decimal lists are equal.
- functional tests: the program defines `class Solution` with method `func_name`; each line of the
  test input is one JSON argument; the return value must equal the JSON-decoded expected output.
  The value travels back as JSON, so tuples compare as lists (at any depth).

Like lcb_runner, the program is run after lcb_runner's import prefix (`from typing import *`,
`import collections, math, heapq, ...`, a recursion limit of 50000), tests in order, and the
verdict is that of the first test that did not pass. Unlike lcb_runner, a wrong answer does not
stop the tests: what runs inside the sandbox never depends on a comparison with an expected
output, in what runs or when (every test runs before any is judged, and judging starts once the
sandbox is closed), so a program cannot learn which of its outputs passed, and each test starts
with an empty scratch folder. Only a timeout or an error, which the program itself decides, ends its tests. One sandbox per
program: its driver starts once and runs each test in a child (sandbox.py, driver.py); test inputs
go in one at a time and expected outputs never do. Bounds: `test_timeout_s` per test, and
`program_timeout_s` for all tests of the program together; a test the shrinking budget cuts short
counts as a program timeout, and tests it leaves no time for are skipped.

Whatever a program returns or prints, judging it never raises: a value that cannot be compared is
that test's error, and a driver that died is the verdict "the sandbox ended".
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase
from atlas.graders.sandbox import SANDBOX_ENDED, QuestionLock, RunResult, Sandbox, SandboxLimits

DETAIL_CHARS = 240  # longest TestOutcome.detail
EXCERPT_CHARS = 60  # longest expected / got excerpt inside a detail


@dataclass(frozen=True)
class TestOutcome:
    """One test of one program."""

    __test__ = False  # not a pytest class

    status: str  # "passed" | "wrong_answer" | "timeout" | "error" | "skipped"
    wall_s: float
    detail: str  # short: what differed, the end of stderr, or why it was skipped


@dataclass(frozen=True)
class Verdict:
    """All tests of one program. `status` is that of the first test that did not pass."""

    passed: int
    total: int
    tests: list[TestOutcome]
    status: str  # "passed" | "failed" (wrong answer) | "timeout" | "error" | "program_timeout"
    wall_s: float
    sandboxed: bool  # every test ran inside bubblewrap (see sandbox.py)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def _same_line(got: str, expected: str) -> bool:
    if got == expected:
        return True
    got_numbers, expected_numbers = _decimals(got), _decimals(expected)
    if got_numbers is None or expected_numbers is None:
        return False
    try:
        return got_numbers == expected_numbers
    except InvalidOperation:  # a signalling NaN refuses comparison: not equal
        return False


def compare_stdout(got: str, expected: str) -> str | None:
    """None when `got` matches `expected` under lcb_runner's stdin rules, else what differs."""
    got_lines, expected_lines = _stripped_lines(got), _stripped_lines(expected)
    if len(got_lines) != len(expected_lines):
        return (
            f"expected {len(expected_lines)} lines, got {len(got_lines)}: "
            f"expected {_clip(expected.strip(), EXCERPT_CHARS)!r} got {_clip(got.strip(), EXCERPT_CHARS)!r}"
        )
    for n, (g, e) in enumerate(zip(got_lines, expected_lines, strict=True), start=1):
        if not _same_line(g, e):
            where = f"line {n}: " if len(expected_lines) > 1 else ""
            return f"{where}expected {_clip(e, EXCERPT_CHARS)!r} got {_clip(g, EXCERPT_CHARS)!r}"
    return None


def compare_functional(value: str | None, expected: str) -> str | None:
    """None when the returned value (JSON text, from the driver) equals the JSON `expected`."""
    if value is None:
        return "no return value (the program exited before the method returned)"
    try:
        same = json.loads(value) == json.loads(expected)
    except (ValueError, RecursionError, MemoryError) as err:
        return f"the return value could not be compared ({type(err).__name__})"
    if same:
        return None
    return f"expected {_clip(expected.strip(), EXCERPT_CHARS)!r} got {_clip(value, EXCERPT_CHARS)!r}"


def _failure_detail(run: RunResult) -> str:
    """The end of stderr (where a traceback names the exception), or the signal that killed it."""
    if run.returncode is None:  # the driver died (a program's doing, or the cgroup's memory bound)
        return SANDBOX_ENDED
    if run.returncode < 0:
        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-run.returncode}"
        head = f"killed by {name} (CPU-time or memory limit)" if name == "SIGKILL" else f"killed by {name}"
    else:
        head = f"exit status {run.returncode}"
    # The last lines that say something (not a traceback's ^~~~ markers), without indentation.
    tail = [line.strip() for line in run.stderr.split("\n") if line.strip().strip("^~ ")][-3:]
    if not tail:
        return head
    room = DETAIL_CHARS - len(head) - 2
    tail_text = "; ".join(tail)
    if len(tail_text) > room:  # keep the end, where the exception is named
        tail_text = "..." + tail_text[len(tail_text) - room + 3 :]
    return f"{head}; {tail_text}"


def _keep_bytes(test: TestCase, limits: SandboxLimits) -> int:
    # Room for any correct output, however small max_output_bytes is: a correct answer is never
    # cut. Applied outside the sandbox, which never learns how long the expected output is.
    return max(limits.max_output_bytes, 2 * len(test.output.encode("utf-8")) + 4096)


@functools.lru_cache(maxsize=1024)
def _value_chars(expected: str) -> int:
    """The longest returned value's JSON (as the driver writes it: json.dumps's defaults) that
    could equal the JSON `expected`: three times expected's own length in that spelling (an equal
    value may spell 1 as 1.0, true or -0.0), plus 4 KiB. Longer values are not parsed at all, so
    a value that marshal shares into millions of objects costs the grader nothing."""
    try:
        return 3 * len(json.dumps(json.loads(expected))) + 4096
    except (ValueError, RecursionError):
        return 3 * len(expected) + 4096


def _kept(run: RunResult, test: TestCase) -> RunResult:
    """What the grader keeps of a run until its tests are judged: a returned value no longer than
    one that could be equal, plus a character to show it was longer."""
    if test.testtype != "functional" or run.value is None:
        return run
    limit = _value_chars(test.output)
    return run if len(run.value) <= limit else dataclasses.replace(run, value=run.value[: limit + 1])


def _outcome(run: RunResult, test: TestCase, timeout_s: float) -> TestOutcome:
    """The judgement of one run; anything the comparison raises is the test's error, never the
    grader's."""
    try:
        return _judge(run, test, timeout_s)
    except Exception as err:  # noqa: BLE001 - a program's output must not crash the grader
        return TestOutcome("error", run.wall_s, f"the output could not be judged ({type(err).__name__})")


def _judge(run: RunResult, test: TestCase, timeout_s: float) -> TestOutcome:
    if run.status == "timeout":
        return TestOutcome("timeout", run.wall_s, f"no exit within {timeout_s:.3g} s")
    if run.status == "error":
        return TestOutcome("error", run.wall_s, _failure_detail(run))
    if run.stdout_truncated:
        return TestOutcome("wrong_answer", run.wall_s, f"output longer than {len(run.stdout)} bytes")
    if test.testtype == "functional":
        if run.value is not None and len(run.value) > (limit := _value_chars(test.output)):
            return TestOutcome(
                "wrong_answer", run.wall_s, f"return value longer than {limit} characters of JSON"
            )
        difference = compare_functional(run.value, test.output)
    else:
        difference = compare_stdout(run.stdout, test.output)
    if difference is None:
        return TestOutcome("passed", run.wall_s, "")
    return TestOutcome("wrong_answer", run.wall_s, _clip(difference, DETAIL_CHARS))


# Runs after which the later tests do not run. Both are the program's own doing (its time, its
# exit), never the comparison's: a program learns nothing it could not know, while a wrong answer,
# which only the expected output decides, never changes what runs next.
STOPS = {"timeout": "timed out", "error": "ended in an error"}
# A test outcome -> the program status it gives when it is the first test that did not pass.
VERDICT_OF = {"passed": "passed", "wrong_answer": "failed", "timeout": "timeout", "error": "error"}


def _check_tests(tests: Sequence[TestCase], func_name: str | None) -> None:
    if not tests:
        raise ValueError("grade_code needs at least one test")
    test_types = {t.testtype for t in tests}
    if len(test_types) != 1 or not test_types <= {"stdin", "functional"}:
        raise ValueError(f"tests of types {sorted(test_types)}: expected all stdin or all functional")
    if "functional" in test_types and not func_name:
        raise ValueError("functional tests need func_name (the Solution method to call)")


def key_of_tests(tests: Sequence[TestCase]) -> str:
    """A test set's question key: the hash of its inputs and expected outputs, in order."""
    text = json.dumps([[t.input, t.output] for t in tests], ensure_ascii=False)
    return "tests:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def grade_code(
    code: str,
    tests: Sequence[TestCase],
    *,
    func_name: str | None,
    cfg: GraderConfig,
    sandbox: Sandbox | None = None,
    question: str | None = None,
) -> Verdict:
    """Run `code` on `tests` in order, one sandboxed child per test, and judge each. A wrong answer
    never stops the tests; a timeout, an error or the program's spent time budget does.

    `sandbox`: one started ahead for this program (never loaded), which grade_code loads and
    closes; by default it starts its own. `question`: what the program is an attempt at (by
    default its tests): no other program of it runs on this host meanwhile (sandbox.QuestionLock)."""
    return _judged(_run_tests(code, tests, func_name, cfg, sandbox, question), tests, cfg)


@dataclass(frozen=True)
class _Ran:
    """A program's tests run, not yet judged: each test's run (None: skipped) and the verdict and
    detail its program gets when the budget or an earlier test decided it."""

    runs: list[tuple[RunResult | None, tuple[str, str] | None]]
    sandboxed: bool
    start: float


def _run_tests(
    code: str,
    tests: Sequence[TestCase],
    func_name: str | None,
    cfg: GraderConfig,
    sandbox: Sandbox | None,
    question: str | None,
) -> _Ran:
    """Every test of the program, run in order under its question's lock, nothing judged."""
    try:
        _check_tests(tests, func_name)
        # Held until every test has run: waiting for it is no part of the program's time budget.
        alone = QuestionLock(question or key_of_tests(tests))
    except BaseException:
        if sandbox is not None:
            sandbox.close()
        raise

    start = time.monotonic()
    budget_note = f"the program's {cfg.program_timeout_s:g} s budget ran out"
    # Every test runs before any is judged, and judging starts once the sandbox is closed and the
    # question's lock released: how long a comparison takes (it stops at the first line that
    # differs) is then nothing a program of this question can time, in its sandbox or the next.
    runs: list[tuple[RunResult | None, tuple[str, str] | None]] = []  # (run, (verdict, detail) set)
    skip: tuple[str, str] | None = None  # once set: (what a skipped test means, why it is skipped)
    limits = SandboxLimits.from_config(cfg)
    mode = tests[0].testtype
    box = sandbox
    sandboxed = True
    try:
        if box is not None:
            box.load(code, mode=mode, func_name=func_name)
            sandboxed = box.sandboxed
        for test in tests:
            remaining = cfg.program_timeout_s - (time.monotonic() - start)
            if skip is None and remaining <= 0:
                skip = ("program_timeout", f"not run: {budget_note}")
            if skip is not None:
                runs.append((None, skip))
                continue
            if box is None or not box.alive:  # a program can end its sandbox: the next test gets a new one
                if box is not None:
                    box.close()
                box = Sandbox(code, mode=mode, limits=limits, func_name=func_name)
                sandboxed = sandboxed and box.sandboxed
            remaining = cfg.program_timeout_s - (time.monotonic() - start)
            timeout = max(0.0, min(cfg.test_timeout_s, remaining))
            run = _kept(box.run(test.input, timeout_s=timeout, keep_bytes=_keep_bytes(test, limits)), test)
            if run.status == "timeout" and timeout < cfg.test_timeout_s:
                # Cut short by the program's budget, not by its own bound.
                runs.append((run, ("program_timeout", f"cut short: {budget_note}")))
                skip = ("program_timeout", f"not run: {budget_note}")
            else:
                runs.append((run, None))
                if run.status in STOPS:
                    skip = ("skipped", f"not run: an earlier test {STOPS[run.status]}")
    finally:
        if box is not None:
            box.close()
        alone.release()
    return _Ran(runs, sandboxed, start)


def _judged(ran: _Ran, tests: Sequence[TestCase], cfg: GraderConfig) -> Verdict:
    """The verdict of a program's runs, judged once its sandbox is closed and its lock released."""
    outcomes: list[TestOutcome] = []
    verdict_of_test: list[str] = []  # what each test means for the whole program
    for test, (run, note) in zip(tests, ran.runs, strict=True):
        if run is None:
            outcomes.append(TestOutcome("skipped", 0.0, note[1]))
            verdict_of_test.append(note[0])
            continue
        outcome = _outcome(run, test, cfg.test_timeout_s)  # the configured bound, not the remainder
        if note is not None:
            outcome = dataclasses.replace(outcome, detail=note[1])
        verdict_of_test.append(VERDICT_OF[outcome.status] if note is None else note[0])
        outcomes.append(outcome)

    passed = sum(o.status == "passed" for o in outcomes)
    status = next((v for v in verdict_of_test if v != "passed"), "passed")
    return Verdict(
        passed=passed,
        total=len(tests),
        tests=outcomes,
        status=status,
        wall_s=time.monotonic() - ran.start,
        sandboxed=ran.sandboxed,
    )


def grade_many(
    jobs: Sequence[tuple[str, Sequence[TestCase], str | None]], *, cfg: GraderConfig
) -> list[Verdict]:
    """Grade (code, tests, func_name) jobs, `cfg.workers` at a time; verdicts in input order.

    Each worker starts the sandbox of its next program before it grades the present one, so that
    a sandbox's start (bwrap, the interpreter, lcb_runner's imports) overlaps with grading. A
    sandbox started ahead runs one program like any other; the worker's thread starts it, so it
    dies with that thread, and one a worker ends up not needing is closed before grade_many
    returns."""
    jobs = list(jobs)
    ran: list[_Ran | None] = [None] * len(jobs)
    claimed = iter(range(len(jobs)))  # next() on a range iterator is atomic under the GIL
    limits = SandboxLimits.from_config(cfg)

    def worker() -> None:
        ahead: Sandbox | None = None
        try:
            for n in claimed:
                box, ahead = ahead, None
                if n + cfg.workers < len(jobs):  # a job is left for this worker, very likely
                    ahead = Sandbox(mode="stdin", limits=limits)
                code, tests, name = jobs[n]
                ran[n] = _run_tests(code, tests, name, cfg, box, None)
        finally:
            if ahead is not None:
                ahead.close()

    with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="lcb-grader") as pool:
        for future in [pool.submit(worker) for _ in range(min(cfg.workers, len(jobs)))]:
            future.result()
    # Judged once every program has run: a worker's next program never waits for the last one's
    # comparisons, which would time them for it.
    return [_judged(r, tests, cfg) for r, (_, tests, _) in zip(ran, jobs, strict=True)]


LABELS = {"wrong_answer": "wrong answer", "timeout": "timeout", "error": "error", "skipped": "skipped"}


def summarize(verdict: Verdict, max_chars: int) -> str:
    """What the policy is shown: the count, then the first test that did not pass and why."""
    text = f"{verdict.passed}/{verdict.total} tests passed"
    for n, outcome in enumerate(verdict.tests, start=1):
        if outcome.status != "passed":
            text += f"; test {n}: {LABELS[outcome.status]}: {outcome.detail}"
            break
    return _clip(text, max_chars)
