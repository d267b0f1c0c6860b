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
with an empty scratch folder. Only a timeout or an error, which the program itself decides, ends
its tests. One sandbox per program: its driver starts once and runs each test in a child
(sandbox.py, driver.py); test inputs go in one at a time and expected outputs never do. Bounds:
`test_timeout_s` per test, and `program_timeout_s` for all tests of the program together; a test
the shrinking budget cuts short counts as a program timeout, and tests it leaves no time for are
skipped.

Whatever a program returns or prints, judging it never raises: a value that cannot be compared is
that test's error, and a driver that died is the verdict "the sandbox ended".
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
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


def _number_key(token: str) -> str | None:
    """One spelling per Decimal value (1, 1.0, 1e0 and 10E-1 alike); None for a token that is not a
    number or is a NaN, which equals nothing."""
    try:
        number = Decimal(token)
    except InvalidOperation:
        return None
    if number.is_nan():
        return None
    if number.is_infinite():
        return "-inf" if number.is_signed() else "inf"
    sign, digits, exponent = number.as_tuple()
    text = "".join(map(str, digits))
    kept = text.rstrip("0")
    if not kept:
        return "0"  # -0 equals 0
    return f"{'-' if sign else ''}{kept}e{exponent + len(text) - len(kept)}"


def _line_keys(line: str) -> tuple[bytes, bytes | None]:
    """A line's digest as text, and as its list of numbers (None unless every token is one)."""
    keys = [_number_key(token) for token in line.split()]
    numbers = None if None in keys else hashlib.sha256("\0".join(keys).encode()).digest()  # type: ignore[arg-type]
    return hashlib.sha256(line.encode("utf-8", "surrogatepass")).digest(), numbers


def _same(a: bytes | None, b: bytes | None) -> bool:
    equal = hmac.compare_digest(a or b"\0", b or b"\1")  # compared even when one side is no number
    return equal and a is not None and b is not None


@functools.lru_cache(maxsize=1024)
def _expected_lines(expected: str) -> tuple[list[str], list[tuple[bytes, bytes | None]]]:
    """An expected output's stripped lines and their keys: read once per test set (before its
    programs run), so judging a program costs what its own output costs, plus the line counts."""
    lines = _stripped_lines(expected)
    return lines, [_line_keys(e) for e in lines]


# Judging takes the same work whether an output is right or wrong: every line of both texts is read
# as text and as numbers, every pair of lines compared as digests, no comparison stops early, and
# both excerpts of a message are made before it is known which is needed. How long judging takes
# then depends on the two texts' sizes, never on whether or where they differ: a program of the
# question graded next cannot time it into a verdict.
def compare_stdout(got: str, expected: str) -> str | None:
    """None when `got` matches `expected` under lcb_runner's stdin rules, else what differs: each
    line, stripped, equal as text or as a list of Decimals."""
    got_lines, (expected_lines, expected_keys) = _stripped_lines(got), _expected_lines(expected)
    got_keys = [_line_keys(g) for g in got_lines]
    differs = [
        not (_same(g[0], e[0]) | _same(g[1], e[1])) for g, e in zip(got_keys, expected_keys, strict=False)
    ]
    excerpts = _clip(expected.strip(), EXCERPT_CHARS), _clip(got.strip(), EXCERPT_CHARS)
    if len(got_lines) != len(expected_lines):
        return f"expected {len(expected_lines)} lines, got {len(got_lines)}: expected {excerpts[0]!r} got {excerpts[1]!r}"
    wrong = [n for n, d in enumerate(differs) if d]  # every line looked at, wrong or not
    if not wrong:
        return None
    n = wrong[0]
    where = f"line {n + 1}: " if len(expected_lines) > 1 else ""
    return f"{where}expected {_clip(expected_lines[n], EXCERPT_CHARS)!r} got {_clip(got_lines[n], EXCERPT_CHARS)!r}"


def _normal(value):
    """A JSON value as Python's == sees it: bools and integral floats as ints (True == 1 == 1.0,
    1e22 == 10**22, -0.0 == 0), any other float as itself."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _canonical(text: str) -> str:
    """One spelling of the JSON `text` per value as Python's == sees it (keys sorted)."""
    return json.dumps(_normal(json.loads(text)), sort_keys=True)


@functools.lru_cache(maxsize=1024)
def _expected_canonical(expected: str) -> str:
    return _canonical(expected)


