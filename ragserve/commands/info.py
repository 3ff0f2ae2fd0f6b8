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
    from indexer.segments import is_live

    if is_live(args.index):
        return _live(args)
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


def _live(args: argparse.Namespace) -> int:
    """A live index: its last commit (writes logged since are replayed by the next writer to open it)."""
    from indexer.reader import InvalidIndexError
    from indexer.segments import LiveIndex

    try:
        live = LiveIndex(args.index, writable=False)
        snap = live.snapshot()
        if args.verify:
            for s in snap.segments:
                s.reader.verify()
    except InvalidIndexError as e:
        raise CliError(str(e)) from e
    if args.json:
        print(json.dumps(live.commit.to_json(), indent=1))
        return 0
    print(f"index      {args.index}  (live index, commit generation {snap.generation}, write-ahead log seq "
          f"{live.commit.seq})")
    print(f"analyzer   {snap.settings['analyzer']}")
    print(f"bm25       k1={snap.k1} b={snap.b}")
    print(f"documents  {snap.num_docs:,} live ({snap.num_docs - snap.doc_count:,} empty), avgdl {float(snap.avgdl):.3f}")
    for s in snap.segments:
        print(f"  {s.name}  {s.reader.num_docs:,} docs, {s.deleted.size:,} deleted, "
              f"{s.reader.manifest['stats']['vocab_size']:,} terms")
    if args.verify:
        print("checksums  verified")
    return 0
