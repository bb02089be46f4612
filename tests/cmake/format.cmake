# The committed .clang-format is the house style; CI fails on unformatted C sources.
find_program(CLANG_FORMAT clang-format)
if (CLANG_FORMAT)
  add_test(NAME clang_format
           COMMAND "${CMAKE_COMMAND}" -DCLANG_FORMAT=${CLANG_FORMAT}
                   -DROOT=${PROJECT_SOURCE_DIR} -P "${CMAKE_CURRENT_SOURCE_DIR}/cmake/check_format.cmake.in")
  set_tests_properties(clang_format PROPERTIES LABELS no_asan TIMEOUT 120)
endif ()
