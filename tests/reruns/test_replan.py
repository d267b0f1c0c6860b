"""Code inputs follow the data: editing a module reruns exactly the jobs whose outputs it shapes.

Every rule lists the source files its stage imports as inputs (atlas.sources), so each import is
a rerun trigger. The matrix below pins, per edited file and engine, the jobs Snakemake plans: the
jobs that list the file, and every job after them. One interpreter answers all the queries.
"""

from __future__ import annotations

import pytest
import yaml

from atlas.config.study import load_config
from conftest import REPO, copy_pipeline, copy_workflow
from plans import downstream_of, job_graphs, to_run

CFG = load_config(REPO / "config" / "config.yaml")
RUNS = sorted(CFG.runs)
TRAIN = {f"train[{r}]" for r in RUNS}
CHECKS = {f"checks[{r}]" for r in RUNS}
DISTRIBUTED = {f"distributed_roundtrip[{r}]" for r in RUNS}
TRAINED = {f"validation[{p}]" for p in CFG.validation.policies if p != "base"}
BASE = {f"validation[{p}]" for p in CFG.validation.policies if p == "base"}
AFTER_TRAINING = TRAIN | CHECKS | DISTRIBUTED | TRAINED | {"dose_step", "report"}
EVERY = AFTER_TRAINING | BASE | {"prepare_data", "build_tiny_model", "smoke", "boundary"}

# (edited file, jobs replanned under engine local, under engine verl)
MATRIX = [
    # The PPO update: the local trainer and what reads its runs; under verl only the stages that
    # run the update themselves (the checks resume a step, the dose step takes one). Never the
    # validation of the base model.
    ("rl/ppo.py", AFTER_TRAINING, CHECKS | {"dose_step", "report"}),
    ("rl/metrics.py", AFTER_TRAINING, AFTER_TRAINING),
    ("verl/convert.py", set(), AFTER_TRAINING),
    ("verl/agent_loop.py", set(), AFTER_TRAINING),
    # The report's column descriptions and card: the report alone, under both engines.
    ("report/tables.py", {"report"}, {"report"}),
    ("report/card.py", {"report"}, {"report"}),
    ("stages/report.py", {"report"}, {"report"}),
    # Rollouts and their protocol check: everything that samples a policy, but not the smoke and
    # boundary stages (they drive episodes directly) nor data or model.
    ("runtime/rollouts.py", AFTER_TRAINING | BASE, AFTER_TRAINING | BASE),
    ("stages/validation.py", TRAINED | BASE | {"report"}, TRAINED | BASE | {"report"}),
    ("checks/roundtrip.py", CHECKS | DISTRIBUTED | {"report"}, CHECKS | DISTRIBUTED | {"report"}),
    # The compact-checkpoint checks: the checks alone (validation raises the same CheckFailed, from
    # atlas.errors, and runs none of them).
    ("checks/compact.py", CHECKS | {"report"}, CHECKS | {"report"}),
    # The tables' contracts: a run folder's reruns training and what reads it; full validation's
    # answers rerun the validations alone (and the report).
    ("contracts/runs.py", AFTER_TRAINING, AFTER_TRAINING),
    ("contracts/answers.py", TRAINED | BASE | {"report"}, TRAINED | BASE | {"report"}),
    ("stages/smoke.py", {"smoke", "report"}, {"smoke", "report"}),
    (
        "graders/lcb.py",
        EVERY - {"prepare_data", "build_tiny_model"},
        EVERY - {"prepare_data", "build_tiny_model"},
    ),
    ("data/gpqa.py", EVERY - {"build_tiny_model"}, EVERY - {"build_tiny_model"}),
    ("model/tiny.py", EVERY - {"prepare_data"}, EVERY - {"prepare_data"}),
    # The config's sections: a stage imports the sections its slice holds, and never the whole
    # study, which only the Snakefile and the command line read. A field's description in the
    # report's section reruns the report alone.
    ("config/report.py", {"report"}, {"report"}),
    ("config/study.py", set(), set()),
    ("config/base.py", EVERY, EVERY),
    ("config/data.py", EVERY - {"build_tiny_model"}, EVERY - {"build_tiny_model"}),
    ("config/model.py", EVERY - {"prepare_data"}, EVERY - {"prepare_data"}),
    *(
        (
            f"config/{section}.py",
            EVERY - {"prepare_data", "build_tiny_model"},
            EVERY - {"prepare_data", "build_tiny_model"},
        )
        for section in ("runtime", "graders", "resources")
    ),
    # The training section reruns training and what reads its runs; the adapters' shape, which
    # loading a policy needs, every validation too (the base's LoRA is built, then disabled).
    ("config/training.py", AFTER_TRAINING, AFTER_TRAINING),
    ("config/adapters.py", AFTER_TRAINING | BASE, AFTER_TRAINING | BASE),
    ("config/smoke.py", {"smoke", "boundary", "report"}, {"smoke", "boundary", "report"}),
    ("config/checks.py", CHECKS | {"report"}, CHECKS | {"report"}),
    ("config/validation.py", TRAINED | BASE | {"report"}, TRAINED | BASE | {"report"}),
    # The contracts, each read by the stages that write or read its files; the code every stage runs.
    ("contracts/questions.py", EVERY - {"build_tiny_model"}, EVERY - {"build_tiny_model"}),
    (
        "contracts/records.py",
        EVERY - {"prepare_data", "build_tiny_model"},
        EVERY - {"prepare_data", "build_tiny_model"},
    ),
    (
        "contracts/parquet.py",
        EVERY - {"prepare_data", "build_tiny_model"},
        EVERY - {"prepare_data", "build_tiny_model"},
    ),
    (
        "contracts/protocol.py",
        EVERY - {"prepare_data", "build_tiny_model", "boundary"},
        EVERY - {"prepare_data", "build_tiny_model", "boundary"},
    ),
    ("stage.py", EVERY, EVERY),
    ("hashing.py", EVERY, EVERY),
]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    wf = copy_workflow(tmp_path_factory.mktemp("replan"))
    (wf / "verl.yaml").write_text(yaml.safe_dump({"training": {"engine": "verl"}}))
    local, verl = job_graphs(wf, [{}, {"configfiles": ["verl.yaml"]}])
    return {"local": local, "verl": verl}


def test_both_engines_plan_the_same_jobs(graphs):
    assert set(graphs["local"]) == set(graphs["verl"]) == EVERY | {"all"}


@pytest.mark.parametrize("engine", ["local", "verl"])
@pytest.mark.parametrize(("module", "local", "verl"), MATRIX, ids=[m for m, *_ in MATRIX])
def test_an_edit_replans_exactly_the_jobs_it_shapes(graphs, engine, module, local, verl):
    expected = {"local": local, "verl": verl}[engine]
    assert downstream_of(graphs[engine], f"src/atlas/{module}") == expected


def test_snakemake_plans_the_matrix_on_a_finished_run(pipeline, tmp_path):
    """On a copy of the finished run, Snakemake's own plan after each edit is the matrix's (local
    engine): nothing before the edit, exactly the expected jobs with it."""
    wf = copy_pipeline(pipeline, tmp_path / "wf")
    cases = [m for m in MATRIX if m[0] in ("rl/ppo.py", "report/tables.py", "stages/validation.py")]
    answers = job_graphs(wf, [{}, *({"edit": [f"src/atlas/{m}"]} for m, _, _ in cases)])
    assert to_run(answers[0]) == set()
    for (module, local, _), graph in zip(cases, answers[1:], strict=True):
        assert to_run(graph) == local, module
