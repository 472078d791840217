#include "chorus/train/data.h"

#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"
#include "chorus/tokenizer/chat_template.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::train {
namespace {

using json = nlohmann::ordered_json;

Status LineError(int64_t line, const std::string& what) {
  return InvalidArgumentError("line " + std::to_string(line) + ": " + what);
}

// Byte offset of the first ill-formed UTF-8 sequence, or -1.
int64_t BadUtf8Offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = tokenizer::internal::ValidUtf8CharLen(s.substr(i));
    if (n == 0) return static_cast<int64_t>(i);
    i += n;
  }
  return -1;
}

class Builder {
 public:
  explicit Builder(const tokenizer::Tokenizer& tok) : tok_(tok) {}

  // Appends `text`'s tokens with the given loss flag. `first`: the sample's first piece (BOS as
  // the tokenizer's config asks, unless the text already starts with the BOS piece).
  void Add(std::string_view text, bool loss, bool first) {
    tokenizer::EncodeOptions eo;
    eo.add_eos = false;
    eo.parse_special = true;
    eo.add_bos = false;
    if (first && tok_.add_bos() && tok_.bos_id() >= 0) {
      const std::string_view bos = tok_.Piece(tok_.bos_id());
      eo.add_bos = bos.empty() || !text.starts_with(bos);
    }
    const std::vector<int32_t> ids = tok_.Encode(text, eo);
    for (size_t i = 0; i < ids.size(); ++i) {
      s_.tokens.push_back(ids[i]);
      // BOS is never a target.
      s_.loss.push_back(loss && !(eo.add_bos && i == 0) ? 1 : 0);
    }
  }
  void AddEos() {
    if (tok_.eos_ids().empty()) return;
    s_.tokens.push_back(tok_.eos_ids()[0]);
    s_.loss.push_back(1);
  }
  Sample Take(int64_t line) {
    Sample s = std::move(s_);
    s_ = {};
    s.line = line;
    if (!s.loss.empty()) s.loss[0] = 0;  // nothing predicts the first token
    return s;
  }

 private:
  const tokenizer::Tokenizer& tok_;
  Sample s_;
};

Status CheckLength(const Sample& s, int64_t line, const DataOptions& opts) {
  if (static_cast<int64_t>(s.tokens.size()) > opts.seq_len) {
    return LineError(line, "sample has " + std::to_string(s.tokens.size()) +
                               " tokens, longer than --seq-len " + std::to_string(opts.seq_len));
  }
  int64_t n = 0;
  for (uint8_t x : s.loss) n += x;
  if (n == 0) return LineError(line, "sample has no token to learn");
  return OkStatus();
}

Result<std::string> StringField(const json& obj, const char* name, int64_t line) {
  auto it = obj.find(name);
  if (it == obj.end()) return LineError(line, std::string("missing field \"") + name + "\"");
  if (!it->is_string())
    return LineError(line, std::string("field \"") + name + "\" must be a string");
  return it->get<std::string>();
}

