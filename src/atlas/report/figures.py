"""The report's figures, drawn with matplotlib (Agg) from the tables alone.

validation_curves.png   each arm's validation utility by step, one panel per source
call_advantage.png      mean advantage at the action token by turn and tool, one panel per arm
step_metrics.png        score, losses, KL and lengths by step for every training run
perf_stack.png          median seconds per phase of one training step, stacked per run
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from atlas.hashing import atomic_path  # noqa: E402

# PNG metadata holds the matplotlib version unless told otherwise; a figure is its pixels.
PNG_METADATA = {"Software": None}


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata=PNG_METADATA, bbox_inches="tight")
    plt.close(fig)


def validation_curves(curve: pl.DataFrame, path: Path) -> None:
    sources = [s for s in ("all", "gpqa", "lcb") if s in curve["source"].unique().to_list()]
    fig, axes = plt.subplots(
        1, len(sources), figsize=(4.2 * len(sources), 3.4), squeeze=False, layout="constrained"
    )
    for ax, source in zip(axes[0], sources, strict=True):
        arms = curve.filter(pl.col("source") == source).group_by("arm", maintain_order=True)
        for i, ((arm,), rows) in enumerate(arms):  # markers and dashes tell apart arms that coincide
            ax.plot(
                rows["step"], rows["utility"], marker="os^dv"[i % 5], ls=("-", "--", ":")[i % 3], label=arm
            )
        ax.set(
            title=f"validation utility: {source}",
            xlabel="steps done",
            ylabel="mean score",
            ylim=(-0.05, 1.05),
        )
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def call_advantage(calls: pl.DataFrame, path: Path) -> None:
    # Count-weighted over steps: the mean advantage of every call at that turn with that tool.
    by = (
        calls.group_by("arm", "turn", "tool")
        .agg(advantage=(pl.col("advantage_mean") * pl.col("count")).sum() / pl.col("count").sum())
        .sort("arm", "turn", "tool")
    )
    arms = by["arm"].unique(maintain_order=True).to_list()
    tools = sorted(by["tool"].unique().to_list())
    fig, axes = plt.subplots(
        1, len(arms), figsize=(4.6 * len(arms), 3.4), squeeze=False, sharey=True, layout="constrained"
    )
    width = 0.8 / max(len(tools), 1)
    for ax, arm in zip(axes[0], arms, strict=True):
        rows = by.filter(pl.col("arm") == arm)
        for i, tool in enumerate(tools):
            r = rows.filter(pl.col("tool") == tool)
            offset = (i - (len(tools) - 1) / 2) * width  # the tools' bars side by side around the turn
            ax.bar(r["turn"].to_numpy() + offset, r["advantage"], width=width, label=tool)
        ax.set_xticks(sorted(rows["turn"].unique().to_list()))
        ax.axhline(0, color="black", lw=0.6)
        ax.set(title=f"call advantage: {arm}", xlabel="turn", ylabel="mean advantage at the action token")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


STEP_PANEL = [
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "policy-gradient loss"),
    ("critic/vf_loss", "value loss"),
    ("actor/kl_loss", "KL to the reference"),
    ("response_length/mean", "generated tokens / episode"),
    ("timing_s/step", "step seconds"),
]


def step_metrics(by_run: pl.DataFrame, path: Path) -> None:
    runs = by_run.filter(pl.col("stage") != "dose_step")
    fig, axes = plt.subplots(2, 3, figsize=(12.6, 6.4), layout="constrained")
    for ax, (column, title) in zip(axes.flat, STEP_PANEL, strict=True):
        for (run,), rows in runs.group_by("run", maintain_order=True):
            ax.plot(rows["step"], rows[column], marker="o", label=run)
        ax.set(title=title, xlabel="step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def perf_stack(perf: pl.DataFrame, path: Path) -> None:
    # The phases that make up a step; gen is split into model and tools, so it is not stacked.
    phases = [
        "gen_model",
        "gen_tools",
        "old_log_prob",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
    ]
    phases.append("save_checkpoint")
    rows = perf.filter(pl.col("test") == "train_step")
    runs = rows["run"].unique(maintain_order=True).to_list()
    fig, ax = plt.subplots(figsize=(8.4, 0.7 * len(runs) + 1.6), layout="constrained")
    left = [0.0] * len(runs)
    for phase in phases:
        seconds = []
        for run in runs:
            r = rows.filter((pl.col("run") == run) & (pl.col("phase") == phase))
            seconds.append(float(r["seconds"][0]) if r.height and r["seconds"][0] is not None else 0.0)
        ax.barh(runs, seconds, left=left, label=phase)
        left = [a + b for a, b in zip(left, seconds, strict=True)]
    device = rows["device"][0] if rows.height else "?"
    ax.set(xlabel=f"median seconds per step ({device})", title="one training step, by phase")
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.12))
    _save(fig, path)


def draw_all(tables: dict[str, pl.DataFrame], folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    validation_curves(tables["arms_validation_curve"], folder / "validation_curves.png")
    call_advantage(tables["arms_call_advantage"], folder / "call_advantage.png")
    step_metrics(tables["step_metrics_by_run"], folder / "step_metrics.png")
    perf_stack(tables["perf_stack"], folder / "perf_stack.png")
    return sorted(p.name for p in folder.glob("*.png"))
