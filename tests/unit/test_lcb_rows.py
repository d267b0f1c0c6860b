"""The LiveCodeBench reader (atlas.data.lcb) on rows written out by hand: every field of the
Question it makes, the exact message of each refusal, and the file-level order and checks."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tracemalloc
import zlib

import pytest

from atlas.data.lcb import decode_private_tests, parse_row, read_lcb, unpickle_string
from atlas.data.schema import DataError, Question
from atlas.data.schema import TestCase as Case

PUBLIC = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
PRIVATE = [
    {"input": "5 7\n", "output": "12\n", "testtype": "stdin"},
    {"input": "0 0\n", "output": "0\n", "testtype": "stdin"},
]
TEST_SHAPE = 'a list of {"input": str, "output": str, "testtype": "stdin"|"functional"}'
PRIVATE_EXPECTED = "a JSON list of tests, or base64(zlib(pickle(JSON string)))"


def packed(payload: bytes) -> str:
    """base64(zlib(payload)): the upstream private-test encoding around any payload."""
    return base64.b64encode(zlib.compress(payload)).decode()


def encode(tests) -> str:
    return packed(pickle.dumps(json.dumps(tests)))


def row(**changes) -> dict:
    base = {
        "question_title": "Sum",
        "question_content": "Add  two\tNumbers.",
        "platform": "atcoder",
        "question_id": " abc001_a ",
        "contest_id": 1,
        "contest_date": "2023-01-02T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(PUBLIC),
        "private_test_cases": encode(PRIVATE),
        "metadata": "{}",
    }
    return base | changes


def stdin_tests(tests) -> list[Case]:
    return [Case("stdin", t["input"], t["output"]) for t in tests]


def test_a_stdin_row_becomes_this_question():
    q = parse_row(row(), "p.jsonl", 7, "val", 2**20)
    assert q == Question(
        question_uid="lcb:abc001_a",
        source="lcb",
        split="val",
        record_id="abc001_a",
        origin="p.jsonl:line 7",
        question="Add  two\tNumbers.",
        text_sha256=hashlib.sha256(b"add two numbers.").hexdigest(),
        title="Sum",
        platform="atcoder",
        contest_id="1",
        contest_date="2023-01-02T00:00:00",
        difficulty="easy",
        starter_code="",
        func_name=None,
        test_type="stdin",
        public_tests=stdin_tests(PUBLIC),
        private_tests=stdin_tests(PRIVATE),
    )


def test_a_functional_row_becomes_this_question():
    public = [{"input": "[1, 2]\n3", "output": "[3, 1, 2]", "testtype": "functional"}]
    private = [{"input": "[]\n\n5", "output": "[5]", "testtype": "functional"}]
    obj = row(
        question_id="9001",
        platform="leetcode",
        contest_id="weekly-1",
        difficulty="medium",
        starter_code="class Solution:\n    def push(self, nums, x):\n        ",
        public_test_cases=public,  # a JSON list as it is, not a string
        private_test_cases=json.dumps(private),  # the plain JSON encoding
        metadata={"func_name": "push"},
    )
    q = parse_row(obj, "f.jsonl", 2, "train", 2**20)
    assert q == Question(
        question_uid="lcb:9001",
        source="lcb",
        split="train",
        record_id="9001",
        origin="f.jsonl:line 2",
        question="Add  two\tNumbers.",
        text_sha256=hashlib.sha256(b"add two numbers.").hexdigest(),
        title="Sum",
        platform="leetcode",
        contest_id="weekly-1",
        contest_date="2023-01-02T00:00:00",
        difficulty="medium",
        starter_code="class Solution:\n    def push(self, nums, x):\n        ",
        func_name="push",
        test_type="functional",
        public_tests=[Case("functional", "[1, 2]\n3", "[3, 1, 2]")],
        private_tests=[Case("functional", "[]\n\n5", "[5]")],
    )


@pytest.mark.parametrize("metadata", ["", "  ", {"func_name": 5}, '{"func_name": ["f"]}'])
def test_a_stdin_row_has_no_function_name(metadata):
    """Blank metadata reads as {}; a func_name that is not a string is no function name."""
    assert parse_row(row(metadata=metadata), "p.jsonl", 1, "val", 2**20).func_name is None


W = "p.jsonl, line 7 (question_id abc001_a)"
FUNCTIONAL = json.dumps([{"input": "[1]", "output": "1", "testtype": "functional"}])
LONG_INPUT = "z" * 200


@pytest.mark.parametrize(
    "obj, message",
    [
        ([1, 2], "p.jsonl, line 7: a JSON list; expected one JSON object per line"),
        (
            {k: v for k, v in row().items() if k != "difficulty"},
            "p.jsonl, line 7: missing keys ['difficulty']; expected the LCB keys ['question_title', "
            "'question_content', 'platform', 'question_id', 'contest_id', 'contest_date', 'starter_code', "
            "'difficulty', 'public_test_cases', 'private_test_cases', 'metadata']",
        ),
        (row(starter_code=3), "p.jsonl, line 7: starter_code is a int; expected a string"),
        (
            row(question_id=" \t"),
            "p.jsonl, line 7: empty question_id or question_content; expected non-empty strings",
        ),
        (
            row(question_content="\n"),
            "p.jsonl, line 7: empty question_id or question_content; expected non-empty strings",
        ),
        (
            row(public_test_cases="[{"),
            f"{W}: public_test_cases is not JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 3 (char 2)); expected a JSON list",
        ),
        (row(public_test_cases="{}"), f"{W}: public_test_cases is a dict; expected {TEST_SHAPE}"),
        (row(private_test_cases=encode("[]")), f"{W}: private_test_cases is a str; expected {TEST_SHAPE}"),
        (row(public_test_cases=["x"]), f"{W}: public_test_cases[0] is malformed: 'x'; expected {TEST_SHAPE}"),
        (
            row(public_test_cases=[PUBLIC[0] | {"input": 1}]),
            f"{W}: public_test_cases[0] is malformed: "
            "\"{'input': 1, 'output': '3\\\\n', 'testtype': 'stdin'}\"; "
            f"expected {TEST_SHAPE}",
        ),
        (
            row(private_test_cases=encode([PRIVATE[0], PRIVATE[1] | {"output": None}])),
            f"{W}: private_test_cases[1] is malformed: "
            "\"{'input': '0 0\\\\n', 'output': None, 'testtype': 'stdin'}\"; "
            f"expected {TEST_SHAPE}",
        ),
        (
            row(public_test_cases=[PUBLIC[0] | {"testtype": "Stdin"}]),
            f"{W}: public_test_cases[0] is malformed: "
            "\"{'input': '1 2\\\\n', 'output': '3\\\\n', 'testtype': 'Stdin'}\"; "
            f"expected {TEST_SHAPE}",
        ),
        (
            # the test is shown cut to its first 120 characters
            row(public_test_cases=[{"input": LONG_INPUT, "output": "", "testtype": "x"}]),
            f"{W}: public_test_cases[0] is malformed: {str({'input': LONG_INPUT})[:120]!r}; "
            f"expected {TEST_SHAPE}",
        ),
        (
            row(public_test_cases="[]", private_test_cases="[]"),
            f"{W}: no tests; expected at least one public or private test",
        ),
        (
            row(private_test_cases=FUNCTIONAL),
            f"{W}: mixed test types ['functional', 'stdin']; expected one test type per problem",
        ),
        (
            row(metadata="{func_name: f}"),
            f"{W}: metadata is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
            "(char 1)); expected a JSON object",
        ),
        (row(metadata='["f"]'), f"{W}: metadata is a list; expected a JSON object"),
        (row(metadata=None), f"{W}: metadata is a NoneType; expected a JSON object"),
        (
            row(public_test_cases=FUNCTIONAL, private_test_cases="[]", metadata={"func_name": ""}),
            f'{W}: functional tests without metadata.func_name; expected metadata {{"func_name": ...}}',
        ),
        (
            row(
                public_test_cases=FUNCTIONAL,
                private_test_cases=encode([{"input": "[1]\n\n{", "output": "1", "testtype": "functional"}]),
                metadata='{"func_name": "f"}',
            ),
            f"{W}: private_test_cases: functional test is not JSON (Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1)); expected one JSON value per input line",
        ),
        (
            row(
                public_test_cases=json.dumps([{"input": "[1]", "output": "[1", "testtype": "functional"}]),
                private_test_cases="[]",
                metadata='{"func_name": "f"}',
            ),
            f"{W}: public_test_cases: functional test is not JSON (Expecting ',' delimiter: line 1 column 3 "
            "(char 2)); expected one JSON value per input line",
        ),
    ],
)
def test_each_refusal_names_the_row_and_what_was_expected(obj, message):
    with pytest.raises(DataError) as err:
        parse_row(obj, "p.jsonl", 7, "val", 2**20)
    assert str(err.value) == message


def undecodable(blob: str, problem: str, max_bytes: int = 2**20) -> None:
    with pytest.raises(DataError) as err:
        parse_row(row(private_test_cases=blob), "p.jsonl", 7, "val", max_bytes)
    assert str(err.value) == f"{W}: undecodable private_test_cases ({problem}); expected {PRIVATE_EXPECTED}"


def test_private_tests_inflate_up_to_the_limit_and_no_further():
    payload = pickle.dumps(json.dumps(PRIVATE))
    assert decode_private_tests(packed(payload), len(payload)) == PRIVATE
    undecodable(
        packed(payload),
        f"ValueError: inflates beyond the {len(payload) - 1}-byte limit (data.max_private_tests_bytes)",
        max_bytes=len(payload) - 1,
    )


def test_a_zip_bomb_is_never_inflated_past_the_limit():
    """32 MiB of zeros packed into ~45 KB: the inflater stops one byte past the 1 MiB limit, so the
    refusal never holds the whole output in memory."""
    bomb = packed(bytes(32 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="inflates beyond the 1048576-byte limit"):
            decode_private_tests(bomb, 2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_a_cut_short_or_impure_blob_is_refused():
    compressed = zlib.compress(pickle.dumps(json.dumps(PRIVATE)))
    undecodable(base64.b64encode(compressed[:-4]).decode(), "ValueError: zlib stream is incomplete")
    blob = encode(PRIVATE)
    # Outside the base64 alphabet: refused, not skipped over.
    undecodable(blob[:8] + "*" + blob[8:], "Error: Only base64 data is allowed")
    undecodable(blob[:8] + "\n" + blob[8:], "Error: Only base64 data is allowed")


def test_a_persistent_id_is_refused():
    class WithPersistentIds(pickle.Pickler):
        def persistent_id(self, obj):
            return "outside" if obj == "[]" else None

    buf = io.BytesIO()
    WithPersistentIds(buf).dump("[]")
    with pytest.raises(pickle.UnpicklingError) as err:
        unpickle_string(buf.getvalue())
    assert str(err.value) == "refused persistent id: only a plain str is admitted"


def lines_of(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_file_is_read_in_order_past_blank_lines(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text(
        "\n"
        + lines_of(row(question_id="b"))
        + "  \n\n"
        + lines_of(row(question_id="a"), row(question_id="c")),
        encoding="utf-8",
    )
    questions = read_lcb(path, "train")
    assert [(q.record_id, q.split, q.origin) for q in questions] == [
        ("b", "train", f"{path}:line 2"),
        ("a", "train", f"{path}:line 5"),
        ("c", "train", f"{path}:line 6"),
    ]


def test_progress_is_called_every_50_problems(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text(lines_of(*(row(question_id=f"q{i}") for i in range(120))), encoding="utf-8")
    calls = []
    questions = read_lcb(path, "val", progress=calls.append)
    assert calls == [50, 100]
    assert [q.record_id for q in questions] == [f"q{i}" for i in range(120)]
    assert [q.record_id for q in read_lcb(path, "val")] == [f"q{i}" for i in range(120)]


def test_private_tests_given_as_a_json_list_are_read_as_they_are():
    q = parse_row(row(private_test_cases=PRIVATE), "p.jsonl", 1, "val", 2**20)
    assert q.private_tests == stdin_tests(PRIVATE)


def test_a_file_is_read_as_utf8_whatever_the_locale(tmp_path):
    """A node whose locale is ASCII (LC_ALL=C, no UTF-8 mode) still reads the file's UTF-8 text."""
    path = tmp_path / "lcb.jsonl"
    path.write_text(
        json.dumps(row(question_content="Café: ∑ of a, b"), ensure_ascii=False) + "\n", encoding="utf-8"
    )
    env = os.environ | {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    script = "import sys; from atlas.data.lcb import read_lcb; print(ascii(read_lcb(sys.argv[1], 'val')[0].question))"
    done = subprocess.run(
        [sys.executable, "-X", "utf8=0", "-c", script, str(path)], env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, ascii("Café: ∑ of a, b") + "\n"), done.stderr


def refusal(path, **kwargs) -> str:
    with pytest.raises(DataError) as err:
        read_lcb(path, "train", **kwargs)
    return str(err.value)


def test_file_level_refusals_name_the_file_and_line(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text("", encoding="utf-8")
    assert (
        refusal(path) == f"{path}: file is empty; expected code_generation_lite JSONL, one problem per line"
    )
    path.write_text("\n \n\n", encoding="utf-8")
    assert refusal(path) == f"{path}: no problems (only blank lines); expected one JSON object per line"

    first = lines_of(row(question_id="q1"))
    path.write_text(first + '{"question_id": "q2"\n' + first, encoding="utf-8")
    assert refusal(path) == (
        f"{path}, line 2: not valid JSON (Expecting ',' delimiter: line 2 column 1 (char 21)); "
        "expected one JSON object per line"
    )
    path.write_text(first + '{"question_id": "q2"', encoding="utf-8")
    assert refusal(path) == (
        f"{path}, line 2: not valid JSON (Expecting ',' delimiter: line 1 column 21 (char 20)); "
        "the file looks truncated; expected one JSON object per line"
    )
    path.write_text(first + lines_of(row(question_id="q2")) + first, encoding="utf-8")
    assert refusal(path) == (
        f"{path}, line 3: duplicate question_id 'q1' (first seen on line 1); expected unique question_ids"
    )
