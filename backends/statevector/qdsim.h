/* qdiff native statevector kernels: the C boundary (records, argument blocks, error codes).
 *
 * Everything Python passes to the kernels is declared here once. The Python side
 * (native_lib.py) mirrors qd_record as a numpy structured dtype and checks its size and field
 * offsets against qd_record_layout() when the library is loaded; the kernels validate every
 * index of every record (qd_validate, run before any state is touched) and return an error
 * code instead of reading or writing out of bounds.
 */
#ifndef QDSIM_H
#define QDSIM_H

#include <stdint.h>

#define QD_ABI_VERSION 7
#define QD_MAXK 6        /* target bits of one gate */
#define QD_MAXA 3        /* angles of one coded gate */
#define QD_MAXN 40       /* qubits of one state */

/* record kinds */
enum { QD_DENSE = 0, QD_DIAG = 1, QD_FLIP = 2, QD_SWAP = 3, QD_NKINDS };

/* precisions of states and gate data */
enum { QD_C128 = 0, QD_C64 = 1, QD_F64 = 2, QD_F32 = 3 };  /* real: qd_pauli_apply only */

/* error codes (qd_strerror names them) */
enum {
    QD_OK = 0, QD_ENOMEM, QD_EARGS, QD_EKIND, QD_EK, QD_EBITS, QD_ECMASK, QD_EDATA,
    QD_ECODE, QD_ECOLUMN, QD_ETRAIN, QD_ESLOT, QD_EDTYPE, QD_ENONFINITE, QD_NERRORS
};

/* One gate of a program.
 *  kind, k: QD_DENSE (2^k x 2^k matrix), QD_DIAG (2^k diagonal entries), QD_FLIP (X on every
 *     target), QD_SWAP (k == 2: exchange the two targets); 1 <= k <= QD_MAXK
 *  bits[0..k): target bit positions (< n, distinct; bits[0] is the most significant bit of the
 *     gate's local index)
 *  cmask: control bits (all must be 1 for the gate to act; disjoint from the targets)
 *  offset, stride: the gate's data in the data buffer, in complex numbers (stride: per binding,
 *     0 when all bindings share it)
 *  code, nangles, col, scale, shift, train: a coded gate (code != 0, no data) evaluates its
 *     matrix from nangles angles scale[j] * theta[b, col[j]] + shift[j] (col -1: the constant
 *     shift[j]); train is the mask of the angles whose gradient the adjoint sweep computes */
typedef struct {
    int32_t kind;
    int32_t k;
    int32_t bits[QD_MAXK];
    int64_t cmask;
    int64_t offset;
    int64_t stride;
    int32_t code;
    int32_t nangles;
    int64_t col[QD_MAXA];
    int32_t train;
    int32_t reserved;
    double scale[QD_MAXA];
    double shift[QD_MAXA];
} qd_record;

/* A program: nops records and their data (data_len complex numbers of the precision dtype). */
typedef struct {
    const qd_record *recs;
    int64_t nops;
    const void *data;
    int64_t data_len;
} qd_program;

/* Angles of coded gates: theta is rows x P float64 (rows 1: shared by the batch, or B),
 * row b at theta + b * P. */
typedef struct {
    const double *theta;
    int64_t rows;
    int64_t P;
} qd_angles;

/* qd_run: apply a program (or its inverse) to batch states of 2^n amplitudes, in place. */
typedef struct {
    int32_t dtype;
    int32_t n;
    int64_t batch;
    void *states;
    qd_program prog;
    qd_angles angles;
    int32_t dagger;
    int32_t from_zero;   /* the input is |0...0>, its content never read (uninitialised memory
                          * will do): a product prefix, or |0...0>, is written */
    int32_t nthreads;
    int32_t tiles;       /* 1: runs of gates on large states share passes in cache tiles */
    int64_t bad_record;  /* out: the record at fault when an error is returned (-1: none) */
} qd_run_args;

/* The adjoint sweeps: psi (final states) and lam (the cotangent state) are uncomputed gate by
 * gate from the last to the first.
 *  qd_adjoint_coded: the gradients of the coded gates' trainable angles are added to
 *     gtheta (batch x P float64); shared_cols (P entries, may be NULL) marks columns broadcast
 *     over the batch (only their column sum matters); lo: the sweep stops at record lo (0:
 *     psi is restored to the input state); ldiag (batch x 2^n reals, with lam NULL): lam is
 *     ldiag * psi, formed tile by tile, and psi is left untouched; with ldiag_bits = m > 0
 *     the diagonal is a sum of two, one over the high and one over the m low bits of x:
 *     ldiag[b, x >> m] + ldiag_lo[b, x & (2^m - 1)] (ldiag batch x 2^(n-m), ldiag_lo batch x 2^m).
 *  qd_adjoint_slots: gates given as data; slot s (a record of kind DENSE or DIAG with dU as
 *     data, slot_op[s] its gate, ascending) gets grads[b, s] = 2 Re <lam| dU_s |psi>. */
