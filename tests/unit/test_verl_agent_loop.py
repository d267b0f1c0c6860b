"""The verl agent loop on CPU: verl 0.9.1's AgentLoopBase driven by a server manager backed by the
local HF engine, with the real grammar, tools and graders. Runs in the verl venv (CI); skips in
the project venv unless ATLAS_REQUIRE_VERL is set.

The strongest check: an episode played through the agent loop (one verl sample, tokens from the
"server", sampled/forced flags recomputed by replaying the grammar) equals the same episode played
by the local engine's batched loop, token for token and record for record.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
if not os.environ.get("ATLAS_REQUIRE_VERL"):
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402

from atlas.config.study import config_slice, load_config, parse_config  # noqa: E402
from atlas.rl.potentials import make_potential, register_potential  # noqa: E402
from atlas.rl.rewards import RewardPlacementError, shape_episode  # noqa: E402
from atlas.runtime.episode import EpisodeSpec, run_episodes  # noqa: E402
from atlas.runtime.inputs import read_questions, read_tests  # noqa: E402
from atlas.runtime.records import record_row  # noqa: E402
from atlas.runtime.session import load_runtime  # noqa: E402
from atlas.verl.agent_loop import (  # noqa: E402
    AtlasAgentLoopOutput,
    AtlasToolAgentLoop,
    GrammarMismatchError,
    LoopSettings,
    replay_generation,
)
from atlas.verl.local_server import HFServerManager  # noqa: E402
from atlas.verl.reward import RecordsMissingError, compute_score  # noqa: E402
from conftest import REPO  # noqa: E402

RUN, STEP = "zero_potential", 3


@register_potential("test_turn_ramp")
class TurnRamp:
    """Phi(s_k) = 0.25 (k + 1): non-zero shaping on every record, to see rewards land."""

    def __init__(self, **_):
        pass

    def __call__(self, episode):
        return [0.25 * (k + 1) for k in range(len(episode.records))]


def _cfg(potential="zero"):
    raw = load_config(REPO / "config" / "config.yaml").model_dump(mode="json")
    raw["runs"][RUN]["potential"] = potential
    return parse_config(raw)


def _loop(tmp_path, tiny_model, data_dir, cfg):
    rt = load_runtime(tiny_model, cfg.runtime)
    settings = LoopSettings(
        config=config_slice(cfg, "training", RUN),
        run=RUN,
        vocab_size=rt.engine.vocab_size,
        train=str(data_dir / "train.parquet"),
        val=str(data_dir / "val.parquet"),
        tests=str(data_dir / "tests.parquet"),
        model=str(tiny_model),
        records_dir=str(tmp_path / "records"),
    )
    path = tmp_path / f"settings_{cfg.runs[RUN].potential}.json"
    path.write_text(settings.model_dump_json())
    trainer = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 8192, "response_length": 8192}}}
    )
    loop = AtlasToolAgentLoop(
        trainer_config=DictConfigWrap(trainer),
        server_manager=HFServerManager(rt),
        tokenizer=rt.tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(OmegaConf.create({})),
        settings=str(path),
    )
    return loop, rt


def _play(loop, uid, sample, phase="train"):
    row = {"extra_info": {"question_uid": uid, "phase": phase}, "session_id": sample, "global_steps": STEP}
    return asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **row))


def play_both_ways(tmp: Path, tiny_model, data_dir):
    """A GPQA and an LCB question, two samples each, through the agent loop and locally: the
    session's `played` (tests/conftest.py), shared with test_verl_actor.py."""
    cfg = _cfg()
    loop, rt = _loop(tmp, tiny_model, data_dir, cfg)
    questions = read_questions(data_dir / "train.parquet")
    tests = read_tests(data_dir / "tests.parquet")
    chosen = [next(q for q in questions if q["source"] == source) for source in ("gpqa", "lcb")]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), s) for q in chosen for s in range(2)]
    outputs = [_play(loop, spec.question["question_uid"], spec.sample) for spec in specs]
    local = run_episodes(
        rt, specs, cfg.runtime, cfg.graders, run=RUN, step=STEP, phase="train", seed=cfg.seed
    )
    return loop, specs, outputs, local, tmp


