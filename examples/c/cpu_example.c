/* Log-softmax of a small matrix through softlight's C ABI (CPU entry), checked against a
 * double-precision reference computed here. Exit status 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <softlight/softlight.h>

#define ROWS 5
#define COLS 37
#define STRIDE 40 /* rows are padded: the stride is larger than the row */

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

int main(void) {
  float x[ROWS * STRIDE], y[ROWS * STRIDE];
  unsigned seed = 12345u;
  for (int i = 0; i < ROWS * STRIDE; ++i) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((seed >> 8) % 20000) / 1000.0f - 10.0f;
    y[i] = 7.0f; /* log-softmax is never positive: a 7 left behind was never written */
  }
  expect(softlight_version() == SOFTLIGHT_VERSION, "runtime version equals header version");

  softlight_status st = softlight_log_softmax_forward_cpu(x, STRIDE, y, STRIDE, ROWS, COLS,
                                                          SOFTLIGHT_FLOAT32, 0);
  expect(st == SOFTLIGHT_SUCCESS, softlight_status_string(st));

  double worst = 0.0;
  for (int r = 0; r < ROWS; ++r) {
    const float* xr = x + r * STRIDE;
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < COLS; ++j) m = xr[j] > m ? xr[j] : m;
    for (int j = 0; j < COLS; ++j) s += exp(xr[j] - m);
    for (int j = 0; j < COLS; ++j) {
      const double ref = (xr[j] - m) - log(s);
      const double err = fabs(y[r * STRIDE + j] - ref);
      worst = err > worst ? err : worst;
    }
    for (int j = COLS; j < STRIDE; ++j) expect(y[r * STRIDE + j] == 7.0f, "padding left alone");
  }
  expect(worst < 1e-5, "within 1e-5 of the double-precision reference");

  /* With options: log_softmax(x / 2) and each row's log-sum-exp, from the same pass. */
  float lse[ROWS];
  softlight_forward_options opts = {0};
  opts.temperature = 2.0;
  opts.lse = lse;
  st = softlight_log_softmax_forward_cpu_ex(x, STRIDE, y, STRIDE, ROWS, COLS, SOFTLIGHT_FLOAT32, &opts, 1);
  expect(st == SOFTLIGHT_SUCCESS, softlight_status_string(st));
  for (int r = 0; r < ROWS; ++r) {
    const float* xr = x + r * STRIDE;
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < COLS; ++j) m = xr[j] / 2.0 > m ? xr[j] / 2.0 : m;
    for (int j = 0; j < COLS; ++j) s += exp(xr[j] / 2.0 - m);
    expect(fabs(lse[r] - (m + log(s))) < 1e-5, "log-sum-exp with temperature");
    expect(fabs(y[r * STRIDE] - ((xr[0] / 2.0 - m) - log(s))) < 1e-5, "output with temperature");
  }
  opts.temperature = -1.0;
  expect(softlight_log_softmax_forward_cpu_ex(x, STRIDE, y, STRIDE, ROWS, COLS, SOFTLIGHT_FLOAT32, &opts, 1) ==
             SOFTLIGHT_ERROR_INVALID_ARGUMENT, "negative temperature refused");

  /* Any axis: the matrix's columns (dim = rows, inner = columns: outer 1, strides {0, STRIDE, 1}). */
  const int64_t strides[3] = {0, STRIDE, 1};
  st = softlight_log_softmax_forward_3d_cpu(x, strides, y, strides, 1, ROWS, COLS, SOFTLIGHT_FLOAT32, NULL, 1);
  expect(st == SOFTLIGHT_SUCCESS, softlight_status_string(st));
  for (int j = 0; j < COLS; ++j) {
    double m = -INFINITY, s = 0.0;
    for (int r = 0; r < ROWS; ++r) m = x[r * STRIDE + j] > m ? x[r * STRIDE + j] : m;
    for (int r = 0; r < ROWS; ++r) s += exp(x[r * STRIDE + j] - m);
    expect(fabs(y[2 * STRIDE + j] - ((x[2 * STRIDE + j] - m) - log(s))) < 1e-5, "log-softmax down a column");
  }

  /* The backward of the rows' log-softmax: dx = dy - exp(y) * sum(dy), here with dy = 1 - row index. */
  float dy[ROWS * STRIDE], dx[ROWS * STRIDE];
  st = softlight_log_softmax_forward_cpu(x, STRIDE, y, STRIDE, ROWS, COLS, SOFTLIGHT_FLOAT32, 0);
  for (int i = 0; i < ROWS * STRIDE; ++i) dy[i] = (float)((i % STRIDE) % 3) - 1.0f;
  st = softlight_log_softmax_backward_cpu(dy, STRIDE, y, STRIDE, dx, STRIDE, ROWS, COLS, SOFTLIGHT_FLOAT32, 0);
  expect(st == SOFTLIGHT_SUCCESS, softlight_status_string(st));
  for (int r = 0; r < ROWS; ++r) {
    double sum = 0.0;
    for (int j = 0; j < COLS; ++j) sum += dy[r * STRIDE + j];
    for (int j = 0; j < COLS; ++j) {
      const double ref = dy[r * STRIDE + j] - exp((double)y[r * STRIDE + j]) * sum;
      expect(fabs(dx[r * STRIDE + j] - ref) < 1e-5 * (1.0 + fabs(sum)), "backward");
    }
  }

  /* Bad arguments come back as named statuses, with nothing written. */
  const float before = y[0];
  expect(softlight_log_softmax_forward_cpu(NULL, COLS, y, COLS, 1, COLS, SOFTLIGHT_FLOAT32, 0) ==
             SOFTLIGHT_ERROR_NULL_POINTER, "null x refused");
  expect(softlight_log_softmax_forward_cpu(x, COLS - 1, y, COLS, 2, COLS, SOFTLIGHT_FLOAT32, 0) ==
             SOFTLIGHT_ERROR_INVALID_STRIDE, "short stride refused");
  expect(softlight_log_softmax_forward_cpu(x, COLS, y, COLS, 1, COLS, (softlight_dtype)42, 0) ==
             SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE, "unknown dtype refused");
  expect(softlight_log_softmax_forward_cpu(x, COLS, x + 1, COLS, 2, COLS, SOFTLIGHT_FLOAT32, 0) ==
             SOFTLIGHT_ERROR_OVERLAP, "partial overlap refused");
  expect(y[0] == before, "nothing written by refused calls");

  printf("softlight %d: %d rows x %d cols, max |error| %.3g, %s\n", softlight_version(), ROWS, COLS,
         worst, failures ? "FAILED" : "ok");
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}
