"""What the stages' command lines share: the config slice, the output, the code it runs, the
arguments of the rollout and training stages, and where progress lines go.

Every path argument of a stage but its outputs is an input, and is checked against the
MANIFEST.json of the folder it lies in before the stage reads it (`verify_inputs`, the same code
as `python -m atlas verify`): a folder argument in full, a file argument by its own entry. A
corrupt, truncated or incomplete input stops the stage, naming the file and the folder to
rebuild. Paths outside any manifest's folder (the user's question files, a local model) are
read as they are.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from atlas.errors import InputError
from atlas.hashing import MANIFEST, verify
from atlas.sources import module_files

# Path arguments a stage writes, not reads: its output and a training run's checkpoint folder
# (checked checkpoint by checkpoint on resume, atlas.rl.recovery).
OUTPUT_ARGS = frozenset({"out", "checkpoints"})


class CorruptInputError(InputError):
    """An input does not match its folder's MANIFEST.json."""


def verify_inputs(paths: list[Path]) -> None:
    """Check each path against the manifest of its folder; raise CorruptInputError naming every
    mismatching file and the folder to rebuild."""
    whole: list[Path] = []
    files: dict[Path, set[str]] = {}
    for path in paths:
        if path.is_dir() and (path / MANIFEST).is_file():
            whole.append(path)
        elif path.is_file() and path.name != MANIFEST and (path.parent / MANIFEST).is_file():
            files.setdefault(path.parent, set()).add(path.name)
    checks = [(folder, None) for folder in whole] + list(files.items())
    for folder, names in checks:
        problems = verify(folder, check_sources=False, only=names)
        if problems:
            listed = "\n".join(f"  {p}" for p in problems)
            # Snakemake rebuilds a directory output by its folder, a file output by the file
            bad = [
                folder / n
                for n in sorted(names or ())
                if any(p.startswith(f"{folder / n}:") for p in problems)
            ]
            target = bad[0] if bad else folder
            raise CorruptInputError(
                f"input folder {folder} does not match its {MANIFEST}:\n{listed}\n"
                f"rebuild {folder} before this stage reads it (snakemake --force {target})"
            )


class StageParser(argparse.ArgumentParser):
    """An ArgumentParser whose parse_args verifies every input path (see the module docstring)."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        verify_inputs(input_paths(self, parsed))
        return parsed


def input_paths(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[Path]:
    """The values of the parser's Path arguments that are not outputs, in argument order."""
    out: list[Path] = []
    for action in parser._actions:
        if action.type is not Path or action.dest in OUTPUT_ARGS:
            continue
        value = getattr(parsed, action.dest, None)
        out.extend(value if isinstance(value, list) else [] if value is None else [value])
    return out


def stage_parser(description: str | None) -> argparse.ArgumentParser:
    parser = StageParser(description=description)
    parser.add_argument(
        "--config-slice",
        required=True,
        type=json.loads,
        help="the stage's config slice as JSON (the rule passes its params)",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    return parser


def rollout_parser(description: str) -> argparse.ArgumentParser:
    """A rollout stage's command line: the config slice and output, the data and the model (the
    stage reads them as atlas.runtime.inputs.RolloutInputs)."""
    parser = stage_parser(description)
    parser.add_argument("--val", required=True, type=Path, help="results/data/val.parquet")
    parser.add_argument("--tests", required=True, type=Path, help="results/data/tests.parquet")
    parser.add_argument("--model", required=True, type=Path, help="the base model folder")
    return parser


def training_parser(description: str) -> argparse.ArgumentParser:
    """A training stage's command line: a rollout stage's, plus the schedule, checkpoints, snapshot
    (the stage reads them as atlas.runtime.inputs.TrainingInputs)."""
    p = rollout_parser(description)
    p.add_argument("--train", required=True, type=Path, help="results/data/train.parquet")
    p.add_argument("--checkpoints", required=True, type=Path, help="results/checkpoints/<run>")
    p.add_argument("--snapshot", type=Path, help="run folder whose critic is the frozen potential")
    return p


def code_files(module: str) -> list[str]:
    """The source files `module` runs, relative to the working directory where possible."""
    return module_files(module, relative_to=Path.cwd())


def log(stage: str, message: str, **fields: Any) -> None:
    """One progress line on stderr (rules send it to their log file)."""
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message} {extra}".rstrip(), file=sys.stderr, flush=True)


def show_library_log() -> None:
    """The library's own loggers (`logging.getLogger(__name__)` under `atlas`) on stderr at INFO,
    as log() writes: library modules log without knowing which stage runs them."""
    logger = logging.getLogger("atlas")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # once: a root handler another library sets up would repeat each line


GPU_MEMORY_ENV = "ATLAS_GPU_MEM_GB"  # the job's claim of resources.gpu_memory_gb (rules set it)


def hold_gpu_memory() -> float | None:
    """The GiB of GPU memory this job claimed (GPU_MEMORY_ENV; unset or 0: no claim) made a hard
    limit: torch's per-process memory fraction of the current GPU, so a job past its claim fails
    alone rather than a neighbour on the same GPU. Returns the limit, or None."""
    claim = float(os.environ.get(GPU_MEMORY_ENV) or 0)
    if claim <= 0:
        return None
    import torch

    if not torch.cuda.is_available():
        raise InputError(f"{GPU_MEMORY_ENV}={claim:g}: a GPU memory claim, but torch sees no GPU")
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, claim * 2**30 / total), device)
    return claim


def run(main: Callable[[], None]) -> None:
    """Run a stage's main(); bad input ends it with the message alone and exit status 1.

    The process then ends with os._exit, its output flushed (Python's and the C library's),
    without the interpreter's teardown. Everything a stage writes is written, atomically, inside
    main(), and its pools, sandboxes and wandb are closed there. The teardown would only cost
    time (1 to 1.7 s of CPU for a process that imported torch, transformers and peft), and in a rank
    of a torchrun job it can hang: freeing the DDP reducers frees gloo's process group, whose
    destructor joins its worker thread while holding the GIL, and a worker still freeing the last
    collective's tensors waits for that GIL. main()'s own locals are freed as it returns, before
    os._exit: what must not be freed there is kept by atlas.rl.distributed.stop."""
    os._exit(_exit_status(main))


def _exit_status(main: Callable[[], None]) -> int:
    """main()'s exit status, as the interpreter would give it, with its output flushed."""
    status = 0
    try:
        show_library_log()
        hold_gpu_memory()
        main()
    except (InputError, ValidationError) as err:
        print(f"error: {err}", file=sys.stderr)
        status = 1
    except SystemExit as err:
        if err.code is None or isinstance(err.code, int):
            status = err.code or 0
        else:
            print(err.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    ctypes.CDLL(None).fflush(None)  # what C extensions wrote through stdio
    return status
