"""The graders on real programs in real sandboxed subprocesses: correct, wrong and hostile ones.

Every hostile program is followed by a containment check: no process of this test process's
sandboxes is alive (other graders on the machine are not counted), no scratch folder is left, and
the test process has no zombie child. Tests of containment need bubblewrap: they skip where it
cannot start, and fail instead under ATLAS_REQUIRE_ISOLATION=1 (CI). The attacks themselves are in
test_sandbox_attacks.py.
"""

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from atlas.config.graders import GraderConfig
from atlas.data.lcb import read_lcb
from atlas.data.schema import TestCase as Case  # not `Test*`: pytest would collect it
from atlas.graders import lcb, sandbox
from atlas.graders.gpqa import grade_letter
from atlas.graders.lcb import compare_stdout, grade_code, grade_many, summarize
from atlas.graders.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    isolation_available,
    isolation_problem,
    run_program,
    sandboxed_processes,
)
from conftest import FIXTURES, REPO, read_jsonl, require_bubblewrap

CFG = GraderConfig(test_timeout_s=1.0, program_timeout_s=10.0, max_output_bytes=4096)
LIMITS = SandboxLimits.from_config(CFG)
TRAIN = read_lcb(FIXTURES / "lcb_train.jsonl", "train")
VAL = read_lcb(FIXTURES / "lcb_val.jsonl", "val")
QUESTIONS = {q.record_id: q for q in TRAIN + VAL}
SOLUTIONS = json.loads((FIXTURES / "lcb_solutions.json").read_text(encoding="utf-8"))
REQUIRE_ISOLATION = os.environ.get("ATLAS_REQUIRE_ISOLATION") == "1"


@pytest.fixture
def sandboxed():
    """Containment tests: they need bubblewrap, and under ATLAS_REQUIRE_ISOLATION=1 its absence
    is a failure."""
    if not isolation_available():
        if REQUIRE_ISOLATION:
            pytest.fail(f"ATLAS_REQUIRE_ISOLATION=1 but bubblewrap cannot start: {isolation_problem()}")
        pytest.skip(f"bubblewrap cannot start here: {isolation_problem()}")


SUM_MOD_3 = QUESTIONS["abc300_a"]  # stdin: print (A_1 + ... + A_N) mod 3
COUNT_PAIRS = QUESTIONS["9003"]  # functional: countPairs(nums) = #pairs i<j with nums[i]+nums[j] > 6


def all_tests(question):
    return question.public_tests + question.private_tests


@pytest.fixture
def scratch_root(tmp_path, monkeypatch):
    """The runs of this test make their scratch directories here (tempfile.tempdir)."""
    root = tmp_path / "scratch"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def assert_contained(root: Path, result=None) -> None:
    assert sandboxed_processes() == []
    assert os.listdir(root) == []  # every scratch directory was removed
    try:
        assert os.waitpid(-1, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        pass  # no children at all: nothing to reap


# --- correct programs ---------------------------------------------------------------------------


def test_reference_solutions_pass_every_test(scratch_root):
    questions = TRAIN + VAL
    assert {q.test_type for q in questions} == {"stdin", "functional"}
    # Train problems on all their tests, validation problems on their public tests (time).
    jobs = [(SOLUTIONS[q.record_id], all_tests(q), q.func_name) for q in TRAIN]
    jobs += [(SOLUTIONS[q.record_id], q.public_tests, q.func_name) for q in VAL]
    verdicts = grade_many(jobs, cfg=CFG)
    for (_, tests, _), q, v in zip(jobs, questions, verdicts, strict=True):
        assert v.status == "passed", (q.record_id, v)
        assert v.passed == v.total == len(tests) and [t.status for t in v.tests] == ["passed"] * len(tests)
    assert_contained(scratch_root)


def test_every_verdict_says_it_was_sandboxed(sandboxed, scratch_root):
    tests = all_tests(SUM_MOD_3)
    verdicts = grade_many([(SOLUTIONS["abc300_a"], tests, None), ("print(1)", tests, None)], cfg=CFG)
    assert [(v.status, v.sandboxed) for v in verdicts] == [("passed", True), ("failed", True)]
    r = run_program(
        "import os\nprint(os.getuid(), os.getgid(), open('/proc/self/status').read())", limits=LIMITS
    )
    uid, gid, status = r.stdout.split(" ", 2)
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert (uid, gid, r.sandboxed) == ("65534", "65534", True)
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"
    assert_contained(scratch_root)


def test_limits_come_from_the_config():
    cfg = GraderConfig(test_timeout_s=2.5, memory_mb=512, cpu_s=3, file_size_mb=2, open_files=32)
    cfg = cfg.model_copy(update={"max_processes": 7, "scratch_mb": 9, "sandbox_uid_base": 3000})
    assert SandboxLimits.from_config(cfg) == SandboxLimits(
        timeout_s=2.5,
        memory_mb=512,
        cpu_s=3,
        file_size_mb=2,
        open_files=32,
        max_output_bytes=cfg.max_output_bytes,
        max_processes=7,
        scratch_mb=9,
        uid_base=3000,
    )
    assert SandboxLimits.from_config(cfg, timeout_s=0.5).timeout_s == 0.5


def test_a_plain_run_reads_stdin_and_gets_a_clean_environment(scratch_root):
    code = "import os, sys\nprint(input()[::-1])\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])"
    r = run_program(code, "abc\n", limits=LIMITS)
    assert r.status == "ok" and r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0] == "cba"
    # Only the scrubbed variables (LC_CTYPE is set by Python for the C.UTF-8 locale, PWD by bwrap).
    assert set(eval(lines[1])) - {"LC_CTYPE", "PWD"} == {"HOME", "LANG", "PATH", "PYTHONHASHSEED", "TMPDIR"}
    assert lines[2] == "True"
    assert not r.stdout_truncated
    assert_contained(scratch_root, r)


