/* The libFuzzer entry point every target in tests/fuzz/ defines. Built either with clang
 * -fsanitize=fuzzer (tests/fuzz/run.sh) or with the standalone replay driver (driver.c). */
#ifndef SL_FUZZ_H
#define SL_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
