"""Few-shot prompts: exemplar files, numbered passages, the question and the answer so far.

Two styles, told apart by the exemplars: chain of thought (every answer ends "So the answer is ...", for models
that can reason, as DRAGIN prompts Llama 2) and direct (every answer is the short answer alone, the whole line,
for small base models such as gemma-3-270m: the prediction is the first generated line)."""
from __future__ import annotations

import re
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
DIRECT_INSTRUCTION = "Answer the question with a short answer on one line."
YES_NO_DIRECT_INSTRUCTION = 'Answer the question with "yes" or "no".'


class PromptError(ValueError):
    """A malformed exemplar file."""


@dataclass(frozen=True)
class Exemplar:
    question: str
    answer: str
    context: tuple[str, ...] = ()  # passages shown with the exemplar ("title: text"), as the question's will be


def parse_exemplars(text: str, source: str = "<text>") -> list[Exemplar]:
    """Blocks separated by blank lines, each optionally a ``Context:`` line and passage lines (``[1] title:
    text``), then a ``Question:`` line and an ``Answer:`` line; either every answer ends in "So the answer is ..."
    (chain of thought) or none has it (direct answers); ``#`` lines are comments."""
    out = []
    blocks = [b for b in "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")).split("\n\n")]
    for block in blocks:
        lines = [l.strip() for l in block.strip().splitlines() if l.strip()]
        if not lines:
            continue
        context: list[str] = []
        if lines[0] == "Context:":
            context = [re.sub(r"^\[\d+\]\s*", "", l) for l in lines[1:-2]]
            lines = lines[-2:]
            if not context:
                raise PromptError(f"{source}: a 'Context:' line needs passage lines after it")
        if len(lines) != 2 or not lines[0].startswith("Question:") or not lines[1].startswith("Answer:"):
            raise PromptError(f"{source}: each exemplar must be a 'Question:' line then an 'Answer:' line; "
                              f"got {lines[0][:60]!r}")
        q, a = lines[0][len("Question:"):].strip(), lines[1][len("Answer:"):].strip()
        if not q or not a:
            raise PromptError(f"{source}: exemplar {q[:60]!r} needs a question and an answer")
        out.append(Exemplar(q, a, tuple(context)))
    if not out:
        raise PromptError(f"{source}: no exemplars found")
    if len({has_answer(e.answer) for e in out}) > 1:
        raise PromptError(f"{source}: mixes chain-of-thought answers ('So the answer is ...') with direct ones; "
                          "use one style")
    return out


def is_direct(exemplars: list[Exemplar]) -> bool:
    """Direct-answer exemplars: no answer reasons up to "the answer is"."""
    return not any(has_answer(e.answer) for e in exemplars)


class Exemplars(list):
    """A list of exemplars that remembers the file it was read from."""
    source: str = "<text>"


def load_exemplars(path_or_name: str | Path) -> list[Exemplar]:
    """Exemplars from a file path, or from a file shipped in ``ragserve/prompts`` by name."""
    p = Path(path_or_name)
    if not p.exists():
        p = PROMPTS_DIR / str(path_or_name)
    if not p.is_file():
        raise PromptError(f"exemplar file {path_or_name!r} not found")
    out = Exemplars(parse_exemplars(p.read_text(encoding="utf-8"), str(p)))
    out.source = p.name
    return out


class PromptBuilder:
    def __init__(self, exemplars: list[Exemplar], yes_no: bool = False, fewshot: int | None = None,
                 passage_words: int = 150) -> None:
        if fewshot is not None and fewshot < 0:
            raise PromptError("fewshot must be >= 0")
        if passage_words < 1:
            raise PromptError("passage_words must be >= 1")
        self.exemplars = exemplars[:fewshot] if fewshot is not None else exemplars
        self.source = getattr(exemplars, "source", "<text>")
        # the style is the whole file's, also when fewshot=0 leaves no exemplar to show
        self.direct = is_direct(exemplars)
        if self.direct:
            self.instruction = YES_NO_DIRECT_INSTRUCTION if yes_no else DIRECT_INSTRUCTION
        else:
            self.instruction = YES_NO_INSTRUCTION if yes_no else INSTRUCTION
        self.passage_words = passage_words
        self._head = self.instruction + "\n\n" + "".join(
            self._context(e.context) + f"Question: {e.question}\nAnswer: {e.answer}\n\n" for e in self.exemplars)
        # exemplars shown with their passages teach the layout itself: no note is needed before the question
        self._note = "" if any(e.context for e in self.exemplars) else CONTEXT_NOTE + "\n"

    @staticmethod
    def _context(passages) -> str:
        return "Context:\n" + "".join(f"[{i}] {p}\n" for i, p in enumerate(passages, 1)) if passages else ""

    def passage(self, hit: Hit) -> str:
        words = hit.text.split()
        text = " ".join(words[:self.passage_words]) + (" ..." if len(words) > self.passage_words else "")
        return f"{hit.title}: {text}" if hit.title else text

    def build(self, question: str, answer_so_far: str = "", passages: list[Hit] = ()) -> str:
        """Exemplars, then the numbered passages (if any), then the question and the answer so far; the
        model continues the last line."""
        parts = [self._head]
        if passages:
            parts.append(self._context([self.passage(h) for h in passages]) + self._note)
        parts.append(f"Question: {question.strip()}\nAnswer:")
        if answer_so_far.strip():
            parts.append(" " + answer_so_far.strip())
        return "".join(parts)
