"""Built models at a real model's scale: Qwen3-1.7B and Qwen3-8B dimensions, a 151,936-token tokenizer.

No hub is reachable, so a GPU run of the pipeline builds its base the way the embedded default
builds the tiny one (atlas.model.tiny), only larger:

    model.shape: 1.7b | 8b            Qwen3-1.7B's / Qwen3-8B's layer dimensions, random init
    model.tokenizer: synthetic-151k   a byte-level BPE of 151,936 tokens (Qwen3's vocabulary
                                      size) trained on seeded random words plus the runtime's
                                      chat and tool-call lines, so the output head, the grammar
                                      masks and xgrammar's tokenizer info have a real model's width

The benchmarks (scripts/bench_*.py) build the same models through `shape_model`, so what they
time is what the pipeline trains. Weights are random: the figures are about speed and memory.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from atlas.chat import IM_END, PAD
from atlas.config.model import ModelConfig
from atlas.model.tiny import build_tokenizer, padded_vocab_size, synthetic_lines, train_tokenizer

# Qwen3-1.7B and Qwen3-8B (their config.json), head_dim 128; the vocabulary comes from the tokenizer.
SHAPES: dict[str, dict] = {
    "1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
}
SYNTHETIC_VOCAB = 151_936
SYNTHETIC_LINES = 12_000  # random-word lines: enough distinct pairs for 151,936 merges (10,000 are)
INIT_CHUNK = 1 << 24  # elements drawn from one generator: the unit of the parallel init


def synthetic_tokenizer(
    vocab_size: int = SYNTHETIC_VOCAB, lines: int = SYNTHETIC_LINES, max_length: int = 8192, seed: int = 0
) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens on seeded random words (the tiny model's chat
    template, control and tool tokens). Too few lines for that many merges is an error."""
    tokenizer = train_tokenizer(synthetic_lines(lines, seed), vocab_size, max_length)
    if len(tokenizer) != vocab_size:
        raise ValueError(
            f"synthetic tokenizer: {lines} lines gave {len(tokenizer)} tokens, not {vocab_size}: use more lines"
        )
    return tokenizer


def model_tokenizer(spec: ModelConfig) -> PreTrainedTokenizerFast:
    """The built model's tokenizer, as `model.tokenizer` asks."""
    if spec.tokenizer == "synthetic-151k":
        return synthetic_tokenizer(max_length=spec.tiny.max_position_embeddings, seed=spec.tiny.seed)
    return build_tokenizer(spec.tiny)


def shape_config(dims: dict, tokenizer, max_position_embeddings: int) -> Qwen3Config:
    """A Qwen3 config of `dims` over `tokenizer` (the head padded to a multiple of 64 tokens)."""
    return Qwen3Config(
        vocab_size=padded_vocab_size(len(tokenizer)),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        **dims,
    )


def shape_model(
    dims: dict | str,
    tokenizer,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    max_position_embeddings: int = 8192,
) -> Qwen3ForCausalLM:
    """A random-init Qwen3 causal LM of `dims` (a name in SHAPES or a dict of its keys), built
    directly on `device` in `dtype` from a fixed seed (see seeded_init)."""
    dims = SHAPES[dims] if isinstance(dims, str) else dims
    config = shape_config(dims, tokenizer, max_position_embeddings)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    if torch.device(device).type == "meta":
        return model.to(dtype).eval()
    # the weights in `dtype`, the rotary frequencies (buffers) in float32: that is what
    # from_pretrained(dtype=...) gives, so the model reloaded from disk computes the same logits
    model.to(dtype).to_empty(device=device)
    model.tie_weights()  # to_empty gives the tied head a tensor of its own: share the embedding again
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    seeded_init(model, seed, config.initializer_range)
    return model.eval()


def seeded_init(model: torch.nn.Module, seed: int, std: float) -> None:
    """transformers' init for a Qwen3 model, drawn in parallel: every matrix N(0, std), every
    norm weight 1, the embedding's padding row 0. Each INIT_CHUNK elements of a matrix come from
    their own generator, seeded by (seed, the chunk's index in parameter order), so the weights
    depend on the seed alone, not on the number of threads; CPU threads draw chunks side by side
    (torch releases the GIL), where transformers' own init draws 1.7B numbers one at a time."""
    jobs, k = [], 0
    for name, p in model.named_parameters():  # a tied head is the embedding: listed once
        if p.ndim == 1:
            p.data.fill_(1.0)
            continue
        if p.ndim != 2:
            raise ValueError(f"seeded_init: parameter {name} has {p.ndim} dimensions")
        flat = p.data.view(-1)
        for start in range(0, flat.numel(), INIT_CHUNK):
            jobs.append((flat[start : start + INIT_CHUNK], seed * 1_000_003 + k))
            k += 1

    def draw(job) -> None:
        out, chunk_seed = job
        g = torch.Generator(device=out.device).manual_seed(chunk_seed)
        out.copy_(
            torch.empty(out.shape, dtype=torch.float32, device=out.device).normal_(0.0, std, generator=g)
        )

    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        list(pool.map(draw, jobs))
    embed = model.get_input_embeddings()
    if embed.padding_idx is not None:
        embed.weight.data[embed.padding_idx].zero_()


def base_parameters(model: torch.nn.Module) -> int:
    """Parameters of the base model, without LoRA tensors peft put inside its layers (a tied
    head is the embedding tensor, counted once)."""
    return sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
