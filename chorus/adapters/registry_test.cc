// test-labels: unit concurrency
// AdapterRegistry: register / lookup / list / unregister with real PEFT and GGUF adapter files,
// persistence across Open, 409 vs replace, path confinement (.., symlinks, absolute paths),
// bad adapters and bad state files leaving everything unchanged, restart with vanished or
// changed files, RegisterDirectory, the real stories260K LoRA, concurrent readers, and crash
// safety under SIGKILL at random moments.
#include "chorus/adapters/registry.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/logging.h"
#include "chorus/formats/gguf.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;
using model::Linear;

model::ModelConfig TinyConfig() {
  auto c = model::SyntheticConfig("tiny");
  CHORUS_CHECK(c.ok());
  return *c;
}

// Loads a registered adapter the way serving does: the registration's reference, through a
// host cache (which checks the recorded fingerprints and validates against the base).
Result<std::shared_ptr<const adapters::LoraAdapter>> LoadRegistered(const AdapterRegistry& reg,
                                                                    const std::string& name) {
  std::optional<AdapterInfo> info = reg.Lookup(name);
  if (!info) return NotFoundError("adapter '" + name + "' is not registered");
  AdapterCache cache(reg.options().base, int64_t{64} << 20);
  return cache.Get(info->ref());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// The content hash as registry.h specifies it, computed here from the files' bytes: per file
// in path order, its role name + NUL, its size as 8 little-endian bytes, its bytes.
uint64_t ExpectedHash(const std::vector<std::pair<std::string, std::string>>& role_and_path) {
  std::string stream;
  for (const auto& [role, path] : role_and_path) {
    const std::string bytes = ReadAll(path);
    stream += role;
    stream.push_back('\0');
    for (int i = 0; i < 8; ++i)
      stream.push_back(static_cast<char>((bytes.size() >> (8 * i)) & 0xff));
    stream += bytes;
  }
  return Fnv1a64(stream);
}
uint64_t ExpectedPeftHash(const std::string& dir) {
  return ExpectedHash({{"adapter_config.json", dir + "/adapter_config.json"},
                       {"adapter_model.safetensors", dir + "/adapter_model.safetensors"}});
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kError);
    base_ = TinyConfig();
    tmp_ = fs::canonical(testing::TempDir()).string();
    root_ = tmp_ + "/root";
    outside_ = tmp_ + "/outside";
    fs::create_directories(root_);
    fs::create_directories(outside_);
    fs::create_directories(tmp_ + "/state");
    state_ = tmp_ + "/state/registry.json";
  }

  RegistryOptions Options() const {
    RegistryOptions o;
    o.adapter_roots = {root_};
    o.max_lora_rank = 64;
    o.base = base_;
    o.base_model_name = "tiny-base";
    return o;
  }
  std::unique_ptr<AdapterRegistry> OpenOrDie(RegistryOptions o) {
    auto r = AdapterRegistry::Open(state_, std::move(o));
    CHORUS_CHECK(r.ok()) << r.status().ToString();
    return std::move(*r);
  }
  std::unique_ptr<AdapterRegistry> OpenOrDie() { return OpenOrDie(Options()); }

  // A PEFT adapter for `c` at `dir`.
  static void WritePeft(const std::string& dir, const model::ModelConfig& c, int64_t rank,
                        uint64_t seed, std::vector<Linear> targets = {}) {
    RandomLoraSpec s;
    s.rank = rank;
    s.alpha = 2.0f * static_cast<float>(rank);
    s.seed = seed;
    if (!targets.empty()) s.targets = std::move(targets);
    CHORUS_CHECK(WritePeftLora(dir, MakeRandomLora(c, s), c).ok());
  }
  void WriteGguf(const std::string& path, int64_t rank, uint64_t seed) const {
    RandomLoraSpec s;
    s.rank = rank;
    s.alpha = 8.0f;
    s.seed = seed;
    s.targets = {Linear::kQ, Linear::kV};
    CHORUS_CHECK(WriteGgufLora(path, MakeRandomLora(base_, s), base_).ok());
  }

  // Asserts that `op` failed and that the registry, in memory and on disk, did not change.
  template <typename Op>
  void ExpectRefusedUnchanged(AdapterRegistry& reg, Op op, std::vector<StatusCode> codes,
                              const std::string& what) {
    const std::string before_disk = ReadAll(state_);
    const auto before = reg.List();
    const uint64_t before_version = reg.next_version();
    Status s = internal::AsStatus(op());
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_TRUE(std::find(codes.begin(), codes.end(), s.code()) != codes.end())
        << what << ": " << s.ToString();
    EXPECT_EQ(ReadAll(state_), before_disk) << what;
    EXPECT_EQ(reg.next_version(), before_version) << what;
    const auto after = reg.List();
    ASSERT_EQ(after.size(), before.size()) << what;
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].name, before[i].name) << what;
      EXPECT_EQ(after[i].id(), before[i].id()) << what;
    }
  }

  model::ModelConfig base_;
  std::string tmp_, root_, outside_, state_;
};

