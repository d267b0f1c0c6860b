import hashlib
import subprocess
import sys

import pytest

from atlas.data.gpqa import option_permutation, read_gpqa
from atlas.data.schema import DataError, Question
from conftest import FIXTURES, read_csv, write_csv


def test_reads_fixture_and_stores_permutation_and_letter():
    questions = read_gpqa(FIXTURES / "gpqa_train.csv", "train")
    header, rows = read_csv(FIXTURES / "gpqa_train.csv")
    assert len(questions) == len(rows) == 24
    col = {name: header.index(name) for name in header}
    for q, row in zip(questions, rows, strict=True):
        assert q.question_uid == f"gpqa:{row[col['Record ID']]}"
        assert q.source == "gpqa" and q.split == "train"
        assert q.question == row[col["Question"]].strip()
        original = [row[col["Correct Answer"]]] + [row[col[f"Incorrect Answer {k}"]] for k in (1, 2, 3)]
        assert sorted(q.permutation) == [0, 1, 2, 3]
        assert q.options == [original[i].strip() for i in q.permutation]
        assert q.options["ABCD".index(q.correct_letter)] == row[col["Correct Answer"]].strip()
        assert q.subdomain == row[col["Subdomain"]] and q.domain == row[col["High-level domain"]]
        assert q.origin.startswith(str(FIXTURES / "gpqa_train.csv") + ":row ")
    # The correct answer is not always in one place: the shuffle actually moves it.
    assert len({q.correct_letter for q in questions}) >= 3


def test_permutation_is_a_pinned_function_of_the_record_id():
    # The pinned definition: the original options ordered by the sha256 of
    # "atlas/gpqa-options/v1:<record id>:<original index>" (a changed salt reshuffles every question).
    digests = [
        hashlib.sha256(f"atlas/gpqa-options/v1:recABCDEFGHIJKLMN:{i}".encode()).hexdigest() for i in range(4)
    ]
    assert (
        option_permutation("recABCDEFGHIJKLMN") == sorted(range(4), key=digests.__getitem__) == [0, 2, 3, 1]
    )
    assert option_permutation("rec00000000000001") == [2, 0, 3, 1]


def test_permutation_is_stable_across_processes():
    ids = [f"rec{i:014d}" for i in range(50)]
    code = (
        "import json,sys; from atlas.data.gpqa import option_permutation;"
        f"print(json.dumps([option_permutation(i) for i in {ids!r}]))"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout
        for seed in (1, 2)
    ]
    assert outs[0] == outs[1]
    assert eval(outs[0]) == [option_permutation(i) for i in ids]
    # All 24 orders are reachable; a seeded-per-question shuffle spreads them.
    assert len({tuple(option_permutation(i)) for i in ids}) > 12


def _break(fixture_copy, mutate):
    path = fixture_copy("gpqa_train.csv")
    header, rows = read_csv(path)
    header, rows = mutate(header, rows)
    write_csv(path, header, rows)
    return path


def test_missing_column_is_named(fixture_copy):
    def drop_record_id(header, rows):
        i = header.index("Record ID")
        return header[:i] + header[i + 1 :], [r[:i] + r[i + 1 :] for r in rows]

    path = _break(fixture_copy, drop_record_id)
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == (
        f"{path}, header: missing columns ['Record ID']; expected the GPQA columns "
        "['Question', 'Correct Answer', 'Incorrect Answer 1', 'Incorrect Answer 2', 'Incorrect Answer 3', 'Record ID']"
    )


def test_duplicate_record_id_names_both_rows(fixture_copy):
    def duplicate(header, rows):
        i = header.index("Record ID")
        rows[4][i] = rows[1][i]
        return header, rows

    path = _break(fixture_copy, duplicate)
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    msg = str(err.value)
    assert msg.startswith(f"{path}, row 5: duplicate Record ID ")
    assert "(first seen in row 2)" in msg and msg.endswith("expected unique Record IDs")


def test_empty_required_field_is_named(fixture_copy):
    def blank(header, rows):
        rows[2][header.index("Correct Answer")] = "  "
        return header, rows

    path = _break(fixture_copy, blank)
    with pytest.raises(DataError, match=r"row 3: empty 'Correct Answer'; expected a non-empty value"):
        read_gpqa(path, "train")


def test_empty_file(fixture_copy):
    path = fixture_copy("gpqa_train.csv")
    path.write_bytes(b"")
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == f"{path}: file is empty; expected a GPQA CSV with a header row and data rows"


def test_header_only(fixture_copy):
    path = fixture_copy("gpqa_train.csv")
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    with pytest.raises(DataError, match="no data rows after the header; expected one row per question"):
        read_gpqa(path, "train")


