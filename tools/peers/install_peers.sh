#!/usr/bin/env bash
# Install the peers that the project environment lacks into one folder, apart from it (their dependencies would
# otherwise change the project's): tantivy-py and PISA's C++ extension from the pyterrier-pisa wheel, with the
# libtbb.so.2 it links (pyterrier itself, which the wheel's Python part needs, is not installed: engines.py
# calls the extension directly). Then: export RAGSERVE_PEERS_SITE=DIR.
#   tools/peers/install_peers.sh DIR [PYTHON]
set -euo pipefail
dir=${1:?usage: install_peers.sh DIR [PYTHON]}
py=${2:-.venv/bin/python}
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip install -q --target "$dir" tantivy==0.27.0
"$py" -m pip download -q --no-deps -d "$tmp" pyterrier-pisa==0.4.9 tbb==2020.3.254
"$py" - "$tmp" "$dir" <<'EOF'
import sys, zipfile, pathlib
tmp, out = map(pathlib.Path, sys.argv[1:])
for whl in tmp.glob("*.whl"):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if base.startswith("_pisathon.") and base.endswith(".so") or base == "libtbb.so.2":
                (out / base).write_bytes(z.read(name))
EOF
ls "$dir"
