import json
import os
import subprocess
import sys

import pytest

from atlas.hashing import (
    MANIFEST,
    atomic_dir,
    atomic_path,
    atomic_write_text,
    canonical_json,
    sha256_file,
    verify,
    write_manifest,
)


def make_folder(tmp_path):
    src = tmp_path / "src.py"
    src.write_text("x = 1\n")
    inp = tmp_path / "input.csv"
    inp.write_text("a,b\n1,2\n")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.bin").write_bytes(bytes(range(256)) * 4)
    (out / "sub" / "b.json").write_text('{"k": 1}\n')
    write_manifest(out, stage="test", inputs=[inp], code=[src], config={"b": 2, "a": [1, 2]})
    return out, inp, src


def test_canonical_json_is_one_spelling():
    assert canonical_json({"b": 1, "a": {"d": [1, 2], "c": "é"}}) == '{"a":{"c":"é","d":[1,2]},"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_manifest_lists_files_inputs_code_and_config(tmp_path):
    out, inp, src = make_folder(tmp_path)
    m = json.loads((out / MANIFEST).read_text())
    assert m["format"] == "atlas.manifest/1" and m["stage"] == "test"
    assert m["files"] == {
        "a.bin": {"sha256": sha256_file(out / "a.bin"), "size": 1024},
        "sub/b.json": {"sha256": sha256_file(out / "sub" / "b.json"), "size": 9},
    }
    assert m["inputs"] == {inp.as_posix(): sha256_file(inp)}
    assert m["code"] == {src.as_posix(): sha256_file(src)}
    assert m["config"] == {"a": [1, 2], "b": 2}
    assert verify(out) == []


def test_verify_catches_a_flipped_byte(tmp_path):
    out, _, _ = make_folder(tmp_path)
    data = bytearray((out / "a.bin").read_bytes())
    data[100] ^= 0x01
    (out / "a.bin").write_bytes(bytes(data))
    problems = verify(out)
    assert len(problems) == 1
    assert problems[0].startswith(f"{out / 'a.bin'}: sha256 ") and "manifest says" in problems[0]


def test_verify_names_every_kind_of_mismatch(tmp_path):
    out, inp, src = make_folder(tmp_path)
    (out / "sub" / "b.json").unlink()
    (out / "extra.txt").write_text("x")
    (out / "a.bin").write_bytes(b"short")
    src.write_text("x = 2\n")
    inp.unlink()
    problems = verify(out)
    assert f"{out / 'sub' / 'b.json'}: missing" in problems
    assert f"{out / 'extra.txt'}: present but not in the manifest" in problems
    assert f"{out / 'a.bin'}: size 5, manifest says 1024" in problems
    assert f"code {src.as_posix()}: changed since the folder was built (stale)" in problems
    assert f"inputs {inp.as_posix()}: missing (stale manifest?)" in problems
    assert len(problems) == 6  # a.bin also fails its sha256
    own = verify(out, check_sources=False)
    assert len(own) == 4 and not any(p.startswith(("code ", "inputs ")) for p in own)


def test_verify_cli_exit_status(tmp_path):
    out, _, _ = make_folder(tmp_path)
    ok = subprocess.run([sys.executable, "-m", "atlas", "verify", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == f"ok {out}"
    with open(out / "sub" / "b.json", "r+b") as f:
        f.write(b"[")
    bad = subprocess.run([sys.executable, "-m", "atlas", "verify", str(out)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[0].startswith(f"MISMATCH {out / 'sub' / 'b.json'}: sha256 ")
    assert bad.stdout.splitlines()[-1] == f"FAILED {out}"


def test_tampered_config_block_is_caught(tmp_path):
    out, _, _ = make_folder(tmp_path)
    m = json.loads((out / MANIFEST).read_text())
    m["config"]["b"] = 3
    (out / MANIFEST).write_text(json.dumps(m))
    assert verify(out) == [f"{out / MANIFEST}: config_sha256 does not match its config block"]


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-written")
            raise RuntimeError("crash before the rename")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["t.txt"]
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["t.txt"]


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "weights").write_bytes(b"partial")
            raise RuntimeError("crash mid-build")
    assert os.listdir(tmp_path) == []
    with atomic_dir(target) as tmp:
        (tmp / "weights").write_bytes(b"whole")
    assert (target / "weights").read_bytes() == b"whole"
    with pytest.raises(FileExistsError):
        with atomic_dir(target):
            pass
