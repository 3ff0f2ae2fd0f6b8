"""``ragserve memory add|search|list|delete``: the persisted memory bank (``ragserve.memory.store``) on the
command line; the same bank a server's ``/v1/memory`` serves (one process holds it at a time)."""
from __future__ import annotations

import argparse
import json
import sys

from ragserve.cli import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="a persisted memory bank: add, search, list and delete entries",
                       description="Texts kept in a memory directory (an fsynced log: an add that returned is "
                                   "never lost), recalled by meaning with a sentence encoder on the memory "
                                   "bank's kernels (cpu, gpu, fpga-sim). The bank a server serves at /v1/memory "
                                   "(ragserve serve --memory DIR); one process at a time holds it.")
    a = p.add_subparsers(dest="memory_action", metavar="ACTION")
    a.required = True

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--memory", required=True, metavar="DIR", help="the memory directory")
        q.add_argument("--json", action="store_true", help="print JSON")

    add = a.add_parser("add", help="add texts (one atomic write)",
                       description="Add each TEXT (or each line of --file) as an entry; prints their ids. A new "
                                   "DIR is made with --model.")
    common(add)
    add.add_argument("texts", nargs="*", metavar="TEXT", help="texts to remember (or --file)")
    add.add_argument("--file", metavar="FILE", help="one text per line ('-': standard input)")
    add.add_argument("--metadata", metavar="JSON", help="a JSON object stored with each text")
    add.add_argument("--model", metavar="DIR",
                     help="sentence encoder of a new memory bank (e.g. ragserve models install minilm); an "
                          "existing one keeps its own")
    add.add_argument("--capacity", type=int, default=None,
                     help="a new bank: entries held before the oldest is evicted (default 65536)")
    add.add_argument("--embed-device", default="cpu", help="encoder device: cpu (default), cuda[:N], auto")
    add.set_defaults(func=run_add)

    s = a.add_parser("search", help="the entries nearest a query",
                     description="Top-k entries by the inner product of the embeddings (cosine for MiniLM).")
    common(s)
    s.add_argument("query", help="what to recall")
    s.add_argument("-k", type=int, default=5, help="hits (default 5)")
    s.add_argument("--memory-backend", default="cpu", choices=["cpu", "gpu", "fpga-sim"],
                   help="memory bank kernels: cpu (default), gpu, fpga-sim (at most 256 dimensions)")
    s.add_argument("--device", help="torch device of the gpu backend (default cuda)")
    s.add_argument("--embed-device", default="cpu", help="encoder device: cpu (default), cuda[:N], auto")
    s.set_defaults(func=run_search)

    ls = a.add_parser("list", help="entries, oldest first", description="Entries oldest first (by id).")
    common(ls)
    ls.add_argument("--after", type=int, default=None, metavar="ID", help="only entries with an id above ID")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.set_defaults(func=run_list)

    d = a.add_parser("delete", help="delete entries by id", description="Forget the entries with these ids.")
    common(d)
    d.add_argument("ids", nargs="+", type=int, metavar="ID", help="ids of the entries to delete")
    d.set_defaults(func=run_delete)


def _open(args: argparse.Namespace, **kw):
    """The memory bank, or one line saying why not. Listing and deleting never load the encoder (nor torch)."""
    from ragserve.memory.store import MemoryStore, MemoryStoreError

    try:
        return MemoryStore(args.memory, create=False, **kw)
    except MemoryStoreError as e:
        raise CliError(str(e)) from None


def _encoder_errors() -> tuple[type[Exception], ...]:
    """What adding or searching may raise for bad input: the bank's and its encoder's errors."""
    from ragserve.memory.store import MemoryStoreError
    from ragserve.retrieval.embedder import EmbedderError

    return MemoryStoreError, EmbedderError


