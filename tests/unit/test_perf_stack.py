"""perf_stack from measurements the test writes itself: the medians, sums and sizes of a run's
step metrics and checks records, computed by hand here.
(No figure of a committed measurement is asserted anywhere: those are data, not behaviour.)"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from atlas.report.tables import RunFolder, perf_stack

SHAPE = "qwen3 L2 d128 ff512 h2/1 v2048"


def write_run(root: Path, name: str, device: str = "cpu") -> tuple[RunFolder, Path]:
    """A run of 3 steps: step metrics (one phase missing at step 2), batch sizes, checkpoint sizes
    on two ranks (rank 1 must be left out), the device."""
    run, checks = root / "runs" / name, root / "checks" / name
    run.mkdir(parents=True)
    checks.mkdir(parents=True)
    pl.DataFrame(
        {
            "run": [name] * 3,
            "step": [0, 1, 2],
            "timing_s/gen": [2.0, 4.0, 9.0],
            "perf/rollout_tokens": [12.0, 24.0, 36.0],
            "timing_s/update_actor": [1.0, 3.0, 2.0],
            "timing_s/save_checkpoint": [0.5, None, 1.5],
            "perf/cpu_memory_used_gb": [1.25, 1.75, 1.5],
            "actor/pg_loss": [0.1, 0.2, 0.3],
        }
    ).write_parquet(run / "step_metrics.parquet")
    (checks / "timing_analysis.json").write_text(json.dumps({"device": device, "steps": []}))
    batch = [{"step": k, "tokens": 100 * (k + 1), "sampled_tokens": 10 * (k + 1)} for k in range(3)]
    (checks / "batch_math.json").write_text(json.dumps({"steps": batch}))
    sizes = [
        {"step": s, "role": role, "rank": rank, "bytes": b}
        for s, (actor, critic) in {1: (100, 50), 2: (300, 70), 3: (120, 60)}.items()
        for role, b0 in (("actor", actor), ("critic", critic))
        for rank, b in ((0, b0), (1, 10**9))
    ]
    (checks / "compact_checkpoint_validation.json").write_text(json.dumps({"rows": sizes}))
    return RunFolder(run, ("arm",)), checks


def test_rows_of_a_run_are_its_medians_and_sums(tmp_path):
    run, checks = write_run(tmp_path, "arm")
    frame = perf_stack([run], {"arm": checks}, SHAPE)
    rows = {r["phase"]: r for r in frame.iter_rows(named=True)}
    assert sorted(rows) == ["gen", "save_checkpoint", "update_actor"]  # timing_s/* only
    gen = rows["gen"]
    assert (gen["source"], gen["test"], gen["run"], gen["device"], gen["model_shape"]) == (
        "pipeline",
        "train_step",
        "arm",
        "cpu",
        SHAPE,
    )
    # gen: median of 2, 4, 9 s; tokens are the generated ones, forced included (12, 24, 36, not
    # the sampled 10, 20, 30); rate = 72 / 15 s
    assert (gen["steps"], gen["seconds"], gen["tokens"], gen["tokens_per_s"]) == (3, 4.0, 24, 4.8)
    assert gen["peak_memory_gb"] == 1.75 and gen["checkpoint_bytes"] is None
    # update_actor counts every token (100, 200, 300) over 1 + 3 + 2 s
    upd = rows["update_actor"]
    assert (upd["seconds"], upd["tokens"], upd["tokens_per_s"]) == (2.0, 200, 100.0)
    # save_checkpoint: the steps that saved (0 and 2); sizes per step summed over roles, rank 0
    # only (150, 370, 180 bytes), median 180
    save = rows["save_checkpoint"]
    assert (save["steps"], save["seconds"], save["checkpoint_save_s"]) == (2, 1.0, 1.0)
    assert save["checkpoint_bytes"] == 180 and save["tokens"] is None
