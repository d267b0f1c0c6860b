"""Preparing a run on verl (`training.engine: verl`): verl's datasets, the agent loop's settings
and the Hydra overrides, composed and checked by verl's own loader before any GPU is asked for.

atlas.stages.train_verl, the `train` rule's module when the engine is verl, prepares with this
module, launches verl and converts its outputs; the inputs, the output folder and the checkpoints
folder are those of a local run, so the DAG is the same. In order:

    results/checkpoints/<run>/            (not a declared output; a rerun finds it)
        verl/data/{train,val}.parquet     the run's ordered schedule and validation questions in
                                          verl's dataset format (file order = schedule order)
        verl/settings.json, agent_loop.yaml   what the agent loop reads (atlas.verl.agent_loop)
        verl/overrides.txt                the exact Hydra overrides (composed and checked first)
        verl/launch_<n>.log, metrics_<n>.jsonl   verl's output and per-step metrics, per launch
        verl/checkpoints/global_step_<g>/  verl's checkpoints (resume_mode=auto resumes from them)
        episodes/<phase>/global_step_<g>/  one file per episode, from the agent loop
    -> python -m verl.trainer.main_ppo <overrides>   (a Ray cluster: training.verl.ray_address)
    -> atlas.verl.convert: the journal, then the same run folder a local run gets
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml

from atlas.config.training import TrainSlice
from atlas.hashing import atomic_path, atomic_write_json
from atlas.runtime.episode import SYSTEM_PROMPT, question_prompt
from atlas.runtime.inputs import TrainingInputs, read_questions, smoke_slice
from atlas.verl.agent_loop import AGENT_NAME, LoopSettings
from atlas.verl.config import VerlPaths, compose, verl_overrides, write_overrides

REWARD_FN = Path(__file__).with_name("reward.py")


def dataset_rows(questions: list[dict], phase: str) -> list[dict]:
    """verl's dataset rows: `prompt` (chat messages, for verl's length filter and logs), the agent
    loop's name, and in extra_info what the agent loop looks the question up by."""
    return [
        {
            "data_source": q["source"],
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question_prompt(q)},
            ],
            "agent_name": AGENT_NAME,
            "ability": q["source"],
            "reward_model": {"style": "rule", "ground_truth": ""},  # scored from records only
            "extra_info": {"index": i, "question_uid": q["question_uid"], "phase": phase},
        }
        for i, q in enumerate(questions)
    ]


def write_parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pl.DataFrame(rows).write_parquet(tmp)


def model_vocab_size(model_dir: Path) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir).vocab_size)


def prepare(
    cfg: TrainSlice, config: dict, inputs: TrainingInputs, root: Path
) -> tuple[list[str], Path, Path, dict[str, int]]:
    """Write the datasets, the agent loop's settings and the overrides under `root` (the run's
    checkpoints folder); return the overrides, the metrics file of this launch, the episodes
    folder and the episodes each step and validation point must have (questions x samples).
    `cfg` is the run's slice validated, `config` the same slice as the stage received it (the
    agent loop validates it again in each worker)."""
    name, steps = cfg.run.name, cfg.run.steps
    verl_dir, episodes = root / "verl", root / "episodes"
    train = [q for q in read_questions(inputs.train) if q["step"] < steps]
    train.sort(key=lambda q: (q["step"], q["position"]))
    val_rows = read_questions(inputs.val)
    val = smoke_slice(val_rows, cfg.training.validation_questions or len(val_rows))
    write_parquet(verl_dir / "data" / "train.parquet", dataset_rows(train, "train"))
    write_parquet(verl_dir / "data" / "val.parquet", dataset_rows(val, "val"))
    settings = LoopSettings(
        config=config,
        run=name,
        vocab_size=model_vocab_size(inputs.model),
        train=str(inputs.train.resolve()),
        val=str(inputs.val.resolve()),
        tests=str(inputs.tests.resolve()),
        model=str(inputs.model.resolve()),
        snapshot=str(inputs.snapshot.resolve()) if inputs.snapshot else None,
        records_dir=str(episodes.resolve()),
    )
    settings_path = verl_dir / "settings.json"
    atomic_write_json(settings_path, settings.model_dump(mode="json"))
    loop_yaml = verl_dir / "agent_loop.yaml"
    with atomic_path(loop_yaml) as tmp:
        entry = {"name": AGENT_NAME, "_target_": "atlas.verl.agent_loop.AtlasToolAgentLoop"}
        Path(tmp).write_text(yaml.safe_dump([{**entry, "settings": str(settings_path.resolve())}]))
    launch = len(list(verl_dir.glob("metrics_*.jsonl")))  # verl truncates its file: one per launch
    metrics = verl_dir / f"metrics_{launch}.jsonl"
    paths = VerlPaths(
        model=str(inputs.model.resolve()),
        train_files=str((verl_dir / "data" / "train.parquet").resolve()),
        val_files=str((verl_dir / "data" / "val.parquet").resolve()),
        agent_loop_config=str(loop_yaml.resolve()),
        reward_fn_path=str(REWARD_FN),
        checkpoints=str((verl_dir / "checkpoints").resolve()),
        metrics_file=str(metrics.resolve()),
        wandb_dir=str(root.resolve()),
        hydra_dir=str((verl_dir / "hydra").resolve()),
        rollout_data_dir=str((verl_dir / "rollouts").resolve()),
    )
    overrides = verl_overrides(cfg, paths)
    compose(overrides)  # verl's own loader and startup checks, before any GPU is asked for
    write_overrides(verl_dir / "overrides.txt", overrides)
    t = cfg.training
    expected = {
        "train": cfg.schedule.questions_per_step * t.responses_per_question,
        "val": len(val) * t.validation_samples,
    }
    return overrides, metrics, episodes, expected
