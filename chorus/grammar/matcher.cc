#include "chorus/grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <numeric>
#include <tuple>

#include "chorus/tokenizer/tokenizer.h"

namespace chorus::grammar {
namespace {

using Elem = LoweredGrammar::Elem;

// Bounds on one matcher's memo tables; past them the matcher restarts its tables from the
// current state (Compact), so a long generation cannot grow them without bound.
constexpr size_t kMaxStates = 8192;           // × 1 KiB of transitions each
constexpr size_t kMaxNodes = 1u << 20;        // interned stack frames
constexpr size_t kMaskCacheBytes = 1u << 20;  // cached masks per matcher

uint64_t HashInts(const std::vector<int32_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t x : v) {
    h ^= static_cast<uint32_t>(x);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// ---- FlatIndex -------------------------------------------------------------------------------

namespace detail {

int32_t FlatIndex::FindOrInsert(uint64_t key, int32_t value, bool* inserted) {
  if (2 * (size_ + 1) > keys_.size()) Grow();
  const size_t mask = keys_.size() - 1;
  size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  for (;; i = (i + 1) & mask) {
    if (epochs_[i] != epoch_) {
      keys_[i] = key;
      values_[i] = value;
      epochs_[i] = epoch_;
      ++size_;
      *inserted = true;
      return value;
    }
    if (keys_[i] == key) {
      *inserted = false;
      return values_[i];
    }
  }
}

void FlatIndex::Clear() {
  size_ = 0;
  if (++epoch_ == 0) {  // wrapped: stale stamps could look current
    std::fill(epochs_.begin(), epochs_.end(), 0);
    epoch_ = 1;
  }
}

void FlatIndex::Grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<int32_t> values = std::move(values_);
  std::vector<uint32_t> epochs = std::move(epochs_);
  const size_t n = std::max<size_t>(64, 2 * keys.size());
  keys_.assign(n, 0);
  values_.assign(n, 0);
  epochs_.assign(n, 0);
  const uint32_t old_epoch = epoch_;
  epoch_ = 1;
  size_ = 0;
  bool ignored;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (epochs[i] == old_epoch) FindOrInsert(keys[i], values[i], &ignored);
  }
}

}  // namespace detail

int64_t TokenMask::Count() const {
  int64_t c = 0;
  for (uint64_t w : words_) c += std::popcount(w);
  return c;
}

// ---- Vocabulary ------------------------------------------------------------------------------

std::shared_ptr<const Vocabulary> Vocabulary::Create(std::vector<std::string> token_bytes,
                                                     std::vector<int32_t> eos_ids,
                                                     const std::vector<int32_t>& never) {
  auto v = std::make_shared<Vocabulary>();
  v->bytes_ = std::move(token_bytes);
  const int64_t n = v->size();
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  eos_ids.erase(
      std::remove_if(eos_ids.begin(), eos_ids.end(), [n](int32_t id) { return id < 0 || id >= n; }),
      eos_ids.end());
  v->eos_ = std::move(eos_ids);
  for (int32_t id : never) {
    if (id >= 0 && id < n) v->bytes_[static_cast<size_t>(id)].clear();
  }
  for (int32_t id : v->eos_) v->bytes_[static_cast<size_t>(id)].clear();
  for (auto& b : v->bytes_) {
    if (b.size() > 4096) b.clear();  // no real token is this long; keeps depths small
  }

  // Tokens sorted by bytes = the prefix tree's preorder.
  std::vector<int32_t> order;
  for (int32_t i = 0; i < n; ++i) {
    if (!v->bytes_[static_cast<size_t>(i)].empty()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto& x = v->bytes_[static_cast<size_t>(a)];
    const auto& y = v->bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  std::vector<uint32_t> path;  // node index per depth - 1
  std::string_view prev;
  for (int32_t id : order) {
    const std::string& s = v->bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < s.size() && prev[lcp] == s[lcp]) ++lcp;
    while (path.size() > lcp) {
      v->node_end_[path.back()] = static_cast<uint32_t>(v->node_byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(v->node_byte_.size()));
      v->node_byte_.push_back(static_cast<uint8_t>(s[d]));
      v->node_depth_.push_back(static_cast<uint16_t>(d + 1));
      v->node_end_.push_back(0);
      v->node_tok_.push_back(static_cast<uint32_t>(v->token_ids_.size()));
    }
    v->token_ids_.push_back(id);
    v->max_depth_ = std::max(v->max_depth_, static_cast<int>(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    v->node_end_[path.back()] = static_cast<uint32_t>(v->node_byte_.size());
    path.pop_back();
  }
  v->node_tok_.push_back(static_cast<uint32_t>(v->token_ids_.size()));
  return v;
}

std::shared_ptr<const Vocabulary> Vocabulary::FromTokenizer(const tokenizer::Tokenizer& tok,
                                                            int64_t n_logits) {
  const int32_t n = tok.vocab_size();
  // Bytes as they follow an ordinary token (not BOS: after BOS a leading space is stripped).
  const int32_t prev = tok.bos_id() == 0 ? (n > 1 ? 1 : -1) : 0;
  std::vector<std::string> bytes(static_cast<size_t>(std::max<int64_t>(n_logits, n)));
  std::vector<int32_t> never;
  for (int32_t id = 0; id < n; ++id) {
    if (tok.IsSpecial(id)) {
      never.push_back(id);
      continue;
    }
    bytes[static_cast<size_t>(id)] = tok.TokenBytes(prev, id, /*include_special=*/false);
  }
  return Create(std::move(bytes), tok.eos_ids(), never);
}

bool Vocabulary::IsEos(int32_t id) const {
  return std::binary_search(eos_.begin(), eos_.end(), id);
}

// ---- Matcher ---------------------------------------------------------------------------------

Matcher::Matcher(Grammar grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), g_(&grammar_.lowered()), vocab_(std::move(vocab)) {
  scratch_.clear();
  expand_seen_.Clear();
  step_work_ = 0;
  expand_cut_ = false;
  for (uint32_t a : g_->alts[g_->root]) Expand(a, -1, &scratch_);
  if (expand_cut_) ++truncated_;
  state_ = InternSet(&scratch_);
}

int32_t Matcher::InternNode(uint32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
  bool inserted;
  const int32_t id = node_ids_.FindOrInsert(key, static_cast<int32_t>(nodes_.size()), &inserted);
  if (inserted) nodes_.push_back({pos, parent});
  return id;
}

// Pushes onto `out` every stack that reading from `pos` (with `parent` below) can reach before
// it must match a byte; -1 for the empty stack (the grammar is complete there).
void Matcher::Expand(uint32_t pos, int32_t parent, std::vector<int32_t>* out) {
  // Depth-first with an explicit stack: a chain of nullable items (x? repeated thousands of
  // times) would otherwise recurse once per item and could overflow a thread's stack. The
  // alternatives are pushed last-first, so they are expanded in the order a recursion would
  // (which matters only for what a work bound drops).
  std::vector<std::pair<uint32_t, int32_t>>& todo = expand_todo_;
  todo.clear();
  todo.emplace_back(pos, parent);
  while (!todo.empty()) {
    std::tie(pos, parent) = todo.back();
    todo.pop_back();
    for (;;) {
      // Each (position, stack below) expands to the same stacks whoever reaches it: expanding
      // it once per top-level step keeps grammars with many empty alternatives (x ::= "" | ""
      // used 30 times in a row) polynomial instead of exponential.
      const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
      bool first;
      expand_seen_.FindOrInsert(key, 0, &first);
      if (!first) break;
      // Past a work bound the rest is dropped (see kMaxStepWork); the caller counts it.
      if (++step_work_ > kMaxStepWork || (in_mask_ && mask_work_ + step_work_ > kMaxMaskWork)) {
        expand_cut_ = true;
        todo.clear();
        return;
      }
      const Elem& e = g_->elems[pos];
      if (e.kind == Elem::Kind::kEnd) {
        if (parent < 0) {
          out->push_back(-1);
          break;
        }
        const Node n = nodes_[static_cast<size_t>(parent)];
        pos = n.pos;
        parent = n.parent;
        continue;
      }
      if (e.kind == Elem::Kind::kBytes) {
        out->push_back(InternNode(pos, parent));
        break;
      }
      // A rule last in its alternative returns straight to the caller's caller (tail call).
      const int32_t cont =
          g_->elems[pos + 1].kind == Elem::Kind::kEnd ? parent : InternNode(pos + 1, parent);
      const std::vector<uint32_t>& alts = g_->alts[e.value];
      for (auto a = alts.rbegin(); a != alts.rend(); ++a) todo.emplace_back(*a, cont);
      break;
    }
  }
}

int32_t Matcher::InternSet(std::vector<int32_t>* stacks) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
  if (stacks->empty()) return -1;
  if (stacks->size() > kMaxStacks) {
    stacks->resize(kMaxStacks);
    ++truncated_;
  }
  const uint64_t h = HashInts(*stacks);
  auto& ids = set_ids_[h];
  for (int32_t id : ids) {
    if (sets_[static_cast<size_t>(id)] == *stacks) return id;
  }
  const int32_t id = static_cast<int32_t>(sets_.size());
  sets_.push_back(*stacks);
  ids.push_back(id);
  trans_.resize(sets_.size() * 256, -2);
  return id;
}

int32_t Matcher::Step(int32_t state, uint8_t byte) {
  const size_t slot = static_cast<size_t>(state) * 256 + byte;
  if (trans_[slot] != -2) return trans_[slot];
  std::vector<int32_t>& next = step_scratch_;  // reused: no allocation per new transition
  next.clear();
  expand_seen_.Clear();
  step_work_ = 0;
  expand_cut_ = false;
  for (int32_t id : sets_[static_cast<size_t>(state)]) {
    if (id < 0) continue;
    const Node n = nodes_[static_cast<size_t>(id)];
    if (g_->classes[g_->elems[n.pos].value].Has(byte)) Expand(n.pos + 1, n.parent, &next);
  }
  // The scan of the set counts too: many cheap transitions out of a set of thousands of stacks
  // would otherwise be unbounded.
  if (in_mask_)
    mask_work_ += step_work_ + static_cast<int64_t>(sets_[static_cast<size_t>(state)].size());
  if (expand_cut_) ++truncated_;
  const int32_t r = InternSet(&next);
  // Every byte of `byte`'s equivalence class leads to the same set (trans_ may have moved).
  const uint8_t cls = g_->byte_class[byte];
  int32_t* row = trans_.data() + static_cast<size_t>(state) * 256;
  for (int b = 0; b < 256; ++b) {
    if (g_->byte_class[b] == cls) row[b] = r;
  }
  return r;
}

void Matcher::FillMask(TokenMask* mask) {
  const Vocabulary& v = *vocab_;
  if (mask->size() != v.size()) mask->Resize(v.size());
  if (ended_ || state_ < 0) {
    mask->Clear();
    return;
  }
  if (auto it = mask_cache_on_ ? mask_cache_.find(state_) : mask_cache_.end();
      it != mask_cache_.end()) {
    ++mask_hits_;
    mask->words() = it->second;
    return;
  }
  mask->Clear();
  in_mask_ = true;
  mask_work_ = 0;
  uint64_t* words = mask->words().data();
  walk_.resize(static_cast<size_t>(v.max_depth_) + 1);
  walk_[0] = state_;
  const size_t n = v.node_byte_.size();
  const uint8_t* byte = v.node_byte_.data();
  const uint16_t* depth = v.node_depth_.data();
  const uint32_t* end = v.node_end_.data();
  const uint32_t* tok = v.node_tok_.data();
  const int32_t* ids = v.token_ids_.data();
  for (size_t i = 0; i < n;) {
    const int32_t from = walk_[depth[i] - 1];
    const size_t slot = static_cast<size_t>(from) * 256 + byte[i];
    int32_t s = trans_[slot];
    if (s == -2) s = Step(from, byte[i]);
    if (s < 0) {
      i = end[i];  // no token under this prefix can match
      continue;
    }
    walk_[depth[i]] = s;
    for (uint32_t k = tok[i]; k < tok[i + 1]; ++k) {
      const int32_t id = ids[k];
      words[id >> 6] |= uint64_t{1} << (id & 63);
    }
    ++i;
  }
  in_mask_ = false;
  if (CanEnd()) {
    for (int32_t id : v.eos_) mask->Set(id);
  }
  const size_t bytes = mask->words().size() * sizeof(uint64_t);
  if (mask_cache_on_ && mask_cache_bytes_ + bytes <= kMaskCacheBytes) {
    mask_cache_.emplace(state_, mask->words());
    mask_cache_bytes_ += bytes;
  }
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  if (ended_ || state_ < 0) return false;
  int32_t s = state_;
  for (char c : bytes) {
    s = Step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  state_ = s;
  if (sets_.size() > kMaxStates || nodes_.size() > kMaxNodes) Compact();
  return true;
}

bool Matcher::Accept(int32_t token) {
  if (ended_ || state_ < 0 || token < 0 || token >= vocab_->size()) return false;
  if (vocab_->IsEos(token)) {
    if (!CanEnd()) return false;
    ended_ = true;
    return true;
  }
  const std::string& b = vocab_->bytes(token);
  if (b.empty()) return false;
  return AcceptBytes(b);
}

bool Matcher::CanEnd() const {
  return !ended_ && state_ >= 0 && sets_[static_cast<size_t>(state_)].front() == -1;
}

bool Matcher::Done() const {
  if (ended_) return true;
  if (state_ < 0) return false;
  const auto& s = sets_[static_cast<size_t>(state_)];
  return s.size() == 1 && s[0] == -1;
}

// Restarts the memo tables from the current state's stacks (re-interned from scratch).
void Matcher::Compact() {
  std::vector<std::vector<uint32_t>> stacks;  // each bottom first
  bool accept = false;
  for (int32_t id : sets_[static_cast<size_t>(state_)]) {
    if (id < 0) {
      accept = true;
      continue;
    }
    std::vector<uint32_t> chain;
    for (int32_t p = id; p >= 0; p = nodes_[static_cast<size_t>(p)].parent)
      chain.push_back(nodes_[static_cast<size_t>(p)].pos);
    std::reverse(chain.begin(), chain.end());
    stacks.push_back(std::move(chain));
  }
  nodes_.clear();
  node_ids_.Clear();
  sets_.clear();
  set_ids_.clear();
  trans_.clear();
  mask_cache_.clear();
  mask_cache_bytes_ = 0;
  std::vector<int32_t> set;
  if (accept) set.push_back(-1);
  for (const auto& chain : stacks) {
    int32_t parent = -1;
    for (uint32_t pos : chain) parent = InternNode(pos, parent);
    set.push_back(parent);
  }
  state_ = InternSet(&set);
}

// ---- Reference (Earley) ---------------------------------------------------------------------

namespace {

struct Item {
  uint32_t rule, pos, origin;
  bool operator==(const Item& o) const {
    return rule == o.rule && pos == o.pos && origin == o.origin;
  }
};

std::vector<bool> Nullable(const LoweredGrammar& g) {
  std::vector<bool> nullable(g.alts.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.alts.size(); ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : g.alts[r]) {
        bool all = true;
        for (uint32_t p = a; g.elems[p].kind != Elem::Kind::kEnd; ++p) {
          if (g.elems[p].kind == Elem::Kind::kBytes || !nullable[g.elems[p].value]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

}  // namespace

int ReferenceRecognize(const Grammar& grammar, std::string_view text) {
  const LoweredGrammar& g = grammar.lowered();
  const std::vector<bool> nullable = Nullable(g);
  std::vector<std::vector<Item>> chart(text.size() + 1);
  auto add = [&](size_t i, Item it) {
    auto& set = chart[i];
    if (std::find(set.begin(), set.end(), it) == set.end()) set.push_back(it);
  };
  for (uint32_t a : g.alts[g.root]) add(0, {g.root, a, 0});
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t k = 0; k < chart[i].size(); ++k) {
      const Item it = chart[i][k];
      const Elem& e = g.elems[it.pos];
      if (e.kind == Elem::Kind::kEnd) {  // complete
        for (size_t j = 0; j < chart[it.origin].size(); ++j) {
          const Item p = chart[it.origin][j];
          const Elem& pe = g.elems[p.pos];
          if (pe.kind == Elem::Kind::kRule && pe.value == it.rule)
            add(i, {p.rule, p.pos + 1, p.origin});
        }
      } else if (e.kind == Elem::Kind::kRule) {  // predict
        for (uint32_t a : g.alts[e.value]) add(i, {e.value, a, static_cast<uint32_t>(i)});
        if (nullable[e.value]) add(i, {it.rule, it.pos + 1, it.origin});
      } else if (i < text.size() && g.classes[e.value].Has(static_cast<uint8_t>(text[i]))) {
        add(i + 1, {it.rule, it.pos + 1, it.origin});  // scan
      }
    }
  }
  bool viable = false;
  for (const Item& it : chart[text.size()]) {
    const Elem& e = g.elems[it.pos];
    if (e.kind == Elem::Kind::kEnd && it.rule == g.root && it.origin == 0) return 1;
    if (e.kind == Elem::Kind::kBytes) viable = true;
  }
  return viable ? 0 : -1;
}

TokenMask ReferenceMask(const Grammar& g, const Vocabulary& vocab, std::string_view prefix) {
  TokenMask m(vocab.size());
  const bool complete = ReferenceRecognize(g, prefix) == 1;
  std::string buf;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (vocab.IsEos(id)) {
      if (complete) m.Set(id);
      continue;
    }
    const std::string& b = vocab.bytes(id);
    if (b.empty()) continue;
    buf.assign(prefix);
    buf += b;
    if (ReferenceRecognize(g, buf) >= 0) m.Set(id);
  }
  return m;
}

}  // namespace chorus::grammar
