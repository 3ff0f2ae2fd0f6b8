"""A Gemma 3 decoder of its own over a transformers ``Gemma3ForCausalLM``'s weights: per-slot static KV caches and
one batched forward pass a decode step, with no ``generate()`` machinery (``ragserve.rag.engine.DecodeEngine``).

Prefill runs the model's own f32 (GPU: its dtype) weights through torch matmuls, as transformers' eager attention
does. Decode differs by device:

- CPU: numba kernels (``ragserve.kernels.cpu.decode``). Given the GGUF the checkpoint was converted from, every
  projection, the tied output projection included, reads the GGUF's own blocks as int8 groups (1.1-1.25 bytes a
  weight instead of 4) after a bit-for-bit check that they de-quantize to the checkpoint's f32 weights: the
  products are the f32 products, only the order of the sums differs. Without one the kernels read the f32 weights.
  Each row is a fixed loop whatever shares the call, so a slot's logits are the same bits alone or in a batch.
- CUDA: one static-shape step over the slots up to the highest one stepping and the cache columns up to the
  longest, each rounded up to a power of two (``StepSettings.shapes``; rows of slots not stepping write a spare
  cache column and are discarded), captured as a CUDA graph at a bucket's first step and replayed after. Reading
  every slot's whole cache instead would cost more than the weights at serving sizes (a 7B-shaped model's 4,096
  positions are 2.1 GB a slot). Eager, the step is ~90 small kernels a layer (each norm alone is ten); so
  ``StepSettings.compile`` has ``torch.compile`` fuse them before the capture (the graph then replays its kernels),
  one compile for every bucket (rows and columns are dynamic sizes).

The caches are preallocated ``[slots, kv heads, max_length (+1 spare), head dim]`` per layer; ``truncate`` only
moves a slot's length, so a prompt prefix kept across retrieval rounds is not recomputed. A prefill runs in chunks
aligned to multiples of ``PrefillSettings.chunk`` positions, the same chunks however the prompt arrives, and keeps
each whole chunk's KV in a ``PrefixCache``: a later prompt that starts with the same chunks (a method's instruction
and exemplars) copies them instead of computing them, bit for bit what it would have computed.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ragserve.rag.engine import PrefillSettings, StepSettings
from ragserve.rag.engines.quantized import QuantMatrix, read_gguf
from ragserve.rag.prefix_cache import PrefixCache

MODEL_TYPES = ("gemma3_text",)
# GGUF tensor names of each layer's projections, by the transformers module they replace.
log = logging.getLogger("ragserve.engine")
_GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def _error(message: str) -> Exception:
    from ragserve.rag.generator import GeneratorError  # imported late: the generator imports the engines

    return GeneratorError(message)


class _Linear:
    """Rows of one or more projections as kernel calls on the CPU: int8 groups or f32 weights, tiled for
    ``ragserve.kernels.cpu.decode``."""

    def __init__(self, parts: list) -> None:
        from ragserve.kernels.cpu.decode import tile_rows, tile_width

        self.parts = []  # (tiled weights or (q, a, c, group), rows)
        self.nbytes = 0
        for p in parts:
            if isinstance(p, QuantMatrix):
                n = p.q.shape[0]
                width = tile_width(n)
                c = tile_rows(p.c, width) if p.c.size else np.zeros((0, 0, 0), np.float32)
                tiled = (tile_rows(p.q, width), tile_rows(p.a, width), c, p.group)
                self.nbytes += p.nbytes
            else:
                n = p.shape[0]
                tiled = tile_rows(p, tile_width(n))
                self.nbytes += p.nbytes
            self.parts.append((tiled, n))
        self.n_out = sum(n for _, n in self.parts)

    @classmethod
    def of(cls, weights: list[torch.Tensor], quant: list[QuantMatrix | None]) -> "_Linear":
        if all(q is not None for q in quant):
            merged = quant[0]
            for q in quant[1:]:
                merged = merged and merged.concat(q)
            return cls([merged] if merged is not None else list(quant))
        return cls([w.detach().float().numpy() for w in weights])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from ragserve.kernels.cpu import decode

        y = np.empty((x.shape[0], self.n_out), np.float32)
        lo = 0
        for tiled, n in self.parts:
            out = y if len(self.parts) == 1 else y[:, lo:lo + n]
            if isinstance(tiled, tuple):
                decode.qmatvec(*tiled, x, out)
            else:
                decode.matvec(tiled, x, out)
            lo += n
        return y


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3RMSNorm, op for op (f32 inside, scale ``1 + w``)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class CudaGraphs:
    """Capture and replay through torch's CUDA graphs (the driver ``Gemma3Engine`` uses on CUDA)."""

    def capture(self, fn: Callable[[], None]):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up runs allocate the kernels' workspaces outside the graph
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph

    def replay(self, graph) -> None:
        graph.replay()


