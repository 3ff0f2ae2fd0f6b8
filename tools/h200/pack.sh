#!/usr/bin/env bash
# Packs what the H200 machine lacks into one carry folder (a call carries 64 MiB): the small wheels pinned by
# requirements.lock for CPython 3.12, faiss, and the shared datasets the benchmarks and the CUDA tests read.
#   bash tools/h200/pack.sh            -> .carry/h200/p1 (git-ignored; README.md says how to call it)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.carry/h200
W=$OUT/wheels
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
rm -rf "$OUT/p1"
mkdir -p "$W" "$OUT/p1/data"
pin() { grep -i "^$1==" requirements.lock; }
PIP=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64
     --platform manylinux_2_28_x86_64 --python-version 3.12 -d "$W")
small=(flask waitress blinker itsdangerous pystemmer faiss-cpu)
for p in "${small[@]}"; do
  spec=$(pin "$p" || echo "$p")
  ls "$W" | grep -qi "^$(echo "$p" | tr - _)-" || "${PIP[@]}" "$spec"
  cp "$W"/$(ls "$W" | grep -i "^$(echo "$p" | tr - _)-") "$OUT/p1/"
done
for d in beir-arguana enwiki-wikiextractor-json-sample enwiki-xml-dump-sample hotpotqa-dev500-ircot \
         msmarco-passage-queries nq-open wiki18-100w-passages-sample; do
  cp -r "../shared/data/$d" "$OUT/p1/data/"
done
du -sh "$OUT/p1"
