# common/sample: unit tests, the torch comparison, CLI tests and a benchmark smoke run.
add_executable(sample_test unit/sample_test.c)
target_link_libraries(sample_test PRIVATE sl_sample sl_common m)
add_test(NAME sample_unit COMMAND sample_test)
set_tests_properties(sample_unit PROPERTIES TIMEOUT 120)

add_executable(sample_bench bench/sample_bench.c)
target_link_libraries(sample_bench PRIVATE sl_sample sl_common)
