"""Throughput and peak memory of the corpus readers: python scripts/bench_readers.py FILE... [--passage-words N]

Reads every document of the given files (``indexer.readers.iter_documents``, format auto-detected) and prints
one line per file: documents, records, seconds, on-disk MB/s, and the process's peak RSS so far."""
from __future__ import annotations

import argparse
import resource
import time

from indexer.readers import ReadStats, iter_documents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--passage-words", type=int, default=100)
    args = ap.parse_args()
    for path in args.files:
        stats = ReadStats()
        start = time.perf_counter()
        docs = sum(1 for _ in iter_documents([path], stats=stats, passage_words=args.passage_words))
        secs = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"{path}: {docs} documents from {stats.records} records in {secs:.2f} s, "
              f"{stats.bytes_total / secs / 1e6:.1f} MB/s on disk, peak RSS {rss} MiB")


if __name__ == "__main__":
    main()
