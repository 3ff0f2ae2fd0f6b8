"""Export the attn_topk testbench's cases: random KV caches run through the CPU reference of each sparse attention
method (ragserve.attention on ragserve.kernels.cpu.attention.CpuOps), with the kernel launch each one makes and
the results it must return.

    python hls_bm25/tb_attn_export.py --out DIR [--seed S]

Writes ``DIR/cases.txt``: per case a header ``case NAME MODE ROWS HEADS DIM KEYS UNIT MID_START MID_END K``, then
the launch's q, w, keys and keys_hi (f32 as hex bits; w and keys_hi empty where the mode takes none) and the
expected unit scores (hex bits) and top-k unit ids, the format ``tb_attn_topk.cpp`` reads.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ragserve.attention import get_method
from ragserve.kernels.cpu.attention import CpuOps
from ragserve.kernels.fpga.attention import MODES

# (name, method, batch, query heads, kv heads, context, head dim, budget, sink, local)
CASES = [
    ("dsa-gqa", "dsa", 2, 8, 2, 3000, 64, 1024, 16, 64),
    ("dsa-odd-dim", "dsa", 1, 3, 1, 700, 40, 300, 0, 16),
    ("quest", "quest", 2, 8, 2, 4000, 128, 1024, 16, 64),
    ("quest-partial-page", "quest", 1, 4, 4, 1001, 24, 256, 16, 16),
    ("lserve", "lserve", 1, 8, 2, 3000, 64, 512, 16, 64),
    ("seer-topk", "seer-topk", 2, 4, 2, 8000, 64, 2048, 64, 64),
    ("dsa-k2048", "dsa", 1, 2, 1, 6000, 16, 2048 + 80, 16, 64),
]


class Recorder(CpuOps):
    """The CPU kernels, noting the launch the FPGA would get."""

    def relevancy(self, kind, plan, **arrays):
        self.launch = (kind, plan, {k: (self.asarray(v) if hasattr(v, "shape") else v) for k, v in arrays.items()})
        return super().relevancy(kind, plan, **arrays)


def _hex(a: np.ndarray) -> str:
    return " ".join(f"{v:08x}" for v in np.ascontiguousarray(a, dtype=np.float32).ravel().view(np.uint32).tolist())


def export(out: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = [f"cases {len(CASES)}"]
    for name, method, b, hq, g, n, d, budget, sink, local in CASES:
        q = rng.standard_normal((b, hq, d), dtype=np.float32)
        keys = rng.standard_normal((b, g, n, d), dtype=np.float32)
        rec = Recorder()
        m = get_method(method, budget=budget, sink=sink, local=local, ops=rec)
        index = m.prepare(keys)
        rel = m.relevancy(index, q, keys)
        sel = m.retrieval(rel, n)
        kind, (s, l, k), arrays = rec.launch
        qa = arrays["q"]
        rows = qa.shape[0] * qa.shape[1]
        ka = arrays["lo" if kind == "bounds_max" else "keys"]
        unit = arrays.get("unit", 1)
        units = rel.scores.shape[-1]
        lines.append(f"case {name} {MODES[kind]} {rows} {qa.shape[2]} {qa.shape[3]} {ka.shape[-2]} {unit} {s} "
                     f"{units - l} {k}")
        lines.append(_hex(qa))
        lines.append(_hex(arrays["w"]) if "w" in arrays else "")
        lines.append(_hex(ka))
        lines.append(_hex(arrays["hi"]) if kind == "bounds_max" else "")
        lines.append(_hex(rel.scores))
        lines.append(" ".join(map(str, np.asarray(sel.top).ravel().tolist())))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    export(Path(a.out), a.seed)


if __name__ == "__main__":
    main()
