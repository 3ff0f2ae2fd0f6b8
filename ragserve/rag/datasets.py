"""Question-answering datasets in their native formats, read into one ``Example`` shape.

Formats: ``hotpotqa`` (original JSON), ``hotpotqa-ircot`` (IRCoT's processed JSONL), ``2wiki``
(2WikiMultihopQA JSON, aliases from ``id_aliases.json`` beside it), ``strategyqa`` (JSON, yes/no), ``iirc``
(IIRC JSON, unanswerable questions skipped), ``nq-open`` (DPR TSV: question, python-list of answers; or JSON
records with ``question`` and ``answer`` / ``golden_answers`` as NQ-open and FlashRAG publish them) and
``musique`` (JSONL, unanswerable questions skipped).

Every JSON format is read from JSON lines or from one JSON array alike, whichever its native form: re-packaged
copies swap them (HippoRAG and KAG ship MuSiQue, HotpotQA and 2Wiki as arrays).
"""
from __future__ import annotations

import ast
import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

FORMATS = ("hotpotqa", "hotpotqa-ircot", "2wiki", "strategyqa", "iirc", "nq-open", "musique")


class DatasetError(ValueError):
    """A dataset file that cannot be read as the stated format."""


@dataclass
class Paragraph:
    title: str
    text: str


@dataclass
class Example:
    id: str
    question: str
    answers: list[str]  # gold answer first, then aliases
    supporting: list[str] = field(default_factory=list)  # titles of the supporting passages
    paragraphs: list[Paragraph] = field(default_factory=list)  # the question's own context passages
    yes_no: bool = False

    def gold_paragraphs(self) -> list[Paragraph]:
        """The supporting paragraphs among the question's own, in their order (an untitled one, a StrategyQA
        fact, is matched by its text)."""
        gold = {" ".join(s.casefold().split()) for s in self.supporting}
        return [p for p in self.paragraphs if " ".join((p.title or p.text).casefold().split()) in gold]


def _load_json(path: Path):
    try:
        with open(path, encoding="utf-8-sig") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from e


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{n}: not valid JSON ({e})") from e


def _need(rec: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in rec]
    if missing:
        raise DatasetError(f"{where}: missing field(s) {', '.join(missing)}")


def _unique(items) -> list[str]:
    out = []
    for x in items:
        x = str(x).strip()
        if x and x not in out:
            out.append(x)
    return out


def _first_char(path: Path) -> str:
    """The first character that is not whitespace (or a byte-order mark), "" for a blank file."""
    with open(path, encoding="utf-8") as f:
        while chunk := f.read(4096):
            rest = chunk.lstrip("\ufeff \t\r\n")
            if rest:
                return rest[0]
    return ""


def _records(path: Path, what: str) -> Iterator[tuple[str, dict]]:
    """(where, record) for each record of a file of JSON lines or of one JSON array of ``what``; ``where``
    names the record in messages (``file:line`` or ``file[index]``)."""
    if _first_char(path) != "[":
        for n, r in _jsonl(path):
            yield f"{path}:{n}", r
        return
    data = _load_json(path)
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON array of {what}")
    for i, r in enumerate(data):
        yield f"{path}[{i}]", r


def _read_hotpotqa(path: Path) -> Iterator[Example]:
    for where, r in _records(path, "questions"):
        _need(r, ("_id", "question", "answer", "context"), where)
        paras = [Paragraph(t, "".join(sents)) for t, sents in r["context"]]
        yield Example(str(r["_id"]), r["question"], [str(r["answer"])],
                      _unique(t for t, _ in r.get("supporting_facts", [])), paras)


