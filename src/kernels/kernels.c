/* The kernel sets, filled once with pthread_once (kernels/kernels.h). */
#include <pthread.h>

#include "core/cpu.h"
#include "kernels/kernels.h"

static qkv_kernel_set g_set[QKV_ARCH_COUNT];
/* The bf16 and int8 tables AMX took the place of (name NULL: none). */
static qkv_gemm_bf16_kernel g_replaced[QKV_ARCH_COUNT];
static qkv_i8_kernels g_replaced_i8[QKV_ARCH_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void fill(int arch, qkv_kernel_set *s) {
    qkv_attn_init_generic(&s->attn);
    qkv_gemm_init_generic(&s->gemm);
    qkv_gemm_bf16_init_generic(&s->gemm_bf16);
    qkv_kv_init_generic(&s->kv);
    qkv_half_init_generic(&s->half);
    qkv_nn_init_generic(&s->nn);
    qkv_i8_init_generic(&s->i8);
    qkv_additive_init_generic(&s->add);
#ifdef QKV_HAVE_X86 /* the ISA folders are built on x86-64 only */
    if (arch == QKV_ARCH_AVX2) {
        qkv_attn_init_avx2(&s->attn);
        qkv_gemm_init_avx2(&s->gemm);
        qkv_kv_init_avx2(&s->kv);
        qkv_additive_init_avx2(&s->add);
    } else if (arch == QKV_ARCH_AVX512) {
        qkv_attn_init_avx512(&s->attn);
        qkv_gemm_init_avx512(&s->gemm);
        qkv_kv_init_avx512(&s->kv);
        qkv_nn_init_avx512(&s->nn);
        qkv_additive_init_avx512(&s->add);
        if (qkv_cpu_has_avx512bf16()) {
            qkv_half_init_avx512bf16(&s->half);
            qkv_gemm_bf16_init_avx512bf16(&s->gemm_bf16);
        }
#ifdef QKV_HAVE_AMX
        if (qkv_cpu_has_amx_bf16()) {
            g_replaced[arch] = s->gemm_bf16;
            qkv_gemm_bf16_init_amx(&s->gemm_bf16);
        }
#endif
        if (qkv_cpu_has_avx512vnni()) qkv_i8_init_avx512vnni(&s->i8);
#ifdef QKV_HAVE_AMX
        if (qkv_cpu_has_amx_int8()) {
            g_replaced_i8[arch] = s->i8;
            qkv_i8_init_amx(&s->i8);
        }
#endif
    }
#else
    (void)arch;
#endif
}

static void init_once(void) {
    for (int a = 0; a < QKV_ARCH_COUNT; a++)
        if (qkv_cpu_has((qkv_arch)a)) fill(a, &g_set[a]);
}

const qkv_kernel_set *qkv_kernel_set_of(int arch) {
    if (arch < 0 || arch >= QKV_ARCH_COUNT || !qkv_cpu_has((qkv_arch)arch)) return NULL;
    pthread_once(&g_once, init_once);
    return &g_set[arch];
}

const qkv_gemm_bf16_kernel *qkv_gemm_bf16_kernel_replaced(int arch) {
    if (!qkv_kernel_set_of(arch)) return NULL;
    return g_replaced[arch].name ? &g_replaced[arch] : NULL;
}

const qkv_i8_kernels *qkv_i8_kernels_replaced(int arch) {
    if (!qkv_kernel_set_of(arch)) return NULL;
    return g_replaced_i8[arch].name ? &g_replaced_i8[arch] : NULL;
}

const qkv_kernel_set *qkv_kernel_set_active(void) {
    pthread_once(&g_once, init_once);
    return &g_set[qkv_cpu_arch()];
}

const qkv_kernels *qkv_kernels_active(void) { return &qkv_kernel_set_active()->attn; }
const qkv_gemm_kernel *qkv_gemm_kernel_active(void) { return &qkv_kernel_set_active()->gemm; }
const qkv_gemm_bf16_kernel *qkv_gemm_bf16_kernel_active(void) { return &qkv_kernel_set_active()->gemm_bf16; }
const kv_kernels *qkv_kv_kernels_active(void) { return &qkv_kernel_set_active()->kv; }
const qkv_half_kernels *qkv_half_kernels_active(void) { return &qkv_kernel_set_active()->half; }
const qkv_nn_kernels *qkv_nn_kernels_active(void) { return &qkv_kernel_set_active()->nn; }
const qkv_i8_kernels *qkv_i8_kernels_active(void) { return &qkv_kernel_set_active()->i8; }
const qkv_additive_kernels *qkv_additive_kernels_active(void) { return &qkv_kernel_set_active()->add; }
