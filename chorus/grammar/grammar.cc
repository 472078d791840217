#include "chorus/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

namespace chorus::grammar {

Expr Expr::Literal(std::string s) {
  Expr e;
  e.kind = Kind::kLiteral;
  e.text = std::move(s);
  return e;
}
Expr Expr::Chars(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  Expr e;
  e.kind = Kind::kChars;
  e.ranges = std::move(ranges);
  e.negated = negated;
  return e;
}
Expr Expr::Seq(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Kind::kSeq;
  e.kids = std::move(kids);
  return e;
}
Expr Expr::Alt(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Kind::kAlt;
  e.kids = std::move(kids);
  return e;
}
Expr Expr::Ref(int rule) {
  Expr e;
  e.kind = Kind::kRef;
  e.rule = rule;
  return e;
}
Expr Expr::Repeat(Expr x, int min, int max) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.min = min;
  e.max = max;
  e.kids.push_back(std::move(x));
  return e;
}

int GrammarAst::RuleId(const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  names.push_back(name);
  bodies.emplace_back();
  defined.push_back(false);
  return static_cast<int>(names.size() - 1);
}

int GrammarAst::Define(const std::string& name, Expr body) {
  const int id = RuleId(name);
  bodies[static_cast<size_t>(id)] = std::move(body);
  defined[static_cast<size_t>(id)] = true;
  return id;
}

namespace {

void Remap(Expr* e, const std::vector<int>& ids) {
  if (e->kind == Expr::Kind::kRef && e->rule >= 0 && e->rule < static_cast<int>(ids.size()))
    e->rule = ids[static_cast<size_t>(e->rule)];
  for (Expr& k : e->kids) Remap(&k, ids);
}

}  // namespace

int GrammarAst::Embed(const GrammarAst& other, const std::string& prefix) {
  std::vector<int> ids;
  for (const std::string& n : other.names) ids.push_back(RuleId(prefix + n));
  for (size_t i = 0; i < other.names.size(); ++i) {
    if (!other.defined[i]) continue;
    Expr body = other.bodies[i];
    Remap(&body, ids);
    Define(prefix + other.names[i], std::move(body));
  }
  return other.root >= 0 ? ids[static_cast<size_t>(other.root)] : -1;
}

