"""``ragserve attention check``: one decode step of a sparse attention method on a random KV cache, against dense."""
from __future__ import annotations

import argparse
import json

from ragserve.cli import CliError


def register(sub: argparse._SubParsersAction) -> None:
    from ragserve.attention.names import METHOD_NAMES

    p = sub.add_parser("attention", help="sparse attention tools (attention check)",
                       description="Sparse attention methods over a KV cache (see 'ragserve attention check').")
    acts = p.add_subparsers(dest="attention_action", metavar="ACTION")
    acts.required = True
    c = acts.add_parser("check", help="one decode step on a random KV cache, against dense attention",
                        description="Build a random KV cache of N tokens and one decode query (standard normal, "
                                    "seeded), run the method's four stages and dense attention, and print the "
                                    "tokens attended, the output error, the dense softmax mass on the selection "
                                    "and the stage times in seconds.")
    c.add_argument("--method", required=True, choices=METHOD_NAMES, help="sparse attention method to check")
    c.add_argument("--context", type=int, required=True, metavar="N", help="cached tokens")
    c.add_argument("--budget", type=int, required=True, metavar="K",
                   help="tokens attended per KV group, sink and local window included")
    c.add_argument("--page-size", type=int, default=16, metavar="P", help="quest/lserve page (default 16)")
    c.add_argument("--block-size", type=int, default=64, help="seer block (default 64)")
    c.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    c.add_argument("--kv-heads", type=int, default=2, help="KV heads (default 2)")
    c.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    c.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    c.add_argument("--sink", type=int, default=16, help="first tokens always kept (default 16)")
    c.add_argument("--local", type=int, default=64, help="last tokens always kept (default 64)")
    c.add_argument("--threshold", type=float, default=1e-3, help="seer-threshold gate probability (default 1e-3)")
    c.add_argument("--device", default="cpu", help="cpu (default), cuda or fpga-sim")
    c.add_argument("--dtype", default="float32", help="float32 (default) or bfloat16 (cuda)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random cache and query (default 0)")
    c.add_argument("--json", action="store_true", help="print one JSON object (default: key=value lines)")
    c.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from ragserve.attention import AttentionError
    from ragserve.attention.check import CheckSpec, run_check as check
    from ragserve.kernels.fpga.backend import FpgaUnavailableError

    spec = CheckSpec(method=args.method, context=args.context, budget=args.budget, page_size=args.page_size,
                     block_size=args.block_size, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                     batch=args.batch, device=args.device, dtype=args.dtype, seed=args.seed, sink=args.sink,
                     local=args.local, threshold=args.threshold)
    try:
        result = check(spec)
    except (AttentionError, FpgaUnavailableError) as e:
        raise CliError(str(e).splitlines()[0]) from e
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}={value}")
    return 0
