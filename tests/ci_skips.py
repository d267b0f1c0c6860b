"""Under CI (CI=true) a skip is a failure, a test's or a whole module's, unless the test declares
by marker that it needs what the machine lacks: `gpu` (a CUDA device: torch sees none; the tests
in tests/gpu carry it) or `verl` (the verl environment: verl is not installed). The words of a
skip's reason never decide, so a guarantee (isolation, bounds, resume) cannot pass CI by skipping.
conftest.py installs the hooks; `python -m pytest -p ci_skips` does elsewhere.

A module that skips as a whole (a module-level importorskip) declares its marker in its source,
`pytestmark = pytest.mark.verl`: the module never ran, so the declaration is read from the file."""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

import pytest


def _no_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


# marker -> whether this machine lacks what it names
LACKING = {"gpu": _no_cuda, "verl": lambda: importlib.util.find_spec("verl") is None}
FOLDER_MARKERS = {"gpu"}  # tests/gpu/*: conftest marks every test there `gpu`


def excused(markers: Iterable[str]) -> list[str]:
    """The markers among `markers` whose need this machine lacks."""
    return [name for name in sorted(set(markers)) if name in LACKING and LACKING[name]()]


def declared_markers(path: Path) -> set[str]:
    """The markers a test module declares in its source (`pytestmark = pytest.mark.NAME`, or a
    list of them), and its folder's."""
    names = {path.parent.name} & FOLDER_MARKERS
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return names
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        ):
            continue
        values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
        for value in values:
            mark = value.func if isinstance(value, ast.Call) else value
            if isinstance(mark, ast.Attribute) and getattr(mark.value, "attr", None) == "mark":
                names.add(mark.attr)
    return names


def skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def _refusal(reason: str, markers: Iterable[str]) -> str:
    need = ", ".join(sorted(set(markers) & set(LACKING))) or "none"
    return (
        f"skipped under CI, where only a test marked `gpu` (no CUDA here) or `verl` (no verl here) may "
        f"skip (its markers of need: {need}): {reason}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        markers = [m.name for m in item.iter_markers()]
        if not excused(markers):
            report.outcome = "failed"
            report.longrepr = _refusal(skip_reason(report), markers)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and isinstance(collector, pytest.Module):
        markers = declared_markers(Path(collector.path))
        if not excused(markers):
            report.outcome = "failed"
            report.longrepr = _refusal(skip_reason(report), markers)