def _without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("timing_s")}


def test_agent_loop_plays_the_local_engines_episode(played):
    _, specs, outputs, local, _ = played
    assert {spec.question["source"] for spec in specs} == {"gpqa", "lcb"}
    for out, ep in zip(outputs, local, strict=True):
        p = ep.prompt_tokens
        assert out.prompt_ids == ep.token_ids[:p]
        assert out.response_ids == ep.token_ids[p:]
        # response_mask is the local loss mask of PPO: sampled tokens only (tool output and
        # grammar-forced tokens are 0); the replayed flags equal the engine's own.
        assert out.response_mask == ep.sampled[p:]
        assert out.response_logprobs == pytest.approx(ep.logprobs[p:], abs=1e-5)
        records = out.extra_fields["records"]
        # what the local trainer does next: shaping (zero here) gives each record its credit
        credits = shape_episode(ep, make_potential("zero"), gamma=1.0, dose=1.0).credits()
        assert [_without_timings(r) for r in records] == [
            _without_timings(record_row(r, c)) for r, c in zip(ep.records, credits, strict=True)
        ]
        assert len(records) >= 1 and records[-1]["tool"] == "submit"
        assert all(r["run"] == RUN and r["step"] == STEP and r["phase"] == "train" for r in records)


def test_tool_tokens_and_forced_tokens_are_masked(played):
    _, _, outputs, local, _ = played
    for out, ep in zip(outputs, local, strict=True):
        p = ep.prompt_tokens
        tool = [i for i, m in enumerate(ep.loss_mask[p:]) if m == 0]
        assert all(out.response_mask[i] == 0 for i in tool)
        forced = sum(r["forced_tokens"] for r in out.extra_fields["records"])
        generated = sum(r["generated_tokens"] for r in out.extra_fields["records"])
        assert sum(out.response_mask) == generated - forced
        assert forced >= len(out.extra_fields["records"])  # at least the stop token after each call
    assert any(0 in ep.loss_mask[ep.prompt_tokens :] for ep in local)  # some episode had a tool turn


def test_rm_scores_sit_on_action_tokens(tmp_path, tiny_model, data_dir):
    loop, _ = _loop(tmp_path, tiny_model, data_dir, _cfg("test_turn_ramp"))
    uid = read_questions(data_dir / "train.parquet")[0]["question_uid"]
    out = _play(loop, uid, 0)
    d = out.as_dict()
    rm, mask = d["rm_scores"], d["response_mask"]
    records = out.extra_fields["records"]
    p = len(out.prompt_ids)
    positions = [r["action_token"] - p for r in records]
    # Phi = 0.25 (k + 1) with dose 1, gamma 1: F_k = Phi_{k+1} - Phi_k = 0.25, and -Phi_{K-1} last.
    k = len(records)
    shaping = [0.25] * (k - 1) + [-0.25 * k]
    expected = [r["score"] + f for r, f in zip(records, shaping, strict=True)]
    assert [r["reward"] for r in records] == pytest.approx(expected)
    assert rm.nonzero().flatten().tolist() == sorted(
        i for i, e in zip(positions, expected, strict=True) if e != 0
    )
    assert rm[positions].tolist() == pytest.approx(expected)
    assert all(mask[i] == 1 for i in positions)  # GAE keeps them
    assert float(rm.sum()) == pytest.approx(out.reward_score)
    assert "action_positions" not in d and "reward_score" not in d
    # The episode was written for the converter, rewards filled, before verl's update.
    written = json.loads(
        next((tmp_path / "records" / "train" / f"global_step_{STEP}").glob("*__0.json")).read_text()
    )
    assert [r["reward"] for r in written["records"]] == pytest.approx(expected)
    assert written["token_ids"] == out.prompt_ids + out.response_ids


def test_a_reward_on_a_masked_token_is_refused():
    out = AtlasAgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        response_mask=[1, 0, 1],
        reward_score=1.0,
        metrics={},
        action_positions=[1],
        action_rewards=[1.0],
    )
    with pytest.raises(RewardPlacementError, match="response position 1 has response_mask 0"):
        out.as_dict()


