"""The protocol checks on episodes built by hand: each invariant of runtime/protocol.py, broken one
at a time, gives exactly its violation row (kind, turn, detail), and the counters add up.

No model: a trajectory here is a list of token ids over a toy vocabulary (one character per token
id, three control tokens), so every position, mask and reward is known before the check runs."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from atlas.hashing import canonical_json
from atlas.runtime.episode import Episode, GenerationSpan
from atlas.runtime.protocol import ProtocolReport, check_episodes, parse_call, token_rewards
from atlas.runtime.records import Credit, ExecutionRecord
from atlas.runtime.tools import CodeBounds, gpqa_tools

OPEN, CLOSE, STOP = 1, 2, 3
TEXT = 1000  # text token id = TEXT + ord(character)
TOOLS = gpqa_tools(CodeBounds(16, 2))


def toks(text: str) -> list[int]:
    return [TEXT + ord(c) for c in text]


def decode(ids: list[int]) -> str:
    names = {OPEN: "<tool_call>", CLOSE: "</tool_call>", STOP: "<eos>"}
    return "".join(names.get(i) or chr(i - TEXT) for i in ids)


def call_ids(name: str, arguments: dict, free_text: str = "ok") -> list[int]:
    body = json.dumps({"name": name, "arguments": arguments})
    return [*toks(free_text), OPEN, *toks(body), CLOSE, STOP]


def record(turn: int, action_token: int, *, tool="submit", arguments='{"answer":"B"}', score=0.0):
    return ExecutionRecord(
        run="r", step=0, phase="train", question_uid="q7", source="gpqa", sample=2, turn=turn,
        tool=tool, arguments=arguments, action_token=action_token, generation_start=0,
        generated_tokens=0, forced_tokens=2, finish_reason="stop", tool_status="ok",
        tool_output_sha256="", tool_output_excerpt="", sandboxed=False, score=score,
    )  # fmt: skip


def tamper(ep: Episode, k: int, **changes) -> None:
    """Put a changed copy in place of record k (a record itself is never changed)."""
    ep.records[k] = replace(ep.records[k], **changes)


def episode(*calls: tuple[str, dict], prompt: int = 3, bound: int = 200) -> Episode:
    """Prompt tokens, then one generation per call, each followed by one tool-output token. The
    call-close and stop tokens are forced (sampled 0); the record's action token is the token
    before the call-close, as the grammar makes it."""
    ids = toks("q" * prompt)
    loss, sampled = [0] * prompt, [0] * prompt
    ep = Episode(
        question={"question_uid": "q7"}, tests=[], sample=2, script=None, tools=TOOLS,
        token_ids=ids, prompt_tokens=prompt, loss_mask=loss, sampled=sampled, end_reason="submit",
    )  # fmt: skip
    for turn, (name, arguments) in enumerate(calls):
        gen = call_ids(name, arguments)
        start = len(ids)
        ids += gen
        loss += [1] * len(gen)
        sampled += [1] * (len(gen) - 2) + [0, 0]
        ep.generations.append(GenerationSpan(start, len(ids), TOOLS, bound, frozenset({STOP})))
        ep.records.append(record(turn, len(ids) - 3, tool=name, arguments=canonical_json(arguments)))
        ids.append(TEXT + ord("o"))  # the tool's answer: not generated
        loss.append(0)
        sampled.append(0)
    return ep


def rows(ep: Episode, **kw) -> list[tuple[str, int | None, str]]:
    report = check_episodes([ep], decode, OPEN, CLOSE, **kw)
    return [(r["kind"], r["turn"], r["detail"]) for r in report.violation_rows]


def counts(report: ProtocolReport) -> tuple[int, ...]:
    return (report.episodes, report.completed, report.generations, report.records, report.calls)


def two_turns() -> Episode:
    return episode(("python", {"code": "print(1)"}), ("submit", {"answer": "B"}))


# --- parse_call ---


def test_parse_call_reads_the_one_call_between_the_tags():
    ids = call_ids("submit", {"answer": "C"})
    assert parse_call(ids, decode, OPEN, CLOSE) == ({"name": "submit", "arguments": {"answer": "C"}}, None)


@pytest.mark.parametrize(
    "ids, why",
    [
        ([*toks("x"), STOP], "0 call-open and 0 call-close tokens, expected one each"),
        ([OPEN, *toks("{}"), STOP], "1 call-open and 0 call-close tokens, expected one each"),
        ([OPEN, OPEN, *toks("{}"), CLOSE], "2 call-open and 1 call-close tokens, expected one each"),
        ([OPEN, *toks("{}"), CLOSE, CLOSE], "1 call-open and 2 call-close tokens, expected one each"),
        ([CLOSE, *toks("{}"), OPEN, STOP], "call-close token before call-open token"),
        (
            [OPEN, *toks('{"name": "submit"'), CLOSE],
            "call is not JSON (Expecting ',' delimiter: line 1 column 18 (char 17))",
        ),
        ([OPEN, *toks("[1]"), CLOSE], 'call must be {"name": str, "arguments": {...}}'),
        ([OPEN, *toks('{"name": "s"}'), CLOSE], 'call must be {"name": str, "arguments": {...}}'),
        (
            [OPEN, *toks('{"name": "s", "arguments": {}, "x": 1}'), CLOSE],
            'call must be {"name": str, "arguments": {...}}',
        ),
        (
            [OPEN, *toks('{"name": 5, "arguments": {}}'), CLOSE],
            'call must be {"name": str, "arguments": {...}}',
        ),
    ],
)
def test_parse_call_names_why_there_is_no_single_call(ids, why):
    assert parse_call(ids, decode, OPEN, CLOSE) == (None, why)


def test_parse_call_decodes_only_the_tokens_between_the_tags():
    seen = []
    ids = [*toks("a{"), OPEN, *toks('{"name": "s", "arguments": {}}'), CLOSE, *toks("}")]
    parse_call(ids, lambda x: seen.append(list(x)) or decode(x), OPEN, CLOSE)
    assert seen == [toks('{"name": "s", "arguments": {}}')]


# --- check_episodes: a clean episode, then one invariant broken at a time ---


def test_a_clean_episode_counts_and_no_violation():
    ep = two_turns()
    other = episode(("python", {"code": "1"}))
    other.end_reason = "turn_limit"
    report = check_episodes([ep, other], decode, OPEN, CLOSE)
    assert counts(report) == (2, 1, 3, 3, 3)
    assert (report.violations, report.violation_rows) == (0, [])


def test_counts_add_to_a_given_report():
    report = ProtocolReport(episodes=5, completed=4, generations=9, records=9, calls=9)
    assert check_episodes([two_turns()], decode, OPEN, CLOSE, report) is report
    assert counts(report) == (6, 5, 11, 11, 11)


def test_violation_rows_name_the_episode_and_the_json_holds_them():
    ep = two_turns()
    tamper(ep, 1, arguments='{"answer":"D"}')
    tamper(ep, 0, finish_reason="length")
    report = check_episodes([ep], decode, OPEN, CLOSE)
    expected_rows = [
        {
            "kind": "no_stop_token",
            "question_uid": "q7",
            "sample": 2,
            "turn": 0,
            "detail": "finish_reason length",
        },
        {
            "kind": "record_differs_from_call",
            "question_uid": "q7",
            "sample": 2,
            "turn": 1,
            "detail": 'record says submit {"answer":"D"}',
        },
    ]
    assert report.violations == 2 and report.violation_rows == expected_rows
    assert report.to_json() == {
        "episodes": 1,
        "completed": 1,
        "generations": 2,
        "records": 2,
        "calls": 2,
        "violations": 2,
        "violation_rows": expected_rows,
    }


def test_fewer_records_than_generations():
    ep = two_turns()
    ep.records.pop()
    assert rows(ep) == [("records_ne_generations", None, "1 records, 2 generations")]


def test_a_generation_without_a_call():
    ep = two_turns()
    span = ep.generations[1]
    ep.token_ids[span.start : span.end] = toks("x" * (span.end - span.start - 1)) + [STOP]
    assert rows(ep) == [("no_single_call", 1, "0 call-open and 0 call-close tokens, expected one each")]


def test_text_after_the_call_close():
    ep = two_turns()
    span = ep.generations[0]
    # ... </tool_call> ! <eos>: the stop token moves one on, over the tool output's token
    ep.token_ids[span.end - 1], ep.token_ids[span.end] = TEXT + ord("!"), STOP
    span.end += 1
    assert rows(ep) == [("tokens_after_call", 0, "more than the stop token follows </tool_call>")]


def test_nothing_after_the_call_close():
    ep = two_turns()
    span = ep.generations[0]
    ep.token_ids[span.end - 1] = TEXT + ord("o")  # the stop token is gone: the generation ends on text
    ep.generations[0].end -= 1
    tamper(ep, 0, action_token=span.end - 3)
    assert rows(ep) == [
        ("tokens_after_call", 0, "more than the stop token follows </tool_call>"),
        ("no_stop_token", 0, "finish_reason stop"),
    ]


def test_the_record_must_name_the_call_it_holds():
    ep = two_turns()
    tamper(ep, 0, tool="submit")
    assert rows(ep) == [("record_differs_from_call", 0, 'record says submit {"code":"print(1)"}')]
    ep = two_turns()
    tamper(ep, 0, arguments=canonical_json({"code": "x" * 200}))
    assert rows(ep) == [("record_differs_from_call", 0, 'record says python {"code":"' + "x" * 71)]


def test_a_tool_that_was_not_offered():
    ep = episode(("search", {"q": "x"}))
    assert rows(ep) == [("tool_not_offered", 0, "'search' not in ['python', 'submit']")]


def test_arguments_outside_the_schema():
    ep = episode(("submit", {"answer": "E"}))
    assert rows(ep) == [("arguments_out_of_bounds", 0, "answer='E' is not one of ['A', 'B', 'C', 'D']")]


def test_a_generation_that_ends_without_a_stop_token():
    ep = two_turns()
    tamper(ep, 1, finish_reason="length")
    assert rows(ep) == [("no_stop_token", 1, "finish_reason length")]
    ep = two_turns()
    ep.generations[1].stop_ids = frozenset({STOP + 10})
    assert rows(ep) == [("no_stop_token", 1, "finish_reason stop")]


def test_an_empty_generation_is_no_call_and_no_stop():
    ep = two_turns()
    span = ep.generations[1]
    ep.generations[1] = GenerationSpan(span.start, span.start, TOOLS, 200, frozenset({STOP}))
    tamper(ep, 1, action_token=span.start)
    got = rows(ep)
    assert got[:2] == [
        ("no_single_call", 1, "0 call-open and 0 call-close tokens, expected one each"),
        ("no_stop_token", 1, "finish_reason stop"),
    ]
    assert got[2] == (
        "action_token_not_sampled",
        1,
        f"action_token {span.start} in [{span.start}, {span.start})",
    )


def test_the_token_bound_is_inclusive():
    ep = two_turns()
    n = ep.generations[0].end - ep.generations[0].start
    ep.generations[0].token_bound = n
    assert rows(ep) == []
    ep.generations[0].token_bound = n - 1
    assert rows(ep) == [("over_token_bound", 0, f"{n} > {n - 1}")]


@pytest.mark.parametrize("where", ["before", "start", "end", "forced", "unmasked"])
def test_the_action_token_must_be_sampled_and_inside_its_generation(where):
    ep = two_turns()
    span = ep.generations[1]
    if where == "before":
        a = span.start - 1  # the tool output before it: not sampled, not loss-mask 1
    elif where == "start":
        a = span.start  # sampled free text: allowed
    elif where == "end":
        a = span.end  # one past the generation (the tool output after it)
        ep.sampled[a] = ep.loss_mask[a] = 1  # even if its masks said otherwise
    elif where == "forced":
        a = span.end - 2  # the call-close: forced
    else:
        a = span.end - 3
        ep.loss_mask[a] = 0
    tamper(ep, 1, action_token=a)
    expected = (
        []
        if where == "start"
        else [("action_token_not_sampled", 1, f"action_token {a} in [{span.start}, {span.end})")]
    )
    assert rows(ep) == expected


def test_a_sampled_token_outside_the_loss_mask_at_the_generation_start():
    ep = two_turns()
    span = ep.generations[0]
    tamper(ep, 0, action_token=span.start)
    ep.loss_mask[span.start] = 0
    assert rows(ep) == [
        ("action_token_not_sampled", 0, f"action_token {span.start} in [{span.start}, {span.end})")
    ]


def test_the_trajectory_limit_is_inclusive():
    ep = two_turns()
    n = len(ep.token_ids)
    assert rows(ep, max_trajectory_tokens=n) == []
    assert rows(ep, max_trajectory_tokens=n - 1) == [("over_trajectory_limit", None, f"{n} > {n - 1}")]


def test_rewards_only_on_action_tokens():
    ep = two_turns()
    tamper(ep, 0, score=0.5)
    tamper(ep, 1, score=1.0)
    assert rows(ep) == []
    stray = [0, 1, 2, 4, 5, 6, 7]
    vector = [1.0 if i in stray else 0.0 for i in range(len(ep.token_ids))]
    assert rows(ep, rewards_of=lambda e: vector) == [
        ("reward_off_action_token", None, "rewards at [0, 1, 2, 4, 5]")
    ]
    a = [r.action_token for r in ep.records]
    on_actions = [2.0 if i in a else 0.0 for i in range(len(ep.token_ids))]
    assert rows(ep, rewards_of=lambda e: on_actions) == []
    # rewards_of is asked about the episode being checked
    seen = []
    assert rows(ep, rewards_of=lambda e: seen.append(e) or on_actions) == [] and seen == [ep]


def test_token_rewards_put_each_record_reward_on_its_action_token():
    ep = two_turns()
    a0, a1 = (r.action_token for r in ep.records)
    tamper(ep, 0, score=1.0)
    tamper(ep, 1, score=-0.25)
    expected = [0.0] * len(ep.token_ids)
    expected[a0], expected[a1] = 1.0, -0.25
    assert token_rewards(ep) == expected
    tamper(ep, 1, action_token=a0)  # two records on one token add up
    expected[a0], expected[a1] = 0.75, 0.0
    assert token_rewards(ep) == expected
    tamper(ep, 0, score=0.0, action_token=len(ep.token_ids) + 5)  # a zero reward is placed nowhere
    tamper(ep, 1, score=0.0)
    assert token_rewards(ep) == [0.0] * len(ep.token_ids)


def test_token_rewards_put_each_credit_reward_on_its_records_action_token():
    ep = two_turns()
    a0, a1 = (r.action_token for r in ep.records)
    credits = [Credit(reward=-0.5), Credit(reward=2.0)]
    expected = [0.0] * len(ep.token_ids)
    expected[a0], expected[a1] = -0.5, 2.0
    assert token_rewards(ep, credits) == expected
    with pytest.raises(ValueError, match="zip"):
        token_rewards(ep, credits[:1])


def test_the_report_of_a_tampered_copy_leaves_the_clean_one_clean():
    clean = two_turns()
    bad = copy.deepcopy(clean)
    tamper(bad, 0, action_token=0)
    assert rows(bad) and rows(clean) == []
