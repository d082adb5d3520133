#!/usr/bin/env bash
# Usage: [TPU_FC_PYTHON=X.Y] scripts/lane.sh {legacy|latest} COMMAND [ARGS...]
# Runs COMMAND, in the current directory, inside the lane's virtualenv (.venv-<lane>
# in the repo), creating it and installing tpu_fc with the lane's TensorFlow, the
# test tools and the benchmarks' matplotlib (the test and bench extras) on
# first use, every package pinned by constraints/<lane>.txt (refreshed by
# scripts/refresh_constraints.sh); a changed constraints file or setup.cfg
# reinstalls.  The lane runs on Python 3.11; TPU_FC_PYTHON=X.Y runs it on Python
# X.Y instead, in .venv-<lane>-pyX.Y pinned by constraints/<lane>-pyX.Y.txt
# (scripts/lane_python.sh).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: [TPU_FC_PYTHON=X.Y] scripts/lane.sh legacy|latest COMMAND [ARGS...]" >&2
  exit 2
fi
lane=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lane_python.sh"
choose_python "$lane" "${TPU_FC_PYTHON:-}" || exit 2
venv="$root/.venv-$lane$suffix"
constraints="$root/constraints/$lane$suffix.txt"
if [ ! -f "$constraints" ]; then
  version=${TPU_FC_PYTHON:-$REFERENCE_PYTHON}
  echo "no constraints/$lane$suffix.txt pins the $lane lane on Python $version;" \
    "TPU_FC_PYTHON=$version scripts/refresh_constraints.sh $lane writes it" >&2
  exit 2
fi
stamp=$(cat "$constraints" "$root/setup.cfg" | cksum)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip -c "$constraints"
  "$venv/bin/python" -m pip install -q -c "$constraints" -e "$root[$lane,test,bench]"
  echo "$stamp" > "$venv/.installed"
fi
export PATH="$venv/bin:$PATH"
if [ "$lane" = latest ]; then
  export TF_USE_LEGACY_KERAS=1   # tf-keras for feature-column layers; TF >= 2.16 only
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec "$@"
