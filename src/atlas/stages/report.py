"""Report stage: results/report25/, the Hub-ready folder of the report's tables, records and figures.

Reads the finished run, check and validation folders (never the checkpoints), and writes, all at
once (a crash leaves nothing half-written):

    tables/<table>.parquet, .csv    the six tables of atlas.report.tables, built with polars
    records/<stage>.<record>.json   every JSON record of the runs, checks and validations
    figures/*.png                   atlas.report.figures
    README.md                       a Hugging Face dataset card (atlas.report.card)
    MANIFEST.json                   sha256 and size of each file; inputs, code and config

    python -m atlas.stages.report --config-slice '{...}' --model results/models/tiny \
        --runs results/runs/training_smoke results/runs/zero_potential ... \
        --dose-step results/runs/dose_step --smoke results/runs/smoke --boundary results/runs/boundary \
        --checks results/checks/training_smoke ... --validation results/validation/base ... \
        --out results/report25
"""

from __future__ import annotations

import shutil
from pathlib import Path

from atlas.config.report import ReportSlice
from atlas.contracts.protocol import PINNED_COUNTS
from atlas.errors import InputError
from atlas.hashing import MANIFEST, atomic_dir, atomic_write_text, write_manifest
from atlas.report import card, figures
from atlas.report.tables import RunFolder, build_tables, read_json
from atlas.stage import code_files, log, run, stage_parser

MODULE = "atlas.stages.report"


def parser():
    p = stage_parser(__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="the base model folder (its config.json)")
    p.add_argument("--runs", required=True, nargs="+", type=Path, help="training run folders")
    p.add_argument("--dose-step", required=True, type=Path)
    p.add_argument("--smoke", required=True, type=Path)
    p.add_argument("--boundary", required=True, type=Path)
    p.add_argument("--checks", required=True, nargs="+", type=Path, help="results/checks/<run> folders")
    p.add_argument("--validation", required=True, nargs="+", type=Path, help="results/validation/<policy>")
    return p


def gather_records(folders: dict[str, Path], dest: Path) -> list[str]:
    """Copy each folder's top-level JSON records to dest/<prefix>.<name>.json."""
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for prefix, folder in folders.items():
        for f in sorted(folder.glob("*.json")):
            if f.name == MANIFEST:
                continue
            name = f"{prefix}.{f.name}"
            shutil.copyfile(f, dest / name)
            names.append(name)
    return sorted(names)


def protocol_rows(stages: dict[str, Path]) -> list[dict]:
    keys = PINNED_COUNTS
    rows = []
    for stage, folder in stages.items():
        p = read_json(folder / "protocol.json")
        missing = [k for k in keys if k not in p]
        if missing:
            raise InputError(f"{folder / 'protocol.json'}: missing {missing}")
        rows.append({"stage": stage, **{k: p[k] for k in keys}})
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    s = args.config_slice
    sl = ReportSlice.model_validate(s)
    arms = tuple(sl.report.arms)
    runs = [RunFolder(p, arms) for p in args.runs]
    missing = sorted(set(arms) - {r.name for r in runs})
    if missing:
        raise InputError(f"report.arms names {missing}, but no --runs folder is named so")
    checks = {p.name: p for p in args.checks}
    if absent := sorted({r.name for r in runs} - set(checks)):
        raise InputError(f"no --checks folder for the runs {absent}")

    log("report", "building tables", runs=len(runs), policies=len(args.validation))
    tables = build_tables(runs, args.dose_step, args.validation, checks, args.model)
    sources = {
        "smoke": args.smoke,
        "boundary": args.boundary,
        **{r.name: r.path for r in runs},
        "dose_step": args.dose_step,
        **{f"validation_{p.name}": p for p in args.validation},
    }
    protocol = protocol_rows(sources)
    validation = [read_json(p / "validation.json") for p in args.validation]

    with atomic_dir(args.out) as tmp:
        (tmp / "tables").mkdir()
        for name, frame in tables.items():
            frame.write_parquet(tmp / "tables" / f"{name}.parquet", compression="zstd", statistics=True)
            frame.write_csv(tmp / "tables" / f"{name}.csv")
        record_folders = {
            "smoke": args.smoke,
            "boundary": args.boundary,
            "dose_step": args.dose_step,
            **{r.name: r.path for r in runs},
            **{f"checks.{name}": p for name, p in checks.items()},
            **{f"validation.{p.name}": p for p in args.validation},
        }
        records = gather_records(record_folders, tmp / "records")
        log("report", "drawing figures")
        drawn = figures.draw_all(tables, tmp / "figures")
        atomic_write_text(
            tmp / "README.md",
            card.render(
                title=sl.report.title,
                study=sl.study,
                tables=tables,
                protocol=protocol,
                validation=validation,
                records=records,
                figures=drawn,
            ),
        )
        inputs = [
            args.model / "config.json",
            *(folder / MANIFEST for folder in record_folders.values()),
        ]
        write_manifest(tmp, stage="report", inputs=inputs, code=code_files(MODULE), config=s)
    log("report", "wrote", out=args.out, tables=len(tables), records=len(records), figures=len(drawn))


if __name__ == "__main__":
    run(main)
