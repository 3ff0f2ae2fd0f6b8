"""A causal LM behind one small interface: generation with per-token log-probabilities and entropies, stopping at a
line or sentence end, and last-layer attention maps for DRAGIN.

Any ``AutoModelForCausalLM`` checkpoint loads (a local directory or a hub id already in the local cache):
bf16 on a GPU, fp32 on the CPU; ``Generator.from_model`` wraps one already in memory. Generations decode through a
``DecodeEngine`` (``ragserve.rag.engines``: the fast one for the model's architecture, else the reference) driven
by one batcher thread, so concurrent callers share each forward step (``ragserve.rag.batcher``). Inside
``Generator.session`` a caller's generations keep one KV cache, and a prompt that starts like the previous one is
prefilled only from where they differ. Attention maps need eager attention, so the model is switched to eager only
for those forward passes (on the batcher thread, between steps) and back afterwards.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar, copy_context
from typing import Iterator

import numpy as np
import torch

from ragserve.rag.batcher import Batcher, BatchSettings, DecodeSession
from ragserve.rag.decoding import (STOP_MODES, Decode, Generation, GeneratorError, Sampling,  # noqa: F401
                                   spans_from_lengths, stop_point)
from ragserve.rag.engines import engine_for
from ragserve.model_path import model_dir, model_path_problem

# The sparse attention a caller chose for the generations run inside ``Generator.attention_scope`` (a server
# request's), over the generator's own default.
_SCOPED_ATTENTION: ContextVar = ContextVar("ragserve_scoped_attention", default=None)
# The decode session of the generations run inside ``Generator.session`` (one request's).
_SESSION: ContextVar[DecodeSession | None] = ContextVar("ragserve_decode_session", default=None)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GeneratorError(f"device {device!r} requested but CUDA is not available")
    return device


class Generator:
    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", temperature: float = 0.0,
                 seed: int = 0, threads: int = 0, attention: str | None = None, budget: int | None = None,
                 engine: str = "auto", max_slots: int = 8, batch: BatchSettings | None = None,
                 engine_options: dict | None = None, **attention_options) -> None:
        """``threads`` > 0 sets torch's (process-wide) CPU thread count: one thread is fastest for small
        models on a shared machine, where spinning threads compete for cores. ``attention``: decode with this
        sparse attention method (``ragserve.attention``) and token ``budget``, prefill staying dense; options such
        as ``page_size`` go to the method. ``engine``: the decode engine (``ragserve.rag.engines.ENGINE_KINDS``),
        ``max_slots`` the generations (or sessions) it holds at once; more wait for a free slot; ``engine_options``
        go to the fast engine (the Gemma 3 engine's ``prefill``: its ``PrefillSettings``, ...). ``batch``: how the
        batcher interleaves prefills with decode steps."""
        if problem := model_path_problem(model):
            raise GeneratorError(problem)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise GeneratorError(f"unknown dtype {dtype!r}")
        if temperature < 0:
            raise GeneratorError("temperature must be >= 0 (0 = greedy)")
        self.device = resolve_device(device)
        if threads < 0:
            raise GeneratorError("threads must be >= 0")
        if threads:
            torch.set_num_threads(threads)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        self.dtype = getattr(torch, dtype)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir(model))
            self.model = AutoModelForCausalLM.from_pretrained(model_dir(model), dtype=self.dtype)
        except (OSError, ValueError) as e:
            raise GeneratorError(f"cannot load a causal LM from {model!r}: {e}") from e
        self._setup(model, temperature, seed, engine, max_slots, batch, engine_options)
        if attention is not None:
            self.attention_method = self.sparse_method(attention, budget, **attention_options)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, device: str | None = None, temperature: float = 0.0,
                   seed: int = 0, name: str = "", attention: str | None = None, budget: int | None = None,
                   engine: str = "auto", max_slots: int = 8, batch: BatchSettings | None = None,
                   engine_options: dict | None = None, **attention_options) -> "Generator":
        """Wrap a causal LM already built in memory and its tokenizer, e.g. a randomly initialised model made
        with ``from_config`` straight on the GPU, where saving and reloading billions of weights would only cost
        time. The model keeps its dtype; ``device`` (default: where its weights are) is where it runs.
        ``attention``, ``budget``, ``engine``, ``max_slots``, ``batch``, ``engine_options`` and the options: as for
        the constructor."""
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "generation_config"):
            raise GeneratorError("model must be a transformers causal LM (a PreTrainedModel that can generate)")
        if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
            raise GeneratorError("tokenizer must be a transformers tokenizer")
        if temperature < 0:
            raise GeneratorError("temperature must be >= 0 (0 = greedy)")
        self = cls.__new__(cls)
        param = next(model.parameters())
        self.device = resolve_device(device) if device else str(param.device)
        self.dtype = param.dtype
        self.tokenizer, self.model = tokenizer, model
        self._setup(name or type(model).__name__, temperature, seed, engine, max_slots, batch, engine_options)
        if attention is not None:
            self.attention_method = self.sparse_method(attention, budget, **attention_options)
        return self

    def _setup(self, name: str, temperature: float, seed: int, engine: str, max_slots: int,
               batch: BatchSettings | None = None, engine_options: dict | None = None) -> None:
        """What both constructors share once ``model`` and ``tokenizer`` are set."""
        self.model.to(self.device).eval()
        self.name = name
        self.temperature = temperature
        self.sampling = Sampling(temperature=temperature)  # a request without its own choices
        self._rng = torch.Generator(device=self.device).manual_seed(seed)  # their random stream
        self.engine = engine_for(self.model, self.device, kind=engine, max_slots=max_slots, **(engine_options or {}))
        self._sparse_engine = None  # the reference engine of sparse-attention decodes (the HF model's attention)
        self._batcher = Batcher(settings=batch)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        if self.max_positions is None or self.engine.max_length < self.max_positions:
            self.max_positions = self.engine.max_length
        eos = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.eos_ids = {int(e) for e in eos if e is not None}
        self.bos_id = self.tokenizer.bos_token_id
        self.attention_method = None  # the sparse attention of decode steps (None: the model's own)
        self.engine.warm()  # a compiled step compiles now, not in the first request

    def sparse_method(self, name: str, budget: int | None = None, **options):
        """A sparse attention method for this model's decode steps (its attention function installed on first use)."""
        from ragserve.attention import AttentionError, get_method
        from ragserve.attention import hf

        if budget is not None:
            options["budget"] = budget
        try:
            method = get_method(name, **options)
            method.check_budget()
        except AttentionError as e:
            raise GeneratorError(str(e)) from e
        self._batcher.call(lambda: hf.install(self.model))  # between steps: it switches the model's attention
        return method

    # -- tokens -----------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def truncate(self, text: str, max_tokens: int) -> str:
        """The first ``max_tokens`` tokens of ``text``."""
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True).strip()

    def encode(self, text: str) -> tuple[list[int], str, list[tuple[int, int]]]:
        """Token ids of ``text`` (with the model's special prefix), the decoded text and each token's span
        in it. Spans come from decoding prefixes, which works for every tokenizer kind."""
        ids = self.tokenizer(text).input_ids
        lengths = [len(self.tokenizer.decode(ids[:i + 1], skip_special_tokens=True)) for i in range(len(ids))]
        decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
        return ids, decoded, spans_from_lengths(lengths, len(decoded))

    def _fit(self, ids: list[int], room: int) -> list[int]:
        """Drop the oldest tokens (keeping a leading BOS) so ``room`` more positions fit the model."""
        if self.max_positions is None or len(ids) + room <= self.max_positions:
            return ids
        keep = self.max_positions - room
        if keep < 1:
            raise GeneratorError(f"max_new_tokens={room} does not fit the model's {self.max_positions} positions")
        head = ids[:1] if self.bos_id is not None and ids and ids[0] == self.bos_id else []
        return head + ids[len(ids) - keep + len(head):]

    # -- generation -------------------------------------------------------------------------
    @contextlib.contextmanager
    def attention_scope(self, method) -> Iterator[None]:
        """Generations in this context (this thread) decode with ``method`` (from ``sparse_method``; None: the
        generator's default), whichever caller runs them."""
        token = _SCOPED_ATTENTION.set(method)
        try:
            yield
        finally:
            _SCOPED_ATTENTION.reset(token)

    @contextlib.contextmanager
    def session(self, sampling: Sampling | None = None) -> Iterator[DecodeSession]:
        """One request's generations in this context (this thread): one KV cache kept across them (a prompt
        prefix they share is not prefilled again), ``sampling`` (default: the generator's) and one random stream.
        Inside a session already open, that one goes on."""
        outer = _SESSION.get()
        if outer is not None:
            yield outer
            return
        s = DecodeSession(sampling)
        token = _SESSION.set(s)
        try:
            yield s
        finally:
            _SESSION.reset(token)
            self._batcher.release(s)

    def generate(self, prompt: str, max_new_tokens: int, stop: str = "line", attention=None,
                 sampling: Sampling | None = None) -> Generation:
        """Decode after ``prompt`` until EOS, ``max_new_tokens``, the stop point of ``stop`` mode or a stop string,
        greedy unless ``sampling`` (or the session's) says otherwise, with the generator's sparse attention or the
        method ``attention`` (from ``sparse_method``) instead. Safe to call from many threads at once."""
        if stop not in STOP_MODES:
            raise GeneratorError(f"stop must be one of {STOP_MODES}")
        if max_new_tokens < 1:
            raise GeneratorError("max_new_tokens must be >= 1")
        session = _SESSION.get()
        sampling = sampling or (session.sampling if session is not None else None) or self.sampling
        ids = self._fit(self.tokenizer(prompt).input_ids, max_new_tokens)
        decode = Decode(ids, max_new_tokens, stop, sampling, self._random(sampling, session), self.tokenizer,
                        self.eos_ids)
        method = attention or _SCOPED_ATTENTION.get() or self.attention_method
        if method is None:
            return self._batcher.generate(self.engine, decode, session)
        from ragserve.attention import hf

        # Sparse decoding runs the HF model's attention function with this generation's session (a context
        # variable): it steps alone on the reference engine, inside a copy of this context.
        with hf.session(method) as s:
            g = self._batcher.generate(self._sparse(), decode, None, copy_context())
        g.attention = s.stats()
        return g

    def _random(self, sampling: Sampling, session: DecodeSession | None) -> torch.Generator | None:
        """The random stream of a sampled generation: the session's own when it has a seed (seeded once, so a
        request's draws repeat), a fresh one for a seeded call outside a session, else the generator's."""
        if sampling.temperature == 0:
            return None
        if sampling.seed is None:
            return self._rng
        if session is None:
            return torch.Generator(device=self.device).manual_seed(sampling.seed)
        if session.rng is None:
            session.rng = torch.Generator(device=self.device).manual_seed(sampling.seed)
        return session.rng

    def _sparse(self):
        if self._sparse_engine is None:
            from ragserve.rag.engines.reference import ReferenceEngine

            if isinstance(self.engine, ReferenceEngine):
                self._sparse_engine = self.engine
            else:
                self._sparse_engine = ReferenceEngine(self.model, self.device, max_slots=self.engine.max_slots)
        return self._sparse_engine

    @property
    def batching(self) -> dict:
        """Engine steps run and the generation steps they advanced (their ratio: the mean batch); seconds in the
        engine's calls (of which prefills: ``prefill_s``) and on the batcher's host work (picking tokens, stop
        checks); prompt positions prefilled, of which copied from the engine's prefix cache (``prefill_reused``)."""
        b = self._batcher
        return {"engine": type(self.engine).__name__, "steps": b.steps, "generation_steps": b.stepped,
                "engine_s": b.engine_s, "host_s": b.host_s, "prefill_s": b.prefill_s,
                "prefill_tokens": b.prefill_tokens, "prefill_reused": b.prefill_reused}

    # -- attention --------------------------------------------------------------------------
    def attention(self, ids: list[int]) -> np.ndarray:
        """Last-layer attention of one forward pass over ``ids``, averaged over heads: ``A[i, j]`` is how much
        position ``i`` attends to position ``j <= i``."""
        if self.max_positions is not None and len(ids) > self.max_positions:
            raise GeneratorError(f"{len(ids)} tokens exceed the model's {self.max_positions} positions")
        return self._batcher.call(lambda: self._attention(ids))  # between steps: it switches to eager attention

    @torch.inference_mode()
    def _attention(self, ids: list[int]) -> np.ndarray:
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            out = self.model(torch.tensor([ids], device=self.device), output_attentions=True)
        finally:
            self.model.set_attn_implementation(previous)
        return out.attentions[-1][0].float().mean(dim=0).cpu().numpy().astype(np.float64)
