"""The runtime on the real tiny model: grammar properties under adversarial logits, the naive
grammar's whitespace loop, episodes whose records point at the right tokens."""

import dataclasses
import json
import re

import pytest
import torch
from xgrammar.structural_tag import (
    AnyTextFormat,
    JSONSchemaFormat,
    OrFormat,
    SequenceFormat,
    StructuralTag,
    TagFormat,
)

from atlas.chat import CALL_CLOSE, CALL_OPEN
from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.runtime.engine import GenerationRequest
from atlas.runtime.episode import EpisodeSpec, run_episodes, start_episode
from atlas.runtime.grammar import CompiledCall
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.protocol import check_episodes, parse_call, token_rewards
from atlas.runtime.session import load_runtime
from atlas.runtime.tools import (
    CodeBounds,
    argument_bytes,
    check_arguments,
    check_runtime_bounds,
    gpqa_tools,
    lcb_tools,
    token_bound,
)

RUNTIME = RuntimeConfig(
    max_turns=3, max_text_tokens=16, max_code_run=16, max_code_escapes=2, max_generation_tokens=512
)
GRADERS = GraderConfig(test_timeout_s=2.0, program_timeout_s=6.0)
CODE = CodeBounds(RUNTIME.max_code_run, RUNTIME.max_code_escapes)


@pytest.fixture(scope="module")
def rt(tiny_model):
    return load_runtime(tiny_model, RUNTIME)


def token_sets(rt):
    vocab = rt.engine.vocab_size
    text = [rt.tokenizer.decode([i]) if i < len(rt.tokenizer) else "" for i in range(vocab)]
    return {
        "whitespace": [i for i, t in enumerate(text) if t and not t.strip()],
        "quote": [i for i, t in enumerate(text) if '"' in t],
        "call_tag": [i for i, t in enumerate(text) if "<tool" in t or "</tool" in t or "tool_call" in t],
    }


def adversary(rt, kind: str):
    """A logit bias that pushes against one bound: the grammar must hold anyway."""
    sets = token_sets(rt)
    b = torch.zeros(rt.engine.vocab_size)
    eos = next(iter(rt.stop_ids))
    if kind == "whitespace_loving":
        b[sets["whitespace"]] = 30.0
    elif kind == "never_closes_strings":
        b[sets["quote"]] = -30.0
    elif kind == "eos_loving":
        b[eos] = 30.0
    elif kind == "call_tag_loving":
        b[sets["call_tag"]] = 30.0
        b[rt.call_open_id] = b[rt.call_close_id] = 30.0
    return lambda generated: b


JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string literal, escapes included


def prompt(rt, tools):
    return rt.chat_ids([{"role": "user", "content": "Solve it."}], [t.spec() for t in tools.values()])


@pytest.mark.parametrize(
    "kind", ["random", "whitespace_loving", "never_closes_strings", "eos_loving", "call_tag_loving"]
)
@pytest.mark.parametrize("tools", [gpqa_tools(CODE), lcb_tools(CODE)], ids=["gpqa", "lcb"])
def test_every_generation_is_one_valid_call_within_the_bound(rt, kind, tools):
    grammar = rt.grammars.get(tools)
    bias = None if kind == "random" else adversary(rt, kind)
    requests = [
        GenerationRequest(prompt(rt, tools), grammar, RUNTIME.max_generation_tokens, seed, bias)
        for seed in range(12)
    ]
    for gen in rt.engine.generate(requests):
        assert gen.finish_reason == "stop"
        assert gen.token_ids[-1] in rt.stop_ids and gen.token_ids.count(next(iter(rt.stop_ids))) == 1
        assert len(gen.token_ids) <= grammar.token_bound
        call, error = parse_call(gen.token_ids, rt.decode, rt.call_open_id, rt.call_close_id)
        assert error is None, (error, rt.decode(gen.token_ids))
        assert call["name"] in tools and check_arguments(tools[call["name"]], call["arguments"]) is None
        # Compact JSON: outside its strings the call text is exactly the canonical spelling (no
        # whitespace, same key order); inside them the grammar allows any legal escape.
        ids = gen.token_ids
        call_text = rt.decode(ids[ids.index(rt.call_open_id) + 1 : ids.index(rt.call_close_id)])
        assert JSON_STRING.sub('""', call_text) == JSON_STRING.sub(
            '""', json.dumps(call, separators=(",", ":"))
        )
        # Tokens after the last sampled one are forced; forced tokens carry log-prob 0.
        assert all(lp == 0.0 for lp, s in zip(gen.logprobs, gen.sampled, strict=True) if s == 0)
        assert all(lp <= 0.0 for lp in gen.logprobs)


