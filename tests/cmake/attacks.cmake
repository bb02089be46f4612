# Attacks on the RPC layer that need no token (docs/hardening.md "Attacks without a token"): a
# gzip bomb, an HTTP/2 rapid-reset flood (15 s; tests/bench/attack_bench.py runs 60 s), a
# connection flood to the fd limit, health Watch streams, method paths aimed at /metrics.
# SLUICE_SANITIZE widens the flood test's bounds in sanitized builds.
add_test(NAME attacks_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_attacks
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(attacks_integration PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_SANITIZE=${SLUICE_SANITIZE}"
                     TIMEOUT 300)
