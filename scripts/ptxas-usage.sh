#!/usr/bin/env bash
# Registers, stack frame and spills of CUDA kernels, as ptxas reports them, for
# one source file of an existing CUDA build tree (no GPU needed):
#
#   scripts/ptxas-usage.sh cuda_mhc.cu [KERNEL_REGEX] [BUILD_DIR]
#
# Recompiles the file with its own command from BUILD_DIR/compile_commands.json
# (default build-cuda; object to a temporary file, the tree is not touched) plus
# -Xptxas -v, demangles, and prints each matching kernel's lines.
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=${1:?usage: scripts/ptxas-usage.sh FILE.cu [KERNEL_REGEX] [BUILD_DIR]}
RE=${2:-.}
BUILD=${3:-build-cuda}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CMD=$(scripts/cuda-compile-cmd.py "$BUILD" "$FILE" "$TMP/x.o" -Xptxas -v) || { echo "ptxas-usage: no compile command" >&2; exit 2; }
PATH=/usr/local/cuda/bin:$PATH bash -c "$CMD" 2>&1 | c++filt | grep -E "Compiling entry|Used|stack frame" | grep -A2 -E "Compiling entry.*($RE)" || true
