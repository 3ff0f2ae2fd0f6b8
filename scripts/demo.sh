#!/usr/bin/env bash
# The demo: set up (runtime dependencies only), index the Wikipedia sample in corpora/demo (real article text,
# CC BY-SA, see corpora/demo/SOURCE.md) with the MediaWiki reader, and serve it on http://127.0.0.1:8080/.
#   PORT=8081 bash scripts/demo.sh     another port
#   WORK=DIR                           where the index goes (default work/)
#   SKIP_SETUP=1                       use the .venv (or RAGSERVE) as it is
#   RAGSERVE=PATH                      the ragserve command to run (default .venv/bin/ragserve)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SKIP_SETUP:-}" ]; then
  bash scripts/setup.sh runtime
fi
RAGSERVE=${RAGSERVE:-.venv/bin/ragserve}
WORK=${WORK:-work}
INDEX="$WORK/demo-wikipedia"
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "demo: indexing corpora/demo (206 Wikipedia pages; the first run on a machine also compiles the" \
       "indexing kernels, about 35 s, cached in ~/.cache/ragserve for later runs)"
  "$RAGSERVE" index corpora/demo/*.xml*.bz2 --format mediawiki --out "$INDEX" --overwrite
fi
echo "demo: serving $INDEX; open http://127.0.0.1:${PORT:-8080}/ once /readyz says ready (the first start" \
     "compiles the search kernels, 13-85 s on a 2-core machine, by its load), or try:"
echo "  curl -s localhost:${PORT:-8080}/v1/search -H 'Content-Type: application/json' -d '{\"query\": \"theory of relativity\", \"k\": 3}'"
exec "$RAGSERVE" serve --index "$INDEX" --port "${PORT:-8080}"
