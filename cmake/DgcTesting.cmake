# dgc_add_test(NAME name SOURCES a.cc b.cc LIBS dgc::core ... [LABELS l1 l2] [TIMEOUT s] [COST s])
# One GoogleTest executable per component. How its cases become CTest tests follows
# DGC_TEST_SHARDS:
#   N > 0 (the default, 4): N tests `name.shard<k>of<N>`, each running every N-th case in one
#         process (GoogleTest's GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX). A process per case
#         costs 0.7 s of libtorch start-up in each train case and more under the sanitizers:
#         the ASan + UBSan suites took 148 s with a process per case, 81 s in 4 shards (2 at a
#         time, 2 cores). A failing shard's output names the failed case. A shard may run 900 s
#         (TIMEOUT bounds single cases in the per-case mode; every multi-process case also
#         bounds its own waits, far below either).
#   0:    one CTest test per case (gtest_discover_tests), to select cases with `ctest -R`.
# GTEST_FILTER in the environment still selects cases within the shards. COST: the seconds all
# cases took in a -j2 run on the idle 2-core machine, shared among the shards (ctest -j starts the
# costliest tests first; see tests/launch/CMakeLists.txt).
set(DGC_TEST_SHARDS 4 CACHE STRING
    "CTest tests per GoogleTest executable, each a shard of its cases; 0: one test per case")

function(dgc_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main
                        dgc_build_flags)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(DGC_TEST_SHARDS GREATER 0)
    math(EXPR last "${DGC_TEST_SHARDS} - 1")
    set(cost 0)
    if(ARG_COST)
      math(EXPR cost "${ARG_COST} / ${DGC_TEST_SHARDS}")
    endif()
    foreach(index RANGE ${last})
      math(EXPR shard "${index} + 1")
      set(test ${ARG_NAME}.shard${shard}of${DGC_TEST_SHARDS})
      add_test(NAME ${test} COMMAND ${ARG_NAME})
      set_tests_properties(${test} PROPERTIES TIMEOUT 900 LABELS "${ARG_LABELS}" COST ${cost}
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${DGC_TEST_SHARDS};GTEST_SHARD_INDEX=${index}")
    endforeach()
  else()
    gtest_discover_tests(${ARG_NAME} DISCOVERY_TIMEOUT 120
                         PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
  endif()
endfunction()

# dgc_add_output_test(NAME name PATTERN regex [LABELS l...] [TIMEOUT s] COMMAND cmd args...)
# A test of a command's output that also fails when the command fails. (CTest's
# PASS_REGULAR_EXPRESSION alone ignores the exit status: a command that printed the pattern and
# then crashed would pass.) The command runs through cmake/expect_output.sh.
function(dgc_add_output_test)
  cmake_parse_arguments(ARG "" "NAME;PATTERN;TIMEOUT" "LABELS;COMMAND" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_test(NAME ${ARG_NAME}
    COMMAND ${PROJECT_SOURCE_DIR}/cmake/expect_output.sh ${ARG_PATTERN} ${ARG_COMMAND})
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
