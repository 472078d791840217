#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds the `release` preset and
# runs every CTest test. Tests that need ../shared/models skip when it is absent, unless
# CHORUS_REQUIRE_MODELS=1 (set by .ci/run), which turns such a skip into a failure.
# Extra arguments go to ctest, e.g. `scripts/test.sh -L kernel`.
set -euo pipefail
cd "$(dirname "$0")/.."
CHORUS_PRESET=release bash scripts/setup.sh
# Which kernel levels this host runs the differential tests at (docs/kernels.md).
build/release/chorus/kernels/kernels_matmul_test --gtest_filter=MatMulLevels.* |
  grep "tested at ISA levels"
ctest --test-dir build/release --output-on-failure -j2 "$@"
