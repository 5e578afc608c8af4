/* bench_agree - how well one set of sentence vectors keeps the geometry of
 * a reference set: the accuracy measures of the encoder benchmark
 * (docs/ENCODER.md, "Precision"), on .npy files that `qkv embed -o` or
 * bench/encoder_peers.py --save wrote for the same input lines.
 *
 *   bench_agree REFERENCE.npy TEST.npy [--pairs N] [--margin M] [--label NAME]
 *
 * Both float32 [sentences, dim]. Prints one key=value line: the worst and
 * mean cosine of a sentence's vector to its reference, Spearman's rho of
 * the pairwise cosines over N pairs drawn with a fixed seed (default 200)
 * and over all pairs, the share of sentences that keep their reference
 * nearest neighbour, and of those whose reference neighbour leads the
 * second by more than M (default 0.01), how many lose it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "similarity.h"

static int load(const char *path, qkv_array *a) {
    char why[256];
    if (qkv_npy_load(path, a, why, sizeof why) != QKV_OK) {
        fprintf(stderr, "bench_agree: %s: %s\n", path, why);
        return -1;
    }
    if (a->dtype != QKV_F32 || a->ndim != 2 || a->shape[0] < 2) {
        fprintf(stderr, "bench_agree: %s: not float32 [sentences >= 2, dim]\n", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *files[2] = {NULL, NULL}, *label = "test";
    long long pairs = 200;
    double margin = 0.01;
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--margin") && i + 1 < argc) margin = atof(argv[++i]);
        else if (!strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
        else if (argv[i][0] != '-' && nf < 2) files[nf++] = argv[i];
        else nf = 3;
    }
    if (nf != 2 || pairs < 1) {
        fprintf(stderr, "usage: bench_agree REFERENCE.npy TEST.npy [--pairs N>=1] [--margin M] [--label NAME]\n");
        return 2;
    }
    qkv_array r = {0}, q = {0};
    if (load(files[0], &r) || load(files[1], &q)) return 1;
    if (r.shape[0] != q.shape[0] || r.shape[1] != q.shape[1]) {
        fprintf(stderr, "bench_agree: the two files' shapes differ\n");
        return 1;
    }
    int64_t n = r.shape[0], dim = r.shape[1];
    sim_agreement all;
    double some;
    if (sim_agree(q.data, r.data, n, dim, margin, &all) || sim_rho(q.data, r.data, n, dim, pairs, 12345, &some)) {
        fprintf(stderr, "bench_agree: out of memory\n");
        return 1;
    }
    printf("label=%s sentences=%lld worst_cosine=%.5f worst_at=%d mean_cosine=%.6f spearman_%lld=%.5f "
           "spearman_all=%.5f nn_kept=%d nn_kept_pct=%.2f clear=%d clear_lost=%d\n",
           label, (long long)n, all.worst_cosine, all.worst_at + 1, all.mean_cosine, pairs, some, all.rho,
           all.kept, 100.0 * all.kept / (double)n, all.clear, all.clear_lost);
    qkv_array_free(&r);
    qkv_array_free(&q);
    return 0;
}
