/* The whole transformer's gradients checked by finite differences in
 * double precision.
 *
 * qkv's model runs in float. This test writes the same transformer again,
 * plainly and in double (token embedding, positions, pre-LayerNorm blocks
 * of multi-head attention and a GELU MLP with residuals, final LayerNorm,
 * tied or untied head, mean cross-entropy over the targeted positions;
 * dropout off), reading qkv's own parameters. Then:
 *   1. qkv's float loss equals the double loss to float rounding, which
 *      shows that the double model is the model qkv computes;
 *   2. every element of every parameter tensor: qkv's analytical float
 *      gradient equals the central difference of the double loss.
 * Decoder and encoder, tied and untied heads, and the positional encodings
 * none, sinusoidal (added, embeddings scaled by sqrt(E)), learned (added)
 * and RoPE (rotating q and k in every head). ALiBi, relative biases and
 * FLOATER are checked by finite differences in float in test_model.c and
 * in double at the layer level in their own tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 2, N = 6, V = 7, E = 8, H = 2, DH = E / H, F = 12, L = 2, MAXSEQ = 8 };

static const int32_t TOK[B * N] = {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 6};
static const int32_t TGT[B * N] = {3, 5, -1, 6, 0, 2, 4, 1, 2, -1, 6, 5};

/* The model's parameters in double, one array per qkv segment. */
typedef struct dmodel {
    qkv_posenc pos;
    int causal, tie;
    int64_t nseg;
    double *p[64];
    int64_t count[64];
    const char *name[64];
    /* segment indices */
    int emb, posemb, head, lnf_w, lnf_b;
    int ln1_w[L], ln1_b[L], ln2_w[L], ln2_b[L], fc1_w[L], fc1_b[L], fc2_w[L], fc2_b[L], attn[L];
} dmodel;

static int seg_of(const dmodel *d, const char *name) {
    for (int i = 0; i < d->nseg; i++)
        if (!strcmp(d->name[i], name)) return i;
    return -1;
}

static void layernorm(const double *x, const double *g, const double *b, double *y) {
    double mu = 0, var = 0;
    for (int i = 0; i < E; i++) mu += x[i];
    mu /= E;
    for (int i = 0; i < E; i++) var += (x[i] - mu) * (x[i] - mu);
    double rs = 1.0 / sqrt(var / E + 1e-5);
    for (int i = 0; i < E; i++) y[i] = (x[i] - mu) * rs * g[i] + b[i];
}

/* y[out] = W[out, in] x + b */
static void linear(const double *x, const double *w, const double *b, int in, int out, double *y) {
    for (int o = 0; o < out; o++) {
        double acc = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) acc += w[o * in + i] * x[i];
        y[o] = acc;
    }
}

/* Rotate the pairs (t, t + DH/2) of one head's vector at position pos. */
static void rope(double *v, int pos) {
    for (int t = 0; t < DH / 2; t++) {
        double a = pos * pow(10000.0, -2.0 * t / DH), c = cos(a), s = sin(a);
        double x0 = v[t], x1 = v[t + DH / 2];
        v[t] = x0 * c - x1 * s;
        v[t + DH / 2] = x0 * s + x1 * c;
    }
}

