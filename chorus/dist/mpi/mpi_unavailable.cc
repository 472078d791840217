// The build without MPI (CMake did not find it): `--tp` > 1 is refused with the fix.
#include <string>

#include "chorus/dist/communicator.h"

namespace chorus::dist {

bool MpiBuilt() { return false; }

Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(int expected_size) {
  return FailedPreconditionError(
      "--tp " + std::to_string(expected_size) +
      " needs MPI, and this chorus was built without it: install OpenMPI (Debian: apt-get install "
      "libopenmpi-dev openmpi-bin, or run scripts/setup.sh) and rebuild (docs/scaleout.md)");
}

}  // namespace chorus::dist
