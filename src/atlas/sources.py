"""Map a stage module to the source files it runs, for Snakemake `input:` lists.

Snakemake reruns a job when an input's content changes, but it never looks at the modules a
`python -m atlas.<stage>` command imports. So every rule lists `module_files("atlas.<stage>")`
as inputs: the stage module, every `atlas` module it imports (transitively, read statically from
the source, including imports inside functions), and the `__init__.py` of every package on the
way. Third-party imports are not followed; the environment pins those.

Each module's `atlas` imports are kept for the next process in `atlas/__pycache__/imports.json`
beside the sources, under a digest of every module file's path and bytes (this parser's own
included): Snakemake reads them at every start and each stage when it writes its manifest, and a
process whose tree has that digest reads them instead of parsing about a hundred files again
(0.19 s of CPU against 0.005 s). Any edit, added or removed file changes the digest; a missing,
unreadable or unwritable store is parsed around.

This module imports only the standard library: the Snakefile loads it before anything is built.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent  # the folder that holds this `atlas` package
ROOT_PACKAGE = "atlas"


def _module_path(src: Path, name: str) -> Path | None:
    base = src.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _statements(nodes: list[ast.AST]):
    """Every statement in `nodes` and in the blocks nested in them (function and class bodies,
    branches, handlers, match cases). An import is a statement, so expressions, most of a
    module's nodes, need not be visited."""
    for node in nodes:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, block, ()))


@cache
def _imports(src: Path, name: str, path: Path) -> frozenset[str]:
    """Names of the `atlas` modules that `path` (module `name`) imports. Read once per process,
    as `module_names` is: the stages share most of their modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from atlas.data import gpqa` imports the submodule atlas.data.gpqa.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return frozenset(m for m in found if m.split(".")[0] == ROOT_PACKAGE and _module_path(src, m) is not None)


STORE = "imports.json"  # in the package's __pycache__: {"digest": ..., "imports": {module: [...]}}


def tree_digest(src: Path) -> str:
    """sha256 over the path and bytes of every module file of the package under `src`."""
    h = hashlib.sha256()
    for path in sorted((src / ROOT_PACKAGE).rglob("*.py")):
        if "__pycache__" not in path.parts:
            data = path.read_bytes()
            h.update(f"{path.relative_to(src).as_posix()}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def _store_path(src: Path) -> Path:
    return src / ROOT_PACKAGE / "__pycache__" / STORE


@cache
def _stored(src: Path) -> tuple[str, dict[str, list[str]]]:
    """The tree's digest, and the imports kept for it (empty when none are)."""
    digest = tree_digest(src)
    try:
        data = json.loads(_store_path(src).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return digest, {}
    imports = data.get("imports") if isinstance(data, dict) and data.get("digest") == digest else None
    whole = isinstance(imports, dict) and all(
        isinstance(names, list) and all(isinstance(n, str) for n in names) for names in imports.values()
    )
    return digest, dict(imports) if whole else {}


def _keep(src: Path, digest: str, imports: dict[str, list[str]]) -> None:
    """Write the store (atomically), if the tree still has the digest its imports were read at."""
    if tree_digest(src) != digest:
        return
    path, tmp = _store_path(src), None
    try:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{STORE}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"digest": digest, "imports": imports}, f, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only install: parsed again next time
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@cache
def module_names(module: str, src: Path = SRC) -> frozenset[str]:
    """`module` and every `atlas` module it reaches under `src`, with their parent packages."""
    if _module_path(src, module) is None:
        raise ModuleNotFoundError(f"no module {module!r} under {src}")
    digest, imports = _stored(src)
    known = len(imports)
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run too
        if name not in imports:
            imports[name] = sorted(_imports(src, name, _module_path(src, name)))
        todo.extend(imports[name])
    if len(imports) > known:
        _keep(src, digest, imports)
    return frozenset(seen)


def module_files(*modules: str, src: str | Path = SRC, relative_to: str | Path | None = None) -> list[str]:
    """Sorted source files of `modules` and everything they import from `atlas`, read from the
    package under `src` (by default this one), as paths relative to `relative_to` if given."""
    src = Path(src).resolve()
    names = set().union(*(module_names(m, src) for m in modules))
    paths = {_module_path(src, n) for n in names}
    base = Path(relative_to).resolve() if relative_to is not None else None
    return sorted(str(p.relative_to(base)) if base and p.is_relative_to(base) else str(p) for p in paths)
