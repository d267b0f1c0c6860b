"""Actor and critic LoRA on one base: who trains what, what never moves, and the reference."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from atlas.config.training import TrainingConfig
from atlas.model.policy import ActorCritic

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)


@pytest.fixture
def ac(tiny_model):
    return ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)


def ids():
    return torch.tensor([[1, 50, 60, 70, 80, 90, 2]])


def step(params, loss):
    opt = torch.optim.AdamW(params, lr=1e-2)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_fresh_adapters_leave_the_base_function_unchanged(ac, tiny_model):
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        expected = base(input_ids=ids()).logits
        assert torch.equal(ac.actor_logits(ids()), expected)  # LoRA B starts at zero
        assert torch.equal(ac.reference_logits(ids()), expected)


def test_trainable_sets_are_disjoint_and_hold_no_base_weight(ac):
    actor, critic = ac.trainable("actor"), ac.trainable("critic")
    assert actor and critic and not set(actor) & set(critic)
    assert all("lora_" in n and ".actor." in n for n in actor)
    assert {"value_head.weight", "value_head.bias"} <= set(critic)
    base_ids = {id(p) for _, p in ac.base_parameters()}
    assert not base_ids & {id(p) for p in [*actor.values(), *critic.values()]}
    # 2 decoder layers x 7 linear modules x (A, B)
    assert len(actor) == 2 * 7 * 2
    # Listing a role's tensors or reading values must not switch adapters: the next rollout
    # samples whatever is active, and that must be the actor.
    assert ac.peft.active_adapter == "actor"
    ac.values(torch.tensor([[1, 2, 3]]))
    assert ac.peft.active_adapter == "actor"
    with ac.role("critic"):
        ac.values(torch.tensor([[1, 2, 3]]))
        assert ac.peft.active_adapter == "critic"  # nested: the outer role is restored
    assert ac.peft.active_adapter == "actor"


def test_actor_step_moves_only_the_actor_and_never_the_base(ac):
    base_before = {n: p.detach().clone() for n, p in ac.base_parameters()}
    critic_before = {n: p.detach().clone() for n, p in ac.trainable("critic").items()}
    actor = ac.trainable("actor")
    step(
        list(actor.values()),
        ac.actor_logits(ids())[0, :-1].log_softmax(-1)[range(6), ids()[0, 1:]].mean().neg(),
    )
    assert any(p.abs().sum() > 0 for n, p in actor.items() if "lora_B" in n)
    assert all(torch.equal(p, base_before[n]) for n, p in ac.base_parameters())
    assert all(torch.equal(p, critic_before[n]) for n, p in ac.trainable("critic").items())
    # The reference is still the base: adapters disabled.
    with torch.no_grad():
        assert not torch.equal(ac.actor_logits(ids()), ac.reference_logits(ids()))


def test_critic_step_moves_only_the_critic_and_head(ac):
    actor_before = {n: p.detach().clone() for n, p in ac.trainable("actor").items()}
    critic = ac.trainable("critic")
    head_before = critic["value_head.weight"].detach().clone()
    for _ in range(2):  # the first step only moves B and the head (B starts at zero)
        step(list(ac.trainable("critic").values()), (ac.values(ids()) - 1.0).pow(2).mean())
    assert not torch.equal(critic["value_head.weight"], head_before)
    assert all(torch.equal(p, actor_before[n]) for n, p in ac.trainable("actor").items())
    values = ac.values(ids())
    assert values.shape == (1, 7) and torch.isfinite(values).all()


def test_exported_actor_adapter_loads_with_peft(ac, tiny_model, tmp_path):
    actor = ac.trainable("actor")
    step(list(actor.values()), ac.actor_logits(ids()).pow(2).mean())
    ac.peft.save_pretrained(tmp_path / "export", selected_adapters=["actor"])
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "export" / "actor"
    )
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids()).logits, ac.actor_logits(ids()), atol=1e-6)


def test_a_frozen_critic_head_is_made_where_the_value_head_lives(ac):
    # On a GPU the policy is on cuda and the snapshot's tensors come from the CPU; the frozen head
    # follows the value head (a meta device stands in for a GPU here: no data, only placement).
    snapshot = {n: p.detach().clone() + 0.5 for n, p in ac.trainable("critic").items()}
    ac.add_frozen_critic("snap", snapshot)
    head = ac.frozen_heads["snap"]
    assert head.weight.dtype == torch.float32 and not head.weight.requires_grad
    assert torch.equal(head.weight, snapshot["value_head.weight"])  # the snapshot's head, not a new one
    ac.value_head.to("meta")
    ac.add_frozen_critic("snap2", snapshot)
    assert ac.frozen_heads["snap2"].weight.device.type == "meta"