def _read_hotpotqa_ircot(path: Path) -> Iterator[Example]:
    for where, r in _records(path, "questions"):
        _need(r, ("question_id", "question_text", "answers_objects", "contexts"), where)
        answers = _unique(s for obj in r["answers_objects"] for s in obj.get("spans", []))
        paras = [Paragraph(c["title"], c["paragraph_text"]) for c in r["contexts"]]
        yield Example(str(r["question_id"]), r["question_text"], answers,
                      _unique(c["title"] for c in r["contexts"] if c.get("is_supporting")), paras)


def _read_2wiki(path: Path) -> Iterator[Example]:
    aliases: dict[str, list[str]] = {}
    alias_file = path.parent / "id_aliases.json"
    if alias_file.exists():
        for _, rec in _records(alias_file, "aliases"):
            aliases[rec["Q_id"]] = list(rec.get("aliases", [])) + list(rec.get("demonyms", []))
    for where, r in _records(path, "questions"):
        _need(r, ("_id", "question", "answer", "context"), where)
        extra = aliases.get(r.get("answer_id") or "", [])
        paras = [Paragraph(t, " ".join(s.strip() for s in sents)) for t, sents in r["context"]]
        yield Example(str(r["_id"]), r["question"], _unique([r["answer"], *extra]),
                      _unique(t for t, _ in r.get("supporting_facts", [])), paras)


def _read_strategyqa(path: Path) -> Iterator[Example]:
    for where, r in _records(path, "questions"):
        _need(r, ("qid", "question", "answer"), where)
        if not isinstance(r["answer"], bool):
            raise DatasetError(f"{where}: answer must be true or false")
        # the facts are the question's own paragraphs (untitled, one sentence each) and its supporting ones: the
        # closed corpus of all facts is how DRAGIN's StrategyQA setting is run here
        facts = _unique(" ".join(str(f).split()) for f in r.get("facts", []))
        yield Example(str(r["qid"]), r["question"], ["yes" if r["answer"] else "no"], facts,
                      [Paragraph("", f) for f in facts], yes_no=True)


def _iirc_answers(ans: dict) -> list[str]:
    kind = ans.get("type")
    if kind in ("value", "binary"):
        value = str(ans.get("answer_value", "")).strip()
        unit = str(ans.get("answer_unit") or "").strip()
        return _unique([value, f"{value} {unit}" if unit else ""])
    if kind == "span":
        return _unique(s["text"] for s in ans.get("answer_spans", []))
    return []


def _read_iirc(path: Path) -> Iterator[Example]:
    for where, passage in _records(path, "passages"):
        _need(passage, ("title", "questions"), where)
        main = passage["title"]
        for q in passage["questions"]:
            _need(q, ("qid", "question", "answer"), f"{where} question")
            answers = _iirc_answers(q["answer"])
            if not answers:  # "none": unanswerable from the linked articles
                continue
            ctx = q.get("context", [])
            titles = [main if c["passage"] == "main" else c["passage"] for c in ctx]
            paras = [Paragraph(t, c["text"]) for t, c in zip(titles, ctx)]
            if passage.get("text"):
                paras.insert(0, Paragraph(main, passage["text"]))
            yield Example(str(q["qid"]), q["question"], answers, _unique(titles), paras,
                          yes_no=q["answer"].get("type") == "binary")


