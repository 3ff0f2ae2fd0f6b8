"""Read query sets (topics) and relevance judgments (qrels) in the formats IR toolkits ship them in.

Topics: anserini TSV (``id<TAB>text``), DPR/NQ-open TSV (``question<TAB>['answer', ...]``, ids = line numbers),
BEIR ``queries.jsonl`` and generic JSONL (``id``/``qid``/``_id`` + ``text``/``query``/``question``), and plain
text (one query per line, id = line number). Qrels: BEIR TSV (header ``query-id corpus-id score``) and TREC
(``qid 0 docid rel``). Any of them may be gzip-compressed (``.gz``).
"""
from __future__ import annotations

import ast
import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ID_KEYS = ("_id", "id", "qid", "query_id")
TEXT_KEYS = ("text", "query", "question")
ANSWER_KEYS = ("answers", "golden_answers")
FORMATS = ("auto", "tsv", "dpr-qas", "jsonl", "text")


class TopicsError(ValueError):
    """A malformed topics or qrels file; the message names the file and line."""


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    answers: tuple[str, ...] = ()  # gold answers where the file has them (NQ-open, FlashRAG JSONL)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); decoding errors become TopicsError with the line."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TopicsError(f"{path}:{no}: not UTF-8 ({e.reason} at byte {e.start})") from None
                if no == 1:
                    line = line.removeprefix("\ufeff")  # a UTF-8 BOM from Windows editors
                yield no, line.rstrip("\r\n")
    except FileNotFoundError:
        raise TopicsError(f"{path}: no such file") from None
    except (OSError, EOFError) as e:  # truncated or corrupt gzip
        raise TopicsError(f"{path}: cannot read: {e}") from None


def _detect(path: Path, first: str) -> str:
    name = path.name.removesuffix(".gz")
    if name.endswith((".jsonl", ".json")) or first.lstrip().startswith("{"):
        return "jsonl"
    if "\t" in first:
        second = first.split("\t", 1)[1].strip()
        return "dpr-qas" if second.startswith("[") and second.endswith("]") else "tsv"
    return "text"


def _parse_answers(field: str, where: str) -> tuple[str, ...]:
    try:
        value = ast.literal_eval(field)
    except (ValueError, SyntaxError):
        raise TopicsError(f"{where}: answers field is not a Python list literal: {field[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise TopicsError(f"{where}: answers field is not a list of strings: {field[:80]!r}")
    return tuple(value)


def _parse_jsonl(line: str, where: str) -> Query:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TopicsError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TopicsError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    qid = next((obj[k] for k in ID_KEYS if k in obj), None)
    text = next((obj[k] for k in TEXT_KEYS if k in obj), None)
    if qid is None or isinstance(qid, (dict, list, bool)):
        raise TopicsError(f"{where}: no query id (one of {', '.join(ID_KEYS)}) as a string or number")
    if not isinstance(text, str):
        raise TopicsError(f"{where}: no query text (one of {', '.join(TEXT_KEYS)}) as a string")
    answers = next((obj[k] for k in ANSWER_KEYS if k in obj), [])
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise TopicsError(f"{where}: answers must be a list of strings")
    return Query(str(qid), text.strip(), tuple(answers))


def read_queries(path: str | Path, fmt: str = "auto") -> list[Query]:
    """All queries of a topics file, in file order. ``fmt`` is one of FORMATS; ``auto`` looks at the name and
    the first non-blank line. Blank lines are skipped (in ``text`` format a query's id stays its line number)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise TopicsError(f"unknown topics format {fmt!r} (one of {', '.join(FORMATS)})")
    queries: list[Query] = []
    seen: dict[str, int] = {}
    for no, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        if fmt == "auto":
            fmt = _detect(path, line)
        if fmt == "jsonl":
            q = _parse_jsonl(line, where)
        elif fmt == "text":
            q = Query(str(no), line.strip())
        elif fmt == "dpr-qas":
            # csv handles the rows whose answer list is CSV-quoted ("" escapes), as NQ-open has.
            fields = next(csv.reader([line], delimiter="\t"))
            if len(fields) != 2:
                raise TopicsError(f"{where}: expected 'question<TAB>[answers]', got {len(fields)} fields")
            q = Query(str(len(queries) + 1), fields[0].strip(), _parse_answers(fields[1], where))
        else:
            qid, tab, text = line.partition("\t")
            if not tab:
                raise TopicsError(f"{where}: expected 'id<TAB>text', found no tab")
            if not qid.strip():
                raise TopicsError(f"{where}: empty query id")
            q = Query(qid.strip(), text.strip())
        if not q.text:
            raise TopicsError(f"{where}: empty query text for id {q.id!r}")
        if q.id in seen:
            raise TopicsError(f"{where}: duplicate query id {q.id!r} (first on line {seen[q.id]})")
        seen[q.id] = no
        queries.append(q)
    if not queries:
        raise TopicsError(f"{path}: no queries in file")
    return queries


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """qid -> {docid: relevance}. TREC lines have 4 fields (the second, the iteration, is ignored); BEIR lines
    have 3 and the file may start with a ``query-id corpus-id score`` header. The same judgment twice is
    accepted; two different grades for one (qid, docid) are an error."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    ncols = 0
    for no, line in _lines(path):
        fields = line.split()
        if not fields:
            continue
        where = f"{path}:{no}"
        if not ncols and len(fields) == 3 and fields[0].lower() in ("query-id", "query_id", "qid"):
            ncols = 3
            continue  # BEIR header
        if len(fields) not in (3, 4):
            raise TopicsError(f"{where}: expected 'qid 0 docid rel' or 'qid docid score', got {len(fields)} fields")
        if ncols and len(fields) != ncols:
            raise TopicsError(f"{where}: {len(fields)} fields where the file has {ncols}")
        ncols = len(fields)
        qid, docid, rel = (fields[0], fields[2], fields[3]) if ncols == 4 else fields
        try:
            grade = int(rel)
        except ValueError:
            try:
                as_float = float(rel)  # "1.0" from tools that write floats
            except ValueError:
                as_float = 0.5
            if not as_float.is_integer():
                raise TopicsError(f"{where}: relevance {rel!r} is not an integer") from None
            grade = int(as_float)
        judged = qrels.setdefault(qid, {})
        if judged.get(docid, grade) != grade:
            raise TopicsError(f"{where}: ({qid}, {docid}) judged {judged[docid]} earlier and {grade} here")
        judged[docid] = grade
    if not qrels:
        raise TopicsError(f"{path}: no judgments in file")
    return qrels