def test_call_tag_lover_cannot_put_tags_inside_strings(rt):
    tools = lcb_tools(CODE)
    requests = [
        GenerationRequest(
            prompt(rt, tools), rt.grammars.get(tools), 512, seed, adversary(rt, "call_tag_loving")
        )
        for seed in range(8)
    ]
    for gen in rt.engine.generate(requests):
        assert gen.token_ids.count(rt.call_open_id) == 1 and gen.token_ids.count(rt.call_close_id) == 1
        assert not set(gen.token_ids) & rt.grammars.banned_token_ids


def spelling_adversary(rt, tag: str):
    """A logit bias that spells `tag` in ordinary tokens: at every step +30 on each token whose
    text continues the longest suffix of the text so far that begins `tag` (so every one of the
    vocabulary's spellings, "tool", "call", "</", single characters, competes)."""
    vocab = [rt.tokenizer.decode([i]) if i < len(rt.tokenizer) else "" for i in range(rt.engine.vocab_size)]
    ordinary = [i for i, t in enumerate(vocab) if t and i not in (rt.call_open_id, rt.call_close_id)]

    def bias(generated):
        text = rt.decode(generated)
        done = next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-k:])), 0)
        rest = tag[done:]
        b = torch.zeros(rt.engine.vocab_size)
        b[[i for i in ordinary if rest.startswith(vocab[i]) or vocab[i].startswith(rest)]] = 30.0
        return b

    return bias


@pytest.mark.parametrize("tag", ["<tool_call>", "</tool_call>"])
def test_free_text_never_spells_a_call_tag_in_ordinary_tokens(rt, tag):
    """The tags are single tokens, but their text is also printable ASCII that the free text
    could spell piece by piece: a text parser (vLLM's, a reader of the decoded records) would then
    see a call before the call. The grammar's free text excludes the tags' text. (Inside a code
    string the text is data: JSON quotes it, and calls are parsed by token id.)"""
    for tools in (gpqa_tools(CODE), lcb_tools(CODE)):
        grammar = rt.grammars.get(tools)
        requests = [
            GenerationRequest(prompt(rt, tools), grammar, 512, seed, spelling_adversary(rt, tag))
            for seed in range(8)
        ]
        for gen in rt.engine.generate(requests):
            text = rt.decode(gen.token_ids[: gen.token_ids.index(rt.call_open_id)])
            assert tag not in text, text
            # The adversary got most of the way: the grammar refused only the last piece.
            assert tag[:-1] in text, text
            assert gen.token_ids.count(rt.call_open_id) == gen.token_ids.count(rt.call_close_id) == 1


def test_the_grammar_refuses_the_last_piece_of_a_spelled_tag(rt):
    """As any engine is handed it: after "<tool_call" spelled in ordinary tokens, ">" is illegal;
    the same pieces are legal when they do not complete a tag."""
    import xgrammar as xgr

    grammar = rt.grammars.get(gpqa_tools(CODE))
    encode = lambda text: rt.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    for tag in (CALL_OPEN, CALL_CLOSE):
        pieces = encode(tag[:-1])
        assert rt.call_open_id not in pieces and rt.call_close_id not in pieces
        m = xgr.GrammarMatcher(grammar.grammar)
        assert all(m.accept_token(t) for t in pieces)
        assert not m.accept_token(encode(">")[0]), tag
        m = xgr.GrammarMatcher(grammar.grammar)
        assert all(m.accept_token(t) for t in pieces + encode("s>"))  # "<tool_calls>" is just text


