import base64
import json
import os
import pickle
import zlib

import pytest

from atlas.data.lcb import decode_private_tests, read_lcb, unpickle_string
from atlas.data.schema import DataError
from conftest import FIXTURES, read_jsonl, write_jsonl


def encode(value) -> str:
    """The upstream private-test encoding: base64(zlib(pickle(JSON string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(value)))).decode()


class _Exploit:
    """Unpickling this would create a folder: the reader must refuse before any call runs."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_reads_both_test_styles_and_both_encodings():
    raw = read_jsonl(FIXTURES / "lcb_train.jsonl")
    questions = read_lcb(FIXTURES / "lcb_train.jsonl", "train")
    assert len(questions) == len(raw) == 20
    assert {q.test_type for q in questions} == {"stdin", "functional"}
    plain = [r for r in raw if r["private_test_cases"].startswith("[")]
    packed = [r for r in raw if not r["private_test_cases"].startswith("[")]
    assert plain and packed
    by_id = {q.record_id: q for q in questions}
    for r in raw:
        q = by_id[r["question_id"]]
        assert q.question_uid == f"lcb:{r['question_id']}"
        assert q.title == r["question_title"] and q.starter_code == r["starter_code"]
        public = json.loads(r["public_test_cases"])
        assert [(t.input, t.output) for t in q.public_tests] == [(t["input"], t["output"]) for t in public]
        assert len(q.private_tests) == 3
        if q.test_type == "functional":
            assert q.func_name == json.loads(r["metadata"])["func_name"]
            assert q.starter_code.startswith("class Solution:")
        else:
            assert q.func_name is None
    # A packed row decodes to the same tests a plain JSON row would carry.
    r = packed[0]
    assert decode_private_tests(r["private_test_cases"], 2**20) == json.loads(
        pickle.loads(zlib.decompress(base64.b64decode(r["private_test_cases"])))
    )


def test_unpickler_admits_plain_strings_only(tmp_path):
    assert unpickle_string(pickle.dumps("[1, 2]")) == "[1, 2]"
    target = tmp_path / "pwned"
    with pytest.raises(pickle.UnpicklingError, match=r"refused global (posix|os)\.mkdir"):
        unpickle_string(pickle.dumps(_Exploit(str(target))))
    assert not target.exists()
    with pytest.raises(pickle.UnpicklingError, match="pickle holds a list, only a plain str is admitted"):
        unpickle_string(pickle.dumps([1, 2]))


def _break(fixture_copy, mutate, name="lcb_train.jsonl"):
    path = fixture_copy(name)
    rows = read_jsonl(path)
    mutate(rows)
    write_jsonl(path, rows)
    return path


def test_malicious_pickle_in_a_row_is_refused(fixture_copy, tmp_path):
    target = tmp_path / "pwned"
    blob = base64.b64encode(zlib.compress(pickle.dumps(_Exploit(str(target))))).decode()
    path = _break(fixture_copy, lambda rows: rows[3].update(private_test_cases=blob))
    qid = read_jsonl(path)[3]["question_id"]
    with pytest.raises(DataError) as err:
        read_lcb(path, "train")
    msg = str(err.value)
    assert msg.startswith(
        f"{path}, line 4 (question_id {qid}): undecodable private_test_cases (UnpicklingError: refused global"
    )
    assert msg.endswith("expected a JSON list of tests, or base64(zlib(pickle(JSON string)))")
    assert not target.exists()


def test_undecodable_blob(fixture_copy):
    path = _break(fixture_copy, lambda rows: rows[0].update(private_test_cases="eJzL%%%not-base64"))
    with pytest.raises(
        DataError, match=r"line 1 \(question_id abc300_a\): undecodable private_test_cases \(Error: "
    ):
        read_lcb(path, "train")


def test_zip_bomb_is_refused(fixture_copy):
    huge = [{"input": "x" * 400_000, "output": "y", "testtype": "stdin"}] * 8
    path = _break(fixture_copy, lambda rows: rows[0].update(private_test_cases=encode(huge)))
    with pytest.raises(DataError, match="inflates beyond the 1048576-byte limit"):
        read_lcb(path, "train", max_private_bytes=2**20)


def test_truncated_last_line(fixture_copy):
    path = fixture_copy("lcb_train.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 500])
    with pytest.raises(DataError) as err:
        read_lcb(path, "train")
    msg = str(err.value)
    assert msg.startswith(f"{path}, line 20: not valid JSON (")
    assert "the file looks truncated" in msg and msg.endswith("expected one JSON object per line")


def test_missing_keys_are_named(fixture_copy):
    path = _break(fixture_copy, lambda rows: rows[2].pop("metadata"))
    with pytest.raises(DataError, match=r"line 3: missing keys \['metadata'\]; expected the LCB keys"):
        read_lcb(path, "train")


def test_functional_without_func_name(fixture_copy):
    path = _break(fixture_copy, lambda rows: rows[1].update(metadata="{}"))
    with pytest.raises(
        DataError, match=r"line 2 \(question_id 9001\): functional tests without metadata.func_name"
    ):
        read_lcb(path, "train")


def test_functional_test_that_is_not_json(fixture_copy):
    bad = json.dumps([{"input": "[1, 2", "output": "3", "testtype": "functional"}])
    path = _break(fixture_copy, lambda rows: rows[1].update(public_test_cases=bad))
    with pytest.raises(DataError, match=r"public_test_cases: functional test is not JSON"):
        read_lcb(path, "train")


def test_duplicate_question_id(fixture_copy):
    path = _break(fixture_copy, lambda rows: rows[5].update(question_id=rows[0]["question_id"]))
    with pytest.raises(DataError, match=r"line 6: duplicate question_id 'abc300_a' \(first seen on line 1\)"):
        read_lcb(path, "train")


def test_empty_file(fixture_copy):
    path = fixture_copy("lcb_train.jsonl")
    path.write_text("")
    with pytest.raises(DataError, match="file is empty; expected code_generation_lite JSONL"):
        read_lcb(path, "train")
