#!/usr/bin/env python3
"""Per-kernel table of an Nsight Compute CSV (scripts/gpu.sh ncu-decode makes one).

Reads `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,...`
output (one row per kernel and metric; lines before the CSV header, e.g. the
profiled program's own output, are skipped) and prints, per kernel name
(template arguments kept, parameters dropped): launches, total and mean
duration, DRAM bytes and the achieved DRAM rate, largest total first. In dsv4's
kernel names the first template argument of the matvec/MoE kernels is the
weight's ggml type id (1 F16, 8 Q8_0, 10 Q2_K, 16 IQ2_XXS), then rows per warp
and whether the rows are staged through shared memory.

  scripts/ncu-kernel-table.py ncu.csv [--top N] [--step K]

--step K keeps only the launches of one decode step: those from the K-th launch
of the step's marker kernel (embed_kernel, first in every forward pass; K = 0 is
the prefill) up to the next one, in launch order.

ncu replays each kernel alone with its caches flushed, so small kernels read
slower than inside a CUDA graph; the totals still show where a step's time goes.
"""
import argparse
import collections
import csv
import io
import re
import sys

UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
        "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def kernel_name(full):
    # ncu prints anonymous namespaces as "(anonymous namespace)::", "<unnamed>::" or,
    # in its demangled CSV, a bare "unnamed>::".
    n = re.sub(r"\(anonymous namespace\)::|<?unnamed>::", "", full)
    n = re.sub(r"^void ", "", n)
    n = re.sub(r"^dsv4::(cuda::)?", "", n)
    depth, out = 0, []
    for ch in n:  # cut at the parameter list, keeping template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        out.append(ch)
    return "".join(out).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--step", type=int, default=-1, help="one forward pass: from the K-th embed_kernel launch to the next")
    ap.add_argument("--marker", default="embed_kernel", help="the kernel that starts every forward pass")
    a = ap.parse_args()
    text = open(a.csv, encoding="utf-8", errors="replace").read()
    start = text.find('"ID","Process ID"')
    if start < 0:
        sys.exit(f"{a.csv}: no ncu CSV header (was ncu run with --csv?)")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels = collections.OrderedDict()
    for r in rows:
        if not r.get("Metric Name"):
            continue
        k = kernels.setdefault(r["ID"], {"name": kernel_name(r["Kernel Name"]), "us": 0.0, "bytes": 0.0, "grid": 0.0})
        v = r["Metric Value"].replace(",", "")
        try:
            val = float(v) * UNIT.get(r["Metric Unit"], 1.0)
        except ValueError:
            continue
        m = r["Metric Name"]
        if m == "gpu__time_duration.sum":
            k["us"] = val
        elif m in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            k["bytes"] += val
        elif m == "launch__grid_size":
            k["grid"] = val
    if not kernels:
        sys.exit(f"{a.csv}: no kernel rows")
    if a.step >= 0:
        ids = sorted(kernels, key=int)
        starts = [i for i, kid in enumerate(ids) if kernels[kid]["name"].startswith(a.marker)]
        if len(starts) <= a.step:
            sys.exit(f"{a.csv}: {len(starts)} launches of {a.marker}, no step {a.step}")
        end = starts[a.step + 1] if a.step + 1 < len(starts) else len(ids)
        if a.step + 1 >= len(starts):
            print(f"(step {a.step} is the last one profiled: it may be cut short)")
        kernels = collections.OrderedDict((kid, kernels[kid]) for kid in ids[starts[a.step]:end])
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for k in kernels.values():
        g = agg[k["name"]]
        g[0] += 1
        g[1] += k["us"]
        g[2] += k["bytes"]
        g[3] += k["grid"]
    total = sum(g[1] for g in agg.values())
    print(f"{len(kernels)} kernel launches, {total:.0f} us of kernel time")
    # blocks: the mean grid size (launch__grid_size, when the CSV has it; else 0)
    print(f"{'kernel':60s} {'calls':>6s} {'total us':>10s} {'us/call':>8s} {'share':>6s} {'MB':>9s} {'GB/s':>7s} {'blocks':>7s}")
    for name, (n, us, b, grid) in sorted(agg.items(), key=lambda x: -x[1][1])[: a.top]:
        rate = b / us / 1e3 if us else 0.0
        print(f"{name[:60]:60s} {n:6d} {us:10.0f} {us / n:8.2f} {100 * us / total:5.1f}% {b / 1e6:9.1f} {rate:7.0f} {grid / n:7.0f}")


if __name__ == "__main__":
    main()
