# CHORUS_SANITIZE adds -fsanitize flags to every target (Chorus and its tests; the Debian
# libraries it links are not rebuilt). One value, or a comma-separated pair for the combined
# build the CI runs (docs/sanitizers.md):
#   address            ASan, with LeakSanitizer at exit
#   undefined          UBSan; every finding aborts (-fno-sanitize-recover)
#   address,undefined  both in one build (`asan-ubsan` preset: the whole ctest suite)
#   thread             TSan (`tsan` preset: the tests labelled `concurrency`)
# A heavy test that must do less work under a sanitizer tests CHORUS_SANITIZE where it is
# registered (tests/e2e/CMakeLists.txt: e2e_api_fuzz).
string(REPLACE "," ";" chorus_sanitizers "${CHORUS_SANITIZE}")
set(chorus_known_sanitizers address undefined thread)
foreach(s ${chorus_sanitizers})
  if(NOT s IN_LIST chorus_known_sanitizers)
    message(FATAL_ERROR "CHORUS_SANITIZE must be address, undefined, thread, "
                        "address,undefined or empty (got '${CHORUS_SANITIZE}')")
  endif()
endforeach()
if("thread" IN_LIST chorus_sanitizers AND NOT chorus_sanitizers STREQUAL "thread")
  message(FATAL_ERROR "CHORUS_SANITIZE=thread cannot be combined with another sanitizer")
endif()
if(chorus_sanitizers)
  string(REPLACE ";" "," chorus_fsanitize "${chorus_sanitizers}")
  add_compile_options(-fsanitize=${chorus_fsanitize} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${chorus_fsanitize})
  if("undefined" IN_LIST chorus_sanitizers)
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()
