"""MODELLED bm25_topk kernel time per query beside MEASURED CPU-backend time (and, with --attention, the
MODELLED attn_topk memory-processing time of a sparse attention decode step).

    python scripts/model_fpga.py --work DIR [--synth-docs 1000000] [--k 10 1000] [--batch 32] [--no-cpu] [--out FILE.md]
    python scripts/model_fpga.py --attention [--contexts 32768 131072 1048576] [--batch 1 8] [--out FILE.md]

Corpora: BEIR ArguAna, the HotpotQA dev (IRCoT) paragraphs, a synthetic Wikipedia-like corpus (indexer/synth.py)
of --synth-docs passages, and 21,015,324 passages (the DPR Wikipedia split's size) whose posting statistics are
extrapolated from the synthetic index (see ``extrapolated_counts``), laid out as ``ragserve index`` does (512 MiB
banks) and over all 32 pseudo-channels. Corpora and indexes are built under DIR on first use. Every FPGA figure is
a model (tools/fpga_model.py, KernelParams): no card was used; the counts it starts from equal the C simulation's
counters (tests/test_fpga_model.py). CPU times are measured here. The verdict compares the 21M model with the
H200's measured single-query p50 and batched q/s (--h200, a raw bench_gpu.py JSON), workload by workload.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not part of the installed package

from indexer.reader import IndexReader  # noqa: E402
from indexer.options import BuildOptions  # noqa: E402
from indexer.writer import build_index  # noqa: E402
from tools import fpga_model as M  # noqa: E402
from ragserve.kernels.fpga.backend import LaunchResult, merge_shards  # noqa: E402
from indexer.bm25 import QueryTerms  # noqa: E402
from ragserve.rag.corpus import dataset_passages, write_corpus  # noqa: E402
from ragserve.rag.datasets import read_dataset  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402

DATA = REPO.parent / "shared" / "data"
DPR_PASSAGES = 21_015_324


@dataclass
class Corpus:
    name: str
    index: Path
    texts: list[str]


def hotpot_paragraphs(out: Path) -> Path:
    """Every distinct (title, paragraph) of the 500 questions' contexts, as a BEIR-style corpus."""
    if not out.exists():
        write_corpus(dataset_passages(read_dataset(DATA / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl")), out)
    return out


def ensure_index(inputs: list[Path], out: Path, **layout) -> Path:
    if not (out / "manifest.json").exists():
        build_index(inputs, out, BuildOptions(progress=False, **layout))
    return out


def spread_layout(index: Path, cus: int) -> dict:
    """Block size and bank size that put the same corpus on about ``cus`` shards of one block each."""
    m = json.loads((index / "manifest.json").read_text())
    n, st = m["stats"]["num_docs"], m["stats"]
    block = 1 << max(6, min(18, math.ceil(math.log2(max(1, n / cus)))))
    blocks = -(-n // block)
    per_block = 2.5 * (4 * st["num_postings"] + 13 * sum(s["entries"] for s in m["shards"])) / blocks + block
    return {"block_size": block, "bank_bytes": int(per_block + 4 * (st["vocab_size"] + 2))}


def corpora(work: Path, synth_docs: int, cus: int) -> list[Corpus]:
    work.mkdir(parents=True, exist_ok=True)
    arguana_in = [DATA / "beir-arguana" / "corpus.jsonl.gz"]
    arguana_q = [q.text for q in read_queries(DATA / "beir-arguana" / "queries.jsonl.gz")]
    hotpot_in = [hotpot_paragraphs(work / "hotpot_paragraphs.jsonl")]
    with open(DATA / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl", encoding="utf-8") as f:
        hotpot_q = [json.loads(line)["question_text"] for line in f]
    sdir = work / f"synth-{synth_docs}"
    sdir.mkdir(exist_ok=True)
    if not (sdir / "queries.tsv").exists():
        from indexer.synth import write_corpus
        write_corpus(sdir / "corpus.jsonl", synth_docs, seed=0, n_queries=1000, queries_path=sdir / "queries.tsv")
    synth_q = [q.text for q in read_queries(sdir / "queries.tsv")]
    out = []
    for name, inputs, texts in (("arguana", arguana_in, arguana_q), ("hotpotqa", hotpot_in, hotpot_q),
                                (f"synth-{synth_docs // 1000}k", [sdir / "corpus.jsonl"], synth_q)):
        default = ensure_index(inputs, work / f"{name}.idx")
        out.append(Corpus(f"{name} (default layout)", default, texts))
        spread = ensure_index(inputs, work / f"{name}.{cus}cu.idx", **spread_layout(default, cus))
        out.append(Corpus(f"{name} (spread layout)", spread, texts))
    return out


def cpu_seconds_per_query(searcher: Searcher, queries: list[QueryTerms], k: int, repeats: int = 3) -> float:
    """Best of ``repeats`` runs of the CPU backend's scoring + top-k over all queries (analysis excluded)."""
    ix = searcher.index
    searcher.backend.search_terms(queries[:20], k, ix.k1, ix.b)  # JIT warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        searcher.backend.search_terms(queries, k, ix.k1, ix.b)
        best = min(best, time.perf_counter() - t0)
    return best / len(queries)


def merge_seconds_per_query(counts: np.ndarray, k: int, batch: int) -> float:
    """Measured host merge time for result lists of the modelled sizes (the host code the backends run)."""
    n, shards = counts.shape[:2]
    rng = np.random.default_rng(0)
    res_counts = counts[..., M.S["results"]].astype(np.int64)
    t = 0.0
    for first in range(0, n, batch):
        part = []
        for s in range(shards):
            c = np.minimum(res_counts[first:first + batch, s], k)
            r = LaunchResult.empty(c.size, k)
            r.counts[:] = c
            r.docids[:] = rng.integers(0, 1 << 30, r.docids.shape, dtype=np.uint32)
            r.scores[:] = -np.sort(-rng.random(r.scores.shape, dtype=np.float32), axis=1)
            part.append(r)
        t0 = time.perf_counter()
        merge_shards(part, k)
        t += time.perf_counter() - t0
    return t / n


def model_row(counts: np.ndarray, k: int, batch: int, p: M.KernelParams) -> dict:
    est, serial = M.kernel_cycles(counts, p)
    # A query's latency on the card: its slowest CU. Throughput: launches of `batch` queries.
    launch = M.launch_seconds(est, batch, p)
    bytes_q = M.hbm_bytes(counts, k, p)
    busiest = est.max(axis=1) / p.clock_hz
    banks = M.bank_utilisation(counts, k, p)
    return {
        "shards": counts.shape[1],
        "postings_per_query": float(counts[..., M.S["postings"]].sum(axis=1).mean()),
        "kernel_us": float(busiest.mean() * 1e6),
        "kernel_serial_us": float((serial.max(axis=1) / p.clock_hz).mean() * 1e6),
        "batched_us": float(launch.sum() / counts.shape[0] * 1e6),
        "hbm_mb_per_query": float(bytes_q.sum(axis=1).mean() / 1e6),
        "bank_util": [float(u) for u in banks],
        "rounds_per_beat": float(counts[..., M.S["rounds"]].sum() / max(1, counts[..., M.S["posting_words"]].sum())),
        "stage_share": {s: float(v.max(axis=1).sum() / est.max(axis=1).sum())
                        for s, v in M.stage_cycles(counts, p).items()},
    }


# ---- extrapolation to a larger synthetic corpus -------------------------------------------------------------


def extrapolated_counts(index: IndexReader, queries: list[QueryTerms], n_docs: int, vocab_size: int, k: int,
                        block_size: int = 1 << 18, bank_bytes: int = 512 << 20,
                        shards: int | None = None) -> np.ndarray:
    """Expected kernel counters for the same generator at ``n_docs`` passages, from a smaller synthetic index.

    The synthetic generator draws every passage independently from one word distribution, so a term's document
    frequency grows in proportion to the corpus (df' = df * n_docs / N) and different terms occur independently.
    Postings are spread uniformly over docids. Per term t and doc block b (d_b docs, p_t = df'_t / n_docs):
    postings p_t d_b, P(entry) = 1 - (1 - p_t)^d_b, beats 1 + (postings - 1)/16 per entry, lane rounds from the
    uniform-docid table of ``fpga_model.expected_rounds``; per block P(visited) = 1 - prod_t (1 - P(entry)),
    candidates d_b q with q = 1 - prod_t (1 - p_t), candidate rows d_b / 64 (1 - (1 - q)^64). Shards are filled
    with whole blocks up to ``bank_bytes`` (FORMAT.md's shard size with the scaled posting and entry totals), or
    the blocks are split into ``shards`` runs that differ by at most one block."""
    factor = n_docs / index.num_docs
    nb = -(-n_docs // block_size)
    docs = np.full(nb, float(block_size))
    docs[-1] = n_docs - (nb - 1) * block_size
    df_all = np.asarray(index.df, dtype=np.float64) * factor
    miss = 1.0 - np.minimum(df_all / n_docs, 1.0)
    hit_blocks = (nb - 1) * (1.0 - miss ** docs[0]) + (1.0 - miss ** docs[-1])  # expected entries per term
    postings = float(index.manifest["stats"]["num_postings"]) * factor
    entries = float(hit_blocks.sum()) + (vocab_size - index.vocab_size)  # new terms: rare, one entry each
    per_block = (4 * postings + 13 * entries) / nb + block_size
    fixed = 4 * (vocab_size + 1) + 4
    if shards:
        runs = [r for r in np.array_split(np.arange(nb), shards) if r.size]
    else:
        per_shard = max(1, int((bank_bytes - fixed) // per_block))
        runs = [np.arange(s, min(nb, s + per_shard)) for s in range(0, nb, per_shard)]
    chunk_postings = M.POSTINGS_PER_WORD * M.CHUNK_BEATS
    out = np.zeros((len(queries), len(runs), M.NUM_STATS))
    for i, q in enumerate(queries):
        p = df_all[q.term_ids.astype(np.int64)] / n_docs  # [T]
        nt = p.size
        q_any = 1.0 - np.prod(1.0 - p)
        for j, blocks in enumerate(runs):
            b = blocks
            d = docs[b]
            hit = 1.0 - np.power.outer(1.0 - p, d)  # [T, blocks]
            npost = p[:, None] * d[None, :]
            any_entry = 1.0 - np.prod(1.0 - hit, axis=1)
            visited = 1.0 - np.prod(1.0 - hit, axis=0)
            n_hit = np.maximum(npost / np.maximum(hit, 1e-300), 1.0)  # postings of an entry, given it exists
            beats_hit = 1.0 + (n_hit - 1.0) / M.POSTINGS_PER_WORD
            full = np.floor(n_hit / chunk_postings)
            pt = np.broadcast_to(p[:, None], n_hit.shape)
            rounds_hit = (full * M.expected_rounds(pt, np.full(n_hit.shape, float(chunk_postings)))
                          + M.expected_rounds(pt, n_hit - full * chunk_postings))
            nwords = np.ceil(d / M.NORMS_PER_WORD)
            c = out[i, j]
            c[M.S["terms"]] = nt
            c[M.S["table_reads"]] = 2 * nt + 2 * any_entry.sum()
            c[M.S["block_loop"]] = b.size
            c[M.S["scan"]] = b.size * nt
            c[M.S["blocks"]] = visited.sum()
            c[M.S["norm_words"]] = (visited * nwords).sum()
            c[M.S["entries"]] = hit.sum()
            c[M.S["entry_reads"]] = 2 * hit.sum() - any_entry.sum()
            c[M.S["posting_words"]] = (hit * beats_hit).sum()
            c[M.S["postings"]] = c[M.S["scored"]] = npost.sum()
            c[M.S["chunks"]] = (hit * np.ceil(beats_hit / M.CHUNK_BEATS)).sum()
            c[M.S["rounds"]] = (hit * rounds_hit).sum()
            c[M.S["lane_stalls"]] = M.ACC_GAP * np.maximum(hit.sum(axis=0) - visited, 0.0).sum()
            # The last visited block's flush runs alone after the shard's blocks.
            c[M.S["norm_flush"]] = c[M.S["norm_words"]] + nwords.max() * (1.0 - np.prod(1.0 - visited))
            c[M.S["candidates"]] = d.sum() * q_any
            c[M.S["cand_rows"]] = (nwords * (1.0 - (1.0 - q_any) ** M.NORMS_PER_WORD)).sum()
            c[M.S["inserts"]] = M.expected_inserts(c[M.S["candidates"]], k)
            c[M.S["results"]] = min(k, c[M.S["candidates"]])
    return out


def heaps_vocab(small: IndexReader, large: IndexReader, n_docs: int) -> int:
    """Vocabulary at ``n_docs`` from Heaps' law V = K n^beta through two measured synthetic indexes."""
    beta = math.log(large.vocab_size / small.vocab_size) / math.log(large.num_docs / small.num_docs)
    return int(large.vocab_size * (n_docs / large.num_docs) ** beta)


# ---- report -----------------------------------------------------------------------------------------------------


def fmt_row(name: str, ix_docs: int, layout: str, nq: int, cpu: dict, mod: dict, merge_us: float) -> str:
    cpu_s = " / ".join(f"{cpu[k] * 1e3:.3f}" if cpu.get(k) is not None else "n/a" for k in sorted(cpu))
    util = mod["bank_util"]
    return (f"| {name} | {ix_docs:,} | {layout} | {nq} | {mod['postings_per_query']:,.0f} | {cpu_s} | "
            f"{mod['kernel_us']:.1f} ({mod['kernel_serial_us']:.1f}) | {mod['batched_us']:.1f} + {merge_us:.1f} | "
            f"{mod['hbm_mb_per_query']:.2f} | {100 * min(util):.0f}-{100 * max(util):.0f}% | "
            f"{mod['rounds_per_beat']:.2f} |")


def h200_workloads(path: Path) -> list[dict]:
    """The measured H200 rows of a bench_gpu.py JSON: per question set and k, the postings of its median query,
    the single-query p50 and the batched q/s."""
    raw = json.loads(path.read_text())
    out = []
    for c in raw["corpora"]:
        for k, r in c["results"].items():
            out.append({"workload": c["corpus"], "k": int(k), "postings_p50": c["postings_per_query"]["p50"],
                        "p50_us": r["gpu"]["p50_ms"] * 1e3, "qps": r["gpu"]["batch_qps"],
                        "batch": r["gpu"]["batch"]})
    return out


def verdict_table(large: IndexReader, queries: list[QueryTerms], vocab: int, layouts: list[tuple[str, dict]],
                  gpu: list[dict], batch: int, p: M.KernelParams, nearest: int = 50) -> str:
    """Per H200 workload: the FPGA model on the ``nearest`` synthetic queries whose 21M postings are closest to the
    workload's median query, one query a launch and ``batch`` a launch, beside the H200's measured p50 (end to end
    in its backend) and batched q/s. The FPGA side is kernel + launch overhead only; the host merge of the CUs'
    lists is measured here apart (this VM, not the H200's host)."""
    lines = ["| workload (H200 measured) | k | postings: median query (FPGA sample) | H200 p50 us | FPGA layout | "
             "FPGA MODELLED us, one query a launch | host merge us, measured here | H200 q/s (batch) | "
             f"FPGA MODELLED q/s, batch {batch} | verdict (FPGA MODELLED / H200) |", "|" + "---|" * 10]
    for w in gpu:
        for name, layout in layouts:
            big = extrapolated_counts(large, queries, DPR_PASSAGES, vocab, w["k"], **layout)
            post = big[..., M.S["postings"]].sum(axis=1)
            pick = np.argsort(np.abs(post - w["postings_p50"]))[:nearest]
            sub = big[pick]
            est, _ = M.kernel_cycles(sub, p)
            single_us = float(np.median(M.launch_seconds(est, 1, p))) * 1e6
            merge_us = merge_seconds_per_query(sub.astype(np.int64), w["k"], 1) * 1e6
            qps = len(pick) / M.launch_seconds(est, batch, p).sum()
            lines.append(
                f"| {w['workload']} | {w['k']} | {w['postings_p50'] / 1e6:.2f}M ({post[pick].mean() / 1e6:.2f}M) | "
                f"{w['p50_us']:.1f} | {name} | {single_us:.1f} | {merge_us:.1f} | {w['qps']:,.0f} ({w['batch']}) | "
                f"{qps:,.0f} | latency {w['p50_us'] / single_us:.2f}x, q/s {qps / w['qps']:.2f}x: "
                f"{'faster before' if single_us < w['p50_us'] else 'slower even before'} the merge |")
    return "\n".join(lines) + "\n"


ATTN_METHODS = ("dsa", "quest", "lserve", "seer-topk")


def attention_table(contexts: list[int], batches: list[int]) -> str:
    """MODELLED attn_topk time per decode step and layer, keys BRAM/URAM-resident when they fit, else from HBM."""
    d, sh = M.AttnDesign(), M.StepShape()
    lines = [f"attn_topk on a U55C, MODELLED (tools/fpga_model.py AttnDesign: {d.clock_hz / 1e6:.0f} MHz, "
             f"{d.dsp_share:.0%} of {d.dsp} DSPs in the engines, keys on chip up to {d.onchip_bytes / 1e6:.0f} MB at "
             f"{d.onchip_bytes_per_s / 1e12:.1f} TB/s, else HBM at {d.hbm_bytes_per_s / 1e9:.0f} GB/s, "
             f"{d.filter_lanes} top-k filter lanes, {d.launch_s * 1e6:.0f} us launch). Step: {sh.q_heads} q heads, "
             f"{sh.kv_heads} KV heads, dim {sh.head_dim}, bf16 keys; DSA {sh.index_heads}x{sh.index_dim} fp8 index, "
             f"top-{sh.dsa_k}; pages {sh.page}, seer blocks {sh.block}, budget {sh.budget} tokens.", "",
             "| method | context | batch | keys scanned MB | where | read us | compute us | select us | "
             "MODELLED step us | bound |", "|" + "---|" * 10]
    for n in contexts:
        for b in batches:
            for m in ATTN_METHODS:
                r = M.attn_step_model(m, n, b, sh, d)
                lines.append(f"| {m} | {n:,} | {b} | {r['bytes'] / 1e6:.1f} | "
                             f"{'BRAM/URAM' if r['resident'] else 'HBM' if r['fits'] else 'over the 16 GB HBM'} | {r['read_s'] * 1e6:.1f} | "
                             f"{r['compute_s'] * 1e6:.1f} | {r['select_s'] * 1e6:.1f} | {r['seconds'] * 1e6:.1f} | "
                             f"{r['bound']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="directory for corpora and indexes (reused; BM25 model)")
    ap.add_argument("--attention", action="store_true", help="model the attn_topk kernel instead")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 1 << 20], help="--attention contexts")
    ap.add_argument("--synth-docs", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, nargs="+", default=[10, 1000], help="k values for CPU timing (model: first)")
    ap.add_argument("--batch", type=int, nargs="+", default=None,
                    help="queries per kernel launch (default 32); with --attention, sequences (default 1 8)")
    ap.add_argument("--cus", type=int, default=8, help="about how many shards (CUs) the spread layouts aim at")
    ap.add_argument("--no-cpu", action="store_true", help="model only: leave the measured CPU column out")
    ap.add_argument("--h200", type=Path, default=Path(__file__).resolve().parents[1] / "benchmarks" / "raw" / "gpu"
                    / "bench_gpu_3bed766_21m.json", help="bench_gpu.py JSON of the 21M H200 run (the verdict)")
    ap.add_argument("--out", type=Path, help="write the markdown table here too")
    args = ap.parse_args(argv)
    if args.attention:
        text = attention_table(args.contexts, args.batch or [1, 8])
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0
    if args.work is None:
        ap.error("--work is required (or --attention)")
    if not args.h200.is_file():
        ap.error(f"--h200 {args.h200}: no such file")
    args.batch = (args.batch or [32])[0]
    p = M.KernelParams()
    k_model = args.k[0]
    lines = ["| corpus | docs | layout: block, shards = CUs | queries | postings/query | CPU measured ms/query "
             f"(k={' / '.join(map(str, sorted(args.k)))}) | FPGA MODELLED kernel us/query, slowest CU (serial bound) | "
             f"MODELLED us/query, batch {args.batch} + measured host merge | MODELLED HBM MB/query | "
             "MODELLED bank BW used, per bank (min-max) | MODELLED lane rounds per posting beat |", "|" + "---|" * 11]
    details = {}
    for c in corpora(args.work, args.synth_docs, args.cus):
        s = Searcher(c.index, backend="cpu")
        queries = [s.analyze(t) for t in c.texts]
        cpu = {k: None if args.no_cpu else cpu_seconds_per_query(s, queries, k) for k in args.k}
        counts = M.predict_counts(s.index, queries, k_model)
        mod = model_row(counts, k_model, args.batch, p)
        merge_us = merge_seconds_per_query(counts, k_model, args.batch) * 1e6
        layout = f"2^{s.index.block_size.bit_length() - 1}, {len(s.index.shards)}"
        lines.append(fmt_row(c.name, s.index.num_docs, layout, len(queries), cpu, mod, merge_us))
        details[c.name] = {"cpu_s_per_query": cpu, "model": mod, "merge_us": merge_us}
        print(lines[-1], file=sys.stderr)
        s.close()
    # 21M: posting statistics extrapolated from the synthetic index; vocabulary from Heaps' law over two sizes.
    small_dir = args.work / f"synth-{args.synth_docs // 10}"
    if not (small_dir / "queries.tsv").exists():
        from indexer.synth import write_corpus
        small_dir.mkdir(exist_ok=True)
        write_corpus(small_dir / "corpus.jsonl", args.synth_docs // 10, seed=0, n_queries=10,
                     queries_path=small_dir / "queries.tsv")
    small = IndexReader(ensure_index([small_dir / "corpus.jsonl"], args.work / f"synth-{args.synth_docs // 10}.idx"))
    large = Searcher(args.work / f"synth-{args.synth_docs // 1000}k.idx", backend="cpu")
    queries = [large.analyze(q.text) for q in read_queries(args.work / f"synth-{args.synth_docs}" / "queries.tsv")]
    # Check the extrapolation on measured data first: small index -> the synthetic index's exact counts.
    check = extrapolated_counts(small, [small_q for small_q in (_reanalyse(small, large, q) for q in queries)],
                                large.index.num_docs, large.index.vocab_size, k_model)
    exact = M.predict_counts(large.index, queries, k_model)
    chk_model, exact_model = model_row(check, k_model, args.batch, p), model_row(exact, k_model, args.batch, p)
    vocab = heaps_vocab(small, large.index, DPR_PASSAGES)
    layouts = [("2^18 blocks, 512 MiB banks", {}), ("2^16 blocks, 32 banks", {"block_size": 1 << 16, "shards": 32})]
    for name, layout in layouts:
        big = extrapolated_counts(large.index, queries, DPR_PASSAGES, vocab, k_model, **layout)
        mod = model_row(big, k_model, args.batch, p)
        merge_us = merge_seconds_per_query(big.astype(np.int64), k_model, args.batch) * 1e6
        lines.append(fmt_row(f"synthetic {DPR_PASSAGES / 1e6:.1f}M (extrapolated stats)", DPR_PASSAGES,
                             f"{name}: {big.shape[1]}", len(queries), {k: None for k in args.k}, mod, merge_us))
        details[f"synth-21M {name}"] = {"model": mod, "merge_us": merge_us}
    details["synth-21M"] = {"vocab": vocab, "extrapolation_check": {
        "from": small.num_docs, "to": large.index.num_docs, "extrapolated": chk_model, "exact": exact_model}}
    text = "\n".join(lines)
    text += (f"\n\nExtrapolation check (MODELLED): {small.num_docs:,} -> {large.index.num_docs:,} synthetic docs "
             f"predicts {chk_model['kernel_us']:.1f} us/query kernel, {chk_model['postings_per_query']:,.0f} "
             f"postings/query and {chk_model['rounds_per_beat']:.2f} lane rounds a beat; the exact counts of the "
             f"{large.index.num_docs:,}-doc index give {exact_model['kernel_us']:.1f} us, "
             f"{exact_model['postings_per_query']:,.0f} and {exact_model['rounds_per_beat']:.2f}. "
             f"Vocabulary at {DPR_PASSAGES:,} docs (Heaps' law): {vocab:,}.\n")
    for name, _ in layouts:
        util = details[f"synth-21M {name}"]["model"]["bank_util"]
        text += (f"\nPer-bank bandwidth used, 21M, {name} (MODELLED, bank 0..{len(util) - 1}): "
                 + ", ".join(f"{100 * u:.0f}%" for u in util) + "\n")
    text += "\n" + verdict_table(large.index, queries, vocab, layouts, h200_workloads(args.h200), args.batch, p)
    print(text)
    if args.out:
        args.out.write_text(text + "\n```json\n" + json.dumps(details, indent=1, default=float) + "\n```\n")
    return 0


def _reanalyse(small: IndexReader, large: Searcher, q: QueryTerms) -> QueryTerms:
    """The same query's terms as ids of the small index (terms it lacks are dropped: df 0 there)."""
    names = [large.index.term(int(t)) for t in q.term_ids]
    pairs = sorted((small.term_ids[n], b) for n, b in zip(names, q.boosts.tolist()) if n in small.term_ids)
    ids = np.asarray([t for t, _ in pairs], dtype=np.uint32)
    boosts = np.asarray([b for _, b in pairs], dtype=np.float32)
    return QueryTerms(term_ids=ids, boosts=boosts, weights=boosts)


if __name__ == "__main__":
    sys.exit(main())
