"""``dragin``: DRAGIN (Su et al., 2024): RIND decides when to retrieve, QFS decides what to retrieve.

RIND scores every generated word: the entropy of its tokens' distributions (mean) times the attention it
receives from later generated tokens (max over the later positions, the newline that ended the line included;
last layer, heads averaged; summed over
the word's tokens and scaled to mean 1 within its sentence, as DRAGIN's code does, so that its published
thresholds apply) times a content-word indicator. The first sentence holding a word above the threshold is
where retrieval happens. QFS takes the attention of the positions that produced the uncertain words over the
whole context (question, accepted text, the sentence so far) and keeps the ``keep`` content words with the
highest attention, in their original order, as the query. The answer is regenerated from the text before the
uncertain sentence with the retrieved passages, and the first regenerated sentence is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragserve.rag import text as T
from ragserve.rag.base import MethodError, RagMethod, finished
from ragserve.rag.generator import Generation
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit

# Published DRAGIN settings (oneal2000/DRAGIN config/Llama2-7b-chat/<dataset>/DRAGIN.json): hallucination
# threshold, query words kept, answer tokens. Other datasets use the HotpotQA settings.
PUBLISHED = {
    "hotpotqa": {"threshold": 1.4, "keep": 35, "max_new_tokens": 100},
    "2wiki": {"threshold": 1.2, "keep": 40, "max_new_tokens": 64},
    "strategyqa": {"threshold": 0.75, "keep": 35, "max_new_tokens": 100},
    "iirc": {"threshold": 1.3, "keep": 35, "max_new_tokens": 128},
}


def group_tokens(text: str, token_spans: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """The words of ``text`` (character spans) and, for each, the indices of the tokens overlapping it."""
    spans = T.words(text)
    members: list[list[int]] = []
    t = 0
    for s, e in spans:
        while t < len(token_spans) and token_spans[t][1] <= s:
            t += 1
        ids, u = [], t
        while u < len(token_spans) and token_spans[u][0] < e:
            if token_spans[u][1] > s:
                ids.append(u)
            u += 1
        members.append(ids)
    return spans, members


def attention_received(attn: np.ndarray) -> np.ndarray:
    """For each position j, the largest attention any later position i > j pays it (0 for the last)."""
    n = attn.shape[0]
    later = np.tril(attn, k=-1)  # keep i > j
    return later.max(axis=0) if n else np.zeros(0)


def rind_scores(token_entropy: np.ndarray, token_attention: np.ndarray, word_tokens: list[list[int]],
                word_sentence: list[int]) -> np.ndarray:
    """RIND value of each word: mean token entropy x summed token attention, the attention scaled to mean 1
    over the words of the word's sentence."""
    n = len(word_tokens)
    ent = np.array([float(np.mean(token_entropy[ts])) if ts else 0.0 for ts in word_tokens])
    att = np.array([float(np.sum(token_attention[ts])) if ts else 0.0 for ts in word_tokens])
    scaled = np.zeros(n)
    sent = np.asarray(word_sentence)
    for s in set(word_sentence):
        idx = np.flatnonzero(sent == s)
        total = att[idx].sum()
        if total > 0:
            scaled[idx] = att[idx] / total * len(idx)
    return ent * scaled


def rind_detect(scores: np.ndarray, content: list[bool], word_sentence: list[int], threshold: float,
                answer_sentences: set[int]) -> tuple[int, list[int]] | None:
    """The first sentence with a content word scoring above ``threshold`` and its words above it; scanning
    stops at the sentence that states the answer (as DRAGIN does)."""
    for s in sorted(set(word_sentence)):
        if s in answer_sentences:
            return None
        hits = [w for w, ws in enumerate(word_sentence) if ws == s and content[w] and scores[w] > threshold]
        if hits:
            return s, hits
    return None


def qfs_word_attention(attn: np.ndarray, word_tokens: list[list[int]], hit_words: list[int]) -> np.ndarray:
    """Attention of each word of the context, seen from the uncertain words: for each uncertain word, the
    rows of the positions that produced its tokens (the token before each), cut to the positions before the
    word and normalised to sum 1, averaged; then averaged over the uncertain words and summed per word."""
    n = attn.shape[0]
    per_pos = np.zeros(n)
    used = 0
    for w in hit_words:
        toks = word_tokens[w]
        if not toks or toks[0] == 0:
            continue
        first = toks[0]
        rows = []
        for t in toks:
            row = attn[t - 1, :first].astype(np.float64)
            if row.sum() > 0:
                rows.append(row / row.sum())
        if rows:
            per_pos[:first] += np.mean(rows, axis=0)
            used += 1
    if used:
        per_pos /= used
    return np.array([float(per_pos[ts].sum()) if ts else 0.0 for ts in word_tokens])


