// Entry point of the adapter registry state-file fuzzer (fuzz/fuzz_registry_state.cc;
// docs/fuzzing.md), callable from ordinary tests too (adapters_registry_fuzz_test).
//
// FuzzRegistryStateInput: `data` is the registry's state file (registry_state.h), written to a
// private temporary file and read with ReadState as a restarting server reads it. Checks: a
// refused file is kDataLoss (or kUnimplemented for a newer schema) naming the file; an accepted
// one serializes (SerializeState) to a file that reads back to the same serialization.
//
// Returns normally on any input (true when accepted); aborts only when Chorus contradicts
// itself. Thread-safety: not reentrant (one temporary directory per process).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::adapters {

bool FuzzRegistryStateInput(const uint8_t* data, size_t size);

// Seed corpus: state files as the registry writes them (LoRA and delta entries, owners, files).
std::vector<std::string> RegistryStateFuzzSeeds();

}  // namespace chorus::adapters
