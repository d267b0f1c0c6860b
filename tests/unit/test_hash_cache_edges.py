"""The hash cache and `verify(only=...)` at their edges: which names are bookkeeping, a cache file
that is not ours, saving merged with another process's entries, small files never cached, and a
name asked for that the manifest does not list."""

from __future__ import annotations

import json
import os

from atlas.hashing import (
    CACHED_SIZE,
    HASH_CACHE,
    HASH_CACHE_FORMAT,
    MANIFEST,
    HashCache,
    is_bookkeeping,
    sha256_file,
    tree_files,
    verify,
    write_manifest,
)


def test_bookkeeping_names_are_the_marker_the_cache_and_its_temporary_files(tmp_path):
    assert is_bookkeeping(".snakemake_timestamp")
    assert is_bookkeeping(HASH_CACHE)
    assert is_bookkeeping(f".{HASH_CACHE}.k2j3.tmp")  # atomic_write_json's temporary file
    assert not is_bookkeeping(f"{HASH_CACHE}.bak")
    assert not is_bookkeeping("data.json")
    for name in (".snakemake_timestamp", HASH_CACHE, f".{HASH_CACHE}.x.tmp", "data.json"):
        (tmp_path / name).write_text("x")
    assert tree_files(tmp_path) == ["data.json"]


def big(folder, name="big.bin", size=CACHED_SIZE):
    path = folder / name
    path.write_bytes(os.urandom(size))
    return path


def test_a_file_below_the_cached_size_is_hashed_and_not_kept(tmp_path):
    small = big(tmp_path, "small.bin", CACHED_SIZE - 1)
    exact = big(tmp_path, "exact.bin", CACHED_SIZE)
    cache = HashCache(tmp_path)
    assert cache.sha256("small.bin", small) == sha256_file(small)
    assert cache.sha256("exact.bin", exact) == sha256_file(exact)
    assert set(cache.added) == {"exact.bin"}
    st = exact.stat()
    assert cache.added["exact.bin"] == [
        [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino],
        sha256_file(exact),
    ]


def test_a_disabled_cache_reads_and_writes_nothing(tmp_path):
    f = big(tmp_path)
    key = HashCache._key(f.stat())
    (tmp_path / HASH_CACHE).write_text(
        json.dumps({"format": HASH_CACHE_FORMAT, "files": {"big.bin": [key, "0" * 64]}})
    )
    cache = HashCache(tmp_path, enabled=False)
    assert cache.entries == {}
    assert cache.sha256("big.bin", f) == sha256_file(f)
    assert cache.added == {}
    assert HashCache(tmp_path).sha256("big.bin", f) == "0" * 64  # the same file, enabled: trusted


def test_a_cache_entry_is_used_only_under_its_own_name_and_key(tmp_path):
    f = big(tmp_path)
    key = HashCache._key(f.stat())
    entries = {"other.bin": [key, "1" * 64], "big.bin": [[*key[:3], key[3] + 1], "2" * 64]}
    (tmp_path / HASH_CACHE).write_text(json.dumps({"format": HASH_CACHE_FORMAT, "files": entries}))
    cache = HashCache(tmp_path)
    assert cache.sha256("big.bin", f) == sha256_file(f)  # another inode: hashed again
    assert cache.added == {"big.bin": [key, sha256_file(f)]}


def test_a_cache_entry_of_another_shape_is_ignored(tmp_path):
    f = big(tmp_path)
    key = HashCache._key(f.stat())
    for entry in ([key, "3" * 64, "extra"], [key], {"key": key}):
        (tmp_path / HASH_CACHE).write_text(
            json.dumps({"format": HASH_CACHE_FORMAT, "files": {"big.bin": entry}})
        )
        assert HashCache(tmp_path).sha256("big.bin", f) == sha256_file(f)


