"""The tool runtime's limits (`runtime`)."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict


class RuntimeConfig(Strict):
    """The sequential tool runtime: turn and token limits, sampling, what tools show back."""

    max_turns: int = Field(
        default=3, ge=1, le=64, description="Generations per episode; the last one may only call submit."
    )
    max_text_tokens: int = Field(
        default=48, ge=0, description="Free-text budget of one generation, in tokens (before its call)."
    )
    max_code_run: int = Field(
        default=64,
        ge=8,
        description="`code` arguments: most printable ASCII characters between two escapes (a line, "
        "roughly).",
    )
    max_code_escapes: int = Field(
        default=8,
        ge=0,
        description='`code` arguments: most escape sequences (\\n, \\t, \\", \\\\, \\/, \\uXXXX). A code '
        "string holds at most max_code_run + max_code_escapes * (max_code_run + 1) characters.",
    )
    max_generation_tokens: int = Field(
        default=4096,
        ge=8,
        description="Token cap of one generation. Must exceed the grammar's hard bound (checked), so a "
        "call is never cut off.",
    )
    max_trajectory_tokens: int = Field(
        default=8192,
        ge=64,
        description="Prompt + generations + tool outputs of one episode. When the next turn could "
        "overflow it, that turn may only submit.",
    )
    tool_output_chars: int = Field(
        default=400,
        ge=16,
        description="Tool output shown to the policy (and kept in the record), in characters.",
    )
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
