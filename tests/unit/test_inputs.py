"""The inputs a user brings (atlas.inputs): each one the config names is checked where it must be."""

import pytest

from atlas.config.study import load_config
from atlas.errors import InputError
from atlas.inputs import MissingInputsError, check_user_inputs, missing_inputs, user_inputs
from conftest import REPO

REPORT25 = REPO / "config" / "report25.yaml"


def _study_files(root):
    """The four question files config/report25.yaml names, present (content is not checked here)."""
    for path in ("data/gpqa/gpqa_train.csv", "data/gpqa/gpqa_diamond.csv", "data/lcb/lcb_train.jsonl"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x\n")
    (root / "data/lcb/test6.jsonl").mkdir(parents=True)  # a folder where a file must be


def test_report25_names_its_question_files_and_model_folder():
    items = user_inputs(load_config(REPORT25))
    assert [(i.key, i.path, i.kind) for i in items] == [
        ("data.gpqa.train", "data/gpqa/gpqa_train.csv", "file"),
        ("data.gpqa.val", "data/gpqa/gpqa_diamond.csv", "file"),
        ("data.lcb.train", "data/lcb/lcb_train.jsonl", "file"),
        ("data.lcb.val", "data/lcb/test6.jsonl", "file"),
        ("model.path", "models/qwen-27b", "model"),
    ]


def test_the_embedded_default_has_every_input_it_names():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert [i.key for i in user_inputs(cfg)] == [
        "data.gpqa.train",
        "data.gpqa.val",
        "data.lcb.train",
        "data.lcb.val",
        "model.tiny.corpus[0]",
        "model.tiny.corpus[1]",
        "model.tiny.corpus[2]",
        "model.tiny.corpus[3]",
    ]
    assert missing_inputs(cfg, REPO) == []
    check_user_inputs(cfg, "(config/config.yaml)", REPO)  # nothing to name, nothing raised


def test_a_model_folder_without_weights_and_a_folder_for_a_file_are_named(tmp_path):
    _study_files(tmp_path)
    (tmp_path / "models/qwen-27b").mkdir(parents=True)
    (tmp_path / "models/qwen-27b/config.json").write_text("{}")
    lines = missing_inputs(load_config(REPORT25), tmp_path)
    assert [line.split("; expected ")[0] for line in lines] == [
        "data.lcb.val: data/lcb/test6.jsonl is not a file",
        "model.path: models/qwen-27b has no *.safetensors weights",
    ]
    (tmp_path / "models/qwen-27b/config.json").unlink()
    (tmp_path / "models/qwen-27b/model-00001-of-00011.safetensors").write_bytes(b"")
    lines = missing_inputs(load_config(REPORT25), tmp_path)
    assert lines[1].split("; expected ")[0] == "model.path: models/qwen-27b has no config.json"


def test_the_error_counts_and_lists_every_missing_input(tmp_path):
    with pytest.raises(MissingInputsError) as err:
        check_user_inputs(load_config(REPORT25), "(config/report25.yaml)", tmp_path)
    assert isinstance(err.value, InputError)
    lines = str(err.value).splitlines()
    assert lines[0] == "missing inputs (config/report25.yaml): 5 paths the config names are not there"
    assert [line.split(":")[0].strip() for line in lines[1:6]] == [
        "data.gpqa.train",
        "data.gpqa.val",
        "data.lcb.train",
        "data.lcb.val",
        "model.path",
    ]
    assert lines[2].endswith("Incorrect Answer 3, Record ID), 198 of them")
    assert lines[6] == "put each one there, or point its key at your copy in a --configfile"
