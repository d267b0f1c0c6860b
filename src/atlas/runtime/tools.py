"""The tools a policy may call, as typed JSON schemas with bounded strings.

GPQA episodes offer `submit {"answer": "A"|"B"|"C"|"D"}` and a scratch `python {"code": ...}`
whose stdout comes back. LiveCodeBench episodes offer `run_tests {"code": ...}` (the public
tests, summarised) and `submit {"code": ...}` (graded on all tests). On the last allowed turn
only `submit` is offered, so every episode ends with a submission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]  # JSON schema of the arguments object; every string is bounded

    def spec(self) -> dict[str, Any]:
        """The tool as the chat template lists it (OpenAI-style function spec)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema},
        }


@dataclass(frozen=True)
class CodeBounds:
    """A code string is printable-ASCII runs of at most `run` characters separated by at most
    `escapes` JSON escapes. The grammar enforces exactly this shape; it masks fast (a bounded run
    of one character class) where a bounded repeat of alternatives costs ~50 ms per token."""

    run: int
    escapes: int

    @property
    def max_chars(self) -> int:
        return self.run + self.escapes * (self.run + 1)


def _code_schema(bounds: CodeBounds) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "maxLength": bounds.max_chars,
                "x-atlas-max-run": bounds.run,
                "x-atlas-max-escapes": bounds.escapes,
            }
        },
        "required": ["code"],
        "additionalProperties": False,
    }


def gpqa_tools(code: CodeBounds) -> dict[str, Tool]:
    return {
        "python": Tool(
            "python", "Run a Python program in a sandbox; its stdout comes back.", _code_schema(code)
        ),
        "submit": Tool(
            "submit",
            "Submit the letter of your final answer. This ends the episode.",
            {
                "type": "object",
                "properties": {"answer": {"type": "string", "enum": list(LETTERS)}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        ),
    }


def lcb_tools(code: CodeBounds) -> dict[str, Tool]:
    return {
        "run_tests": Tool(
            "run_tests", "Run a program on the public tests; a short summary comes back.", _code_schema(code)
        ),
        "submit": Tool(
            "submit",
            "Submit the final program; it is graded on all tests. This ends the episode.",
            _code_schema(code),
        ),
    }


def tools_for(source: str, code: CodeBounds) -> dict[str, Tool]:
    if source == "gpqa":
        return gpqa_tools(code)
    if source == "lcb":
        return lcb_tools(code)
    raise ValueError(f"unknown question source {source!r}; expected 'gpqa' or 'lcb'")


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` break the tool's schema, or None. The grammar makes this unreachable for
    sampled calls; the protocol check runs it anyway, on every record."""
    schema = tool.schema
    if not isinstance(arguments, dict):
        return f"arguments are a {type(arguments).__name__}, expected an object"
    if set(arguments) != set(schema["required"]):
        return f"argument keys {sorted(arguments)}, expected {sorted(schema['required'])}"
    for key, value in arguments.items():
        prop = schema["properties"][key]
        if not isinstance(value, str):
            return f"{key} is a {type(value).__name__}, expected a string"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{key} holds a lone surrogate, expected valid text"
        if "enum" in prop and value not in prop["enum"]:
            return f"{key}={value!r} is not one of {prop['enum']}"
        if "maxLength" in prop and len(value) > prop["maxLength"]:
            return f"{key} has {len(value)} characters, more than {prop['maxLength']}"
    return None
