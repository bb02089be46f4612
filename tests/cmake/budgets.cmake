# Budgets of issue 13, item 6 (docs/hardening.md "Hardening II"), each attack played against the
# real daemon (tests/integration/test_budgets.py lists them). Under a minute; the checkpoint
# tests write a few hundred MiB under their temporary data dirs. SLUICE_SANITIZE skips the RSS
# figure in sanitized builds.
add_test(NAME budgets_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_budgets
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(budgets_integration PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_SANITIZE=${SLUICE_SANITIZE}" TIMEOUT 400)
