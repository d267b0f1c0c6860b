"""LiveCodeBench code_generation_lite JSONL reader.

Each line is one problem. `public_test_cases` is a JSON list of {input, output, testtype}.
`private_test_cases` is either the same JSON, or base64 -> zlib -> pickle -> JSON string (the
upstream encoding). Unpickling downloaded data can run code, so the pickle is read by an unpickler
that admits only a plain `str`: no globals, no persistent ids, no other result type.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atlas.data.schema import DataError, Question, TestCase, text_sha256

REQUIRED_KEYS = (
    "question_title",
    "question_content",
    "platform",
    "question_id",
    "contest_id",
    "contest_date",
    "starter_code",
    "difficulty",
    "public_test_cases",
    "private_test_cases",
    "metadata",
)
TEST_TYPES = ("stdin", "functional")
PRIVATE_EXPECTED = "a JSON list of tests, or base64(zlib(pickle(JSON string)))"


class _StringsOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}: only a plain str is admitted")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id: only a plain str is admitted")


def unpickle_string(data: bytes) -> str:
    """Load a pickle that holds one plain str; anything else raises pickle.UnpicklingError."""
    value = _StringsOnlyUnpickler(io.BytesIO(data)).load()
    if type(value) is not str:
        raise pickle.UnpicklingError(f"pickle holds a {type(value).__name__}, only a plain str is admitted")
    return value


def decode_private_tests(blob: str, max_bytes: int) -> Any:
    """The JSON value of an LCB private_test_cases field, in either upstream encoding."""
    try:
        return json.loads(blob)
    except json.JSONDecodeError:
        pass
    compressed = base64.b64decode(blob.encode("ascii"), validate=True)
    inflater = zlib.decompressobj()
    raw = inflater.decompress(compressed, max_bytes + 1)
    if len(raw) > max_bytes:
        raise ValueError(f"inflates beyond the {max_bytes}-byte limit (data.max_private_tests_bytes)")
    if not inflater.eof:
        raise ValueError("zlib stream is incomplete")
    return json.loads(unpickle_string(raw))


def _parse_tests(value: Any, path: str, where: str, key: str) -> list[TestCase]:
    expected = 'a list of {"input": str, "output": str, "testtype": "stdin"|"functional"}'
    if not isinstance(value, list):
        raise DataError(path, where, f"{key} is a {type(value).__name__}", expected)
    tests = []
    for i, t in enumerate(value):
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("input"), str)
            or not isinstance(t.get("output"), str)
            or t.get("testtype") not in TEST_TYPES
        ):
            raise DataError(path, where, f"{key}[{i}] is malformed: {str(t)[:120]!r}", expected)
        tests.append(TestCase(testtype=t["testtype"], input=t["input"], output=t["output"]))
    return tests


def _check_functional(test: TestCase, path: str, where: str, key: str) -> None:
    # Each input line is one JSON argument and the output one JSON value: check now, not mid-run.
    try:
        for line in test.input.split("\n"):
            if line.strip():
                json.loads(line)
        json.loads(test.output)
    except json.JSONDecodeError as err:
        raise DataError(
            path, where, f"{key}: functional test is not JSON ({err})", "one JSON value per input line"
        ) from None


def parse_row(obj: Any, path: str, line: int, split: str, max_private: int) -> Question:
    """One decoded code_generation_lite row as a Question, checked the way `read_lcb` checks every
    line; errors name `path` and `line`. The grader CLI uses it for a single-row file."""
    where = f"line {line}"
    if not isinstance(obj, dict):
        raise DataError(path, where, f"a JSON {type(obj).__name__}", "one JSON object per line")
    missing = [k for k in REQUIRED_KEYS if k not in obj]
    if missing:
        raise DataError(path, where, f"missing keys {missing}", f"the LCB keys {list(REQUIRED_KEYS)}")
    for k in ("question_title", "question_content", "question_id", "platform", "starter_code"):
        if not isinstance(obj[k], str):
            raise DataError(path, where, f"{k} is a {type(obj[k]).__name__}", "a string")
    qid = obj["question_id"].strip()
    if not qid or not obj["question_content"].strip():
        raise DataError(path, where, "empty question_id or question_content", "non-empty strings")
    where = f"{where} (question_id {qid})"

    public_raw = obj["public_test_cases"]
    if isinstance(public_raw, str):
        try:
            public_raw = json.loads(public_raw)
        except json.JSONDecodeError as err:
            raise DataError(path, where, f"public_test_cases is not JSON ({err})", "a JSON list") from None
    public = _parse_tests(public_raw, path, where, "public_test_cases")

    private_raw = obj["private_test_cases"]
    if isinstance(private_raw, str):
        try:
            private_raw = decode_private_tests(private_raw, max_private)
        except (ValueError, binascii.Error, zlib.error, pickle.UnpicklingError, EOFError) as err:
            raise DataError(
                path, where, f"undecodable private_test_cases ({type(err).__name__}: {err})", PRIVATE_EXPECTED
            ) from None
    private = _parse_tests(private_raw, path, where, "private_test_cases")

    tests = public + private
    if not tests:
        raise DataError(path, where, "no tests", "at least one public or private test")
    types = {t.testtype for t in tests}
    if len(types) > 1:
        raise DataError(path, where, f"mixed test types {sorted(types)}", "one test type per problem")
    test_type = types.pop()

    metadata = obj["metadata"]
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip() else {}
        except json.JSONDecodeError as err:
            raise DataError(path, where, f"metadata is not JSON ({err})", "a JSON object") from None
    if not isinstance(metadata, dict):
        raise DataError(path, where, f"metadata is a {type(metadata).__name__}", "a JSON object")
    func_name = metadata.get("func_name")
    if test_type == "functional":
        if not isinstance(func_name, str) or not func_name:
            raise DataError(
                path, where, "functional tests without metadata.func_name", 'metadata {"func_name": ...}'
            )
        for key, group in (("public_test_cases", public), ("private_test_cases", private)):
            for t in group:
                _check_functional(t, path, where, key)

    return Question(
        question_uid=f"lcb:{qid}",
        source="lcb",
        split=split,
        record_id=qid,
        origin=f"{path}:line {line}",
        question=obj["question_content"],
        text_sha256=text_sha256(obj["question_content"]),
        title=obj["question_title"],
        platform=obj["platform"],
        contest_id=str(obj["contest_id"]),
        contest_date=str(obj["contest_date"]),
        difficulty=str(obj["difficulty"]),
        starter_code=obj["starter_code"],
        func_name=func_name if isinstance(func_name, str) else None,
        test_type=test_type,
        public_tests=public,
        private_tests=private,
    )


def read_lcb(
    path: str | Path,
    split: str,
    max_private_bytes: int = 256 * 2**20,
    progress: Callable[[int], None] | None = None,
) -> list[Question]:
    """Every problem in the file, in file order; `progress(n)` is called every 50 problems
    (upstream files are up to ~1 GB)."""
    path = str(path)
    if Path(path).stat().st_size == 0:
        raise DataError(path, None, "file is empty", "code_generation_lite JSONL, one problem per line")
    questions: list[Question] = []
    first_line_of: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                hint = "; the file looks truncated" if not line.endswith("\n") else ""
                raise DataError(
                    path, where, f"not valid JSON ({err}){hint}", "one JSON object per line"
                ) from None
            q = parse_row(obj, path, n, split, max_private_bytes)
            if q.record_id in first_line_of:
                raise DataError(
                    path,
                    where,
                    f"duplicate question_id {q.record_id!r} (first seen on line {first_line_of[q.record_id]})",
                    "unique question_ids",
                )
            first_line_of[q.record_id] = n
            questions.append(q)
            if progress is not None and len(questions) % 50 == 0:
                progress(len(questions))
    if not questions:
        raise DataError(path, None, "no problems (only blank lines)", "one JSON object per line")
    return questions
