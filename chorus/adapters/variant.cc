#include "chorus/adapters/variant.h"

#include <cstdio>

namespace chorus::adapters {

std::string VariantId::ToString() const {
  if (empty()) return "";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(content_hash));
  return std::string(hex) + "-v" + std::to_string(version);
}

}  // namespace chorus::adapters