TEST(Fnv1a64Test, KnownVectors) {
  // Published FNV-1a 64-bit test vectors (Fowler/Noll/Vo).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  // Chaining equals hashing the concatenation.
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
}

TEST(AdapterNameTest, Validity) {
  EXPECT_TRUE(IsValidAdapterName("a"));
  EXPECT_TRUE(IsValidAdapterName("org/sql-lora_v1.2:latest"));
  EXPECT_TRUE(IsValidAdapterName(std::string(128, 'x')));
  EXPECT_FALSE(IsValidAdapterName(""));
  EXPECT_FALSE(IsValidAdapterName(std::string(129, 'x')));
  EXPECT_FALSE(IsValidAdapterName("a b"));
  EXPECT_FALSE(IsValidAdapterName("a\nb"));
  EXPECT_FALSE(IsValidAdapterName("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidAdapterName("a\"b"));
}

TEST_F(RegistryTest, RegisterLookupListUnregister) {
  WritePeft(root_ + "/sql", base_, 8, 1);
  WriteGguf(root_ + "/chat.gguf", 4, 2);
  auto reg = OpenOrDie();
  EXPECT_EQ(reg->size(), 0u);
  EXPECT_TRUE(fs::exists(state_));

  auto a = reg->Register("sql", root_ + "/sql");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->name, "sql");
  EXPECT_EQ(a->path, root_ + "/sql");
  EXPECT_EQ(a->kind, "lora");
  EXPECT_EQ(a->format, "peft");
  EXPECT_EQ(a->rank, 8);
  EXPECT_EQ(a->target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"}));
  EXPECT_FLOAT_EQ(a->alpha, 16.0f);
  EXPECT_FLOAT_EQ(a->scale, 2.0f);
  EXPECT_FALSE(a->use_rslora);
  EXPECT_EQ(a->version, 1u);
  EXPECT_EQ(a->bytes,
            static_cast<int64_t>(fs::file_size(root_ + "/sql/adapter_config.json") +
                                 fs::file_size(root_ + "/sql/adapter_model.safetensors")));
  EXPECT_EQ(a->content_hash, ExpectedPeftHash(root_ + "/sql"));
  EXPECT_GT(a->created, 1600000000);
  EXPECT_TRUE(a->available);
  ASSERT_EQ(a->files.size(), 2u);

  auto b = reg->Register("org/chat:v1", root_ + "/chat.gguf");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->format, "gguf");
  EXPECT_EQ(b->rank, 4);
  EXPECT_EQ(b->target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_FLOAT_EQ(b->alpha, 8.0f);
  EXPECT_FLOAT_EQ(b->scale, 2.0f);
  EXPECT_EQ(b->version, 2u);
  EXPECT_EQ(b->bytes, static_cast<int64_t>(fs::file_size(root_ + "/chat.gguf")));
  EXPECT_EQ(b->content_hash, ExpectedHash({{"adapter.gguf", root_ + "/chat.gguf"}}));
  EXPECT_NE(a->id(), b->id());

  EXPECT_EQ(reg->size(), 2u);
  auto list = reg->List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "org/chat:v1");  // sorted by name
  EXPECT_EQ(list[1].name, "sql");
  auto found = reg->Lookup("sql");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->id(), a->id());
  EXPECT_FALSE(reg->Lookup("nope").has_value());

  // The serving path (the host cache, given the registration's reference) loads the weights in
  // compute layout under the adapter's name and id.
  auto loaded = LoadRegistered(*reg, "sql");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->name(), "sql");
  EXPECT_EQ((*loaded)->max_rank(), 8);
  EXPECT_EQ((*loaded)->id(), a->id());
  EXPECT_EQ(LoadRegistered(*reg, "nope").status().code(), StatusCode::kNotFound);

  CHORUS_EXPECT_OK(reg->Unregister("sql"));
  EXPECT_EQ(reg->Unregister("sql").code(), StatusCode::kNotFound);
  EXPECT_FALSE(reg->Lookup("sql").has_value());
  EXPECT_EQ(reg->size(), 1u);
  // Versions are never reused.
  auto again = reg->Register("sql", root_ + "/sql");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->version, 3u);
  EXPECT_EQ(again->content_hash, a->content_hash);
  EXPECT_NE(again->id(), a->id());
}

TEST_F(RegistryTest, RelativePathsAndPeftFilePaths) {
  WritePeft(root_ + "/team/x", base_, 2, 3);
  auto reg = OpenOrDie();
  auto r = reg->Register("x", "team/x");  // relative to the root
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->path, root_ + "/team/x");
  auto f = reg->Register("x-file", root_ + "/team/x/adapter_config.json");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->path, root_ + "/team/x");
  EXPECT_EQ(f->content_hash, r->content_hash);
  EXPECT_EQ(reg->Register("y", "team/missing").status().code(), StatusCode::kNotFound);
}

