"""Under CI (CI=true) a skipped test is a failure, unless its reason is a missing CUDA device or
another engine's environment (verl): a guarantee (isolation, bounds, resume) must never pass CI
by skipping. conftest.py installs the hook; `python -m pytest -p ci_skips` does elsewhere."""

from __future__ import annotations

import os
import re

import pytest

ALLOWED = re.compile(r"CUDA|\bverl\b")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not ALLOWED.search(reason):
            report.outcome = "failed"
            report.longrepr = (
                f"skipped under CI, where only a missing CUDA device or another engine's environment "
                f"may skip: {reason}"
            )
