#!/usr/bin/env python
"""Write the synthetic fixtures in resources/fixtures/ (deterministic; no real GPQA or LCB rows).

    python scripts/make_fixtures.py [--out resources/fixtures]

Files, in the exact upstream formats:
  gpqa_train.csv, gpqa_val.csv     GPQA CSV column layout (Record ID, Question, Correct Answer, ...)
  lcb_train.jsonl, lcb_val.jsonl   LiveCodeBench code_generation_lite rows: stdin and functional
                                   problems; private tests as plain JSON on some rows and as
                                   base64(zlib(pickle(JSON string))) on others
  lcb_solutions.json               our reference solution per question_id (not an upstream file;
                                   for grader tests)
Every question is written here from templates; the answers and tests are computed, so they are right.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import pickle
import random
import zlib
from pathlib import Path

GPQA_COLUMNS = [
    "Pre-Revision Question",
    "Pre-Revision Correct Answer",
    "Pre-Revision Incorrect Answer 1",
    "Pre-Revision Incorrect Answer 2",
    "Pre-Revision Incorrect Answer 3",
    "Pre-Revision Explanation",
    "Self-reported question-writing time (minutes)",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Explanation",
    "Revision Comments (from Question Writer)",
    "Subdomain",
    "Writer's Difficulty Estimate",
    "Non-Expert Validator Accuracy",
    "Expert Validator Accuracy",
    "Record ID",
    "High-level domain",
    "Question Writer",
]


def _num(x: float) -> str:
    return f"{x:.3g}" if isinstance(x, float) and not float(x).is_integer() else str(int(x))


def _distinct(correct: str, wrong: list[str], extra: list[str]) -> list[str]:
    out: list[str] = []
    for w in wrong + extra:
        if w != correct and w not in out:
            out.append(w)
    return out[:3]


def gpqa_question(kind: int, rng: random.Random) -> dict[str, str]:
    """One synthetic multiple-choice science question: (text, correct, 3 wrong, explanation, field)."""
    if kind == 0:
        m, a = rng.randint(2, 40), rng.randint(2, 12)
        text = (
            f"A cart of mass {m} kg rolls on a level, frictionless track and speeds up uniformly at "
            f"{a} m/s^2.\nWhat is the magnitude of the net force acting on the cart?"
        )
        c, w = f"{m * a} N", [f"{m + a} N", f"{2 * m * a} N", f"{_num(m / a)} N"]
        e, sub, dom = "Newton's second law gives F = m a.", "Physics (general)", "Physics"
    elif kind == 1:
        r, i = rng.randint(2, 90), rng.randint(2, 9)
        text = f'A resistor marked "{r} ohm" carries a steady current of {i} A. How much power does it dissipate?'
        c, w = f"{i * i * r} W", [f"{i * r} W", f"{_num(r / i)} W", f"{i * i * r * 2} W"]
        e, sub, dom = "P = I^2 R.", "Electromagnetism and Photonics", "Physics"
    elif kind == 2:
        lam = rng.choice([124, 155, 248, 310, 413, 496, 620, 124 * 4])
        text = f"A photon has a wavelength of {lam} nm. Using hc = 1240 eV nm, what is its energy?"
        c, w = (
            f"{_num(1240 / lam)} eV",
            [f"{_num(lam / 1240)} eV", f"{_num(2480 / lam)} eV", f"{_num(620 / lam)} eV"],
        )
        e, sub, dom = "E = hc / lambda.", "Quantum Mechanics", "Physics"
    elif kind == 3:
        name, mm = rng.choice([("NaCl", 58.44), ("H2O", 18.02), ("CO2", 44.01), ("glucose", 180.16)])
        n = rng.randint(2, 9)
        g = round(n * mm, 2)
        text = f"How many moles of {name} are in {g} g of the pure substance (molar mass {mm} g/mol)?"
        c, w = f"{n} mol", [f"{n * 2} mol", f"{_num(n / 2)} mol", f"{n + 1} mol"]
        e, sub, dom = "n = m / M.", "Chemistry (general)", "Chemistry"
    elif kind == 4:
        p = rng.randint(2, 12)
        text = f"An aqueous solution at 25 C has [H+] = 1e-{p} mol/L. What is its pH, to the nearest whole number?"
        c, w = f"{p}", [f"{14 - p}", f"{p + 1}", f"{p - 1}"]
        e, sub, dom = "pH = -log10[H+].", "Physical Chemistry", "Chemistry"
    elif kind == 5:
        n = rng.randint(3, 40)
        text = f"A diploid eukaryote has {n} pairs of homologous chromosomes. How many chromosomes does one of its haploid gametes carry?"
        c, w = f"{n}", [f"{2 * n}", f"{4 * n}", f"{n + 2}"]
        e, sub, dom = "Meiosis halves the chromosome number.", "Genetics", "Biology"
    else:
        d, c0, h = rng.choice([2, 3, 4, 5]), rng.randint(10, 90), 0
        h = d * rng.randint(2, 5)
        text = f"A bacterial culture doubles every {d} hours. Starting from {c0} cells, how many cells are present after {h} hours?"
        c, w = (
            f"{c0 * 2 ** (h // d)}",
            [f"{c0 * 2 * (h // d)}", f"{c0 * 2 ** (h // d + 1)}", f"{c0 + 2 ** (h // d)}"],
        )
        e, sub, dom = "N = N0 2^(t/T).", "Molecular Biology", "Biology"
    wrong = _distinct(c, w, [f"none of {c}", f"twice {c}", f"half of {c}"])
    return {
        "Question": text,
        "Correct Answer": c,
        "Incorrect": wrong,
        "Explanation": e,
        "Subdomain": sub,
        "High-level domain": dom,
    }


def gpqa_rows(n: int, rng: random.Random, seen: set[str], split: str) -> list[dict[str, str]]:
    rows = []
    while len(rows) < n:
        q = gpqa_question(len(rows) % 7, rng)
        if q["Question"] in seen:
            continue
        seen.add(q["Question"])
        rid = "rec" + hashlib.sha256(f"{split}:{q['Question']}".encode()).hexdigest()[:14]
        row = {col: "" for col in GPQA_COLUMNS}
        row.update(
            {
                "Pre-Revision Question": q["Question"],
                "Pre-Revision Correct Answer": q["Correct Answer"],
                "Pre-Revision Explanation": q["Explanation"],
                "Self-reported question-writing time (minutes)": str(rng.randint(10, 60)),
                "Question": q["Question"],
                "Correct Answer": q["Correct Answer"],
                "Explanation": q["Explanation"],
                "Subdomain": q["Subdomain"],
                "Writer's Difficulty Estimate": rng.choice(
                    [
                        "Easy undergraduate level (or easier)",
                        "Hard undergraduate level (could be a question on a hard undergraduate exam for students majoring in the subject)",
                    ]
                ),
                "Non-Expert Validator Accuracy": rng.choice(["0.0", "0.33", "0.67"]),
                "Expert Validator Accuracy": rng.choice(["0.5", "1.0"]),
                "Record ID": rid,
                "High-level domain": q["High-level domain"],
                "Question Writer": "synthetic",
            }
        )
        for k, w in enumerate(q["Incorrect"], start=1):
            row[f"Incorrect Answer {k}"] = w
            row[f"Pre-Revision Incorrect Answer {k}"] = w
        rows.append(row)
    return rows


def write_gpqa(path: Path, rows: list[dict[str, str]]) -> None:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=GPQA_COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8", newline="")


# ---- LiveCodeBench: problems with reference solutions; tests computed from them ----


def stdin_problem(kind: int, k: int, rng: random.Random) -> tuple[str, str, str, list[tuple[str, str]]]:
    """(title, statement, solution, tests) for a standard-input problem."""
    if kind == 0:
        title = f"Sum Modulo {k}"
        text = (
            f"You are given N integers A_1, ..., A_N. Print (A_1 + ... + A_N) mod {k}.\n\n"
            "Input\nThe first line holds N. The second line holds A_1 ... A_N separated by spaces.\n\n"
            "Output\nPrint one integer.\n\nConstraints\n1 <= N <= 100\n0 <= A_i <= 10^9"
        )
        sol = f"n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) % {k})\n"

        def make() -> tuple[str, str]:
            a = [rng.randint(0, 10**9) for _ in range(rng.randint(1, 8))]
            return f"{len(a)}\n{' '.join(map(str, a))}\n", f"{sum(a) % k}\n"

    elif kind == 1:
        ch = "abcdefghijklmnopqrstuvwxyz"[k % 26]
        title = f"Count the Letter {ch.upper()} ({k})"
        text = (
            f"Given a string S of lowercase English letters, print the number of times the letter '{ch}' "
            f"occurs in S plus {k}, then print S with every '{ch}' removed (an empty line if nothing is left).\n\n"
            "Input\nS\n\nOutput\nTwo lines."
        )
        sol = f"s = input().strip()\nprint(s.count({ch!r}) + {k})\nprint(s.replace({ch!r}, ''))\n"

        def make() -> tuple[str, str]:
            s = "".join(rng.choice("abcdefghij" + ch * 3) for _ in range(rng.randint(1, 20)))
            return f"{s}\n", f"{s.count(ch) + k}\n{s.replace(ch, '')}\n"

    else:
        title = f"Spread Plus {k}"
        text = (
            f"Given N integers, print (max - min) + {k}.\n\n"
            "Input\nN on the first line, then N integers on the second line.\n\nOutput\nOne integer."
        )
        sol = f"input()\na = list(map(int, input().split()))\nprint(max(a) - min(a) + {k})\n"

        def make() -> tuple[str, str]:
            a = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 9))]
            return f"{len(a)}\n{' '.join(map(str, a))}\n", f"{max(a) - min(a) + k}\n"

    return title, text, sol, [make() for _ in range(5)]


def functional_problem(
    kind: int, k: int, rng: random.Random
) -> tuple[str, str, str, str, str, list[tuple[str, str]]]:
    """(title, statement, func_name, starter_code, solution, tests) for a LeetCode-style problem."""
    if kind == 0:
        fn, title = "countPairs", f"Count Pairs With Sum Above {k}"
        text = f"Given an integer array nums, return the number of index pairs (i, j) with i < j and nums[i] + nums[j] > {k}."
        starter = f"class Solution:\n    def {fn}(self, nums: List[int]) -> int:\n        "
        sol = (
            "from typing import List\n\nclass Solution:\n"
            f"    def {fn}(self, nums: List[int]) -> int:\n"
            f"        return sum(1 for i in range(len(nums)) for j in range(i + 1, len(nums)) if nums[i] + nums[j] > {k})\n"
        )

        def make() -> tuple[str, str]:
            a = [rng.randint(-20, 40) for _ in range(rng.randint(1, 8))]
            n = sum(1 for i in range(len(a)) for j in range(i + 1, len(a)) if a[i] + a[j] > k)
            return json.dumps(a), json.dumps(n)

    elif kind == 1:
        fn, title = "isShiftedPalindrome", f"Palindrome After Shift {k}"
        text = f"Given a string s, shift every letter forward by {k} positions in the alphabet (wrapping z to a) and return true if the result is a palindrome."
        starter = f"class Solution:\n    def {fn}(self, s: str) -> bool:\n        "
        sol = (
            "class Solution:\n"
            f"    def {fn}(self, s: str) -> bool:\n"
            f"        t = ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) for c in s)\n"
            "        return t == t[::-1]\n"
        )

        def make() -> tuple[str, str]:
            half = "".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 4)))
            s = half + half[::-1] if rng.random() < 0.5 else half + "q"
            return json.dumps(s), json.dumps(s == s[::-1])

    else:
        fn, title = "rotateAndAdd", f"Rotate Left Then Add {k}"
        text = f"Given an integer array nums and an integer r, rotate nums left by r positions and add {k} to every element. Return the new array."
        starter = f"class Solution:\n    def {fn}(self, nums: List[int], r: int) -> List[int]:\n        "
        sol = (
            "from typing import List\n\nclass Solution:\n"
            f"    def {fn}(self, nums: List[int], r: int) -> List[int]:\n"
            "        r %= len(nums)\n"
            f"        return [x + {k} for x in nums[r:] + nums[:r]]\n"
        )

        def make() -> tuple[str, str]:
            a = [rng.randint(0, 50) for _ in range(rng.randint(1, 7))]
            r = rng.randint(0, 10)
            rr = r % len(a)
            return f"{json.dumps(a)}\n{r}", json.dumps([x + k for x in a[rr:] + a[:rr]])

    return title, text, fn, starter, sol, [make() for _ in range(5)]


def encode_private(tests: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode("ascii")


def lcb_rows(n: int, rng: random.Random, start: int, solutions: dict[str, str]) -> list[dict]:
    rows = []
    for i in range(n):
        idx = start + i
        k = 3 + idx
        functional = i % 2 == 1
        if functional:
            title, text, fn, starter, sol, tests = functional_problem(i % 3, k, rng)
            platform, qid, meta, ttype = (
                "leetcode",
                f"{9000 + idx}",
                json.dumps({"func_name": fn}),
                "functional",
            )
        else:
            title, text, sol, tests = stdin_problem(i % 3, k, rng)
            starter, platform, meta, ttype = (
                "",
                rng.choice(["atcoder", "codeforces"]),
                json.dumps({}),
                "stdin",
            )
            qid = f"abc{300 + idx}_{'abc'[i % 3]}" if platform == "atcoder" else f"{1900 + idx}{'ABC'[i % 3]}"
        cases = [{"input": a, "output": b, "testtype": ttype} for a, b in tests]
        public, private = cases[:2], cases[2:]
        rows.append(
            {
                "question_title": title,
                "question_content": text,
                "platform": platform,
                "question_id": qid,
                "contest_id": qid.split("_")[0]
                if platform == "atcoder"
                else f"weekly-contest-{400 + idx}"
                if platform == "leetcode"
                else qid[:-1],
                "contest_date": f"2024-{1 + idx % 12:02d}-{1 + idx % 28:02d}T00:00:00",
                "starter_code": starter,
                "difficulty": ["easy", "medium", "hard"][idx % 3],
                "public_test_cases": json.dumps(public),
                # Upstream ships both encodings; alternate so the reader meets each.
                "private_test_cases": encode_private(private) if (i // 2) % 2 == 0 else json.dumps(private),
                "metadata": meta,
            }
        )
        solutions[qid] = sol
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("resources/fixtures"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261129)

    seen: set[str] = set()
    write_gpqa(out / "gpqa_train.csv", gpqa_rows(24, rng, seen, "train"))
    write_gpqa(out / "gpqa_val.csv", gpqa_rows(16, rng, seen, "val"))

    solutions: dict[str, str] = {}
    write_jsonl(out / "lcb_train.jsonl", lcb_rows(20, rng, 0, solutions))
    write_jsonl(out / "lcb_val.jsonl", lcb_rows(14, rng, 20, solutions))
    (out / "lcb_solutions.json").write_text(
        json.dumps(solutions, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
