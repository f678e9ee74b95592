/* qdiff native CPU statevector kernels (optional fast path of qdiff.backends.native).
 *
 * A state batch is B contiguous vectors of N = 2^n complex numbers (interleaved re, im),
 * wire 0 the most significant bit, exactly torch's (B, 2**n) complex layout. A circuit arrives
 * as a program: one record of REC int64 per gate and one buffer of complex gate data, so a whole
 * forward pass (or a whole adjoint sweep) is ONE call with no Python or dispatch per gate.
 *
 * Record fields:
 *   [0] kind: 0 dense 2^k x 2^k matrix, 1 diagonal of 2^k entries, 2 flip (X on the k targets),
 *       3 swap (exchange target 0 and target 1)
 *   [1] k, the number of target bits (1..MAXK)
 *   [2..2+MAXK) target bit positions (target 0 is the most significant bit of the local index)
 *   [8] control mask: bits that must be 1 for the gate to act
 *   [9] offset of the gate's data in the data buffer (complex numbers)
 *   [10] batch stride of the data (complex numbers; 0 when all bindings share it)
 *   [11] gate code: 0 for data given in the buffer; otherwise a parametric gate whose matrix
 *        (kind [0]) the kernels evaluate from the angles themselves (see gate_eval)
 *   [12] number of angles of a coded gate (1..3)
 *   [13..16) theta column of each angle (-1: a constant angle)
 *   [16] bit mask of the angles whose gradient the adjoint sweep computes
 * A coded gate's data is one complex number per angle, (scale, offset): angle =
 * scale * theta[b, column] + offset. Its matrix and derivatives are evaluated once per binding
 * and kept while the angles stay the same (a weight shared by the batch: once per call).
 *
 * Every kernel walks groups of 2^k amplitudes that differ only in the target bits; the loop
 * over the lowest free bits is innermost and contiguous, so the compiler vectorises it
 * (uncontrolled one-qubit gates, their overlaps and singly-controlled X use block loops with
 * compile-time widths instead). Large states are processed in cache-sized chunks: runs of
 * gates whose bits all lie below CHUNK_BITS are applied chunk by chunk, one pass over memory
 * for the whole run. Small states are processed in batch tiles of up to 2^TILE_BITS
 * amplitudes: a gate with the same matrix for every binding applies to the tile at once.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID omp_get_thread_num()
#else
#define THREAD_ID 0
#endif

typedef int64_t i64;

#define REC 17
#define MAXK 6
#define CHUNK_BITS 12

enum { K_DENSE = 0, K_DIAG = 1, K_FLIP = 2, K_SWAP = 3 };
enum { C_NONE = 0, C_RX, C_RY, C_RZ, C_PHASE, C_ROT, C_RXX, C_RYY, C_RZZ, C_SEXC, C_MRZ, C_DEXC };

typedef struct {
    int kind, k, nspecial;
    i64 cmask, tmask;
    i64 off[1 << MAXK];  /* offset of local index m from the group base */
    int special[MAXK + 64]; /* sorted bit positions of targets and controls */
    const double *data;
    i64 stride;
    int code, np, tmask_p;  /* coded gates: code, number of angles, trainable-angle mask */
    i64 col[3];
    double scale[3], shift[3];
    i64 usize;              /* doubles of one matrix (or diagonal) of this gate */
    int uniform;            /* the same matrix for every binding of the call */
    int gshared;            /* uniform, and its trainable angles' columns are batch-shared */
} gate_t;

static void decode(const i64 *r, const double *data, gate_t *g) {
    g->kind = (int)r[0];
    g->k = (int)r[1];
    g->cmask = r[8];
    g->data = data + 2 * r[9];
    g->stride = r[10];
    g->tmask = 0;
    for (int j = 0; j < g->k; j++) g->tmask |= (i64)1 << r[2 + j];
    for (i64 m = 0; m < ((i64)1 << g->k); m++) {
        i64 o = 0;
        for (int j = 0; j < g->k; j++)
            if ((m >> (g->k - 1 - j)) & 1) o |= (i64)1 << r[2 + j];
        g->off[m] = o;
    }
    i64 all = g->tmask | g->cmask;
    g->nspecial = 0;
    for (int p = 0; p < 63; p++)
        if ((all >> p) & 1) g->special[g->nspecial++] = p;
    g->code = (int)r[11];
    g->np = g->code ? (int)r[12] : 0;
    g->tmask_p = (int)r[16];
    for (int j = 0; j < g->np; j++) {
        g->col[j] = r[13 + j];
        g->scale[j] = g->data[2 * j];
        g->shift[j] = g->data[2 * j + 1];
    }
    i64 d = (i64)1 << g->k;
    g->usize = 2 * (g->kind == K_DIAG ? d : d * d);
}

/* ---------------------------------------------------------------------------------------- */
/* coded gates: matrices and derivatives from the angles                                      */

#define SET(u, e, re, im) do { (u)[2 * (e)] = (re); (u)[2 * (e) + 1] = (im); } while (0)

/* U(a) of a coded gate into u (g->usize doubles). */
static void gate_eval(const gate_t *g, const double *a, double *u) {
    memset(u, 0, sizeof(double) * g->usize);
    double c = cos(0.5 * a[0]), s = sin(0.5 * a[0]);
    switch (g->code) {
    case C_RX: SET(u, 0, c, 0); SET(u, 1, 0, -s); SET(u, 2, 0, -s); SET(u, 3, c, 0); break;
    case C_RY: SET(u, 0, c, 0); SET(u, 1, -s, 0); SET(u, 2, s, 0); SET(u, 3, c, 0); break;
    case C_RZ: SET(u, 0, c, -s); SET(u, 1, c, s); break;
    case C_PHASE: SET(u, 0, 1, 0); SET(u, 1, cos(a[0]), sin(a[0])); break;
    case C_ROT: {  /* RZ(omega) RY(theta) RZ(phi), angles (phi, theta, omega) */
        double ct = cos(0.5 * a[1]), st = sin(0.5 * a[1]);
        double ap = -0.5 * (a[0] + a[2]), bp = 0.5 * (a[0] - a[2]);
        double ar = cos(ap), ai = sin(ap), br = cos(bp), bi = sin(bp);
        SET(u, 0, ar * ct, ai * ct); SET(u, 1, -br * st, -bi * st);
        SET(u, 2, br * st, -bi * st); SET(u, 3, ar * ct, -ai * ct);
        break;
    }
    case C_RXX:
        SET(u, 0, c, 0); SET(u, 5, c, 0); SET(u, 10, c, 0); SET(u, 15, c, 0);
        SET(u, 3, 0, -s); SET(u, 6, 0, -s); SET(u, 9, 0, -s); SET(u, 12, 0, -s);
        break;
    case C_RYY:
        SET(u, 0, c, 0); SET(u, 5, c, 0); SET(u, 10, c, 0); SET(u, 15, c, 0);
        SET(u, 3, 0, s); SET(u, 6, 0, -s); SET(u, 9, 0, -s); SET(u, 12, 0, s);
        break;
    case C_RZZ: SET(u, 0, c, -s); SET(u, 1, c, s); SET(u, 2, c, s); SET(u, 3, c, -s); break;
    case C_SEXC:
        SET(u, 0, 1, 0); SET(u, 5, c, 0); SET(u, 6, -s, 0); SET(u, 9, s, 0); SET(u, 10, c, 0);
        SET(u, 15, 1, 0);
        break;
    case C_MRZ: {
        i64 d = (i64)1 << g->k;
        for (i64 m = 0; m < d; m++) {
            if (__builtin_popcountll((unsigned long long)m) & 1) SET(u, m, c, s);
            else SET(u, m, c, -s);
        }
        break;
    }
    case C_DEXC:
        for (int m = 0; m < 16; m++) SET(u, 17 * m, 1, 0);
        SET(u, 3 * 16 + 3, c, 0); SET(u, 12 * 16 + 12, c, 0);
        SET(u, 3 * 16 + 12, -s, 0); SET(u, 12 * 16 + 3, s, 0);
        break;
    }
}

