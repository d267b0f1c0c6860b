"""Boundary stage: one scripted episode per runtime boundary, each asserted in boundary.json.

A scripted episode is a real rollout of the base model whose sampling is steered toward a target
text per turn (`Runtime.steer`); the grammar mask comes after the steering, so where the script
asks for something illegal the model goes its own legal way. That is the point: the turn limit,
the text budget and the argument bound must hold against a policy that pushes past them.

Cases: the turn limit (the last call is forced to submit), the free-text budget, the longest
argument, a tool error, programs that hang / fork / flood output / eat memory, an empty and a
unicode-heavy answer, and the longest prompt.

Writes `<out>/boundary.json`, records.parquet, trajectories.parquet, protocol.json, MANIFEST.json.
The stage fails (after printing the report) when any check fails.

    python -m atlas.stages.boundary --config-slice '{...}' --val results/data/val.parquet \
        --tests results/data/tests.parquet --model results/models/tiny --out results/runs/boundary
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.config.smoke import BoundarySlice
from atlas.graders.sandbox import require_sandbox, sandboxed_processes
from atlas.runtime.episode import Episode, EpisodeSpec, run_episodes, start_episode
from atlas.runtime.inputs import RolloutInputs, read_questions, read_tests
from atlas.runtime.protocol import ProtocolReport, check_episodes
from atlas.runtime.runfolder import write_rollout_stage
from atlas.runtime.session import Runtime, load_runtime
from atlas.runtime.tools import UTF8_SLACK_TOKENS, CodeBounds
from atlas.stage import code_files, log, rollout_parser, run

RUN = "boundary"
MODULE = "atlas.stages.boundary"


def call_text(name: str, key: str, value: str, lead: str = "Next step.") -> str:
    # json.dumps escapes non-ASCII as \uXXXX: the only form the code grammar admits.
    return f'{lead}<tool_call>{{"name":"{name}","arguments":{{"{key}":{json.dumps(value)}}}}}</tool_call><|im_end|>'


def python_call(code: str, lead: str = "Let me run it.") -> str:
    return call_text("python", "code", code, lead)


@dataclass
class Case:
    name: str
    spec: EpisodeSpec
    checks: Callable[[Episode, Runtime], list[tuple[str, bool, Any]]]
    runtime: dict[str, Any] | None = None  # overrides of the runtime config for this case


def _gen_ids(ep: Episode, turn: int) -> list[int]:
    g = ep.generations[turn]
    return ep.token_ids[g.start : g.end]


def left_behind() -> list[int]:
    """This stage's sandboxed programs still alive (other jobs may be grading beside it)."""
    return sandboxed_processes(os.getpid())


def _program_checks(status: set[str], graders: GraderConfig, needle: str | None = None):
    def checks(ep: Episode, rt: Runtime):
        r = ep.records[0]
        alive = left_behind()  # one scan: the check and what it observed are the same reading
        out = [
            (f"tool status in {sorted(status)}", r.tool_status in status, r.tool_status),
            (
                f"tool returned within test_timeout_s + 1 s ({graders.test_timeout_s + 1:g} s)",
                r.timing_s_tool <= graders.test_timeout_s + 1,
                round(r.timing_s_tool, 3),
            ),
            ("no sandboxed process left behind", not alive, alive),
            ("the episode went on and completed", ep.end_reason == "submit", ep.end_reason),
        ]
        if needle is not None:
            out.append(
                (f"output mentions {needle!r}", needle in r.tool_output_excerpt, r.tool_output_excerpt[-200:])
            )
        return out

    return checks


