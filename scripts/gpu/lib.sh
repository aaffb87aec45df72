# shellcheck shell=bash
# Sourced by scripts/gpu/*.sh, the subcommands of scripts/gpu.sh (dsv4 on the GPU machine): what they share.
# Each subcommand sets GPU_NAME (its name in messages: "gpu.sh NAME: ...") and sources this file, which
# makes the repository root the working directory, puts /usr/local/cuda/bin on PATH and defines:
#
#   gpu_args "FLAGS" "$@"      the options: --help (the subcommand's header comment), --dry-run, the FLAGS
#                              (space-separated) it takes; anything else stops it (exit 2). gpu_flag FLAG: given?
#   gpu_die MSG                "gpu.sh NAME: MSG" on stderr, exit 2 (a usage or set-up error, nothing run);
#                              gpu_note MSG: the same without exiting
#   gpu_need_uint VAR...       the variables hold whole numbers (gpu_need_pos: >= 1); gpu_need_choice VAR A B...
#   gpu_need_tool TOOL WHAT    TOOL is on PATH
#   gpu_probe                  there is an NVIDIA GPU here: a clear stop on any other machine
#   gpu_unpack                 the carried build-device/dsv4-device.tar.xz (scripts/gpu-build-carry.sh) unpacked
#                              afresh into build-device-run/{bin,lib} (tar/xz, or python3's tarfile)
#   gpu_binaries [NAME...]     build-device-run/bin holds NAME... (unpacking the payload if it, or one, is missing)
#   gpu_use_run_libs           build-device-run/lib on LD_LIBRARY_PATH
#   gpu_out_begin NAME         LOG = the log folder (below), packed on exit; gpu_out_keep FILE DEST: also copied
#   gpu_out_flat               LOG = $OUT itself (else ./out), for the subcommands that write two or three files
#   gpu_tmpdir VAR             VAR = a temporary folder, removed on exit
#   gpu_run [--log|--append|--out|--err FILE]... CMD...
#                              runs CMD (a command or a function) with stdout and stderr (--log; --append adds),
#                              stdout only (--out) or stderr only (--err) into FILE; GPU_RC = its exit code,
#                              GPU_SECS = its seconds; returns GPU_RC. With --dry-run it prints the command
#                              (gpu_show: that printing) and returns 0.
#   gpu_dry_run                true under --dry-run; gpu_exists FILE: FILE is executable (always, in a dry run)
#   gpu_row NAME RESULT SECONDS DETAIL / gpu_table TITLE    the summary table (check's)
#   gpu_heading TITLE EXTRA    "== dsv4 TITLE (UTC time, EXTRA)"; gpu_device_name: the GPU's name
#
# Logs. The device tool brings back at most 8 files from $OUT, and one check alone writes a dozen logs.
# So on the device tool (OUT set) each subcommand keeps its logs in a folder of its own, $OUT/NAME/, and
# when it exits packs that folder into $OUT/NAME-logs.tgz and copies the few files worth reading at once
# beside it (gpu_out_keep): three files or so per subcommand, enough room for check + a benchmark + a
# sweep in one call. Without OUT (a GPU machine of your own) the logs stay unpacked in ./out.
#
# --dry-run: nothing runs and nothing is written to $OUT or ./out (LOG is a temporary folder, shown in the
# printed commands as the folder it would be); the GPU and the carried binaries need not be here.

GPU_NAME=${GPU_NAME:-${BASH_SOURCE[1]##*/}}
GPU_SELF=$(realpath "${BASH_SOURCE[1]}")
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || {
  echo "gpu.sh $GPU_NAME: cannot enter the repository root" >&2
  exit 2
}
export PATH="$PATH:/usr/local/cuda/bin"
GPU_PAYLOAD=build-device/dsv4-device.tar.xz
GPU_RUN=build-device-run
GPU_DRY_RUN=0
GPU_GIVEN=" "
GPU_HELP_ALSO=()  # more headers to print after this subcommand's for --help
GPU_OUT_NAME=""
GPU_OUT_KEEP=()
GPU_TMPDIRS=()
GPU_ROWS=()
LOG=""
GPU_LOG_SHOWN=""  # under --dry-run: what LOG would have been

gpu_die() {
  echo "gpu.sh $GPU_NAME: $*" >&2
  exit 2
}

gpu_note() {
  echo "gpu.sh $GPU_NAME: $*" >&2
}

gpu_help() {  # the header comment of each file: from line 2 to the first line that is not a comment
  local f
  for f in "$@"; do
    sed -n '2,/^[^#]/{/^#/!q;s/^# \{0,1\}//;p;}' "$f"
  done
}

gpu_args() {
  local allowed=" $1 " a
  shift
  for a in "$@"; do
    case "$a" in
      -h | --help)
        gpu_help "$GPU_SELF" "${GPU_HELP_ALSO[@]}"
        exit 0
        ;;
      --dry-run) GPU_DRY_RUN=1 ;;
      *)
        if [[ $allowed != *" $a "* ]]; then
          local opts
          read -ra opts <<<"$allowed --dry-run --help"
          gpu_die "unknown option '$a' (options: ${opts[*]}; see scripts/gpu.sh ${GPU_NAME%% *} --help)"
        fi
        GPU_GIVEN+="$a "
        ;;
    esac
  done
}

