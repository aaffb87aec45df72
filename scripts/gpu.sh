#!/usr/bin/env bash
# dsv4 on the GPU machine: one entry point for the CUDA checks, benchmarks and profiles.
#
#   here (development machine, no GPU needed):  scripts/gpu-build-carry.sh   builds and packs build-device/
#   there (device tool, kind nvidia-h200):      command "scripts/gpu.sh check --quick; scripts/gpu.sh bench",
#                                               carry ["build-device"]
#
#   scripts/gpu.sh SUBCOMMAND [OPTIONS]     one subcommand (join several with ';' in one device call)
#   scripts/gpu.sh SUBCOMMAND --help        its steps, options, variables and outputs
#   scripts/gpu.sh SUBCOMMAND --dry-run     the commands it would run (checks its options and variables;
#                                           needs neither a GPU nor build-device/)
#   scripts/gpu.sh --help                   this text and the subcommands
#
# The subcommands live in scripts/gpu/<name>.sh (what they share: scripts/gpu/lib.sh). Every one unpacks
# build-device/dsv4-device.tar.xz into build-device-run/ when what it needs is not there yet (check always
# does, afresh). Every one honours OUT: where it is set (the device tool, which brings back at most 8
# files), check, bench, sweep, ab, ops-bench and the full-size check pack their logs into
# $OUT/<name>-logs.tgz beside a summary, and micro and ncu-decode write their two or three files into $OUT;
# without OUT the logs stay in ./out. Exit code: 0 when every step passed, 2 on a usage or set-up error
# (stopped before running anything), else 1 or the failing step's code.
set -uo pipefail
GPU_DIR=$(dirname "$(realpath "$0")")/gpu
SUBCOMMANDS=(check bench ab sweep ops-bench micro ncu-decode load offload spec pipeline numerics)

usage() {
  sed -n '2,/^[^#]/{/^#/!q;s/^# \{0,1\}//;p;}' "$0"
  echo
  echo "Subcommands (the variables each honours; --help for the details):"
  local s usage summary envs
  for s in "${SUBCOMMANDS[@]}"; do
    usage=$(sed -n '2s/^# Usage: //p' "$GPU_DIR/$s.sh")
    summary=$(sed -n '3s/^# Summary: //p' "$GPU_DIR/$s.sh")
    envs=$(sed -n '4s/^# Environment: //p' "$GPU_DIR/$s.sh")
    printf '  %s\n      %s\n' "$usage" "$summary"
    echo "variables: $envs" | fold -s -w 104 | sed 's/ *$//; s/^/      /; 2,$s/^/           /'

  done
}

case "${1:-}" in
  "")
    echo "usage: scripts/gpu.sh SUBCOMMAND [OPTIONS] (subcommands: ${SUBCOMMANDS[*]}; scripts/gpu.sh --help)" >&2
    exit 2
    ;;
  -h | --help | help)
    if [ -n "${2:-}" ] && [ "$1" = help ]; then
      set -- "$2" --help
    else
      usage
      exit 0
    fi
    ;;
esac
sub=$1
shift
for s in "${SUBCOMMANDS[@]}"; do
  [ "$s" = "$sub" ] && exec bash "$GPU_DIR/$sub.sh" "$@"
done
echo "gpu.sh: unknown subcommand '$sub' (subcommands: ${SUBCOMMANDS[*]}; see scripts/gpu.sh --help)" >&2
exit 2
