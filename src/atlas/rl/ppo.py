"""One PPO update from a batch of finished episodes: the middle of DESIGN.md's training step.

    episodes (records, token ids, masks, rollout log-probs)
    --> rewards: score + shaping on each record's action token (rewards.py)
    --> old log-probs under the replayed grammar masks (actor), reference log-probs (adapters
        off), values (critic) -- no grad
    --> GAE over sampled tokens, advantages whitened over the batch (advantages.py)
    --> critic update (clipped value loss), then actor update (clipped surrogate + KL to the
        reference + optional entropy bonus), in micro-batches accumulated per mini-batch

Token tensors are [B, T], right-padded. The loss mask of both updates is `sampled`: forced
tokens, prompt and tool output never enter a loss. V[:, t] is the critic's value of the state
*before* token t (its output at position t - 1), as verl aligns values with response tokens.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from atlas.config.training import PPOConfig
from atlas.model.fused_lora import fused_lora
from atlas.model.liger import liger_rope
from atlas.model.policy import ActorCritic
from atlas.rl.advantages import gae_over_sampled_batch
from atlas.rl.drift import rollout_drift
from atlas.rl.fused_head import output_weight, packed_old_logprobs, packed_token_logprobs
from atlas.rl.losses import entropy_from_logits, kl_penalty, masked_mean, policy_loss, value_loss
from atlas.rl.packing import decoder, pack, packed_attention, token_budget_cut
from atlas.rl.replay import ReplayedMasks, masked_logprobs


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention: torch.Tensor  # [B, T] 1 = real token
    sampled: torch.Tensor  # [B, T] float: 1 = sampled by the policy (the loss mask of PPO)
    rollout_logprobs: torch.Tensor  # [B, T]
    rewards: torch.Tensor  # [B, T] rewards on action tokens
    masks: list[ReplayedMasks]

    def lengths(self) -> list[int]:
        """Real tokens per row (host ints)."""
        return self.attention.sum(-1).tolist()

    def rows(self, idx: list[int]) -> Batch:
        return Batch(
            self.input_ids[idx],
            self.attention[idx],
            self.sampled[idx],
            self.rollout_logprobs[idx],
            self.rewards[idx],
            [self.masks[i] for i in idx],
        )


def make_batch(
    episodes, token_rewards: list[torch.Tensor], masks: list[ReplayedMasks], pad_id: int, device="cpu"
) -> Batch:
    """The episodes right-padded into one batch, on the policy's `device`."""
    width = max(len(ep.token_ids) for ep in episodes)
    n = len(episodes)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    sampled = torch.zeros((n, width))
    logprobs = torch.zeros((n, width))
    rewards = torch.zeros((n, width))
    for i, ep in enumerate(episodes):
        k = len(ep.token_ids)
        ids[i, :k] = torch.tensor(ep.token_ids)
        attn[i, :k] = 1
        sampled[i, :k] = torch.tensor(ep.sampled, dtype=torch.float32)
        logprobs[i, :k] = torch.tensor(ep.logprobs, dtype=torch.float32)
        rewards[i, :k] = token_rewards[i]
    # positions stay on the host: the packed path indexes with them without a device sync
    masks = [ReplayedMasks(m.positions, m.bitmask.to(device)) for m in masks]
    return Batch(*(t.to(device) for t in (ids, attn, sampled, logprobs, rewards)), masks)


def token_logprobs(logits: torch.Tensor, batch: Batch, temperature: float, raw: bool = False) -> torch.Tensor:
    """[B, T] log-probs of every generated token under its replayed mask (0 elsewhere); with
    raw=True over the whole vocabulary instead (atlas.rl.drift)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=logits.device)
    for i, m in enumerate(batch.masks):
        pos = m.positions.to(logits.device)
        before, targets = logits[i, pos - 1], batch.input_ids[i, pos]
        if raw:
            lp = torch.log_softmax(before.float() / temperature, dim=-1).gather(-1, targets[:, None])[:, 0]
        else:
            lp = masked_logprobs(before, targets, m.bitmask, temperature)
        out[i] = out[i].index_put((pos,), lp)
    return out


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """x[:, t - 1] at t, 0 at t = 0: the output read before token t belongs to token t."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def aligned_values(ac: ActorCritic, batch: Batch) -> torch.Tensor:
    return _shift_right(ac.values(batch.input_ids, batch.attention))  # V before token t


