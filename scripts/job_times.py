#!/usr/bin/env python
"""Per-job wall times of a Snakemake run, from its log (.snakemake/log/<date>.snakemake.log).

    python scripts/job_times.py .snakemake/log/2026-12-03T214710.snakemake.log [--json times.json]

Prints a Markdown table, one row per job in start order: the rule and its wildcards, start and end
(seconds after the first job started), wall seconds, and how it ended (`ok`, `error`, or `running`
when the log stops first: a run cut short). Snakemake writes a timestamp line before each job's
`rule X:` block and before its `Finished jobid: N` or `Error in rule X:` line; nothing else is read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
FIELD = re.compile(r"^\s+(jobid|wildcards): (.*)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")
ERROR = re.compile(r"^Error in rule (\w+):$")


def job_times(lines: list[str]) -> list[dict]:
    """The jobs of a Snakemake log, in start order, with start/end datetimes and their status."""
    jobs: dict[str, dict] = {}
    order: list[str] = []
    stamp: datetime | None = None
    pending: dict | None = None  # a `rule X:` block whose jobid is not read yet
    failing: str | None = None  # the rule of an `Error in rule X:` block whose jobid is not read yet
    for raw in lines:
        line = raw.rstrip("\n")
        if m := STAMP.match(line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
            continue
        if (m := START.match(line)) and stamp is not None:
            pending, failing = {"rule": m.group(1), "wildcards": "", "start": stamp, "end": None}, None
            continue
        if m := ERROR.match(line):
            failing, pending = m.group(1), None
            continue
        if m := FIELD.match(line):
            key, value = m.groups()
            if pending is not None and key == "wildcards":
                pending["wildcards"] = value
            elif pending is not None and key == "jobid":
                pending["status"] = "running"
                jobs[value] = pending
                order.append(value)
            elif failing is not None and key == "jobid" and value in jobs:
                jobs[value].update(end=stamp, status="error")
                failing = None
            continue
        if (m := FINISHED.match(line)) and m.group(1) in jobs:
            jobs[m.group(1)].update(end=stamp, status="ok")
            pending = None
    return [jobs[j] for j in order]


def table(jobs: list[dict]) -> str:
    if not jobs:
        return "no jobs in the log\n"
    t0 = min(j["start"] for j in jobs)
    rows = ["| job | start (s) | end (s) | wall (s) | status |", "|---|---:|---:|---:|---|"]
    for j in jobs:
        name = j["rule"] + (f" {j['wildcards']}" if j["wildcards"] else "")
        start = (j["start"] - t0).total_seconds()
        if j["end"] is None:
            rows.append(f"| {name} | {start:.0f} | | | {j['status']} |")
            continue
        end = (j["end"] - t0).total_seconds()
        rows.append(f"| {name} | {start:.0f} | {end:.0f} | {end - start:.0f} | {j['status']} |")
    ends = [j["end"] for j in jobs if j["end"] is not None]
    done = sum(j["status"] == "ok" for j in jobs)
    span = (max(ends) - t0).total_seconds() if ends else 0
    return (
        "\n".join(rows)
        + f"\n\n{done} of {len(jobs)} jobs finished; {span:.0f} s from the first start to the last end\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, help="a Snakemake log")
    p.add_argument("--json", type=Path, help="also write the jobs as JSON here")
    args = p.parse_args()
    try:
        lines = args.log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        sys.exit(f"job_times: {err}")
    jobs = job_times(lines)
    sys.stdout.write(table(jobs))
    if args.json:
        plain = [j | {k: j[k] and j[k].isoformat() for k in ("start", "end")} for j in jobs]
        args.json.write_text(json.dumps(plain, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
