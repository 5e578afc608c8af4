/* The kernels in use (internal): one set per ISA holding a table of every
 * kernel family, filled once at first use, BLIS-style: start from the
 * generic tables, then the ISA's inits override the slots it implements
 * (AVX-512 also takes the AVX512-BF16, AMX-BF16 and AVX512-VNNI kernels
 * when the CPU has them). The ISA comes from core/cpu.h (CPU detection, QKV_ARCH, a
 * test's forcing).
 *
 *   family            contract            kernels
 *   attention tiles   kernels/attn.h      kernels/<isa>/attn.c
 *   matmul            kernels/gemm.h      kernels/<isa>/gemm.c
 *   bf16 matmul       kernels/gemm.h      kernels/{generic,avx512bf16,amx}/gemm.c
 *   KV decode         kernels/kv.h        kernels/<isa>/kv.c
 *   bf16 tiles        kernels/half.h      kernels/<isa>/half.c
 *   layer rows        kernels/nn.h        kernels/<isa>/nn.c
 *   int8 matmul       kernels/i8.h        kernels/{generic,avx512vnni,amx}/i8.c
 *   additive score    kernels/additive.h  kernels/<isa>/additive.c
 * with <isa> one of generic, avx2, avx512, avx512bf16, avx512vnni, amx, each folder compiled
 * with that ISA's flags only. */
#ifndef QKV_KERNELS_KERNELS_H
#define QKV_KERNELS_KERNELS_H

#include "kernels/additive.h"
#include "kernels/attn.h"
#include "kernels/gemm.h"
#include "kernels/half.h"
#include "kernels/i8.h"
#include "kernels/kv.h"
#include "kernels/nn.h"

typedef struct qkv_kernel_set {
    qkv_kernels attn;
    qkv_gemm_kernel gemm;
    qkv_gemm_bf16_kernel gemm_bf16;
    kv_kernels kv;
    qkv_half_kernels half;
    qkv_nn_kernels nn;
    qkv_i8_kernels i8;
    qkv_additive_kernels add;
} qkv_kernel_set;

/* The set of an arch (qkv_arch of core/cpu.h), or NULL when the CPU or
 * this build does not have it. Thread-safe. */
const qkv_kernel_set *qkv_kernel_set_of(int arch);

/* For tests: the bf16 product table of an arch that the AMX one replaced
 * in its set (the AVX512-BF16 one on a CPU with AMX-BF16), else NULL. */
const qkv_gemm_bf16_kernel *qkv_gemm_bf16_kernel_replaced(int arch);
/* Likewise the int8 table (the AVX512-VNNI one where AMX-INT8 runs). */
const qkv_i8_kernels *qkv_i8_kernels_replaced(int arch);

/* The set of the arch in use (qkv_cpu_arch), and its tables. Thread-safe;
 * never NULL. */
const qkv_kernel_set *qkv_kernel_set_active(void);
const qkv_kernels *qkv_kernels_active(void);
const qkv_gemm_kernel *qkv_gemm_kernel_active(void);
const qkv_gemm_bf16_kernel *qkv_gemm_bf16_kernel_active(void);
const kv_kernels *qkv_kv_kernels_active(void);
const qkv_half_kernels *qkv_half_kernels_active(void);
const qkv_nn_kernels *qkv_nn_kernels_active(void);
const qkv_i8_kernels *qkv_i8_kernels_active(void);
const qkv_additive_kernels *qkv_additive_kernels_active(void);

#endif
