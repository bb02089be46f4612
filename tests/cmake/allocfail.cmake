# Allocation-failure injection for common/ (tests/unit/allocfail_test.c): the k-th allocation made
# by sluice's own code fails, for every k, in every public entry point that allocates. --wrap
# redirects only the calls made from the test's and sluice's object files and static libraries;
# libc, OpenSSL, gRPC and protobuf-c keep their own allocator (the test wraps the calls sluice
# makes into them instead). Runs in the release and the ASan+UBSan ctest runs (LeakSanitizer
# checks that no failing run leaks).
add_executable(allocfail_test unit/allocfail_test.c)
target_include_directories(allocfail_test PRIVATE "${PROJECT_SOURCE_DIR}/common/rpc")
target_link_libraries(allocfail_test PRIVATE sl_rpc sl_proto sl_sample sl_batch sl_shard sl_common
                      PkgConfig::GRPC PkgConfig::CRYPTO m)
target_link_options(allocfail_test PRIVATE
  "LINKER:--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup"
  "LINKER:--wrap=posix_memalign,--wrap=aligned_alloc"
  "LINKER:--wrap=EVP_MD_CTX_new,--wrap=EVP_DigestInit_ex,--wrap=protobuf_c_message_unpack")
add_test(NAME allocfail_unit COMMAND allocfail_test)
set_tests_properties(allocfail_unit PROPERTIES TIMEOUT 120)
