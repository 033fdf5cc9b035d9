/* One weight row . one activation row, `reps` times, with llama.cpp's CPU dot of the type (its
 * arch/arm/quants.c, compiled beside this file by scripts/count-insn-aarch64): the peer of
 * shoal-kernels' examples/dot_insn.rs. Usage: ggml_dot <type> <k> <reps> [nrc]; nrc = 2 runs the
 * i8mm kernels' two weight rows x two activation rows per call (built with +i8mm; Q4_0, Q4_1,
 * Q8_0, Q4_K and Q6_K have them). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

#define DOT(name) void ggml_vec_dot_##name(int, float *, size_t, const void *, size_t, const void *, size_t, int);
DOT(q4_0_q8_0) DOT(q4_1_q8_1) DOT(q5_0_q8_0) DOT(q5_1_q8_1) DOT(q8_0_q8_0)
DOT(q2_K_q8_K) DOT(q3_K_q8_K) DOT(q4_K_q8_K) DOT(q5_K_q8_K) DOT(q6_K_q8_K)
DOT(iq4_nl_q8_0) DOT(mxfp4_q8_0) DOT(iq4_xs_q8_K) DOT(iq3_s_q8_K) DOT(iq3_xxs_q8_K) DOT(iq2_xxs_q8_K) DOT(iq2_xs_q8_K) DOT(iq2_s_q8_K) DOT(iq1_s_q8_K) DOT(iq1_m_q8_K)

/* What quants.c references but the dots do not use. */
float ggml_table_f32_ue4m3[256];
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k) { (void)x; (void)y; (void)k; abort(); }

struct kind { const char *name; dot_fn f; int block, wbytes, xbytes; };

static const struct kind KINDS[] = {
    {"q4_0", ggml_vec_dot_q4_0_q8_0, 32, 18, 34},  {"q4_1", ggml_vec_dot_q4_1_q8_1, 32, 20, 36},
    {"q5_0", ggml_vec_dot_q5_0_q8_0, 32, 22, 34},  {"q5_1", ggml_vec_dot_q5_1_q8_1, 32, 24, 36},
    {"q8_0", ggml_vec_dot_q8_0_q8_0, 32, 34, 34},  {"q2_K", ggml_vec_dot_q2_K_q8_K, 256, 84, 292},
    {"q3_K", ggml_vec_dot_q3_K_q8_K, 256, 110, 292}, {"q4_K", ggml_vec_dot_q4_K_q8_K, 256, 144, 292},
    {"q5_K", ggml_vec_dot_q5_K_q8_K, 256, 176, 292}, {"q6_K", ggml_vec_dot_q6_K_q8_K, 256, 210, 292},
    {"iq4_nl", ggml_vec_dot_iq4_nl_q8_0, 32, 18, 34}, {"mxfp4", ggml_vec_dot_mxfp4_q8_0, 32, 17, 34},
    {"iq4_xs", ggml_vec_dot_iq4_xs_q8_K, 256, 136, 292}, {"iq3_s", ggml_vec_dot_iq3_s_q8_K, 256, 110, 292},
    {"iq3_xxs", ggml_vec_dot_iq3_xxs_q8_K, 256, 98, 292}, {"iq2_xxs", ggml_vec_dot_iq2_xxs_q8_K, 256, 66, 292},
    {"iq2_xs", ggml_vec_dot_iq2_xs_q8_K, 256, 74, 292}, {"iq2_s", ggml_vec_dot_iq2_s_q8_K, 256, 82, 292},
    {"iq1_s", ggml_vec_dot_iq1_s_q8_K, 256, 50, 292}, {"iq1_m", ggml_vec_dot_iq1_m_q8_K, 256, 56, 292},
};

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) { fprintf(stderr, "usage: ggml_dot <type> <k> <reps> [nrc]\n"); return 2; }
    int k = atoi(argv[2]), reps = atoi(argv[3]), nrc = argc == 5 ? atoi(argv[4]) : 1;
    if (nrc != 1 && nrc != 2) { fprintf(stderr, "nrc must be 1 or 2\n"); return 2; }
    for (size_t i = 0; i < sizeof KINDS / sizeof *KINDS; i++) {
        const struct kind *t = &KINDS[i];
        if (strcmp(t->name, argv[1]) != 0) continue;
        size_t nb = (size_t)(k / t->block);
        size_t bx = nb * t->wbytes, by = nb * t->xbytes;
        unsigned char *w = malloc(nrc * bx), *x = malloc(nrc * by);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (size_t j = 0; j < nrc * bx; j++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; w[j] = (s >> 56) & 0x3B; }
        for (size_t j = 0; j < nrc * by; j++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; x[j] = (s >> 56) & 0x3B; }
        float acc = 0, out[4];
        for (int r = 0; r < reps; r++) {
            t->f(k, out, 2, w, bx, x, by, nrc); /* nrc = 2: out[0], out[1], out[2], out[3] */
            for (int i = 0; i < nrc * nrc; i++) acc += out[i];
        }
        printf("ggml %s %d %d: %g\n", t->name, k, reps, acc);
        return 0;
    }
    fprintf(stderr, "unknown type %s\n", argv[1]);
    return 2;
}
