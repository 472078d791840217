// SentencePiece models (tokenizer.model) through Debian's libsentencepiece. Chorus adds what the
// library does not do: splitting on control tokens written in the text (parse_special, as HF's
// LlamaTokenizer and llama.cpp do) and per-token decoding for streaming.
#include <sentencepiece_processor.h>

#include <unordered_map>

#include "chorus/tokenizer/added_tokens.h"
#include "chorus/tokenizer/internal.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer::internal {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status Init(std::string_view bytes, std::string_view name) {
    try {
      const auto st = sp_.LoadFromSerializedProto(bytes);
      if (!st.ok()) {
        return InvalidArgumentError(std::string(name) +
                                    ": not a valid SentencePiece model: " + st.ToString());
      }
    } catch (const std::exception& e) {
      return InvalidArgumentError(std::string(name) +
                                  ": not a valid SentencePiece model: " + e.what());
    }
    const int n = sp_.GetPieceSize();
    if (n <= 0) return InvalidArgumentError(std::string(name) + ": SentencePiece model is empty");
    decoded_.resize(n);
    std::vector<int32_t> special;
    std::vector<AddedToken> control;
    for (int id = 0; id < n; ++id) {
      const std::string& p = sp_.IdToPiece(id);
      piece_to_id_.emplace(p, id);
      if (sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsUnused(id)) {
        special.push_back(id);
        if (!sp_.IsUnused(id)) control.push_back(AddedToken{p, id, /*special=*/true});
        continue;
      }
      const int b = sp_.IsByte(id) ? ParseBytePiece(p) : -1;
      if (b >= 0) {
        decoded_[id] = std::string(1, static_cast<char>(b));
        continue;
      }
      std::string& d = decoded_[id];
      for (size_t i = 0; i < p.size();) {
        if (std::string_view(p).substr(i, 3) == kSpmSpace) {
          d.push_back(' ');
          i += 3;
        } else {
          d.push_back(p[i++]);
        }
      }
    }
    set_special_ids(std::move(special));
    control_.Build(std::move(control));
    set_bos_id(sp_.bos_id());
    if (sp_.eos_id() >= 0) set_eos_ids({sp_.eos_id()});
    set_add_bos(sp_.bos_id() >= 0);
    if (sp_.pad_id() >= 0 && sp_.pad_id() < n) set_pad_id(sp_.pad_id());
    return OkStatus();
  }

  std::string SerializedModel() const { return std::string(sp_.serialized_model_proto()); }

  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& opts) const override {
    std::vector<int32_t> out;
    if (opts.add_bos && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    std::vector<int> ids;
    auto encode_text = [&](std::string_view s) {
      ids.clear();
      try {
        if (sp_.Encode(s, &ids).ok()) out.insert(out.end(), ids.begin(), ids.end());
      } catch (const std::exception&) {
        // libsentencepiece does not throw on encode; nothing to add if it ever did.
      }
    };
    for (const Segment& seg : control_.Split(text, opts.parse_special)) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
      } else {
        encode_text(seg.text);
      }
    }
    if (opts.add_eos && add_eos_ && !eos_ids_.empty()) out.push_back(eos_ids_.front());
    return out;
  }

  std::string TokenBytes(int32_t prev_id, int32_t id, bool include_special) const override {
    if (id < 0 || id >= vocab_size()) return {};
    if (IsSpecial(id)) return include_special ? sp_.IdToPiece(id) : std::string();
    const std::string& s = decoded_[id];
    if (!s.empty() && s[0] == ' ' && (prev_id < 0 || (!include_special && prev_id == bos_id_))) {
      return s.substr(1);
    }
    return s;
  }

  std::string_view Piece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return {};
    return sp_.IdToPiece(id);
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(decoded_.size()); }
  std::string_view kind() const override { return "sentencepiece"; }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    auto it = piece_to_id_.find(std::string(piece));
    if (it == piece_to_id_.end()) return std::nullopt;
    return it->second;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::string> decoded_;
  std::unordered_map<std::string, int32_t> piece_to_id_;
  AddedTokenMatcher control_;
};

}  // namespace

std::optional<std::string> SentencePieceModelProto(const Tokenizer& tok) {
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tok);
  if (sp == nullptr) return std::nullopt;
  return sp->SerializedModel();
}

Result<std::unique_ptr<Tokenizer>> SentencePieceFromBytes(std::string_view bytes,
                                                          std::string_view name) {
  auto tok = std::make_unique<SentencePieceTokenizer>();
  CHORUS_RETURN_IF_ERROR(tok->Init(bytes, name));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace chorus::tokenizer::internal
