"""Sparse attention on a real decoder's real keys: gemma-3-270m (google/gemma-3-270m base, fp32) reads N tokens of
the shared Wikipedia sample, and at its global-attention layers (3 of 18: the others see a 512-token sliding window)
the last ``--queries`` positions act as decode steps over the whole cache before them. Each method selects at
budgets of 1/8 and 1/32 of the context; reported: the share of the dense softmax mass on the selected tokens (mass
kept; the mean over layers, query heads and positions), its minimum over positions, and the relative L2 error of the
attention output. ``oracle`` is the exact top-k by the head's own logits, the best any selection of that size does.

    python scripts/attention_real.py --model /work/models/gemma-270m --contexts 4096 16384 --out OUT.json

The model reads the text in chunks of ``--chunk`` tokens with its KV cache (memory stays linear in N); the query,
key and value tensors are the ones transformers passes to the attention function (after the norms and RoPE).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.attention import AttentionError, get_method  # noqa: E402
from tools.provenance import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "enwiki-wikiextractor-json-sample" / "wiki_00"
METHODS = ("oracle", "dsa", "quest", "lserve", "seer-topk", "seer-threshold")
FRACTIONS = (8, 32)


def wiki_ids(tok, n: int) -> list[int]:
    """The first ``n`` tokens of the Wikipedia sample's articles, one after another."""
    ids = [tok.bos_token_id] if tok.bos_token_id is not None else []
    with open(WIKI, encoding="utf-8") as f:
        for line in f:
            ids += tok(json.loads(line)["text"] + "\n\n", add_special_tokens=False).input_ids
            if len(ids) >= n:
                break
    if len(ids) < n:
        raise SystemExit(f"the sample holds only {len(ids)} tokens")
    return ids[:n]


def capture_global(model, ids: list[int], queries: int, chunk: int) -> list[tuple]:
    """(q [Hq, Q, D], k [G, N, D], v [G, N, D], scaling) of each global layer for the last ``queries`` positions."""
    from transformers import AttentionInterface, DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen: dict[int, tuple] = {}
    last = {"on": False}

    def hook(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if last["on"] and not getattr(module, "is_sliding", False):
            seen[module.layer_idx] = (query[0, :, -queries:].detach().clone(), key[0].detach().clone(),
                                      value[0].detach().clone(), scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)

    AttentionInterface.register("ragserve_capture", hook)
    previous = model.config._attn_implementation
    model.set_attn_implementation("ragserve_capture")
    cache = DynamicCache(config=model.config)
    try:
        with torch.inference_mode():
            starts = list(range(0, len(ids), chunk))
            for s in starts:
                last["on"] = s == starts[-1]
                model(torch.tensor([ids[s:s + chunk]]), past_key_values=cache, use_cache=True)
    finally:
        model.set_attn_implementation(previous)
    return [seen[i] for i in sorted(seen)]


def evaluate(q, k, v, scale: float, method: str, budget: int, seer_block: int) -> dict[str, list[float]]:
    """Each captured query position as one decode step over the keys up to it (GQA groups as the model has them)."""
    hq, nq, d = q.shape
    g, n, _ = k.shape
    recall, rel_err = [], []
    for j in range(nq):
        pos = n - nq + j + 1  # keys this position may attend
        qj = q[:, j][None].double()  # [1, Hq, D]
        kj, vj = k[None, :, :pos].double(), v[None, :, :pos].double()  # [1, G, pos, D]
        logits = torch.einsum("bgrd,bgnd->bgrn", qj.view(1, g, hq // g, d), kj) * scale
        p = torch.softmax(logits, -1)
        dense = torch.einsum("bgrn,bgnd->bgrd", p, vj)
        if method == "oracle":  # per head: the exact top-k of its own logits
            top = torch.topk(logits, min(budget, pos), dim=-1).indices
            picked = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, top, True)
            pm = torch.where(picked, p, 0)
            out = torch.einsum("bgrn,bgnd->bgrd", pm / pm.sum(-1, keepdim=True), vj)
        else:
            m = get_method(method, budget=budget, page_size=16, block_size=seer_block, sink=16, local=64)
            o, sel, _ = m.step(qj.float(), kj.float(), vj.float(), scale)
            out = o.double().view(1, g, hq // g, d)
            picked = torch.zeros((1, g, pos + 1), dtype=torch.bool)
            picked.scatter_(-1, torch.where(sel.valid, sel.tokens, pos), True)
            picked = picked[..., :pos][:, :, None, :].expand_as(p)
        recall += (p * picked).sum(-1).flatten().tolist()
        rel_err += ((out - dense).norm(dim=-1) / dense.norm(dim=-1)).flatten().tolist()
    return {"recall": recall, "rel_err": rel_err}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="gemma-3-270m transformers directory")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096])
    ap.add_argument("--queries", type=int, default=8, help="decode positions per layer (the last ones)")
    ap.add_argument("--chunk", type=int, default=1024, help="prefill chunk (tokens)")
    ap.add_argument("--seer-block", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    result = {"model": "google/gemma-3-270m (base, fp32)", "text": "enwiki-wikiextractor-json-sample/wiki_00",
              "queries": args.queries, "rows": []}
    for n in args.contexts:
        t0 = time.perf_counter()
        layers = capture_global(model, wiki_ids(tok, n), args.queries, args.chunk)
        read_s = time.perf_counter() - t0
        print(f"context {n}: read in {read_s:.0f} s, {len(layers)} global layers", file=sys.stderr, flush=True)
        for frac in FRACTIONS:
            budget = n // frac
            for method in METHODS:
                rec, err = [], []
                try:
                    for q, k, v, scale in layers:
                        r = evaluate(q, k, v, scale, method, budget, args.seer_block)
                        rec += r["recall"]
                        err += r["rel_err"]
                except AttentionError as e:  # a budget below the method's sink + local window + one unit
                    row = {"context": n, "budget": budget, "fraction": f"1/{frac}", "method": method,
                           "error": str(e)}
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    continue
                row = {"context": n, "budget": budget, "fraction": f"1/{frac}", "method": method,
                       "mass_kept": float(np.mean(rec)), "mass_kept_min": float(np.min(rec)),
                       "rel_err": float(np.mean(err)), "read_seconds": round(read_s, 1)}
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(stamp(result), separators=(",", ":")) + "\n")  # with the tree measured
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
