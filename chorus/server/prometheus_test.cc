// Per-adapter /metrics series: top-N + (other) folding, base label, label escaping
// and histogram consistency of the rendered Prometheus text.
#include "chorus/server/prometheus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

namespace chorus::server {
namespace {

// Every sample line "name{labels} value" of the text, keyed by "name{labels}".
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    EXPECT_TRUE(out.emplace(line.substr(0, sp), std::stod(line.substr(sp + 1))).second)
        << "duplicate " << line;
  }
  return out;
}

// Checks the text format's structure: every sample's metric family has exactly one HELP and one
// TYPE line before its first sample.
void CheckFamilies(const std::string& text) {
  std::map<std::string, int> help, type;
  std::istringstream in(text);
  std::string line;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$)");
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      ++help[line.substr(7, line.find(' ', 7) - 7)];
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      ++type[line.substr(7, line.find(' ', 7) - 7)];
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "bad sample line: " << line;
    std::string family = m[1].str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx(suffix);
      if (family.size() > sfx.size() &&
          family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0 &&
          type.count(family.substr(0, family.size() - sfx.size()))) {
        family = family.substr(0, family.size() - sfx.size());
      }
    }
    EXPECT_EQ(help[family], 1) << "HELP before " << line;
    EXPECT_EQ(type[family], 1) << "TYPE before " << line;
  }
  for (const auto& [name, n] : help) EXPECT_EQ(n, 1) << name;
  for (const auto& [name, n] : type) EXPECT_EQ(n, 1) << name;
}

// Bucket counts are cumulative (non-decreasing in le), +Inf equals _count.
void CheckHistogram(const std::map<std::string, double>& s, const std::string& name,
                    const std::string& label) {
  const std::string l = "adapter=\"" + label + "\"";
  double prev = 0;
  for (double le : engine::AdapterMetrics::TtftBounds()) {
    std::ostringstream key;
    key << name << "_bucket{" << l << ",le=\"" << le << "\"}";
    auto it = s.find(key.str());
    ASSERT_NE(it, s.end()) << key.str();
    EXPECT_GE(it->second, prev) << key.str();
    prev = it->second;
  }
  const double inf = s.at(name + "_bucket{" + l + ",le=\"+Inf\"}");
  EXPECT_GE(inf, prev);
  EXPECT_EQ(inf, s.at(name + "_count{" + l + "}"));
}

TEST(AdapterMetricsTest, TopNOtherAndBase) {
  engine::AdapterMetrics m;
  // a: 5 requests, b: 4, c: 3, d: 2, e: 1, base: 2.
  const std::vector<std::pair<std::string, int>> load = {{"a", 5}, {"b", 4}, {"c", 3},
                                                         {"d", 2}, {"e", 1}, {"", 2}};
  double total_sum = 0;
  int i = 0;
  for (const auto& [name, n] : load) {
    for (int k = 0; k < n; ++k) {
      m.CountRequest(name);
      const double ttft = 0.004 * (++i);
      m.ObserveTtft(name, ttft);
      total_sum += ttft;
    }
  }
  auto ex = m.Top(2);
  ASSERT_EQ(ex.top.size(), 2u);
  EXPECT_EQ(ex.top[0].adapter, "a");
  EXPECT_EQ(ex.top[0].requests, 5u);
  EXPECT_EQ(ex.top[1].adapter, "b");
  EXPECT_EQ(ex.base.requests, 2u);
  EXPECT_EQ(ex.other.requests, 6u);  // c + d + e
  EXPECT_EQ(ex.other.ttft.count, 6u);
  EXPECT_EQ(ex.other_adapters, 3u);
  double sum = ex.base.ttft.sum + ex.other.ttft.sum;
  for (const auto& s : ex.top) sum += s.ttft.sum;
  EXPECT_NEAR(sum, total_sum, 1e-9);

  AdapterExportOptions o;
  o.top_n = 2;
  o.base_label = "my \"base\"\\model\n";
  adapters::AdapterCache::Stats cs;
  cs.hits = 7;
  cs.misses = 3;
  cs.loads = 3;
  cs.load_seconds_total = 0.75;
  // 0.004 s (le 0.005), 0.2 s (le 0.25), 0.546 s (le 1).
  const auto& lb = adapters::AdapterCache::LoadSecondsBounds();
  auto bucket_of = [&](double v) {
    return static_cast<size_t>(std::lower_bound(lb.begin(), lb.end(), v) - lb.begin());
  };
  for (double v : {0.004, 0.2, 0.546}) ++cs.load_seconds_buckets[bucket_of(v)];
  cs.bytes = 1024;
  cs.entries = 3;
  const std::string text = RenderAdapterPrometheus(m, &cs, 5, o);
  CheckFamilies(text);
  const auto s = Samples(text);
  const std::string base = R"(my \"base\"\\model\n)";  // escaped
  EXPECT_EQ(s.at("chorus_adapter_requests_total{adapter=\"a\"}"), 5);
  EXPECT_EQ(s.at("chorus_adapter_requests_total{adapter=\"b\"}"), 4);
  EXPECT_EQ(s.count("chorus_adapter_requests_total{adapter=\"c\"}"), 0u);
  EXPECT_EQ(s.at("chorus_adapter_requests_total{adapter=\"(other)\"}"), 6);
  EXPECT_EQ(s.at("chorus_adapter_requests_total{adapter=\"" + base + "\"}"), 2);
  EXPECT_EQ(s.at("chorus_adapter_other_adapters"), 3);
  EXPECT_EQ(s.at("chorus_adapters_registered"), 5);
  EXPECT_EQ(s.at("chorus_adapter_host_cache_hits_total"), 7);
  EXPECT_EQ(s.at("chorus_adapter_host_cache_misses_total"), 3);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_count"), 3);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_sum"), 0.75);
  // A histogram (1 ms .. 10 s): cumulative buckets, +Inf = _count.
  EXPECT_NE(text.find("# TYPE chorus_adapter_load_seconds histogram"), std::string::npos);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.001\"}"), 0);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.0025\"}"), 0);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.1\"}"), 1);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.25\"}"), 2);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"0.5\"}"), 2);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"1\"}"), 3);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"10\"}"), 3);
  EXPECT_EQ(s.at("chorus_adapter_load_seconds_bucket{le=\"+Inf\"}"), 3);
  EXPECT_EQ(s.at("chorus_adapter_host_cache_bytes"), 1024);
  const char* h = "chorus_adapter_time_to_first_token_seconds";
  for (const std::string& l : {std::string("a"), std::string("b"), std::string("(other)"), base}) {
    CheckHistogram(s, h, l);
  }
  EXPECT_EQ(s.at(std::string(h) + "_count{adapter=\"(other)\"}"), 6);
  EXPECT_EQ(s.at(std::string(h) + "_count{adapter=\"a\"}"), 5);
  // a's TTFTs are 0.004..0.02: 2 at or below 0.01, all 5 at or below 0.025.
  EXPECT_EQ(s.at(std::string(h) + "_bucket{adapter=\"a\",le=\"0.01\"}"), 2);
  EXPECT_EQ(s.at(std::string(h) + "_bucket{adapter=\"a\",le=\"0.025\"}"), 5);

  // Without a cache or registry those families are omitted.
  const std::string bare = RenderAdapterPrometheus(m, nullptr, -1, o);
  CheckFamilies(bare);
  EXPECT_EQ(bare.find("chorus_adapter_host_cache_hits_total"), std::string::npos);
  EXPECT_EQ(bare.find("chorus_adapters_registered"), std::string::npos);
}

