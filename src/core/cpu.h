/* Run-time CPU detection (internal): which instruction sets the CPU and the
 * OS support, read once from CPUID + XGETBV, and the ISA in use: the one a
 * test forced, else QKV_ARCH=generic|avx2|avx512 (read once; an unsupported
 * request falls back to the best the CPU has), else the best the CPU has.
 * The kernels of each ISA and the table of the one in use are in
 * src/kernels/ (kernels/kernels.h). */
#ifndef QKV_CORE_CPU_H
#define QKV_CORE_CPU_H

typedef enum qkv_arch {
    QKV_ARCH_GENERIC = 0,
    QKV_ARCH_AVX2 = 1,   /* AVX2 + FMA (+ OS saves YMM) */
    QKV_ARCH_AVX512 = 2, /* AVX-512 F/DQ/BW/VL (+ OS saves ZMM and opmasks) */
    QKV_ARCH_COUNT = 3
} qkv_arch;

/* Whether the CPU and OS support an arch and this build has its kernels. */
int qkv_cpu_has(qkv_arch arch);

/* Whether the CPU also has AVX512-BF16 (CPUID.(7,1):EAX[5]) on top of
 * QKV_ARCH_AVX512: the bf16 kernels run within the AVX-512 ISA. */
int qkv_cpu_has_avx512bf16(void);

/* Whether the CPU also has AVX512-VNNI (CPUID.(7,0):ECX[11]) on top of
 * QKV_ARCH_AVX512: the int8 kernels run within the AVX-512 ISA. */
int qkv_cpu_has_avx512vnni(void);

/* Whether AMX-BF16 tiles can run here (x86-64 Linux): the CPU has AMX-TILE
 * and AMX-BF16 (CPUID.(7,0):EDX[24], [22]) and AVX512-BF16, the OS saves
 * the tile state (XCR0[17:18]) and granted it to this process
 * (arch_prctl), and the environment does not say QKV_AMX=0. The bf16
 * product then runs on tiles within the AVX-512 ISA (kernels/amx/). */
int qkv_cpu_has_amx_bf16(void);

/* Whether AMX-INT8 tiles can run here: qkv_cpu_has_amx_bf16, AVX512-VNNI
 * and AMX-INT8 (CPUID.(7,0):EDX[25]). The int8 product then runs on tiles
 * (QKV_AMX=0 turns both off). */
int qkv_cpu_has_amx_int8(void);

/* The arch in use: the forced one if any, else QKV_ARCH, else the best the
 * CPU has. Thread-safe; always one that qkv_cpu_has. */
qkv_arch qkv_cpu_arch(void);

/* Internal, for tests: force an arch for later calls (-1 restores the
 * default). Returns 1 when applied, 0 when the arch is not supported here
 * (then nothing changes). Not to be called concurrently with attention calls. */
int qkv_cpu_force_arch(int arch);

/* "generic", "avx2", "avx512". */
const char *qkv_arch_name(int arch);

#endif
