/* What both native files share. Included after <Python.h> where that is used. */
#ifndef DDCTL_NATIVE_COMMON_H
#define DDCTL_NATIVE_COMMON_H

#include <stdint.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* An AVX2 clone picked at load time (glibc ifunc); the wheel stays baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DDCTL_NO_CLONES)
#define DDCTL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DDCTL_CLONES
#endif

#if defined(__GNUC__)
#define DDCTL_EXPORT __attribute__((visibility("default")))
#else
#define DDCTL_EXPORT
#endif

/* A decoder's output is usually a fresh multi-MB tensor, and first-touch page
 * faults cost more than the decode itself. Asking for transparent huge pages
 * on its 2 MiB-aligned interior (before anything is written) cuts that cost
 * ~2x where THP is in "madvise" mode; elsewhere it is a harmless no-op. */
static inline void advise_hugepages(void *p, int64_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (nbytes < 4 * (int64_t)huge) return;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)p + (uintptr_t)nbytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)nbytes;
#endif
}

#endif
