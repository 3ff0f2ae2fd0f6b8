"""The registered method names, importable without torch (the command line and the server's validation use them)."""
METHOD_NAMES = ("dense", "dsa", "quest", "lserve", "seer-topk", "seer-threshold")
