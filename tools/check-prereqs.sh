#!/bin/sh
# Fails with a clear message when a prerequisite of `make demo` / `make test` is missing.
python=${1:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: $python not found. Install Python 3.10 or newer (or run: make PYTHON=/path/to/python3.x ...)." >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "error: $("$python" --version 2>&1) is too old; Python 3.10 or newer is required." >&2
  exit 1
fi
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "error: $python lacks venv/ensurepip (on Debian/Ubuntu: apt-get install python3-venv)." >&2
  exit 1
fi
java_bin=java
[ -n "$JAVA_HOME" ] && [ -x "$JAVA_HOME/bin/java" ] && java_bin="$JAVA_HOME/bin/java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "error: Java not found. Spark needs Java 17 or newer (e.g. apt-get install openjdk-17-jre-headless) on PATH or in JAVA_HOME." >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$version" ] || [ "$version" -lt 17 ]; then
  echo "error: Java ${version:-of unknown version} found at $(command -v "$java_bin"); Spark 4 needs Java 17 or newer." >&2
  exit 1
fi
