import copy

import pytest
import yaml

from atlas.config.base import ConfigError
from atlas.config.study import AtlasConfig, config_slice, json_schema_text, load_config, parse_config
from conftest import REPO


def default_raw() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_embedded_default_is_tiny_on_cpu():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert cfg.model.path is None and cfg.model.tiny is not None
    assert cfg.resources.device == "cpu" and cfg.resources.gpus == 0
    assert all(p.startswith("resources/fixtures/") for p in cfg.model.tiny.corpus)
    assert cfg.data.gpqa.train == "resources/fixtures/gpqa_train.csv"


def test_report25_describes_the_real_study():
    cfg = load_config(REPO / "config" / "report25.yaml")
    assert cfg.model.path is not None and cfg.model.tiny is None
    assert (cfg.resources.device, cfg.resources.gpus) == ("cuda", 2)
    assert cfg.schedule.steps * cfg.schedule.questions_per_step == 1280
    assert (cfg.schedule.questions_per_step, cfg.training.responses_per_question) == (32, 8)
    assert (cfg.data.gpqa.train_questions, cfg.data.lcb.train_questions) == (158, 140)
    assert (cfg.data.gpqa.val_questions, cfg.data.lcb.val_questions) == (198, 175)


def test_committed_schema_matches_the_models():
    assert (REPO / "config" / "schema.json").read_text() == json_schema_text()


def test_every_field_has_a_description():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    walk(sub)

    walk(AtlasConfig)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda c: c["schedule"].update(steps=0),
            "schedule.steps: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            lambda c: c["schedule"].update(questions_per_stp=4),
            "schedule.questions_per_stp: Extra inputs are not permitted",
        ),
        (
            lambda c: c["runs"]["frozen_potential"].update(snapshot_of="nope"),
            "runs.frozen_potential.snapshot_of: no run named 'nope'",
        ),
        (
            lambda c: c["runs"]["training_smoke"].update(snapshot_of="frozen_potential"),
            "runs.training_smoke.snapshot_of: the chain through 'training_smoke' is a cycle",
        ),
        (
            lambda c: c["runs"]["zero_potential"].update(steps=9),
            "runs.zero_potential.steps is 9 but schedule.steps is 4",
        ),
        (
            lambda c: c["runs"]["zero_potential"].update(potential="critic_snapshot"),
            "potential critic_snapshot needs snapshot_of",
        ),
        (
            lambda c: c["training"]["ppo"].update(kl_mode="sometimes"),
            "training.ppo.kl_mode: Input should be 'none', 'reward' or 'loss'",
        ),
        (lambda c: c["data"]["gpqa"].pop("train"), "data.gpqa.train: Field required"),
        (
            lambda c: c["model"]["tiny"].update(num_key_value_heads=3),
            "model.tiny: Value error, num_attention_heads (2) must be a multiple",
        ),
        (
            lambda c: c["model"].update(path="/models/x"),
            "model: Value error, set only one of model.path and model.tiny",
        ),
        (lambda c: c["resources"].update(gpus=2), "resources: Value error, gpus > 0 needs device: cuda"),
        (
            lambda c: c["training"].update(engine="deepspeed"),
            "training.engine: Input should be 'local' or 'verl'",
        ),
        (
            lambda c: c["training"].update(runs=c.pop("runs")),
            "training.runs: runs sits at the top level of the config (runs:), not under training",
        ),
        (
            lambda c: c["training"].update(dose_step=c["dose_step"]),
            "training.dose_step: dose_step sits at the top level of the config (dose_step:)",
        ),
        (
            lambda c: c["runs"].update(zero_potential=None),
            "validation.policies: 'zero_potential' is neither 'base' nor a training run",
        ),
    ],
)
def test_bad_config_names_key_path_and_reason(edit, expected):
    raw = copy.deepcopy(default_raw())
    edit(raw)
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "bad.yaml")
    assert "invalid config bad.yaml" in str(err.value)
    assert expected in str(err.value)


def test_config_slices_hold_only_what_the_stage_reads():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert set(config_slice(cfg, "data")) == {"data", "schedule"}
    assert set(config_slice(cfg, "model")) == {"model"}
    assert config_slice(cfg, "data")["schedule"]["steps"] == cfg.schedule.steps


