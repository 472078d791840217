// Tokenizer: text <-> token ids for every tokenizer family Chorus loads:
//   * SentencePiece BPE with byte fallback — from tokenizer.model (libsentencepiece), or from
//     tokenizer.json / GGUF metadata (Chorus's own implementation);
//   * byte-level BPE (GPT-2, Llama-3, Qwen2 pre-tokenizer regexes) — tokenizer.json / GGUF;
//   * the llama2.c tokenizer (.bin with scores).
// Special/added tokens are matched in the text before the model runs when
// EncodeOptions::parse_special is set.
//
// Thread-safety: immutable after loading; Encode/Decode are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::formats {
class GgufFile;
}

namespace chorus::tokenizer {

struct EncodeOptions {
  // Prepend BOS (only when the tokenizer has one and its config asks for it, i.e.
  // add_bos_token; a request can turn it off).
  bool add_bos = true;
  // Recognise special/added tokens written in the text ("<|im_start|>", "</s>", ...).
  bool parse_special = true;
  // Append EOS (only when the tokenizer's config asks for it, i.e. add_eos_token — rare).
  bool add_eos = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& opts) const = 0;

  // The bytes token `id` contributes to the text when it follows `prev_id` (-1 = start of
  // text). Handles SentencePiece "▁" → space, byte-fallback tokens <0xAB> → one raw byte,
  // byte-level BPE unicode → bytes, the leading-space strip after BOS, and special tokens
  // (empty unless `include_special`). May return a partial UTF-8 sequence.
  virtual std::string TokenBytes(int32_t prev_id, int32_t id, bool include_special) const = 0;

  // The raw vocabulary string of `id` (for inspect/logprobs "token" fields).
  virtual std::string_view Piece(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::string_view kind() const = 0;  // "sentencepiece", "spm-bpe", "byte-bpe", "llama2c"

  int32_t bos_id() const { return bos_id_; }  // -1 when none
  // Padding id (tokenizer_config.json pad_token, SentencePiece pad_id); -1 when none. Only
  // carried along (e.g. into exported files); Chorus never pads token sequences.
  int32_t pad_id() const { return pad_id_; }
  // End-of-generation ids (EOS plus e.g. <|eot_id|>, from generation_config.json).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool IsEos(int32_t id) const;
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool IsSpecial(int32_t id) const;
  // Returns the id of `piece` if it is in the vocabulary.
  virtual std::optional<int32_t> PieceToId(std::string_view piece) const = 0;

  // Decodes a whole sequence (no BOS/EOS text unless include_special).
  std::string Decode(std::span<const int32_t> ids, bool include_special = false) const;

  // Settings from tokenizer_config.json / generation_config.json / GGUF.
  void set_bos_id(int32_t id) { bos_id_ = id; }
  void set_pad_id(int32_t id) { pad_id_ = id; }
  void set_eos_ids(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }
  void set_add_bos(bool v) { add_bos_ = v; }
  void set_add_eos(bool v) { add_eos_ = v; }
  // Replaces the set of special ids (sorted and deduplicated here).
  void set_special_ids(std::vector<int32_t> ids);
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  // The Jinja chat template from tokenizer_config.json or GGUF (empty when none).
  const std::string& chat_template() const { return chat_template_; }
  void set_chat_template(std::string t) { chat_template_ = std::move(t); }

 protected:
  int32_t bos_id_ = -1;
  int32_t pad_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::vector<int32_t> special_ids_;  // sorted
  bool add_bos_ = true;
  bool add_eos_ = false;
  std::string chat_template_;
};

// Streams text from tokens without ever emitting a broken UTF-8 sequence: bytes of an
// incomplete code point are held until it completes (invalid bytes become U+FFFD when it is
// clear they cannot complete).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer* tok, bool include_special = false)
      : tok_(tok), include_special_(include_special) {}
  // Returns the newly completed text (possibly empty).
  std::string Push(int32_t id);
  // Returns whatever is still held (incomplete sequences as U+FFFD).
  std::string Flush();
  // Tells the detokenizer which token precedes the first pushed one (the prompt's last token),
  // so e.g. the space after BOS is stripped exactly as in a whole-sequence decode.
  void SetPrevious(int32_t id) { prev_ = id; }

 private:
  const Tokenizer* tok_;
  bool include_special_;
  int32_t prev_ = -1;
  std::string pending_;
};

// Loads a tokenizer from a path: a directory (tokenizer.json preferred, else tokenizer.model,
// plus tokenizer_config.json / generation_config.json / special_tokens_map.json beside it),
// a tokenizer.json, a tokenizer.model, or a llama2.c tokenizer .bin. Errors name the file.
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

// Builds the tokenizer embedded in a GGUF file's metadata (tokenizer.ggml.*).
Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const formats::GgufFile& gguf);

// Builds a tokenizer from the text of a tokenizer.json (HF tokenizers format) and, optionally,
// of a tokenizer_config.json (empty = none). `name` is used in error messages. Never throws,
// whatever the bytes (the fuzz target feeds arbitrary input here).
Result<std::unique_ptr<Tokenizer>> TokenizerFromJsonString(
    std::string_view json, std::string_view config_json = {},
    std::string_view name = "tokenizer.json");

// HF's clean_up_tokenization_spaces post-processing of decoded text (" ." -> ".", " n't" ->
// "n't", ...). Not applied by Decode (it is not streamable); offered for callers that want
// transformers-identical text for tokenizers whose config enables it.
std::string CleanUpTokenizationSpaces(std::string_view text);

}  // namespace chorus::tokenizer
