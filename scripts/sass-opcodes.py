#!/usr/bin/env python3
"""Opcode histogram of CUDA kernels' SASS (cuobjdump -sass output on stdin).

  cuobjdump -sass build-device-run/bin/bench_cuda_ops | scripts/sass-opcodes.py REGEX [--top N]

For every kernel whose (mangled) name matches REGEX: the instruction count per
opcode (modifiers dropped: IMAD.SHL.U32 -> IMAD), largest first, and the
total. Static counts of the whole function (loops are not weighted), enough to
see which units a decoder leans on (ALU: LOP3/SHF/PRMT/I2F.., FMA: FFMA/FMUL/
FADD/IMAD, MIO: LDS/SHFL).
"""
import collections
import re
import sys

def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    pat = re.compile(sys.argv[1])
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    cur, hist = None, None
    out = []
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if cur and hist:
                out.append((cur, hist))
            cur = m.group(1) if pat.search(m.group(1)) else None
            hist = collections.Counter() if cur else None
            continue
        if cur is None:
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            hist[m.group(1)] += 1
    if cur and hist:
        out.append((cur, hist))
    for name, h in out:
        print(f"== {name}: {sum(h.values())} instructions")
        for op, c in h.most_common(top):
            print(f"  {op:10s} {c}")
    return 0 if out else 1

if __name__ == "__main__":
    sys.exit(main())
