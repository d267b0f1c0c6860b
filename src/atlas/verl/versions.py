"""The versions the verl engine keeps its guarantees with, checked when atlas.verl is imported.

The free-text bound of every generation (the report's whitespace-loop failure) is xgrammar's
`AnyTextFormat.max_tokens`, added in xgrammar 0.2.6. An older xgrammar's pydantic model drops the
unknown field silently and the bound disappears; resolvers pick one when a pin elsewhere holds
apache-tvm-ffi below 0.1.10 (vLLM 0.24.0 pins 0.1.9: xgrammar 0.2.3). So the field itself is
checked, not a version string.

Run together on one H200 (docs/verl.md): verl 0.9.1, vLLM 0.26.0, torch 2.11.0+cu130,
xgrammar 0.2.7, apache-tvm-ffi 0.1.10, transformers 5.10.4, tokenizers 0.22.2.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

XGRAMMAR_MIN = "0.2.6"


class GrammarBoundError(ImportError):
    """The installed xgrammar cannot bound free text: the generation bound would be lost."""


def check_xgrammar() -> None:
    from xgrammar.structural_tag import AnyTextFormat

    if "max_tokens" not in AnyTextFormat.model_fields:
        try:
            found = version("xgrammar")
        except PackageNotFoundError:
            found = "unknown"
        raise GrammarBoundError(
            f"xgrammar {found}: its AnyTextFormat has no max_tokens field, so the free-text bound of "
            f"every generation would be dropped silently; install xgrammar>={XGRAMMAR_MIN} (a "
            "vLLM that pins apache-tvm-ffi<0.1.10, such as 0.24.0, forces an older xgrammar: use "
            "the versions of the `gpu` extra)"
        )