class Gemma3Engine:
    """``DecodeEngine`` for transformers' ``Gemma3ForCausalLM`` (``model_type`` gemma3_text).

    ``gguf``: the GGUF file the checkpoint was converted from (CPU decode then reads its blocks; matrices that do not
    de-quantize to the checkpoint's weights keep f32); default: a single ``*.gguf`` in the model's directory, if
    any. ``threads``: numba threads of the CPU decode kernels (0: one, which a busy core cannot stall; see
    ``ragserve.kernels.cpu.decode``); prefill uses torch's own threads. ``graphs``: the
    capture/replay driver of the CUDA step (default ``CudaGraphs`` on CUDA; None elsewhere: the static step runs
    eagerly), used whenever ``dense_step`` is on, which it is on CUDA and for weights other than f32.
    ``prefill``: the prefill's chunk and prefix cache (``PrefillSettings``). ``step``: whether the static step is
    compiled (``StepSettings``; the kernels step never is)."""

    def __init__(self, model: torch.nn.Module, device: str | None = None, max_slots: int = 4,
                 max_length: int = 4096, gguf: str | Path | None = None, threads: int = 0,
                 graphs=None, dense_step: bool | None = None, prefill: PrefillSettings | None = None,
                 step: StepSettings | None = None) -> None:
        cfg = model.config
        if getattr(cfg, "model_type", None) not in MODEL_TYPES:
            raise _error(f"Gemma3Engine serves {MODEL_TYPES}, not {getattr(cfg, 'model_type', None)!r}")
        if getattr(cfg, "attn_logit_softcapping", None) is not None or getattr(cfg, "use_bidirectional_attention",
                                                                                 False):
            raise _error("Gemma3Engine: attention soft-capping and bidirectional attention are not supported")
        if max_slots < 1 or max_length < 2:
            raise _error("max_slots must be >= 1 and max_length >= 2")
        settings = prefill or PrefillSettings()
        if settings.chunk < 1 or settings.prefix_cache_bytes < 0:
            raise _error("the prefill chunk must be >= 1 position and the prefix cache >= 0 bytes")
        self.step_settings = step or StepSettings()
        if self.step_settings.compile not in ("auto", "on", "off"):
            raise _error(f"the step's compile setting is auto, on or off, not {self.step_settings.compile!r}")
        if self.step_settings.shapes not in ("bucketed", "fixed"):
            raise _error(f"the step's shapes are bucketed or fixed, not {self.step_settings.shapes!r}")
        if not isinstance(self.step_settings.span, int) or self.step_settings.span < 1:
            raise _error(f"the step's span must be a positive integer, not {self.step_settings.span!r}")
        self.prefill_chunk = settings.chunk
        self.prefix_cache = PrefixCache(settings.chunk, settings.prefix_cache_bytes) \
            if settings.prefix_cache_bytes else None
        param = next(model.parameters())
        self.device = torch.device(device) if device else param.device
        self.dtype = param.dtype
        # transformers' embedding scale: sqrt(hidden) rounded to the weights' dtype, on their device
        self.normalizer = torch.tensor(cfg.hidden_size ** 0.5, dtype=self.dtype, device=self.device)
        self.model, self.cfg = model, cfg
        self.max_slots, self.max_length = max_slots, max_length
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.scaling = float(cfg.query_pre_attn_scalar) ** -0.5
        self.window = int(cfg.sliding_window or 0)
        self.softcap = cfg.final_logit_softcapping
        inner = model.model
        self.layers = inner.layers
        self.sliding = [t == "sliding_attention" for t in cfg.layer_types]
        self.embed = inner.embed_tokens.weight
        self.lm_head = model.lm_head.weight
        # RoPE tables of every position, as transformers computes them (f32 products, then cos and sin).
        pos = torch.arange(max_length + 1, dtype=torch.float32)
        self.rope = {}
        for kind in set(cfg.layer_types):
            inv = getattr(inner.rotary_emb, f"{kind}_inv_freq").float().cpu()
            scale = getattr(inner.rotary_emb, f"{kind}_attention_scaling")
            emb = torch.cat([pos[:, None] * inv[None]] * 2, dim=-1)
            self.rope[kind] = ((emb.cos() * scale).to(self.dtype).to(self.device),
                               (emb.sin() * scale).to(self.dtype).to(self.device))
        # One spare column past max_length: where the static step writes the rows of slots that are not stepping.
        shape = (max_slots, self.n_kv, max_length + 1, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.lengths = [0] * max_slots
        self.tokens: list[list[int]] = [[] for _ in range(max_slots)]  # each slot's cached ids (prefix cache keys)
        # Each slot's leading positions that hold what one prefill of its tokens from position 0 computes (a chunk
        # boundary): only there may cached chunks be copied or computed ones kept. Decode steps, and a prefill
        # starting inside a chunk, compute their positions differently.
        self.exact = [0] * max_slots
        self.free = list(range(max_slots))
        self.is_open = [False] * max_slots
        self.threads = threads
        on_cuda = self.device.type == "cuda"
        # The CPU kernels read f32 weights (or the GGUF's, checked against f32): other dtypes take the static step.
        self.dense_step = (on_cuda or self.dtype != torch.float32) if dense_step is None else dense_step
        self.graphs = (CudaGraphs() if on_cuda else None) if graphs is None else graphs
        self._graphs: dict[tuple[int, int], object] = {}  # (rows, columns) -> its captured step
        self._ran: set[tuple[int, int]] = set()  # buckets the compiled step has run (compiled) once
        self._out: torch.Tensor | None = None  # the static step's buffers, made at its first use
        compile_ = self.step_settings.compile
        self.compile_step = self.dense_step and (compile_ == "on" or compile_ == "auto" and on_cuda and _triton())
        self._forward: Callable[..., None] | None = None  # the static step as run and captured, set at first use
        self.compiled = False  # whether that is the compiled step
        self.compile_s: float | None = None  # seconds its compiles took (each bucket's first run)
        self.weights = "f32"
        if not self.dense_step:
            if self.device.type != "cpu" or self.dtype != torch.float32:
                raise _error("the kernel decode step runs on the CPU over f32 weights only")
            self._setup_kernels(self._find_gguf(gguf))

    # -- setup ------------------------------------------------------------------------------
    def _find_gguf(self, gguf: str | Path | None) -> Path | None:
        if gguf is not None:
            p = Path(gguf)
            if not p.is_file():
                raise _error(f"GGUF file not found: {p}")
            return p
        folder = Path(str(getattr(self.cfg, "_name_or_path", "") or ""))
        found = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        return found[0] if len(found) == 1 else None

    def _setup_kernels(self, gguf: Path | None) -> None:
        quant = read_gguf(gguf) if gguf is not None else {}
        used = set()

        def q(name: str, weight: torch.Tensor) -> QuantMatrix | None:
            m = quant.get(name)
            if m is not None and m.matches(weight.detach().numpy()):
                used.add(name)
                return m
            return None

        self.kq, self.ko, self.kgu, self.kd = [], [], [], []
        for i, layer in enumerate(self.layers):
            at, mlp = layer.self_attn, layer.mlp
            mods = {"q_proj": at.q_proj, "k_proj": at.k_proj, "v_proj": at.v_proj, "o_proj": at.o_proj,
                    "gate_proj": mlp.gate_proj, "up_proj": mlp.up_proj, "down_proj": mlp.down_proj}
            qm = {k: q(f"blk.{i}.{_GGUF_NAMES[k]}.weight", m.weight) for k, m in mods.items()}
            self.kq.append(_Linear.of([mods[k].weight for k in ("q_proj", "k_proj", "v_proj")],
                                      [qm[k] for k in ("q_proj", "k_proj", "v_proj")]))
            self.ko.append(_Linear.of([at.o_proj.weight], [qm["o_proj"]]))
            self.kgu.append(_Linear.of([mlp.gate_proj.weight, mlp.up_proj.weight], [qm["gate_proj"], qm["up_proj"]]))
            self.kd.append(_Linear.of([mlp.down_proj.weight], [qm["down_proj"]]))
        head = "output.weight" if "output.weight" in quant else "token_embd.weight"
        self.khead = _Linear.of([self.lm_head], [q(head, self.lm_head)])
        total = 7 * len(self.layers) + 1
        self.weights = "f32" if not used else ("gguf" if len(used) == total else f"gguf {len(used)}/{total}")
        self.k_np = [c.numpy() for c in self.k_cache]
        self.v_np = [c.numpy() for c in self.v_cache]

    def describe(self) -> dict:
        """What the engine runs: its device, weights (``gguf``: every matrix from the GGUF's blocks) and step."""
        read = None
        if not self.dense_step:
            read = sum(x.nbytes for x in (*self.kq, *self.ko, *self.kgu, *self.kd, self.khead))
        return {"engine": "gemma3", "device": str(self.device), "weights": self.weights,
                "step": ("graph" if self.graphs is not None else "static") if self.dense_step else "kernels",
                "compiled": self.compiled, "compile_s": self.compile_s, "shapes": self.step_settings.shapes,
                "buckets": sorted(self._graphs) if self.graphs is not None else sorted(self._ran),
                "max_slots": self.max_slots, "max_length": self.max_length, "decode_weight_bytes": read,
                "prefill_chunk": self.prefill_chunk, "prefix_cache": None if self.prefix_cache is None else {
                    "chunks": len(self.prefix_cache), "bytes": self.prefix_cache.nbytes,
                    "hits": self.prefix_cache.hits, "stored": self.prefix_cache.stored}}

    @torch.inference_mode()
    def warm(self) -> None:
        """Compile the static step for one slot stepping and for several (one compile serves every bucket of
        each: rows of one are a specialised size), every row writing its spare column (no slot's cache is
        touched), so that no request waits for a compile. Nothing to do for an uncompiled or kernels step."""
        if not self.compile_step:
            return
        if self._out is None:
            self._static_buffers()
        self._ids.zero_()
        self._pos.fill_(self.max_length)
        span = min(self.step_settings.span, self.max_length)
        buckets = [(self.max_slots, self.max_length)] if self.step_settings.shapes == "fixed" else \
            sorted({(1, span), (self.max_slots, span)})
        for bucket in buckets:
            if bucket not in self._ran:
                self._first_run(bucket)

    # -- slots ------------------------------------------------------------------------------
    def open(self) -> int:
        if not self.free:
            raise _error(f"all {self.max_slots} decode slots are taken")
        slot = self.free.pop(0)
        self.is_open[slot] = True
        self.lengths[slot] = 0
        self.tokens[slot] = []
        self.exact[slot] = 0
        return slot

    def _check(self, slot: int) -> None:
        if not (0 <= slot < self.max_slots) or not self.is_open[slot]:
            raise _error(f"slot {slot} is not open")

    def length(self, slot: int) -> int:
        self._check(slot)
        return self.lengths[slot]

    def truncate(self, slot: int, length: int) -> None:
        self._check(slot)
        if not 0 <= length <= self.lengths[slot]:
            raise _error(f"cannot truncate slot {slot} of {self.lengths[slot]} positions to {length}")
        self.lengths[slot] = length
        del self.tokens[slot][length:]
        self.exact[slot] = min(self.exact[slot], length - length % self.prefill_chunk)

    def close(self, slot: int) -> None:
        self._check(slot)
        self.is_open[slot] = False
        self.free.append(slot)
        self.free.sort()

    # -- prefill ----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slot: int, ids: Sequence[int], logits: bool = True) -> torch.Tensor | None:
        self._check(slot)
        n, start = len(ids), self.lengths[slot]
        if n < 1:
            raise _error("prefill needs at least one token")
        if start + n > self.max_length:
            raise _error(f"{start + n} positions exceed the engine's {self.max_length}")
        c, end = self.prefill_chunk, start + n
        tokens = self.tokens[slot] + [int(t) for t in ids]
        exact = start == self.exact[slot]
        pos = start + (self._copy_cached(slot, tokens, start, end) if exact else 0)
        h = None
        while pos < end:
            stop = min(end, (pos // c + 1) * c)  # the next chunk boundary: the same chunks however ids arrive
            h = self._prefill_hidden(slot, pos, torch.tensor(tokens[pos:stop], device=self.device))
            if exact and stop % c == 0 and self.prefix_cache is not None:
                self._store(slot, tokens, stop // c - 1)
            pos = stop
        self.lengths[slot] = end
        self.tokens[slot] = tokens
        if exact:
            self.exact[slot] = end - end % c
        return self._logits(h[-1:])[0] if logits else None

    def reusable(self, slot: int, ids: Sequence[int]) -> int:
        self._check(slot)
        start = self.lengths[slot]
        if self.prefix_cache is None or not ids or start != self.exact[slot]:
            return 0
        return self.prefix_cache.covered(self.tokens[slot] + [int(t) for t in ids], start, start + len(ids) - 1)

    def _copy_cached(self, slot: int, tokens: list[int], start: int, end: int) -> int:
        """Copy the cached chunks of ``tokens`` from ``start`` into the slot; the positions copied. The last
        position is always computed: its hidden state gives the logits."""
        if self.prefix_cache is None:
            return 0
        pos = start
        for k, v in self.prefix_cache.lookup(tokens, start, end - 1):
            stop = pos + self.prefill_chunk
            for i in range(len(self.layers)):
                self.k_cache[i][slot, :, pos:stop] = k[i]
                self.v_cache[i][slot, :, pos:stop] = v[i]
            pos = stop
        return pos - start

    def _store(self, slot: int, tokens: list[int], index: int) -> None:
        c = self.prefill_chunk
        lo, hi = index * c, (index + 1) * c
        k = torch.stack([cache[slot, :, lo:hi] for cache in self.k_cache])
        v = torch.stack([cache[slot, :, lo:hi] for cache in self.v_cache])
        self.prefix_cache.store(tokens, index, (k, v), k.nbytes + v.nbytes)

    def _prefill_hidden(self, slot: int, start: int, ids: torch.Tensor, attention_layer: int | None = None,
                        maps: list | None = None) -> torch.Tensor:
        """Hidden states after the final norm of ``ids`` placed at ``start..`` in ``slot``'s cache (written)."""
        n = ids.shape[0]
        end = start + n
        h = F.embedding(ids, self.embed) * self.normalizer
        q_pos = torch.arange(start, end, device=self.device)
        k_pos = torch.arange(end, device=self.device)
        causal = k_pos[None, :] <= q_pos[:, None]
        masks = {False: causal, True: causal & (k_pos[None, :] > q_pos[:, None] - self.window)}
        group = self.n_heads // self.n_kv
        for i, layer in enumerate(self.layers):
            at = layer.self_attn
            kind = self.cfg.layer_types[i]
            cos, sin = (t[start:end] for t in self.rope[kind])
            x = _rms(h, layer.input_layernorm.weight, self.eps)
            q = F.linear(x, at.q_proj.weight).view(n, self.n_heads, self.head_dim).transpose(0, 1)
            k = F.linear(x, at.k_proj.weight).view(n, self.n_kv, self.head_dim).transpose(0, 1)
            v = F.linear(x, at.v_proj.weight).view(n, self.n_kv, self.head_dim).transpose(0, 1)
            q = _rms(q, at.q_norm.weight, self.eps)
            k = _rms(k, at.k_norm.weight, self.eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k_cache[i][slot, :, start:end] = k
            self.v_cache[i][slot, :, start:end] = v
            keys = self.k_cache[i][slot, :, :end].repeat_interleave(group, dim=0)
            values = self.v_cache[i][slot, :, :end].repeat_interleave(group, dim=0)
            scores = torch.matmul(q, keys.transpose(1, 2)) * self.scaling
            scores = scores.masked_fill(~masks[self.sliding[i]], torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            if maps is not None and i == attention_layer:
                maps.append(probs)
            a = torch.matmul(probs, values).transpose(0, 1).reshape(n, -1)
            h = h + _rms(F.linear(a, at.o_proj.weight), layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            x = _rms(h, layer.pre_feedforward_layernorm.weight, self.eps)
            m = F.gelu(F.linear(x, mlp.gate_proj.weight), approximate="tanh") * F.linear(x, mlp.up_proj.weight)
            h = h + _rms(F.linear(m, mlp.down_proj.weight), layer.post_feedforward_layernorm.weight, self.eps)
            if attention_layer is not None and i == attention_layer:
                break
        return _rms(h, self.model.model.norm.weight, self.eps)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """f32 logits of final-normed hidden rows [B, hidden]."""
        if self.dense_step:
            out = F.linear(h, self.lm_head).float()
        else:
            with self._threads():
                out = torch.from_numpy(self.khead(h.float().contiguous().numpy()))
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    @torch.inference_mode()
    def attention(self, ids: Sequence[int], layer: int = -1) -> np.ndarray:
        """Attention of one forward pass over ``ids`` at one layer (default the last), averaged over heads:
        ``A[i, j]`` is how much position ``i`` attends to ``j <= i`` (DRAGIN's signal). Only that layer's weights
        are formed, and the layers after it are not run. Uses a free slot's cache as scratch."""
        if not self.free:
            raise _error(f"all {self.max_slots} decode slots are taken")
        if len(ids) > self.max_length:
            raise _error(f"{len(ids)} tokens exceed the engine's {self.max_length} positions")
        layer = layer % len(self.layers)
        maps: list = []
        self._prefill_hidden(self.free[0], 0, torch.tensor(list(ids), device=self.device), layer, maps)
        return maps[0].float().mean(dim=0).cpu().numpy().astype(np.float64)

    # -- decode -----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        if len(slots) != len(ids) or not slots:
            raise _error("step needs one id for each of one or more slots")
        if len(set(slots)) != len(slots):
            raise _error("a slot appears twice in one step")
        for s in slots:
            self._check(s)
            if self.lengths[s] >= self.max_length:
                raise _error(f"slot {s} is full ({self.max_length} positions)")
        out = self._step_dense(slots, ids) if self.dense_step else self._step_kernels(slots, ids)
        for s, t in zip(slots, ids):
            self.lengths[s] += 1
            self.tokens[s].append(int(t))
        return out

    def _threads(self):
        import contextlib

        import numba

        @contextlib.contextmanager
        def scope():
            want = self.threads or 1
            torch_threads = torch.get_num_threads()  # first: numba's first call starts its pool, resetting it
            previous = numba.get_num_threads()
            numba.set_num_threads(max(1, min(want, numba.config.NUMBA_NUM_THREADS)))
            try:
                yield
            finally:
                numba.set_num_threads(previous)
                # numba's OpenMP layer sets the process's OpenMP thread count, which torch's own ops use: left at
                # numba's, every small torch op of a prefill became a parallel region (60x the CPU on a busy box)
                torch.set_num_threads(torch_threads)

        return scope()

    def _step_kernels(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        from ragserve.kernels.cpu import decode

        b = len(slots)
        pos = torch.tensor([self.lengths[s] for s in slots])
        slot_np = np.asarray(slots, np.int64)
        slot_t = torch.from_numpy(slot_np)
        lengths = pos.numpy() + 1
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        h = F.embedding(torch.tensor(list(ids)), self.embed) * self.normalizer
        with self._threads():
            for i, layer in enumerate(self.layers):
                at = layer.self_attn
                cos, sin = (t[pos][:, None] for t in self.rope[self.cfg.layer_types[i]])
                x = _rms(h, layer.input_layernorm.weight, self.eps)
                qkv = torch.from_numpy(self.kq[i](x.contiguous().numpy()))
                q = _rms(qkv[:, :nh * d].view(b, nh, d), at.q_norm.weight, self.eps)
                k = _rms(qkv[:, nh * d:(nh + nkv) * d].view(b, nkv, d), at.k_norm.weight, self.eps)
                v = qkv[:, (nh + nkv) * d:].view(b, nkv, d)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
                self.k_cache[i][slot_t, :, pos] = k
                self.v_cache[i][slot_t, :, pos] = v
                a = np.empty((b, nh, d), np.float32)
                decode.attend(q.contiguous().numpy(), self.k_np[i], self.v_np[i], slot_np, lengths,
                              self.window if self.sliding[i] else 0, np.float32(self.scaling), a)
                o = torch.from_numpy(self.ko[i](a.reshape(b, nh * d)))
                h = h + _rms(o, layer.post_attention_layernorm.weight, self.eps)
                x = _rms(h, layer.pre_feedforward_layernorm.weight, self.eps)
                gu = torch.from_numpy(self.kgu[i](x.contiguous().numpy()))
                half = gu.shape[1] // 2
                m = F.gelu(gu[:, :half], approximate="tanh") * gu[:, half:]
                h = h + _rms(torch.from_numpy(self.kd[i](m.contiguous().numpy())),
                             layer.post_feedforward_layernorm.weight, self.eps)
            h = _rms(h, self.model.model.norm.weight, self.eps)
            out = torch.from_numpy(self.khead(h.contiguous().numpy()))
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    # -- the static step (CUDA graph) ----------------------------------------------------------
    def _static_buffers(self) -> None:
        s, dev = self.max_slots, self.device
        self._ids = torch.zeros(s, dtype=torch.long, device=dev)
        self._pos = torch.zeros(s, dtype=torch.long, device=dev)  # where each row writes (max_length: spare)
        self._cols = torch.arange(self.max_length, device=dev)
        self._out = torch.zeros(s, self.cfg.vocab_size, dtype=torch.float32, device=dev)
        self._views: dict[tuple[int, int], tuple] = {}

    def _bucket(self, slots: Sequence[int]) -> tuple[int, int]:
        """The step's rows and cache columns: every slot up to the highest stepping and every column up to the
        longest one's new position, each a power of two (columns from the span), or all of them (fixed)."""
        if self.step_settings.shapes == "fixed":
            return self.max_slots, self.max_length
        return (_round_up(max(slots) + 1, 1, self.max_slots),
                _round_up(max(self.lengths[s] for s in slots) + 1, self.step_settings.span, self.max_length))

    def _args(self, bucket: tuple[int, int]) -> tuple:
        """The bucket's views of the static buffers: what its step reads and writes, at fixed addresses."""
        if bucket not in self._views:
            rows, cols = bucket
            self._views[bucket] = (self._ids[:rows], self._pos[:rows], self._cols[:cols], self._out[:rows])
        return self._views[bucket]

    def _static_forward(self, ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor, out: torch.Tensor) -> None:
        """Rows ``0..len(ids)``, one token each: ids ``ids``, written at ``pos`` (max_length for rows not stepping,
        whose outputs are garbage), attending to the columns ``cols`` (the cache's first ones) ``<= pos``; logits
        into ``out``. Fixed shapes throughout: what a CUDA graph captures."""
        s, nh, nkv, d, group = ids.shape[0], self.n_heads, self.n_kv, self.head_dim, self.n_heads // self.n_kv
        n = cols.shape[0]
        rows = torch.arange(s, device=self.device)
        causal = cols[None, :] <= pos[:, None]
        masks = {False: causal, True: causal & (cols[None, :] > pos[:, None] - self.window)}
        h = F.embedding(ids, self.embed) * self.normalizer
        for i, layer in enumerate(self.layers):
            at = layer.self_attn
            cos, sin = (t[pos][:, None] for t in self.rope[self.cfg.layer_types[i]])
            x = _rms(h, layer.input_layernorm.weight, self.eps)
            q = _rms(F.linear(x, at.q_proj.weight).view(s, nh, d), at.q_norm.weight, self.eps)
            k = _rms(F.linear(x, at.k_proj.weight).view(s, nkv, d), at.k_norm.weight, self.eps)
            v = F.linear(x, at.v_proj.weight).view(s, nkv, d)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k_cache[i][rows, :, pos] = k
            self.v_cache[i][rows, :, pos] = v
            qg = q.view(s, nkv, group, d)
            keys = self.k_cache[i][:s, :, :n]
            scores = torch.matmul(qg, keys.transpose(2, 3)) * self.scaling  # [s, kv, group, n]
            mask = masks[self.sliding[i]][:, None, None, :]
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            a = torch.matmul(probs, self.v_cache[i][:s, :, :n]).reshape(s, nh * d)
            h = h + _rms(F.linear(a, at.o_proj.weight), layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            x = _rms(h, layer.pre_feedforward_layernorm.weight, self.eps)
            m = F.gelu(F.linear(x, mlp.gate_proj.weight), approximate="tanh") * F.linear(x, mlp.up_proj.weight)
            h = h + _rms(F.linear(m, mlp.down_proj.weight), layer.post_feedforward_layernorm.weight, self.eps)
        h = _rms(h, self.model.model.norm.weight, self.eps)
        out.copy_(F.linear(h, self.lm_head).float())

    def _fall_back(self, what: str, e: Exception) -> None:
        log.warning("%s: %s: %s", what, type(e).__name__, " ".join(str(e).split())[:300])
        self._forward, self.compiled = self._static_forward, False

    def _first_run(self, bucket: tuple[int, int]) -> None:
        """A bucket's first step through ``torch.compile``: compiled now (a bucket's rows and columns are dynamic
        sizes, so a new bucket rarely compiles again), outside any graph capture (a compile inside one fails).
        Running a step twice is harmless: it writes only the positions it computes, the same values again. A
        compile that fails leaves the eager step, with one logged line."""
        if self._forward is None:
            s = self.step_settings
            self._forward = self._static_forward if not self.compile_step else torch.compile(
                self._static_forward, fullgraph=True, dynamic=False if s.shapes == "fixed" else None,
                backend=s.backend, **({"mode": s.mode} if s.mode else {}))
        if self._forward == self._static_forward or bucket in self._ran:
            self._ran.add(bucket)
            return
        ids, pos, cols, out = self._args(bucket)
        if self.step_settings.shapes == "bucketed":
            for t in (ids, pos, cols, out):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        t = time.perf_counter()
        try:
            self._forward(ids, pos, cols, out)
        except Exception as e:  # any failure: the eager step computes the same tokens, only slower
            self._fall_back("the decode step did not compile, it runs eagerly", e)
            return
        self.compile_s = (self.compile_s or 0.0) + time.perf_counter() - t
        self.compiled = True
        self._ran.add(bucket)

    def _capture(self, bucket: tuple[int, int]):
        """The graph of the bucket's step as run; a compiled step that cannot be captured falls back to the eager
        one."""
        args = self._args(bucket)
        try:
            return self.graphs.capture(lambda: self._forward(*args))
        except Exception as e:
            if not self.compiled:
                raise
            self._fall_back("the compiled decode step could not be captured, the eager one is", e)
            return self.graphs.capture(lambda: self._forward(*args))

    def _step_dense(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        if self._out is None:
            self._static_buffers()
        bucket = self._bucket(slots)
        args = self._args(bucket)
        ids_all = [0] * bucket[0]
        pos_all = [self.max_length] * bucket[0]
        for s, t in zip(slots, ids):
            ids_all[s], pos_all[s] = int(t), self.lengths[s]
        args[0].copy_(torch.tensor(ids_all), non_blocking=True)
        args[1].copy_(torch.tensor(pos_all), non_blocking=True)
        if bucket not in self._ran:
            self._first_run(bucket)
        if self.graphs is None:
            self._forward(*args)
        else:
            if bucket not in self._graphs:
                self._graphs[bucket] = self._capture(bucket)
            self.graphs.replay(self._graphs[bucket])
        out = self._out[torch.as_tensor(list(slots), device=self.device)]
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out


def _round_up(n: int, smallest: int, limit: int) -> int:
    """The smallest power-of-two multiple of ``smallest`` holding ``n``, at most ``limit``."""
    b = smallest
    while b < n:
        b *= 2
    return min(b, limit)


def _triton() -> bool:
    """Whether Triton imports (what inductor compiles CUDA kernels with)."""
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install fails in many ways: no compile then
        return False
    return True
