#!/usr/bin/env bash
# Installs every system dependency of dsv4 from Debian packages. Idempotent:
# packages already present are left alone. Needs root (or sudo) only when
# something is missing. The CUDA toolkit (nvcc) is not installed here; the
# CUDA build needs it on PATH or at /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer and sanitizer runtimes for clang builds
  clang-format                        # scripts/format.sh (CI checks the sources are formatted)
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
  libssl-dev libicu-dev
  python3 curl tmux
  libreadline-dev                     # line editing of `dsv4 run`'s interactive chat
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# node >= 20 and npm run the dsv4 serve SDK tests; use an existing install, else Debian's.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present (node $(node --version))"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
