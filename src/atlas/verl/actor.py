"""verl's actor log-probs under our replayed grammar masks, as atlas.rl.ppo computes them.

vLLM samples each generated token from the masked distribution (the structural tag's bitmask); verl
0.9.1 recomputes old, new and reference log-probs over the full vocabulary
(FSDPEngineWithLMHead.prepare_model_outputs), so its PPO ratio and KL would compare unmasked
distributions. Here the log-prob of every generated token is taken under the mask it was sampled
with: log_softmax(masked(logits / T)), in float32, exactly atlas.rl.replay.masked_logprobs. A forced
token (one legal token) gets log-prob 0. Entropy stays that of the raw next-token distribution, as
in the local engine (atlas.rl.ppo).

The masks travel from the agent loop to the actor through verl's TransferQueue as two per-sample
tensors (AtlasAgentLoopOutput.as_dict): a dense bitmask is ceil(V / 32) int32 words per token
(19 KB at V = 151,936), while the tokens of a generation share few distinct masks, so

    grammar_mask_table  [M * W] int32   the sample's distinct masks, flattened (W = ceil(V / 32))
    grammar_mask_index  [R] int64       per response token: its row of the table, -1 for tool
                                        output (not generated; its log-prob is never used)

`MaskedActorEngine` (a subclass of verl's FSDPEngineWithLMHead) replaces it in verl's
EngineRegistry for the language model (fsdp, fsdp2). Like atlas.verl.critic, the module checks
verl's version and the source of what it overrides on import, and reaches every verl process
through VERL_USE_EXTERNAL_MODULES.
"""

from __future__ import annotations

import torch
from verl.utils import tensordict_utils as tu
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from atlas.rl.replay import unpack_bitmask
from atlas.verl import patching
from atlas.verl.transport import INDEX, TABLE

VERL_VERSION = "0.9.1"
_EXPECTED_SOURCES = {
    # wrapped: its log_probs are replaced at the generated tokens; its output layout is relied on
    # (nested log_probs over input_ids' offsets, labels rolled by one, per-token temperature)
    "FSDPEngineWithLMHead.prepare_model_outputs": "5239f536e8f617e3538cc0aa2c4aaf7d4d27e59877abb40abe635e6a2d46c7ce",
}


class VerlActorPatchError(RuntimeError):
    """The installed verl is not the one this module was written against, or a batch cannot be
    masked (fused kernels, sequence parallelism)."""


def mask_words(vocab: int) -> int:
    return (vocab + 31) // 32


def row_masks(input_lengths: list[int], indices: list[torch.Tensor], tables: list[torch.Tensor], words: int):
    """For a packed batch (sequences back to back), the mask of each logits row: (rows [n] int64
    of the packed rows that predict a generated token, bitmask [n, words] int32).

    Row j of sequence b predicts token j + 1, so response token r (sequence position P + r, with
    P = length - len(index)) is predicted by row P + r - 1."""
    rows, masks, offset = [], [], 0
    for length, index, table in zip(input_lengths, indices, tables, strict=True):
        index = index.to(torch.long).cpu()
        table = table.to(torch.int32).reshape(-1, words)
        prompt = length - index.numel()
        if prompt < 1:
            raise VerlActorPatchError(
                f"a sample of {length} tokens has {index.numel()} masked response tokens"
            )
        if index.numel() and int(index.max()) >= table.shape[0]:
            raise VerlActorPatchError(f"mask index {int(index.max())} past a table of {table.shape[0]} masks")
        r = (index >= 0).nonzero().flatten()
        rows.append(offset + prompt - 1 + r)
        masks.append(table[index[r]])
        offset += length
    if not rows:
        return torch.empty(0, dtype=torch.long), torch.empty(0, words, dtype=torch.int32)
    return torch.cat(rows), torch.cat(masks)


def masked_rows_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: torch.Tensor,
    rows: torch.Tensor,
    bitmask: torch.Tensor,
) -> torch.Tensor:
    """log p(label) under softmax(masked(logits / T)) at `rows` of packed [N, V] logits, float32."""
    rows = rows.to(logits.device)
    scaled = logits[rows].float() / temperature[rows].float().unsqueeze(-1)
    allowed = unpack_bitmask(bitmask.to(logits.device), scaled.shape[-1])
    scaled = scaled.masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, labels[rows].view(-1, 1)).squeeze(-1)


def _nested_list(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor) and value.is_nested:
        return list(value.unbind())
    return list(value)


def packed_logits(output, output_args, micro_batch, use_remove_padding: bool):
    """The [N, V] logits rows, [N] labels and [N] temperatures of the packed sequences, in the
    order verl's nested log_probs use (sequence by sequence, every position)."""
    lengths = micro_batch["input_ids"].offsets().diff().tolist()
    total = sum(lengths)
    labels = output_args["input_ids_rmpad_rolled"][:total]
    if use_remove_padding:
        logits = output.logits.squeeze(0)[:total]
        temperature = output_args["temperature_rmpad"][:total]
    else:
        logits = torch.cat([output.logits[b, :n] for b, n in enumerate(lengths)])
        per_seq = output_args["temperature"].reshape(-1)
        temperature = torch.cat([per_seq[b].expand(n) for b, n in enumerate(lengths)])
    if hasattr(logits, "full_tensor"):  # a DTensor sharded on the vocabulary (tensor parallel)
        logits = logits.full_tensor()
    return lengths, logits, labels, temperature


class MaskedActorEngine(FSDPEngineWithLMHead):
    """verl's FSDP language-model engine with log-probs under the samples' grammar masks."""

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        model_output = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        if INDEX not in micro_batch.keys() or "log_probs" not in model_output:
            return model_output
        if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
            raise VerlActorPatchError(
                "masked log-probs need the logits: set actor_rollout_ref.model.use_fused_kernels=False"
            )
        if getattr(self, "use_ulysses_sp", False):
            raise VerlActorPatchError("masked log-probs are not written for Ulysses sequence parallelism")
        rmpad = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
        lengths, logits, labels, temperature = packed_logits(output, output_args, micro_batch, rmpad)
        rows, bitmask = row_masks(
            lengths,
            _nested_list(micro_batch[INDEX]),
            _nested_list(micro_batch[TABLE]),
            mask_words(logits.shape[-1]),
        )
        lp = model_output["log_probs"]
        flat = lp.values()
        masked = masked_rows_logprobs(logits, labels, temperature, rows, bitmask)
        flat = flat.index_put((rows.to(flat.device),), masked.to(flat.dtype))
        model_output["log_probs"] = torch.nested.nested_tensor_from_jagged(flat, lp.offsets())
        return model_output


def check_verl() -> None:
    """Fail loudly unless verl, and the verl functions this module overrides, wraps or relies on,
    are the ones it was written against."""
    patching.check_verl(
        __name__,
        VERL_VERSION,
        _EXPECTED_SOURCES,
        {"FSDPEngineWithLMHead": FSDPEngineWithLMHead},
        VerlActorPatchError,
        "Re-check prepare_model_outputs in that version first.",
    )


def install() -> None:
    """Check verl, then make its EngineRegistry build MaskedActorEngine for the language model."""
    check_verl()
    patching.replace_engine(
        "language_model", MaskedActorEngine, FSDPEngineWithLMHead, VerlActorPatchError, __name__
    )


install()
