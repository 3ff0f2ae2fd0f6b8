"""Index-time tokenizer in numba: the analyzer's Latin-1 token pattern run over UTF-8 bytes, with every distinct
token looked up in a hash table, so the Python analysis chain runs once per distinct token instead of once per
occurrence.

``TokenTable.ids`` gives exactly the token stream of ``Analyzer.tokens`` (lower-casing analyzer) mapped to term
ids, for every document whose characters are all in the fast path's set (the characters that send no
lower-cased text to the full UAX#29 pattern, see ``analyzer.NOT_LATIN1``); other documents are flagged for the
caller's full path. The character classes are derived from the analyzer's own definitions at import.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np
from numba import njit

from indexer.analyzer import LATIN1_LETTERS, MID_LETTER, MID_NUM, NOT_LATIN1

# Character classes of the token pattern (on the lower-cased character).
OTHER, LETTER, DIGIT, UNDERSCORE, MID_L, MID_N, MID_LN, REJECT = range(8)
# Every code point from here up is outside the fast path (tests/test_fasttok.py checks all of Unicode).
CLASS_LIMIT = 0x2060

# A slot of the token table is four int64 words: the token's first 16 bytes (lower-cased UTF-8, little-endian,
# zero padded), so a lookup usually reads one cache line; arena offset << 16 | byte length (0: empty slot); and
# the term id (-1: a dropped token), or a pending code until the caller has given the term id of a new token.
_W0, _W1, _WHERE, _VALUE = range(4)
# Occurrence codes below -1 refer to values the caller supplies after the scan: -2 - 2p for the p-th new token,
# -3 - 2k for the k-th occurrence over the table's limits.
_PENDING = -2
_MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def _char_class(ch: str) -> int:
    if NOT_LATIN1.match(ch):
        return REJECT
    low = ch.lower()
    # Lower-casing must keep the character in the set and its UTF-8 length, so lower-cased tokens are
    # lower-cased in place, byte for byte.
    if len(low) != 1 or NOT_LATIN1.match(low) or len(low.encode()) != len(ch.encode()):
        return REJECT
    if re.fullmatch(f"[{LATIN1_LETTERS}]", low):
        return LETTER
    if "0" <= low <= "9":
        return DIGIT
    if low == "_":
        return UNDERSCORE
    return {(True, True): MID_LN, (True, False): MID_L, (False, True): MID_N}.get(
        (low in MID_LETTER, low in MID_NUM), OTHER)


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(class of each code point below CLASS_LIMIT, lower case of each code point below 256)."""
    classes = np.array([_char_class(chr(c)) for c in range(CLASS_LIMIT)], dtype=np.uint8)
    lower = np.array([ord(chr(c).lower()) if classes[c] != REJECT else c for c in range(256)], dtype=np.int32)
    return classes, lower


CLASSES, LOWER = _tables()


@njit(cache=True, nogil=True, inline="always")
def _decode(buf, i):
    """(code point, byte length) of the UTF-8 sequence at buf[i] (Python wrote it, so it is well formed)."""
    b = np.int32(buf[i])
    if b < 0x80:
        return b, 1
    if b < 0xE0:
        return ((b & 0x1F) << 6) | (np.int32(buf[i + 1]) & 0x3F), 2
    if b < 0xF0:
        return ((b & 0x0F) << 12) | ((np.int32(buf[i + 1]) & 0x3F) << 6) | (np.int32(buf[i + 2]) & 0x3F), 3
    return (((b & 0x07) << 18) | ((np.int32(buf[i + 1]) & 0x3F) << 12) | ((np.int32(buf[i + 2]) & 0x3F) << 6)
            | (np.int32(buf[i + 3]) & 0x3F)), 4


@njit(cache=True, nogil=True, inline="always")
def _class(classes, cp):
    return classes[cp] if cp < classes.size else REJECT


@njit(cache=True, nogil=True)
def doc_bounds(buf, char_lens):
    """Byte offsets of documents in ``buf`` (their UTF-8 concatenation) from their lengths in code points."""
    bounds = np.empty(char_lens.size + 1, dtype=np.int64)
    bounds[0] = 0
    pos = 0
    for d in range(char_lens.size):
        left = char_lens[d]
        while left > 0:
            b = buf[pos]
            pos += 1 if b < 0x80 else (2 if b < 0xE0 else (3 if b < 0xF0 else 4))
            left -= 1
        bounds[d + 1] = pos
    return bounds