def build_cases(
    questions: list[dict], tests, rt: Runtime, runtime: RuntimeConfig, graders: GraderConfig
) -> list[Case]:
    gpqa = next(q for q in questions if q["source"] == "gpqa")
    lcb = next(q for q in questions if q["source"] == "lcb" and not q["func_name"])
    code = CodeBounds.of(runtime)

    def spec(q, script, sample=0):
        return EpisodeSpec(q, tests.get(q["question_uid"], []), sample, script)

    def turn_limit(ep, rt):
        tools = [r.tool for r in ep.records]
        return [
            ("three generations", len(ep.records) == 3, len(ep.records)),
            ("the script's python calls ran on turns 0 and 1", tools[:2] == ["python", "python"], tools),
            (
                "the last turn offered submit alone",
                sorted(ep.generations[-1].offered) == ["submit"],
                sorted(ep.generations[-1].offered),
            ),
            ("the last call is submit although the script asked for python", tools[-1:] == ["submit"], tools),
            ("the episode completed", ep.end_reason == "submit", ep.end_reason),
        ]

    def text_budget(ep, rt):
        ids = _gen_ids(ep, 0)
        text_tokens = ids.index(rt.call_open_id) if rt.call_open_id in ids else None
        lo, hi = runtime.max_text_tokens, runtime.max_text_tokens + UTF8_SLACK_TOKENS
        return [
            (
                f"free text ran to the budget: {lo}..{hi} tokens",
                text_tokens is not None and lo <= text_tokens <= hi,
                text_tokens,
            ),
            ("then exactly one call was parsed", ep.records[0].tool != "", ep.records[0].tool),
            (
                "within the hard token bound",
                len(ids) <= ep.generations[0].token_bound,
                [len(ids), ep.generations[0].token_bound],
            ),
        ]

    longest = ("a" * code.run + "\n") * code.escapes + "a" * code.run

    def longest_argument(ep, rt):
        args = json.loads(ep.records[0].arguments) if ep.records[0].arguments else {}
        n = len(args.get("code", ""))
        return [
            (f"code argument at the bound ({code.max_chars} characters)", n == code.max_chars, n),
            (
                "the call closed and was graded",
                ep.records[0].tool == "submit" and ep.end_reason == "submit",
                ep.end_reason,
            ),
            (
                "within the hard token bound",
                ep.records[0].generated_tokens <= ep.generations[0].token_bound,
                [ep.records[0].generated_tokens, ep.generations[0].token_bound],
            ),
            (
                "finish reason is stop, not length",
                ep.records[0].finish_reason == "stop",
                ep.records[0].finish_reason,
            ),
        ]

    def empty_answer(ep, rt):
        r = ep.records[0]
        return [
            ("the empty program was submitted", json.loads(r.arguments) == {"code": ""}, r.arguments),
            (
                "it was graded (status ok, score 0)",
                (r.tool_status, r.score) == ("ok", 0.0),
                [r.tool_status, r.score],
            ),
            ("the episode completed", ep.end_reason == "submit", ep.end_reason),
        ]

    unicode_text = "Ωμέγα ∑ 数学 🙂 — café. "

    def unicode_heavy(ep, rt):
        r = ep.records[0]
        gen_text = rt.decode(_gen_ids(ep, 0))
        return [
            (
                "unicode free text kept token for token",
                gen_text.startswith(unicode_text.strip()[:8]),
                gen_text[:40],
            ),
            (
                "the program printed the unicode string",
                "Ωμ∑数" in r.tool_output_excerpt,
                r.tool_output_excerpt[:60],
            ),
            ("tool status ok", r.tool_status == "ok", r.tool_status),
        ]

    cases = [
        Case("turn_limit", spec(gpqa, [python_call("print(1)")] * 3), turn_limit, {"max_turns": 3}),
        Case("text_budget", spec(gpqa, ["word " * 400]), text_budget),
        Case(
            "longest_argument", spec(lcb, [call_text("submit", "code", longest, "Final.")]), longest_argument
        ),
        Case(
            "tool_error",
            spec(gpqa, [python_call("raise ValueError('boom')"), call_text("submit", "answer", "A")]),
            _program_checks({"error"}, graders, "ValueError: boom"),
        ),
        Case(
            "program_hangs",
            spec(gpqa, [python_call("while True:\n    pass")]),
            _program_checks({"timeout"}, graders),
        ),
        Case(
            "program_forks",
            # 2^10 processes that then sleep: a real fan-out, bounded so CI's pid space is safe.
            spec(gpqa, [python_call("import os, time\nfor _ in range(10):\n    os.fork()\ntime.sleep(60)")]),
            _program_checks({"timeout", "error"}, graders),
        ),
        Case(
            "program_floods_output",
            spec(gpqa, [python_call("while True:\n    print('x' * 1000)")]),
            _program_checks({"timeout", "error"}, graders),
        ),
        Case(
            "program_eats_memory",
            spec(gpqa, [python_call("x = bytearray(64 * 1024 ** 3)")]),
            _program_checks({"error"}, graders, "MemoryError"),
        ),
        Case("empty_answer", spec(lcb, [call_text("submit", "code", "", "")]), empty_answer),
        Case(
            "unicode_heavy_answer",
            # Non-ASCII in code travels as \uXXXX escapes, each one of max_code_escapes.
            spec(gpqa, [python_call('print("Ωμ∑数")', lead=unicode_text)]),
            unicode_heavy,
        ),
    ]
    cases += longest_prompt_cases(questions, tests, rt, runtime, spec)
    return cases


