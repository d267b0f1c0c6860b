"""PPO through the real runtime: the learning test (the gradient has the right sign)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.config.training import PPOConfig, TrainingConfig
from atlas.model.policy import ActorCritic
from atlas.rl.potentials import make_potential
from atlas.rl.ppo import Batch, lr_factor, make_batch, make_optimizers, ppo_update, prepare
from atlas.rl.replay import ReplayedMasks, replay_masks
from atlas.rl.rewards import shape_episode
from atlas.runtime.episode import EpisodeSpec, run_episodes
from atlas.runtime.session import make_runtime

# A toy task through the real runtime: one submit per episode; "A" is always right.
RUNTIME = RuntimeConfig(
    max_turns=1, max_text_tokens=2, max_code_run=8, max_code_escapes=0, max_generation_tokens=64
)
QUESTIONS = [
    {
        "question_uid": f"toy:{i}",
        "source": "gpqa",
        "question": f"Toy question {i}: pick the first option.",
        "options": ["yes", "no", "maybe", "never"],
        "correct_letter": "A",
    }
    for i in range(2)
]


def test_mean_reward_rises_within_seven_cpu_steps(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    samples = 8
    training = TrainingConfig(responses_per_question=samples, lora_rank=8, lora_alpha=16)
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), training, seed=0)
    base_before = {n: p.detach().clone() for n, p in ac.base_parameters()}
    rt = make_runtime(ac.peft, tok, RUNTIME)
    ppo = PPOConfig(actor_lr=1e-2, critic_lr=1e-2, micro_batch_size=12, kl_mode="none")
    opts = make_optimizers(ac, ppo)
    zero = make_potential("zero")
    means, gaps = [], []
    for step in range(7):
        specs = [EpisodeSpec(q, [], k) for q in QUESTIONS for k in range(samples)]
        episodes = run_episodes(
            rt, specs, RUNTIME, GraderConfig(), run="learn", step=step, phase="train", seed=0
        )
        means.append(sum(ep.score for ep in episodes) / len(episodes))
        rewards = [shape_episode(ep, zero, gamma=1.0, dose=0.0).token_rewards for ep in episodes]
        batch = make_batch(episodes, rewards, [replay_masks(ep, rt) for ep in episodes], tok.pad_token_id)
        metrics = ppo_update(ac, batch, opts, ppo)
        gaps.append(metrics["rollout/logprob_gap_max"])
    assert means[0] <= 0.5, means  # a random policy picks A about a quarter of the time
    assert sum(means[-3:]) / 3 >= 0.65, means  # seen: 0.25 0.38 0.38 0.44 0.75 0.75 0.81
    assert max(gaps) < 1e-4, gaps  # old log-probs under replayed masks = rollout log-probs
    assert all(torch.equal(p, base_before[n]) for n, p in ac.base_parameters())  # base never moves


def test_lr_schedule_warms_up_then_holds_or_decays():
    const = lr_factor(PPOConfig(warmup_steps=3), total_updates=10)
    assert [const(k) for k in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cos = lr_factor(PPOConfig(lr_schedule="cosine", min_lr_ratio=0.1), total_updates=4)
    # progress k/4: 0.1 + 0.9 * (1 + cos(pi k / 4)) / 2
    assert [cos(k) for k in range(5)] == pytest.approx([1.0, 0.8681980515, 0.55, 0.2318019485, 0.1])


def _synthetic_batch(vocab: int, rows: int = 3, length: int = 12) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    sampled = torch.zeros(rows, length)
    sampled[:, 6:] = 1.0
    rewards = torch.zeros(rows, length)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.5])
    words = -(-vocab // 32)
    masks = [
        ReplayedMasks(torch.arange(6, length), torch.full((length - 6, words), -1, dtype=torch.int32))
        for _ in range(rows)
    ]
    return Batch(ids, torch.ones_like(ids), sampled, torch.zeros(rows, length), rewards, masks)


def test_kl_in_reward_charges_every_sampled_token_and_kl_as_loss_does_not(tiny_model):
    ac = ActorCritic(
        AutoModelForCausalLM.from_pretrained(tiny_model), TrainingConfig(responses_per_question=1)
    )
    with torch.no_grad():  # move the actor off the reference (LoRA B starts at zero)
        for name, p in ac.trainable("actor").items():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    batch = _synthetic_batch(ac.peft.base_model.model.config.vocab_size)
    reward = prepare(ac, batch, PPOConfig(kl_mode="reward", kl_kind="k1", kl_coef=0.5), 1.0)
    kl = (reward.old_logprobs - reward.ref_logprobs) * batch.sampled  # k1 = log-ratio
    assert kl.abs().sum() > 0
    assert torch.allclose(reward.rewards, batch.rewards - 0.5 * kl)
    assert reward.metrics["actor/reward_kl_penalty"] == pytest.approx((kl.sum() / batch.sampled.sum()).item())

    loss = prepare(ac, batch, PPOConfig(kl_mode="loss", kl_coef=0.5), 1.0)
    assert torch.equal(loss.rewards, batch.rewards)
    assert torch.equal(loss.ref_logprobs, reward.ref_logprobs)
    none = prepare(ac, batch, PPOConfig(kl_mode="none"), 1.0)
    assert not none.ref_logprobs.any()  # the reference pass is skipped


def test_one_update_moves_every_actor_and_critic_tensor(tiny_model):
    ac = ActorCritic(
        AutoModelForCausalLM.from_pretrained(tiny_model), TrainingConfig(responses_per_question=1)
    )
    before = {
        role: {n: p.detach().clone() for n, p in ac.trainable(role).items()} for role in ("actor", "critic")
    }
    opts = make_optimizers(ac, PPOConfig(actor_lr=1e-3, critic_lr=1e-3))
    ppo_update(
        ac, _synthetic_batch(ac.peft.base_model.model.config.vocab_size), opts, PPOConfig(kl_mode="none")
    )
    for role in ("actor", "critic"):
        params = ac.trainable(role)
        # AdamW holds state for every tensor: each one got a gradient (LoRA A's is zero while B is).
        assert len(opts[role].state) == len(params), role
        lora_b = [n for n in params if "lora_B" in n]
        assert lora_b and all(not torch.equal(params[n], before[role][n]) for n in lora_b), role
