// Internal to chat templates (chat_template.h): global functions, filters, tests and the
// str/dict methods templates call. The list is in docs/chat_templates.md.
#pragma once

#include <string>

#include "chorus/base/status.h"
#include "chorus/tokenizer/jinja_ast.h"
#include "chorus/tokenizer/jinja_interp.h"
#include "chorus/tokenizer/jinja_value.h"

namespace chorus::tokenizer::jinja {

// Global functions: range, namespace, dict, raise_exception (nullptr for other names).
const Value* FindGlobal(const std::string& name);

// obj.name — a mapping's item, else undefined. Attribute access on undefined is an error.
Result<Value> GetAttr(const Value& obj, const std::string& name, const Node& at);

// obj.name(args) for strings (strip, split, startswith, ...), dicts (items, keys, values,
// get) and the loop object (cycle).
Result<Value> CallMethod(Interp& in, const Value& obj, const std::string& name, CallArgs& args);

}  // namespace chorus::tokenizer::jinja
