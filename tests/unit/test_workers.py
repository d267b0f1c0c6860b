"""How many pytest-xdist workers `-n auto` starts (tests/conftest.py): one per core (two at most)
for a run of folders or of several named files, one process for one file or named tests."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from conftest import pytest_xdist_auto_num_workers


@pytest.mark.parametrize(
    ("cores", "args", "workers"),
    [
        (2, [], 2),  # `python -m pytest`: the testpaths
        (2, ["tests"], 2),
        (2, ["tests/unit", "tests/reruns/test_slurm.py"], 2),  # a folder among the arguments
        (8, ["tests"], 2),  # never more than two
        (1, ["tests"], 1),
        (2, ["tests/unit/test_rl_math.py", "tests/unit/test_verl_config.py"], 2),  # the verl run
        (1, ["tests/unit/test_rl_math.py", "tests/unit/test_verl_config.py"], 1),
        (2, ["tests/unit/test_ppo.py"], 0),
        (2, ["tests/unit/test_ppo.py::test_lr_schedule_warms_up_then_holds_or_decays"], 0),
        (2, ["tests/unit/test_ppo.py", "tests/unit/test_gpqa.py::test_letters"], 0),
    ],
)
def test_auto_workers(monkeypatch, cores, args, workers):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert pytest_xdist_auto_num_workers(SimpleNamespace(args=args)) == workers
