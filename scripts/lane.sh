#!/usr/bin/env bash
# Usage: scripts/lane.sh {legacy|latest} COMMAND [ARGS...]
# Runs COMMAND, in the current directory, inside the lane's virtualenv (.venv-<lane>
# in the repo), creating it and installing tpu_fc with the lane's TensorFlow on
# first use, every package pinned by constraints/<lane>.txt (refreshed by
# scripts/refresh_constraints.sh); a changed constraints file or setup.cfg
# reinstalls.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/lane.sh legacy|latest COMMAND [ARGS...]" >&2
  exit 2
fi
lane=$1
shift
case "$lane" in
  legacy|latest) ;;
  *) echo "unknown lane '$lane' (legacy or latest)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv-$lane"
constraints="$root/constraints/$lane.txt"
stamp=$(cat "$constraints" "$root/setup.cfg" | cksum)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
  python=$(command -v python3.11 || command -v python3)
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip -c "$constraints"
  "$venv/bin/python" -m pip install -q -c "$constraints" -e "$root[$lane,test]"
  echo "$stamp" > "$venv/.installed"
fi
export PATH="$venv/bin:$PATH"
if [ "$lane" = latest ]; then
  export TF_USE_LEGACY_KERAS=1   # tf-keras for feature-column layers; TF >= 2.16 only
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec "$@"
