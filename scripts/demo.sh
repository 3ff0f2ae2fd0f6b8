#!/usr/bin/env bash
# The main job on the embedded default: set up, make a synthetic Wikipedia-like corpus, index it, serve it.
# Then open http://127.0.0.1:8080/ (or: curl -s localhost:8080/v1/search -H 'Content-Type: application/json' \
#   -d '{"query": "...", "k": 5}').
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DOCS=${DOCS:-200000}
mkdir -p work
if [ ! -f "work/synth-$DOCS.jsonl.gz" ]; then
  .venv/bin/ragserve corpus synth --docs "$DOCS" --out "work/synth-$DOCS.jsonl.gz"
fi
if [ ! -f "work/synth-$DOCS-index/manifest.json" ]; then
  .venv/bin/ragserve index "work/synth-$DOCS.jsonl.gz" --out "work/synth-$DOCS-index" --overwrite
fi
.venv/bin/ragserve info "work/synth-$DOCS-index"
exec .venv/bin/ragserve serve --index "work/synth-$DOCS-index" --port "${PORT:-8080}"
