"""Model build stage: the tiny tokenizer + random-init Qwen3 model, saved in HF format.

`model.shape` and `model.tokenizer` build the same at Qwen3-1.7B / 8B scale instead
(atlas.model.shapes), saved in bf16.

Writes `<out>/` (config.json, generation_config.json, model.safetensors, tokenizer files,
build_info.json, MANIFEST.json) through a temporary folder renamed into place, so a crash leaves
no half-built model. Before the rename the saved folder is reloaded and checked: same logits as
the model in memory, and a tokenizer xgrammar accepts.

    python -m atlas.stages.build_tiny_model --config-slice '{"model": ...}' --out results/models/tiny
"""

from __future__ import annotations

import torch
import xgrammar as xgr
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.chat import CALL_CLOSE, CALL_OPEN, IM_END
from atlas.config.model import ModelSlice
from atlas.errors import InputError
from atlas.hashing import atomic_dir, atomic_write_json, write_manifest
from atlas.model.shapes import SHAPES, model_tokenizer, shape_model
from atlas.model.tiny import build_model
from atlas.stage import code_files, log, run, stage_parser

STAGE = "model"
MODULE = "atlas.stages.build_tiny_model"


def check_saved(folder, model, tokenizer) -> None:
    """Reload what was written and compare it with what is in memory."""
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=model.dtype)
    reloaded_tok = AutoTokenizer.from_pretrained(folder)
    ids = reloaded_tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 x 7?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.no_grad():
        if not torch.equal(model(ids).logits, reloaded(ids).logits):
            raise RuntimeError(f"{folder}: reloaded model gives different logits")
    for tag in (CALL_OPEN, CALL_CLOSE):
        if len(reloaded_tok.encode(tag, add_special_tokens=False)) != 1:
            raise RuntimeError(f"{folder}: {tag} is not a single token")
    # xgrammar must accept the tokenizer with the model's (padded) vocabulary.
    xgr.TokenizerInfo.from_huggingface(
        reloaded_tok,
        vocab_size=model.config.vocab_size,
        stop_token_ids=[reloaded_tok.convert_tokens_to_ids(IM_END)],
    )


def main(argv: list[str] | None = None) -> None:
    args = stage_parser(__doc__.splitlines()[0]).parse_args(argv)
    spec = ModelSlice.model_validate(args.config_slice).model
    if spec.tiny is None:
        raise InputError(f"model.tiny is not set: model {spec.name!r} is read from {spec.path}, not built")

    tokenizer = model_tokenizer(spec)
    log(STAGE, "tokenizer trained", tokens=len(tokenizer), kind=spec.tokenizer)
    if spec.shape == "tiny":
        model = build_model(spec.tiny, tokenizer)
    else:
        model = shape_model(
            spec.shape, tokenizer, spec.tiny.seed, max_position_embeddings=spec.tiny.max_position_embeddings
        )
    n_params = sum(p.numel() for p in model.parameters())
    log(STAGE, "model initialised", parameters=n_params, vocab=model.config.vocab_size)

    with atomic_dir(args.out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(
            tmp / "build_info.json",
            {
                "name": spec.name,
                "architecture": "Qwen3ForCausalLM",
                "parameters": n_params,
                "tokenizer_tokens": len(tokenizer),
                "vocab_size": model.config.vocab_size,
                "special_token_ids": {
                    t: tokenizer.convert_tokens_to_ids(t)
                    for t in (*tokenizer.all_special_tokens, CALL_OPEN, CALL_CLOSE)
                },
                "spec": spec.tiny.model_dump(mode="json"),
                "shape": spec.shape if spec.shape == "tiny" else SHAPES[spec.shape],
                "tokenizer": spec.tokenizer,
            },
        )
        check_saved(tmp, model, tokenizer)
        write_manifest(
            tmp, stage=STAGE, inputs=spec.tiny.corpus, code=code_files(MODULE), config=args.config_slice
        )
    log(STAGE, "wrote", out=args.out)


if __name__ == "__main__":
    run(main)
