import json

import pytest

from atlas import sources
from atlas.sources import module_files
from conftest import REPO


def test_data_stage_runs_the_readers_but_not_the_model():
    files = module_files("atlas.stages.prepare_data", relative_to=REPO)
    for f in ("gpqa.py", "lcb.py", "schedule.py", "schema.py", "__init__.py"):
        assert f"src/atlas/data/{f}" in files
    assert "src/atlas/stages/prepare_data.py" in files and "src/atlas/stages/__init__.py" in files
    for f in ("__init__.py", "hashing.py", "stage.py", "errors.py", "sources.py"):
        assert f"src/atlas/{f}" in files
    config = sorted(f.rpartition("/")[2] for f in files if f.startswith("src/atlas/config/"))
    assert config == ["__init__.py", "base.py", "data.py"]
    assert not any(f.startswith("src/atlas/model/") for f in files)
    assert "src/atlas/__main__.py" not in files


@pytest.mark.parametrize(
    ("stage", "sections"),
    [
        ("report", ["report"]),
        ("build_tiny_model", ["model"]),
        ("smoke", ["graders", "resources", "runtime", "smoke"]),
        ("boundary", ["graders", "resources", "runtime", "smoke"]),
        ("train", ["adapters", "data", "graders", "resources", "runtime", "training"]),
        ("dose_step", ["adapters", "data", "graders", "resources", "runtime", "training"]),
        ("checks", ["adapters", "checks", "data", "graders", "resources", "runtime", "training"]),
        # the adapters' shape, and not the training section: see atlas.config.adapters
        ("validation", ["adapters", "graders", "resources", "runtime", "validation"]),
        ("train_verl", ["adapters", "data", "graders", "resources", "runtime", "training"]),
        ("distributed_roundtrip", ["adapters", "data", "graders", "resources", "runtime", "training"]),
    ],
)
def test_a_stage_runs_the_config_sections_of_its_slice_alone(stage, sections):
    """No stage imports the whole study (atlas.config.study): an edit to a section's code is a
    code input of the stages that read that section only."""
    files = module_files(f"atlas.stages.{stage}", relative_to=REPO)
    config = sorted(f.rpartition("/")[2][:-3] for f in files if f.startswith("src/atlas/config/"))
    assert config == sorted(["__init__", "base", *sections])


def test_model_stage_does_not_run_the_readers():
    files = module_files("atlas.stages.build_tiny_model", relative_to=REPO)
    assert "src/atlas/model/tiny.py" in files and "src/atlas/model/__init__.py" in files
    assert not any(f.startswith("src/atlas/data/") for f in files)


def test_validation_does_not_run_the_checks_code():
    """An edit to a check reruns the checks, not every validation: validation raises the same
    CheckFailed, which lives in atlas.errors, not beside the checks."""
    files = module_files("atlas.stages.validation", relative_to=REPO)
    assert "src/atlas/stages/validation.py" in files and "src/atlas/errors.py" in files
    assert not any(f.startswith("src/atlas/checks/") for f in files)
    assert "src/atlas/checks/compact.py" in module_files("atlas.stages.checks", relative_to=REPO)


def test_imports_inside_functions_and_relative_imports_count(tmp_path):
    pkg = tmp_path / "atlas"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "stage.py").write_text("def main():\n    from . import helper\n    import json\n")
    (pkg / "sub" / "helper.py").write_text("from ..util import thing\n")
    (pkg / "util.py").write_text("thing = 1\n")
    (pkg / "unused.py").write_text("")
    files = module_files("atlas.sub.stage", src=tmp_path, relative_to=tmp_path)
    assert files == [
        "atlas/__init__.py",
        "atlas/sub/__init__.py",
        "atlas/sub/helper.py",
        "atlas/sub/stage.py",
        "atlas/util.py",
    ]


