/* libFuzzer target: qkv_image_parse (PNG through libpng, binary PGM/PPM) on
 * arbitrary bytes. Findings beyond memory errors and UB: an undocumented
 * status, *out not zeroed or no reason on failure; on success an invalid
 * size, more pixels than the input can encode (the documented bound:
 * deflate's 1032:1 for PNG), or samples outside [0, 1]. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qkv_image img;
    char why[160];
    memset(&img, 0x5a, sizeof img);
    why[0] = '\0';
    qkv_status s = qkv_image_parse(data, size, &img, why, sizeof why);
    if (s != QKV_OK) {
        FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_SIZE_OVERFLOW || s == QKV_ERR_OUT_OF_MEMORY ||
                       (!QKV_WITH_PNG && s == QKV_ERR_UNSUPPORTED),
                   "undocumented status %d (%s)", (int)s, why);
        FUZZ_CHECK(img.data == NULL && img.height == 0 && img.width == 0, "failed parse left *out set");
        FUZZ_CHECK(why[0] != '\0' && memchr(why, '\0', sizeof why) != NULL, "no reason given");
        return 0;
    }
    FUZZ_CHECK(img.height >= 1 && img.width >= 1 && img.channels >= 1 && img.channels <= 4,
               "size %lld x %lld x %lld", (long long)img.height, (long long)img.width,
               (long long)img.channels);
    int64_t n = qkv_image_count(&img);
    FUZZ_CHECK(n > 0 && img.data != NULL, "no pixels");
    /* 1032:1 deflate bound on the decoded bytes (at most 2 per sample). */
    FUZZ_CHECK((uint64_t)(img.height * img.width) <= (uint64_t)size * 1032u + 64u,
               "%lld pixels from %zu bytes", (long long)(img.height * img.width), size);
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(img.data[i] >= 0.0f && img.data[i] <= 1.0f, "sample %lld = %g", (long long)i,
                   (double)img.data[i]);
    qkv_image_free(&img);
    FUZZ_CHECK(img.data == NULL, "qkv_image_free did not zero");
    return 0;
}
