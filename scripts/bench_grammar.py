#!/usr/bin/env python
"""Grammar mask benchmark: what the call grammar's masks cost the host, per row and per step,
at a real vocabulary (Qwen3's 151,936 tokens, the synthetic tokenizer of `config/h200.yaml`).

    python scripts/bench_grammar.py [--tokenizer DIR] [--walks 2] [--rows 128] [--out grammar.json]

Rows walk through the GPQA and LCB call grammars (atlas.runtime.grammar, R and E from
`config/h200.yaml`'s runtime) taking a seeded uniformly random allowed token at every step, as a
random-init model samples: free text to its bound, a call, code strings run to their bounds. Two
spellings of the same grammar, on the same walks (their masks are checked equal at every step):

chain    the runtime's: a code string's runs as a chain of rules with lookaheads
repeats  `[ !#-\\[\\]-~]{0,R}` runs and a grouped escape, the plain spelling of the same strings

For each: one matcher's `fill_next_token_bitmask` (median, 99th percentile and largest, in
microseconds) and, for `--rows` rows in one BatchGrammarMatcher as the engine fills them each
decode step, the fill's milliseconds per step (median, largest) and over the whole walk.
`--tokenizer DIR`: a saved tokenizer (a built model's folder); default: the synthetic one, built
here (about 20 s).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import numpy as np
import xgrammar as xgr
from transformers import AutoTokenizer

from atlas.config.study import merged, parse_config, read_yaml
from atlas.hashing import atomic_write_json
from atlas.runtime.grammar import ESCAPES, RUN_CLASS, CallGrammars, arguments_ebnf, structural_tag
from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools

REPO = Path(__file__).resolve().parents[1]


def repeats(schema: dict) -> str:
    """The arguments grammar with `{0,R}` runs and one grouped escape: the plain spelling, made
    from the runtime's root rule by writing each run and escaped run out as repeats."""
    escape = '"\\\\" (' + ESCAPES[0].split(" ", 1)[1] + ' | "u" ('
    escape += " | ".join(e.split(" ", 1)[1] for e in ESCAPES[1:]) + "))"
    root = arguments_ebnf(schema).splitlines()[0]
    root = re.sub(
        r"escaped_(\d+)\{0,(\d+)\}", lambda m: f"({escape} {RUN_CLASS}{{0,{m[1]}}}){{0,{m[2]}}}", root
    )
    return re.sub(r"\brun_(\d+)", lambda m: f"{RUN_CLASS}{{0,{m[1]}}}", root)


def walk(grammars: dict, rows: int, vocab: int, seed: int, threads: int) -> dict:
    """`rows` rows (GPQA and LCB alternating) to their ends, each form's matchers fed alike."""
    rng = np.random.default_rng(seed)
    matchers = {form: [xgr.GrammarMatcher(g[r % 2]) for r in range(rows)] for form, g in grammars.items()}
    batch = xgr.BatchGrammarMatcher(threads) if threads else xgr.BatchGrammarMatcher()
    masks = {form: xgr.allocate_token_bitmask(rows, vocab) for form in grammars}
    one = xgr.allocate_token_bitmask(1, vocab)
    ids = np.arange(vocab)
    out = {form: {"single_us": [], "step_ms": []} for form in grammars}
    live = list(range(rows))
    while live:
        for form, ms in matchers.items():
            t = time.perf_counter()
            batch.batch_fill_next_token_bitmask(
                [ms[r] for r in live], masks[form], indices=list(range(len(live)))
            )
            out[form]["step_ms"].append(1e3 * (time.perf_counter() - t))
            r = live[len(out[form]["step_ms"]) % len(live)]  # one row's mask alone, a different row each step
            t = time.perf_counter()
            ms[r].fill_next_token_bitmask(one)
            out[form]["single_us"].append(1e6 * (time.perf_counter() - t))
        first, *others = (masks[form][: len(live)].numpy() for form in grammars)
        if any(not np.array_equal(first, o) for o in others):
            raise AssertionError("the two spellings' masks differ")
        words = first.view(np.uint32)
        ended = []
        for i, r in enumerate(live):
            allowed = np.flatnonzero((words[i][ids // 32] >> (ids % 32).astype(np.uint32)) & 1)
            token = int(rng.choice(allowed))
            for ms in matchers.values():
                if not ms[r].accept_token(token):
                    raise AssertionError(f"row {r}: token {token} refused after the mask allowed it")
            if ms[r].is_terminated():
                ended.append(r)
        live = [r for r in live if r not in ended]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config/h200.yaml")
    p.add_argument("--tokenizer", type=Path)
    p.add_argument("--walks", type=int, default=2, help="batches of --rows rows, each to its end")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument(
        "--threads", type=int, default=0, help="BatchGrammarMatcher threads (0: xgrammar's default)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    cfg = parse_config(
        merged(read_yaml(REPO / "config/config.yaml"), read_yaml(args.config)), str(args.config)
    )
    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        from atlas.model.shapes import model_tokenizer

        tokenizer = model_tokenizer(cfg.model)
    vocab = -(-len(tokenizer) // 64) * 64
    rt = cfg.runtime
    cg = CallGrammars(
        tokenizer, vocab, [tokenizer.eos_token_id], rt.max_text_tokens, rt.max_generation_tokens
    )
    bounds = CodeBounds.of(rt)
    tool_sets = (gpqa_tools(bounds), lcb_tools(bounds))
    grammars = {
        "chain": [cg.get(tools).grammar for tools in tool_sets],
        "repeats": [
            cg.compiler.compile_structural_tag(
                structural_tag(tools, rt.max_text_tokens, cg.call_open_id, cg.call_close_id, repeats)[0]
            )
            for tools in tool_sets
        ],
    }
    runs = [walk(grammars, args.rows, vocab, seed, args.threads) for seed in range(args.walks)]
    res = dict(vocab=vocab, rows=args.rows, walks=args.walks, max_code_run=rt.max_code_run, forms={})
    print(f"masks of {args.rows} rows x {args.walks} walks, vocabulary {vocab}, runs of {rt.max_code_run}")
    print(
        f"  {'form':8s} {'one mask us: median':>20s} {'p99':>7s} {'max':>8s}   {'a step ms: median':>18s} {'max':>7s} {'all s':>7s}"
    )
    for form in grammars:
        single = [x for r in runs for x in r[form]["single_us"]]
        steps = [x for r in runs for x in r[form]["step_ms"]]
        row = dict(
            single_us_median=statistics.median(single),
            single_us_p99=float(np.percentile(single, 99)),
            single_us_max=max(single),
            step_ms_median=statistics.median(steps),
            step_ms_max=max(steps),
            seconds=sum(steps) / 1e3,
            steps=len(steps),
        )
        res["forms"][form] = row
        print(
            f"  {form:8s} {row['single_us_median']:20.1f} {row['single_us_p99']:7.0f} {row['single_us_max']:8.0f}"
            f"   {row['step_ms_median']:18.2f} {row['step_ms_max']:7.1f} {row['seconds']:7.2f}"
        )
    if args.out:
        atomic_write_json(args.out, res)


if __name__ == "__main__":
    main()
