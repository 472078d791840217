#!/usr/bin/env bash
# Installs every dependency of Chorus from Debian packages and builds the release preset.
# Idempotent; safe to re-run. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

# build-essential brings GCC 12 with the sanitizer runtimes scripts/sanitize.sh needs (libasan8,
# libubsan1, liblsan0, libtsan2: dependencies of libgcc-12-dev).
PACKAGES=(
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpcre2-dev libsentencepiece-dev libzstd-dev libsqlite3-dev
  libcpp-httplib-dev libssl-dev ccache
  libopenmpi-dev openmpi-bin
  python3 python3-prometheus-client python3-jinja2 python3-jsonschema python3-numpy gnuplot-nox curl
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Compile through ccache; CCACHE_BASEDIR makes its keys independent of where the clone lives, so
# a fresh clone in another folder (as CI makes) reuses the objects of an earlier build.
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

PRESET="${CHORUS_PRESET:-release}"
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j"$(nproc)"
echo "setup: built build/$PRESET/apps/chorus/chorus"
