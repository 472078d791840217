// Exports any loaded tokenizer so a converted model carries its own vocabulary:
//   * as GGUF metadata (llama.cpp's tokenizer.ggml.* keys): "llama" for SentencePiece-style
//     vocabularies (tokens with "▁" for spaces, scores, token types), "gpt2" for byte-level BPE
//     (tokens, types, merges, tokenizer.ggml.pre); bos/eos/eot/eom/unknown/padding ids,
//     add_bos/add_eos, add_space_prefix, tokenizer.chat_template;
//   * as a Hugging Face directory: tokenizer.json (model BPE; SentencePiece-style vocabularies get
//     byte_fallback and merges derived from the scores the way HF's SentencePiece converters derive
//     them; byte-level ones a ByteLevel pipeline), tokenizer_config.json (bos/eos/unk/pad tokens,
//     add_bos/add_eos, added_tokens_decoder, chat_template) and, when there are several
//     end-of-generation ids, generation_config.json.
//
// Every tokenizer kind is accepted: "sentencepiece" (BPE models with the identity normalizer),
// "spm-bpe", "byte-bpe" and "llama2c". The llama2.c tokenizer becomes a proper SentencePiece
// vocabulary: " " -> "▁", "\n<s>\n"/"\n</s>\n" -> "<s>"/"</s>" (control), "<0xNN>" byte tokens.
//
// Fidelity: reloading the output (TokenizerFromGguf / LoadTokenizer on the directory) gives the
// same ids and the same decoded text, with these documented exceptions where the target format
// cannot express the source:
//   * llama2.c: its prefix space only at the very start of the text becomes SentencePiece's
//     prefix after every special token, its special tokens become matchable in the text, and its
//     decode strips the leading space only after BOS (llama2.c) vs. also at the start (SPM);
//   * SentencePiece user-defined pieces become added tokens: the text after one gets the "▁"
//     prefix (as after every added token in HF's legacy Llama pipeline and in Chorus's GGUF
//     reader), where libsentencepiece adds none;
//   * GGUF has no added-token lstrip/rstrip, no Metaspace "only if missing" prefix and no
//     "prefix only at the start"; HF merges are ranks, GGUF "llama" merges are scores. A
//     conversion that would change tokenization in ways not listed here is refused
//     (kUnimplemented naming the reason), e.g. merges that are not consistent with any scores.
//
// Thread-safety: the functions only read the tokenizer (which is immutable).
#pragma once

#include <cstdint>
#include <string>

#include "chorus/base/status.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::formats {
class GgufWriter;
}

namespace chorus::tokenizer {

struct GgufExportOptions {
  // When > vocab_size(): the token list is padded to this many entries with unused
  // "[PAD<id>]" tokens, as llama.cpp's converter does for models whose embedding has more rows
  // than the tokenizer has tokens. 0 = no padding. Must not be smaller than vocab_size().
  int64_t pad_to_vocab_size = 0;
};

// Writes the tokenizer.* metadata keys into `w` (replacing any already set).
Status ExportToGguf(const Tokenizer& tok, formats::GgufWriter* w,
                    const GgufExportOptions& opts = {});

// The text of the Hugging Face tokenizer files.
struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;  // empty unless the tokenizer has several EOS ids
};
Result<HfTokenizerFiles> ExportToHfFiles(const Tokenizer& tok);

// Writes tokenizer.json, tokenizer_config.json (and generation_config.json, see above) into
// `dir` (created if missing; files replaced atomically).
Status ExportToHfDirectory(const Tokenizer& tok, const std::string& dir);

}  // namespace chorus::tokenizer
