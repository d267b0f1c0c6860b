"""The report folder's README.md: a Hugging Face dataset card.

Its YAML front matter maps each of the six tables to its parquet file (`configs:`), so the Hub's
viewer and `datasets.load_dataset(path, "<table>")` open them; the body summarises what was found
(protocol counts, completion, the arms compared, perf) and documents every column.
"""

from __future__ import annotations

import polars as pl
import yaml

from atlas.contracts.protocol import PINNED_COUNTS
from atlas.report.tables import SUMMARIES, TABLES


def front_matter(title: str, study: str) -> dict:
    return {
        "pretty_name": title,
        "license": "apache-2.0",
        "tags": ["reinforcement-learning", "ppo", "tool-use", "atlas", study],
        "configs": [
            {
                "config_name": name,
                "data_files": [{"split": "train", "path": f"tables/{name}.parquet"}],
                **({"default": True} if i == 0 else {}),
            }
            for i, name in enumerate(TABLES)
        ],
    }


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return out


def summary(tables: dict[str, pl.DataFrame], protocol: list[dict], validation: list[dict]) -> list[str]:
    lines = ["## What was found", "", "### Protocol", ""]
    lines += _table(
        ["stage", *PINNED_COUNTS],
        [
            [
                p["stage"],
                *(p[k] for k in PINNED_COUNTS),
            ]
            for p in protocol
        ],
    )
    total = sum(p["violations"] for p in protocol)
    lines += ["", f"Protocol violations over every stage: **{total}**.", "", "### Full validation", ""]
    rows = []
    for v in validation:
        by = {r["source"]: r for r in v["by_source"]}
        rows.append(
            [
                v["policy"],
                f"{v['completed']}/{v['trajectories']}",
                by["all"]["utility"],
                by.get("gpqa", {}).get("utility"),
                by.get("lcb", {}).get("utility"),
            ]
        )
    lines += _table(["policy", "completed", "utility (all)", "GPQA", "LCB"], rows)

    lines += ["", "### Arms compared", ""]
    curve = tables["arms_validation_curve"].filter(pl.col("source") == "all")
    metrics = tables["arms_step_metrics"]
    rows = []
    for (arm,), c in curve.group_by("arm", maintain_order=True):
        m = metrics.filter(pl.col("arm") == arm)
        rows.append(
            [
                arm,
                m["potential"][0],
                m["dose"][0],
                m.height,
                c.filter(pl.col("step") == c["step"].min())["utility"][0],
                c.filter(pl.col("step") == c["step"].max())["utility"][0],
                m["critic/score/mean"].mean(),
            ]
        )
    lines += _table(
        ["arm", "potential", "dose", "steps", "val utility at start", "at end", "mean train score"], rows
    )

    lines += ["", "### Perf (median seconds of one training step)", ""]
    perf = tables["perf_stack"].filter(pl.col("test") == "train_step")
    rows = []
    for (run,), p in perf.group_by("run", maintain_order=True):
        phase = {r["phase"]: r for r in p.iter_rows(named=True)}
        save = phase.get("save_checkpoint", {})
        rows.append(
            [
                run,
                p["device"][0],
                phase["step"]["seconds"],
                phase["gen"]["seconds"],
                phase["update_actor"]["seconds"],
                phase["update_critic"]["seconds"],
                p["peak_memory_gb"][0],
                save.get("checkpoint_bytes"),
            ]
        )
    lines += _table(
        ["run", "device", "step", "gen", "update_actor", "update_critic", "peak GiB", "checkpoint bytes"],
        rows,
    )
    shape = perf["model_shape"][0] if perf.height else "-"
    lines += ["", f"Model shape: `{shape}`.", ""]
    return lines


def columns_doc() -> list[str]:
    lines = ["## Tables", ""]
    for name, columns in TABLES.items():
        lines += [
            f"### `{name}`",
            "",
            SUMMARIES[name],
            "",
            f"File: `tables/{name}.parquet` (and `.csv`).",
            "",
        ]
        lines += _table(
            ["column", "type", "meaning"], [[f"`{c.name}`", c.dtype.__name__, c.meaning] for c in columns]
        )
        lines.append("")
    return lines


def render(
    *,
    title: str,
    study: str,
    tables: dict[str, pl.DataFrame],
    protocol: list[dict],
    validation: list[dict],
    records: list[str],
    figures: list[str],
) -> str:
    head = yaml.safe_dump(front_matter(title, study), sort_keys=False, width=1000)
    body = [
        f"# {title}",
        "",
        f"Study `{study}`, built by the atlas pipeline (`snakemake --cores all results/report25/`). "
        "Every generation is free text followed by exactly one tool call; every turn writes one typed "
        "execution record; reward is scored only from that record and placed on its action token.",
        "",
        *summary(tables, protocol, validation),
        "## Figures",
        "",
        *[f"![{f}](figures/{f})" for f in figures],
        "",
        *columns_doc(),
        "## Records",
        "",
        "The run and check records, gathered as `records/<stage>.<record>.json`:",
        "",
        *[f"- `records/{r}`" for r in records],
        "",
        "`MANIFEST.json` lists the sha256 and size of every file here; `python -m atlas verify` "
        "recomputes them.",
        "",
    ]
    return f"---\n{head}---\n\n" + "\n".join(body)