@njit(cache=True, nogil=True, inline="always")
def _put_lower(buf, i, n, cp, lower, scratch, nb):
    """Append the lower case of the character at buf[i] (n bytes, code point cp) to scratch[nb:]; returns
    nb + n. Lower-casing keeps the UTF-8 length of every character in the set."""
    if n == 1:
        scratch[nb] = lower[cp]
    elif n == 2:
        c = lower[cp]
        scratch[nb] = 0xC0 | (c >> 6)
        scratch[nb + 1] = 0x80 | (c & 0x3F)
    else:  # three-byte punctuation (U+2010..U+205E) has no case
        scratch[nb] = buf[i]
        scratch[nb + 1] = buf[i + 1]
        scratch[nb + 2] = buf[i + 2]
    return nb + n


@njit(cache=True, nogil=True)
def _lower_piece(buf, start, end, lower, scratch):
    """Lower-case buf[start:end] (at most max_len code points) into scratch; returns its byte length."""
    nb = 0
    i = start
    while i < end:
        cp, n = _decode(buf, i)
        nb = _put_lower(buf, i, n, cp, lower, scratch, nb)
        i += n
    return nb


@njit(cache=True, nogil=True, inline="always")
def _words(scratch64, nb):
    """The first 16 bytes of the token in scratch (viewed as u64 words), zero padded."""
    w0 = scratch64[0]
    w1 = scratch64[1]
    if nb < 16:
        w1 = w1 & ((np.uint64(1) << np.uint64(8 * (nb - 8))) - np.uint64(1)) if nb > 8 else np.uint64(0)
        if nb < 8:
            w0 = w0 & ((np.uint64(1) << np.uint64(8 * nb)) - np.uint64(1))
    return np.int64(w0), np.int64(w1)


@njit(cache=True, nogil=True, inline="always")
def _home(w0, w1, n, mask):
    """Home slot of a token from its first 16 bytes and length (longer tokens sharing those may share it)."""
    h = (np.uint64(w0) * _MIX1) ^ ((np.uint64(w1) + np.uint64(n)) * _MIX2)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True)
def _same_tail(arena, offset, scratch, n):
    """Whether a long token's bytes after the first 16 (stored at arena[offset:]) equal scratch[16:n]."""
    for j in range(16, n):
        if arena[offset + j] != scratch[j]:
            return False
    return True


_FULL_CODE = np.iinfo(np.int64).min
_OVER_CODE = _FULL_CODE + 1


@njit(cache=True, nogil=True)
def _lookup(scratch, scratch64, n, state, slots, arena, pending, max_tokens, max_arena):
    """Value of the token in scratch[:n] (a term id or a pending code), inserting it as pending if new.
    _FULL_CODE: the table must grow first; _OVER_CODE: the table is at its limits."""
    w0, w1 = _words(scratch64, n)
    mask = slots.shape[0] - 1
    s = _home(w0, w1, n, mask)
    while True:
        where = slots[s, _WHERE]
        if where == 0:
            break
        if slots[s, _W0] == w0 and slots[s, _W1] == w1 and (where & 0xFFFF) == n:
            if n <= 16 or _same_tail(arena, where >> 16, scratch, n):
                return slots[s, _VALUE]
        s = (s + 1) & mask
    tokens, p, used = state[0], state[3], state[4]
    if tokens >= max_tokens or used + n > max_arena:
        return _OVER_CODE
    if 2 * (tokens + 1) > slots.shape[0] or used + n > arena.size or p >= pending.size:
        return _FULL_CODE
    arena[used:used + n] = scratch[:n]
    slots[s, _W0] = w0
    slots[s, _W1] = w1
    slots[s, _WHERE] = (used << 16) | n
    slots[s, _VALUE] = _PENDING - 2 * p
    pending[p] = s
    state[0] = tokens + 1
    state[3] = p + 1
    state[4] = used + n
    return _PENDING - 2 * p


@njit(cache=True, nogil=True, inline="always")
def _char_at(buf, i, classes):
    """(code point, byte length, class) of the character at buf[i]."""
    b = np.int32(buf[i])
    if b < 0x80:
        return b, 1, classes[b]
    cp, n = _decode(buf, i)
    return cp, n, _class(classes, cp)


