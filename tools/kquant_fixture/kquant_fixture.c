// Writes tests/kquant_fixture/kquants.gguf: a few deterministic 256-wide rows quantized to each
// K type by llama.cpp's (ggml's) own reference quantizer, with ggml's dequantization of them, so
// Chorus's decoders are checked against an independent writer. See README.md here for how to
// build it against a llama.cpp / ggml checkout; tests/kquant_fixture/PROVENANCE.md records the
// run that produced the committed file.
//
// Tensors (GGUF v3, alignment 32), R rows of 256:
//   input        F32 [R, 256]  the rows (the generator below)
//   <type>       Q2_K..Q6_K    quantize_row_<type>_ref(input)
//   <type>.deq   F32 [R, 256]  dequantize_row_<type>(<type>)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

// ggml-quants.c refers to these ggml.c functions from code this program does not call.
void ggml_abort(const char* file, int line, const char* fmt, ...) {
  fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
  abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) {
  (void)type;
  (void)ne;
  abort();
}
size_t ggml_type_size(enum ggml_type type) {
  (void)type;
  abort();
}
const char* ggml_type_name(enum ggml_type type) {
  (void)type;
  return "?";
}

enum { kRows = 4, kK = 256 };

// xorshift32 → uniform in [-1, 1).
static uint32_t g_state = 0x2545f491u;
static float Uniform(void) {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 17;
  g_state ^= g_state << 5;
  return (float)((double)(g_state >> 8) / 8388608.0 - 1.0);
}

// Row 0: uniform; row 1: bell-shaped (sum of 4 uniforms) × 0.05, like trained weights; row 2:
// row 1 plus outliers every 37 elements; row 3: all positive with a ramp (min clamped to 0 for
// the types with mins) and one sub-block of zeros.
static void MakeRows(float* x) {
  for (int e = 0; e < kK; ++e) x[e] = Uniform();
  for (int e = 0; e < kK; ++e) x[kK + e] = 0.05f * (Uniform() + Uniform() + Uniform() + Uniform());
  for (int e = 0; e < kK; ++e) {
    x[2 * kK + e] = 0.05f * (Uniform() + Uniform() + Uniform() + Uniform());
    if (e % 37 == 5) x[2 * kK + e] *= 25.0f;
  }
  for (int e = 0; e < kK; ++e) x[3 * kK + e] = (e >= 64 && e < 80) ? 0.0f : 0.01f + 0.002f * (float)e * (1.0f + 0.5f * Uniform());
}

struct Tensor {
  char name[32];
  uint32_t type;
  const void* data;
  uint64_t bytes;
};

static void W(FILE* f, const void* p, size_t n) {
  if (fwrite(p, 1, n, f) != n) {
    perror("write");
    exit(1);
  }
}
static void WStr(FILE* f, const char* s) {
  uint64_t n = strlen(s);
  W(f, &n, 8);
  W(f, s, n);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT.gguf\n", argv[0]);
    return 2;
  }
  static float x[kRows * kK];
  MakeRows(x);
  static block_q2_K q2[kRows];
  static block_q3_K q3[kRows];
  static block_q4_K q4[kRows];
  static block_q5_K q5[kRows];
  static block_q6_K q6[kRows];
  static float d2[kRows * kK], d3[kRows * kK], d4[kRows * kK], d5[kRows * kK], d6[kRows * kK];
  for (int r = 0; r < kRows; ++r) {
    quantize_row_q2_K_ref(x + r * kK, &q2[r], kK);
    quantize_row_q3_K_ref(x + r * kK, &q3[r], kK);
    quantize_row_q4_K_ref(x + r * kK, &q4[r], kK);
    quantize_row_q5_K_ref(x + r * kK, &q5[r], kK);
    quantize_row_q6_K_ref(x + r * kK, &q6[r], kK);
  }
  dequantize_row_q2_K(q2, d2, kRows * kK);
  dequantize_row_q3_K(q3, d3, kRows * kK);
  dequantize_row_q4_K(q4, d4, kRows * kK);
  dequantize_row_q5_K(q5, d5, kRows * kK);
  dequantize_row_q6_K(q6, d6, kRows * kK);

  const uint64_t fbytes = sizeof(float) * kRows * kK;
  struct Tensor t[] = {
      {"input", 0, x, fbytes},         {"q2_k", 10, q2, sizeof(q2)}, {"q2_k.deq", 0, d2, fbytes},
      {"q3_k", 11, q3, sizeof(q3)},    {"q3_k.deq", 0, d3, fbytes},  {"q4_k", 12, q4, sizeof(q4)},
      {"q4_k.deq", 0, d4, fbytes},     {"q5_k", 13, q5, sizeof(q5)}, {"q5_k.deq", 0, d5, fbytes},
      {"q6_k", 14, q6, sizeof(q6)},    {"q6_k.deq", 0, d6, fbytes},
  };
  const int nt = (int)(sizeof(t) / sizeof(t[0]));

  // The RMS error of llama.cpp's quantizer on these rows, for PROVENANCE.md.
  const float* deq[] = {d2, d3, d4, d5, d6};
  const char* names[] = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k"};
  for (int i = 0; i < 5; ++i) {
    double se = 0;
    for (int e = 0; e < kRows * kK; ++e) se += (x[e] - deq[i][e]) * (double)(x[e] - deq[i][e]);
    printf("%s rmse %.6g\n", names[i], sqrt(se / (kRows * kK)));
  }

  FILE* f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  const uint32_t magic = 0x46554747u, version = 3;  // "GGUF"
  const uint64_t n_tensors = (uint64_t)nt, n_kv = 1;
  W(f, &magic, 4);
  W(f, &version, 4);
  W(f, &n_tensors, 8);
  W(f, &n_kv, 8);
  WStr(f, "general.description");
  const uint32_t kString = 8;
  W(f, &kString, 4);
  WStr(f, "K-quant fixture: llama.cpp reference quantize_row_*_ref and dequantize_row_*");
  uint64_t offset = 0;
  for (int i = 0; i < nt; ++i) {
    WStr(f, t[i].name);
    const uint32_t n_dims = 2;
    const uint64_t ne[2] = {kK, kRows};
    W(f, &n_dims, 4);
    W(f, ne, 16);
    W(f, &t[i].type, 4);
    W(f, &offset, 8);
    offset += (t[i].bytes + 31) / 32 * 32;
  }
  static const uint8_t zeros[32];
  long pos = ftell(f);
  W(f, zeros, (size_t)((32 - pos % 32) % 32));
  for (int i = 0; i < nt; ++i) {
    W(f, t[i].data, t[i].bytes);
    W(f, zeros, (size_t)((32 - t[i].bytes % 32) % 32));
  }
  fclose(f);
  return 0;
}
