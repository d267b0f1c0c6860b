"""The report folder, end to end: the embedded default pipeline from an empty results/ (the
session's `pipeline` fixture) to results/report25/, its pinned table schemas, values that tie
back to the run folders, the dataset card, the figures, the manifest, and the dry-run plan after
a grader fix."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import polars as pl
import yaml

REPORT = Path("results/report25")
TABLES = [
    "step_metrics_by_run",
    "full_validation_views",
    "perf_stack",
    "arms_validation_curve",
    "arms_step_metrics",
    "arms_call_advantage",
]
F, INT, S, B = pl.Float64, pl.Int64, pl.String, pl.Boolean

# The pinned schemas, written out here rather than imported: a change to a table must change this.
STEP_METRIC_NAMES = [
    "training/global_step",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "score/gpqa/mean",
    "score/lcb/mean",
    "completed/gpqa",
    "completed/lcb",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "critic/values/mean",
    "critic/values/max",
    "critic/values/min",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "critic/lr",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "rollout/logprob_gap_mean",
    "rollout/logprob_gap_max",
    "rollout/importance_ratio_mean",
    "rollout/importance_ratio_outside",
    "rollout/importance_ratio_raw_mean",
    "rollout/importance_ratio_raw_outside",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "prompt_length/mean",
    "turns/mean",
    "protocol/episodes",
    "protocol/completed",
    "protocol/generations",
    "protocol/records",
    "protocol/calls",
    "protocol/violations",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/gen_model",
    "timing_s/gen_tools",
    "timing_s/potential",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "timing_s/adv",
    "timing_s/update_critic",
    "timing_s/update_actor",
    "timing_s/save_checkpoint",
    "perf/rollout_tokens",
    "perf/rollout_tokens_per_s",
    "perf/cpu_memory_used_gb",
    "perf/max_memory_allocated_gb",
]
ARM_METRIC_NAMES = [
    "critic/score/mean",
    "score/gpqa/mean",
    "score/lcb/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/values/mean",
    "critic/returns/mean",
    "critic/vf_loss",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "actor/pg_loss",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "response_length/mean",
    "turns/mean",
    "protocol/episodes",
    "protocol/completed",
    "protocol/violations",
    "timing_s/step",
]
SCHEMAS = {
    "step_metrics_by_run": [
        ("run", S),
        ("stage", S),
        ("arm", S),
        ("potential", S),
        ("dose", F),
        ("step", INT),
        *[(n, F) for n in STEP_METRIC_NAMES],
    ],
    "full_validation_views": [
        ("policy", S),
        ("arm", S),
        ("question_uid", S),
        ("source", S),
        ("sample", INT),
        ("completed", B),
        ("end_reason", S),
        ("turns", INT),
        ("tools", S),
        ("tool_errors", INT),
        ("final_answer", S),
        ("score", F),
        ("prompt_tokens", INT),
        ("tokens", INT),
        ("generated_tokens", INT),
        ("sampled_tokens", INT),
    ],
    "perf_stack": [
        ("source", S),
        ("test", S),
        ("run", S),
        ("device", S),
        ("model_shape", S),
        ("phase", S),
        ("steps", INT),
        ("seconds", F),
        ("tokens", INT),
        ("tokens_per_s", F),
        ("peak_memory_gb", F),
        ("checkpoint_bytes", INT),
        ("checkpoint_save_s", F),
    ],
    "arms_validation_curve": [
        ("arm", S),
        ("step", INT),
        ("source", S),
        ("n", INT),
        ("utility", F),
        ("accuracy", F),
        ("completed_fraction", F),
    ],
    "arms_step_metrics": [
        ("arm", S),
        ("potential", S),
        ("dose", F),
        ("step", INT),
        *[(n, F) for n in ARM_METRIC_NAMES],
    ],
    "arms_call_advantage": [
        ("arm", S),
        ("step", INT),
        ("turn", INT),
        ("tool", S),
        ("count", INT),
        ("advantage_mean", F),
        ("advantage_std", F),
        ("advantage_min", F),
        ("advantage_max", F),
        ("value_mean", F),
        ("reward_mean", F),
        ("score_mean", F),
        ("potential_delta_mean", F),
    ],
}
ARMS = ["frozen_potential", "zero_potential"]


def table(pipeline: Path, name: str) -> pl.DataFrame:
    return pl.read_parquet(pipeline / REPORT / "tables" / f"{name}.parquet")


def test_tables_open_in_polars_with_the_pinned_schemas_and_match_their_csv(pipeline):
    for name in TABLES:
        frame = table(pipeline, name)
        assert list(frame.schema.items()) == SCHEMAS[name], name
        assert frame.height > 0, name
        csv = pl.read_csv(pipeline / REPORT / "tables" / f"{name}.csv", schema=frame.schema)
        assert csv.equals(frame), f"{name}.csv differs from {name}.parquet"
    assert sorted(p.name for p in (pipeline / REPORT / "tables").iterdir()) == sorted(
        f"{n}.{ext}" for n in TABLES for ext in ("csv", "parquet")
    )


def test_step_metrics_tie_back_to_the_run_folders(pipeline):
    by_run = table(pipeline, "step_metrics_by_run")
    # training_smoke 2 steps, each arm 2 (the suite config), the dose step one row per dose.
    counts = dict(by_run.group_by("run").len().iter_rows())
    assert counts == {"training_smoke": 2, "zero_potential": 2, "frozen_potential": 2, "dose_step": 3}
    assert by_run.filter(pl.col("stage") == "arm")["arm"].unique().sort().to_list() == ARMS
    assert by_run.filter(pl.col("stage") != "arm")["arm"].null_count() == 5
    assert by_run["protocol/violations"].to_list() == [0.0] * 9
    assert sorted(by_run.filter(pl.col("run") == "dose_step")["dose"].to_list()) == [0.0, 0.5, 1.0]
    for run in ["training_smoke", *ARMS]:
        source = pl.read_parquet(pipeline / "results" / "runs" / run / "step_metrics.parquet")
        mine = by_run.filter(pl.col("run") == run).sort("step")
        for column in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "timing_s/step"):
            assert mine[column].to_list() == source[column].to_list(), (run, column)
    arms = table(pipeline, "arms_step_metrics")
    assert arms.height == 4
    expected = by_run.filter(pl.col("stage") == "arm").sort("arm", "step")
    assert arms["critic/score/mean"].to_list() == expected["critic/score/mean"].to_list()
    potentials = dict(arms.select("arm", "potential").unique().iter_rows())
    assert potentials == {"zero_potential": "zero", "frozen_potential": "critic_snapshot"}


def test_validation_views_and_curves(pipeline):
    views = table(pipeline, "full_validation_views")
    assert dict(views.group_by("policy").len().iter_rows()) == {
        "base": 8,  # 4 GPQA + 4 LCB validation questions, one sample each
        "zero_potential": 8,
        "frozen_potential": 8,
    }
    assert views["completed"].all() and set(views["end_reason"]) == {"submit"}
    assert views.filter(pl.col("policy") == "base")["arm"].null_count() == 8
    for policy in ("base", *ARMS):
        answers = pl.read_parquet(pipeline / "results" / "validation" / policy / "answers.parquet")
        mine = views.filter(pl.col("policy") == policy)
        assert mine["score"].sum() == answers["score"].sum()
        records = pl.read_parquet(pipeline / "results" / "validation" / policy / "records.parquet")
        assert mine["turns"].sum() == records.height
        assert (mine["tools"].str.split(">").list.len() == mine["turns"]).all()
        assert mine["tools"].str.ends_with("submit").all()
    assert (views["sampled_tokens"] <= views["generated_tokens"]).all()
    assert (views["tokens"] >= views["prompt_tokens"] + views["generated_tokens"]).all()  # + tool output

    curve = table(pipeline, "arms_validation_curve")
    assert sorted(set(curve["step"])) == [0, 2]
    assert curve.height == 2 * 2 * 3  # arms x points x (gpqa, lcb, all)
    alls = curve.filter(pl.col("source") == "all")
    assert alls["n"].to_list() == [2] * 4 and alls["completed_fraction"].to_list() == [1.0] * 4


def test_call_advantage_counts_every_train_record(pipeline):
    calls = table(pipeline, "arms_call_advantage")
    for arm in ARMS:
        records = pl.read_parquet(pipeline / "results" / "runs" / arm / "records.parquet").filter(
            pl.col("phase") == "train"
        )
        mine = calls.filter(pl.col("arm") == arm)
        assert mine["count"].sum() == records.height
        assert set(mine["tool"]) <= {"python", "submit", "run_tests"}
        assert (mine["advantage_min"] <= mine["advantage_mean"]).all()
        assert (mine["advantage_mean"] <= mine["advantage_max"]).all()
        # The zero potential shapes nothing; the frozen critic does.
        deltas = mine["potential_delta_mean"].abs().max()
        assert deltas == 0.0 if arm == "zero_potential" else deltas > 0.0


def test_perf_stack_rows(pipeline):
    everything = table(pipeline, "perf_stack")
    perf = everything.filter(pl.col("source") == "pipeline")
    assert set(perf["run"]) == {"training_smoke", *ARMS}
    assert set(perf["device"]) == {"cpu"}
    assert everything.height == perf.height  # perf_stack is the pipeline's own timings only
    assert set(perf["model_shape"]) == {"qwen3 L2 d128 ff512 h2/1 v2048"}
    for run, rows in perf.group_by("run"):
        phases = set(rows["phase"])
        assert {"step", "gen", "old_log_prob", "ref", "values", "update_critic", "update_actor"} <= phases
        assert (rows["seconds"] > 0).all()
        save = rows.filter(pl.col("phase") == "save_checkpoint")
        compact = json.loads(
            (pipeline / "results" / "checks" / run[0] / "compact_checkpoint_validation.json").read_text()
        )
        per_step = {}
        for row in compact["rows"]:
            per_step[row["step"]] = per_step.get(row["step"], 0) + row["bytes"]
        assert save["checkpoint_bytes"][0] == sorted(per_step.values())[len(per_step) // 2]
        gen = rows.filter(pl.col("phase") == "gen")
        assert gen["tokens"][0] > 0 and gen["tokens_per_s"][0] > 0


def test_dataset_card_names_the_six_configs(pipeline):
    text = (pipeline / REPORT / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    configs = {c["config_name"]: c["data_files"] for c in front["configs"]}
    assert list(configs) == TABLES
    for name, files in configs.items():
        assert files == [{"split": "train", "path": f"tables/{name}.parquet"}]
        assert (pipeline / REPORT / files[0]["path"]).is_file()
    assert "Protocol violations over every stage: **0**." in text
    assert "| base | 8/8 |" in text and "| zero_potential | 8/8 |" in text
    for name in TABLES:  # every table's columns are documented
        assert f"### `{name}`" in text
    assert "| `potential_delta_mean` | Float64 |" in text


def test_figures_and_records(pipeline):
    figures = sorted((pipeline / REPORT / "figures").iterdir())
    assert [f.name for f in figures] == [
        "call_advantage.png",
        "perf_stack.png",
        "step_metrics.png",
        "validation_curves.png",
    ]
    for f in figures:  # real images with ink on them; what they show: tests/unit/test_figures.py
        pixels = mpimg.imread(f)
        assert pixels.ndim == 3 and min(pixels.shape[:2]) > 200 and (pixels[..., :3] < 0.5).any(), f.name
    records = {p.name for p in (pipeline / REPORT / "records").iterdir()}
    for run in ("training_smoke", *ARMS):
        assert f"{run}.protocol.json" in records and f"{run}.run.json" in records
        for name in (
            "cpu_roundtrip",
            "compact_checkpoint_validation",
            "checkpoint_validation",
            "batch_math",
            "timing_analysis",
            "distributed_roundtrip_rank_0",
            "distributed_roundtrip_rank_1",
        ):
            assert f"checks.{run}.{name}.json" in records
    for policy in ("base", *ARMS):
        assert f"validation.{policy}.validation.json" in records
    assert {"smoke.protocol.json", "boundary.boundary.json", "dose_step.dose_step.json"} <= records
    copied = pipeline / REPORT / "records" / "checks.zero_potential.cpu_roundtrip.json"
    assert copied.read_bytes() == (pipeline / "results/checks/zero_potential/cpu_roundtrip.json").read_bytes()
