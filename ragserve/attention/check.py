"""One decode step of a method on a random KV cache, against dense attention: what ``ragserve attention check``
prints. The cache and the query are standard normal (seeded), so the scores are those of random vectors: this checks
the pipeline's arithmetic and selection and times its stages; it says nothing of quality on a real model."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragserve.attention import get_method
from ragserve.attention.common import AttentionError
from ragserve.kernels.contract import StageTimes

DEVICES = ("cpu", "cuda", "fpga-sim")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class CheckSpec:
    method: str
    context: int
    budget: int
    page_size: int = 16
    block_size: int = 64
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    batch: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    sink: int = 16
    local: int = 64
    threshold: float = 1e-3

    def validate(self) -> None:
        for name in ("context", "budget", "heads", "kv_heads", "head_dim", "batch", "page_size", "block_size"):
            if getattr(self, name) < 1:
                raise AttentionError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise AttentionError(f"--heads ({self.heads}) must be a multiple of --kv-heads ({self.kv_heads})")
        if self.device not in DEVICES:
            raise AttentionError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise AttentionError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.dtype == "bfloat16" and self.device != "cuda":
            raise AttentionError("--dtype bfloat16 runs on --device cuda (the CPU kernels compute in f32)")


def random_cache(spec: CheckSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [B, Hq, D], keys and values [B, G, N, D], f32, standard normal."""
    rng = np.random.default_rng(spec.seed)
    b, g, n, d = spec.batch, spec.kv_heads, spec.context, spec.head_dim
    keys = rng.standard_normal((b, g, n, d), dtype=np.float32)
    values = rng.standard_normal((b, g, n, d), dtype=np.float32)
    q = rng.standard_normal((b, spec.heads, d), dtype=np.float32)
    return q, keys, values


def mass_recall(q: np.ndarray, keys: np.ndarray, tokens: np.ndarray, valid: np.ndarray, scale: float) -> float:
    """Share of the dense softmax mass (f64) on the selected tokens, averaged over sequences and query heads."""
    b, hq, d = q.shape
    g = keys.shape[1]
    logits = np.einsum("bghd,bgnd->bghn", q.reshape(b, g, hq // g, d).astype(np.float64),
                       keys.astype(np.float64)) * scale
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tok = np.broadcast_to(tokens, (b, g, tokens.shape[-1]))
    ok = np.broadcast_to(valid, tok.shape)
    n = keys.shape[2]
    picked = np.zeros((b, g, n + 1), bool)  # padding entries all land in the spare slot n
    np.put_along_axis(picked, np.where(ok, tok, n), True, -1)
    return float((p * picked[:, :, None, :n]).sum(-1).mean())


def run_check(spec: CheckSpec) -> dict:
    """Run the step (after one untimed warm-up step) and compare it with dense attention on the same device."""
    spec.validate()
    method = get_method(spec.method, budget=spec.budget, page_size=spec.page_size, block_size=spec.block_size,
                        sink=spec.sink, local=spec.local, threshold=spec.threshold, ops=_ops(spec.device))
    dense = get_method("dense")
    q, keys, values = random_cache(spec)
    scale = spec.head_dim ** -0.5
    args, sync = _on_device(spec, q, keys, values)
    times, dense_times = StageTimes(), StageTimes()
    method.step(*args, scale)
    out, sel, _ = method.step(*args, scale, times=times, sync=sync)
    dense.step(*args, scale)
    ref, _, _ = dense.step(*args, scale, times=dense_times, sync=sync)
    tokens, valid, out, ref = (_numpy(x) for x in (sel.tokens, sel.valid, out, ref))
    counts = valid.sum(-1)
    return {
        "method": spec.method, "context": spec.context, "budget": spec.budget, "device": spec.device,
        "dtype": spec.dtype, "batch": spec.batch, "heads": spec.heads, "kv_heads": spec.kv_heads,
        "head_dim": spec.head_dim, "unit": method.unit, "seed": spec.seed,
        "selected": float(counts.mean()), "selected_min": int(counts.min()), "selected_max": int(counts.max()),
        "max_abs_err": float(np.abs(out.astype(np.float64) - ref.astype(np.float64)).max()),
        "mass_recall": mass_recall(q, keys, tokens, valid, scale),
        **times.to_dict(), "dense_seconds": dense_times.apply,
    }


def _ops(device: str):
    if device == "fpga-sim":
        from ragserve.kernels.registry import attention_ops
        return attention_ops("fpga-sim")
    return None


def _on_device(spec: CheckSpec, q, keys, values):
    if spec.device != "cuda":
        return (q, keys, values), None
    import torch

    if not torch.cuda.is_available():
        raise AttentionError("--device cuda: CUDA is not available here")
    dt = getattr(torch, spec.dtype)
    return tuple(torch.from_numpy(x).to("cuda", dt) for x in (q, keys, values)), torch.cuda.synchronize


def _numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return (x.float() if x.is_floating_point() else x).cpu().numpy()
