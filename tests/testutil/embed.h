// One embedding request through an engine (GenerationRequest::embedding; docs/api.md,
// "Embeddings"), for the integration tests: submits it, waits for its one event and checks that
// it finished with a vector and generated nothing. Header-only, like stories260k.h.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "chorus/engine/engine.h"

namespace chorus::testing {

// The pooled vector of `prompt` under `variant` (the base if none); empty after a failure.
inline std::vector<float> Embed(engine::Engine& e, std::vector<int32_t> prompt,
                                engine::Pooling pooling, bool normalize,
                                std::optional<adapters::VariantRef> variant = std::nullopt) {
  engine::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.embedding = engine::EmbeddingOptions{.pooling = pooling, .normalize = normalize};
  r.variant = std::move(variant);
  auto h = e.Submit(r);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (!h.ok()) return {};
  auto ev = (*h)->Next(std::chrono::milliseconds(60000));
  EXPECT_TRUE(ev.has_value());
  if (!ev) return {};
  EXPECT_EQ(ev->finish, engine::FinishReason::kStop) << ev->error;
  EXPECT_EQ(ev->token, -1);
  EXPECT_EQ((*h)->completion_tokens(), 0);
  return ev->embedding;
}

}  // namespace chorus::testing
