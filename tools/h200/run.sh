#!/usr/bin/env bash
# One call on the H200 machine: bash tools/h200/run.sh N, with .carry/h200/p1 carried (README.md beside this).
# Keeps what the first call carried under /tmp/h200 (it stays while the machine is warm), installs the wheels
# once, then runs phase N's measurements into $OUT. Each step has its own time limit so that one that hangs does
# not cost the others; its log tail is kept in $OUT/phaseN.log.
set -u
N=${1:?phase 1-5}
export PYTHONUNBUFFERED=1
H=/tmp/h200
mkdir -p "$H/parts" "$H/site" "$OUT"
[ -d .carry/h200/p1 ] && cp -r .carry/h200/p1/. "$H/parts/"
cd "$H/parts"
for w in *.whl; do
  [ -f "$H/site/.$w" ] && continue
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$H/site" "$w" && touch "$H/site/.$w"
done
cd - > /dev/null
# The benchmarks read ../shared/data, which the device machine lacks: point it at the carried copy, and never
# touch one that exists (on the dev machine it is the real, shared one).
if [ -d "$H/parts/data" ] && [ ! -e ../shared/data ]; then mkdir -p ../shared && ln -s "$H/parts/data" ../shared/data; fi
export PYTHONPATH=$H/site:$PWD
if [ -n "${H200_DRY:-}" ]; then ls "$H/site" | grep -v '^\.' | tr '\n' ' '; echo; exit 0; fi  # the carry check only
S=../shared/data
W=/tmp/rag-scale
LOG=$OUT/phase$N.log
step() { local limit=$1; shift; echo "== $(date +%T) $*" | tee -a "$LOG"; timeout "$limit" "$@" 2>&1 | tail -40 | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/machine.txt"

case "$N" in
1)  # first, on a quiet host, the 7B-shaped decode step: the compiled step's graph (torch.compile, inductor:
    # its compile takes a minute or two) vs the eager step's graph vs engine eager vs transformers eager; then the
    # CUDA tests while the 21M synthetic layout and the reference index are built (kept in /tmp for call 2)
    step 280 python3 scripts/bench_generate.py --device cuda --out "$OUT/generate_h200.json"
    ( timeout 270 python3 scripts/bench_rag_scale.py --prepare --workdir $W --workers 16 \
        --out "$OUT/prepare.json" > "$OUT/prepare.log" 2>&1 ) &
    step 240 python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu tests
    wait
    tail -3 "$OUT/prepare.log" | tee -a "$LOG" ;;
2)  # RAG end to end at 21M passages: the 7B shapes as Gemma 3 networks on the fast engine (CUDA graph decode),
    # every method, cpu and gpu backends (fpga MODELLED from the cpu run), 10 questions a cell, served at 8 clients
    # (a fresh machine builds the layout first, ~1 min); then the CUDA tests (modules whose packages the image
    # lacks, e.g. openai, fail to collect and are reported, the rest run)
    step 370 python3 scripts/bench_rag_scale.py --workdir $W --arch gemma3 --engine fast --limit 10 --clients 8 \
        --deadline-s 390 --out "$OUT/rag_scale_fast_h200.json"
    step 80 python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu tests
    if [ -d .carry/layout ]; then  # a branch's tree carried beside (its CUDA tests before it merges)
      mkdir -p .carry/shared && ln -sfn "$H/parts/data" .carry/shared/data
      ( cd .carry/layout && PYTHONPATH=$H/site:$PWD step 75 python3 -m pytest -q -p no:cacheprovider \
          --continue-on-collection-errors -m gpu tests )
    fi ;;
3)  # what phase 2 left: the CUDA tests first (the gpu backend's, then the rest), then the methods it skipped
    step 110 python3 -m pytest -q -p no:cacheprovider -x -m gpu tests/test_gpu_backend.py
    step 370 python3 scripts/bench_rag_scale.py --workdir $W --arch gemma3 --engine fast --limit 10 --clients 8 \
        --methods dragin,two-stage,fixed-length,none --deadline-s 350 --out "$OUT/rag_scale_fast_h200_rest.json" ;;
4)  # phase 1 without the 21M layout, for a session with device time for one short call: the decode step, then
    # the CUDA tests
    step 320 python3 scripts/bench_generate.py --device cuda --out "$OUT/generate_h200.json"
    step 200 python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu tests ;;
5)  # the decode step alone (phase 4's first half)
    step 420 python3 scripts/bench_generate.py --device cuda --out "$OUT/generate_h200.json" ;;
*)  echo "phase must be 1-5" >&2; exit 2 ;;
esac
echo "== $(date +%T) phase $N done" | tee -a "$LOG"
