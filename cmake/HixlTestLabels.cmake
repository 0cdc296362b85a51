# Labels of hixl's tests: one rule, used when CMake configures the tests added
# with add_test() and again when CTest defines the tests gtest_discover_tests()
# found (cmake/HixlTesting.cmake).
#
# A test carries the labels of its suite (given where it is registered) and
# the transports its name mentions: a name containing "shm", "tcp" or "ucx",
# in any case, is labelled shm, tcp or ucx. So `ctest -L tcp` finds the tcp
# cases of the parameterized suites (".../TCP") as well as the tcp-only ones.
#
# The labels that must always find tests, and those reserved for suites still
# to come, are listed here; the test test_labels (tests/check_labels.py)
# holds the build to them.
set(HIXL_TEST_AREA_LABELS
  tcp shm ucx capi datadist multihost auth fault load fuzz discovery python cs peers cuda)
set(HIXL_TEST_COMING_LABELS gpu vllm sglang)

# hixl_label_tests(SUITE_LABELS TEST...): SUITE_LABELS is one list ("a;b").
function(hixl_label_tests suite_labels)
  foreach(test IN LISTS ARGN)
    set(labels ${suite_labels})
    string(TOLOWER "${test}" lower)
    foreach(transport IN ITEMS shm tcp ucx)
      string(FIND "${lower}" "${transport}" at)
      if(NOT at EQUAL -1)
        list(APPEND labels ${transport})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES labels)
    set_tests_properties("${test}" PROPERTIES LABELS "${labels}")
  endforeach()
endfunction()
