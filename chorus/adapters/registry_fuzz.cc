// The registry state-file fuzzer's body (registry_fuzz.h).
#include "chorus/adapters/registry_fuzz.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "chorus/adapters/registry_state.h"
#include "chorus/base/check.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;
using registry_internal::ReadState;
using registry_internal::SerializeState;

const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/chorus_registry_fuzz_XXXXXX";
    CHORUS_CHECK(::mkdtemp(pattern.data()) != nullptr);
    static const std::string keep = pattern;
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(keep, ec);
    });
    return pattern;
  }();
  return dir;
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHORUS_CHECK(static_cast<bool>(out));
}

}  // namespace

bool FuzzRegistryStateInput(const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/registry.json";
  WriteBytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
  auto state = ReadState(path);
  if (!state.ok()) {
    const StatusCode c = state.status().code();
    CHORUS_CHECK(c == StatusCode::kDataLoss || c == StatusCode::kUnimplemented)
        << state.status().ToString();
    CHORUS_CHECK(state.status().message().rfind(path, 0) == 0) << state.status().ToString();
    return false;
  }
  CHORUS_CHECK(state->has_value());  // the file exists
  const registry_internal::RegistryState& st = **state;
  for (const auto& [name, info] : st.entries) {
    CHORUS_CHECK(name == info.name);
    CHORUS_CHECK(info.version < st.next_version);
  }
  const std::string text = SerializeState(st.entries, st.next_version);
  const std::string again_path = ScratchDir() + "/again.json";
  WriteBytes(again_path, text);
  auto again = ReadState(again_path);
  CHORUS_CHECK(again.ok() && again->has_value()) << again.status().ToString();
  CHORUS_CHECK(SerializeState((*again)->entries, (*again)->next_version) == text);
  return true;
}

std::vector<std::string> RegistryStateFuzzSeeds() {
  std::map<std::string, AdapterInfo> entries;
  AdapterInfo a;
  a.name = "support-bot";
  a.path = "/srv/adapters/support-bot";
  a.format = "peft";
  a.rank = 16;
  a.target_modules = {"q_proj", "v_proj"};
  a.alpha = 32;
  a.scale = 2;
  a.base_model = "meta-llama/Llama-3.2-1B";
  a.content_hash = 0x0123456789abcdefull;
  a.version = 3;
  a.bytes = 123456;
  a.created = 1764000000;
  a.files = {{"/srv/adapters/support-bot/adapter_config.json", 612, 1764000000123456789},
             {"/srv/adapters/support-bot/adapter_model.safetensors", 122844, 1764000000223456789}};
  entries[a.name] = a;
  AdapterInfo b;
  b.name = "legal.v2";
  b.path = "/srv/adapters/legal.gguf";
  b.format = "gguf";
  b.rank = 8;
  b.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  b.alpha = 8;
  b.scale = 2.828427f;
  b.use_rslora = true;
  b.version = 5;
  b.owner = "acme";
  b.bytes = 5000;
  b.files = {{"/srv/adapters/legal.gguf", 5000, 1}};
  entries[b.name] = b;
  AdapterInfo d;
  d.name = "full-ft";
  d.kind = "delta";
  d.format = "delta";
  d.path = "/srv/deltas/full-ft.delta";
  d.version = 1;
  d.bytes = 99;
  d.files = {{"/srv/deltas/full-ft.delta", 99, 2}};
  entries[d.name] = d;
  std::vector<std::string> seeds = {SerializeState(entries, 6), SerializeState({}, 1)};
  entries.erase("full-ft");
  seeds.push_back(SerializeState(entries, 9));
  return seeds;
}

}  // namespace chorus::adapters
