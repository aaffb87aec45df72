#!/usr/bin/env python3
"""Prints the compile command of one source file of a CMake build tree, retargeted.

  scripts/cuda-compile-cmd.py BUILD_DIR FILE OUT [--ptx] [EXTRA ...]

Looks FILE (a path or a file name) up in BUILD_DIR/compile_commands.json and
prints "cd DIR && COMMAND" with the output redirected to OUT; with --ptx the
command emits PTX instead of an object (one -arch=sm_XX for the build's
architecture); EXTRA words are appended (e.g. -Xptxas -v). Used by
scripts/ptxas-usage.sh and scripts/ptx-loops.sh; exits 2 with a message when
the tree or the file is missing.
"""
import json
import os
import re
import sys


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    build, name, out, rest = args[0], args[1], args[2], args[3:]
    ptx = "--ptx" in rest
    extra = [a for a in rest if a != "--ptx"]
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        print(f"{db} missing (configure a DSV4_CUDA=ON build)", file=sys.stderr)
        sys.exit(2)
    for e in json.load(open(db)):
        if e["file"].endswith("/" + name) or e["file"] == name:
            cmd = re.sub(r" -o \S+", " -o " + out, e["command"])
            if ptx:
                cmd = cmd.replace(" -c ", " -ptx ")
                cmd = re.sub(r"--generate-code=arch=compute_(\d+),code=\[[^\]]*\]", r"-arch=sm_\1", cmd)
            print("cd " + e["directory"] + " && " + " ".join([cmd] + extra))
            return
    print(f"{name} is not in {db}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
