"""atlas.verl.drift: verl's trainer reports the local engine's rollout-vs-trainer metrics
(atlas.rl.drift) beside its own, over the generated tokens of the padded step batch that
PPOTrainer._compute_old_log_prob hands to calculate_debug_metrics. Runs in the verl venv (CI)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
if not os.environ.get("ATLAS_REQUIRE_VERL"):
    pytest.importorskip("verl.trainer.ppo.v1.trainer_base")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base  # noqa: E402
from verl.utils.debug import metrics as debug_metrics  # noqa: E402

from atlas.verl import drift  # noqa: E402


def _batch() -> DataProto:
    # two responses of width 4; row 1's last two slots are padding, row 0's third is tool output
    rollout = torch.tensor([[-1.0, -2.0, 0.0, -0.5], [-0.2, -1.0, 0.0, 0.0]])
    ratio = torch.tensor([[1.0, 1.2, 9.0, 0.95], [0.8, 1.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]])
    return DataProto.from_dict(
        {
            "rollout_log_probs": rollout,
            "old_log_probs": rollout + ratio.log(),
            "response_mask": mask,
            "responses": torch.ones(2, 4, dtype=torch.long),
        }
    )


def test_trainer_base_reports_verls_metrics_and_the_drift_metrics():
    assert trainer_base.calculate_debug_metrics is not debug_metrics.calculate_debug_metrics
    data = _batch()
    got = trainer_base.calculate_debug_metrics(data)
    verls = debug_metrics.calculate_debug_metrics(data)
    assert {k: got[k] for k in verls} == verls
    kept = [1.0, 1.2, 0.95, 0.8, 1.0]  # the five generated tokens' ratios
    assert got["rollout/importance_ratio_mean"] == pytest.approx(sum(kept) / 5, rel=1e-6)
    assert got["rollout/importance_ratio_outside"] == pytest.approx(2 / 5)  # 1.2 and 0.8
    assert got["rollout/logprob_gap_max"] == pytest.approx(-math.log(0.8), rel=1e-6)
    assert "rollout/importance_ratio_raw_mean" not in got  # verl keeps no raw log-probs


def test_install_is_idempotent_and_refuses_a_foreign_wrapper(monkeypatch):
    wrapped = trainer_base.calculate_debug_metrics
    drift.install()
    assert trainer_base.calculate_debug_metrics is wrapped
    monkeypatch.setattr(trainer_base, "calculate_debug_metrics", lambda data: {})
    with pytest.raises(drift.VerlDriftPatchError, match="not verl's own"):
        drift.install()


def test_every_external_module_imports_with_verl():
    """verl imports VERL_USE_EXTERNAL_MODULES at the end of `import verl`, in each Ray process:
    the drift module must import there without a cycle."""
    from atlas.verl.config import EXTERNAL_MODULES

    code = (
        "import verl\n"
        "from verl.trainer.ppo.v1 import trainer_base\n"
        "assert trainer_base.calculate_debug_metrics.atlas_drift\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": ",".join(EXTERNAL_MODULES)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
