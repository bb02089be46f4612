# Attacks on the RPC layer that need no token (docs/hardening.md "Attacks without a token"): a
# gzip bomb, an HTTP/2 rapid-reset flood (15 s; tests/bench/attack_bench.py runs 60 s), a
# connection flood to the fd limit, health Watch streams, method paths aimed at /metrics.
# SLUICE_SANITIZE widens the flood test's bounds in sanitized builds.
add_test(NAME attacks_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_attacks
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
# RUN_SERIAL: the flood measures the daemon's memory and health checks while it keeps up with
# the attackers; a test beside it on a 2-core machine starves it (CI, ASan, beside the S3 suite:
# RSS 2.4 GiB and 3 s checks; alone 0.1-0.3 GiB and under 0.1 s).
set_tests_properties(attacks_integration PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_SANITIZE=${SLUICE_SANITIZE}"
                     TIMEOUT 300 RUN_SERIAL ON)
