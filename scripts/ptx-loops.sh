#!/usr/bin/env bash
# PTX instruction counts of the innermost hot loop of CUDA kernels, for one
# source file of an existing CUDA build tree (no GPU needed):
#
#   scripts/ptx-loops.sh cuda_matmul.cu 'matvec_kernelILNS_8GgmlTypeE8ELi2ELi3ELb1E' [BUILD_DIR]
#
# Recompiles FILE to PTX with its own command from BUILD_DIR/compile_commands.json
# (default build-cuda; output to a temporary file), then for every kernel whose
# mangled name contains the pattern (a Python regex) prints the largest loop
# (the longest span between a label and a backward branch to it): its PTX
# instruction count and the most frequent opcodes. Divide by the weights a
# lane handles per iteration for instructions per weight. PTX is not SASS
# (register moves mostly vanish, some ops expand), but it shows where the
# issue slots go; cuobjdump --dump-sass on the GPU machine gives the exact code.
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=${1:?usage: scripts/ptx-loops.sh FILE.cu KERNEL_REGEX [BUILD_DIR]}
RE=${2:?usage: scripts/ptx-loops.sh FILE.cu KERNEL_REGEX [BUILD_DIR]}
BUILD=${3:-build-cuda}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CMD=$(scripts/cuda-compile-cmd.py "$BUILD" "$FILE" "$TMP/x.ptx" --ptx) || { echo "ptx-loops: no compile command" >&2; exit 2; }
PATH=/usr/local/cuda/bin:$PATH bash -c "$CMD"
python3 - "$TMP/x.ptx" "$RE" <<'PY'
import re, sys
from collections import Counter
text, pat = open(sys.argv[1]).read(), re.compile(sys.argv[2])
entries = [(m.start(), m.group(1)) for m in re.finditer(r"\.entry\s+(\S+?)\(", text)]
found = 0
for i, (start, name) in enumerate(entries):
    if not pat.search(name):
        continue
    found += 1
    end = entries[i + 1][0] if i + 1 < len(entries) else len(text)
    lines = [l.strip() for l in text[start:end].split("\n")]
    labels = {m.group(1): k for k, l in enumerate(lines) if (m := re.match(r"^(\$L__BB\d+_\d+):", l))}
    best = None
    for k, l in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", l)
        if m and m.group(1) in labels and labels[m.group(1)] < k:
            body = [x for x in lines[labels[m.group(1)]:k + 1]
                    if x and not x.startswith(("$", "//", ".")) and x not in ("{", "}")]
            if best is None or len(body) > len(best):
                best = body
    print(name)
    if best is None:
        print("  no loop")
        continue
    ops = Counter(re.sub(r"^@!?%p\d+\s+", "", x).split()[0].split(".")[0] for x in best)
    print(f"  largest loop: {len(best)} PTX instructions; " + ", ".join(f"{o} {c}" for o, c in ops.most_common(12)))
if not found:
    sys.exit(f"ptx-loops: no kernel matches {sys.argv[2]}")
PY