def _read_nq_open(path: Path) -> Iterator[Example]:
    if _first_char(path) in ("{", "["):
        yield from _read_nq_open_json(path)
        return
    with open(path, encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if not row:
                continue
            if len(row) != 2:
                raise DatasetError(f"{path}:{n}: expected 'question<TAB>[answers]'")
            try:
                answers = ast.literal_eval(row[1])
            except (ValueError, SyntaxError) as e:
                raise DatasetError(f"{path}:{n}: answers are not a python list literal") from e
            if not isinstance(answers, list) or not answers:
                raise DatasetError(f"{path}:{n}: answers must be a non-empty list")
            yield Example(f"{path.stem}-{n - 1}", row[0], _unique(answers))


NQ_ANSWER_FIELDS = ("answer", "answers", "golden_answers")  # NQ-open, DPR's JSON, FlashRAG


def _read_nq_open_json(path: Path) -> Iterator[Example]:
    for i, (where, r) in enumerate(_records(path, "questions")):
        _need(r, ("question",), where)
        key = next((k for k in NQ_ANSWER_FIELDS if k in r), None)
        answers = r.get(key) if key else None
        if not isinstance(answers, list) or not answers:
            raise DatasetError(f"{where}: answers ({' or '.join(NQ_ANSWER_FIELDS)}) must be a non-empty list")
        yield Example(str(r.get("id", f"{path.stem}-{i}")), r["question"], _unique(answers))


def _read_musique(path: Path) -> Iterator[Example]:
    for where, r in _records(path, "questions"):
        _need(r, ("id", "question", "answer", "paragraphs"), where)
        if r.get("answerable") is False:
            continue
        paras = [Paragraph(p["title"], p["paragraph_text"]) for p in r["paragraphs"]]
        yield Example(str(r["id"]), r["question"], _unique([r["answer"], *r.get("answer_aliases", [])]),
                      _unique(p["title"] for p in r["paragraphs"] if p.get("is_supporting")), paras)


_READERS: dict[str, Callable[[Path], Iterator[Example]]] = {
    "hotpotqa": _read_hotpotqa, "hotpotqa-ircot": _read_hotpotqa_ircot, "2wiki": _read_2wiki,
    "strategyqa": _read_strategyqa, "iirc": _read_iirc, "nq-open": _read_nq_open, "musique": _read_musique,
}


def _format_of_record(rec: dict) -> str | None:
    """The format whose records have ``rec``'s keys (2Wiki's before HotpotQA's, which are a subset)."""
    if "question_text" in rec:
        return "hotpotqa-ircot"
    if "paragraphs" in rec:
        return "musique"
    if "questions" in rec:
        return "iirc"
    if "qid" in rec and "facts" in rec or isinstance(rec.get("answer"), bool):
        return "strategyqa"
    if "evidences" in rec or rec.get("type") in ("compositional", "inference", "bridge_comparison"):
        return "2wiki"
    if "supporting_facts" in rec:
        return "hotpotqa"
    if "question" in rec and any(k in rec for k in NQ_ANSWER_FIELDS):
        return "nq-open"
    return None


def sniff_format(path: str | Path) -> str:
    """Guess the format from the file's first record (JSON lines or a JSON array alike), else a TSV line."""
    p = Path(path)
    first = _first_char(p)
    rec = None
    if first == "[":
        data = _load_json(p)
        rec = data[0] if isinstance(data, list) and data else None
    elif first == "{":
        try:
            rec = next(_jsonl(p))[1]
        except (DatasetError, StopIteration) as e:
            raise DatasetError(f"{p}: cannot tell the format (first line is not a JSON object)") from e
    else:
        with open(p, encoding="utf-8") as f:
            if "\t" in f.readline():
                return "nq-open"
    fmt = _format_of_record(rec) if isinstance(rec, dict) else None
    if fmt is None:
        raise DatasetError(f"{p}: cannot tell the dataset format; pass --format ({', '.join(FORMATS)})")
    return fmt


def read_dataset(path: str | Path, fmt: str = "auto", limit: int | None = None) -> list[Example]:
    """Examples of a dataset file in file order (the first ``limit`` of them)."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file {p} not found")
    if fmt == "auto":
        fmt = sniff_format(p)
    if fmt not in _READERS:
        raise DatasetError(f"unknown dataset format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise DatasetError("limit must be >= 0")
    out = []
    try:
        for ex in _READERS[fmt](p):
            if limit is not None and len(out) >= limit:
                break
            if not ex.question.strip() or not ex.answers:
                raise DatasetError(f"{p}: question {ex.id!r} has no text or no answer")
            out.append(ex)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{p}: not a {fmt} file ({type(e).__name__}: {e})") from e
    return out
