# common/rpc: the test-only service, its unit tests and benchmark.
sl_protoc_c(test_proto_c "${CMAKE_CURRENT_SOURCE_DIR}/rpc" sluice/test/test.proto)
add_library(sl_testsvc STATIC ${test_proto_c} rpc/testsvc.c)
target_include_directories(sl_testsvc PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}/rpc" "${SLUICE_GEN_DIR}")
target_link_libraries(sl_testsvc PUBLIC sl_rpc sl_common Threads::Threads)
set_source_files_properties(${test_proto_c} PROPERTIES COMPILE_OPTIONS "-w")

add_executable(rpc_test unit/rpc_test.c)
target_link_libraries(rpc_test PRIVATE sl_testsvc)
add_test(NAME rpc_unit COMMAND rpc_test)
set_tests_properties(rpc_unit PROPERTIES TIMEOUT 120)

add_executable(rpc_bench bench/rpc_bench.c)
target_link_libraries(rpc_bench PRIVATE sl_testsvc)
