# Deployment files: systemd unit (systemd-analyze verify/security), example config and ConfigMap
# (sluiced --check-config), Kubernetes manifests (PyYAML, kubectl kustomize when present),
# Dockerfile runtime packages (apt-cache, ldd), and `cmake --install` from this build tree.
add_test(NAME deploy
         COMMAND ${SL_PYTHON} -m unittest -v test_deploy
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(deploy PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_BUILD_DIR=${CMAKE_BINARY_DIR}"
                     TIMEOUT 120)