def test_a_cache_file_that_is_not_ours_is_empty(tmp_path):
    good = {"format": HASH_CACHE_FORMAT, "files": {"a": [[1, 2, 3, 4], "5" * 64]}}
    for text in (
        "{not json",
        "\xff\xfe",
        json.dumps([good]),
        json.dumps({**good, "format": "atlas.hashes/0"}),
        json.dumps({"format": HASH_CACHE_FORMAT, "files": ["a"]}),
        json.dumps({"format": HASH_CACHE_FORMAT}),
    ):
        (tmp_path / HASH_CACHE).write_text(text, encoding="utf-8")
        assert HashCache(tmp_path).entries == {}, text
    (tmp_path / HASH_CACHE).write_text(json.dumps(good))
    assert HashCache(tmp_path).entries == good["files"]


def test_saving_merges_with_what_another_process_saved(tmp_path):
    a, b = big(tmp_path, "a.bin"), big(tmp_path, "b.bin")
    first, second = HashCache(tmp_path), HashCache(tmp_path)
    first.sha256("a.bin", a)
    second.sha256("b.bin", b)
    first.save()
    second.save()
    saved = json.loads((tmp_path / HASH_CACHE).read_text())
    assert saved["format"] == HASH_CACHE_FORMAT
    assert {name: entry[1] for name, entry in saved["files"].items()} == {
        "a.bin": sha256_file(a),
        "b.bin": sha256_file(b),
    }


def test_nothing_added_saves_nothing(tmp_path):
    big(tmp_path, "s.bin", 10)
    cache = HashCache(tmp_path)
    cache.sha256("s.bin", tmp_path / "s.bin")
    cache.save()
    assert not (tmp_path / HASH_CACHE).exists()


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    f = big(tmp_path)
    (tmp_path / HASH_CACHE).mkdir()  # a folder where the cache file goes: the rename fails
    cache = HashCache(tmp_path)
    cache.sha256("big.bin", f)
    cache.save()  # best effort: no error
    assert (tmp_path / HASH_CACHE).is_dir()


def test_verify_uses_the_cache_by_default_and_names_files_the_manifest_lacks(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    f = big(out)
    (out / "small.json").write_text("{}\n")
    write_manifest(out, stage="test")
    assert verify(out) == []
    cache = json.loads((out / HASH_CACHE).read_text())
    assert cache["files"]["big.bin"][1] == sha256_file(f)
    (out / "small.json").write_text("[]\n")
    problems = verify(out, only=["a-not-listed.txt", "small.json", "a-not-listed.txt"])
    assert problems == [
        f"{out / 'a-not-listed.txt'}: not in the manifest {out / MANIFEST}",
        f"{out / 'small.json'}: sha256 {sha256_file(out / 'small.json')}, manifest says "
        + json.loads((out / MANIFEST).read_text())["files"]["small.json"]["sha256"],
    ]


def test_a_process_reads_a_large_file_once_until_it_changes(tmp_path, monkeypatch):
    import hashlib

    import atlas.hashing as hashing

    reads = []
    real_read = hashing._read_sha256
    monkeypatch.setattr(hashing, "_read_sha256", lambda p: reads.append(p) or real_read(p))
    monkeypatch.setattr(hashing, "_SEEN", {})
    f = big(tmp_path)
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert sha256_file(f) == want and sha256_file(tmp_path / "." / "big.bin") == want
    assert len(reads) == 1  # the same real path, unchanged: read once
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # same size, one bit: the write gives it a new ctime
    f.write_bytes(bytes(data))
    assert sha256_file(f) == hashlib.sha256(bytes(data)).hexdigest() != want
    assert len(reads) == 2
    small = big(tmp_path, "small.bin", CACHED_SIZE - 1)
    sha256_file(small), sha256_file(small)
    assert len(reads) == 4  # below CACHED_SIZE: read every time


def test_a_file_of_several_read_chunks_hashes_as_hashlib_does(tmp_path):
    import hashlib

    import atlas.hashing as hashing

    data = os.urandom(2 * hashing._CHUNK + 12345)  # two whole chunks and a part
    f = tmp_path / "three_chunks.bin"
    f.write_bytes(data)
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()
    assert HashCache(tmp_path).sha256("three_chunks.bin", f) == hashlib.sha256(data).hexdigest()
