"""RAG end to end at the seeds' scale: every method over HotpotQA questions with a 21M-passage BM25 index and a
Llama-2-7B-shaped generator (Llama-3.1-8B-shaped for two-stage, with a BERT-base-shaped cross-encoder over the
BM25 top 100), per retrieval backend: cpu (measured), gpu (measured, sharing the card with the generator) and fpga
(MODELLED: the cpu run with the BM25 kernel's time replaced by ``tools/fpga_model.py``'s).

    python scripts/bench_rag_scale.py --data-dir DATA --out rag_scale.json   # H200: the full run (4-7 minutes)
    python scripts/bench_rag_scale.py --quick --out /tmp/rag_quick.json      # CPU dry run with tiny shapes
    python scripts/bench_rag_scale.py --prepare --out prep.json              # the index inputs only (reused)
    python scripts/bench_rag_scale.py --report rag_scale.json                # the tables of a (partial) run
    python scripts/bench_rag_scale.py --generator /work/models/gemma-270m --engine fast --out rag_gemma.json
                                                     # a serving-class generator: a real small model, fast engine
    python scripts/bench_rag_scale.py --arch gemma3 --engine fast --limit 10 --out rag_fast.json
                                                     # the 7B shapes on the fast engine (CUDA graph decode)

``DATA`` is ../shared/data or a copy holding hotpotqa-dev500-ircot, wiki18-100w-passages-sample and
enwiki-wikiextractor-json-sample (the questions, the passage text and the reference corpus).

What is real and what stands in:
- Models: random weights in the published configurations (bf16 on a GPU). Answers are noise; only the times
  count. A forward pass costs the same whatever the weights hold, but a random model's output differs from a
  trained one's, so how many tokens and retrievals a question takes differs too: both are reported per question,
  with the time per token and per retrieval, so the shares can be re-weighted. Llama-2-7B: vocab 32,000, hidden
  4,096, 32 layers, 32 heads, intermediate 11,008. Llama-3.1-8B: 8 KV heads, intermediate 14,336 and a
  128,256-row embedding and LM head, but the same 32k BPE tokenizer (a 128k one takes too long to train here);
  the LM-head rows of ids the tokenizer lacks are zeroed, so greedy decoding never picks an id it cannot decode,
  while the matmul keeps its full size. RoPE base and scaling stay at the defaults (no cost difference). The
  cross-encoder is BERT-base (12 layers, 768 hidden, 12 heads, 3,072 intermediate) over the same 32k vocabulary.
- Index: ``scripts/synth_layout.py``'s synthetic 21,015,324-passage layout (the DPR Wikipedia split's size).
  Every query a loop forms (real words) is mapped onto its vocabulary by document-frequency rank against a
  reference index of real Wikipedia text (``QueryMapper``), then searched through ``Searcher``; the mapping is lab
  overhead and is taken out of the seconds per question (its cost is reported).
- Passages: hits carry REAL text, DPR 100-word Wikipedia passages from ../shared/data cycled by docid, so prompts
  have real length; which passage a docid gets is arbitrary (only the prompt length matters).
- fpga: MODELLED, never measured. For the same analysed queries as the cpu run, the BM25 relevancy + retrieval time
  of each search is replaced by the model's kernel launch (one CU per shard of the layout, 512 MiB = one U55C HBM
  pseudo-channel each) plus the measured host merge of the per-CU top-k lists; everything else is the cpu run's.
- Batch: the RAG loops answer one question at a time. Batch 8 is run for ``none`` and ``single`` only, through a
  batched greedy decode in this script (HF ``generate``, left padding, the full token budget, no early stop) and one
  ``search_batch`` per batch; the same path at batch 1 gives the like-for-like reference.
- Served (``--clients N``, default 8): the server's way, every method's own loop for N questions at once, one
  thread each, their decode steps batched by the generator's batcher (continuous batching, ``ragserve.rag.batcher``)
  and their retrievals meeting at the backend. ``s/q`` is then the wall time over the questions (the inverse of the
  throughput), and the answers must equal the one-at-a-time loop's (greedy, batch-invariant engine).
- Generator: ``--generator DIR`` replaces the random shapes by a real causal LM (every method, two-stage included):
  a serving-class small model such as gemma-3-270m, decoded by the engine ``--engine`` picks (``fast``: the
  architecture's batched engine, ``ragserve.rag.engines``). A DIR without weights (config.json and the tokenizer
  only, e.g. carried to a machine the weights cannot reach) gets random weights in that configuration, like the
  shapes above: the times hold, the answers are noise.

Cells run in priority order (per-question loops, both backends per method, then the batched path) and one that would
not finish before ``--deadline-s`` is skipped; the JSON is rewritten after every cell, so a timeout still leaves
results.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a bare checkout
sys.path.insert(0, str(REPO / "scripts"))

import numpy as np  # noqa: E402

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

T0 = time.time()
DATA = REPO.parent / "shared" / "data"
DPR_PASSAGES = 21_015_324
STAGES = ("prepare", "relevancy", "retrieval", "apply")
LOOP_ORDER = ("single", "fixed-sentence", "flare", "dragin", "two-stage", "fixed-length", "none")

LLAMA2_7B = dict(vocab_size=32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5)
LLAMA31_8B = dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072, rms_norm_eps=1e-5)
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512)
# --quick: the same code on shapes a 2-core CPU runs in seconds; vocab rows past the 2k tokenizer test the zeroing.
QUICK = {"lm": dict(LLAMA2_7B, vocab_size=2048, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4),
         "lm2": dict(LLAMA31_8B, vocab_size=4096, hidden_size=128, intermediate_size=448, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
         "ce": dict(BERT_BASE, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)}

# The seeds' figures (paper on an MI210 + U55C; /work/shared/notes/seeds-memory-pipeline.md), against their
# MI210-only baseline: FPGA end-to-end speed-up at batch 1 and 32, and the range over their RAG settings.
SEEDS = {
    "fixed-sentence": {"fpga_e2e_batch1": 1.26, "fpga_e2e_batch32": 2.10, "fpga_e2e_range": [1.10, 1.45]},
    "flare": {"fpga_e2e_batch1": 1.19, "fpga_e2e_batch32": 2.11, "fpga_e2e_range": [1.10, 1.45]},
    "dragin": {"fpga_e2e_batch1": 1.14, "fpga_e2e_batch32": 1.92, "fpga_e2e_range": [1.10, 1.45]},
    "two-stage": {"fpga_e2e_range": [1.47, 1.84], "memory_speedup_range": [1.1, 2.1]},
}
SEEDS_COMMON = {"memory_share_at_20M_docs": [0.40, 0.61], "memory_speedup_range_dragin_flare_fs": [5.1, 6.6],
                "hardware": "AMD MI210 + Alveo U55C, Llama 2 7B (Llama 3.1 8B for two-stage), Wikipedia up to 20M docs"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---- environment and inputs ----------------------------------------------------------------------------------
def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cpu": cpu_model(), "cpus": os.cpu_count(), "device": device, "argv": sys.argv}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return env


def wiki_passages(data: Path) -> list[tuple[str, str]]:
    """(title, text) of the DPR 100-word Wikipedia passage sample."""
    out = []
    with open(data / "wiki18-100w-passages-sample" / "sample_data.jsonl", encoding="utf-8") as f:
        for line in f:
            title, _, text = json.loads(line)["contents"].partition("\n")
            out.append((title.strip().strip('"'), " ".join(text.split())))
    return out


def build_reference(hotpot: Path, data: Path, work: Path) -> None:
    """The reference index of real text (``gpu_bench_inputs.reference_inputs``) in ``work/ref``, in one process
    (numba compiles once), then one cpu-backend search on it, so the cpu kernels are compiled and cached too. Runs in
    a spawned process beside the layout writer and the model builds."""
    from gpu_bench_inputs import reference_inputs
    from indexer.options import BuildOptions
    from indexer.writer import build_index
    from ragserve.rag.corpus import dataset_passages, write_corpus
    from ragserve.rag.datasets import read_dataset
    from ragserve.retrieval.searcher import Searcher

    ref = work / "ref"
    if not (ref / "manifest.json").exists():
        shutil.rmtree(ref, ignore_errors=True)
        paragraphs = write_corpus(dataset_passages(read_dataset(hotpot)), work / "hotpot_paragraphs.jsonl")
        build_index(reference_inputs(paragraphs, data), ref, BuildOptions(progress=False, workers=1))
    s = Searcher(ref, backend="cpu")
    s.search("which magazine was started first", k=3)
    s.close()


# ---- models -----------------------------------------------------------------------------------------------------
def build_generator(shape: dict, tok, device: str, name: str, engine: str = "auto", max_slots: int = 32,
                    arch: str = "llama"):
    """A random causal LM of ``shape`` built in place on ``device`` (bf16 on a GPU), wrapped without a save.
    ``arch``: ``llama``, or ``gemma3`` (the same widths as a Gemma 3 network, which has a fast decode engine)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    from ragserve.rag.generator import Generator

    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
               tie_word_embeddings=False)
    if arch == "gemma3":
        head = shape["hidden_size"] // shape["num_attention_heads"]
        # Every layer global (sliding window past the prompt lengths): the cost of the Llama shape it stands for.
        cfg = Gemma3TextConfig(**shape, **ids, head_dim=head, query_pre_attn_scalar=head,
                               sliding_window=shape["max_position_embeddings"], attn_implementation="eager")
    else:
        cfg = LlamaConfig(**shape, **ids)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if next(model.parameters()).dtype != dtype:  # a transformers that ignored dtype= would leave fp32
        model.to(dtype)
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tok):] = 0  # ids without a token: logit 0, never the argmax
    return Generator.from_model(model, tok, device=device, name=name, engine=engine, max_slots=max_slots)


