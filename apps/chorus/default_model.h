// The embedded default model: a small deterministic synthetic Llama (shape "tiny") with a
// small SentencePiece-style vocabulary, written once as a GGUF file into the cache directory
// and then loaded like any other model. It makes `chorus serve` / `chorus generate` work on a
// bare machine; its text is random-looking because its weights are random.
#pragma once

#include <string>

#include "chorus/base/status.h"

namespace chorus::apps {

// Returns the path of the default model, creating it if needed ($CHORUS_CACHE_DIR, else
// $XDG_CACHE_HOME/chorus, else ~/.cache/chorus, else /tmp/chorus-cache).
Result<std::string> EnsureDefaultModel();

// Chorus's cache directory (created if missing): $CHORUS_CACHE_DIR, else $XDG_CACHE_HOME/chorus,
// else ~/.cache/chorus, else /tmp/chorus-cache.
Result<std::string> CacheDirectory();

}  // namespace chorus::apps