Result<Sample> ChatSample(const json& messages, int64_t line, const tokenizer::ChatTemplate& tmpl,
                          const tokenizer::Tokenizer& tok, const DataOptions& opts) {
  if (!messages.is_array() || messages.empty()) {
    return LineError(line, "\"messages\" must be a non-empty array");
  }
  bool any_assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return LineError(line, "message " + std::to_string(i) + " needs a string \"role\"");
    }
    if (!m.contains("content") || !m["content"].is_string()) {
      return LineError(line, "message " + std::to_string(i) + " needs a string \"content\"");
    }
    if (m["role"] == "assistant") {
      if (m["content"].get_ref<const std::string&>().empty()) {
        return LineError(line, "empty assistant message " + std::to_string(i));
      }
      any_assistant = true;
    }
  }
  if (!any_assistant) return LineError(line, "no assistant message to learn");
  tokenizer::ChatRenderOptions ro;
  if (tok.bos_id() >= 0) ro.bos_token = std::string(tok.Piece(tok.bos_id()));
  if (!tok.eos_ids().empty()) ro.eos_token = std::string(tok.Piece(tok.eos_ids()[0]));
  Builder b(tok);
  std::string done;  // text rendered so far
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    json head = json::array(), upto = json::array();
    for (size_t j = 0; j < i; ++j) head.push_back(messages[j]);
    upto = head;
    upto.push_back(messages[i]);
    ro.add_generation_prompt = true;
    auto prompt = tmpl.RenderJson(head, ro);
    if (!prompt.ok()) return LineError(line, "chat template: " + prompt.status().message());
    ro.add_generation_prompt = false;
    auto full = tmpl.RenderJson(upto, ro);
    if (!full.ok()) return LineError(line, "chat template: " + full.status().message());
    if (!prompt->starts_with(done) || !full->starts_with(*prompt)) {
      return LineError(line,
                       "the chat template does not render the conversation incrementally "
                       "(a turn changes the text before it), so the assistant tokens cannot be "
                       "located");
    }
    b.Add(std::string_view(*prompt).substr(done.size()), false, done.empty());
    b.Add(std::string_view(*full).substr(prompt->size()), true, false);
    done = *full;
  }
  Sample s = b.Take(line);
  CHORUS_RETURN_IF_ERROR(CheckLength(s, line, opts));
  return s;
}

}  // namespace

Result<std::vector<Sample>> ParseSamples(std::string_view content, bool jsonl,
                                         const tokenizer::Tokenizer& tok, const DataOptions& opts) {
  if (opts.seq_len < 2) return InvalidArgumentError("--seq-len must be at least 2");
  std::vector<Sample> out;
  std::optional<tokenizer::ChatTemplate> tmpl;
  Builder b(tok);
  // Lines with their 1-based numbers.
  int64_t line_no = 0;
  size_t pos = 0;
  std::string doc;  // plain text: the document being gathered
  int64_t doc_line = 0;
  auto flush_doc = [&]() -> Status {
    if (doc.empty()) return OkStatus();
    b.Add(doc, true, true);
    Sample s = b.Take(doc_line);
    doc.clear();
    // Long documents are cut into seq_len pieces, each predicting from its own start.
    for (size_t off = 0; off < s.tokens.size(); off += static_cast<size_t>(opts.seq_len)) {
      Sample piece;
      piece.line = s.line;
      const size_t end = std::min(s.tokens.size(), off + static_cast<size_t>(opts.seq_len));
      piece.tokens.assign(s.tokens.begin() + static_cast<int64_t>(off),
                          s.tokens.begin() + static_cast<int64_t>(end));
      piece.loss.assign(s.loss.begin() + static_cast<int64_t>(off),
                        s.loss.begin() + static_cast<int64_t>(end));
      piece.loss[0] = 0;
      if (piece.tokens.size() >= 2) out.push_back(std::move(piece));
    }
    return OkStatus();
  };
  while (pos < content.size()) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string_view::npos) nl = content.size();
    std::string_view line = content.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (const int64_t bad = BadUtf8Offset(line); bad >= 0) {
      return LineError(line_no, "not valid UTF-8 (byte " + std::to_string(bad + 1) + ")");
    }
    if (!jsonl) {
      if (line.find_first_not_of(" \t") == std::string_view::npos) {
        CHORUS_RETURN_IF_ERROR(flush_doc());
      } else {
        if (doc.empty()) doc_line = line_no;
        if (!doc.empty()) doc += '\n';
        doc += line;
      }
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      std::string what;
      try {
        const json unused = json::parse(line);
        what = "unexpected parse success";
      } catch (const json::exception& e) {  // parse_error, or out_of_range for a huge number
        what = e.what();
      }
      return LineError(line_no, "invalid JSON (" + what + ")");
    }
    if (!j.is_object()) return LineError(line_no, "expected a JSON object");
    if (j.contains("messages")) {
      if (!tmpl) {
        const std::string& src =
            opts.chat_template.empty() ? tok.chat_template() : opts.chat_template;
        auto t = tokenizer::ChatTemplate::ParseOrDefault(src);
        if (!t.ok()) return InvalidArgumentError("chat template: " + t.status().message());
        tmpl = std::move(*t);
      }
      CHORUS_ASSIGN_OR_RETURN(Sample s, ChatSample(j["messages"], line_no, *tmpl, tok, opts));
      out.push_back(std::move(s));
    } else if (j.contains("prompt") || j.contains("completion")) {
      CHORUS_ASSIGN_OR_RETURN(std::string prompt, StringField(j, "prompt", line_no));
      CHORUS_ASSIGN_OR_RETURN(std::string completion, StringField(j, "completion", line_no));
      if (completion.empty()) return LineError(line_no, "empty completion");
      b.Add(prompt, false, true);
      b.Add(completion, true, prompt.empty());
      b.AddEos();
      Sample s = b.Take(line_no);
      CHORUS_RETURN_IF_ERROR(CheckLength(s, line_no, opts));
      out.push_back(std::move(s));
    } else if (j.contains("text")) {
      CHORUS_ASSIGN_OR_RETURN(std::string text, StringField(j, "text", line_no));
      if (text.empty()) return LineError(line_no, "empty text");
      b.Add(text, true, true);
      Sample s = b.Take(line_no);
      CHORUS_RETURN_IF_ERROR(CheckLength(s, line_no, opts));
      out.push_back(std::move(s));
    } else {
      return LineError(line_no,
                       "expected \"prompt\" and \"completion\", \"messages\", or \"text\"");
    }
  }
  if (!jsonl) CHORUS_RETURN_IF_ERROR(flush_doc());
  if (out.empty()) return InvalidArgumentError("no training sample in the data");
  return out;
}

