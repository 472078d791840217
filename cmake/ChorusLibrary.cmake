# chorus_cc_library(NAME n SRCS ... DEPS ...) — one CMake target per module, named chorus_<n>,
# with an alias chorus::<n>. Headers are included as "chorus/<module>/<file>.h".
function(chorus_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS;COPTS" ${ARGN})
  set(target chorus_${A_NAME})
  add_library(${target} STATIC ${A_SRCS})
  add_library(chorus::${A_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${CHORUS_SOURCE_DIR})
  target_compile_options(${target} PRIVATE ${CHORUS_WARNING_FLAGS} ${A_COPTS})
  target_link_libraries(${target} PUBLIC ${A_DEPS})
endfunction()

# chorus_cc_test(NAME n SRCS ... DEPS ... LABELS ...) — a GoogleTest binary registered with
# CTest, each test case labelled (unit, kernel, integration, e2e, slow; `concurrency` marks the
# tests that run threads, which the tsan build runs — docs/sanitizers.md).
function(chorus_cc_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT CHORUS_BUILD_TESTS)
    return()
  endif()
  add_executable(${A_NAME} ${A_SRCS})
  target_compile_options(${A_NAME} PRIVATE ${CHORUS_WARNING_FLAGS})
  target_compile_definitions(${A_NAME} PRIVATE CHORUS_SOURCE_DIR="${CHORUS_SOURCE_DIR}")
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} chorus_testutil GTest::gtest GTest::gtest_main)
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set(discovery_timeout 60)
  if(CHORUS_SANITIZE)
    # A sanitized test binary runs a few times slower; discovery also runs it (--gtest_list_tests).
    math(EXPR A_TIMEOUT "${A_TIMEOUT} * 3")
    set(discovery_timeout 180)
  endif()
  gtest_discover_tests(${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT}
                       DISCOVERY_TIMEOUT ${discovery_timeout})
  # Labels are set from a file CTest reads after the discovered list (<name>_TESTS): passed
  # through gtest_discover_tests' PROPERTIES, a list of several labels is split into separate
  # arguments and mis-parsed.
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}_labels.cmake)
  file(WRITE ${labels_file}
       "if(${A_NAME}_TESTS)\n"
       "  set_tests_properties(\${${A_NAME}_TESTS} PROPERTIES LABELS \"${A_LABELS}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
  if("concurrency" IN_LIST A_LABELS)
    add_dependencies(concurrency_tests ${A_NAME})
  endif()
endfunction()

# chorus_glob_module(NAME n DEPS ...) — a module whose sources are every *.cc in its folder,
# reference/ and x86/ (tests *_test.cc and benches excluded); each foo_test.cc becomes a test
# binary `<n>_foo_test` labelled from a first-line comment `// test-labels: kernel slow`
# (default unit). Files in x86/ named *_avx2.cc / *_avx512.cc / *_amx.cc get their ISA flags here and
# nowhere else; run-time dispatch (kernels/dispatch.h) decides which runs.
function(chorus_glob_module)
  cmake_parse_arguments(A "" "NAME" "DEPS;TEST_DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc
       ${CMAKE_CURRENT_SOURCE_DIR}/reference/*.cc ${CMAKE_CURRENT_SOURCE_DIR}/x86/*.cc)
  set(lib_srcs "")
  set(test_srcs "")
  foreach(f ${srcs})
    if(f MATCHES "_test\\.cc$")
      list(APPEND test_srcs ${f})
    else()
      list(APPEND lib_srcs ${f})
    endif()
    if(f MATCHES "_avx2\\.cc$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
    elseif(f MATCHES "_avx512\\.cc$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512vnni;-mavx512bf16;-mavx2;-mfma;-mf16c")
    elseif(f MATCHES "_amx\\.cc$")  # AMX tiles, with AVX-512 for the float epilogue
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mamx-tile;-mamx-int8;-mamx-bf16;-mavx512f;-mavx512bw;-mavx512vl;-mavx512vnni;-mavx512bf16;-mavx2;-mfma;-mf16c")
    endif()
  endforeach()
  chorus_cc_library(NAME ${A_NAME} SRCS ${lib_srcs} DEPS ${A_DEPS})
  foreach(t ${test_srcs})
    get_filename_component(stem ${t} NAME_WE)
    file(STRINGS ${t} first_line LIMIT_COUNT 1)
    set(labels unit)
    if(first_line MATCHES "test-labels:(.*)$")
      string(STRIP "${CMAKE_MATCH_1}" l)
      string(REPLACE " " ";" labels "${l}")
    endif()
    chorus_cc_test(NAME ${A_NAME}_${stem} SRCS ${t} DEPS chorus::${A_NAME} ${A_TEST_DEPS}
                   LABELS ${labels})
  endforeach()
endfunction()
