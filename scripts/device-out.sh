# shellcheck shell=bash
# Sourced by the scripts/device-*.sh that run on the GPU machine: where their logs go.
#
# The device tool brings back at most 8 files from $OUT (its README), and one
# device-check alone writes a dozen logs. So on the device tool (OUT set) each
# script keeps its logs in a folder of its own, $OUT/NAME/, and when it exits
# packs that folder into $OUT/NAME-logs.tgz and copies the few files worth
# reading at once beside it (device_out_keep): three files or so per script,
# enough room for device-check + a benchmark + a sweep in one call. Without OUT
# (a GPU machine of your own) the logs stay unpacked in ./out, as before.
#
#   device_out_begin NAME       sets LOG to the log folder (created) and packs it on exit
#   device_out_keep FILE DEST   on exit, also copy $LOG/FILE to $OUT/DEST (if it exists)

DEVICE_OUT_KEEP=()

device_out_begin() {
  DEVICE_OUT_NAME=$1
  if [ -n "${OUT:-}" ]; then LOG=$OUT/$1; else LOG=$PWD/out; fi
  mkdir -p "$LOG"
  [ -n "${OUT:-}" ] && trap device_out_end EXIT
}

device_out_keep() {
  DEVICE_OUT_KEEP+=("$1:$2")
}

device_out_end() {
  local rc=$? pair
  [ -n "${OUT:-}" ] && [ -d "$LOG" ] || return "$rc"
  for pair in "${DEVICE_OUT_KEEP[@]}"; do
    [ -f "$LOG/${pair%%:*}" ] && cp "$LOG/${pair%%:*}" "$OUT/${pair#*:}"
  done
  if command -v tar >/dev/null 2>&1; then
    tar -C "$LOG" -czf "$OUT/$DEVICE_OUT_NAME-logs.tgz" . && rm -rf "$LOG"
  else
    python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[2], "w:gz"); t.add(sys.argv[1], arcname="."); t.close()' \
      "$LOG" "$OUT/$DEVICE_OUT_NAME-logs.tgz" && rm -rf "$LOG"
  fi
  return "$rc"
}
