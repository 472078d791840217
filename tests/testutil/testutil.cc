#include "tests/testutil/testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace chorus::testing {

std::string SharedModelsDir() {
  return std::string(CHORUS_TESTUTIL_SOURCE_DIR) + "/../shared/models";
}

bool HaveSharedModel(const std::string& relative) {
  struct stat st {};
  return ::stat((SharedModelsDir() + "/" + relative).c_str(), &st) == 0;
}

bool ModelsRequired() {
  const char* v = std::getenv("CHORUS_REQUIRE_MODELS");
  return v != nullptr && std::string(v) == "1";
}

namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;
void Cleanup() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) return;
  for (const auto& d : *g_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}
}  // namespace

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "chorus_test_XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = ::mkdtemp(buf.data());
  if (p == nullptr) return "/tmp";
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) {
    g_dirs = new std::vector<std::string>();
    std::atexit(Cleanup);
  }
  g_dirs->push_back(p);
  return p;
}

}  // namespace chorus::testing
