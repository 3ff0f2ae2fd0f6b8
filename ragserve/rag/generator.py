"""A causal LM behind one small interface: greedy generation with per-token log-probabilities and entropies,
stopping at a line or sentence end, and last-layer attention maps for DRAGIN.

Any ``AutoModelForCausalLM`` checkpoint loads (a local directory or a hub id already in the local cache):
bf16 on a GPU, fp32 on the CPU; ``Generator.from_model`` wraps one already in memory. Attention maps need eager
attention, so the model is switched to eager only for those forward passes and back afterwards.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from ragserve.model_path import model_path_problem
from ragserve.rag.text import sentence_ends


class GeneratorError(ValueError):
    """The model cannot be loaded or used as asked."""


STOP_MODES = ("line", "sentence")
# The sparse attention a caller chose for the generations run inside ``Generator.attention_scope`` (a server
# request's), over the generator's own default.
_SCOPED_ATTENTION: ContextVar = ContextVar("ragserve_scoped_attention", default=None)


@dataclass
class Generation:
    text: str  # the continuation, cut at the stop point
    token_ids: list[int]  # tokens kept (each starts before the cut)
    spans: list[tuple[int, int]]  # character span of each kept token in ``text``
    logprobs: np.ndarray  # log-probability of each kept token
    entropies: np.ndarray  # entropy (nats) of the distribution each kept token was chosen from
    tokens_generated: int  # every token decoded, including any cut off after the stop point
    prompt_tokens: int
    stop: str  # eos | newline | sentence | length
    attention: dict | None = None  # the sparse decoding's method, budget, attended share and stage seconds

    @property
    def probs(self) -> np.ndarray:
        return np.exp(self.logprobs)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GeneratorError(f"device {device!r} requested but CUDA is not available")
    return device


def _spans_from_lengths(lengths: list[int], total: int) -> list[tuple[int, int]]:
    """Token spans from the decoded length after each token (kept monotone: partial UTF-8 bytes can decode
    to a replacement character that the next token then completes)."""
    spans, prev = [], 0
    for n in lengths:
        end = min(max(n, prev), total)
        spans.append((prev, end))
        prev = end
    return spans


def stop_point(text: str, mode: str) -> tuple[int, str] | None:
    """Where generated ``text`` should be cut, and why: at the first newline after some text, or (mode
    ``sentence``) also just after the first sentence end."""
    body = len(text) - len(text.lstrip())
    if body == len(text):
        return None
    cuts = []
    nl = text.find("\n", body)
    if nl >= 0:
        cuts.append((nl, "newline"))
    if mode == "sentence":
        ends = [e for e in sentence_ends(text) if e > body]
        if ends:
            cuts.append((ends[0], "sentence"))
    return min(cuts) if cuts else None


class Generator:
    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", temperature: float = 0.0,
                 seed: int = 0, threads: int = 0, attention: str | None = None, budget: int | None = None,
                 **attention_options) -> None:
        """``threads`` > 0 sets torch's (process-wide) CPU thread count: one thread is fastest for small
        models on a shared machine, where spinning threads compete for cores. ``attention``: decode with this
        sparse attention method (``ragserve.attention``) and token ``budget``, prefill staying dense; options such
        as ``page_size`` go to the method."""
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
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=self.dtype)
        except (OSError, ValueError) as e:
            raise GeneratorError(f"cannot load a causal LM from {model!r}: {e}") from e
        self._setup(model, temperature, seed)
        if attention is not None:
            self.attention_method = self.sparse_method(attention, budget, **attention_options)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, device: str | None = None, temperature: float = 0.0,
                   seed: int = 0, name: str = "", attention: str | None = None, budget: int | None = None,
                   **attention_options) -> "Generator":
        """Wrap a causal LM already built in memory and its tokenizer, e.g. a randomly initialised model made
        with ``from_config`` straight on the GPU, where saving and reloading billions of weights would only cost
        time. The model keeps its dtype; ``device`` (default: where its weights are) is where it runs.
        ``attention``, ``budget`` and the options: as for the constructor."""
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
        self._setup(name or type(model).__name__, temperature, seed)
        if attention is not None:
            self.attention_method = self.sparse_method(attention, budget, **attention_options)
        return self

    def _setup(self, name: str, temperature: float, seed: int) -> None:
        """What both constructors share once ``model`` and ``tokenizer`` are set."""
        self.model.to(self.device).eval()
        self.name = name
        self.temperature = temperature
        self._rng = torch.Generator(device=self.device).manual_seed(seed)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        eos = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.eos_ids = {int(e) for e in eos if e is not None}
        self.bos_id = self.tokenizer.bos_token_id
        self.attention_method = None  # the sparse attention of decode steps (None: the model's own)

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
        hf.install(self.model)
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
        return ids, decoded, _spans_from_lengths(lengths, len(decoded))

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

    @torch.inference_mode()
    def generate(self, prompt: str, max_new_tokens: int, stop: str = "line", attention=None) -> Generation:
        """Decode after ``prompt`` until EOS, ``max_new_tokens`` or the stop point of ``stop`` mode, with the
        generator's sparse attention or the method ``attention`` (from ``sparse_method``) instead."""
        method = attention or _SCOPED_ATTENTION.get() or self.attention_method
        if method is None:
            return self._generate(prompt, max_new_tokens, stop)
        from ragserve.attention import hf

        with hf.session(method) as s:
            g = self._generate(prompt, max_new_tokens, stop)
        g.attention = s.stats()
        return g

    def _generate(self, prompt: str, max_new_tokens: int, stop: str) -> Generation:
        if stop not in STOP_MODES:
            raise GeneratorError(f"stop must be one of {STOP_MODES}")
        if max_new_tokens < 1:
            raise GeneratorError("max_new_tokens must be >= 1")
        ids = self._fit(self.tokenizer(prompt).input_ids, max_new_tokens)
        out = self.model(torch.tensor([ids], device=self.device), use_cache=True)
        past = out.past_key_values
        new: list[int] = []
        logps, ents, lengths = [], [], []
        reason, cut, text = "length", None, ""
        for step in range(max_new_tokens):
            logits = out.logits[0, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            if self.temperature > 0:
                probs = torch.softmax(logits / self.temperature, dim=-1)
                tok = int(torch.multinomial(probs, 1, generator=self._rng))
            else:
                tok = int(torch.argmax(logp))
            if tok in self.eos_ids:
                reason = "eos"
                break
            new.append(tok)
            logps.append(logp[tok])
            ents.append(-(logp.exp() * logp).nansum())
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            lengths.append(len(text))
            hit = stop_point(text, stop)
            if hit is not None:
                cut, reason = hit
                break
            if step + 1 < max_new_tokens:
                out = self.model(torch.tensor([[tok]], device=self.device), past_key_values=past, use_cache=True)
                past = out.past_key_values
        generated = len(new)
        if cut is not None:
            text = text[:cut]
            starts = [0] + lengths[:-1]
            n_keep = sum(1 for s in starts if s < cut)
        else:
            n_keep = len(new)
        spans = _spans_from_lengths(lengths[:n_keep], len(text))
        lp = torch.stack(logps[:n_keep]).cpu().numpy() if n_keep else np.zeros(0, np.float32)
        en = torch.stack(ents[:n_keep]).cpu().numpy() if n_keep else np.zeros(0, np.float32)
        return Generation(text=text, token_ids=new[:n_keep], spans=spans, logprobs=lp.astype(np.float64),
                          entropies=en.astype(np.float64), tokens_generated=generated, prompt_tokens=len(ids),
                          stop=reason)

    # -- attention --------------------------------------------------------------------------
    @torch.inference_mode()
    def attention(self, ids: list[int]) -> np.ndarray:
        """Last-layer attention of one forward pass over ``ids``, averaged over heads: ``A[i, j]`` is how much
        position ``i`` attends to position ``j <= i``."""
        if self.max_positions is not None and len(ids) > self.max_positions:
            raise GeneratorError(f"{len(ids)} tokens exceed the model's {self.max_positions} positions")
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            out = self.model(torch.tensor([ids], device=self.device), output_attentions=True)
        finally:
            self.model.set_attn_implementation(previous)
        return out.attentions[-1][0].float().mean(dim=0).cpu().numpy().astype(np.float64)