typedef struct {
    int32_t dtype;
    int32_t n;
    int64_t batch;
    void *psi;
    void *lam;
    qd_program prog;
    qd_angles angles;
    double *gtheta;
    const int64_t *shared_cols;
    int64_t lo;
    const void *ldiag;   /* real, of the precision dtype */
    qd_program slots;
    const int64_t *slot_op;
    double *grads;
    int32_t nthreads;
    int32_t tiles;
    int64_t bad_record;  /* out: the record (slots: nops + slot) at fault, -1: none */
    const void *ldiag_lo;  /* with ldiag_bits > 0: the low bits' part of the diagonal */
    int64_t ldiag_bits;    /* 0: ldiag is the whole diagonal */
} qd_adjoint_args;

/* qd_batch_run / qd_batch_adjoint: a batch of small states (n <= QD_BATCH_MAXN) in the lane
 * layout (qdsim_batch.h), angles gathered from the argument tensors, Z-word outputs.
 *  theta[b, j] = scale[b, j] * src(idx[b, j]) + offset[b, j] (scale and offset B x P or both
 *     NULL: 1 and 0), src(x) the x-th element of the concatenation of the nsrc float64 sources
 *     (src[s]: src_len[s] elements); every angle must be finite (QD_ENONFINITE)
 *  outputs: out[b, k] = coeffs[k] <psi_b| Z on the bits of words[k] |psi_b> (B x K)
 *  psi: ceil(B / lanes) * lanes * 2^n complex numbers of the precision dtype: written by the
 *     run (the final states, lane layout), read and overwritten by the adjoint
 *  adjoint: cot (B x K) the outputs' cotangent; the gradient of every source element (records'
 *     train masks) is written into gout[s] (src_len[s] float64, zeroed first; NULL: not
 *     wanted) */
#define QD_BATCH_MAXN 16
#define QD_BATCH_MAXW 512  /* lanes: a multiple of 8, at most this */
typedef struct {
    int32_t dtype;
    int32_t n;
    int64_t batch;
    qd_program prog;
    int64_t P;
    const int64_t *idx;
    const double *scale;
    const double *offset;
    const double *const *src;
    const int64_t *src_len;
    int32_t nsrc;
    int32_t nthreads;
    int64_t K;
    const int64_t *words;
    const double *coeffs;
    double *out;
    void *psi;
    int64_t lanes;
    const double *cot;
    double *const *gout;
    double *theta;        /* optional: ceil(B / lanes) * lanes x P scratch for the angles */
    int32_t theta_ready;  /* theta holds this call's angles (the run's, for its adjoint) */
    int32_t reserved;
    const int8_t *cshared;  /* optional, P flags: column j reads one source element in every
                               row (idx, scale and offset the same); computed when NULL */
    int64_t bad_record;
} qd_batch_args;

int qd_abi_version(void);
int qd_record_layout(char *buf, int cap);  /* "size;name:offset:bytes;..." of qd_record */
void qd_args_sizes(int64_t out[4]);        /* sizeof qd_program, qd_angles, qd_run_args, qd_adjoint_args */
const char *qd_strerror(int code);
int qd_gate_code(const char *formula);  /* 0: no such formula */
int qd_code_info(int code, int32_t *kind, int32_t *k, int32_t *nangles);
int qd_run(qd_run_args *a);
int qd_adjoint_coded(qd_adjoint_args *a);
int qd_adjoint_slots(qd_adjoint_args *a);
int qd_abs2(int32_t dtype, const void *s, void *out, int64_t count);
/* |s|^2 of B states of 2^n amplitudes summed to the high bits (hi: B x 2^(n - lb)) and to the
 * lb low bits (lo: B x 2^lb), the states' real type; the same bits for any nthreads */
int qd_zmarginals(int32_t dtype, const void *s, int64_t B, int32_t n, int32_t lb, void *hi,
                  void *lo, int32_t nthreads);
/* out[b, i] (+= when accumulate) sum_g D_g[i] x[b, i ^ masks[g]] for B states of 2^n
 * amplitudes (dtype QD_C128/QD_C64, or QD_F64/QD_F32 with a real d) and G flip groups; D_g is
 * row drow[g] of d (D x 2^n, the states' real type, or complex when dcomplex), or the constant
 * consts[g] where drow[g] < 0; out must not be x; the same bits for any nthreads */
int qd_pauli_apply(int32_t dtype, const void *x, int64_t B, int32_t n, int64_t G,
                   const int64_t *masks, const int64_t *drow, int64_t D, const void *d,
                   const void *consts, int32_t dcomplex, void *out, int32_t accumulate,
                   int32_t nthreads);
int64_t qd_scratch_release(void);  /* free the scratch kept between calls */
int64_t qd_scratch_held(void);     /* bytes of scratch kept between calls */
int64_t qd_batch_args_size(void);
int qd_batch_run(qd_batch_args *a);
int qd_batch_adjoint(qd_batch_args *a);

#endif