/* Mean cross-entropy of the batch in double. */
static double dloss(const dmodel *d) {
    static double h[B * N][E], x[B * N][E], ln[B * N][E], q[B * N][E], k[B * N][E], v[B * N][E], o[B * N][E];
    static double pre[F], act[F], tmp[E];
    for (int r = 0; r < B * N; r++) {
        int pos = r % N;
        double scale = d->pos == QKV_POSENC_SINUSOIDAL ? sqrt((double)E) : 1.0;
        for (int i = 0; i < E; i++) {
            double val = d->p[d->emb][TOK[r] * E + i] * scale;
            if (d->pos == QKV_POSENC_SINUSOIDAL) {
                double w = pos * exp(-log(10000.0) * (double)(i - i % 2) / E);
                val += i % 2 ? cos(w) : sin(w);
            }
            if (d->pos == QKV_POSENC_LEARNED) val += d->p[d->posemb][pos * E + i];
            h[r][i] = val;
        }
    }
    for (int l = 0; l < L; l++) {
        const double *A = d->p[d->attn[l]];
        const double *wq = A, *wk = A + E * E, *wv = A + 2 * E * E, *bin = A + 3 * E * E;
        const double *wo = bin + 3 * E, *bo = wo + E * E;
        for (int r = 0; r < B * N; r++) {
            memcpy(x[r], h[r], sizeof x[r]);
            layernorm(x[r], d->p[d->ln1_w[l]], d->p[d->ln1_b[l]], ln[r]);
            linear(ln[r], wq, bin, E, E, q[r]);
            linear(ln[r], wk, bin + E, E, E, k[r]);
            linear(ln[r], wv, bin + 2 * E, E, E, v[r]);
            if (d->pos == QKV_POSENC_ROPE)
                for (int hd = 0; hd < H; hd++) {
                    rope(q[r] + hd * DH, r % N);
                    rope(k[r] + hd * DH, r % N);
                }
        }
        for (int b = 0; b < B; b++)
            for (int hd = 0; hd < H; hd++)
                for (int i = 0; i < N; i++) {
                    double s[N], mx = -INFINITY, sum = 0;
                    int last = d->causal ? i : N - 1;
                    for (int j = 0; j <= last; j++) {
                        double dot = 0;
                        for (int t = 0; t < DH; t++) dot += q[b * N + i][hd * DH + t] * k[b * N + j][hd * DH + t];
                        s[j] = dot / sqrt((double)DH);
                        mx = s[j] > mx ? s[j] : mx;
                    }
                    for (int j = 0; j <= last; j++) sum += (s[j] = exp(s[j] - mx));
                    for (int t = 0; t < DH; t++) {
                        double acc = 0;
                        for (int j = 0; j <= last; j++) acc += s[j] / sum * v[b * N + j][hd * DH + t];
                        o[b * N + i][hd * DH + t] = acc;
                    }
                }
        for (int r = 0; r < B * N; r++) {
            linear(o[r], wo, bo, E, E, tmp);
            for (int i = 0; i < E; i++) x[r][i] += tmp[i]; /* mid */
            layernorm(x[r], d->p[d->ln2_w[l]], d->p[d->ln2_b[l]], ln[r]);
            linear(ln[r], d->p[d->fc1_w[l]], d->p[d->fc1_b[l]], E, F, pre);
            for (int i = 0; i < F; i++) act[i] = 0.5 * pre[i] * (1.0 + erf(pre[i] / sqrt(2.0)));
            linear(act, d->p[d->fc2_w[l]], d->p[d->fc2_b[l]], F, E, tmp);
            for (int i = 0; i < E; i++) h[r][i] = x[r][i] + tmp[i];
        }
    }
    double total = 0;
    int count = 0;
    for (int r = 0; r < B * N; r++) {
        if (TGT[r] < 0) continue;
        double z[V], mx = -INFINITY, sum = 0;
        layernorm(h[r], d->p[d->lnf_w], d->p[d->lnf_b], ln[r]);
        linear(ln[r], d->p[d->head], NULL, E, V, z);
        for (int c = 0; c < V; c++) mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < V; c++) sum += exp(z[c] - mx);
        total += log(sum) + mx - z[TGT[r]];
        count++;
    }
    return total / count;
}

