# Hardening (issue 8): the hostile-input test and the fuzz targets.
#
# Hostile input for every RPC through a real client (tests/integration/test_hostile.py; the table
# is in docs/hardening.md).
add_test(NAME hostile_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_hostile
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(hostile_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Fuzz targets (tests/fuzz/). Each target defines LLVMFuzzerTestOneInput. In the normal build it
# is linked with the standalone replay driver (tests/fuzz/driver.c) and ctest replays its
# committed corpus (tests/fuzz/corpus/<target>/), under ASan+UBSan in the sanitized build. With
# -DSLUICE_FUZZ=ON (clang only; tests/fuzz/run.sh does it) it is linked with libFuzzer instead.
option(SLUICE_FUZZ "Link the fuzz targets with libFuzzer (clang) instead of the replay driver" OFF)

set(SL_FUZZ_DIR "${CMAKE_CURRENT_SOURCE_DIR}/fuzz")

# sl_fuzz_target(<name> <libraries>...)
function(sl_fuzz_target name)
  if (SLUICE_FUZZ)
    add_executable(${name} "${SL_FUZZ_DIR}/${name}.c")
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  else ()
    add_executable(${name} "${SL_FUZZ_DIR}/${name}.c" "${SL_FUZZ_DIR}/driver.c")
    add_test(NAME ${name}_replay COMMAND ${name} "${SL_FUZZ_DIR}/corpus/${name}")
    set_tests_properties(${name}_replay PROPERTIES TIMEOUT 120 LABELS fuzz)
  endif ()
  target_include_directories(${name} PRIVATE "${SL_FUZZ_DIR}")
  target_link_libraries(${name} PRIVATE ${ARGN})
endfunction()

sl_fuzz_target(fuzz_shard sl_shard sl_common)
sl_fuzz_target(fuzz_lengths sl_batch sl_common m)
sl_fuzz_target(fuzz_config sl_server_core)
sl_fuzz_target(fuzz_feed_rpc sl_server_core)
sl_fuzz_target(fuzz_ckpt_rpc sl_server_core)
# sl_lengths_read (common/util/lengths_read.c): the daemon's lengths-file reader.
sl_fuzz_target(fuzz_read_lengths sl_server_core)
# feed_labels_read (server/feed/labels.c): the daemon's stored labels-file reader.
sl_fuzz_target(fuzz_read_labels sl_server_core)
# sluiced's flags and SLUICE_* environment (server/config.c).
sl_fuzz_target(fuzz_flags sl_server_core)
# The S3 client's reading of a store's XML answers (server/store/s3_xml.c): a hostile store.
sl_fuzz_target(fuzz_s3_xml sl_server_core)
