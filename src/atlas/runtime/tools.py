"""The tools a policy may call, as typed JSON schemas with bounded strings.

GPQA episodes offer `submit {"answer": "A"|"B"|"C"|"D"}` and a scratch `python {"code": ...}`
whose stdout comes back. LiveCodeBench episodes offer `run_tests {"code": ...}` (the public
tests, summarised) and `submit {"code": ...}` (graded on all tests). On the last allowed turn
only `submit` is offered, so every episode ends with a submission.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from atlas.config.base import ConfigError
from atlas.config.runtime import RuntimeConfig
from atlas.data.schema import LETTERS


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

    @classmethod
    def of(cls, cfg: RuntimeConfig) -> CodeBounds:
        """The bounds the runtime config sets (runtime.max_code_run, runtime.max_code_escapes)."""
        return cls(cfg.max_code_run, cfg.max_code_escapes)

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


# --- the hard token bound of a generation (pure arithmetic; the grammar enforces the shape) ---

MAX_ESCAPE_BYTES = 12  # the longest escape a code string admits: a \uXXXX\uXXXX surrogate pair
# A margin on the free-text budget: xgrammar kept it exactly in every test, but a character split
# across the budget's end could need up to its 3 continuation bytes.
UTF8_SLACK_TOKENS = 3
# Room a trajectory needs beyond one generation: the prompt and the tool turn's wrapper.
MIN_PROMPT_ROOM = 256


def call_prefix(name: str) -> str:
    return f'{{"name":{json.dumps(name)},"arguments":'


def argument_bytes(schema: dict[str, Any]) -> int:
    """The most bytes the compact JSON of an arguments object under `schema` can take."""
    total = 2  # the braces
    for i, key in enumerate(schema["required"]):
        prop = schema["properties"][key]
        total += len((("," if i else "") + json.dumps(key) + ":").encode())
        if "enum" in prop:
            total += max(len(json.dumps(v).encode()) for v in prop["enum"])
        else:
            run, escapes = int(prop["x-atlas-max-run"]), int(prop["x-atlas-max-escapes"])
            total += 2 + run + escapes * (MAX_ESCAPE_BYTES + run)
    return total


def token_bound(tools: dict[str, Tool], max_text_tokens: int) -> int:
    """No generation offering `tools` is longer: text, call-open, the longest call, call-close, EOS.
    Every token inside the call holds at least one byte, so bytes bound tokens."""
    longest_call = max(len(call_prefix(n).encode()) + argument_bytes(t.schema) + 1 for n, t in tools.items())
    return max_text_tokens + UTF8_SLACK_TOKENS + 1 + longest_call + 1 + 1


def check_runtime_bounds(cfg: RuntimeConfig) -> int:
    """Refuse a runtime config whose token caps a generation could exceed; returns the bound.
    The Snakefile calls it at load time, so a bad config stops before any job runs."""
    code = CodeBounds.of(cfg)
    bound = max(token_bound(tools_for(source, code), cfg.max_text_tokens) for source in ("gpqa", "lcb"))
    if cfg.max_generation_tokens <= bound:
        raise ConfigError(
            f"runtime.max_generation_tokens ({cfg.max_generation_tokens}) must exceed the grammar's hard "
            f"bound ({bound} tokens from max_text_tokens, max_code_run, max_code_escapes), so that a call "
            "can never be cut off"
        )
    if cfg.max_trajectory_tokens < cfg.max_generation_tokens + MIN_PROMPT_ROOM:
        raise ConfigError(
            f"runtime.max_trajectory_tokens ({cfg.max_trajectory_tokens}) must be at least "
            f"max_generation_tokens + {MIN_PROMPT_ROOM} ({cfg.max_generation_tokens + MIN_PROMPT_ROOM}): "
            "room for a prompt and one generation"
        )
    return bound
