/*
 * softlight: log-softmax over the rows of a matrix, on CUDA GPUs and on the CPU.
 *
 * Plain C. Only C types cross this interface; the stream is an opaque pointer (a cudaStream_t or
 * CUstream, or NULL for the legacy default stream), so callers need no CUDA headers.
 *
 * Semantics (all entry points): for every row r in [0, rows),
 *     y[r, :] = (x[r, :] - m) - log(sum_j exp(x[r, j] - m)),   m = max_j x[r, j]
 * (with x / temperature in place of x where the _ex options ask for a temperature)
 * accumulated in float32 for float32/float16/bfloat16 and in float64 for float64. Special values
 * follow torch.log_softmax: a row holding a NaN or +inf, and a row of all -inf, is all NaN; a -inf
 * entry among finite ones gives -inf. See docs/semantics.md.
 *
 * Strides are in elements between the starts of consecutive rows; a row's elements are contiguous.
 * x and y may be the same pointer with the same stride (in place); any other overlap is refused.
 * Every argument is checked before any work is queued; a call that returns an error wrote nothing.
 * Pointers must be aligned to their element size (INVALID_ARGUMENT otherwise). The library links
 * its own CUDA runtime: the caller's pending CUDA errors are neither seen nor cleared by it.
 * No global state: calls are safe from many host threads on many streams.
 */
#ifndef SOFTLIGHT_SOFTLIGHT_H
#define SOFTLIGHT_SOFTLIGHT_H

#include <stdint.h>

#define SOFTLIGHT_VERSION_MAJOR 0
#define SOFTLIGHT_VERSION_MINOR 1
#define SOFTLIGHT_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as softlight_version() returns it. */
#define SOFTLIGHT_VERSION \
  (SOFTLIGHT_VERSION_MAJOR * 10000 + SOFTLIGHT_VERSION_MINOR * 100 + SOFTLIGHT_VERSION_PATCH)

#if defined(_WIN32)
#  if defined(SOFTLIGHT_BUILDING)
#    define SOFTLIGHT_API __declspec(dllexport)
#  else
#    define SOFTLIGHT_API __declspec(dllimport)
#  endif
#else
#  define SOFTLIGHT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum softlight_status {
  SOFTLIGHT_SUCCESS = 0,
  SOFTLIGHT_ERROR_NULL_POINTER = 1,       /* x or y is NULL while rows * cols > 0 */
  SOFTLIGHT_ERROR_INVALID_SIZE = 2,       /* rows or cols negative */
  SOFTLIGHT_ERROR_INVALID_STRIDE = 3,     /* a row stride smaller than cols (rows > 1); 3-d forms:
                                             a negative stride, or an output aliasing itself */
  SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE = 4,  /* dtype is not one of softlight_dtype */
  SOFTLIGHT_ERROR_OVERLAP = 5,            /* x and y overlap other than exactly (in place) */
  SOFTLIGHT_ERROR_NOT_DEVICE_MEMORY = 6,  /* GPU entry: x or y is not device (or managed) memory */
  SOFTLIGHT_ERROR_DEVICE_MISMATCH = 7,    /* GPU entry: x and y live on different devices */
  SOFTLIGHT_ERROR_NO_DEVICE = 8,          /* GPU entry: no usable CUDA driver or device */
  SOFTLIGHT_ERROR_UNSUPPORTED_DEVICE = 9, /* GPU entry: compute capability below 8.0 */
  SOFTLIGHT_ERROR_CUDA = 10,              /* GPU entry: the CUDA runtime reported an error */
  SOFTLIGHT_ERROR_INVALID_ARGUMENT = 11,  /* any other bad argument: a temperature out of its range, a
                                             pointer not aligned to its element size */
  SOFTLIGHT_ERROR_OUT_OF_MEMORY = 12,     /* a workspace could not be allocated */
  SOFTLIGHT_ERROR_INVALID_AXIS = 13,      /* N-d forms: dim outside [-ndim, ndim) (a 0-d array has one axis) */
  SOFTLIGHT_ERROR_UNMERGED_LAYOUT = 14    /* N-d forms: the axes before dim, or those after it, are not one
                                             evenly strided run, or a stride is negative: the array is not
                                             computed in place (a contiguous copy of it is) */
} softlight_status;

