// Crash-safe file maintenance shared by every store that persists state (the adapter registry,
// the fine-tuning file store and job queue, fine-tuning checkpoints; docs/adapters.md,
// "Durability"). WriteFileAtomically (mapped_file.h) writes one file; these helpers clean up
// after a writer that was killed, move a corrupt file aside, and let tests kill the process at
// a chosen step of a write.
#pragma once

#include <functional>
#include <string>

#include "chorus/base/status.h"

namespace chorus {

// Test hook for the crash-consistency tests (tests/crash/): when the environment variable
// CHORUS_CRASH_POINT is `name` or `name@N`, the process sends itself SIGKILL the first (N-th)
// time execution reaches the point called `name` (hits of the armed point are counted per
// process). Unset (production): one getenv per call, no effect; the points sit next to file
// writes, which cost far more. Points: docs/adapters.md, "Durability".
void CrashPoint(const char* name);

// fsync(2) of a directory, so that renames and unlinks inside it survive a crash.
Status SyncDirectory(const std::string& dir);

// True for a temp-file name of WriteFileAtomically: `<name>.tmp.<digits>`.
bool IsAtomicWriteTempName(const std::string& file_name);

// Removes the WriteFileAtomically temp files (`*.tmp.<digits>`) directly in `dir` that a killed
// writer left behind — only those whose base name satisfies `base_prefix` as a prefix ("" =
// all). The caller must be the directory's only writer (hold its lock). Returns how many were
// removed; each is logged.
int RemoveAtomicWriteTempFiles(const std::string& dir, const std::string& base_prefix = "");

// For a writer without a lock (a one-shot command such as `chorus compress`): removes the
// WriteFileAtomically temp files of `path` (`<path>.tmp.<pid>`) whose process no longer exists,
// so repeated kills leave at most one per live writer — and the staging directories of a
// StagedDirectory for `path` (same name), with their contents. Returns how many were removed.
int RemoveDeadWritersTempFiles(const std::string& path);
// The same for every file directly in `dir` (a PEFT adapter directory, whose files are written
// one by one).
int RemoveDeadWritersTempFilesIn(const std::string& dir);

// A directory replaced as a whole, for a writer of several files without a lock (`chorus convert
// --format hf`): the new contents are written into a sibling staging directory
// `<dir>.tmp.<pid>`, and Commit() swaps it with `dir` in one rename (renameat2 RENAME_EXCHANGE),
// so a reader or a kill sees the old set of files or the new one, never a mix. Files of the old
// directory that the new contents do not replace are carried over (hard links; copies where the
// file system refuses links), so a README or other files someone put there stay. A staging
// directory left by a killed writer is removed by the next Begin for the same `dir` (its pid is
// gone); one that is destroyed without Commit() removes its own. Crash points (CrashPoint):
// `staged_dir.before_exchange`, `staged_dir.after_exchange` (before the old contents are removed).
// On a file system without RENAME_EXCHANGE the old directory is first moved aside to
// `<dir>.tmp.<pid>.old`, then the new one renamed in; a kill between the two leaves `dir` absent
// until the next Begin, which puts the old one back (docs/adapters.md, "Durability").
class StagedDirectory {
 public:
  // `dir` may exist (a directory, or a symlink to one: its target is replaced) or not; it is
  // taken as an absolute, normal path ("." and "out/" work), and its parent must exist and be
  // writable (the staging directory is created there). A replaced directory keeps its
  // permission bits. Not "/".
  static Result<StagedDirectory> Begin(const std::string& dir);
  StagedDirectory(StagedDirectory&& o) noexcept;
  StagedDirectory& operator=(StagedDirectory&&) = delete;
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  ~StagedDirectory();

  // Where the new contents go.
  const std::string& path() const { return staging_; }
  // Puts the new contents in place: carries over each entry of the old directory that the
  // staging directory does not hold, unless `replaced(name)` says it belongs to the contents
  // being replaced (then it is dropped) or it is a WriteFileAtomically temp file; fsyncs every
  // file and the directories; swaps; removes the old contents. Once only.
  Status Commit(const std::function<bool(const std::string& name)>& replaced);

 private:
  StagedDirectory(std::string dir, std::string staging)
      : dir_(std::move(dir)), staging_(std::move(staging)) {}
  std::string dir_, staging_;
  bool done_ = false;
};

// Moves a corrupt file aside to `<path>.corrupt-<UTC time YYYYmmddTHHMMSSZ>` (plus `-<n>` if
// that exists), fsyncs the directory and returns the new path. Nothing is deleted.
Result<std::string> QuarantineFile(const std::string& path);

// An exclusive flock(2) on `lock_path` (created if needed), held until the object is destroyed
// or the process dies (the kernel drops it). kFailedPrecondition naming `what` when another
// process holds it.
class FileLock {
 public:
  static Result<FileLock> Acquire(const std::string& lock_path, const std::string& what);
  FileLock() = default;
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace chorus