def test_replay_refuses_tokens_outside_the_grammar(played):
    loop, specs, _, local, _ = played
    setup, ep = loop.setup, local[0]
    call = setup.rt.grammars.get(ep.generations[0].offered)
    span = ep.generations[0]
    tokens = ep.token_ids[span.start : span.end]
    # The local engine's own generation replays to the same flags.
    gen = replay_generation(tokens, ep.logprobs[span.start : span.end], call, setup)
    assert gen.sampled == ep.sampled[span.start : span.end] and gen.finish_reason == "stop"
    # A server that leaves out the (forced) stop token gets it back as a forced token.
    again = replay_generation(tokens[:-1], ep.logprobs[span.start : span.end - 1], call, setup)
    assert again.token_ids == tokens and again.sampled[-1] == 0
    # A call-close token where the grammar wants text is a server that ignored the grammar.
    with pytest.raises(GrammarMismatchError, match="not legal under the turn's grammar"):
        replay_generation([setup.rt.call_close_id], None, call, setup)


def test_the_legacy_trainer_is_refused(played):
    loop = played[0]
    with pytest.raises(ValueError, match="use_v1=True"):
        asyncio.run(loop.run({}, extra_info={"question_uid": "x", "phase": "train"}))


def test_reward_function_scores_from_records_only(played):
    _, _, outputs, _, _ = played
    out = outputs[0]
    records = out.extra_fields["records"]
    source = records[0]["source"]
    score = compute_score(source, "ignored text", "ignored truth", {"records": records})
    assert score["score"] == pytest.approx(sum(r["reward"] for r in records))
    assert score["calls"] == len(records) and score["submitted"] is True
    assert score["acc"] == records[-1]["score"]
    # The same records under verl's tool_extra_fields key; no records at all is an error.
    assert compute_score(source, "", "", {"tool_extra_fields": {"records": records}}) == score
    with pytest.raises(RecordsMissingError, match="atlas_tool_agent"):
        compute_score(source, "text", "truth", {"index": 0})
    with pytest.raises(ValueError, match="but verl says"):
        compute_score("other", "", "", {"records": records})


def test_potential_token_rewards_dtype():
    # rm_scores are float32, the dtype verl's GAE reads.
    out = AtlasAgentLoopOutput(
        prompt_ids=[1],
        response_ids=[2, 3],
        response_mask=[1, 1],
        metrics={},
        action_positions=[1],
        action_rewards=[0.5],
    )
    assert out.as_dict()["rm_scores"].dtype == torch.float32


@pytest.fixture(scope="module")
def converted(played, tiny_model, training_inputs, tmp_path_factory):
    """A run folder assembled by atlas.verl.convert from verl-shaped outputs: the played episodes
    as one training step and two validations, two metrics files, one LoRA-only verl checkpoint."""
    import shutil

    tmp_path = tmp_path_factory.mktemp("converted")
    _, _, outputs, _, tmp = played
    episodes = tmp / "records" / "train" / f"global_step_{STEP}"
    records_dir = tmp_path / "episodes"
    for where in ("train/global_step_1", "val/global_step_0", "val/global_step_1"):
        shutil.copytree(episodes, records_dir / where)
        for path in (records_dir / where).glob("*.json"):  # as the loop writes validation episodes
            body = json.loads(path.read_text())
            for r in body["records"]:
                r["phase"] = "val" if where.startswith("val") else "train"
            path.write_text(json.dumps(body))
    # Two launches: the resumed one's line for step 1 wins. verl-only metrics stay out.
    first, second = tmp_path / "metrics_0.jsonl", tmp_path / "metrics_1.jsonl"
    line = {"actor/pg_loss": 0.5, "critic/vf_loss": 0.25, "response_length/mean": 999.0, "verl/only": 1}
    first.write_text(json.dumps({"step": 1, "data": line}) + "\n")
    second.write_text(json.dumps({"step": 1, "data": {"actor/pg_loss": -0.125, "timing_s/gen": 3.0}}) + "\n")
    root = tmp_path / "checkpoints"
    # A verl-shaped LoRA-only checkpoint (one rank, plain tensors): a policy's trainable tensors
    # under verl's names (peft adapter "default"; the critic's head as `score`).
    from atlas.model.policy import ActorCritic
    from atlas.runtime.session import load_model

    trained = ActorCritic(load_model(tiny_model)[0], _cfg().training, seed=11)
    for role in ("actor", "critic"):
        state = {}
        for n, t in trained.trainable(role).items():
            verl_name = n.replace(f".{role}.", ".default.")
            if n.startswith("value_head."):
                verl_name = "base_model.model.score.modules_to_save.default." + n.split(".")[-1]
            state[verl_name] = t.detach() + 0.01  # LoRA B starts at 0: make every tensor count
        shard = root / "verl" / "checkpoints" / "global_step_1" / role / "model_world_size_1_rank_0.pt"
        shard.parent.mkdir(parents=True)
        torch.save(state, shard)

    inputs = training_inputs
    out = tmp_path / "run"
    raw = _cfg().model_dump(mode="json")  # one step, validated before and after it, dose 0.5
    raw["runs"][RUN].update(steps=1, dose=0.5)
    raw["training"]["validation_every"] = 1
    s = config_slice(parse_config(raw), "training", RUN)
    from atlas.config.training import TrainSlice
    from atlas.stages import train_verl

    expected = {"train": len(outputs), "val": len(outputs)}
    train_verl.convert_run(
        TrainSlice.model_validate(s),
        s,
        inputs,
        root,
        out,
        episodes=records_dir,
        metrics_dir=tmp_path,
        expected=expected,
    )
    return inputs, out, s, trained


