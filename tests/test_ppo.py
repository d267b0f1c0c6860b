"""PPO through the real runtime: the learning test (the gradient has the right sign)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config import GraderConfig, PPOConfig, RuntimeConfig, TrainingConfig
from atlas.model.policy import ActorCritic
from atlas.rl.potentials import make_potential
from atlas.rl.ppo import make_batch, ppo_update
from atlas.rl.replay import replay_masks
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
    for i in range(3)
]


@pytest.mark.slow
def test_mean_reward_rises_within_six_cpu_steps(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    training = TrainingConfig(responses_per_question=4, lora_rank=8, lora_alpha=16)
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), training, seed=0)
    base_before = {n: p.detach().clone() for n, p in ac.base_parameters()}
    rt = make_runtime(ac.peft, tok, RUNTIME)
    opts = {
        "actor": torch.optim.AdamW(list(ac.trainable("actor").values()), lr=3e-3),
        "critic": torch.optim.AdamW(list(ac.trainable("critic").values()), lr=1e-2),
    }
    zero = make_potential("zero")
    means, gaps = [], []
    for step in range(6):
        specs = [EpisodeSpec(q, [], k) for q in QUESTIONS for k in range(4)]
        episodes = run_episodes(
            rt, specs, RUNTIME, GraderConfig(), run="learn", step=step, phase="train", seed=0
        )
        means.append(sum(ep.score for ep in episodes) / len(episodes))
        rewards = [shape_episode(ep, zero, gamma=1.0, dose=0.0).token_rewards for ep in episodes]
        batch = make_batch(episodes, rewards, [replay_masks(ep, rt) for ep in episodes], tok.pad_token_id)
        metrics = ppo_update(ac, batch, opts, PPOConfig(micro_batch_size=12, kl_mode="none"))
        gaps.append(metrics["rollout/logprob_gap_max"])
    assert means[0] <= 0.5, means  # a random policy picks A about a quarter of the time
    assert sum(means[-2:]) / 2 >= 0.75, means
    assert max(gaps) < 1e-4, gaps  # old log-probs under replayed masks = rollout log-probs
    assert all(torch.equal(p, base_before[n]) for n, p in ac.base_parameters())  # base never moves
