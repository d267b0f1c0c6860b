"""The report's six tables, built with polars from the run, check and validation folders.

Each table is declared once, as columns of (name, dtype, meaning): the builders select exactly
those columns in that order, the schema tests pin them, and the dataset card documents them.

    step_metrics_by_run     one row per training step of every run (and per dose of the dose step)
    full_validation_views   one row per full-validation trajectory, for every validated policy
    perf_stack              phase times, tokens, memory and checkpoint sizes per perf test
    arms_validation_curve   each arm's validation points during training, per source
    arms_step_metrics       the arms' step metrics that the report compares
    arms_call_advantage     advantages at the action tokens, by arm, step, turn and tool
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from atlas.contracts.runs import STEP_METRICS
from atlas.errors import InputError

F64, I64, STR, BOOL = pl.Float64, pl.Int64, pl.String, pl.Boolean


@dataclass(frozen=True)
class Column:
    name: str
    dtype: type[pl.DataType]
    meaning: str


def schema(columns: list[Column]) -> pl.Schema:
    return pl.Schema([(c.name, c.dtype) for c in columns])


# --- what each step metric means (the catalogue and its order: atlas.contracts.runs) ---

METRIC_MEANINGS: dict[str, str] = {
    "training/global_step": "steps done after this step",
    "critic/score/mean": "mean episode score (graded submissions)",
    "critic/score/max": "max episode score",
    "critic/score/min": "min episode score",
    "score/gpqa/mean": "mean GPQA episode score (null in a step without GPQA questions)",
    "score/lcb/mean": "mean LiveCodeBench episode score (null without LCB questions)",
    "completed/gpqa": "fraction of GPQA episodes that ended with a submit",
    "completed/lcb": "fraction of LCB episodes that ended with a submit",
    "critic/rewards/mean": "mean reward per action token (score + dose * shaping)",
    "critic/rewards/max": "max reward on an action token",
    "critic/rewards/min": "min reward on an action token",
    "critic/advantages/mean": "mean GAE advantage over sampled tokens",
    "critic/advantages/max": "max advantage",
    "critic/advantages/min": "min advantage",
    "critic/returns/mean": "mean return over sampled tokens",
    "critic/returns/max": "max return",
    "critic/returns/min": "min return",
    "critic/values/mean": "mean critic value over sampled tokens",
    "critic/values/max": "max value",
    "critic/values/min": "min value",
    "critic/vf_loss": "critic loss (clipped value loss)",
    "critic/vf_clipfrac": "fraction of tokens where the value clip was active",
    "critic/vpred_mean": "mean value prediction during the critic update",
    "critic/vf_explained_var": "explained variance of returns by values",
    "critic/grad_norm": "critic gradient norm before clipping",
    "critic/lr": "critic learning rate",
    "actor/pg_loss": "policy-gradient loss",
    "actor/pg_clipfrac": "fraction of tokens clipped by the PPO ratio (upper)",
    "actor/pg_clipfrac_lower": "fraction clipped by the dual-clip lower bound",
    "actor/ppo_kl": "mean approximate KL between the old and new policy",
    "actor/kl_loss": "KL-to-reference loss (0 unless kl_mode is loss)",
    "actor/kl_coef": "KL coefficient",
    "actor/grad_norm": "actor gradient norm before clipping",
    "actor/lr": "actor learning rate",
    "rollout/logprob_gap_mean": "mean |rollout log-prob - recomputed old log-prob| on sampled tokens",
    "rollout/logprob_gap_max": "max of that gap",
    "rollout/importance_ratio_mean": "mean exp(old log-prob - rollout log-prob) on sampled tokens, both under the grammar's masks",
    "rollout/importance_ratio_outside": "share of sampled tokens whose ratio lies outside [0.9, 1.1]",
    "rollout/importance_ratio_raw_mean": "the same ratio with the old log-prob over the whole vocabulary (null under verl)",
    "rollout/importance_ratio_raw_outside": "share of sampled tokens whose raw ratio lies outside [0.9, 1.1]",
    "response_length/mean": "mean generated tokens per episode",
    "response_length/max": "max generated tokens per episode",
    "response_length/min": "min generated tokens per episode",
    "prompt_length/mean": "mean prompt tokens per episode",
    "turns/mean": "mean generations per episode",
    "protocol/episodes": "episodes in the step",
    "protocol/completed": "episodes that ended with an executed submit",
    "protocol/generations": "generations",
    "protocol/records": "execution records (must equal generations)",
    "protocol/calls": "parsed tool calls (must equal generations)",
    "protocol/violations": "protocol violations (must be 0)",
    "timing_s/step": "seconds for the whole step (measured)",
    "timing_s/gen": "rollout seconds (measured)",
    "timing_s/gen_model": "of which the model's forward passes and sampling (measured)",
    "timing_s/gen_tools": "of which tools and graders (measured)",
    "timing_s/potential": "potential evaluation seconds (measured)",
    "timing_s/old_log_prob": "old log-prob recomputation seconds (measured)",
    "timing_s/ref": "reference log-prob seconds (measured)",
    "timing_s/values": "critic value seconds (measured)",
    "timing_s/adv": "GAE seconds (measured)",
    "timing_s/update_critic": "critic update seconds (measured)",
    "timing_s/update_actor": "actor update seconds (measured)",
    "timing_s/save_checkpoint": "compact checkpoint save seconds (measured; null without a save)",
    "perf/rollout_tokens": "tokens the policy generated in the step's rollouts, forced ones included (measured)",
    "perf/rollout_tokens_per_s": "those tokens over the rollout's seconds, timing_s/gen (measured)",
    "perf/cpu_memory_used_gb": "peak resident memory of the process, GiB (measured)",
    "perf/max_memory_allocated_gb": "peak CUDA memory allocated, GiB (measured; null on CPU)",
}
if tuple(METRIC_MEANINGS) != STEP_METRICS:  # every written metric is documented, in its order
    raise ImportError(
        "atlas.report.tables.METRIC_MEANINGS must describe exactly atlas.contracts.runs.STEP_METRICS, "
        f"in order; missing {sorted(set(STEP_METRICS) - set(METRIC_MEANINGS))}, "
        f"extra {sorted(set(METRIC_MEANINGS) - set(STEP_METRICS))}"
    )

STEP_METRICS_BY_RUN = [
    Column("run", STR, "training run (runs.<name>), or dose_step"),
    Column("stage", STR, "training_smoke, arm or dose_step"),
    Column("arm", STR, "the run's name when it is one of report.arms, else null"),
    Column("potential", STR, "the run's potential (zero, critic_snapshot)"),
    Column("dose", F64, "shaping dose"),
    Column("step", I64, "0-based step of the ordered schedule"),
    *[Column(name, F64, meaning) for name, meaning in METRIC_MEANINGS.items()],
]

FULL_VALIDATION_VIEWS = [
    Column("policy", STR, "base, or the training run whose final actor was validated"),
    Column("arm", STR, "the policy's name when it is one of report.arms, else null"),
    Column("question_uid", STR, "question id (source:record id)"),
    Column("source", STR, "gpqa or lcb"),
    Column("sample", I64, "episode index among the question's samples"),
    Column("completed", BOOL, "ended with an executed submit"),
    Column("end_reason", STR, "submit, trajectory_limit or turn_limit"),
    Column("turns", I64, "generations in the episode"),
    Column("tools", STR, "the called tools in order, joined by '>'"),
    Column("tool_errors", I64, "records whose tool status is not ok"),
    Column("final_answer", STR, "arguments of the submit call (canonical JSON)"),
    Column("score", F64, "graded score of the episode"),
    Column("prompt_tokens", I64, "tokens of the first prompt"),
    Column("tokens", I64, "tokens of the whole trajectory"),
    Column("generated_tokens", I64, "tokens the policy generated (loss mask 1)"),
    Column("sampled_tokens", I64, "of those, sampled (not forced by the grammar)"),
]

PERF_STACK = [
    Column("source", STR, "pipeline: this run's own timings"),
    Column("test", STR, "train_step (one PPO step of a run), rollout, checkpoint_save"),
    Column("run", STR, "the training run it was measured in"),
    Column("device", STR, "cpu, or the GPU's name"),
    Column("model_shape", STR, "architecture, layers, width, MLP width, heads, vocab, parameters"),
    Column("phase", STR, "timing phase (verl's timing_s names without the prefix)"),
    Column("steps", I64, "steps measured"),
    Column("seconds", F64, "median seconds of the phase per step"),
    Column("tokens", I64, "median tokens per step the phase processed (null where not meaningful)"),
    Column("tokens_per_s", F64, "total tokens / total seconds over the measured steps"),
    Column("peak_memory_gb", F64, "peak CUDA memory allocated on GPUs, peak process RSS on CPU, GiB"),
    Column("checkpoint_bytes", I64, "median compact checkpoint size per step (save_checkpoint only)"),
    Column("checkpoint_save_s", F64, "median save seconds (save_checkpoint only)"),
]

ARMS_VALIDATION_CURVE = [
    Column("arm", STR, "the arm (a training run in report.arms)"),
    Column("step", I64, "steps done when validated (0: before training)"),
    Column("source", STR, "gpqa, lcb or all"),
    Column("n", I64, "validation trajectories"),
    Column("utility", F64, "mean score"),
    Column("accuracy", F64, "fraction of trajectories with score 1"),
    Column("completed_fraction", F64, "fraction that ended with an executed submit"),
]

ARM_METRICS = [
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

ARMS_STEP_METRICS = [
    Column("arm", STR, "the arm"),
    Column("potential", STR, "the arm's potential"),
    Column("dose", F64, "the arm's shaping dose"),
    Column("step", I64, "0-based step"),
    *[Column(name, F64, METRIC_MEANINGS[name]) for name in ARM_METRICS],
]

ARMS_CALL_ADVANTAGE = [
    Column("arm", STR, "the arm"),
    Column("step", I64, "0-based step"),
    Column("turn", I64, "0-based generation index in the episode"),
    Column("tool", STR, "the called tool"),
    Column("count", I64, "calls (records) in the group"),
    Column("advantage_mean", F64, "mean advantage at the record's action token"),
    Column("advantage_std", F64, "its standard deviation (0 for one call)"),
    Column("advantage_min", F64, "min advantage"),
    Column("advantage_max", F64, "max advantage"),
    Column("value_mean", F64, "mean critic value at the action token"),
    Column("reward_mean", F64, "mean reward on the action token"),
    Column("score_mean", F64, "mean score of the records"),
    Column("potential_delta_mean", F64, "mean gamma * Phi(s') - Phi(s) on the action token"),
]

TABLES: dict[str, list[Column]] = {
    "step_metrics_by_run": STEP_METRICS_BY_RUN,
    "full_validation_views": FULL_VALIDATION_VIEWS,
    "perf_stack": PERF_STACK,
    "arms_validation_curve": ARMS_VALIDATION_CURVE,
    "arms_step_metrics": ARMS_STEP_METRICS,
    "arms_call_advantage": ARMS_CALL_ADVANTAGE,
}

SUMMARIES = {
    "step_metrics_by_run": "One row per training step of every run, and per dose of the dose step.",
    "full_validation_views": "One row per full-validation trajectory of every validated policy.",
    "perf_stack": "Phase times, tokens, memory and checkpoint sizes of the perf tests.",
    "arms_validation_curve": "Each arm's validation points during training, per source.",
    "arms_step_metrics": "The step metrics the arms are compared on.",
    "arms_call_advantage": "Advantages at the action tokens by arm, step, turn and tool.",
}


def conform(frame: pl.DataFrame, columns: list[Column], what: str) -> pl.DataFrame:
    """`frame` with exactly `columns`, in order and cast to their types; a missing metric column
    becomes null (a run without LCB questions has no score/lcb/mean), a missing key is an error."""
    exprs = []
    for c in columns:
        if c.name in frame.columns:
            exprs.append(pl.col(c.name).cast(c.dtype, strict=True))
        elif c.dtype is F64:
            exprs.append(pl.lit(None, dtype=F64).alias(c.name))
        else:
            raise InputError(f"{what}: no column {c.name!r} (expected {c.dtype.__name__})")
    return frame.select(exprs)


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing (expected the stage's JSON record)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None


# --- builders ---


@dataclass(frozen=True)
class RunFolder:
    """A finished training run (results/runs/<name>) and what the report calls it."""

    path: Path
    arms: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def arm(self) -> str | None:
        return self.name if self.name in self.arms else None

    @property
    def info(self) -> dict:
        return read_json(self.path / "run.json")


def step_metrics_by_run(runs: list[RunFolder], dose_step: Path) -> pl.DataFrame:
    frames = []
    for run in runs:
        metrics = pl.read_parquet(run.path / "step_metrics.parquet")
        unknown = sorted(set(metrics.columns) - {"run", "step", *STEP_METRICS})
        if unknown:
            raise InputError(
                f"{run.path / 'step_metrics.parquet'}: metric columns {unknown} are not in "
                "atlas.contracts.runs.STEP_METRICS; declare them there and their meaning in "
                "atlas.report.tables.METRIC_MEANINGS"
            )
        info = run.info
        frames.append(
            metrics.with_columns(
                stage=pl.lit("arm" if run.arm else run.name),
                arm=pl.lit(run.arm, dtype=STR),
                potential=pl.lit(info["potential"]),
                dose=pl.lit(float(info["dose"])),
            )
        )
    dose = pl.read_parquet(dose_step / "step_metrics.parquet")
    potential = read_json(dose_step / "dose_step.json")["potential"]
    frames.append(
        dose.with_columns(stage=pl.lit("dose_step"), arm=pl.lit(None, dtype=STR), potential=pl.lit(potential))
    )
    frames = [conform(f, STEP_METRICS_BY_RUN, "step metrics") for f in frames]
    return pl.concat(frames).sort("stage", "run", "step", "dose")


def full_validation_views(folders: list[Path], arms: tuple[str, ...]) -> pl.DataFrame:
    frames = []
    key = ["question_uid", "sample"]
    for folder in folders:
        policy = folder.name
        answers = pl.scan_parquet(folder / "answers.parquet")
        traj = pl.scan_parquet(folder / "trajectories.parquet").select(
            *key,
            "end_reason",
            "prompt_tokens",
            tokens=pl.col("token_ids").list.len(),
            generated_tokens=pl.col("loss_mask").list.sum(),
            sampled_tokens=pl.col("sampled").list.sum(),
        )
        calls = (
            pl.scan_parquet(folder / "records.parquet")
            .sort(*key, "turn")
            .group_by(key, maintain_order=True)
            .agg(tools=pl.col("tool").str.join(">"), tool_errors=(pl.col("tool_status") != "ok").sum())
        )
        view = (
            answers.join(traj, on=key, how="left", validate="1:1")
            .join(calls, on=key, how="left", validate="1:1")
            .with_columns(policy=pl.lit(policy), arm=pl.lit(policy if policy in arms else None, dtype=STR))
            .collect()
        )
        frames.append(conform(view, FULL_VALIDATION_VIEWS, f"{folder}"))
    return pl.concat(frames).sort("policy", "source", "question_uid", "sample")


def model_shape(model_dir: Path) -> str:
    c = read_json(model_dir / "config.json")
    return (
        f"{c['model_type']} L{c['num_hidden_layers']} d{c['hidden_size']} ff{c['intermediate_size']} "
        f"h{c['num_attention_heads']}/{c['num_key_value_heads']} v{c['vocab_size']}"
    )


# The token count a phase processes: the generated tokens (a step metric) for the rollout, all of the
# batch's tokens (batch math) for the passes over it.
PHASE_TOKENS = {
    "gen": "perf/rollout_tokens",
    "gen_model": "perf/rollout_tokens",
    "old_log_prob": "tokens",
    "ref": "tokens",
    "values": "tokens",
    "update_critic": "tokens",
    "update_actor": "tokens",
    "step": "tokens",
}


def perf_stack(runs: list[RunFolder], checks: dict[str, Path], shape: str) -> pl.DataFrame:
    """The pipeline's own perf tests: every timing_s/* phase of each run's steps (the checks
    stage's timing_analysis names the device), with tokens, peak memory and checkpoint sizes."""
    rows = []
    for run in runs:
        metrics = pl.read_parquet(run.path / "step_metrics.parquet")
        folder = checks[run.name]
        timing = read_json(folder / "timing_analysis.json")
        batch = pl.DataFrame(read_json(folder / "batch_math.json")["steps"]).select(
            "step", "tokens", "sampled_tokens"
        )
        sizes = (
            pl.DataFrame(read_json(folder / "compact_checkpoint_validation.json")["rows"])
            .filter(pl.col("rank") == 0)
            .group_by("step")
            .agg(pl.col("bytes").sum())
        )
        steps = metrics.join(batch, on="step", how="left", validate="1:1")
        memory = "perf/max_memory_allocated_gb" if "perf/max_memory_allocated_gb" in steps.columns else None
        memory = memory or "perf/cpu_memory_used_gb"
        peak = steps[memory].max()
        for column in sorted(c for c in steps.columns if c.startswith("timing_s/")):
            phase = column.removeprefix("timing_s/")
            seconds = steps[column].drop_nulls()
            tokens_col = PHASE_TOKENS.get(phase)
            tokens = steps.filter(pl.col(column).is_not_null())[tokens_col] if tokens_col else None
            saving = phase == "save_checkpoint"
            rows.append(
                {
                    "source": "pipeline",
                    "test": "train_step",
                    "run": run.name,
                    "device": timing["device"],
                    "model_shape": shape,
                    "phase": phase,
                    "steps": seconds.len(),
                    "seconds": seconds.median(),
                    "tokens": int(tokens.median()) if tokens is not None else None,
                    "tokens_per_s": tokens.sum() / seconds.sum()
                    if tokens is not None and seconds.sum()
                    else None,
                    "peak_memory_gb": peak,
                    "checkpoint_bytes": int(sizes["bytes"].median()) if saving and sizes.height else None,
                    "checkpoint_save_s": seconds.median() if saving else None,
                }
            )
    frame = pl.DataFrame(rows, schema=schema(PERF_STACK))
    return frame.sort("source", "test", "run", "phase")


def arms_validation_curve(runs: list[RunFolder]) -> pl.DataFrame:
    frames = [
        pl.read_parquet(run.path / "validation.parquet").with_columns(arm=pl.lit(run.name))
        for run in runs
        if run.arm
    ]
    frames = [conform(f, ARMS_VALIDATION_CURVE, "validation curve") for f in frames]
    return pl.concat(frames).sort("arm", "step", "source")


def arms_step_metrics(by_run: pl.DataFrame) -> pl.DataFrame:
    arms = by_run.filter(pl.col("stage") == "arm")
    return conform(arms, ARMS_STEP_METRICS, "step metrics").sort("arm", "step")


def arms_call_advantage(runs: list[RunFolder]) -> pl.DataFrame:
    frames = [
        pl.read_parquet(run.path / "call_advantages.parquet").with_columns(arm=pl.lit(run.name))
        for run in runs
        if run.arm
    ]
    frames = [conform(f, ARMS_CALL_ADVANTAGE, "call advantages") for f in frames]
    return pl.concat(frames).sort("arm", "step", "turn", "tool")


def build_tables(
    runs: list[RunFolder],
    dose_step: Path,
    validation: list[Path],
    checks: dict[str, Path],
    model_dir: Path,
) -> dict[str, pl.DataFrame]:
    arms = runs[0].arms if runs else ()
    by_run = step_metrics_by_run(runs, dose_step)
    tables = {
        "step_metrics_by_run": by_run,
        "full_validation_views": full_validation_views(validation, arms),
        "perf_stack": perf_stack(runs, checks, model_shape(model_dir)),
        "arms_validation_curve": arms_validation_curve(runs),
        "arms_step_metrics": arms_step_metrics(by_run),
        "arms_call_advantage": arms_call_advantage(runs),
    }
    for name, frame in tables.items():
        assert frame.schema == schema(TABLES[name]), name
    return tables
