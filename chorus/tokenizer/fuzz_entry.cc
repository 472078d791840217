#include "chorus/tokenizer/fuzz_entry.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "chorus/base/check.h"
#include "chorus/tokenizer/chat_template.h"
#include "chorus/tokenizer/tokenizer.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer {

bool FuzzTokenizerJsonInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tok = TokenizerFromJsonString(json, {}, "fuzz.json");
  if (!tok.ok()) return false;
  static const std::string_view kInputs[] = {
      "Hello world",
      " hello  there\n\n\tok ",
      "<s>hi</s><|endoftext|><|im_start|>user",
      "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE7\x94\x9F\xE6\xB4\xBB",
      "bad \xFF\xC3 utf8 \xE2\x82",
      "",
  };
  for (std::string_view text : kInputs) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*tok)->Encode(text, EncodeOptions{true, special, true});
      for (int32_t id : ids) {
        CHORUS_CHECK(id >= 0 && id < (*tok)->vocab_size()) << "id " << id << " out of range";
      }
      const std::string decoded = (*tok)->Decode(ids, special);
      CHORUS_CHECK(internal::SanitizeUtf8(decoded) == decoded) << "Decode gave invalid UTF-8";
      StreamingDetokenizer detok(tok->get(), special);
      std::string streamed;
      for (int32_t id : ids) streamed += detok.Push(id);
      streamed += detok.Flush();
      CHORUS_CHECK(streamed == decoded) << "streamed text differs from Decode()";
    }
  }
  for (int32_t id : {-1, 0, 1, (*tok)->vocab_size() - 1, (*tok)->vocab_size(), 1 << 30}) {
    (*tok)->TokenBytes(-1, id, true);
    (*tok)->Piece(id);
  }
  return true;
}

bool FuzzChatTemplateInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) {
    CHORUS_CHECK(tmpl.status().code() == StatusCode::kInvalidArgument) << tmpl.status().ToString();
    return false;
  }
  static const nlohmann::ordered_json kConversations = nlohmann::ordered_json::parse(R"([
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 18.5}"},
     {"role": "user", "content": "caf\u00e9 \ud83d\ude00 \u03a3\u03a3 \u0130"}]
  ])");
  ChatRenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.now_unix_seconds = 0;
  // Tight limits keep each run short; hitting one is a normal outcome.
  o.max_steps = 200'000;
  o.max_alloc_bytes = 8 << 20;
  o.max_output_bytes = 1 << 20;
  o.max_call_depth = 16;
  for (const auto& conv : kConversations) {
    for (bool with_tools : {false, true}) {
      o.add_generation_prompt = with_tools;
      o.extra_context = nlohmann::ordered_json::object();
      o.extra_context["tools"] =
          with_tools ? nlohmann::ordered_json::parse(
                           R"([{"type": "function", "function": {"name": "get_weather",
                               "parameters": {"type": "object", "properties":
                               {"city": {"type": "string"}}}}}])")
                     : nlohmann::ordered_json(nullptr);
      o.extra_context["documents"] = nullptr;
      auto r = tmpl->RenderJson(conv, o);
      if (!r.ok()) {
        CHORUS_CHECK(r.status().code() == StatusCode::kInvalidArgument ||
                     r.status().code() == StatusCode::kResourceExhausted)
            << r.status().ToString();
        continue;
      }
      CHORUS_CHECK(r->size() <= o.max_output_bytes) << "render exceeded its output limit";
      if (internal::SanitizeUtf8(source) == source) {
        CHORUS_CHECK(internal::SanitizeUtf8(*r) == *r) << "valid UTF-8 in, invalid UTF-8 out";
      }
    }
  }
  return true;
}

namespace {

nlohmann::json AddedTokenJson(int id, const std::string& content, bool special, bool lstrip = false,
                              bool rstrip = false) {
  return {{"id", id},         {"content", content},  {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

}  // namespace

std::string SmallSpmTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab[buf] = 3 + b;
  }
  const char* const pieces[] = {"\u2581",    "h",  "e",           "l",       "o",
                                "w",         "r",  "d",           "\u2581h", "el",
                                "\u2581hel", "lo", "\u2581hello", "\u2581w", "or",
                                "\u2581wor", "ld", "\u2581world"};
  int id = 259;
  for (const char* p : pieces) vocab[p] = id++;
  nlohmann::json merges = {"\u2581 h", "e l", "\u2581h el", "l o", "\u2581hel lo",
                           "\u2581 w", "o r", "\u2581w or", "l d", "\u2581wor ld"};
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {AddedTokenJson(0, "<unk>", true), AddedTokenJson(1, "<s>", true),
        AddedTokenJson(2, "</s>", true)}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump();
}

std::string SmallByteLevelTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[internal::ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  }
  // "Ġ" is the byte-level form of a space.
  const char* const pieces[] = {"he",      "\u0120t", "\u0120the", "ll", "llo",
                                "\u0120w", "or",      "\u0120wor", "ld", "\u0120world"};
  int id = 256;
  for (const char* p : pieces) vocab[p] = id++;
  nlohmann::json merges = {"h e",      "\u0120 t", "\u0120t he", "l l", "ll o",
                           "\u0120 w", "o r",      "\u0120w or", "l d", "\u0120wor ld"};
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {AddedTokenJson(266, "<|endoftext|>", true),
        AddedTokenJson(267, "<|im_start|>", true, false, true), AddedTokenJson(268, "  ", false)}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump();
}

std::vector<std::string> TokenizerJsonFuzzSeeds() {
  return {SmallSpmTokenizerJson(), SmallByteLevelTokenizerJson()};
}

}  // namespace chorus::tokenizer