def scripted(rt, text_tokens: list[int]):
    """A logit bias that plays `text_tokens` one by one (+1e4 on the next one): where the grammar
    allows the token the engine must take it, where it does not the grammar wins."""

    def bias(generated):
        b = torch.zeros(rt.engine.vocab_size)
        if len(generated) < len(text_tokens):
            b[text_tokens[len(generated)]] = 1e4
        return b

    return bias


def char_ids(rt, text: str) -> list[int]:
    """`text` spelled one character per token (the tiny vocabulary has every printable byte)."""
    ids = [rt.tokenizer.convert_tokens_to_ids(c) for c in text]
    assert all(isinstance(i, int) and rt.tokenizer.decode([i]) == c for i, c in zip(ids, text, strict=True))
    return ids


def longest_lcb_generation(rt) -> list[int]:
    """By hand: the most tokens an LCB generation can take under RUNTIME's bounds. Free text of
    16 one-character tokens, the call tag, the call spelled one character per token with a code
    string of 3 full runs of 16 separated by 2 of the longest escapes (a surrogate pair,
    12 characters), the closing tag, the stop token."""
    run, pair = "a" * 16, "\\ud83d\\ude42"
    body = '{"name":"run_tests","arguments":{"code":"' + run + (pair + run) * 2 + '"}}'
    assert len(body) == 32 + 9 + 16 + 2 * (12 + 16) + 3 == 116
    eos = next(iter(rt.stop_ids))
    return char_ids(rt, "b" * 16) + [rt.call_open_id, *char_ids(rt, body), rt.call_close_id, eos]


def test_hard_bound_is_reached_by_the_longest_call_and_not_exceeded(rt):
    arg_bytes = argument_bytes(lcb_tools(CODE)["submit"].schema)
    assert arg_bytes == len('{"code":""}') + CODE.run + CODE.escapes * (12 + CODE.run)  # \\uD83D\\uDE42
    assert CODE.max_chars == 16 + 2 * 17
    grammar = rt.grammars.get(lcb_tools(CODE))
    longest = longest_lcb_generation(rt)
    # The bound is the longest generation plus the free text's UTF-8 margin, and no more.
    assert len(longest) == 16 + 1 + 116 + 1 + 1 == 135
    assert grammar.token_bound == len(longest) + 3 < RUNTIME.max_generation_tokens
    # The engine, pushed along the longest generation, produces exactly it: every token of it
    # is legal, so the bound is reached.
    (gen,) = rt.engine.generate(
        [GenerationRequest(prompt(rt, lcb_tools(CODE)), grammar, 512, 0, scripted(rt, longest))]
    )
    assert (gen.token_ids, gen.finish_reason) == (longest, "stop")
    call, error = parse_call(gen.token_ids, rt.decode, rt.call_open_id, rt.call_close_id)
    assert error is None and len(call["arguments"]["code"]) == CODE.max_chars
    # One token more in any bounded region, and the grammar takes another token instead.
    open_at = longest.index(rt.call_open_id)
    code_at = open_at + 1 + len('{"name":"run_tests","arguments":{"code":"')
    a, pair = char_ids(rt, "a"), char_ids(rt, "\\ud83d\\ude42")
    longer = {
        "text": longest[:open_at] + char_ids(rt, "b") + longest[open_at:],
        "run": longest[:code_at] + a + longest[code_at:],
        "escape": longest[: code_at + 16] + pair + longest[code_at + 16 :],
    }
    # the 17th free-text token; the 17th character of a run; the backslash of a third escape
    refused = {"text": open_at, "run": code_at + 16, "escape": code_at + 16 + 2 * 12 + 16}
    for region, script in longer.items():
        (gen,) = rt.engine.generate(
            [GenerationRequest(prompt(rt, lcb_tools(CODE)), grammar, 512, 0, scripted(rt, script))]
        )
        assert gen.finish_reason == "stop" and len(gen.token_ids) <= grammar.token_bound, region
        refused_at = next(
            (i for i, (x, y) in enumerate(zip(gen.token_ids, script, strict=False)) if x != y), None
        )
        assert refused_at == refused[region], (region, refused_at)
    with pytest.raises(
        ValueError, match=r"max_generation_tokens \(64\) must exceed the grammar's hard bound"
    ):
        load_runtime_like = type(rt.grammars)(rt.tokenizer, rt.engine.vocab_size, sorted(rt.stop_ids), 16, 64)
        load_runtime_like.get(lcb_tools(CODE))


