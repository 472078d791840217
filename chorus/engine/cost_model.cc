#include "chorus/engine/cost_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"

namespace chorus::engine {
namespace {

using json = nlohmann::json;

// j[key] when it is a string, else "" (json::value would throw on a value of another type).
std::string StringField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Solves the symmetric system a·x = b (n×n, row-major) by Gaussian elimination with partial
// pivoting; false when singular.
bool Solve(std::vector<double> a, std::vector<double> b, size_t n, std::vector<double>* x) {
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    if (std::fabs(a[p * n + c]) < 1e-300) return false;
    if (p != c) {
      for (size_t k = 0; k < n; ++k) std::swap(a[p * n + k], a[c * n + k]);
      std::swap(b[p], b[c]);
    }
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      if (f == 0) continue;
      for (size_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0);
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= a[i * n + k] * (*x)[k];
    (*x)[i] = s / a[i * n + i];
  }
  return true;
}

}  // namespace

void StepFeatures::AddChunk(int64_t start, int64_t count, bool prefill, int64_t rank) {
  const double c = static_cast<double>(count), s = static_cast<double>(start);
  (prefill ? prefill_tokens : decode_rows) += c;
  // Row i (position start + i) attends to start + i + 1 positions.
  context_tokens += c * s + c * (c + 1) / 2;
  if (prefill) prefill_context += c * s + c * (c + 1) / 2;
  row_ranks += c * static_cast<double>(rank);
}

const char* CostModel::KindName(Kind k) { return k == Kind::kLinear ? "linear" : "extended"; }

const std::vector<std::string>& CostModel::TermNames(Kind k) {
  static const std::vector<std::string> kLinear = {
      "1", "prefill_tokens", "decode_rows", "sum_ranks", "adapters", "deltas", "context_tokens"};
  static const std::vector<std::string> kExtended = [] {
    std::vector<std::string> v = kLinear;
    v.push_back("row_ranks");
    v.push_back("min_rows_32");
    v.push_back("prefill_context_tokens");
    return v;
  }();
  return k == Kind::kLinear ? kLinear : kExtended;
}

void CostModel::Terms(Kind k, const StepFeatures& f, std::vector<double>* out) {
  out->assign(
      {1.0, f.prefill_tokens, f.decode_rows, f.sum_ranks, f.adapters, f.deltas, f.context_tokens});
  if (k == Kind::kExtended) {
    out->push_back(f.row_ranks);
    out->push_back(std::min(f.rows(), 32.0));
    out->push_back(f.prefill_context);
  }
}

Result<CostModel> CostModel::FromCoefficients(Kind kind, std::vector<double> coef) {
  if (coef.size() != TermNames(kind).size()) {
    return InvalidArgumentError(std::string("a ") + KindName(kind) + " cost model has " +
                                std::to_string(TermNames(kind).size()) + " coefficients, got " +
                                std::to_string(coef.size()));
  }
  for (double c : coef)
    if (!std::isfinite(c)) return InvalidArgumentError("cost model coefficient is not finite");
  CostModel m;
  m.kind_ = kind;
  m.coef_ = std::move(coef);
  return m;
}