def test_an_import_in_any_block_counts(tmp_path):
    """Imports nested in every kind of block: a class's method, branches, loops, with, try's
    handlers, else and finally, and match cases."""
    pkg = tmp_path / "atlas"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    blocks = [f"m{i}" for i in range(11)]
    for name in blocks:
        (pkg / f"{name}.py").write_text("")
    (pkg / "stage.py").write_text(
        "class C:\n    def f(self):\n        import atlas.m0\n"
        "if x:\n    import atlas.m1\nelse:\n    import atlas.m2\n"
        "for _ in y:\n    pass\nelse:\n    from atlas import m3\n"
        "while z:\n    from atlas import m4\n"
        "with open(p) as f:\n    from atlas import m5\n"
        "try:\n    from atlas import m6\nexcept ImportError:\n    from atlas import m7\n"
        "else:\n    from atlas import m8\nfinally:\n    from atlas import m9\n"
        "match v:\n    case 1:\n        from atlas import m10\n"
    )
    files = module_files("atlas.stage", src=tmp_path, relative_to=tmp_path)
    assert files == sorted(["atlas/__init__.py", "atlas/stage.py", *(f"atlas/{m}.py" for m in blocks)])


def _package(root):
    pkg = root / "atlas"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "stage.py").write_text("from atlas import a\n")
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("")
    return pkg


def _fresh(src, module="atlas.stage"):
    """module_files as a new process sees it: no imports read in this one yet."""
    for f in (sources.module_names, sources._stored, sources._imports):
        f.cache_clear()
    return module_files(module, src=src, relative_to=src)


def test_the_imports_are_kept_for_the_next_process_under_the_trees_digest(tmp_path):
    pkg = _package(tmp_path)
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/a.py", "atlas/stage.py"]
    store = json.loads((pkg / "__pycache__" / sources.STORE).read_text())
    assert store["digest"] == sources.tree_digest(tmp_path)
    assert store["imports"]["atlas.stage"] == ["atlas", "atlas.a"]
    # the next process reads the store, not the sources: a store that says otherwise is believed
    store["imports"]["atlas.stage"] = ["atlas", "atlas.b"]
    (pkg / "__pycache__" / sources.STORE).write_text(json.dumps(store))
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/b.py", "atlas/stage.py"]


def test_an_edited_added_or_removed_file_is_read_again(tmp_path):
    pkg = _package(tmp_path)
    _fresh(tmp_path)
    (pkg / "stage.py").write_text("from atlas import a\n\ndef main():\n    from atlas import b\n")
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/a.py", "atlas/b.py", "atlas/stage.py"]
    (pkg / "c.py").write_text("")  # a new module changes what `from atlas import c` resolves to
    digest = sources.tree_digest(tmp_path)
    _fresh(tmp_path)
    assert json.loads((pkg / "__pycache__" / sources.STORE).read_text())["digest"] == digest
    (pkg / "b.py").unlink()
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/a.py", "atlas/stage.py"]


def test_a_corrupt_store_is_parsed_around_and_replaced(tmp_path):
    pkg = _package(tmp_path)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / sources.STORE).write_text('{"digest": "')  # a write cut short
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/a.py", "atlas/stage.py"]
    store = json.loads((pkg / "__pycache__" / sources.STORE).read_text())
    assert store["imports"]["atlas.stage"] == ["atlas", "atlas.a"]
    # the tree's digest, but an entry that is not a list of module names: parsed around too
    store["imports"]["atlas.stage"] = 5
    (pkg / "__pycache__" / sources.STORE).write_text(json.dumps(store))
    assert _fresh(tmp_path) == ["atlas/__init__.py", "atlas/a.py", "atlas/stage.py"]


def test_verl_training_runs_the_modules_verl_loads_by_name():
    """verl imports EXTERNAL_MODULES by name in its processes: an edit to them reruns training."""
    from atlas.verl.config import EXTERNAL_MODULES

    assert set(EXTERNAL_MODULES) <= sources.module_names("atlas.stages.train_verl")
