"""Throughput of ``indexer.synth.write_corpus`` (passages/s written to disk), per worker count and compression.

    .venv/bin/python scripts/bench_synth.py --docs 1000000 --workers 1 2 [--json out.json]

``--json`` also writes the rows, with the machine and the tree measured (``tools/provenance.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.synth import Synthesizer, WIKI_PARAMS, write_corpus  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--gzip", action="store_true", help="also measure .jsonl.gz output")
    ap.add_argument("--dir", help="where to write (default: a temporary directory)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    rows = []
    load_start = round(os.getloadavg()[0], 2)
    Synthesizer(WIKI_PARAMS).chunk(0, 1)  # JIT compile / load the numba cache outside the timing
    print(f"host: {cpu_model()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for suffix in (".jsonl", ".jsonl.gz") if args.gzip else (".jsonl",):
            for workers in args.workers:
                out = Path(tmp) / f"synth{suffix}"
                wall, cpu = time.perf_counter(), time.process_time()
                stats = write_corpus(out, args.docs, seed=1, workers=workers)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                print(f"{suffix:<10} workers={workers:<3} {stats.docs:,} passages in {wall:.2f} s: "
                      f"{stats.docs / wall:,.0f} passages/s, {stats.bytes / wall / 1e6:,.0f} MB/s of JSONL "
                      f"(cpu {cpu:.2f} s, file {out.stat().st_size / 1e6:,.0f} MB)")
                rows.append({"output": suffix, "workers": workers, "passages": stats.docs, "wall_s": round(wall, 3),
                             "cpu_s": round(cpu, 3), "file_MB": round(out.stat().st_size / 1e6, 1)})
                out.unlink()
    if args.json:
        report = {"benchmark": "synthetic corpus writer", "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
                  "load_start": load_start, "load_end": round(os.getloadavg()[0], 2), "command": " ".join(sys.argv),
                  "rows": rows}
        Path(args.json).write_text(json.dumps(stamp(report), separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
