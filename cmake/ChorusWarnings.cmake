# Warnings applied to every Chorus target (not to third-party code).
set(CHORUS_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)

# The `tsa` preset: clang checks the GUARDED_BY / REQUIRES annotations (base/thread_annotations.h)
# and fails the build on a violation.
option(CHORUS_THREAD_SAFETY_ANALYSIS "clang -Wthread-safety -Werror=thread-safety" OFF)
if(CHORUS_THREAD_SAFETY_ANALYSIS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CHORUS_THREAD_SAFETY_ANALYSIS needs clang (cmake --preset tsa)")
  endif()
  list(APPEND CHORUS_WARNING_FLAGS -Wthread-safety -Werror=thread-safety)
endif()
