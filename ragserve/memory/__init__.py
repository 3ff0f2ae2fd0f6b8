"""Memory as context: a bank of segment embeddings (``bank``) and reading a long input through it (``reader``)."""
