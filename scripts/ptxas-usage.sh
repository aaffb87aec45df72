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
[ -f "$BUILD/compile_commands.json" ] || { echo "ptxas-usage: $BUILD/compile_commands.json missing (configure a DSV4_CUDA=ON build)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CMD=$(python3 - "$BUILD/compile_commands.json" "$FILE" "$TMP/x.o" <<'PY'
import json, re, sys
cc, name, obj = sys.argv[1:4]
for e in json.load(open(cc)):
    if e["file"].endswith("/" + name) or e["file"] == name:
        print("cd " + e["directory"] + " && " + re.sub(r" -o \S+", " -o " + obj, e["command"]) + " -Xptxas -v")
        break
else:
    sys.exit(f"ptxas-usage: {name} is not in {cc}")
PY
)
PATH=/usr/local/cuda/bin:$PATH bash -c "$CMD" 2>&1 | c++filt | grep -E "Compiling entry|Used|stack frame" | grep -A2 -E "Compiling entry.*($RE)" || true
