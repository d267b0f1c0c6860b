"""The verl agent loop: one episode of the sequential tool runtime per verl sample.

verl's V1 trainer hands each sample (a question row of the dataset the launcher wrote) to
`AtlasToolAgentLoop.run`, which drives the episode through the same turn loop as the local engines
(atlas.runtime.episode.play), answering its requests for generations and tool results:

    turn t: the runtime's grammar for the offered tools -> vLLM, as a structured-output structural
            tag in that call's sampling_params (the tag `CallGrammars` built, never a second copy)
            -> the returned tokens replayed through the same grammar: every token must be legal,
               and a token is forced (sampled 0) where the grammar admitted exactly one
            -> parse the call by token id -> run the tool through the same tools and graders
            -> one ExecutionRecord
    end:    potential shaping (the same potential code) -> each record's Credit: its reward on its
            action token (the records themselves are never changed)

What goes back to verl (`AtlasAgentLoopOutput`):
    response_mask  1 = sampled by the policy; 0 = tool output, and tokens the grammar forced. It is
                   the loss mask of the local engine (`sampled`), so forced tokens stay out of both
                   losses and GAE, as they do locally.
    rm_scores      record k's reward on its action token (a sampled token, so GAE keeps it); verl's
                   default puts one scalar on the last token instead. Built in `as_dict`, which the
                   V1 trainer's TransferQueue path calls; the legacy (use_v1=False) path ignores it.
    extra_fields   {"records": one records.parquet row per ExecutionRecord and its Credit
                   (atlas.runtime.records.record_row), "min_global_steps"/"max_global_steps": the
                   oldest and newest weight versions the episode's turns were generated with}. verl's
                   V1 post-process tags each sample with these two, and its step metrics read them as
                   integers (trainer_base._compute_metrics); without them verl stops after step 1.
Each episode is also written to `records_dir/<phase>/global_step_<g>/<uid>__<sample>.json` before
verl's update uses it, which `atlas.verl.convert` turns into the run folder's records.parquet.

The loop is configured by one JSON file (`LoopSettings`, written by atlas.verl.launch) named in
the agent-loop YAML as `settings: <path>`; verl instantiates the class with it as a keyword. That
YAML entry is the loop's only registration.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xgrammar as xgr
from pydantic import BaseModel
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from atlas.config.training import TrainSlice
from atlas.hashing import atomic_path, canonical_json
from atlas.rl.potentials import Potential, make_potential
from atlas.rl.replay import unpack_bitmask
from atlas.rl.rewards import RewardPlacementError, shape_episode
from atlas.runtime.engine import Generation
from atlas.runtime.episode import (
    Episode,
    EpisodeSpec,
    NeedGeneration,
    episode_seed,
    play,
    run_tool,
    start_episode,
)
from atlas.runtime.grammar import CompiledCall
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.protocol import ProtocolReport, check_episodes
from atlas.runtime.records import Credit, record_row
from atlas.runtime.runfolder import trajectory_row
from atlas.runtime.session import Runtime, tool_runtime
from atlas.runtime.tools import CodeBounds
from atlas.verl.transport import INDEX, TABLE

AGENT_NAME = "atlas_tool_agent"


class LoopSettings(BaseModel):
    """What the agent loop needs beyond verl's own config: written by the launcher, one per run."""

    config: dict[str, Any]  # the run's training config slice (atlas.config.study.config_slice)
    run: str
    vocab_size: int  # the model's logits width (xgrammar bitmasks are this wide)
    train: str  # results/data/train.parquet
    val: str
    tests: str
    model: str
    snapshot: str | None = None  # run folder of a critic_snapshot potential
    records_dir: str


class GrammarMismatchError(RuntimeError):
    """The rollout server returned a token the turn's grammar does not admit."""


