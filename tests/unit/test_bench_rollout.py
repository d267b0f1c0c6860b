"""scripts/bench_rollout.py's episode mode times the trainer's own episode loop: its clock wraps
the engine without changing what the loop hands it, in both schedules (the engine's continuous
serve, and rounds of one batch a turn), and its counts are the records' own."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import torch

from atlas.config.training import TrainingConfig
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.rollouts import episode_specs, rollout
from atlas.runtime.session import load_model, make_runtime
from conftest import REPO
from unit.test_runtime import GRADERS, RUNTIME


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_rollout", REPO / "scripts" / "bench_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_episode_clock_counts_the_records_tokens_in_both_schedules(tiny_model, data_dir):
    bench = bench_module()
    # the runtime tests' small episodes, under the seeds of a run named as the train stage's
    cfg = SimpleNamespace(runtime=RUNTIME, graders=GRADERS, seed=0, runs={"training_smoke": None})
    model, tokenizer = load_model(tiny_model)
    rt = make_runtime(model, tokenizer, RUNTIME, fast=True)  # StaticEngine, eager on a CPU
    questions = read_questions(data_dir / "val.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][:1] + [
        q for q in questions if q["source"] == "lcb"
    ][:1]
    specs = episode_specs(picked, read_tests(data_dir / "tests.parquet"), 2)
    runs = {
        schedule: bench.timed_rollout(rt, specs, cfg, step=0, phase="train", device="cpu", schedule=schedule)
        for schedule in ("continuous", "rounds")
    }
    assert "serve" not in vars(rt.engine) and "generate" not in vars(rt.engine)  # the engine is untouched
    assert rt.engine._kept == {}  # in both schedules, an ended episode's keys are given back
    cont, rounds = runs["continuous"], runs["rounds"]
    # the schedule changes when a row runs, not what it generates: same seeds, same episodes
    assert cont["tokens"] == rounds["tokens"] > 0 and cont["generations"] == rounds["generations"]
    assert cont["episodes"] == rounds["episodes"] == 4
    assert cont["generations"] > cont["episodes"]  # some episodes took a second turn
    for run in runs.values():
        # every step generates one token for each of its rows
        assert run["engine"]["rows"] == run["tokens"]
        assert run["tokens_per_s"] == run["tokens"] / run["seconds"]
        assert run["seconds"] >= run["engine"]["seconds"] > 0
        by_bucket = run["engine"]["by_bucket"]  # every step in one bucket's row
        assert sum(steps for steps, _, _ in by_bucket.values()) == run["engine"]["steps"]
        assert all(gpu == 0.0 for _, _, gpu in by_bucket.values())  # no device: no device seconds
        assert run["engine"]["feed_s"] > 0  # the episode loop's parsing and tool starts
    assert len(cont["calls"]) == 1 and cont["engine"]["admissions"] > 1  # one serve, turns joining
    # rounds: one call a turn, each with every episode still going
    assert len(rounds["calls"]) >= 2
    assert sum(c["rows_asked"] for c in rounds["calls"]) == rounds["generations"]
    assert rounds["calls"][0]["rows_asked"] == 4 and rounds["engine"]["admissions"] == len(rounds["calls"])
    # the first rollout is the train stage's first step's: its run's seeds, the same tokens
    trainer = rollout(rt, specs, RUNTIME, GRADERS, run="training_smoke", step=0, phase="train", seed=0)
    assert sum(r.generated_tokens for ep in trainer for r in ep.records) == cont["tokens"]


def test_the_episode_mode_samples_the_policy_of_the_first_step(tiny_model):
    """The generation mode's arms set the actor's LoRA B off zero; the episode mode puts it back at
    zero, as peft initialises it, and the merged serving copy is the base again."""
    bench = bench_module()
    model, tokenizer = load_model(tiny_model)
    training = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8, merged_rollouts=True)
    policy = bench.Policy(
        model, tokenizer, SimpleNamespace(training=training, runtime=RUNTIME, seed=0), "cpu"
    )
    lora_b = [t for name, t in policy.ac.trainable("actor").items() if "lora_B" in name]
    assert lora_b and all(t.abs().max() > 0 for t in lora_b)
    merged = dict(policy.serving.model.named_parameters())
    base = {n: p for n, p in policy.ac.peft.named_parameters() if "base_layer" in n}
    name = next(n for n in base if "q_proj" in n)
    served = merged[name.replace("base_model.model.", "").replace(".base_layer", "")]
    assert not torch.equal(served, base[name])
    policy.as_at_the_first_step()
    assert all(t.abs().max() == 0 for t in lora_b)
    assert torch.equal(served, base[name])


def test_the_profile_sums_kernels_by_kind():
    """Kernel names as torch.profiler gives them on an H100 (whole: FlashAttention's template
    arguments name cutlass), each to its kind; only the device's events count (a host event of a
    kernel's name, as Inductor's launch wrapper, does not); the table sums device time and launches
    by kind, largest first."""
    from torch.autograd import DeviceType

    bench = bench_module()
    flash = (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
    )
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)"
    inductor = "triton_red_fused___lshift_____rshift____log_softmax_bitwise_and_where_0"
    kernels = [
        ("_shared_kernel", 80.0, 3),
        ("_split_kernel", 40.0, 1),
        (inductor, 700.0, 1),
        ("_draw_kernel", 10.0, 2),
        ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT", 24.0, 4),
        (gemm, 10.0, 1),
        ("_qk_rope_store_kernel", 8.0, 4),
        ("_triton_rope", 2.0, 1),
        ("_block_rms_norm_forward_kernel", 1.0, 1),
        (flash, 240.0, 1),
        ("Memcpy HtoD (Pinned -> Device)", 39.0, 2),
        (
            "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...> >(long, ...)",
            300.0,
            1,
        ),
    ]
    events = [
        SimpleNamespace(
            name=name, device_type=DeviceType.CUDA, time_range=SimpleNamespace(elapsed_us=lambda us=us: us)
        )
        for name, us, count in kernels
        for _ in range(count)
    ]
    events.append(
        SimpleNamespace(
            name=inductor, device_type=DeviceType.CPU, time_range=SimpleNamespace(elapsed_us=lambda: 5.0)
        )
    )
    got = sorted(bench.device_kernels(events))
    assert got == sorted((name, us * count, count) for name, us, count in kernels)
    kinds = [bench.kernel_kind(name) for name, _, _ in kernels]
    assert (
        kinds
        == ["decode attention"] * 2
        + ["the pick"] * 2
        + ["matrix products"] * 2
        + ["RMSNorm, RoPE, SwiGLU"] * 3
        + ["prefill attention"]
        + ["copies, elementwise, other"] * 2
    )
    lines = bench.kinds_table(got).splitlines()
    # 720 us of the pick's, 378 of copies and the rest, 1,759 in all
    assert lines[2] == "| the pick | 0.7 | 40.9% | 3 |"
    assert lines[3] == "| copies, elementwise, other | 0.4 | 21.5% | 3 |"
    assert lines[-1] == "| all | 1.8 | | 22 |"
