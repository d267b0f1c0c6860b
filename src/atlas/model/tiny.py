"""The embedded default's model: a local byte-level BPE tokenizer and a random-init Qwen3 LM.

No hub is reachable, so both are made here. The tokenizer is trained on the fixture text plus a
few lines in the runtime's own chat and tool-call format; it has a ChatML chat template and
`<tool_call>` / `</tool_call>` as single tokens (the grammar forces them by id). The model is
a Qwen3 causal LM of about a million parameters, initialised from a fixed seed: the same config
gives the same bytes on the same library versions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from atlas.chat import CALL_CLOSE, CALL_OPEN, IM_END, IM_START, PAD, RESPONSE_CLOSE, RESPONSE_OPEN
from atlas.config.model import TinyModelConfig

# Control tokens are special (skipped when decoding); the tool tags are ordinary added tokens,
# as in Qwen, so decoded text shows the call.
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
TOOL_TOKENS = [CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE]
VOCAB_MULTIPLE = 64  # the LM head is padded to a multiple of this, as real checkpoints are

# ChatML in Qwen's layout: tools listed in the system turn, tool results as user turns wrapped in
# <tool_response>. Whitespace control keeps the rendered prompt exact.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    '{{- \'# Tools\\n\\nCall exactly one tool per turn, as <tool_call>{"name":...,"arguments":...}</tool_call>.\\n<tools>\' }}'
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Lines in the runtime's own format, so the calls and chat markers get sensible merges.
FORMAT_LINES = [
    f'{IM_START}assistant\nThe answer follows from the data.{CALL_OPEN}{{"name":"submit","arguments":{{"answer":"{x}"}}}}{CALL_CLOSE}{IM_END}'
    for x in "ABCD"
] + [
    f'{IM_START}assistant\nLet me check with code.{CALL_OPEN}{{"name":"python","arguments":{{"code":"print(2+2)"}}}}{CALL_CLOSE}{IM_END}',
    f'{IM_START}assistant\nRun the public tests.{CALL_OPEN}{{"name":"run_tests","arguments":{{"code":"n=int(input())\\nprint(n)"}}}}{CALL_CLOSE}{IM_END}',
    f'{IM_START}assistant\nSubmitting.{CALL_OPEN}{{"name":"submit","arguments":{{"code":"class Solution:\\n    pass"}}}}{CALL_CLOSE}{IM_END}',
    f"{IM_START}user\n{RESPONSE_OPEN}\nstdout: 4\n{RESPONSE_CLOSE}{IM_END}",
]


def corpus_lines(paths: Sequence[str | Path]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            yield from (line for line in f if line.strip())
    yield from FORMAT_LINES


def build_tokenizer(spec: TinyModelConfig) -> PreTrainedTokenizerFast:
    return train_tokenizer(corpus_lines(spec.corpus), spec.tokenizer_vocab_size, spec.max_position_embeddings)


def train_tokenizer(lines: Iterator[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens (control and tool tokens included) on `lines`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def synthetic_lines(lines: int, seed: int = 0) -> Iterator[str]:
    """Random words (letters and digits, 2-12 characters) plus the runtime's format lines: enough
    distinct pairs for a BPE of a real model's vocabulary size (151,936 takes ~40,000 lines)."""
    import random
    import string

    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    for _ in range(lines):
        yield " ".join("".join(rng.choices(alphabet, k=rng.randint(2, 12))) for _ in range(64))
    yield from FORMAT_LINES


def padded_vocab_size(n_tokens: int) -> int:
    return -(-n_tokens // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def build_model(spec: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=padded_vocab_size(len(tokenizer)),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()
