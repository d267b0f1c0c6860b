"""The packed attention's CUDA kernel (varlen FlashAttention-2) against a float32 reference that
attends row by row. Skips without CUDA (CI has none); `scripts/offline_node.sh run tests` runs it on a GPU node."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas.rl.packing import varlen_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_varlen_flash_attention_matches_a_float32_reference_values_and_gradients():
    torch.manual_seed(0)
    lengths, hq, hkv, d = [300, 1, 517, 64], 8, 2, 128
    n = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn((1, h, n, d), device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    grad = torch.randn((1, n, hq, d), device="cuda", dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = varlen_attention(
        None, *leaves, None, scaling=d**-0.5, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    out.backward(grad)

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    rows = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (x[0, :, a:b] for x in ref_leaves)
        rows.append(
            F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=d**-0.5, enable_gqa=True)
        )
    ref = torch.cat(rows, dim=1).transpose(0, 1).unsqueeze(0)
    ref.backward(grad.double())

    def rel(x, y):
        return ((x.double() - y).norm() / y.norm()).item()

    assert rel(out, ref) < 1e-2  # bf16 operands: ~3e-3 expected
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert rel(got.grad, want.grad) < 2e-2
    assert torch.isfinite(out).all()


def test_ppo_update_on_cuda_packed_by_default_and_close_to_the_padded_path():
    """atlas.rl.ppo on a bf16 model on the GPU: remove_padding auto takes the packed path (varlen
    FlashAttention-2, chunked head, fused LoRA), with gradient checkpointing; its log-probs, values
    and losses stay within bf16 rounding of the padded path's, and the update moves the adapters."""
    from atlas.config.training import PPOConfig, TrainingConfig
    from atlas.model.policy import ActorCritic
    from atlas.rl.ppo import Batch, Passes, prepare, update
    from atlas.rl.replay import ReplayedMasks
    from unit.test_packing import _ppo_batch, tiny_lm

    cpu = _ppo_batch(seed=11)
    batch = Batch(
        *(t.cuda() for t in (cpu.input_ids, cpu.attention, cpu.sampled, cpu.rollout_logprobs, cpu.rewards)),
        [ReplayedMasks(m.positions, m.bitmask.cuda()) for m in cpu.masks],
    )
    results = {}
    for mode in ("padded", "auto"):
        ac = ActorCritic(
            tiny_lm().to(torch.bfloat16), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
        ).cuda()
        with torch.no_grad():
            for p in ac.trainable("actor").values():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)).cuda())
        ppo = PPOConfig(
            kl_mode="loss",
            kl_coef=0.1,
            entropy_coef=0.01,
            micro_batch_size=3,
            remove_padding=False if mode == "padded" else "auto",
        )
        assert Passes.for_batch(ac, batch, ppo, 0.9).packed is (mode == "auto")
        if mode == "auto":
            ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        before = {n: p.detach().clone() for n, p in ac.trainable("actor").items()}
        opts = {r: torch.optim.SGD(list(ac.trainable(r).values()), lr=0.5) for r in ("actor", "critic")}
        prep = prepare(ac, batch, ppo, temperature=0.9)
        metrics = update(ac, batch, prep, opts, None, ppo, temperature=0.9)
        moved = max((p.detach() - before[n]).abs().max().item() for n, p in ac.trainable("actor").items())
        results[mode] = (prep, metrics, moved)

    (plain, plain_m, plain_moved), (fused, fused_m, fused_moved) = results["padded"], results["auto"]
    on = batch.sampled.bool()
    for key in ("old_logprobs", "ref_logprobs", "values"):
        a, b = getattr(plain, key)[on], getattr(fused, key)[on]
        assert torch.isfinite(b).all(), key
        assert (a - b).abs().max() < 0.1 and (a - b).abs().mean() < 0.02, key  # bf16 logits: ~1e-2
    for key in ("actor/pg_loss", "actor/entropy", "critic/vf_loss"):
        assert abs(fused_m[key] - plain_m[key]) < 0.05 * max(1.0, abs(plain_m[key])), key
    assert plain_moved > 1e-4 and fused_moved > 1e-4


