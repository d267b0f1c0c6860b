"""Log-probs recomputed under replayed grammar masks match what the rollout sampled with."""

import pytest
import torch

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.rl.replay import masked_logprobs, replay_masks
from atlas.runtime.episode import EpisodeSpec, run_episodes
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.session import load_runtime

RUNTIME = RuntimeConfig(
    max_turns=2,
    max_text_tokens=12,
    max_code_run=12,
    max_code_escapes=1,
    max_generation_tokens=256,
    temperature=0.7,
)


@pytest.fixture(scope="module")
def rollout(tiny_model, data_dir):
    rt = load_runtime(tiny_model, RUNTIME)
    questions, tests = read_questions(data_dir / "val.parquet"), read_tests(data_dir / "tests.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][:2] + [
        q for q in questions if q["source"] == "lcb"
    ][:2]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), 0) for q in picked]
    return rt, run_episodes(
        rt, specs, RUNTIME, GraderConfig(test_timeout_s=2.0), run="t", step=0, phase="val", seed=3
    )


def recompute(rt, ep, masks, use_masks=True):
    with torch.no_grad():
        logits = rt.model(input_ids=torch.tensor([ep.token_ids])).logits[0, :, : rt.engine.vocab_size]
    before = logits[masks.positions - 1]
    targets = torch.tensor(ep.token_ids)[masks.positions]
    if use_masks:
        return masked_logprobs(before, targets, masks.bitmask, RUNTIME.temperature)
    return torch.log_softmax(before / RUNTIME.temperature, -1).gather(-1, targets.view(-1, 1)).squeeze(-1)


def test_replayed_masks_cover_every_generated_token(rollout):
    rt, episodes = rollout
    for ep in episodes:
        masks = replay_masks(ep, rt)
        generated = [t for span in ep.generations for t in range(span.start, span.end)]
        assert masks.positions.tolist() == generated
        assert masks.bitmask.shape == (len(generated), (rt.engine.vocab_size + 31) // 32)


def test_recomputed_logprobs_match_the_rollout(rollout):
    rt, episodes = rollout
    gaps = []
    for ep in episodes:
        masks = replay_masks(ep, rt)
        lp = recompute(rt, ep, masks)
        sampled = torch.tensor(ep.sampled)[masks.positions].bool()
        rollout_lp = torch.tensor(ep.logprobs)[masks.positions]
        gaps.append((lp[sampled] - rollout_lp[sampled]).abs().max().item())
        # A forced token is the only legal one: its masked log-prob is exactly 0.
        assert torch.all(lp[~sampled] == 0.0)
    assert max(gaps) < 1e-4, gaps


def test_unmasked_logprobs_would_not_match(rollout):
    """Without the masks the ratio is off from the start: the test that the masks matter."""
    rt, episodes = rollout
    ep = episodes[0]
    masks = replay_masks(ep, rt)
    sampled = torch.tensor(ep.sampled)[masks.positions].bool()
    raw = recompute(rt, ep, masks, use_masks=False)[sampled]
    rollout_lp = torch.tensor(ep.logprobs)[masks.positions][sampled]
    assert (raw - rollout_lp).abs().max().item() > 0.1


def test_masked_logprobs_are_differentiable(rollout):
    rt, episodes = rollout
    ep = episodes[0]
    masks = replay_masks(ep, rt)
    logits = rt.model(input_ids=torch.tensor([ep.token_ids])).logits[0, :, : rt.engine.vocab_size]
    lp = masked_logprobs(
        logits[masks.positions - 1], torch.tensor(ep.token_ids)[masks.positions], masks.bitmask, 0.7
    )
    sampled = torch.tensor(ep.sampled)[masks.positions].bool()
    lp[sampled].sum().backward()
    grads = [p.grad for p in rt.model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    rt.model.zero_grad(set_to_none=True)


def test_a_token_the_grammar_forbids_is_refused(rollout):
    rt, episodes = rollout
    ep = episodes[0]
    span = ep.generations[0]
    tampered = type(ep)(**{**ep.__dict__, "token_ids": list(ep.token_ids)})
    tampered.token_ids[span.end - 2] = rt.call_open_id  # a second call-open inside the call
    with pytest.raises(ValueError, match="is not legal under the grammar it was sampled with"):
        replay_masks(tampered, rt)


def test_the_refusal_names_the_question_sample_and_position(rollout):
    rt, episodes = rollout
    ep = episodes[0]
    span = ep.generations[0]
    tampered = type(ep)(**{**ep.__dict__, "token_ids": list(ep.token_ids)})
    tampered.token_ids[span.end - 2] = rt.call_open_id
    with pytest.raises(ValueError) as err:
        replay_masks(tampered, rt)
    assert str(err.value) == (
        f"{ep.question['question_uid']} sample {ep.sample}: token {rt.call_open_id} at position "
        f"{span.end - 2} is not legal under the grammar it was sampled with"
    )


def test_an_episode_without_generations_has_no_masks(rollout):
    rt, episodes = rollout
    empty = type(episodes[0])(**{**episodes[0].__dict__, "generations": []})
    masks = replay_masks(empty, rt)
    assert masks.positions.tolist() == [] and masks.positions.dtype == torch.long
    assert masks.bitmask.numel() == 0
