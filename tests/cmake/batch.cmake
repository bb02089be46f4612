# common/batch/: the planner's unit tests and the `sluice batch` CLI tests.
if (TARGET sl_batch)
  add_executable(batch_test "${CMAKE_CURRENT_SOURCE_DIR}/unit/batch_test.c")
  target_link_libraries(batch_test PRIVATE sl_batch m)
  # The planner consumes the sampler's epoch order; test that pairing when the sampler exists.
  if (TARGET sl_sample)
    target_link_libraries(batch_test PRIVATE sl_sample)
    target_compile_definitions(batch_test PRIVATE SL_HAVE_SAMPLE)
  endif ()
  add_test(NAME batch_unit COMMAND batch_test)
  set_tests_properties(batch_unit PROPERTIES TIMEOUT 120 LABELS "unit;batch")

  add_test(NAME batch_cli
           COMMAND ${SL_PYTHON} -m unittest -v test_batch_cli
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
  set_tests_properties(batch_cli PROPERTIES TIMEOUT 120 LABELS "python;batch"
                       ENVIRONMENT "${SL_TEST_ENV}")

  # A tiny run of the benchmark so it keeps building and working; the real run is by hand.
  add_executable(batch_bench "${CMAKE_CURRENT_SOURCE_DIR}/bench/batch_bench.c")
  target_link_libraries(batch_bench PRIVATE sl_batch m)
  add_test(NAME batch_bench_smoke COMMAND batch_bench --n 20000 --runs 1)
  set_tests_properties(batch_bench_smoke PROPERTIES TIMEOUT 60 LABELS "bench;batch")
endif ()