def test_liger_kernels_leave_the_update_within_bf16_of_the_plain_packed_path():
    """training.ppo.liger: Liger's RMSNorm and SwiGLU in the policy's layers and its RoPE inside
    the update give the packed path's log-probs and losses within bf16 rounding; the module-level
    Qwen3 classes and RoPE are transformers' own again afterwards (rollouts trace those)."""
    pytest.importorskip("liger_kernel")
    from transformers.models.qwen3 import modeling_qwen3

    from atlas.config.training import PPOConfig, TrainingConfig
    from atlas.model.liger import applied, apply_liger
    from atlas.model.policy import ActorCritic
    from atlas.rl.ppo import Batch, prepare, update
    from atlas.rl.replay import ReplayedMasks
    from unit.test_packing import _ppo_batch, tiny_lm

    cpu = _ppo_batch(seed=11)
    batch = Batch(
        *(t.cuda() for t in (cpu.input_ids, cpu.attention, cpu.sampled, cpu.rollout_logprobs, cpu.rewards)),
        [ReplayedMasks(m.positions, m.bitmask.cuda()) for m in cpu.masks],
    )
    kept = (modeling_qwen3.Qwen3RMSNorm, modeling_qwen3.Qwen3MLP, modeling_qwen3.apply_rotary_pos_emb)
    results = {}
    for liger in (False, True):
        ac = ActorCritic(
            tiny_lm().to(torch.bfloat16), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
        ).cuda()
        if liger:
            apply_liger(ac.peft)
            assert applied(ac.peft)
            layer = ac.peft.get_base_model().model.layers[0]
            assert "forward" in vars(layer.input_layernorm) and "forward" in vars(
                layer.mlp
            )  # this instance's
        ppo = PPOConfig(kl_mode="loss", kl_coef=0.1, micro_batch_size=3, liger=liger)
        opts = {r: torch.optim.SGD(list(ac.trainable(r).values()), lr=0.5) for r in ("actor", "critic")}
        prep = prepare(ac, batch, ppo, temperature=0.9)
        results[liger] = (prep, update(ac, batch, prep, opts, None, ppo, temperature=0.9))
    assert (modeling_qwen3.Qwen3RMSNorm, modeling_qwen3.Qwen3MLP, modeling_qwen3.apply_rotary_pos_emb) == kept
    on = batch.sampled.bool()
    for key in ("old_logprobs", "values"):
        a, b = getattr(results[False][0], key)[on], getattr(results[True][0], key)[on]
        assert torch.isfinite(b).all() and (a - b).abs().max() < 0.1, key
    for key in ("actor/pg_loss", "critic/vf_loss"):
        assert abs(results[True][1][key] - results[False][1][key]) < 0.05 * max(
            1.0, abs(results[False][1][key])
        )


def test_merged_rollout_model_matches_the_adapter_path_in_bf16():
    """atlas.model.merged on the GPU in bf16: the folded weights give the adapter path's
    log-probs within bf16 rounding, and the base stays bit-identical."""
    from atlas.config.training import TrainingConfig
    from atlas.model.merged import MergedModel
    from atlas.model.policy import ActorCritic
    from unit.test_packing import tiny_lm

    ac = ActorCritic(
        tiny_lm().to(torch.bfloat16), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
    ).cuda()
    with torch.no_grad():
        for n, p in ac.trainable("actor").items():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    base = {n: p.detach().clone() for n, p in ac.base_parameters()}
    merged = MergedModel(ac.peft, "actor")
    ids = torch.randint(1, 300, (3, 20), device="cuda")
    with torch.no_grad():
        a = ac.actor_logits(ids).float().log_softmax(-1)
        b = merged.model(input_ids=ids).logits.float().log_softmax(-1)
        r = ac.reference_logits(ids).float().log_softmax(-1)
    assert (a - b).abs().max() < 0.1 and (a - b).abs().mean() < 0.01
    assert (a - r).abs().mean() > 5 * (a - b).abs().mean()  # the adapter's effect is far above rounding
    assert all(torch.equal(p, base[n]) for n, p in ac.base_parameters())
