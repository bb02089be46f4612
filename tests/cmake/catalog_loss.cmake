# Catalog loss must not become data loss (tests/integration/test_catalog_loss.py, docs/hardening.md
# "Hardening II"): a catalog restored from an online backup, catalog.db removed or replaced under
# a running daemon. Files the catalog does not know go to the quarantine, never away.
add_test(NAME catalog_loss_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_catalog_loss
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(catalog_loss_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 180)
