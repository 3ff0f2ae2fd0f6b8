"""The Porter stemmer exactly as Lucene's ``PorterStemFilter`` applies it (Porter's reference release 3).

Lucene does not run the algorithm of the 1980 paper that Snowball's ``porter`` (PyStemmer) implements: its
second-step table maps ``-bli`` to ``-ble`` (the paper: ``-abli`` to ``-able``) and adds ``-logi`` to ``-log``.
So "technology" is ``technolog`` in Lucene and ``technologi`` in Snowball, "possibly" ``possibl`` against
``possibli``, "incredibly" ``incred`` against ``incredibli``. And after removing -ed/-ing it undoubles every
double consonant but l, s, z, where Snowball leaves cc, hh, jj, kk, qq, vv, ww, xx (and yy) alone: "trekking" is
``trek`` in Lucene and ``trekk`` in Snowball. Everything else agrees (checked against Lucene on 88k distinct words
of Wikipedia and ArguAna, and on suffixed variants of each).

These rules can only fire on a word containing ``bl``, ``log`` or one of those doubled letters (the first step
removes plural and -ed/-ing endings, turns a final y into i and may add an e after ``bl``; it never creates the
letters), so ``PorterStemmer.stem`` runs this pure-Python implementation on such words only and PyStemmer's C code
on the rest.
"""
from __future__ import annotations

import re

import Stemmer

_VOWELS = frozenset("aeiou")
# Words on which Lucene's Porter and Snowball's may differ (see the module docstring).
_LUCENE_ONLY = re.compile(r"bl|log|cc|hh|jj|kk|qq|vv|ww|xx|yy")


class _Word:
    """A word being stemmed: ``b`` holds its characters, ``k`` the index of the last one still kept."""

    __slots__ = ("b", "k", "j")

    def __init__(self, word: str) -> None:
        self.b = list(word)
        self.k = len(word) - 1
        self.j = 0

    def cons(self, i: int) -> bool:
        c = self.b[i]
        if c in _VOWELS:
            return False
        if c == "y":
            return True if i == 0 else not self.cons(i - 1)
        return True

    def _skip(self, i: int, consonants: bool) -> int:
        """First position from i (up to j + 1) that is not a consonant (consonants=True) or not a vowel."""
        while i <= self.j and self.cons(i) == consonants:
            i += 1
        return i

    def m(self) -> int:
        """Number of vowel-consonant sequences in b[0..j]."""
        n, i = 0, self._skip(0, True)
        while True:
            i = self._skip(i, False)
            if i > self.j:
                return n
            n += 1
            i = self._skip(i, True)
            if i > self.j:
                return n

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def double_cons(self, j: int) -> bool:
        return j >= 1 and self.b[j] == self.b[j - 1] and self.cons(j)

    def cvc(self, i: int) -> bool:
        if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
            return False
        return self.b[i] not in "wxy"

    def ends(self, s: str) -> bool:
        o = self.k - len(s) + 1
        if o < 0 or "".join(self.b[o:self.k + 1]) != s:
            return False
        self.j = self.k - len(s)
        return True

    def set_to(self, s: str) -> None:
        o = self.j + 1
        self.b[o:] = list(s)
        self.k = self.j + len(s)

    def replace(self, s: str) -> None:
        if self.m() > 0:
            self.set_to(s)

    def text(self) -> str:
        return "".join(self.b[:self.k + 1])


# Second step (the paper's step 2), keyed by the penultimate letter, tried in this order; first match wins.
_STEP3 = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP4 = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP5 = {
    "a": ("al",), "c": ("ance", "ence"), "e": ("er",), "i": ("ic",), "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"), "o": ("ion", "ou"), "s": ("ism",), "t": ("ate", "iti"),
    "u": ("ous",), "v": ("ive",), "z": ("ize",),
}


def _step1(w: _Word) -> None:
    b = w.b
    if b[w.k] == "s":
        if w.ends("sses"):
            w.k -= 2
        elif w.ends("ies"):
            w.set_to("i")
        elif b[w.k - 1] != "s":
            w.k -= 1
    if w.ends("eed"):
        if w.m() > 0:
            w.k -= 1
    elif (w.ends("ed") or w.ends("ing")) and w.vowel_in_stem():
        w.k = w.j
        if w.ends("at"):
            w.set_to("ate")
        elif w.ends("bl"):
            w.set_to("ble")
        elif w.ends("iz"):
            w.set_to("ize")
        elif w.double_cons(w.k):
            if b[w.k] not in "lsz":
                w.k -= 1
        else:
            w.j = w.k
            if w.m() == 1 and w.cvc(w.k):
                w.set_to("e")


def _step2(w: _Word) -> None:
    if w.ends("y") and w.vowel_in_stem():
        w.b[w.k] = "i"


def _table_step(w: _Word, table: dict, key: int) -> None:
    for suffix, repl in table.get(w.b[key], ()):
        if w.ends(suffix):
            w.replace(repl)
            return


def _step5(w: _Word) -> None:
    for suffix in _STEP5.get(w.b[w.k - 1], ()):
        if w.ends(suffix):
            if suffix == "ion" and not (w.j >= 0 and w.b[w.j] in "st"):
                continue
            if w.m() > 1:
                w.k = w.j
            return


def _step6(w: _Word) -> None:
    w.j = w.k
    if w.b[w.k] == "e":
        a = w.m()
        if a > 1 or (a == 1 and not w.cvc(w.k - 1)):
            w.k -= 1
    if w.b[w.k] == "l" and w.double_cons(w.k) and w.m() > 1:
        w.k -= 1


def lucene_porter(word: str) -> str:
    """Lucene's Porter stem of one lower-case token (words of one or two letters are left alone)."""
    if len(word) <= 2:
        return word
    w = _Word(word)
    _step1(w)
    _step2(w)
    if w.k > 0:
        _table_step(w, _STEP3, w.k - 1)
    _table_step(w, _STEP4, w.k)
    if w.k > 0:
        _step5(w)
    _step6(w)
    return w.text()


class PorterStemmer:
    """Lucene-exact Porter stems at C speed: PyStemmer where the two algorithms provably agree."""

    def __init__(self) -> None:
        self._snowball = Stemmer.Stemmer("porter", 0)  # no cache: callers cache terms (PyStemmer's costs ~1 us a word)

    def stem(self, word: str) -> str:
        if len(word) <= 2:
            return word
        if _LUCENE_ONLY.search(word):
            return lucene_porter(word)
        return self._snowball.stemWord(word)