gpu_flag() {
  [[ $GPU_GIVEN == *" $1 "* ]]
}

gpu_dry_run() {
  [ "$GPU_DRY_RUN" -eq 1 ]
}

gpu_need_uint() {
  local v
  for v in "$@"; do
    [[ ${!v:-} =~ ^[0-9]+$ ]] || gpu_die "$v=${!v:-} is not a whole number"
  done
}

gpu_need_pos() {
  local v
  for v in "$@"; do
    [[ ${!v:-} =~ ^[1-9][0-9]*$ ]] || gpu_die "$v=${!v:-} is not a positive number"
  done
}

gpu_need_choice() {
  local v=$1 c
  shift
  for c in "$@"; do [ "${!v:-}" = "$c" ] && return 0; done
  gpu_die "$v=${!v:-} is not one of: $*"
}

gpu_need_tool() {
  gpu_dry_run && return 0
  command -v "$1" >/dev/null 2>&1 || gpu_die "$1 ($2) is not on PATH"
}

gpu_probe() {
  gpu_dry_run && return 0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then return 0; fi
  if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then return 0; fi  # a GPU without a working nvidia-smi
  gpu_die "no NVIDIA GPU here (no working nvidia-smi, no /dev/nvidia0): scripts/gpu.sh runs on the GPU machine" \
    "(device tool: command \"scripts/gpu.sh ${GPU_NAME%% *} ...\", carry [\"build-device\"]);" \
    "--dry-run prints what it would run"
}

gpu_device_name() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
}

gpu_heading() {
  echo "== dsv4 $1 ($(date -u +%Y-%m-%dT%H:%M:%SZ), $2)"
}

gpu_use_run_libs() {
  export LD_LIBRARY_PATH="$PWD/$GPU_RUN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

gpu_unpack() {
  if gpu_dry_run; then
    gpu_show rm -rf "$GPU_RUN" "&&" mkdir -p "$GPU_RUN" "&&" tar -C "$GPU_RUN" -xJf "$GPU_PAYLOAD"
    return 0
  fi
  rm -rf "$GPU_RUN" && mkdir -p "$GPU_RUN" || return 1
  if command -v xz >/dev/null; then
    tar -C "$GPU_RUN" -xJf "$GPU_PAYLOAD"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$GPU_PAYLOAD" "$GPU_RUN"
  fi
}

gpu_binaries() {
  local b missing=0
  [ -d "$GPU_RUN/bin" ] || missing=1
  for b in "$@"; do [ -x "$GPU_RUN/bin/$b" ] || missing=1; done
  [ "$missing" -eq 0 ] && return 0
  gpu_dry_run && [ -n "${GPU_DRY_UNPACKED:-}" ] && return 0  # check --flash --dry-run: check unpacked them
  if [ ! -f "$GPU_PAYLOAD" ]; then
    if gpu_dry_run; then
      gpu_note "dry run: no $GPU_PAYLOAD here; on the GPU machine it is unpacked into $GPU_RUN/"
      return 0
    fi
    gpu_die "no $GPU_PAYLOAD (and no $GPU_RUN/bin${1:+/$1}): build it on the development machine with" \
      "scripts/gpu-build-carry.sh and carry it (device tool: carry [\"build-device\"])"
  fi
  gpu_unpack || gpu_die "cannot unpack $GPU_PAYLOAD"
  gpu_dry_run && return 0
  for b in "$@"; do
    [ -x "$GPU_RUN/bin/$b" ] || gpu_die "$GPU_RUN/bin/$b missing (a payload from before it was added?" \
      "rebuild it with scripts/gpu-build-carry.sh)"
  done
}

gpu_exists() {
  gpu_dry_run || [ -x "$1" ]
}

gpu_exit() {  # the EXIT trap: temporary folders, then the logs packed into $OUT
  local rc=$? pair d
  for d in "${GPU_TMPDIRS[@]}"; do rm -rf "$d"; done
  # GPU_OUT_NAME: set by gpu_out_begin (never under --dry-run)
  [ -n "${OUT:-}" ] && [ -n "$GPU_OUT_NAME" ] && [ -d "$LOG" ] || return "$rc"
  for pair in "${GPU_OUT_KEEP[@]}"; do
    [ -f "$LOG/${pair%%:*}" ] && cp "$LOG/${pair%%:*}" "$OUT/${pair#*:}"
  done
  if command -v tar >/dev/null 2>&1; then
    tar -C "$LOG" -czf "$OUT/$GPU_OUT_NAME-logs.tgz" . && rm -rf "$LOG"
  else
    python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[2], "w:gz"); t.add(sys.argv[1], arcname="."); t.close()' \
      "$LOG" "$OUT/$GPU_OUT_NAME-logs.tgz" && rm -rf "$LOG"
  fi
  return "$rc"
}

