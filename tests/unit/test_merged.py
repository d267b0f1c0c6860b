"""Rollouts from merged weights: the plain model with the actor's LoRA folded in computes the
adapter path's function, shares the base's constant tensors, and never writes the base."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from atlas.config.training import TrainingConfig
from atlas.model.merged import MergedModel
from atlas.model.policy import ActorCritic

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)


@pytest.fixture
def ac(tiny_model):
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)
    with torch.no_grad():  # B starts at zero: give both adapters a real product to fold in
        g = torch.Generator().manual_seed(1)
        for name, p in ac.peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return ac


def random_ids(seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (2, 11), generator=g)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_merged_forward_is_the_adapter_forward_and_the_base_is_unchanged(ac):
    base = {n: p.detach().clone() for n, p in ac.base_parameters()}
    merged = MergedModel(ac.peft, "actor")
    vocab = ac.peft.config.vocab_size
    ids = random_ids(0, vocab)
    with torch.no_grad():
        adapter = ac.actor_logits(ids)
        folded = merged.model(input_ids=ids).logits
        reference = ac.reference_logits(ids)
    assert rel(folded, adapter) < 1e-5  # float32 on a CPU: rounding only
    assert rel(reference, adapter) > 1e-3  # the adapter does move the function
    assert all(torch.equal(p, base[n]) for n, p in ac.base_parameters())
    # Constant tensors are the base's own, not copies; adapted weights are the merged model's.
    inner = ac.peft.get_base_model()
    assert merged.model.model.embed_tokens.weight.data_ptr() == inner.model.embed_tokens.weight.data_ptr()
    q = merged.model.model.layers[0].self_attn.q_proj.weight
    assert q.data_ptr() != inner.model.layers[0].self_attn.q_proj.base_layer.weight.data_ptr()
    assert not any(p.requires_grad for p in merged.model.parameters())


def test_refresh_follows_an_update_in_place(ac):
    merged = MergedModel(ac.peft, "actor")
    q = merged.model.model.layers[0].self_attn.q_proj.weight
    ptr, before = q.data_ptr(), q.detach().clone()
    opt = torch.optim.SGD(list(ac.trainable("actor").values()), lr=0.5)
    ids = random_ids(1, ac.peft.config.vocab_size)
    ac.actor_logits(ids).logsumexp(-1).mean().backward()
    opt.step()
    merged.refresh()
    assert q.data_ptr() == ptr  # same storage: a captured CUDA graph reads the new weights
    assert not torch.equal(q, before)
    with torch.no_grad():
        assert rel(merged.model(input_ids=ids).logits, ac.actor_logits(ids)) < 1e-5


def test_an_unknown_adapter_is_named(ac):
    with pytest.raises(ValueError, match="no LoRA adapter 'policy'"):
        MergedModel(ac.peft, "policy")


@pytest.mark.parametrize("setting", [True, False, "auto"])
def test_rollouts_sample_from_the_copy_the_config_names(ac, tiny_model, setting):
    """rollout_runtime, the one choice of the trainer and the dose step: the merged copy when
    training.merged_rollouts says so (auto: on a GPU only), else the adapters."""
    from transformers import AutoTokenizer

    from atlas.config.runtime import RuntimeConfig
    from atlas.rl.serving import rollout_runtime

    training = TRAINING.model_copy(update={"merged_rollouts": setting})
    rt, merged = rollout_runtime(
        ac, AutoTokenizer.from_pretrained(tiny_model), training, RuntimeConfig(), "cpu"
    )
    if setting is True:
        assert isinstance(merged, MergedModel) and rt.engine.model is merged.model
    else:
        assert merged is None and rt.engine.model is ac.peft