TEST(AdapterMetricsTest, SeriesStayBoundedWithManyAdapters) {
  engine::AdapterMetrics m;
  for (int i = 0; i < 3000; ++i) {
    const std::string name = "adapter-" + std::to_string(i);
    for (int k = 0; k <= i % 3; ++k) m.CountRequest(name);
    m.ObserveTtft(name, 0.5);
  }
  AdapterExportOptions o;
  o.top_n = 16;
  o.base_label = "base";
  const std::string text = RenderAdapterPrometheus(m, nullptr, -1, o);
  CheckFamilies(text);
  const auto s = Samples(text);
  size_t request_series = 0;
  double requests = 0;
  for (const auto& [k, v] : s) {
    if (k.rfind("chorus_adapter_requests_total{", 0) == 0) {
      ++request_series;
      requests += v;
    }
  }
  EXPECT_EQ(request_series, 16u + 2u);  // top 16 + base + (other)
  EXPECT_EQ(requests, 3000.0 / 3 * (1 + 2 + 3));
  EXPECT_EQ(s.at("chorus_adapter_other_adapters"), 3000 - 16);
  EXPECT_EQ(s.at("chorus_adapter_time_to_first_token_seconds_count{adapter=\"(other)\"}"),
            3000 - 16);
  // Ties (3 requests each) are broken by name, so the top set is deterministic.
  EXPECT_EQ(s.count("chorus_adapter_requests_total{adapter=\"adapter-1004\"}"), 1u);
}

TEST(AdapterMetricsTest, TrackedNamesAreCapped) {
  engine::AdapterMetrics m;
  const size_t n = engine::AdapterMetrics::kMaxTracked + 10;
  for (size_t i = 0; i < n; ++i) {
    std::string name = "x";  // appended: "x" + to_string trips a false GCC 12 -Wrestrict
    name += std::to_string(i);
    m.CountRequest(name);
  }
  m.CountRequest("");  // the base is always tracked
  auto ex = m.Top(4);
  EXPECT_EQ(ex.base.requests, 1u);
  EXPECT_EQ(ex.top.size(), 4u);
  uint64_t total = ex.other.requests;
  for (const auto& t : ex.top) total += t.requests;
  EXPECT_EQ(total, n);
}

TEST(PrometheusTest, EscapeLabelValue) {
  EXPECT_EQ(EscapeLabelValue("plain/name:1.0-x"), "plain/name:1.0-x");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace chorus::server
