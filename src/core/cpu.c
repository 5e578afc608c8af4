/* Run-time CPU detection (CPUID for the instruction sets, XGETBV for the OS
 * saving the wider registers: a CPU with AVX-512 under an OS that does not
 * save ZMM state must not run AVX-512 code), done once with pthread_once, and
 * the arch in use. The only place that reads CPUID, QKV_ARCH or QKV_AMX. */
#define _DEFAULT_SOURCE /* syscall (arch_prctl) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"

#if defined(QKV_HAVE_X86) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#define QKV_CPU_X86 1
#endif
#if defined(QKV_CPU_X86) && defined(QKV_HAVE_AMX) && defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define QKV_CPU_AMX_LINUX 1
#endif

static int g_has[QKV_ARCH_COUNT];
static int g_has_bf16;
static int g_has_vnni;
static int g_has_amx;
static int g_has_amx_int8;
static int g_default = QKV_ARCH_GENERIC;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_forced = -1;

#ifdef QKV_CPU_X86
static unsigned long long xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect_x86(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx) return;
    unsigned long long xcr0 = xgetbv0();
    int ymm_os = (xcr0 & 0x6) == 0x6;           /* SSE + AVX state */
    int zmm_os = ymm_os && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    int avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
    g_has[QKV_ARCH_AVX2] = ymm_os && avx2 && fma;
    g_has[QKV_ARCH_AVX512] = zmm_os && avx512 && g_has[QKV_ARCH_AVX2];
#if defined(__x86_64__) /* the bf16 kernels are built for x86-64 only */
    __cpuid_count(7, 1, a, b, c, d);
    g_has_bf16 = g_has[QKV_ARCH_AVX512] && ((a >> 5) & 1); /* AVX512_BF16 */
#endif
    __cpuid_count(7, 0, a, b, c, d);
    g_has_vnni = g_has[QKV_ARCH_AVX512] && ((c >> 11) & 1); /* AVX512_VNNI */
#ifdef QKV_CPU_AMX_LINUX
    /* AMX-TILE (EDX[24]) and AMX-BF16 (EDX[22]), the OS saving the tile
     * configuration and data (XCR0[17], XCR0[18]), and Linux granting this
     * process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for
     * XFEATURE_XTILEDATA = 18): without the grant the first tile
     * instruction faults. The grant is for the whole process. */
    const char *amx_env = getenv("QKV_AMX");
    int amx_cpu = g_has_bf16 && ((d >> 24) & 1) && ((d >> 22) & 1) && (xcr0 & 0x60000) == 0x60000;
    if (amx_cpu && !(amx_env && strcmp(amx_env, "0") == 0))
        g_has_amx = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    g_has_amx_int8 = g_has_amx && g_has_vnni && ((d >> 25) & 1); /* AMX-INT8 */
#endif
}
#endif

static int parse_arch(const char *s) {
    if (!s) return -1;
    if (strcmp(s, "generic") == 0) return QKV_ARCH_GENERIC;
    if (strcmp(s, "avx2") == 0) return QKV_ARCH_AVX2;
    if (strcmp(s, "avx512") == 0) return QKV_ARCH_AVX512;
    return -1;
}

static void init_once(void) {
    g_has[QKV_ARCH_GENERIC] = 1;
#ifdef QKV_CPU_X86
    detect_x86();
#endif
    int best = QKV_ARCH_GENERIC;
    for (int a = 0; a < QKV_ARCH_COUNT; a++)
        if (g_has[a]) best = a;
    int want = parse_arch(getenv("QKV_ARCH"));
    g_default = (want >= 0 && g_has[want]) ? want : best;
}

int qkv_cpu_has(qkv_arch arch) {
    pthread_once(&g_once, init_once);
    return (int)arch >= 0 && arch < QKV_ARCH_COUNT && g_has[arch];
}

int qkv_cpu_has_avx512bf16(void) {
    pthread_once(&g_once, init_once);
    return g_has_bf16;
}

int qkv_cpu_has_avx512vnni(void) {
    pthread_once(&g_once, init_once);
    return g_has_vnni;
}

int qkv_cpu_has_amx_bf16(void) {
    pthread_once(&g_once, init_once);
    return g_has_amx;
}

int qkv_cpu_has_amx_int8(void) {
    pthread_once(&g_once, init_once);
    return g_has_amx_int8;
}

qkv_arch qkv_cpu_arch(void) {
    pthread_once(&g_once, init_once);
    int f = atomic_load(&g_forced);
    return (qkv_arch)(f >= 0 ? f : g_default);
}

int qkv_cpu_force_arch(int arch) {
    pthread_once(&g_once, init_once);
    if (arch < 0) {
        atomic_store(&g_forced, -1);
        return 1;
    }
    if (arch >= QKV_ARCH_COUNT || !g_has[arch]) return 0;
    atomic_store(&g_forced, arch);
    return 1;
}

const char *qkv_arch_name(int arch) {
    switch (arch) {
    case QKV_ARCH_GENERIC: return "generic";
    case QKV_ARCH_AVX2: return "avx2";
    case QKV_ARCH_AVX512: return "avx512";
    default: return "unknown";
    }
}