def test_converter_builds_the_run_folder_from_verl_shaped_outputs(played, converted):
    import polars as pl

    _, _, outputs, _, _ = played
    _, out, _, trained = converted
    n_records = sum(len(o.extra_fields["records"]) for o in outputs)
    records = pl.read_parquet(out / "records.parquet")
    assert records.height == 3 * n_records
    assert sorted(records.filter(pl.col("phase") == "train")["step"].unique()) == [0]  # verl's step 1
    assert sorted(records.filter(pl.col("phase") == "val")["step"].unique()) == [0, 1]
    assert records["value"].null_count() == records.height  # verl keeps values to itself
    metrics = pl.read_parquet(out / "step_metrics.parquet").row(0, named=True)
    assert metrics["actor/pg_loss"] == -0.125 and metrics["critic/vf_loss"] == 0.25
    assert metrics["timing_s/gen"] == 3.0 and "verl/only" not in metrics
    generated = [sum(o.response_mask) for o in outputs]  # ours counts generated tokens, not tool output
    assert metrics["response_length/mean"] != 999.0 and metrics["response_length/mean"] >= sum(
        generated
    ) / len(generated)
    assert metrics["protocol/records"] == n_records and metrics["protocol/violations"] == 0
    calls = pl.read_parquet(out / "call_advantages.parquet")
    assert calls["count"].sum() == n_records and calls["advantage_mean"].null_count() == calls.height
    assert calls["dose"].unique().to_list() == [0.5]  # the run's dose, from its slice
    curve = pl.read_parquet(out / "validation.parquet")
    assert sorted(curve.filter(pl.col("source") == "all")["step"].to_list()) == [0, 1]
    index = json.loads((out / "adapters" / "verl_checkpoints.json").read_text())
    assert [c["global_step"] for c in index] == [1]
    assert sorted(index[0]["files"]) == [
        "actor/model_world_size_1_rank_0.pt",
        "critic/model_world_size_1_rank_0.pt",
    ]
    # The checkpoint became a policy checkpoint (checkpoints.json) and the run's adapters.
    from safetensors.torch import load_file

    (entry,) = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    assert entry["step"] == 1 and set(entry["files"]) >= {"actor.safetensors", "critic.safetensors"}
    actor = load_file(str(Path(entry["path"]) / "actor.safetensors"))
    expected = {n: t.detach() + 0.01 for n, t in trained.trainable("actor").items()}
    assert set(actor) == set(expected) and all(torch.equal(actor[n], expected[n]) for n in expected)
    head = load_file(str(out / "adapters" / "critic" / "value_head.safetensors"))
    assert torch.equal(head["value_head.weight"], trained.value_head.weight.detach() + 0.01)
    assert (out / "adapters" / "actor" / "adapter_config.json").is_file()
    assert json.loads((out / "run.json").read_text())["engine"] == "verl"
    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol["violations"] == 0 and protocol["records"] == 3 * n_records