TEST_F(RegistryTest, PersistsAcrossOpen) {
  WritePeft(root_ + "/a", base_, 8, 1);
  WritePeft(root_ + "/b", base_, 16, 2, {Linear::kO});
  WriteGguf(root_ + "/c.gguf", 4, 3);
  std::vector<AdapterInfo> before;
  {
    auto reg = OpenOrDie();
    ASSERT_TRUE(reg->Register("a", root_ + "/a").ok());
    ASSERT_TRUE(reg->Register("b", root_ + "/b").ok());
    ASSERT_TRUE(reg->Register("c", root_ + "/c.gguf").ok());
    CHORUS_ASSERT_OK(reg->Unregister("a"));
    before = reg->List();
    // A second process (or a second Open) cannot use the same state while this one is open.
    auto second = AdapterRegistry::Open(state_, Options());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition)
        << second.status().ToString();
  }
  auto reg = OpenOrDie();
  EXPECT_EQ(reg->next_version(), 4u);
  auto after = reg->List();
  ASSERT_EQ(after.size(), 2u);
  for (size_t i = 0; i < after.size(); ++i) {
    const AdapterInfo& x = before[i];
    const AdapterInfo& y = after[i];
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.path, x.path);
    EXPECT_EQ(y.format, x.format);
    EXPECT_EQ(y.rank, x.rank);
    EXPECT_EQ(y.target_modules, x.target_modules);
    EXPECT_EQ(y.alpha, x.alpha);
    EXPECT_EQ(y.scale, x.scale);
    EXPECT_EQ(y.content_hash, x.content_hash);
    EXPECT_EQ(y.version, x.version);
    EXPECT_EQ(y.bytes, x.bytes);
    EXPECT_EQ(y.created, x.created);
    ASSERT_EQ(y.files.size(), x.files.size());
    for (size_t k = 0; k < y.files.size(); ++k) {
      EXPECT_EQ(y.files[k].path, x.files[k].path);
      EXPECT_EQ(y.files[k].size, x.files[k].size);
      EXPECT_EQ(y.files[k].mtime_ns, x.files[k].mtime_ns);
    }
    EXPECT_TRUE(y.available) << y.problem;
  }
  EXPECT_EQ(after[0].name, "b");
  EXPECT_EQ(after[0].rank, 16);
  EXPECT_EQ(after[0].target_modules, std::vector<std::string>{"o_proj"});
  auto d = reg->Register("d", root_ + "/a");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->version, 4u);
}

TEST_F(RegistryTest, ExistingNameIsRefusedUnlessReplaced) {
  WritePeft(root_ + "/v1", base_, 8, 1);
  WritePeft(root_ + "/v2", base_, 8, 2);
  auto reg = OpenOrDie();
  auto first = reg->Register("sql", root_ + "/v1");
  ASSERT_TRUE(first.ok());
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("sql", root_ + "/v2"); }, {StatusCode::kAlreadyExists},
      "existing name");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("sql", root_ + "/v1"); }, {StatusCode::kAlreadyExists},
      "same adapter again");

  auto second = reg->Register("sql", root_ + "/v2", /*replace=*/true);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_GT(second->version, first->version);
  EXPECT_NE(second->content_hash, first->content_hash);
  EXPECT_NE(second->id(), first->id());
  EXPECT_EQ(second->path, root_ + "/v2");
  EXPECT_EQ(reg->size(), 1u);
  EXPECT_EQ(reg->Lookup("sql")->id(), second->id());

  // Replacing with identical bytes still gives a new cache key.
  auto third = reg->Register("sql", root_ + "/v2", /*replace=*/true);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->content_hash, second->content_hash);
  EXPECT_GT(third->version, second->version);
  EXPECT_NE(third->id(), second->id());

  // A failed replacement keeps the old registration.
  fs::create_directories(root_ + "/broken");
  WriteAll(root_ + "/broken/adapter_config.json", "{");
  WriteAll(root_ + "/broken/adapter_model.safetensors", "xx");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("sql", root_ + "/broken", true); },
      {StatusCode::kInvalidArgument, StatusCode::kDataLoss}, "broken replacement");
  EXPECT_EQ(reg->Lookup("sql")->id(), third->id());
}

