"""Sampled device readings while a run trains: process RSS and CPU utilisation, and on GPUs
nvidia-smi's utilisation and memory. A background thread reads them every `interval` seconds; the
trainer takes the samples of each step and journals them (they are measurements, kept out of
every comparison and hash of results)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time


def _rss_gb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    return float("nan")


def _gpus() -> list[dict[str, float]]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    rows = []
    for line in out.stdout.strip().splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue  # not a reading (a warning, a driver message): the sample goes without it
        index, util, mem = fields
        rows.append(
            {"gpu": int(index), "utilization_pct": _number(util), "memory_used_gb": _number(mem) / 1024}
        )
    return rows


def _number(text: str) -> float:
    """nvidia-smi's reading, or NaN where it prints none ("[N/A]", "[Not Supported]")."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


class DeviceSampler:
    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = (time.monotonic(), sum(os.times()[:2]))
        self._thread = threading.Thread(target=self._run, name="device-sampler", daemon=True)

    def start(self) -> DeviceSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def read(self) -> dict:
        now, cpu = time.monotonic(), sum(os.times()[:2])
        wall, used = now - self._last[0], cpu - self._last[1]
        self._last = (now, cpu)
        return {
            "time": time.time(),
            "rss_gb": _rss_gb(),
            "cpu_utilization_pct": 100.0 * used / wall if wall > 0 else 0.0,  # 100 = one core busy
            "gpus": _gpus(),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._rows.append(self.read())

    def take(self) -> list[dict]:
        """The samples since the last call, with one read now (so even a short step has one)."""
        with self._lock:
            rows, self._rows = [*self._rows, self.read()], []
        return rows