def test_a_step_short_of_questions_x_samples_fails_with_the_reasons(played, tmp_path):
    from atlas.verl import convert
    from atlas.verl.agent_loop import write_failure

    loop, specs, outputs, _, tmp = played
    folder = tmp_path / "episodes" / "train" / "global_step_1"
    episodes = sorted((tmp / "records" / "train" / f"global_step_{STEP}").glob("*.json"))
    folder.mkdir(parents=True)
    for path in episodes[1:]:  # one episode never came back
        (folder / path.name).write_text(path.read_text())
    lost = json.loads(episodes[0].read_text())
    setup = loop.setup.__class__(**{**vars(loop.setup), "records_dir": tmp_path / "episodes"})
    row = {"extra_info": {"question_uid": lost["question_uid"], "phase": "train"}}
    write_failure(
        setup, {**row, "session_id": lost["sample"], "global_steps": 1}, GrammarMismatchError("token 7")
    )
    with pytest.raises(convert.VerlOutputError) as err:
        convert.read_episodes(folder, len(outputs))
    message = str(err.value)
    assert f"{len(outputs) - 1} episodes, expected {len(outputs)} (questions x samples); 1 failed" in message
    assert f"{lost['question_uid']} sample {lost['sample']}: GrammarMismatchError: token 7" in message
    assert len(convert.read_episodes(folder, len(outputs) - 1)) == len(outputs) - 1