def longest_prompt_cases(questions, tests, rt: Runtime, runtime: RuntimeConfig, spec) -> list[Case]:
    """The longest validation prompt, and one padded until only a submit fits in the budget."""
    code = CodeBounds.of(runtime)
    lengths = [(start_episode(rt, spec(q, None), code).prompt_tokens, i) for i, q in enumerate(questions)]
    longest = questions[max(lengths)[1]]
    gpqa = next(q for q in questions if q["source"] == "gpqa")
    submit_bound = rt.grammars.get(
        {"submit": start_episode(rt, spec(gpqa, None), code).tools["submit"]}
    ).token_bound
    base = start_episode(rt, spec(gpqa, None), code).prompt_tokens
    filler_tokens = len(rt.tokenizer.encode(" filler", add_special_tokens=False))
    pad = max(0, (runtime.max_trajectory_tokens - submit_bound - base - 8) // filler_tokens)
    padded = dict(
        gpqa, question=gpqa["question"] + " filler" * pad, question_uid=gpqa["question_uid"] + "#padded"
    )

    def fits(ep, rt):
        return [
            ("the episode completed", ep.end_reason == "submit", ep.end_reason),
            (
                f"the trajectory fits max_trajectory_tokens ({runtime.max_trajectory_tokens})",
                len(ep.token_ids) <= runtime.max_trajectory_tokens,
                len(ep.token_ids),
            ),
        ]

    def padded_checks(ep, rt):
        return fits(ep, rt) + [
            (
                "only submit was offered on the first turn",
                sorted(ep.generations[0].offered) == ["submit"],
                sorted(ep.generations[0].offered),
            ),
            (
                "the prompt nearly fills the budget",
                ep.prompt_tokens + submit_bound <= runtime.max_trajectory_tokens,
                ep.prompt_tokens,
            ),
        ]

    return [
        Case("longest_prompt", spec(longest, None), fits),
        Case("prompt_at_the_trajectory_limit", EpisodeSpec(padded, [], 0, None), padded_checks),
    ]


def main(argv: list[str] | None = None) -> None:
    args = rollout_parser(__doc__.splitlines()[0]).parse_args(argv)
    sl = BoundarySlice.model_validate(args.config_slice)
    inputs = RolloutInputs(val=args.val, tests=args.tests, model=args.model)
    runtime, graders, resources = sl.runtime, sl.graders, sl.resources
    require_sandbox(graders.allow_unsandboxed)  # before any model loads: bwrap missing stops here

    rt = load_runtime(inputs.model, runtime, resources.device)
    questions, tests = read_questions(inputs.val), read_tests(inputs.tests)
    report, episodes, results = ProtocolReport(), [], []
    for i, case in enumerate(build_cases(questions, tests, rt, runtime, graders)):
        cfg = runtime.model_copy(update=case.runtime or {})
        case.spec.sample = i  # (question_uid, sample) names one case's episode in both parquet files
        (ep,) = run_episodes(rt, [case.spec], cfg, graders, run=RUN, step=0, phase="val", seed=sl.seed)
        check_episodes(
            [ep],
            rt.decode,
            rt.call_open_id,
            rt.call_close_id,
            report,
            max_trajectory_tokens=cfg.max_trajectory_tokens,
        )
        checks = [{"check": c, "passed": bool(ok), "observed": seen} for c, ok, seen in case.checks(ep, rt)]
        passed = all(c["passed"] for c in checks)
        results.append({"case": case.name, "sample": i, "passed": passed, "checks": checks})
        episodes.append(ep)
        log(RUN, f"{case.name}: {'passed' if passed else 'FAILED'}")

    summary = {
        "cases": len(results),
        "passed": sum(r["passed"] for r in results),
        "protocol_violations": report.violations,
        "results": results,
    }
    write_rollout_stage(
        args.out,
        episodes,
        report,
        run=RUN,
        inputs=inputs,
        config=args.config_slice,
        code=code_files(MODULE),
        extra={"boundary.json": summary},
    )
    if summary["passed"] != summary["cases"] or report.violations:
        print(json.dumps(summary, indent=1, ensure_ascii=False), file=sys.stderr)
        raise SystemExit(
            f"boundary: {summary['passed']}/{summary['cases']} cases passed, {report.violations} violations"
        )


if __name__ == "__main__":
    run(main)
