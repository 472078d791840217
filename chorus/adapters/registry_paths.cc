// The adapter registry's path policy: adapter roots, realpath containment and the regular-file
// checks of an adapter's files (registry_paths.h).
#include "chorus/adapters/registry_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "chorus/adapters/fingerprint.h"

namespace chorus::adapters::registry_internal {

std::string Basename(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Dirname(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

Result<std::string> RealPath(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (r == nullptr) return ErrnoError(errno, "cannot resolve " + path);
  std::string out(r);
  std::free(r);
  return out;
}

bool IsInside(const std::string& resolved, const std::string& root) {
  if (root == "/") return !resolved.empty() && resolved[0] == '/';
  if (resolved.size() < root.size() || resolved.compare(0, root.size(), root) != 0) return false;
  return resolved.size() == root.size() || resolved[root.size()] == '/';
}

Result<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& adapter_roots) {
  std::vector<std::string> roots;
  for (const std::string& root : adapter_roots) {
    auto real = RealPath(root);
    if (!real.ok()) return real.status().WithContext("adapter root");
    struct stat st {};
    if (::stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgumentError("adapter root " + root + " is not a directory");
    }
    if (std::find(roots.begin(), roots.end(), *real) == roots.end()) roots.push_back(*real);
  }
  return roots;
}

Status ResolveInsideRoots(const std::vector<std::string>& roots, const std::string& path,
                          std::string* resolved) {
  if (roots.empty()) {
    return PermissionDeniedError("adapter path " + path +
                                 " refused: no adapter roots are configured");
  }
  auto refuse = [&]() {
    std::string list;
    for (const std::string& r : roots) list += (list.empty() ? "" : ", ") + r;
    return PermissionDeniedError("adapter path " + path + " is outside the adapter roots (" + list +
                                 ")");
  };
  auto real = RealPath(path);
  if (!real.ok()) {
    // Say "outside the roots" rather than "does not exist" for a path that lexically leaves
    // them, so the API does not reveal which paths exist elsewhere.
    const std::string lexical = std::filesystem::path(path).lexically_normal().string();
    const bool inside = std::any_of(roots.begin(), roots.end(),
                                    [&](const std::string& r) { return IsInside(lexical, r); });
    if (!inside) return refuse();
    return real.status();
  }
  for (const std::string& r : roots) {
    if (IsInside(*real, r)) {
      *resolved = *real;
      return OkStatus();
    }
  }
  return refuse();
}

Result<ResolvedAdapter> ResolveAdapterPath(const std::vector<std::string>& roots,
                                           const std::string& path) {
  // Relative paths are relative to the roots (the first root under which the path exists).
  std::string candidate = path;
  if (path[0] != '/') {
    candidate.clear();
    for (const std::string& r : roots) {
      struct stat st {};
      const std::string p = r + "/" + path;
      if (::lstat(p.c_str(), &st) == 0) {
        candidate = p;
        break;
      }
    }
    if (candidate.empty()) {
      return roots.empty()
                 ? PermissionDeniedError("adapter path " + path +
                                         " refused: no adapter roots are configured")
                 : NotFoundError("adapter path " + path + " exists under no adapter root");
    }
  }

  ResolvedAdapter ra;
  CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots, candidate, &ra.path));
  struct stat st {};
  if (::stat(ra.path.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat " + ra.path);
  if (S_ISREG(st.st_mode)) {
    const std::string base = Basename(ra.path);
    if (base == kPeftConfig || base == kPeftWeights) {
      ra.path = Dirname(ra.path);  // the PEFT directory (inside the root: its child is)
    } else if (base.size() > 12 && base.compare(base.size() - 12, 12, ".safetensors") == 0) {
      CHORUS_RETURN_IF_ERROR(StatRegular(ra.path).status());
      ra.format = "delta";  // a compressed full fine-tune (docs/deltas.md), one file
      ra.files = {ra.path};
    } else {
      struct stat fst {};
      CHORUS_ASSIGN_OR_RETURN(const int fd, OpenRegular(ra.path, &fst));
      char magic[4] = {0, 0, 0, 0};
      const ssize_t n = ::read(fd, magic, 4);
      ::close(fd);
      if (n != 4 || std::string_view(magic, 4) != "GGUF") {
        return InvalidArgumentError(ra.path +
                                    ": not a LoRA adapter (expected a PEFT directory with " +
                                    kPeftConfig + " and " + kPeftWeights + ", or a GGUF file)");
      }
      ra.format = "gguf";
      ra.files = {ra.path};
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(ra.path + ": neither a directory nor a regular file");
  }
  if (ra.format.empty()) {
    // A delta directory holds delta.safetensors and no adapter_config.json.
    struct stat dst {};
    const std::string delta_file = ra.path + "/" + kDeltaFile;
    if (::lstat((ra.path + "/" + kPeftConfig).c_str(), &dst) != 0 &&
        ::lstat(delta_file.c_str(), &dst) == 0) {
      std::string real;
      CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots, delta_file, &real));
      CHORUS_RETURN_IF_ERROR(StatRegular(real).status());
      ra.format = "delta";
      ra.files = {real};
    }
  }
  if (ra.format.empty()) {
    ra.format = "peft";
    for (const char* f : {kPeftConfig, kPeftWeights}) {
      const std::string p = ra.path + "/" + f;
      struct stat fst {};
      if (::lstat(p.c_str(), &fst) != 0) {
        struct stat pst {};
        if (std::string(f) == kPeftWeights &&
            ::lstat((ra.path + "/" + kPeftPickle).c_str(), &pst) == 0) {
          return UnimplementedError(ra.path +
                                    ": adapter_model.bin is a pickle file, which Chorus refuses to "
                                    "load; save the adapter as safetensors");
        }
        return NotFoundError(ra.path + ": no " + f);
      }
      // Each file may itself be a symlink: it must resolve inside a root too.
      std::string real;
      CHORUS_RETURN_IF_ERROR(ResolveInsideRoots(roots, p, &real));
      CHORUS_RETURN_IF_ERROR(StatRegular(real).status());
      ra.files.push_back(real);
    }
  }
  std::sort(ra.files.begin(), ra.files.end());
  return ra;
}

}  // namespace chorus::adapters::registry_internal
