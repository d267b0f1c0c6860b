"""Where a run resumes after a check of its checkpoints: the last good step by number, with several
good ones, the bad ones moved aside, and what the log says. verl's checkpoints: which shards are
whole (their safetensors headers, byte by byte) and the step verl's tracker is set back to."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from atlas.hashing import MANIFEST, write_manifest
from atlas.rl.checkpoint import latest_checkpoint
from atlas.rl.recovery import VERL_TRACKER, check_checkpoints, check_verl_checkpoints, verl_latest


def checkpoint(root: Path, step: int, numel: int = 64, **manifest) -> Path:
    folder = root / f"step_{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((numel,), float(step))}, str(folder / "actor.safetensors"))
    (folder / "state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder, stage="compact_checkpoint", config={"step": step}, **manifest)
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(autouse=True)
def _log_info(caplog):
    caplog.set_level(logging.INFO, logger="atlas")


def logged(caplog) -> list[str]:
    """The lines the recovery logs (a stage shows them on stderr, after their clock time)."""
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("atlas.")]
    caplog.clear()
    return lines


def truncate(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:-n])


def test_the_run_resumes_from_the_last_good_step_by_number(tmp_path, caplog):
    root = tmp_path / "run"
    for k in (2, 9, 10, 11):
        checkpoint(root, k)
    (root / "step_best").mkdir()  # not a step: neither checked nor moved
    actor = root / "step_11" / "actor.safetensors"
    data = actor.read_bytes()
    truncate(actor, 7)
    event = check_checkpoints(root, "run")
    aside = tmp_path / "run.corrupt-1"
    why = f"{actor}: size {len(data) - 7}, manifest says {len(data)}"
    digests = hashlib.sha256(data[:-7]).hexdigest(), hashlib.sha256(data).hexdigest()
    assert event == {
        "moved": ["step_11"],
        "to": aside.as_posix(),
        "why": {"step_11": [why, f"{actor}: sha256 {digests[0]}, manifest says {digests[1]}"]},
    }
    assert sorted(p.name for p in root.iterdir()) == [
        "recovery.json",
        "step_10",
        "step_2",
        "step_9",
        "step_best",
    ]
    assert logged(caplog) == [
        f"run: checkpoint step_11 is corrupt; moved aside to={aside / 'step_11'} why={why}",
        "run: resuming from the last good checkpoint last_good=step_10",  # not step_2, not step_9
    ]
    assert latest_checkpoint(root) == root / "step_10"


def test_with_no_good_step_left_the_run_starts_over(tmp_path, caplog):
    root = tmp_path / "run"
    (checkpoint(root, 4) / MANIFEST).unlink()
    (root / "step_7").write_text("")  # a file, not a checkpoint: never the resume point
    event = check_checkpoints(root, "run")
    assert event["moved"] == ["step_4"] and not (root / "step_4").exists()
    assert logged(caplog)[-1] == "run: no good checkpoint left: starting over last_good=None"
    assert latest_checkpoint(root) is None


def test_a_check_reads_only_the_checkpoint_and_writes_nothing_into_it(tmp_path, caplog):
    """A checkpoint is judged by its own files: not by the code files its manifest may name (a
    resume after an edit keeps its checkpoints), and without a hash cache, which the check would
    otherwise write beside a tensor file of a megabyte or more."""
    code = tmp_path / "trainer.py"
    code.write_text("print(1)\n")
    root = tmp_path / "run"
    folder = checkpoint(root, 1, numel=300_000, code=[str(code)])  # 1.2 MB of tensor
    assert (folder / "actor.safetensors").stat().st_size > 1 << 20
    before = snapshot(folder)
    code.write_text("print(2)\n")  # the code changed since the checkpoint was written
    assert check_checkpoints(root, "run") is None
    code.unlink()
    assert check_checkpoints(root, "run") is None
    assert snapshot(folder) == before
    assert logged(caplog) == []


# --- verl's checkpoints -------------------------------------------------------------------------


def shard(folder: Path, data: bytes | None = None, **tensors) -> Path:
    path = folder / "actor" / "model.safetensors"
    path.parent.mkdir(parents=True)
    if data is None:
        save_file(tensors or {"lora_A": torch.ones(128)}, str(path), metadata={"format": "pt"})
    else:
        path.write_bytes(data)
    return path


def test_only_whole_shards_are_sealed_and_verl_goes_back_to_the_last_whole_step(tmp_path, caplog):
    root = tmp_path / "run"
    folder = root / "verl" / "checkpoints"
    shard(folder / "global_step_1")  # whole, with the metadata every safetensors file carries
    shard(folder / "global_step_2", struct.pack("<Q", 2) + b"{}")  # whole: no tensors at all
    shard(folder / "global_step_10")  # after 2 by number, though not by name
    short = shard(folder / "global_step_11", b"\x01\x02")
    huge = shard(folder / "global_step_12", b"\xff" * 8 + b"{}")
    long_header = shard(folder / "global_step_13", struct.pack("<Q", 3) + b"{}")
    not_json = shard(folder / "global_step_14", struct.pack("<Q", 4) + b"{{{{")
    cut = shard(folder / "global_step_15")
    whole = len(cut.read_bytes())
    truncate(cut, 10)
    trailing = shard(
        folder / "global_step_16", struct.pack("<Q", 2) + b"{}" + b"\0"
    )  # no tensors, a byte more
    (folder / VERL_TRACKER).write_text("16\n")
    event = check_verl_checkpoints(root, folder, "run")
    assert event["why"] == {
        "global_step_11": [f"{short}: 2 bytes, too short for a safetensors header"],
        "global_step_12": [f"{huge}: header of {2**64 - 1} bytes in a file of 10: truncated"],
        "global_step_13": [f"{long_header}: header of 3 bytes in a file of 10: truncated"],
        "global_step_14": [f"{not_json}: header is not JSON: truncated or altered"],
        "global_step_15": [f"{cut}: tensors end at byte {whole}, the file has {whole - 10}: truncated"],
        "global_step_16": [f"{trailing}: tensors end at byte 10, the file has 11: truncated"],
    }
    assert (folder / VERL_TRACKER).read_text() == "10"
    assert verl_latest(folder) == 10
    assert sorted(p.name for p in folder.glob("global_step_*")) == [
        "global_step_1",
        "global_step_10",
        "global_step_2",
    ]
    aside = tmp_path / "run.corrupt-1" / "verl" / "checkpoints"
    assert logged(caplog)[0] == (
        f"run: checkpoint global_step_11 is corrupt; moved aside to={aside / 'global_step_11'} "
        f"why={short}: 2 bytes, too short for a safetensors header"
    )
    # Each whole step got its manifest, naming verl's step.
    for g in (1, 2, 10):
        manifest = json.loads((folder / f"global_step_{g}" / MANIFEST).read_text())
        assert (manifest["stage"], manifest["config"]) == ("verl_checkpoint", {"global_step": g})
        assert list(manifest["files"]) == ["actor/model.safetensors"]
    # A step set aside is kept as it was found: never sealed
    assert sorted(p.name for p in aside.iterdir()) == [f"global_step_{g}" for g in range(11, 17)]
    assert [p for p in aside.rglob(MANIFEST)] == []


def test_without_a_tracker_every_unsealed_step_is_an_unfinished_save(tmp_path):
    root = tmp_path / "run"
    folder = root / "verl" / "checkpoints"
    shard(folder / "global_step_1")
    (folder / "global_step_x").mkdir()  # not a step
    event = check_verl_checkpoints(root, folder, "run")
    assert event["why"] == {
        "global_step_1": [
            f"{folder / 'global_step_1'}: past verl's {VERL_TRACKER} (0): its save did not finish"
        ]
    }
    assert not (folder / VERL_TRACKER).exists() and verl_latest(folder) == 0
    assert [p.name for p in folder.iterdir()] == ["global_step_x"]


def test_a_sealed_verl_step_is_checked_without_writing_into_it(tmp_path):
    root = tmp_path / "run"
    folder = root / "verl" / "checkpoints"
    shard(folder / "global_step_1", lora_A=torch.zeros(300_000))  # 1.2 MB: a hash cache would be kept
    (folder / VERL_TRACKER).write_text("1")
    assert check_verl_checkpoints(root, folder, "run") is None  # whole: sealed
    sealed = snapshot(folder)
    assert sorted(sealed) == [
        "global_step_1/MANIFEST.json",
        "global_step_1/actor/model.safetensors",
        VERL_TRACKER,
    ]
    assert check_verl_checkpoints(root, folder, "run") is None  # sealed: verified against its manifest
    assert snapshot(folder) == sealed
