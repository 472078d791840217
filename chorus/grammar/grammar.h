// Grammars for constrained decoding (docs/structured_outputs.md): a context-free grammar over
// code points (the AST below), built by hand, from GBNF text (CompileGbnf) or from a JSON schema
// (CompileJsonSchema), then lowered to a byte-level form (Grammar) that the token matcher
// (grammar/matcher.h) runs. Lowering turns every character class into UTF-8 byte sequences, so
// the matcher never sees code points: a token that ends inside a multi-byte character, or a
// byte-fallback token <0xAB>, is matched byte by byte like any other.
//
// Thread-safety: a Grammar is immutable and cheap to copy (it shares its lowered form); the
// compile functions are reentrant; GrammarCache is thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/base/mutex.h"
#include "chorus/base/status.h"

namespace chorus::grammar {

// ---- AST (code-point level) ----------------------------------------------------------------

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr int kUnbounded = -1;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // `text` (UTF-8 bytes, matched exactly)
    kChars,    // one code point in `ranges` (inclusive), or not in them when `negated`
    kSeq,      // kids in order (empty = the empty string)
    kAlt,      // one of kids
    kRef,      // rule `rule`
    kRepeat,   // kids[0] between `min` and `max` times (max kUnbounded = no bound)
  };
  Kind kind = Kind::kSeq;
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  int rule = -1;
  int min = 0, max = 0;
  std::vector<Expr> kids;

  static Expr Literal(std::string s);
  static Expr Chars(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated = false);
  static Expr Seq(std::vector<Expr> kids);
  static Expr Alt(std::vector<Expr> kids);
  static Expr Ref(int rule);
  static Expr Repeat(Expr e, int min, int max);
  static Expr Optional(Expr e) { return Repeat(std::move(e), 0, 1); }
  static Expr Star(Expr e) { return Repeat(std::move(e), 0, kUnbounded); }
  static Expr Plus(Expr e) { return Repeat(std::move(e), 1, kUnbounded); }
};

// Named rules; `root` is where matching starts.
struct GrammarAst {
  std::vector<std::string> names;
  std::vector<Expr> bodies;
  std::vector<bool> defined;
  int root = -1;

  // The id of rule `name`, created (undefined) when new.
  int RuleId(const std::string& name);
  // Defines rule `name` (creating it when new); returns its id.
  int Define(const std::string& name, Expr body);
  // Copies every rule of `other` into this grammar under `prefix` + its name (references
  // remapped) and returns the id its root has here. Combines grammars, e.g. a tool-call wrapper
  // around JsonSchemaToAst(parameters): Expr::Seq({Literal("<tool_call>"), Ref(Embed(...)), ...}).
  int Embed(const GrammarAst& other, const std::string& prefix);
};

// ---- Lowered, byte-level grammar ------------------------------------------------------------

// A set of bytes.
struct ByteClass {
  uint64_t bits[4] = {0, 0, 0, 0};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  bool operator==(const ByteClass& o) const {
    return bits[0] == o.bits[0] && bits[1] == o.bits[1] && bits[2] == o.bits[2] &&
           bits[3] == o.bits[3];
  }
};

// Every rule is a list of alternatives; an alternative is a run of elements in `elems` ended by
// a kEnd element. Repetitions, groups and multi-byte character classes became auxiliary rules.
struct LoweredGrammar {
  struct Elem {
    enum class Kind : uint8_t { kEnd, kBytes, kRule };
    Kind kind;
    uint32_t value;  // kBytes: index into classes; kRule: rule id
  };
  std::vector<Elem> elems;
  std::vector<ByteClass> classes;
  std::vector<std::vector<uint32_t>> alts;  // per rule: start index of each alternative
  std::vector<std::string> names;           // per rule (auxiliary rules: "name_N")
  uint32_t root = 0;
  // Bytes that no class tells apart share an equivalence class (regex engines' "byte
  // classes"): the matcher computes one transition per class instead of one per byte.
  uint8_t byte_class[256] = {};
  int n_byte_classes = 1;
};

// A compiled grammar: immutable, shared. Default-constructed = empty (valid() false).
class Grammar {
 public:
  Grammar() = default;
  bool valid() const { return lowered_ != nullptr; }
  const LoweredGrammar& lowered() const { return *lowered_; }
  // Size figures (docs, logs).
  int64_t n_rules() const { return lowered_ ? static_cast<int64_t>(lowered_->alts.size()) : 0; }

  // Lowers `ast` (every referenced rule defined, no left recursion — errors name the rule).
  static Result<Grammar> FromAst(const GrammarAst& ast);

 private:
  std::shared_ptr<const LoweredGrammar> lowered_;
};

// Parses llama.cpp's GBNF: `name ::= alternatives` rules (a newline ends a rule except after
// `::=`, after `|` and inside parentheses), a rule named `root`, "literals" and [classes] with
// escapes \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH, [^negated] classes and ranges a-z, `.`
// (any character), ( groups ), postfix * + ? {m} {m,} {m,n}, and # comments. Errors name the
// line and column.
Result<Grammar> CompileGbnf(std::string_view text);
// The same, stopping at the AST (tests, tools that combine grammars).
Result<GrammarAst> ParseGbnf(std::string_view text);

// A process-wide LRU of compiled grammars keyed by their source (kind + text), so the same
// schema sent by every request compiles once (docs/structured_outputs.md, "Caching").
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256) : capacity_(capacity) {}
  // Returns the cached grammar for `key`, or compiles it with `compile` (outside the lock) and
  // caches it when it succeeds. Errors are not cached.
  template <typename F>
  Result<Grammar> GetOrCompile(const std::string& key, F&& compile) {
    if (auto g = Find(key); g.valid()) return g;
    Result<Grammar> r = compile();
    if (r.ok()) Insert(key, *r);
    return r;
  }
  Grammar Find(const std::string& key);
  void Insert(const std::string& key, Grammar g);
  size_t size() const;
  int64_t hits() const;
  int64_t misses() const;

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::list<std::pair<std::string, Grammar>> lru_ GUARDED_BY(mu_);  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, Grammar>>::iterator> index_
      GUARDED_BY(mu_);
  int64_t hits_ GUARDED_BY(mu_) = 0;
  int64_t misses_ GUARDED_BY(mu_) = 0;
};

// The cache the server and the engine share.
GrammarCache& SharedGrammarCache();

}  // namespace chorus::grammar