TEST_F(RegistryTest, PathsOutsideTheRootsAreRefused) {
  WritePeft(outside_ + "/evil", base_, 8, 1);
  WritePeft(root_ + "/good", base_, 8, 2);
  WritePeft(tmp_ + "/root2/sib", base_, 8, 3);  // shares the root's prefix, not its directory
  fs::create_directory_symlink(outside_ + "/evil", root_ + "/link");
  // A PEFT directory inside the root whose weights file points outside.
  fs::create_directories(root_ + "/half");
  fs::copy_file(root_ + "/good/adapter_config.json", root_ + "/half/adapter_config.json");
  fs::create_symlink(outside_ + "/evil/adapter_model.safetensors",
                     root_ + "/half/adapter_model.safetensors");
  // A symlink that stays inside the root is fine.
  fs::create_directory_symlink(root_ + "/good", root_ + "/alias");

  auto reg = OpenOrDie();
  ASSERT_TRUE(reg->Register("keep", root_ + "/good").ok());
  const std::vector<StatusCode> denied = {StatusCode::kPermissionDenied};
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", root_ + "/../outside/evil"); }, denied, "dotdot");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", "../outside/evil"); }, denied, "relative dotdot");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", root_ + "/link"); }, denied, "symlink out");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", outside_ + "/evil"); }, denied, "absolute outside");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", tmp_ + "/root2/sib"); }, denied, "sibling prefix");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", root_ + "/half"); }, denied, "file symlink out");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", "/etc/passwd"); }, denied, "system file");
  // A missing path outside the roots is "outside", not "not found" (no existence oracle).
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", outside_ + "/nope"); }, denied, "missing outside");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("x", root_ + "/nope"); }, {StatusCode::kNotFound},
      "missing inside");

  auto alias = reg->Register("alias", root_ + "/alias");
  ASSERT_TRUE(alias.ok()) << alias.status().ToString();
  EXPECT_EQ(alias->path, root_ + "/good");  // recorded resolved

  // No roots: everything is refused.
  RegistryOptions none = Options();
  none.adapter_roots.clear();
  reg.reset();
  auto closed = OpenOrDie(none);
  ExpectRefusedUnchanged(
      *closed, [&] { return closed->Register("y", root_ + "/good"); }, denied, "no roots");
}

TEST_F(RegistryTest, BadAdaptersAndNamesLeaveTheRegistryUnchanged) {
  WritePeft(root_ + "/good", base_, 8, 1);
  auto reg = OpenOrDie();
  ASSERT_TRUE(reg->Register("keep", root_ + "/good").ok());
  const std::vector<StatusCode> bad = {StatusCode::kInvalidArgument, StatusCode::kDataLoss,
                                       StatusCode::kOutOfRange};

  // Names.
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("", root_ + "/good"); }, {StatusCode::kInvalidArgument},
      "empty name");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register(std::string(129, 'n'), root_ + "/good"); },
      {StatusCode::kInvalidArgument}, "long name");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("a b", root_ + "/good"); }, {StatusCode::kInvalidArgument},
      "space");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("tiny-base", root_ + "/good"); },
      {StatusCode::kInvalidArgument}, "base name");

  // Truncated weights.
  fs::create_directories(root_ + "/trunc");
  fs::copy_file(root_ + "/good/adapter_config.json", root_ + "/trunc/adapter_config.json");
  const std::string st = ReadAll(root_ + "/good/adapter_model.safetensors");
  WriteAll(root_ + "/trunc/adapter_model.safetensors", st.substr(0, st.size() / 2));
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("t", root_ + "/trunc"); }, bad, "truncated safetensors");
  WriteAll(root_ + "/trunc/adapter_model.safetensors", st.substr(0, 5));
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("t", root_ + "/trunc"); }, bad, "5-byte safetensors");
  WriteGguf(root_ + "/g.gguf", 4, 2);
  const std::string gg = ReadAll(root_ + "/g.gguf");
  WriteAll(root_ + "/trunc.gguf", gg.substr(0, gg.size() - 100));
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("t", root_ + "/trunc.gguf"); }, bad, "truncated gguf");

  // Wrong shapes: an adapter for a model with another MLP width.
  model::ModelConfig other = base_;
  other.n_ff = 256;
  WritePeft(root_ + "/other", other, 8, 3);
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("o", root_ + "/other"); }, {StatusCode::kInvalidArgument},
      "wrong shapes");
  // Rank above the limit (64).
  WritePeft(root_ + "/big", base_, 96, 4, {Linear::kQ});
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("big", root_ + "/big"); }, {StatusCode::kInvalidArgument},
      "rank too large");
  // NaN weights.
  {
    RandomLoraSpec s;
    s.targets = {Linear::kQ, Linear::kV};
    LoraWeights w = MakeRandomLora(base_, s);
    static_cast<float*>(w.at(2, Linear::kV).b.mutable_data())[5] =
        std::numeric_limits<float>::quiet_NaN();
    CHORUS_ASSERT_OK(WritePeftLora(root_ + "/nan", w, base_));
  }
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("nan", root_ + "/nan"); }, {StatusCode::kInvalidArgument},
      "NaN");
  // Not an adapter at all, an empty directory, a pickle, a FIFO (must not hang).
  WriteAll(root_ + "/notes.txt", "hello");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("n", root_ + "/notes.txt"); },
      {StatusCode::kInvalidArgument}, "text file");
  fs::create_directories(root_ + "/empty");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("n", root_ + "/empty"); }, {StatusCode::kNotFound},
      "empty dir");
  fs::create_directories(root_ + "/pickle");
  fs::copy_file(root_ + "/good/adapter_config.json", root_ + "/pickle/adapter_config.json");
  WriteAll(root_ + "/pickle/adapter_model.bin", "\x80\x02");
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("n", root_ + "/pickle"); }, {StatusCode::kUnimplemented},
      "pickle");
  ASSERT_EQ(::mkfifo((root_ + "/fifo.gguf").c_str(), 0600), 0);
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("n", root_ + "/fifo.gguf"); },
      {StatusCode::kInvalidArgument}, "fifo");
  fs::create_directories(root_ + "/fifodir");
  fs::copy_file(root_ + "/good/adapter_config.json", root_ + "/fifodir/adapter_config.json");
  ASSERT_EQ(::mkfifo((root_ + "/fifodir/adapter_model.safetensors").c_str(), 0600), 0);
  ExpectRefusedUnchanged(
      *reg, [&] { return reg->Register("n", root_ + "/fifodir"); }, {StatusCode::kInvalidArgument},
      "fifo weights");
  EXPECT_EQ(reg->size(), 1u);
}

