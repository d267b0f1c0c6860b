"""`python -m atlas grade lcb`: grade one program on one LiveCodeBench problem, print the verdict.

    python -m atlas grade lcb --problem ROW.json --code PROG.py [--config config/config.yaml] [--public-only]

ROW.json holds one code_generation_lite row (one line of an upstream JSONL file; private tests in
either encoding), checked by the same parser as the data stage. Grader settings come from the
config's `graders` section. Prints one JSON verdict (Verdict.to_json) on stdout and exits 0 once
the program is graded, whatever its result; bad input exits 1 with a message naming it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from atlas.config.study import AtlasConfig, load_config
from atlas.data.lcb import parse_row
from atlas.data.schema import DataError, Question
from atlas.errors import InputError
from atlas.graders.lcb import grade_code
from atlas.graders.sandbox import require_sandbox
from atlas.stage import run


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {what}") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err}); expected {what}") from None


def read_problem(path: Path, config: AtlasConfig) -> Question:
    """The one LCB row in `path`, parsed and checked like a line of the data stage's input."""
    text = _read_text(path, "one code_generation_lite row as JSON")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            str(path), None, f"not valid JSON ({err})", "one code_generation_lite row as JSON"
        ) from None
    return parse_row(row, str(path), 1, "grade", config.data.max_private_tests_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="atlas grade", description=__doc__.splitlines()[0])
    benchmarks = parser.add_subparsers(dest="benchmark", required=True)
    lcb = benchmarks.add_parser("lcb", help="grade a program on a LiveCodeBench problem")
    lcb.add_argument("--problem", required=True, type=Path, help="one code_generation_lite row (JSON)")
    lcb.add_argument("--code", required=True, type=Path, help="the Python program to grade")
    lcb.add_argument("--config", default=Path("config/config.yaml"), type=Path, help="its graders section")
    lcb.add_argument("--public-only", action="store_true", help="run the public tests only")
    args = parser.parse_args(argv)

    if not args.config.is_file():
        raise InputError(f"{args.config}: no such file; expected the pipeline config (--config)")
    config = load_config(args.config)
    require_sandbox(config.graders.allow_unsandboxed)
    question = read_problem(args.problem, config)
    code = _read_text(args.code, "the Python program to grade")
    tests = question.public_tests if args.public_only else question.public_tests + question.private_tests
    if not tests:
        raise DataError(
            str(args.problem), None, "no public tests", "at least one public test for --public-only"
        )
    # the question's uid, as training names it: no other program of it runs here meanwhile
    verdict = grade_code(
        code, tests, func_name=question.func_name, cfg=config.graders, question=question.question_uid
    )
    print(json.dumps(verdict.to_json()))


if __name__ == "__main__":
    run(main)
