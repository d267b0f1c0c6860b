"""The efficient PPO update's pieces against the plain path, on a tiny random Qwen3 (CPU, float32):
padding removal (packed rows, transformers' block-causal mask and the varlen attention function)
and the chunked output head (grammar masks, temperature, entropy, gradients)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from atlas.config.training import PPOConfig, TrainingConfig
from atlas.model.fused_lora import fused_lora
from atlas.model.policy import ActorCritic
from atlas.rl.fused_head import head_logprobs, output_weight, packed_token_logprobs, unpack_bitmask
from atlas.rl.packing import decoder, pack, packed_attention
from atlas.rl.ppo import Batch, prepare, token_budget_cut, token_logprobs, update
from atlas.rl.replay import ReplayedMasks, masked_logprobs

VOCAB = 300  # not a multiple of 32: the bitmask's last word is partly past the vocabulary
LENGTHS = [9, 1, 14, 6]  # one single-token row: its position 0 follows another row's 0


def tiny_lm() -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def padded_batch(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2  # trailing padding on every row
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        attn[i, :n] = 1
    return ids, attn


def random_bitmask(targets: torch.Tensor, seed: int) -> torch.Tensor:
    """xgrammar-layout masks allowing a random ~third of the vocabulary plus each target; one row
    allows only its target (a forced token: log-prob 0)."""
    g = torch.Generator().manual_seed(seed)
    words = -(-VOCAB // 32)
    allowed = torch.rand((len(targets), words * 32), generator=g) < 0.3
    allowed[torch.arange(len(targets)), targets] = True
    allowed[0] = False
    allowed[0, targets[0]] = True
    bits = allowed.view(len(targets), words, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int64).to(torch.int32)  # wraps bit 31 to the sign, as xgrammar's


def test_pack_restarts_positions_and_unpacks_to_the_padded_layout():
    ids, attn = padded_batch(LENGTHS)
    packed = pack(ids, attn)
    assert packed.tokens == sum(LENGTHS) and packed.lengths == LENGTHS
    assert packed.cu_seqlens.tolist() == [0, 9, 10, 24, 30]
    assert packed.position_ids[0, 8:12].tolist() == [8, 0, 0, 1]
    assert torch.equal(packed.unpack(packed.input_ids[0]), ids * attn)
    with pytest.raises(ValueError, match="right-padded"):
        pack(ids, attn.flip(-1))


def test_packed_forward_equals_the_padded_forward():
    model = tiny_lm()
    ids, attn = padded_batch(LENGTHS)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=attn).logits
        packed = pack(ids, attn)
        # transformers' own packed-row detection: position ids restart, block-causal sdpa mask
        kwargs = packed.model_kwargs()
        plain = packed.unpack(model(**kwargs).logits)
        with packed_attention(model):
            varlen = packed.unpack(model(**kwargs).logits)
        assert model.config._attn_implementation == "sdpa"  # restored
    on = attn.bool()
    assert (padded[on] - plain[on]).abs().max() < 1e-5
    assert (padded[on] - varlen[on]).abs().max() < 1e-5
    # without the restart the rows would see each other: the check has teeth
    with torch.no_grad():
        leaky = model(input_ids=packed.input_ids, use_cache=False).logits
    assert (packed.unpack(leaky)[on] - padded[on]).abs().max() > 1e-3


def test_unpack_bitmask_reads_xgrammar_words():
    targets = torch.tensor([5, 31, 32, 299])
    bitmask = random_bitmask(targets, seed=3)
    allowed = unpack_bitmask(bitmask, VOCAB)
    words, bits = torch.arange(VOCAB) // 32, torch.arange(VOCAB) % 32
    expected = ((bitmask[:, words] >> bits) & 1).bool()
    assert torch.equal(allowed, expected)
    assert allowed[0].sum() == 1 and allowed[0, 5]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_head_matches_the_full_logits_path_values_and_gradients(temperature):
    g = torch.Generator().manual_seed(7)
    n, hidden_size = 37, 16
    hidden = torch.randn((n, hidden_size), generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn((VOCAB, hidden_size), generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, VOCAB, (n,), generator=g)
    bitmask = random_bitmask(targets, seed=11)
    w_lp, w_ent = (
        torch.randn(n, generator=g, dtype=torch.float64),
        torch.randn(n, generator=g, dtype=torch.float64),
    )

    # plain: full logits, replay's masked log-softmax; entropy of the same masked distribution
    logits = hidden @ weight.t()
    ref_lp = masked_logprobs(logits.double(), targets, bitmask, temperature).double()
    z = (logits / temperature).masked_fill(~unpack_bitmask(bitmask, VOCAB), float("-inf"))
    logp = torch.log_softmax(z, -1)
    ref_ent = -(logp.exp() * logp.masked_fill(z == float("-inf"), 0.0)).sum(-1)
    (ref_lp.double() @ w_lp + ref_ent @ w_ent).backward()
    ref_gh, ref_gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    lp, ent = head_logprobs(hidden, weight, targets, bitmask, temperature, chunk=8, entropy=True)
    (lp.double() @ w_lp + ent.double() @ w_ent).backward()
    assert lp[0].item() == 0.0  # the forced row
    assert torch.allclose(lp.double(), ref_lp, atol=1e-5)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-5)
    # both sides log-softmax in float32 (as replay's masked_logprobs does): float32 rounding
    assert torch.allclose(hidden.grad, ref_gh, atol=1e-4, rtol=1e-4)
    assert torch.allclose(weight.grad, ref_gw, atol=1e-4, rtol=1e-4)
    assert ref_gh.abs().max() > 1e-2  # the gradients are not trivially zero


def test_fused_head_without_a_mask_is_log_softmax():
    g = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn((10, 8), generator=g), torch.randn((VOCAB, 8), generator=g)
    targets = torch.randint(0, VOCAB, (10,), generator=g)
    lp, ent = head_logprobs(hidden, weight, targets, None, chunk=3)
    ref = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, targets[:, None]).squeeze(-1)
    assert ent is None and torch.allclose(lp, ref, atol=1e-5)


def test_packed_actor_logprobs_and_gradients_equal_the_padded_path():
    """The update's actor term, packed + fused head against ppo.token_logprobs, through the real
    ActorCritic (LoRA on every linear layer, actor adapter active)."""
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    with torch.no_grad():  # move the LoRA B matrices off zero so the adapters matter
        for p in ac.trainable("actor").values():
            p.add_(0.05 * torch.randn_like(p))
    lengths = [12, 5, 15]
    ids, attn = padded_batch(lengths, seed=4)
    masks = []
    for i, n in enumerate(lengths):
        pos = torch.arange(max(1, n - 6), n)  # the last tokens of each row were generated
        masks.append(ReplayedMasks(pos, random_bitmask(ids[i, pos], seed=20 + i)))
    sampled = torch.zeros(ids.shape)
    batch = Batch(ids, attn, sampled, sampled, sampled, masks)
    temperature = 0.8
    params = list(ac.trainable("actor").values())

    with ac.role("actor"):
        plain = token_logprobs(ac.actor_logits(ids, attn), batch, temperature)
        plain.sum().backward()
        plain_grads = [p.grad.clone() for p in params]
        ac.zero_grad(set_to_none=True)

        packed = pack(ids, attn)
        with packed_attention(ac.peft):
            hidden = decoder(ac.peft)(**packed.model_kwargs()).last_hidden_state
            fused, _ = packed_token_logprobs(
                hidden, output_weight(ac.peft), packed, masks, temperature, chunk=5
            )
        fused.sum().backward()
        fused_grads = [p.grad for p in params]

    assert (plain != 0).sum() > 10
    assert torch.equal(fused == 0, plain == 0)
    assert (fused - plain).abs().max() < 1e-5
    worst = max((a - b).abs().max().item() for a, b in zip(plain_grads, fused_grads, strict=True))
    assert worst < 1e-5, worst
    assert max(a.abs().max().item() for a in plain_grads) > 1e-3


def test_fused_lora_forward_equals_peft_values_and_gradients():
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    with torch.no_grad():
        for p in ac.trainable("actor").values():
            p.add_(0.05 * torch.randn_like(p))
    ids, attn = padded_batch([11, 7], seed=5)
    params = list(ac.trainable("actor").values())
    outs, grads = [], []
    for fused in (False, True):
        with ac.role("actor"), fused_lora(ac.peft) if fused else contextlib.nullcontext():
            logits = ac.actor_logits(ids, attn)
            (logits[attn.bool()] ** 2).mean().backward()
        outs.append(logits.detach())
        grads.append([p.grad.clone() for p in params])
        ac.zero_grad(set_to_none=True)
    assert (outs[0] - outs[1]).abs().max() < 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(*grads, strict=True)) < 1e-5
    assert "forward" not in vars(next(m for m in ac.modules() if hasattr(m, "lora_A")))  # restored
    with ac.peft.disable_adapter(), fused_lora(ac.peft):  # adapters off: peft's own path
        ref = ac.peft(input_ids=ids, attention_mask=attn).logits
    assert (ref - outs[0]).abs().max() > 1e-4


def _ppo_batch(seed: int) -> Batch:
    """Right-padded rows whose tail was generated (some forced), a reward on each last token."""
    lengths = [14, 6, 11, 9]
    ids, attn = padded_batch(lengths, seed=seed)
    sampled, rewards = torch.zeros(ids.shape), torch.zeros(ids.shape)
    masks = []
    for i, n in enumerate(lengths):
        pos = torch.arange(n - 5, n)
        masks.append(ReplayedMasks(pos, random_bitmask(ids[i, pos], seed=seed + i)))
        sampled[i, pos[1:]] = 1.0  # the first generated token of a row was forced
        rewards[i, n - 1] = (-1.0) ** i
    return Batch(ids, attn, sampled, torch.zeros(ids.shape), rewards, masks)


def _count_calls(module) -> list[int]:
    """Count the module's forward calls (recomputes included: checkpointing skips module hooks)."""
    calls, forward = [0], module.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    module.forward = counted
    return calls