def compare_functional(value: str | None, expected: str) -> str | None:
    """None when the returned value (JSON text, from the driver) equals the JSON `expected` as
    Python's == sees them, compared as digests of one spelling each (see compare_stdout)."""
    if value is None:
        return "no return value (the program exited before the method returned)"
    excerpts = _clip(expected.strip(), EXCERPT_CHARS), _clip(value, EXCERPT_CHARS)
    try:
        got, want = _canonical(value), _expected_canonical(expected)
    except (ValueError, RecursionError, MemoryError) as err:
        return f"the return value could not be compared ({type(err).__name__})"
    digests = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest() for t in (got, want)]
    if hmac.compare_digest(*digests):
        return None
    return f"expected {excerpts[0]!r} got {excerpts[1]!r}"


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
    # Room for a correct output written as the expected one is, however small max_output_bytes is
    # (one spelled much longer, a number with 20 decimals for a digit, is cut: a wrong answer).
    # Applied outside the sandbox, and worked out before the program runs.
    return max(limits.max_output_bytes, 2 * len(test.output.encode("utf-8")) + 4096)


@functools.lru_cache(maxsize=1024)
def _value_chars(expected: str) -> int:
    """The longest returned value's JSON (as the driver writes it: json.dumps's defaults) that
    could equal the JSON `expected`: three times the length of expected's spelling with integral
    numbers as integers (an equal value may spell 1 as 1.0, true or -0.0, and 1e22 as 10**22's
    digits), plus 4 KiB. Longer values are not parsed at all, so a value that marshal shares into
    millions of objects costs the grader nothing."""
    try:
        return 3 * len(_expected_canonical(expected)) + 4096
    except (ValueError, RecursionError, MemoryError):
        return 3 * len(expected) + 4096


def _outcome(
    run: RunResult, test: TestCase, timeout_s: float, keep: int | None = None, value_too_long: bool = False
) -> TestOutcome:
    """The judgement of one run; anything the comparison raises is the test's error, never the
    grader's. `keep`: the test's own bound on stdout, for a run that kept more, undecoded;
    `value_too_long`: the returned value was longer than any equal one, and was dropped unread."""
    try:
        return _judge(run, test, timeout_s, keep, value_too_long)
    except Exception as err:  # noqa: BLE001 - a program's output must not crash the grader
        return TestOutcome("error", run.wall_s, f"the output could not be judged ({type(err).__name__})")


