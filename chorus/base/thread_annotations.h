// Clang thread-safety annotations (-Wthread-safety): locking rules written next to the data they
// protect and checked at compile time by the `tsa` build (CMakePresets.json, run by .ci/run).
// Other compilers see empty macros.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);          // read or written only with mu_ held
//   void Flush() REQUIRES(mu_);          // callers hold mu_
//   void Add() EXCLUDES(mu_);            // takes mu_ itself
#pragma once

#if defined(__clang__)
#define CHORUS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CHORUS_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) CHORUS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY CHORUS_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) CHORUS_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) CHORUS_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) CHORUS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) CHORUS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) CHORUS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) CHORUS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CHORUS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define EXCLUDES(...) CHORUS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) CHORUS_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) CHORUS_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS CHORUS_THREAD_ANNOTATION(no_thread_safety_analysis)
