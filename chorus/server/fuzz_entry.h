// Entry points of the server's input fuzzers (fuzz/fuzz_api_request.cc, fuzz/fuzz_tenants.cc,
// fuzz/fuzz_tool_calls.cc; docs/fuzzing.md), callable from ordinary tests too
// (server_fuzz_entry_test).
//
// FuzzApiRequestInput: byte 0 picks the route and the tool-call syntax, the rest is the JSON
// body as the HTTP layer hands it over: /v1/completions or /v1/chat/completions
// (ParseApiRequest, then MakeGenerationRequest for every prompt), /tokenize, /detokenize or
// /apply-template, against a small byte-level BPE tokenizer and the ChatML template. Checks: an
// error is a 4xx whose body is JSON; an accepted request has 1..kMaxPrompts prompts of valid
// token ids (a chat request exactly one), 1..kMaxChoices choices; a route's reply is JSON.
//
// FuzzTenantsInput: a --tenants file (ParseTenants); an accepted one has valid names, keys
// used by one tenant only, and limits ≥ 0.
//
// FuzzToolCallsInput: byte 0 picks the syntax, the rest is a model's reply; the reply parsed in
// one piece and fed in pieces (split at points derived from the input) gives the same content
// and calls.
//
// Each returns normally on any input (true when it was accepted); aborts only when Chorus
// contradicts itself.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::server {

bool FuzzApiRequestInput(const uint8_t* data, size_t size);
bool FuzzTenantsInput(const uint8_t* data, size_t size);
bool FuzzToolCallsInput(const uint8_t* data, size_t size);

// Seed corpora: request bodies of every route and field (with the selector byte), tenants
// files, and replies in every tool-call syntax.
std::vector<std::string> ApiRequestFuzzSeeds();
std::vector<std::string> TenantsFuzzSeeds();
std::vector<std::string> ToolCallsFuzzSeeds();

}  // namespace chorus::server