def _entry_line(e: dict, score: float | None = None) -> str:
    head = f"{e['id']:6d}" + (f"  {score:8.4f}" if score is not None else "")
    meta = f"  {json.dumps(e['metadata'], ensure_ascii=False)}" if e["metadata"] else ""
    text = e["text"] if len(e["text"]) <= 200 else e["text"][:200] + "..."
    return f"{head}  {text}{meta}"


def run_add(args: argparse.Namespace) -> int:
    from ragserve.memory.store import MemoryStore, check_metadata

    texts = list(args.texts)
    if args.file:
        try:
            f = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
            with f:
                texts += [ln.rstrip("\n") for ln in f if ln.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read {args.file}: {getattr(e, 'strerror', None) or e}") from None
    if not texts or any(not t.strip() for t in texts):
        raise CliError("give the texts to add (TEXT ... or --file), none of them empty")
    try:
        meta = check_metadata(json.loads(args.metadata)) if args.metadata else None
    except ValueError as e:  # json's and ours
        raise CliError(f"--metadata: {e}") from None
    if args.capacity is not None and args.capacity < 1:
        raise CliError(f"--capacity must be at least 1, got {args.capacity}")
    errors = _encoder_errors()
    try:
        store = MemoryStore(args.memory, args.model, capacity=args.capacity, embed_device=args.embed_device)
    except errors as e:
        raise CliError(str(e)) from None
    try:
        ids, evicted = store.add_with_evictions(texts, [meta] * len(texts))
    except errors as e:
        raise CliError(str(e)) from None
    except OSError as e:  # nothing was added: the log's failed write is undone
        raise CliError(f"cannot write the memory bank {args.memory}: {e.strerror or e}") from None
    finally:
        store.close()
    if args.json:
        print(json.dumps({"ids": ids, "evicted": evicted}))
    else:
        print(f"added {len(ids)} {'entry' if len(ids) == 1 else 'entries'} to {args.memory}: "
              f"id{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
              + (f"; evicted the oldest {len(evicted)}" if evicted else ""))
    return 0


def run_search(args: argparse.Namespace) -> int:
    if not args.query.strip():
        raise CliError("the query is empty")
    if args.k < 1:
        raise CliError(f"-k must be at least 1, got {args.k}")
    store = _open(args, backend=args.memory_backend, device=args.device, embed_device=args.embed_device)
    try:
        hits = store.search(args.query, args.k)  # loads the encoder
    except _encoder_errors() as e:
        raise CliError(str(e)) from None
    finally:
        store.close()
    if args.json:
        print(json.dumps([dict(rank=r, **h.to_dict()) for r, h in enumerate(hits, 1)], ensure_ascii=False, indent=1))
    else:
        print("\n".join(_entry_line(h.entry.to_dict(), h.score) for h in hits) or "the memory bank is empty")
    return 0


def run_list(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise CliError(f"--limit must not be negative, got {args.limit}")
    store = _open(args)  # listing and deleting never load the encoder
    try:
        entries, total = store.list(args.after, args.limit), len(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"entries": [e.to_dict() for e in entries], "total": total}, ensure_ascii=False, indent=1))
    else:
        print("\n".join(_entry_line(e.to_dict()) for e in entries) or "no entries")
        print(f"{len(entries)} of {total} entries", file=sys.stderr)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    store = _open(args)  # listing and deleting never load the encoder
    try:
        deleted = store.delete(args.ids)
    except OSError as e:
        raise CliError(f"cannot write the memory bank {args.memory}: {e.strerror or e}") from None
    finally:
        store.close()
    missing = [i for i in dict.fromkeys(args.ids) if i not in deleted]
    if args.json:
        print(json.dumps({"deleted": deleted, "missing": missing}))
    elif deleted:
        print(f"deleted {', '.join(map(str, deleted))}")
    if missing:
        raise CliError(f"no entry with id {', '.join(map(str, missing))} in {args.memory}"
                       + (" (the others were deleted)" if deleted else ""))
    return 0
