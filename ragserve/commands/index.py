"""``ragserve index INPUT... --out DIR``: build an index from corpus files."""
from __future__ import annotations

import argparse
import os
import sys

from indexer.analyzer import AnalyzerConfig
from indexer.layout import DEFAULT_BANK_BYTES, DEFAULT_BLOCK_SIZE
from ragserve.cli import CliError


def register(sub: argparse._SubParsersAction) -> None:
    from indexer.readers import FORMAT_HELP, FORMATS, canonical_format

    p = sub.add_parser("index", help=f"build an index from corpus files ({', '.join(FORMATS)})",
                       description="Build a sharded BM25 index (layout: indexer/FORMAT.md) from corpus files. "
                                   "Compressed inputs (.gz, .bz2) are read as they are. Formats: "
                                   + "; ".join(f"{n}: {h}" for n, h in FORMAT_HELP.items()) + ".")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="corpus files")
    p.add_argument("--out", required=True, help="index directory to create")
    p.add_argument("--format", default="auto", choices=["auto", *FORMATS], type=canonical_format,
                   help="input format (default auto: from compression, name and content)")
    p.add_argument("--on-error", choices=["skip", "fail"], default="skip",
                   help="malformed records: count and skip them (default) or stop at the first")
    p.add_argument("--passage-words", type=int, default=100,
                   help="split whole articles (MediaWiki XML, WikiExtractor, wikimedia/wikipedia Parquet) into "
                        "passages of this many words (default 100, as DPR); 0 keeps whole articles")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="docs per accumulator block (power of two)")
    p.add_argument("--bank-bytes", type=int, default=DEFAULT_BANK_BYTES, help="HBM bank capacity a shard must fit")
    p.add_argument("--k1", type=float, default=0.9, help="default BM25 k1 recorded in the index")
    p.add_argument("--b", type=float, default=0.4, help="default BM25 b recorded in the index")
    p.add_argument("--no-stem", action="store_true", help="disable Porter stemming")
    p.add_argument("--no-stopwords", action="store_true", help="keep stopwords")
    p.add_argument("--workers", type=int, default=0, help="analysis processes (default: one per core)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="build on the Ray cluster at ADDRESS (local: start one here) with Ray Data; the same "
                        "index files as without it (needs ragserve[ray]; the output directory on a shared file system)")
    p.add_argument("--dense", metavar="MODEL",
                   help="also embed the passages with this sentence encoder (dense part; see index-dense)")
    from ragserve.commands.retrieval_options import add_dense_build_args

    add_dense_build_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from indexer.readers import CorpusError
    from indexer.options import BuildError, BuildOptions
    from indexer.writer import build_index
    from indexer.bm25 import check_params

    for path in args.inputs:
        if not os.path.exists(path):
            raise CliError(f"input {path} does not exist")
    if args.dense:  # a model that cannot embed is found before the BM25 build, not after it
        from ragserve.retrieval.embedder import EmbedderError, read_encoder_config

        try:
            read_encoder_config(args.dense)
        except EmbedderError as e:
            raise CliError(str(e)) from None
    try:
        check_params(args.k1, args.b)
    except ValueError as e:
        raise CliError(str(e)) from e
    if args.passage_words < 0:
        raise CliError("--passage-words must be >= 0")
    opts = BuildOptions(block_size=args.block_size, bank_bytes=args.bank_bytes, k1=args.k1, b=args.b,
                        workers=args.workers, overwrite=args.overwrite, progress=not args.quiet,
                        analyzer=AnalyzerConfig(stemmer="none" if args.no_stem else "porter",
                                                stopwords="none" if args.no_stopwords else "lucene-english"))
    try:
        if args.ray:
            manifest = _build_on_ray(args, opts)
        else:
            manifest = build_index(args.inputs, args.out, opts, fmt=args.format, on_error=args.on_error,
                                   passage_words=args.passage_words)
    except (BuildError, CorpusError) as e:
        raise CliError(str(e)) from e
    except OSError as e:  # e.g. a folder above --out is a file, or not writable
        raise CliError(f"cannot write the index to {args.out}: {e.strerror or e}") from None
    st, lay, src = manifest["stats"], manifest["layout"], manifest["source"]
    print(f"indexed {st['num_docs']:,} documents into {args.out}: "
          f"{st['vocab_size']:,} terms, {st['num_postings']:,} postings, {lay['num_shards']} shard(s), "
          f"{lay['num_blocks']} block(s) of {lay['block_size']:,} docs, {manifest['build_seconds']:.1f} s")
    # One count line for what the list below shows: malformed records and truncated files alike.
    skipped, truncated, problems = src.get("skipped", 0), src.get("truncated", []), src.get("error_count", 0)
    if problems:
        print(f"{problems:,} input problem(s): {skipped:,} malformed record(s) skipped, "
              f"{len(truncated)} truncated file(s)")
        for err in src.get("errors", [])[:5]:
            print(f"  {err}")
        if problems > 5:
            print(f"  ... {problems - 5:,} more (the first 100 are listed in {args.out}/manifest.json)")
    for path in truncated:
        print(f"warning: {path} ends early (truncated or corrupt compressed data); documents before the cut "
              f"were indexed", file=sys.stderr)
    if args.dense:
        from ragserve.commands.retrieval_options import build_dense, report_dense

        try:
            report_dense(build_dense(args, args.out, args.dense, overwrite=True), args.out)
        except CliError as e:  # the BM25 index stands on its own; only the dense part is missing
            raise CliError(f"{e} (the BM25 index at {args.out} is complete; add the dense part with "
                           f"'ragserve index-dense {args.out} --model MODEL')") from None
    return 0


def _build_on_ray(args: argparse.Namespace, opts) -> dict:
    from ragserve.distributed import RayUnavailable

    try:
        from ragserve.distributed.build import build_index_ray

        return build_index_ray(args.inputs, args.out, opts, fmt=args.format, on_error=args.on_error,
                               passage_words=args.passage_words, address=args.ray, workers=args.workers)
    except RayUnavailable as e:
        raise CliError(str(e)) from e
