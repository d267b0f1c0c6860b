"""Checks stage: the records that prove a training run's checkpoints and batches are sound.

    results/checks/<run>/
        compact_checkpoint_validation.json  per step, role and rank: trainable names, critic head
                                            keys, file sizes, finite checks, no base weight
        checkpoint_validation.json          per step: optimizer states = trainable tensors, per
                                            role (a verl run: its shards, hash-checked); the
                                            exported adapters' hashes; the exported actor, loaded
                                            with peft, reproduces the actor's log-probs
        cpu_roundtrip.json                  per checkpoint (see atlas.checks.roundtrip); the first
                                            checks.resumed_steps are resumed from (a verl run's
                                            none: verl resumes from its own checkpoints)
        distributed_roundtrip_rank_<r>.json FSDP2, world size 2 (see atlas.checks.distributed)
        batch_math.json                     per step: questions, trajectories, ... vs the config
        timing_analysis.json                per step: native phase times, peak memory, and the
                                            sampled readings (RSS, CPU %; nvidia-smi on GPUs)
        MANIFEST.json

Any failed check stops the stage with a message naming the file and the tensor; nothing is
written then. The config slice is the training run's own plus `checks`, so the checks rerun
with the run, and a change to `checks` reruns the checks alone.

    python -m atlas.stages.checks --config-slice '{...}' --train ... --val ... --tests ... \
        --model results/models/tiny [--snapshot ...] --checkpoints results/checkpoints/<run> \
        --run-folder results/runs/<run> --out results/checks/<run>
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from peft import PeftModel

from atlas.checks.compact import (
    adapter_hashes,
    base_parameter_names,
    compact_checkpoint_validation,
    optimizer_counts,
    read_json,
    verify_index,
    verl_checkpoint_shards,
)
from atlas.checks.roundtrip import (
    batch_math,
    cpu_roundtrip,
    next_token_logprobs,
    policy_device,
    policy_roundtrip,
    probe_batch,
    probes,
)
from atlas.config.checks import ChecksSlice
from atlas.contracts.parquet import read_table
from atlas.errors import CheckFailed
from atlas.hashing import atomic_dir, atomic_write_json, is_bookkeeping, write_manifest
from atlas.model.liger import applied, apply_liger
from atlas.rl.checkpoint import load_trainable
from atlas.rl.serving import build_policy
from atlas.rl.step import open_session, train_step
from atlas.runtime.inputs import TrainingInputs
from atlas.runtime.session import load_model
from atlas.stage import code_files, log, run, training_parser

MODULE = "atlas.stages.checks"


def timing_rows(metrics: list[dict], samples: list[dict]) -> list[dict]:
    """Per step: the native phase times and peak memory, and a summary of the sampled readings."""
    by_step = {s["step"]: s["samples"] for s in samples}
    rows = []
    for m in metrics:
        got = by_step.get(m["step"], [])
        gpu = [g for s in got for g in s["gpus"]]
        rows.append(
            {
                "step": m["step"],
                **{k: v for k, v in m.items() if k.startswith(("timing_s/", "perf/"))},
                "sampled": {
                    "samples": len(got),
                    "rss_gb_max": max((s["rss_gb"] for s in got), default=None),
                    "cpu_utilization_pct_mean": sum(s["cpu_utilization_pct"] for s in got) / len(got)
                    if got
                    else None,
                    "gpu_utilization_pct_mean": sum(g["utilization_pct"] for g in gpu) / len(gpu)
                    if gpu
                    else None,
                    "gpu_memory_used_gb_max": max((g["memory_used_gb"] for g in gpu), default=None),
                },
            }
        )
    return rows


def exported_actor_reproduces(model_dir: Path, adapters: Path, ac, ids: torch.Tensor) -> float:
    """Max |log-prob difference| between the exported actor (peft) and the checkpointed actor,
    the exported one loaded as the policy's base is (device, dtype, Liger kernels), so that equal
    weights give equal log-probs."""
    device = policy_device(ac)
    base, _ = load_model(model_dir, str(device))
    if applied(ac.peft):
        apply_liger(base)
    peft_model = PeftModel.from_pretrained(base.to(device), adapters / "actor")
    ids = ids.to(device)
    with torch.no_grad():
        exported = next_token_logprobs(peft_model(input_ids=ids).logits, ids).cpu()
    return (exported - probes(ac, ids)["actor_logprobs"]).abs().max().item()


def main(argv: list[str] | None = None) -> None:
    p = training_parser(__doc__.splitlines()[0])
    p.add_argument("--run-folder", required=True, type=Path, help="results/runs/<run>")
    p.add_argument("--distributed", required=True, type=Path, help="the distributed roundtrip's rank files")
    args = p.parse_args(argv)
    s = args.config_slice
    sl = ChecksSlice.model_validate(s)
    inputs = TrainingInputs(
        train=args.train, val=args.val, tests=args.tests, model=args.model, snapshot=args.snapshot
    )
    name = sl.run.name
    folder = args.run_folder
    index = read_json(folder / "checkpoints.json")
    verify_index(index)
    base_names = base_parameter_names(inputs.model)
    metrics = [json.loads(json.dumps(m)) for m in read_table(folder / "step_metrics.parquet").to_pylist()]
    by_step = {m["step"]: m for m in metrics}
    ids = probe_batch(folder / "trajectories.parquet")

    training, resources, checks = sl.training, sl.resources, sl.checks
    verl = training.engine == "verl"  # policy checkpoints only; optimizer and RNG stay in verl's
    made_by = read_json(folder / "run.json").get("engine", "local")
    if made_by != training.engine:
        raise CheckFailed(
            f"{folder / 'run.json'}: a {made_by} run; the config's training.engine is {training.engine}"
        )

    def open_fresh():
        return open_session(sl, inputs)

    def fresh_policy():
        return build_policy(inputs.model, training, sl.seed, resources.device)[0]

    compact, optim, roundtrips = [], [], []
    for i, c in enumerate(index["checkpoints"]):
        ckpt, k = Path(c["path"]), c["step"]
        compact.extend(compact_checkpoint_validation(ckpt, base_names, step=k))
        if verl:
            roundtrips.append(policy_roundtrip(fresh_policy, ckpt, k, ids))
        else:
            optim.append({"step": k, **optimizer_counts(ckpt)})
            resume = by_step.get(k) if checks.resumes(i) else None
            roundtrips.append(cpu_roundtrip(open_fresh, ckpt, k, resume, ids, train_step))
        log(name, "checkpoint checked", step=k)
    if verl:
        optim = verl_checkpoint_shards(read_json(folder / "adapters" / "verl_checkpoints.json"))

    last = fresh_policy()
    load_trainable(Path(index["checkpoints"][-1]["path"]), last)
    gap = exported_actor_reproduces(inputs.model, folder / "adapters", last, ids)
    if gap != 0.0:
        raise CheckFailed(
            f"{folder / 'adapters/actor'}: exported actor log-probs differ by {gap} from the last checkpoint's"
        )
    batches = batch_math(
        read_table(folder / "records.parquet").to_pylist(),
        read_table(folder / "trajectories.parquet").to_pylist(),
        steps=sl.run.steps,
        questions=sl.schedule.questions_per_step,
        responses=training.responses_per_question,
        ppo=training.ppo,
    )

    ranks = sorted(args.distributed.glob("distributed_roundtrip_rank_*.json"))
    for path in ranks:
        r = read_json(path)
        if not (
            r["loaded_tensors_equal"] and r["grads_within_tolerance"] and r["digests_agree_across_ranks"]
        ):
            raise CheckFailed(f"{path}: the distributed roundtrip failed on rank {r['rank']}")
    if len(ranks) != 2:
        raise CheckFailed(f"{args.distributed}: {len(ranks)} rank files, expected 2")

    with atomic_dir(args.out) as tmp:
        for path in ranks:
            shutil.copyfile(path, tmp / path.name)
        atomic_write_json(tmp / "compact_checkpoint_validation.json", {"run": name, "rows": compact})
        atomic_write_json(
            tmp / "checkpoint_validation.json",
            {
                "run": name,
                "engine": training.engine,
                # local: AdamW state per trainable tensor; verl: its own checkpoints' shards
                ("verl_checkpoint_shards" if verl else "optimizer_counts"): optim,
                "exported_adapters": adapter_hashes(folder / "adapters"),
                "exported_actor_logprob_max_abs_diff": gap,
            },
        )
        atomic_write_json(
            tmp / "cpu_roundtrip.json",
            {"run": name, "resumed_steps": checks.resumed_steps, "checkpoints": roundtrips},
        )
        atomic_write_json(tmp / "batch_math.json", {"run": name, "steps": batches})
        atomic_write_json(
            tmp / "timing_analysis.json",
            {
                "run": name,
                "device": resources.device,
                "steps": timing_rows(metrics, read_json(folder / "device_samples.json")),
            },
        )
        write_manifest(
            tmp,
            stage=f"checks/{name}",
            inputs=[
                *inputs.files(),
                *sorted(p for p in folder.rglob("*") if p.is_file() and not is_bookkeeping(p.name)),
            ],
            code=code_files(MODULE),
            config=s,
        )
    log(name, "checks passed", out=args.out, checkpoints=len(roundtrips))


if __name__ == "__main__":
    run(main)
