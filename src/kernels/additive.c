/* The additive score's kernel tables (kernels/additive.h), one per arch,
 * filled once under pthread_once. */
#include <pthread.h>

#include "core/cpu.h"
#include "kernels/additive.h"

static qkv_additive_kernels g_add[QKV_ARCH_COUNT];
static pthread_once_t g_add_once = PTHREAD_ONCE_INIT;

static void add_init_once(void) {
    for (int a = 0; a < QKV_ARCH_COUNT; a++) {
        if (!qkv_cpu_has((qkv_arch)a)) continue;
        qkv_additive_init_generic(&g_add[a]);
#ifdef QKV_HAVE_X86 /* the ISA folders are built on x86-64 only */
        if (a == QKV_ARCH_AVX2) qkv_additive_init_avx2(&g_add[a]);
        if (a == QKV_ARCH_AVX512) qkv_additive_init_avx512(&g_add[a]);
#endif
    }
}

const qkv_additive_kernels *qkv_additive_kernels_of(int arch) {
    if (arch < 0 || arch >= QKV_ARCH_COUNT || !qkv_cpu_has((qkv_arch)arch)) return NULL;
    pthread_once(&g_add_once, add_init_once);
    return &g_add[arch];
}

const qkv_additive_kernels *qkv_additive_kernels_active(void) {
    pthread_once(&g_add_once, add_init_once);
    return &g_add[qkv_cpu_arch()];
}
