#include "chorus/sim/trace.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "chorus/base/mapped_file.h"

namespace chorus::sim {
namespace {

using json = nlohmann::json;

std::string LineError(size_t line, const std::string& what) {
  return "trace line " + std::to_string(line) + ": " + what;
}

// A number field: absent → `def` (when not required); present but not a finite number → error.
Status NumberField(const json& j, const char* name, bool required, size_t line, double* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required)
      return InvalidArgumentError(LineError(line, std::string("missing field '") + name + "'"));
    return Status();
  }
  if (!it->is_number())
    return InvalidArgumentError(LineError(
        line, std::string("field '") + name + "' is not a number: " + it->dump().substr(0, 40)));
  const double v = it->get<double>();
  if (!std::isfinite(v))
    return InvalidArgumentError(LineError(line, std::string("field '") + name + "' is not finite"));
  *out = v;
  return Status();
}

Status CountField(const json& j, const char* name, bool required, int64_t min, size_t line,
                  int64_t* out) {
  double v = static_cast<double>(*out);
  if (Status s = NumberField(j, name, required, line, &v); !s.ok()) return s;
  if (v != std::floor(v) || v < static_cast<double>(min) || v > 1e9)
    return InvalidArgumentError(
        LineError(line, std::string("field '") + name + "' must be an integer ≥ " +
                            std::to_string(min) + " (got " + json(v).dump() + ")"));
  *out = static_cast<int64_t>(v);
  return Status();
}

}  // namespace

Result<std::vector<TraceRequest>> ParseTrace(std::string_view jsonl) {
  std::vector<TraceRequest> out;
  size_t line_no = 0, pos = 0;
  double last_arrival = 0;
  while (pos < jsonl.size()) {
    size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    std::string_view line = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      return InvalidArgumentError(LineError(line_no, std::string("not JSON (") + e.what() + ")"));
    }
    if (!j.is_object()) return InvalidArgumentError(LineError(line_no, "not a JSON object"));
    TraceRequest r;
    if (Status s = NumberField(j, "arrival_s", true, line_no, &r.arrival_s); !s.ok()) return s;
    if (r.arrival_s < 0)
      return InvalidArgumentError(LineError(line_no, "field 'arrival_s' is negative"));
    if (r.arrival_s < last_arrival)
      return InvalidArgumentError(LineError(
          line_no, "field 'arrival_s' goes back in time (arrivals must be non-decreasing)"));
    last_arrival = r.arrival_s;
    if (Status s = CountField(j, "prompt_tokens", true, 1, line_no, &r.prompt_tokens); !s.ok())
      return s;
    if (Status s = CountField(j, "output_tokens", true, 1, line_no, &r.output_tokens); !s.ok())
      return s;
    if (auto it = j.find("adapter"); it != j.end() && !it->is_null()) {
      if (!it->is_string())
        return InvalidArgumentError(LineError(line_no, "field 'adapter' is not a string"));
      r.adapter = it->get<std::string>();
    }
    if (Status s =
            CountField(j, "rank", !r.adapter.empty(), r.adapter.empty() ? 0 : 1, line_no, &r.rank);
        !s.ok())
      return s;
    if (r.adapter.empty() && r.rank != 0)
      return InvalidArgumentError(LineError(line_no, "field 'rank' without an 'adapter'"));
    if (Status s = NumberField(j, "ttft_slo_ms", false, line_no, &r.ttft_slo_ms); !s.ok()) return s;
    if (Status s = NumberField(j, "tpot_slo_ms", false, line_no, &r.tpot_slo_ms); !s.ok()) return s;
    if (r.ttft_slo_ms < 0 || r.tpot_slo_ms < 0)
      return InvalidArgumentError(LineError(line_no, "an SLO is negative"));
    out.push_back(std::move(r));
  }
  if (out.empty()) return InvalidArgumentError("trace has no requests");
  return out;
}

Result<std::vector<TraceRequest>> LoadTrace(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, size_t{1} << 30));
  auto t = ParseTrace(text);
  if (!t.ok()) return t.status().WithContext(path);
  return t;
}

std::string TraceToJsonl(const std::vector<TraceRequest>& trace) {
  std::string out;
  for (const TraceRequest& r : trace) {
    json j = {{"arrival_s", r.arrival_s},
              {"prompt_tokens", r.prompt_tokens},
              {"output_tokens", r.output_tokens}};
    if (!r.adapter.empty()) {
      j["adapter"] = r.adapter;
      j["rank"] = r.rank;
    }
    if (r.ttft_slo_ms > 0) j["ttft_slo_ms"] = r.ttft_slo_ms;
    if (r.tpot_slo_ms > 0) j["tpot_slo_ms"] = r.tpot_slo_ms;
    out += j.dump();
    out += '\n';
  }
  return out;
}

std::vector<TraceRequest> ScaleToRate(const std::vector<TraceRequest>& trace, double rate) {
  std::vector<TraceRequest> out = trace;
  if (trace.empty() || rate <= 0) return out;
  const double span = trace.back().arrival_s;
  if (span <= 0) return out;
  // n requests over `span` seconds → n / span per second; scale times by (n / span) / rate.
  const double factor = static_cast<double>(trace.size()) / span / rate;
  for (TraceRequest& r : out) r.arrival_s *= factor;
  return out;
}

