"""Closed-corpus indexes: a dataset's own context paragraphs, deduplicated, written as a BEIR-style JSONL
corpus and indexed with ``indexer.writer.build_index`` (so HotpotQA dev can be run in the distractor setting)."""
from __future__ import annotations

import json
from pathlib import Path

from ragserve.rag.datasets import DatasetError, Example


def dataset_passages(examples: list[Example]) -> list[dict]:
    """Distinct (title, text) paragraphs of the examples in first-seen order, with ids ``p<n>``."""
    seen: dict[tuple[str, str], None] = {}
    for ex in examples:
        for p in ex.paragraphs:
            key = (p.title.strip(), " ".join(p.text.split()))
            if key[1]:
                seen.setdefault(key, None)
    return [{"_id": f"p{i}", "title": t, "text": x} for i, (t, x) in enumerate(seen)]


def write_corpus(passages: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in passages:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(p)
    return p


def build_dataset_index(examples: list[Example], out_dir: str | Path, corpus_path: str | Path | None = None,
                        overwrite: bool = False, workers: int = 0, progress: bool = False) -> dict:
    """Write the examples' paragraphs to ``corpus_path`` (default ``<out_dir>.corpus.jsonl``) and index them
    into ``out_dir``; returns the index manifest."""
    from indexer.options import BuildOptions
    from indexer.writer import build_index

    passages = dataset_passages(examples)
    if not passages:
        raise DatasetError("the dataset has no context paragraphs to index (it needs an external corpus)")
    out = Path(out_dir)
    corpus = write_corpus(passages, corpus_path or out.with_name(out.name + ".corpus.jsonl"))
    opts = BuildOptions(overwrite=overwrite, workers=workers, progress=progress)
    return build_index([corpus], out, opts, fmt="jsonl", on_error="fail", passage_words=0)
