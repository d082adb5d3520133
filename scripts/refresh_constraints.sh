#!/usr/bin/env bash
# Usage: scripts/refresh_constraints.sh [legacy|latest ...]   (default: both lanes)
# Re-resolves each lane from setup.cfg's unpinned extras in a throw-away virtualenv
# and writes every installed package, transitive ones included, to
# constraints/<lane>.txt, which scripts/lane.sh installs from.  Run it to take
# newer releases (e.g. a TF 2.21.x patch), then run both lanes' tests
# (`bash .ci/run`) and commit the constraints files with the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lanes=("$@")
[ ${#lanes[@]} -eq 0 ] && lanes=(legacy latest)
python=$(command -v python3.11 || command -v python3)
for lane in "${lanes[@]}"; do
  case "$lane" in
    legacy|latest) ;;
    *) echo "unknown lane '$lane' (legacy or latest)" >&2; exit 2 ;;
  esac
  venv=$(mktemp -d)
  trap 'rm -rf "$venv"' EXIT
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$root[$lane,test]"
  {
    echo "# Every package of the $lane lane, pinned; written by scripts/refresh_constraints.sh."
    "$venv/bin/python" -m pip freeze --all | grep -iv '^tpu[-_]fc[= @]'
  } > "$root/constraints/$lane.txt"
  rm -rf "$venv"
  trap - EXIT
  echo "wrote constraints/$lane.txt ($(grep -vc '^#' "$root/constraints/$lane.txt") packages)"
done
