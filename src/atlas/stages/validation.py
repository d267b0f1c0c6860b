"""Full validation: one policy (a run's final actor, or the base) over the whole validation set.

    results/validation/<policy>/
        records.parquet, trajectories.parquet   every episode (phase val)
        answers.parquet                         per trajectory: final answer, score, completed
        protocol.json
        validation.json                         trajectory and completed counts, protocol checks,
                                                weight probes, the software stack
        MANIFEST.json

Weight probes: the sha256 of chosen base tensors, read from the live policy, equal those of the
model files (the base never moved); for a trained policy, the share of its actor LoRA tensors that
differ from their seeded initial values. Every trajectory must complete with a submission: if one
does not, or a protocol check fails, the stage stops before its folder is renamed into place, so
an incomplete validation never looks finished (the summary goes to the log).

    python -m atlas.stages.validation --config-slice '{...}' --val results/data/val.parquet \
        --tests results/data/tests.parquet --model results/models/tiny \
        [--run-folder results/runs/zero_potential] --policy zero_potential --out results/validation/zero_potential
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from atlas.config.validation import ValidationSlice
from atlas.contracts.answers import ANSWERS_SCHEMA
from atlas.contracts.parquet import arrow_table
from atlas.contracts.protocol import PINNED_COUNTS
from atlas.errors import CheckFailed
from atlas.graders.sandbox import require_sandbox
from atlas.hashing import atomic_dir, atomic_write_json, sha256_file, write_manifest
from atlas.model.policy import ActorCritic
from atlas.runtime.inputs import RolloutInputs, read_questions, read_tests
from atlas.runtime.rollouts import check_protocol, episode_specs, rollout, validation_rows
from atlas.runtime.runfolder import write_rollouts
from atlas.runtime.session import load_model, make_runtime
from atlas.stage import code_files, log, rollout_parser, run

MODULE = "atlas.stages.validation"
PROBED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight")
STACK = ("torch", "transformers", "peft", "xgrammar", "snakemake", "polars", "pyarrow", "wandb")


def software_stack() -> dict:
    out = {"python": platform.python_version()}
    out.update({name: metadata.version(name) for name in STACK})
    out["cuda"] = torch.version.cuda
    out["device"] = (
        torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    )
    return out


def tensor_sha(t: torch.Tensor) -> str:
    # the raw bytes, through uint8: numpy has no bfloat16
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def base_tensor_probes(base: dict[str, torch.Tensor], model_file: Path) -> dict:
    """The sha256 of each PROBED base tensor, live (`base`: the policy's base parameters) and as
    `model_file` holds it, in the dtype the policy loaded it in (bf16 on a GPU from a float32
    file): equal, or CheckFailed naming the tensor. Only the probed tensors are read."""
    out = {}
    with safe_open(str(model_file), framework="pt") as f:
        for name in PROBED:
            live = base.get(f"base_model.model.{name}")
            if live is None:
                live = base[
                    next(n for n in base if n.endswith(name.replace(".weight", ".base_layer.weight")))
                ]
            out[name] = {"live": tensor_sha(live), "file": tensor_sha(f.get_tensor(name).to(live.dtype))}
            if out[name]["live"] != out[name]["file"]:
                raise CheckFailed(f"{model_file}: base tensor {name} changed in the policy")
    return out


def final_answer(ep) -> str:
    submits = [r for r in ep.records if r.tool == "submit"]
    return submits[-1].arguments if submits else ""


def main(argv: list[str] | None = None) -> None:
    p = rollout_parser(__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="'base' or a training run's name")
    p.add_argument("--run-folder", type=Path, help="results/runs/<run> for a trained policy")
    args = p.parse_args(argv)
    s = args.config_slice
    sl = ValidationSlice.model_validate(s)
    inputs = RolloutInputs(val=args.val, tests=args.tests, model=args.model)
    runtime, graders, resources = sl.runtime, sl.graders, sl.resources
    require_sandbox(graders.allow_unsandboxed)  # before any model loads: bwrap missing stops here
    model, tokenizer = load_model(inputs.model, resources.device)
    probes: dict = {"base_tensors": {}}

    ac = ActorCritic(model, sl.training, seed=sl.seed).to(resources.device)
    initial = {n: t.detach().clone() for n, t in ac.trainable("actor").items()}
    if args.policy != "base":
        index = json.loads((args.run_folder / "checkpoints.json").read_text(encoding="utf-8"))
        last = index["checkpoints"][-1]
        path = Path(last["path"]) / "actor.safetensors"
        if sha256_file(path) != last["files"]["actor.safetensors"]["sha256"]:
            raise CheckFailed(f"{path}: sha256 differs from {args.run_folder / 'checkpoints.json'}")
        saved = load_file(str(path))
        with torch.no_grad():
            for name, t in ac.trainable("actor").items():
                t.copy_(saved[name])
        changed = sum(not torch.equal(t, initial[n]) for n, t in ac.trainable("actor").items())
        probes["actor_checkpoint"] = {"path": path.as_posix(), "step": last["step"]}
        probes["lora_tensors_changed"] = {"changed": changed, "of": len(initial)}
        if changed == 0:
            raise CheckFailed(f"{path}: no actor LoRA tensor differs from its initial value")
    policy_model = ac.peft
    probes["base_tensors"] = base_tensor_probes(
        dict(ac.base_parameters()), inputs.model / "model.safetensors"
    )

    ctx = ac.peft.disable_adapter() if args.policy == "base" else torch.no_grad()
    rt = make_runtime(policy_model, tokenizer, runtime)
    questions = read_questions(inputs.val)
    specs = episode_specs(questions, read_tests(inputs.tests), sl.validation.samples)
    log(args.policy, "validating", episodes=len(specs))
    with ctx:
        episodes = rollout(
            rt, specs, runtime, graders, run=f"validation/{args.policy}", step=0, phase="val", seed=sl.seed
        )
    report = check_protocol(rt, episodes, runtime)
    rows = validation_rows(episodes, run=args.policy, step=0)
    answers = [
        {
            "question_uid": ep.question["question_uid"],
            "source": ep.question["source"],
            "sample": ep.sample,
            "final_answer": final_answer(ep),
            "score": ep.score,
            "completed": ep.end_reason == "submit",
            "turns": len(ep.generations),
        }
        for ep in episodes
    ]
    incomplete = [a for a in answers if not a["completed"]]
    summary = {
        "policy": args.policy,
        "trajectories": len(episodes),
        "completed": len(episodes) - len(incomplete),
        "protocol": {k: getattr(report, k) for k in PINNED_COUNTS},
        "by_source": rows,
        "weight_probes": probes,
        "software": software_stack(),
    }
    if report.violations or incomplete:
        print(json.dumps(summary, indent=1), file=sys.stderr)
        raise CheckFailed(
            f"validation of {args.policy}: {report.violations} protocol violations, "
            f"{len(incomplete)} trajectories without a submission (first: {incomplete[:1]})"
        )
    with atomic_dir(args.out) as tmp:
        write_rollouts(tmp, episodes, report, run=f"validation/{args.policy}", step=0, phase="val")
        pq.write_table(arrow_table(answers, ANSWERS_SCHEMA, "answers"), tmp / "answers.parquet")
        atomic_write_json(tmp / "validation.json", summary)
        read = inputs.files()
        if args.run_folder:
            read.append(args.run_folder / "checkpoints.json")
        write_manifest(tmp, stage=f"validation/{args.policy}", inputs=read, code=code_files(MODULE), config=s)
    log(args.policy, "validated", completed=summary["completed"], of=len(episodes))


if __name__ == "__main__":
    run(main)