typedef enum softlight_dtype {
  SOFTLIGHT_FLOAT32 = 0,
  SOFTLIGHT_FLOAT16 = 1,
  SOFTLIGHT_BFLOAT16 = 2,
  SOFTLIGHT_FLOAT64 = 3
} softlight_dtype;

/* A static, human-readable description of a status; never NULL. */
SOFTLIGHT_API const char* softlight_status_string(softlight_status status);

/* The library's version as MAJOR * 10000 + MINOR * 100 + PATCH (compare with SOFTLIGHT_VERSION). */
SOFTLIGHT_API int softlight_version(void);

/* 1 where this library was built with its CUDA kernels, 0 for a build of the CPU backend alone
 * (no CUDA compiler at build time): there every GPU entry point checks its arguments as usual and
 * then returns SOFTLIGHT_ERROR_NO_DEVICE, writing nothing. */
SOFTLIGHT_API int softlight_gpu_built(void);

/* The CUDA devices this library's runtime sees: 0 without a GPU build, a driver or a device (and no
 * CUDA error is left pending). */
SOFTLIGHT_API int softlight_device_count(void);

/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
SOFTLIGHT_API int softlight_dtype_size(softlight_dtype dtype);

/*
 * Log-softmax of each row of x into y, on the GPU that holds x and y, queued on `stream`.
 * The call is asynchronous with respect to the host. The current device is left as it was.
 */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward(
    const void* x, int64_t x_row_stride,
    void* y, int64_t y_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, void* stream);

/*
 * The same on the CPU: x and y are host memory; runs on the calling thread and, for large inputs,
 * on worker threads it joins before returning (`num_threads` <= 0 picks the hardware's count).
 */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_cpu(
    const void* x, int64_t x_row_stride,
    void* y, int64_t y_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, int num_threads);

/*
 * Options of the _ex entry points. Zero-initialise, then set what you need:
 *   temperature  computes log_softmax(x / temperature); 0 means 1. Must be finite and positive.
 *   lse          optional (NULL: none): `rows` values, one per row, contiguous, of the accumulation
 *                type (float32 for float32/float16/bfloat16, float64 for float64), receiving
 *                m + log(s), the log-sum-exp of the row of x / temperature. It costs no extra
 *                pass. A row holding NaN or +inf gives NaN (as y does), a row of all -inf gives
 *                -inf. Must not overlap x or y; on the GPU, device memory of x's device.
 */
typedef struct softlight_forward_options {
  double temperature;
  void* lse;
} softlight_forward_options;

/* softlight_log_softmax_forward with options (`options` may be NULL: the defaults). */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_ex(
    const void* x, int64_t x_row_stride,
    void* y, int64_t y_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, void* stream);

/* softlight_log_softmax_forward_cpu with options (`options` may be NULL: the defaults). */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_cpu_ex(
    const void* x, int64_t x_row_stride,
    void* y, int64_t y_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, int num_threads);

/*
 * Any axis of a strided array, as three axes: `outer` slices, each a `dim` x `inner` block; the
 * log-softmax runs along `dim` for each of the outer * inner positions. An N-d array with the
 * softmax over axis d has outer = product of the extents before d, inner = product of those after
 * d, when the axes before d (and those after d) collapse to one evenly strided axis each.
 *
 * Strides are in elements, {outer, dim, inner}, one triple per array; x and y may differ. A stride
 * of an axis of extent 1 is never used. Strides must not be negative. x may repeat elements (a
 * stride 0); y may not: its axes, ordered by stride, must each step past all that the smaller ones
 * reach (as every view of an array does), else INVALID_STRIDE. x and y may be the same array with
 * the same strides (in place); any other overlap of their spans is refused. With options->lse, it
 * receives outer * inner values, the one of position (o, i) at o * inner + i. Rows (inner = 1, dim
 * stride 1) take the same kernels as softlight_log_softmax_forward. On Hopper, a contiguous inner
 * axis of at least 128 bytes whose base, outer and dim strides and extent are multiples of 16 bytes
 * reads x once through clusters of CTAs (when a tile of 256 bytes of it along the whole axis fits
 * their shared memory); other layouts take a two-pass kernel whose second pass re-reads x from the
 * L2 cache (docs/design.md).
 */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_3d(
    const void* x, const int64_t x_strides[3],
    void* y, const int64_t y_strides[3],
    int64_t outer, int64_t dim, int64_t inner,
    softlight_dtype dtype, const softlight_forward_options* options, void* stream);

