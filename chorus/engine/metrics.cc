#include "chorus/engine/metrics.h"

#include <algorithm>
#include <chrono>

namespace chorus::engine {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::Get() const {
  Snapshot s;
  s.bounds = bounds_;
  MutexLock lock(&mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) {
    acc += c;
    s.cumulative.push_back(acc);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

// ---- AdapterMetrics ----

const std::vector<double>& AdapterMetrics::TtftBounds() {
  static const std::vector<double> kBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                              1,    2.5,   5,    10,  30,   60};
  return kBounds;
}

AdapterMetrics::Entry& AdapterMetrics::EntryLocked(const std::string& adapter) {
  auto it = entries_.find(adapter);
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxTracked && !adapter.empty()) {
      if (overflow_.counts.empty()) overflow_.counts.assign(TtftBounds().size() + 1, 0);
      return overflow_;
    }
    it = entries_.emplace(adapter, Entry{}).first;
    it->second.counts.assign(TtftBounds().size() + 1, 0);
  }
  return it->second;
}

void AdapterMetrics::CountRequest(const std::string& adapter) {
  MutexLock lock(&mu_);
  ++EntryLocked(adapter).requests;
}

void AdapterMetrics::ObserveTtft(const std::string& adapter, double seconds) {
  const auto& b = TtftBounds();
  const size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), seconds) - b.begin());
  MutexLock lock(&mu_);
  Entry& e = EntryLocked(adapter);
  ++e.counts[i];
  e.sum += seconds;
  ++e.count;
}

void AdapterMetrics::CountSlo(const std::string& adapter, SloCount which) {
  MutexLock lock(&mu_);
  ++EntryLocked(adapter).slo[static_cast<size_t>(which)];
}

namespace {

void AddInto(AdapterMetrics::Series* s, uint64_t requests, const std::vector<uint64_t>& counts,
             double sum, uint64_t count, const std::array<uint64_t, kSloCounts>& slo) {
  s->requests += requests;
  for (size_t i = 0; i < slo.size(); ++i) s->slo[i] += slo[i];
  if (s->ttft.cumulative.empty()) s->ttft.cumulative.assign(counts.size(), 0);
  uint64_t acc = 0;
  for (size_t i = 0; i < counts.size() && i < s->ttft.cumulative.size(); ++i) {
    acc += counts[i];
    s->ttft.cumulative[i] += acc;
  }
  s->ttft.sum += sum;
  s->ttft.count += count;
}

}  // namespace

AdapterMetrics::Export AdapterMetrics::Top(size_t top_n) const {
  Export out;
  const auto& bounds = TtftBounds();
  auto init = [&](Series* s, std::string name) {
    s->adapter = std::move(name);
    s->ttft.bounds = bounds;
    s->ttft.cumulative.assign(bounds.size() + 1, 0);
  };
  init(&out.base, "");
  init(&out.other, "");
  MutexLock lock(&mu_);
  std::vector<std::pair<const std::string*, const Entry*>> named;
  named.reserve(entries_.size());
  for (const auto& [name, e] : entries_) {
    if (name.empty()) {
      AddInto(&out.base, e.requests, e.counts, e.sum, e.count, e.slo);
    } else {
      named.emplace_back(&name, &e);
    }
  }
  const size_t n = std::min(top_n, named.size());
  std::partial_sort(named.begin(), named.begin() + static_cast<std::ptrdiff_t>(n), named.end(),
                    [](const auto& x, const auto& y) {
                      if (x.second->requests != y.second->requests)
                        return x.second->requests > y.second->requests;
                      return *x.first < *y.first;
                    });
  for (size_t i = 0; i < named.size(); ++i) {
    const Entry& e = *named[i].second;
    if (i < n) {
      Series s;
      init(&s, *named[i].first);
      AddInto(&s, e.requests, e.counts, e.sum, e.count, e.slo);
      out.top.push_back(std::move(s));
    } else {
      AddInto(&out.other, e.requests, e.counts, e.sum, e.count, e.slo);
      ++out.other_adapters;
    }
  }
  if (!overflow_.counts.empty()) {
    AddInto(&out.other, overflow_.requests, overflow_.counts, overflow_.sum, overflow_.count,
            overflow_.slo);
    ++out.other_adapters;
  }
  return out;
}

bool AdapterActivity::Publish(const std::vector<const std::string*>& running,
                              const std::vector<const std::string*>& waiting) {
  auto same = [](const std::vector<std::string>& a, const std::vector<const std::string*>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != *b[i]) return false;
    return true;
  };
  MutexLock lock(&mu_);
  if (same(snapshot_.running, running) && same(snapshot_.waiting, waiting)) return false;
  snapshot_.running.clear();
  for (const std::string* s : running) snapshot_.running.push_back(*s);
  snapshot_.waiting.clear();
  for (const std::string* s : waiting) snapshot_.waiting.push_back(*s);
  snapshot_.updated_unix_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return true;
}

AdapterActivity::Snapshot AdapterActivity::Get() const {
  MutexLock lock(&mu_);
  return snapshot_;
}

}  // namespace chorus::engine
