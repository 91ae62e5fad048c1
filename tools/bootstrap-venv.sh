#!/bin/sh
# Creates or refreshes the project virtualenv for a make target.
#
#   sh tools/bootstrap-venv.sh PYTHON VENV LEVEL
#
# LEVEL is "runtime" (what `make demo` needs: the package and its dependencies) or "dev" (adds
# the test, lint and type-check tools of the `dev` extra). The stamp file VENV/.installed records
# the level installed last; the venv is (re)installed when the stamp is missing, older than
# pyproject.toml, or records a lower level than asked for. A refresh never drops to a lower
# level: a dev venv stays a dev venv when `make demo` reinstalls it after pyproject.toml changed.
set -e
cd "$(dirname "$0")/.."  # pyproject.toml and VENV are relative to the project root
python=${1:-python3}
venv=${2:-.venv}
level=${3:-dev}
case "$level" in
  runtime | dev) ;;
  *) echo "error: unknown level '$level' (runtime or dev)" >&2; exit 2 ;;
esac

sh tools/check-prereqs.sh "$python"

stamp="$venv/.installed"
installed=""
if [ -f "$stamp" ]; then
  installed=$(cat "$stamp")
  # An empty stamp was written before levels existed, when every install included the dev extra.
  [ -n "$installed" ] || installed=dev
fi
# Never install less than what the venv already holds.
[ "$installed" = dev ] && level=dev

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] &&
  { [ "$installed" = dev ] || [ "$level" = runtime ]; }; then
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "Creating the virtualenv $venv with $python"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
if [ "$level" = dev ]; then
  echo "Installing sparksink (editable) with its dependencies and the dev extra into $venv"
  "$venv/bin/python" -m pip install -e '.[dev]'
else
  echo "Installing sparksink (editable) with its runtime dependencies into $venv"
  "$venv/bin/python" -m pip install -e .
fi
echo "$level" >"$stamp"