def test_concurrent_runs_share_nothing(scratch_root):
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda i: run_program("print(int(input()) * 2)", f"{i}\n", limits=LIMITS), range(16))
        )
    assert [r.stdout for r in results] == [f"{2 * i}\n" for i in range(16)]
    assert_contained(scratch_root)


# --- wrong answers and comparison rules --------------------------------------------------------


def test_every_test_runs_after_a_wrong_answer_and_the_first_failure_is_the_verdict(scratch_root):
    wrong = "input()\nprint(sum(map(int, input().split())) % 3 + 1)\n"  # never the right residue
    v = grade_code(wrong, all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    assert (v.status, v.passed, v.total) == ("failed", 0, 5)
    assert v.tests[0].status == "wrong_answer" and v.tests[0].detail == "expected '0' got '1'"
    # What runs never depends on a verdict: the later tests run, and are judged, all the same.
    assert [t.status for t in v.tests] == ["wrong_answer"] * 5
    assert summarize(v, 200) == "0/5 tests passed; test 1: wrong answer: expected '0' got '1'"

    # A program right on some tests is counted test by test; the first failure gives the status.
    zero = "print(0)"
    v = grade_code(zero, all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    expected = [t.output.strip() == "0" for t in all_tests(SUM_MOD_3)]
    assert 0 < sum(expected) < 5  # the fixture has tests both ways, so this can fail
    assert [t.status == "passed" for t in v.tests] == expected
    assert v.passed == sum(expected) and v.status == "failed"
    assert_contained(scratch_root)


def test_functional_wrong_answer_and_missing_method(scratch_root):
    tests = all_tests(COUNT_PAIRS)
    wrong = "class Solution:\n    def countPairs(self, nums):\n        return -1\n"
    v = grade_code(wrong, tests, func_name="countPairs", cfg=CFG)
    assert v.status == "failed"
    assert v.tests[0].detail == f"expected {tests[0].output!r} got '-1'"

    renamed = "class Solution:\n    def count(self, nums):\n        return 0\n"
    v = grade_code(renamed, tests, func_name="countPairs", cfg=CFG)
    assert v.status == "error"
    assert v.tests[0].detail == "exit status 1; class Solution has no method countPairs"
    v = grade_code("def countPairs(nums):\n    return 0\n", tests, func_name="countPairs", cfg=CFG)
    assert v.status == "error" and v.tests[0].detail == "exit status 1; the program defines no class Solution"
    assert_contained(scratch_root)


def test_stdout_lines_compare_stripped_and_as_decimals(scratch_root):
    tests = [Case("stdin", "", "0.5\n1e2 3\n")]
    for output, status in [
        ("0.50\n100   3.0", "passed"),  # numbers equal as Decimals, spacing differs
        ("\n\n  0.5  \n1e2 3   \n\n", "passed"),  # blank lines around and spaces at ends are stripped
        ("0.51\n100 3", "failed"),
        ("0.5\n100", "failed"),
        ("0.5", "failed"),
    ]:
        v = grade_code(f"print({output!r})", tests, func_name=None, cfg=CFG)
        assert v.status == status, (output, v)
    assert compare_stdout("0.51\n100 3", "0.5\n1e2 3") == "line 1: expected '0.5' got '0.51'"
    assert compare_stdout("Yes", "yes") == "expected 'yes' got 'Yes'"  # words compare as text
    assert compare_stdout("1 a", "1.0 a") == "expected '1.0 a' got '1 a'"  # every token must be a number
    assert compare_stdout("1\n2", "1") == "expected 1 lines, got 2: expected '1' got '1\\n2'"
    assert compare_stdout("NaN", "NaN") is None  # equal as text, before any Decimal
    assert compare_stdout("sNaN 1", "sNaN 1.0") is not None  # a signalling NaN never compares equal
    assert_contained(scratch_root)


def test_functional_results_compare_tuples_as_lists(scratch_root):
    tests = [Case("functional", "[1, 2]\n3", "[3, 1, 2]"), Case("functional", "[]\n5", "[5]")]
    method = "class Solution:\n    def push(self, nums, x):\n        return {}\n"
    for body, status in [
        ("tuple([x] + nums)", "passed"),
        ("[x] + nums", "passed"),
        ("nums + [x]", "failed"),
        ("{x, *nums}", "error"),  # a set is not JSON: the driver says so
    ]:
        v = grade_code(method.format(body), tests, func_name="push", cfg=CFG)
        assert v.status == status, (body, v)
    nested = [Case("functional", "2", "[[0, 0], [1, 1]]")]
    code = "class Solution:\n    def pairs(self, n):\n        return tuple((i, i) for i in range(n))\n"
    assert grade_code(code, nested, func_name="pairs", cfg=CFG).status == "passed"
    # What the method prints is not its value; anything printed after it returned is an error.
    chatty = "class Solution:\n    def pairs(self, n):\n        print('[[0, 0], [1, 1]]', end='')\n        return []\n"
    assert grade_code(chatty, nested, func_name="pairs", cfg=CFG).status == "failed"
    mimic = "import atexit\natexit.register(print, '[[0, 0], [1, 1]]')\n" + code
    v = grade_code(mimic, nested, func_name="pairs", cfg=CFG)
    assert v.status == "error" and v.tests[0].detail.endswith("wrote to stdout after the method returned")
    nan = "class Solution:\n    def pairs(self, n):\n        return [float('nan')]\n"
    v = grade_code(nan, nested, func_name="pairs", cfg=CFG)
    assert v.status == "error" and "not JSON-serialisable" in v.tests[0].detail
    exits = "import sys\nclass Solution:\n    def pairs(self, n):\n        sys.exit(0)\n"
    v = grade_code(exits, nested, func_name="pairs", cfg=CFG)
    assert v.status == "failed" and v.tests[0].detail.startswith("no return value")
    assert_contained(scratch_root)


# --- failing and hostile programs --------------------------------------------------------------


def test_timeout_kills_a_sleeper_within_the_bound(scratch_root):
    v = grade_code("import time\ntime.sleep(30)", all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    assert v.status == "timeout" and v.tests[0].status == "timeout"
    assert [t.status for t in v.tests[1:]] == ["skipped"] * 4
    assert CFG.test_timeout_s <= v.wall_s < CFG.test_timeout_s + 1
    r = run_program("import time\ntime.sleep(30)", limits=LIMITS)
    assert (r.status, r.returncode) == ("timeout", None)
    assert LIMITS.timeout_s <= r.wall_s < LIMITS.timeout_s + 1
    assert_contained(scratch_root, r)


def test_infinite_loop_times_out(scratch_root):
    r = run_program("while True:\n    pass", limits=LIMITS)
    assert r.status == "timeout" and LIMITS.timeout_s <= r.wall_s < LIMITS.timeout_s + 1
    assert_contained(scratch_root, r)
    # The CPU-time limit ends a busy program even when the wall-clock bound is longer.
    cpu_bound = SandboxLimits.from_config(GraderConfig(cpu_s=1), timeout_s=10.0)
    r = run_program("while True:\n    pass", limits=cpu_bound)
    assert (r.status, r.returncode) == ("error", -9) and r.wall_s < 3
    v = grade_code(
        "while True:\n    pass", [Case("stdin", "", "1")], func_name=None, cfg=GraderConfig(cpu_s=1)
    )
    assert v.status == "error" and v.tests[0].detail.startswith(
        "killed by SIGKILL (CPU-time or memory limit)"
    )
    assert_contained(scratch_root, r)


def test_crash_and_syntax_error_are_errors_with_their_message(scratch_root):
    v = grade_code("raise ValueError('boom 42')", all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    assert v.status == "error" and v.tests[0].status == "error"
    assert v.tests[0].detail == (
        "exit status 1; File \"solution.py\", line 1, in <module>; raise ValueError('boom 42'); ValueError: boom 42"
    )

    v = grade_code("def f(:\n    pass\n", all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    assert v.status == "error"
    assert (
        v.tests[0].detail == 'exit status 1; File "solution.py", line 1; def f(:; SyntaxError: invalid syntax'
    )
    assert summarize(v, 300).startswith("0/5 tests passed; test 1: error: exit status 1; ")

    segfault = run_program("import ctypes\nctypes.string_at(0)", limits=LIMITS)
    assert (segfault.status, segfault.returncode) == ("error", -11)
    v = grade_code("import ctypes\nctypes.string_at(0)", [Case("stdin", "", "1")], func_name=None, cfg=CFG)
    assert v.status == "error" and v.tests[0].detail == "killed by SIGSEGV"

    method_raises = "class Solution:\n    def countPairs(self, nums):\n        return nums[99]\n"
    v = grade_code(method_raises, all_tests(COUNT_PAIRS), func_name="countPairs", cfg=CFG)
    assert v.status == "error" and v.tests[0].detail.endswith("IndexError: list index out of range")
    assert_contained(scratch_root)


def test_fork_bomb_is_killed_whole_and_the_parent_stays_healthy(sandboxed, scratch_root):
    r = run_program("import os\nwhile True:\n    os.fork()", limits=LIMITS)
    # The process count bound stops the bomb (fork fails: an error) unless the time bound is first.
    assert r.status in {"timeout", "error"} and r.wall_s < LIMITS.timeout_s + 0.5
    assert_contained(scratch_root, r)
    after = run_program("print('still fine')", limits=LIMITS)
    assert after.status == "ok" and after.stdout == "still fine\n"
    assert_contained(scratch_root, after)


def test_background_processes_die_with_the_run(scratch_root):
    code = "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('started')"
    r = run_program(code, limits=LIMITS)
    assert r.status == "ok" and r.stdout == "started\n"
    assert r.wall_s < 1  # the run ends with its main process, not with the sleeper holding its pipes
    assert_contained(scratch_root, r)


def test_a_process_that_leaves_the_group_dies_with_the_namespace(sandboxed, scratch_root):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('parent done')"
    r = run_program(code, limits=LIMITS)
    assert r.status == "ok" and r.stdout == "parent done\n" and r.wall_s < 1
    assert_contained(scratch_root, r)


def test_memory_hog_gets_a_memory_error(scratch_root):
    hog = "x = bytearray(4 * 2**30)\nprint(len(x))"
    r = run_program(hog, limits=LIMITS)
    assert r.status == "error" and r.returncode == 1 and r.stderr.strip().endswith("MemoryError")
    v = grade_code(hog, [Case("stdin", "", "4294967296")], func_name=None, cfg=CFG)
    assert v.status == "error" and v.tests[0].detail.endswith("MemoryError")
    assert r.wall_s < 1
    assert_contained(scratch_root, r)


def test_output_flood_is_capped_while_read(scratch_root):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_program("while True:\n    print('x' * 1000)", limits=LIMITS)
    assert r.status == "timeout" and r.wall_s < LIMITS.timeout_s + 1
    assert r.stdout_truncated and len(r.stdout) == LIMITS.max_output_bytes == 4096
    assert_contained(scratch_root, r)
    # 200 MB on each stream, written at once: the run completes, 4 KiB of each is kept.
    big = "import sys\nblock = 'y' * 2**20\nfor _ in range(200):\n    sys.stdout.write(block)\n    sys.stderr.write(block)"
    r = run_program(big, limits=SandboxLimits.from_config(CFG, timeout_s=10.0))
    assert r.status == "ok" and r.stdout_truncated and r.stderr_truncated
    assert r.stdout == r.stderr == "y" * 4096
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024  # far below the 400 MB the program wrote
    assert_contained(scratch_root, r)
    v = grade_code("while True:\n    print(0)", [Case("stdin", "", "0")], func_name=None, cfg=CFG)
    assert v.status == "timeout"
    v = grade_code("print('0\\n' * 10**6)", [Case("stdin", "", "0")], func_name=None, cfg=CFG)
    assert v.status == "failed" and v.tests[0].detail.startswith("output longer than")
    assert_contained(scratch_root)


def test_no_network_inside_the_sandbox(sandboxed, scratch_root):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = (
        "import socket\n"
        "for host in ('127.0.0.1', '1.1.1.1'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2).close()\n"
        "        print(host, 'connected')\n"
        "    except OSError as err:\n"
        "        print(host, 'failed', err.errno)\n"
    )
    try:
        # The same probe outside the sandbox reaches the local server: the check can fail.
        outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
        assert outside.stdout.splitlines()[0] == "127.0.0.1 connected"
        server.accept()[0].close()
        r = run_program(probe, limits=LIMITS)
        assert r.status == "ok" and r.sandboxed
        lines = r.stdout.splitlines()
        assert lines[0].startswith("127.0.0.1 failed") and lines[1].startswith("1.1.1.1 failed")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing from the sandbox ever arrived
    finally:
        server.close()
    assert r.wall_s < 1  # refused at once, not after a connect timeout
    assert_contained(scratch_root, r)


def test_writes_outside_the_scratch_dir_are_refused(sandboxed, tmp_path, scratch_root):
    """Outside its private /tmp the file system is read-only to a program, and the host's folders
    are not there at all."""
    outside = tmp_path / "outside.txt"
    r = run_program(f"open({str(outside)!r}, 'w').write('written from the sandbox')", limits=LIMITS)
    assert r.status == "error" and "No such file or directory" in r.stderr
    r = run_program("open('/usr/atlas-probe', 'w')", limits=LIMITS)
    assert r.status == "error" and "Read-only file system" in r.stderr
    assert not outside.exists() and not Path("/usr/atlas-probe").exists()
    inside = run_program("open('note.txt', 'w').write('ok')\nprint(open('note.txt').read())", limits=LIMITS)
    assert (inside.status, inside.stdout) == ("ok", "ok\n")
    assert_contained(scratch_root, r)


def test_the_workflow_and_the_packages_are_not_there(sandboxed, scratch_root):
    """Answers and private tests live under the grader's working directory, the project's code in
    its venv: neither is in the sandbox."""
    probe = "import os, sys\nfor p in sys.argv[1:] or %r:\n    print(os.path.exists(p), os.listdir(p) if os.path.isdir(p) else None)"
    paths = [str(REPO), sys.prefix, *__import__("site").getsitepackages()]
    r = run_program(probe % (paths,), limits=LIMITS)
    lines = r.stdout.splitlines()
    assert lines[0] == "False None" and lines[1] == "False None"  # the repository, the venv
    assert all(line in ("False None", "True []") for line in lines[2:])  # site-packages: empty
    assert (REPO / "pyproject.toml").is_file()  # hidden from the program only
    assert_contained(scratch_root)


def test_file_size_is_capped_in_the_scratch_dir(scratch_root):
    limits = SandboxLimits.from_config(GraderConfig(file_size_mb=1))
    r = run_program("with open('big.bin', 'wb') as f:\n    f.write(b'a' * (3 * 2**20))", limits=limits)
    assert r.status == "error" and "File too large" in r.stderr
    assert_contained(scratch_root, r)


# --- program budget, pool, summary, GPQA -------------------------------------------------------


def test_program_budget_cuts_the_run_and_skips_the_rest(scratch_root):
    cfg = GraderConfig(test_timeout_s=1.0, program_timeout_s=1.0)
    tests = [Case("stdin", "", "0")] * 5
    v = grade_code("import time\ntime.sleep(0.3)\nprint(0)", tests, func_name=None, cfg=cfg)
    statuses = [t.status for t in v.tests]
    cut = statuses.count("passed")
    # The budget runs out while a test runs (that test is cut short: "timeout") or, when the
    # passed tests took the whole second between them, just before the next one starts.
    cut_short = ["timeout"] if "timeout" in statuses else []
    assert cut >= 1 and statuses == ["passed"] * cut + cut_short + ["skipped"] * (5 - cut - len(cut_short))
    assert v.status == "program_timeout" and v.passed == cut
    assert all("budget ran out" in t.detail for t in v.tests[cut:])
    assert v.wall_s < cfg.program_timeout_s + 1
    assert_contained(scratch_root)


def test_grade_many_keeps_input_order_and_grades_the_programs_at_once(scratch_root, monkeypatch):
    """Four workers grade four programs at once: each program's grading waits at a barrier that
    all four must reach (graded one at a time, the first would wait out the barrier and fail). The
    verdicts come back in input order, as one worker gives them."""
    # Earlier jobs sleep longer, so they finish last; job 2 prints a wrong answer.
    sleeps, prints = [0.6, 0.4, 0.2, 0.0], ["0", "1", "7", "3"]
    jobs = [
        (f"import time\ntime.sleep({s})\nprint({p})", [Case("stdin", "", str(i))], None)
        for i, (s, p) in enumerate(zip(sleeps, prints, strict=True))
    ]
    together = threading.Barrier(len(jobs), timeout=120)
    grade = lcb.grade_code

    def grade_together(*args, **kwargs):
        together.wait()
        return grade(*args, **kwargs)

    monkeypatch.setattr(lcb, "grade_code", grade_together)
    verdicts = grade_many(jobs, cfg=GraderConfig(workers=4))
    assert [v.status for v in verdicts] == ["passed", "passed", "failed", "passed"]
    assert verdicts[2].tests[0].detail == "expected '2' got '7'"
    monkeypatch.setattr(lcb, "grade_code", grade)
    assert [v.status for v in grade_many(jobs, cfg=GraderConfig(workers=1))] == [v.status for v in verdicts]
    assert_contained(scratch_root)


def test_grade_many_runs_each_program_in_a_sandbox_of_its_own(sandboxed, scratch_root, monkeypatch):
    """Sandboxes started ahead (a worker's next program's, while it grades the present one) each
    run one program: what a program leaves in its /tmp never reaches the next one, and no
    sandbox, used or not, outlives grade_many."""
    loaded = []
    load = sandbox.Sandbox.load
    monkeypatch.setattr(
        sandbox.Sandbox, "load", lambda box, *a, **k: (loaded.append(box), load(box, *a, **k))
    )
    code = (
        "import os\nseen = os.listdir('/tmp')\nopen(f'/tmp/{os.getpid()}', 'w').close()\n"
        "print('fresh' if not seen else f'seen {seen}')"
    )
    jobs = [(code, [Case("stdin", "", "fresh")], None)] * 7
    verdicts = grade_many(jobs, cfg=GraderConfig(workers=2))
    assert [(v.status, v.tests[0].detail) for v in verdicts] == [("passed", "")] * 7
    assert len(loaded) == len({id(box) for box in loaded}) == 7
    assert_contained(scratch_root)


def _sandbox_events(monkeypatch) -> list[tuple[str, int, str]]:
    """("new" | "load", the sandbox's number in the order they were made, the thread's name) for
    each Sandbox made and each program loaded, in the order they happen."""
    isolation_available()  # the probe's own sandbox, made once per process, is not grade_many's
    events, made = [], []
    init, load = sandbox.Sandbox.__init__, sandbox.Sandbox.load

    def spy_init(box, *args, **kwargs):
        made.append(box)
        events.append(("new", len(made) - 1, threading.current_thread().name))
        init(box, *args, **kwargs)

    def spy_load(box, *args, **kwargs):
        events.append(("load", made.index(box), threading.current_thread().name))
        return load(box, *args, **kwargs)

    monkeypatch.setattr(sandbox.Sandbox, "__init__", spy_init)
    monkeypatch.setattr(sandbox.Sandbox, "load", spy_load)
    return events


def test_grade_many_starts_a_workers_next_sandbox_before_it_grades(scratch_root, monkeypatch):
    """One worker, three programs: before grading a program it starts the next one's sandbox
    (grade_code starts the first program's own); the last program has no next, so no sandbox is
    started that nothing runs in."""
    events = _sandbox_events(monkeypatch)
    jobs = [(f"print({i})", [Case("stdin", "", str(i))], None) for i in range(3)]
    verdicts = grade_many(jobs, cfg=GraderConfig(workers=1))
    assert [(v.status, v.passed) for v in verdicts] == [("passed", 1)] * 3
    worker = "lcb-grader_0"
    assert events == [
        ("new", 0, worker),  # ahead, for program 1
        ("new", 1, worker),  # program 0's, by grade_code
        ("load", 1, worker),
        ("new", 2, worker),  # ahead, for program 2
        ("load", 0, worker),
        ("load", 2, worker),
    ]
    assert_contained(scratch_root)


def test_grade_many_starts_nothing_ahead_when_each_worker_has_one_program(scratch_root, monkeypatch):
    events = _sandbox_events(monkeypatch)
    jobs = [(f"print({i})", [Case("stdin", "", str(i))], None) for i in range(2)]
    verdicts = grade_many(jobs, cfg=GraderConfig(workers=2))
    assert [(v.status, v.passed) for v in verdicts] == [("passed", 1)] * 2
    assert sorted(kind for kind, _, _ in events) == ["load", "load", "new", "new"]
    assert sorted(box for kind, box, _ in events if kind == "load") == [0, 1]
    assert {name for _, _, name in events} <= {"lcb-grader_0", "lcb-grader_1"}
    assert_contained(scratch_root)


def test_summary_is_capped():
    v = grade_code("print(1)", all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    full = summarize(v, 1000)
    ones = [t.output.strip() for t in all_tests(SUM_MOD_3)].count("1")  # every test runs: these pass
    assert full == f"{ones}/5 tests passed; test 1: wrong answer: expected '0' got '1'"
    short = summarize(v, 20)
    assert short == full[:17] + "..." and len(short) == 20
    ok = grade_code(SOLUTIONS["abc300_a"], all_tests(SUM_MOD_3), func_name=None, cfg=CFG)
    assert summarize(ok, 100) == "5/5 tests passed"


def test_grade_letter():
    assert grade_letter(" b\n", "B") == 1.0
    assert grade_letter("B", "B") == 1.0
    assert grade_letter("C", "B") == 0.0
    assert grade_letter("E", "B") == 0.0
    assert grade_letter("", "B") == 0.0
    assert grade_letter("AB", "A") == 0.0
    with pytest.raises(ValueError, match="expected one of A, B, C, D"):
        grade_letter("E", "E")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one test"):
        grade_code("print(1)", [], func_name=None, cfg=CFG)
    with pytest.raises(ValueError, match="expected all stdin or all functional"):
        grade_code("print(1)", [Case("stdin", "", "1"), Case("functional", "1", "1")], func_name="f", cfg=CFG)
    with pytest.raises(ValueError, match="need func_name"):
        grade_code("print(1)", all_tests(COUNT_PAIRS), func_name=None, cfg=CFG)


# --- the command line ---------------------------------------------------------------------------


def run_cli(tmp_path, row, code, *extra, graders=None):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    config["graders"] = graders or {"test_timeout_s": 1.0, "program_timeout_s": 3.0}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "row.json").write_text(json.dumps(row) if not isinstance(row, str) else row, encoding="utf-8")
    (tmp_path / "prog.py").write_text(code, encoding="utf-8")
    command = [sys.executable, "-m", "atlas", "grade", "lcb", "--problem", str(tmp_path / "row.json")]
    command += ["--code", str(tmp_path / "prog.py"), "--config", str(tmp_path / "config.yaml"), *extra]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - start


def fixture_row(question_id):
    return next(r for r in read_jsonl(FIXTURES / "lcb_train.jsonl") if r["question_id"] == question_id)


def test_cli_grades_a_row_and_prints_one_json_verdict(tmp_path):
    require_bubblewrap()
    row = fixture_row("9001")  # functional, private tests in the packed upstream encoding
    assert not row["private_test_cases"].startswith("[")
    proc, _ = run_cli(tmp_path, row, SOLUTIONS["9001"])
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert set(verdict) == {"passed", "total", "tests", "status", "wall_s", "sandboxed"}
    assert (verdict["status"], verdict["passed"], verdict["total"]) == ("passed", 5, 5)
    assert verdict["sandboxed"] is True  # without graders.allow_unsandboxed it grades sandboxed or not at all
    assert set(verdict["tests"][0]) == {"status", "wall_s", "detail"}

    proc, _ = run_cli(tmp_path, row, SOLUTIONS["9001"], "--public-only")
    assert json.loads(proc.stdout)["total"] == 2


def test_cli_reports_a_timeout_within_its_bound(tmp_path):
    graders = {"test_timeout_s": 1.0, "program_timeout_s": 2.0}
    proc, elapsed = run_cli(tmp_path, fixture_row("abc300_a"), "while True:\n    pass", graders=graders)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "timeout" and [t["status"] for t in verdict["tests"]][:2] == [
        "timeout",
        "skipped",
    ]
    assert verdict["wall_s"] < graders["test_timeout_s"] + 1
    assert elapsed < graders["program_timeout_s"] + 1  # interpreter start included


def test_cli_refuses_bad_input_with_a_message(tmp_path):
    row = fixture_row("abc300_a")
    del row["metadata"]
    proc, _ = run_cli(tmp_path, row, "print(0)")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: {tmp_path / 'row.json'}, line 1: missing keys ['metadata']")
    proc, _ = run_cli(tmp_path, "{not json", "print(0)")
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr
    missing = tmp_path / "missing.json"
    proc = subprocess.run(
        [sys.executable, "-m", "atlas", "grade", "lcb", "--problem", str(missing), "--code", "prog.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (
        1,
        f"error: {missing}: no such file; expected one code_generation_lite row as JSON\n",
    )


def test_without_bubblewrap_runs_are_refused_unless_asked_for_and_then_recorded_unsandboxed(
    scratch_root, monkeypatch
):
    # Where bwrap cannot start (the probe fails), grading refuses; allow_unsandboxed runs programs
    # under the same driver without it.
    monkeypatch.setattr(sandbox, "_probe", lambda: (False, "no user namespaces (test)"))
    assert not isolation_available()
    with pytest.raises(
        SandboxUnavailable, match=r"bubblewrap cannot start here \(no user namespaces \(test\)\)"
    ):
        run_program("print(1)", limits=LIMITS)
    open_limits = SandboxLimits.from_config(CFG.model_copy(update={"allow_unsandboxed": True}))
    code = "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('started')"
    r = run_program(code, limits=open_limits)
    assert (r.status, r.stdout, r.sandboxed) == ("ok", "started\n", False)
    assert r.wall_s < 1  # the sleeper holding the pipes is killed with the group
    assert_contained(scratch_root, r)
    cfg = CFG.model_copy(update={"allow_unsandboxed": True})
    v = grade_code(SOLUTIONS["abc300_a"], all_tests(SUM_MOD_3), func_name=None, cfg=cfg)
    assert (v.status, v.sandboxed) == ("passed", False)
    assert_contained(scratch_root)


ADVERSARIAL = {
    "sleeps": ("import time\ntime.sleep(30)", {"timeout"}),
    "loops": ("while True:\n    pass", {"timeout"}),
    "crashes": ("raise SystemExit(3)", {"error"}),
    # 256 processes: past the sandbox's process count, fork fails (an error) unless time runs out first
    "forks": ("import os, time\nfor _ in range(8):\n    os.fork()\ntime.sleep(30)", {"timeout", "error"}),
    "floods_output": ("while True:\n    print('y' * 4096)", {"timeout", "failed"}),
    "eats_memory": ("x = bytearray(16 * 1024 ** 3)", {"error"}),
    "opens_a_socket": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", {"error"}),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_cli_verdict_for_every_adversarial_program_within_bound_plus_1s(tmp_path, name):
    code, statuses = ADVERSARIAL[name]
    graders = {"test_timeout_s": 1.0, "program_timeout_s": 2.0}
    proc, elapsed = run_cli(tmp_path, fixture_row("abc300_a"), code, graders=graders)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["status"] in statuses, verdict
    assert verdict["wall_s"] <= graders["program_timeout_s"] + 1
    # Only this test process's own sandboxes: other graders on the machine are not counted. The
    # CLI's would be below it (run_cli waited for the CLI, whose sandboxes die with it).
    assert sandboxed_processes() == []


def test_string_hashing_is_stable_across_runs(scratch_root):
    """Set order depends on PYTHONHASHSEED; tool output (so trajectories) must not vary run to run."""
    code = "print(list({'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta'}))"
    outputs = {run_program(code, limits=LIMITS).stdout for _ in range(4)}
    assert len(outputs) == 1


def test_left_behind_programs_are_counted_per_owning_process():
    """A stage asks only about the sandboxes it started: a marked process below another process (a
    job grading beside it) is not its own; one below it, at any depth, is."""
    from atlas.graders.driver import MARK

    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", MARK]
    mine = subprocess.Popen(sleeper)
    # The other process's own command line must not carry the mark: it builds it.
    spawn = sleeper[:-1] + ["MARK"]
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, time; subprocess.Popen({spawn!r}[:-1] + ['atlas-sandbox-' + 'driver'])"
            "; time.sleep(30)",
        ]
    )
    plain = subprocess.Popen(["sleep", "30"])  # below this process but no sandbox
    try:
        give_up = time.monotonic() + 10
        while not sandboxed_processes(other.pid) and time.monotonic() < give_up:
            time.sleep(0.05)
        (theirs,) = sandboxed_processes(other.pid)
        assert sandboxed_processes(os.getpid()) == sorted([mine.pid, theirs])
        assert plain.pid not in sandboxed_processes() and theirs != mine.pid
    finally:
        for p in (mine, other, plain):
            p.kill()
            p.wait()


def test_a_long_correct_answer_passes_past_max_output_bytes(sandboxed):
    """docs/sandbox.md: stdout is kept up to twice the expected output plus 4 KiB, however small
    max_output_bytes is, so a correct answer is never cut."""
    n = 30_000  # the numbers 0..n-1, one a line: about 169 KB, 40 times max_output_bytes
    expected = "".join(f"{i}\n" for i in range(n))
    case = Case("stdin", f"{n}\n", expected)
    echo = "n = int(input())\nprint('\\n'.join(map(str, range(n))))\n"
    v = grade_code(echo, [case], func_name=None, cfg=CFG)
    assert (v.status, v.passed) == ("passed", 1), v.tests[0].detail
    short = Case("stdin", f"{n}\n", expected[: len(expected) // 2])  # half the answer expected
    v = grade_code(echo, [short], func_name=None, cfg=CFG)
    assert (v.status, v.tests[0].status) == ("failed", "wrong_answer")
