/* Helpers shared by the C test programs: fail loudly with the library's message. */
#ifndef VANS_TEST_CHECK_H
#define VANS_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vans.h"

/* Exits with code 2 when `call` does not return VANS_OK, printing where and why. */
#define CHECK(call)                                                                    \
    do {                                                                               \
        int check_status_ = (call);                                                    \
        if (check_status_ != VANS_OK) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,  \
                    vans_status_name(check_status_), vans_last_error());               \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

/* Exits with code 3 when `cond` is false. */
#define EXPECT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);        \
            exit(3);                                                                   \
        }                                                                              \
    } while (0)

/* Exits with code 3 unless `call` fails with `code` and a message containing `needle`. */
#define EXPECT_ERROR(call, code, needle)                                               \
    do {                                                                               \
        int expect_status_ = (call);                                                   \
        const char *expect_message_ = vans_last_error();                               \
        if (expect_status_ != (code) || strstr(expect_message_, (needle)) == NULL) {   \
            fprintf(stderr, "%s:%d: %s gave %s (%s), expected %s with \"%s\"\n",       \
                    __FILE__, __LINE__, #call, vans_status_name(expect_status_),       \
                    expect_message_, #code, (needle));                                 \
            exit(3);                                                                   \
        }                                                                              \
        printf("error as expected: %s: %s\n", vans_status_name(expect_status_),        \
               expect_message_);                                                       \
    } while (0)

#endif
