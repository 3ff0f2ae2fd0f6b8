"""Answer extraction and scoring: SQuAD-style normalisation, EM / F1 / precision / recall against every
gold alias, yes/no answers, and recall of the supporting passages among those retrieved."""
from __future__ import annotations

import re
import string
from collections import Counter

from ragserve.rag.text import ANSWER_MARK_RE

_PUNCT = set(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no")


def normalize_answer(s: str) -> str:
    """SQuAD / HotpotQA normalisation: lower case, drop punctuation and articles, squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def extract_answer(text: str) -> str | None:
    """The answer after the last "the answer is" in ``text`` (up to the line or sentence end), or None."""
    marks = list(ANSWER_MARK_RE.finditer(text))
    if not marks:
        return None
    rest = text[marks[-1].end():].lstrip(" :").split("\n", 1)[0]
    m = re.search(r"\.\s", rest)  # a following sentence is not part of the answer
    if m:
        rest = rest[:m.start()]
    return rest.strip().rstrip(".").strip().strip("\"'“”‘’").strip()


def first_line_answer(text: str) -> str:
    """A direct answer: the first non-empty line of the generated text, without a closing full stop or quotes."""
    line = next((l for l in text.strip().splitlines() if l.strip()), "")
    return line.strip().rstrip(".").strip().strip("\"'“”‘’").strip()


def to_yes_no(prediction: str) -> str:
    """Map a yes/no prediction to "yes" or "no" by its first word (anything else is kept as it is)."""
    words = normalize_answer(prediction).split()
    return words[0] if words and words[0] in _YES_NO else prediction


def _prf(prediction: str, gold: str) -> tuple[float, float, float]:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    # HotpotQA's rule: a yes/no answer either matches exactly or scores zero.
    if (p in _YES_NO or g in _YES_NO) and p != g:
        return 0.0, 0.0, 0.0
    pt, gt = p.split(), g.split()
    common = sum((Counter(pt) & Counter(gt)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    prec, rec = common / len(pt), common / len(gt)
    return 2 * prec * rec / (prec + rec), prec, rec


def score_answer(prediction: str, golds: list[str], yes_no: bool = False) -> dict:
    """EM, F1, precision and recall of ``prediction`` against the best-matching gold alias."""
    if not golds:
        raise ValueError("no gold answers")
    if yes_no:
        prediction = to_yes_no(prediction)
    em = max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds)
    f1, prec, rec = max(_prf(prediction, g) for g in golds)
    return {"em": em, "f1": f1, "precision": prec, "recall": rec}


def _norm_title(t: str) -> str:
    return " ".join(t.casefold().split())


def support_recall(retrieved_titles: list[str], supporting_titles: list[str]) -> float | None:
    """Fraction of the supporting passages (by title; an untitled passage, a StrategyQA fact, by its text)
    retrieved at least once; None without supports."""
    gold = {_norm_title(t) for t in supporting_titles}
    if not gold:
        return None
    got = {_norm_title(t) for t in retrieved_titles}
    return len(gold & got) / len(gold)
