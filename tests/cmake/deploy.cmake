# Deployment files: systemd unit (systemd-analyze verify/security), example config and ConfigMap
# (sluiced --check-config), Kubernetes manifests (PyYAML, kubectl kustomize when present),
# Dockerfile runtime packages (apt-cache, ldd), and `cmake --install` from this build tree.
add_test(NAME deploy
         COMMAND ${SL_PYTHON} -m unittest -v test_deploy
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(deploy PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_BUILD_DIR=${CMAKE_BINARY_DIR}"
                     TIMEOUT 120)

# `pip install ./client/python` into a fresh venv (stubs generated from proto/ at build time),
# then `python -m sluice --version`, the torch-free import and a sampler against the daemon.
# Packaging: release build only.
add_test(NAME pip_install
         COMMAND ${SL_PYTHON} -m unittest -v test_pip_install
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(pip_install PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;no_asan")
