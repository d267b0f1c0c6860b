"""scripts/bench_rollout.py's episode mode times the trainer's own episode loop: its clock wraps
the engine without changing what the loop hands it (the rows' on_finish reports included), one
engine call a turn, and its tokens are the records' generated tokens."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.rollouts import episode_specs
from atlas.runtime.session import load_model, make_runtime
from conftest import REPO
from unit.test_runtime import GRADERS, RUNTIME


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_rollout", REPO / "scripts" / "bench_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_episode_clock_sees_every_turn_and_passes_the_row_reports_on(tiny_model, data_dir):
    bench = bench_module()
    cfg = SimpleNamespace(runtime=RUNTIME, graders=GRADERS, seed=0)  # the runtime tests' small episodes
    model, tokenizer = load_model(tiny_model)
    rt = make_runtime(model, tokenizer, RUNTIME, fast=True)  # StaticEngine, eager on a CPU
    reported = []
    engine_generate = rt.engine.generate

    def generate(requests, on_finish=None):  # what reaches the engine through the bench's clock
        reported.append(on_finish is not None)
        return engine_generate(requests, on_finish=on_finish)

    rt.engine.generate = generate
    questions = read_questions(data_dir / "val.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][:1] + [
        q for q in questions if q["source"] == "lcb"
    ][:1]
    specs = episode_specs(picked, read_tests(data_dir / "tests.parquet"), 2)
    run = bench.timed_rollout(rt, specs, cfg, step=0, phase="train", device="cpu")
    assert rt.engine.generate is generate  # the clock is taken off again
    assert reported and all(reported)  # every call handed the loop's on_finish to the engine
    assert run["episodes"] == 4 and len(run["turns"]) == len(reported)
    assert run["generations"] == sum(t["rows"] for t in run["turns"])
    assert run["tokens"] == sum(t["tokens"] for t in run["turns"]) > 0
    assert all(t["turn_s"] >= t["seconds"] > 0 and "prefill_s" in t for t in run["turns"])
    assert run["tokens_per_s"] == run["tokens"] / run["seconds"]
