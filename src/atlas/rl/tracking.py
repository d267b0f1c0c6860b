"""The training log through the real wandb library: offline by default, under the run's folder.

wandb writes while the job runs (into results/checkpoints/<run>/wandb/, beside the checkpoints, so
a crash loses nothing); the finished run folder gets a copy of its regular files. A job that
resumes moves the interrupted attempt's log to wandb.earlier-<n>/ (`retire`), opens the same run
id in a new log and replays its journal into it (atlas.rl.step.replay_journal): offline, the run
folder's log holds every step once, and `wandb sync` uploads one run. Online, the server keeps
the rows up to the killed attempt's last step and drops replayed rows at or below it.

`read_history` reads the logged rows back from an offline `.wandb` file: the file is a LevelDB-
style log (a 7-byte header, 32 KiB blocks of CRC-framed chunks) of wandb's protobuf Records.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from atlas.hashing import aside_path

_HEADER = 7  # b":W&B", magic 0xBEE1, version
_BLOCK = 32768
_CHUNK = struct.Struct("<IHB")  # crc32, length, type (1 full, 2 first, 3 middle, 4 last)


def start(folder: Path, *, mode: str, project: str, run_id: str, name: str, config: dict[str, Any]):
    """A wandb run logging under `folder`/wandb, or None with mode `disabled`."""
    if mode == "disabled":
        return None
    import wandb  # imported here: it starts slowly, and disabled runs never need it

    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")
    # wandb's own telemetry (OpenTelemetry, posted to its server every minute and at exit) reads
    # the process-wide settings, not the run's: they are set to the run's mode, or an offline run
    # would look up and call that server (verl's workers get WANDB_MODE, atlas.verl.config).
    wandb.setup(settings=wandb.Settings(mode=mode))
    return wandb.init(
        mode=mode,
        dir=str(folder),
        project=project,
        name=name,
        id=run_id,
        resume="allow",
        config=config,
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
    )


def preload(mode: str) -> None:
    """Import the wandb modules that `start` imports, before torch and transformers load (a
    training job calls this first). `wandb.init` imports wandb's Launch and public API modules,
    whose pydantic models read their own source through inspect.getmodule, which scans sys.modules
    for each frame of the import: with torch, transformers and peft loaded, the same init costs
    about 0.5 s more CPU (docs/testing.md)."""
    if mode == "disabled":
        return
    import wandb  # noqa: F401

    try:  # what wandb.init imports when the run starts (wandb.sdk.wandb_run, job inputs)
        import wandb.sdk.launch.inputs.internal  # noqa: F401
    except ImportError:  # another wandb: its init imports what it needs, only later
        pass


def teardown() -> None:
    """Stop wandb's service process (what wandb's exit hook does; stages end without exit hooks,
    atlas.stage.run)."""
    import wandb

    wandb.teardown()


def retire(folder: Path) -> Path | None:
    """Move an earlier attempt's log, `folder`/wandb, to `folder`/wandb.earlier-<n> (never
    deleted); returns where it went, or None when there was none."""
    src = folder / "wandb"
    if not src.exists():
        return None
    dest = aside_path(src, "earlier")
    src.rename(dest)
    return dest


def copy_logs(folder: Path, out: Path) -> None:
    """Copy the regular files of `folder`/wandb into `out` (its symlinks point into itself)."""
    src = folder / "wandb"
    if not src.is_dir():
        return
    for path in sorted(src.rglob("*")):
        if path.is_file() and not path.is_symlink():
            target = out / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _records(data: bytes) -> list[bytes]:
    out, buf, pos = [], b"", _HEADER
    while pos + _CHUNK.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = _CHUNK.unpack_from(data, pos)
        pos += _CHUNK.size
        if length == 0 and kind == 0:
            pos += left - _CHUNK.size
            continue
        buf += data[pos : pos + length]
        pos += length
        if kind in (1, 4):
            out.append(buf)
            buf = b""
    return out


def read_history(wandb_file: str | Path) -> list[dict[str, Any]]:
    """The rows logged with run.log(...) in an offline `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(wandb_file).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{wandb_file}: not a wandb run file (header {data[:4]!r})")
    rows = []
    for raw in _records(data):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            )
    return rows