class Passes:
    """The forward passes of prepare and update, on padded rows or on packed ones.

    padded  the [B, T] micro-batch through the peft model: full logits, then the replayed masks
            (token_logprobs). The reference path, and the default on a CPU.
    packed  padding removal: the micro-batch's rows packed into one (atlas.rl.packing; varlen
            FlashAttention-2 on a GPU), the decoder's hidden states straight into the chunked
            head under the same masks (atlas.rl.fused_head), so the vocab x tokens logits never
            exist in float32; the adapters' product accumulated in the base GEMM in the base's
            dtype (atlas.model.fused_lora: bf16 on a GPU, where peft would run them in float32).

    Both give the same [B, T] log-probs, entropies (of the raw next-token distribution) and values
    in float32; tests/unit/test_packing.py checks that a PPO update through either moves the adapters
    alike.
    """

    def __init__(self, ac: ActorCritic, temperature: float, packed: bool):
        self.ac, self.temperature, self.packed = ac, temperature, packed

    @classmethod
    def for_batch(cls, ac: ActorCritic, batch: Batch, ppo: PPOConfig, temperature: float) -> Passes:
        return cls(ac, temperature, ppo.on_gpu("remove_padding", batch.input_ids.is_cuda))

    @contextlib.contextmanager
    def active(self):
        """The packed path's attention and LoRA forward for the block, peft's own afterwards
        (rollouts need their attention implementation back); Liger's RoPE where the policy has
        Liger kernels (atlas.model.liger)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(liger_rope(self.ac.peft))
            if self.packed:
                stack.enter_context(packed_attention(self.ac.peft))
                stack.enter_context(fused_lora(self.ac.peft))
            yield self

    def _hidden(self, sub: Batch):
        packed = pack(sub.input_ids, sub.attention)
        return packed, decoder(self.ac.peft)(**packed.model_kwargs()).last_hidden_state

    def logprobs(
        self, sub: Batch, reference: bool = False, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, T] log-probs of the generated tokens of the active adapter (of the base model with
        reference=True) and, with entropy=True, [B, T] entropies of the raw next-token distribution
        before each token (0 off the generated tokens in the packed path; the loss masks both)."""
        ac = self.ac
        with ac.peft.disable_adapter() if reference else contextlib.nullcontext():
            if self.packed:
                packed, hidden = self._hidden(sub)
                return packed_token_logprobs(
                    hidden, output_weight(ac.peft), packed, sub.masks, self.temperature, entropy=entropy
                )
            logits = ac.peft(input_ids=sub.input_ids, attention_mask=sub.attention).logits
        lp = token_logprobs(logits, sub, self.temperature)
        return lp, (_shift_right(entropy_from_logits(logits).float()) if entropy else None)

    def old_logprobs(self, sub: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] log-probs of the generated tokens under their masks and over the whole
        vocabulary (atlas.rl.drift), from one forward of the active adapter."""
        ac = self.ac
        if self.packed:
            packed, hidden = self._hidden(sub)
            return packed_old_logprobs(hidden, output_weight(ac.peft), packed, sub.masks, self.temperature)
        logits = ac.peft(input_ids=sub.input_ids, attention_mask=sub.attention).logits
        return token_logprobs(logits, sub, self.temperature), token_logprobs(
            logits, sub, self.temperature, raw=True
        )

    def values(self, sub: Batch) -> torch.Tensor:
        """[B, T] V of the state before token t, of the active critic adapter."""
        if not self.packed:
            return aligned_values(self.ac, sub)
        with self.ac.role("critic"):
            packed, hidden = self._hidden(sub)
            return _shift_right(packed.unpack(self.ac.value_head(hidden[0].float()).squeeze(-1)))


def _micro(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def micro_batches(indices: list[int], batch: Batch, ppo: PPOConfig) -> list[list[int]]:
    """The forward/backward units of `indices`: by token budget (micro_batch_tokens) or by row
    count (micro_batch_size). A budget keeps every unit's work about the same when trajectory
    lengths vary (a tool-heavy episode is many times a direct answer)."""
    if ppo.micro_batch_tokens is None:
        return _micro(indices, ppo.micro_batch_size)
    return token_budget_cut(indices, batch.lengths(), ppo.micro_batch_tokens)


def make_optimizers(ac: ActorCritic, ppo: PPOConfig) -> dict[str, torch.optim.Optimizer]:
    """AdamW per role over exactly the tensors a compact checkpoint holds, in name order."""
    lrs = {"actor": ppo.actor_lr, "critic": ppo.critic_lr}
    return {
        role: torch.optim.AdamW(
            [p for _, p in sorted(ac.trainable(role).items())],
            lr=lrs[role],
            betas=ppo.betas,
            eps=ppo.eps,
            weight_decay=ppo.weight_decay,
        )
        for role in ("actor", "critic")
    }


def lr_factor(ppo: PPOConfig, total_updates: int) -> Callable[[int], float]:
    """LR multiplier after `k` optimizer steps: linear warm-up, then constant or cosine."""

    def factor(k: int) -> float:
        if k < ppo.warmup_steps:
            return (k + 1) / (ppo.warmup_steps + 1)
        if ppo.lr_schedule == "constant":
            return 1.0
        span = max(1, total_updates - ppo.warmup_steps)
        progress = min(1.0, (k - ppo.warmup_steps) / span)
        return ppo.min_lr_ratio + (1 - ppo.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def make_schedulers(
    optimizers: dict[str, torch.optim.Optimizer], ppo: PPOConfig, steps: int
) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
    total = steps * ppo.epochs * ppo.mini_batches
    return {
        role: torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(ppo, total))
        for role, opt in optimizers.items()
    }


def _stats(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    on = x[mask.bool()]
    if on.numel() == 0:
        return {f"{name}/mean": 0.0, f"{name}/max": 0.0, f"{name}/min": 0.0}
    return {f"{name}/mean": on.mean().item(), f"{name}/max": on.max().item(), f"{name}/min": on.min().item()}


@dataclass
class Prepared:
    """Everything the updates need that does not change during them (no gradients)."""

    old_logprobs: torch.Tensor  # [B, T] actor, under the replayed masks
    ref_logprobs: torch.Tensor  # [B, T] reference (adapters off), same masks
    values: torch.Tensor  # [B, T] critic: V of the state before token t; 0 off the mask
    rewards: torch.Tensor  # [B, T] the batch's rewards, minus the KL penalty with kl_mode: reward
    advantages: torch.Tensor  # [B, T] GAE (whitened if configured); 0 off the mask
    returns: torch.Tensor  # [B, T]
    metrics: dict[str, float]


def prepare(ac: ActorCritic, batch: Batch, ppo: PPOConfig, temperature: float) -> Prepared:
    """Old log-probs, reference log-probs and values in micro-batches, then GAE."""
    old_lp, raw_lp, ref_lp, values, metrics = forward_passes(ac, batch, ppo, temperature)
    return advantages_of(
        batch.rewards, batch.sampled, batch.rollout_logprobs, old_lp, raw_lp, ref_lp, values, ppo, metrics
    )


def forward_passes(
    ac: ActorCritic, batch: Batch, ppo: PPOConfig, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """[B, T] old log-probs (masked, then raw: atlas.rl.drift), reference log-probs and values
    (0 off the mask), and their timings."""
    n, mask = batch.input_ids.shape[0], batch.sampled
    chunks = micro_batches(list(range(n)), batch, ppo)
    passes = Passes.for_batch(ac, batch, ppo, temperature)
    metrics: dict[str, float] = {}
    old_lp, raw_lp, ref_lp, values = (torch.zeros_like(mask) for _ in range(4))
    with torch.no_grad(), passes.active():
        t = time.perf_counter()
        with ac.role("actor"):
            for idx in chunks:
                old_lp[idx], raw_lp[idx] = passes.old_logprobs(batch.rows(idx))
        metrics["timing_s/old_log_prob"] = time.perf_counter() - t
        t = time.perf_counter()
        if ppo.kl_mode != "none":
            for idx in chunks:
                ref_lp[idx] = passes.logprobs(batch.rows(idx), reference=True)[0]
        metrics["timing_s/ref"] = time.perf_counter() - t
        t = time.perf_counter()
        for idx in chunks:
            values[idx] = passes.values(batch.rows(idx))
        values = values * mask
        metrics["timing_s/values"] = time.perf_counter() - t
    return old_lp, raw_lp, ref_lp, values, metrics


def advantages_of(
    batch_rewards: torch.Tensor,
    mask: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    old_lp: torch.Tensor,
    raw_lp: torch.Tensor,
    ref_lp: torch.Tensor,
    values: torch.Tensor,
    ppo: PPOConfig,
    metrics: dict[str, float],
) -> Prepared:
    """GAE (whitened over every row) and the batch's statistics, from the batch's [B, T] rewards,
    sampled mask and rollout log-probs and the passes' tensors (raw_lp: the old log-probs over the
    whole vocabulary, for atlas.rl.drift's ratios). A data-parallel step calls it on
    the gathered global batch (atlas.rl.distributed), so it whitens as one process does."""
    n = mask.shape[0]
    metrics = dict(metrics)
    with torch.no_grad():
        t = time.perf_counter()
        rewards = batch_rewards
        if ppo.kl_mode == "reward":  # verl's apply_kl_penalty: every sampled token pays beta * KL
            kl = kl_penalty(old_lp, ref_lp, ppo.kl_kind) * mask
            rewards = rewards - ppo.kl_coef * kl
            metrics["actor/reward_kl_penalty"] = masked_mean(kl, mask).item()
            metrics["actor/reward_kl_penalty_coeff"] = ppo.kl_coef
        advantages, returns = gae_over_sampled_batch(
            rewards, values, mask, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages
        )
        metrics["timing_s/adv"] = time.perf_counter() - t

    metrics.update(rollout_drift(old_lp, rollout_logprobs, mask, raw_lp))
    for name, x in (
        ("critic/advantages", advantages),
        ("critic/returns", returns),
        ("critic/values", values),
    ):
        metrics.update(_stats(name, x, mask))
    rows = torch.ones(n, 1)
    metrics.update(_stats("critic/rewards", rewards.sum(-1, keepdim=True), rows))
    on = mask.bool()
    residual = (returns - values)[on]
    var_returns = returns[on].var() if on.sum() > 1 else torch.tensor(0.0)
    explained = 1 - residual.var() / var_returns if var_returns > 0 else torch.tensor(0.0)
    metrics["critic/vf_explained_var"] = explained.item()
    return Prepared(old_lp, ref_lp, values, rewards, advantages, returns, metrics)


def _role_loss(role: str, passes: Passes, sub: Batch, idx, prep: Prepared, ppo: PPOConfig):
    mask = sub.sampled
    if role == "critic":
        out = value_loss(
            passes.values(sub),
            prep.values[idx],
            prep.returns[idx],
            mask,
            ppo.cliprange_value,
            agg=ppo.loss_agg_mode,
        )
        return out["critic/vf_loss"], out
    lp, ent = passes.logprobs(sub, entropy=bool(ppo.entropy_coef))
    out = policy_loss(
        lp,
        prep.old_logprobs[idx],
        prep.advantages[idx],
        mask,
        ppo.clip_ratio_low,
        ppo.clip_ratio_high,
        ppo.clip_ratio_c,
        agg=ppo.loss_agg_mode,
    )
    loss = out["actor/pg_loss"]
    if ppo.kl_mode == "loss":
        kl = masked_mean(kl_penalty(lp, prep.ref_logprobs[idx], ppo.kl_kind), mask)
        loss = loss + ppo.kl_coef * kl
        out["actor/kl_loss"], out["actor/kl_coef"] = kl, ppo.kl_coef
    if ppo.entropy_coef:  # entropy of the raw (unmasked) next-token distribution
        ent = masked_mean(ent, mask)
        loss = loss - ppo.entropy_coef * ent
        out["actor/entropy"] = ent
    return loss, out


class OneProcess:
    """How the update's optimizer steps see other ranks when there are none.

    The data-parallel update (atlas.rl.distributed.DataParallel) answers the same four questions
    across ranks: which local rows make each optimizer step's mini-batch, the mini-batch's token
    count over all ranks, how a micro-batch's forward and backward run (DDP, its gradients
    synced after the last micro-batch only), and the loss metrics summed over ranks."""

    world = 1

    def mini_batches(self, n: int, mini_batches: int) -> list[list[int]]:
        mini = -(-n // mini_batches)
        return [list(range(start, min(n, start + mini))) for start in range(0, n, mini)]

    def total(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @contextlib.contextmanager
    def micro_batch(self, role: str, last: bool):
        yield lambda loss_fn: loss_fn()

    def sums(self, sums: dict[str, float]) -> dict[str, float]:
        return sums


def update(
    ac: ActorCritic,
    batch: Batch,
    prep: Prepared,
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, torch.optim.lr_scheduler.LRScheduler] | None,
    ppo: PPOConfig,
    temperature: float,
    sync: OneProcess | None = None,
) -> dict[str, float]:
    """The critic update, then the actor update: `epochs` passes of `mini_batches` optimizer steps,
    each accumulating micro-batch gradients weighted by their share of the mini-batch's tokens.
    `sync` spreads each mini-batch over ranks (atlas.rl.distributed); None: one process."""
    sync = sync or OneProcess()
    passes = Passes.for_batch(ac, batch, ppo, temperature)
    metrics: dict[str, float] = {}
    with passes.active(), _training_mode(ac):
        for role in ("critic", "actor"):
            metrics.update(_update_role(role, passes, batch, prep, optimizers, schedulers, ppo, sync))
    return metrics


@contextlib.contextmanager
def _training_mode(ac: ActorCritic):
    """train() for the updates (transformers recomputes checkpointed layers only in training mode;
    the adapters have no dropout, so nothing else changes), eval() again for rollouts."""
    ac.train()
    try:
        yield
    finally:
        ac.eval()


def _update_role(role, passes, batch, prep, optimizers, schedulers, ppo, sync) -> dict[str, float]:
    """`epochs` passes of optimizer steps of one role over the mini-batches `sync` cuts."""
    n, mask, ac = batch.input_ids.shape[0], batch.sampled, passes.ac
    metrics: dict[str, float] = {}
    t = time.perf_counter()
    params = list(ac.trainable(role).values())
    opt = optimizers[role]
    sums: dict[str, float] = {}
    grad_norms = 0.0
    count = 0
    metrics[f"{role}/lr"] = opt.param_groups[0]["lr"]
    for _ in range(ppo.epochs):
        for rows in sync.mini_batches(n, ppo.mini_batches):
            opt.zero_grad(set_to_none=True)
            tokens = sync.total(mask[rows].sum()).clamp(min=1)  # the mini-batch's, over all ranks
            micros = micro_batches(rows, batch, ppo)
            for j, idx in enumerate(micros):
                sub = batch.rows(idx)
                weight = (mask[idx].sum() / tokens).item()  # token share of the mini-batch
                # backward inside the role: peft clears requires_grad of inactive adapters,
                # and autograd skips accumulating into a tensor that no longer requires grad.
                # The loss is scaled by the world size because data-parallel sync averages.
                with ac.role(role), sync.micro_batch(role, last=j == len(micros) - 1) as forward:
                    loss, out = forward(
                        lambda sub=sub, idx=idx: _role_loss(role, passes, sub, idx, prep, ppo)
                    )
                    (loss * (weight * sync.world)).backward()
                for k, v in out.items():
                    sums[k] = sums.get(k, 0.0) + float(torch.as_tensor(v).detach()) * weight
            grad_norm = torch.nn.utils.clip_grad_norm_(params, ppo.grad_clip)
            opt.step()
            if schedulers is not None:
                schedulers[role].step()
            grad_norms += grad_norm.item()
            count += 1
    metrics.update({k: v / count for k, v in sync.sums(sums).items()})
    metrics[f"{role}/grad_norm"] = grad_norms / count
    metrics[f"timing_s/update_{role}"] = time.perf_counter() - t
    return metrics


def ppo_update(
    ac: ActorCritic,
    batch: Batch,
    optimizers: dict[str, torch.optim.Optimizer],
    ppo: PPOConfig,
    temperature: float = 1.0,
    schedulers: dict | None = None,
) -> dict[str, float]:
    """prepare + update of one process, for a batch without episodes (a synthetic batch, a
    benchmark's); a training step from episodes is atlas.rl.step.ppo_step."""
    prep = prepare(ac, batch, ppo, temperature)
    return {**prep.metrics, **update(ac, batch, prep, optimizers, schedulers, ppo, temperature)}
