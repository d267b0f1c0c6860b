"""The call grammar as text and as a real xgrammar matcher: the arguments EBNF spelled exactly,
what it admits byte by byte (enums, the run and escape bounds, surrogates), the structural tag
(bounded free text that cannot spell a tag, one call, the tags as single token ids), and
CallGrammars on the tiny model's tokenizer (banned ids, the bound check, caching)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import xgrammar as xgr

from atlas.config.base import ConfigError
from atlas.runtime.grammar import CallGrammars, arguments_ebnf, grammar_tokenizer_info, structural_tag
from atlas.runtime.tools import UTF8_SLACK_TOKENS, CodeBounds, Tool, gpqa_tools, lcb_tools, token_bound

TOOLS = gpqa_tools(CodeBounds(4, 1))
OPEN, CLOSE, EOS = 256, 257, 258
# One token per byte, then the two call tags and a stop token (RAW vocabulary: bytes as they are;
# the tags' bytes get a 0xFF prefix, as grammar_tokenizer_info gives them, so only their ids match).
VOCAB = [bytes([i]) for i in range(256)] + [b"\xff<tool_call>", b"\xff</tool_call>", b""]
INFO = xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=len(VOCAB), stop_token_ids=[EOS])
COMPILER = xgr.GrammarCompiler(INFO)


def admits(grammar: xgr.CompiledGrammar, *pieces: str | int, stop: bool = False) -> bool:
    """Whether these pieces (text as one token per byte, ints as token ids) can be sampled under
    the grammar: each token allowed by the mask in force before it (as the engine samples) and
    accepted, and the grammar then complete (with `stop`: the stop token allowed and accepted)."""
    matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=not stop)
    tokens = [t for p in pieces for t in ([p] if isinstance(p, int) else list(p.encode()))]
    mask = xgr.allocate_token_bitmask(1, len(VOCAB))
    for t in [*tokens, EOS] if stop else tokens:
        matcher.fill_next_token_bitmask(mask)
        if not (int(mask[0, t // 32]) >> (t % 32)) & 1 or not matcher.accept_token(t):
            return False
    return matcher.is_terminated()


def args_grammar(tool: str) -> xgr.CompiledGrammar:
    return COMPILER.compile_grammar(arguments_ebnf(TOOLS[tool].schema))


# --- arguments_ebnf ---


def test_the_arguments_grammar_is_spelled_exactly():
    assert arguments_ebnf(TOOLS["submit"].schema) == (
        r'root ::= "{" "\"answer\":" ("\"A\"" | "\"B\"" | "\"C\"" | "\"D\"") "}"'
    )
    hex2, hex3 = " ".join(["[0-9a-fA-F]"] * 2), " ".join(["[0-9a-fA-F]"] * 3)
    assert arguments_ebnf(TOOLS["python"].schema).splitlines() == [
        r'root ::= "{" "\"code\":\"" run_4 escaped_4{0,1} "\"" "}"',
        r'escaped_4 ::= ("\\" ["\\/nt] run_4 | "\\u" [0-9a-cA-Ce-fE-F] ' + hex3 + " run_4"
        r' | "\\u" [dD] [0-7] '
        + hex2
        + r' run_4 | "\\u" [dD] [89abAB] '
        + hex2
        + r' "\\u" [dD] [c-fC-F] '
        + hex2
        + r' run_4) (= ["\\])',
        r'run_4 ::= ("" | [ !#-\[\]-~] run_3) (= ["\\])',
        r'run_3 ::= ("" | [ !#-\[\]-~] run_2) (= ["\\])',
        r'run_2 ::= ("" | [ !#-\[\]-~] run_1) (= ["\\])',
        r'run_1 ::= ("" | [ !#-\[\]-~] run_0) (= ["\\])',
        'run_0 ::= ""',
    ]


# A code string of runs of at most 3 characters and at most 2 escapes, as plain repeats: the
# language the chain of rules must admit, token for token.
REPEATS = (
    r'root ::= "{" "\"code\":\"" [ !#-\[\]-~]{0,3} ("\\" (["\\/nt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3}'
    r' | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}))'
    r' [ !#-\[\]-~]{0,3}){0,2} "\"" "}"'
)
# Tokens of several bytes that cross where a run, an escape or the string ends: every string of
# two and three characters over an alphabet that spells runs, escapes, surrogates and the close.
ALPHABET = 'a d 8 c e 0 u n } " \\'.split(" ")
MULTI = sorted(
    {a + b for a in ALPHABET for b in ALPHABET}
    | {a + b + c for a in ALPHABET for b in ALPHABET for c in ALPHABET}
)
MULTI_VOCAB = [bytes([i]) for i in range(256)] + [t.encode() for t in MULTI] + [b""]
MULTI_EOS = len(MULTI_VOCAB) - 1


def test_the_code_string_rules_mask_as_the_plain_repeats_do():
    """Along random walks of multi-byte tokens, the mask before every token is the same under
    the chain of rules (with their lookaheads) as under `{0,R}` repeats, and both end together."""
    info = xgr.TokenizerInfo(
        MULTI_VOCAB, xgr.VocabType.RAW, vocab_size=len(MULTI_VOCAB), stop_token_ids=[MULTI_EOS]
    )
    compiler = xgr.GrammarCompiler(info)
    schema = gpqa_tools(CodeBounds(3, 2))["python"].schema
    chain, repeats = compiler.compile_grammar(arguments_ebnf(schema)), compiler.compile_grammar(REPEATS)
    masks = xgr.allocate_token_bitmask(2, len(MULTI_VOCAB))
    ids = torch.arange(len(MULTI_VOCAB))
    rng = random.Random(0)
    escapes = 0
    for _ in range(100):
        a, b = xgr.GrammarMatcher(chain), xgr.GrammarMatcher(repeats)
        text = b""
        while not a.is_terminated():
            a.fill_next_token_bitmask(masks, 0)
            b.fill_next_token_bitmask(masks, 1)
            assert torch.equal(masks[0], masks[1]), text
            allowed = torch.nonzero((masks[0, ids // 32] >> (ids % 32)) & 1).flatten().tolist()
            t = rng.choice(allowed)
            assert a.accept_token(t) and b.accept_token(t), (text, MULTI_VOCAB[t])
            text += MULTI_VOCAB[t]
        assert b.is_terminated(), text
        escapes += text.count(b"\\u")
    assert escapes > 20  # the walks went through \u escapes, not only runs


def test_two_properties_are_joined_by_a_comma_in_required_order():
    schema = {
        "type": "object",
        "properties": {"b": {"type": "string", "enum": ["x"]}, "a": {"type": "string", "enum": ["y"]}},
        "required": ["b", "a"],
        "additionalProperties": False,
    }
    g = COMPILER.compile_grammar(arguments_ebnf(schema))
    assert admits(g, '{"b":"x","a":"y"}')
    assert not admits(g, '{"a":"y","b":"x"}')
    assert not admits(g, '{"b":"x""a":"y"}')
    # an enum, then a code string
    schema["properties"]["a"] = TOOLS["python"].schema["properties"]["code"]
    g = COMPILER.compile_grammar(arguments_ebnf(schema))
    assert admits(g, '{"b":"x","a":"ab"}')
    assert not admits(g, '{"a":"ab"}')


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"answer":"A"}', True),
        ('{"answer":"D"}', True),
        ('{"answer":"E"}', False),
        ('{"answer": "A"}', False),  # no whitespace anywhere
        ('{"answer":"A"} ', False),
    ],
)
def test_an_enum_admits_its_literals_only(text, ok):
    assert admits(args_grammar("submit"), text) is ok


@pytest.mark.parametrize(
    "code, ok",
    [
        ("", True),
        ("abcd", True),  # a run of 4
        ("abcde", False),  # a run of 5
        (r"ab\ncd", True),  # run, one escape, run
        (r"a\nb\nc", False),  # two escapes, one allowed
        (r"\t", True),
        (r"\"", True),
        (r"\\", True),
        (r"\/", True),
        (r"\r", False),  # not in the escape set
        (r"\u00e9", True),
        (r"\u00E9", True),
        (r"\ud83d\ude00", True),  # a surrogate pair: one escape
        (r"\uD83D\uDE00", True),
        (r"\ud83d", False),  # a lone high surrogate
        (r"\ude00", False),  # a lone low surrogate
        (r"\ud83dab", False),
        ("tab\there", False),  # a raw control character
        ("é", False),  # printable ASCII only
    ],
)
def test_a_code_string_is_bounded_runs_and_escapes(code, ok):
    assert admits(args_grammar("python"), '{"code":"' + code + '"}') is ok


@pytest.mark.parametrize(
    "schema, why",
    [
        (
            {"type": "object", "properties": {}, "required": []},
            "tool schemas must be closed objects (additionalProperties: false)",
        ),
        (
            {"type": "array", "additionalProperties": False},
            "tool schemas must be closed objects (additionalProperties: false)",
        ),
        (
            {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
            "property 'n': only string properties are supported",
        ),
        (
            {
                "type": "object",
                "properties": {"s": {"type": "string", "maxLength": 5}},
                "required": ["s"],
                "additionalProperties": False,
            },
            "property 's': strings must be an enum or a bounded code string",
        ),
    ],
)
def test_a_schema_outside_the_subset_is_refused(schema, why):
    with pytest.raises(ValueError) as err:
        arguments_ebnf(schema)
    assert str(err.value) == why


# --- structural_tag ---


def call_text(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


@pytest.fixture(scope="module")
def call_grammar():
    tag, bound = structural_tag(TOOLS, 6, OPEN, CLOSE)
    return COMPILER.compile_structural_tag(tag), bound


def test_the_tag_is_text_then_one_call_then_the_stop_token(call_grammar):
    g, bound = call_grammar
    # The longest generation the grammar admits, written out: 6 text tokens, the call tags, the
    # python call with the longest code string (a run, a surrogate-pair escape, a run), the stop
    # token. The bound holds it with the UTF-8 slack alone to spare; one byte more is refused.
    longest = '{"name":"python","arguments":{"code":"aaaa' + r"\ud83d\ude00" + 'aaaa"}}'
    assert admits(g, "think.", OPEN, longest, CLOSE, stop=True)
    assert not admits(g, "think.", OPEN, longest.replace('aaaa"', 'aaaaa"'), CLOSE, stop=True)
    assert bound == 6 + 1 + len(longest.encode()) + 1 + 1 + UTF8_SLACK_TOKENS
    submit = call_text("submit", {"answer": "B"})
    python = call_text("python", {"code": "x=1"})
    assert admits(g, "think.", OPEN, submit, CLOSE, stop=True)
    assert admits(g, OPEN, python, CLOSE, stop=True)
    assert not admits(g, "think.", OPEN, submit, CLOSE, OPEN, stop=True)  # a second call
    assert not admits(g, "think.", OPEN, submit, stop=True)  # the call is closed by its token
    assert not admits(g, OPEN, submit, CLOSE, "more", stop=True)  # nothing but the stop follows
    assert not admits(g, OPEN, call_text("search", {"q": "x"}), CLOSE, stop=True)  # not offered
    assert not admits(g, OPEN, '{"name":"submit","arguments":{"code":"x"}}', CLOSE, stop=True)


def test_free_text_is_bounded_and_cannot_spell_a_tag(call_grammar):
    g, _ = call_grammar
    submit = call_text("submit", {"answer": "A"})
    assert admits(g, "abcdef", OPEN, submit, CLOSE, stop=True)  # 6 text tokens
    assert not admits(g, "abcdefg", OPEN, submit, CLOSE, stop=True)  # 7
    for tag in ("<tool_call>", "</tool_call>"):
        matcher = xgr.GrammarMatcher(g)
        assert not all(matcher.accept_token(b) for b in tag.encode()), tag


def test_the_tags_default_to_their_text():
    tag, _ = structural_tag(TOOLS, 6)
    elements = json.loads(tag.model_dump_json())["format"]["elements"]
    assert [e["type"] for e in elements] == ["any_text", "token", "or", "token"]
    assert elements[0]["excludes"] == ["<tool_call>", "</tool_call>"] and elements[0]["max_tokens"] == 6
    assert (elements[1]["token"], elements[3]["token"]) == ("<tool_call>", "</tool_call>")
    prefixes = [call["elements"][0]["value"] for call in elements[2]["elements"]]
    assert prefixes == ['{"name":"python","arguments":', '{"name":"submit","arguments":']  # sorted


# --- CallGrammars on the tiny model's tokenizer ---


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_added_tokens_but_the_tags_and_the_stop_are_banned(tokenizer):
    added = tokenizer.get_added_vocab()
    eos = tokenizer.eos_token_id
    padded = len(tokenizer) + 64  # a model's embedding is often larger than its tokenizer
    info, banned = grammar_tokenizer_info(tokenizer, padded, [eos])
    assert info.vocab_size == len(info.decoded_vocab) == padded
    assert banned == {i for t, i in added.items() if t not in ("<tool_call>", "</tool_call>") and i != eos}
    vocab = info.decoded_vocab
    for token, i in added.items():
        if i in banned:
            assert vocab[i] == b"", token
        elif i != eos:
            assert vocab[i] == b"\xff" + token.encode(), token
    assert info.stop_token_ids == [eos]


def test_call_grammars_check_the_bound_and_cache_by_tool_set(tokenizer):
    eos = tokenizer.eos_token_id
    lcb = lcb_tools(CodeBounds(4, 1))
    bound = token_bound(lcb, 6)
    grammars = CallGrammars(tokenizer, len(tokenizer) + 64, [eos], 6, bound + 1)
    assert grammars.info.vocab_size == len(tokenizer) + 64
    assert grammars.call_open_id == tokenizer.convert_tokens_to_ids("<tool_call>")
    assert grammars.call_close_id == tokenizer.convert_tokens_to_ids("</tool_call>")
    compiled = grammars.get(lcb)
    longest = '{"name":"run_tests","arguments":{"code":"aaaa' + r"\ud83d\ude00" + 'aaaa"}}'  # written out
    assert (compiled.tools, compiled.token_bound) == (
        ("run_tests", "submit"),
        6 + 1 + len(longest.encode()) + 1 + 1 + UTF8_SLACK_TOKENS,
    )
    assert grammars.get(dict(reversed(list(lcb.items())))) is compiled  # the same set, any order
    other = {"submit": Tool("submit", "other", lcb["submit"].schema)}
    assert grammars.get(other) is not compiled
    wider = {**lcb, "submit": lcb_tools(CodeBounds(5, 1))["submit"]}  # the same names, another schema
    # its submit takes code runs of 5: two bytes more, still shorter than run_tests' call
    assert grammars.get(wider) is not compiled and grammars.get(wider).token_bound == compiled.token_bound
    assert grammars.get(wider).tools == ("run_tests", "submit")
    reordered = {
        n: Tool(t.name, t.description, dict(reversed(list(t.schema.items())))) for n, t in lcb.items()
    }
    assert grammars.get(reordered) is compiled  # a schema is keyed by its content, not its key order
    tag, _ = structural_tag(lcb, 6, grammars.call_open_id, grammars.call_close_id)
    assert compiled.tag_json == tag.model_dump_json()
    again = grammars.from_tag_json(compiled.tag_json)
    assert isinstance(again, xgr.CompiledGrammar) and grammars.from_tag_json(compiled.tag_json) is again
    tight = CallGrammars(tokenizer, len(tokenizer), [eos], 6, bound)
    with pytest.raises(ConfigError) as err:
        tight.get(lcb)
    assert str(err.value) == (
        f"runtime.max_generation_tokens ({bound}) must exceed the grammar's hard bound ({bound} tokens "
        "for tools ['run_tests', 'submit']); raise it or lower runtime.max_text_tokens / "
        "runtime.max_code_run / runtime.max_code_escapes"
    )
