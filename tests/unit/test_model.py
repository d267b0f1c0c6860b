import json
from pathlib import Path

import pytest
import torch
import xgrammar as xgr
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config.study import config_slice, load_config
from atlas.hashing import tree_files, verify
from atlas.stages import build_tiny_model
from conftest import REPO


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model


def build_in_process(out: Path, **tiny_overrides) -> Path:
    """The build stage's main() in this process, from the repository as the workflow runs it (the
    session's model came from a subprocess: the bytes must not depend on which)."""
    s = config_slice(load_config(REPO / "config" / "config.yaml"), "model")
    s["model"]["tiny"].update(tiny_overrides)
    build_tiny_model.main(["--config-slice", json.dumps(s), "--out", str(out)])
    return out


def test_two_builds_give_identical_bytes(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    other = build_in_process(tmp_path / "tiny")
    names = tree_files(model_dir)
    assert names == tree_files(other)
    assert {"config.json", "model.safetensors", "tokenizer.json", "MANIFEST.json", "build_info.json"} <= set(
        names
    )
    for name in names:
        assert (model_dir / name).read_bytes() == (other / name).read_bytes(), name
    # A different seed gives different weights (the test can fail).
    third = build_in_process(tmp_path / "seed1", seed=1)
    assert (third / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()


def test_saved_model_is_a_qwen3_of_about_a_million_parameters(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    n = sum(p.numel() for p in model.parameters())
    assert 500_000 < n < 10_000_000
    info = json.loads((model_dir / "build_info.json").read_text())
    assert info["parameters"] == n and info["vocab_size"] == model.config.vocab_size
    assert model.config.vocab_size % 64 == 0
    assert verify(model_dir, check_sources=False) == []


def test_tokenizer_has_chat_template_and_single_call_tokens(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    call_open, call_close = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    ids = tok.encode('x<tool_call>{"name":"submit"}</tool_call>', add_special_tokens=False)
    assert ids.count(call_open) == 1 and ids.count(call_close) == 1 and ids[-1] == call_close
    assert tok.decode(ids) == 'x<tool_call>{"name":"submit"}</tool_call>'
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Q?"},
            {"role": "tool", "content": "42"},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    sample = "Ångström: λ = 1240/E nm; ∑ x_i ≥ 0 — ok"
    assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample


def test_xgrammar_constrains_the_tiny_tokenizer(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size, stop_token_ids=[eos])
    grammar = xgr.GrammarCompiler(info).compile_grammar('root ::= [a-z ]* "<tool_call>" "{}" "</tool_call>"')
    matcher = xgr.GrammarMatcher(grammar)
    for t in tok.encode("ok <tool_call>{}</tool_call>", add_special_tokens=False):
        assert matcher.accept_token(t)
    assert matcher.accept_token(eos) and matcher.is_terminated()
    # The mask after the call admits only the stop token.
    matcher = xgr.GrammarMatcher(grammar)
    for t in tok.encode("<tool_call>{}</tool_call>", add_special_tokens=False):
        matcher.accept_token(t)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    matcher.fill_next_token_bitmask(mask)
    logits = torch.zeros(1, info.vocab_size)
    xgr.apply_token_bitmask_inplace(logits, mask)
    assert torch.isfinite(logits).nonzero()[:, 1].tolist() == [eos]