Result<LengthDist> LengthDist::Parse(const std::string& spec) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("length distribution '" + spec.substr(0, 48) + "': " + why +
                                " (expected N, uniform:LO:HI or lognormal:MEDIAN:SIGMA:MAX)");
  };
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t c = spec.find(':', start);
    parts.push_back(spec.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  std::vector<double> v;
  for (size_t i = (parts.size() == 1 ? 0 : 1); i < parts.size(); ++i) {
    char* end = nullptr;
    const double x = std::strtod(parts[i].c_str(), &end);
    if (parts[i].empty() || *end != '\0' || !std::isfinite(x)) return bad("bad number");
    v.push_back(x);
  }
  LengthDist d;
  if (parts.size() == 1) {
    if (v[0] < 1 || v[0] != std::floor(v[0])) return bad("a fixed length must be an integer ≥ 1");
    d.kind = Kind::kFixed;
    d.a = v[0];
    return d;
  }
  if (parts[0] == "uniform" && v.size() == 2) {
    if (v[0] < 1 || v[1] < v[0] || v[0] != std::floor(v[0]) || v[1] != std::floor(v[1]))
      return bad("needs integers 1 ≤ LO ≤ HI");
    d.kind = Kind::kUniform;
    d.a = v[0];
    d.b = v[1];
    return d;
  }
  if (parts[0] == "lognormal" && v.size() == 3) {
    if (v[0] < 1 || v[1] < 0 || v[2] < 1) return bad("needs MEDIAN ≥ 1, SIGMA ≥ 0, MAX ≥ 1");
    d.kind = Kind::kLognormal;
    d.a = v[0];
    d.b = v[1];
    d.c = v[2];
    return d;
  }
  return bad("unknown form");
}

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

double Rng::Exponential() { return -std::log1p(-Uniform()); }

double Rng::Normal() {
  // Box–Muller; the second value is dropped (simplicity over speed).
  const double u1 = 1.0 - Uniform(), u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double Rng::Gamma(double shape) {
  if (shape < 1) {
    // Boost: Gamma(k) = Gamma(k + 1) · U^(1/k).
    const double u = 1.0 - Uniform();
    return Gamma(shape + 1) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x, v;
    do {
      x = Normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - Uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

namespace {

int64_t SampleLength(const LengthDist& d, Rng& rng) {
  switch (d.kind) {
    case LengthDist::Kind::kFixed:
      return static_cast<int64_t>(d.a);
    case LengthDist::Kind::kUniform:
      return static_cast<int64_t>(d.a) +
             static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(d.b - d.a + 1));
    case LengthDist::Kind::kLognormal: {
      const double x = std::round(d.a * std::exp(d.b * rng.Normal()));
      return static_cast<int64_t>(std::clamp(x, 1.0, d.c));
    }
  }
  return 1;
}

}  // namespace

Result<std::vector<TraceRequest>> GenerateTrace(const TraceSpec& spec) {
  if (spec.requests < 1) return InvalidArgumentError("trace: --requests must be ≥ 1");
  if (!(spec.rate > 0) || !std::isfinite(spec.rate))
    return InvalidArgumentError("trace: the rate must be > 0");
  if (!(spec.cv > 0) || !std::isfinite(spec.cv))
    return InvalidArgumentError("trace: --cv must be > 0");
  if (spec.adapters < 0) return InvalidArgumentError("trace: --adapters must be ≥ 0");
  if (!(spec.zipf >= 0)) return InvalidArgumentError("trace: --zipf must be ≥ 0");
  if (spec.adapters > 0 && spec.ranks.empty())
    return InvalidArgumentError("trace: --ranks is empty");
  for (int64_t r : spec.ranks)
    if (r < 1)
      return InvalidArgumentError("trace: a rank must be ≥ 1 (got " + std::to_string(r) + ")");

  // Independent streams: arrivals, and the requests' content.
  Rng arrivals(spec.seed * 0x2545F4914F6CDD1Dull + 1),
      content(spec.seed * 0x9E3779B97F4A7C15ull + 2);
  // Each adapter's rank: uniform over the list, drawn once per adapter.
  std::vector<int64_t> adapter_rank(static_cast<size_t>(spec.adapters));
  for (auto& r : adapter_rank) r = spec.ranks[content.Next() % spec.ranks.size()];
  // Popularity CDF: adapter i ∝ 1/(i+1)^zipf (zipf 0 = uniform).
  std::vector<double> cdf(static_cast<size_t>(spec.adapters));
  double total = 0;
  for (size_t i = 0; i < cdf.size(); ++i) {
    total += std::pow(static_cast<double>(i + 1), -spec.zipf);
    cdf[i] = total;
  }
  // Gamma inter-arrivals with shape 1/cv² and mean 1/rate (shape 1: exponential, i.e. Poisson).
  const double shape = 1.0 / (spec.cv * spec.cv);
  std::vector<TraceRequest> out(static_cast<size_t>(spec.requests));
  double t = 0;
  for (TraceRequest& r : out) {
    const double gap = spec.cv == 1 ? arrivals.Exponential() : arrivals.Gamma(shape) / shape;
    t += gap / spec.rate;
    r.arrival_s = t;
    if (!cdf.empty()) {
      const double u = content.Uniform() * total;
      const size_t i =
          static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const size_t a = std::min(i, cdf.size() - 1);
      r.adapter = std::to_string(a);
      r.adapter.insert(r.adapter.begin(), 'a');  // not "a" + …: GCC 12's false -Wrestrict
      r.rank = adapter_rank[a];
    }
    r.prompt_tokens = SampleLength(spec.prompt, content);
    r.output_tokens = SampleLength(spec.output, content);
    r.ttft_slo_ms = spec.ttft_slo_ms;
    r.tpot_slo_ms = spec.tpot_slo_ms;
  }
  return out;
}

}  // namespace chorus::sim