namespace {

using Elem = LoweredGrammar::Elem;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Limits that keep a hostile grammar (e.g. x{0,1000000}) from exhausting memory.
constexpr size_t kMaxElems = 4u << 20;
constexpr int kMaxRepeat = 100000;

// Sorted, merged, surrogates removed, clamped to the code point range.
Ranges Normalize(Ranges r, bool negated) {
  for (auto& [lo, hi] : r) hi = std::min(hi, kMaxCodepoint);
  r.erase(std::remove_if(r.begin(), r.end(), [](auto p) { return p.first > p.second; }), r.end());
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (auto p : r) {
    if (!merged.empty() && p.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, p.second);
    } else {
      merged.push_back(p);
    }
  }
  if (negated) {
    Ranges comp;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) comp.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodepoint) comp.emplace_back(next, kMaxCodepoint);
    merged = std::move(comp);
  }
  Ranges out;  // without the surrogates D800..DFFF (never valid UTF-8)
  for (auto [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

int EncodedLen(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void Encode(uint32_t cp, uint8_t* out) {
  const int n = EncodedLen(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

// Splits [lo, hi] (same encoded length) into ranges whose UTF-8 encodings are products of
// byte ranges: every code point in [lo, hi] ↔ one byte sequence in lo_b[i]..hi_b[i] per i.
void SplitUtf8(uint32_t lo, uint32_t hi,
               std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  const int n = EncodedLen(lo);
  if (EncodedLen(hi) != n) {
    static constexpr uint32_t kMax[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    const uint32_t split = kMax[n - 1];
    SplitUtf8(lo, split, out);
    SplitUtf8(split + 1, hi, out);
    return;
  }
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

class Lowerer {
 public:
  explicit Lowerer(const GrammarAst& ast) : ast_(ast) {}

  Result<Grammar> Run(std::shared_ptr<LoweredGrammar>* out) {
    if (ast_.root < 0 || ast_.root >= static_cast<int>(ast_.names.size()))
      return InvalidArgumentError("grammar has no root rule");
    for (size_t i = 0; i < ast_.names.size(); ++i) {
      if (!ast_.defined[i])
        return InvalidArgumentError("rule '" + ast_.names[i] + "' is used but never defined");
    }
    g_ = std::make_shared<LoweredGrammar>();
    g_->alts.resize(ast_.names.size());
    g_->names = ast_.names;
    g_->root = static_cast<uint32_t>(ast_.root);
    for (size_t i = 0; i < ast_.names.size(); ++i) {
      CHORUS_RETURN_IF_ERROR(LowerRule(static_cast<uint32_t>(i), ast_.bodies[i]));
    }
    CHORUS_RETURN_IF_ERROR(CheckLeftRecursion());
    *out = g_;
    return Grammar();
  }

 private:
  uint32_t NewRule(uint32_t parent) {
    g_->alts.emplace_back();
    g_->names.push_back(g_->names[parent] + "_" + std::to_string(g_->alts.size() - 1));
    return static_cast<uint32_t>(g_->alts.size() - 1);
  }

  uint32_t ClassId(const ByteClass& c) {
    auto key = std::make_tuple(c.bits[0], c.bits[1], c.bits[2], c.bits[3]);
    auto [it, inserted] = class_ids_.try_emplace(key, static_cast<uint32_t>(g_->classes.size()));
    if (inserted) g_->classes.push_back(c);
    return it->second;
  }

  Status AddAlt(uint32_t rule, const std::vector<Elem>& seq) {
    if (g_->elems.size() + seq.size() + 1 > kMaxElems)
      return ResourceExhaustedError("grammar too large (more than 4M elements after expansion)");
    g_->alts[rule].push_back(static_cast<uint32_t>(g_->elems.size()));
    g_->elems.insert(g_->elems.end(), seq.begin(), seq.end());
    g_->elems.push_back({Elem::Kind::kEnd, 0});
    return OkStatus();
  }

  Status LowerRule(uint32_t rule, const Expr& body) {
    if (body.kind == Expr::Kind::kAlt) {
      for (const Expr& k : body.kids) {
        std::vector<Elem> seq;
        CHORUS_RETURN_IF_ERROR(LowerSeq(rule, k, &seq));
        CHORUS_RETURN_IF_ERROR(AddAlt(rule, seq));
      }
      return OkStatus();
    }
    std::vector<Elem> seq;
    CHORUS_RETURN_IF_ERROR(LowerSeq(rule, body, &seq));
    return AddAlt(rule, seq);
  }

  // Appends `e` as a sequence of elements (groups, alternations, repetitions and multi-byte
  // classes become auxiliary rules named after `owner`).
  Status LowerSeq(uint32_t owner, const Expr& e, std::vector<Elem>* seq) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        for (unsigned char c : e.text) {
          ByteClass bc;
          bc.Add(c, c);
          seq->push_back({Elem::Kind::kBytes, ClassId(bc)});
        }
        return OkStatus();
      case Expr::Kind::kSeq:
        for (const Expr& k : e.kids) CHORUS_RETURN_IF_ERROR(LowerSeq(owner, k, seq));
        return OkStatus();
      case Expr::Kind::kRef:
        if (e.rule < 0 || e.rule >= static_cast<int>(ast_.names.size()))
          return InvalidArgumentError("reference to an unknown rule");
        seq->push_back({Elem::Kind::kRule, static_cast<uint32_t>(e.rule)});
        return OkStatus();
      case Expr::Kind::kAlt: {
        const uint32_t r = NewRule(owner);
        seq->push_back({Elem::Kind::kRule, r});
        return LowerRule(r, e);
      }
      case Expr::Kind::kChars:
        return LowerChars(owner, e, seq);
      case Expr::Kind::kRepeat:
        return LowerRepeat(owner, e, seq);
    }
    return InternalError("bad expression kind");
  }

  Status LowerChars(uint32_t owner, const Expr& e, std::vector<Elem>* seq) {
    const Ranges r = Normalize(e.ranges, e.negated);
    if (r.empty()) return InvalidArgumentError("character class matches nothing");
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> parts;
    for (auto [lo, hi] : r) SplitUtf8(lo, hi, &parts);
    // All single-byte parts merge into one class; multi-byte parts become alternatives.
    ByteClass single;
    bool any_single = false;
    std::vector<std::vector<Elem>> multi;
    for (const auto& p : parts) {
      if (p.size() == 1) {
        single.Add(p[0].first, p[0].second);
        any_single = true;
        continue;
      }
      std::vector<Elem> s;
      for (auto [lo, hi] : p) {
        ByteClass bc;
        bc.Add(lo, hi);
        s.push_back({Elem::Kind::kBytes, ClassId(bc)});
      }
      multi.push_back(std::move(s));
    }
    if (multi.empty()) {
      seq->push_back({Elem::Kind::kBytes, ClassId(single)});
      return OkStatus();
    }
    const uint32_t key_rule = CharsRule(owner, single, any_single, multi);
    seq->push_back({Elem::Kind::kRule, key_rule});
    return OkStatus();
  }

  uint32_t CharsRule(uint32_t owner, const ByteClass& single, bool any_single,
                     const std::vector<std::vector<Elem>>& multi) {
    // Shared by identical classes (e.g. every JSON string character): one rule each.
    std::vector<uint32_t> key;
    if (any_single) key.push_back(ClassId(single));
    key.push_back(~0u);
    for (const auto& s : multi) {
      for (const Elem& x : s) key.push_back(x.value);
      key.push_back(~0u);
    }
    auto it = chars_rules_.find(key);
    if (it != chars_rules_.end()) return it->second;
    const uint32_t r = NewRule(owner);
    if (any_single) AddAlt(r, {{Elem::Kind::kBytes, ClassId(single)}}).IgnoreError();
    for (const auto& s : multi) AddAlt(r, s).IgnoreError();
    chars_rules_.emplace(std::move(key), r);
    return r;
  }

  Status LowerRepeat(uint32_t owner, const Expr& e, std::vector<Elem>* seq) {
    if (e.min < 0 || (e.max != kUnbounded && e.max < e.min))
      return InvalidArgumentError("repetition bounds {" + std::to_string(e.min) + "," +
                                  std::to_string(e.max) + "} are invalid");
    if (e.min > kMaxRepeat || e.max > kMaxRepeat)
      return InvalidArgumentError("repetition bound above " + std::to_string(kMaxRepeat));
    // The repeated item as elements (usually one: a class or a rule).
    std::vector<Elem> item;
    CHORUS_RETURN_IF_ERROR(LowerSeq(owner, e.kids[0], &item));
    if (item.size() > 1) {
      const uint32_t r = NewRule(owner);
      CHORUS_RETURN_IF_ERROR(AddAlt(r, item));
      item = {{Elem::Kind::kRule, r}};
    }
    for (int i = 0; i < e.min; ++i) seq->insert(seq->end(), item.begin(), item.end());
    if (e.max == kUnbounded) {
      // R ::= item R | ε  (right recursion: the matcher's tail call keeps its stacks flat).
      const uint32_t r = NewRule(owner);
      std::vector<Elem> body = item;
      body.push_back({Elem::Kind::kRule, r});
      CHORUS_RETURN_IF_ERROR(AddAlt(r, body));
      CHORUS_RETURN_IF_ERROR(AddAlt(r, {}));
      seq->push_back({Elem::Kind::kRule, r});
    } else if (e.max > e.min) {
      // O_1 ::= item | ε; O_k ::= item O_{k-1} | ε.
      uint32_t prev = 0;
      for (int k = 1; k <= e.max - e.min; ++k) {
        const uint32_t r = NewRule(owner);
        std::vector<Elem> body = item;
        if (k > 1) body.push_back({Elem::Kind::kRule, prev});
        CHORUS_RETURN_IF_ERROR(AddAlt(r, body));
        CHORUS_RETURN_IF_ERROR(AddAlt(r, {}));
        prev = r;
      }
      seq->push_back({Elem::Kind::kRule, prev});
    }
    return OkStatus();
  }

  // The matcher expands rules depth-first until it reaches a byte; a rule that can reach itself
  // without consuming a byte would expand forever, so it is rejected here.
  Status CheckLeftRecursion() {
    const size_t n = g_->alts.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t a : g_->alts[r]) {
          bool all = true;
          for (uint32_t p = a; g_->elems[p].kind != Elem::Kind::kEnd; ++p) {
            const Elem& x = g_->elems[p];
            if (x.kind == Elem::Kind::kBytes || !nullable[x.value]) {
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
    // Edges r -> s: s can start r's expansion.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      for (uint32_t a : g_->alts[r]) {
        for (uint32_t p = a; g_->elems[p].kind == Elem::Kind::kRule; ++p) {
          first[r].push_back(g_->elems[p].value);
          if (!nullable[g_->elems[p].value]) break;
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the DFS stack, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (size_t s = 0; s < n; ++s) {
      if (color[s] != 0) continue;
      stack.push_back({static_cast<uint32_t>(s), 0});
      color[s] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i == first[r].size()) {
          color[r] = 2;
          stack.pop_back();
          continue;
        }
        const uint32_t t = first[r][i++];
        if (color[t] == 1) {
          return InvalidArgumentError("rule '" + BaseName(t) +
                                      "' is left-recursive (it can reach itself without "
                                      "matching a character)");
        }
        if (color[t] == 0) {
          color[t] = 1;
          stack.push_back({t, 0});
        }
      }
    }
    return OkStatus();
  }

  std::string BaseName(uint32_t r) const {
    return r < ast_.names.size() ? ast_.names[r] : g_->names[r];
  }

  const GrammarAst& ast_;
  std::shared_ptr<LoweredGrammar> g_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, uint32_t> class_ids_;
  std::map<std::vector<uint32_t>, uint32_t> chars_rules_;
};

}  // namespace

Result<Grammar> Grammar::FromAst(const GrammarAst& ast) {
  std::shared_ptr<LoweredGrammar> lowered;
  Lowerer l(ast);
  CHORUS_ASSIGN_OR_RETURN(Grammar g, l.Run(&lowered));
  // Refine the partition of the 256 bytes by every class: two bytes stay together only when
  // each class holds both or neither.
  int n = 1;
  for (const ByteClass& c : lowered->classes) {
    int split[256][2];
    for (auto& s : split) s[0] = s[1] = -1;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      int& id = split[lowered->byte_class[b]][c.Has(static_cast<uint8_t>(b)) ? 1 : 0];
      if (id < 0) id = next++;
      lowered->byte_class[b] = static_cast<uint8_t>(id);
    }
    n = next;
    if (n == 256) break;  // every byte apart already
  }
  lowered->n_byte_classes = n;
  g.lowered_ = std::move(lowered);
  return g;
}

Grammar GrammarCache::Find(const std::string& key) {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return Grammar();
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void GrammarCache::Insert(const std::string& key, Grammar g) {
  MutexLock lock(&mu_);
  if (index_.count(key) != 0) return;
  lru_.emplace_front(key, std::move(g));
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t GrammarCache::size() const {
  MutexLock lock(&mu_);
  return lru_.size();
}
int64_t GrammarCache::hits() const {
  MutexLock lock(&mu_);
  return hits_;
}
int64_t GrammarCache::misses() const {
  MutexLock lock(&mu_);
  return misses_;
}

GrammarCache& SharedGrammarCache() {
  static GrammarCache* cache = new GrammarCache(256);
  return *cache;
}

}  // namespace chorus::grammar
