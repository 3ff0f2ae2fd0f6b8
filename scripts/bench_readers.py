"""Throughput and peak memory of the corpus readers: python scripts/bench_readers.py FILE... [--passage-words N]

Reads every document of the given files (``indexer.readers.iter_documents``, format auto-detected) and prints
one line per file: documents, records, seconds, on-disk MB/s, and the process's peak RSS so far; ``--json PATH`` also
writes them, with the machine and the tree measured (``tools/provenance.py``)."""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.readers import ReadStats, iter_documents  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--passage-words", type=int, default=100)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    rows = []
    for path in args.files:
        stats = ReadStats()
        start = time.perf_counter()
        docs = sum(1 for _ in iter_documents([path], stats=stats, passage_words=args.passage_words))
        secs = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"{path}: {docs} documents from {stats.records} records in {secs:.2f} s, "
              f"{stats.bytes_total / secs / 1e6:.1f} MB/s on disk, peak RSS {rss} MiB")
        rows.append({"file": path, "documents": docs, "records": stats.records, "seconds": round(secs, 3),
                     "disk_MBps": round(stats.bytes_total / secs / 1e6, 2), "peak_rss_MiB": rss})
    if args.json:
        report = {"benchmark": "corpus readers", "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
                  "load": round(os.getloadavg()[0], 2), "command": " ".join(sys.argv), "files": rows}
        Path(args.json).write_text(json.dumps(stamp(report), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
