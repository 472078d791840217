// The one identity of a variant's weights, and the one reference a request carries
// (docs/adapters.md, "Identity"; docs/variants.md for how a new kind of variant plugs in).
//
// VariantId names the CONTENT a registration made servable: the content hash of its files and
// the registry's version of that registration (a counter that only grows, so a replaced
// adapter never shares an identity with its predecessor even when its bytes are equal). Every
// tier keys its copies by it — the host cache, the pool copies of engine residency — and a
// loaded copy carries it (LoraView::id()), so a reload of the same registration finds the copy
// a lower tier still holds. Names are for people (logs, metrics, errors), not for identity.
//
// VariantRef is what the server resolves a request's `model` name to and the request carries
// (GenerationRequest::variant): the name, the id, and where the engine's loader threads find the
// files (with the fingerprints recorded at registration, checked before a load so that a file
// changed since is never served under this id).
//
// Thread-safety: values.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/adapters/fingerprint.h"

namespace chorus::adapters {

struct VariantId {
  uint64_t content_hash = 0;
  uint64_t version = 0;  // 0 = no registration (an adapter built in memory: no id)
  bool empty() const { return version == 0 && content_hash == 0; }
  // "<content hash as 16 hex digits>-v<version>", e.g. "00000000000000ab-v3"; "" when empty.
  std::string ToString() const;
  friend auto operator<=>(const VariantId&, const VariantId&) = default;
};

struct VariantRef {
  std::string name;  // the registered name (the OpenAI `model` a request used)
  VariantId id;
  std::string kind = "lora";  // what the files hold
  std::string path;           // resolved real path of the files (a PEFT directory, a GGUF file)
  // The files' fingerprints recorded at registration, checked before every load from disk
  // (empty: unchecked, for variants that were never registered, e.g. in tests).
  std::vector<AdapterFile> files = {};
};

}  // namespace chorus::adapters
