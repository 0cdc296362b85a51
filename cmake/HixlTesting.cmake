# How hixl registers its tests (included from the top-level CMakeLists.txt when
# HIXL_BUILD_TESTS is on).
#
#   hixl_discover_tests(TARGET TIMEOUT SECONDS LABELS LABEL...
#                       [COST N] [RESOURCE_LOCK NAME])
#     Every gtest case of TARGET becomes its own CTest test (discovered when
#     CTest runs, so an executable that changes needs no reconfigure), with the
#     given TIMEOUT and the labels of cmake/HixlTestLabels.cmake. COST makes
#     CTest start the suite's tests first (long tests last leave one core idle
#     at the end of a run); tests holding the same RESOURCE_LOCK never run
#     side by side (suites that load the whole machine).
#
#     The target's C++ sources also get the precompiled GoogleTest and
#     standard headers of hixl_test_pch (HIXL_TEST_PCH, on by default): parsing
#     them took about 2.5 s of each test file's compile time.
#
#   hixl_label_directory_tests()
#     Adds the transport labels to the tests this directory registered with
#     add_test() (called at the end of its CMakeLists.txt).
#
# gtest_discover_tests(... PROPERTIES LABELS "a;b") cannot be used for more
# than one label: CMake 3.25 flattens the list when it writes the
# set_tests_properties() call, and only "a" survives. hixl_discover_tests()
# sets the labels itself, from a script CTest runs right after the discovered
# tests are defined.
include(GoogleTest)
include(${CMAKE_CURRENT_LIST_DIR}/HixlTestLabels.cmake)
set(HIXL_TEST_LABELS_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/HixlTestLabels.cmake)

option(HIXL_TEST_PCH "Precompile GoogleTest and the standard headers once for all test programs" ON)

# The one precompiled header every gtest program reuses. An executable, so that
# it is compiled with the same code-model flags (-fPIE) as the programs that
# reuse it; GCC ignores a header built with other flags (-Winvalid-pch says so).
function(hixl_test_pch_target)
  if(TARGET hixl_test_pch)
    return()
  endif()
  find_package(GTest REQUIRED)
  set(main ${PROJECT_BINARY_DIR}/hixl_test_pch_main.cc)
  file(WRITE ${main} "int main() { return 0; }\n")
  add_executable(hixl_test_pch ${main})
  target_link_libraries(hixl_test_pch PRIVATE GTest::gtest)
  target_precompile_headers(hixl_test_pch PRIVATE
    <gtest/gtest.h> <algorithm> <atomic> <chrono> <condition_variable> <cstdint>
    <cstring> <functional> <map> <memory> <mutex> <set> <string> <thread>
    <unordered_map> <vector>)
endfunction()

function(hixl_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TIMEOUT;COST;RESOURCE_LOCK" "LABELS")
  if(NOT arg_TIMEOUT OR NOT arg_LABELS OR arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "hixl_discover_tests(${target} TIMEOUT SECONDS LABELS LABEL... "
                        "[COST N] [RESOURCE_LOCK NAME])")
  endif()
  if(HIXL_TEST_PCH)
    hixl_test_pch_target()
    target_precompile_headers(${target} REUSE_FROM hixl_test_pch)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
  endif()
  set(props TIMEOUT ${arg_TIMEOUT})
  if(arg_COST)
    list(APPEND props COST ${arg_COST})
  endif()
  if(arg_RESOURCE_LOCK)
    list(APPEND props RESOURCE_LOCK ${arg_RESOURCE_LOCK})
  endif()
  gtest_discover_tests(${target}
    DISCOVERY_MODE PRE_TEST
    TEST_LIST ${target}_TESTS
    PROPERTIES ${props})
  string(REPLACE ";" "\\;" labels "${arg_LABELS}")
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${script}
    "# Labels of the tests discovered in ${target} (cmake/HixlTesting.cmake).\n"
    "include(\"${HIXL_TEST_LABELS_SCRIPT}\")\n"
    "hixl_label_tests(\"${labels}\" \${${target}_TESTS})\n")
  # Runs after the script gtest_discover_tests appended just above.
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()

# Called at the end of each CMakeLists.txt that uses add_test(): CMake 3.25
# sets test properties only in the directory that added the test.
function(hixl_label_directory_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(test IN LISTS tests)
    get_test_property(${test} LABELS labels)
    if(NOT labels)
      set(labels "")
    endif()
    hixl_label_tests("${labels}" ${test})
  endforeach()
endfunction()
