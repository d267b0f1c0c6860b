"""`python -m atlas <command>`: the stages and tools behind one entry point.

    python -m atlas verify PATH [PATH ...]   recompute MANIFEST.json hashes; exit 1 on a mismatch
    python -m atlas schema [--check FILE]     print the config JSON schema (or check a copy of it)
    python -m atlas config FILE               validate a config file and print it with defaults
    python -m atlas sources MODULE            the source files a stage module runs
    python -m atlas data ...                  = python -m atlas.stages.prepare_data ...
    python -m atlas model ...                 = python -m atlas.stages.build_tiny_model ...
    python -m atlas grade lcb --problem ROW.json --code PROG.py   one JSON verdict

Snakemake rules call the stage modules directly (`python -m atlas.stages.prepare_data`), so an edit to
this dispatcher reruns nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

STAGES = {
    "data": "atlas.stages.prepare_data",
    "model": "atlas.stages.build_tiny_model",
    "grade": "atlas.graders.cli",
}


def _verify(paths: list[str], skip_sources: bool, no_cache: bool = False) -> int:
    from atlas.hashing import verify

    failed = 0
    for path in paths:
        problems = verify(path, check_sources=not skip_sources, cache=not no_cache)
        for p in problems:
            print(f"MISMATCH {p}")
        print(f"{'ok' if not problems else 'FAILED'} {path}")
        failed += bool(problems)
    return 1 if failed else 0


def _schema(check: str | None) -> int:
    from atlas.config.study import json_schema_text

    text = json_schema_text()
    if check is None:
        sys.stdout.write(text)
        return 0
    if Path(check).read_text(encoding="utf-8") != text:
        print(f"{check} is out of date: regenerate it with `python -m atlas schema > {check}`")
        return 1
    print(f"{check} is up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in STAGES:
        from atlas.stage import run

        stage = importlib.import_module(STAGES[argv[0]])
        run(lambda: stage.main(argv[1:]))
        return 0

    parser = argparse.ArgumentParser(prog="atlas", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="recompute a folder's MANIFEST.json and name every mismatch")
    v.add_argument("paths", nargs="+")
    v.add_argument("--skip-sources", action="store_true", help="check only the folder's own files")
    v.add_argument("--no-cache", action="store_true", help="hash every file again (no cached hashes)")
    s = sub.add_parser("schema", help="print the config JSON schema")
    s.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated schema")
    c = sub.add_parser("config", help="validate a config file")
    c.add_argument("file")
    m = sub.add_parser("sources", help="source files a stage module runs")
    m.add_argument("module")
    for name, module in STAGES.items():
        sub.add_parser(name, help=f"run the stage {module}")
    args = parser.parse_args(argv)

    if args.command == "verify":
        return _verify(args.paths, args.skip_sources, args.no_cache)
    if args.command == "schema":
        return _schema(args.check)
    if args.command == "config":
        from atlas.config.base import ConfigError
        from atlas.config.study import load_config

        try:
            cfg = load_config(args.file)
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 1
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
        return 0
    if args.command == "sources":
        from atlas.sources import module_files

        print("\n".join(module_files(args.module, relative_to=Path.cwd())))
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
