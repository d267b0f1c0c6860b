"""A loaded runtime: tokenizer, model, rollout engine and call grammars for one base model.

The tool-response wrapper is read off the model's own chat template (a probe conversation), so
the same code serves the tiny model and a real Qwen-family checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.chat import CALL_CLOSE, CALL_OPEN
from atlas.config.runtime import RuntimeConfig
from atlas.runtime.engine import HFEngine, LogitBias, RolloutEngine
from atlas.runtime.fast_engine import StaticEngine
from atlas.runtime.grammar import CallGrammars

STEER_LOGIT = 1e4  # added to a scripted token's logit: sampled with probability ~1 when legal
_PROBE_CALL, _PROBE_OUTPUT = "\u2063CALL\u2063", "\u2063OUTPUT\u2063"


@dataclass
class Runtime:
    tokenizer: object
    model: object | None  # None where another process generates (the verl agent loop)
    engine: RolloutEngine | None  # HFEngine, or StaticEngine on a GPU
    grammars: CallGrammars
    call_open_id: int
    call_close_id: int
    stop_ids: frozenset[int]
    response_head: list[int]  # tokens between a generation's stop token and the tool output
    response_tail: list[int]  # tokens after the tool output, through the next generation prompt

    def chat_ids(self, messages: list[dict], tools: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
        return list(out["input_ids"] if not isinstance(out, list) else out)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def sanitize(self, text: str) -> str:
        """Tool output must not smuggle in control or call tokens: break every added-token string."""
        for token in self.tokenizer.get_added_vocab():
            if token in text:
                text = text.replace(token, token[0] + "\u200b" + token[1:])
        return text

    def tool_response_ids(self, output: str) -> list[int]:
        body = self.tokenizer.encode(self.sanitize(output), add_special_tokens=False)
        return self.response_head + body + self.response_tail

    def steer(self, text: str) -> LogitBias:
        """A bias toward generating `text` token by token, while the generation still follows it.

        Scripted cases use it; the grammar mask is applied after the bias, so a steered token the
        grammar forbids is simply not sampled and the generation goes its own (legal) way."""
        target = self.tokenizer.encode(text, add_special_tokens=False)
        vocab = self.engine.vocab_size

        def bias(generated: list[int]) -> torch.Tensor | None:
            k = len(generated)
            if k >= len(target) or generated != target[:k]:
                return None
            b = torch.zeros(vocab)
            b[target[k]] = STEER_LOGIT
            return b

        return bias

    def tool_response_bound(self, output_chars: int) -> int:
        # A character is at most 4 UTF-8 bytes, and a byte-level BPE token holds at least one byte.
        return len(self.response_head) + len(self.response_tail) + 4 * output_chars


def _response_wrapper(tokenizer) -> tuple[list[int], list[int]]:
    base = [{"role": "user", "content": "Q"}]
    full = tokenizer.apply_chat_template(
        [*base, {"role": "assistant", "content": _PROBE_CALL}, {"role": "tool", "content": _PROBE_OUTPUT}],
        add_generation_prompt=True,
        tokenize=False,
    )
    after_call = full.split(_PROBE_CALL, 1)[1]
    head, tail = after_call.split(_PROBE_OUTPUT, 1)
    eos = tokenizer.eos_token
    if not head.startswith(eos):
        raise ValueError(
            f"chat template does not close an assistant turn with {eos!r}; cannot splice tool turns"
        )
    head = head[len(eos) :]  # the generation already ended with the stop token
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    return encode(head), encode(tail)


def tool_runtime(tokenizer, vocab_size: int, cfg: RuntimeConfig, model=None, engine=None) -> Runtime:
    """The runtime's tokenizer side (chat template, call grammars, tool-response wrapper); the model
    and engine are optional, for callers whose tokens come from elsewhere (a vLLM server)."""
    stop_ids = frozenset({tokenizer.convert_tokens_to_ids(tokenizer.eos_token)})
    grammars = CallGrammars(
        tokenizer, vocab_size, sorted(stop_ids), cfg.max_text_tokens, cfg.max_generation_tokens
    )
    head, tail = _response_wrapper(tokenizer)
    return Runtime(
        tokenizer=tokenizer,
        model=model,
        engine=engine,
        grammars=grammars,
        call_open_id=tokenizer.convert_tokens_to_ids(CALL_OPEN),
        call_close_id=tokenizer.convert_tokens_to_ids(CALL_CLOSE),
        stop_ids=stop_ids,
        response_head=head,
        response_tail=tail,
    )


def make_runtime(
    model, tokenizer, cfg: RuntimeConfig, constrained: bool = True, fast: bool | None = None
) -> Runtime:
    """A runtime around an already loaded model (the base, or the actor adapter during training).
    Its engine is StaticEngine (`fast`; by default on a CUDA device) or HFEngine: the same
    contract and, on the same log-probs, the same tokens."""
    rt = tool_runtime(tokenizer, model.config.vocab_size, cfg, model=model)
    if fast is None:
        fast = next(model.parameters()).device.type == "cuda"
    common = dict(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        constrained=constrained,
        banned_token_ids=sorted(rt.grammars.banned_token_ids),
    )
    vocab = model.config.vocab_size
    rt.engine = (
        StaticEngine(model, vocab, rt.stop_ids, **common)
        if fast
        else HFEngine(model, vocab, rt.stop_ids, tokenizer.pad_token_id, **common)
    )
    return rt


def load_model(model_dir: str | Path, device: str = "cpu"):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32 if device == "cpu" else torch.bfloat16
    )
    return model.to(device), tokenizer


def load_runtime(
    model_dir: str | Path, cfg: RuntimeConfig, device: str = "cpu", constrained: bool = True
) -> Runtime:
    model, tokenizer = load_model(model_dir, device)
    return make_runtime(model, tokenizer, cfg, constrained)
