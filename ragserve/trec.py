"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document, as trec_eval reads them."""
from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Iterable, TextIO

import numpy as np


class RunError(ValueError):
    """A malformed run file or an unwritable result; the message names the file and line."""


def _check_token(value: str, what: str) -> None:
    # Fields are whitespace-separated, so a space inside one would shift every later column.
    if not value or any(c.isspace() for c in value):
        raise RunError(f"{what} {value!r} is empty or contains whitespace; TREC run fields cannot")


def format_score(score: float) -> str:
    """The shortest decimal that reads back as the same f32 (scores are f32 BM25 sums)."""
    if not math.isfinite(score):
        raise RunError(f"score {score!r} is not finite")
    return str(np.float32(score))


def write_run(f: TextIO, results: Iterable[tuple[str, list[tuple[str, float]]]], tag: str) -> int:
    """Write ranked results (best first) for each query; rank counts from 1. Returns the number of lines."""
    _check_token(tag, "run tag")
    lines = 0
    for qid, hits in results:
        _check_token(qid, "query id")
        seen: set[str] = set()
        out = []
        for rank, (docid, score) in enumerate(hits, 1):
            if docid in seen:
                raise RunError(f"query {qid}: document {docid!r} retrieved twice (trec_eval rejects duplicates)")
            seen.add(docid)
            _check_token(docid, "document id")
            out.append(f"{qid} Q0 {docid} {rank} {format_score(score)} {tag}\n")
        f.write("".join(out))
        lines += len(out)
    return lines


def read_run(path: str | Path) -> dict[str, list[tuple[str, float]]]:
    """qid -> [(docid, score)] in rank order. Queries keep their first-appearance order."""
    path = Path(path)
    ranked: dict[str, list[tuple[int, str, float]]] = {}
    docs: dict[str, dict[str, int]] = {}
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    continue
                where = f"{path}:{no}"
                if len(fields) != 6:
                    raise RunError(f"{where}: expected 'qid Q0 docid rank score tag', got {len(fields)} fields")
                qid, _, docid, rank_s, score_s, _ = fields
                try:
                    rank = int(rank_s)
                    score = float(score_s)
                except ValueError:
                    raise RunError(f"{where}: rank {rank_s!r} must be an integer and score {score_s!r} a number") from None
                if not math.isfinite(score):
                    raise RunError(f"{where}: score {score_s!r} is not finite")
                first = docs.setdefault(qid, {}).setdefault(docid, no)
                if first != no:
                    raise RunError(f"{where}: query {qid} retrieves {docid!r} twice (first on line {first})")
                ranked.setdefault(qid, []).append((rank, docid, score))
    except FileNotFoundError:
        raise RunError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise RunError(f"{path}: not UTF-8 ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise RunError(f"{path}: cannot read: {e}") from None
    if not ranked:
        raise RunError(f"{path}: empty run")
    run: dict[str, list[tuple[str, float]]] = {}
    for qid, rows in ranked.items():
        rows.sort(key=lambda r: r[0])  # stable: equal ranks keep file order
        run[qid] = [(docid, score) for _, docid, score in rows]
    return run
