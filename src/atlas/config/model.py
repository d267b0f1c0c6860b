"""The base model (`model`), and the model stage's slice."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from atlas.config.base import Strict


class TinyModelConfig(Strict):
    """The embedded default's model: a local byte-level BPE tokenizer and a random-init Qwen3."""

    tokenizer_vocab_size: int = Field(
        default=2048, ge=300, description="Target BPE vocabulary size (bytes + merges + specials)."
    )
    corpus: list[str] = Field(
        min_length=1,
        description="Text files the tokenizer is trained on, read as raw UTF-8 text.",
    )
    hidden_size: int = Field(default=128, ge=8, description="Model width.")
    intermediate_size: int = Field(default=512, ge=8, description="MLP inner width.")
    num_hidden_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=2, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=1, ge=1, description="Key/value heads (GQA).")
    head_dim: int = Field(default=64, ge=4, description="Width of one attention head.")
    max_position_embeddings: int = Field(
        default=8192, ge=256, description="Longest trajectory the model accepts, in tokens."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        return self


class ModelConfig(Strict):
    """The base model: built locally (tiny) or read from a local HF-format folder."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Model name; a built model lands in results/models/<name>/.",
    )
    path: str | None = Field(
        default=None,
        description="Local folder of a real HF-format model (weights + tokenizer). Null builds "
        "the tiny model from `tiny` instead.",
    )
    tiny: TinyModelConfig | None = Field(
        default=None, description="Spec of the locally built model; required when path is null."
    )
    shape: Literal["tiny", "1.7b", "8b"] = Field(
        default="tiny",
        description="Dimensions of the built model: tiny takes them from `tiny`; 1.7b and 8b are "
        "Qwen3-1.7B's and Qwen3-8B's (atlas.model.shapes; `tiny` still gives seed, corpus and "
        "max_position_embeddings). Built models of these shapes are saved in bf16.",
    )
    tokenizer: Literal["corpus", "synthetic-151k"] = Field(
        default="corpus",
        description="Tokenizer of the built model: corpus trains a BPE of "
        "tiny.tokenizer_vocab_size on tiny.corpus; synthetic-151k trains one of 151,936 tokens "
        "(a Qwen3 vocabulary's size) on seeded random words, so the output head and the grammar "
        "masks have a real model's width.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path is None and self.tiny is None:
            raise ValueError("set either model.path (a real model) or model.tiny (build one)")
        if self.path is not None and self.tiny is not None:
            raise ValueError("set only one of model.path and model.tiny")
        if self.path is not None and (self.shape != "tiny" or self.tokenizer != "corpus"):
            raise ValueError(
                "model.shape and model.tokenizer describe a built model: leave them unset with model.path"
            )
        return self


class ModelSlice(Strict):
    model: ModelConfig = Field(description="Base model.")
