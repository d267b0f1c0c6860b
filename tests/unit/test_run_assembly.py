"""The run folder built from a training journal (journal.assemble): every table in step order, the
train and validation phases together, the protocol counts per phase and in all, the checkpoint
index, the recoveries, the adapters and the manifest, all in one atomic step. Expected values are
written out from the journal this test writes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atlas.contracts import runs
from atlas.contracts.records import TRAJECTORY_SCHEMA
from atlas.hashing import MANIFEST, verify, write_manifest
from atlas.rl import journal
from atlas.rl.journal import assemble, step_dir, val_dir
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.records import ExecutionRecord, write_records

RECORD = ExecutionRecord(
    run="arm", step=0, phase="train", question_uid="gpqa-1", source="gpqa", sample=0, turn=0,
    tool="submit", arguments='{"answer": "A"}', action_token=5, generation_start=2, generated_tokens=4,
    forced_tokens=0, finish_reason="stop", tool_status="ok", tool_output_sha256="0" * 64,
    tool_output_excerpt="submitted A", sandboxed=True, score=1.0, timing_s_generate=0.1, timing_s_tool=0.0,
)  # fmt: skip


def trajectory(step: int, phase: str) -> dict:
    return {
        "run": "arm", "step": step, "phase": phase, "question_uid": "gpqa-1", "source": "gpqa", "sample": 0,
        "prompt_tokens": 3, "token_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 0, 1], "sampled": [0, 0, 0, 1],
        "logprobs": [0.0, 0.0, 0.0, -0.5], "completed": True, "end_reason": "submit", "score": 1.0, "turns": 1,
    }  # fmt: skip


def write_journal(root: Path) -> None:
    """Two steps, validation points 0 and 2, checkpoints 1 and 2, a recovery, a wandb log."""
    for k in (0, 1):
        folder = step_dir(root, k)
        folder.mkdir(parents=True)
        write_records(folder / "records.parquet", [replace(RECORD, step=k, sample=k)])
        pq.write_table(
            pa.Table.from_pylist([trajectory(k, "train")], schema=TRAJECTORY_SCHEMA),
            folder / "trajectories.parquet",
        )
        (folder / "protocol.json").write_text(
            json.dumps({"episodes": 4, "violations": k, "violation_rows": [{"step": k}] * k})
        )
        (folder / "metrics.json").write_text(json.dumps({"actor/pg_loss": 0.5 + k, "timing_s/step": 2.0}))
        journal.write_table(
            folder / "call_advantages.parquet",
            [{"run": "arm", "step": k, "turn": 0, "tool": "submit", "count": 2}],
            runs.CALL_ADVANTAGES_SCHEMA,
        )
        if k == 1:  # a journal from before the device sampler has no samples.json
            (folder / "samples.json").write_text(json.dumps([{"rss_gb": 1.5}]))
    for j in (0, 2):
        folder = val_dir(root, j)
        folder.mkdir(parents=True)
        write_records(folder / "records.parquet", [replace(RECORD, step=j, phase="val", sample=7)])
        pq.write_table(
            pa.Table.from_pylist([trajectory(j, "val")], schema=TRAJECTORY_SCHEMA),
            folder / "trajectories.parquet",
        )
        (folder / "protocol.json").write_text(
            json.dumps({"episodes": 2, "violations": 0, "violation_rows": []})
        )
        (folder / "validation.json").write_text(
            json.dumps([{"run": "arm", "step": j, "source": "all", "n": 2, "utility": j / 2}])
        )
    for c in (1, 2):
        (root / f"step_{c}").mkdir()
        (root / f"step_{c}" / "actor.safetensors").write_bytes(bytes([c]) * 8)
        write_manifest(root / f"step_{c}", stage="compact_checkpoint", config={"step": c})
    (root / "recovery.json").write_text(json.dumps([{"moved": ["step_3"]}]))
    (root / "wandb" / "run-1").mkdir(parents=True)
    (root / "wandb" / "run-1" / "run.wandb").write_bytes(b"log")
    (root / "wandb" / "latest-run").symlink_to("run-1")  # wandb's own link: not copied


def export(folder: Path) -> None:
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "adapter_model.safetensors").write_bytes(b"adapter")


def build(tmp_path: Path, name: str = "arm", **change) -> Path:
    root, out = tmp_path / "checkpoints" / "arm", tmp_path / "runs" / name
    if not root.exists():
        write_journal(root)
    args = dict(run="arm", steps=2, validated=[0, 2], checkpoints=[1, 2], run_info={"steps": 2},
                export=export, manifest={"stage": "train", "config": {"run": "arm"}})  # fmt: skip
    assemble(out, root, **(args | change))
    return out


def test_the_run_folder_holds_the_journal_in_step_order_with_its_totals(tmp_path):
    out = build(tmp_path)
    records = pq.read_table(out / "records.parquet").to_pylist()
    assert [(r["phase"], r["step"], r["sample"]) for r in records] == [
        ("train", 0, 0), ("train", 1, 1), ("val", 0, 7), ("val", 2, 7)
    ]  # fmt: skip
    assert [(t["phase"], t["step"]) for t in pq.read_table(out / "trajectories.parquet").to_pylist()] == [
        ("train", 0), ("train", 1), ("val", 0), ("val", 2)
    ]  # fmt: skip
    metrics = pq.read_table(out / "step_metrics.parquet").to_pylist()
    assert [(m["run"], m["step"], m["actor/pg_loss"], m["timing_s/step"]) for m in metrics] == [
        ("arm", 0, 0.5, 2.0), ("arm", 1, 1.5, 2.0)
    ]  # fmt: skip
    assert pq.read_table(out / "step_metrics.parquet").schema.names == runs.STEP_METRICS_SCHEMA.names
    calls = pq.read_table(out / "call_advantages.parquet").to_pylist()
    assert [(c["step"], c["tool"], c["count"]) for c in calls] == [(0, "submit", 2), (1, "submit", 2)]
    curve = pq.read_table(out / "validation.parquet").to_pylist()
    assert [(v["step"], v["utility"]) for v in curve] == [(0, 0.0), (2, 1.0)]
    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol == {
        "run": "arm",
        "episodes": 12, "violations": 1, "violation_rows": [{"step": 1}],
        "train": {"episodes": 8, "violations": 1, "violation_rows": [{"step": 1}]},
        "val": {"episodes": 4, "violations": 0, "violation_rows": []},
    }  # fmt: skip
    assert json.loads((out / "device_samples.json").read_text()) == [
        {"step": 0, "samples": []}, {"step": 1, "samples": [{"rss_gb": 1.5}]}
    ]  # fmt: skip
    index = json.loads((out / "checkpoints.json").read_text())
    assert [(c["step"], c["path"], sorted(c["files"])) for c in index["checkpoints"]] == [
        (c, (tmp_path / "checkpoints" / "arm" / f"step_{c}").as_posix(), ["actor.safetensors"])
        for c in (1, 2)
    ]
    assert json.loads((out / "run.json").read_text()) == {"steps": 2, "recovered": [{"moved": ["step_3"]}]}
    assert (out / "adapters" / "actor" / "adapter_model.safetensors").read_bytes() == b"adapter"
    assert sorted(p.relative_to(out / "wandb").as_posix() for p in (out / "wandb").rglob("*")) == [
        "run-1", "run-1/run.wandb"
    ]  # fmt: skip
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["stage"] == "train" and "records.parquet" in manifest["files"]
    assert verify(out, check_sources=False, cache=False) == []


def test_a_failed_assembly_leaves_no_run_folder(tmp_path):
    def broken(folder: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build(tmp_path, export=broken)
    assert not (tmp_path / "runs" / "arm").exists()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # no temporary folder left either
    # without recovery.json the run says so as an empty list
    (tmp_path / "checkpoints" / "arm" / "recovery.json").unlink()
    out = build(tmp_path)
    assert json.loads((out / "run.json").read_text())["recovered"] == []


def test_a_steps_results_are_written_beside_its_rollouts_and_a_bad_metric_fails_at_the_step(tmp_path):
    root = tmp_path / "arm"
    step_dir(root, 3).mkdir(parents=True)
    rows = [{"run": "arm", "step": 3, "turn": 1, "tool": "python", "count": 4, "advantage_mean": -0.25}]
    journal.write_step_results(root, 3, {"actor/pg_loss": 0.125}, rows, [{"rss_gb": 2.0}])
    folder = step_dir(root, 3)
    assert json.loads((folder / "metrics.json").read_text()) == {"actor/pg_loss": 0.125}
    assert json.loads((folder / "samples.json").read_text()) == [{"rss_gb": 2.0}]
    calls = pq.read_table(folder / "call_advantages.parquet").to_pylist()
    assert [(c["turn"], c["tool"], c["count"], c["advantage_mean"], c["dose"]) for c in calls] == [
        (1, "python", 4, -0.25, None)
    ]
    with pytest.raises(ValueError, match=r"metrics.json: columns \['actor/made_up'\] are not in its schema"):
        journal.write_step_metrics(root, 3, {"actor/made_up": 1.0})
    with pytest.raises((TypeError, pa.ArrowInvalid, pa.ArrowTypeError)):
        journal.write_step_metrics(root, 3, {"actor/pg_loss": "high"})
    assert json.loads((folder / "metrics.json").read_text()) == {"actor/pg_loss": 0.125}  # kept as it was
    journal.write_step_metrics(root, 3, {"actor/pg_loss": 0.125, "timing_s/save_checkpoint": 0.5})
    assert json.loads((folder / "metrics.json").read_text())["timing_s/save_checkpoint"] == 0.5


def test_every_table_is_zstd_and_a_key_outside_a_schema_is_named_by_its_table(tmp_path, monkeypatch):
    out = build(tmp_path)
    for name in ("records", "trajectories", "step_metrics", "call_advantages", "validation"):
        meta = pq.ParquetFile(out / f"{name}.parquet").metadata
        assert {meta.row_group(0).column(c).compression for c in range(meta.num_columns)} == {"ZSTD"}, name
    root = tmp_path / "checkpoints" / "arm"
    journal.write_table(tmp_path / "calls.parquet", [{"run": "arm", "step": 0}], runs.CALL_ADVANTAGES_SCHEMA)
    meta = pq.ParquetFile(tmp_path / "calls.parquet").metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    with pytest.raises(
        ValueError, match=rf"^{tmp_path / 'bad.parquet'}: columns \['extra'\] are not in its schema"
    ):
        journal.write_table(
            tmp_path / "bad.parquet", [{"run": "arm", "extra": 1}], runs.CALL_ADVANTAGES_SCHEMA
        )
    for folder, file, value, what in [
        (step_dir(root, 1), "metrics.json", {"actor/pg_loss": 1.0, "extra": 1.0}, "step metrics"),
        (val_dir(root, 2), "validation.json", [{"run": "arm", "step": 2, "extra": 1}], "validation curve"),
    ]:
        kept = (folder / file).read_text()
        (folder / file).write_text(json.dumps(value))
        with pytest.raises(ValueError, match=rf"^{what}: columns \['extra'\] are not in its schema"):
            build(tmp_path, "again")
        (folder / file).write_text(kept)
    journal.write_table(
        step_dir(root, 0) / "call_advantages.parquet",
        [{"run": "arm", "step": 0}],
        runs.CALL_ADVANTAGES_SCHEMA,
    )
    real = journal.pl.read_parquet
    monkeypatch.setattr(
        journal.pl, "read_parquet", lambda path: real(path).with_columns(journal.pl.lit(1).alias("extra"))
    )
    with pytest.raises(ValueError, match=r"^call advantages: columns \['extra'\] are not in its schema"):
        build(tmp_path, "third")


def test_the_journal_layout_and_a_validation_point_written_whole(tmp_path):
    assert (step_dir(tmp_path, 3), val_dir(tmp_path, 4)) == (
        tmp_path / "journal" / "step_3",
        tmp_path / "journal" / "val_4",
    )
    report = ProtocolReport(episodes=0)
    journal.write_validation(
        tmp_path, 4, [], report, [{"run": "arm", "step": 4, "source": "all", "n": 0}], run="arm"
    )
    folder = tmp_path / "journal" / "val_4"
    assert json.loads((folder / "validation.json").read_text()) == [
        {"run": "arm", "step": 4, "source": "all", "n": 0}
    ]
    assert json.loads((folder / "protocol.json").read_text())["run"] == "arm"
    assert pq.read_table(folder / "records.parquet").num_rows == 0
    journal.write_validation(tmp_path, 4, [], report, [], run="arm")  # written again over itself
    assert json.loads((folder / "validation.json").read_text()) == []
    # a protocol.json without violation rows adds none
    (tmp_path / "p.json").write_text(json.dumps({"episodes": 2}))
    assert journal._protocol_totals([tmp_path / "p.json"]) == {"episodes": 2, "violation_rows": []}
