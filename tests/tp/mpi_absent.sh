#!/usr/bin/env bash
# Stands in for the tensor-parallel tests when CMake did not find MPI (docs/scaleout.md).
if [ "${CHORUS_REQUIRE_MODELS:-}" = "1" ] && command -v mpirun >/dev/null; then
  echo "FAIL: mpirun is installed but this build has no MPI (is libopenmpi-dev installed? re-run cmake)"
  exit 1
fi
echo "SKIP: built without MPI; install libopenmpi-dev openmpi-bin (scripts/setup.sh) and re-run cmake"
exit 77