/* softlight_log_softmax_forward_3d on the CPU (host memory). */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_3d_cpu(
    const void* x, const int64_t x_strides[3],
    void* y, const int64_t y_strides[3],
    int64_t outer, int64_t dim, int64_t inner,
    softlight_dtype dtype, const softlight_forward_options* options, int num_threads);

/*
 * The gradient of log-softmax: given dy (the gradient of the loss with respect to y) and y (the
 * forward's output), for every row
 *     dx[r, :] = dy[r, :] - exp(y[r, :]) * sum_j dy[r, j]
 * accumulated as the forward is. One read of dy and y and one write of dx where the row allows
 * (docs/design.md). dx may be dy or y itself (same strides); any other overlap of dx with an input
 * is refused. The temperature of the forward is not an input: for y = log_softmax(x / T), scale
 * the result by 1 / T.
 */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward(
    const void* dy, int64_t dy_row_stride,
    const void* y, int64_t y_row_stride,
    void* dx, int64_t dx_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, void* stream);

/* softlight_log_softmax_backward on the CPU (host memory). */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward_cpu(
    const void* dy, int64_t dy_row_stride,
    const void* y, int64_t y_row_stride,
    void* dx, int64_t dx_row_stride,
    int64_t rows, int64_t cols,
    softlight_dtype dtype, int num_threads);

/* The backward along any axis, with the layouts of softlight_log_softmax_forward_3d. */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward_3d(
    const void* dy, const int64_t dy_strides[3],
    const void* y, const int64_t y_strides[3],
    void* dx, const int64_t dx_strides[3],
    int64_t outer, int64_t dim, int64_t inner,
    softlight_dtype dtype, void* stream);

/* softlight_log_softmax_backward_3d on the CPU (host memory). */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward_3d_cpu(
    const void* dy, const int64_t dy_strides[3],
    const void* y, const int64_t y_strides[3],
    void* dx, const int64_t dx_strides[3],
    int64_t outer, int64_t dim, int64_t inner,
    softlight_dtype dtype, int num_threads);

/*
 * N-d arrays: `shape` (ndim extents, ndim >= 0; NULL where ndim is 0) and, for each array, ndim
 * strides in elements; the softmax along axis `dim`, in [-ndim, ndim) (a 0-d array counts as one axis
 * of one element). The library merges the axes before dim into one and those after it into another
 * (axes of extent 1 take no part) and computes the 3-d form above, with its rules; where either
 * group is not one evenly strided run, or a stride of an axis longer than 1 is negative, it returns
 * SOFTLIGHT_ERROR_UNMERGED_LAYOUT and writes nothing (a contiguous copy of such an array is computed).
 * Every array has the shape `shape`. This is the form the Python, torch and JAX bindings call.
 */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_nd(
    const void* x, const int64_t* x_strides,
    void* y, const int64_t* y_strides,
    const int64_t* shape, int ndim, int64_t dim,
    softlight_dtype dtype, const softlight_forward_options* options, void* stream);

/* softlight_log_softmax_forward_nd on the CPU (host memory). */
SOFTLIGHT_API softlight_status softlight_log_softmax_forward_nd_cpu(
    const void* x, const int64_t* x_strides,
    void* y, const int64_t* y_strides,
    const int64_t* shape, int ndim, int64_t dim,
    softlight_dtype dtype, const softlight_forward_options* options, int num_threads);

/* The backward along axis dim of N-d arrays, as softlight_log_softmax_forward_nd takes them. */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward_nd(
    const void* dy, const int64_t* dy_strides,
    const void* y, const int64_t* y_strides,
    void* dx, const int64_t* dx_strides,
    const int64_t* shape, int ndim, int64_t dim,
    softlight_dtype dtype, void* stream);

/* softlight_log_softmax_backward_nd on the CPU (host memory). */
SOFTLIGHT_API softlight_status softlight_log_softmax_backward_nd_cpu(
    const void* dy, const int64_t* dy_strides,
    const void* y, const int64_t* y_strides,
    void* dx, const int64_t* dx_strides,
    const int64_t* shape, int ndim, int64_t dim,
    softlight_dtype dtype, int num_threads);

