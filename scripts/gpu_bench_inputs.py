"""Inputs of ``scripts/bench_gpu.py`` from ../shared/data: three small indexes and the HotpotQA questions.

    python scripts/gpu_bench_inputs.py OUT_DIR

- ``OUT_DIR/idx/arguana``: BEIR ArguAna (title + text), default layout;
- ``OUT_DIR/idx/hotpot``: the HotpotQA dev (IRCoT, 500 questions) paragraphs, one document per distinct
  (title, paragraph_text), as the tests' ``hotpot_index`` fixture does, default layout;
- ``OUT_DIR/idx/ref``: those paragraphs + the DPR wiki18 passage sample + the WikiExtractor sample: the
  reference of real Wikipedia text whose document frequencies map real queries onto a synthetic vocabulary;
- ``OUT_DIR/topics/hotpot.questions.tsv``: ``question_id<TAB>question`` for the 500 questions.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.options import BuildOptions  # noqa: E402
from indexer.writer import build_index  # noqa: E402
from ragserve.rag.corpus import dataset_passages, write_corpus  # noqa: E402
from ragserve.rag.datasets import read_dataset  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def reference_inputs(paragraphs: Path, data: Path = DATA) -> list[Path]:
    """The reference corpus (real Wikipedia text): the HotpotQA paragraphs file plus the two Wikipedia samples
    of ``data`` (a copy of ../shared/data where that is not beside the checkout)."""
    return [paragraphs, data / "wiki18-100w-passages-sample" / "sample_data.jsonl",
            data / "enwiki-wikiextractor-json-sample" / "wiki_00"]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    (out / "topics").mkdir(parents=True, exist_ok=True)
    examples = read_dataset(DATA / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl")
    paragraphs = write_corpus(dataset_passages(examples), out / "hotpot_paragraphs.jsonl")
    with open(out / "topics" / "hotpot.questions.tsv", "w") as q:
        for ex in examples:
            q.write(f"{ex.id}\t{' '.join(ex.question.split())}\n")
    corpora = {
        "arguana": [DATA / "beir-arguana" / "corpus.jsonl.gz"],
        "hotpot": [paragraphs],
        "ref": reference_inputs(paragraphs),
    }
    for name, inputs in corpora.items():
        if not (out / "idx" / name).exists():
            m = build_index(inputs, out / "idx" / name, BuildOptions(progress=False))
            print(f"{name}: {m['stats']['num_docs']:,} docs, {m['stats']['num_postings']:,} postings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
