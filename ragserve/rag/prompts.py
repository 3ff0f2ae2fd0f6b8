"""Few-shot chain-of-thought prompts: exemplar files, numbered passages, the question and the answer so far."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragserve.rag.text import has_answer
from ragserve.retrieval.contract import Hit

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"

# Default exemplar file per dataset format.
DEFAULT_EXEMPLARS = {
    "hotpotqa": "multihop.txt", "hotpotqa-ircot": "multihop.txt", "2wiki": "multihop.txt",
    "musique": "multihop.txt", "iirc": "multihop.txt", "strategyqa": "strategyqa.txt", "nq-open": "nq.txt",
}

INSTRUCTION = ('Answer the question by reasoning step by step, then finish with "So the answer is" followed by '
               "the answer.")
YES_NO_INSTRUCTION = ('Answer the question by reasoning step by step, then finish with "So the answer is yes." or '
                      '"So the answer is no."')
CONTEXT_NOTE = "Answer in the same format as before, using the passages above where they help."


class PromptError(ValueError):
    """A malformed exemplar file."""


@dataclass(frozen=True)
class Exemplar:
    question: str
    answer: str


def parse_exemplars(text: str, source: str = "<text>") -> list[Exemplar]:
    """Blocks separated by blank lines, each a ``Question:`` line then an ``Answer:`` line ending in
    "So the answer is ..."; ``#`` lines are comments."""
    out = []
    blocks = [b for b in "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")).split("\n\n")]
    for block in blocks:
        lines = [l.strip() for l in block.strip().splitlines() if l.strip()]
        if not lines:
            continue
        if len(lines) != 2 or not lines[0].startswith("Question:") or not lines[1].startswith("Answer:"):
            raise PromptError(f"{source}: each exemplar must be a 'Question:' line then an 'Answer:' line; "
                              f"got {lines[0][:60]!r}")
        q, a = lines[0][len("Question:"):].strip(), lines[1][len("Answer:"):].strip()
        if not q or not has_answer(a):
            raise PromptError(f"{source}: exemplar {q[:60]!r} needs a question and an answer with 'the answer is'")
        out.append(Exemplar(q, a))
    if not out:
        raise PromptError(f"{source}: no exemplars found")
    return out


def load_exemplars(path_or_name: str | Path) -> list[Exemplar]:
    """Exemplars from a file path, or from a file shipped in ``ragserve/prompts`` by name."""
    p = Path(path_or_name)
    if not p.exists():
        p = PROMPTS_DIR / str(path_or_name)
    if not p.is_file():
        raise PromptError(f"exemplar file {path_or_name!r} not found")
    return parse_exemplars(p.read_text(encoding="utf-8"), str(p))


class PromptBuilder:
    def __init__(self, exemplars: list[Exemplar], yes_no: bool = False, fewshot: int | None = None,
                 passage_words: int = 150) -> None:
        if fewshot is not None and fewshot < 0:
            raise PromptError("fewshot must be >= 0")
        if passage_words < 1:
            raise PromptError("passage_words must be >= 1")
        self.exemplars = exemplars[:fewshot] if fewshot is not None else exemplars
        self.instruction = YES_NO_INSTRUCTION if yes_no else INSTRUCTION
        self.passage_words = passage_words
        self._head = self.instruction + "\n\n" + "".join(
            f"Question: {e.question}\nAnswer: {e.answer}\n\n" for e in self.exemplars)

    def passage(self, hit: Hit) -> str:
        words = hit.text.split()
        text = " ".join(words[:self.passage_words]) + (" ..." if len(words) > self.passage_words else "")
        return f"{hit.title}: {text}" if hit.title else text

    def build(self, question: str, answer_so_far: str = "", passages: list[Hit] = ()) -> str:
        """Exemplars, then the numbered passages (if any), then the question and the answer so far; the
        model continues the last line."""
        parts = [self._head]
        if passages:
            parts.append("Context:\n" + "".join(f"[{i}] {self.passage(h)}\n" for i, h in enumerate(passages, 1)))
            parts.append(CONTEXT_NOTE + "\n")
        parts.append(f"Question: {question.strip()}\nAnswer:")
        if answer_so_far.strip():
            parts.append(" " + answer_so_far.strip())
        return "".join(parts)
