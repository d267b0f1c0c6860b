"""The vLLM plugin that puts our token table into vLLM's xgrammar backend (atlas.verl.vllm_plugin).

vLLM is a GPU wheel and is not installed on CPU, so these tests cover: the entry point as
installed (the metadata vLLM reads), the masks of the same structural tag compiled on the table
vLLM builds by default (`TokenizerInfo.from_huggingface(tokenizer, vocab_size=...)`, as its
backend source does) and on the plugin's table, against the runtime's own grammar at every
position of real episodes; the wrapper on a backend-shaped dataclass; and the source check on
files that do and do not hold the wrapped method. Where vLLM is installed, the hash is also checked
against its real backend module (the H200 run logs the plugin's line from vLLM's engine core).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass

import pytest
import torch
import xgrammar as xgr

from atlas.config.study import load_config
from atlas.rl.replay import unpack_bitmask
from atlas.runtime.episode import EpisodeSpec, run_episodes
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.session import load_runtime
from atlas.verl import vllm_plugin
from conftest import REPO


def test_the_entry_point_is_installed_for_vllm():
    eps = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.name == "atlas_token_table"
    ]
    assert len(eps) == 1
    assert eps[0].load() is vllm_plugin.register


@pytest.fixture(scope="module")
def episodes(tiny_model, data_dir):
    cfg = load_config(REPO / "config" / "config.yaml")
    rt = load_runtime(tiny_model, cfg.runtime)
    questions = read_questions(data_dir / "train.parquet")
    tests = read_tests(data_dir / "tests.parquet")
    chosen = [next(q for q in questions if q["source"] == s) for s in ("gpqa", "lcb")]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), s) for q in chosen for s in range(2)]
    eps = run_episodes(rt, specs, cfg.runtime, cfg.graders, run="r", step=0, phase="train", seed=cfg.seed)
    return rt, eps


def _masks(compiled, tokens: list[int], vocab: int) -> list[torch.Tensor]:
    """The admitted-token mask before each token of a generation."""
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    out = []
    for t in tokens:
        matcher.fill_next_token_bitmask(bitmask, 0)
        out.append(unpack_bitmask(bitmask, vocab)[0].clone())
        assert matcher.accept_token(t)
    return out


def test_the_plugins_table_gives_the_runtimes_masks_and_vllms_does_not(episodes):
    rt, eps = episodes
    vocab = rt.engine.vocab_size
    ours = vllm_plugin.atlas_compiler(rt.tokenizer, vocab)
    default = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(rt.tokenizer, vocab_size=vocab))
    added = set(rt.tokenizer.get_added_vocab().values())
    compared, looser = 0, set()
    for ep in eps:
        for gen in ep.generations:
            call = rt.grammars.get(gen.offered)
            tokens = ep.token_ids[gen.start : gen.end]
            local = _masks(call.grammar, tokens, vocab)
            plugin = _masks(ours.compile_structural_tag(call.tag_json), tokens, vocab)
            vllm_default = _masks(default.compile_structural_tag(call.tag_json), tokens, vocab)
            assert len(local) == len(plugin) == len(tokens)
            for k, (a, b) in enumerate(zip(local, plugin, strict=True)):
                assert torch.equal(a, b), f"position {k}: {int((a ^ b).sum())} tokens differ"
            compared += len(local)
            for a, c in zip(local, vllm_default, strict=False):
                looser |= set((c & ~a).nonzero().flatten().tolist()) & added
    assert compared > 50
    # vLLM's default table admits added tokens (call tags, chat markers) where ours refuses them
    names = {rt.tokenizer.convert_ids_to_tokens(i) for i in looser}
    assert "</tool_call>" in names or "<|im_start|>" in names, names


def test_stop_tokens_are_the_runtimes(episodes):
    rt, _ = episodes
    assert set(vllm_plugin.stop_token_ids(rt.tokenizer)) == set(rt.stop_ids)


@dataclass
class _Backend:
    """The fields XgrammarBackend's set-up reads (vLLM's class is a dataclass too)."""

    tokenizer: object
    vocab_size: int

    def __post_init__(self):
        self.compiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
        )


def test_the_wrapped_set_up_compiles_on_our_table(episodes, monkeypatch):
    rt, eps = episodes
    monkeypatch.setattr(_Backend, "__post_init__", vllm_plugin.wrap_post_init(_Backend.__post_init__))
    backend = _Backend(rt.tokenizer, rt.engine.vocab_size)
    gen = eps[0].generations[0]
    call = rt.grammars.get(gen.offered)
    tokens = eps[0].token_ids[gen.start : gen.end]
    got = _masks(backend.compiler.compile_structural_tag(call.tag_json), tokens, backend.vocab_size)
    want = _masks(call.grammar, tokens, backend.vocab_size)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_register_does_nothing_unless_enabled(monkeypatch, tmp_path):
    """A stand-in for vLLM's xgrammar backend module: without the flag register() leaves its
    method as it is; with it, register() reaches the module and checks its source (which this
    stand-in fails, naming the method)."""
    import types

    source = tmp_path / "backend_xgrammar.py"
    source.write_text("class XgrammarBackend:\n    def __post_init__(self):\n        self.compiler = 1\n")
    module = types.ModuleType(vllm_plugin.TARGET_MODULE)
    module.__file__ = str(source)
    exec(compile(source.read_text(), str(source), "exec"), module.__dict__)  # noqa: S102 (the stand-in)
    original = module.XgrammarBackend.__post_init__
    monkeypatch.setitem(sys.modules, vllm_plugin.TARGET_MODULE, module)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.0-test")
    monkeypatch.delenv(vllm_plugin.ENABLE_ENV, raising=False)
    vllm_plugin.register()
    assert module.XgrammarBackend.__post_init__ is original
    monkeypatch.setenv(vllm_plugin.ENABLE_ENV, "1")
    with pytest.raises(vllm_plugin.VllmPluginError, match=r"XgrammarBackend\.__post_init__ \(sha256"):
        vllm_plugin.register()
    assert module.XgrammarBackend.__post_init__ is original  # refused before wrapping


def test_the_source_check_refuses_another_method(tmp_path, monkeypatch):
    body = "class XgrammarBackend:\n    def __post_init__(self):\n        self.compiler = None\n"
    path = tmp_path / "backend_xgrammar.py"
    path.write_text("import json\n\n" + body)
    digest = hashlib.sha256(body.split("\n", 1)[1].encode()).hexdigest()
    monkeypatch.setitem(vllm_plugin.EXPECTED_SOURCES, "9.9.9", digest)
    vllm_plugin.check_target(str(path), "9.9.9")  # the method's own lines, found by name
    path.write_text("import json\n\n" + body.replace("None", "build()"))
    with pytest.raises(vllm_plugin.VllmPluginError, match=r"XgrammarBackend.__post_init__ \(sha256"):
        vllm_plugin.check_target(str(path), "9.9.9")
    with pytest.raises(vllm_plugin.VllmPluginError, match="written against"):
        vllm_plugin.check_target(str(path), "0.1.0")
    path.write_text("class Other:\n    pass\n")
    with pytest.raises(vllm_plugin.VllmPluginError, match="no method XgrammarBackend.__post_init__"):
        vllm_plugin.check_target(str(path), "9.9.9")


@pytest.mark.gpu  # vLLM's wheel is built for CUDA machines: CI's CPU machine has none
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (a CUDA wheel) is not installed")
def test_the_installed_vllm_backend_is_the_one_wrapped():
    spec = importlib.util.find_spec(vllm_plugin.TARGET_MODULE)
    vllm_plugin.check_target(spec.origin, importlib.metadata.version("vllm"))
