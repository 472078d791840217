// Entry point of the fine-tuning dataset fuzzer (fuzz/fuzz_jsonl_dataset.cc; docs/fuzzing.md),
// callable from ordinary tests too (train_data_fuzz_test).
//
// FuzzTrainingDataInput: byte 0 picks the format (even: JSON Lines — prompt/completion, chat
// messages, text; odd: plain text) and the sequence length (16..128 tokens); the rest is the
// file's content. It is parsed with ParseSamples against a small byte-level BPE tokenizer (with
// the ChatML template for chat lines); an accepted file is packed (Pack) and laid into a batch
// (AppendSequence). Checks: errors are kInvalidArgument naming the line; every sample has
// 1..seq_len tokens of the vocabulary, one loss flag per token, no loss on its first token and
// some loss somewhere; packing places every sample exactly once in sequences of ≤ seq_len tokens;
// the batch's targets are the next tokens where the loss flag says so.
//
// Returns normally on any input (true when the file was accepted); aborts only when Chorus
// contradicts itself. Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::train {

bool FuzzTrainingDataInput(const uint8_t* data, size_t size);

// Seed corpus: datasets of every format and field, valid and invalid (with the selector byte).
std::vector<std::string> TrainingDataFuzzSeeds();

}  // namespace chorus::train
