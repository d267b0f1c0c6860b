"""What every stage's command line shares: the config slice, the output, the code it runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from atlas.errors import InputError
from atlas.sources import module_files


def stage_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--config-slice",
        required=True,
        type=json.loads,
        help="the stage's config slice as JSON (the rule passes its params)",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    return parser


def code_files(module: str) -> list[str]:
    """The source files `module` runs, relative to the working directory where possible."""
    return module_files(module, relative_to=Path.cwd())


def log(stage: str, message: str, **fields: Any) -> None:
    """One progress line on stderr (rules send it to their log file)."""
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message} {extra}".rstrip(), file=sys.stderr, flush=True)


def run(main: Callable[[], None]) -> None:
    """Run a stage's main(); bad input ends it with the message alone and exit status 1."""
    try:
        main()
    except (InputError, ValidationError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
