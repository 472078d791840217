// Recursive-descent parser for the Jinja subset (precedence as in Jinja2's parser:
// conditional < or < and < not < comparison/in < + - < ~ < * / // % < ** < unary <
// primary with postfix . [] () and filters | / tests `is`).
#include <initializer_list>

#include "chorus/tokenizer/jinja_ast.h"
#include "chorus/tokenizer/jinja_lexer.h"

namespace chorus::tokenizer::jinja {

namespace {

// Bounds parser recursion (and with it evaluation recursion) for hostile input like
// "((((((...".
constexpr int kMaxNesting = 128;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Result<Body> ParseTemplate() {
    std::string end;
    CHORUS_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end, nullptr));
    // Jinja 3 compiles a filter or test it does not know into a run-time error when it sits in
    // an `if` (test or body) or a conditional expression, and refuses the template otherwise;
    // the first refused one (in source order) is the error.
    for (const auto& u : unknowns_) {
      if (!u.soft) {
        return SyntaxError(
            u.line, u.col,
            std::string("no ") + (u.is_filter ? "filter" : "test") + " named '" + u.name + "'");
      }
    }
    return body;
  }

 private:
  // ------------------------------------------------------------ token helpers
  const Token& Peek(size_t ahead = 0) const {
    const size_t k = std::min(i_ + ahead, t_.size() - 1);
    return t_[k];
  }
  const Token& Next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.kind == TokKind::kOp && t.text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.kind == TokKind::kName && t.text == name;
  }
  Status ErrorAt(const Token& t, std::string_view what) const {
    return SyntaxError(t.line, t.col, what);
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TokKind::kText:
        return "template text";
      case TokKind::kVarBegin:
        return "'{{'";
      case TokKind::kVarEnd:
        return "'}}'";
      case TokKind::kBlockBegin:
        return "'{%'";
      case TokKind::kBlockEnd:
        return "'%}'";
      case TokKind::kName:
        return "'" + t.text + "'";
      case TokKind::kString:
        return "string literal";
      case TokKind::kInt:
      case TokKind::kFloat:
        return "number '" + t.text + "'";
      case TokKind::kOp:
        return "'" + t.text + "'";
      case TokKind::kEof:
        return "end of template";
    }
    return "token";
  }
  Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) {
      return ErrorAt(Peek(), "expected '" + std::string(op) + "', found " + Describe(Peek()));
    }
    Next();
    return OkStatus();
  }
  Status ExpectBlockEnd() {
    if (Peek().kind != TokKind::kBlockEnd) {
      return ErrorAt(Peek(), "expected '%}', found " + Describe(Peek()));
    }
    Next();
    return OkStatus();
  }
  Result<std::string> ExpectName() {
    if (Peek().kind != TokKind::kName) {
      return ErrorAt(Peek(), "expected a name, found " + Describe(Peek()));
    }
    return Next().text;
  }
  template <typename T>
  std::unique_ptr<T> Make(const Token& at) {
    auto n = std::make_unique<T>();
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  struct DepthGuard {
    explicit DepthGuard(int* d) : d_(d) { ++*d_; }
    ~DepthGuard() { --*d_; }
    int* d_;
  };
  Status CheckDepth() const {
    if (depth_ > kMaxNesting) return ErrorAt(Peek(), "template nests too deeply");
    return OkStatus();
  }

  // ------------------------------------------------------------ statements

  // Parses until `{% <one of end_keywords>` (consumed up to and including the keyword;
  // stored in *found_end) or the end of the template (only allowed when end_keywords is
  // empty). `opener` names the block for the "missing end tag" error.
  Result<Body> ParseBody(std::initializer_list<std::string_view> end_keywords,
                         std::string* found_end, const Token* opener) {
    DepthGuard g(&depth_);
    CHORUS_RETURN_IF_ERROR(CheckDepth());
    Body body;
    while (true) {
      const Token& t = Peek();
      switch (t.kind) {
        case TokKind::kEof: {
          if (end_keywords.size() == 0) return body;
          // The last end keyword is the one that closes the block ({% endif %}, ...).
          const std::string want = "{% " + std::string(*(end_keywords.end() - 1)) + " %}";
          return ErrorAt(*opener, "unclosed block: missing " + want);
        }
        case TokKind::kText: {
          auto s = Make<TextStmt>(t);
          s->text = Next().text;
          body.push_back(std::move(s));
          break;
        }
        case TokKind::kVarBegin: {
          auto s = Make<OutputStmt>(t);
          Next();
          CHORUS_ASSIGN_OR_RETURN(s->expr, ParseExpr());
          if (Peek().kind != TokKind::kVarEnd) {
            return ErrorAt(Peek(), "expected '}}', found " + Describe(Peek()));
          }
          Next();
          body.push_back(std::move(s));
          break;
        }
        case TokKind::kBlockBegin: {
          const Token& kw = Peek(1);
          if (kw.kind != TokKind::kName) {
            return ErrorAt(kw, "expected a tag name after '{%', found " + Describe(kw));
          }
          for (auto k : end_keywords) {
            if (kw.text == k) {
              Next();
              Next();
              *found_end = kw.text;
              return body;
            }
          }
          CHORUS_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
          if (s) body.push_back(std::move(s));
          break;
        }
        default:
          return ErrorAt(t, "unexpected " + Describe(t));
      }
    }
  }

  Result<StmtPtr> ParseStatement() {
    const Token& open = Next();  // {%
    const Token& kw = Next();    // tag name
    const std::string& name = kw.text;
    if (name == "if") return ParseIf(kw);
    if (name == "for") return ParseFor(kw);
    if (name == "set") return ParseSet(kw);
    if (name == "macro") return ParseMacro(kw);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return ErrorAt(kw, "'" + name + "' outside of a for loop");
      auto s = Make<LoopControlStmt>(kw);
      s->is_break = name == "break";
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      return StmtPtr(std::move(s));
    }
    if (name == "generation") {
      // Hugging Face's AssistantTracker extension: marks assistant text; renders its body.
      auto s = Make<BlockStmt>(kw);
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      CHORUS_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end, &kw));
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      return StmtPtr(std::move(s));
    }
    if (name == "call") return ParseCallBlock(kw);
    if (name == "filter") return ParseFilterBlock(kw);
    if (name == "with") return ParseWith(kw);
    if (name == "block") return ParseBlock(kw);
    if (name == "include" || name == "import" || name == "from" || name == "extends") {
      return ParseLoaderTag(kw);
    }
    if (name == "elif" || name == "else" || name.rfind("end", 0) == 0) {
      return ErrorAt(kw, "unexpected {% " + name + " %} (no open block it could close)");
    }
    (void)open;
    return ErrorAt(kw, "unsupported tag '" + name + "'");
  }

  Result<StmtPtr> ParseIf(const Token& kw) {
    return WithSoft(true, [&] { return ParseIfSoft(kw); });
  }
  Result<StmtPtr> ParseIfSoft(const Token& kw) {
    auto s = Make<IfStmt>(kw);
    CHORUS_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpr());
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    while (true) {
      std::string end;
      CHORUS_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end, &kw));
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        CHORUS_ASSIGN_OR_RETURN(cond, ParseExpr());
        CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
        continue;
      }
      if (end == "else") {
        CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
        CHORUS_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end, &kw));
      }
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      break;
    }
    return StmtPtr(std::move(s));
  }

  Result<StmtPtr> ParseFor(const Token& kw) {
    auto s = Make<ForStmt>(kw);
    const bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      CHORUS_ASSIGN_OR_RETURN(std::string target, ExpectName());
      s->targets.push_back(std::move(target));
      if (!IsOp(",")) break;
      Next();
    }
    if (paren) CHORUS_RETURN_IF_ERROR(ExpectOp(")"));
    if (!IsName("in")) return ErrorAt(Peek(), "expected 'in', found " + Describe(Peek()));
    Next();
    // No conditional expression here: a trailing `if` filters the loop.
    CHORUS_ASSIGN_OR_RETURN(s->iter, ParseExpr(/*allow_cond=*/false));
    if (IsName("if")) {
      Next();
      CHORUS_ASSIGN_OR_RETURN(s->filter, WithSoft(false, [&] { return ParseExpr(); }));
    }
    if (IsName("recursive")) {
      Next();
      s->recursive = true;
    }
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    std::string end;
    auto body = WithSoft(false, [&] { return ParseBody({"else", "endfor"}, &end, &kw); });
    if (!body.ok()) {
      --loop_depth_;
      return body.status();
    }
    s->body = std::move(body).value();
    --loop_depth_;
    if (end == "else") {
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      CHORUS_ASSIGN_OR_RETURN(s->else_body,
                              WithSoft(false, [&] { return ParseBody({"endfor"}, &end, &kw); }));
    }
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  Result<StmtPtr> ParseSet(const Token& kw) {
    auto s = Make<SetStmt>(kw);
    CHORUS_ASSIGN_OR_RETURN(std::string first, ExpectName());
    s->targets.push_back(std::move(first));
    if (IsOp(".")) {
      Next();
      CHORUS_ASSIGN_OR_RETURN(s->ns_attr, ExpectName());
    } else {
      while (IsOp(",")) {
        Next();
        CHORUS_ASSIGN_OR_RETURN(std::string t, ExpectName());
        s->targets.push_back(std::move(t));
      }
    }
    if (IsOp("=")) {
      Next();
      CHORUS_ASSIGN_OR_RETURN(s->value, ParseExprOrTuple());
      CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
      return StmtPtr(std::move(s));
    }
    if (s->targets.size() != 1 || !s->ns_attr.empty()) {
      return ErrorAt(Peek(), "a block {% set %} takes a single name");
    }
    if (IsOp("|")) {
      CHORUS_ASSIGN_OR_RETURN(s->block_filter, ParseFilterExpr(Make<BlockValueExpr>(kw)));
    }
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    CHORUS_ASSIGN_OR_RETURN(s->block, ParseBody({"endset"}, &end, &kw));
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  Result<StmtPtr> ParseMacro(const Token& kw) {
    auto s = Make<MacroStmt>(kw);
    CHORUS_ASSIGN_OR_RETURN(s->name, ExpectName());
    CHORUS_RETURN_IF_ERROR(ParseParams(&s->params).status());
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    // A loop outside the macro is not a loop inside it.
    CHORUS_ASSIGN_OR_RETURN(s->body, ParseMacroBody(s.get(), {"endmacro"}, kw));
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // A macro (or call-block caller) body: its own frame, no enclosing loop.
  Result<Body> ParseMacroBody(MacroStmt* m, std::initializer_list<std::string_view> end_kw,
                              const Token& kw) {
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    macros_.push_back(m);
    std::string end;
    auto body = WithSoft(false, [&] { return ParseBody(end_kw, &end, &kw); });
    macros_.pop_back();
    loop_depth_ = saved_loop_depth;
    return body;
  }

  Result<ArgList> ParseParams(std::vector<std::pair<std::string, ExprPtr>>* params) {
    CHORUS_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      CHORUS_ASSIGN_OR_RETURN(std::string p, ExpectName());
      ExprPtr def;
      if (IsOp("=")) {
        Next();
        CHORUS_ASSIGN_OR_RETURN(def, ParseExpr());
      }
      params->emplace_back(std::move(p), std::move(def));
      if (!IsOp(",")) break;
      Next();
    }
    CHORUS_RETURN_IF_ERROR(ExpectOp(")"));
    return ArgList{};
  }

  // {% call [(params)] macro(args) %} ... {% endcall %}
  Result<StmtPtr> ParseCallBlock(const Token& kw) {
    auto s = Make<CallBlockStmt>(kw);
    s->caller.name = "caller";
    s->caller.line = kw.line;
    s->caller.col = kw.col;
    if (IsOp("(")) CHORUS_RETURN_IF_ERROR(ParseParams(&s->caller.params).status());
    const Token& at = Peek();
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
    auto* call = dynamic_cast<CallExpr*>(e.get());
    if (call == nullptr) return ErrorAt(at, "expected a call after {% call %}");
    e.release();
    s->call.reset(call);
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    CHORUS_ASSIGN_OR_RETURN(s->caller.body, ParseMacroBody(&s->caller, {"endcall"}, kw));
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // {% filter name(args) | other %} ... {% endfilter %}
  Result<StmtPtr> ParseFilterBlock(const Token& kw) {
    auto s = Make<FilterBlockStmt>(kw);
    ExprPtr chain = Make<BlockValueExpr>(kw);
    bool first = true;
    while (first || IsOp("|")) {
      if (!first) Next();
      first = false;
      const Token& name_tok = Peek();
      CHORUS_ASSIGN_OR_RETURN(std::string name, ExpectName());
      auto f = Make<FilterExpr>(name_tok);
      f->fn = FindFilter(name);
      if (f->fn == nullptr) NoteUnknown(name_tok, name, true);
      f->name = std::move(name);
      f->obj = std::move(chain);
      if (IsOp("(")) {
        CHORUS_ASSIGN_OR_RETURN(f->args, ParseCallArgs());
      }
      chain = std::move(f);
    }
    s->chain = std::move(chain);
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    CHORUS_ASSIGN_OR_RETURN(s->body,
                            WithSoft(false, [&] { return ParseBody({"endfilter"}, &end, &kw); }));
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // {% with a = x, b = y %} ... {% endwith %}
  Result<StmtPtr> ParseWith(const Token& kw) {
    auto s = Make<WithStmt>(kw);
    while (Peek().kind != TokKind::kBlockEnd) {
      if (!s->vars.empty()) CHORUS_RETURN_IF_ERROR(ExpectOp(","));
      CHORUS_ASSIGN_OR_RETURN(std::string name, ExpectName());
      CHORUS_RETURN_IF_ERROR(ExpectOp("="));
      CHORUS_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
      s->vars.emplace_back(std::move(name), std::move(v));
    }
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    CHORUS_ASSIGN_OR_RETURN(s->body,
                            WithSoft(false, [&] { return ParseBody({"endwith"}, &end, &kw); }));
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // {% include/import/from/extends ... %}: the expression and clauses are parsed and kept
  // only for their syntax; running the tag is an error (no template loader).
  Result<StmtPtr> ParseLoaderTag(const Token& kw) {
    auto s = Make<LoaderStmt>(kw);
    s->tag = kw.text;
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
    (void)e;
    while (Peek().kind != TokKind::kBlockEnd) {
      if (Peek().kind == TokKind::kEof) return ErrorAt(Peek(), "expected '%}'");
      Next();
    }
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // {% block name [scoped] [required] %} ... {% endblock [name] %}: without inheritance a
  // block renders in place.
  Result<StmtPtr> ParseBlock(const Token& kw) {
    auto s = Make<BlockStmt>(kw);
    CHORUS_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsName("scoped") || IsName("required")) Next();
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    CHORUS_ASSIGN_OR_RETURN(s->body,
                            WithSoft(false, [&] { return ParseBody({"endblock"}, &end, &kw); }));
    if (IsName(name)) Next();
    CHORUS_RETURN_IF_ERROR(ExpectBlockEnd());
    return StmtPtr(std::move(s));
  }

  // ------------------------------------------------------------ expressions

  // `a, b` without parentheses (only where Jinja allows it: set values).
  Result<ExprPtr> ParseExprOrTuple() {
    const Token& start = Peek();
    CHORUS_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
    if (!IsOp(",")) return first;
    auto list = Make<ListExpr>(start);
    list->is_tuple = true;
    list->items.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == TokKind::kBlockEnd) break;
      CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
      list->items.push_back(std::move(e));
    }
    return ExprPtr(std::move(list));
  }

  Result<ExprPtr> ParseExpr(bool allow_cond = true) {
    DepthGuard g(&depth_);
    CHORUS_RETURN_IF_ERROR(CheckDepth());
    const size_t unknowns_before = unknowns_.size();
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    if (!allow_cond) return e;
    while (IsName("if")) {
      // The whole conditional expression is a soft frame, its `then` part included.
      for (size_t k = unknowns_before; k < unknowns_.size(); ++k) unknowns_[k].soft = true;
      const Token& at = Next();
      auto c = Make<CondExpr>(at);
      c->then = std::move(e);
      CHORUS_ASSIGN_OR_RETURN(c->cond, WithSoft(true, [&] { return ParseOr(); }));
      if (IsName("else")) {
        Next();
        CHORUS_ASSIGN_OR_RETURN(c->otherwise, WithSoft(true, [&] { return ParseExpr(); }));
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr MakeBinary(const Token& at, BinaryExpr::Op op, ExprPtr a, ExprPtr b) {
    auto n = Make<BinaryExpr>(at);
    n->op = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  Result<ExprPtr> ParseOr() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      const Token& at = Next();
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      e = MakeBinary(at, BinaryExpr::Op::kOr, std::move(e), std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParseAnd() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      const Token& at = Next();
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      e = MakeBinary(at, BinaryExpr::Op::kAnd, std::move(e), std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParseNot() {
    DepthGuard g(&depth_);
    CHORUS_RETURN_IF_ERROR(CheckDepth());
    if (IsName("not")) {
      const Token& at = Next();
      auto n = Make<UnaryExpr>(at);
      n->op = UnaryExpr::Op::kNot;
      CHORUS_ASSIGN_OR_RETURN(n->x, ParseNot());
      return ExprPtr(std::move(n));
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const Token& start = Peek();
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    std::vector<std::pair<BinaryExpr::Op, ExprPtr>> rest;
    const Token* first_op = nullptr;
    while (true) {
      const Token& t = Peek();
      BinaryExpr::Op op;
      if (t.kind == TokKind::kOp && t.text == "==") {
        op = BinaryExpr::Op::kEq;
      } else if (t.kind == TokKind::kOp && t.text == "!=") {
        op = BinaryExpr::Op::kNe;
      } else if (t.kind == TokKind::kOp && t.text == "<") {
        op = BinaryExpr::Op::kLt;
      } else if (t.kind == TokKind::kOp && t.text == ">") {
        op = BinaryExpr::Op::kGt;
      } else if (t.kind == TokKind::kOp && t.text == "<=") {
        op = BinaryExpr::Op::kLe;
      } else if (t.kind == TokKind::kOp && t.text == ">=") {
        op = BinaryExpr::Op::kGe;
      } else if (IsName("in")) {
        op = BinaryExpr::Op::kIn;
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        op = BinaryExpr::Op::kNotIn;
      } else {
        break;
      }
      const Token& at = Next();
      if (first_op == nullptr) first_op = &at;
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      rest.emplace_back(op, std::move(r));
    }
    if (rest.empty()) return e;
    if (rest.size() == 1) {
      return MakeBinary(*first_op, rest[0].first, std::move(e), std::move(rest[0].second));
    }
    auto chain = Make<CompareChainExpr>(start);
    chain->first = std::move(e);
    chain->rest = std::move(rest);
    return ExprPtr(std::move(chain));
  }

  Result<ExprPtr> ParseMath1() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      e = MakeBinary(at, at.text == "+" ? BinaryExpr::Op::kAdd : BinaryExpr::Op::kSub, std::move(e),
                     std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParseConcat() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
    while (IsOp("~")) {
      const Token& at = Next();
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      e = MakeBinary(at, BinaryExpr::Op::kConcat, std::move(e), std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParseMath2() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      const BinaryExpr::Op op = at.text == "*"    ? BinaryExpr::Op::kMul
                                : at.text == "/"  ? BinaryExpr::Op::kDiv
                                : at.text == "//" ? BinaryExpr::Op::kFloorDiv
                                                  : BinaryExpr::Op::kMod;
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      e = MakeBinary(at, op, std::move(e), std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParsePow() {
    CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(true));
    while (IsOp("**")) {
      const Token& at = Next();
      CHORUS_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
      e = MakeBinary(at, BinaryExpr::Op::kPow, std::move(e), std::move(r));
    }
    return e;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard g(&depth_);
    CHORUS_RETURN_IF_ERROR(CheckDepth());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& at = Next();
      auto n = Make<UnaryExpr>(at);
      n->op = at.text == "-" ? UnaryExpr::Op::kNeg : UnaryExpr::Op::kPos;
      CHORUS_ASSIGN_OR_RETURN(n->x, ParseUnary(false));
      node = std::move(n);
    } else {
      CHORUS_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    CHORUS_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      CHORUS_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.kind) {
      case TokKind::kName: {
        Next();
        auto lit = Make<LiteralExpr>(t);
        if (t.text == "true" || t.text == "True") {
          lit->value = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          lit->value = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          lit->value = Value::None();
        } else {
          auto n = Make<NameExpr>(t);
          n->name = t.text;
          if (!macros_.empty()) {
            MacroStmt* m = macros_.back();
            m->uses_varargs = m->uses_varargs || t.text == "varargs";
            m->uses_kwargs = m->uses_kwargs || t.text == "kwargs";
            m->uses_caller = m->uses_caller || t.text == "caller";
          }
          return ExprPtr(std::move(n));
        }
        return ExprPtr(std::move(lit));
      }
      case TokKind::kString: {
        std::string s = Next().text;
        while (Peek().kind == TokKind::kString) s += Next().text;  // "a" "b" → "ab"
        auto lit = Make<LiteralExpr>(t);
        lit->value = Value::Str(std::move(s));
        return ExprPtr(std::move(lit));
      }
      case TokKind::kInt: {
        Next();
        auto lit = Make<LiteralExpr>(t);
        lit->value = Value::Int(t.int_value);
        return ExprPtr(std::move(lit));
      }
      case TokKind::kFloat: {
        Next();
        auto lit = Make<LiteralExpr>(t);
        lit->value = Value::Float(t.float_value);
        return ExprPtr(std::move(lit));
      }
      case TokKind::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            auto empty = Make<ListExpr>(t);  // ()
            empty->is_tuple = true;
            return ExprPtr(std::move(empty));
          }
          CHORUS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
          if (IsOp(",")) {
            auto list = Make<ListExpr>(t);
            list->is_tuple = true;
            list->items.push_back(std::move(e));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              CHORUS_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
              list->items.push_back(std::move(item));
            }
            e = std::move(list);
          }
          CHORUS_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[") {
          Next();
          auto list = Make<ListExpr>(t);
          while (!IsOp("]")) {
            CHORUS_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
            list->items.push_back(std::move(item));
            if (!IsOp(",")) break;
            Next();
          }
          CHORUS_RETURN_IF_ERROR(ExpectOp("]"));
          return ExprPtr(std::move(list));
        }
        if (t.text == "{") {
          Next();
          auto dict = Make<DictExpr>(t);
          while (!IsOp("}")) {
            CHORUS_ASSIGN_OR_RETURN(ExprPtr k, ParseExpr());
            CHORUS_RETURN_IF_ERROR(ExpectOp(":"));
            CHORUS_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
            dict->items.emplace_back(std::move(k), std::move(v));
            if (!IsOp(",")) break;
            Next();
          }
          CHORUS_RETURN_IF_ERROR(ExpectOp("}"));
          return ExprPtr(std::move(dict));
        }
        break;
      default:
        break;
    }
    return ErrorAt(t, "unexpected " + Describe(t) + " in expression");
  }

  Result<ArgList> ParseCallArgs() {
    CHORUS_RETURN_IF_ERROR(ExpectOp("("));
    ArgList args;
    while (!IsOp(")")) {
      if (Peek().kind == TokKind::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        CHORUS_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        args.kw.emplace_back(std::move(name), std::move(v));
      } else {
        if (!args.kw.empty()) {
          return ErrorAt(Peek(), "positional argument after keyword argument");
        }
        if (IsOp("*") || IsOp("**")) {
          return ErrorAt(Peek(), "*args / **kwargs in calls are not supported");
        }
        CHORUS_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        args.pos.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    CHORUS_RETURN_IF_ERROR(ExpectOp(")"));
    return args;
  }

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const Token& at = Next();
        const Token& name = Peek();
        if (name.kind == TokKind::kInt) {  // foo.0 → foo[0]
          Next();
          auto idx = Make<IndexExpr>(at);
          auto lit = Make<LiteralExpr>(name);
          lit->value = Value::Int(name.int_value);
          idx->obj = std::move(node);
          idx->index = std::move(lit);
          node = std::move(idx);
          continue;
        }
        CHORUS_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        if (IsOp("(")) {
          auto m = Make<MethodCallExpr>(at);
          m->obj = std::move(node);
          m->name = std::move(attr);
          CHORUS_ASSIGN_OR_RETURN(m->args, ParseCallArgs());
          node = std::move(m);
        } else {
          auto a = Make<AttrExpr>(at);
          a->obj = std::move(node);
          a->name = std::move(attr);
          node = std::move(a);
        }
      } else if (IsOp("[")) {
        const Token& at = Next();
        ExprPtr start, stop, step;
        bool is_slice = false;
        if (!IsOp(":")) {
          CHORUS_ASSIGN_OR_RETURN(start, ParseExpr());
        }
        if (IsOp(":")) {
          is_slice = true;
          Next();
          if (!IsOp("]") && !IsOp(":")) {
            CHORUS_ASSIGN_OR_RETURN(stop, ParseExpr());
          }
          if (IsOp(":")) {
            Next();
            if (!IsOp("]")) {
              CHORUS_ASSIGN_OR_RETURN(step, ParseExpr());
            }
          }
        }
        CHORUS_RETURN_IF_ERROR(ExpectOp("]"));
        if (is_slice) {
          auto s = Make<SliceExpr>(at);
          s->obj = std::move(node);
          s->start = std::move(start);
          s->stop = std::move(stop);
          s->step = std::move(step);
          node = std::move(s);
        } else {
          auto idx = Make<IndexExpr>(at);
          idx->obj = std::move(node);
          idx->index = std::move(start);
          node = std::move(idx);
        }
      } else if (IsOp("(")) {
        const Token& at = Peek();
        auto c = Make<CallExpr>(at);
        c->callee = std::move(node);
        CHORUS_ASSIGN_OR_RETURN(c->args, ParseCallArgs());
        node = std::move(c);
      } else {
        return node;
      }
    }
  }

  // Whether the current token can start a test's bare argument (`is divisibleby 3`).
  bool StartsBareTestArg() const {
    const Token& t = Peek();
    if (t.kind == TokKind::kString || t.kind == TokKind::kInt || t.kind == TokKind::kFloat) {
      return true;
    }
    if (t.kind == TokKind::kOp) return t.text == "[" || t.text == "{";
    if (t.kind == TokKind::kName) {
      // Jinja's parse_test stops only at these; any other name (even `if`) is the argument.
      static constexpr std::string_view kStop[] = {"else", "or", "and"};
      for (auto s : kStop) {
        if (t.text == s) return false;
      }
      return true;
    }
    return false;
  }

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        const Token& name_tok = Peek();
        CHORUS_ASSIGN_OR_RETURN(std::string name, ExpectName());
        auto f = Make<FilterExpr>(name_tok);
        f->fn = FindFilter(name);
        if (f->fn == nullptr) NoteUnknown(name_tok, name, true);
        f->name = std::move(name);
        f->obj = std::move(node);
        if (IsOp("(")) {
          CHORUS_ASSIGN_OR_RETURN(f->args, ParseCallArgs());
        }
        node = std::move(f);
      } else if (IsName("is")) {
        Next();
        bool negated = false;
        if (IsName("not")) {
          Next();
          negated = true;
        }
        const Token& name_tok = Peek();
        CHORUS_ASSIGN_OR_RETURN(std::string name, ExpectName());
        // `is none` / `is true` come through as names here (keywords are names).
        auto t = Make<TestExpr>(name_tok);
        t->fn = FindTest(name);
        if (t->fn == nullptr) NoteUnknown(name_tok, name, false);
        t->name = std::move(name);
        t->negated = negated;
        t->obj = std::move(node);
        if (IsOp("(")) {
          CHORUS_ASSIGN_OR_RETURN(t->args, ParseCallArgs());
        } else if (StartsBareTestArg()) {
          if (IsName("is")) return ErrorAt(Peek(), "You cannot chain multiple tests with is");
          CHORUS_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          CHORUS_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.pos.push_back(std::move(arg));
        }
        node = std::move(t);
      } else {
        return node;
      }
    }
  }

  // A use of a name that is not a filter / test, and whether it sits where Jinja defers the
  // error to run time (a "soft" frame: `if` statements and conditional expressions, but not
  // inside a loop, macro or block nested in them).
  struct Unknown {
    int line, col;
    std::string name;
    bool is_filter;
    bool soft;
  };
  void NoteUnknown(const Token& at, const std::string& name, bool is_filter) {
    unknowns_.push_back({at.line, at.col, name, is_filter, soft_ > 0});
  }
  // Runs `f` with the soft-frame state set to `soft` (restored afterwards).
  template <typename F>
  auto WithSoft(bool soft, F&& f) -> decltype(f()) {
    const int saved = soft_;
    soft_ = soft ? saved + 1 : 0;
    auto r = f();
    soft_ = saved;
    return r;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int soft_ = 0;
  std::vector<Unknown> unknowns_;
  // Macros being parsed (innermost last): names they mention decide varargs/kwargs/caller.
  std::vector<MacroStmt*> macros_;
};

}  // namespace

Result<std::shared_ptr<const Program>> ParseProgram(std::string_view source) {
  CHORUS_ASSIGN_OR_RETURN(std::vector<Token> toks, Lex(source));
  Parser parser(std::move(toks));
  CHORUS_ASSIGN_OR_RETURN(Body body, parser.ParseTemplate());
  auto prog = std::make_shared<Program>();
  prog->source = std::string(source);
  prog->body = std::move(body);
  return std::shared_ptr<const Program>(std::move(prog));
}

}  // namespace chorus::tokenizer::jinja
