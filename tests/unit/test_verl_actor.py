"""verl's actor log-probs under our grammar masks (atlas.verl.actor) against the local engine's
(atlas.rl.ppo.token_logprobs), on CPU: the same episodes, the same tiny model's logits, the masks
carried from the agent loop as verl's TransferQueue carries them (table + index per sample).
Runs in the verl venv (CI)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
if not os.environ.get("ATLAS_REQUIRE_VERL"):
    pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils import torch_functional as verl_F  # noqa: E402
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402

from atlas.config.study import load_config  # noqa: E402
from atlas.rl.ppo import token_logprobs  # noqa: E402
from atlas.rl.replay import replay_masks  # noqa: E402
from atlas.runtime.session import load_model, load_runtime  # noqa: E402
from atlas.verl.actor import MaskedActorEngine, mask_words  # noqa: E402
from atlas.verl.transport import INDEX, TABLE  # noqa: E402
from conftest import REPO  # noqa: E402

TEMPERATURE = 0.7


def _engine(cls):
    """verl's engine object with only what prepare_model_outputs reads (no FSDP, no GPU)."""
    e = object.__new__(cls)
    e.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    e.compute_entropy_from_logits = verl_F.entropy_from_logits
    e.use_ulysses_sp = False
    return e


@pytest.fixture(scope="module")
def batch(played, tiny_model):
    _, _, outputs, local, _ = played
    rt = load_runtime(tiny_model, load_config(REPO / "config" / "config.yaml").runtime)  # with its engine
    model = load_model(tiny_model)[0].eval()
    seqs = [torch.tensor(o.prompt_ids + o.response_ids) for o in outputs]
    for s, ep in zip(seqs, local, strict=True):
        assert s.tolist() == ep.token_ids
    with torch.no_grad():
        per_seq = [model(input_ids=s.unsqueeze(0)).logits[0].float() for s in seqs]
    dicts = [o.as_dict() for o in outputs]
    micro = TensorDict(
        {
            "input_ids": torch.nested.as_nested_tensor(seqs, layout=torch.jagged),
            INDEX: torch.nested.as_nested_tensor([d[INDEX] for d in dicts], layout=torch.jagged),
            TABLE: torch.nested.as_nested_tensor([d[TABLE] for d in dicts], layout=torch.jagged),
        },
        batch_size=[len(seqs)],
    )
    tu.assign_non_tensor(micro, use_remove_padding=True, calculate_entropy=True)
    flat_ids = torch.cat(seqs)
    n = flat_ids.numel()
    output_args = {
        "input_ids_rmpad_rolled": torch.roll(flat_ids, shifts=-1),
        "temperature_rmpad": torch.full((n,), TEMPERATURE),
        "pad_size": 0,
    }
    output = SimpleNamespace(logits=torch.cat(per_seq).unsqueeze(0))  # verl's packed [1, N, V]
    return rt, outputs, local, seqs, per_seq, micro, output, output_args


def test_the_carried_table_is_the_local_engines_masks(batch):
    rt, outputs, local, *_ = batch
    for out, ep in zip(outputs, local, strict=True):
        d = out.as_dict()
        words = mask_words(rt.engine.vocab_size)
        table = d[TABLE].reshape(-1, words)
        replayed = replay_masks(ep, rt)
        p = ep.prompt_tokens
        rows = d[INDEX][replayed.positions - p]
        assert (rows >= 0).all() and torch.equal(table[rows], replayed.bitmask)
        # tool output carries no mask; the table holds each distinct mask once
        assert int((d[INDEX] >= 0).sum()) == replayed.positions.numel()
        assert table.shape[0] == torch.unique(replayed.bitmask, dim=0).shape[0] < replayed.positions.numel()


def test_verls_patched_logprobs_agree_with_the_local_engines(batch):
    _, outputs, local, seqs, per_seq, micro, output, output_args = batch
    got = _engine(MaskedActorEngine).prepare_model_outputs(output, output_args, micro, None)
    raw = _engine(FSDPEngineWithLMHead).prepare_model_outputs(output, output_args, micro, None)
    worst, unmasked_gap = 0.0, 0.0
    for b, ep in enumerate(local):
        masks = replay_masks(ep, batch[0])
        want = token_logprobs(
            per_seq[b].unsqueeze(0),
            SimpleNamespace(input_ids=seqs[b].unsqueeze(0), masks=[masks]),
            TEMPERATURE,
        )[0]
        pos = masks.positions
        ours = got["log_probs"][b][pos - 1]  # row t - 1 predicts token t
        worst = max(worst, float((ours - want[pos]).abs().max()))
        unmasked_gap = max(unmasked_gap, float((raw["log_probs"][b][pos - 1] - want[pos]).abs().max()))
        # forced tokens (sampled 0) get log-prob 0, as locally
        forced = [t for t in pos.tolist() if ep.sampled[t] == 0]
        assert forced and all(abs(float(got["log_probs"][b][t - 1])) < 1e-6 for t in forced)
        # entropy stays that of the raw distribution, as in atlas.rl.ppo
        assert torch.equal(got["entropy"][b], raw["entropy"][b])
    assert worst < 1e-5
    assert unmasked_gap > 1e-3  # verl's own log-probs are not the masked ones


def test_the_patch_is_registered_for_the_language_model():
    for backend in ("fsdp", "fsdp2"):
        engines = EngineRegistry._engines["language_model"][backend]
        assert set(engines.values()) == {MaskedActorEngine}
