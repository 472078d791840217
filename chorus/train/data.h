// Training data for `chorus finetune` (docs/finetuning.md, "Data"): reading, validation,
// tokenization and packing.
//
// Formats (chosen by the file name: *.jsonl / *.json are JSON Lines, anything else plain text):
//   {"prompt": "...", "completion": "..."}   tokens = [BOS] prompt completion [EOS]; loss on the
//                                           completion and EOS only.
//   {"messages": [{"role": ..., "content": ...}, ...]}   rendered with the model's chat template
//                                           (tokenizer/chat_template.h); loss on the text of each
//                                           assistant turn (what rendering it adds after the
//                                           generation prompt, its end-of-turn marker included).
//   {"text": "..."}                         loss on every token.
//   plain text                              documents separated by blank lines; loss on every
//                                           token; a document longer than seq_len is cut into
//                                           seq_len pieces.
// Every problem is an error naming the line (1-based): invalid JSON, a line that is not an
// object, missing or non-string fields, an empty completion or assistant turn, a sample longer
// than seq_len, bytes that are not UTF-8; and the file itself when it is over max_file_bytes or
// holds no sample.
//
// Packing: samples are laid one after the other into sequences of at most seq_len tokens (first
// fit in the given order, among the last 64 sequences opened); each keeps its own positions (from
// 0) and attends only to itself (lora_model.h's Batch::seg_start), so packing never changes a
// sample's loss.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/tokenizer/tokenizer.h"
#include "chorus/train/lora_model.h"

namespace chorus::train {

struct DataOptions {
  int64_t seq_len = 256;
  int64_t max_file_bytes = int64_t{256} << 20;
  std::string chat_template;  // overrides the tokenizer's (empty: the tokenizer's, else ChatML)
};

struct Sample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss;  // loss[i] = 1: tokens[i] is predicted (from tokens[0..i))
  int64_t line = 0;           // first line of the sample in its file
};

// Reads and validates `path`; errors start with the path.
Result<std::vector<Sample>> LoadSamples(const std::string& path, const tokenizer::Tokenizer& tok,
                                        const DataOptions& opts);
// The same on text already read (`jsonl` selects the format); errors start with "line N: ".
Result<std::vector<Sample>> ParseSamples(std::string_view content, bool jsonl,
                                         const tokenizer::Tokenizer& tok, const DataOptions& opts);

// Sample indices of one packed sequence.
using PackedSeq = std::vector<int64_t>;
std::vector<PackedSeq> Pack(const std::vector<Sample>& samples, std::span<const int64_t> order,
                            int64_t seq_len);
// Appends the rows of `seq` to `b`.
void AppendSequence(const std::vector<Sample>& samples, const PackedSeq& seq, Batch* b);

}  // namespace chorus::train
