# Sourced by scripts/lane.sh, scripts/refresh_constraints.sh and .ci/run: which Python a
# lane runs on and the name suffix of that (lane, Python)'s virtualenv and constraints
# file.  Without a version, the lanes' reference Python 3.11 (python3 where there is no
# python3.11): .venv-<lane>, constraints/<lane>.txt.  With X.Y (TPU_FC_PYTHON=X.Y):
# python X.Y, from PATH or pyenv; .venv-<lane>-pyX.Y, constraints/<lane>-pyX.Y.txt
# (3.11 keeps the reference names).

REFERENCE_PYTHON=3.11

# The Pythons lane $1's TensorFlow has wheels for, oldest first.
lane_pythons() {
  case "$1" in
    legacy) echo "3.9 3.10 3.11" ;;      # TF 2.15.1
    latest) echo "3.10 3.11 3.12 3.13" ;; # TF 2.21
    *) echo "unknown lane '$1' (legacy or latest)" >&2; return 2 ;;
  esac
}

# Prints the path of a Python $1 (X.Y) that runs: pythonX.Y on PATH, else pyenv's X.Y
# (a pyenv shim runs only the versions pyenv selects).
find_python() {
  local probe='import sys; print(sys.executable)'
  "python$1" -c "$probe" 2>/dev/null || PYENV_VERSION=$1 "python$1" -c "$probe" 2>/dev/null
}

# Sets `python` and `suffix` for lane $1 on Python $2 (X.Y, or empty for the reference
# Python); says why not on stderr and returns non-zero if the lane or Python is not there.
choose_python() {
  local lane=$1 version=$2 supported
  supported=$(lane_pythons "$lane") || return
  if [ -z "$version" ]; then
    python=$(command -v python3.11 || command -v python3)
    suffix=
    return
  fi
  if [[ " $supported " != *" $version "* ]]; then
    echo "the $lane lane runs on Python ${supported// /, }, not $version" >&2
    return 2
  fi
  if ! python=$(find_python "$version"); then
    echo "no Python $version here: python$version does not run, nor pyenv's $version" >&2
    return 3
  fi
  suffix=
  [ "$version" = "$REFERENCE_PYTHON" ] || suffix=-py$version
}