@dataclass
class LoopSetup:
    cfg: TrainSlice  # the run's slice, validated once
    run: str
    rt: Runtime
    questions: dict[str, dict]
    tests: dict
    potential: Potential
    records_dir: Path
    banned: torch.Tensor  # [vocab] bool: control tokens the grammar never admits
    banned_words: torch.Tensor  # the bitmask words holding banned tokens, and per word the bits
    banned_clear: torch.Tensor  # to keep (int32): `word & clear` drops the banned tokens
    # verl runs many episodes at once in one worker; at most graders.workers tool programs run at a
    # time in this process, as the local loop's pool allows.
    tool_slots: threading.BoundedSemaphore


_SETUPS: dict[str, LoopSetup] = {}
_SETUP_LOCK = threading.Lock()


def loop_setup(settings_path: str, tokenizer) -> LoopSetup:
    """Per process and settings file: config, runtime (grammars compile once), questions, potential."""
    with _SETUP_LOCK:
        if settings_path not in _SETUPS:
            s = LoopSettings.model_validate_json(Path(settings_path).read_text())
            cfg = TrainSlice.model_validate(s.config)
            rt = tool_runtime(tokenizer, s.vocab_size, cfg.runtime)
            questions = {q["question_uid"]: q for path in (s.train, s.val) for q in read_questions(path)}
            banned = torch.zeros(s.vocab_size, dtype=torch.bool)
            banned[sorted(rt.grammars.banned_token_ids)] = True
            words, clear = banned_bits(rt.grammars.banned_token_ids, s.vocab_size)
            _SETUPS[settings_path] = LoopSetup(
                cfg=cfg,
                run=s.run,
                rt=rt,
                questions=questions,
                tests=read_tests(s.tests),
                potential=build_potential(cfg, s),
                records_dir=Path(s.records_dir),
                banned=banned,
                banned_words=words,
                banned_clear=clear,
                tool_slots=threading.BoundedSemaphore(cfg.graders.workers),
            )
        return _SETUPS[settings_path]


