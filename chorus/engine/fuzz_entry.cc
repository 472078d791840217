// The cost-model file fuzzer's body (fuzz_entry.h).
#include "chorus/engine/fuzz_entry.h"

#include <cmath>
#include <string_view>

#include "chorus/base/check.h"
#include "chorus/engine/cost_model.h"

namespace chorus::engine {

bool FuzzCostModelInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto f = CostModelFile::Parse(text);
  if (!f.ok()) {
    CHORUS_CHECK(f.status().code() == StatusCode::kInvalidArgument) << f.status().ToString();
    return false;
  }
  CHORUS_CHECK(!f->models.empty() && f->use < f->models.size());
  for (const CostModelFile::Entry& e : f->models) {
    CHORUS_CHECK(e.model.coefficients().size() == CostModel::TermNames(e.model.kind()).size());
    for (double c : e.model.coefficients()) CHORUS_CHECK(std::isfinite(c));
  }
  StepFeatures step;
  step.AddChunk(0, 17, /*prefill=*/true, /*rank=*/8);
  step.AddChunk(40, 1, /*prefill=*/false, /*rank=*/0);
  step.adapters = 1;
  // Never a negative time (NaN included: it compares false).
  CHORUS_CHECK(!(f->best().Predict(step) < 0));
  CHORUS_CHECK(!(f->best().Predict(StepFeatures{}) < 0));
  const std::string json = f->ToJson();
  auto again = CostModelFile::Parse(json);
  CHORUS_CHECK(again.ok()) << again.status().ToString();
  CHORUS_CHECK(again->ToJson() == json);
  return true;
}

std::vector<std::string> CostModelFuzzSeeds() {
  std::vector<std::string> seeds;
  // Files as `chorus profile` writes them: each kind alone, and both with either in use.
  auto model = [](CostModel::Kind k, double scale) {
    std::vector<double> coef;
    for (size_t i = 0; i < CostModel::TermNames(k).size(); ++i)
      coef.push_back(scale * static_cast<double>(i + 1));
    return CostModelFile::Entry{
        .model = *CostModel::FromCoefficients(k, coef),
        .heldout = {.r2 = 0.98, .median_ape = 0.03, .p90_ape = 0.08, .n = 40}};
  };
  for (size_t use : {0, 1}) {
    CostModelFile f;
    f.models = {model(CostModel::Kind::kLinear, 1e-6), model(CostModel::Kind::kExtended, -2e-7)};
    f.use = use;
    f.model_name = "tiny";
    f.threads = 2;
    f.loadavg = "0.50 0.40 0.30 1/90 1234";
    seeds.push_back(f.ToJson());
  }
  CostModelFile one;
  one.models = {model(CostModel::Kind::kExtended, 0)};
  seeds.push_back(one.ToJson());
  // Broken files: wrong types everywhere, a `use` the file does not hold, too few terms.
  seeds.emplace_back(R"({"format": 1, "use": 5, "models": [{"kind": 2, "heldout": {"r2": "x"}}]})");
  seeds.emplace_back(R"({"format": "chorus-cost-model", "use": "extended", "models": [
      {"kind": "linear", "seconds_per_term": {"1": 1, "adapters": "x"}, "heldout": []}]})");
  return seeds;
}

}  // namespace chorus::engine