Result<CostModel> CostModel::Fit(Kind kind, const std::vector<StepSample>& samples) {
  const size_t n = TermNames(kind).size();
  if (samples.size() < n) {
    return InvalidArgumentError("fitting a " + std::string(KindName(kind)) + " cost model needs " +
                                std::to_string(n) + " samples or more, got " +
                                std::to_string(samples.size()));
  }
  // Columns are scaled to max |value| 1 (features span 1 to 10^6) before the normal equations.
  std::vector<double> t, scale(n, 0);
  for (const StepSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds))
      return InvalidArgumentError("a step sample has a non-positive or non-finite time");
    Terms(kind, s.f, &t);
    for (size_t j = 0; j < n; ++j) scale[j] = std::max(scale[j], std::fabs(t[j]));
  }
  std::vector<size_t> live;  // terms not zero in every sample
  for (size_t j = 0; j < n; ++j)
    if (scale[j] > 0) live.push_back(j);
  const size_t m = live.size();
  std::vector<double> ata(m * m, 0), atb(m, 0);
  for (const StepSample& s : samples) {
    Terms(kind, s.f, &t);
    const double w = 1.0 / (s.seconds * s.seconds);
    for (size_t a = 0; a < m; ++a) {
      const double xa = t[live[a]] / scale[live[a]];
      atb[a] += w * xa * s.seconds;
      for (size_t b = 0; b < m; ++b) ata[a * m + b] += w * xa * t[live[b]] / scale[live[b]];
    }
  }
  std::vector<double> x;
  if (!Solve(ata, atb, m, &x)) {
    // Collinear terms (e.g. every sample with the same adapter count): a tiny ridge picks the
    // smallest-norm solution among the equally good ones.
    double tr = 0;
    for (size_t a = 0; a < m; ++a) tr += ata[a * m + a];
    for (size_t a = 0; a < m; ++a) ata[a * m + a] += 1e-9 * tr / static_cast<double>(m);
    if (!Solve(ata, atb, m, &x))
      return InvalidArgumentError("the step samples do not determine a cost model");
  }
  std::vector<double> coef(n, 0);
  for (size_t a = 0; a < m; ++a) coef[live[a]] = x[a] / scale[live[a]];
  return FromCoefficients(kind, std::move(coef));
}

double CostModel::Predict(const StepFeatures& f) const {
  thread_local std::vector<double> t;
  Terms(kind_, f, &t);
  double s = 0;
  for (size_t j = 0; j < coef_.size(); ++j) s += coef_[j] * t[j];
  return std::max(0.0, s);
}

FitQuality CostModel::Evaluate(const std::vector<StepSample>& samples) const {
  FitQuality q;
  q.n = static_cast<int64_t>(samples.size());
  if (samples.empty()) return q;
  double mean = 0;
  for (const auto& s : samples) mean += s.seconds;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0, ss_tot = 0;
  std::vector<double> ape;
  for (const auto& s : samples) {
    const double p = Predict(s.f);
    ss_res += (p - s.seconds) * (p - s.seconds);
    ss_tot += (s.seconds - mean) * (s.seconds - mean);
    ape.push_back(std::fabs(p - s.seconds) / s.seconds);
  }
  q.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 0;
  q.median_ape = Percentile(ape, 0.5);
  q.p90_ape = Percentile(ape, 0.9);
  return q;
}

std::string CostModelFile::ToJson() const {
  json j;
  j["format"] = "chorus-cost-model";
  j["version"] = 1;
  j["model"] = model_name;
  j["threads"] = threads;
  j["loadavg"] = loadavg;
  j["clock"] = clock;
  if (!timing.empty()) j["timing"] = timing;
  j["use"] = CostModel::KindName(models[use].model.kind());
  json arr = json::array();
  for (const Entry& e : models) {
    json m;
    m["kind"] = CostModel::KindName(e.model.kind());
    json terms = json::object();
    const auto& names = CostModel::TermNames(e.model.kind());
    for (size_t i = 0; i < names.size(); ++i) terms[names[i]] = e.model.coefficients()[i];
    m["seconds_per_term"] = terms;
    m["heldout"] = {{"r2", e.heldout.r2},
                    {"median_ape", e.heldout.median_ape},
                    {"p90_ape", e.heldout.p90_ape},
                    {"n", e.heldout.n}};
    arr.push_back(m);
  }
  j["models"] = arr;
  return j.dump(2) + "\n";
}

void CostCorrection::Observe(double predicted_s, double measured_s) {
  if (!(predicted_s > 0) || !(measured_s > 0) || !std::isfinite(predicted_s) ||
      !std::isfinite(measured_s))
    return;
  const double log_ratio =
      std::clamp(std::log(measured_s / predicted_s), -std::log(8.0), std::log(8.0));
  // From 0 (the profile's own clock), so that one unusual first step moves it a tenth of the way.
  mean_log_ratio_ += kWeight * (log_ratio - mean_log_ratio_);
  ++steps_;
}