def qfs_select(word_texts: list[str], scores: np.ndarray, candidates: list[bool], keep: int) -> str:
    """The ``keep`` candidate words with the highest scores, in their original order."""
    idx = [i for i, c in enumerate(candidates) if c]
    idx.sort(key=lambda i: (-scores[i], i))
    return " ".join(word_texts[i] for i in sorted(idx[:keep]))


@dataclass
class Detection:
    sentence: tuple[int, int]  # span of the uncertain sentence in the generated text
    prefix: str  # the generated text before it
    hit_spans: list[tuple[int, int]]  # spans of the uncertain words in the generated text


class Dragin(RagMethod):
    name = "dragin"
    options = ("threshold", "keep")

    def __init__(self, *args, threshold: float = PUBLISHED["hotpotqa"]["threshold"],
                 keep: int = PUBLISHED["hotpotqa"]["keep"], **kw) -> None:
        super().__init__(*args, **kw)
        if keep < 1:
            raise MethodError("keep must be >= 1")
        self.threshold, self.keep = threshold, keep

    def rind(self, gen: Generation) -> tuple[Detection | None, dict]:
        """Run RIND over a generation (one attention pass over the generated tokens): the detection, if
        any, and the record of the decision for the trace."""
        text = gen.text
        sentences = T.split_sentences(text)
        spans, members = group_tokens(text, gen.spans)
        word_sentence = [next((i for i, (a, b) in enumerate(sentences) if a <= s < b), len(sentences))
                         for s, _ in spans]
        # BOS first (where the model has one) absorbs the attention sink, as in a normal decoding context.
        lead = [self.generator.bos_id] if self.generator.bos_id is not None else []
        # A line that ended at a newline is read up to it: the newline attends to the line's last word, which
        # otherwise no later token sees (a direct answer is one short line, and its last word is the answer's).
        tail = self.generator.tokenizer("\n", add_special_tokens=False).input_ids if gen.stop == "newline" else []
        ids = lead + list(gen.token_ids) + tail
        attn = self.generator.attention(ids)[len(lead):, len(lead):]
        n = len(gen.token_ids)
        scores = rind_scores(gen.entropies, attention_received(attn)[:n], members, word_sentence)
        content = [T.is_content_word(text[s:e]) for s, e in spans]
        answer_sents = {i for i, (a, b) in enumerate(sentences) if T.has_answer(text[a:b])}
        found = rind_detect(scores, content, word_sentence, self.threshold, answer_sents)
        content_scores = [float(scores[i]) for i, c in enumerate(content) if c]
        record = {"threshold": self.threshold, "max_score": max(content_scores, default=0.0),
                  "fired": found is not None}
        if found is None:
            return None, record
        s_idx, hit_words = found
        record.update(sentence=s_idx, words=[text[spans[w][0]:spans[w][1]] for w in hit_words],
                      scores=[round(float(scores[w]), 4) for w in hit_words])
        a, _ = sentences[s_idx]
        return Detection(sentences[s_idx], text[:a].strip(), [spans[w] for w in hit_words]), record

    def qfs(self, question: str, accepted: str, gen: Generation, det: Detection) -> str:
        """Query from the attention of the uncertain words over question + accepted text + this sentence."""
        a, b = det.sentence
        sentence = gen.text[a:b]
        context = T.join_text(question, accepted, det.prefix, sentence)
        ids, decoded, tok_spans = self.generator.encode(context)
        base = decoded.rfind(sentence)
        if base < 0:
            base = len(decoded) - len(sentence)
        hits = {(base + s - a, base + e - a) for s, e in det.hit_spans}
        spans, members = group_tokens(decoded, tok_spans)
        hit_words = [i for i, sp in enumerate(spans) if sp in hits]
        attn = self.generator.attention(ids)
        scores = qfs_word_attention(attn, members, hit_words)
        texts = [decoded[s:e] for s, e in spans]
        candidates = [T.is_content_word(t) and i not in hit_words for i, t in enumerate(texts)]
        return qfs_select(texts, scores, candidates, self.keep)

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        text, hits = "", []
        while (room := self.room(text)) > 0:
            step, gen = self.generate(trace, question, text, [], room, "line")
            if not gen.text.strip():
                break
            with step.timed("apply"):
                det, step.trigger = self.rind(gen)
            if det is None:
                text = T.join_text(text, gen.text)
                break  # the whole continuation is trusted: the model has finished or used its budget
            accepted = text
            hits = self.retrieve(trace, lambda: self.qfs(question, accepted, gen, det), question)
            text = T.join_text(text, det.prefix)
            if (room := self.room(text)) <= 0:
                break
            _, regen = self.generate(trace, question, text, hits, room, "sentence")
            if not regen.text.strip():
                break
            text = T.join_text(text, regen.text)
            if finished(regen, regen.text):
                break
        return text, hits
