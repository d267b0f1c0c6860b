"""Resume from the last good checkpoint: every checkpoint is checked against its MANIFEST.json
before a run resumes, and a bad one is moved aside, never deleted.

    results/checkpoints/<run>/step_<k>/            checked (atlas.hashing.verify, no hash cache)
    results/checkpoints/<run>.corrupt-<n>/step_<k>/  where a truncated, altered or incomplete
                                                   one goes; why.json says which files and why
    results/checkpoints/<run>/recovery.json        every such move, in order; journal.assemble
                                                   copies it into run.json ("recovered")

Training then resumes from the latest checkpoint left, or starts over when none is. verl's
checkpoints (global_step_<g>/, written by verl without a manifest) get one when first found
complete, so a later change to them is caught the same way (`check_verl_checkpoints`).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

from atlas.hashing import MANIFEST, aside_path, atomic_write_json, tree_files, verify, write_manifest

RECOVERY = "recovery.json"
WHY = "why.json"
VERL_TRACKER = "latest_checkpointed_iteration.txt"

logger = logging.getLogger(__name__)


def corrupt_dir(root: Path) -> Path:
    """The first unused <root>.corrupt-<n> beside root."""
    return aside_path(root, "corrupt")


def recovery_events(root: Path) -> list[dict[str, Any]]:
    path = root / RECOVERY
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def _move_aside(root: Path, bad: dict[str, list[str]], run: str, sub: str = "") -> dict[str, Any]:
    """Move each bad folder (name -> problems) under root/sub into one new <root>.corrupt-<n>/sub,
    with why.json, and append the event to root/recovery.json."""
    aside = corrupt_dir(root)
    (aside / sub).mkdir(parents=True)
    event = {"moved": sorted(bad), "to": aside.as_posix(), "why": bad}
    atomic_write_json(aside / WHY, event)  # first: a job killed while moving leaves the why
    for name, problems in bad.items():
        os.rename(root / sub / name, aside / sub / name)
        logger.info(
            "%s: checkpoint %s is corrupt; moved aside to=%s why=%s",
            run,
            name,
            aside / sub / name,
            problems[0],
        )
    atomic_write_json(root / RECOVERY, [*recovery_events(root), event])
    return event


def _step_number(name: str, prefix: str) -> int | None:
    rest = name[len(prefix) :]
    return int(rest) if name.startswith(prefix) and rest.isdigit() else None


def check_checkpoints(root: str | Path, run: str) -> dict[str, Any] | None:
    """Verify every step_<k> under root against its manifest (all files, sizes and sha256; a
    folder without one is incomplete) and move the bad ones aside. Returns the event, or None
    when all were good. The caller then resumes from the latest step left."""
    root = Path(root)
    if not root.is_dir():
        return None
    bad: dict[str, list[str]] = {}
    for folder in sorted(root.glob("step_*")):
        if folder.is_dir() and _step_number(folder.name, "step_") is not None:
            problems = verify(folder, check_sources=False, cache=False)
            if problems:
                bad[folder.name] = problems
    if not bad:
        return None
    event = _move_aside(root, bad, run)
    left = sorted(
        k for p in root.glob("step_*") if p.is_dir() and (k := _step_number(p.name, "step_")) is not None
    )
    logger.info(
        "%s: %s last_good=%s",
        run,
        "resuming from the last good checkpoint" if left else "no good checkpoint left: starting over",
        f"step_{left[-1]}" if left else None,
    )
    return event


def _safetensors_problem(path: Path) -> str | None:
    """Whether a .safetensors file is whole: its header parses and its tensors end at its end."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path}: {size} bytes, too short for a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return f"{path}: header of {n} bytes in a file of {size}: truncated"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path}: header is not JSON: truncated or altered"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) != size:
        return f"{path}: tensors end at byte {8 + n + max(ends, default=0)}, the file has {size}: truncated"
    return None


def verl_latest(folder: str | Path) -> int:
    """The steps done of the checkpoint verl resumes from: its tracker file's number when that
    step's folder is there, else 0 (verl then starts over)."""
    tracker = Path(folder) / VERL_TRACKER
    text = tracker.read_text().strip() if tracker.is_file() else ""
    return int(text) if text.isdigit() and (Path(folder) / f"global_step_{text}").is_dir() else 0


def check_verl_checkpoints(root: str | Path, folder: str | Path, run: str) -> dict[str, Any] | None:
    """verl's global_step_<g>/ under `folder` (the run's verl/checkpoints): a sealed one (with
    MANIFEST.json) is verified, an unsealed one is checked whole (every safetensors file ends
    where its header says; no step past verl's tracker file) and sealed. Bad ones go to
    <root>.corrupt-<n>/<folder relative to root>/, and the tracker is set to the last good step
    (removed when none is left, so verl starts over)."""
    root, folder = Path(root), Path(folder)
    if not folder.is_dir():
        return None
    tracker = folder / VERL_TRACKER
    text = tracker.read_text().strip() if tracker.is_file() else ""
    latest = int(text) if text.isdigit() else 0
    bad: dict[str, list[str]] = {}
    good: list[int] = []
    steps = sorted(
        (g, p)
        for p in folder.glob("global_step_*")
        if (g := _step_number(p.name, "global_step_")) is not None
    )
    for g, step in steps:
        if (step / MANIFEST).is_file():
            problems = verify(step, check_sources=False, cache=False)
        elif g > latest:
            problems = [f"{step}: past verl's {VERL_TRACKER} ({latest}): its save did not finish"]
        else:
            problems = [
                p
                for f in tree_files(step)
                if f.endswith(".safetensors")
                if (p := _safetensors_problem(step / f))
            ]
            if not problems:
                write_manifest(step, stage="verl_checkpoint", config={"global_step": g})
        if problems:
            bad[step.name] = problems
        else:
            good.append(g)
    if not bad:
        return None
    event = _move_aside(root, bad, run, sub=folder.relative_to(root).as_posix())
    if good:
        tracker.write_text(str(good[-1]))
    else:
        tracker.unlink(missing_ok=True)
    return event
