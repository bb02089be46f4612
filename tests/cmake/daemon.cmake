# sluiced end to end: the real daemon, the CLI and a Python grpcio client.
add_test(NAME daemon_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_daemon
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(daemon_integration PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Operations: TLS/mTLS, tokens and roles, metrics (promtool), config file, JSON logs.
add_test(NAME ops_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_ops
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(ops_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Enforced limits: --max-calls, --max-job-streams, --idle-timeout, memory of stalled readers.
add_test(NAME limits_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_limits
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(limits_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Debian's own python3 (python3-grpcio, python3-protobuf, no torch): the torch-free client
# against the daemon, the one test kept on that stack (the rest run in the test venv).
add_test(NAME debian_python_smoke
         COMMAND ${SL_DEBIAN_PYTHON} -m unittest -v test_debian_smoke
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(debian_python_smoke PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120 LABELS "python")
