#include "apps/chorus/default_model.h"

#include <sys/stat.h>

#include <cstdlib>
#include <set>
#include <vector>

#include "chorus/formats/gguf.h"
#include "chorus/model/convert.h"
#include "chorus/model/synthetic.h"

namespace chorus::apps {
namespace {

// Bump when the default model's bytes change, so stale cached files are not reused.
constexpr const char* kDefaultModelFile = "chorus-default-tiny-v1.gguf";

std::string CacheDir() {
  if (const char* d = std::getenv("CHORUS_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/chorus";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/chorus";
  return "/tmp/chorus-cache";
}

Status MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, "cannot create " + cur);
      }
    }
    if (i < path.size()) cur += path[i];
  }
  return OkStatus();
}

// A SentencePiece-BPE vocabulary of exactly `vocab` pieces: <unk> <s> </s>, 256 byte-fallback
// pieces, "▁", single characters, then prefixes of common English words (so every piece can be
// reached by pairwise merges). Scores favour longer pieces.
void AddTokenizer(formats::GgufWriter* w, int64_t vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};  // unknown, control, control
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.emplace_back(buf);
    types.push_back(6);  // byte
  }
  const std::string space = "\xE2\x96\x81";  // ▁
  std::vector<std::string> pieces = {space};
  for (char ch = 'a'; ch <= 'z'; ++ch) pieces.emplace_back(1, ch);
  for (char ch = 'A'; ch <= 'Z'; ++ch) pieces.emplace_back(1, ch);
  for (const char* p : {".", ",", "!", "?", "'", "\"", "-", ":", "0", "1", "2", "3"})
    pieces.emplace_back(p);
  const char* words[] = {
      "the",  "and",  "was",  "she",   "he",   "they",   "a",     "to",   "of",    "in",
      "it",   "with", "said", "day",   "one",  "time",   "upon",  "once", "there", "little",
      "girl", "boy",  "play", "happy", "big",  "friend", "saw",   "went", "mom",   "dog",
      "cat",  "sun",  "tree", "park",  "ball", "named",  "loved", "very", "had",   "her",
      "his",  "not",  "but",  "so",    "you",  "we",     "for",   "on",   "is"};
  std::set<std::string> seen(pieces.begin(), pieces.end());
  for (const char* word : words) {
    std::string wd = space + word;
    for (size_t k = space.size() + 1; k <= wd.size(); ++k) {
      std::string p = wd.substr(0, k);
      if (seen.insert(p).second) pieces.push_back(p);
    }
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (const auto& p : pieces) {
    if (static_cast<int64_t>(tokens.size()) >= vocab) break;
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(-static_cast<float>(tokens.size()) / static_cast<float>(p.size()));
  }
  // Pad with unused pieces so the vocabulary matches the model exactly.
  while (static_cast<int64_t>(tokens.size()) < vocab) {
    tokens.push_back("<unused" + std::to_string(tokens.size()) + ">");
    types.push_back(5);  // unused
    scores.push_back(-1e9f);
  }
  w->SetString("tokenizer.ggml.model", "llama");
  w->SetStringArray("tokenizer.ggml.tokens", tokens);
  w->SetFloat32Array("tokenizer.ggml.scores", scores);
  w->SetInt32Array("tokenizer.ggml.token_type", types);
  w->SetUint32("tokenizer.ggml.bos_token_id", 1);
  w->SetUint32("tokenizer.ggml.eos_token_id", 2);
  w->SetUint32("tokenizer.ggml.unknown_token_id", 0);
  w->SetBool("tokenizer.ggml.add_bos_token", true);
  w->SetString("tokenizer.chat_template",
               "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + "
               "message['content'] + '\\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}");
}

}  // namespace

Result<std::string> CacheDirectory() {
  const std::string dir = CacheDir();
  CHORUS_RETURN_IF_ERROR(MakeDirs(dir));
  return dir;
}

Result<std::string> EnsureDefaultModel() {
  const std::string dir = CacheDir();
  const std::string path = dir + "/" + kDefaultModelFile;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return path;
  CHORUS_RETURN_IF_ERROR(MakeDirs(dir));
  model::SyntheticSpec spec{.shape = "tiny", .dtype = DType::kF32, .seed = 20261122};
  CHORUS_ASSIGN_OR_RETURN(auto m, model::MakeSyntheticModel(spec));
  model::ConvertOptions opts;
  opts.format = model::OutputFormat::kGguf;
  opts.output = path;
  const int64_t vocab = m->config().vocab_size;
  CHORUS_RETURN_IF_ERROR(model::ConvertModel(*m, opts, [vocab](formats::GgufWriter* w) {
    AddTokenizer(w, vocab);
    return OkStatus();
  }));
  return path;
}

}  // namespace chorus::apps
