# common/sample: unit tests, the torch comparison, CLI tests and a benchmark smoke run.
add_executable(sample_test unit/sample_test.c)
target_link_libraries(sample_test PRIVATE sl_sample sl_common m)
add_test(NAME sample_unit COMMAND sample_test)
set_tests_properties(sample_unit PROPERTIES TIMEOUT 120)

add_executable(sample_bench bench/sample_bench.c)
target_link_libraries(sample_bench PRIVATE sl_sample sl_common)

add_test(NAME sample_torch COMMAND ${SL_PYTHON} -m unittest -v test_sample_torch
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
add_test(NAME sample_cli COMMAND ${SL_PYTHON} -m unittest -v test_sample_cli
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(sample_torch sample_cli PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)
add_test(NAME sample_bench_smoke COMMAND sample_bench --smoke)
set_tests_properties(sample_bench_smoke PROPERTIES TIMEOUT 60)

add_executable(sample_strat_test unit/sample_strat_test.c)
target_link_libraries(sample_strat_test PRIVATE sl_sample sl_common m)
add_test(NAME sample_strat_unit COMMAND sample_strat_test)
set_tests_properties(sample_strat_unit PROPERTIES TIMEOUT 300)

add_executable(strat_bench bench/strat_bench.c)
target_link_libraries(strat_bench PRIVATE sl_sample sl_common)
add_test(NAME strat_bench_smoke COMMAND strat_bench --smoke)
set_tests_properties(strat_bench_smoke PROPERTIES TIMEOUT 60)