def test_launcher_dry_run_prepares_a_run_verl_accepts(tiny_model, data_dir, tmp_path, capsys):
    # Everything up to verl's own process: datasets in schedule order, the agent loop's YAML and
    # settings, and overrides composed and checked by verl's loader (one GPU asked for).
    import yaml

    from atlas.stages import train_verl

    raw = load_config(REPO / "config" / "config.yaml").model_dump(mode="json")
    raw["training"]["engine"] = "verl"
    raw["resources"] = {"device": "cuda", "gpus": 1}
    s = config_slice(parse_config(raw), "training", RUN)
    root = tmp_path / "checkpoints"
    argv = ["--config-slice", json.dumps(s), "--train", str(data_dir / "train.parquet")]
    argv += ["--val", str(data_dir / "val.parquet"), "--tests", str(data_dir / "tests.parquet")]
    argv += [
        "--model",
        str(tiny_model),
        "--checkpoints",
        str(root),
        "--out",
        str(tmp_path / "run"),
        "--dry-run",
    ]
    train_verl.main(argv)

    import polars as pl

    train = pl.read_parquet(root / "verl" / "data" / "train.parquet")
    ours = pl.read_parquet(data_dir / "train.parquet").sort("step", "position")
    assert [e["question_uid"] for e in train["extra_info"].to_list()] == ours["question_uid"].to_list()
    assert set(train["agent_name"]) == {"atlas_tool_agent"}
    loop = yaml.safe_load((root / "verl" / "agent_loop.yaml").read_text())
    assert loop[0]["_target_"] == "atlas.verl.agent_loop.AtlasToolAgentLoop"
    settings = LoopSettings.model_validate_json(Path(loop[0]["settings"]).read_text())
    assert settings.run == RUN and settings.vocab_size == 2048
    overrides = (root / "verl" / "overrides.txt").read_text().splitlines()
    assert (
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={root.resolve() / 'verl' / 'agent_loop.yaml'}"
        in overrides
    )
    assert "python" in capsys.readouterr().out and not (tmp_path / "run").exists()
    # What verl's agent-loop worker does: the YAML fills its registry, and the first episode's
    # instantiation imports this module; the entry must still name the settings afterwards.
    probe = (
        "import sys, hydra; from omegaconf import OmegaConf; "
        "from verl.experimental.agent_loop import agent_loop as al; "
        "[al._agent_loop_registry.__setitem__(c.name, c) for c in OmegaConf.load(sys.argv[1])]; "
        "hydra.utils.get_class(al._agent_loop_registry['atlas_tool_agent']['_target_']); "
        "print(al._agent_loop_registry['atlas_tool_agent'].get('settings'))"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", probe, str(root / "verl" / "agent_loop.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == loop[0]["settings"]


def test_the_checks_stage_reads_a_verl_run(converted, tmp_path):
    """The distributed roundtrip (torchrun, two gloo ranks) and the checks stage on the converted
    run: verl's shards hash-checked, the policy checkpoints round-tripped, no resumed step (verl
    resumes from its own checkpoints), the batch arithmetic from the records."""
    import subprocess
    import sys

    from atlas.checks.compact import CheckFailed
    from atlas.stages import checks as checks_stage

    inputs, run_folder, s, _ = converted
    # the launcher's slice: engine verl, and the one step the converted run has
    s = {**s, "training": {**s["training"], "engine": "verl", "run": {**s["training"]["run"], "steps": 1}}}
    distributed = tmp_path / "distributed"
    subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
            *(
                "-m",
                "atlas.stages.distributed_roundtrip",
                "--config-slice",
                json.dumps(config_slice(_cfg(), "distributed_roundtrip")),
                "--model",
                str(inputs.model),
                "--run-folder",
                str(run_folder),
            ),
            *("--out", str(distributed)),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )

    def checks(config: dict, out: Path) -> None:
        checks_stage.main(
            [
                *("--config-slice", json.dumps(config), "--train", str(inputs.train)),
                *("--val", str(inputs.val), "--tests", str(inputs.tests), "--model", str(inputs.model)),
                *("--checkpoints", str(tmp_path / "unused"), "--run-folder", str(run_folder)),
                *("--distributed", str(distributed), "--out", str(out)),
            ]
        )

    local = {**s, "training": {**s["training"], "engine": "local"}}
    with pytest.raises(CheckFailed, match="run.json: a verl run; the config's training.engine is local"):
        checks(local, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "checks"
    checks(s, out)
    validation = json.loads((out / "checkpoint_validation.json").read_text())
    assert validation["engine"] == "verl" and "optimizer_counts" not in validation
    (shards,) = validation["verl_checkpoint_shards"]
    assert shards["step"] == 1 and shards["shards"] == {"actor": {"model": 1}, "critic": {"model": 1}}
    assert validation["exported_actor_logprob_max_abs_diff"] == 0.0
    (roundtrip,) = json.loads((out / "cpu_roundtrip.json").read_text())["checkpoints"]
    assert roundtrip["step"] == 1 and roundtrip["next_step_metrics_equal"] is None
    # probe_logprobs_equal is written once policy_roundtrip passed; its failing paths (changed
    # probes, rounded or non-finite tensors) are in tests/unit/test_check_failures.py.
    assert roundtrip["tensors_bit_equal"] > 10
    rows = json.loads((out / "compact_checkpoint_validation.json").read_text())["rows"]
    assert {(r["step"], r["role"]) for r in rows} == {(1, "actor"), (1, "critic")}
    (batch,) = json.loads((out / "batch_math.json").read_text())["steps"]
    assert batch["trajectories"] == batch["questions"] * batch["responses_per_question"]
    assert sorted(p.name for p in out.glob("distributed_roundtrip_rank_*.json")) == [
        "distributed_roundtrip_rank_0.json",
        "distributed_roundtrip_rank_1.json",
    ]


def test_the_checks_stage_refuses_a_changed_verl_shard(converted, tmp_path):
    from atlas.checks.compact import CheckFailed, verl_checkpoint_shards

    _, run_folder, _, _ = converted
    index = json.loads((run_folder / "adapters" / "verl_checkpoints.json").read_text())
    assert verl_checkpoint_shards(index)[0]["shards"]["critic"] == {"model": 1}
    index[0]["files"]["critic/model_world_size_1_rank_0.pt"]["sha256"] = "0" * 64
    with pytest.raises(CheckFailed, match="critic/model_world_size_1_rank_0.pt: sha256"):
        verl_checkpoint_shards(index)
    del index[0]["files"]["critic/model_world_size_1_rank_0.pt"]
    with pytest.raises(CheckFailed, match="critic: no model shard"):
        verl_checkpoint_shards(index)