static void check(qkv_posenc pos, int causal, int tie) {
    qkv_model_config c;
    qkv_model_config_init(&c, V, MAXSEQ);
    c.dim = E;
    c.heads = H;
    c.layers = L;
    c.mlp_dim = F;
    c.pos = pos;
    c.causal = causal;
    c.tie_embeddings = tie;
    c.threads = 1;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&c, 23, &m), QKV_OK);
    if (!m) return;
    dmodel d;
    memset(&d, 0, sizeof d);
    d.pos = pos;
    d.causal = causal;
    d.tie = tie;
    d.nseg = qkv_model_segment_count(m);
    CHECK(d.nseg <= 64, "few segments");
    if (d.nseg > 64) return;
    /* Weights larger than the training init (every gradient well above the
     * float noise), copied into double exactly. */
    tu_rng rng;
    tu_rng_seed(&rng, 11);
    for (int s = 0; s < d.nseg; s++) {
        float *p;
        qkv_model_segment(m, s, &d.name[s], &p, NULL, &d.count[s]);
        d.p[s] = malloc((size_t)d.count[s] * sizeof(double));
        for (int64_t i = 0; i < d.count[s]; i++) {
            p[i] += (float)(0.3 * tu_rng_normal(&rng));
            d.p[s][i] = p[i];
        }
    }
    char nm[64];
    d.emb = seg_of(&d, "tok_emb.weight");
    d.posemb = seg_of(&d, "pos_emb.weight");
    d.head = tie ? d.emb : seg_of(&d, "head.weight");
    d.lnf_w = seg_of(&d, "ln_f.weight");
    d.lnf_b = seg_of(&d, "ln_f.bias");
    int ok = d.emb >= 0 && d.head >= 0 && d.lnf_w >= 0 && d.lnf_b >= 0 && (pos != QKV_POSENC_LEARNED || d.posemb >= 0);
    for (int l = 0; l < L; l++) {
#define SEG(field, fmt)                                                                                              \
    snprintf(nm, sizeof nm, fmt, l);                                                                                 \
    d.field[l] = seg_of(&d, nm);                                                                                     \
    ok &= d.field[l] >= 0;
        SEG(ln1_w, "layers.%d.ln1.weight")
        SEG(ln1_b, "layers.%d.ln1.bias")
        SEG(ln2_w, "layers.%d.ln2.weight")
        SEG(ln2_b, "layers.%d.ln2.bias")
        SEG(fc1_w, "layers.%d.mlp.fc1.weight")
        SEG(fc1_b, "layers.%d.mlp.fc1.bias")
        SEG(fc2_w, "layers.%d.mlp.fc2.weight")
        SEG(fc2_b, "layers.%d.mlp.fc2.bias")
        SEG(attn, "layers.%d.attn.")
#undef SEG
        /* the attention block: Wq, Wk, Wv [E, E], in-projection bias [3E], Wo [E, E], bo [E] */
        ok &= d.attn[l] >= 0 && d.count[d.attn[l]] == 4 * E * E + 4 * E;
    }
    CHECK(ok, "pos %d: the segments are those of the double model", pos);
    if (!ok) goto out;

    /* 1. The float forward is this model: the loss (about 2-3 with these
     * weights) agrees to float rounding. Each value passes a few dozen
     * float operations of relative error 6e-8 on O(1) values; measured
     * relative differences are 1e-8 .. 3e-8. 1e-6 relative leaves a margin
     * of 30 and is far below what any wiring difference gives (O(0.1)). */
    double lf = NAN, ld = dloss(&d);
    qkv_model_zero_grad(m);
    CHECK_STATUS(qkv_model_forward(m, B, N, TOK, TGT, 0, NULL, &lf), QKV_OK);
    CHECK(fabs(lf - ld) <= 1e-6 * fabs(ld), "pos %d causal %d tie %d: float loss %.9g, double loss %.9g", pos, causal,
          tie, lf, ld);
    CHECK_STATUS(qkv_model_backward(m), QKV_OK);

    /* 2. Central differences of the double loss, step 1e-5: truncation error
     * ~h^2 |f'''| ~ 1e-10, rounding ~1e-16 / 1e-5 = 1e-11, so they are the
     * true gradient to ~1e-9. qkv's gradients are float: their errors are
     * float rounding through the backward, ~1e-6 relative to the terms
     * summed (measured: at most 6.5e-7 absolute over ~4700 gradients of
     * magnitude up to 0.6). Tolerance 2e-5 + 1e-3 |g|: thirty times the
     * measured float error, and hundreds of times below the O(|g|) error of
     * a missing or wrong term. The largest gradient must be well above
     * the tolerance for the check to mean anything. */
    double worst = 0, gmax = 0;
    int64_t checked = 0;
    for (int s = 0; s < d.nseg; s++) {
        float *p, *g;
        int64_t cnt;
        qkv_model_segment(m, s, NULL, &p, &g, &cnt);
        int bad = 0;
        for (int64_t i = 0; i < cnt; i++) {
            double keep = d.p[s][i], hstep = 1e-5;
            d.p[s][i] = keep + hstep;
            double lp = dloss(&d);
            d.p[s][i] = keep - hstep;
            double lm = dloss(&d);
            d.p[s][i] = keep;
            double fd = (lp - lm) / (2 * hstep), err = fabs(fd - g[i]);
            gmax = fabs(fd) > gmax ? fabs(fd) : gmax;
            worst = err > worst ? err : worst;
            checked++;
            if (err > 2e-5 + 1e-3 * fabs(fd) && !bad) {
                fprintf(stderr, "  pos %d causal %d tie %d: %s[%lld]: double fd %.9g, qkv %.9g\n", pos, causal, tie,
                        d.name[s], (long long)i, fd, (double)g[i]);
                bad = 1;
            }
        }
        CHECK(!bad, "pos %d causal %d tie %d: gradient of %s", pos, causal, tie, d.name[s]);
    }
    CHECK(gmax > 0.05, "pos %d: the gradients are large enough to test (%g)", pos, gmax);
    fprintf(stderr, "pos %d causal %d tie %d: loss float %.9g double %.9g; %lld gradients, max |g| %.3g, "
                    "max |qkv - fd| %.3g\n",
            pos, causal, tie, lf, ld, (long long)checked, gmax, worst);
out:
    for (int s = 0; s < d.nseg; s++) free(d.p[s]);
    qkv_model_free(m);
}

int main(void) {
    check(QKV_POSENC_SINUSOIDAL, 1, 1); /* decoder, tied head */
    check(QKV_POSENC_ROPE, 0, 0);       /* encoder, untied */
    check(QKV_POSENC_LEARNED, 1, 0);
    check(QKV_POSENC_NONE, 0, 1);
    return tu_finish();
}
