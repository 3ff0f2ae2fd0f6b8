"""What one static decode step of the Gemma 3 engine launches, counted on the CPU: the aten ops the eager step
dispatches (each one kernel on CUDA, views aside) and, with --compiled, the kernel calls in the code inductor
generates for the same step (fused kernels plus extern matmuls). Counted at 1 and 2 layers of a tiny model; the
difference is one layer's, the rest what runs outside the layers. A CUDA graph replays one node a kernel.

    python tools/step_ops.py [--compiled] [--layers-at 32]
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.rag.engines.gemma3 import Gemma3Engine  # noqa: E402
from tools.tiny_models import tiny_gemma3  # noqa: E402

# aten ops that only make a view or an alias (no kernel on CUDA)
VIEWS = {"view", "_unsafe_view", "transpose", "t", "slice", "expand", "unsqueeze", "squeeze", "select", "alias",
         "permute", "reshape", "as_strided", "detach", "lift_fresh"}


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _engine(layers: int) -> Gemma3Engine:
    model = tiny_gemma3(layers=layers, dtype=torch.bfloat16, layer_types=["sliding_attention"] * layers)
    engine = Gemma3Engine(model, max_slots=2, max_length=32, dense_step=True)
    engine.prefill(engine.open(), [2, 5, 6, 7])
    engine._static_buffers()
    return engine


def _step_args(engine: Gemma3Engine) -> tuple:
    """The static step's arguments at the fixed shapes (every slot, every column)."""
    return engine._args((engine.max_slots, engine.max_length))


@torch.inference_mode()
def eager_ops(layers: int) -> collections.Counter:
    engine = _engine(layers)
    with _Count() as count:
        engine._static_forward(*_step_args(engine))
    return count.ops


@torch.inference_mode()
def compiled_calls(layers: int) -> collections.Counter:
    from torch._inductor.utils import run_and_get_code

    engine = _engine(layers)
    fn = torch.compile(engine._static_forward, fullgraph=True, dynamic=False)
    _, codes = run_and_get_code(fn, *_step_args(engine))
    call = "\n".join(codes).split("def call(")[-1]
    return collections.Counter(m.group(1) for m in re.finditer(
        r"^\s+(cpp_fused|triton_\w+|extern_kernels\.\w+)", call, re.M))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compiled", action="store_true", help="also count inductor's kernel calls (compiles C++)")
    ap.add_argument("--layers-at", type=int, default=32, help="total a step of this many layers")
    args = ap.parse_args()
    one, two = eager_ops(1), eager_ops(2)
    layer, rest = two - one, one - (two - one)
    kernels = sum(v for k, v in layer.items() if k not in VIEWS)
    rest_kernels = sum(v for k, v in rest.items() if k not in VIEWS)
    print(f"eager: {sum(layer.values())} aten ops a layer, {kernels} not views; {rest_kernels} outside the layers; "
          f"{kernels * args.layers_at + rest_kernels} kernels a step of {args.layers_at} layers")
    print("  a layer:", ", ".join(f"{k} {v}" for k, v in layer.most_common()))
    if args.compiled:
        c1, c2 = compiled_calls(1), compiled_calls(2)
        per = sum(c2.values()) - sum(c1.values())
        out = sum(c1.values()) - per
        print(f"compiled (inductor): {per} kernel calls a layer ({dict(c2 - c1)}), {out} outside the layers; "
              f"{per * args.layers_at + out} a step of {args.layers_at} layers")


if __name__ == "__main__":
    main()
