/* kh_asan.h: KH_ASAN is defined when AddressSanitizer instruments this build (GCC's
 * __SANITIZE_ADDRESS__, clang's __has_feature), for the pools and allocators that poison what
 * they keep so that a use after free is still caught; the ASan interface comes with it. */
#ifndef KH_ASAN_H
#define KH_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define KH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KH_ASAN 1
#endif
#endif
#ifdef KH_ASAN
#include <sanitizer/asan_interface.h>
#endif

#endif
