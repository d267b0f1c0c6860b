"""The checks on a policy on the GPU: probe ids held on the CPU, and the exported actor loaded as
the policy's base is (bf16 on CUDA), reproducing its log-probs exactly."""

from __future__ import annotations

import pytest
import torch

from atlas.checks.roundtrip import probes
from atlas.config.training import TrainingConfig
from atlas.model.policy import ROLES
from atlas.rl.checkpoint import export_adapters
from atlas.rl.serving import build_policy
from atlas.stages.checks import exported_actor_reproduces

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
IDS = torch.tensor([[1, 50, 60, 70, 80, 90, 2], [1, 40, 41, 42, 43, 44, 2]])


def test_probes_and_the_exported_actor_on_a_cuda_policy(tiny_model, tmp_path):
    ac = build_policy(tiny_model, TRAINING, 0, "cuda")[0]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for role in ROLES:
            for p in ac.trainable(role).values():
                p.copy_(torch.randn(p.shape, generator=gen).to(p) * 0.05)
    got = probes(ac, IDS)
    assert {t.device.type for t in got.values()} == {"cpu"}
    assert got["actor_logprobs"].shape == (2, 6) and torch.isfinite(got["actor_logprobs"]).all()
    export_adapters(ac, tmp_path / "adapters")
    assert exported_actor_reproduces(tiny_model, tmp_path / "adapters", ac, IDS) == 0.0
