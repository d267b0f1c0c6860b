"""Merge bench_gpu_dp.py's runs at 1 and N GPUs into one perf JSON: phase times per world size
(the slowest rank's, since each phase ends in step with the others), scaling efficiency
t_1 / (N * t_N) per phase and for the step, peak memory per GPU, and `perf_stack` rows.

    python scripts/dp_scaling.py OUT/dp_1.json OUT/dp_2.json --roundtrip OUT/roundtrip \
        --out resources/perf/h200x2_dp_1.7b.json

The last timed step is used (the first pays for allocator growth); phases are bench_gpu_perf's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atlas.hashing import atomic_write_json  # noqa: E402

PHASES = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def last_step(run: dict) -> dict[str, dict]:
    """phase -> {seconds: slowest rank, tokens: all ranks, peak_gb: per rank} at the last step."""
    ranks = run["ranks"]
    step = max(p["step"] for p in ranks[0]["phases"])
    out = {}
    for phase in PHASES:
        rows = [next(p for p in r["phases"] if p["step"] == step and p["phase"] == phase) for r in ranks]
        out[phase] = {
            "seconds": max(r["seconds"] for r in rows),
            "tokens": sum(r["tokens"] or 0 for r in rows),
            "peak_gb_per_gpu": [r["peak_gb"] for r in rows],
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench_gpu_dp JSON files, 1 GPU first")
    p.add_argument("--roundtrip", type=Path, help="folder of distributed_roundtrip_rank_<r>.json")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs = [json.loads(path.read_text()) for path in args.runs]
    by_world = {len(r["ranks"]): r for r in runs}
    if 1 not in by_world:
        raise SystemExit("need the 1-GPU run as the baseline")
    phases = {w: last_step(r) for w, r in sorted(by_world.items())}
    base = phases[1]
    summary, rows = {}, []
    for w, ph in phases.items():
        step = sum(v["seconds"] for v in ph.values())
        summary[f"{w}_gpu"] = {
            "step_seconds": step,
            "phases": ph,
            "peak_memory_gb_per_gpu": [r["peak_memory_gb"] for r in by_world[w]["ranks"]],
            "digests_agree_across_ranks": by_world[w]["digests_agree_across_ranks"],
            "scaling_efficiency_step": sum(v["seconds"] for v in base.values()) / (w * step),
            "scaling_efficiency_by_phase": {
                k: base[k]["seconds"] / (w * v["seconds"]) for k, v in ph.items()
            },
        }
        device = by_world[w]["ranks"][0]["device"]
        for phase, v in ph.items():
            rows.append(
                {
                    "source": "committed",
                    "test": "dp_step",
                    "run": f"{w}gpu",
                    "device": f"{w} x {device}",
                    "model_shape": by_world[w]["shape"],
                    "phase": phase,
                    "steps": 1,
                    "seconds": v["seconds"],
                    "tokens": v["tokens"],
                    "tokens_per_s": v["tokens"] / v["seconds"] if v["seconds"] else None,
                    "peak_memory_gb": max(v["peak_gb_per_gpu"]),
                    "checkpoint_bytes": None,
                    "checkpoint_save_s": None,
                }
            )
    out = {
        "commands": [r["command"] for r in runs],
        "merged_by": " ".join(["scripts/dp_scaling.py", *sys.argv[1:]]),
        "global_rows": runs[0]["global_rows"],
        "row_tokens": runs[0]["row_tokens"],
        "synthetic": runs[0]["synthetic"],
        "scaling": summary,
        "perf_stack": rows,
    }
    if args.roundtrip:
        out["nccl_roundtrip"] = [
            json.loads(f.read_text())
            for f in sorted(args.roundtrip.glob("distributed_roundtrip_rank_*.json"))
        ]
    atomic_write_json(args.out, out)
    print(f"{'GPUs':>5} {'step s':>8} {'efficiency':>10}  " + " ".join(f"{k:>13}" for k in PHASES))
    for w, s in summary.items():
        print(
            f"{w:>5} {s['step_seconds']:8.3f} {s['scaling_efficiency_step']:10.2f}  "
            + " ".join(f"{s['phases'][k]['seconds']:13.3f}" for k in PHASES)
        )


if __name__ == "__main__":
    main()