def test_threads_per_job_are_scheduling_only():
    """resources.threads sets each model job's threads (1 in the embedded default, so jobs run
    side by side) and is in no stage's slice: changing it reruns nothing."""
    raw = default_raw()
    assert parse_config(raw).resources.threads == 1
    raw4 = copy.deepcopy(raw)
    raw4["resources"]["threads"] = 4
    for stage in ("smoke", "boundary", "validation"):
        assert config_slice(parse_config(raw), stage) == config_slice(parse_config(raw4), stage)
        assert config_slice(parse_config(raw), stage)["resources"] == {"device": "cpu", "gpus": 0}
    assert config_slice(parse_config(raw), "training", "zero_potential") == config_slice(
        parse_config(raw4), "training", "zero_potential"
    )
    raw4["resources"]["threads"] = 0
    with pytest.raises(ConfigError, match="threads"):
        parse_config(raw4, "bad.yaml")


def test_gpu_memory_claims_are_scheduling_only_and_need_every_kind():
    """resources.gpu_memory_gb: each GPU job's claim (the Snakemake resource gpu_mem_gb), in no
    stage's slice: changing it reruns nothing."""
    raw = default_raw()
    raw["resources"] |= {"device": "cuda", "gpus": 1}
    claimed = copy.deepcopy(raw)
    claimed["resources"]["gpu_memory_gb"] = {"training": 72, "rollouts": 20, "checks": 24}
    cfg = parse_config(claimed)
    assert [cfg.resources.gpu_mem_gb(k) for k in ("training", "rollouts", "checks")] == [72, 20, 24]
    assert parse_config(raw).resources.gpu_mem_gb("training") == 0  # no claim
    for stage in ("smoke", "boundary", "validation"):
        assert config_slice(cfg, stage) == config_slice(parse_config(raw), stage)
    for stage in ("training", "checks"):
        assert config_slice(cfg, stage, "zero_potential") == config_slice(
            parse_config(raw), stage, "zero_potential"
        )
    claimed["resources"]["gpu_memory_gb"] = {"training": 72, "rollouts": 20}
    with pytest.raises(ConfigError, match="gpu_memory_gb: give training, rollouts and checks"):
        parse_config(claimed, "bad.yaml")
    cpu = default_raw()
    cpu["resources"]["gpu_memory_gb"] = {"training": 1, "rollouts": 1, "checks": 1}
    with pytest.raises(ConfigError, match="gpu_memory_gb needs device: cuda"):
        parse_config(cpu, "bad.yaml")


def test_a_training_slice_holds_only_its_own_run():
    raw = default_raw()
    before = config_slice(parse_config(raw), "training", "zero_potential")
    assert before["training"]["run"] == {
        "name": "zero_potential",
        "steps": 4,  # null in the config: the whole schedule
        "potential": "zero",
        "dose": 1.0,
        "snapshot_of": None,
        "snapshot_step": None,
    }
    assert "runs" not in before["training"] and "dose_step" not in before["training"]
    raw["runs"]["frozen_potential"]["dose"] = 0.25
    raw["dose_step"]["doses"] = [0.0, 2.0]
    assert config_slice(parse_config(raw), "training", "zero_potential") == before
    assert config_slice(parse_config(raw), "training", "frozen_potential")["training"]["run"]["dose"] == 0.25
    assert config_slice(parse_config(raw), "dose_step")["training"]["run"]["doses"] == [0.0, 2.0]


def test_the_distributed_roundtrip_slice_holds_the_seed_and_the_engine_keys_of_every_run():
    from atlas.config.training import RoundtripSlice

    raw = default_raw()
    raw["seed"] = 7
    raw["training"]["ppo"]["actor_lr"] = 3e-6
    before = config_slice(parse_config(raw), "distributed_roundtrip")
    assert set(before) == {"seed", "training"}
    assert {"run", "runs", "dose_step", "verl"}.isdisjoint(before["training"])  # verl: engine local
    sl = RoundtripSlice.model_validate(before)
    assert (sl.seed, sl.training.ppo.actor_lr) == (7, 3e-6)
    assert sl.training.lora_rank == raw["training"]["lora_rank"]
    raw["runs"]["zero_potential"]["dose"] = 0.25  # a run's entry: its training reruns
    raw["dose_step"]["doses"] = [0.0, 2.0]
    raw["graders"] = {**raw.get("graders", {}), "test_timeout_s": 9.0}
    assert config_slice(parse_config(raw), "distributed_roundtrip") == before
    raw["training"]["ppo"]["critic_lr"] = 2e-5
    changed = RoundtripSlice.model_validate(config_slice(parse_config(raw), "distributed_roundtrip"))
    assert changed.training.ppo.critic_lr == 2e-5


