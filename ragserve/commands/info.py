"""``ragserve info DIR``: print an index's manifest summary (or the whole manifest as JSON)."""
from __future__ import annotations

import argparse
import json

from ragserve.cli import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe an index", description="Print an index's manifest.")
    p.add_argument("index", metavar="DIR", help="index directory (ragserve index)")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    p.add_argument("--verify", action="store_true", help="recompute every file's SHA-256")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from indexer.reader import IndexReader, InvalidIndexError

    try:
        reader = IndexReader(args.index, verify=args.verify)
    except InvalidIndexError as e:
        raise CliError(str(e)) from e
    m = reader.manifest
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    st, lay = m["stats"], m["layout"]
    total = sum(f["bytes"] for f in m["files"].values())
    print(f"index      {args.index}  (format {m['format']} v{m['version']}, built by {m['builder']} at {m['created']})")
    print(f"analyzer   {m['analyzer']}")
    print(f"bm25       k1={m['bm25']['k1']} b={m['bm25']['b']}")
    print(f"documents  {st['num_docs']:,} ({st['empty_docs']:,} empty), avgdl {st['avgdl']:.3f}")
    print(f"terms      {st['vocab_size']:,}   postings {st['num_postings']:,}   max tf {st['max_tf']}")
    print(f"layout     {lay['num_blocks']} block(s) of {lay['block_size']:,} docs ({lay['accumulator_bytes']:,} B accumulator), "
          f"tf_bits {lay['tf_bits']}, bank {lay['bank_bytes']:,} B")
    for s in m["shards"]:
        print(f"  {s['dir']}  docs [{s['doc_start']:,}, {s['doc_end']:,})  blocks [{s['block_start']}, {s['block_end']})  "
              f"{s['postings']:,} postings  {s['entries']:,} block entries  {s['bytes']:,} B "
              f"({100.0 * s['bytes'] / lay['bank_bytes']:.1f}% of a bank)")
    print(f"size       {total:,} bytes in {len(m['files'])} files" + ("  (checksums verified)" if args.verify else ""))
    _dense(reader, args.verify)
    return 0


def _dense(reader, verify: bool) -> None:
    from ragserve.retrieval.dense import DENSE_DIR, DenseIndex, DenseIndexError

    if not (reader.path / DENSE_DIR).is_dir():
        return
    try:
        d = DenseIndex(reader, verify=verify)
    except DenseIndexError as e:
        raise CliError(str(e)) from e
    enc, size = d.encoder, sum(f["bytes"] for f in d.manifest["files"].values())
    print(f"dense      {d.num_docs:,} x {d.dim} fp16 embeddings of {enc['name']} ({enc['pooling']} pooling"
          f"{', normalised' if enc['normalize'] else ''}, {enc['fingerprint'][:12]}), faiss {d.kind}, {size:,} bytes"
          + ("  (checksums verified)" if verify else ""))
