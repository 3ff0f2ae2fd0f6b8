#!/usr/bin/env bash
# One call on the H200 machine: bash tools/h200/run.sh N, with .carry/h200/pN carried (README.md beside this).
# Keeps what the calls carried under /tmp/h200 (it stays while the machine is warm), installs each wheel once all
# its parts have arrived, then runs phase N's measurements into $OUT. Each step has its own time limit so that
# one that hangs does not cost the others; its log tail is kept in $OUT/phaseN.log.
set -u
N=${1:?phase 1-4}
export PYTHONUNBUFFERED=1
H=/tmp/h200
mkdir -p "$H/parts" "$H/site" "$OUT"
cp -r .carry/h200/p"$N"/. "$H/parts/"
cd "$H/parts"
if [ -f parts.txt ]; then cp parts.txt "$H/"; fi
while read -r wheel n; do  # join a split wheel once every part is here
  [ -f "$wheel" ] && continue
  [ "$(ls "$wheel".* 2>/dev/null | wc -l)" -eq "$n" ] && cat "$wheel".* > "$wheel" && rm "$wheel".*
done < "$H/parts.txt"
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
LOG=$OUT/phase$N.log
step() { local limit=$1; shift; echo "== $(date +%T) $*" | tee -a "$LOG"; timeout "$limit" "$@" 2>&1 | tail -40 | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/machine.txt"

case "$N" in
1)  # the CUDA tests; the 21M synthetic layout (kept in /tmp for call 4); the search paths against the graph
    step 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests
    ( timeout 150 python3 scripts/gpu_bench_inputs.py /tmp/gbi > /dev/null 2>&1 ) &
    step 150 python3 scripts/synth_layout.py write /tmp/synth/dpr21m --docs 21000000 --workers 16
    wait
    step 60 python3 scripts/synth_layout.py queries /tmp/synth/dpr21m --reference /tmp/gbi/idx/ref --limit 2000 \
        --topics $S/msmarco-passage-queries/topics.msmarco-passage.dev-subset.txt --out /tmp/synth/msmarco.tsv
    for k in 10 1000; do
      step 80 python3 scripts/bench_search_paths.py --index /tmp/synth/dpr21m --queries /tmp/synth/msmarco.tsv \
          --backend gpu -k $k --n 300 --out "$OUT/paths_gpu_k$k.json"
    done ;;
2)  # sparse attention: the CUDA tests of the Triton kernels, then one decode step at 32K, 128K and 1M
    # (the tests compile ~100 Triton kernel variants; the bench starts nothing after 330 s and keeps its JSON)
    step 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_triton.py
    step 380 python3 scripts/bench_attention.py --time-limit 330 --out "$OUT/attention_h200.json" ;;
3)  # dense retrieval: embedding throughput, exact search at 1M and 21M, memory-bank recall; the 1M needle
    python3 -c "import all_minilm_l6_v2 as m; m.extract_model('$H/minilm')" 2>&1 | tail -2
    M=$(dirname "$(find "$H/minilm" -name modules.json | head -1)")
    step 300 python3 scripts/bench_dense.py --model "$M" --json "$OUT/bench_dense_h200.json"
    step 240 python3 scripts/memory_needle.py --model "$M" --tokens 1M --device cuda --backend gpu \
        --json "$OUT/memory_needle_1m_h200.json" ;;
4)  # Ray: 4 GPU-backed shard-group replicas on one GPU against one local gpu backend; then the HTTP server
    # under load on call 1's 21M index, one server process and four (serve --workers)
    step 240 python3 scripts/bench_distributed.py --backend gpu --replicas 4 --single 300 --batch-n 1000 \
        --deadline-s 150 --json "$OUT/distributed_gpu_arguana.json"
    for w in 1 4; do
      step 150 python3 scripts/load_test.py --index /tmp/synth/dpr21m --backend gpu --queries /tmp/synth/msmarco.tsv \
          --workers $w --procs 4 --clients 1 8 32 128 --duration 8 --warmup 2 --k 10 --out "$OUT/load_gpu_w$w.json"
    done ;;
*)  echo "phase must be 1-4" >&2; exit 2 ;;
esac
echo "== $(date +%T) phase $N done" | tee -a "$LOG"
