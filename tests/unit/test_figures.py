"""The report's figures show their tables: drawn from small tables written here, each figure's
bars and lines hold exactly the table's numbers (read back from the drawn figure), and the PNG's
pixels change when a number does."""

from __future__ import annotations

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest

from atlas.report import figures


@pytest.fixture
def drawn(monkeypatch):
    """The figure a drawing function made, kept open after it is saved (the real save runs)."""
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: None)
    plt.close("all")
    yield lambda: plt.figure(plt.get_fignums()[-1])
    plt.close("all")


PERF = pl.DataFrame(
    {
        "test": ["train_step"] * 5 + ["rollout"],
        "run": ["a", "a", "a", "b", "b", "bench"],
        "device": ["cpu"] * 5 + ["NVIDIA H200"],
        "phase": ["gen_model", "update_actor", "gen", "gen_model", "save_checkpoint", "static_grammar"],
        "seconds": [2.0, 3.0, 99.0, 1.5, 0.25, 7.0],
    }
)


def test_perf_stack_stacks_each_runs_phases(drawn, tmp_path):
    figures.perf_stack(PERF, tmp_path / "perf.png")
    (ax,) = drawn().axes
    phases = [t.get_text() for t in ax.get_legend().get_texts()]
    assert phases[0] == "gen_model" and phases[-1] == "save_checkpoint" and "gen" not in phases
    bars = {}  # (phase, run) -> (left, width); rows are runs a, b in table order
    for phase, container in zip(phases, ax.containers, strict=True):
        for run, rect in zip(["a", "b"], container, strict=True):
            bars[phase, run] = (rect.get_x(), rect.get_width())
    assert bars["gen_model", "a"] == (0.0, 2.0) and bars["update_actor", "a"] == (2.0, 3.0)
    assert bars["save_checkpoint", "a"] == (5.0, 0.0)  # a phase a run lacks is drawn as nothing
    assert bars["gen_model", "b"] == (0.0, 1.5) and bars["save_checkpoint", "b"] == (1.5, 0.25)
    assert sum(w for (_, run), (_, w) in bars.items() if run == "a") == 5.0  # gen (99 s) not stacked
    assert ax.get_xlabel() == "median seconds per step (cpu)"


def test_validation_curves_plot_each_arms_utility(drawn, tmp_path):
    curve = pl.DataFrame(
        {
            "arm": ["x", "x", "y", "y"] * 2,
            "source": ["all"] * 4 + ["gpqa"] * 4,
            "step": [0, 2, 0, 2] * 2,
            "utility": [0.1, 0.4, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8],
        }
    )
    figures.validation_curves(curve, tmp_path / "curves.png")
    axes = drawn().axes
    assert [ax.get_title() for ax in axes] == ["validation utility: all", "validation utility: gpqa"]
    got = {
        (ax.get_title().rsplit(" ", 1)[1], line.get_label()): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in axes
        for line in ax.get_lines()
    }
    assert got == {
        ("all", "x"): ([0, 2], [0.1, 0.4]),
        ("all", "y"): ([0, 2], [0.2, 0.3]),
        ("gpqa", "x"): ([0, 2], [0.5, 0.6]),
        ("gpqa", "y"): ([0, 2], [0.7, 0.8]),
    }


def test_call_advantage_bars_are_count_weighted_means(drawn, tmp_path):
    calls = pl.DataFrame(
        {
            "arm": ["x"] * 3,
            "step": [0, 1, 0],
            "turn": [0, 0, 1],
            "tool": ["python", "python", "submit"],
            "advantage_mean": [1.0, -2.0, 0.5],
            "count": [3, 1, 2],
        }
    )
    figures.call_advantage(calls, tmp_path / "adv.png")
    (ax,) = drawn().axes
    heights = {
        (label, round(rect.get_x() + rect.get_width() / 2, 6)): rect.get_height()
        for label, container in zip(
            [t.get_text() for t in ax.get_legend().get_texts()], ax.containers, strict=True
        )
        for rect in container
    }
    # python at turn 0: (3 x 1.0 + 1 x -2.0) / 4 = 0.25, left of the turn; submit at turn 1, right
    assert heights == {("python", -0.2): 0.25, ("submit", 1.2): 0.5}


def test_step_metrics_leave_out_the_dose_step(drawn, tmp_path):
    columns = [c for c, _ in figures.STEP_PANEL]
    by_run = pl.DataFrame(
        {
            "run": ["r", "r", "dose"],
            "stage": ["train", "train", "dose_step"],
            "step": [0, 1, 0],
            **{c: [float(i), float(i) + 1, 50.0] for i, c in enumerate(columns)},
        }
    )
    figures.step_metrics(by_run, tmp_path / "steps.png")
    axes = drawn().axes
    assert [ax.get_title() for ax in axes] == [t for _, t in figures.STEP_PANEL]
    for i, ax in enumerate(axes):
        (line,) = ax.get_lines()
        assert (line.get_label(), list(line.get_ydata())) == ("r", [float(i), float(i) + 1])


def test_the_png_shows_the_numbers(tmp_path):
    """The written file is the figure's pixels: the same table gives the same bytes, a changed
    number changes the pixels (and the drawing is not blank)."""
    paths = [tmp_path / f"{k}.png" for k in range(3)]
    figures.perf_stack(PERF, paths[0])
    figures.perf_stack(PERF, paths[1])
    changed = PERF.with_columns(
        pl.when(pl.col("phase") == "update_actor").then(1.0).otherwise(pl.col("seconds")).alias("seconds")
    )
    figures.perf_stack(changed, paths[2])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    a, c = mpimg.imread(paths[0]), mpimg.imread(paths[2])
    assert a.ndim == 3 and (a[..., :3] < 0.9).any()  # ink on the page
    assert a.shape != c.shape or not np.array_equal(a, c)
