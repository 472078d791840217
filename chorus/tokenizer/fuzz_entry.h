// Entry point of the tokenizer.json fuzzer, callable from the libFuzzer target
// (fuzz/fuzz_tokenizer_json.cc, clang `fuzz` preset) and from ordinary tests
// (tokenizer_fuzz_slow_test), so the robustness checks run in every build.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::tokenizer {

// Parses `data` as a tokenizer.json; when that succeeds, encodes and decodes a few short
// strings (special tokens, invalid UTF-8, whitespace runs) and checks the invariants every
// tokenizer keeps: ids within the vocabulary, streamed text valid UTF-8 and equal to Decode().
// Returns whether the input parsed. Aborts (CHORUS_CHECK) only on a Chorus bug.
bool FuzzTokenizerJsonInput(const uint8_t* data, size_t size);

// Parses `data` as a chat template; when that succeeds, renders it on a few conversations
// (system, tools and tool calls, empty and non-ASCII content) with tight limits. Any failure
// must be a kInvalidArgument or kResourceExhausted Status (never an exception turned into
// kInternal, never a crash); a successful render must be valid UTF-8 when the template and
// conversation are. Returns whether the template parsed.
bool FuzzChatTemplateInput(const uint8_t* data, size_t size);

// Small valid tokenizer.json files: a SentencePiece-style BPE with byte fallback and a
// byte-level BPE with added tokens (seed corpus of the fuzzer, fixtures of the unit tests).
std::string SmallSpmTokenizerJson();
std::string SmallByteLevelTokenizerJson();
std::vector<std::string> TokenizerJsonFuzzSeeds();

}  // namespace chorus::tokenizer
