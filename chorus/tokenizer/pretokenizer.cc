#define PCRE2_CODE_UNIT_WIDTH 8
#include "chorus/tokenizer/pretokenizer.h"

#include <pcre2.h>

namespace chorus::tokenizer::internal {

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool remove_matches = false;
  bool jit = false;
  ~Compiled() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Status PreTokenizer::Init(const std::vector<PreTokenizerStep>& steps) {
  steps_.clear();
  for (const auto& s : steps) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto c = std::make_shared<Compiled>();
    c->remove_matches = s.remove_matches;
    c->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(s.pattern.data()), s.pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (c->code == nullptr) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return InvalidArgumentError("pre-tokenizer regex '" + s.pattern + "' does not compile at " +
                                  std::to_string(err_off) + ": " +
                                  reinterpret_cast<const char*>(buf));
    }
    c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
    steps_.push_back(std::move(c));
  }
  return OkStatus();
}

namespace {

// Splits every word of `in` with one regex into `out` (Isolated: matches and the gaps between
// them are words; Removed: only the gaps).
void SplitOne(const pcre2_code* code, bool jit, bool remove_matches,
              const std::vector<std::string_view>& in, std::vector<std::string_view>* out,
              pcre2_match_data* md) {
  for (std::string_view w : in) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(w.data());
    size_t pos = 0;
    size_t gap_start = 0;
    while (pos < w.size()) {
      int rc = jit ? pcre2_jit_match(code, subject, w.size(), pos, 0, md, nullptr)
                   : pcre2_match(code, subject, w.size(), pos, 0, md, nullptr);
      if (rc < 0 && jit && rc != PCRE2_ERROR_NOMATCH) {
        // JIT stack exhausted on a pathological input: the interpreter has larger limits.
        rc = pcre2_match(code, subject, w.size(), pos, PCRE2_NO_JIT, md, nullptr);
      }
      if (rc < 0) break;  // no more matches (or a resource limit): the rest is one gap
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t ms = ov[0], me = ov[1];
      if (ms < pos || me < ms || me > w.size()) break;
      if (me == ms) {
        // Empty match: step one character forward so the loop always progresses.
        pos = ms + 1;
        while (pos < w.size() && (static_cast<uint8_t>(w[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (ms > gap_start) out->push_back(w.substr(gap_start, ms - gap_start));
      if (!remove_matches) out->push_back(w.substr(ms, me - ms));
      gap_start = pos = me;
    }
    if (w.size() > gap_start) out->push_back(w.substr(gap_start));
  }
}

}  // namespace

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* words) const {
  words->clear();
  if (text.empty()) return;
  words->push_back(text);
  if (steps_.empty()) return;
  std::vector<std::string_view> tmp;
  for (const auto& step : steps_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(step->code, nullptr);
    if (md == nullptr) return;  // out of memory: keep the current split
    tmp.clear();
    SplitOne(step->code, step->jit, step->remove_matches, *words, &tmp, md);
    pcre2_match_data_free(md);
    words->swap(tmp);
  }
}

}  // namespace chorus::tokenizer::internal
