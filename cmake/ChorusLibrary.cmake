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
# CTest, each test case labelled (unit, kernel, integration, e2e, slow).
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
  gtest_discover_tests(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()
