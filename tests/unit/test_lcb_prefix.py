"""The part of lcb_runner's import prefix a program gets: every name its source spells is bound to
the object the whole prefix binds, and the whole prefix is sent where the source could reach the
namespace by a name it does not spell; and the driver's reply, JSON written without the json module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from atlas.config.graders import GraderConfig
from atlas.data.schema import TestCase as Case  # not `Test*`: pytest would collect it
from atlas.graders import prefix
from atlas.graders.lcb import grade_code
from atlas.graders.sandbox import Sandbox, SandboxLimits
from conftest import require_bubblewrap

# lcb_runner's import_string, as its testing_util.py spells it (the reference the prefix follows).
LCB_IMPORT_STRING = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\n"
    "import statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\n"
    "import json\nsys.setrecursionlimit(50000)\n"
)


def run_prefix(text: str) -> dict:
    """The namespace `text` (prefix lines) makes; the process's recursion limit is put back."""
    limit = sys.getrecursionlimit()
    namespace: dict = {}
    try:
        exec(text, namespace)
    finally:
        sys.setrecursionlimit(limit)
    return namespace


def test_the_prefix_is_lcb_runners():
    assert prefix.IMPORTS == LCB_IMPORT_STRING
    assert "".join(prefix.LINES) == LCB_IMPORT_STRING


def test_every_name_gets_the_object_the_whole_prefix_gives_it():
    """For each name any line binds, a program spelling that name alone gets the whole prefix's
    object: the last line binding it is sent, and sent after any earlier one."""
    whole = run_prefix(LCB_IMPORT_STRING)
    names = set().union(*prefix.bound_names())
    assert {"deque", "List", "Counter", "M", "e", "gcd", "copy", "digits", "mode"} <= names
    for name in sorted(names):
        assert run_prefix(prefix.needed(f"x = {name}\n"))[name] is whole[name], name


def test_where_a_name_comes_from_when_several_lines_bind_it():
    whole = run_prefix(LCB_IMPORT_STRING)
    import collections
    import copy
    import typing

    assert whole["Counter"] is typing.Counter  # `from typing import *` comes after collections
    assert whole["copy"] is copy  # `import copy` comes after `from copy import *`
    assert whole["pow"] is pow  # `from builtins import *` comes after math's pow
    assert whole["deque"] is collections.deque
    needed = prefix.needed("print(Counter, copy, pow)\n")
    assert needed.index("from collections import *") < needed.index("from typing import *")
    assert "from copy import *" in needed and needed.index("from copy import *") < needed.index(
        "import copy\n"
    )


def test_a_plain_program_gets_only_the_lines_that_load_nothing():
    code = "import sys\ninput = sys.stdin.readline\nn = int(input())\nprint(sum(map(int, input().split())) * n)\n"
    assert prefix.needed(code) == (
        "from sys import *\nfrom builtins import *\nimport sys\nsys.setrecursionlimit(50000)\n"
    )


def test_attributes_and_numbers_are_no_names():
    code = "x = s.split()\ny = t.deque\nz = 1e5 + 0x1f\nprint(x, y, z)\n"
    needed = prefix.needed(code)
    assert "from re import *" not in needed  # .split is x's
    assert "from collections import *" not in needed
    assert "from math import *" not in needed  # e5 is part of 1e5


@pytest.mark.parametrize(
    "code",
    [
        "print(globals()['deque'])\n",
        "print(eval('gcd(4, 6)'))\n",
        "exec('print(pi)')\n",
        "print(vars()['pi'])\n",
        "import sys\nprint(sys._getframe().f_globals['pi'])\n",
        "def f(): pass\nprint(f.__globals__['pi'])\n",
        "print(__builtins__)\n",
        "print(dir())\n",
        "ｐｉ = 3\nprint(ｐｉ)\n",  # non-ASCII identifiers are normalised: the whole prefix
    ],
)
def test_a_source_that_can_reach_names_it_does_not_spell_gets_the_whole_prefix(code):
    assert prefix.needed(code) == LCB_IMPORT_STRING


def test_the_names_are_read_from_an_interpreter_started_as_the_sandbox_starts():
    out = subprocess.run(
        [sys.executable, "-S", "-P", "-c", "import collections; print(sorted(collections.__all__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = prefix.LINES.index("from collections import *\n")
    assert sorted(prefix.bound_names()[line]) == eval(out)  # noqa: S307 (our own output)
    assert prefix.bound_names()[prefix.LINES.index("import math\n")] == {"math"}
    assert prefix.bound_names()[prefix.LINES.index("sys.setrecursionlimit(50000)\n")] == frozenset()


PROBE = (
    "print(deque.__module__, Counter.__module__, M == re.M, e == math.e, pow is __builtins__['pow']"
    " if isinstance(__builtins__, dict) else pow is __builtins__.pow, copy.__name__, List)\n"
    "print(sys.getrecursionlimit())\n"
)


def test_a_program_in_the_sandbox_sees_what_lcb_runners_prefix_gives(tmp_path):
    """The same program's output under the sandbox's partial prefix and under lcb_runner's whole
    prefix in a plain interpreter."""
    require_bubblewrap()
    script = tmp_path / "whole.py"
    script.write_text(LCB_IMPORT_STRING + PROBE, encoding="utf-8")
    want = subprocess.run(
        [sys.executable, "-S", "-P", str(script)], capture_output=True, text=True, check=True
    ).stdout
    assert want.splitlines()[0] == "collections typing True True True copy typing.List"
    limits = SandboxLimits.from_config(GraderConfig())
    with Sandbox(PROBE, mode="stdin", limits=limits) as box:
        got = box.run("", timeout_s=10, keep_bytes=1 << 16)
    assert (got.status, got.stderr) == ("ok", "")
    assert got.stdout == want


def test_a_functional_program_naming_typing_passes_and_one_naming_no_module_loads_none():
    require_bubblewrap()
    cfg = GraderConfig()
    typed = "class Solution:\n    def twice(self, xs: List[int]) -> List[int]:\n        return [2 * x for x in xs]\n"
    verdict = grade_code(
        typed, [Case(input="[1, 2]", output="[2, 4]", testtype="functional")], func_name="twice", cfg=cfg
    )
    assert (verdict.passed, verdict.status) == (1, "passed"), verdict
    # spelled in parts: a word in a string counts as a name the program may read
    bare = "import sys\nprint(sorted(m for m in sys.modules if m.startswith(('typi', 'coll', 'jso', 'statis', 'rand'))))\n"
    verdict = grade_code(bare, [Case(input="", output="[]", testtype="stdin")], func_name=None, cfg=cfg)
    assert (verdict.passed, verdict.status) == (1, "passed"), verdict


@pytest.mark.parametrize(
    "done",
    [
        {"status": "ok", "returncode": 0, "wall_s": 0.0123, "stderr": "", "value": None, "spent": False},
        {
            "status": "error",
            "returncode": -9,
            "wall_s": 1e-05,
            "stderr": 'a "quoted"\\ line\n\t\x00\x1f é 中 😀',
            "value": "[1, 2]",
            "spent": True,
        },
    ],
)
def test_the_drivers_done_frame_is_the_json_of_its_dict(done):
    import json

    from atlas.graders.driver import done_json

    text = done_json(done)
    assert text.isascii()
    assert json.loads(text) == done
    assert text == json.dumps(done)  # json.dumps's own separators and escapes
