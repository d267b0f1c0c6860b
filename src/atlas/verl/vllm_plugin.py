"""Our grammar token table inside vLLM: a `vllm.general_plugins` entry point (pyproject.toml).

vLLM's xgrammar backend builds its token table with `TokenizerInfo.from_huggingface(tokenizer,
vocab_size=...)` (vllm/v1/structured_output/backend_xgrammar.py, `XgrammarBackend.__post_init__`).
That table treats added tokens as their text, so the grammar vLLM enforces admits `</tool_call>`,
`<|im_start|>` and the other added tokens inside a code string, where ours admits none
(atlas.runtime.grammar.grammar_tokenizer_info). A token our replay then refuses fails the episode.

vLLM calls every `vllm.general_plugins` entry point in each of its processes before it builds the
engine. `register` wraps `XgrammarBackend.__post_init__`: vLLM's own set-up runs, then the
backend's compiler is rebuilt on our table, for the same tokenizer and vocabulary size, so the
structural tag each request carries compiles to exactly the masks the local engine uses.

The plugin acts only where `ATLAS_VLLM_TOKEN_TABLE=1` (the verl launcher puts it in the Ray job's
environment, which vLLM's server processes inherit): atlas installed beside vLLM changes nothing
for anyone else. It checks that the method it wraps has the source of the vLLM it was written
against (the sha256 of `__post_init__`'s lines, read from the module file) and fails loudly
otherwise. vLLM swallows an exception raised while *importing* a plugin but not one raised by
calling it, so this module imports only the standard library at the top.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os

logger = logging.getLogger(__name__)

ENABLE_ENV = "ATLAS_VLLM_TOKEN_TABLE"
TARGET_MODULE = "vllm.v1.structured_output.backend_xgrammar"
TARGET = ("XgrammarBackend", "__post_init__")
# sha256 of `XgrammarBackend.__post_init__`'s source lines in vLLM 0.26.0
EXPECTED_SOURCES = {"0.26.0": "79ad733eac8a836c161d902ebce97332daa8406d21d2a7634f49e3fc13a08fb3"}
_WRAPPED = "__atlas_token_table__"


class VllmPluginError(RuntimeError):
    """The installed vLLM's xgrammar backend is not the one this plugin was written against."""


def method_source(path: str, cls: str, name: str) -> str:
    """The source lines of `cls.name` in the Python file `path`, read without importing it."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name:
                    return "".join(text.splitlines(keepends=True)[fn.lineno - 1 : fn.end_lineno])
    raise VllmPluginError(f"{path}: no method {cls}.{name}; atlas's vLLM plugin cannot wrap it")


def check_target(path: str, vllm_version: str) -> None:
    """Fail unless `path` holds the XgrammarBackend.__post_init__ this plugin was written against."""
    digest = hashlib.sha256(method_source(path, *TARGET).encode()).hexdigest()
    expected = EXPECTED_SOURCES.get(vllm_version)
    if digest != expected:
        raise VllmPluginError(
            f"vLLM {vllm_version}: {path}'s {'.'.join(TARGET)} (sha256 {digest[:12]}) is not the "
            f"source atlas.verl.vllm_plugin was written against ({sorted(EXPECTED_SOURCES)}); read it, "
            "check that it still builds `self.compiler` from the tokenizer and `self.vocab_size`, then "
            "add its hash to EXPECTED_SOURCES"
        )


def stop_token_ids(tokenizer) -> list[int]:
    """The runtime's stop tokens (atlas.runtime.session.tool_runtime): the tokenizer's EOS token."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]


def atlas_compiler(tokenizer, vocab_size: int, **compiler_kwargs):
    """An xgrammar compiler on our token table for this tokenizer and logits width."""
    import xgrammar as xgr

    from atlas.runtime.grammar import grammar_tokenizer_info

    info, _ = grammar_tokenizer_info(tokenizer, vocab_size, stop_token_ids(tokenizer))
    return xgr.GrammarCompiler(info, **compiler_kwargs)


def _cache_bytes() -> int:
    try:
        import vllm.envs
    except ImportError:  # the CPU tests wrap a stand-in backend
        return 512 * 1024 * 1024
    return vllm.envs.VLLM_XGRAMMAR_CACHE_MB * 1024 * 1024


def wrap_post_init(original):
    """XgrammarBackend.__post_init__: vLLM's, then the compiler rebuilt on our table (same threads
    and cache as vLLM's)."""

    def __post_init__(self):
        original(self)
        self.compiler = atlas_compiler(
            self.tokenizer,
            self.vocab_size,
            max_threads=8,
            cache_enabled=True,
            cache_limit_bytes=_cache_bytes(),
        )
        logger.warning(
            "atlas: vLLM's xgrammar backend compiles on atlas's token table (vocab %d)", self.vocab_size
        )

    setattr(__post_init__, _WRAPPED, original)
    return __post_init__


def register() -> None:
    """The entry point vLLM calls in each of its processes (loading plugins more than once is
    allowed, so a second call leaves the wrapped method as it is)."""
    if os.environ.get(ENABLE_ENV) != "1":
        return
    import importlib
    import importlib.metadata

    module = importlib.import_module(TARGET_MODULE)
    backend = getattr(module, TARGET[0])
    if hasattr(backend.__post_init__, _WRAPPED):
        return
    check_target(module.__file__, importlib.metadata.version("vllm"))
    # the wrapped dataclass hook: dataclasses call cls.__post_init__ at construction time
    backend.__post_init__ = wrap_post_init(backend.__post_init__)
