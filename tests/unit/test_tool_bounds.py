"""The tools' schemas and the grammar's hard token bound, counted by hand from the bytes of the
longest call (no model: pure arithmetic on the schemas)."""

import pytest

from atlas.config.base import ConfigError
from atlas.config.runtime import RuntimeConfig
from atlas.runtime.tools import (
    CodeBounds,
    argument_bytes,
    call_prefix,
    check_arguments,
    check_runtime_bounds,
    gpqa_tools,
    lcb_tools,
    token_bound,
    tools_for,
)

CODE = CodeBounds(8, 2)
CODE_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "maxLength": 26, "x-atlas-max-run": 8, "x-atlas-max-escapes": 2}
    },
    "required": ["code"],
    "additionalProperties": False,
}
LETTER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def test_a_code_string_holds_runs_and_escapes():
    assert CODE.max_chars == 8 + 2 * (8 + 1) == 26
    assert CodeBounds(64, 0).max_chars == 64
    cfg = RuntimeConfig(max_code_run=64, max_code_escapes=8)
    assert CodeBounds.of(cfg) == CodeBounds(64, 8)


def test_the_tools_of_each_source_as_the_chat_template_lists_them():
    gpqa, lcb = tools_for("gpqa", CODE), tools_for("lcb", CODE)
    assert [t.spec() for t in gpqa.values()] == [
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "Run a Python program in a sandbox; its stdout comes back.",
                "parameters": CODE_SCHEMA,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "submit",
                "description": "Submit the letter of your final answer. This ends the episode.",
                "parameters": LETTER_SCHEMA,
            },
        },
    ]
    assert [t.spec() for t in lcb.values()] == [
        {
            "type": "function",
            "function": {
                "name": "run_tests",
                "description": "Run a program on the public tests; a short summary comes back.",
                "parameters": CODE_SCHEMA,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "submit",
                "description": "Submit the final program; it is graded on all tests. This ends the episode.",
                "parameters": CODE_SCHEMA,
            },
        },
    ]
    assert list(gpqa) == ["python", "submit"] and list(lcb) == ["run_tests", "submit"]
    assert gpqa == gpqa_tools(CODE) and lcb == lcb_tools(CODE)
    with pytest.raises(ValueError, match=r"^unknown question source 'mmlu'; expected 'gpqa' or 'lcb'$"):
        tools_for("mmlu", CODE)


def test_the_longest_arguments_in_bytes():
    # '{"code":"' + 8 characters + a 12-byte surrogate pair + 8 + 12 + 8 + '"}'
    assert argument_bytes(CODE_SCHEMA) == 9 + 8 + 12 + 8 + 12 + 8 + 2 == 59
    assert argument_bytes(LETTER_SCHEMA) == len('{"answer":"A"}') == 14
    # Two keys in required order, a comma between them; the longest enum value counts.
    two = {
        "required": ["a", "b"],
        "properties": {
            "a": {"enum": ["x", "yy"]},
            "b": {"x-atlas-max-run": 2, "x-atlas-max-escapes": 0},
        },
    }
    assert argument_bytes(two) == len('{"a":"yy","b":"zz"}') == 19
    # Keys and enum values are counted as JSON writes them: é is \u00e9, six bytes.
    wide = {"required": ["é"], "properties": {"é": {"enum": ["é"]}}}
    assert argument_bytes(wide) == len('{"\\u00e9":"\\u00e9"}') == 19


def test_the_hard_bound_is_text_margin_open_longest_call_close_and_eos():
    assert call_prefix("run_tests") == '{"name":"run_tests","arguments":'
    assert len(call_prefix("run_tests")) == 32 and len(call_prefix("submit")) == 29
    # LCB: the run_tests call, 32 + 59 + 1 ("}") = 92 bytes; 10 text tokens, a margin of 3,
    # call-open, the call, call-close, EOS.
    assert token_bound(lcb_tools(CODE), 10) == 10 + 3 + 1 + 92 + 1 + 1 == 108
    # GPQA: the python call (29 + 59 + 1) is longer than submit's (29 + 14 + 1).
    assert token_bound(gpqa_tools(CODE), 10) == 10 + 3 + 1 + 89 + 1 + 1 == 105
    assert token_bound({"submit": gpqa_tools(CODE)["submit"]}, 0) == 0 + 3 + 1 + 44 + 1 + 1 == 50


def test_a_runtime_config_must_leave_room_above_the_hard_bound():
    ok = RuntimeConfig(
        max_text_tokens=10,
        max_code_run=8,
        max_code_escapes=2,
        max_generation_tokens=109,
        max_trajectory_tokens=109 + 256,
    )
    assert check_runtime_bounds(ok) == 108  # LCB's bound, the larger of the two
    at_bound = ok.model_copy(update={"max_generation_tokens": 108})
    with pytest.raises(
        ConfigError,
        match=r"^runtime.max_generation_tokens \(108\) must exceed the grammar's hard bound \(108 tokens from "
        r"max_text_tokens, max_code_run, max_code_escapes\), so that a call can never be cut off$",
    ):
        check_runtime_bounds(at_bound)
    short = ok.model_copy(update={"max_trajectory_tokens": 364})
    with pytest.raises(
        ConfigError,
        match=r"^runtime.max_trajectory_tokens \(364\) must be at least max_generation_tokens \+ 256 \(365\): "
        r"room for a prompt and one generation$",
    ):
        check_runtime_bounds(short)


@pytest.mark.parametrize(
    ("tool", "arguments", "why"),
    [
        ("submit", {"answer": "B"}, None),
        ("submit", ["B"], "arguments are a list, expected an object"),
        ("submit", {}, "argument keys [], expected ['answer']"),
        ("submit", {"answer": "B", "code": ""}, "argument keys ['answer', 'code'], expected ['answer']"),
        ("submit", {"answer": 2}, "answer is a int, expected a string"),
        ("submit", {"answer": "E"}, "answer='E' is not one of ['A', 'B', 'C', 'D']"),
        ("python", {"code": "x" * 26}, None),
        ("python", {"code": "x" * 27}, "code has 27 characters, more than 26"),
        ("python", {"code": "print(1)\ud800"}, "code holds a lone surrogate, expected valid text"),
    ],
)
def test_arguments_are_checked_against_the_schema(tool, arguments, why):
    assert check_arguments(gpqa_tools(CODE)[tool], arguments) == why
