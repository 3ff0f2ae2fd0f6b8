"""The RAG method names, importable without torch (the command line's choices)."""
METHOD_NAMES = ("none", "single", "fixed-sentence", "fixed-length", "flare", "dragin", "two-stage", "bridge")
# Evaluation only, never served: the gold supporting paragraphs in the prompt.
EVAL_METHOD_NAMES = (*METHOD_NAMES, "oracle")