Result<std::vector<Sample>> LoadSamples(const std::string& path, const tokenizer::Tokenizer& tok,
                                        const DataOptions& opts) {
  auto text = ReadFileToString(path, static_cast<size_t>(opts.max_file_bytes));
  if (!text.ok()) {
    return Status(text.status().code(), path + ": " + text.status().message() +
                                            " (data files are limited to " +
                                            std::to_string(opts.max_file_bytes) + " bytes)");
  }
  const bool jsonl = path.ends_with(".jsonl") || path.ends_with(".json");
  auto samples = ParseSamples(*text, jsonl, tok, opts);
  if (!samples.ok())
    return Status(samples.status().code(), path + ": " + samples.status().message());
  return samples;
}

std::vector<PackedSeq> Pack(const std::vector<Sample>& samples, std::span<const int64_t> order,
                            int64_t seq_len) {
  std::vector<PackedSeq> out;
  std::vector<int64_t> used;  // tokens per open sequence
  for (int64_t idx : order) {
    const int64_t len = static_cast<int64_t>(samples[static_cast<size_t>(idx)].tokens.size());
    // First fit among the last kOpenSequences sequences (older ones are nearly full anyway),
    // so packing stays linear in the number of samples.
    constexpr size_t kOpenSequences = 64;
    size_t k = out.size() > kOpenSequences ? out.size() - kOpenSequences : 0;
    while (k < out.size() && used[k] + len > seq_len) ++k;
    if (k == out.size()) {
      out.emplace_back();
      used.push_back(0);
    }
    out[k].push_back(idx);
    used[k] += len;
  }
  return out;
}

void AppendSequence(const std::vector<Sample>& samples, const PackedSeq& seq, Batch* b) {
  for (int64_t idx : seq) {
    const Sample& s = samples[static_cast<size_t>(idx)];
    const int32_t start = static_cast<int32_t>(b->tokens.size());
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      b->tokens.push_back(s.tokens[static_cast<size_t>(i)]);
      b->positions.push_back(static_cast<int32_t>(i));
      b->seg_start.push_back(start);
      b->targets.push_back(i + 1 < n && s.loss[static_cast<size_t>(i + 1)]
                               ? s.tokens[static_cast<size_t>(i + 1)]
                               : -1);
    }
  }
}

}  // namespace chorus::train
