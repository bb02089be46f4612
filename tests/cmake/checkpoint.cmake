# Checkpoint shards: the shard format unit test and the daemon's Checkpoints service end to end.
if (TARGET sl_shard)
  add_executable(shard_test unit/shard_test.c)
  target_link_libraries(shard_test PRIVATE sl_shard sl_common)
  add_test(NAME shard_unit COMMAND shard_test)
  set_tests_properties(shard_unit PROPERTIES TIMEOUT 60)
endif ()

add_test(NAME checkpoint_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_checkpoints
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(checkpoint_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)
