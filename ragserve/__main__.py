"""``python -m ragserve``: the same entry point as the ``ragserve`` console script."""
import sys

from ragserve.cli import main

sys.exit(main())
