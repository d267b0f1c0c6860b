"""Our agent loop's output through verl 0.9.1's own V1 path on CPU: the TransferQueue post-process
(`AgentLoopWorkerTQ._agent_loop_postprocess`, which tags each sample with min/max_global_steps) and
the trainer's step metrics (`PPOTrainer._compute_metrics`, which reads those tags as integers).

A real TransferQueue on a local Ray cluster holds the samples, as in a verl run; the trainer's
GAE fields are filled by verl's own compute_gae_advantage_return. Runs in the verl venv (CI).
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
if not os.environ.get("ATLAS_REQUIRE_VERL"):
    pytest.importorskip("transfer_queue", reason="TransferQueue comes with the verl environment")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from test_verl_agent_loop import STEP, _cfg, _loop, _play  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402

from atlas.runtime.inputs import read_questions  # noqa: E402
from atlas.verl.agent_loop import weight_versions  # noqa: E402


@pytest.fixture(scope="module")
def queue():
    """A local Ray cluster with verl's TransferQueue (controller + storage) on it. Each of its
    actors holds a CPU slot, so the cluster must offer more than one or the second never starts."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="atlas_test")
    try:
        tq.init()
        yield tq
    finally:
        tq.close()
        ray.shutdown()


WORKER = AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class under @ray.remote


def _worker() -> SimpleNamespace:
    """verl's AgentLoopWorkerTQ methods on the attributes its post-process reads: no reward loop
    (our loop scores), no teacher, no multi-modal processor."""
    w = SimpleNamespace(processor=None, reward_loop_worker_handles=None, distillation_enabled=False)
    for name in (
        "_compute_score",
        "_compute_teacher_logprobs",
        "_compute_multi_modal_inputs",
        "_compute_position_ids",
    ):
        setattr(w, name, getattr(WORKER, name).__get__(w))
    return w


def test_weight_versions_keep_the_servers_and_fall_back_to_the_step():
    assert weight_versions([{"min_global_steps": 4, "max_global_steps": 4}, {"max_global_steps": 5}], 9) == {
        "min_global_steps": 4,
        "max_global_steps": 5,
    }
    assert weight_versions([{}, {"global_steps": None}], 3) == {"min_global_steps": 3, "max_global_steps": 3}


def test_verls_v1_postprocess_and_step_metrics_read_our_output(queue, tmp_path, tiny_model, data_dir):
    loop, _ = _loop(tmp_path, tiny_model, data_dir, _cfg())
    uid = read_questions(data_dir / "train.parquet")[0]["question_uid"]
    worker = _worker()
    keys = []
    for sample in range(2):
        out = _play(loop, uid, sample)
        kwargs = {"uid": uid, "session_id": sample, "global_steps": STEP, "index": 0}
        asyncio.run(WORKER._agent_loop_postprocess(worker, out, validate=False, **kwargs))
        keys.append(f"{uid}_{sample}_0")
    listed = tq.kv_list(partition_id="train")["train"]
    tags = [listed[k] for k in keys]
    # the tags verl's staleness control and metrics read: our loop's weight versions
    assert [(t["min_global_steps"], t["max_global_steps"]) for t in tags] == [(STEP, STEP)] * 2
    assert all(t["status"] == "success" and t["global_steps"] == STEP for t in tags)

    # the trainer's GAE fields, as verl's trainer writes them before its metrics
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores", "response_mask"])
    padded = data.to_padded_tensor()
    values = torch.zeros_like(padded["rm_scores"])
    adv, ret = core_algos.compute_gae_advantage_return(
        padded["rm_scores"], values, padded["response_mask"].float(), gamma=1.0, lam=1.0
    )
    lengths = [int(n) for n in data["response_mask"].offsets().diff()]
    nested = {
        name: torch.nested.as_nested_tensor([t[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)
        for name, t in {
            "values": values,
            "advantages": adv,
            "returns": ret,
            "token_level_rewards": padded["rm_scores"],
        }.items()
    }
    tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict(nested, batch_size=[len(keys)]))

    trainer = SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"rollout": {}, "model": {}}}),
        _rollout_moe_lb_metrics_accumulator=RolloutMoELoadBalanceMetricsAccumulator(),
        use_critic=True,
        _get_n_gpus_for_throughput=lambda: 1,
    )
    metrics: dict = {}
    batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
    PPOTrainer._compute_metrics(
        trainer, batch, metrics, {"step": 1.0, "gen": 0.5}, global_steps=STEP + 1, epoch=0
    )
    assert metrics["training/global_step"] == STEP + 1
    assert metrics["training/off_policy/trajectory_spans/max"] == 1
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 0
    assert metrics["critic/score/mean"] == pytest.approx(float(padded["rm_scores"].sum(-1).mean()))