def load_generator(path: Path, device: str, engine: str, max_slots: int):
    """The causal LM in ``path``; random weights in its configuration when the directory holds none."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ragserve.rag.generator import Generator

    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return Generator(str(path), device=device, engine=engine, max_slots=max_slots)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    return Generator.from_model(model, AutoTokenizer.from_pretrained(path), device=device,
                                name=f"random weights, {path.name} configuration", engine=engine, max_slots=max_slots)


def build_cross_encoder(shape: dict, tok, work: Path, device: str):
    """A random one-label BERT sequence classifier, saved (bf16) and loaded through ``CrossEncoder``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ragserve.retrieval.rerank import CrossEncoder

    out = work / "cross-encoder"
    shutil.rmtree(out, ignore_errors=True)
    cfg = BertConfig(vocab_size=len(tok), **shape, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return CrossEncoder(str(out), device=device)


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---- the retriever the loops see -------------------------------------------------------------------------------
class MappedRetriever:
    """``Searcher.search``'s signature over the synthetic index: the loop's query text is mapped onto the synthetic
    vocabulary (lab overhead, kept out of the stage times), searched, and the hits get real passage text. Every
    search is recorded (mapped queries, its own stage times) for the FPGA model and the per-retrieval figures."""

    def __init__(self, searcher, mapper, passages: list[tuple[str, str]]) -> None:
        self.searcher, self.mapper, self.passages = searcher, mapper, passages
        # What a wrapping reranker reads from the retriever it wraps (the contract's per-backend k bound).
        self.max_k, self.index, self.backend_name = searcher.max_k, searcher.index, searcher.backend_name
        self.calls: list[dict] = []

    def _fill(self, hits):
        from ragserve.retrieval.searcher import Hit

        n = len(self.passages)
        return [Hit(docid=h.docid, id=h.id, score=h.score, title=self.passages[h.docid % n][0],
                    text=self.passages[h.docid % n][1]) for h in hits]

    def search_batch(self, queries: list[str], k: int = 10, *, times=None) -> list[list]:
        from ragserve.kernels.contract import StageTimes

        t0 = time.perf_counter()
        mapped = [self.mapper(q) for q in queries]
        t1 = time.perf_counter()
        own = StageTimes()
        live = [m for m in mapped if m]  # a query of stopwords only finds nothing, as on a real index
        found = iter(self.searcher.search_batch(live, k=k, times=own) if live else [])
        t2 = time.perf_counter()
        hits = [self._fill(next(found)) if m else [] for m in mapped]
        fill = time.perf_counter() - t2
        self.calls.append({"queries": mapped, "k": k, "map_s": t1 - t0, "prepare": own.prepare,
                           "relevancy": own.relevancy, "retrieval": own.retrieval, "fill_s": fill})
        if times is not None:
            own.retrieval += fill  # the real text stands in for fetching stored text
            times.add(own)
        return hits

    def search(self, query: str, k: int = 10, *, times=None) -> list:
        return self.search_batch([query], k, times=times)[0]

    def take_calls(self) -> list[dict]:
        """The searches recorded since the last call."""
        calls, self.calls = self.calls, []
        return calls


class GeneratorProbe:
    """Wall time of a generator's ``generate`` and ``attention`` calls (both end in a host copy, so the device is
    done when they return)."""

    def __init__(self, gen) -> None:
        self.generate_s = 0.0
        self.attention: list[tuple[int, float]] = []  # (tokens, seconds) per attention pass
        self._lock = threading.Lock()  # the served path calls from several threads
        generate, attention = gen.generate, gen.attention

        def timed_generate(*a, **kw):
            t = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                with self._lock:
                    self.generate_s += time.perf_counter() - t

        def timed_attention(ids, *a, **kw):
            t = time.perf_counter()
            try:
                return attention(ids, *a, **kw)
            finally:
                self.attention.append((len(ids), time.perf_counter() - t))

        gen.generate, gen.attention = timed_generate, timed_attention

    def take(self) -> dict:
        out = {"generate_s": self.generate_s, "attention_passes": len(self.attention),
               "attention_s": sum(s for _, s in self.attention),
               "attention_tokens": sum(n for n, _ in self.attention)}
        self.generate_s, self.attention = 0.0, []
        return out


# ---- FPGA model ----------------------------------------------------------------------------------------------------
def fpga_substitute(rows: list[dict], searcher, threads: int) -> tuple[list[dict], dict]:
    """MODELLED fpga rows from measured cpu rows: each search's BM25 relevancy + retrieval replaced by the modelled
    kernel launch (all its queries in one launch) plus the measured host merge of the per-CU lists."""
    from model_fpga import merge_seconds_per_query
    from tools import fpga_model as M

    calls = [c for r in rows for c in r["calls"]]
    queries = [(ci, searcher.analyze(q)) for ci, c in enumerate(calls) for q in c["queries"] if q]

    def counts(item):
        ci, q = item
        return ci, M.predict_counts(searcher.index, [q], calls[ci]["k"])[0]

    per_call: dict[int, list[np.ndarray]] = {}
    with ThreadPoolExecutor(threads) as pool:
        for ci, c in pool.map(counts, queries):
            per_call.setdefault(ci, []).append(c)
    model = []
    for ci, c in enumerate(calls):
        if ci not in per_call:
            model.append({"kernel_s": 0.0, "merge_s": 0.0, "postings": 0})
            continue
        cnt = np.stack(per_call[ci])  # [queries, shards, stats]
        est, _ = M.kernel_cycles(cnt)
        n = cnt.shape[0]
        model.append({"kernel_s": float(M.launch_seconds(est, n).sum()),
                      "merge_s": merge_seconds_per_query(cnt, c["k"], n) * n,
                      "postings": int(cnt[..., M.S["postings"]].sum())})
    out, i = [], 0
    for r in rows:
        f = {**r, "times": dict(r["times"]), "calls": []}
        for c in r["calls"]:
            m = model[i]
            i += 1
            c["postings"] = m["postings"]
            f["times"]["relevancy"] += m["kernel_s"] - c["relevancy"]
            f["times"]["retrieval"] += m["merge_s"] - c["retrieval"]
            f["seconds"] += m["kernel_s"] + m["merge_s"] - c["relevancy"] - c["retrieval"]
            f["calls"].append({**c, "relevancy": m["kernel_s"], "retrieval": m["merge_s"]})
        out.append(f)
    shards = len(searcher.index.shards)
    return out, {"cus": shards, "params": M.KernelParams().__dict__}


# ---- running cells -------------------------------------------------------------------------------------------------
def copy_postings(modelled: list[dict], rows: list[dict]) -> None:
    """The modelled postings of each search onto the same searches of another backend's run."""
    for a, b in zip(modelled, rows):
        for ca, cb in zip(a["calls"], b["calls"]):
            if ca["queries"] == cb["queries"] and "postings" in ca:
                cb["postings"] = ca["postings"]


def summarise(rows: list[dict]) -> dict:
    n = sum(r["questions"] for r in rows)
    st = {s: sum(r["times"][s] for r in rows) for s in STAGES}
    total = sum(st.values())
    calls = [c for r in rows for c in r["calls"]]
    searched = sum(len([q for q in c["queries"] if q]) for c in calls)
    bm25 = sum(c["relevancy"] + c["retrieval"] for c in calls)
    gen_s = sum(r.get("generator", {}).get("generate_s", 0.0) for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    out = {"questions": n, "seconds_per_question": sum(r["seconds"] for r in rows) / n,
           "stage_ms_per_question": {s: 1000 * v / n for s, v in st.items()},
           "stage_shares": {s: (v / total if total else 0.0) for s, v in st.items()},
           "memory_share": (total - st["apply"]) / total if total else 0.0,
           "retrievals_per_question": sum(r["retrievals"] for r in rows) / n,
           "tokens_per_question": tokens / n,
           "bm25_ms_per_query": 1000 * bm25 / searched if searched else None,
           "map_ms_per_question": 1000 * sum(c["map_s"] for c in calls) / n,
           "prompt_tokens_mean": (float(np.mean([p for r in rows for p in r["prompt_tokens"]]))
                                  if any(r["prompt_tokens"] for r in rows) else None)}
    if gen_s:
        out["generate_ms_per_token"] = 1000 * gen_s / tokens if tokens else None
    if any("postings" in c for c in calls):
        out["postings_per_query"] = sum(c.get("postings", 0) for c in calls) / searched if searched else 0.0
    att = [r["generator"] for r in rows if r.get("generator", {}).get("attention_passes")]
    if att:
        out["attention"] = {"passes_per_question": sum(a["attention_passes"] for a in att) / n,
                            "ms_per_question": 1000 * sum(a["attention_s"] for a in att) / n,
                            "tokens_per_pass": sum(a["attention_tokens"] for a in att) /
                            sum(a["attention_passes"] for a in att),
                            "generate_ms_per_question": 1000 * gen_s / n,
                            "share_of_generate": sum(a["attention_s"] for a in att) / gen_s if gen_s else None}
    return out


def loop_rows(method, examples, retriever: MappedRetriever | None, probe: GeneratorProbe) -> list[dict]:
    """One row per question through the method's own loop."""
    rows = []
    for ex in examples:
        if retriever is not None:
            retriever.take_calls()  # drop any warm-up's
        probe.take()
        t0 = time.perf_counter()
        _, trace = method.answer(ex.question)
        wall = time.perf_counter() - t0
        calls = retriever.take_calls() if retriever is not None else []
        rows.append({"id": ex.id, "questions": 1, "retrievals": trace.retrievals, "tokens": trace.tokens,
                     "times": trace.times.to_dict(), "seconds": wall - sum(c["map_s"] for c in calls),
                     "prompt_tokens": [s.prompt_tokens for s in trace.steps if s.kind != "retrieve"],
                     "output": trace.output, "calls": calls, "generator": probe.take()})
    return rows


def served_rows(method, examples, clients: int, retriever: MappedRetriever | None) -> list[dict]:
    """The served path: ``clients`` threads answer the questions (each the next one free) through the method's own
    loop at once, their decodes batched by the generator's batcher. One row per question; a row's ``seconds`` is
    the wall time over the questions (so s/q is the inverse throughput), its ``latency_s`` its own."""
    if retriever is not None:
        retriever.take_calls()
    todo = iter(range(len(examples)))
    lock = threading.Lock()
    rows: list[dict | None] = [None] * len(examples)
    start = threading.Barrier(clients)

    def client() -> None:
        start.wait()
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            t0 = time.perf_counter()
            _, trace = method.answer(examples[i].question)
            rows[i] = {"id": examples[i].id, "questions": 1, "retrievals": trace.retrievals, "tokens": trace.tokens,
                       "times": trace.times.to_dict(), "latency_s": time.perf_counter() - t0,
                       "prompt_tokens": [s.prompt_tokens for s in trace.steps if s.kind != "retrieve"],
                       "output": trace.output, "calls": []}

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    calls = retriever.take_calls() if retriever is not None else []
    done = [r for r in rows if r is not None]
    if len(done) < len(rows):
        raise RuntimeError(f"{len(rows) - len(done)} of {len(rows)} served answers failed")
    map_s = sum(c["map_s"] for c in calls)
    for r in done:
        r["seconds"] = (wall - map_s) / len(done)
    if done:
        done[0]["calls"] = calls  # the searches of the whole run (their order across threads is arbitrary)
    return done


def batch_rows(gen, prompts, examples, batch: int, retriever: MappedRetriever | None, k: int,
               max_new: int) -> list[dict]:
    """One row per batch of ``batch`` questions: one ``search_batch`` (``single``) or none (``none``), then one
    batched greedy decode of the full budget (left padding)."""
    import torch

    from ragserve.kernels.contract import StageTimes

    tok = gen.tokenizer
    eos = gen.eos_ids
    rows = []
    for first in range(0, len(examples) - batch + 1, batch):
        group = examples[first:first + batch]
        times = StageTimes()
        if retriever is not None:
            retriever.take_calls()
        t0 = time.perf_counter()
        hits = (retriever.search_batch([e.question for e in group], k, times=times) if retriever is not None
                else [[] for _ in group])
        t1 = time.perf_counter()
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok([prompts.build(e.question, "", h) for e, h in zip(group, hits)], return_tensors="pt",
                      padding=True)
        finally:
            tok.padding_side = side
        ids, mask = enc.input_ids.to(gen.device), enc.attention_mask.to(gen.device)
        with torch.inference_mode():
            out = gen.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
        new = out[:, ids.shape[1]:].tolist()
        t2 = time.perf_counter()
        times.apply += t2 - t1
        calls = retriever.take_calls() if retriever is not None else []
        rows.append({"id": ",".join(e.id for e in group), "questions": batch, "retrievals": batch if calls else 0,
                     # tokens before each row's EOS, as the loops count them
                     "tokens": sum(next((i for i, t in enumerate(r) if t in eos), len(r)) for r in new),
                     "times": times.to_dict(), "seconds": (t2 - t0) - sum(c["map_s"] for c in calls),
                     "prompt_tokens": [int(mask.sum(1).float().mean())], "calls": calls})
    return rows


def _identical_calls(b: dict, c: dict) -> tuple[int, int, list[tuple[dict, dict]]]:
    """(questions whose output text equals the cpu run's, questions, the search calls of both runs with the same
    query, up to each question's first differing query)."""
    def text(row: dict) -> str:  # a run in memory holds the text, a saved report its hash
        return row["output"] if "output" in row else row.get("output_sha1")

    def query(call: dict) -> tuple:  # the mapped query, or in a saved report its term count and postings
        return (tuple(call["queries"]) if "queries" in call else tuple(call.get("query_terms", ())),
                call.get("postings"))

    same_out, pairs = 0, []
    for rb, rc in zip(b["rows"], c["rows"]):
        same_out += text(rb) == text(rc)
        for x, y in zip(rb["calls"], rc["calls"]):
            if query(x) != query(y):
                break
            pairs.append((x, y))
    return same_out, len(b["rows"]), pairs


def speedups(cells: list[dict]) -> None:
    """Each backend's cell against the cpu cell of the same method, path and batch: the wall-clock speed-up; the
    BM25 speed-up over the searches both runs made with the same query (like for like); and, only where both runs
    generated the same text (so formed the same queries), the speed-up with the cpu run's apply time held. A greedy
    decode is not guaranteed to repeat across runs on a GPU (a random-weight model's near-tied logits flip on any
    rounding difference), so that is checked per question, never assumed."""
    base = {(c["method"], c["batch"], c["path"]): c for c in cells if c["backend"] == "cpu"}
    for c in cells:
        b = base.get((c["method"], c["batch"], c["path"]))
        if b is None or not c["summary"]["seconds_per_question"]:
            continue
        sb, sc = b["summary"], c["summary"]
        c["e2e_speedup_vs_cpu"] = sb["seconds_per_question"] / sc["seconds_per_question"]
        same_out, n, pairs = _identical_calls(b, c)
        calls = sum(len(r["calls"]) for r in b["rows"])
        c["same_as_cpu"] = {"outputs": f"{same_out}/{n}", "identical_queries": f"{len(pairs)}/{calls}"}
        if pairs:
            ms_b = sum(x["relevancy"] + x["retrieval"] for x, _ in pairs)
            ms_c = sum(y["relevancy"] + y["retrieval"] for _, y in pairs)
            c["bm25_speedup_vs_cpu_identical_queries"] = ms_b / ms_c if ms_c else None
        if same_out == n:
            mem_b = sum(sb["stage_ms_per_question"][k] for k in STAGES if k != "apply") / 1000
            mem_c = sum(sc["stage_ms_per_question"][k] for k in STAGES if k != "apply") / 1000
            c["e2e_speedup_vs_cpu_apply_held"] = sb["seconds_per_question"] / (sb["seconds_per_question"] - mem_b
                                                                               + mem_c)
        rb = sum(sb["stage_ms_per_question"][k] for k in ("relevancy", "retrieval"))
        rc = sum(sc["stage_ms_per_question"][k] for k in ("relevancy", "retrieval"))
        c["relevancy_retrieval_speedup_vs_cpu"] = rb / rc if rc else None


def table(cells: list[dict]) -> str:
    head = ("method", "path", "batch", "backend", "n", "ret/q", "tok/q", "s/q", "prep%", "rel%", "retr%", "apply%",
            "memory%", "BM25 ms/query", "postings/query", "same as cpu: texts, queries", "BM25 vs cpu, same queries",
            "e2e vs cpu", "e2e vs cpu, apply held (same texts only)", "seeds' fpga e2e (b1)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        s = c["summary"]
        sh = s["stage_shares"]
        seeds = SEEDS.get(c["method"], {})
        seed = (f"{seeds['fpga_e2e_batch1']:.2f}x" if "fpga_e2e_batch1" in seeds else
                "{:.2f}-{:.2f}x".format(*seeds["fpga_e2e_range"]) if seeds else "-")
        bm = s.get("bm25_ms_per_query")
        pq = s.get("postings_per_query")
        sp, sh_ = c.get("e2e_speedup_vs_cpu"), c.get("e2e_speedup_vs_cpu_apply_held")
        lines.append("| " + " | ".join([
            c["method"], c["path"], str(c["batch"]), c["label"], str(s["questions"]),
            f"{s['retrievals_per_question']:.2f}", f"{s['tokens_per_question']:.1f}", f"{s['seconds_per_question']:.3f}",
            *(f"{100 * sh[k]:.1f}" for k in STAGES), f"{100 * s['memory_share']:.1f}",
            f"{bm:.2f}" if bm is not None else "-", f"{pq:,.0f}" if pq is not None else "-",
            ", ".join(c["same_as_cpu"].values()) if "same_as_cpu" in c else "-",
            f"{c['bm25_speedup_vs_cpu_identical_queries']:.0f}x" if c.get("bm25_speedup_vs_cpu_identical_queries")
            else "-",
            f"{sp:.3f}x" if sp is not None else "-", f"{sh_:.3f}x" if sh_ is not None else "-",
            seed if c["backend"] == "fpga" else ""]) + " |")
    return "\n".join(lines)


def compact(obj):
    """The report as saved: floats to 6 decimals (microseconds), each answer text as a short hash (the noise of a
    random model) and each mapped query as its term count."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, list):
        return [compact(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        if k == "output":
            out["output_sha1"] = hashlib.sha1(v.encode()).hexdigest()[:12]
        elif k == "queries":
            out["query_terms"] = [len(q.split()) for q in v]
        else:
            out[k] = compact(v)
    return out


def print_report(report: dict) -> None:
    """The table, DRAGIN's attention passes and the GPU memory of a (possibly partial) results JSON (the
    comparisons with the cpu cells recomputed by this script's rules)."""
    for c in report["cells"]:
        c.pop("e2e_speedup_vs_cpu_apply_held", None)
    speedups(report["cells"])
    print(table(report["cells"]))
    for c in report["cells"]:
        a = c["summary"].get("attention")
        if c["method"] == "dragin" and c["backend"] == "cpu" and a:
            print(f"DRAGIN attention passes: {a['passes_per_question']:.1f}/question, {a['tokens_per_pass']:.0f} "
                  f"tokens each, {a['ms_per_question']:.1f} ms/question = {100 * (a['share_of_generate'] or 0):.1f}% "
                  f"of its generate() time ({a['generate_ms_per_question']:.0f} ms/question)")
    for c in report["cells"]:
        s = c["summary"]
        if c["backend"] == "cpu" and c["path"] == "loop" and s.get("generate_ms_per_token"):
            print(f"{c['method']}: generate() {s['generate_ms_per_token']:.1f} ms/token, mean prompt "
                  f"{s['prompt_tokens_mean'] or 0:.0f} tokens, query mapping {s['map_ms_per_question']:.2f} ms/question "
                  "(lab overhead, not in s/q)")
    m = report.get("gpu_memory")
    if m:
        models = sum(v or 0 for v in report["models"]["param_bytes"].values())
        print(f"GPU memory after setup: {m['device_used_bytes_after_setup'] / 2**30:.1f} GiB used on the device, "
              f"{m['torch_allocated_bytes_after_setup'] / 2**30:.1f} GiB allocated by torch: models "
              f"{models / 2**30:.1f} GiB + gpu backend {(m['gpu_backend_total_bytes'] or 0) / 2**30:.1f} GiB "
              f"(index {(m['gpu_backend_index_bytes'] or 0) / 2**30:.1f} GiB)"
              + (f"; peak torch allocation {m['torch_max_allocated_bytes'] / 2**30:.1f} GiB"
                 if "torch_max_allocated_bytes" in m else ""))
    if report.get("skipped"):
        print(f"skipped: {report['skipped']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results JSON (rewritten after every cell)")
    ap.add_argument("--report", type=Path, help="print the tables of a (possibly partial) results JSON and stop")
    ap.add_argument("--quick", action="store_true", help="CPU dry run: 200k docs, 2-layer models, 1 question a cell")
    ap.add_argument("--workdir", type=Path, help="layout, reference index, cross-encoder (reused when present)")
    ap.add_argument("--prepare", action="store_true",
                    help="build the layout and the reference index in --workdir, then stop (no models, no cells)")
    ap.add_argument("--data-dir", type=Path, default=DATA, help="a copy of ../shared/data (default: beside the repo)")
    ap.add_argument("--docs", type=int, help=f"synthetic passages (default {DPR_PASSAGES:,}; --quick 200,000)")
    ap.add_argument("--workers", type=int, default=0, help="layout writer processes (default: all cores)")
    ap.add_argument("--limit", type=int, help="timed questions per loop cell (default 3; --quick 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed questions before a method's first cell")
    ap.add_argument("--batch-rounds", type=int, help="timed batches of 8 per batched cell (default 2; --quick 1)")
    ap.add_argument("--methods", default=",".join(LOOP_ORDER))
    ap.add_argument("--backends", default="cpu,gpu")
    ap.add_argument("--device", default="auto", help="generator, cross-encoder and gpu-backend device")
    ap.add_argument("--max-new-tokens", type=int, default=100, help="answer budget (DRAGIN's HotpotQA: 100)")
    ap.add_argument("--deadline-s", type=float, help="start no cell that would end after this (default 450; quick 170)")
    ap.add_argument("--generator", type=Path, metavar="DIR",
                    help="a real causal LM directory for every method instead of the random shapes (e.g. gemma-3-270m)")
    ap.add_argument("--arch", choices=("llama", "gemma3"), default="llama",
                    help="network of the random shapes: llama, or gemma3 at the same widths (it has a fast engine)")
    ap.add_argument("--engine", default="auto", help="decode engine: auto, reference or fast (default auto)")
    ap.add_argument("--clients", type=int, default=8,
                    help="served path: questions answered at once, decodes batched (default 8; 0 skips it)")
    args = ap.parse_args()

    if args.report:
        try:
            print_report(json.loads(args.report.read_text()))
        except (OSError, ValueError, KeyError) as e:
            print(f"bench_rag_scale: cannot read {args.report}: {e}", file=sys.stderr)
            return 2
        return 0
    if args.out is None:
        print("bench_rag_scale: --out is required (or --report JSON)", file=sys.stderr)
        return 2
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(LOOP_ORDER)
    if unknown:
        print(f"bench_rag_scale: unknown methods: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    hotpot = args.data_dir / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl"
    if not hotpot.is_file():
        print(f"bench_rag_scale: {hotpot} not found (--data-dir: a copy of ../shared/data)", file=sys.stderr)
        return 2
    if args.generator is not None and not (args.generator / "config.json").is_file():
        print(f"bench_rag_scale: --generator {args.generator} is not a model directory (no config.json)",
              file=sys.stderr)
        return 2
    for label, v, low in (("--limit", args.limit, 1), ("--batch-rounds", args.batch_rounds, 1), ("--clients",
                                                                                                  args.clients, 0),
                          ("--warmup", args.warmup, 0), ("--docs", args.docs, 1000), ("--max-new-tokens",
                                                                                     args.max_new_tokens, 1)):
        if v is not None and v < low:
            print(f"bench_rag_scale: {label} must be >= {low}, got {v}", file=sys.stderr)
            return 2
    q = args.quick
    docs = args.docs or (200_000 if q else DPR_PASSAGES)
    limit = args.limit or (1 if q else 3)
    rounds = args.batch_rounds or (1 if q else 2)
    deadline = args.deadline_s or (170.0 if q else 450.0)
    work = args.workdir or Path("/tmp") / ("rag-scale-quick" if q else "rag-scale")
    work.mkdir(parents=True, exist_ok=True)

    import torch

    from ragserve.rag.datasets import read_dataset
    from ragserve.rag.dragin import PUBLISHED
    from ragserve.rag.engines import ENGINE_KINDS
    from ragserve.rag.generator import Generator, GeneratorError, resolve_device
    from ragserve.rag.methods import build_method
    from ragserve.rag.prompts import PROMPTS_DIR, PromptBuilder, load_exemplars
    from ragserve.retrieval.rerank import RerankingSearcher
    from ragserve.retrieval.searcher import Searcher
    from indexer.reader import IndexReader
    from synth_layout import QueryMapper, write_layout
    from tools.tiny_models import train_tokenizer

    if args.engine not in ENGINE_KINDS:
        print(f"bench_rag_scale: --engine must be one of {', '.join(ENGINE_KINDS)}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    if q and not device.startswith("cuda"):
        torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared machine
    env = environment(device)
    log(f"{env.get('gpu', 'no GPU')}; {env['cpus']} x {env['cpu']}; torch {env['torch']}, "
        f"transformers {env['transformers']}; commit {env['commit']}")
    report: dict = {"environment": env, "quick": q, "docs": docs, "questions_per_cell": limit,
                    "max_new_tokens": args.max_new_tokens, "clients": args.clients,
                    "seeds": {"per_method": SEEDS, **SEEDS_COMMON},
                    "setup_s": {}, "cells": [], "skipped": []}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(stamp(compact(report)), separators=(",", ":"), default=float))
        tmp.replace(args.out)

    def step(name: str, t: float) -> None:
        report["setup_s"][name] = round(time.time() - t, 2)
        log(f"{name}: {report['setup_s'][name]} s")
        save()

    # -- index, reference, questions, passages
    t_ref = time.time()
    ref = work / "ref"
    ref_proc = mp.get_context("spawn").Process(target=build_reference, args=(hotpot, args.data_dir, work))
    ref_proc.start()
    layout = work / f"synth-{docs}"
    t = time.time()
    if not (layout / "manifest.json").exists():
        shutil.rmtree(layout, ignore_errors=True)
        # --quick: small blocks and banks, so the FPGA model sees several CUs (shards)
        write_layout(layout, docs, workers=args.workers, block_size=(1 << 15) if q else 1 << 18,
                     bank_bytes=(8 << 20) if q else 512 << 20, log=log)
    step("layout", t)
    if args.prepare:  # the inputs only: a later run with the same --workdir starts at the models
        ref_proc.join()
        step("reference_index_and_cpu_kernels (beside the above, since start)", t_ref)
        return 0 if ref_proc.exitcode == 0 else 1
    examples = read_dataset(hotpot)
    passages = wiki_passages(args.data_dir)
    report["passages"] = {"source": "wiki18-100w-passages-sample (DPR 100-word Wikipedia passages), cycled by docid",
                          "count": len(passages),
                          "words_mean": float(np.mean([len(x.split()) for _, x in passages]))}

    # -- tokenizers and models
    t = time.time()
    texts = [f"{p.title} {p.text}" for e in examples for p in e.paragraphs] + [f"{a} {b}" for a, b in passages]
    texts += [e.question for e in examples] + [f.read_text() for f in sorted(PROMPTS_DIR.glob("*.txt"))]
    vocab = 2000 if q else 32_000
    lm_tok = train_tokenizer(texts, vocab)
    ce_tok = train_tokenizer(texts, vocab, pair_template=True)
    step("tokenizers", t)
    shapes = QUICK if q else {"lm": LLAMA2_7B, "lm2": LLAMA31_8B, "ce": BERT_BASE}
    t = time.time()
    slots = max(args.clients, 1)
    if args.generator is not None:
        try:
            gen = load_generator(args.generator, device, args.engine, slots)
        except GeneratorError as e:
            print(f"bench_rag_scale: {e}", file=sys.stderr)
            return 2
        step("generator", t)
    else:
        gen = build_generator(shapes["lm"], lm_tok, device, f"random Llama-2-7B shape ({args.arch})", args.engine,
                              slots, args.arch)
        step("generator_llama2_7b_shape", t)
    gen2 = reranker = None
    if "two-stage" in methods:
        t = time.time()
        gen2 = gen if args.generator is not None else build_generator(
            shapes["lm2"], lm_tok, device, f"random Llama-3.1-8B shape ({args.arch})", args.engine, slots, args.arch)
        reranker = build_cross_encoder(shapes["ce"], ce_tok, work, device)
        step("generator_two_stage_and_cross_encoder", t)
    real = {"path": str(args.generator), "model_type": gen.model.config.model_type,
            "weights": "random" if gen.name.startswith("random") else "trained"} if args.generator else None
    report["models"] = {"arch": args.arch, "tokenizer_vocab": len(gen.tokenizer), "dtype": str(gen.dtype),
                        "generator": real or shapes["lm"], "generator_two_stage": real or shapes["lm2"],
                        "engine": gen.batching["engine"],
                        "cross_encoder": shapes["ce"], "param_bytes": {
                            "generator": param_bytes(gen.model),
                            "generator_two_stage": param_bytes(gen2.model) if gen2 and gen2 is not gen else None,
                            "cross_encoder": param_bytes(reranker.model) if reranker else None}}
    probes = {id(gen): GeneratorProbe(gen)}
    if gen2 is not None and gen2 is not gen:
        probes[id(gen2)] = GeneratorProbe(gen2)

    # -- searchers and the mapping
    t = time.time()
    ref_proc.join()
    if ref_proc.exitcode != 0:
        log(f"the reference index build failed (exit code {ref_proc.exitcode})")
        save()
        return 1
    step("reference_index_and_cpu_kernels (beside the above, since start)", t_ref)
    t = time.time()
    reader = IndexReader(layout)  # one reader (and one vocabulary dict) for the mapping and both backends
    mapper = QueryMapper(reader, ref)
    searchers = {}
    for b in [b for b in args.backends.split(",") if b]:
        try:
            opts = {"device": device if device.startswith("cuda") else "cpu", "max_batch": 8} if b == "gpu" else {}
            searchers[b] = Searcher(reader, backend=b, **opts)
        except Exception as e:  # keep the other backend's figures
            log(f"backend {b} unavailable: {type(e).__name__}: {e}")
            report["skipped"].append({"backend": b, "reason": f"{type(e).__name__}: {e}"})
    if "cpu" not in searchers:
        log("the cpu backend is the baseline of every ratio; it did not load")
        save()
        return 1
    retrievers = {b: MappedRetriever(s, mapper, passages) for b, s in searchers.items()}
    labels = {"cpu": f"cpu backend, {env['cpus']} x {env['cpu']}",
              "gpu": f"gpu backend, {env.get('gpu', device)}, shared with the generator"}
    for b, r in retrievers.items():  # numba compilation, NVRTC kernels, the vocabulary dict: all before timing
        for ex in examples[:2]:
            r.search(ex.question, k=3)
            r.search(ex.question, k=100)
        r.search_batch([e.question for e in examples[:8]], k=3)
    report["index"] = {"layout": str(layout), **{k: v for k, v in searchers["cpu"].manifest["stats"].items()},
                       "shards": len(searchers["cpu"].manifest["shards"])}
    step("searchers_and_warm_up", t)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        gpu_desc = searchers["gpu"].backend.describe() if "gpu" in searchers else {}
        report["gpu_memory"] = {"device_used_bytes_after_setup": total - free,
                                "torch_allocated_bytes_after_setup": torch.cuda.memory_allocated(),
                                "gpu_backend_total_bytes": gpu_desc.get("total_bytes"),
                                "gpu_backend_index_bytes": gpu_desc.get("index_bytes_on_device"),
                                "gpu_backend": gpu_desc}
        log(f"GPU memory after setup: {(total - free) / 2**30:.1f} GiB used on the device "
            f"(index {(gpu_desc.get('total_bytes') or 0) / 2**30:.1f} GiB with its batch rows, models "
            f"{sum(v or 0 for v in report['models']['param_bytes'].values()) / 2**30:.1f} GiB)")
    save()

    prompts = PromptBuilder(load_exemplars("multihop.txt"))
    hp = PUBLISHED["hotpotqa"]
    warm_q, timed_q = examples[:args.warmup], examples[args.warmup:args.warmup + limit]
    batch_q = examples[args.warmup + limit:args.warmup + limit + 8 * rounds]
    durations: dict[str, float] = {}
    per_question: list[float] = []  # seconds a question took in each loop cell so far

    def fits(key: str, backend: str, guess: float) -> bool:
        need = durations.get(key, guess)
        if time.time() - T0 + need > deadline:
            log(f"SKIPPED {key} on {backend}: ~{need:.0f} s would pass the {deadline:.0f} s deadline")
            report["skipped"].append({"cell": key, "backend": backend, "estimated_s": need})
            save()
            return False
        return True

    def record(cell: dict, rows: list[dict], wall: float) -> None:
        if cell["backend"] == "gpu":  # the same searches as the cpu run's: the same postings
            for c in report["cells"]:
                if (c["method"], c["path"], c["batch"], c["backend"]) == (cell["method"], cell["path"],
                                                                           cell["batch"], "cpu"):
                    copy_postings(c["rows"], rows)
        cell["summary"] = summarise(rows)
        cell["wall_s"] = round(wall, 2)
        cell["rows"] = rows
        report["cells"].append(cell)
        speedups(report["cells"])
        s = cell["summary"]
        log(f"{cell['method']} b{cell['batch']} {cell['label']}: {s['seconds_per_question']:.3f} s/q, "
            f"memory {100 * s['memory_share']:.1f}%, {s['retrievals_per_question']:.2f} ret/q, "
            f"{s['tokens_per_question']:.0f} tok/q" + (f", BM25 {s['bm25_ms_per_query']:.2f} ms/query"
                                                      if s.get("bm25_ms_per_query") is not None else "")
            + (f", {cell['e2e_speedup_vs_cpu']:.3f}x vs cpu" if "e2e_speedup_vs_cpu" in cell else ""))
        save()

    def add_fpga(cell: dict) -> None:
        t = time.time()
        rows, meta = fpga_substitute(cell["rows"], searchers["cpu"], os.cpu_count() or 1)
        cell["summary"] = summarise(cell["rows"])  # now with the modelled postings per query
        record({**{k: v for k, v in cell.items() if k not in ("summary", "rows", "wall_s")}, "backend": "fpga",
                "label": f"fpga MODELLED ({meta['cus']} CUs)", "fpga_model": meta,
                "model_s": round(time.time() - t, 2)}, rows, cell["wall_s"])

    # -- 1. the methods' own loops, one question at a time
    for name in [m for m in LOOP_ORDER if m in methods]:
        g = gen2 if name == "two-stage" else gen
        first = True
        for b in [b for b in ("cpu", "gpu") if b in searchers and (b == "cpu" or name != "none")]:
            key = f"loop/{name}"
            slowest = max(per_question, default=40.0 / 3 if not q else 4.0)  # a first guess until a cell ran
            if not fits(key, b, slowest * (limit + (args.warmup if first else 0))):
                continue
            r = retrievers[b]
            retr = RerankingSearcher(r, reranker, depth=100) if name == "two-stage" else r
            method = build_method(name, g, prompts, retr, k=3, max_new_tokens=args.max_new_tokens,
                                  threshold=hp["threshold"], keep=hp["keep"])
            t = time.time()
            if first:
                for ex in warm_q:
                    method.answer(ex.question)
                first = False
            t1 = time.time()
            rows = loop_rows(method, timed_q, r if method.uses_retrieval else None, probes[id(g)])
            durations[key] = time.time() - t1
            per_question.append(durations[key] / limit)
            label = "no retrieval" if name == "none" else labels[b]
            cell = {"method": name, "path": "loop", "batch": 1, "backend": b, "label": label,
                    "warmup_s": round(t1 - t, 2)}
            if b == "gpu":
                cpu_cell = next((c for c in report["cells"] if c["method"] == name and c["path"] == "loop"
                                 and c["backend"] == "cpu"), None)
                if cpu_cell is not None:
                    cell["same_outputs_as_cpu"] = [a["output"] for a in cpu_cell["rows"]] == [x["output"] for x in rows]
            record(cell, rows, time.time() - t1)
            if b == "cpu" and method.uses_retrieval:
                add_fpga(report["cells"][-1])

    # -- 2. served: every method's loop for --clients questions at once, decodes batched
    served_q = examples[args.warmup:args.warmup + max(args.clients, limit)]
    for name in [m for m in LOOP_ORDER if m in methods] if args.clients else []:
        g = gen2 if name == "two-stage" else gen
        for b in [b for b in ("cpu", "gpu") if b in searchers and (b == "cpu" or name != "none")]:
            key = f"served/{name}"
            loop_cell = next((c for c in report["cells"] if c["method"] == name and c["path"] == "loop"
                              and c["backend"] == b), None)
            guess = loop_cell["summary"]["seconds_per_question"] * len(served_q) if loop_cell else 60.0
            if not fits(key, b, durations.get(key, guess)):
                continue
            r = retrievers[b]
            retr = RerankingSearcher(r, reranker, depth=100) if name == "two-stage" else r
            method = build_method(name, g, prompts, retr, k=3, max_new_tokens=args.max_new_tokens,
                                  threshold=hp["threshold"], keep=hp["keep"])
            before = g.batching
            t1 = time.time()
            rows = served_rows(method, served_q, args.clients, r if method.uses_retrieval else None)
            durations[key] = time.time() - t1
            after = g.batching
            steps = after["steps"] - before["steps"]
            cell = {"method": name, "path": "served", "batch": args.clients, "backend": b,
                    "label": "no retrieval" if name == "none" else labels[b],
                    "latency_s": {"p50": float(np.percentile([x["latency_s"] for x in rows], 50)),
                                  "max": max(x["latency_s"] for x in rows)},
                    "mean_decode_batch": (after["generation_steps"] - before["generation_steps"]) / steps
                    if steps else 0.0}
            if loop_cell is not None:  # greedy and batch-invariant: the same answers as one at a time
                alone = {x["id"]: x["output"] for x in loop_cell["rows"]}
                cell["same_outputs_as_loop"] = all(alone[x["id"]] == x["output"] for x in rows if x["id"] in alone)
            record(cell, rows, time.time() - t1)

    # -- 3. batch 1 and 8 through the batched decode: none and single
    warmed = set()
    for name in [m for m in ("single", "none") if m in methods]:
        for batch in (1, 8):
            group = batch_q[:limit] if batch == 1 else batch_q
            for b in (["cpu", "gpu"] if name == "single" else ["cpu"]):
                if b not in searchers:
                    continue
                key = f"batched/{name}/b{batch}"
                if not fits(key, b, (12.0 if not q else 4.0) * (1 if batch == 1 else rounds)):
                    continue
                r = retrievers[b] if name == "single" else None
                t = time.time()
                if batch not in warmed:  # this batch shape's first decode, untimed
                    batch_rows(gen, prompts, group[:batch], batch, r, 3, args.max_new_tokens)
                    warmed.add(batch)
                t1 = time.time()
                rows = batch_rows(gen, prompts, group, batch, r, 3, args.max_new_tokens)
                durations[key] = time.time() - t1
                label = "no retrieval" if r is None else labels[b]
                record({"method": name, "path": "batched", "batch": batch, "backend": b, "label": label,
                        "warmup_s": round(t1 - t, 2)}, rows, time.time() - t1)
                if r is not None and b == "cpu":
                    add_fpga(report["cells"][-1])

    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        report["gpu_memory"].update(device_used_bytes_at_end=total - free,
                                    torch_max_allocated_bytes=torch.cuda.max_memory_allocated())
    for s in searchers.values():
        s.close()
    report["table"] = table(report["cells"])
    report["total_s"] = round(time.time() - T0, 1)
    save()
    print_report(report)
    log(f"done: {len(report['cells'])} cells, {len(report['skipped'])} skipped -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
