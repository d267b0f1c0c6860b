"""The repository's own promises: layout, fixtures we can regenerate, environments in step."""

import ast
import csv
import re
import subprocess
import sys

import tomllib
import yaml

from atlas import sources
from conftest import FIXTURES, REPO

TEST_DATA = REPO / ".test" / "data"


def test_layout_from_the_design():
    for part in (
        "Snakefile",
        "rules",
        "config",
        "profiles",
        "envs",
        "scripts",
        "src/atlas",
        "resources/fixtures",
        "tests",
    ):
        assert (REPO / part).exists(), part
    for profile in ("default", "slurm", "kubernetes"):
        assert (REPO / "profiles" / profile / "config.yaml").is_file()
    assert "/results/" in (REPO / ".gitignore").read_text().splitlines()


def test_fixtures_are_ours_and_reproducible(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_fixtures.py"), "--out", str(tmp_path)], check=True
    )
    shipped = sorted(p.name for p in FIXTURES.iterdir())
    assert shipped == sorted(p.name for p in tmp_path.iterdir())
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs" / "atlas.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert [d for d in pip if not d.startswith("-e")] == deps


def test_ci_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for command in (
        "bash scripts/setup.sh",
        ". .venv/bin/activate",
        "python -m pytest\n",
        "ATLAS_REQUIRE_VERL=1 .venv-verl/bin/python -m pytest tests/unit/test_rl_math.py tests/unit/test_verl_*.py",
    ):
        assert command in readme and command in ci, command


def _rules() -> dict[str, str]:
    """Rule name -> the text of its block, from every rules/*.smk."""
    blocks = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        parts = re.split(r"^\s*rule (\w+):\n", smk.read_text(), flags=re.M)
        blocks.update(zip(parts[1::2], parts[2::2], strict=True))
    return blocks


def test_every_rule_runs_the_stage_module_of_its_name():
    common = (REPO / "rules" / "common.smk").read_text()
    train_modules = re.search(r"TRAIN_MODULE = (\{.*?\})", common, flags=re.S).group(1)
    assert ast.literal_eval(train_modules) == {
        "local": "atlas.stages.train",
        "verl": "atlas.stages.train_verl",
    }
    rules = _rules()
    assert {"prepare_data", "smoke", "boundary", "train", "dose_step", "checks"} <= set(rules)
    assert {"distributed_roundtrip", "validation", "report", "build_tiny_model"} <= set(rules)
    for rule, block in rules.items():
        if rule == "train":  # the engine picks the module; both are stages of this rule
            assert "code=code(TRAIN_MODULE)" in block and "-m {params.module} " in block
            continue
        assert f'code=code("atlas.stages.{rule}")' in block, rule
        assert re.findall(r"-m (atlas[\w.]*)", block) == [f"atlas.stages.{rule}"], rule
    stages = {p.stem for p in (REPO / "src" / "atlas" / "stages").glob("*.py")} - {"__init__"}
    assert stages == set(rules) | {"train_verl"}


def test_no_module_imports_a_stage():
    src = REPO / "src"
    for path in sorted((src / "atlas").rglob("*.py")):
        name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        if name == "atlas.stages":
            continue
        imported = sources._imports(src, name, path)
        assert not {m for m in imported if m.startswith("atlas.stages")}, name
        if name.startswith("atlas.stages."):
            assert "def main(" in path.read_text(), name


def test_the_contracts_are_the_ground_floor():
    # Every stage may import a contract; a contract importing the library would make an edit of
    # that library rerun every stage that reads the contract. Contracts may share the parquet one.
    src = REPO / "src"
    for path in sorted((src / "atlas" / "contracts").glob("*.py")):
        name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        imported = sources._imports(src, name, path)
        assert imported <= {"atlas", "atlas.contracts", "atlas.contracts.parquet"}, (name, imported)


def test_dot_test_data_are_the_first_rows_of_the_shipped_fixtures():
    # The suite's config (.test/config) validates on these: the same rows, fewer of them.
    gpqa = [
        list(csv.reader(open(d / "gpqa_val.csv", newline="", encoding="utf-8")))
        for d in (FIXTURES, TEST_DATA)
    ]
    assert len(gpqa[1]) == 1 + 4 and gpqa[1] == gpqa[0][:5]
    lcb = [(d / "lcb_val.jsonl").read_text(encoding="utf-8").splitlines() for d in (FIXTURES, TEST_DATA)]
    assert len(lcb[1]) == 4 and lcb[1] == lcb[0][:4]
