#!/usr/bin/env bash
# Usage: [TPU_FC_PYTHON=X.Y] scripts/refresh_constraints.sh [legacy|latest ...]
# Re-resolves each lane from setup.cfg's unpinned extras in a throw-away virtualenv
# and writes every installed package, transitive ones included, to
# constraints/<lane>.txt, which scripts/lane.sh installs from; with TPU_FC_PYTHON=X.Y,
# on Python X.Y to constraints/<lane>-pyX.Y.txt (scripts/lane_python.sh).  Without
# arguments or TPU_FC_PYTHON it rewrites every constraints file there is, each on its
# own Python (keeping, with a note, one whose Python this machine lacks).  Run it to
# take newer releases (e.g. a TF 2.21.x patch), then run the lanes' tests
# (`bash .ci/run`) and commit the constraints files with the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lane_python.sh"

# Re-resolves lane $1 on Python $2 (X.Y, or empty for the reference Python).
refresh() {
  local lane=$1 version=$2 venv file
  choose_python "$lane" "$version" || return
  file=constraints/$lane$suffix.txt
  venv=$(mktemp -d)
  trap 'rm -rf "$venv"' EXIT
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$root[$lane,test,bench]"
  {
    echo "# Every package of the $lane lane${suffix:+ on Python $version}, pinned;" \
      "written by scripts/refresh_constraints.sh."
    "$venv/bin/python" -m pip freeze --all | grep -iv '^tpu[-_]fc[= @]'
  } > "$root/$file"
  rm -rf "$venv"
  trap - EXIT
  echo "wrote $file ($(grep -vc '^#' "$root/$file") packages)"
}

if [ $# -eq 0 ] && [ -z "${TPU_FC_PYTHON:-}" ]; then
  for file in "$root"/constraints/*.txt; do
    name=$(basename "$file" .txt)   # legacy, latest, latest-py3.13, ...
    lane=${name%%-py*}
    version=${name#"$lane"}
    version=${version#-py}
    if [ -n "$version" ] && ! find_python "$version" > /dev/null; then
      echo "kept constraints/$name.txt: no Python $version here" >&2
      continue
    fi
    refresh "$lane" "$version"
  done
else
  lanes=("$@")
  [ ${#lanes[@]} -eq 0 ] && lanes=(legacy latest)
  for lane in "${lanes[@]}"; do
    refresh "$lane" "${TPU_FC_PYTHON:-}"
  done
fi