def banned_bits(banned: set[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The xgrammar bitmask words holding banned tokens and, per word, an int32 that keeps every
    other bit."""
    clear = torch.full(((vocab + 31) // 32,), -1, dtype=torch.int32)
    for b in banned:
        clear[b // 32] &= ~(1 << (b % 32)) if b % 32 != 31 else 0x7FFFFFFF
    words = (clear != -1).nonzero().flatten()
    return words, clear[words]


def build_potential(cfg: TrainSlice, s: LoopSettings) -> Potential:
    """The run's potential through the same registry as the local trainer. A critic snapshot needs
    the base model and the snapshot critic in this process (on CPU: fine for small models only)."""
    run = cfg.run
    if run.potential == "zero":
        return make_potential("zero")
    from atlas.model.policy import ActorCritic
    from atlas.rl.snapshot import CriticSnapshotPotential  # noqa: F401  (registers critic_snapshot)
    from atlas.runtime.session import load_model

    base, _ = load_model(s.model)
    ac = ActorCritic(base, cfg.training, seed=cfg.seed)
    return make_potential(run.potential, model=ac, run_folder=s.snapshot, step=run.snapshot_step)


def structured_outputs(tag_json: str):
    """The structured-output request vLLM takes in SamplingParams: our structural tag. Without vLLM
    in this process (the CPU server manager of atlas.verl.local_server) a plain dict carries it."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        return {"structural_tag": tag_json}
    return StructuredOutputsParams(structural_tag=tag_json)


def replay_generation(
    token_ids: list[int],
    logprobs: list[float] | None,
    call: CompiledCall,
    setup: LoopSetup,
    masks: list[bytes] | None = None,
) -> Generation:
    """A Generation (ids, log-probs, sampled/forced flags, finish reason) from a server's tokens.

    The tokens are replayed through the turn's grammar: each must be legal (else the server did not
    enforce our grammar: GrammarMismatchError), and a token is forced (sampled 0, log-prob 0) where
    the grammar, control-token ban included, admitted exactly one token, as the local engine marks
    it. A server that stops on the stop token but leaves it out of its tokens gets it appended as a
    forced token, so the trajectory holds the same tokens the chat template expects. With `masks`,
    each token's allowed-token bitmask (int32 words, control-token ban included: the mask the
    actor's log-prob takes it under, atlas.verl.actor) is appended to it as bytes."""
    rt = setup.rt
    if logprobs is not None and len(logprobs) != len(token_ids):
        raise ValueError(f"{len(logprobs)} log-probs for {len(token_ids)} tokens")
    matcher = xgr.GrammarMatcher(call.grammar)
    bitmask = xgr.allocate_token_bitmask(1, len(setup.banned))
    gen = Generation()

    def allowed() -> torch.Tensor:
        matcher.fill_next_token_bitmask(bitmask, 0)
        bitmask[0, setup.banned_words] &= setup.banned_clear
        return unpack_bitmask(bitmask, len(setup.banned))[0]

    def keep() -> None:
        if masks is not None:
            masks.append(bitmask[0].numpy().tobytes())

    for k, token in enumerate(token_ids):
        legal = allowed()
        if not legal[token] or not matcher.accept_token(token):
            raise GrammarMismatchError(
                f"token {token} at generation position {k} is not legal under the turn's grammar "
                f"(tools {list(call.tools)}); the rollout server must enforce the structural tag it "
                "was given (vLLM: structured_outputs with the xgrammar backend)"
            )
        keep()
        sampled = int(legal.sum()) > 1
        gen.token_ids.append(token)
        gen.sampled.append(int(sampled))
        gen.logprobs.append(float(logprobs[k]) if sampled and logprobs is not None else 0.0)
        if matcher.is_terminated():
            break
    if not matcher.is_terminated():
        legal = allowed()
        only = legal.nonzero().flatten().tolist()
        if len(only) == 1 and only[0] in rt.stop_ids:  # the server dropped the (forced) stop token
            keep()
            matcher.accept_token(only[0])
            gen.token_ids.append(only[0])
            gen.sampled.append(0)
            gen.logprobs.append(0.0)
    if len(gen.token_ids) < len(token_ids):
        raise GrammarMismatchError(f"{len(token_ids) - len(gen.token_ids)} tokens after the grammar ended")
    gen.finish_reason = "stop" if matcher.is_terminated() else "length"
    return gen


def weight_versions(turn_fields: list[dict[str, Any]], step: int) -> dict[str, int]:
    """The episode's min/max_global_steps from its turns' server outputs, as verl's own loops keep
    them (the first turn's min, the last turn's max). verl's server client sets both on every
    output from the server's weight version; a server that reports none (the CPU server of
    atlas.verl.local_server) served the weights of the sample's own global step."""
    mins = [f["min_global_steps"] for f in turn_fields if f.get("min_global_steps") is not None]
    maxs = [f["max_global_steps"] for f in turn_fields if f.get("max_global_steps") is not None]
    return {
        "min_global_steps": int(min(mins)) if mins else step,
        "max_global_steps": int(max(maxs)) if maxs else step,
    }


class AtlasAgentLoopOutput(AgentLoopOutput):
    """verl's output with rm_scores built from the records: reward k on action token k."""

    action_positions: list[int] = []  # response positions (trajectory position - prompt length)
    action_rewards: list[float] = []
    # the generated tokens' grammar masks for atlas.verl.actor: distinct bitmasks, flattened
    # [M * W] int32, and per response token its row (-1: tool output)
    mask_table: list[bytes] = []
    mask_index: list[int] = []

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        for key in ("action_positions", "action_rewards", "mask_table", "mask_index"):
            out.pop(key, None)
        if self.mask_index:
            if len(self.mask_index) != len(self.response_ids):
                raise ValueError(
                    f"{len(self.mask_index)} mask rows for {len(self.response_ids)} response tokens"
                )
            words = torch.frombuffer(bytearray(b"".join(self.mask_table)), dtype=torch.int32)
            out[TABLE] = words
            out[INDEX] = torch.tensor(self.mask_index, dtype=torch.int64)
        mask = out["response_mask"]
        rm = torch.zeros_like(mask, dtype=torch.float32)
        for pos, reward in zip(self.action_positions, self.action_rewards, strict=True):
            if not 0 <= pos < len(mask) or mask[pos] != 1:
                raise RewardPlacementError(
                    f"action token at response position {pos} has response_mask "
                    f"{int(mask[pos]) if 0 <= pos < len(mask) else 'out of range'}; GAE would drop its reward"
                )
            rm[pos] = reward
        out["rm_scores"] = rm
        return out


def mask_rows(ep: Episode, masks: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The distinct masks of an episode's generated tokens and, per response token, its row."""
    p = ep.prompt_tokens
    index = [-1] * (len(ep.token_ids) - p)
    rows: dict[bytes, int] = {}
    spans = [t for span in ep.generations for t in range(span.start, span.end)]
    if len(spans) != len(masks):
        raise GrammarMismatchError(f"{len(masks)} replayed masks for {len(spans)} generated tokens")
    for t, mask in zip(spans, masks, strict=True):
        index[t - p] = rows.setdefault(mask, len(rows))
    return list(rows), index


def episode_credits(ep: Episode, setup: LoopSetup, phase: str) -> list[Credit]:
    """Each record's credit: shaped rewards in training; in validation the rewards are the scores."""
    if phase != "train":
        return [Credit.unshaped(r) for r in ep.records]
    run = setup.cfg.run
    return shape_episode(ep, setup.potential, gamma=setup.cfg.training.ppo.gamma, dose=run.dose).credits()


def episode_output(
    ep: Episode,
    credits: list[Credit],
    metrics: AgentLoopMetrics,
    versions: dict[str, int],
    masks: list[bytes],
) -> AtlasAgentLoopOutput:
    """verl's output: the trajectory, and each record's reward on its action token."""
    p = ep.prompt_tokens
    table, index = mask_rows(ep, masks)
    return AtlasAgentLoopOutput(
        prompt_ids=ep.token_ids[:p],
        response_ids=ep.token_ids[p:],
        response_mask=ep.sampled[p:],
        response_logprobs=ep.logprobs[p:],
        reward_score=sum(c.reward for c in credits),
        num_turns=2 * len(ep.records) + 1,  # user, then an assistant and a tool message per call
        metrics=metrics,
        extra_fields={"records": record_rows(ep, credits), **versions},
        action_positions=[r.action_token - p for r in ep.records],
        action_rewards=[c.reward for c in credits],
        mask_table=table,
        mask_index=index,
    )


def record_rows(ep: Episode, credits: list[Credit]) -> list[dict[str, Any]]:
    return [record_row(r, c) for r, c in zip(ep.records, credits, strict=True)]


def write_episode(
    ep: Episode,
    credits: list[Credit],
    setup: LoopSetup,
    phase: str,
    global_step: int,
    report: ProtocolReport,
) -> Path:
    """The episode's records, trajectory and protocol counts, one JSON file, written before any
    update uses them (atlas.verl.convert reads it back)."""
    uid = ep.question["question_uid"]
    folder = setup.records_dir / phase / f"global_step_{global_step}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uid.replace(':', '_')}__{ep.sample}.json"
    body = {
        **trajectory_row(ep, run=setup.run, step=global_step, phase=phase),
        "records": record_rows(ep, credits),
        "protocol": report.to_json(),
    }
    with atomic_path(path) as tmp:
        Path(tmp).write_text(canonical_json(body))
    return path


def write_failure(setup: LoopSetup, row: dict[str, Any], err: BaseException) -> Path:
    """Why an episode produced no output: records_dir/<phase>/global_step_<g>/failed/<uid>__<sample>.json."""
    info = row.get("extra_info") or {}
    uid, phase = str(info.get("question_uid", "unknown")), str(info.get("phase", "train"))
    step, sample = int(row.get("global_steps", 0)), row.get("session_id", "unknown")
    folder = setup.records_dir / phase / f"global_step_{step}" / "failed"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uid.replace(':', '_')}__{sample}.json"
    body = {"question_uid": uid, "sample": sample, "error": type(err).__name__, "message": str(err)[:2000]}
    with atomic_path(path) as tmp:
        Path(tmp).write_text(canonical_json(body))
    return path


# Not @register(AGENT_NAME): verl's worker fills its registry from the agent-loop YAML (with
# `settings`) and imports this module on the first instantiation; the decorator would then replace
# that entry with one without `settings`, and every later episode would fail to build.
class AtlasToolAgentLoop(AgentLoopBase):
    """One episode per call of `run`; see the module docstring."""

    def __init__(self, *args, settings: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.setup = loop_setup(os.fspath(settings), self.tokenizer)

    def _run_tool(self, ep: Episode, offered, parsed):
        with self.setup.tool_slots:
            return run_tool(ep, offered, parsed, self.setup.cfg.graders, self.setup.cfg.runtime)

    async def run(self, sampling_params: dict[str, Any], **row) -> AtlasAgentLoopOutput:
        try:
            return await self._play(sampling_params, **row)
        except Exception as err:
            # verl marks the sample's group failed and trains on the rest; the converter counts
            # episodes and names this file's reason when a step comes up short
            write_failure(self.setup, row, err)
            raise

    async def _play(self, sampling_params: dict[str, Any], **row) -> AtlasAgentLoopOutput:
        setup, rt = self.setup, self.setup.rt
        cfg = setup.cfg.runtime
        info = row["extra_info"]
        uid, phase = info["question_uid"], info["phase"]
        if "session_id" not in row:
            raise ValueError(
                "no session_id in the agent loop's arguments: atlas's rewards on action tokens need "
                "verl's V1 trainer (trainer.use_v1=True), which numbers the samples of a prompt"
            )
        sample, step = int(row["session_id"]), int(row.get("global_steps", 0))
        if uid not in setup.questions:
            raise KeyError(f"question {uid!r} of the verl dataset is in neither train nor val parquet")
        spec = EpisodeSpec(setup.questions[uid], setup.tests.get(uid, []), sample)
        ep = start_episode(rt, spec, CodeBounds.of(cfg))
        metrics = AgentLoopMetrics()
        turn_fields: list[dict[str, Any]] = []
        masks: list[bytes] = []
        loop, answer = play(ep, rt, cfg, run=setup.run, step=step, phase=phase), None
        while True:
            try:
                need = loop.send(answer)
            except StopIteration:
                break
            if isinstance(need, NeedGeneration):
                call = rt.grammars.get(need.offered)
                params = {
                    **sampling_params,
                    "max_tokens": cfg.max_generation_tokens,
                    "logprobs": True,
                    "seed": episode_seed(setup.cfg.seed, setup.run, step, uid, sample, need.turn),
                    "structured_outputs": structured_outputs(call.tag_json),
                }
                t0 = time.perf_counter()
                out = await self.server_manager.generate(
                    f"{uid}-{phase}-{step}-{sample}", prompt_ids=list(ep.token_ids), sampling_params=params
                )
                gen_s = time.perf_counter() - t0
                turn_fields.append(dict(out.extra_fields or {}))
                answer = replay_generation(list(out.token_ids), out.log_probs, call, setup, masks)
                answer.engine_s = gen_s
                metrics.generate_sequences += gen_s
            else:
                answer = await asyncio.to_thread(self._run_tool, ep, need.offered, need.call)
                metrics.tool_calls += answer[1]
        credits = episode_credits(ep, setup, phase)
        output = episode_output(ep, credits, metrics, weight_versions(turn_fields, step), masks)
        # The protocol invariants, checked against the very reward vector verl will read.
        rm = [0.0] * ep.prompt_tokens + output.as_dict()["rm_scores"].tolist()
        report = check_episodes(
            [ep],
            rt.decode,
            rt.call_open_id,
            rt.call_close_id,
            max_trajectory_tokens=cfg.max_trajectory_tokens,
            rewards_of=lambda _: rm,
        )
        write_episode(ep, credits, setup, phase, step, report)
        return output
