"""Run one parsed tool call: the sandboxed program runs and graders behind each tool.

`execute_call` returns a ToolResult; the episode turns it into the record's tool status, output
and score. Every program of a question runs alone on the host, apart from the other attempts at
that question (sandbox.QuestionLock): samples of one question cannot share what they computed. Scores come only from here: a GPQA submit is graded against the stored permutation's
letter, an LCB submit on all tests (1.0 when every test passes, the pass@1 of one program).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase
from atlas.graders.gpqa import grade_letter
from atlas.graders.lcb import grade_code, summarize
from atlas.graders.sandbox import SandboxLimits, run_program
from atlas.runtime.tools import Tool, check_arguments


@dataclass(frozen=True)
class ToolResult:
    status: str  # "ok" | "error" | "timeout" | "refused"
    output: str  # full text (capped later for the policy and the record)
    score: float  # 0 except for graded submissions
    sandboxed: bool
    ends_episode: bool


_VERDICT_STATUS = {
    "passed": "ok",
    "failed": "ok",
    "error": "error",
    "timeout": "timeout",
    "program_timeout": "timeout",
}


def refused(reason: str) -> ToolResult:
    # Nothing ran, so nothing ran unsandboxed: sandboxed stays true.
    return ToolResult("refused", f"refused: {reason}", 0.0, True, False)


def execute_call(
    call: dict[str, Any] | None,
    parse_error: str | None,
    offered: dict[str, Tool],
    question: dict[str, Any],
    tests: list[tuple[TestCase, str]],  # (test, "public" | "private")
    graders: GraderConfig,
    output_chars: int,
) -> ToolResult:
    if call is None:
        return refused(parse_error or "no call")
    name, args = call["name"], call["arguments"]
    if name not in offered:
        return refused(f"tool {name!r} is not offered on this turn (offered: {sorted(offered)})")
    problem = check_arguments(offered[name], args)
    if problem:
        return refused(problem)

    source = question["source"]
    if source == "gpqa" and name == "submit":
        score = grade_letter(args["answer"], question["correct_letter"])
        return ToolResult("ok", f"submitted {args['answer']}", score, True, True)
    if source == "gpqa" and name == "python":
        run = run_program(
            args["code"], limits=SandboxLimits.from_config(graders), question=question["question_uid"]
        )
        output = run.stdout
        if run.status == "timeout":
            output = f"[timed out after {graders.test_timeout_s:g} s]\n{run.stdout}"
        elif run.status == "error":  # the end of the traceback first: it names the error
            output = f"[exit {run.returncode}] {run.stderr[-output_chars // 2 :]}\n{run.stdout}"
        return ToolResult(run.status, output, 0.0, run.sandboxed, False)
    if source == "lcb" and name in ("run_tests", "submit"):
        public = [t for t, vis in tests if vis == "public"] if name == "run_tests" else [t for t, _ in tests]
        if not public:  # data preparation admits a problem with private tests only
            return ToolResult("ok", "this problem has no public tests", 0.0, True, False)
        verdict = grade_code(
            args["code"],
            public,
            func_name=question.get("func_name"),
            cfg=graders,
            question=question["question_uid"],
        )
        score = 1.0 if name == "submit" and verdict.status == "passed" else 0.0
        return ToolResult(
            _VERDICT_STATUS[verdict.status],
            summarize(verdict, output_chars),
            score,
            verdict.sandboxed,
            name == "submit",
        )
    raise AssertionError(f"no executor for tool {name!r} on source {source!r}")