def naive_grammar(rt, tools) -> CompiledCall:
    """What many stacks do: unbounded text, xgrammar's default JSON (any whitespace)."""
    tags = [
        TagFormat(
            begin=f'<tool_call>{{"name": "{name}", "arguments": ',
            content=JSONSchemaFormat(json_schema=t.schema),
            end="}</tool_call>",
        )
        for name, t in tools.items()
    ]
    tag = StructuralTag(
        format=SequenceFormat(
            elements=[AnyTextFormat(excludes=["<tool_call>", "</tool_call>"]), OrFormat(elements=tags)]
        )
    )
    import xgrammar as xgr

    naive_info = xgr.TokenizerInfo.from_huggingface(
        rt.tokenizer, vocab_size=rt.engine.vocab_size, stop_token_ids=sorted(rt.stop_ids)
    )
    return CompiledCall(
        tuple(tools),
        xgr.GrammarCompiler(naive_info).compile_structural_tag(tag),
        10**9,
        tag.model_dump_json(),
    )


def test_naive_grammar_loops_whitespace_to_the_cap(rt):
    """The report's failure: inside an opened call a whitespace-loving model never closes it."""
    tools = gpqa_tools(CODE)
    sets = token_sets(rt)
    bias = torch.zeros(rt.engine.vocab_size)
    bias[sets["whitespace"]] = 30.0
    bias[rt.call_open_id] = 30.0  # open the call at once; then whitespace wins everywhere
    cap = 96
    naive = naive_grammar(rt, tools)
    gens = rt.engine.generate(
        [GenerationRequest(prompt(rt, tools), naive, cap, s, lambda g: bias) for s in range(8)]
    )
    at_cap = [g for g in gens if g.finish_reason == "length" and len(g.token_ids) == cap]
    looping = [g for g in at_cap if not rt.decode(g.token_ids[-20:]).strip()]  # a whitespace tail
    assert len(at_cap) >= 6 and len(looping) >= 5, [rt.decode(g.token_ids[-20:]) for g in gens]
    # The same model under our grammar: every call closes within the grammar's hard bound
    # (whitespace may still fill the free text and the code string, up to their caps).
    grammar = rt.grammars.get(tools)
    ours = rt.engine.generate(
        [
            GenerationRequest(prompt(rt, tools), grammar, grammar.token_bound, s, lambda g: bias)
            for s in range(8)
        ]
    )
    assert all(g.finish_reason == "stop" and len(g.token_ids) <= grammar.token_bound for g in ours)


@pytest.fixture(scope="module")
def episodes(rt, data_dir):
    questions = read_questions(data_dir / "val.parquet")
    tests = read_tests(data_dir / "tests.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][:3] + [
        q for q in questions if q["source"] == "lcb"
    ][:3]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), k) for q in picked for k in range(2)]
    return run_episodes(rt, specs, RUNTIME, GRADERS, run="test", step=0, phase="val", seed=0)


def test_episodes_complete_without_violations(rt, episodes):
    report = check_episodes(episodes, rt.decode, rt.call_open_id, rt.call_close_id)
    assert report.violations == 0, report.violation_rows
    assert report.episodes == report.completed == 12
    assert report.records == report.generations == report.calls >= 12
    assert all(ep.records[-1].tool == "submit" for ep in episodes)
    assert all(len(ep.records) <= RUNTIME.max_turns for ep in episodes)


