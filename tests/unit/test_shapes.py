"""The builder of real-scale shapes: Qwen3-1.7B / 8B dimensions and a synthetic tokenizer, which
the pipeline builds from `model.shape` / `model.tokenizer` and the benchmarks time."""

from pathlib import Path

import pytest
import torch
import xgrammar as xgr
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from atlas.chat import CALL_CLOSE, CALL_OPEN, IM_END
from atlas.config.model import ModelConfig
from atlas.model.shapes import SHAPES, base_parameters, shape_model, synthetic_tokenizer

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
)


class _Vocab:
    """A stand-in length for the meta-device count: the head is sized from len(tokenizer)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def convert_tokens_to_ids(self, token: str) -> int:
        return {IM_END: 2}.get(token, 0)


@pytest.fixture(scope="module")
def small_tokenizer():
    return synthetic_tokenizer(vocab_size=700, lines=300, max_length=512)


@pytest.mark.parametrize(
    ("shape", "parameters"),
    # Qwen3-1.7B (tied head: 1.41B in the layers + 0.31B embedding) and Qwen3-8B, vocab 151,936
    [("1.7b", 1_720_574_976), ("8b", 8_190_735_360)],
)
def test_named_shapes_have_the_qwen3_parameter_counts(shape, parameters):
    model = shape_model(shape, _Vocab(151_936), device="meta")
    assert base_parameters(model) == parameters
    assert model.config.vocab_size == 151_936 and model.config.head_dim == 128
    assert model.config.tie_word_embeddings == SHAPES[shape]["tie_word_embeddings"]


def test_synthetic_tokenizer_is_a_chat_tokenizer_of_the_asked_size(small_tokenizer):
    assert len(small_tokenizer) == 700
    for tag in (CALL_OPEN, CALL_CLOSE, IM_END):
        assert len(small_tokenizer.encode(tag, add_special_tokens=False)) == 1, tag
    ids = small_tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert small_tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    # same seed, same merges; another seed, other merges
    assert synthetic_tokenizer(700, 300, 512).get_vocab() == small_tokenizer.get_vocab()
    assert synthetic_tokenizer(700, 300, 512, seed=1).get_vocab() != small_tokenizer.get_vocab()


def test_shape_model_is_seeded_padded_and_accepted_by_xgrammar(small_tokenizer):
    a = shape_model(SMALL, small_tokenizer, seed=0, dtype=torch.float32)
    b = shape_model(SMALL, small_tokenizer, seed=0, dtype=torch.float32)
    c = shape_model(SMALL, small_tokenizer, seed=1, dtype=torch.float32)
    assert a.config.vocab_size == 704  # 700 padded to a multiple of 64
    assert a.config.eos_token_id == small_tokenizer.convert_tokens_to_ids(IM_END)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])
    assert shape_model(SMALL, small_tokenizer).dtype == torch.bfloat16
    ids = torch.tensor([small_tokenizer.encode("hello world")])
    with torch.no_grad():
        assert a(input_ids=ids).logits.shape == (1, ids.shape[1], 704)
    xgr.TokenizerInfo.from_huggingface(
        small_tokenizer, vocab_size=704, stop_token_ids=[a.config.eos_token_id]
    )


def test_the_seeded_init_is_transformers_init_and_independent_of_the_thread_count(
    small_tokenizer, monkeypatch
):
    import atlas.model.shapes as shapes

    monkeypatch.setattr(shapes, "INIT_CHUNK", 1000)  # many chunks per matrix
    many = shape_model(SMALL, small_tokenizer, seed=3, dtype=torch.float32)
    monkeypatch.setattr(shapes.os, "cpu_count", lambda: 1)
    one = shape_model(SMALL, small_tokenizer, seed=3, dtype=torch.float32)
    s1, s2 = many.state_dict(), one.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    up = s1["model.layers.0.mlp.up_proj.weight"]
    assert abs(up.std().item() - many.config.initializer_range) < 0.002 and abs(up.mean().item()) < 0.002
    # each chunk its own draw: no two chunks of a matrix repeat each other
    assert not torch.equal(up.view(-1)[:1000], up.view(-1)[1000:2000])
    assert torch.equal(s1["model.norm.weight"], torch.ones(64))
    assert torch.equal(s1["model.layers.1.self_attn.q_norm.weight"], torch.ones(16))
    pad = small_tokenizer.pad_token_id
    assert not s1["model.embed_tokens.weight"][pad].any() and s1["model.embed_tokens.weight"][pad + 1].any()


def test_a_bf16_shape_reloaded_from_disk_gives_the_same_logits(small_tokenizer, tmp_path):
    # build_tiny_model refuses a model whose reloaded copy differs; the rotary frequencies must
    # stay float32 in memory as they do in from_pretrained
    model = shape_model(SMALL | {"tie_word_embeddings": True}, small_tokenizer, seed=0)  # as 1.7B
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ids = torch.tensor([small_tokenizer.encode("hello world, the sixth word")])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_shape_and_tokenizer_are_for_built_models_only():
    tiny = {"corpus": ["resources/fixtures/gpqa_train.csv"]}
    spec = ModelConfig.model_validate(
        {"name": "q", "tiny": tiny, "shape": "1.7b", "tokenizer": "synthetic-151k"}
    )
    assert (spec.shape, spec.tokenizer) == ("1.7b", "synthetic-151k")
    with pytest.raises(ValidationError, match="leave them unset with model.path"):
        ModelConfig.model_validate({"name": "q", "path": "/models/q", "shape": "8b"})
    with pytest.raises(ValidationError, match="shape"):
        ModelConfig.model_validate({"name": "q", "tiny": tiny, "shape": "70b"})


def test_the_h200_config_builds_the_1_7b_shape_and_trains_on_the_report_batch():
    """config/h200.yaml over config/config.yaml, as snakemake --configfile merges it."""
    import yaml

    from atlas.config.study import merged, parse_config

    repo = Path(__file__).resolve().parents[2]
    raw = merged(*(yaml.safe_load((repo / "config" / n).read_text()) for n in ("config.yaml", "h200.yaml")))
    cfg = parse_config(raw, "config/h200.yaml")
    assert (cfg.model.shape, cfg.model.tokenizer) == ("1.7b", "synthetic-151k")
    assert cfg.schedule.questions_per_step * cfg.training.responses_per_question == 256  # 32 x 8
    assert (cfg.resources.device, cfg.resources.gpus) == ("cuda", 1)
    assert cfg.training.ppo.micro_batch_tokens and cfg.training.merged_rollouts == "auto"
