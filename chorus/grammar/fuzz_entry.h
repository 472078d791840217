// Entry points of the grammar fuzzers (fuzz/fuzz_gbnf.cc, fuzz/fuzz_json_schema.cc, clang `fuzz`
// preset), also run by an ordinary test (grammar_fuzz_slow_test) so the checks run in every build.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus::grammar {

// Compiles `data` as GBNF; when that succeeds, decodes a few steps over a small byte vocabulary
// (tokens drawn from the input's hash) and checks the matcher's invariants: every token in the
// mask is accepted, every other token refused, EOS only where the grammar accepts. Failures
// must be kInvalidArgument / kResourceExhausted Status values. Returns whether it compiled.
// Aborts (CHORUS_CHECK) only on a Chorus bug.
bool FuzzGbnfInput(const uint8_t* data, size_t size);
// The same with `data` parsed as JSON and compiled as a JSON schema.
bool FuzzJsonSchemaInput(const uint8_t* data, size_t size);

}  // namespace chorus::grammar