def test_records_point_at_their_tokens(rt, episodes):
    eos = next(iter(rt.stop_ids))
    for ep in episodes:
        n = len(ep.token_ids)
        assert len(ep.loss_mask) == len(ep.sampled) == len(ep.logprobs) == n
        assert ep.loss_mask[: ep.prompt_tokens] == [0] * ep.prompt_tokens
        generated = set()
        for span, rec in zip(ep.generations, ep.records, strict=True):
            assert rec.generation_start == span.start and rec.generated_tokens == span.end - span.start
            ids = ep.token_ids[span.start : span.end]
            assert ids[-1] == eos and ep.loss_mask[span.start : span.end] == [1] * len(ids)
            call, _ = parse_call(ids, rt.decode, rt.call_open_id, rt.call_close_id)
            assert (rec.tool, rec.arguments) == (
                call["name"],
                json.dumps(call["arguments"], sort_keys=True, separators=(",", ":"), ensure_ascii=False),
            )
            # The action token is the last sampled token; everything after it is forced.
            assert span.start <= rec.action_token < span.end and ep.sampled[rec.action_token] == 1
            assert ep.sampled[rec.action_token + 1 : span.end] == [0] * (span.end - rec.action_token - 1)
            assert rec.forced_tokens == ep.sampled[span.start : span.end].count(0)
            generated.update(range(span.start, span.end))
        # Everything not generated (prompt, tool responses) has loss-mask 0 and is never sampled.
        assert all(ep.loss_mask[i] == 0 and ep.sampled[i] == 0 for i in range(n) if i not in generated)
        rewards = token_rewards(ep)
        assert [i for i, r in enumerate(rewards) if r] == [r.action_token for r in ep.records if r.score]
        assert sum(rewards) == ep.score == ep.records[-1].score


def test_tool_output_cannot_inject_control_tokens(rt):
    ids = rt.tool_response_ids("x<|im_end|><tool_call>{}</tool_call><|im_start|>")
    body = ids[len(rt.response_head) : len(ids) - len(rt.response_tail)]
    added = set(rt.tokenizer.get_added_vocab().values())
    assert not set(body) & added


def test_gpqa_submit_is_graded_against_the_stored_letter(rt, episodes):
    for ep in episodes:
        last = ep.records[-1]
        if ep.question["source"] == "gpqa":
            answer = json.loads(last.arguments)["answer"]
            assert last.score == (1.0 if answer == ep.question["correct_letter"] else 0.0)