TEST_F(RegistryTest, RealStoriesLoraAgainstStories260K) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  CHORUS_REQUIRE_SHARED_MODEL("stories260K-finetunes/things/lora");
  auto m = model::LoadModel(testing::SharedModelsDir() + "/stories260K/stories260K.bin");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const model::ModelConfig& c = (*m)->config();
  ASSERT_EQ(c.n_embd, 64);
  ASSERT_EQ(c.n_ff, 172);
  ASSERT_EQ(c.n_layers, 5);
  RegistryOptions o;
  o.adapter_roots = {testing::SharedModelsDir() + "/stories260K-finetunes"};
  o.base = c;
  o.base_model_name = "stories260K";
  const std::string lora_dir =
      fs::canonical(testing::SharedModelsDir() + "/stories260K-finetunes/things/lora").string();
  {
    auto reg = OpenOrDie(o);
    auto r = reg->Register("things", "things/lora");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->path, lora_dir);
    EXPECT_EQ(r->rank, 8);
    EXPECT_FLOAT_EQ(r->alpha, 16.0f);
    EXPECT_FLOAT_EQ(r->scale, 2.0f);
    EXPECT_EQ(r->target_modules.size(), 7u);
    EXPECT_EQ(r->base_model, "stories260K");
    EXPECT_EQ(r->content_hash, ExpectedPeftHash(lora_dir));
    // The base's own served name is not an adapter name.
    EXPECT_EQ(reg->Register("stories260K", "things/lora").status().code(),
              StatusCode::kInvalidArgument);
    // rank 8 > a limit of 4.
    reg.reset();
    RegistryOptions small = o;
    small.max_lora_rank = 4;
    auto reg4 = OpenOrDie(small);
    EXPECT_EQ(reg4->Register("things4", "things/lora").status().code(),
              StatusCode::kInvalidArgument);
  }
  auto reg = OpenOrDie(o);
  auto loaded = LoadRegistered(*reg, "things");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->max_rank(), 8);
  EXPECT_EQ((*loaded)->n_layers(), 5);
  EXPECT_FLOAT_EQ((*loaded)->module(0, Linear::kQ).scale, 2.0f);
  reg.reset();
  // The same adapter against the tiny base does not fit.
  RegistryOptions tiny = o;
  tiny.base = base_;
  auto wrong = OpenOrDie(tiny);
  // Entries are checked cheaply at Open; the load validates against the base and refuses.
  EXPECT_EQ(LoadRegistered(*wrong, "things").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong->Register("things2", "things/lora").status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(RegistryTest, RegisterDirectory) {
  const std::string dir = root_ + "/lib";
  WritePeft(dir + "/alpha", base_, 8, 1);
  WritePeft(dir + "/beta", base_, 4, 2, {Linear::kQ});
  WriteGguf(dir + "/gamma.gguf", 4, 3);
  {
    formats::GgufWriter w;  // a base-model GGUF: skipped, not an error
    w.SetString("general.type", "model");
    w.SetString("general.architecture", "llama");
    CHORUS_ASSERT_OK(w.Write(dir + "/model.gguf"));
  }
  WritePeft(dir + "/.hidden", base_, 8, 4);
  fs::create_directories(dir + "/no-config");
  WritePeft(dir + "/bad name", base_, 8, 5);
  fs::create_directories(dir + "/trunc");
  fs::copy_file(dir + "/alpha/adapter_config.json", dir + "/trunc/adapter_config.json");
  WriteAll(dir + "/trunc/adapter_model.safetensors", "12345678");
  WriteAll(dir + "/junk.gguf", "GGUF not really");
  fs::create_directory_symlink(outside_, dir + "/escape");

  auto reg = OpenOrDie();
  ASSERT_TRUE(reg->Register("alpha", dir + "/alpha").ok());  // already there: 409 for that entry
  auto res = reg->RegisterDirectory(dir);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  std::map<std::string, Status> by_name;
  for (const auto& e : *res) by_name[e.name] = e.status;
  ASSERT_EQ(by_name.size(), 7u) << "alpha beta gamma 'bad name' trunc junk escape";
  EXPECT_EQ(by_name["alpha"].code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(by_name["beta"].ok()) << by_name["beta"].ToString();
  EXPECT_TRUE(by_name["gamma"].ok()) << by_name["gamma"].ToString();
  EXPECT_EQ(by_name["bad name"].code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(by_name["trunc"].ok());
  EXPECT_FALSE(by_name["junk"].ok());
  EXPECT_EQ(by_name["escape"].code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(by_name.count("model"), 0u);
  EXPECT_EQ(by_name.count(".hidden"), 0u);
  EXPECT_EQ(by_name.count("no-config"), 0u);
  for (size_t i = 1; i < res->size(); ++i) EXPECT_LE((*res)[i - 1].name, (*res)[i].name);
  EXPECT_EQ(reg->size(), 3u);
  EXPECT_EQ(reg->Lookup("gamma")->format, "gguf");

  // replace=true re-registers the existing entries with new versions.
  const uint64_t v = reg->Lookup("alpha")->version;
  auto again = reg->RegisterDirectory(dir, /*replace=*/true);
  ASSERT_TRUE(again.ok());
  EXPECT_GT(reg->Lookup("alpha")->version, v);

  EXPECT_EQ(reg->RegisterDirectory(outside_).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(reg->RegisterDirectory(root_ + "/nope").status().code(), StatusCode::kNotFound);
}

TEST_F(RegistryTest, RestartWithVanishedOrChangedFiles) {
  WritePeft(root_ + "/gone", base_, 8, 1);
  WritePeft(root_ + "/touched", base_, 8, 2);
  WritePeft(root_ + "/changed", base_, 8, 3);
  {
    auto reg = OpenOrDie();
    ASSERT_TRUE(reg->Register("gone", root_ + "/gone").ok());
    ASSERT_TRUE(reg->Register("touched", root_ + "/touched").ok());
    ASSERT_TRUE(reg->Register("changed", root_ + "/changed").ok());
  }
  const std::string saved = tmp_ + "/saved";
  fs::rename(root_ + "/gone", saved);
  // Same bytes, new modification time: accepted by content.
  const auto t = fs::last_write_time(root_ + "/touched/adapter_model.safetensors");
  fs::last_write_time(root_ + "/touched/adapter_model.safetensors", t + std::chrono::hours(1));
  // Different bytes at the same path: refused until registered again.
  WritePeft(root_ + "/changed", base_, 8, 99);

  auto reg = OpenOrDie();
  ASSERT_EQ(reg->size(), 3u);  // kept, marked
  auto gone = reg->Lookup("gone");
  EXPECT_FALSE(gone->available);
  EXPECT_FALSE(gone->problem.empty());
  EXPECT_TRUE(reg->Lookup("touched")->available) << reg->Lookup("touched")->problem;
  auto changed = reg->Lookup("changed");
  EXPECT_FALSE(changed->available);
  EXPECT_NE(changed->problem.find("changed since it was registered"), std::string::npos)
      << changed->problem;

  EXPECT_EQ(LoadRegistered(*reg, "gone").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadRegistered(*reg, "changed").status().code(), StatusCode::kFailedPrecondition);
  auto touched = LoadRegistered(*reg, "touched");
  ASSERT_TRUE(touched.ok()) << touched.status().ToString();

  // Files restored: Revalidate makes the entry available again.
  fs::rename(saved, root_ + "/gone");
  auto bad = reg->Revalidate();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].first, "changed");
  EXPECT_TRUE(reg->Lookup("gone")->available);
  EXPECT_TRUE(LoadRegistered(*reg, "gone").ok());
  // Re-registering the changed adapter gives a new identity.
  auto re = reg->Register("changed", root_ + "/changed", /*replace=*/true);
  ASSERT_TRUE(re.ok());
  EXPECT_NE(re->content_hash, changed->content_hash);
  EXPECT_TRUE(LoadRegistered(*reg, "changed").ok());
  // An unavailable entry can be unregistered.
  fs::remove_all(root_ + "/gone");
  reg->Revalidate();
  CHORUS_EXPECT_OK(reg->Unregister("gone"));

  // Roots changed: an entry outside the new roots is unavailable.
  reg.reset();
  fs::create_directories(tmp_ + "/other-root");
  RegistryOptions o = Options();
  o.adapter_roots = {tmp_ + "/other-root"};
  auto moved = OpenOrDie(o);
  EXPECT_FALSE(moved->Lookup("touched")->available);  // the server refuses it before any load
  EXPECT_NE(moved->Lookup("touched")->problem.find("outside"), std::string::npos)
      << moved->Lookup("touched")->problem;
}

TEST_F(RegistryTest, CorruptStateIsAnErrorAndTempFilesAreIgnored) {
  WritePeft(root_ + "/a", base_, 8, 1);
  {
    auto reg = OpenOrDie();
    ASSERT_TRUE(reg->Register("a", root_ + "/a").ok());
  }
  const std::string good = ReadAll(state_);
  // A killed writer's temp file: ignored and removed.
  WriteAll(state_ + ".tmp.12345", good.substr(0, good.size() / 3));
  {
    auto reg = OpenOrDie();
    EXPECT_EQ(reg->size(), 1u);
    EXPECT_FALSE(fs::exists(state_ + ".tmp.12345"));
  }
  auto expect_corrupt = [&](const std::string& text, const std::string& what) {
    WriteAll(state_, text);
    auto r = AdapterRegistry::Open(state_, Options());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(state_), std::string::npos) << what;
    EXPECT_EQ(ReadAll(state_), text) << what << ": the state must not be reset";
  };
  expect_corrupt("", "empty");
  expect_corrupt(good.substr(0, good.size() / 2), "truncated");
  expect_corrupt("garbage\x01\x02", "garbage");
  expect_corrupt("[]", "array");
  expect_corrupt(R"({"format":"something-else","schema_version":1,"next_version":1,"adapters":[]})",
                 "format");
  auto doc = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    CHORUS_CHECK(at != std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  expect_corrupt(doc("\"next_version\": 2", "\"next_version\": 1"), "version ≥ next_version");
  expect_corrupt(doc("\"name\": \"a\"", "\"name\": \"a b\""), "bad name");
  expect_corrupt(doc("\"rank\": 8", "\"rank\": \"8\""), "rank type");
  expect_corrupt(doc("\"format\": \"peft\"", "\"format\": \"pickle\""), "format value");
  expect_corrupt(doc("\"content_hash\": \"", "\"content_hash\": \"zz"), "hash");
  expect_corrupt(doc("\"bytes\": ", "\"bytes\": 1"), "bytes sum");
  expect_corrupt(doc("\"kind\": \"lora\",", ""), "missing kind");
  // Newer schema: a clear kUnimplemented.
  WriteAll(state_, doc("\"schema_version\": 1", "\"schema_version\": 7"));
  EXPECT_EQ(AdapterRegistry::Open(state_, Options()).status().code(), StatusCode::kUnimplemented);
  // Restored: opens again.
  WriteAll(state_, good);
  EXPECT_EQ(OpenOrDie()->size(), 1u);
  // Bad options.
  RegistryOptions o = Options();
  o.max_lora_rank = 0;
  EXPECT_EQ(AdapterRegistry::Open(state_, o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.adapter_roots = {tmp_ + "/missing-root"};
  EXPECT_EQ(AdapterRegistry::Open(state_, o).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(AdapterRegistry::Open(tmp_ + "/no-dir/r.json", Options()).status().code(),
            StatusCode::kNotFound);
}

// A corrupt state file (a torn write from outside, garbage, a wrong schema, a bad field): by
// default Open refuses, naming the problem, and leaves the file as it is; with
// recover_corrupt_state the file is moved aside byte for byte, an ERROR line names the problem
// and the quarantine path, and the registry starts empty. Never silently emptied.
TEST_F(RegistryTest, CorruptStateIsRefusedOrQuarantined) {
  WritePeft(root_ + "/a", base_, 8, 1);
  {
    auto reg = OpenOrDie();
    ASSERT_TRUE(reg->Register("a", root_ + "/a").ok());
  }
  const std::string good = ReadAll(state_);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    CHORUS_CHECK(at != std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"truncated", good.substr(0, good.size() / 2), "not valid JSON"},
      {"garbage", "\x7f\x45garbage", "not valid JSON"},
      {"wrong schema", R"({"format":"chorus-adapter-registry","schema_version":1,"adapters":[]})",
       "missing field 'next_version'"},
      {"bad field", with("\"rank\": 8", "\"rank\": -3"), "field 'rank' is out of range"}};
  for (const auto& [what, text, problem] : cases) {
    WriteAll(state_, text);
    auto refused = AdapterRegistry::Open(state_, Options());
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_NE(refused.status().message().find(problem), std::string::npos)
        << what << ": " << refused.status().message();
    EXPECT_NE(refused.status().message().find(state_), std::string::npos) << what;
    EXPECT_EQ(ReadAll(state_), text) << what << ": refused, the file must stay as it was";

    RegistryOptions o = Options();
    o.recover_corrupt_state = true;
    SetMinLogLevel(LogLevel::kInfo);
    ::testing::internal::CaptureStderr();
    auto recovered = AdapterRegistry::Open(state_, o);
    const std::string log = ::testing::internal::GetCapturedStderr();
    SetMinLogLevel(LogLevel::kError);
    ASSERT_TRUE(recovered.ok()) << what << ": " << recovered.status().ToString();
    EXPECT_EQ((*recovered)->size(), 0u) << what;
    std::vector<std::string> quarantined;
    for (const auto& e : fs::directory_iterator(tmp_ + "/state")) {
      if (e.path().filename().string().find(".corrupt-") != std::string::npos)
        quarantined.push_back(e.path().string());
    }
    ASSERT_EQ(quarantined.size(), 1u) << what;
    EXPECT_EQ(ReadAll(quarantined[0]), text) << what << ": the quarantined copy is the original";
    EXPECT_EQ(quarantined[0].rfind(state_ + ".corrupt-", 0), 0u) << quarantined[0];
    // One ERROR line naming the quarantine path and the problem.
    std::string line;
    for (std::istringstream in(log); std::getline(in, line);) {
      if (line.find(quarantined[0]) != std::string::npos) break;
    }
    EXPECT_EQ(line.rfind("E ", 0), 0u) << what << ": " << log;
    EXPECT_NE(line.find(quarantined[0]), std::string::npos) << what << ": " << log;
    EXPECT_NE(line.find(problem), std::string::npos) << what << ": " << log;
    recovered->reset();
    EXPECT_EQ(OpenOrDie()->size(), 0u);  // the new, empty state is a valid file
    fs::remove(quarantined[0]);
  }
}

TEST_F(RegistryTest, ConcurrentReadersSeeWholeEntries) {
  for (int i = 0; i < 4; ++i)
    WritePeft(root_ + "/a" + std::to_string(i), base_, 2 + 2 * i, i + 1, {Linear::kQ});
  auto reg = OpenOrDie();
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    while (!done.load()) {
      for (const AdapterInfo& info : reg->List()) {
        if (info.name != "x" && info.name != "y") bad.fetch_add(1);
        if (info.rank < 2 || info.rank > 8 || info.version == 0) bad.fetch_add(1);
      }
      auto x = reg->Lookup("x");
      if (x && x->version >= reg->next_version()) bad.fetch_add(1);
    }
  });
  for (int i = 0; i < 40; ++i) {
    const std::string path = root_ + "/a" + std::to_string(i % 4);
    ASSERT_TRUE(reg->Register(i % 2 ? "x" : "y", path, /*replace=*/true).ok());
    if (i % 5 == 4) CHORUS_ASSERT_OK(reg->Unregister("y"));
  }
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
}

// A child registers, replaces and unregisters in a loop; the parent kills it with SIGKILL at a
// random moment, then Open must succeed and hold a consistent state: known names and paths,
// hashes matching the files, versions below next_version, next_version never going back.
TEST_F(RegistryTest, SurvivesSigkillDuringRegistration) {
  constexpr int kAdapters = 4;
  std::vector<std::string> paths;
  std::map<std::string, uint64_t> hash_of;
  for (int i = 0; i < kAdapters; ++i) {
    paths.push_back(root_ + "/c" + std::to_string(i));
    WritePeft(paths.back(), base_, 4 + 4 * i, 10 + i);
    hash_of[paths.back()] = ExpectedPeftHash(paths.back());
  }
  const std::set<std::string> names = {"n0", "n1", "n2"};
  std::mt19937 rng(1234);
  uint64_t last_next = 1;
  int killed = 0;
  for (int round = 0; round < 24; ++round) {
    // The child says when its first registration is done, and the kill comes a random time
    // after that: a slow start (a sanitized build takes longer than the whole window below to
    // open the registry) must not let every kill land before the first write.
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(ready[0]);
      auto r = AdapterRegistry::Open(state_, Options());
      if (!r.ok()) ::_exit(2);
      for (int i = 0; i < 400; ++i) {
        const std::string name = "n" + std::to_string(i % 3);
        if (i % 7 == 6) {
          (void)(*r)->Unregister(name);
        } else if (!(*r)->Register(name, paths[static_cast<size_t>((i + round) % kAdapters)], true)
                        .ok()) {
          ::_exit(3);
        }
        if (i == 0 && ::write(ready[1], "r", 1) != 1) ::_exit(4);
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte;
    (void)::read(ready[0], &byte, 1);  // 0 bytes: the child ended first (its status says how)
    ::close(ready[0]);
    const int delay_us = std::uniform_int_distribution<int>(0, 40000)(rng);
    ::usleep(static_cast<useconds_t>(delay_us));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) {
      ++killed;
    } else {
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_EQ(WEXITSTATUS(status), 0) << "child failed in round " << round;
    }

    auto reg = AdapterRegistry::Open(state_, Options());
    ASSERT_TRUE(reg.ok()) << "round " << round << ": " << reg.status().ToString();
    const uint64_t next = (*reg)->next_version();
    EXPECT_GE(next, last_next) << "round " << round << ": the state went back";
    last_next = next;
    std::set<uint64_t> versions;
    for (const AdapterInfo& info : (*reg)->List()) {
      EXPECT_TRUE(names.count(info.name)) << info.name;
      ASSERT_TRUE(hash_of.count(info.path)) << info.path;
      EXPECT_EQ(info.content_hash, hash_of[info.path]) << info.name;
      EXPECT_LT(info.version, next);
      EXPECT_TRUE(versions.insert(info.version).second);
      EXPECT_TRUE(info.available) << info.problem;
    }
    for (const auto& e : fs::directory_iterator(tmp_ + "/state")) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
          << "leftover temp file not removed: " << e.path();
    }
  }
  EXPECT_GT(last_next, 1u);  // the children made progress
  std::cerr << "killed " << killed << " of 24 children mid-run\n";
}

}  // namespace
}  // namespace chorus::adapters
