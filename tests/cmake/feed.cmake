# The feeding service end to end (datasets, jobs, epochs, index and batch streams, restart,
# SIGKILL, resize) and the PyTorch samplers in a 4-process torch.distributed (gloo) run.
add_test(NAME feed_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_feed
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(feed_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

add_test(NAME feed_torch_ddp
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_ddp
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_ddp PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 600)