def test_truncated_inside_a_quoted_field(fixture_copy):
    path = fixture_copy("gpqa_train.csv")
    text = path.read_text()
    cut = text.index('"', len(text) // 2) + 5  # inside a quoted field
    path.write_text(text[:cut])
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    msg = str(err.value)
    assert msg.startswith(f"{path}, line ")
    assert "malformed CSV" in msg and "truncated" in msg
    assert msg.endswith("expected RFC 4180 CSV with every quoted field closed")


def test_truncated_row_has_too_few_fields(fixture_copy):
    path = _break(fixture_copy, lambda h, rows: (h, rows[:-1] + [rows[-1][:7]]))
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == (
        f"{path}, row 24: 7 fields, the header has 21; the file may be truncated; expected 21 fields per row"
    )


def test_correct_answer_equal_to_an_incorrect_one_is_refused(fixture_copy):
    def same(header, rows):
        # the same words with other spacing and a line break: still the same answer
        answer = rows[5][header.index("Correct Answer")]
        rows[5][header.index("Incorrect Answer 2")] = "  " + answer.replace(" ", "\r\n  ", 1) + " "
        return header, rows

    path = _break(fixture_copy, same)
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    msg = str(err.value)
    assert msg.startswith(f"{path}, row 6: 'Correct Answer' equals 'Incorrect Answer 2' ")
    assert msg.endswith("expected a correct answer that differs from every incorrect one")


def test_line_endings_inside_fields_are_normalised(fixture_copy):
    def multiline(header, rows):
        rows[0][header.index("Question")] = "First line.\r\nSecond line.\rThird line."
        rows[0][header.index("Incorrect Answer 1")] = "two\r\nlines"
        return header, rows

    path = _break(fixture_copy, multiline)  # write_csv ends rows with \r\n too
    assert b"First line.\r\nSecond line.\rThird" in path.read_bytes()
    q = read_gpqa(path, "train")[0]
    assert q.question == "First line.\nSecond line.\nThird line."
    assert "two\nlines" in q.options
    assert not any("\r" in o for q in read_gpqa(path, "train") for o in [q.question, *q.options])


HEADER = [
    "Record ID",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Subdomain",
    "High-level domain",
]


def small_csv(tmp_path, *rows):
    """A GPQA CSV as a spreadsheet exports it: a UTF-8 byte-order mark, CRLF line endings."""
    path = tmp_path / "gpqa.csv"
    write_csv(path, HEADER, [list(r) for r in rows])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    return path


def test_a_row_becomes_its_question_whole(tmp_path):
    row = ["rec00000000000001", " What  Is\r\n√4 + 2? ", "4", "3", "5", "22", "Arithmetic", ""]
    path = small_csv(tmp_path, row)
    # rec00000000000001's pinned permutation is [2, 0, 3, 1]: the correct answer shows at B.
    assert read_gpqa(path, "val") == [
        Question(
            question_uid="gpqa:rec00000000000001",
            source="gpqa",
            split="val",
            record_id="rec00000000000001",
            origin=f"{path}:row 1",
            question="What  Is\n√4 + 2?",
            text_sha256=hashlib.sha256("what is √4 + 2?".encode()).hexdigest(),
            options=["5", "4", "22", "3"],
            permutation=[2, 0, 3, 1],
            correct_letter="B",
            subdomain="Arithmetic",
            domain=None,
        )
    ]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_correct_answer_equal_to_any_incorrect_one_is_named(tmp_path, k):
    row = ["rec1", "Q?", "two  words", "a", "b", "c", "", ""]
    row[2 + k] = "two words"  # one space: the same answer
    path = small_csv(tmp_path, row)
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == (
        f"{path}, row 1: 'Correct Answer' equals 'Incorrect Answer {k}' ('two  words') after normalising "
        "whitespace, so the question has no single right option; expected a correct answer that differs "
        "from every incorrect one"
    )
    row[2 + k] = "two wordz"
    assert read_gpqa(small_csv(tmp_path, row), "train")[0].record_id == "rec1"


def test_empty_and_header_only_files_name_the_path(tmp_path):
    path = small_csv(
        tmp_path, ["rec1", "Q?", "a", "b", "c", "d", "", ""], ["rec2", " ", "a", "b", "c", "d", "", ""]
    )
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == f"{path}, row 2: empty 'Question'; expected a non-empty value"
    path = small_csv(tmp_path)
    with pytest.raises(DataError) as err:
        read_gpqa(path, "train")
    assert str(err.value) == f"{path}: no data rows after the header; expected one row per question"