def test_ppo_update_moves_the_adapters_alike_through_the_packed_and_the_padded_passes():
    """atlas.rl.ppo with remove_padding on (packed rows, varlen attention, chunked head) and
    gradient checkpointing, against the padded path: the same old/ref log-probs and values, the
    same losses (KL in the loss, an entropy bonus), the same step of every trainable tensor."""
    results = {}
    for packed in (False, True):
        ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
        with torch.no_grad():  # the actor off the reference (LoRA B starts at zero)
            for p in ac.trainable("actor").values():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        if packed:
            ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        calls = _count_calls(ac.peft.get_base_model().model.layers[0].mlp.act_fn)
        ppo = PPOConfig(
            kl_mode="loss",
            kl_coef=0.1,
            entropy_coef=0.01,
            micro_batch_size=3,  # two micro-batches: accumulation by token share
            remove_padding=packed,
            gradient_checkpointing=packed,
        )
        # SGD, not AdamW: its step is the gradient, so a tiny numeric gap stays tiny
        before = {r: {n: p.detach().clone() for n, p in ac.trainable(r).items()} for r in ("actor", "critic")}
        opts = {r: torch.optim.SGD(list(ac.trainable(r).values()), lr=0.5) for r in ("actor", "critic")}
        batch = _ppo_batch(seed=11)
        prep = prepare(ac, batch, ppo, temperature=0.9)
        calls[0] = 0
        metrics = update(ac, batch, prep, opts, None, ppo, temperature=0.9)
        # 2 roles x 2 micro-batches forwards, and as many recomputes in the backward if checkpointed
        assert calls[0] == (8 if packed else 4)
        steps = {
            r: {n: p.detach() - before[r][n] for n, p in ac.trainable(r).items()} for r in ("actor", "critic")
        }
        results[packed] = (prep, metrics, steps)
        assert not ac.training  # back in eval mode for rollouts
        assert ac.peft.get_base_model().config._attn_implementation == "sdpa"  # restored
        assert not any("forward" in vars(m) for m in ac.modules() if hasattr(m, "lora_A"))  # peft's again

    (plain, plain_m, plain_steps), (fused, fused_m, fused_steps) = results[False], results[True]
    for key in ("old_logprobs", "ref_logprobs", "values", "advantages"):
        a, b = getattr(plain, key), getattr(fused, key)
        assert a.abs().max() > 1e-3, key
        assert (a - b).abs().max() < 1e-5, key
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss", "actor/grad_norm"):
        assert fused_m[key] == pytest.approx(plain_m[key], rel=1e-5, abs=1e-7), key
    assert plain_m["actor/entropy"] > 1.0  # about log(300) at random init
    for role in ("actor", "critic"):
        moved = max(s.abs().max().item() for s in plain_steps[role].values())
        assert moved > 1e-4, role
        gap = max((plain_steps[role][n] - fused_steps[role][n]).abs().max().item() for n in plain_steps[role])
        assert gap < 1e-5 * max(1.0, moved), (role, gap, moved)


