#!/usr/bin/env bash
# Formats C++ and CUDA sources with clang-format (.clang-format).
#   scripts/format.sh [FILE...]          rewrite the files in place (default: every tracked source)
#   scripts/format.sh --check [FILE...]  list the files that are not formatted; exit 1 if any
# Test fixtures and vendored data are not sources and are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$fmt" ]; then
  echo "format.sh: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 2
fi
check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fixtures/')
fi
if [ $check -eq 1 ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$fmt" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
      echo "not formatted: $f (run scripts/format.sh)"
      bad=1
    fi
  done
  [ $bad -eq 0 ] && echo "format: ${#files[@]} files formatted"
  exit $bad
fi
"$fmt" --style=file -i "${files[@]}"
echo "format: ${#files[@]} files"
