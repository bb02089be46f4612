# libsluice as an outside program sees it: `cmake --install` into a temporary prefix, a consumer
# (tests/consumer/consumer.c) built with pkg-config against that prefix only and run against a
# real sluiced, and the installed library's exports checked against its headers' SL_API list.
# In a sanitized build the consumer is built with the same sanitizers: the installed
# libsluice.so needs their runtime.
set(sl_consumer_flags "")
if (SLUICE_SANITIZE STREQUAL "address")
  set(sl_consumer_flags "-fsanitize=address,undefined -fno-sanitize-recover=undefined")
elseif (SLUICE_SANITIZE STREQUAL "thread")
  set(sl_consumer_flags "-fsanitize=thread")
endif ()
add_test(NAME libsluice_consumer
         COMMAND ${SL_PYTHON} -m unittest -v test_consumer
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/consumer")
set_tests_properties(libsluice_consumer PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SLUICE_BUILD_DIR=${CMAKE_BINARY_DIR};SLUICE_CC=${CMAKE_C_COMPILER};SLUICE_CONSUMER_FLAGS=${sl_consumer_flags}"
                     TIMEOUT 180)