/* dU/da_j. Products of Pauli rotations exp(-i a P / 2): dU/da_j = U(a_j + pi) / 2. */
static void gate_deriv(const gate_t *g, const double *a, int j, double *du) {
    double c = cos(0.5 * a[0]), s = sin(0.5 * a[0]);
    switch (g->code) {
    case C_PHASE:
        memset(du, 0, sizeof(double) * g->usize);
        SET(du, 1, -sin(a[0]), cos(a[0]));
        return;
    case C_SEXC:
        memset(du, 0, sizeof(double) * g->usize);
        SET(du, 5, -0.5 * s, 0); SET(du, 6, -0.5 * c, 0); SET(du, 9, 0.5 * c, 0);
        SET(du, 10, -0.5 * s, 0);
        return;
    case C_DEXC:
        memset(du, 0, sizeof(double) * g->usize);
        SET(du, 3 * 16 + 3, -0.5 * s, 0); SET(du, 12 * 16 + 12, -0.5 * s, 0);
        SET(du, 3 * 16 + 12, -0.5 * c, 0); SET(du, 12 * 16 + 3, 0.5 * c, 0);
        return;
    default: {
        double b[3] = {a[0], g->np > 1 ? a[1] : 0, g->np > 2 ? a[2] : 0};
        b[j] += 3.14159265358979323846;
        gate_eval(g, b, du);
        for (i64 e = 0; e < g->usize; e++) du[e] *= 0.5;
    }
    }
}

/* Workspace of one coded gate for one thread: [angles (3), state (1), U, dU_0 .. dU_{np-1}].
 * state: 0 empty, 1 U valid, 2 U and the derivatives valid, for the stored angles. */
static i64 ws_size(const gate_t *g) { return g->code ? 4 + g->usize * (1 + g->np) : 0; }

static const double *coded_data(const gate_t *g, double *w, const double *theta, i64 tstride,
                                i64 b, int deriv) {
    double a[3] = {0, 0, 0};
    for (int j = 0; j < g->np; j++)
        a[j] = (g->col[j] >= 0 ? g->scale[j] * theta[b * tstride + g->col[j]] : 0.0) + g->shift[j];
    int same = 1;
    for (int j = 0; j < g->np; j++) same &= (a[j] == w[j]);
    int have = same ? (int)w[3] : 0;
    if (have < 1) gate_eval(g, a, w + 4);
    if (deriv && have < 2)
        for (int j = 0; j < g->np; j++) gate_deriv(g, a, j, w + 4 + g->usize * (1 + j));
    if (have < 1 + deriv) {
        for (int j = 0; j < g->np; j++) w[j] = a[j];
        w[3] = 1 + deriv;
    }
    return w + 4;
}

/* Group base for free index j: insert zeros at the special bits, then set the controls. */
static inline i64 group_base(const gate_t *g, i64 j) {
    for (int s = 0; s < g->nspecial; s++) {
        int p = g->special[s];
        j = ((j >> p) << (p + 1)) | (j & (((i64)1 << p) - 1));
    }
    return j | g->cmask;
}

/* ---------------------------------------------------------------------------------------- */
/* kernels                                                                                   */

