"""One generation as a state machine: the batcher feeds it one row of logits at a time and it picks the next token
(greedy, or sampled with the request's temperature, top-p and seed), records its log-probability and entropy, and
decides when to stop (EOS, a line or sentence end, a stop string, the token budget)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ragserve.rag.text import sentence_ends


class GeneratorError(ValueError):
    """The model cannot be loaded or used as asked."""


STOP_MODES = ("line", "sentence", "none")
MAX_STOP_STRINGS = 8


@dataclass
class Generation:
    text: str  # the continuation, cut at the stop point
    token_ids: list[int]  # tokens kept (each starts before the cut)
    spans: list[tuple[int, int]]  # character span of each kept token in ``text``
    logprobs: np.ndarray  # log-probability of each kept token
    entropies: np.ndarray  # entropy (nats) of the distribution each kept token was chosen from
    tokens_generated: int  # every token decoded, including any cut off after the stop point
    prompt_tokens: int
    stop: str  # eos | newline | sentence | stop (a stop string) | length
    attention: dict | None = None  # the sparse decoding's method, budget, attended share and stage seconds

    @property
    def probs(self) -> np.ndarray:
        return np.exp(self.logprobs)


@dataclass(frozen=True)
class Sampling:
    """A request's decoding choices (OpenAI's temperature, top_p, seed and stop). The default is greedy; a
    temperature above 0 samples, from the smallest set of tokens holding ``top_p`` of the probability; ``seed``
    makes the draws repeatable (one stream per request); the text is cut before the first of the ``stop`` strings.
    Log-probabilities and entropies are always those of the model's own distribution (temperature 1)."""
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise GeneratorError("temperature must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise GeneratorError("top_p must be in (0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise GeneratorError("seed must be an integer")
        if isinstance(self.stop, str) or len(self.stop) > MAX_STOP_STRINGS or \
                not all(isinstance(s, str) and s for s in self.stop):
            raise GeneratorError(f"stop must be a list of at most {MAX_STOP_STRINGS} non-empty strings")



def stop_point(text: str, mode: str, strings: tuple[str, ...] = ()) -> tuple[int, str] | None:
    """Where generated ``text`` should be cut, and why: at the first newline after some text, or (mode
    ``sentence``) also just after the first sentence end (mode ``none``: neither); and before the first of the
    stop ``strings``."""
    cuts = [(i, "stop") for i in (text.find(s) for s in strings) if i >= 0]
    body = len(text) - len(text.lstrip())
    if mode != "none" and body < len(text):
        nl = text.find("\n", body)
        if nl >= 0:
            cuts.append((nl, "newline"))
        if mode == "sentence":
            ends = [e for e in sentence_ends(text) if e > body]
            if ends:
                cuts.append((ends[0], "sentence"))
    return min(cuts) if cuts else None


def spans_from_lengths(lengths: list[int], total: int) -> list[tuple[int, int]]:
    """Token spans from the decoded length after each token (kept monotone: partial UTF-8 bytes can decode
    to a replacement character that the next token then completes)."""
    spans, prev = [], 0
    for n in lengths:
        end = min(max(n, prev), total)
        spans.append((prev, end))
        prev = end
    return spans


def sample(logits: torch.Tensor, sampling: Sampling, rng: torch.Generator) -> int:
    """A token drawn from ``softmax(logits / temperature)``, cut to its top-p nucleus."""
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p >= 1:
        return int(torch.multinomial(probs, 1, generator=rng))
    p, idx = torch.sort(probs, descending=True)
    keep = torch.cumsum(p, dim=-1) - p < sampling.top_p  # the first token always stays
    p = torch.where(keep, p, torch.zeros_like(p))
    return int(idx[torch.multinomial(p, 1, generator=rng)])


class Decode:
    """One generation after the prompt ``ids``: ``feed`` takes the logits after the last token fed and returns
    the next token to feed, or None once the generation is over (then ``result`` holds it)."""

    def __init__(self, ids: list[int], max_new_tokens: int, stop: str, sampling: Sampling,
                 rng: torch.Generator | None, tokenizer, eos_ids: set[int]) -> None:
        if stop not in STOP_MODES:
            raise GeneratorError(f"stop must be one of {STOP_MODES}")
        if max_new_tokens < 1:
            raise GeneratorError("max_new_tokens must be >= 1")
        if sampling.temperature > 0 and rng is None:
            raise GeneratorError("sampling needs a random generator")
        self.ids, self.max_new, self.stop, self.sampling, self.rng = ids, max_new_tokens, stop, sampling, rng
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self.new: list[int] = []
        self.logps: list[torch.Tensor] = []
        self.ents: list[torch.Tensor] = []
        self.lengths: list[int] = []
        self.reason, self.cut, self.text = "length", None, ""

    def feed(self, logits: torch.Tensor) -> int | None:
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        if self.sampling.temperature > 0:
            tok = sample(logits, self.sampling, self.rng)
        else:
            tok = int(torch.argmax(logp))
        if tok in self.eos_ids:
            self.reason = "eos"
            return None
        self.new.append(tok)
        self.logps.append(logp[tok])
        self.ents.append(-(logp.exp() * logp).nansum())
        self.text = self.tokenizer.decode(self.new, skip_special_tokens=True)
        self.lengths.append(len(self.text))
        hit = stop_point(self.text, self.stop, self.sampling.stop)
        if hit is not None:
            self.cut, self.reason = hit
            return None
        return tok if len(self.new) < self.max_new else None

    def result(self) -> Generation:
        text, lengths = self.text, self.lengths
        if self.cut is not None:
            text = text[:self.cut]
            starts = [0] + lengths[:-1]
            n_keep = sum(1 for s in starts if s < self.cut)
        else:
            n_keep = len(self.new)
        spans = spans_from_lengths(lengths[:n_keep], len(text))
        lp = torch.stack(self.logps[:n_keep]).cpu().numpy() if n_keep else np.zeros(0, np.float32)
        en = torch.stack(self.ents[:n_keep]).cpu().numpy() if n_keep else np.zeros(0, np.float32)
        return Generation(text=text, token_ids=self.new[:n_keep], spans=spans, logprobs=lp.astype(np.float64),
                          entropies=en.astype(np.float64), tokens_generated=len(self.new),
                          prompt_tokens=len(self.ids), stop=self.reason)
