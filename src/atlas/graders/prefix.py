"""lcb_runner's import prefix, and the part of it that one program needs.

lcb_runner runs every LiveCodeBench program after its `import_string`: eighteen star imports and
as many module imports (`from collections import *`, `import math`, ...). Importing all of them
costs a fresh interpreter more than the sandbox's start and a test together, while most programs
name a handful of those names or none. The grader therefore sends each program's driver only the
prefix's lines that bind a name the program's source spells; run in their order, they give every
such name the object the whole prefix would have given it (a name's value comes from the last
line that binds it, and that line is always sent). Lines that import nothing new are always sent.

Where the source could reach the namespace by a name it does not spell (`globals()`, `vars()`,
`eval`, a frame's `f_globals`, ...), or holds identifiers that Python would normalise (non-ASCII
ones), the whole prefix is sent. Which names each line binds is read once per grader process, from
an interpreter started the way the sandbox starts it.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

# lcb_runner's `import_string` (lcb_runner/evaluation/testing_util.py), line by line.
IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\n"
    "import statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\n"
    "import json\nsys.setrecursionlimit(50000)\n"
)
LINES = IMPORTS.splitlines(keepends=True)
# Lines that load nothing the driver has not loaded already: always sent.
ALWAYS = frozenset(
    {"from sys import *\n", "from builtins import *\n", "import sys\n", "sys.setrecursionlimit(50000)\n"}
)
# Names through which a program reaches its namespace without spelling the names it reads there.
DYNAMIC = frozenset(
    "globals vars locals dir eval exec __builtins__ __dict__ __globals__ f_globals f_locals".split()
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A word that is no attribute (`x.split` names split of x, never the prefix's split) and no part of
# a number (`1e5`).
_WORD = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*")
# Which names each line binds: a star import binds the module's __all__ (or its public names), a
# module import the module's name.
_PROBE = """
import importlib, json, sys
names = []
for line in sys.stdin.read().splitlines():
    words = line.split()
    if words[:1] == ["from"]:
        module = importlib.import_module(words[1])
        names.append(list(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")])))
    elif words[:1] == ["import"]:
        names.append([words[1]])
    else:
        names.append([])
print(json.dumps(names))
"""


@functools.cache
def bound_names() -> tuple[frozenset[str], ...]:
    """The names each line of the prefix binds, read from an interpreter started as the sandbox
    starts its driver (`-S`, no site-packages)."""
    out = subprocess.run(
        [sys.executable, "-S", "-P", "-c", _PROBE],
        input=IMPORTS,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = json.loads(out)
    if len(names) != len(LINES):
        raise RuntimeError(f"the import prefix's probe named {len(names)} lines of {len(LINES)}")
    return tuple(frozenset(n) for n in names)


def spelled(code: str) -> set[str] | None:
    """Every word of `code` that could name a global (in strings and comments too: more is only
    slower); None where the source may reach names it does not spell."""
    if not code.isascii() or not DYNAMIC.isdisjoint(_IDENTIFIER.findall(code)):
        return None
    return set(_WORD.findall(code))


def needed(code: str) -> str:
    """The lines of the prefix that `code` needs, in their order: the whole prefix where the
    source may name what it does not spell."""
    words = spelled(code)
    if words is None:
        return IMPORTS
    return "".join(
        line for line, names in zip(LINES, bound_names(), strict=True) if line in ALWAYS or names & words
    )
