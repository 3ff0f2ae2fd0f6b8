"""Needle-in-a-haystack inputs for memory as context: long documents made of real Wikipedia text (the shared
samples) with invented facts planted in them, and a question for each fact placed later in the stream.

Each fact is a sentence about invented names (so no Wikipedia paragraph already answers it), put at the start of
a paragraph; its question is a paragraph of its own further on. ``build_haystack`` returns the stream as
(title, text) documents in reading order and, for every fact, the document indexes of the fact and its question.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SYLLABLES = ("ka", "lo", "mer", "vin", "tas", "qu", "bra", "zel", "dor", "fi", "gan", "hol", "ix", "jor", "nu",
             "pel", "ros", "sul", "tem", "vo", "wyn", "yar", "zo", "cri", "phe", "thal", "mu", "ren", "sko", "bel")
COLORS = ("crimson", "amber", "violet", "teal", "ivory", "scarlet", "ochre", "cobalt", "jade", "silver")
ANIMALS = ("badger", "heron", "lynx", "tortoise", "falcon", "otter", "salamander", "ibex", "marten", "owl")
FOODS = ("soup", "pie", "stew", "bread", "pudding", "curry", "tart", "dumplings", "risotto", "porridge")
INGREDIENTS = ("walnuts", "figs", "onions", "lemons", "cloves", "eggs", "olives", "plums", "chestnuts", "leeks")
TOOLS = ("brass compass", "silver key", "glass flute", "copper lantern", "oak chessboard", "iron telescope")


@dataclass
class Fact:
    sentence: str
    question: str
    answer: str
    fact_doc: int = -1
    question_doc: int = -1


def _name(rng: random.Random, parts: int = 3) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def make_fact(rng: random.Random) -> Fact:
    person, place, other = _name(rng), _name(rng), _name(rng, 2)
    kind = rng.randrange(5)
    if kind == 0:
        word = _name(rng, 2).lower()
        return Fact(f"The secret password of the {place} cartographers' guild is {word}.",
                    f"What is the secret password of the {place} cartographers' guild?", word)
    if kind == 1:
        color, year = rng.choice(COLORS), rng.randrange(1700, 1990)
        return Fact(f"{person} {other} painted the {color} lighthouse of {place} in {year}.",
                    f"Who painted the {color} lighthouse of {place}?", f"{person} {other}")
    if kind == 2:
        animal = rng.choice(ANIMALS)
        return Fact(f"A tame {animal} called {other} lives in the cellar of {place} castle.",
                    f"Which animal lives in the cellar of {place} castle?", animal)
    if kind == 3:
        food, ing, n = rng.choice(FOODS), rng.choice(INGREDIENTS), rng.randrange(3, 19)
        return Fact(f"{person}'s famous {food} recipe from {place} needs exactly {n} {ing}.",
                    f"How many {ing} does {person}'s {food} recipe from {place} need?", str(n))
    tool = rng.choice(TOOLS)
    return Fact(f"{person} of {place} hid the {tool} under the third step of the old mill.",
                f"Where did {person} of {place} hide the {tool}?", "under the third step of the old mill")


def wikipedia_paragraphs(shared_data: Path) -> Iterator[tuple[str, str]]:
    """(title, paragraph) from the shared samples: WikiExtractor articles, DPR 100-word passages, then the
    MediaWiki XML dump (as plain text through the corpus reader), each paragraph once."""
    with open(shared_data / "enwiki-wikiextractor-json-sample" / "wiki_00", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            for para in rec["text"].split("\n\n")[1:]:
                if len(para.split()) >= 20:
                    yield rec["title"], para.strip()
    with open(shared_data / "wiki18-100w-passages-sample" / "sample_data.jsonl", encoding="utf-8") as f:
        for line in f:
            title, _, text = json.loads(line)["contents"].partition("\n")
            yield title.strip('"'), text.strip()
    from indexer.readers import iter_documents

    dump = shared_data / "enwiki-xml-dump-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    for doc in iter_documents([dump], fmt="mediawiki-xml", passage_words=150):
        if len(doc.text.split()) >= 20:
            yield doc.title, doc.text


def build_haystack(shared_data: Path, tokens: int, n_facts: int, tokenizer, seed: int = 0, repeat: bool = False
                   ) -> tuple[list[tuple[str, str]], list[Fact]]:
    """About ``tokens`` tokenizer tokens of Wikipedia paragraphs with ``n_facts`` facts planted and asked about.

    The shared samples hold about 958K tokens: beyond that ``repeat`` reads them again from the start (so some
    paragraphs occur twice, never with a fact in both), else ``ValueError``."""
    rng = random.Random(seed)
    paras: list[tuple[str, str]] = []
    total = 0
    source = wikipedia_paragraphs(shared_data)
    while total < tokens:
        batch = [p for _, p in zip(range(256), source)]
        if not batch and repeat and paras:
            source = wikipedia_paragraphs(shared_data)
            continue
        if not batch:
            raise ValueError(f"the shared Wikipedia samples hold only {total:,} tokens, not {tokens:,}")
        lens = [len(ids) for ids in tokenizer([t for _, t in batch], add_special_tokens=False, verbose=False)["input_ids"]]
        for p, n in zip(batch, lens):
            if total < tokens:
                paras.append(p)
                total += n
    facts = []
    names = set()
    while len(facts) < n_facts:
        f = make_fact(rng)
        if f.question not in names:
            names.add(f.question)
            facts.append(f)
    # Facts between 10% and 80% of the way in (never among the first few segments, where a recall of k would
    # hold everything), each question at least one paragraph after its fact.
    spots = rng.sample(range(int(len(paras) * 0.1), int(len(paras) * 0.8)), n_facts)
    asks = [rng.randrange(s + 1, len(paras)) for s in spots]
    plant = {s: f for s, f in zip(spots, facts)}
    ask: dict[int, list[Fact]] = {}
    for a, f in zip(asks, facts):
        ask.setdefault(a, []).append(f)
    docs: list[tuple[str, str]] = []
    for i, (title, text) in enumerate(paras):
        if i in plant:
            plant[i].fact_doc = len(docs)
            text = f"{plant[i].sentence} {text}"
        docs.append((title, text))
        for f in ask.get(i, []):
            f.question_doc = len(docs)
            docs.append(("question", f.question))
    return docs, facts
