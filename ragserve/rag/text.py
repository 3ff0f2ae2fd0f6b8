"""Text helpers shared by the RAG loops: sentences, words, stopwords and joining generated text."""
from __future__ import annotations

import re

# English function words. DRAGIN keeps nouns, verbs, adjectives, proper nouns and numbers (spaCy POS tags);
# without a tagger, a word counts as content when it is alphanumeric and not in this list.
STOPWORDS = frozenset("""
a about above after again against all also am an and any are aren't as at be because been before being below
between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each
either else ever every few for from further had hadn't has hasn't have haven't having he he'd he'll he's her
here here's hers herself him himself his how how's however i i'd i'll i'm i've if in into is isn't it it's its
itself just let's like may me might more most much must mustn't my myself neither no nor not now of off on
once one only or other ought our ours ourselves out over own per rather same shall shan't she she'd she'll
she's should shouldn't since so some such than that that's the their theirs them themselves then there
there's these they they'd they'll they're they've this those though through thus to too under until up upon
us very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's whether which
while who who's whom whose why why's will with within without won't would wouldn't yet you you'd you'll
you're you've your yours yourself yourselves answer question
""".split())

WORD_RE = re.compile(r"\w+(?:['’\-]\w+)*|[^\w\s]")
# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets) when whitespace and an
# upper-case letter, digit or opening quote follow; single capitals ("J. R. R.") and common abbreviations
# are not ends.
_SENT_END_RE = re.compile(r"[.!?][\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9])")
_ABBREV = frozenset("mr mrs ms dr st jr sr prof gen col lt sgt capt rev vs etc inc ltd co no vol fig approx est"
                    .split())
ANSWER_MARK_RE = re.compile(r"the answer is", re.IGNORECASE)


def is_content_word(word: str) -> bool:
    """True for words a retrieval query should keep: alphanumeric and not a stopword."""
    w = word.lower().strip("'’")
    return bool(w) and any(c.isalnum() for c in w) and w not in STOPWORDS


def words(text: str) -> list[tuple[int, int]]:
    """Character spans of the words and punctuation marks of ``text``."""
    return [m.span() for m in WORD_RE.finditer(text)]


def _is_abbreviation(text: str, dot: int) -> bool:
    if text[dot] != ".":
        return False
    m = re.search(r"(\w+)$", text[:dot])
    if not m:
        return False
    w = m.group(1)
    return (len(w) == 1 and w.isupper()) or w.lower() in _ABBREV


def sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence-final punctuation mark that is followed by another sentence."""
    return [m.end() for m in _SENT_END_RE.finditer(text) if not _is_abbreviation(text, m.start())]


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of ``text`` (leading/trailing whitespace excluded), in order."""
    spans = []
    start = 0
    for end in sentence_ends(text) + [len(text)]:
        seg = text[start:end]
        lead = len(seg) - len(seg.lstrip())
        s, e = start + lead, start + len(seg.rstrip())
        if e > s:
            spans.append((s, e))
        start = end
    return spans


def join_text(*parts: str) -> str:
    """Concatenate pieces of generated answer text with single spaces."""
    return " ".join(p.strip() for p in parts if p and p.strip())


def has_answer(text: str) -> bool:
    return ANSWER_MARK_RE.search(text) is not None
