# common/util: unit tests of the shared small utilities and the lengths file (docs/util.md).
# realloc is wrapped so the test can make the buffer's allocations fail.
add_executable(util_test unit/util_test.c)
target_link_libraries(util_test PRIVATE sl_lengths sl_common)
target_link_options(util_test PRIVATE "LINKER:--wrap=realloc")
add_test(NAME util_unit COMMAND util_test)
set_tests_properties(util_unit PROPERTIES TIMEOUT 60 LABELS unit)
