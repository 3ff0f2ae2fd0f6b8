"""``ragserve corpus``: list and fetch known corpora (``corpora/*.json`` recipes), or synthesize one."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from tqdm import tqdm

from ragserve.cli import CliError, output_path
from ragserve.recipes import FetchError, RecipeError, fetch, get_recipe, recipes


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("corpus", help="list, fetch or synthesize corpora",
                              description="List and download the corpora ragserve knows, or write a synthetic one.")
    sub = p.add_subparsers(dest="corpus_command", metavar="ACTION")
    sub.required = True

    ls = sub.add_parser("list", help="known corpora (bundled recipes)")
    ls.set_defaults(func=run_list)

    fe = sub.add_parser("fetch", help="download a corpus (resumable, checksum-verified) and unpack it")
    fe.add_argument("name", help="corpus name from 'ragserve corpus list', or a recipe .json file")
    fe.add_argument("--dest", help="download directory (default: data/NAME)")
    fe.add_argument("--timeout", type=float, default=60.0, help="seconds without data before giving up (default 60)")
    fe.set_defaults(func=run_fetch)

    sy = sub.add_parser("synth", help="write a synthetic Wikipedia-like passage corpus (JSONL)",
                        description="Synthetic passages whose word frequencies, vocabulary growth, passage lengths "
                                    "and stopword share follow the DPR/Wikipedia samples they were fitted on "
                                    "(see indexer/synth.py). Same seed, same bytes.")
    sy.add_argument("--docs", type=int, required=True, help="number of passages")
    sy.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz")
    sy.add_argument("--seed", type=int, default=0, help="random seed (default 0; same seed, same bytes)")
    sy.add_argument("--length", type=float, help="mean passage length in tokens (default: fitted, ~101)")
    sy.add_argument("--length-std", type=float, help="standard deviation of the passage length (default: fitted)")
    sy.add_argument("--queries", type=int, default=0, help="also write this many queries drawn from passages")
    sy.add_argument("--queries-out", help="queries file (TSV 'id<TAB>text')")
    sy.add_argument("--workers", type=int, help="generator threads (default: one per CPU; output is the same)")
    sy.set_defaults(func=run_synth)


def run_list(args: argparse.Namespace) -> int:
    known = recipes()
    width = max(len(n) for n in known)
    for name, r in known.items():
        checks = sum(1 for f in r.files if f.checksum[0])
        print(f"{name:<{width}}  {r.format:<8}  {len(r.files):>2} file(s), {checks} with checksum  {r.description}")
    return 0


def _bar_factory(bars: list):
    def make(total: int | None, have: int, label: str):
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=label, leave=False,
                   disable=None)  # no bar when stderr is not a terminal
        bars.append(bar)
        return bar.update
    return make


def run_fetch(args: argparse.Namespace) -> int:
    try:
        recipe = get_recipe(args.name)
    except RecipeError as e:
        raise CliError(str(e)) from None
    dest = Path(args.dest or Path("data") / recipe.name)
    bars: list = []
    try:
        paths = fetch(recipe, dest, progress=_bar_factory(bars), timeout=args.timeout)
    except FetchError as e:
        raise CliError(str(e)) from None
    except OSError as e:  # --dest (or a folder above it) is a file, or not writable
        raise CliError(f"cannot write to {dest}: {e.strerror or e}") from None
    finally:
        for bar in bars:
            bar.close()
    for p in paths:
        print(f"{p}  ({p.stat().st_size:,} bytes)")
    if recipe.corpus:
        print(f"corpus: {dest / recipe.corpus}  (format {recipe.format})")
    for what in ("queries", "qrels"):
        if getattr(recipe, what):
            print(f"{what}: {dest / getattr(recipe, what)}")
    return 0


def run_synth(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from indexer.synth import WIKI_PARAMS, write_corpus

    if args.queries and not args.queries_out:
        raise CliError("--queries needs --queries-out FILE")
    out = output_path(args.out, "corpus file")
    if args.queries_out:
        output_path(args.queries_out, "queries file")
    try:
        params = replace(WIKI_PARAMS, length_mean=WIKI_PARAMS.length_mean if args.length is None else args.length,
                         length_std=WIKI_PARAMS.length_std if args.length_std is None else args.length_std)
        start = time.perf_counter()
        with tqdm(total=args.docs, unit="doc", unit_scale=True, desc="synth", disable=None) as bar:
            stats = write_corpus(out, args.docs, seed=args.seed, params=params, n_queries=args.queries,
                                 queries_path=args.queries_out, progress=bar.update, workers=args.workers)
    except ValueError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot write {e.filename or out}: {e.strerror or e}") from None
    seconds = time.perf_counter() - start
    print(f"wrote {stats.docs:,} passages, {stats.tokens:,} tokens, {stats.bytes / 1e6:,.1f} MB of JSONL to {out} "
          f"in {seconds:.1f} s ({stats.docs / seconds:,.0f} passages/s)")
    if stats.queries:
        print(f"wrote {stats.queries:,} queries to {args.queries_out}")
    return 0
