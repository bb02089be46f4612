/* The unit tests' checks: CHECK(cond) counts a failure and says where, and check_done(name)
 * reports and gives main's exit code. One copy for every test that includes it. */
#ifndef SL_TEST_CHECK_H
#define SL_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* Print "<name>: ok" or the number of failures; returns main's exit code. */
static inline int check_done(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif
