# Clients with several replicas' addresses (issue 15): two or three sluiced replicas of one
# PostgreSQL catalog and one data dir, one of them killed while the Python package, the CLI or
# libsluice (through tests/integration/failover_client.c) talks to it.
add_executable(failover_client integration/failover_client.c)
target_link_libraries(failover_client PRIVATE sluice_static)
foreach (spec "python|AddressListTest PythonFailoverTest" "cli|CliFailoverTest" "libsluice|LibsluiceFailoverTest")
  string(REPLACE "|" ";" parts "${spec}")
  list(GET parts 0 part)
  list(GET parts 1 class)
  string(REPLACE " " ";test_failover." classes "test_failover.${class}")
  add_test(NAME failover_${part}_pg
           COMMAND ${SL_PYTHON} -m unittest -v ${classes}
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
  set_tests_properties(failover_${part}_pg PROPERTIES
                       ENVIRONMENT "${SL_TEST_ENV};SL_FAILOVER_CLIENT=$<TARGET_FILE:failover_client>"
                       TIMEOUT 300 LABELS "pg;failover;${part}")
endforeach ()
