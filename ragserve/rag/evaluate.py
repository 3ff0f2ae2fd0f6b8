"""Evaluation runs: answer every question, write one JSON line per question as it goes (a rerun skips the
ids already written, so an interrupted run resumes), and summarise quality, retrieval effort and where the
time went."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from ragserve.rag.base import RagMethod
from ragserve.rag.datasets import Example
from ragserve.rag.metrics import score_answer, support_recall
from ragserve.rag.trace import STAGES


class EvalError(ValueError):
    """The output file cannot be resumed (another run's results, or not JSON lines)."""


def load_done(out_path: str | Path, run: dict) -> dict[str, dict]:
    """Rows already in ``out_path`` by question id. A torn last line (the run was killed mid-write) is cut
    off the file; rows of a different method or dataset are an error rather than silently mixed."""
    p = Path(out_path)
    if not p.exists():
        return {}
    data = p.read_bytes()
    keep = data if data.endswith(b"\n") or not data else data[:data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with open(p, "r+b") as f:
            f.truncate(len(keep))
    done = {}
    for n, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalError(f"{p}:{n}: not a JSON line; not a ragserve eval output?") from e
        for key in ("method", "dataset"):
            if row.get(key) != run.get(key):
                raise EvalError(f"{p} holds results for {key} {row.get(key)!r}, not {run.get(key)!r}; "
                                "use another --out")
        done[row["id"]] = row
    return done


def make_row(ex: Example, answer: str, trace, seconds: float, run: dict, gold: bool = False) -> dict:
    """One question's JSON row; ``gold``: the gold paragraphs were given (the oracle), so nothing was retrieved
    and supporting-passage recall does not apply."""
    t = trace.to_dict()
    row = {"id": ex.id, **run, "question": ex.question, "answers": ex.answers, "prediction": answer,
           **score_answer(answer, ex.answers, ex.yes_no),
           "support_recall": None if gold else support_recall(trace.retrieved_titles(), ex.supporting),
           "retrievals": t["retrievals"], "tokens": t["tokens"], "times": t["times"], "seconds": seconds,
           "output": t["output"], "steps": t["steps"]}
    return row


def gold_context(ex: Example) -> list[tuple[str, str]]:
    """The question's gold supporting paragraphs as (title, text); an error for a dataset without them."""
    gold = ex.gold_paragraphs()
    if not gold:
        raise EvalError(f"question {ex.id} has no gold supporting paragraphs in the dataset (the oracle needs them)")
    return [(p.title, p.text) for p in gold]


def evaluate(examples: list[Example], method: RagMethod, out_path: str | Path, run: dict,
             on_row: Callable[[dict, bool], None] | None = None,
             context: Callable[[Example], list[tuple[str, str]]] | None = None) -> list[dict]:
    """Rows for ``examples`` in order: those already in ``out_path`` and new ones, appended and flushed one
    by one. ``on_row(row, resumed)`` is called for each. ``context(example)``, when given, is the long input
    each question is answered from (memory as context); a method with ``gold_context`` (the oracle) gets the
    question's gold paragraphs instead."""
    gold = getattr(method, "gold_context", False)
    if gold:
        context = gold_context
    p = Path(out_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    done = load_done(p, run)
    rows = []
    with open(p, "a", encoding="utf-8") as f:
        for ex in examples:
            if ex.id in done:
                row, resumed = done[ex.id], True
            else:
                t0 = time.perf_counter()
                answer, trace = method.answer(ex.question, context(ex) if context else None)
                row, resumed = make_row(ex, answer, trace, time.perf_counter() - t0, run, gold), False
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
            rows.append(row)
            if on_row:
                on_row(row, resumed)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Means of the answer metrics (percent), supporting-passage recall, retrievals and tokens per question,
    seconds per stage and each stage's share of their sum. ``retrieval_share`` is the share of the three
    memory-access stages (prepare + relevancy + retrieval) against generation (apply)."""
    n = len(rows)
    out: dict = {"questions": n}
    if not n:
        return out
    for key in ("em", "f1", "precision", "recall"):
        out[key] = 100.0 * sum(r[key] for r in rows) / n
    sup = [r["support_recall"] for r in rows if r.get("support_recall") is not None]
    out["support_recall"] = 100.0 * sum(sup) / len(sup) if sup else None
    out["retrievals_per_question"] = sum(r["retrievals"] for r in rows) / n
    out["tokens_per_question"] = sum(r["tokens"] for r in rows) / n
    out["seconds"] = sum(r["seconds"] for r in rows)
    out["seconds_per_question"] = out["seconds"] / n
    stages = {s: sum(r["times"][s] for r in rows) for s in STAGES}
    total = sum(stages.values())
    out["stage_seconds"] = stages
    out["stage_shares"] = {s: (v / total if total else 0.0) for s, v in stages.items()}
    out["retrieval_share"] = (total - stages["apply"]) / total if total else 0.0
    return out


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))


def format_summary(label: str, s: dict) -> str:
    """A two-line text table of one run's summary."""
    if not s.get("questions"):
        return f"{label}: no questions"
    head = ["method", "n", "EM", "F1", "P", "R", "SupR", "ret/q", "tok/q", "s/q", "prep%", "rel%", "retr%",
            "apply%", "retrieval share%"]
    sh = s["stage_shares"]
    vals = [label, str(s["questions"]), _fmt(s["em"], True), _fmt(s["f1"], True), _fmt(s["precision"], True),
            _fmt(s["recall"], True), _fmt(s["support_recall"], True), _fmt(s["retrievals_per_question"]),
            _fmt(s["tokens_per_question"]), f"{s['seconds_per_question']:.3f}",
            *(f"{100 * sh[k]:.1f}" for k in STAGES), f"{100 * s['retrieval_share']:.1f}"]
    widths = [max(len(h), len(v)) for h, v in zip(head, vals)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in (head, vals))