/*
 * The 3-d form the N-d entries compute for one array: extents n = {outer, dim, inner} and strides
 * s, or the status they would return (SOFTLIGHT_ERROR_INVALID_AXIS, SOFTLIGHT_ERROR_UNMERGED_LAYOUT,
 * and NULL_POINTER or INVALID_SIZE for a missing or negative shape). Writes nothing to any array.
 */
SOFTLIGHT_API softlight_status softlight_layout_nd(const int64_t* shape, const int64_t* strides, int ndim, int64_t dim,
                                                   int64_t n[3], int64_t s[3]);


/*
 * Consumers of a row's log-sum-exp: cross-entropy, the log-probabilities of chosen tokens, entropy
 * and the log-sum-exp itself, from one read of each row and without a row-sized output
 * (docs/consumers.md). Rows are contiguous, `x_row_stride` elements apart (at least cols where rows
 * > 1); z = x / temperature. Statistics and losses are of the accumulation type (float32 for
 * float32/float16/bfloat16, float64 for float64). Token indices are int64 in the memory x lives in.
 * Every check of the forward entries above applies; on the CPU an index outside the row (where the
 * options do not allow it) is INVALID_ARGUMENT with nothing written.
 */

/*
 * Chosen tokens of each row (optional: ids NULL and count 0 for none).
 *   ids:        rows x count token ids, row r's at ids + r * row_stride (row_stride >= count where
 *               rows > 1).
 *   offset:     the token of column j is offset + j (a shard of a vocabulary split over devices
 *               starts at its first token's id; 0 otherwise); not negative.
 *   shard:      nonzero: a token outside [offset, offset + cols) picks nothing (another shard holds
 *               it); zero: it is INVALID_ARGUMENT.
 */
typedef struct softlight_tokens {
  const int64_t* ids;
  int64_t count;
  int64_t row_stride;
  int64_t offset;
  int shard;
} softlight_tokens;

/*
 * What softlight_row_stats_cpu computes. Zero-initialise, then set what you need. Each output is
 * NULL (not wanted) or `rows` values (picked and logprobs: rows * index.count, row-major),
 * contiguous, overlapping neither x, the indices nor each other.
 *   lse       log(sum_j exp(z_j)); -inf for a row of all -inf, NaN for a row holding NaN or +inf.
 *   entropy   -sum_j p_j log p_j with p = softmax(z) (NaN where lse is not finite).
 *   logprobs  z[token] - lse for each index (0 for a token outside a shard).
 *   picked    z[token] for each index (0 for a token outside a shard).
 *   sum       sum_j z_j (label smoothing's term).
 *   max, sumexp, moment: m = max_j z_j, s = sum_j exp(z_j - m), t = sum_j exp(z_j - m) (z_j - m):
 *             what merges the statistics of shards (lse = m + log s, entropy = log s - t / s).
 */
typedef struct softlight_row_stats_options {
  double temperature;
  softlight_tokens index;
  void* lse;
  void* entropy;
  void* logprobs;
  void* picked;
  void* sum;
  void* max;
  void* sumexp;
  void* moment;
} softlight_row_stats_options;

/* Row statistics of x in one read (`options` must not be NULL), on the GPU that holds x, queued on
 * `stream`. Token ids are device memory and are not read by the checks: a token outside the row
 * (where `shard` is zero) gives NaN for what it picks. */
SOFTLIGHT_API softlight_status softlight_row_stats(
    const void* x, int64_t x_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_row_stats_options* options, void* stream);

/* The same on the CPU (host memory); a token outside the row is INVALID_ARGUMENT there. */
SOFTLIGHT_API softlight_status softlight_row_stats_cpu(
    const void* x, int64_t x_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_row_stats_options* options, int num_threads);

/*
 * The gradient with respect to x of a loss that depends on x through row statistics, given the
 * loss's gradient with respect to each statistic (d_* each NULL for zero, else `rows` values of
 * the accumulation type; d_picked and d_logprobs rows * index.count), in one read of x from memory
 * and one write of dx. With p = softmax(z):
 *   dz_j = p_j (d_lse - sum_k d_logprobs_k - d_entropy (log p_j + entropy)) + d_sum
 *          + sum_k (d_picked_k + d_logprobs_k) [j == token_k],      dx = dz / temperature.
 * lse (required) and entropy (required with d_entropy) are the forward's, over the whole row (for a
 * shard: merged over all shards). dx
 * may be x itself (same stride); any other overlap is refused.
 */