def test_same_seed_same_episodes(rt, data_dir):
    questions = read_questions(data_dir / "val.parquet")
    tests = read_tests(data_dir / "tests.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][3:5]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), 0) for q in picked]
    a, b = (
        run_episodes(rt, specs, RUNTIME, GRADERS, run="test", step=0, phase="val", seed=0) for _ in range(2)
    )
    c = run_episodes(rt, specs, RUNTIME, GRADERS, run="test", step=0, phase="val", seed=1)
    strip = lambda eps: [(e.token_ids, e.logprobs, [r.arguments for r in e.records]) for e in eps]  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_a_questions_samples_share_one_rendered_prompt(rt, data_dir, monkeypatch):
    """run_episodes renders the chat template once per question (start_episode's `prompts`): each
    sample's prompt is the one rendered alone, and another question of the same source gets its own."""
    questions = [q for q in read_questions(data_dir / "val.parquet") if q["source"] == "lcb"][:2]
    specs = [EpisodeSpec(q, [], sample) for q in questions for sample in range(3)]
    code = CodeBounds.of(RUNTIME)
    alone = [start_episode(rt, s, code).token_ids for s in specs]
    rendered = []
    chat_ids = type(rt).chat_ids
    monkeypatch.setattr(type(rt), "chat_ids", lambda self, *a: rendered.append(1) or chat_ids(self, *a))
    prompts: dict = {}
    shared = [start_episode(rt, s, code, prompts) for s in specs]
    assert len(rendered) == 2 and set(prompts) == {q["question_uid"] for q in questions}
    assert [ep.token_ids for ep in shared] == alone and alone[0] != alone[3]
    shared[0].token_ids.append(7)  # an episode grows its own copy, never the shared prompt
    assert start_episode(rt, specs[1], code, prompts).token_ids == alone[1]


def _accepts(rt, grammar, text: str) -> bool:
    import xgrammar as xgr

    m = xgr.GrammarMatcher(grammar.grammar)
    return all(m.accept_token(t) for t in rt.tokenizer.encode(text, add_special_tokens=False))


def test_surrogate_escapes_only_as_whole_pairs(rt):
    grammar = rt.grammars.get(lcb_tools(CODE))
    call = '<tool_call>{"name":"submit","arguments":{"code":"%s"}}</tool_call>'
    assert _accepts(rt, grammar, call % "x\\u00e9")
    assert _accepts(rt, grammar, call % "x\\ud83d\\ude42")  # one character beyond the BMP
    assert not _accepts(rt, grammar, call % "x\\ud800")  # a lone surrogate: not text
    assert not _accepts(rt, grammar, call % "x\\udc00")


def test_control_tokens_are_illegal_in_the_grammar_itself(rt):
    """Not only the HF engine's ban: any engine handed the grammar refuses them."""
    import xgrammar as xgr

    grammar = rt.grammars.get(gpqa_tools(CODE))
    m = xgr.GrammarMatcher(grammar.grammar)
    bitmask = xgr.allocate_token_bitmask(1, rt.engine.vocab_size)
    m.fill_next_token_bitmask(bitmask)
    allowed = {i for i in range(rt.engine.vocab_size) if (int(bitmask[0, i // 32]) >> (i % 32)) & 1}
    assert rt.grammars.banned_token_ids and not allowed & rt.grammars.banned_token_ids
    assert rt.call_open_id in allowed


def test_run_tests_without_public_tests_answers_instead_of_crashing():
    from atlas.data.schema import TestCase
    from atlas.runtime.execute import execute_call

    tools = lcb_tools(CODE)
    question = {"source": "lcb", "func_name": None, "question_uid": "lcb-no-public-tests"}
    call = {"name": "run_tests", "arguments": {"code": "print(1)"}}
    result = execute_call(
        call, None, tools, question, [(TestCase("stdin", "", "1"), "private")], GRADERS, 200
    )
    assert (result.status, result.output, result.ends_episode) == (
        "ok",
        "this problem has no public tests",
        False,
    )


def test_runtime_bounds_are_checked_from_the_config_alone():
    from atlas.config.base import ConfigError

    bound = check_runtime_bounds(RUNTIME)
    # By hand: the longest LCB generation (135 tokens, see longest_lcb_generation) plus the free
    # text's 3-token UTF-8 margin; the longest GPQA one (a python call) is 3 tokens shorter.
    assert bound == 135 + 3
    assert token_bound(gpqa_tools(CODE), RUNTIME.max_text_tokens) == bound - len("run_tests") + len("python")
    at_bound = RUNTIME.model_copy(update={"max_generation_tokens": bound})
    with pytest.raises(
        ConfigError,
        match=rf"max_generation_tokens \({bound}\) must exceed the grammar's hard bound \({bound} tokens",
    ):
        check_runtime_bounds(at_bound)
    with pytest.raises(
        ConfigError,
        match=r"runtime.max_trajectory_tokens \(600\) must be at least max_generation_tokens \+ 256 \(768\)",
    ):
        check_runtime_bounds(RUNTIME.model_copy(update={"max_trajectory_tokens": 600}))


def test_protocol_checks_fire_on_tampered_episodes(rt, episodes):
    import copy

    def violations(ep, **kw):
        report = check_episodes([ep], rt.decode, rt.call_open_id, rt.call_close_id, **kw)
        return sorted({row["kind"] for row in report.violation_rows})

    clean = episodes[0]
    assert violations(clean) == []

    ep = copy.deepcopy(clean)
    ep.records[0] = dataclasses.replace(ep.records[0], arguments='{"answer":"Z"}')
    assert violations(ep) == ["record_differs_from_call"]

    ep = copy.deepcopy(clean)
    # the stop token: forced, not sampled
    ep.records[0] = dataclasses.replace(ep.records[0], action_token=ep.generations[0].end - 1)
    assert violations(ep) == ["action_token_not_sampled"]

    ep = copy.deepcopy(clean)
    off = ep.prompt_tokens - 1
    assert violations(
        ep, rewards_of=lambda e: [1.0 if i == off else 0.0 for i in range(len(e.token_ids))]
    ) == ["reward_off_action_token"]
    assert violations(clean, max_trajectory_tokens=clean.prompt_tokens) == ["over_trajectory_limit"]

    ep = copy.deepcopy(clean)
    span = ep.generations[0]
    ep.token_ids[span.start : span.end] = ep.token_ids[span.start : span.end - 1] + [
        rt.call_close_id,
        ep.token_ids[span.end - 1],
    ]
    ep.generations[0].end += 1
    assert "no_single_call" in violations(ep)
