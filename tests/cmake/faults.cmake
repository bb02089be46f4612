# Fault injection (tests/integration/test_faults.py, docs/hardening.md "Fault injection"): SIGKILL
# at random moments of a mixed workload, a full disk under the data dir, a catalog locked by
# another process. One ctest per fault so they run in parallel and each stays short.
# The release build runs 50 kill rounds; the sanitized build 30 (each round costs ~2x there).
if (SLUICE_SANITIZE STREQUAL "")
  set(SL_FAULT_ROUNDS 50)
else ()
  set(SL_FAULT_ROUNDS 30)
endif ()
foreach (fault KillTest DiskFullTest CatalogBusyTest CrashStateTest)
  string(TOLOWER "${fault}" name)
  add_test(NAME faults_${name}
           COMMAND ${SL_PYTHON} -m unittest -v test_faults.${fault}
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
  set_tests_properties(faults_${name} PROPERTIES
                       ENVIRONMENT "${SL_TEST_ENV};SLUICE_FAULT_ROUNDS=${SL_FAULT_ROUNDS}"
                       TIMEOUT 300)
endforeach ()
# The checkpoint faults again with the shards in object storage (SL_TEST_STORE=s3: s3rver, parts
# of 5 MiB, shards of two parts among the sizes): kills (30% of the rounds, ~35 s)
# and the startup states and their sweep. (DiskFullTest and CatalogBusyTest are about the data
# dir's lengths files and catalog, the same whatever holds the shards.)
math(EXPR SL_FAULT_ROUNDS_S3 "${SL_FAULT_ROUNDS} * 3 / 10")
foreach (fault KillTest CrashStateTest)
  string(TOLOWER "${fault}" name)
  add_test(NAME faults_${name}_s3
           COMMAND ${SL_PYTHON} -m unittest -v test_faults.${fault}
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
  set_tests_properties(faults_${name}_s3 PROPERTIES
                       ENVIRONMENT
                       "${SL_TEST_ENV};SL_TEST_STORE=s3;SLUICE_FAULT_ROUNDS=${SL_FAULT_ROUNDS_S3}"
                       TIMEOUT 300 LABELS "checkpoint;s3")
endforeach ()
