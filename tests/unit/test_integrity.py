"""Stages verify what they read: an input that does not match its folder's MANIFEST.json stops the
stage, naming the file and the folder to rebuild (the same check as `python -m atlas verify`)."""

import json
import os
from pathlib import Path

import pytest

from atlas.errors import InputError
from atlas.hashing import CACHED_SIZE, HASH_CACHE, MANIFEST, sha256_file, verify, write_manifest
from atlas.stage import CorruptInputError, stage_parser, verify_inputs
from conftest import flip_byte


def big_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "big.bin").write_bytes(os.urandom(CACHED_SIZE + 123))
    (out / "small.json").write_text('{"k": 1}\n')
    write_manifest(out, stage="test")
    return out


def test_hash_cache_is_used_only_while_the_file_is_unchanged(tmp_path):
    out = big_folder(tmp_path)
    assert verify(out) == []
    cache = json.loads((out / HASH_CACHE).read_text())
    assert set(cache["files"]) == {"big.bin"}  # small files are hashed each time
    assert cache["files"]["big.bin"][1] == sha256_file(out / "big.bin")
    # a cached hash is what verify reports while size, mtime, ctime and inode match
    cache["files"]["big.bin"][1] = "0" * 64
    (out / HASH_CACHE).write_text(json.dumps(cache))
    assert verify(out) == [
        f"{out / 'big.bin'}: sha256 {'0' * 64}, manifest says {sha256_file(out / 'big.bin')}"
    ]
    assert verify(out, cache=False) == []
    # a same-size write with the mtime set back still changes the ctime: hashed again, caught
    (out / HASH_CACHE).unlink()
    assert verify(out) == []
    flip_byte(out / "big.bin", 1000)
    problems = verify(out)
    assert len(problems) == 1 and problems[0].startswith(f"{out / 'big.bin'}: sha256 ")
    assert verify(out, only=["small.json"]) == []


def test_stage_parser_refuses_an_input_that_differs_from_its_manifest(tmp_path):
    out = big_folder(tmp_path)
    parser = stage_parser("test")
    parser.add_argument("--big", type=Path)
    parser.add_argument("--folder", type=Path)
    args = ["--config-slice", "{}", "--out", str(tmp_path / "new"), "--big", str(out / "big.bin")]
    parser.parse_args(args)  # all good
    flip_byte(out / "small.json", 2)
    parser.parse_args(args)  # a file argument is checked by its own entry only
    with pytest.raises(CorruptInputError) as err:
        parser.parse_args([*args, "--folder", str(out)])
    msg = str(err.value)
    assert msg.startswith(
        f"input folder {out} does not match its {MANIFEST}:\n  {out / 'small.json'}: sha256 "
    )
    assert msg.endswith(f"rebuild {out} before this stage reads it (snakemake --force {out})")
    assert isinstance(err.value, InputError)  # a stage ends with the message alone, exit status 1
    with pytest.raises(CorruptInputError) as err:  # file arguments: the bad file is the target
        verify_inputs([out / "big.bin", out / "small.json"])
    assert str(err.value).endswith(f"(snakemake --force {out / 'small.json'})")
    (out / "big.bin").write_bytes(b"truncated")
    with pytest.raises(CorruptInputError, match=r"big\.bin: size 9, manifest says"):
        verify_inputs([out / "big.bin"])


def test_the_distributed_roundtrip_refuses_a_changed_run_folder_before_any_rank_starts(tmp_path):
    from atlas.hashing import write_manifest
    from atlas.stage import CorruptInputError
    from atlas.stages import distributed_roundtrip

    run, model = tmp_path / "run", tmp_path / "model"
    for folder in (run, model):
        folder.mkdir()
        (folder / "data.bin").write_bytes(b"\x00" * 64)
        write_manifest(folder, stage="test")
    (run / "data.bin").write_bytes(b"\x00" * 63 + b"\x01")  # one byte flipped, same size
    argv = ["--config-slice", "{}", "--model", str(model), "--run-folder", str(run)]
    argv += ["--out", str(tmp_path / "o")]
    with pytest.raises(CorruptInputError, match=rf"(?s){run}/data.bin: sha256.*rebuild {run}"):
        distributed_roundtrip.main(argv)