double CostCorrection::factor() const {
  return std::clamp(std::exp(mean_log_ratio_), 1.0 / kMaxFactor, kMaxFactor);
}

Result<CostModelFile> CostModelFile::Parse(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgumentError("cost model file is not a JSON object");
  if (StringField(j, "format") != "chorus-cost-model")
    return InvalidArgumentError("cost model file lacks \"format\": \"chorus-cost-model\"");
  auto mit = j.find("models");
  if (mit == j.end() || !mit->is_array() || mit->empty())
    return InvalidArgumentError("cost model file: \"models\" must be a non-empty list");
  CostModelFile f;
  if (auto m = j.find("model"); m != j.end() && m->is_string()) f.model_name = *m;
  if (auto t = j.find("threads"); t != j.end() && t->is_number_integer()) f.threads = *t;
  if (auto l = j.find("loadavg"); l != j.end() && l->is_string()) f.loadavg = *l;
  if (auto c = j.find("clock"); c != j.end() && c->is_string()) f.clock = *c;
  if (auto t = j.find("timing"); t != j.end() && t->is_string()) f.timing = *t;
  std::string use = "linear";
  if (auto u = j.find("use"); u != j.end()) {
    if (!u->is_string()) return InvalidArgumentError("cost model file: \"use\" must be a string");
    use = *u;
  }
  for (size_t i = 0; i < mit->size(); ++i) {
    const json& m = (*mit)[i];
    const std::string where = "cost model file: models[" + std::to_string(i) + "]";
    if (!m.is_object()) return InvalidArgumentError(where + " is not an object");
    const std::string kind = StringField(m, "kind");
    CostModel::Kind k;
    if (kind == "linear") {
      k = CostModel::Kind::kLinear;
    } else if (kind == "extended") {
      k = CostModel::Kind::kExtended;
    } else {
      return InvalidArgumentError(where + ".kind must be \"linear\" or \"extended\", got \"" +
                                  kind.substr(0, 32) + "\"");
    }
    auto terms = m.find("seconds_per_term");
    if (terms == m.end() || !terms->is_object())
      return InvalidArgumentError(where + ".seconds_per_term must be an object");
    std::vector<double> coef;
    for (const std::string& name : CostModel::TermNames(k)) {
      auto c = terms->find(name);
      // Files written before the prefill-context term: coefficient 0 predicts exactly what
      // they predicted (one context coefficient for all rows).
      if (c == terms->end() && name == "prefill_context_tokens") {
        coef.push_back(0);
        continue;
      }
      if (c == terms->end() || !c->is_number())
        return InvalidArgumentError(where + ".seconds_per_term lacks the number \"" + name + "\"");
      coef.push_back(c->get<double>());
    }
    auto model = CostModel::FromCoefficients(k, std::move(coef));
    if (!model.ok()) return model.status().WithContext(where);
    Entry e{.model = std::move(*model), .heldout = {}};
    if (auto h = m.find("heldout"); h != m.end() && h->is_object()) {
      for (auto [key, out] :
           {std::pair{"r2", &e.heldout.r2}, std::pair{"median_ape", &e.heldout.median_ape},
            std::pair{"p90_ape", &e.heldout.p90_ape}}) {
        if (auto v = h->find(key); v != h->end()) {
          if (!v->is_number())
            return InvalidArgumentError(where + ".heldout." + key + " must be a number");
          *out = v->get<double>();
        }
      }
      if (auto v = h->find("n"); v != h->end()) {
        if (!v->is_number_integer())
          return InvalidArgumentError(where + ".heldout.n must be an integer");
        e.heldout.n = v->get<int64_t>();
      }
    }
    if (kind == use) f.use = f.models.size();
    f.models.push_back(std::move(e));
  }
  if (CostModel::KindName(f.models[f.use].model.kind()) != use)
    return InvalidArgumentError("cost model file: \"use\" names a model it does not hold");
  return f;
}

Result<CostModelFile> CostModelFile::Load(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  auto f = Parse(text);
  if (!f.ok()) return f.status().WithContext(path);
  return f;
}

}  // namespace chorus::engine
