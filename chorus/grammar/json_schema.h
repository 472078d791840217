// JSON Schema → grammar (docs/structured_outputs.md, "JSON schemas"). Every output the grammar
// admits parses as JSON and validates against the schema; the converse is not a goal (the
// grammar narrows some freedoms, e.g. a fixed property order, bounded whitespace and number
// lengths — the exact list is in the doc).
//
// Supported keywords: type (one or a list), properties (generated in the schema object's key
// order: sorted for a nlohmann::json, as written for CompileOrderedJsonSchema), required,
// additionalProperties (false, true or a schema; absent = false when `properties` is given), enum,
// const, items (a schema or false), prefixItems, minItems, maxItems, minLength, maxLength, pattern
// (regex subset below), format (date, time, date-time, uuid, email), minimum / maximum (integers
// only), anyOf, oneOf, $ref (to "#", "#/$defs/…" or "#/definitions/…", recursion allowed), $defs /
// definitions. Annotations ignored: title, description, $schema, $id, $comment, default, examples,
// deprecated, readOnly, writeOnly. Any other keyword is an error naming it and its location.
//
// Regex subset for `pattern`: literals and escapes (\d \w \s \D \W \S \. \\ \/ \t \n \r, \uHHHH),
// classes [a-z] [^...], '.', groups ( ) (?: ), alternation |, quantifiers * + ? {m} {m,}
// {m,n}, anchors ^ at the start and $ at the end (an unanchored side matches any text, as JSON
// Schema's search semantics say). No backreferences, lookaround or lazy quantifiers. Characters
// that JSON must escape (", \ and controls) are never produced by a class or '.', only by an
// explicit literal, which the grammar writes JSON-escaped.
//
// Thread-safety: reentrant.
#pragma once

#include <nlohmann/json.hpp>

#include "chorus/base/status.h"
#include "chorus/grammar/grammar.h"

namespace chorus::grammar {

struct JsonSchemaOptions {
  // Whitespace allowed between tokens: none, or one space, or a newline followed by up to this
  // many spaces/tabs (pretty printing). Bounded so that a model cannot loop on blanks.
  int max_indent = 16;
  // Digits allowed in an unbounded integer / in a fraction / in an exponent.
  int max_int_digits = 16;
  int max_frac_digits = 16;
  int max_exp_digits = 3;
};

// Errors: InvalidArgument naming the keyword and its JSON pointer, e.g.
// "unsupported JSON schema keyword 'patternProperties' at #/properties/a".
Result<Grammar> CompileJsonSchema(const nlohmann::json& schema, const JsonSchemaOptions& opts = {});
Result<GrammarAst> JsonSchemaToAst(const nlohmann::json& schema,
                                   const JsonSchemaOptions& opts = {});

// The same from an order-preserving parse: object properties are generated in the schema's own
// key order (as OpenAI's structured outputs do) instead of nlohmann::json's sorted order.
Result<Grammar> CompileOrderedJsonSchema(const nlohmann::ordered_json& schema,
                                         const JsonSchemaOptions& opts = {});
Result<GrammarAst> OrderedJsonSchemaToAst(const nlohmann::ordered_json& schema,
                                          const JsonSchemaOptions& opts = {});
Result<Grammar> CachedOrderedJsonSchema(const nlohmann::ordered_json& schema);

// Any JSON object (response_format {"type": "json_object"}), same whitespace policy.
Grammar AnyJsonObjectGrammar();
// Any JSON value.
Grammar AnyJsonValueGrammar();

// Cached compiles through SharedGrammarCache() (key: kind + the schema's canonical dump).
Result<Grammar> CachedJsonSchema(const nlohmann::json& schema);
Result<Grammar> CachedGbnf(std::string_view text);

// A regex over raw text (vLLM's guided_regex): the whole output must match it (^ and $ are
// optional). The subset above, except that classes and '.' may produce any character but NUL
// ('.' no newline), literals are raw, and \s also matches tab, newline, \v, \f and \r.
// Errors: InvalidArgument "regex: <what> (position N)[ at <where>]".
Result<Grammar> CompileRegex(std::string_view pattern, const std::string& where);
Result<Grammar> CachedRegex(std::string_view pattern, const std::string& where);

}  // namespace chorus::grammar