@njit(cache=True, nogil=True)
def _in_set(buf, start, end, classes):
    """Whether every character of buf[start:end] is in the fast path's set. Checked before any token of a
    document is looked up, so a document left to the full path adds no token (hence no term) to the table."""
    i = start
    while i < end:
        if buf[i] < 0x80:
            i += 1
            continue
        cp, n = _decode(buf, i)
        if _class(classes, cp) == REJECT:
            return False
        i += n
    return True


@njit(cache=True, nogil=True)
def _token_end(buf, i, end, classes):
    """End of the token that starts at buf[i] (a letter, digit or '_') and its length in code points. This is
    the analyzer's _TOKEN_LATIN1: a run of letters, digits and '_', continued across a MidLetter/MidNumLet
    between two letters or a MidNum/MidNumLet between two digits."""
    _, n, c = _char_at(buf, i, classes)
    prev = c
    nchars = 0
    while True:  # the character at i (n bytes) belongs to the token
        nchars += 1
        i += n
        if i >= end:
            return i, nchars
        _, n, c = _char_at(buf, i, classes)
        if LETTER <= c <= UNDERSCORE:
            prev = c
            continue
        if c >= MID_L and i + n < end and (prev == LETTER or prev == DIGIT):
            nxt = _char_at(buf, i + n, classes)[2]
            if (prev == LETTER and nxt == LETTER and c != MID_N) or (prev == DIGIT and nxt == DIGIT and c != MID_L):
                continue
        return i, nchars


