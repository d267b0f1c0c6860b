"""atlas.rl.drift's step metrics under verl: the rollout-vs-trainer log-prob gap and importance
ratio, as the local engine reports them.

verl 0.9.1's PPOTrainer._compute_old_log_prob hands the step's padded batch (old_log_probs from
the actor, under our grammar masks: atlas.verl.actor; rollout_log_probs from vLLM, sampled under
the same masks; response_mask) to `calculate_debug_metrics`, whose `training/rollout_probs_diff_*`
compare probabilities, not log-probs. Here that function, as trainer_base names it, is wrapped:
its metrics stay, and `rollout/logprob_gap_*` and `rollout/importance_ratio_*` join them, over
the tokens the policy generated. verl's actor keeps no log-probs over the whole vocabulary, so
the raw ratio stays the local engine's.

Like atlas.verl.actor, the module checks verl's version and the source of what it wraps on
import, and reaches verl's trainer process through VERL_USE_EXTERNAL_MODULES.
"""

from __future__ import annotations

import functools

from verl.trainer.ppo.v1 import trainer_base
from verl.utils.debug import metrics as debug_metrics

from atlas.rl.drift import rollout_drift
from atlas.verl import patching

VERL_VERSION = "0.9.1"
_EXPECTED_SOURCES = {
    # wrapped: reads rollout_log_probs, old_log_probs, response_mask and responses of the batch
    "metrics.calculate_debug_metrics": "026ebc3947fcafe68ec2eb1b5184667877a0c5bb4958450a3c8b8d57c0f1ef5b",
    # relied on: calls it, on the step's padded batch, only when rollout log-probs are computed
    "PPOTrainer._compute_old_log_prob": "b2630e6178ed99f7b55b8e342911e746d7d48e148e87a3da090b0be8d5b8f70f",
}


class VerlDriftPatchError(RuntimeError):
    """The installed verl is not the one this module was written against."""


def drift_metrics(data) -> dict[str, float]:
    """atlas.rl.drift's metrics of a verl DataProto batch (old_log_probs, rollout_log_probs,
    responses and response_mask, the response part [B, R])."""
    batch = data.batch
    width = batch["responses"].size(1)
    mask = batch["response_mask"][:, -width:]
    return rollout_drift(batch["old_log_probs"], batch["rollout_log_probs"], mask)


def with_drift(calculate):
    @functools.wraps(calculate)
    def calculate_with_drift(data):
        return {**calculate(data), **drift_metrics(data)}

    calculate_with_drift.atlas_drift = True
    return calculate_with_drift


def install() -> None:
    """Check verl, then make trainer_base's calculate_debug_metrics add the drift metrics."""
    patching.check_verl(
        __name__,
        VERL_VERSION,
        _EXPECTED_SOURCES,
        {"metrics": debug_metrics, "PPOTrainer": trainer_base.PPOTrainer},
        VerlDriftPatchError,
        "Re-check what PPOTrainer._compute_old_log_prob passes to calculate_debug_metrics first.",
    )
    current = trainer_base.calculate_debug_metrics
    if getattr(current, "atlas_drift", False):
        return
    if current is not debug_metrics.calculate_debug_metrics:
        raise VerlDriftPatchError(
            f"verl's trainer_base.calculate_debug_metrics is {current!r}, not verl's own: something "
            "else wraps it"
        )
    trainer_base.calculate_debug_metrics = with_drift(current)


install()
