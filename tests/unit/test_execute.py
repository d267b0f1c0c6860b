"""execute_call, the one place a score comes from: what each tool runs, the result it returns and
the score it gives, with every program run in the real sandbox. Expected results written out."""

from __future__ import annotations

import pytest

from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase
from atlas.runtime.execute import ToolResult, execute_call, refused
from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools
from conftest import waits_for_question

CODE = CodeBounds(4000, 400)
GRADERS = GraderConfig(test_timeout_s=1.0, program_timeout_s=4.0)
GPQA = {"question_uid": "gpqa-execute", "source": "gpqa", "correct_letter": "B"}
LCB = {"question_uid": "lcb-execute", "source": "lcb", "func_name": None}
TESTS = [
    (TestCase("stdin", "2 3\n", "5\n"), "public"),
    (TestCase("stdin", "10 -4\n", "6\n"), "private"),
]
SUM = "a, b = map(int, input().split())\nprint(a + b)"
PUBLIC_ONLY = "a, b = map(int, input().split())\nprint(5 if a == 2 else 0)"


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def gpqa(c, parse_error=None, chars=400) -> ToolResult:
    return execute_call(c, parse_error, gpqa_tools(CODE), GPQA, [], GRADERS, chars)


def lcb(c, tests=TESTS) -> ToolResult:
    return execute_call(c, None, lcb_tools(CODE), LCB, tests, GRADERS, 400)


def test_a_call_that_cannot_run_is_refused_with_why_and_scores_nothing():
    assert refused("x") == ToolResult("refused", "refused: x", 0.0, True, False)
    assert gpqa(None, "no call before the end of the generation") == refused(
        "no call before the end of the generation"
    )
    assert gpqa(None) == refused("no call")
    assert gpqa(call("run_tests", code="print(1)")) == refused(
        "tool 'run_tests' is not offered on this turn (offered: ['python', 'submit'])"
    )
    assert gpqa(call("submit", answer="E")) == refused("answer='E' is not one of ['A', 'B', 'C', 'D']")
    assert gpqa(call("submit", letter="B")) == refused("argument keys ['letter'], expected ['answer']")


def test_a_gpqa_submit_is_graded_against_the_stored_letter_and_ends_the_episode():
    assert gpqa(call("submit", answer="B")) == ToolResult("ok", "submitted B", 1.0, True, True)
    assert gpqa(call("submit", answer="C")) == ToolResult("ok", "submitted C", 0.0, True, True)


def test_the_python_tool_runs_in_the_sandbox_and_never_scores():
    assert gpqa(call("python", code="print(6 * 7)")) == ToolResult("ok", "42\n", 0.0, True, False)
    failed = gpqa(call("python", code="print('before')\nraise SystemExit('x' * 300 + 'the end')"))
    # the exit code, then the end of stderr (half the output's characters: it names the error)
    stderr = "x" * 300 + "the end\n"
    assert failed == ToolResult("error", f"[exit 1] {stderr[-200:]}\nbefore\n", 0.0, True, False)
    slow = gpqa(call("python", code="print('started', flush=True)\nwhile True: pass"))
    assert slow == ToolResult("timeout", "[timed out after 1 s]\nstarted\n", 0.0, True, False)


def test_run_tests_grades_the_public_tests_only_and_never_scores():
    assert lcb(call("run_tests", code=PUBLIC_ONLY)) == ToolResult("ok", "1/1 tests passed", 0.0, True, False)
    wrong = lcb(call("run_tests", code="print(4)"))
    assert wrong == ToolResult(
        "ok", "0/1 tests passed; test 1: wrong answer: expected '5' got '4'", 0.0, True, False
    )
    assert lcb(call("run_tests", code="print(1)"), tests=[TESTS[1]]) == ToolResult(
        "ok", "this problem has no public tests", 0.0, True, False
    )


def test_submit_grades_every_test_and_scores_one_only_when_all_pass():
    assert lcb(call("submit", code=SUM)) == ToolResult("ok", "2/2 tests passed", 1.0, True, True)
    partial = lcb(call("submit", code=PUBLIC_ONLY))
    assert (partial.status, partial.score, partial.ends_episode) == ("ok", 0.0, True)
    assert partial.output.startswith("1/2 tests passed; test 2: wrong answer")
    crashed = lcb(call("submit", code="raise ValueError('no')"))
    assert (crashed.status, crashed.score, crashed.ends_episode) == ("error", 0.0, True)
    slow = lcb(call("submit", code="while True: pass"))
    assert (slow.status, slow.score, slow.ends_episode) == ("timeout", 0.0, True)


def test_a_tool_without_an_executor_is_a_bug_not_a_score():
    offered = {**gpqa_tools(CODE), **lcb_tools(CODE)}
    with pytest.raises(AssertionError, match="no executor for tool 'run_tests' on source 'gpqa'"):
        execute_call(call("run_tests", code="print(1)"), None, offered, GPQA, [], GRADERS, 400)


def test_a_functional_question_is_graded_by_its_method():
    question = {**LCB, "func_name": "add"}
    tests = [
        (TestCase("functional", "2\n3", "5"), "public"),
        (TestCase("functional", "-1\n1", "0"), "private"),
    ]
    code = "class Solution:\n    def add(self, a, b):\n        return a + b"
    result = execute_call(call("submit", code=code), None, lcb_tools(CODE), question, tests, GRADERS, 400)
    assert result == ToolResult("ok", "2/2 tests passed", 1.0, True, True)


@pytest.mark.parametrize(
    "question,tool",
    [
        (GPQA, call("python", code="print(1)")),
        (LCB, call("run_tests", code=SUM)),
        (LCB, call("submit", code=SUM)),
    ],
)
def test_every_program_runs_under_its_questions_lock(question, tool):
    """While another program of the same question holds its lock, the call waits for it."""
    offered = gpqa_tools(CODE) if question is GPQA else lcb_tools(CODE)
    waits_for_question(
        question["question_uid"], lambda: execute_call(tool, None, offered, question, TESTS, GRADERS, 400)
    )