#define FOR_GROUPS_(g, nbits, PRAGMA, ...)                                                     \
    do {                                                                                       \
        i64 ngroups_ = (i64)1 << ((nbits) - (g)->nspecial);                                    \
        int pmin_ = (g)->nspecial ? (g)->special[0] : 0;                                       \
        i64 inner_ = (i64)1 << pmin_;                                                          \
        if (inner_ > ngroups_) inner_ = ngroups_;                                              \
        if (inner_ >= 4) {                                                                     \
            i64 nout_ = ngroups_ / inner_;                                                     \
            PRAGMA                                                                             \
            for (i64 o_ = 0; o_ < nout_; o_++) {                                               \
                i64 base0_ = group_base(g, o_ * inner_);                                       \
                for (i64 l_ = 0; l_ < inner_; l_++) {                                          \
                    i64 base = base0_ + l_;                                                    \
                    __VA_ARGS__                                                                \
                }                                                                              \
            }                                                                                  \
        } else {                                                                               \
            /* lowest special bit 0 or 1: runs of groups strided by 2^(pmin+1) up to the    */ \
            /* next special bit                                                              */ \
            int s1_ = (g)->nspecial > 1 ? (g)->special[1] : (nbits);                           \
            i64 run_ = (i64)1 << (s1_ - pmin_ - 1);                                            \
            if (run_ * inner_ > ngroups_) run_ = ngroups_ / inner_;                            \
            const i64 step_ = (i64)2 << pmin_;                                                 \
            if (run_ >= 4) {                                                                   \
                i64 nout_ = ngroups_ / (run_ * inner_);                                        \
                PRAGMA                                                                         \
                for (i64 o_ = 0; o_ < nout_; o_++) {                                           \
                    i64 base0_ = group_base(g, o_ * run_ * inner_);                            \
                    for (i64 lo_ = 0; lo_ < inner_; lo_++)                                     \
                        for (i64 l_ = 0; l_ < run_; l_++) {                                    \
                            i64 base = base0_ + lo_ + l_ * step_;                              \
                            __VA_ARGS__                                                        \
                        }                                                                      \
                }                                                                              \
            } else {                                                                           \
                PRAGMA                                                                         \
                for (i64 j_ = 0; j_ < ngroups_; j_++) {                                        \
                    i64 base = group_base(g, j_);                                              \
                    __VA_ARGS__                                                                \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)

/* Run BODY for every group base: the innermost loop runs over contiguous amplitudes when the
 * lowest special bit is >= 2 (vectorised), otherwise one flat loop over groups. The parallel
 * variant splits the loop over par_ threads (one large state). */
#define FOR_GROUPS(g, nbits, ...) FOR_GROUPS_(g, nbits, , __VA_ARGS__)
#define FOR_GROUPS_PAR(g, nbits, ...)                                                          \
    FOR_GROUPS_(g, nbits, _Pragma("omp parallel for num_threads(par_) schedule(static)"),      \
                __VA_ARGS__)
#define FOR_GROUPS_ANY(g, nbits, ...)                                                          \
    do {                                                                                       \
        if (par_ > 1) FOR_GROUPS_PAR(g, nbits, __VA_ARGS__);                                   \
        else FOR_GROUPS(g, nbits, __VA_ARGS__);                                                \
    } while (0)

#define RE(p, i) (p)[2 * (i)]
#define IM(p, i) (p)[2 * (i) + 1]

/* The matrix (or diagonal) to apply: u itself, or its adjoint written into buf. */
static const double *effective(const gate_t *g, const double *u, int dag, double *buf) {
    if (!dag || g->kind == K_FLIP || g->kind == K_SWAP) return u;
    int d = 1 << g->k;
    if (g->kind == K_DIAG) {
        for (int m = 0; m < d; m++) { buf[2 * m] = u[2 * m]; buf[2 * m + 1] = -u[2 * m + 1]; }
        return buf;
    }
    for (int r = 0; r < d; r++)
        for (int c = 0; c < d; c++) {
            buf[2 * (r * d + c)] = u[2 * (c * d + r)];
            buf[2 * (r * d + c) + 1] = -u[2 * (c * d + r) + 1];
        }
    return buf;
}

/* A one-qubit matrix on bit p without controls: the two amplitudes of a
 * pair are W = 2^(p+1) doubles apart inside blocks of 2W doubles. With W a compile-time
 * constant (p <= 7) the body is unrolled and vectorised over the block (the group loops
 * would walk such short runs one complex number at a time). */
#define BLOCK_1Q(W, BODY)                                                                      \
    do {                                                                                       \
        for (i64 j = 0; j < nblk; j++) {                                                       \
            double *restrict x = s + 2 * (W) * j, *restrict y = x + (W);                       \
            for (int e = 0; e < (W); e += 2) {                                                 \
                double a0r = x[e], a0i = x[e + 1], a1r = y[e], a1i = y[e + 1];                 \
                BODY                                                                           \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#define DENSE_1Q_BODY                                                                          \
    x[e] = m00r * a0r - m00i * a0i + m01r * a1r - m01i * a1i;                                  \
    x[e + 1] = m00r * a0i + m00i * a0r + m01r * a1i + m01i * a1r;                              \
    y[e] = m10r * a0r - m10i * a0i + m11r * a1r - m11i * a1i;                                  \
    y[e + 1] = m10r * a0i + m10i * a0r + m11r * a1i + m11i * a1r;
#define DIAG_1Q_BODY                                                                           \
    x[e] = d0r * a0r - d0i * a0i; x[e + 1] = d0r * a0i + d0i * a0r;                            \
    y[e] = d1r * a1r - d1i * a1i; y[e + 1] = d1r * a1i + d1i * a1r;

static void dense_1q_low(double *restrict s, int nbits, int p, const double *u) {
    const double m00r = u[0], m00i = u[1], m01r = u[2], m01i = u[3];
    const double m10r = u[4], m10i = u[5], m11r = u[6], m11i = u[7];
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    switch (p) {
    case 0: BLOCK_1Q(2, DENSE_1Q_BODY); break;
    case 1: BLOCK_1Q(4, DENSE_1Q_BODY); break;
    case 2: BLOCK_1Q(8, DENSE_1Q_BODY); break;
    case 3: BLOCK_1Q(16, DENSE_1Q_BODY); break;
    case 4: BLOCK_1Q(32, DENSE_1Q_BODY); break;
    case 5: BLOCK_1Q(64, DENSE_1Q_BODY); break;
    case 6: BLOCK_1Q(128, DENSE_1Q_BODY); break;
    case 7: BLOCK_1Q(256, DENSE_1Q_BODY); break;
    default: { const int wd = 2 << p; BLOCK_1Q(wd, DENSE_1Q_BODY); }
    }
}

static void diag_1q_low(double *restrict s, int nbits, int p, const double *u) {
    const double d0r = u[0], d0i = u[1], d1r = u[2], d1i = u[3];
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    switch (p) {
    case 0: BLOCK_1Q(2, DIAG_1Q_BODY); break;
    case 1: BLOCK_1Q(4, DIAG_1Q_BODY); break;
    case 2: BLOCK_1Q(8, DIAG_1Q_BODY); break;
    case 3: BLOCK_1Q(16, DIAG_1Q_BODY); break;
    case 4: BLOCK_1Q(32, DIAG_1Q_BODY); break;
    case 5: BLOCK_1Q(64, DIAG_1Q_BODY); break;
    case 6: BLOCK_1Q(128, DIAG_1Q_BODY); break;
    case 7: BLOCK_1Q(256, DIAG_1Q_BODY); break;
    default: { const int wd = 2 << p; BLOCK_1Q(wd, DIAG_1Q_BODY); }
    }
}

/* X on bit p with at most one control bit c (-1: none), in the block layout: swap the two
 * halves of each block whose control is set, as contiguous runs of doubles. */
static void swap_run(double *restrict x, double *restrict y, i64 len) {
    for (i64 e = 0; e < len; e++) {
        double t = x[e];
        x[e] = y[e];
        y[e] = t;
    }
}

static void flip_1q_low(double *s, int nbits, int p, int c) {
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    const i64 w = (i64)2 << p;  /* doubles per half block */
    if (c < 0 || c > p) {
        const i64 cb = c < 0 ? 0 : (i64)1 << (c - p - 1);
        for (i64 j = 0; j < nblk; j++)
            if (!cb || (j & cb)) swap_run(s + 2 * w * j, s + 2 * w * j + w, w);
        return;
    }
    const i64 run = (i64)2 << c;  /* doubles: 2^c amplitudes with the control set */
    for (i64 j = 0; j < nblk; j++)
        for (i64 r = run; r < w; r += 2 * run) swap_run(s + 2 * w * j + r, s + 2 * w * j + w + r, run);
}

/* Apply gate g with data u (this binding's) to the 2^nbits amplitudes at st. */
static void apply_range(double *st, int nbits, const gate_t *g, const double *u_in, int dag,
                        int par_) {
    double buf[2 << (2 * MAXK)];
    const double *u = effective(g, u_in, dag, buf);
    double *restrict s = st;
    if (g->kind == K_FLIP && g->k == 1 && par_ <= 1 && __builtin_popcountll(g->cmask) <= 1) {
        int p = __builtin_ctzll(g->tmask), c = g->cmask ? __builtin_ctzll(g->cmask) : -1;
        if (nbits > p && nbits > c && (c < 0 || c > p || c >= 2)) {  /* runs of >= 4 amps */
            flip_1q_low(s, nbits, p, c);
            return;
        }
    }
    if (g->k == 1 && g->cmask == 0 && par_ <= 1 && nbits > g->special[0] &&
        (g->kind == K_DENSE || g->kind == K_DIAG)) {
        if (g->kind == K_DENSE) dense_1q_low(s, nbits, g->special[0], u);
        else diag_1q_low(s, nbits, g->special[0], u);
        return;
    }
    if (g->kind == K_DENSE && g->k == 1) {
        const i64 o1 = g->off[1];
        const double m00r = u[0], m00i = u[1], m01r = u[2], m01i = u[3];
        const double m10r = u[4], m10i = u[5], m11r = u[6], m11i = u[7];
        FOR_GROUPS_ANY(g, nbits, {
            double a0r = RE(s, base), a0i = IM(s, base);
            double a1r = RE(s, base + o1), a1i = IM(s, base + o1);
            RE(s, base) = m00r * a0r - m00i * a0i + m01r * a1r - m01i * a1i;
            IM(s, base) = m00r * a0i + m00i * a0r + m01r * a1i + m01i * a1r;
            RE(s, base + o1) = m10r * a0r - m10i * a0i + m11r * a1r - m11i * a1i;
            IM(s, base + o1) = m10r * a0i + m10i * a0r + m11r * a1i + m11i * a1r;
        });
    } else if (g->kind == K_DENSE && g->k == 2) {
        /* two-qubit gates (Ising, Givens, iSWAP, ...): a fixed 4x4 body the compiler vectorises
         * over the contiguous amplitudes, instead of the generic loops */
        const i64 o1 = g->off[1], o2 = g->off[2], o3 = g->off[3];
        double mr[16], mi[16];
        for (int e = 0; e < 16; e++) { mr[e] = u[2 * e]; mi[e] = u[2 * e + 1]; }
        FOR_GROUPS_ANY(g, nbits, {
            double ar[4], ai[4];
            ar[0] = RE(s, base); ai[0] = IM(s, base);
            ar[1] = RE(s, base + o1); ai[1] = IM(s, base + o1);
            ar[2] = RE(s, base + o2); ai[2] = IM(s, base + o2);
            ar[3] = RE(s, base + o3); ai[3] = IM(s, base + o3);
            double yr[4], yi[4];
            for (int r = 0; r < 4; r++) {
                yr[r] = mr[4 * r] * ar[0] - mi[4 * r] * ai[0] + mr[4 * r + 1] * ar[1]
                      - mi[4 * r + 1] * ai[1] + mr[4 * r + 2] * ar[2] - mi[4 * r + 2] * ai[2]
                      + mr[4 * r + 3] * ar[3] - mi[4 * r + 3] * ai[3];
                yi[r] = mr[4 * r] * ai[0] + mi[4 * r] * ar[0] + mr[4 * r + 1] * ai[1]
                      + mi[4 * r + 1] * ar[1] + mr[4 * r + 2] * ai[2] + mi[4 * r + 2] * ar[2]
                      + mr[4 * r + 3] * ai[3] + mi[4 * r + 3] * ar[3];
            }
            RE(s, base) = yr[0]; IM(s, base) = yi[0];
            RE(s, base + o1) = yr[1]; IM(s, base + o1) = yi[1];
            RE(s, base + o2) = yr[2]; IM(s, base + o2) = yi[2];
            RE(s, base + o3) = yr[3]; IM(s, base + o3) = yi[3];
        });
    } else if (g->kind == K_DENSE) {
        /* k >= 3: only the rows that differ from the identity, only their nonzero entries
         * (a DoubleExcitation touches 2 of its 16 amplitudes: 4 products, not 256) */
        const int d = 1 << g->k;
        int nact = 0, ptr[(1 << MAXK) + 1], rows[1 << MAXK], cols[1 << (2 * MAXK)];
        double vr[1 << (2 * MAXK)], vi[1 << (2 * MAXK)];
        int nnz = 0;
        ptr[0] = 0;
        for (int r = 0; r < d; r++) {
            int start = nnz, ident = 1;
            for (int c = 0; c < d; c++) {
                double re = u[2 * (r * d + c)], im = u[2 * (r * d + c) + 1];
                if (re != 0.0 || im != 0.0) {
                    cols[nnz] = c; vr[nnz] = re; vi[nnz] = im; nnz++;
                    if (c != r || re != 1.0 || im != 0.0) ident = 0;
                } else if (c == r) {
                    ident = 0;
                }
            }
            if (ident) { nnz = start; continue; }
            rows[nact++] = r;
            ptr[nact] = nnz;
        }
        if (nact == 0) return;
        FOR_GROUPS_ANY(g, nbits, {
            double xr[1 << MAXK], xi[1 << MAXK], yr[1 << MAXK], yi[1 << MAXK];
            for (int m = 0; m < d; m++) { xr[m] = RE(s, base + g->off[m]); xi[m] = IM(s, base + g->off[m]); }
            for (int a = 0; a < nact; a++) {
                double ar = 0, ai = 0;
                for (int e = ptr[a]; e < ptr[a + 1]; e++) {
                    ar += vr[e] * xr[cols[e]] - vi[e] * xi[cols[e]];
                    ai += vr[e] * xi[cols[e]] + vi[e] * xr[cols[e]];
                }
                yr[a] = ar; yi[a] = ai;
            }
            for (int a = 0; a < nact; a++) {
                RE(s, base + g->off[rows[a]]) = yr[a];
                IM(s, base + g->off[rows[a]]) = yi[a];
            }
        });
    } else if (g->kind == K_DIAG && g->k == 1) {
        const i64 o1 = g->off[1];
        const double d0r = u[0], d0i = u[1], d1r = u[2], d1i = u[3];
        FOR_GROUPS_ANY(g, nbits, {
            double a0r = RE(s, base), a0i = IM(s, base);
            double a1r = RE(s, base + o1), a1i = IM(s, base + o1);
            RE(s, base) = d0r * a0r - d0i * a0i;
            IM(s, base) = d0r * a0i + d0i * a0r;
            RE(s, base + o1) = d1r * a1r - d1i * a1i;
            IM(s, base + o1) = d1r * a1i + d1i * a1r;
        });
    } else if (g->kind == K_DIAG) {
        const int d = 1 << g->k;
        FOR_GROUPS_ANY(g, nbits, {
            for (int m = 0; m < d; m++) {
                i64 i = base + g->off[m];
                double ar = RE(s, i), ai = IM(s, i);
                RE(s, i) = u[2 * m] * ar - u[2 * m + 1] * ai;
                IM(s, i) = u[2 * m] * ai + u[2 * m + 1] * ar;
            }
        });
    } else if (g->kind == K_FLIP && g->k == 1) {
        const i64 o1 = g->off[1];
        FOR_GROUPS_ANY(g, nbits, {
            double tr = RE(s, base), ti = IM(s, base);
            RE(s, base) = RE(s, base + o1); IM(s, base) = IM(s, base + o1);
            RE(s, base + o1) = tr; IM(s, base + o1) = ti;
        });
    } else if (g->kind == K_FLIP) {
        const int d = 1 << g->k;
        FOR_GROUPS_ANY(g, nbits, {
            for (int m = 0; m < d / 2; m++) {
                i64 i = base + g->off[m], j = base + g->off[d - 1 - m];
                double tr = RE(s, i), ti = IM(s, i);
                RE(s, i) = RE(s, j); IM(s, i) = IM(s, j);
                RE(s, j) = tr; IM(s, j) = ti;
            }
        });
    } else { /* K_SWAP */
        const i64 o1 = g->off[1], o2 = g->off[2];
        FOR_GROUPS_ANY(g, nbits, {
            double tr = RE(s, base + o1), ti = IM(s, base + o1);
            RE(s, base + o1) = RE(s, base + o2); IM(s, base + o1) = IM(s, base + o2);
            RE(s, base + o2) = tr; IM(s, base + o2) = ti;
        });
    }
}

/* Overlap matrix M[r][c] = sum over groups conj(lam[r]) psi[c] (only r == c, in M[r], for a
 * diagonal geometry), written to out (complex, d*d or d entries). For k >= 3 dense gates,
 * ``need`` (the derivative matrix) restricts the sums to its nonzero entries, others are 0. */
#define OVERLAP_1Q_BODY                                                                        \
    {                                                                                          \
        double l0r = RE(lam, base), l0i = IM(lam, base);                                       \
        double l1r = RE(lam, base + o1), l1i = IM(lam, base + o1);                             \
        double p0r = RE(psi, base), p0i = IM(psi, base);                                       \
        double p1r = RE(psi, base + o1), p1i = IM(psi, base + o1);                             \
        s00r += l0r * p0r + l0i * p0i; s00i += l0r * p0i - l0i * p0r;                          \
        s11r += l1r * p1r + l1i * p1i; s11i += l1r * p1i - l1i * p1r;                          \
        s01r += l0r * p1r + l0i * p1i; s01i += l0r * p1i - l0i * p1r;                          \
        s10r += l1r * p0r + l1i * p0i; s10i += l1r * p0i - l1i * p0r;                          \
    }

/* The one-qubit overlap sums of a gate on bit p without controls, in the block layout of
 * dense_1q_low: W = 2^(p+1) doubles between the two amplitudes of a pair. The sums run over
 * the interleaved doubles as real dot products (Re: l * p, Im: l * swapped p with signs), in
 * per-lane accumulators that the compiler keeps in vector registers. */
#define OVERLAP_TERMS(e, q)                                                                    \
    rr00[q] += lx[e] * px[e]; rr00[q + 1] += lx[e + 1] * px[e + 1];                            \
    ri00[q] += lx[e] * px[e + 1]; ri00[q + 1] -= lx[e + 1] * px[e];                            \
    rr01[q] += lx[e] * py[e]; rr01[q + 1] += lx[e + 1] * py[e + 1];                            \
    ri01[q] += lx[e] * py[e + 1]; ri01[q + 1] -= lx[e + 1] * py[e];                            \
    rr10[q] += ly[e] * px[e]; rr10[q + 1] += ly[e + 1] * px[e + 1];                            \
    ri10[q] += ly[e] * px[e + 1]; ri10[q + 1] -= ly[e + 1] * px[e];                            \
    rr11[q] += ly[e] * py[e]; rr11[q + 1] += ly[e + 1] * py[e + 1];                            \
    ri11[q] += ly[e] * py[e + 1]; ri11[q + 1] -= ly[e + 1] * py[e];
#define OVERLAP_BLOCK(W)                                                                       \
    do {                                                                                       \
        for (i64 j = 0; j < nblk; j++) {                                                       \
            const double *restrict lx = lam + 2 * (W) * j, *restrict ly = lx + (W);            \
            const double *restrict px = psi + 2 * (W) * j, *restrict py = px + (W);            \
            if ((W) < 8) {                                                                     \
                for (int e = 0; e < (W); e += 2) { OVERLAP_TERMS(e, e) }                       \
            } else {                                                                           \
                for (int e0 = 0; e0 < (W); e0 += 8)                                            \
                    for (int q = 0; q < 8; q += 2) { OVERLAP_TERMS(e0 + q, q) }                \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static void overlap_1q_low(const double *restrict lam, const double *restrict psi, int nbits,
                           int p, int diag, double *out) {
    double rr00[8] = {0}, ri00[8] = {0}, rr01[8] = {0}, ri01[8] = {0};
    double rr10[8] = {0}, ri10[8] = {0}, rr11[8] = {0}, ri11[8] = {0};
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    switch (p) {
    case 0: OVERLAP_BLOCK(2); break;
    case 1: OVERLAP_BLOCK(4); break;
    case 2: OVERLAP_BLOCK(8); break;
    case 3: OVERLAP_BLOCK(16); break;
    case 4: OVERLAP_BLOCK(32); break;
    case 5: OVERLAP_BLOCK(64); break;
    case 6: OVERLAP_BLOCK(128); break;
    case 7: OVERLAP_BLOCK(256); break;
    default: { const int wd = 2 << p; OVERLAP_BLOCK(wd); }
    }
    double v[8] = {0};
    for (int q = 0; q < 8; q++) {
        v[0] += rr00[q]; v[1] += ri00[q]; v[2] += rr01[q]; v[3] += ri01[q];
        v[4] += rr10[q]; v[5] += ri10[q]; v[6] += rr11[q]; v[7] += ri11[q];
    }
    if (diag) {
        out[0] = v[0]; out[1] = v[1]; out[2] = v[6]; out[3] = v[7];
    } else {
        for (int e = 0; e < 8; e++) out[e] = v[e];
    }
}

/* One whole adjoint step of an uncontrolled dense one-qubit gate on bit p, in ONE pass over
 * psi and lam: M[r][c] += conj(lam[r]) psi[c] on the values BEFORE the step (then
 * <lam| dU |U^dag psi> = sum_rc (dU U^dag)[r][c] M[r][c]), psi <- V psi and, when do_lam,
 * lam <- V lam, with V = U^dag given in v (2x2 complex). Lane accumulators as in
 * overlap_1q_low. */
#define STEP_TERMS(e, q)                                                                       \
    {                                                                                          \
        double a0r = px[e], a0i = px[e + 1], a1r = py[e], a1i = py[e + 1];                     \
        double l0r = lx[e], l0i = lx[e + 1], l1r = ly[e], l1i = ly[e + 1];                     \
        rr00[q] += l0r * a0r; rr00[q + 1] += l0i * a0i;                                        \
        ri00[q] += l0r * a0i; ri00[q + 1] -= l0i * a0r;                                        \
        rr01[q] += l0r * a1r; rr01[q + 1] += l0i * a1i;                                        \
        ri01[q] += l0r * a1i; ri01[q + 1] -= l0i * a1r;                                        \
        rr10[q] += l1r * a0r; rr10[q + 1] += l1i * a0i;                                        \
        ri10[q] += l1r * a0i; ri10[q + 1] -= l1i * a0r;                                        \
        rr11[q] += l1r * a1r; rr11[q + 1] += l1i * a1i;                                        \
        ri11[q] += l1r * a1i; ri11[q + 1] -= l1i * a1r;                                        \
        px[e] = v00r * a0r - v00i * a0i + v01r * a1r - v01i * a1i;                             \
        px[e + 1] = v00r * a0i + v00i * a0r + v01r * a1i + v01i * a1r;                         \
        py[e] = v10r * a0r - v10i * a0i + v11r * a1r - v11i * a1i;                             \
        py[e + 1] = v10r * a0i + v10i * a0r + v11r * a1i + v11i * a1r;                         \
        if (DO_LAM) {                                                                          \
            lx[e] = v00r * l0r - v00i * l0i + v01r * l1r - v01i * l1i;                         \
            lx[e + 1] = v00r * l0i + v00i * l0r + v01r * l1i + v01i * l1r;                     \
            ly[e] = v10r * l0r - v10i * l0i + v11r * l1r - v11i * l1i;                         \
            ly[e + 1] = v10r * l0i + v10i * l0r + v11r * l1i + v11i * l1r;                     \
        }                                                                                      \
    }
#define STEP_BLOCK(W)                                                                          \
    do {                                                                                       \
        for (i64 j = 0; j < nblk; j++) {                                                       \
            double *restrict lx = lam + 2 * (W) * j, *restrict ly = lx + (W);                  \
            double *restrict px = psi + 2 * (W) * j, *restrict py = px + (W);                  \
            if ((W) < 8) {                                                                     \
                for (int e = 0; e < (W); e += 2) STEP_TERMS(e, e)                              \
            } else {                                                                           \
                for (int e0 = 0; e0 < (W); e0 += 8)                                            \
                    for (int q = 0; q < 8; q += 2) STEP_TERMS(e0 + q, q)                       \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#define STEP_SWITCH                                                                            \
    switch (p) {                                                                               \
    case 0: STEP_BLOCK(2); break;                                                              \
    case 1: STEP_BLOCK(4); break;                                                              \
    case 2: STEP_BLOCK(8); break;                                                              \
    case 3: STEP_BLOCK(16); break;                                                             \
    case 4: STEP_BLOCK(32); break;                                                             \
    case 5: STEP_BLOCK(64); break;                                                             \
    case 6: STEP_BLOCK(128); break;                                                            \
    case 7: STEP_BLOCK(256); break;                                                            \
    default: { const int wd = 2 << p; STEP_BLOCK(wd); }                                       \
    }

static void adjoint_step_1q(double *restrict psi, double *restrict lam, int nbits, int p,
                            const double *v, int do_lam, double *out) {
    double rr00[8] = {0}, ri00[8] = {0}, rr01[8] = {0}, ri01[8] = {0};
    double rr10[8] = {0}, ri10[8] = {0}, rr11[8] = {0}, ri11[8] = {0};
    const double v00r = v[0], v00i = v[1], v01r = v[2], v01i = v[3];
    const double v10r = v[4], v10i = v[5], v11r = v[6], v11i = v[7];
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    if (do_lam) {
#define DO_LAM 1
        STEP_SWITCH
#undef DO_LAM
    } else {
#define DO_LAM 0
        STEP_SWITCH
#undef DO_LAM
    }
    double w[8] = {0};
    for (int q = 0; q < 8; q++) {
        w[0] += rr00[q]; w[1] += ri00[q]; w[2] += rr01[q]; w[3] += ri01[q];
        w[4] += rr10[q]; w[5] += ri10[q]; w[6] += rr11[q]; w[7] += ri11[q];
    }
    for (int e = 0; e < 8; e++) out[e] = w[e];
}

/* 2x2 complex product c = a b */
static void mul2(const double *a, const double *b, double *c) {
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++) {
            double re = 0, im = 0;
            for (int t = 0; t < 2; t++) {
                double ar = a[2 * (2 * r + t)], ai = a[2 * (2 * r + t) + 1];
                double br = b[2 * (2 * t + k)], bi = b[2 * (2 * t + k) + 1];
                re += ar * br - ai * bi;
                im += ar * bi + ai * br;
            }
            c[2 * (2 * r + k)] = re;
            c[2 * (2 * r + k) + 1] = im;
        }
}

static void overlap_matrix(const double *lam, const double *psi, int nbits, const gate_t *g,
                           double *out, int par_, const double *need) {
    const int d = 1 << g->k;
    const int diag = g->kind == K_DIAG;
    if (g->k == 1 && g->cmask == 0 && par_ <= 1 && nbits > g->special[0]) {
        overlap_1q_low(lam, psi, nbits, g->special[0], diag, out);
        return;
    }
    if (g->k == 1) {
        const i64 o1 = g->off[1];
        double s00r = 0, s00i = 0, s01r = 0, s01i = 0, s10r = 0, s10i = 0, s11r = 0, s11i = 0;
        if (par_ > 1) {  /* one large state: split the sums over threads */
            FOR_GROUPS_(g, nbits, _Pragma("omp parallel for num_threads(par_) schedule(static) \
reduction(+: s00r, s00i, s01r, s01i, s10r, s10i, s11r, s11i)"), OVERLAP_1Q_BODY);
        } else {
            FOR_GROUPS(g, nbits, OVERLAP_1Q_BODY);
        }
        if (diag) {
            out[0] = s00r; out[1] = s00i; out[2] = s11r; out[3] = s11i;
        } else {
            out[0] = s00r; out[1] = s00i; out[2] = s01r; out[3] = s01i;
            out[4] = s10r; out[5] = s10i; out[6] = s11r; out[7] = s11i;
        }
        return;
    }
    if (g->k == 2 && !diag) {
        const i64 o1 = g->off[1], o2 = g->off[2], o3 = g->off[3];
        double sr[16] = {0}, si[16] = {0};
        FOR_GROUPS(g, nbits, {
            double lr[4], li[4], pr[4], pi[4];
            lr[0] = RE(lam, base); li[0] = IM(lam, base);
            lr[1] = RE(lam, base + o1); li[1] = IM(lam, base + o1);
            lr[2] = RE(lam, base + o2); li[2] = IM(lam, base + o2);
            lr[3] = RE(lam, base + o3); li[3] = IM(lam, base + o3);
            pr[0] = RE(psi, base); pi[0] = IM(psi, base);
            pr[1] = RE(psi, base + o1); pi[1] = IM(psi, base + o1);
            pr[2] = RE(psi, base + o2); pi[2] = IM(psi, base + o2);
            pr[3] = RE(psi, base + o3); pi[3] = IM(psi, base + o3);
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) {
                    sr[4 * r + c] += lr[r] * pr[c] + li[r] * pi[c];
                    si[4 * r + c] += lr[r] * pi[c] - li[r] * pr[c];
                }
        });
        for (int e = 0; e < 16; e++) { out[2 * e] = sr[e]; out[2 * e + 1] = si[e]; }
        return;
    }
    int cnt = diag ? d : d * d;
    for (int i = 0; i < 2 * cnt; i++) out[i] = 0;
    if (!diag && need != 0) {  /* only the entries the contraction will use */
        int ne = 0, er[1 << (2 * MAXK)], ec[1 << (2 * MAXK)];
        for (int r = 0; r < d; r++)
            for (int c = 0; c < d; c++)
                if (need[2 * (r * d + c)] != 0.0 || need[2 * (r * d + c) + 1] != 0.0) {
                    er[ne] = r; ec[ne] = c; ne++;
                }
        FOR_GROUPS(g, nbits, {
            for (int e = 0; e < ne; e++) {
                i64 ir = base + g->off[er[e]], ic = base + g->off[ec[e]];
                double lr = RE(lam, ir), li = IM(lam, ir), pr = RE(psi, ic), pi = IM(psi, ic);
                out[2 * (er[e] * d + ec[e])] += lr * pr + li * pi;
                out[2 * (er[e] * d + ec[e]) + 1] += lr * pi - li * pr;
            }
        });
        return;
    }
    FOR_GROUPS(g, nbits, {
        for (int r = 0; r < d; r++) {
            i64 ir = base + g->off[r];
            double lr = RE(lam, ir), li = IM(lam, ir);
            for (int c = diag ? r : 0; c < (diag ? r + 1 : d); c++) {
                i64 ic = base + g->off[c];
                double pr = RE(psi, ic), pi = IM(psi, ic);
                int e = diag ? r : r * d + c;
                out[2 * e] += lr * pr + li * pi;
                out[2 * e + 1] += lr * pi - li * pr;
            }
        }
    });
}

/* Re sum_rc D[r][c] M[r][c] */
static double contract(const gate_t *g, const double *dm, const double *m) {
    int d = 1 << g->k;
    int cnt = g->kind == K_DIAG ? d : d * d;
    double acc = 0;
    for (int e = 0; e < cnt; e++) acc += dm[2 * e] * m[2 * e] - dm[2 * e + 1] * m[2 * e + 1];
    return acc;
}

static int same_geometry(const i64 *a, const i64 *b) {
    for (int f = 0; f < 9; f++) if (a[f] != b[f]) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* programs                                                                                  */

static int fits_chunk(const gate_t *g, int cb) {
    return g->nspecial == 0 || g->special[g->nspecial - 1] < cb;
}

static const double *data_of(const gate_t *g, i64 b) { return g->data + 2 * g->stride * b; }

/* Per-call context: the decoded gates, and for coded gates the angles and a per-thread
 * workspace (ws_off[i]: offset of gate i's workspace, wsize doubles per thread). */
typedef struct {
    gate_t *gates;
    const double *theta;
    i64 tstride, wsize, *ws_off;
    double *ws;
} ctx_t;

/* shared_cols (P entries, may be NULL): 1 where a theta column is one value broadcast over
 * the batch by construction, so that only the sum of its gradient over the bindings matters. */
static int ctx_init(ctx_t *c, i64 nops, const i64 *recs, const double *data, i64 nextra,
                    const double *theta, i64 tstride, i64 B, i64 P, const i64 *shared_cols,
                    int nthreads) {
    c->gates = (gate_t *)malloc((size_t)(nops + nextra + 1) * sizeof(gate_t));
    c->ws_off = (i64 *)malloc((size_t)(nops + 1) * sizeof(i64));
    c->theta = theta;
    c->tstride = tstride;
    c->ws = 0;
    if (!c->gates || !c->ws_off) return -1;
    /* columns whose value is the same in every row: their gates apply to many states at once */
    char *ucol = (char *)malloc((size_t)(P + 1));
    if (!ucol) return -1;
    for (i64 k = 0; k < P; k++) {
        int same = 1;
        if (tstride)
            for (i64 b = 1; b < B && same; b++) same = theta[b * tstride + k] == theta[k];
        ucol[k] = (char)same;
    }
    c->wsize = 0;
    for (i64 i = 0; i < nops; i++) {
        gate_t *g = &c->gates[i];
        decode(recs + REC * i, data, g);
        c->ws_off[i] = c->wsize;
        c->wsize += ws_size(g);
        g->uniform = g->code ? 1 : g->stride == 0;
        g->gshared = g->code ? 1 : 0;
        for (int j = 0; j < g->np; j++) {
            if (g->col[j] < 0) continue;
            g->uniform &= ucol[g->col[j]];
            if ((g->tmask_p >> j) & 1) g->gshared &= shared_cols ? (int)(shared_cols[g->col[j]] != 0) : 0;
        }
        g->gshared &= g->uniform;
    }
    free(ucol);
    if (c->wsize) {
        c->ws = (double *)calloc((size_t)c->wsize * (nthreads > 1 ? nthreads : 1), sizeof(double));
        if (!c->ws) return -1;
    }
    return 0;
}

static void ctx_free(ctx_t *c) {
    free(c->gates);
    free(c->ws_off);
    free(c->ws);
}

static double *ws_of(const ctx_t *c, i64 i, int tid) { return c->ws + tid * c->wsize + c->ws_off[i]; }

/* The data of gate i for binding b (coded gates: evaluated into this thread's workspace). */
static const double *gate_data(const ctx_t *c, i64 i, i64 b, int tid, int deriv) {
    const gate_t *g = &c->gates[i];
    if (!g->code) return data_of(g, b);
    return coded_data(g, ws_of(c, i, tid), c->theta, c->tstride, b, deriv);
}

/* Small states are processed in tiles of 2^tb consecutive states: a gate whose matrix is the
 * same for all bindings applies to the tile as ONE state of n + tb qubits (the batch index
 * is the high bits), so the per-gate cost is paid once per tile instead of once per state. */
#define TILE_BITS 10

typedef struct { i64 b0; int tb; } tile_t;

static i64 make_tiles(int n, i64 B, tile_t *out) {
    int t = TILE_BITS - n;
    i64 cnt = 0, b0 = 0;
    if (t < 0) t = 0;
    while (b0 < B) {
        int tb = t;
        while (tb > 0 && ((i64)1 << tb) > B - b0) tb--;
        if (out) { out[cnt].b0 = b0; out[cnt].tb = tb; }
        cnt++;
        b0 += (i64)1 << tb;
    }
    return cnt;
}

/* Apply gate i (or its inverse) to the tile of states st (binding b0 first). */
static void apply_tile(double *st, int n, int tb, const ctx_t *c, i64 i, i64 b0, int dag,
                       int par, int tid) {
    const gate_t *g = &c->gates[i];
    if (g->uniform) {
        apply_range(st, n + tb, g, gate_data(c, i, b0, tid, 0), dag, par);
        return;
    }
    i64 N = (i64)1 << n;
    for (i64 t = 0; t < ((i64)1 << tb); t++)
        apply_range(st + 2 * N * t, n, g, gate_data(c, i, b0 + t, tid, 0), dag, par);
}

/* Gates [i0, i1) (all with bits below cb), or their inverses in reverse order, applied chunk
 * by chunk: one pass over memory for the whole run. ``us[i]`` is gate i's data. */
static void run_chunked(double *st, int n, int cb, const gate_t *gates, const double **us, i64 i0,
                        i64 i1, int dag, int par) {
    i64 nch = (i64)1 << (n - cb);
#pragma omp parallel for if (par > 1) num_threads(par) schedule(static)
    for (i64 c = 0; c < nch; c++) {
        double *chunk = st + 2 * (c << cb);
        for (i64 t = 0; t < i1 - i0; t++) {
            i64 i = dag ? i1 - 1 - t : i0 + t;
            apply_range(chunk, cb, &gates[i], us[i], dag, 1);
        }
    }
}

static void run_one(double *st, int n, const ctx_t *c, const double **us, i64 nops, i64 b,
                    int dag, int par, int tid, i64 start) {
    const gate_t *gates = c->gates;
    for (i64 i = start; i < nops; i++) us[i] = gate_data(c, i, b, tid, 0);
    int cb = n > CHUNK_BITS + 2 ? CHUNK_BITS : n;
    i64 t = start;
    while (t < nops) {
        i64 i = dag ? nops - 1 - t : t;
        i64 e = t;
        if (cb < n)
            while (e < nops && fits_chunk(&gates[dag ? nops - 1 - e : e], cb)) e++;
        if (e - t < 2) {
            apply_range(st, n, &gates[i], us[i], dag, par);
            t++;
        } else {
            if (dag) run_chunked(st, n, cb, gates, us, nops - e, nops - t, 1, par);
            else run_chunked(st, n, cb, gates, us, t, e, 0, par);
            t = e;
        }
    }
}

int qd_abi_version(void) { return 3; }

/* The leading one-qubit gates (no controls) of a program, applied to |0...0>, give a product
 * state: written directly, one pass instead of one per gate. Returns the first gate not in
 * that prefix (0: nothing written). */
static i64 product_prefix(const ctx_t *c, i64 nops, int n) {
    i64 e = 0;
    while (e < nops) {
        const gate_t *g = &c->gates[e];
        if (g->k != 1 || g->cmask || !(g->kind == K_DENSE || g->kind == K_DIAG || g->kind == K_FLIP))
            break;
        e++;
    }
    return e >= 2 && n >= 2 ? e : 0;
}

static void write_product(double *st, int n, const ctx_t *c, i64 pe, i64 b, int tid) {
    double v[64][4];
    for (int p = 0; p < n; p++) { v[p][0] = 1; v[p][1] = 0; v[p][2] = 0; v[p][3] = 0; }
    for (i64 i = 0; i < pe; i++) {
        const gate_t *g = &c->gates[i];
        int p = g->special[0];
        double a0r = v[p][0], a0i = v[p][1], a1r = v[p][2], a1i = v[p][3];
        if (g->kind == K_FLIP) {
            v[p][0] = a1r; v[p][1] = a1i; v[p][2] = a0r; v[p][3] = a0i;
            continue;
        }
        const double *u = gate_data(c, i, b, tid, 0);
        if (g->kind == K_DIAG) {
            v[p][0] = u[0] * a0r - u[1] * a0i; v[p][1] = u[0] * a0i + u[1] * a0r;
            v[p][2] = u[2] * a1r - u[3] * a1i; v[p][3] = u[2] * a1i + u[3] * a1r;
        } else {
            v[p][0] = u[0] * a0r - u[1] * a0i + u[2] * a1r - u[3] * a1i;
            v[p][1] = u[0] * a0i + u[1] * a0r + u[2] * a1i + u[3] * a1r;
            v[p][2] = u[4] * a0r - u[5] * a0i + u[6] * a1r - u[7] * a1i;
            v[p][3] = u[4] * a0i + u[5] * a0r + u[6] * a1i + u[7] * a1r;
        }
    }
    st[0] = 1;
    st[1] = 0;
    i64 len = 1;
    for (int p = n - 1; p >= 0; p--) {  /* the most significant bit first */
        for (i64 j = len - 1; j >= 0; j--) {
            double xr = st[2 * j], xi = st[2 * j + 1];
            st[4 * j] = xr * v[p][0] - xi * v[p][1];
            st[4 * j + 1] = xr * v[p][1] + xi * v[p][0];
            st[4 * j + 2] = xr * v[p][2] - xi * v[p][3];
            st[4 * j + 3] = xr * v[p][3] + xi * v[p][2];
        }
        len *= 2;
    }
}

/* Apply the program (in order, or its inverse when dag) to every state of the batch. Coded
 * gates read their angles from theta (row b at theta + b * tstride; tstride 0: one row, P
 * columns). */
int qd_run(double *states, i64 B, int n, i64 nops, const i64 *recs, const double *data,
           const double *theta, i64 tstride, i64 P, int dag, int from_zero, int nthreads) {
    int nt = (B > 1 && nthreads > 1) ? nthreads : 1;
    ctx_t c = {0};
    i64 ntiles = make_tiles(n, B, 0);
    tile_t *tiles = (tile_t *)malloc((size_t)ntiles * sizeof(tile_t));
    const double **us = (const double **)malloc((size_t)(nops + 1) * nt * sizeof(double *));
    if (!us || !tiles || ctx_init(&c, nops, recs, data, 0, theta, tstride, B, P, 0, nt) != 0) {
        free(us);
        free(tiles);
        ctx_free(&c);
        return -1;
    }
    make_tiles(n, B, tiles);
    i64 N = (i64)1 << n;
    /* from_zero: the input is |0...0> (its content is not read); a leading product prefix is
     * written directly */
    i64 pe = from_zero && !dag ? product_prefix(&c, nops, n) : 0;
    if (B == 1) {  /* one state: the kernels split it over the threads */
        if (pe) write_product(states, n, &c, pe, 0, 0);
        run_one(states, n, &c, us, nops, 0, dag, nthreads, 0, pe);
        ntiles = 0;
    }
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
    for (i64 k = 0; k < ntiles; k++) {
        int tid = nt > 1 ? THREAD_ID : 0;
        i64 b0 = tiles[k].b0;
        int tb = tiles[k].tb;
        double *st = states + 2 * N * b0;
        if (pe)
            for (i64 t = 0; t < ((i64)1 << tb); t++) write_product(st + 2 * N * t, n, &c, pe, b0 + t, tid);
        if (tb == 0) {
            run_one(st, n, &c, us + (nops + 1) * tid, nops, b0, dag, 1, tid, pe);
        } else {
            for (i64 t = pe; t < nops; t++)
                apply_tile(st, n, tb, &c, dag ? nops - 1 - (t - pe) : t, b0, dag, 1, tid);
        }
    }
    free(us);
    free(tiles);
    ctx_free(&c);
    return 0;
}

/* Adjoint sweep. For i = nops-1 .. lo: psi <- U_i^dag psi; then the gradients of gate i:
 *  - fallback slots (data given): grads[b, s] = 2 Re <lam| dU_s |psi> = 2 Re sum_rc
 *    dU_s[r][c] M[r][c] with M the overlap matrix of lam and psi on the slot's geometry (shared
 *    by slots with the same geometry). Slot records have the gate record layout (kind dense or
 *    diag, dU as data); slot_op[s] is the gate index of slot s, ascending;
 *  - coded gates: the same for every angle in its trainable mask, added (times the angle's
 *    scale) to gtheta[b, column]. For a uniform gate whose columns are batch-shared
 *    (shared_cols), one overlap over a whole tile gives the tile's sum, added to the tile's
 *    first row (only the column sum of such a gradient matters);
 * then lam <- U_i^dag lam. Gates below lo have nothing to differentiate: the sweep stops
 * there (psi is uncomputed down to gate lo only; lo = 0 restores the input state). */
int qd_adjoint(double *psi, double *lam, i64 B, int n, i64 nops, const i64 *recs,
               const double *data, i64 nslots, const i64 *slot_recs, const i64 *slot_op,
               double *grads, const double *theta, i64 tstride, double *gtheta, i64 P,
               const i64 *shared_cols, i64 lo, const double *ldiag, int nthreads) {
    int nt = (B > 1 && nthreads > 1) ? nthreads : 1;
    ctx_t c = {0};
    /* fallback slots are per binding: no tiles then */
    i64 ntiles = nslots ? B : make_tiles(n, B, 0);
    tile_t *tiles = (tile_t *)malloc((size_t)ntiles * sizeof(tile_t));
    if (!tiles || ctx_init(&c, nops, recs, data, nslots, theta, tstride, B, P, shared_cols,
                           nt) != 0) {
        free(tiles);
        ctx_free(&c);
        return -1;
    }
    if (nslots) {
        for (i64 b = 0; b < B; b++) { tiles[b].b0 = b; tiles[b].tb = 0; }
    } else {
        make_tiles(n, B, tiles);
    }
    /* ldiag: lam = ldiag * psi (a real diagonal per binding, e.g. a sum of Z words), formed
     * tile by tile in per-thread scratch together with a copy of psi, which stays untouched */
    double *scratch = 0;
    i64 tile_amps = 0;
    if (ldiag) {
        for (i64 k = 0; k < ntiles; k++)
            if (((i64)1 << (n + tiles[k].tb)) > tile_amps) tile_amps = (i64)1 << (n + tiles[k].tb);
        scratch = (double *)malloc((size_t)(4 * tile_amps) * nt * sizeof(double));
        if (!scratch) {
            free(tiles);
            ctx_free(&c);
            return -1;
        }
    }
    gate_t *gates = c.gates;
    gate_t *sg = gates + nops;
    for (i64 s = 0; s < nslots; s++) decode(slot_recs + REC * s, data, &sg[s]);
    i64 N = (i64)1 << n;
    int par = B == 1 ? nthreads : 1;
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
    for (i64 k = 0; k < ntiles; k++) {
        int tid = nt > 1 ? THREAD_ID : 0;
        i64 b0 = tiles[k].b0;
        int tb = tiles[k].tb;
        i64 nb = (i64)1 << tb;
        double *p = psi + 2 * N * b0, *l = lam + 2 * N * b0;
        if (ldiag) {
            i64 amps = N * nb;
            double *sp = scratch + (i64)4 * tile_amps * tid, *sl = sp + 2 * tile_amps;
            const double *src = psi + 2 * N * b0, *dg = ldiag + N * b0;
            memcpy(sp, src, sizeof(double) * 2 * amps);
            for (i64 x = 0; x < amps; x++) {
                sl[2 * x] = dg[x] * src[2 * x];
                sl[2 * x + 1] = dg[x] * src[2 * x + 1];
            }
            p = sp;
            l = sl;
        }
        double m[2 << (2 * MAXK)];
        i64 s = nslots - 1;
        for (i64 i = nops - 1; i >= lo; i--) {
            const gate_t *g = &gates[i];
            int train = g->code ? g->tmask_p : 0;
            if (train && g->kind == K_DENSE && g->k == 1 && g->cmask == 0 && par <= 1 &&
                g->special[0] <= 7) {
                /* the fused step: overlap on the values before the step, both updates */
                i64 reps = g->gshared ? 1 : nb;
                int bits = g->gshared ? n + tb : n;
                for (i64 t = 0; t < reps; t++) {
                    i64 b = b0 + t;
                    const double *u = gate_data(&c, i, b, tid, 1);
                    double v[8], gm[8];
                    effective(g, u, 1, v);  /* v = U^dag */
                    adjoint_step_1q(p + 2 * N * t, l + 2 * N * t, bits, g->special[0], v,
                                    i > lo, m);
                    for (int j = 0; j < g->np; j++)
                        if ((train >> j) & 1) {
                            mul2(u + g->usize * (1 + j), v, gm);  /* dU_j U^dag */
                            gtheta[b * P + g->col[j]] += g->scale[j] * 2.0 * contract(g, gm, m);
                        }
                }
                continue;
            }
            apply_tile(p, n, tb, &c, i, b0, 1, par, tid);
            if (train) {
                /* one overlap for all angles (k >= 3: restricted to dU's nonzero entries) */
                int first = __builtin_ctz((unsigned)train);
                i64 reps = g->gshared ? 1 : nb;
                for (i64 t = 0; t < reps; t++) {
                    i64 b = b0 + t;
                    const double *u = gate_data(&c, i, b, tid, 1);
                    const double *du0 = u + g->usize * (1 + first);
                    int bits = g->gshared ? n + tb : n;
                    overlap_matrix(l + 2 * N * t, p + 2 * N * t, bits, g, m, par,
                                   g->k >= 3 ? du0 : 0);
                    for (int j = 0; j < g->np; j++)
                        if ((train >> j) & 1)
                            gtheta[b * P + g->col[j]] +=
                                g->scale[j] * 2.0 * contract(g, u + g->usize * (1 + j), m);
                }
            }
            i64 prev = -1;
            for (; s >= 0 && slot_op[s] == i; s--) {  /* tb == 0 here: b == b0 */
                /* k >= 3: a sparse M for this slot's dU, never shared */
                const double *need = sg[s].k >= 3 ? data_of(&sg[s], b0) : 0;
                if (need || prev < 0 || !same_geometry(slot_recs + REC * s, slot_recs + REC * prev))
                    overlap_matrix(l, p, n, &sg[s], m, par, need);
                prev = s;
                grads[b0 * nslots + s] = 2.0 * contract(&sg[s], data_of(&sg[s], b0), m);
            }
            if (i > lo) apply_tile(l, n, tb, &c, i, b0, 1, par, tid);
        }
    }
    free(tiles);
    free(scratch);
    ctx_free(&c);
    return 0;
}

/* |s_i|^2 for count complex numbers (probabilities of a batch of states). */
void qd_abs2(const double *s, double *out, i64 count) {
    for (i64 i = 0; i < count; i++) out[i] = s[2 * i] * s[2 * i] + s[2 * i + 1] * s[2 * i + 1];
}
