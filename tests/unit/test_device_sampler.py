"""The trainer's device sampler reads nvidia-smi's CSV; a line that is not a reading, or a field
the driver cannot give, never ends the training job."""

from __future__ import annotations

import math
import subprocess

import atlas.rl.sampler as sampler


def test_odd_nvidia_smi_output_is_skipped_or_nan(monkeypatch):
    printed = "0, 87, 40960\n1, [N/A], [Not Supported]\nWARNING: infoROM is corrupted at gpu 0000:01:00.0\n\n"
    monkeypatch.setattr(sampler.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        sampler.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=printed, stderr=""),
    )
    rows = sampler._gpus()
    assert rows[0] == {"gpu": 0, "utilization_pct": 87.0, "memory_used_gb": 40.0}
    assert (
        rows[1]["gpu"] == 1
        and math.isnan(rows[1]["utilization_pct"])
        and math.isnan(rows[1]["memory_used_gb"])
    )
    assert len(rows) == 2
    monkeypatch.setattr(sampler.shutil, "which", lambda name: None)
    assert sampler._gpus() == []
