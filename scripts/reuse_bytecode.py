"""Compile the bytecode of this interpreter's environment, taking it from another environment
for the files the two share (scripts/setup.sh: .venv-verl from .venv).

    .venv-verl/bin/python scripts/reuse_bytecode.py .venv

uv installs a package as hard links to its files in uv's cache, so a package of the same version
is the same files in both environments (torch, numpy, sympy, ...: over half of .venv-verl's
modules). The .pyc of such a file is valid in both: Python checks a .pyc against its source's
mtime and size, and takes the code's file name from where it loads it. Those are linked; the rest
(another version, or a copy where uv could not link) are compiled, as uv's --compile-bytecode
does: compileall with the default (timestamp) invalidation, a file that fails to compile (a few
ship Python 2 or a newer Python's syntax) left without bytecode.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import sysconfig


def link_shared(source: str, target: str) -> int:
    """Link into `target` (a site-packages) the .pyc of each module that is the same file as the
    module at the same place in `source`; the number linked."""
    linked = 0
    for folder, _, names in os.walk(target):
        for name in names:
            if not name.endswith(".py"):
                continue
            ours = os.path.join(folder, name)
            theirs = os.path.join(source, os.path.relpath(ours, target))
            pyc = importlib.util.cache_from_source(ours)
            try:
                if not os.path.samefile(ours, theirs) or os.path.exists(pyc):
                    continue
                os.makedirs(os.path.dirname(pyc), exist_ok=True)
                os.link(importlib.util.cache_from_source(theirs), pyc)
            except FileNotFoundError:  # not in `source`, or no bytecode there
                continue
            linked += 1
    return linked


def main(argv: list[str]) -> None:
    (prefix,) = argv
    target = sysconfig.get_path("purelib")
    source = sysconfig.get_path("purelib", vars={"base": os.path.abspath(prefix)})
    if not os.path.isdir(source):
        raise SystemExit(f"reuse_bytecode: {source} is not a folder (expected the environment {prefix})")
    linked = link_shared(source, target)
    compileall.compile_dir(target, quiet=2, workers=0)  # skips a .pyc that matches its source
    print(f"setup: {linked} modules' bytecode from {prefix}, the rest compiled")


if __name__ == "__main__":
    main(sys.argv[1:])