gpu_tmpdir() {
  local d
  d=$(mktemp -d) || gpu_die "mktemp failed"
  GPU_TMPDIRS+=("$d")
  trap gpu_exit EXIT
  printf -v "$1" '%s' "$d"
}

gpu_dry_log() {  # under --dry-run: LOG is a temporary folder standing for $1
  GPU_LOG_SHOWN=$1
  gpu_tmpdir LOG
}

gpu_out_begin() {
  local dest
  if [ -n "${OUT:-}" ]; then dest=$OUT/$1; else dest=$PWD/out; fi
  if gpu_dry_run; then
    gpu_dry_log "$dest"
    return 0
  fi
  GPU_OUT_NAME=$1
  LOG=$dest
  mkdir -p "$LOG"
  trap gpu_exit EXIT
}

gpu_out_keep() {
  GPU_OUT_KEEP+=("$1:$2")
}

gpu_out_flat() {
  local dest=${OUT:-$PWD/out}
  if gpu_dry_run; then
    gpu_dry_log "$dest"
    return 0
  fi
  LOG=$dest
  mkdir -p "$LOG"
}

gpu_quote() {  # a word as the shell reads it, quoted only where it needs to be
  if [[ $1 =~ ^[A-Za-z0-9_./:=@,+%^-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

gpu_show() {  # prints a command as --dry-run shows it; [--log|--append|--out|--err FILE]... first
  local line="+" redir="" w
  while :; do
    case "${1:-}" in
      --log) redir+=" > $(gpu_quote "$2") 2>&1" ;;
      --append) redir+=" >> $(gpu_quote "$2") 2>&1" ;;
      --out) redir+=" > $(gpu_quote "$2")" ;;
      --err) redir+=" 2> $(gpu_quote "$2")" ;;
      *) break ;;
    esac
    shift 2
  done
  for w in "$@"; do
    case "$w" in
      '&&' | '||' | '|') line+=" $w" ;;
      *) line+=" $(gpu_quote "$w")" ;;
    esac
  done
  line+=$redir
  [ -n "$GPU_LOG_SHOWN" ] && line=${line//"$LOG"/"$GPU_LOG_SHOWN"}
  echo "${line//"$PWD/"/}"
}

gpu_run() {
  local out="" err="" app=0 t0
  while :; do
    case "${1:-}" in
      --log) out=$2 err=$2 ;;
      --append) out=$2 err=$2 app=1 ;;
      --out) out=$2 ;;
      --err) err=$2 ;;
      *) break ;;
    esac
    shift 2
  done
  if gpu_dry_run; then
    local how=()
    if [ "$app" -eq 1 ]; then
      how=(--append "$out")
    elif [ -n "$out" ] && [ "$out" = "$err" ]; then
      how=(--log "$out")
    else
      [ -n "$out" ] && how+=(--out "$out")
      [ -n "$err" ] && how+=(--err "$err")
    fi
    gpu_show "${how[@]}" "$@"
    # shellcheck disable=SC2034 # GPU_RC, GPU_SECS: read by the subcommands
    GPU_RC=0 GPU_SECS=0
    return 0
  fi
  t0=$(date +%s)
  if [ "$app" -eq 1 ]; then
    "$@" >>"$out" 2>&1
  elif [ -n "$out" ] && [ "$out" = "$err" ]; then
    "$@" >"$out" 2>&1
  elif [ -n "$out" ] && [ -n "$err" ]; then
    "$@" >"$out" 2>"$err"
  elif [ -n "$out" ]; then
    "$@" >"$out"
  elif [ -n "$err" ]; then
    "$@" 2>"$err"
  else
    "$@"
  fi
  GPU_RC=$?
  # shellcheck disable=SC2034 # read by the subcommands
  GPU_SECS=$(($(date +%s) - t0))
  return "$GPU_RC"
}

gpu_row() {
  GPU_ROWS+=("$1|$2|$3|$4")
}

gpu_table() {
  local r name res secs detail
  echo
  echo "$1"
  printf '%-18s %-6s %7s  %s\n' step result seconds detail
  for r in "${GPU_ROWS[@]}"; do
    IFS='|' read -r name res secs detail <<<"$r"
    printf '%-18s %-6s %7s  %s\n' "$name" "$res" "$secs" "$detail"
  done
}
