r"""The call grammar: bounded free text, then exactly one tool call, then only a stop token.

    generation ::= text{<= max_text_tokens, never "<tool_call>" or "</tool_call>"}
                   <tool_call> {"name":"<tool>","arguments":<compact JSON args>} </tool_call>  EOS

It is an xgrammar structural tag. `<tool_call>` and `</tool_call>` are matched as their single
token ids (TokenFormat), so a call is never spelled out in pieces and parsing is by token id.
The arguments grammar is written here, not lowered from JSON schema by xgrammar: xgrammar 0.2.9
lowers a `maxLength` string to `[^"\\\r\n]{0,N}`, which admits raw control characters (invalid
JSON) and no escapes (code needs `\n`), and a bounded repeat of a rule with alternatives (the
obvious fix) costs ~50 ms per mask. Enums are literal alternatives; a code string is

    "\"" run_R escaped_R{0,E} "\""                  runs of printable ASCII, at most R characters
    run_k ::= ("" | [ !#-\[\]-~] run_k-1) (= ["\\])    run_0 ::= ""
    escaped_R ::= (escape run_R) (= ["\\])
    escape ::= one of \" \\ \/ \n \t, \uXXXX (not a surrogate) or a \uXXXX\uXXXX surrogate pair

with no whitespace anywhere outside strings. It admits what `"\"" [ !#-\[\]-~]{0,R} (escape
[ !#-\[\]-~]{0,R}){0,E} "\""` admits, in a shape whose masks xgrammar works out when it compiles
the grammar. A token that runs past the end of a rule is checked against what follows the rule
at every mask, unless the rule asserts what follows it (a lookahead); near the end of a repeat
such as `{0,R}`, or right after a backslash, that is most of a 151,936-token vocabulary, 1 to 12 ms
a row. So a run is a chain of rules, one a character, and an escape is one rule with the run
after it, its alternatives spelled out flat (a group or a repeat inside it would be a rule of its
own, with no lookahead); each asserts that a quote or a backslash follows, which holds wherever a
run ends. Every mask of a code string then takes microseconds (`scripts/bench_grammar.py`).

Every region is bounded, so a generation has a hard token bound (`CompiledCall.token_bound`); the
runtime's token cap must exceed it, so a call can never be cut off, and the report's whitespace
loop inside an unclosed call cannot happen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import xgrammar as xgr
from xgrammar.structural_tag import (
    AnyTextFormat,
    ConstStringFormat,
    GrammarFormat,
    OrFormat,
    SequenceFormat,
    StructuralTag,
    TokenFormat,
)

from atlas.chat import CALL_CLOSE, CALL_OPEN
from atlas.config.base import ConfigError
from atlas.runtime.tools import Tool, call_prefix, token_bound

RUN_CLASS = r"[ !#-\[\]-~]"  # printable ASCII without quote and backslash
RUN_END = r'(= ["\\])'  # a lookahead: in a code string, a quote or a backslash follows every run
# The escapes, each with the run after it: \" \\ \/ \n \t; \uXXXX outside the surrogates D800-DFFF;
# a whole surrogate pair (one character beyond the BMP, counted as one escape). A lone surrogate
# is valid JSON but not valid text, and it would fail the moment the code is written to a file or
# a parquet column. Flat sequences of character classes, no group or repeat (module docstring).
HEX = "[0-9a-fA-F]"
ESCAPES = (
    r'"\\" ["\\/nt]',
    r'"\\u" [0-9a-cA-Ce-fE-F] ' + " ".join([HEX] * 3),
    r'"\\u" [dD] [0-7] ' + " ".join([HEX] * 2),
    r'"\\u" [dD] [89abAB] ' + " ".join([HEX] * 2) + r' "\\u" [dD] [c-fC-F] ' + " ".join([HEX] * 2),
)


def _ebnf_literal(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid EBNF string literal here


def arguments_ebnf(schema: dict) -> str:
    """Compact-JSON grammar of an arguments object (its byte bound: tools.argument_bytes).

    Supports the subset our tools use: an object of required string properties, each an enum or
    a bounded string, written in `required` order with no whitespace."""
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        raise ValueError("tool schemas must be closed objects (additionalProperties: false)")
    parts, runs = [], set()
    for i, key in enumerate(schema["required"]):
        prop = schema["properties"][key]
        if prop.get("type") != "string":
            raise ValueError(f"property {key!r}: only string properties are supported")
        prefix = ("," if i else "") + json.dumps(key) + ":"
        if "enum" in prop:
            options = " | ".join(_ebnf_literal(json.dumps(v)) for v in prop["enum"])
            parts += [_ebnf_literal(prefix), f"({options})"]
        elif "x-atlas-max-run" in prop:
            run, escapes = int(prop["x-atlas-max-run"]), int(prop["x-atlas-max-escapes"])
            runs.add(run)
            parts += [
                _ebnf_literal(prefix + '"'),
                f"run_{run}",
                f"escaped_{run}{{0,{escapes}}}",
                _ebnf_literal('"'),
            ]
        else:
            raise ValueError(f"property {key!r}: strings must be an enum or a bounded code string")
    root = "root ::= " + " ".join([_ebnf_literal("{"), *parts, _ebnf_literal("}")])
    return "\n".join([root, *code_string_rules(runs)])


def code_string_rules(runs: set[int]) -> list[str]:
    """The rules a code string with runs of at most R characters, R in `runs`, refers to:
    escaped_R (an escape and the run after it) and run_0 .. run_R (run_k: up to k characters)."""
    if not runs:
        return []
    escaped = [
        f"escaped_{r} ::= (" + " | ".join(f"{e} run_{r}" for e in ESCAPES) + f") {RUN_END}"
        for r in sorted(runs)
    ]
    chain = [f'run_{k} ::= ("" | {RUN_CLASS} run_{k - 1}) {RUN_END}' for k in range(max(runs), 0, -1)]
    return [*escaped, *chain, 'run_0 ::= ""']


def structural_tag(
    tools: dict[str, Tool],
    max_text_tokens: int,
    call_open: int | str = CALL_OPEN,
    call_close: int | str = CALL_CLOSE,
    arguments=arguments_ebnf,
) -> tuple[StructuralTag, int]:
    """The structural tag for one tool set, and the hard token bound of a generation under it
    (`arguments`: a tool schema's grammar; a benchmark hands it another spelling)."""
    calls = []
    for name, tool in sorted(tools.items()):
        ebnf = arguments(tool.schema)
        prefix = call_prefix(name)
        calls.append(
            SequenceFormat(
                elements=[
                    ConstStringFormat(value=prefix),
                    GrammarFormat(grammar=ebnf),
                    ConstStringFormat(value="}"),
                ]
            )
        )
    tag = StructuralTag(
        format=SequenceFormat(
            elements=[
                AnyTextFormat(excludes=[CALL_OPEN, CALL_CLOSE], max_tokens=max_text_tokens),
                TokenFormat(token=call_open),
                OrFormat(elements=calls),
                TokenFormat(token=call_close),
            ]
        )
    )
    return tag, token_bound(tools, max_text_tokens)


@dataclass(frozen=True)
class CompiledCall:
    tools: tuple[str, ...]
    grammar: xgr.CompiledGrammar
    token_bound: int  # no generation under this grammar is longer, stop token included
    tag_json: str  # the structural tag it was compiled from: what another engine (vLLM) is handed


def grammar_tokenizer_info(
    tokenizer, vocab_size: int, stop_token_ids: list[int]
) -> tuple[xgr.TokenizerInfo, set[int]]:
    """xgrammar's view of the vocabulary, with added tokens made unmatchable as content.

    xgrammar matches tokens by their bytes, so `</tool_call>` or `<|im_start|>` would be legal
    *inside* a code string (their bytes are printable ASCII). The call tags get a 0xFF prefix,
    a byte no string here admits (AnyText excludes their text anyway), so they match only where a
    TokenFormat names their id. Every other added token but the stop token gets the empty string,
    which xgrammar treats as special and never admits, so the grammar alone (as any engine is
    handed it) forbids them; the HF engine also bans them with -inf. Returns the info and those
    banned ids."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    vocab = list(info.decoded_vocab)
    added = tokenizer.get_added_vocab()
    banned = {i for t, i in added.items() if t not in (CALL_OPEN, CALL_CLOSE) and i not in stop_token_ids}
    for token, i in added.items():
        if i in banned:
            vocab[i] = b""  # an empty token is special to xgrammar: never admitted anywhere
        elif i not in stop_token_ids:
            vocab[i] = b"\xff" + token.encode("utf-8")  # the call tags: only by TokenFormat id
    raw = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    return raw, banned


class CallGrammars:
    """Compiles the call grammar once per tool set (cached) for one tokenizer."""

    def __init__(
        self, tokenizer, vocab_size: int, stop_token_ids: list[int], max_text_tokens: int, max_tokens: int
    ):
        self.info, self.banned_token_ids = grammar_tokenizer_info(tokenizer, vocab_size, list(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info)
        self.call_open_id = tokenizer.convert_tokens_to_ids(CALL_OPEN)
        self.call_close_id = tokenizer.convert_tokens_to_ids(CALL_CLOSE)
        self.max_text_tokens = max_text_tokens
        self.max_tokens = max_tokens
        self._cache: dict[tuple, CompiledCall] = {}
        self._by_text: dict[str, xgr.CompiledGrammar] = {}

    def get(self, tools: dict[str, Tool]) -> CompiledCall:
        key = tuple(sorted((name, json.dumps(t.schema, sort_keys=True)) for name, t in tools.items()))
        if key not in self._cache:
            tag, bound = structural_tag(tools, self.max_text_tokens, self.call_open_id, self.call_close_id)
            if bound >= self.max_tokens:
                raise ConfigError(
                    f"runtime.max_generation_tokens ({self.max_tokens}) must exceed the grammar's hard "
                    f"bound ({bound} tokens for tools {sorted(tools)}); raise it or lower "
                    "runtime.max_text_tokens / runtime.max_code_run / runtime.max_code_escapes"
                )
            grammar = self.compiler.compile_structural_tag(tag)
            self._cache[key] = CompiledCall(tuple(sorted(tools)), grammar, bound, tag.model_dump_json())
        return self._cache[key]

    def from_tag_json(self, tag_json: str) -> xgr.CompiledGrammar:
        """Compile a structural tag another process built with `get` (cached by its text)."""
        if tag_json not in self._by_text:
            self._by_text[tag_json] = self.compiler.compile_structural_tag(tag_json)
        return self._by_text[tag_json]
