#!/usr/bin/env bash
# The interactive chat of `dsv4 run` in a real terminal: starts it inside a
# private tmux server on a synthetic tiny model, types messages and commands,
# and checks what the terminal shows (replies, statistics lines, /nothink,
# /save, /reset, /load, history recall, Ctrl-C at the prompt and during a
# reply, /exit and Ctrl-D).
#
# usage: test_interactive.sh PATH/TO/dsv4
# Exit 0: pass; 1: fail (the pane is printed); 77: skipped (no tmux).
set -euo pipefail

DSV4=$(realpath "${1:?usage: test_interactive.sh PATH/TO/dsv4}")
if ! command -v tmux >/dev/null 2>&1; then
  echo "SKIP: tmux is not installed (scripts/setup.sh installs it)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dsv4_interactive.XXXXXX")
# A private server (its own socket): never touches the user's tmux sessions,
# and kill-server below ends everything this test started.
TMUX_CMD=(tmux -S "$WORK/tmux.sock" -f /dev/null)
cleanup() {
  "${TMUX_CMD[@]}" kill-server >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$DSV4" synth --preset tiny -o "$WORK/tiny.gguf" >/dev/null

SESSION=chat
start() {  # start NAME ARGS...: dsv4 run ARGS in a new 120x40 window of its own session
  local name=$1
  shift
  "${TMUX_CMD[@]}" new-session -d -s "$name" -x 120 -y 40 \
    "cd '$WORK' && '$DSV4' run -m tiny.gguf $* ; echo DSV4_EXIT=\$? ; sleep 600"
}
pane() { "${TMUX_CMD[@]}" capture-pane -p -J -S - -t "$1"; }
fail() {
  echo "FAIL: $*"
  echo "----- pane $SESSION (trailing blank lines dropped) -----"
  pane "$SESSION" | awk 'NF { for (; n > 0; n--) print ""; print; next } { n++ }' || true
  exit 1
}
# wait_for SESSION REGEX [COUNT]: until at least COUNT pane lines match REGEX (20 s).
wait_for() {
  local s=$1 re=$2 n=${3:-1} i
  for ((i = 0; i < 400; i++)); do
    if [ "$(pane "$s" | grep -cE -- "$re" || true)" -ge "$n" ]; then return 0; fi
    sleep 0.05
  done
  SESSION=$s fail "timed out waiting for ${n}x /$re/"
}
type_line() { "${TMUX_CMD[@]}" send-keys -t "$1" -l -- "$2" && "${TMUX_CMD[@]}" send-keys -t "$1" Enter; }

STATS='^\[prompt [0-9]+ tokens \([0-9]+ cached\), prefill [^|]+\| generated [0-9]+ tokens, decode [^|]+\| finish [a-z_]+ \| context [0-9]+/32768\]$'
CACHED='^\[prompt [0-9]+ tokens \([1-9][0-9]* cached\)'

# --- a conversation -----------------------------------------------------------
# --batch 4: prompts take several forward batches, so the prefill progress bar shows.
start chat -n 12 --seed 5 --no-color --batch 4
wait_for chat '^dsv4 chat: .*thinking: high \(--think\)$'
wait_for chat '/help lists the commands'

type_line chat "hello there"
wait_for chat "$STATS" 1
pane chat | grep -qxF '[thinking]' || fail "the thinking-mode reply is not fenced with [thinking]"
pane chat | grep -qE '^prefill \[#+\] 100\.0% [0-9]+ tok/[0-9]+ tok' || fail "no prefill progress bar"

type_line chat "/nothink"
wait_for chat '^thinking: none \(--nothink\)$'
type_line chat "and a second message"
wait_for chat "$STATS" 2
# The second turn reuses the first turn's prefix of the session.
wait_for chat "$CACHED" 1

type_line chat "/save conv.dsv4"
wait_for chat '^saved 4 messages and [0-9]+ tokens of session state to conv.dsv4$'
[ "$(head -c 8 "$WORK/conv.dsv4")" = "DSV4CONV" ] || fail "conv.dsv4 does not start with DSV4CONV"

type_line chat "/reset"
wait_for chat '^conversation cleared$'
type_line chat "/think"
wait_for chat '^thinking: high \(--think\)$'
type_line chat "/load conv.dsv4"
wait_for chat '^loaded 4 messages from conv.dsv4; thinking: none \(--nothink\)$'
wait_for chat '^session state restored \([0-9]+ tokens\)$'
type_line chat "third after load"
wait_for chat "$STATS" 3
wait_for chat "$CACHED" 2

# History: Up recalls the last line.
"${TMUX_CMD[@]}" send-keys -t chat Up
"${TMUX_CMD[@]}" send-keys -t chat Enter
wait_for chat "$STATS" 4
wait_for chat '^> third after load$' 2

# Ctrl-C at the prompt abandons the line being typed.
"${TMUX_CMD[@]}" send-keys -t chat -l -- "abandoned words"
wait_for chat '^> abandoned words$'
"${TMUX_CMD[@]}" send-keys -t chat C-c
wait_for chat '^> abandoned words\^C$'

type_line chat "/load missing.dsv4"
wait_for chat '^error: cannot open missing.dsv4: No such file or directory$'
type_line chat "/bogus"
wait_for chat '^error: unknown command /bogus'
type_line chat "/help"
wait_for chat '^  /save FILE +save the conversation'
type_line chat "/exit"
wait_for chat '^DSV4_EXIT=0$'
[ "$(pane chat | grep -cE "$STATS")" -eq 4 ] || fail "expected exactly 4 replies"

# --- Ctrl-C during a reply stops the reply, not the program; Ctrl-D quits ------
SESSION=long
start long --ignore-eos -n 0 --nothink --seed 1 --no-color
wait_for long '/help lists the commands'
type_line long "write forever"
# Wait until the reply is streaming, then interrupt it.
for ((i = 0; i < 400; i++)); do
  [ "$(pane long | sed -n '/^> write forever$/,$p' | wc -c)" -gt 200 ] && break
  sleep 0.05
done
"${TMUX_CMD[@]}" send-keys -t long C-c
wait_for long '^\[interrupted\]$'
wait_for long '\| finish cancelled \|'
# Still alive: the next message gets a reply (interrupted exchanges are not kept).
type_line long "/nothink"
wait_for long '^thinking: none \(--nothink\)$'
"${TMUX_CMD[@]}" send-keys -t long C-d
wait_for long '^DSV4_EXIT=0$'

echo "PASS: interactive dsv4 run (conversation, commands, history, Ctrl-C, /exit, Ctrl-D)"