@njit(cache=True, nogil=True)
def _scan(buf, bounds, first_doc, max_len, classes, lower, state, slots, arena, pending, occ, occ_end, rejected,
          overflow, max_tokens, max_arena):
    """Scan documents from first_doc on; returns the first one not done (all done: the number of documents),
    which then left no occurrences behind. A token longer than max_len code points is cut every max_len code
    points, as the analyzer cuts it. Documents with characters outside the set are marked in ``rejected``."""
    scratch64 = np.zeros((3 * max_len + 32) // 8, dtype=np.uint64)  # a token of max_len chars, and slack
    scratch = scratch64.view(np.uint8)
    n_occ, n_over = state[1], state[2]
    for d in range(first_doc, bounds.size - 1):
        doc_occ, doc_over = n_occ, n_over
        i, end = bounds[d], bounds[d + 1]
        rejected[d] = not _in_set(buf, i, end, classes)
        if rejected[d]:
            i = end
        while i < end:
            _, n, c = _char_at(buf, i, classes)
            if c < LETTER or c > UNDERSCORE:
                i += n
                continue
            start = i
            i, nchars = _token_end(buf, i, end, classes)
            while start < i:  # one piece unless the token is longer than max_len
                piece_end = i
                if nchars > max_len:
                    piece_end = start
                    for _ in range(max_len):
                        piece_end += _decode(buf, piece_end)[1]
                nb = _lower_piece(buf, start, piece_end, lower, scratch)
                v = _lookup(scratch, scratch64, nb, state, slots, arena, pending, max_tokens, max_arena)
                if v == _FULL_CODE:
                    state[1], state[2] = doc_occ, doc_over
                    return d
                if v == _OVER_CODE:  # the caller resolves this occurrence from its bytes
                    overflow[n_over, 0] = start
                    overflow[n_over, 1] = piece_end
                    v = _PENDING - 1 - 2 * n_over
                    n_over += 1
                occ[n_occ] = v
                n_occ += 1
                start = piece_end
                nchars -= max_len
        occ_end[d] = n_occ
    state[1], state[2] = n_occ, n_over
    return bounds.size - 1


@njit(cache=True, nogil=True)
def _rehash(old, new, pending):
    """Move every token of slot table ``old`` into the empty, larger ``new``; pending slots follow."""
    mask = new.shape[0] - 1
    for s in range(old.shape[0]):
        where = old[s, _WHERE]
        if where == 0:
            continue
        t = _home(old[s, _W0], old[s, _W1], where & 0xFFFF, mask)
        while new[t, _WHERE] != 0:
            t = (t + 1) & mask
        new[t] = old[s]
        v = old[s, _VALUE]
        if v <= _PENDING and (_PENDING - v) % 2 == 0:
            pending[(_PENDING - v) // 2] = t


@njit(cache=True, nogil=True)
def _resolve(occ, slots, pending, new_values, overflow_values):
    """Store the caller's term ids of the new tokens in their slots and replace every pending code in occ."""
    for p in range(new_values.size):
        slots[pending[p], _VALUE] = new_values[p]
    out = np.empty(occ.size, dtype=np.int32)
    for i in range(occ.size):
        v = occ[i]
        if v > _PENDING:
            out[i] = v
        else:
            code = _PENDING - v
            out[i] = new_values[code // 2] if code % 2 == 0 else overflow_values[code // 2]
    return out


class TokenTable:
    """Distinct lower-cased tokens of a worker and their term ids: open addressing over 32-byte slots, grown by
    doubling up to ``max_tokens`` tokens and ``max_arena`` bytes of tokens; tokens beyond are resolved by the
    caller per occurrence."""

    def __init__(self, max_len: int, max_tokens: int = 4_000_000, max_arena: int = 128 << 20) -> None:
        self.max_len, self.max_tokens, self.max_arena = max_len, max_tokens, max_arena
        # tokens, occurrences in this call, overflow occurrences in this call, new tokens in this call, arena bytes
        self.state = np.zeros(5, dtype=np.int64)
        self.slots = np.zeros((1 << 16, 4), dtype=np.int64)
        self.arena = np.zeros(1 << 18, dtype=np.uint8)
        self.pending = np.zeros(1 << 14, dtype=np.int64)  # slot of each new token of this call

    def _grow(self) -> None:
        if 2 * (self.state[0] + 1) > self.slots.shape[0]:  # load at most 1/2
            slots = np.zeros((2 * self.slots.shape[0], 4), dtype=np.int64)
            _rehash(self.slots, slots, self.pending)
            self.slots = slots
        if self.state[4] + 4 * self.max_len > self.arena.size:
            self.arena = np.resize(self.arena, min(2 * self.arena.size, self.max_arena + 4 * self.max_len))
        if self.state[3] + 1 >= self.pending.size:
            self.pending = np.resize(self.pending, 2 * self.pending.size)

    def _new_tokens(self) -> list[str]:
        """The tokens inserted by the last scan, in pending order. They lie back to back at the end of the arena:
        decoded in one go, with a newline (never inside a token) put between them."""
        where = self.slots[self.pending[:self.state[3]], _WHERE]
        if not where.size:
            return []
        start = where[0] >> 16
        sizes = where & 0xFFFF
        text = np.insert(self.arena[start:start + sizes.sum()], np.cumsum(sizes[:-1]), ord("\n"))
        return text.tobytes().decode("utf-8").split("\n")

    def ids(self, buf: bytes, char_lens: np.ndarray, new_token: Callable[[str], int],
            overflow_token: Callable[[str], int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Term ids of the tokens of documents concatenated in ``buf`` (UTF-8, lone surrogates passed), with
        ``char_lens`` their lengths in code points: (term id per token occurrence, end of each document's
        occurrences, documents left to the caller's full path). ``new_token`` gives the term id of a token new to
        the table, ``overflow_token`` that of a token over the table's limits (it may keep its own cache)."""
        data = np.frombuffer(buf, dtype=np.uint8)
        bounds = doc_bounds(data, char_lens)
        n_docs = char_lens.size
        occ = np.empty(max(len(buf), 1), dtype=np.int64)
        overflow = np.empty((max(len(buf), 1), 2), dtype=np.int64)
        occ_end = np.empty(n_docs, dtype=np.int64)
        rejected = np.zeros(n_docs, dtype=np.bool_)
        self.state[1:4] = 0
        d = 0
        while True:
            d = _scan(data, bounds, d, self.max_len, CLASSES, LOWER, self.state, self.slots, self.arena,
                      self.pending, occ, occ_end, rejected, overflow, self.max_tokens, self.max_arena)
            if d == n_docs:
                break
            self._grow()
        new_values = np.array([new_token(t) for t in self._new_tokens()], dtype=np.int32)
        overflow_values = np.array([overflow_token(buf[s:e].decode("utf-8").lower())
                                    for s, e in overflow[:self.state[2]].tolist()], dtype=np.int32)
        return _resolve(occ[:self.state[1]], self.slots, self.pending, new_values, overflow_values), occ_end, rejected