typedef struct softlight_row_stats_grad {
  double temperature;
  softlight_tokens index;
  const void* lse;
  const void* entropy;
  const void* d_lse;
  const void* d_entropy;
  const void* d_logprobs;
  const void* d_picked;
  const void* d_sum;
} softlight_row_stats_grad;

/* On the GPU, queued on `stream` (at most 8192 tokens a row there: INVALID_ARGUMENT past it). */
SOFTLIGHT_API softlight_status softlight_row_stats_backward(
    const void* x, int64_t x_row_stride, void* dx, int64_t dx_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_row_stats_grad* grad, void* stream);

SOFTLIGHT_API softlight_status softlight_row_stats_backward_cpu(
    const void* x, int64_t x_row_stride, void* dx, int64_t dx_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_row_stats_grad* grad, int num_threads);

typedef enum softlight_reduction {
  SOFTLIGHT_REDUCTION_NONE = 0, /* one loss per row */
  SOFTLIGHT_REDUCTION_SUM = 1,  /* their sum */
  SOFTLIGHT_REDUCTION_MEAN = 2  /* their sum over the rows not ignored, divided by their count (NaN for none) */
} softlight_reduction;

/*
 * Cross-entropy of each row against its target class, torch.nn.functional.cross_entropy's:
 *   loss_r = (1 - eps) (lse - z[t]) + eps (lse - sum_j z_j / cols) + z_loss * lse^2
 * (eps: label_smoothing in [0, 1]; z_loss >= 0), 0 for a row whose target is ignore_index (where
 * `ignore` is nonzero), reduced as `reduction` says into `loss` (rows values for NONE, else one) of
 * the accumulation type. A target outside [0, cols) other than ignore_index is INVALID_ARGUMENT.
 * lse: optional, rows values. grad: optional, the gradient of the (reduced) loss with respect to x
 * for an upstream gradient of 1, written in the same pass while each row is in cache (one read of
 * x, one write of grad); it may be x itself (grad_row_stride equal to x_row_stride).
 */
typedef struct softlight_cross_entropy_options {
  double temperature;
  double label_smoothing;
  double z_loss;
  int ignore;
  int64_t ignore_index;
  softlight_reduction reduction;
  void* loss;
  void* lse;
  void* grad;
  int64_t grad_row_stride;
} softlight_cross_entropy_options;

/* On the GPU, queued on `stream`; target is device memory, and a target outside [0, cols) other
 * than ignore_index gives that row a NaN loss and a NaN gradient (and the reduced loss NaN). */
SOFTLIGHT_API softlight_status softlight_cross_entropy(
    const void* x, int64_t x_row_stride, const int64_t* target, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_cross_entropy_options* options, void* stream);

/* target: `rows` int64 class indices, contiguous (`options` must not be NULL; options->loss neither, but
 * for reduction NONE over no rows, a zero-size array). */
SOFTLIGHT_API softlight_status softlight_cross_entropy_cpu(
    const void* x, int64_t x_row_stride, const int64_t* target, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_cross_entropy_options* options, int num_threads);

/*
 * Scales, in place, the gradient that softlight_cross_entropy_cpu wrote for an upstream gradient of 1
 * (grad: rows x cols of dtype, rows grad_row_stride elements apart) by the loss's actual upstream
 * gradient d_loss: one value (a reduced loss) or `rows` values (reduction NONE), of the accumulation
 * type. A row whose factor is exactly 1 is neither read nor written: the backward of the loss itself
 * costs nothing. d_loss may not overlap grad.
 */
SOFTLIGHT_API softlight_status softlight_cross_entropy_grad_scale_cpu(
    void* grad, int64_t grad_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
    const void* d_loss, int64_t d_loss_count, int num_threads);

/* On the GPU, queued on `stream`: d_loss is device memory, read by the kernel (no synchronization). */
SOFTLIGHT_API softlight_status softlight_cross_entropy_grad_scale(
    void* grad, int64_t grad_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
    const void* d_loss, int64_t d_loss_count, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* SOFTLIGHT_SOFTLIGHT_H */
