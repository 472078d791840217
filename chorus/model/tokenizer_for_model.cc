// Kept apart from loader.cc so that code which only needs weights does not link the tokenizers.
#include <sys/stat.h>

#include "chorus/formats/gguf.h"
#include "chorus/model/loader.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::model {

namespace {

Result<std::unique_ptr<tokenizer::Tokenizer>> TokenizerFor(ModelFormat format,
                                                           const std::string& source,
                                                           const std::string& override_path) {
  if (!override_path.empty()) return tokenizer::LoadTokenizer(override_path);
  switch (format) {
    case ModelFormat::kHfDirectory:
      return tokenizer::LoadTokenizer(source);
    case ModelFormat::kGguf: {
      CHORUS_ASSIGN_OR_RETURN(auto g, formats::GgufFile::Open(source));
      return tokenizer::TokenizerFromGguf(*g);
    }
    case ModelFormat::kLlama2c: {
      // llama2.c's run.c defaults to tokenizer.bin; look beside the checkpoint.
      std::string dir = source;
      size_t slash = dir.find_last_of('/');
      dir = slash == std::string::npos ? "." : dir.substr(0, slash);
      std::string candidate = dir + "/tokenizer.bin";
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0) return tokenizer::LoadTokenizer(candidate);
      return InvalidArgumentError(
          source + ": llama2.c checkpoints carry no tokenizer; pass --tokenizer PATH");
    }
    case ModelFormat::kSynthetic:
      break;
  }
  return InvalidArgumentError("model has no tokenizer; pass --tokenizer PATH");
}

}  // namespace

Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizerFor(const Model& model,
                                                               const std::string& override_path) {
  return TokenizerFor(model.format(), model.source(), override_path);
}

Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizerFor(const ModelFile& file,
                                                               const std::string& override_path) {
  return TokenizerFor(file.format, file.source, override_path);
}

}  // namespace chorus::model
