"""tools/suite_cpu.py's reading of /proc/stat: busy and idle core-seconds from clock ticks."""

from __future__ import annotations

import importlib.util
import os

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("suite_cpu", REPO / "tools" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_cpu)


def test_core_seconds_sum_the_busy_and_idle_fields(monkeypatch):
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 100 if name == "SC_CLK_TCK" else real(name))
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  1000 20 300 5000 70 4 6 900 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    busy, idle = suite_cpu.core_seconds(stat)
    assert busy == pytest.approx((1000 + 20 + 300 + 4 + 6) / 100)  # steal is not ours
    assert idle == pytest.approx((5000 + 70) / 100)


def test_a_file_that_is_not_proc_stat_is_refused():
    with pytest.raises(ValueError, match="expected a first line 'cpu user nice system idle"):
        suite_cpu.core_seconds("intr 123 4 5\n")
