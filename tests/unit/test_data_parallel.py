"""Data-parallel bookkeeping: how rows are dealt to ranks, mini-batches per rank, merged reports,
the ranks setting (no processes), and what `stop` keeps (in a one-rank gloo group of its own
process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from atlas.config.resources import ResourcesConfig
from atlas.rl.distributed import Ranks, Share, StepSync, merge_reports
from atlas.runtime.protocol import ProtocolReport
from conftest import REPO


def test_rows_are_dealt_round_robin_and_gathered_back_in_order():
    share = Share(Ranks(rank=1, world=3), total=8)
    assert share.rows == [1, 4, 7]
    assert share.mine(list("abcdefgh")) == ["b", "e", "h"]
    with pytest.raises(ValueError, match="7 items for a share of 8"):
        share.mine(list("abcdefg"))


def test_a_mini_batch_without_rows_on_a_rank_is_refused():
    share = Share(Ranks(rank=0, world=2), total=4)  # rank 0: rows 0, 2; rank 1: rows 1, 3
    assert StepSync(None, share, mini_batches=2).mini_batches(2, 2) == [[0], [1]]
    StepSync(None, share, mini_batches=3)  # ceil(4 / 3) = 2 rows a mini-batch: both ranks in each
    with pytest.raises(SystemExit, match=r"mini-batch 1 \(rows 1-1 of 4\) has no rows on rank 0 of 2"):
        StepSync(None, share, mini_batches=4)


def test_reports_merge_in_global_episode_order():
    a, b = ProtocolReport(episodes=2, calls=3), ProtocolReport(episodes=1, calls=1, violations=1)
    b.violation_rows.append({"question_uid": "q1", "sample": 0, "turn": 0})
    a.violations = 1
    a.violation_rows.append({"question_uid": "q2", "sample": 0, "turn": 1})
    order = {("q1", 0): 0, ("q2", 0): 1}
    merged = merge_reports([a, b], lambda r: order[(r["question_uid"], r["sample"])])
    assert (merged.episodes, merged.calls, merged.violations) == (3, 4, 2)
    assert [r["question_uid"] for r in merged.violation_rows] == ["q1", "q2"]


def test_ranks_config():
    assert ResourcesConfig().world_size == 1
    assert ResourcesConfig(ranks=2).world_size == 2
    assert ResourcesConfig(device="cuda", gpus=2).world_size == 2
    with pytest.raises(ValueError, match="on cuda each rank has one GPU"):
        ResourcesConfig(device="cuda", gpus=2, ranks=1)


KEEP_SCRIPT = """
import gc, weakref
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from atlas.rl import distributed

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def train_and_stop():
    ddp = DistributedDataParallel(torch.nn.Linear(4, 1))
    ddp(torch.ones(2, 4)).sum().backward()  # the reducer has synced a gradient
    distributed.stop(distributed.Ranks(), ddp)
    return weakref.ref(ddp)


held = train_and_stop()
gc.collect()
print("kept" if held() is not None else "freed")
"""


def test_what_stop_keeps_outlives_the_function_that_stopped():
    """A rank's DDP reducers are never freed: freeing one frees gloo's process group, whose
    destructor can deadlock with gloo's worker thread (atlas.rl.distributed.stop)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", KEEP_SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["kept"], proc.stdout