def test_the_validation_slice_holds_the_studys_adapter_shape_and_no_other_training_key():
    from atlas.config.adapters import AdapterShape
    from atlas.config.validation import ValidationSlice

    raw = yaml.safe_load((REPO / "config" / "report25.yaml").read_text())
    raw["training"]["lora_targets"] = ["q_proj", "v_proj"]
    before = config_slice(parse_config(raw), "validation")
    assert before["training"] == {"lora_rank": 64, "lora_alpha": 128, "lora_targets": ["q_proj", "v_proj"]}
    # the study's values, and no training key it does not read (defaulted or not)
    shape = AdapterShape(lora_rank=64, lora_alpha=128, lora_targets=["q_proj", "v_proj"])
    assert ValidationSlice.model_validate(before).training == shape
    # training keys validation does not read leave its slice alone: no validation reruns
    raw["training"]["responses_per_question"] = 4
    raw["training"]["merged_rollouts"] = False
    raw["training"]["ppo"] = {**raw["training"].get("ppo", {}), "actor_lr": 3.0e-6}
    raw["runs"]["zero_potential"]["dose"] = 0.5
    assert config_slice(parse_config(raw), "validation") == before
    raw["training"]["lora_alpha"] = 64  # the adapters' shape reruns every validation
    assert config_slice(parse_config(raw), "validation")["training"]["lora_alpha"] == 64
    with pytest.raises(ValueError, match="responses_per_question"):
        ValidationSlice.model_validate(
            {**before, "training": {**before["training"], "responses_per_question": 8}}
        )


def test_checks_resume_the_first_checkpoints_and_sit_in_their_own_slice():
    from atlas.config.checks import ChecksConfig
    from atlas.config.study import config_slice, load_config

    assert [ChecksConfig().resumes(i) for i in range(3)] == [True, False, False]
    assert [ChecksConfig(resumed_steps=2).resumes(i) for i in range(3)] == [True, True, False]
    assert all(ChecksConfig(resumed_steps="all").resumes(i) for i in range(50))
    with pytest.raises(ValueError):
        ChecksConfig(resumed_steps="some")
    cfg = load_config(REPO / "config" / "config.yaml")
    checks, training = (
        config_slice(cfg, "checks", "zero_potential"),
        config_slice(cfg, "training", "zero_potential"),
    )
    assert checks.pop("checks") == {"resumed_steps": 1}
    assert checks == training and "checks" not in training  # changing it reruns no training


def test_a_config_laid_over_another_merges_nested_mappings_key_by_key():
    from atlas.config.study import merged

    base = {"training": {"engine": "local", "ppo": {"actor_lr": 1e-3, "epochs": 1}}, "seed": 0}
    over = {"training": {"ppo": {"epochs": 2}, "runs": ["a"]}, "seed": {"not": "an int"}}
    assert merged(base, over) == {
        "training": {"engine": "local", "ppo": {"actor_lr": 1e-3, "epochs": 2}, "runs": ["a"]},
        "seed": {"not": "an int"},  # a mapping over a scalar replaces it
    }
    assert base["training"]["ppo"]["epochs"] == 1 and "runs" not in base["training"]  # unchanged
    assert merged({"a": {"b": 1}}, {"a": 5}) == {"a": 5}  # a scalar over a mapping replaces it


# The configs laid over another shipped one (--configfile BASE CONFIG), by the files beneath them
LAID_OVER = {"h200-verl.yaml": ["h200.yaml"]}


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "config").glob("*.yaml") if p.name != "config.yaml")
)
def test_every_shipped_config_parses_over_the_embedded_default(name):
    """Each config/*.yaml, merged over config/config.yaml as --configfile merges it, is a valid
    config; the GPU ones ask for CUDA."""
    from atlas.config.study import merged

    def read(file):
        return yaml.safe_load((REPO / "config" / file).read_text(encoding="utf-8"))

    layers = [read("config.yaml"), *(read(under) for under in LAID_OVER.get(name, [])), read(name)]
    whole = layers[0]
    for layer in layers[1:]:
        whole = merged(whole, layer)
    cfg = parse_config(whole, f"config/{name}")
    assert cfg.resources.device == "cuda", name
    if name == "h200-verl.yaml":  # the report's shape under verl, its training smoke the one arm
        assert cfg.training.engine == "verl" and list(cfg.runs) == ["training_smoke"]
        assert cfg.runs["training_smoke"].steps == 2 and cfg.schedule.questions_per_step == 32
        assert (cfg.training.responses_per_question, cfg.training.lora_rank, cfg.training.lora_alpha) == (
            8,
            64,
            128,
        )
        assert cfg.runtime.max_turns == 3 and cfg.report.arms == ["training_smoke"]
    if name == "h200-tiny.yaml":  # the embedded default, only on a GPU
        assert cfg.model.tiny is not None and cfg.training.engine == "local"
        assert cfg.training.wandb_mode == "disabled" and cfg.resources.gpus == 1