def test_a_compiled_fused_lora_step_is_traced_once_and_reads_the_current_weights():
    """StaticEngine's use: a compiled step under fused_lora, one block per generate call. The
    second block reuses the graph (no graph break, no retrace) and sees weights changed between
    blocks (an optimizer step), matching the eager fused path in bf16."""
    base = tiny_lm().to(torch.bfloat16)
    ac = ActorCritic(base, TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    lora_b = [p for n, p in ac.trainable("actor").items() if "lora_B" in n]
    assert lora_b[0].dtype == torch.float32  # peft keeps adapter weights in float32
    ids, _ = padded_batch([9, 9], seed=6)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = torch.compile(lambda x: ac.peft(input_ids=x, use_cache=False).logits, backend=backend)
    seen = []
    for shift in (0.0, 0.25):
        with torch.no_grad(), fused_lora(ac.peft):
            for p in lora_b:
                p.add_(shift)
            eager = ac.peft(input_ids=ids, use_cache=False).logits
            seen.append(step(ids))
        assert torch.equal(seen[-1], eager)
    assert not torch.equal(seen[0], seen[1])  # the second block read the changed weights
    assert len(graphs) == 1  # traced once, reused by the second block
    assert not any("forward" in vars(m) for m in ac.modules() if hasattr(m, "lora_A"))


def test_token_budget_cut_keeps_order_and_puts_a_long_row_alone():
    lengths = [14, 6, 11, 9, 30, 2, 3]
    assert token_budget_cut(list(range(7)), lengths, 20) == [[0, 1], [2, 3], [4], [5, 6]]
    assert token_budget_cut([2, 3, 5], lengths, 16) == [[2], [3, 5]]
    assert token_budget_cut([], lengths, 16) == []


def _steps_of_one_update(ppo: PPOConfig):
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    with torch.no_grad():
        for p in ac.trainable("actor").values():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    calls = _count_calls(ac.peft.get_base_model().model.layers[0].mlp.act_fn)
    before = {r: {n: p.detach().clone() for n, p in ac.trainable(r).items()} for r in ("actor", "critic")}
    opts = {r: torch.optim.SGD(list(ac.trainable(r).values()), lr=0.5) for r in ("actor", "critic")}
    batch = _ppo_batch(seed=11)
    prep = prepare(ac, batch, ppo, temperature=0.9)
    calls[0] = 0
    metrics = update(ac, batch, prep, opts, None, ppo, temperature=0.9)
    steps = {
        r: {n: p.detach() - before[r][n] for n, p in ac.trainable(r).items()} for r in ("actor", "critic")
    }
    return prep, metrics, steps, calls[0]


@pytest.mark.parametrize("packed", [False, True])
def test_a_token_budget_cut_gives_the_update_of_a_row_cut(packed):
    """micro_batch_tokens=16 cuts the rows [14, 6, 11, 9] into four micro-batches, the row cut
    (micro_batch_size=3) into two: gradients accumulate by token share, so both take one step."""
    common = dict(kl_mode="loss", kl_coef=0.1, remove_padding=packed, gradient_checkpointing=False)
    rows = _steps_of_one_update(PPOConfig(micro_batch_size=3, **common))
    tokens = _steps_of_one_update(PPOConfig(micro_batch_size=3, micro_batch_tokens=16, **common))
    assert (rows[3], tokens[3]) == (4, 8)  # forwards of 2 roles: 2 and 4 micro-batches each
    for key in ("old_logprobs", "values", "advantages"):
        assert (getattr(rows[0], key) - getattr(tokens[0], key)).abs().max() < 1e-5, key
    for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        assert tokens[1][key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-7), key
    for role in ("actor", "critic"):
        moved = max(s.abs().max().item() for s in rows[2][role].values())
        assert moved > 1e-4, role
        gap = max((rows[2][role][n] - tokens[2][role][n]).abs().max().item() for n in rows[2][role])
        assert gap < 1e-5 * max(1.0, moved), (role, gap, moved)
