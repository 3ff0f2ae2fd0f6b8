"""``ragserve add|delete|merge --index DIR``: write to a live index (``indexer/segments.py``) without a rebuild."""
from __future__ import annotations

import argparse
import os
import sys
import time

from ragserve.cli import CliError

BATCH = 1000  # documents per logged request: each is acknowledged (on disk) before the next is read


def register(sub: argparse._SubParsersAction) -> None:
    from indexer.readers import FORMATS, canonical_format

    p = sub.add_parser("add", help="add or replace documents in an index, without a rebuild",
                       description="Add the documents of corpus files to an index (a plain index becomes a live "
                                   "one: indexer/FORMAT.md, 'Live index'). A document whose id the index holds "
                                   "replaces it. Every batch is on disk (write-ahead log) before the next is read; "
                                   "at the end the writes are committed as a delta segment. Fails if a server "
                                   "started with --writes holds the index: send writes to it (POST /v1/documents).")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="corpus files")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory (a plain index becomes a live one)")
    p.add_argument("--format", default="auto", choices=["auto", *FORMATS], type=canonical_format,
                   help="input format (default auto)")
    p.add_argument("--passage-words", type=int, default=100,
                   help="split whole articles into passages of this many words (default 100; 0: whole articles)")
    p.add_argument("--create", action="store_true", help="start an empty live index if DIR does not exist")
    p.add_argument("--dense-model", metavar="DIR", help="the dense part's sentence encoder, where it is not at the "
                   "path the dense part records (an index with a dense part embeds what it adds)")
    p.add_argument("--merge", action="store_true", help="merge all segments into one afterwards")
    p.set_defaults(func=run_add)

    p = sub.add_parser("delete", help="delete documents from an index by id, without a rebuild",
                       description="Delete documents by their corpus ids (a plain index becomes a live one). "
                                   "Ids the index does not hold are reported and ignored.")
    p.add_argument("ids", nargs="*", metavar="ID", help="document ids")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory (a plain index becomes a live one)")
    p.add_argument("--ids-file", metavar="FILE", help="a file of ids, one a line")
    p.add_argument("--merge", action="store_true", help="merge all segments into one afterwards")
    p.set_defaults(func=run_delete)

    p = sub.add_parser("merge", help="merge a live index's segments into one, dropping deleted documents",
                       description="Fold every segment of a live index into one segment without its deleted "
                                   "documents (searches then run on one segment, as on a fresh build).")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory (a plain index becomes a live one)")
    p.set_defaults(func=run_merge)


def _open(path: str, create: bool = False, dense_model: str | None = None):
    from indexer.reader import InvalidIndexError
    from indexer.segments import LiveIndex, LiveIndexError
    import ragserve.retrieval.live_dense  # noqa: F401 - writes the segments' dense parts, where there are any

    try:
        return LiveIndex(path, writable=True, create=create, dense_model=dense_model)
    except (LiveIndexError, InvalidIndexError) as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot open {path} for writing: {e.strerror or e}") from None


def _finish(live, merge: bool, t0: float) -> None:
    snap = live.force_merge() if merge else live.refresh()
    print(f"{live.path}: {snap.num_docs:,} documents in {len(snap.segments)} segment(s), "
          f"{sum(int(s.deleted.size) for s in snap.segments):,} deleted awaiting a merge ({time.time() - t0:.1f} s)")
    live.close()


def run_add(args: argparse.Namespace) -> int:
    from indexer.readers import CorpusError, iter_documents
    from indexer.segments import LiveIndexError

    for path in args.inputs:
        if not os.path.exists(path):
            raise CliError(f"input {path} does not exist")
    t0 = time.time()
    live = _open(args.index, args.create, args.dense_model)
    added = 0
    try:
        docs = iter_documents(args.inputs, fmt=args.format, passage_words=args.passage_words)
        batch = []
        for d in docs:
            batch.append(d)
            if len(batch) == BATCH:
                added += live.add(batch).added
                batch = []
        if batch:
            added += live.add(batch).added
    except (CorpusError, LiveIndexError, OSError, ValueError) as e:
        live.close()
        raise CliError(f"{e} ({added:,} documents written before it are kept)") from None
    print(f"added {added:,} documents", file=sys.stderr)
    try:
        _finish(live, args.merge, t0)
    except LiveIndexError as e:  # e.g. the encoder of the dense part is missing: the writes stay in the log
        live.close()
        raise CliError(f"{e} (the {added:,} documents are logged and become searchable at the next refresh "
                       f"that can embed them)") from None
    return 0


def run_delete(args: argparse.Namespace) -> int:
    from indexer.segments import LiveIndexError

    ids = list(args.ids)
    if args.ids_file:
        try:
            with open(args.ids_file, encoding="utf-8") as f:
                ids += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise CliError(f"cannot read {args.ids_file}: {e.strerror or e}") from None
    if not ids:
        raise CliError("no ids given (pass IDs or --ids-file FILE)")
    t0 = time.time()
    live = _open(args.index)
    try:
        res = live.delete(ids)
    except LiveIndexError as e:
        live.close()
        raise CliError(str(e)) from None
    if res.missing:
        print(f"not in the index ({len(res.missing):,}): {', '.join(res.missing[:10])}"
              f"{' ...' if len(res.missing) > 10 else ''}", file=sys.stderr)
    print(f"deleted {res.deleted:,} documents", file=sys.stderr)
    _finish(live, args.merge, t0)
    return 0


def run_merge(args: argparse.Namespace) -> int:
    t0 = time.time()
    live = _open(args.index)
    _finish(live, True, t0)
    return 0
