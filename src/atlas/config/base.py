"""Strict models, config errors and their messages: what every section module builds on."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from atlas.errors import InputError


class Strict(BaseModel):
    """Unknown keys are errors: a typo in a config key must not be silently ignored. Values are
    strictly typed ("2" is no int, true no number) and numbers finite (.inf and .nan refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def list_as_tuple(value: Any) -> Any:
    """YAML and JSON have no tuples: a list of the right items is read as one (items stay strict)."""
    return tuple(value) if isinstance(value, list) else value


FloatPair = Annotated[tuple[float, float], BeforeValidator(list_as_tuple)]


class ConfigError(InputError):
    """A config that does not satisfy the models; the message names every bad key path."""


def _hint(value: Any) -> str:
    """Why a value that looks right is refused: the config is strictly typed."""
    if isinstance(value, bool):
        return ": a boolean, not a number"
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return ": a string; write the number unquoted (YAML reads 1e-6 as a string: write 1.0e-6)"
    return ""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        scalar = e["type"] != "missing" and not isinstance(e["input"], (dict, list))
        got = f" (got {e['input']!r}{_hint(e['input'])})" if scalar else ""
        lines.append(f"  {path}: {e['msg']}{got}")
    return "\n".join(lines)
