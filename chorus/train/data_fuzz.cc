// The fine-tuning dataset fuzzer's body (data_fuzz.h).
#include "chorus/train/data_fuzz.h"

#include <string_view>

#include "chorus/base/check.h"
#include "chorus/tokenizer/fuzz_entry.h"
#include "chorus/train/data.h"

namespace chorus::train {
namespace {

const tokenizer::Tokenizer& Tok() {
  static const tokenizer::Tokenizer* tok = [] {
    auto t = tokenizer::TokenizerFromJsonString(tokenizer::SmallByteLevelTokenizerJson());
    CHORUS_CHECK(t.ok());
    return t->release();
  }();
  return *tok;
}

}  // namespace

bool FuzzTrainingDataInput(const uint8_t* data, size_t size) {
  if (size == 0) return false;
  const bool jsonl = (data[0] & 1) == 0;
  DataOptions opts;
  opts.seq_len = 16 + 16 * ((data[0] >> 1) % 8);
  opts.max_file_bytes = 1 << 20;
  const std::string_view content(reinterpret_cast<const char*>(data + 1), size - 1);
  const tokenizer::Tokenizer& tok = Tok();
  auto samples = ParseSamples(content, jsonl, tok, opts);
  if (!samples.ok()) {
    CHORUS_CHECK(samples.status().code() == StatusCode::kInvalidArgument)
        << samples.status().ToString();
    return false;
  }
  CHORUS_CHECK(!samples->empty());
  for (const Sample& s : *samples) {
    CHORUS_CHECK(!s.tokens.empty() && static_cast<int64_t>(s.tokens.size()) <= opts.seq_len);
    CHORUS_CHECK(s.loss.size() == s.tokens.size());
    CHORUS_CHECK(s.loss[0] == 0);
    bool any = false;
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      CHORUS_CHECK(s.tokens[i] >= 0 && s.tokens[i] < tok.vocab_size()) << s.tokens[i];
      CHORUS_CHECK(s.loss[i] <= 1);
      any |= s.loss[i] != 0;
    }
    // A one-token piece (the tail of a cut document) predicts nothing; any other sample does.
    CHORUS_CHECK(any || s.tokens.size() == 1);
    CHORUS_CHECK(s.line >= 1);
  }
  std::vector<int64_t> order(samples->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  const std::vector<PackedSeq> packed = Pack(*samples, order, opts.seq_len);
  std::vector<int> placed(samples->size(), 0);
  for (const PackedSeq& seq : packed) {
    int64_t tokens = 0;
    for (int64_t idx : seq) {
      CHORUS_CHECK(idx >= 0 && idx < static_cast<int64_t>(samples->size()));
      ++placed[static_cast<size_t>(idx)];
      tokens += static_cast<int64_t>((*samples)[static_cast<size_t>(idx)].tokens.size());
    }
    CHORUS_CHECK(tokens <= opts.seq_len) << tokens;
    Batch b;
    AppendSequence(*samples, seq, &b);
    CHORUS_CHECK(b.size() == tokens);
    CHORUS_CHECK(b.positions.size() == b.tokens.size() && b.targets.size() == b.tokens.size());
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      CHORUS_CHECK(b.seg_start[i] <= static_cast<int32_t>(i));
      CHORUS_CHECK(b.positions[i] == static_cast<int32_t>(i) - b.seg_start[i]);
      if (b.targets[i] >= 0)
        CHORUS_CHECK(i + 1 < b.tokens.size() && b.targets[i] == b.tokens[i + 1]);
    }
  }
  for (int p : placed) CHORUS_CHECK(p == 1);
  return true;
}

std::vector<std::string> TrainingDataFuzzSeeds() {
  auto jsonl = [](int seq_index, std::string_view text) {
    std::string s(1, static_cast<char>(seq_index << 1));
    return s.append(text);
  };
  auto plain = [](int seq_index, std::string_view text) {
    std::string s(1, static_cast<char>((seq_index << 1) | 1));
    return s.append(text);
  };
  return {
      jsonl(3,
            "{\"prompt\": \"hello\", \"completion\": \" world\"}\n"
            "{\"prompt\": \"the\", \"completion\": \" world\"}\n"),
      jsonl(7,
            "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
            "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": "
            "\"hello\"}, {\"role\": \"user\", \"content\": \"more\"}, {\"role\": "
            "\"assistant\", \"content\": \"world\"}]}\n"),
      jsonl(1, "{\"text\": \"hello world, the world\"}\n\n{\"text\": \"\\u00e9t\\u00e9\"}\r\n"),
      plain(2, "hello world\nthe world\n\nsecond document\n\n\n\xc3\xa9t\xc3\xa9\n"),
      plain(0, std::string(100, 'a') + "\n\nb"),
      // Refused: an empty completion, no assistant turn, too long, not UTF-8.
      jsonl(0, "{\"prompt\": \"a\", \"completion\": \"\"}\n"),
      jsonl(0,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n[1, 2]\n"
            "{\"text\": 5}\n"),
      jsonl(0, "{\"text\": \"" + std::string(40, 'x') + "\"}\n"),
      plain(1, "\xff\xfe not utf-8"),
  };
}

}  // namespace chorus::train