def _judge(
    run: RunResult, test: TestCase, timeout_s: float, keep: int | None, value_too_long: bool
) -> TestOutcome:
    if run.status == "timeout":
        return TestOutcome("timeout", run.wall_s, f"no exit within {timeout_s:.3g} s")
    if run.status == "error":
        return TestOutcome("error", run.wall_s, _failure_detail(run))
    stdout, truncated, kept = run.stdout, run.stdout_truncated, len(run.stdout)
    if run.stdout_bytes is not None:  # kept to the program's largest bound, decoded only now
        kept = len(run.stdout_bytes) if keep is None else keep
        stdout = run.stdout_bytes[:kept].decode("utf-8", errors="replace")
        truncated = truncated or len(run.stdout_bytes) > kept
    if truncated:
        return TestOutcome("wrong_answer", run.wall_s, f"output longer than {kept} bytes")
    if test.testtype == "functional":
        if value_too_long:
            limit = _value_chars(test.output)
            return TestOutcome(
                "wrong_answer", run.wall_s, f"return value longer than {limit} characters of JSON"
            )
        difference = compare_functional(run.value, test.output)
    else:
        difference = compare_stdout(stdout, test.output)
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
    default its tests): no other program of it runs on this host meanwhile (sandbox.QuestionLock),
    from before its first test until its verdict is made."""
    try:
        _check_tests(tests, func_name)
        alone = QuestionLock(question or key_of_tests(tests))
    except BaseException:
        if sandbox is not None:
            sandbox.close()
        raise
    try:
        return _judged(_run_tests(code, tests, func_name, cfg, sandbox), tests, cfg)
    finally:
        alone.release()


@dataclass(frozen=True)
class _TestRun:
    """One test of a program, run but not yet judged."""

    run: RunResult | None  # None: not run
    # (the program's verdict, the detail) when the budget or an earlier test decided it
    note: tuple[str, str] | None
    keep: int  # the test's own bound on stdout
    value_too_long: bool  # the returned value was longer than any equal one, and was dropped unread


@dataclass(frozen=True)
class _Ran:
    tests: list[_TestRun]
    sandboxed: bool
    start: float


def _run_tests(
    code: str, tests: Sequence[TestCase], func_name: str | None, cfg: GraderConfig, sandbox: Sandbox | None
) -> _Ran:
    """Every test of the program, run in order, nothing judged; the sandbox is closed on return.

    Judging waits until every test has run and the sandbox is closed, and the bounds that depend on
    the expected outputs are worked out before the program runs: between two tests the grader does
    no work that depends on an expected output (stdout is kept to the program's largest bound and
    decoded later), so no test can time it."""
    start = time.monotonic()
    budget_note = f"the program's {cfg.program_timeout_s:g} s budget ran out"
    limits = SandboxLimits.from_config(cfg)
    mode = tests[0].testtype
    keeps = [_keep_bytes(t, limits) for t in tests]
    kept = max(keeps)  # what a run keeps of stdout: each test is judged against its own bound
    values = [_value_chars(t.output) if mode == "functional" else 0 for t in tests]
    if mode == "stdin":
        for t in tests:
            _expected_lines(t.output)  # read now, not while judging: see _expected_lines
    done: list[_TestRun] = []
    skip: tuple[str, str] | None = None  # once set: (what a skipped test means, why it is skipped)
    box = sandbox
    sandboxed = True
    try:
        if box is not None:
            box.load(code, mode=mode, func_name=func_name)
            sandboxed = box.sandboxed
        for test, keep, value_chars in zip(tests, keeps, values, strict=True):
            remaining = cfg.program_timeout_s - (time.monotonic() - start)
            if skip is None and remaining <= 0:
                skip = ("program_timeout", f"not run: {budget_note}")
            if skip is not None:
                done.append(_TestRun(None, skip, keep, False))
                continue
            if box is None or not box.alive:  # a program can end its sandbox: the next test gets a new one
                if box is not None:
                    box.close()
                box = Sandbox(code, mode=mode, limits=limits, func_name=func_name)
                sandboxed = sandboxed and box.sandboxed
            remaining = cfg.program_timeout_s - (time.monotonic() - start)
            timeout = max(0.0, min(cfg.test_timeout_s, remaining))
            run = box.run(test.input, timeout_s=timeout, keep_bytes=kept, text=False)
            too_long = run.value is not None and len(run.value) > value_chars
            if too_long:
                run = dataclasses.replace(run, value=None)
            note = None
            if run.status == "timeout" and timeout < cfg.test_timeout_s:
                # Cut short by the program's budget, not by its own bound.
                note = ("program_timeout", f"cut short: {budget_note}")
                skip = ("program_timeout", f"not run: {budget_note}")
            elif run.status in STOPS:
                skip = ("skipped", f"not run: an earlier test {STOPS[run.status]}")
            done.append(_TestRun(run, note, keep, too_long))
    finally:
        if box is not None:
            box.close()
    return _Ran(done, sandboxed, start)


def _judged(ran: _Ran, tests: Sequence[TestCase], cfg: GraderConfig) -> Verdict:
    """The verdict of a program's runs, judged once its sandbox is closed."""
    outcomes: list[TestOutcome] = []
    verdict_of_test: list[str] = []  # what each test means for the whole program
    for test, one in zip(tests, ran.tests, strict=True):
        if one.run is None:
            outcomes.append(TestOutcome("skipped", 0.0, one.note[1]))
            verdict_of_test.append(one.note[0])
            continue
        # the configured bound, not the remainder
        outcome = _outcome(one.run, test, cfg.test_timeout_s, one.keep, one.value_too_long)
        if one.note is not None:
            outcome = dataclasses.replace(outcome, detail=one.note[1])
        verdict_of_test.append(VERDICT_OF[outcome.status] if one.note is None else one.note[0])
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
    verdicts: list[Verdict | None] = [None] * len(jobs)
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
                verdicts[n] = grade_code(code, tests, func_name=name, cfg=cfg, sandbox=box)
        finally:
            if ahead is not None:
                ahead.close()

    with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="lcb-grader") as pool:
        for future in [pool.submit(worker) for _ in range(min(cfg.workers, len(jobs)))]:
            future.result()
    return verdicts


LABELS = {"wrong_answer": "wrong answer", "timeout": "timeout", "error": "error", "skipped": "skipped"}


def summarize(verdict: Verdict, max_chars: int) -> str:
    """What the policy is shown: the count, then the first test that did not pass and why."""
    text = f"{verdict.passed}/{verdict.total} tests passed"
    for n, outcome in enumerate(verdict.tests, start=1):
        if outcome.status != "passed":
            text += f"; test {n}: {LABELS[outcome.status]}: {outcome.detail}"
            break
    return _clip(text, max_chars)
