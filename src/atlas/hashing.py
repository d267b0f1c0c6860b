"""Content hashing: canonical JSON, sha256 of files and trees, atomic writes, MANIFEST.json.

Every output folder of the pipeline carries a MANIFEST.json: the sha256 and size of each file it
holds, and the hashes of the inputs, code and config slice that made it. `python -m atlas verify
PATH` recomputes them and names every mismatch (exit status 1). Every stage checks the folders it
reads with the same `verify` before it opens them (atlas.stage).

Hashes of large files are cached in the manifest's folder (HASH_CACHE), keyed by the file's size,
mtime_ns, ctime_ns and inode: any write to a file changes its ctime (which no user call can set
back), so a cached hash is never trusted across a content change, and a copied folder (new
inodes) is hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "atlas.manifest/1"
HASH_CACHE = ".atlas-hashes.json"
HASH_CACHE_FORMAT = "atlas.hashes/1"
# Bookkeeping that is not content: Snakemake's marker in directory outputs, the hash cache.
IGNORED_NAMES = frozenset({".snakemake_timestamp", HASH_CACHE})
_CHUNK = 1 << 20
CACHED_SIZE = 1 << 20  # smaller files are hashed again: that costs less than a cache entry


def is_bookkeeping(name: str) -> bool:
    """Names in a folder that are not its content (the cache's temporary file included)."""
    return name in IGNORED_NAMES or name.startswith(f".{HASH_CACHE}.")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no whitespace, UTF-8 kept, NaN refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# This process's hashes of large files, by real path, each with the stat key it was read under: a
# stage names the model among its inputs several times (verify, fingerprint, manifest), and at a
# real shape each read of it costs seconds.
_SEEN: dict[str, tuple[list[int], str]] = {}


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    """sha256 of the file's bytes. A file of CACHED_SIZE or more is read once per process while
    its size, mtime, ctime and inode stay the same (a write changes its ctime)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    if st.st_size < CACHED_SIZE:
        return _read_sha256(real)
    key = _stat_key(st)
    seen = _SEEN.get(real)
    if seen is not None and seen[0] == key:
        return seen[1]
    digest = _read_sha256(real)
    _remember(real, key, digest)
    return digest


def _remember(real: str, key: list[int], digest: str) -> None:
    if _stat_key(os.stat(real)) == key:  # not written to while it was read
        _SEEN[real] = (key, digest)


def tree_files(root: str | Path) -> list[str]:
    """Every regular file under root, as sorted POSIX paths relative to root (bookkeeping aside)."""
    root = Path(root)
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not is_bookkeeping(p.name)
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename.

    On an exception the temporary file is removed and whatever was at `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.chmod(0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def aside_path(path: Path, label: str) -> Path:
    """The first unused <path>.<label>-<n> beside path (n from 1): where work that no longer counts
    is moved, never deleted."""
    n = 1
    while (aside := path.with_name(f"{path.name}.{label}-{n}")).exists():
        n += 1
    return aside


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `path`; on success it becomes `path` in one rename.

    `path` must not exist (Snakemake removes a directory output before its job runs). On an
    exception the temporary folder is removed.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                f.chmod(0o666 & ~_umask())  # some writers make 0600 files
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.rename(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _hash_paths(paths: Iterable[str | Path]) -> dict[str, str]:
    return {Path(p).as_posix(): sha256_file(p) for p in sorted(set(map(str, paths)))}


def build_manifest(
    folder: str | Path,
    *,
    stage: str,
    inputs: Iterable[str | Path] = (),
    code: Iterable[str | Path] = (),
    config: Any = None,
    files: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The manifest of `folder`: its files (all but MANIFEST.json unless `files` names them),
    and the hashes of the inputs and code files (paths as given, relative to the working
    directory) and of the config slice."""
    folder = Path(folder)
    names = sorted(files) if files is not None else [n for n in tree_files(folder) if n != MANIFEST]
    return {
        "format": MANIFEST_FORMAT,
        "stage": stage,
        "files": {n: {"sha256": sha256_file(folder / n), "size": (folder / n).stat().st_size} for n in names},
        "inputs": _hash_paths(inputs),
        "code": _hash_paths(code),
        "config": config,
        "config_sha256": sha256_bytes(canonical_json(config).encode("utf-8")),
    }


def write_manifest(folder: str | Path, **kwargs: Any) -> dict[str, Any]:
    manifest = build_manifest(folder, **kwargs)
    atomic_write_json(Path(folder) / MANIFEST, manifest)
    return manifest


class HashCache:
    """sha256 of a folder's large files, kept in folder/HASH_CACHE between processes.

    An entry holds (size, mtime_ns, ctime_ns, inode) with the hash; it is used only while all four
    still match the file. Saving is best effort (a read-only folder keeps no cache), atomic, and
    merges with what another process saved meanwhile."""

    def __init__(self, folder: Path, enabled: bool = True) -> None:
        self.path, self.enabled = folder / HASH_CACHE, enabled
        self.entries: dict[str, list] = self._read() if enabled else {}
        self.added: dict[str, list] = {}

    def _read(self) -> dict[str, list]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        ok = isinstance(data, dict) and data.get("format") == HASH_CACHE_FORMAT
        return data.get("files", {}) if ok and isinstance(data.get("files"), dict) else {}

    _key = staticmethod(_stat_key)

    def sha256(self, name: str, file: Path) -> str:
        st = file.stat()
        if not self.enabled or st.st_size < CACHED_SIZE:
            return sha256_file(file)
        key = _stat_key(st)
        entry = self.entries.get(name)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == key:
            return entry[1]  # trusted here alone: sha256_file's own memo holds only what it read
        digest = sha256_file(file)
        if _stat_key(file.stat()) == key:  # not written to while it was read
            self.added[name] = [key, digest]
        return digest

    def save(self) -> None:
        if not self.added:
            return
        try:
            files = {**self._read(), **self.added}
            atomic_write_json(self.path, {"format": HASH_CACHE_FORMAT, "files": files})
        except OSError:
            pass


def _read_manifest(manifest_path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if not manifest_path.is_file():
        return None, f"{manifest_path}: no manifest"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return None, f"{manifest_path}: not valid JSON ({err})"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None, f"{manifest_path}: not an {MANIFEST_FORMAT} manifest"
    if not isinstance(manifest.get("files"), dict):
        return None, f"{manifest_path}: no files block"
    return manifest, None


def verify(
    path: str | Path,
    *,
    check_sources: bool = True,
    only: Iterable[str] | None = None,
    cache: bool = True,
) -> list[str]:
    """Recompute a manifest; return one line per mismatch (empty when everything matches).

    Checks every listed file (missing, size, sha256), files present but not listed, the config
    hash, and, with `check_sources`, the inputs and code files the manifest names (relative to
    the working directory), which tells whether the folder is stale. With `only` (names relative
    to the folder), just those files: each must be listed and match. `cache` uses and updates
    the folder's hash cache (see HashCache).
    """
    path = Path(path)
    manifest_path = path if path.name == MANIFEST else path / MANIFEST
    folder = manifest_path.parent
    manifest, problem = _read_manifest(manifest_path)
    if manifest is None:
        return [problem]

    problems: list[str] = []
    listed = manifest["files"]
    hashes = HashCache(folder, enabled=cache)
    names = sorted(listed) if only is None else sorted(set(only))
    for name in names:
        f = folder / name
        entry = listed.get(name)
        if entry is None:
            problems.append(f"{f}: not in the manifest {manifest_path}")
            continue
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        size = f.stat().st_size
        if size != entry["size"]:
            problems.append(f"{f}: size {size}, manifest says {entry['size']}")
        digest = hashes.sha256(name, f)
        if digest != entry["sha256"]:
            problems.append(f"{f}: sha256 {digest}, manifest says {entry['sha256']}")
    hashes.save()
    if only is not None:
        return problems
    for name in tree_files(folder):
        if name != MANIFEST and name not in listed:
            problems.append(f"{folder / name}: present but not in the manifest")

    config_digest = sha256_bytes(canonical_json(manifest.get("config")).encode("utf-8"))
    if config_digest != manifest.get("config_sha256"):
        problems.append(f"{manifest_path}: config_sha256 does not match its config block")

    if check_sources:
        for kind in ("inputs", "code"):
            for name, digest in sorted(manifest.get(kind, {}).items()):
                src = Path(name)
                if not src.is_file():
                    problems.append(f"{kind} {name}: missing (stale manifest?)")
                elif sha256_file(src) != digest:
                    problems.append(f"{kind} {name}: changed since the folder was built (stale)")
    return problems
