/* The statevector kernels of qdsim.c for one precision: included once with R = double
 * (complex128 states, names ending _c128) and once with R = float (complex64, _c64). */

/* Per-thread scratch: the adjoint of a dense k >= 3 matrix, its sparse rows, the overlap
 * matrix of the adjoint sweep (heap: sized by the widest gate of the call). */
typedef struct {
    R *u, *vr, *vi;
    int *cols, *ptr, *rows, *er, *ec, *colv;
    double *m;
} SFX(scratch_t);

/* Per-call context: the decoded gates, and for coded gates the angles and a per-thread
 * workspace (ws_off[i]: offset of gate i's workspace, wsize reals per thread; whdr: the
 * angles the workspace holds and its state, 4 doubles per gate and thread). */
typedef struct {
    gate_t *gates;
    i64 ngates;
    const double *theta;
    i64 tstride, wsize, *ws_off;
    R *ws;
    double *whdr;
    SFX(scratch_t) *scr;
    void *scr_mem;
    R *tbuf;        /* per thread: two tiles (psi, lam) of 2^(TILE_LOW + tk) amplitudes */
    size_t tbytes;  /* tbuf's size (a block kept between calls: keep_get) */
    int tk;         /* high bits of a tile in this call (tile_high) */
    int tiles;      /* 0 off, 1 where they pay off, 2 always (tests) */
} SFX(ctx_t);

static const R *SFX(data_of)(const gate_t *g, i64 b) {
    return (const R *)g->data + 2 * g->stride * b;
}

/* The matrix (or diagonal) to apply: u itself, or its adjoint written into buf. */
static const R *SFX(effective)(const gate_t *g, const R *u, int dag, R *buf) {
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

/* ---------------------------------------------------------------------------------------- */
/* one-qubit gates without controls: block loops                                              */

/* The two amplitudes of a pair are W reals apart inside blocks of 2W reals (W = 2^(p+1)).
 * With W a compile-time constant (p <= 7) the body is unrolled and vectorised over the block
 * (the group loops would walk such short runs one complex number at a time). Blocks
 * [j0, j1), reals [E0, E1) of each half. */
#define BLOCK_1Q(W, E0, E1, BODY)                                                              \
    do {                                                                                       \
        for (i64 j = j0; j < j1; j++) {                                                        \
            R *restrict x = s + 2 * (i64)(W) * j, *restrict y = x + (W);                       \
            for (i64 e = (E0); e < (E1); e += 2) {                                             \
                R a0r = x[e], a0i = x[e + 1], a1r = y[e], a1i = y[e + 1];                      \
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
#define SWITCH_1Q(BODY)                                                                        \
    if (e0 != 0 || e1 != w) { BLOCK_1Q(w, e0, e1, BODY); return; }                             \
    switch (p) {                                                                               \
    case 0: BLOCK_1Q(2, 0, 2, BODY); break;                                                    \
    case 1: BLOCK_1Q(4, 0, 4, BODY); break;                                                    \
    case 2: BLOCK_1Q(8, 0, 8, BODY); break;                                                    \
    case 3: BLOCK_1Q(16, 0, 16, BODY); break;                                                  \
    case 4: BLOCK_1Q(32, 0, 32, BODY); break;                                                  \
    case 5: BLOCK_1Q(64, 0, 64, BODY); break;                                                  \
    case 6: BLOCK_1Q(128, 0, 128, BODY); break;                                                \
    case 7: BLOCK_1Q(256, 0, 256, BODY); break;                                                \
    default: BLOCK_1Q(w, 0, w, BODY);                                                          \
    }

static void SFX(dense_1q_part)(R *restrict s, int p, const R *u, i64 j0, i64 j1, i64 e0,
                               i64 e1) {
    const R m00r = u[0], m00i = u[1], m01r = u[2], m01i = u[3];
    const R m10r = u[4], m10i = u[5], m11r = u[6], m11i = u[7];
    const i64 w = (i64)2 << p;
    SWITCH_1Q(DENSE_1Q_BODY)
}

static void SFX(diag_1q_part)(R *restrict s, int p, const R *u, i64 j0, i64 j1, i64 e0,
                              i64 e1) {
    const R d0r = u[0], d0i = u[1], d1r = u[2], d1i = u[3];
    const i64 w = (i64)2 << p;
    SWITCH_1Q(DIAG_1Q_BODY)
}

/* A one-qubit gate on bit p of 2^nbits amplitudes, split over par threads for a large state. */
#if QD_VEC
static void SFX(vdense_1q_part)(R *restrict s, i64 w, const R *u, int pf, i64 j0, i64 j1,
                                i64 e0, i64 e1);
static void SFX(vdense_1q_fwd)(R *restrict s, i64 w, const R *u, int pf, int pf_light,
                               i64 j0, i64 j1, i64 e0, i64 e1);
#define VDENSE_OK(w) ((w) >= 64 / (i64)sizeof(R))
#else
#define VDENSE_OK(w) 0
#endif

static void SFX(one_qubit_low)(R *s, int nbits, int p, const R *u, int diag, int par) {
    const i64 nblk = (i64)1 << (nbits - 1 - p), w = (i64)2 << p;
#if QD_VEC
    if (!diag && VDENSE_OK(w)) {  /* halves of at least one vector: the vector kernel */
        const size_t bytes = RSIZE << (nbits + 1);
        const int pf = pf_run(w * (i64)sizeof(R));
        const int pf_light = pf && (bytes < PF_LIGHT_LO || bytes >= PF_LIGHT_HI);
        if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
            {
                i64 j0, j1, e0, e1;
                split_1q(nblk, w, THREAD_ID, NUM_THREADS, &j0, &j1, &e0, &e1);
                SFX(vdense_1q_fwd)(s, w, u, pf, pf_light, j0, j1, e0, e1);
            }
            return;
        }
        SFX(vdense_1q_fwd)(s, w, u, pf, pf_light, 0, nblk, 0, w);
        return;
    }
#endif
    if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
        {
            i64 j0, j1, e0, e1;
            split_1q(nblk, w, THREAD_ID, NUM_THREADS, &j0, &j1, &e0, &e1);
            if (diag) SFX(diag_1q_part)(s, p, u, j0, j1, e0, e1);
            else SFX(dense_1q_part)(s, p, u, j0, j1, e0, e1);
        }
        return;
    }
    if (diag) SFX(diag_1q_part)(s, p, u, 0, nblk, 0, w);
    else SFX(dense_1q_part)(s, p, u, 0, nblk, 0, w);
}


/* ---------------------------------------------------------------------------------------- */
/* one-qubit gates on the lowest bits (0-2), any controls: lanes of 8-amplitude groups         */

/* A one-qubit gate (dense, diagonal or flip) whose target p < 3 pairs amplitudes inside every
 * group of 8 (16 reals): with P = 2 << p, out[e] = A[e] v[e] + B[e] v[e^1] + C[e] v[e^P] +
 * D[e] v[e^P^1] with per-lane coefficients (the identity on lanes whose low control bits are
 * not all 1), so the compiler keeps a group in vector registers and permutes within them;
 * groups whose high control bits (>= 3) are not all 1 are never touched. */
static void SFX(lane_coeffs)(const gate_t *g, const R *u, int p, R *A, R *B, R *C, R *D) {
    const int lo = (int)(g->cmask & 7);
    for (int m = 0; m < 8; m++) {
        int b = (m >> p) & 1, on = (m & lo) == lo;
        R ur = 1, ui = 0, vr = 0, vi = 0;  /* U[b][b] and U[b][1-b] */
        if (on && g->kind == K_DENSE) {
            ur = u[2 * (3 * b)]; ui = u[2 * (3 * b) + 1];
            vr = u[2 * (2 * b + 1 - b)]; vi = u[2 * (2 * b + 1 - b) + 1];
        } else if (on && g->kind == K_DIAG) {
            ur = u[2 * b]; ui = u[2 * b + 1];
        } else if (on) {  /* flip */
            ur = 0; vr = 1;
        }
        A[2 * m] = ur; B[2 * m] = -ui; C[2 * m] = vr; D[2 * m] = -vi;
        A[2 * m + 1] = ur; B[2 * m + 1] = ui; C[2 * m + 1] = vr; D[2 * m + 1] = vi;
    }
}

#define LANE_BODY(P, TERMS)                                                                    \
    for (i64 j = j0; j < j1; j++) {                                                            \
        i64 G = j;                                                                             \
        for (int q = 0; q < nh; q++)                                                           \
            G = ((G >> hb[q]) << (hb[q] + 1)) | ((i64)1 << hb[q]) | (G & (((i64)1 << hb[q]) - 1)); \
        R *restrict v = s + 16 * G;                                                            \
        R t[16];                                                                               \
        for (int e = 0; e < 16; e++) t[e] = TERMS;                                             \
        for (int e = 0; e < 16; e++) v[e] = t[e];                                              \
    }

#define LANE_FULL(P) A[e] * v[e] + B[e] * v[e ^ 1] + C[e] * v[e ^ (P)] + D[e] * v[e ^ (P) ^ 1]
#define LANE_DIAG A[e] * v[e] + B[e] * v[e ^ 1]

#ifndef QD_GROUPS_ONCE
#define QD_GROUPS_ONCE
/* group index j with the bits hb[0..nh) (ascending) inserted as 1 */
#define LOW_GROUP(j, G)                                                                        \
    i64 G = (j);                                                                               \
    for (int q = 0; q < nh; q++)                                                               \
        G = ((G >> hb[q]) << (hb[q] + 1)) | ((i64)1 << hb[q]) | (G & (((i64)1 << hb[q]) - 1));
/* the groups [j0, j1) of 16 reals, v_ the first real of each: without high control bits
 * (nh = 0) a plain walk (the index loop costs more than the body of a cache-resident
 * group), else the group index with the bits hb[0..nh) inserted */
#define LOW_GROUPS(...)                                                                        \
    if (nh == 0) {                                                                             \
        for (i64 j = j0; j < j1; j++) { R *v_ = s + 16 * j; __VA_ARGS__ }                      \
    } else {                                                                                   \
        for (i64 j = j0; j < j1; j++) { LOW_GROUP(j, G) R *v_ = s + 16 * G; __VA_ARGS__ }      \
    }
#endif

#if QD_VEC
/* The same with the group as one vector of 16 reals and the partners as constant shuffles
 * (the loop above stays scalar: the compiler does not see the permutations). */
typedef R SFX(v16) __attribute__((vector_size(16 * sizeof(R))));
/* (16 doubles span two registers: QD_INREG only for 16 floats) */
#undef V16_INREG
#if RBYTES == 4
#define V16_INREG(x) QD_INREG(x)
#else
#define V16_INREG(x) ((void)0)
#endif
static inline SFX(v16) SFX(vld)(const R *p) {
    SFX(v16) v;
    memcpy(&v, p, sizeof v);
    V16_INREG(v);
    return v;
}
static inline void SFX(vst)(R *p, SFX(v16) v) { memcpy(p, &v, sizeof v); }
#define LANE_VBODY(EXPR)                                                                       \
    LOW_GROUPS({                                                                               \
        SFX(v16) v, t;                                                                         \
        memcpy(&v, v_, sizeof v);                                                              \
        V16_INREG(v);                                                                          \
        t = EXPR;                                                                              \
        memcpy(v_, &t, sizeof t);                                                              \
    })
#define SHUF(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#define LX1 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14
#define LX2 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13
#define LX3 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12
#define LX4 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11
#define LX5 5, 4, 7, 6, 1, 0, 3, 2, 13, 12, 15, 14, 9, 8, 11, 10
#define LX8 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7
#define LX9 9, 8, 11, 10, 13, 12, 15, 14, 1, 0, 3, 2, 5, 4, 7, 6
#if RBYTES == 8
static void SFX(lane_part_v)(R *restrict s, int p, int diag, const R *A_, const R *B_,
                             const R *C_, const R *D_, const int *hb, int nh, i64 j0, i64 j1);
#endif
static int SFX(lane_two)(R *restrict s, int p, const R *A_, const R *B_, const R *C_,
                         const R *D_, const int *hb, int nh, i64 j0, i64 j1);
static void SFX(swap_low)(R *s, int nbits, int h, int l, int par);
static void SFX(swap_groups)(R *s, int nbits, int h, int l, int par);
static void SFX(diag_groups)(R *s, int nbits, const gate_t *g, const R *u, int par);
QD_FMA_CHAIN static void SFX(lane_part)(R *restrict s, int p, int diag, const R *A_, const R *B_,
                           const R *C_, const R *D_, const int *hb, int nh, i64 j0, i64 j1) {
    if (!diag && SFX(lane_two)(s, p, A_, B_, C_, D_, hb, nh, j0, j1)) return;
#if RBYTES == 8  /* 16 doubles span two vector registers: the kernel on two halves */
    SFX(lane_part_v)(s, p, diag, A_, B_, C_, D_, hb, nh, j0, j1);
    return;
#endif
    SFX(v16) A, B, C, D;
    memcpy(&A, A_, sizeof A); memcpy(&B, B_, sizeof B);
    memcpy(&C, C_, sizeof C); memcpy(&D, D_, sizeof D);
    if (diag) {
        LANE_VBODY(A * v + B * SHUF(v, LX1));
        return;
    }
    /* B v[e^1] + D v[e^P^1] is (Bs v + Ds v[.^P]) re/im swapped, Bs and Ds the swapped
     * coefficients: two shuffles per group instead of three; one chain of multiply-adds,
     * A v + (C v[.^P] + swap(Ds v[.^P] + Bs v)), no final add */
    const SFX(v16) Bs = SHUF(B, LX1), Ds = SHUF(D, LX1);
    switch (p) {
    case 0: LANE_VBODY(A * v + (C * SHUF(v, LX2) + SHUF(Ds * SHUF(v, LX2) + Bs * v, LX1))); break;
    case 1: LANE_VBODY(A * v + (C * SHUF(v, LX4) + SHUF(Ds * SHUF(v, LX4) + Bs * v, LX1))); break;
    default: LANE_VBODY(A * v + (C * SHUF(v, LX8) + SHUF(Ds * SHUF(v, LX8) + Bs * v, LX1))); break;
    }
}
#else
static void SFX(lane_part)(R *restrict s, int p, int diag, const R *A, const R *B, const R *C,
                           const R *D, const int *hb, int nh, i64 j0, i64 j1) {
    if (diag) {  /* diagonal: no partner terms */
        LANE_BODY(2, LANE_DIAG);
        return;
    }
    switch (p) {
    case 0: LANE_BODY(2, LANE_FULL(2)); break;
    case 1: LANE_BODY(4, LANE_FULL(4)); break;
    default: LANE_BODY(8, LANE_FULL(8)); break;
    }
}

#endif

static void SFX(lane_1q)(R *s, int nbits, const gate_t *g, const R *u, int par) {
    int p = __builtin_ctzll((unsigned long long)g->tmask), hb[64], nh = 0;
    R A[16], B[16], C[16], D[16];
    SFX(lane_coeffs)(g, u, p, A, B, C, D);
    /* group-index bits forced to 1: the controls on bits 3-62 */
    for (unsigned long long m = ((unsigned long long)g->cmask >> 3) & ((1ULL << 60) - 1); m;
         m &= m - 1)
        hb[nh++] = __builtin_ctzll(m);
    const i64 ngroups = (i64)1 << (nbits - 3 - nh);
    if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
        {
            i64 j0, j1;
            share(ngroups, THREAD_ID, NUM_THREADS, &j0, &j1);
            SFX(lane_part)(s, p, g->kind == K_DIAG, A, B, C, D, hb, nh, j0, j1);
        }
        return;
    }
    SFX(lane_part)(s, p, g->kind == K_DIAG, A, B, C, D, hb, nh, 0, ngroups);
}

#if QD_VEC
static void SFX(flip_low_part)(R *restrict s, int p, int lo, const int *hb, int nh, i64 j0,
                               i64 j1);
/* X on bit p < 3 with any controls: a constant permutation inside each group of 8 amplitudes
 * whose high control bits are 1 (flip_low_part). */
static void SFX(flip_low_1q)(R *s, int nbits, const gate_t *g, int par) {
    int p = __builtin_ctzll((unsigned long long)g->tmask), hb[64], nh = 0;
    for (unsigned long long m = ((unsigned long long)g->cmask >> 3) & ((1ULL << 60) - 1); m;
         m &= m - 1)
        hb[nh++] = __builtin_ctzll(m);
    const int lo = (int)(g->cmask & 7);
    const i64 ngroups = (i64)1 << (nbits - 3 - nh);
    if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
        {
            i64 j0, j1;
            share(ngroups, THREAD_ID, NUM_THREADS, &j0, &j1);
            SFX(flip_low_part)(s, p, lo, hb, nh, j0, j1);
        }
        return;
    }
    SFX(flip_low_part)(s, p, lo, hb, nh, 0, ngroups);
}
#endif

/* X on bit p with at most one control bit c (-1: none), in the block layout: swap the two
 * halves of each block whose control is set, as contiguous runs of reals. */
static void SFX(swap_run)(R *restrict x, R *restrict y, i64 len) {
    for (i64 e = 0; e < len; e++) {
        R t = x[e];
        x[e] = y[e];
        y[e] = t;
    }
}

#if QD_VEC
static void SFX(swap_blocks_v)(R *restrict s, i64 w, i64 cb, i64 j0, i64 j1);
#endif

static void SFX(flip_part)(R *s, int p, int c, i64 j0, i64 j1) {
    const i64 w = (i64)2 << p;  /* reals per half block */
    if (c < 0 || c > p) {
        const i64 cb = c < 0 ? 0 : (i64)1 << (c - p - 1);
#if QD_VEC
        if (w >= 64 / (i64)sizeof(R)) {  /* halves of whole vectors */
            SFX(swap_blocks_v)(s, w, cb, j0, j1);
            return;
        }
#endif
        for (i64 j = j0; j < j1; j++)
            if (!cb || (j & cb)) SFX(swap_run)(s + 2 * w * j, s + 2 * w * j + w, w);
        return;
    }
    if (c < 2 && w >= 16) {  /* control on bit 0 or 1: masked swaps of 8-amplitude groups */
#if QD_VEC
        /* as constant blends of the two halves' 64-byte vectors (lanes whose control is set
         * swap); a 16-double vector would be split into scalar moves */
        typedef R vb_t __attribute__((vector_size(64)));
#if RBYTES == 4
#define FB(l, c) ((((l) >> ((c) + 1)) & 1) ? 16 + (l) : (l))
#define FBS(c) FB(0, c), FB(1, c), FB(2, c), FB(3, c), FB(4, c), FB(5, c), FB(6, c),          \
               FB(7, c), FB(8, c), FB(9, c), FB(10, c), FB(11, c), FB(12, c), FB(13, c),       \
               FB(14, c), FB(15, c)
#else
#define FB(l, c) ((((l) >> ((c) + 1)) & 1) ? 8 + (l) : (l))
#define FBS(c) FB(0, c), FB(1, c), FB(2, c), FB(3, c), FB(4, c), FB(5, c), FB(6, c), FB(7, c)
#endif
#define FLIP_BLEND(C)                                                                          \
        for (i64 j = j0; j < j1; j++) {                                                        \
            R *restrict x = s + 2 * w * j, *restrict y = x + w;                                \
            for (i64 e = 0; e < w; e += 64 / (i64)sizeof(R)) {                                 \
                vb_t xv, yv, nx, ny;                                                           \
                memcpy(&xv, x + e, 64); memcpy(&yv, y + e, 64);                                \
                QD_INREG(xv); QD_INREG(yv);                                                    \
                nx = __builtin_shufflevector(xv, yv, FBS(C));                                  \
                ny = __builtin_shufflevector(yv, xv, FBS(C));                                  \
                memcpy(x + e, &nx, 64); memcpy(y + e, &ny, 64);                                \
            }                                                                                  \
        }
        if (c == 0) { FLIP_BLEND(0) } else { FLIP_BLEND(1) }
#undef FLIP_BLEND
#undef FBS
#undef FB
        return;
#endif
        for (i64 j = j0; j < j1; j++) {
            R *restrict x = s + 2 * w * j, *restrict y = x + w;
            for (i64 e = 0; e < w; e += 16)
                for (int l = 0; l < 16; l++) {
                    int on = (l >> (c + 1)) & 1;
                    R xv = x[e + l], yv = y[e + l];
                    x[e + l] = on ? yv : xv;
                    y[e + l] = on ? xv : yv;
                }
        }
        return;
    }
    const i64 run = (i64)2 << c;  /* reals: 2^c amplitudes with the control set */
    for (i64 j = j0; j < j1; j++)
        for (i64 r = run; r < w; r += 2 * run)
            SFX(swap_run)(s + 2 * w * j + r, s + 2 * w * j + w + r, run);
}

static void SFX(flip_1q_low)(R *s, int nbits, int p, int c, int par) {
    const i64 nblk = (i64)1 << (nbits - 1 - p);
    if (par > 1 && nbits >= PAR_MIN_BITS && nblk >= par) {
#pragma omp parallel num_threads(par)
        {
            i64 j0, j1;
            share(nblk, THREAD_ID, NUM_THREADS, &j0, &j1);
            SFX(flip_part)(s, p, c, j0, j1);
        }
        return;
    }
    SFX(flip_part)(s, p, c, 0, nblk);
}

/* ---------------------------------------------------------------------------------------- */
/* any gate                                                                                   */

#ifndef FZ_MIN_N
#define FZ_MIN_N 6
#endif
static void SFX(fz_expand)(const gate_t *g, const R *u, int nb, const int *bl, double *E);
static void SFX(fz_apply2)(R *st, int nbits, int hi, int lo, const R *m, int par, int sel,
                           const R *m1);

/* Apply gate g with data u (this binding's) to the 2^nbits amplitudes at st. */
static void SFX(apply_range)(R *st, int nbits, const gate_t *g, const R *u_in, int dag,
                             int par_, SFX(scratch_t) *sc) {
    R small[32];
    const R *u = SFX(effective)(g, u_in, dag, g->k <= 2 ? small : sc->u);
    R *restrict s = st;
#if QD_VEC
    /* SWAP of two bits below 3: a permutation inside each group of 8 amplitudes (elsewhere
     * the swap loop below moves contiguous runs); any other uncontrolled two-bit gate (Ising,
     * Givens, excitations, iSWAP, a two-bit diagonal): its 4x4 matrix through the fused-block
     * kernels, which have vector loops for every placement of the two bits (the generic loops
     * below index every amplitude: 3-22x lightning.qubit's time per gate, measured) */
    if (g->kind == K_SWAP && g->cmask == 0 && nbits >= 3) {
        const int h = g->bits[0] > g->bits[1] ? g->bits[0] : g->bits[1];
        const int l = g->bits[0] > g->bits[1] ? g->bits[1] : g->bits[0];
        if (h < 3) SFX(swap_low)(s, nbits, h, l, par_);
        else SFX(swap_groups)(s, nbits, h, l, par_);
        return;
    }
    /* a diagonal on two bits (CZ, CP, IsingZZ) or a controlled one-bit diagonal (CRZ, CCZ):
     * by groups of 8 amplitudes with per-lane constants, visiting only the groups where it is
     * not the identity (the generic loop below indexes every amplitude) */
    if (g->kind == K_DIAG && g->k <= 2 && (g->k == 2 || g->cmask != 0) && nbits >= 3) {
        SFX(diag_groups)(s, nbits, g, u, par_);
        return;
    }
    if (g->k == 2 && g->cmask == 0 && g->kind != K_SWAP && nbits >= FZ_MIN_N) {
        const int bl[2] = {g->bits[0] > g->bits[1] ? g->bits[0] : g->bits[1],
                           g->bits[0] > g->bits[1] ? g->bits[1] : g->bits[0]};
        double E[32];
        R m[32];
        SFX(fz_expand)(g, u, 2, bl, E);
        for (int e = 0; e < 32; e++) m[e] = (R)E[e];
        SFX(fz_apply2)(s, nbits, bl[0], bl[1], m, par_, -1, 0);
        return;
    }
#endif
    if (g->k == 1 && g->tmask < 8 && nbits >= 3 + __builtin_popcountll(g->cmask >> 3) &&
        (g->cmask >> nbits) == 0) {
#if QD_VEC
        if (g->kind == K_FLIP) {
            SFX(flip_low_1q)(s, nbits, g, par_);
            return;
        }
#endif
        SFX(lane_1q)(s, nbits, g, u, par_);
        return;
    }
    if (g->kind == K_FLIP && g->k == 1 && __builtin_popcountll(g->cmask) <= 1) {
        int p = __builtin_ctzll(g->tmask), c = g->cmask ? __builtin_ctzll(g->cmask) : -1;
        i64 nblk = (i64)1 << (nbits - 1 - p);
        if (nbits > p && nbits > c && (par_ <= 1 || nblk >= par_)) {
            SFX(flip_1q_low)(s, nbits, p, c, par_);
            return;
        }
    }
    if (g->k == 1 && g->cmask == 0 && nbits > g->special[0] &&
        (g->kind == K_DENSE || g->kind == K_DIAG)) {
        SFX(one_qubit_low)(s, nbits, g->special[0], u, g->kind == K_DIAG, par_);
        return;
    }
    if (g->kind == K_DENSE && g->k == 1) {
        const i64 o1 = g->off[1];
        const R m00r = u[0], m00i = u[1], m01r = u[2], m01i = u[3];
        const R m10r = u[4], m10i = u[5], m11r = u[6], m11i = u[7];
        FOR_GROUPS_ANY(g, nbits, {
            R a0r = RE(s, base), a0i = IM(s, base);
            R a1r = RE(s, base + o1), a1i = IM(s, base + o1);
            RE(s, base) = m00r * a0r - m00i * a0i + m01r * a1r - m01i * a1i;
            IM(s, base) = m00r * a0i + m00i * a0r + m01r * a1i + m01i * a1r;
            RE(s, base + o1) = m10r * a0r - m10i * a0i + m11r * a1r - m11i * a1i;
            IM(s, base + o1) = m10r * a0i + m10i * a0r + m11r * a1i + m11i * a1r;
        });
    } else if (g->kind == K_DENSE && g->k == 2) {
        /* two-qubit gates (Ising, Givens, iSWAP, ...): a fixed 4x4 body the compiler vectorises
         * over the contiguous amplitudes, instead of the generic loops */
        const i64 o1 = g->off[1], o2 = g->off[2], o3 = g->off[3];
        R mr[16], mi[16];
        for (int e = 0; e < 16; e++) { mr[e] = u[2 * e]; mi[e] = u[2 * e + 1]; }
        FOR_GROUPS_ANY(g, nbits, {
            R ar[4], ai[4];
            ar[0] = RE(s, base); ai[0] = IM(s, base);
            ar[1] = RE(s, base + o1); ai[1] = IM(s, base + o1);
            ar[2] = RE(s, base + o2); ai[2] = IM(s, base + o2);
            ar[3] = RE(s, base + o3); ai[3] = IM(s, base + o3);
            R yr[4], yi[4];
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
        int nact = 0, nnz = 0, *ptr = sc->ptr, *rows = sc->rows, *cols = sc->cols;
        R *vr = sc->vr, *vi = sc->vi;
        ptr[0] = 0;
        for (int r = 0; r < d; r++) {
            int start = nnz, ident = 1;
            for (int c = 0; c < d; c++) {
                R re = u[2 * (r * d + c)], im = u[2 * (r * d + c) + 1];
                if (re != 0 || im != 0) {
                    cols[nnz] = c; vr[nnz] = re; vi[nnz] = im; nnz++;
                    if (c != r || re != 1 || im != 0) ident = 0;
                } else if (c == r) {
                    ident = 0;
                }
            }
            if (ident) { nnz = start; continue; }
            rows[nact++] = r;
            ptr[nact] = nnz;
        }
        if (nact == 0) return;
        /* only the columns those rows read are loaded (a DoubleExcitation: 2 of 16) */
        int ncol = 0, *colv = sc->colv;
        for (int c = 0; c < d; c++)
            for (int e = 0; e < nnz; e++)
                if (cols[e] == c) { colv[ncol++] = c; break; }
        if (nact == 2 && ncol == 2 && rows[0] == colv[0] && rows[1] == colv[1]) {
            /* a 2x2 on two basis states of the group (a DoubleExcitation): those two only */
            R m[8] = {0};
            for (int a = 0; a < 2; a++)
                for (int e = ptr[a]; e < ptr[a + 1]; e++) {
                    const int b = cols[e] == colv[1];
                    m[2 * (2 * a + b)] = vr[e]; m[2 * (2 * a + b) + 1] = vi[e];
                }
            const i64 p0 = g->off[colv[0]], p1 = g->off[colv[1]];
            FOR_GROUPS_ANY(g, nbits, {
                R a0r = RE(s, base + p0), a0i = IM(s, base + p0);
                R a1r = RE(s, base + p1), a1i = IM(s, base + p1);
                RE(s, base + p0) = m[0] * a0r - m[1] * a0i + m[2] * a1r - m[3] * a1i;
                IM(s, base + p0) = m[0] * a0i + m[1] * a0r + m[2] * a1i + m[3] * a1r;
                RE(s, base + p1) = m[4] * a0r - m[5] * a0i + m[6] * a1r - m[7] * a1i;
                IM(s, base + p1) = m[4] * a0i + m[5] * a0r + m[6] * a1i + m[7] * a1r;
            });
            return;
        }
        FOR_GROUPS_ANY(g, nbits, {
            R xr[1 << MAXK], xi[1 << MAXK], yr[1 << MAXK], yi[1 << MAXK];
            for (int q = 0; q < ncol; q++) {
                const i64 i = base + g->off[colv[q]];
                xr[colv[q]] = RE(s, i); xi[colv[q]] = IM(s, i);
            }
            for (int a = 0; a < nact; a++) {
                R ar = 0, ai = 0;
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
        const R d0r = u[0], d0i = u[1], d1r = u[2], d1i = u[3];
        if (d0r == 1 && d0i == 0) {  /* a phase on the 1 half only (CZ, CP, S, T): half the reads */
            FOR_GROUPS_ANY(g, nbits, {
                R a1r = RE(s, base + o1), a1i = IM(s, base + o1);
                RE(s, base + o1) = d1r * a1r - d1i * a1i;
                IM(s, base + o1) = d1r * a1i + d1i * a1r;
            });
        } else {
            FOR_GROUPS_ANY(g, nbits, {
                R a0r = RE(s, base), a0i = IM(s, base);
                R a1r = RE(s, base + o1), a1i = IM(s, base + o1);
                RE(s, base) = d0r * a0r - d0i * a0i;
                IM(s, base) = d0r * a0i + d0i * a0r;
                RE(s, base + o1) = d1r * a1r - d1i * a1i;
                IM(s, base + o1) = d1r * a1i + d1i * a1r;
            });
        }
    } else if (g->kind == K_DIAG) {
        const int d = 1 << g->k;
        FOR_GROUPS_ANY(g, nbits, {
            for (int m = 0; m < d; m++) {
                i64 i = base + g->off[m];
                R ar = RE(s, i), ai = IM(s, i);
                RE(s, i) = u[2 * m] * ar - u[2 * m + 1] * ai;
                IM(s, i) = u[2 * m] * ai + u[2 * m + 1] * ar;
            }
        });
    } else if (g->kind == K_FLIP && g->k == 1) {
        const i64 o1 = g->off[1];
        FOR_GROUPS_ANY(g, nbits, {
            R tr = RE(s, base), ti = IM(s, base);
            RE(s, base) = RE(s, base + o1); IM(s, base) = IM(s, base + o1);
            RE(s, base + o1) = tr; IM(s, base + o1) = ti;
        });
    } else if (g->kind == K_FLIP) {
        const int d = 1 << g->k;
        FOR_GROUPS_ANY(g, nbits, {
            for (int m = 0; m < d / 2; m++) {
                i64 i = base + g->off[m], j = base + g->off[d - 1 - m];
                R tr = RE(s, i), ti = IM(s, i);
                RE(s, i) = RE(s, j); IM(s, i) = IM(s, j);
                RE(s, j) = tr; IM(s, j) = ti;
            }
        });
    } else { /* K_SWAP */
        const i64 o1 = g->off[1], o2 = g->off[2];
        FOR_GROUPS_ANY(g, nbits, {
            R tr = RE(s, base + o1), ti = IM(s, base + o1);
            RE(s, base + o1) = RE(s, base + o2); IM(s, base + o1) = IM(s, base + o2);
            RE(s, base + o2) = tr; IM(s, base + o2) = ti;
        });
    }
}

/* ---------------------------------------------------------------------------------------- */
/* overlaps <lam| . |psi> for the adjoint sweep                                               */

#if QD_VEC
/* The same step with vectors of VL reals (64 bytes: 16 floats or 8 doubles) and constant
 * shuffles, and (complex64) the overlap sums kept in single precision for at most STEP_FLUSH
 * vectors per lane before they are added to double sums: the whole step then runs at the
 * width of the data.
 *  Halves of w >= VL reals (block path): a0, a1 are VL reals of each half;
 *  w < VL (lane path): a vector holds whole blocks, the partner of lane e is lane e ^ w.
 * Sums: r_rc += l_r * a_c and i_rc += l_r * swap(a_c) (swap: re <-> im), so that
 * Re M[r][c] = sum of r_rc over the lanes and Im M[r][c] = even minus odd lanes of i_rc. */
#if RBYTES == 4
#define VL 16
#define VX1 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14
#define VX2 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13
#define VX3 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12
#define VX4 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11
#define VX5 5, 4, 7, 6, 1, 0, 3, 2, 13, 12, 15, 14, 9, 8, 11, 10
#define VX8 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7
#define VX9 9, 8, 11, 10, 13, 12, 15, 14, 1, 0, 3, 2, 5, 4, 7, 6
#define STEP_FLUSH 64
#else
#define VL 8
#define VX1 1, 0, 3, 2, 5, 4, 7, 6
#define VX2 2, 3, 0, 1, 6, 7, 4, 5
#define VX3 3, 2, 1, 0, 7, 6, 5, 4
#define VX4 4, 5, 6, 7, 0, 1, 2, 3
#define VX5 5, 4, 7, 6, 1, 0, 3, 2
#define STEP_FLUSH (1 << 30)
#endif
typedef R SFX(vv) __attribute__((vector_size(VL * sizeof(R))));
typedef struct { double d[8][VL]; } SFX(vacc_t);

static inline SFX(vv) SFX(vvld)(const R *p) {
    SFX(vv) v;
    memcpy(&v, p, sizeof v);
    QD_INREG(v);
    return v;
}
static inline void SFX(vvst)(R *p, SFX(vv) v) { memcpy(p, &v, sizeof v); }

/* da += acc, acc = 0: whole-vector conversions and adds (an element loop over acc made GCC keep
 * the accumulators in memory, re-read and re-written at every step of the loop) */
typedef double SFX(vdd) __attribute__((vector_size(64)));
#if RBYTES == 4
typedef float SFX(vhalf) __attribute__((vector_size(32)));
#endif
QD_FMA static inline __attribute__((always_inline)) void SFX(vflush)(SFX(vacc_t) *da, SFX(vv) *acc) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        SFX(vdd) d0;
        memcpy(&d0, da->d[k], sizeof d0);
#if RBYTES == 4
        SFX(vdd) d1;
        memcpy(&d1, da->d[k] + 8, sizeof d1);
        d0 += __builtin_convertvector(
            (SFX(vhalf))__builtin_shufflevector(acc[k], acc[k], 0, 1, 2, 3, 4, 5, 6, 7),
            SFX(vdd));
        d1 += __builtin_convertvector(
            (SFX(vhalf))__builtin_shufflevector(acc[k], acc[k], 8, 9, 10, 11, 12, 13, 14, 15),
            SFX(vdd));
        memcpy(da->d[k] + 8, &d1, sizeof d1);
#else
        d0 += acc[k];
#endif
        memcpy(da->d[k], &d0, sizeof d0);
        acc[k] = (SFX(vv)){0};
    }
}

/* block path: halves of w >= VL reals, blocks [j0, j1), reals [e0, e1) of each half
 * (multiples of 16); upd: 0 sums only, 1 also psi <- V psi, 2 also lam <- V lam */
QD_FMA static inline __attribute__((always_inline)) void SFX(vstep_blocks)(
        R *restrict psi, R *restrict lam, i64 w, const R *v, int upd, i64 j0, i64 j1, i64 e0,
        i64 e1, SFX(vacc_t) *da) {
    SFX(vv) acc[8], V[8];
    for (int k = 0; k < 8; k++) acc[k] = (SFX(vv)){0};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < VL; l++) {
            V[2 * k][l] = v[2 * k];
            V[2 * k + 1][l] = (l & 1) ? v[2 * k + 1] : -v[2 * k + 1];
        }
    int cnt = 0;
    const int pf = pf_run(w * (i64)sizeof(R));
    const i64 pd = PF_BYTES / (i64)sizeof(R);
    for (i64 j = j0; j < j1; j++) {
        R *restrict lx = lam + 2 * w * j, *restrict ly = lx + w;
        R *restrict px = psi + 2 * w * j, *restrict py = px + w;
        for (i64 e = e0; e < e1; e += VL) {
            if (pf) {
                const i64 o_ = pf_ahead(e, pd, w);
                PF_AT(px, o_, sizeof(R)); PF_AT(px, o_ + w, sizeof(R));
                PF_AT(lx, o_, sizeof(R)); PF_AT(lx, o_ + w, sizeof(R));
            }
            SFX(vv) a0 = SFX(vvld)(px + e), a1 = SFX(vvld)(py + e);
            SFX(vv) l0 = SFX(vvld)(lx + e), l1 = SFX(vvld)(ly + e);
            SFX(vv) s0 = SHUF(a0, VX1), s1 = SHUF(a1, VX1);
            acc[0] += l0 * a0; acc[1] += l0 * s0; acc[2] += l0 * a1; acc[3] += l0 * s1;
            acc[4] += l1 * a0; acc[5] += l1 * s0; acc[6] += l1 * a1; acc[7] += l1 * s1;
            if (upd >= 1) {
                SFX(vvst)(px + e, V[0] * a0 + V[1] * s0 + V[2] * a1 + V[3] * s1);
                SFX(vvst)(py + e, V[4] * a0 + V[5] * s0 + V[6] * a1 + V[7] * s1);
            }
            if (upd >= 2) {
                SFX(vv) t0 = SHUF(l0, VX1), t1 = SHUF(l1, VX1);
                SFX(vvst)(lx + e, V[0] * l0 + V[1] * t0 + V[2] * l1 + V[3] * t1);
                SFX(vvst)(ly + e, V[4] * l0 + V[5] * t0 + V[6] * l1 + V[7] * t1);
            }
            if (++cnt == STEP_FLUSH) { SFX(vflush)(da, acc); cnt = 0; }
        }
    }
    SFX(vflush)(da, acc);
}

/* A dense one-qubit gate u on halves of w >= VL reals: blocks [j0, j1), reals [e0, e1) of
 * each half (multiples of VL). */
QD_FMA static void SFX(vdense_1q_part)(R *restrict s, i64 w, const R *u, int pf, i64 j0,
                                       i64 j1, i64 e0, i64 e1) {
    SFX(vv) V[8];
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < VL; l++) {
            V[2 * k][l] = u[2 * k];
            V[2 * k + 1][l] = (l & 1) ? u[2 * k + 1] : -u[2 * k + 1];
        }
    const i64 pd = PF_BYTES / (i64)sizeof(R);
    for (i64 j = j0; j < j1; j++) {
        R *restrict x = s + 2 * w * j, *restrict y = x + w;
        i64 e = e0;
        if (!pf)  /* two vectors per half at a time (more loads in flight) */
            for (; e + 2 * VL <= e1; e += 2 * VL) {
                SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
                SFX(vv) b0 = SFX(vvld)(x + e + VL), b1 = SFX(vvld)(y + e + VL);
                SFX(vv) s0 = SHUF(a0, VX1), s1 = SHUF(a1, VX1);
                SFX(vv) t0 = SHUF(b0, VX1), t1 = SHUF(b1, VX1);
                SFX(vvst)(x + e, V[0] * a0 + V[1] * s0 + V[2] * a1 + V[3] * s1);
                SFX(vvst)(y + e, V[4] * a0 + V[5] * s0 + V[6] * a1 + V[7] * s1);
                SFX(vvst)(x + e + VL, V[0] * b0 + V[1] * t0 + V[2] * b1 + V[3] * t1);
                SFX(vvst)(y + e + VL, V[4] * b0 + V[5] * t0 + V[6] * b1 + V[7] * t1);
            }
        for (; e < e1; e += VL) {
            if (pf) {
                const i64 o_ = pf_ahead(e, pd, w);
                PF_AT(x, o_, sizeof(R)); PF_AT(x, o_ + w, sizeof(R));
            }
            SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
            SFX(vv) s0 = SHUF(a0, VX1), s1 = SHUF(a1, VX1);
            SFX(vvst)(x + e, V[0] * a0 + V[1] * s0 + V[2] * a1 + V[3] * s1);
            SFX(vvst)(y + e, V[4] * a0 + V[5] * s0 + V[6] * a1 + V[7] * s1);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* gates on the lowest bits (0-2) at the vector width                                         */

/* A group of 8 amplitudes (16 reals) is one vector of VL = 16 floats, or two of VL = 8 doubles
 * (lo: amplitudes 0-3, hi: 4-7): every operand is a hardware register, so the partner
 * permutations are register shuffles (a 16-double vector is wider than the registers and the
 * compiler would assemble each shuffled lane from a scalar load). */
#ifndef QD_LOWV_ONCE
#define QD_LOWV_ONCE
/* the real that lands on real e of a group when X on bit P acts where the group's low control
 * bits L are all 1 */
#define FI(e, P, L) (((((e) >> 1) & (L)) == (L)) ? ((e) ^ (2 << (P))) : (e))
#define FI8(o, P, L) FI((o), P, L), FI((o) + 1, P, L), FI((o) + 2, P, L), FI((o) + 3, P, L),   \
                     FI((o) + 4, P, L), FI((o) + 5, P, L), FI((o) + 6, P, L), FI((o) + 7, P, L)
#endif

#if RBYTES == 8
/* lane_part for complex128: out[e] = A[e] v[e] + B[e] v[e^1] + C[e] v[e^P] + D[e] v[e^P^1]
 * (P = 2 << p) on the two halves of each group. */
QD_FMA_CHAIN static void SFX(lane_part_v)(R *restrict s, int p, int diag, const R *A_, const R *B_,
                             const R *C_, const R *D_, const int *hb, int nh, i64 j0, i64 j1) {
    const SFX(vv) A0 = SFX(vvld)(A_), A1 = SFX(vvld)(A_ + 8), B0 = SFX(vvld)(B_),
                  B1 = SFX(vvld)(B_ + 8), C0 = SFX(vvld)(C_), C1 = SFX(vvld)(C_ + 8),
                  D0 = SFX(vvld)(D_), D1 = SFX(vvld)(D_ + 8);
/* (memcpy, not vvld/vvst: those are not inlined into lane_part_v, whose options differ) */
#define LANE_V(LO, HI)                                                                         \
    LOW_GROUPS({                                                                               \
        SFX(vv) a, b;                                                                          \
        memcpy(&a, v_, sizeof a);                                                              \
        memcpy(&b, v_ + 8, sizeof b);                                                          \
        QD_INREG(a); QD_INREG(b);                                                              \
        SFX(vv) x = LO, y = HI;                                                                \
        memcpy(v_, &x, sizeof x);                                                              \
        memcpy(v_ + 8, &y, sizeof y);                                                          \
    })
    if (diag) {
        LANE_V(A0 * a + B0 * SHUF(a, VX1), A1 * b + B1 * SHUF(b, VX1));
        return;
    }
    /* p < 2: B v[e^1] + D v[e^P^1] as (Bs v + Ds v[.^P]) re/im swapped (as lane_part); every
     * output one chain of multiply-adds in the order written */
    const SFX(vv) B0s = SHUF(B0, VX1), B1s = SHUF(B1, VX1), D0s = SHUF(D0, VX1),
                  D1s = SHUF(D1, VX1);
    switch (p) {
    case 0:
        LANE_V(A0 * a + (C0 * SHUF(a, VX2) + SHUF(D0s * SHUF(a, VX2) + B0s * a, VX1)),
               A1 * b + (C1 * SHUF(b, VX2) + SHUF(D1s * SHUF(b, VX2) + B1s * b, VX1)));
        break;
    case 1:
        LANE_V(A0 * a + (C0 * SHUF(a, VX4) + SHUF(D0s * SHUF(a, VX4) + B0s * a, VX1)),
               A1 * b + (C1 * SHUF(b, VX4) + SHUF(D1s * SHUF(b, VX4) + B1s * b, VX1)));
        break;
    default:
        LANE_V(A0 * a + (B0 * SHUF(a, VX1) + (C0 * b + D0 * SHUF(b, VX1))),
               A1 * b + (B1 * SHUF(b, VX1) + (C1 * a + D1 * SHUF(a, VX1))));
        break;
    }
}
#endif

/* The lane kernel when every output needs two products, not four: B = D = 0 (a real matrix:
 * RY, H) or B = C = 0 (a real diagonal and an imaginary off-diagonal: RX); lanes outside the
 * controls (A = 1, B = C = D = 0) fit both. Returns 0 (nothing done) for other matrices. */
QD_FMA static int SFX(lane_two)(R *restrict s, int p, const R *A_, const R *B_, const R *C_,
                         const R *D_, const int *hb, int nh, i64 j0, i64 j1) {
    int nb = 1, nc = 1, nd = 1;
    for (int e = 0; e < 16; e++) {
        nb &= B_[e] == 0;
        nc &= C_[e] == 0;
        nd &= D_[e] == 0;
    }
    if (!nb || !(nc || nd)) return 0;
    const int rx = !nd;            /* the partner term: D (re/im swapped partner), else C */
    const R *E_ = rx ? D_ : C_;
#if RBYTES == 8
    const SFX(vv) A0 = SFX(vvld)(A_), A1 = SFX(vvld)(A_ + 8), E0 = SFX(vvld)(E_),
                  E1 = SFX(vvld)(E_ + 8);
    switch (p * 2 + rx) {
    case 0: LANE_V(A0 * a + E0 * SHUF(a, VX2), A1 * b + E1 * SHUF(b, VX2)); break;
    case 1: LANE_V(A0 * a + E0 * SHUF(a, VX3), A1 * b + E1 * SHUF(b, VX3)); break;
    case 2: LANE_V(A0 * a + E0 * SHUF(a, VX4), A1 * b + E1 * SHUF(b, VX4)); break;
    case 3: LANE_V(A0 * a + E0 * SHUF(a, VX5), A1 * b + E1 * SHUF(b, VX5)); break;
    case 4: LANE_V(A0 * a + E0 * b, A1 * b + E1 * a); break;
    default: LANE_V(A0 * a + E0 * SHUF(b, VX1), A1 * b + E1 * SHUF(a, VX1)); break;
    }
#else
    const SFX(vv) A = SFX(vvld)(A_), E = SFX(vvld)(E_);
#define TWO_V(EXPR)                                                                            \
    LOW_GROUPS({                                                                               \
        SFX(vv) a = SFX(vvld)(v_);                                                             \
        SFX(vvst)(v_, EXPR);                                                                   \
    })
    switch (p * 2 + rx) {
    case 0: TWO_V(A * a + E * SHUF(a, VX2)); break;
    case 1: TWO_V(A * a + E * SHUF(a, VX3)); break;
    case 2: TWO_V(A * a + E * SHUF(a, VX4)); break;
    case 3: TWO_V(A * a + E * SHUF(a, VX5)); break;
    case 4: TWO_V(A * a + E * SHUF(a, VX8)); break;
    default: TWO_V(A * a + E * SHUF(a, VX9)); break;
    }
#endif
#undef TWO_V
#undef LANE_V
    return 1;
}

/* vdense_1q_part with the products the matrix needs: a real matrix (RY, H) or a real diagonal
 * with an imaginary off-diagonal (RX) takes two vector products per output instead of four. */
QD_FMA static void SFX(vdense_1q_fwd)(R *restrict s, i64 w, const R *u, int pf, int pf_light,
                                      i64 j0, i64 j1, i64 e0, i64 e1) {
    const int real = u[1] == 0 && u[3] == 0 && u[5] == 0 && u[7] == 0;
    const int rx = u[1] == 0 && u[7] == 0 && u[2] == 0 && u[4] == 0;
    if (!real && !rx) {
        SFX(vdense_1q_part)(s, w, u, pf, j0, j1, e0, e1);
        return;
    }
    /* broadcasts (built lane by lane the coefficients stayed in memory, one more load each
     * per vector) */
    const SFX(vv) zero = {0};
    SFX(vv) alt = zero + 1;  /* -1 on real lanes, +1 on imaginary lanes */
    for (int l = 0; l < VL; l += 2) alt[l] = -1;
    const SFX(vv) P0 = zero + u[0], P3 = zero + u[6];
    const SFX(vv) Q1 = real ? zero + u[2] : alt * u[3], Q2 = real ? zero + u[4] : alt * u[5];
    const i64 pd = PF_BYTES / (i64)sizeof(R);
    if (real) {
        for (i64 j = j0; j < j1; j++) {
            R *restrict x = s + 2 * w * j, *restrict y = x + w;
            i64 e = e0;
            if (!pf_light)  /* two vectors per half at a time (more loads in flight) */
                for (; e + 2 * VL <= e1; e += 2 * VL) {
                    SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
                    SFX(vv) b0 = SFX(vvld)(x + e + VL), b1 = SFX(vvld)(y + e + VL);
                    SFX(vvst)(x + e, P0 * a0 + Q1 * a1);
                    SFX(vvst)(y + e, Q2 * a0 + P3 * a1);
                    SFX(vvst)(x + e + VL, P0 * b0 + Q1 * b1);
                    SFX(vvst)(y + e + VL, Q2 * b0 + P3 * b1);
                }
            for (; e < e1; e += VL) {
                if (pf_light) {
                    const i64 o_ = pf_ahead(e, pd, w);
                    PF_AT(x, o_, sizeof(R)); PF_AT(x, o_ + w, sizeof(R));
                }
                SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
                SFX(vvst)(x + e, P0 * a0 + Q1 * a1);
                SFX(vvst)(y + e, Q2 * a0 + P3 * a1);
            }
        }
        return;
    }
    for (i64 j = j0; j < j1; j++) {
        R *restrict x = s + 2 * w * j, *restrict y = x + w;
        i64 e = e0;
        if (!pf_light)  /* two vectors per half at a time (more loads in flight) */
            for (; e + 2 * VL <= e1; e += 2 * VL) {
                SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
                SFX(vv) b0 = SFX(vvld)(x + e + VL), b1 = SFX(vvld)(y + e + VL);
                SFX(vvst)(x + e, P0 * a0 + Q1 * SHUF(a1, VX1));
                SFX(vvst)(y + e, Q2 * SHUF(a0, VX1) + P3 * a1);
                SFX(vvst)(x + e + VL, P0 * b0 + Q1 * SHUF(b1, VX1));
                SFX(vvst)(y + e + VL, Q2 * SHUF(b0, VX1) + P3 * b1);
            }
        for (; e < e1; e += VL) {
            if (pf_light) {
                const i64 o_ = pf_ahead(e, pd, w);
                PF_AT(x, o_, sizeof(R)); PF_AT(x, o_ + w, sizeof(R));
            }
            SFX(vv) a0 = SFX(vvld)(x + e), a1 = SFX(vvld)(y + e);
            SFX(vvst)(x + e, P0 * a0 + Q1 * SHUF(a1, VX1));
            SFX(vvst)(y + e, Q2 * SHUF(a0, VX1) + P3 * a1);
        }
    }
}

/* X on bit p < 3 where the low control bits lo (of bits 0-2) are all 1, in the groups of
 * [j0, j1) (group bits hb[0..nh) forced to 1: the high controls): a constant permutation of
 * each group's reals, no arithmetic. In complex128 a half whose amplitudes all have a control
 * bit 0 (lo has bit 2: amplitudes 0-3) is neither read nor written. */
#if RBYTES == 8
#define FLIP_V(P, L)                                                                           \
    LOW_GROUPS({                                                                               \
        SFX(vv) a = SFX(vvld)(v_), b = SFX(vvld)(v_ + 8);                                      \
        SFX(vv) x = __builtin_shufflevector(a, b, FI8(0, P, L));                               \
        SFX(vv) y = __builtin_shufflevector(a, b, FI8(8, P, L));                               \
        if (!((L) & 4)) SFX(vvst)(v_, x);                                                      \
        SFX(vvst)(v_ + 8, y);                                                                  \
    })
#else
#define FLIP_V(P, L)                                                                           \
    LOW_GROUPS({                                                                               \
        SFX(vv) a = SFX(vvld)(v_);                                                             \
        SFX(vvst)(v_, __builtin_shufflevector(a, a, FI8(0, P, L), FI8(8, P, L)));              \
    })
#endif
/* X on bit p (halves of w >= VL reals) in the blocks [j0, j1) whose control bit cb is set (cb
 * = 0: every block): the halves swapped as 64-byte vectors; the blocks without the control
 * are skipped a run at a time (no per-run set-up of a generic swap loop: 16-64 vectors per
 * half on the middle bits of a cache-resident state). */
static void SFX(swap_blocks_v)(R *restrict s, i64 w, i64 cb, i64 j0, i64 j1) {
    for (i64 j = j0; j < j1; j++) {
        if (cb && !(j & cb)) {  /* the rest of this run of blocks without the control */
            j |= cb - 1;
            continue;
        }
        R *restrict x = s + 2 * w * j, *restrict y = x + w;
        for (i64 e = 0; e < w; e += VL) {
            SFX(vv) a = SFX(vvld)(x + e), b = SFX(vvld)(y + e);
            SFX(vvst)(x + e, b);
            SFX(vvst)(y + e, a);
        }
    }
}

static void SFX(flip_low_part)(R *restrict s, int p, int lo, const int *hb, int nh, i64 j0,
                               i64 j1) {
    switch (p * 8 + lo) {
    case 0: FLIP_V(0, 0); break;
    case 2: FLIP_V(0, 2); break;
    case 4: FLIP_V(0, 4); break;
    case 6: FLIP_V(0, 6); break;
    case 8: FLIP_V(1, 0); break;
    case 9: FLIP_V(1, 1); break;
    case 12: FLIP_V(1, 4); break;
    case 13: FLIP_V(1, 5); break;
    case 16: FLIP_V(2, 0); break;
    case 17: FLIP_V(2, 1); break;
    case 18: FLIP_V(2, 2); break;
    default: FLIP_V(2, 3); break;
    }
}
#undef FLIP_V

/* SWAP of bits h > l, both below 3: a constant permutation of every group of 8 amplitudes
 * (the real that lands on real e: bits h and l of its amplitude exchanged). */
#ifndef QD_SWI_ONCE
#define QD_SWI_ONCE
#define SWI(e, H, L)                                                                           \
    (2 * ((((e) >> 1) & ~((1 << (H)) | (1 << (L)))) | ((((e) >> (1 + (H))) & 1) << (L)) |     \
          ((((e) >> (1 + (L))) & 1) << (H))) + ((e) & 1))
#define SWI8(o, H, L) SWI((o), H, L), SWI((o) + 1, H, L), SWI((o) + 2, H, L),                  \
                      SWI((o) + 3, H, L), SWI((o) + 4, H, L), SWI((o) + 5, H, L),              \
                      SWI((o) + 6, H, L), SWI((o) + 7, H, L)
#endif
#if RBYTES == 8
#define SWAP_V(H, L)                                                                           \
    LOW_GROUPS({                                                                               \
        SFX(vv) a = SFX(vvld)(v_), b = SFX(vvld)(v_ + 8);                                      \
        SFX(vvst)(v_, __builtin_shufflevector(a, b, SWI8(0, H, L)));                           \
        SFX(vvst)(v_ + 8, __builtin_shufflevector(a, b, SWI8(8, H, L)));                       \
    })
#else
#define SWAP_V(H, L)                                                                           \
    LOW_GROUPS({                                                                               \
        SFX(vv) a = SFX(vvld)(v_);                                                             \
        SFX(vvst)(v_, __builtin_shufflevector(a, a, SWI8(0, H, L), SWI8(8, H, L)));            \
    })
#endif
static void SFX(swap_low_part)(R *restrict s, int h, int l, i64 j0, i64 j1) {
    const int nh = 0, *hb = 0;
    (void)hb;
    switch (h * 4 + l) {
    case 4: SWAP_V(1, 0); break;
    case 8: SWAP_V(2, 0); break;
    default: SWAP_V(2, 1); break;
    }
}
#undef SWAP_V

static void SFX(swap_low)(R *s, int nbits, int h, int l, int par) {
    const i64 ngroups = (i64)1 << (nbits - 3);
    if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
        {
            i64 j0, j1;
            share(ngroups, THREAD_ID, NUM_THREADS, &j0, &j1);
            SFX(swap_low_part)(s, h, l, j0, j1);
        }
        return;
    }
    SFX(swap_low_part)(s, h, l, 0, ngroups);
}

/* Groups of 8 amplitudes (16 reals) whose group-index bits at pos[0..np) (ascending) hold
 * val[...]: BODY runs with gi, the group index, for each in ascending order, in runs of
 * consecutive groups (up to the lowest fixed bit, at most 2^12), the runs' starts stepped by
 * setting the fixed and in-run bits, adding one, clearing them; split over the threads by runs
 * for a large state. */
#ifndef QD_DEPOSIT_ONCE
#define QD_DEPOSIT_ONCE
static inline i64 deposit_bits(i64 j, const int *pos, int np) {
    for (int q = 0; q < np; q++) {
        const int p = pos[q];
        j = ((j >> p) << (p + 1)) | (j & (((i64)1 << p) - 1));
    }
    return j;
}
#endif
#define FIXED_GROUPS_RANGE(a, b, ...)                                                          \
    {                                                                                          \
        i64 f_ = deposit_bits((a) * run_, pos_, np_);                                          \
        if (run_ == 1) {                                                                       \
            for (i64 j_ = (a); j_ < (b); j_++) {                                               \
                const i64 gi = ((f_ | fv_) << c_) | vc_;                                       \
                __VA_ARGS__                                                                    \
                f_ = ((f_ | lm_) + 1) & ~lm_;                                                  \
            }                                                                                  \
        } else if (c_ == 0) {                                                                  \
            for (i64 j_ = (a); j_ < (b); j_++) {                                               \
                const i64 g0_ = f_ | fv_;                                                      \
                for (i64 r_ = 0; r_ < run_; r_++) {                                            \
                    const i64 gi = g0_ + r_;                                                   \
                    __VA_ARGS__                                                                \
                }                                                                              \
                f_ = ((f_ | lm_) + 1) & ~lm_;                                                  \
            }                                                                                  \
        } else {                                                                               \
            for (i64 j_ = (a); j_ < (b); j_++) {                                               \
                const i64 g0_ = f_ | fv_;                                                      \
                for (i64 r_ = 0; r_ < run_; r_++) {                                            \
                    const i64 gi = ((g0_ + r_) << c_) | vc_;                                   \
                    __VA_ARGS__                                                                \
                }                                                                              \
                f_ = ((f_ | lm_) + 1) & ~lm_;                                                  \
            }                                                                                  \
        }                                                                                      \
    }
/* (fixed bits at 0..c-1 of the group index are taken off first: the visited groups are then
 * ((J << c) | their values) for J over the rest, in runs as above) */
#define FOR_FIXED_GROUPS(nbits, pos, val, np, par, ...)                                        \
    do {                                                                                       \
        int c_ = 0;                                                                            \
        i64 vc_ = 0;                                                                           \
        while (c_ < (np) && (pos)[c_] == c_) { vc_ |= (i64)(val)[c_] << c_; c_++; }            \
        int rpos_[64];                                                                         \
        const int np_ = (np) - c_, gb_ = (nbits) - 3 - c_, *pos_ = rpos_;                      \
        i64 fm_ = 0, fv_ = 0;                                                                  \
        for (int q_ = 0; q_ < np_; q_++) {                                                     \
            rpos_[q_] = (pos)[c_ + q_] - c_;                                                   \
            fm_ |= (i64)1 << rpos_[q_];                                                        \
            fv_ |= (i64)(val)[c_ + q_] << rpos_[q_];                                           \
        }                                                                                      \
        int rb_ = np_ ? rpos_[0] : gb_;                                                        \
        if (rb_ > 12) rb_ = 12;                                                                \
        const i64 run_ = (i64)1 << rb_, lm_ = fm_ | (run_ - 1);                                \
        const i64 nout_ = ((i64)1 << (gb_ - np_)) / run_;                                      \
        const int pp_ = (par) > 1 && (nbits) >= PAR_MIN_BITS && nout_ >= (par) ? (par) : 1;    \
        if (pp_ > 1) {                                                                         \
            _Pragma("omp parallel num_threads(pp_)")                                           \
            {                                                                                  \
                i64 a_, b_;                                                                    \
                share(nout_, THREAD_ID, NUM_THREADS, &a_, &b_);                                \
                FIXED_GROUPS_RANGE(a_, b_, __VA_ARGS__)                                        \
            }                                                                                  \
        } else {                                                                               \
            FIXED_GROUPS_RANGE(0, nout_, __VA_ARGS__)                                          \
        }                                                                                      \
    } while (0)

/* SWAP of bits h >= 3 and l < h. l >= 3: each group with bit h clear and bit l set exchanged
 * whole with its partner (h set, l clear). l < 3: the groups with bit h clear and their
 * partners 2^(h-3) groups on: amplitudes with bit l set in the first cross with those with
 * bit l clear in the second, as two-source shuffles (W reals per vector). */
#define SWA(r, L, W) ((((r) >> (1 + (L))) & 1) ? (W) + ((r) ^ (2 << (L))) : (r))
#define SWB(r, L, W) ((((r) >> (1 + (L))) & 1) ? (W) + (r) : ((r) ^ (2 << (L))))
#define SW8(F, o, L, W) F((o), L, W), F((o) + 1, L, W), F((o) + 2, L, W), F((o) + 3, L, W),     \
                        F((o) + 4, L, W), F((o) + 5, L, W), F((o) + 6, L, W), F((o) + 7, L, W)
#if RBYTES == 4
#define SWAP_GROUPS_LOW(L)                                                                     \
    FOR_FIXED_GROUPS(nbits, pos, val, 1, par, {                                                \
        R *x = s + 16 * gi, *y = x + 16 * hd;                                                  \
        SFX(vv) a = SFX(vvld)(x), b = SFX(vvld)(y);                                            \
        SFX(vvst)(x, __builtin_shufflevector(a, b, SW8(SWA, 0, L, 16), SW8(SWA, 8, L, 16)));   \
        SFX(vvst)(y, __builtin_shufflevector(a, b, SW8(SWB, 0, L, 16), SW8(SWB, 8, L, 16)));   \
    })
#else
#define SWAP_GROUPS_LOW(L)                                                                     \
    FOR_FIXED_GROUPS(nbits, pos, val, 1, par, {                                                \
        R *x = s + 16 * gi, *y = x + 16 * hd;                                                  \
        SFX(vv) a0 = SFX(vvld)(x), a1 = SFX(vvld)(x + 8);                                      \
        SFX(vv) b0 = SFX(vvld)(y), b1 = SFX(vvld)(y + 8);                                      \
        if ((L) == 2) {                                                                        \
            SFX(vvst)(x + 8, b0);                                                              \
            SFX(vvst)(y, a1);                                                                  \
        } else {                                                                               \
            SFX(vvst)(x, __builtin_shufflevector(a0, b0, SW8(SWA, 0, (L) & 1, 8)));            \
            SFX(vvst)(x + 8, __builtin_shufflevector(a1, b1, SW8(SWA, 0, (L) & 1, 8)));        \
            SFX(vvst)(y, __builtin_shufflevector(a0, b0, SW8(SWB, 0, (L) & 1, 8)));            \
            SFX(vvst)(y + 8, __builtin_shufflevector(a1, b1, SW8(SWB, 0, (L) & 1, 8)));        \
        }                                                                                      \
    })
#endif
static void SFX(swap_groups)(R *s, int nbits, int h, int l, int par) {
    const i64 hd = (i64)1 << (h - 3);
    if (l >= 3) {
        const i64 ld = (i64)1 << (l - 3);
        const int pos[2] = {l - 3, h - 3}, val[2] = {1, 0};
        FOR_FIXED_GROUPS(nbits, pos, val, 2, par, {
            R *x = s + 16 * gi, *y = s + 16 * (gi - ld + hd);
            SFX(vv) a = SFX(vvld)(x), b = SFX(vvld)(y);
            SFX(vvst)(x, b);
            SFX(vvst)(y, a);
#if RBYTES == 8
            SFX(vv) a1 = SFX(vvld)(x + 8), b1 = SFX(vvld)(y + 8);
            SFX(vvst)(x + 8, b1);
            SFX(vvst)(y + 8, a1);
#endif
        });
        return;
    }
    const int pos[1] = {h - 3}, val[1] = {0};
    switch (l) {
    case 0: SWAP_GROUPS_LOW(0); break;
    case 1: SWAP_GROUPS_LOW(1); break;
    default: SWAP_GROUPS_LOW(2); break;
    }
}
#undef SWAP_GROUPS_LOW
#undef SW8
#undef SWA
#undef SWB

/* A diagonal on one or two bits with any controls, by groups of 8 amplitudes: real r of a
 * group becomes A[r] v[r] + B[r] v[r ^ 1] (B: the imaginary part with the sign of its place),
 * the identity on lanes whose low controls (bits 0-2) are not all set; the coefficients of a
 * group depend on its values of the targets at bits >= 3 (one set per combination). Visited:
 * the groups whose high controls are set, with their high targets clear, and for each the
 * partner groups of the combinations that are not the identity; a single such combination
 * fixes the high targets to it instead (CZ, CP on high bits: a quarter or half of the state). */
QD_FMA static void SFX(diag_groups)(R *s, int nbits, const gate_t *g, const R *u, int par) {
    const int k = g->k;
    const i64 lowc = g->cmask & 7;
    int hi[2], nh = 0;
    for (int j = 0; j < k; j++)
        if (g->bits[j] >= 3) hi[nh++] = j;
    R A[4][16], B[4][16];
    int live[4], nlive = 0;
    for (int c = 0; c < (1 << nh); c++) {
        int ident = 1;
        for (int r = 0; r < 16; r++) {
            const int e = r >> 1;
            int m = 0;
            for (int j = 0, h = 0; j < k; j++) {
                int v;
                if (g->bits[j] < 3) v = (e >> g->bits[j]) & 1;
                else v = (c >> h++) & 1;
                m |= v << (k - 1 - j);
            }
            const int on = (e & lowc) == lowc;
            A[c][r] = on ? u[2 * m] : 1;
            B[c][r] = on ? ((r & 1) ? u[2 * m + 1] : -u[2 * m + 1]) : 0;
            if (A[c][r] != 1 || B[c][r] != 0) ident = 0;
        }
        if (!ident) live[nlive++] = c;
    }
    if (!nlive) return;
    /* fixed group-index bits, ascending: high controls 1, high targets 0 (or the one live
     * combination's values) */
    int pos[64], val[64], np = 0;
    const int one = nlive == 1;
    for (int b = 3; b < nbits; b++) {
        int h = -1;
        for (int q = 0; q < nh; q++)
            if (g->bits[hi[q]] == b) h = q;
        if ((g->cmask >> b) & 1) { pos[np] = b - 3; val[np++] = 1; }
        else if (h >= 0) { pos[np] = b - 3; val[np++] = one ? (live[0] >> h) & 1 : 0; }
    }
    i64 goff[4];
    SFX(vv) VA[4][2], VB[4][2];
    for (int q = 0; q < nlive; q++) {
        const int c = live[q];
        goff[q] = 0;
        if (!one)
            for (int h = 0; h < nh; h++)
                if ((c >> h) & 1) goff[q] += (i64)1 << (g->bits[hi[h]] - 3);
        for (int w = 0; w < 16 / VL; w++) {
            memcpy(&VA[q][w], &A[c][w * VL], sizeof VA[q][w]);
            memcpy(&VB[q][w], &B[c][w * VL], sizeof VB[q][w]);
        }
    }
    if (nlive == 1) {  /* one coefficient set: held in registers */
        const SFX(vv) a0 = VA[0][0], b0 = VB[0][0];
        const SFX(vv) a1 = VA[0][16 / VL - 1], b1 = VB[0][16 / VL - 1];
        const i64 o = goff[0];
        FOR_FIXED_GROUPS(nbits, pos, val, np, par, {
            R *x = s + 16 * (gi + o);
            SFX(vv) v = SFX(vvld)(x);
            SFX(vvst)(x, a0 * v + b0 * SHUF(v, VX1));
            if (VL < 16) {
                SFX(vv) w = SFX(vvld)(x + VL);
                SFX(vvst)(x + VL, a1 * w + b1 * SHUF(w, VX1));
            }
        });
        return;
    }
    FOR_FIXED_GROUPS(nbits, pos, val, np, par, {
        for (int q = 0; q < nlive; q++) {
            R *x = s + 16 * (gi + goff[q]);
            for (int w = 0; w < 16 / VL; w++) {
                SFX(vv) v = SFX(vvld)(x + w * VL);
                SFX(vvst)(x + w * VL, VA[q][w] * v + VB[q][w] * SHUF(v, VX1));
            }
        }
    });
}
#undef FOR_FIXED_GROUPS
#undef FIXED_GROUPS_RANGE

/* lane path: w = 2 << p < VL reals, groups [g0, g1) of VL reals */
#define VSTEP_LANES(XW, XW1)                                                                   \
    for (i64 gi = g0; gi < g1; gi++) {                                                         \
        R *restrict pv = psi + VL * gi, *restrict lv = lam + VL * gi;                          \
        SFX(vv) a = SFX(vvld)(pv), l = SFX(vvld)(lv);                                          \
        SFX(vv) sa = SHUF(a, VX1), ap = SHUF(a, XW), sap = SHUF(a, XW1);                       \
        acc[0] += l * a; acc[1] += l * sa; acc[2] += l * ap; acc[3] += l * sap;                \
        if (upd >= 1) SFX(vvst)(pv, A * a + B * sa + C * ap + D * sap);                        \
        if (upd >= 2) {                                                                        \
            SFX(vv) sl = SHUF(l, VX1), lp = SHUF(l, XW), slp = SHUF(l, XW1);                   \
            SFX(vvst)(lv, A * l + B * sl + C * lp + D * slp);                                  \
        }                                                                                      \
        if (++cnt == STEP_FLUSH) { SFX(vflush)(da, acc); cnt = 0; }                            \
    }

QD_FMA static inline __attribute__((always_inline)) void SFX(vstep_lanes)(
        R *restrict psi, R *restrict lam, int p, const R *v, int upd, i64 g0, i64 g1,
        SFX(vacc_t) *da) {
    SFX(vv) acc[8], A, B, C, D;
    for (int k = 0; k < 8; k++) acc[k] = (SFX(vv)){0};
    const i64 w = (i64)2 << p;
    for (int l = 0; l < VL; l++) {
        int y = (l & w) != 0, sg = (l & 1) ? 1 : -1;
        int own = y ? 3 : 0, part = y ? 2 : 1;  /* V[own half][own], V[own half][partner] */
        A[l] = v[2 * own]; B[l] = sg * v[2 * own + 1];
        C[l] = v[2 * part]; D[l] = sg * v[2 * part + 1];
    }
    int cnt = 0;
    switch (p) {
    case 0: VSTEP_LANES(VX2, VX3); break;
    case 1: VSTEP_LANES(VX4, VX5); break;
#if VL == 16
    default: VSTEP_LANES(VX8, VX9); break;
#endif
    }
    SFX(vflush)(da, acc);
}

/* The sums of da as M (M00, M01, M10, M11 complex, 8 doubles); lanes: the lane layout of
 * a target of w reals, else the block layout */
static void SFX(vsums)(const SFX(vacc_t) *da, int lanes, i64 w, double *out) {
    for (int e = 0; e < 8; e++) out[e] = 0;
    if (!lanes) {
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < VL; l++) {
                out[2 * k] += da->d[2 * k][l];
                out[2 * k + 1] += (l & 1) ? -da->d[2 * k + 1][l] : da->d[2 * k + 1][l];
            }
        return;
    }
    for (int l = 0; l < VL; l++) {
        int y = (l & w) != 0;
        double im = (l & 1) ? -1.0 : 1.0;
        int own = y ? 3 : 0, part = y ? 2 : 1;  /* M index (r, c) = (0,0)/(1,1), (0,1)/(1,0) */
        out[2 * own] += da->d[0][l];
        out[2 * own + 1] += im * da->d[1][l];
        out[2 * part] += da->d[2][l];
        out[2 * part + 1] += im * da->d[3][l];
    }
}

/* One part of the vector step (blocks [j0, j1), reals [e0, e1) of each half as split_1q
 * gives them; for w < VL whole groups of VL reals) into M (8 doubles). */
QD_FMA static void SFX(vstep_part)(R *psi, R *lam, int p, const R *v, int upd, i64 j0, i64 j1,
                            i64 e0, i64 e1, double *out) {
    SFX(vacc_t) da;
    memset(&da, 0, sizeof da);
    const i64 w = (i64)2 << p;
    if (w < VL) {  /* blocks of 2w reals, VL / (2w) of them per group */
        i64 per = VL / (2 * w);
        if (upd == 2) SFX(vstep_lanes)(psi, lam, p, v, 2, j0 / per, j1 / per, &da);
        else if (upd == 1) SFX(vstep_lanes)(psi, lam, p, v, 1, j0 / per, j1 / per, &da);
        else SFX(vstep_lanes)(psi, lam, p, v, 0, j0 / per, j1 / per, &da);
    } else {
        if (upd == 2) SFX(vstep_blocks)(psi, lam, w, v, 2, j0, j1, e0, e1, &da);
        else if (upd == 1) SFX(vstep_blocks)(psi, lam, w, v, 1, j0, j1, e0, e1, &da);
        else SFX(vstep_blocks)(psi, lam, w, v, 0, j0, j1, e0, e1, &da);
    }
    SFX(vsums)(&da, w < VL, w, out);
}

/* The vector step over 2^nbits amplitudes (upd as in vstep_blocks), split over par threads
 * for a large state: whole groups of 64 bytes per thread for w < VL, split_1q otherwise. */
static void SFX(vstep_all)(R *psi, R *lam, int nbits, int p, const R *v, int upd, double *out,
                           int par) {
    const i64 nblk = (i64)1 << (nbits - 1 - p), w = (i64)2 << p;
    const i64 ngroups = ((i64)2 << nbits) / VL, per = w < VL ? VL / (2 * w) : 1;
    if (nbits >= SUM_PARTS_MIN_BITS || (par > 1 && nbits >= PAR_MIN_BITS)) {
        double part[SUM_PARTS][8];
#define VSTEP_PART_Q(q)                                                                        \
        {                                                                                      \
            i64 j0, j1, e0 = 0, e1 = w;                                                        \
            if (w < VL) {                                                                      \
                share(ngroups, q, SUM_PARTS, &j0, &j1);                                        \
                j0 *= per;                                                                     \
                j1 *= per;                                                                     \
            } else {                                                                           \
                split_1q(nblk, w, q, SUM_PARTS, &j0, &j1, &e0, &e1);                           \
            }                                                                                  \
            SFX(vstep_part)(psi, lam, p, v, upd, j0, j1, e0, e1, part[q]);                     \
        }
        if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel for num_threads(par) schedule(static)
            for (int q = 0; q < SUM_PARTS; q++) VSTEP_PART_Q(q)
        } else {
            for (int q = 0; q < SUM_PARTS; q++) VSTEP_PART_Q(q)
        }
#undef VSTEP_PART_Q
        sum_parts(part, out);
        return;
    }
    SFX(vstep_part)(psi, lam, p, v, upd, 0, nblk, 0, w, out);
}
#undef VL
#undef VX1
#undef VX2
#undef VX3
#undef VX4
#undef VX5
#undef VX8
#undef VX9
#undef STEP_FLUSH
#endif

/* The one-qubit overlap sums of a gate on bit p without controls, in the block layout of
 * dense_1q_part: the sums run over the interleaved reals as real dot products (Re: l * p,
 * Im: l * swapped p with signs), in per-lane double accumulators the compiler keeps in
 * vector registers. out: (M00, M01, M10, M11) complex. */
#define OVERLAP_TERMS(e, q)                                                                    \
    rr00[q] += lx[e] * px[e]; rr00[q + 1] += lx[e + 1] * px[e + 1];                            \
    ri00[q] += lx[e] * px[e + 1]; ri00[q + 1] -= lx[e + 1] * px[e];                            \
    rr01[q] += lx[e] * py[e]; rr01[q + 1] += lx[e + 1] * py[e + 1];                            \
    ri01[q] += lx[e] * py[e + 1]; ri01[q + 1] -= lx[e + 1] * py[e];                            \
    rr10[q] += ly[e] * px[e]; rr10[q + 1] += ly[e + 1] * px[e + 1];                            \
    ri10[q] += ly[e] * px[e + 1]; ri10[q + 1] -= ly[e + 1] * px[e];                            \
    rr11[q] += ly[e] * py[e]; rr11[q + 1] += ly[e + 1] * py[e + 1];                            \
    ri11[q] += ly[e] * py[e + 1]; ri11[q + 1] -= ly[e + 1] * py[e];
#define OVERLAP_BLOCK(W, E0, E1)                                                               \
    do {                                                                                       \
        for (i64 j = j0; j < j1; j++) {                                                        \
            const R *restrict lx = lam + 2 * (i64)(W) * j, *restrict ly = lx + (W);            \
            const R *restrict px = psi + 2 * (i64)(W) * j, *restrict py = px + (W);            \
            if ((W) < 8) {                                                                     \
                for (int e = 0; e < (W); e += 2) { OVERLAP_TERMS(e, e) }                       \
            } else {                                                                           \
                for (i64 e0_ = (E0); e0_ < (E1); e0_ += 8)                                     \
                    for (int q = 0; q < 8; q += 2) { OVERLAP_TERMS(e0_ + q, q) }               \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#define LANES_SUM(v)                                                                           \
    for (int q = 0; q < 8; q++) {                                                              \
        v[0] += rr00[q]; v[1] += ri00[q]; v[2] += rr01[q]; v[3] += ri01[q];                    \
        v[4] += rr10[q]; v[5] += ri10[q]; v[6] += rr11[q]; v[7] += ri11[q];                    \
    }

static void SFX(overlap_1q_part)(const R *restrict lam, const R *restrict psi, int p, i64 j0,
                                 i64 j1, i64 e0, i64 e1, double *out) {
    double rr00[8] = {0}, ri00[8] = {0}, rr01[8] = {0}, ri01[8] = {0};
    double rr10[8] = {0}, ri10[8] = {0}, rr11[8] = {0}, ri11[8] = {0};
    const i64 w = (i64)2 << p;
    if (e0 != 0 || e1 != w) {
        OVERLAP_BLOCK(w, e0, e1);
    } else {
        switch (p) {
        case 0: OVERLAP_BLOCK(2, 0, 2); break;
        case 1: OVERLAP_BLOCK(4, 0, 4); break;
        case 2: OVERLAP_BLOCK(8, 0, 8); break;
        case 3: OVERLAP_BLOCK(16, 0, 16); break;
        case 4: OVERLAP_BLOCK(32, 0, 32); break;
        case 5: OVERLAP_BLOCK(64, 0, 64); break;
        case 6: OVERLAP_BLOCK(128, 0, 128); break;
        case 7: OVERLAP_BLOCK(256, 0, 256); break;
        default: OVERLAP_BLOCK(w, 0, w);
        }
    }
    for (int e = 0; e < 8; e++) out[e] = 0;
    LANES_SUM(out)
}

/* out: M (diag: M00, M11 only) of a one-qubit gate on bit p, split over par threads. */
static void SFX(overlap_1q_low)(const R *lam, const R *psi, int nbits, int p, int diag,
                                double *out, int par) {
    const i64 nblk = (i64)1 << (nbits - 1 - p), w = (i64)2 << p;
    double v[8] = {0};
#if QD_VEC
    if (nbits >= 4) {  /* the vector step without updates (psi and lam are only read) */
        const R none[8] = {0};
        SFX(vstep_all)((R *)psi, (R *)lam, nbits, p, none, 0, v, par);
    } else
#endif
    if (nbits >= SUM_PARTS_MIN_BITS || (par > 1 && nbits >= PAR_MIN_BITS)) {
        double part[SUM_PARTS][8];
#pragma omp parallel for if (par > 1 && nbits >= PAR_MIN_BITS) num_threads(par) schedule(static)
        for (int q = 0; q < SUM_PARTS; q++) {
            i64 j0, j1, e0, e1;
            split_1q(nblk, w, q, SUM_PARTS, &j0, &j1, &e0, &e1);
            SFX(overlap_1q_part)(lam, psi, p, j0, j1, e0, e1, part[q]);
        }
        sum_parts(part, v);
    } else {
        SFX(overlap_1q_part)(lam, psi, p, 0, nblk, 0, w, v);
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
 * overlap_1q_part. */
#define STEP_TERMS(e, q)                                                                       \
    {                                                                                          \
        R a0r = px[e], a0i = px[e + 1], a1r = py[e], a1i = py[e + 1];                          \
        R l0r = lx[e], l0i = lx[e + 1], l1r = ly[e], l1i = ly[e + 1];                          \
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
#define STEP_BLOCK(W, E0, E1)                                                                  \
    do {                                                                                       \
        for (i64 j = j0; j < j1; j++) {                                                        \
            R *restrict lx = lam + 2 * (i64)(W) * j, *restrict ly = lx + (W);                  \
            R *restrict px = psi + 2 * (i64)(W) * j, *restrict py = px + (W);                  \
            if ((W) < 8) {                                                                     \
                for (int e = 0; e < (W); e += 2) STEP_TERMS(e, e)                              \
            } else {                                                                           \
                for (i64 e0_ = (E0); e0_ < (E1); e0_ += 8)                                     \
                    for (int q = 0; q < 8; q += 2) STEP_TERMS(e0_ + q, q)                      \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#define STEP_SWITCH                                                                            \
    if (e0 != 0 || e1 != w) {                                                                  \
        STEP_BLOCK(w, e0, e1);                                                                 \
    } else {                                                                                   \
        switch (p) {                                                                           \
        case 0: STEP_BLOCK(2, 0, 2); break;                                                    \
        case 1: STEP_BLOCK(4, 0, 4); break;                                                    \
        case 2: STEP_BLOCK(8, 0, 8); break;                                                    \
        case 3: STEP_BLOCK(16, 0, 16); break;                                                  \
        case 4: STEP_BLOCK(32, 0, 32); break;                                                  \
        case 5: STEP_BLOCK(64, 0, 64); break;                                                  \
        case 6: STEP_BLOCK(128, 0, 128); break;                                                \
        case 7: STEP_BLOCK(256, 0, 256); break;                                                \
        default: STEP_BLOCK(w, 0, w);                                                          \
        }                                                                                      \
    }

static void SFX(step_1q_part)(R *restrict psi, R *restrict lam, int p, const R *v, int do_lam,
                              i64 j0, i64 j1, i64 e0, i64 e1, double *out) {
    double rr00[8] = {0}, ri00[8] = {0}, rr01[8] = {0}, ri01[8] = {0};
    double rr10[8] = {0}, ri10[8] = {0}, rr11[8] = {0}, ri11[8] = {0};
    const R v00r = v[0], v00i = v[1], v01r = v[2], v01i = v[3];
    const R v10r = v[4], v10i = v[5], v11r = v[6], v11i = v[7];
    const i64 w = (i64)2 << p;
    if (do_lam) {
#define DO_LAM 1
        STEP_SWITCH
#undef DO_LAM
    } else {
#define DO_LAM 0
        STEP_SWITCH
#undef DO_LAM
    }
    for (int e = 0; e < 8; e++) out[e] = 0;
    LANES_SUM(out)
}


static void SFX(adjoint_step_1q)(R *psi, R *lam, int nbits, int p, const R *v, int do_lam,
                                 double *out, int par) {
    const i64 nblk = (i64)1 << (nbits - 1 - p), w = (i64)2 << p;
#if QD_VEC
    if (nbits >= 4) {  /* vectors of 64 bytes (vstep_part) */
        SFX(vstep_all)(psi, lam, nbits, p, v, do_lam ? 2 : 1, out, par);
        return;
    }
#endif
    if (nbits >= SUM_PARTS_MIN_BITS || (par > 1 && nbits >= PAR_MIN_BITS)) {
        double part[SUM_PARTS][8];
#pragma omp parallel for if (par > 1 && nbits >= PAR_MIN_BITS) num_threads(par) schedule(static)
        for (int q = 0; q < SUM_PARTS; q++) {
            i64 j0, j1, e0, e1;
            split_1q(nblk, w, q, SUM_PARTS, &j0, &j1, &e0, &e1);
            SFX(step_1q_part)(psi, lam, p, v, do_lam, j0, j1, e0, e1, part[q]);
        }
        sum_parts(part, out);
        return;
    }
    SFX(step_1q_part)(psi, lam, p, v, do_lam, 0, nblk, 0, w, out);
}

/* 2x2 complex product c = a b (a: R, b: R, c: double) */
static void SFX(mul2)(const R *a, const R *b, double *c) {
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

#define OVERLAP_PAIR(l, p, r, c)                                                               \
    sr[4 * (r) + (c)] += (double)lr[r] * pr[c] + (double)li[r] * pi[c];                        \
    si[4 * (r) + (c)] += (double)lr[r] * pi[c] - (double)li[r] * pr[c];

/* Overlap matrix M[r][c] = sum over groups conj(lam[r]) psi[c] (only r == c, in M[r], for a
 * diagonal geometry), written to out (complex, d*d or d entries). For k >= 3 dense gates,
 * ``need`` (the derivative matrix) restricts the sums to its nonzero entries, others are 0. */
static void SFX(overlap_matrix)(const R *lam, const R *psi, int nbits, const gate_t *g,
                                double *out, int par_, const R *need, SFX(scratch_t) *sc) {
    const int d = 1 << g->k;
    const int diag = g->kind == K_DIAG;
    if (g->k == 1 && g->cmask == 0 && nbits > g->special[0]) {
        SFX(overlap_1q_low)(lam, psi, nbits, g->special[0], diag, out, par_);
        return;
    }
    if (g->k == 1) {
        const i64 o1 = g->off[1];
        double s00r = 0, s00i = 0, s01r = 0, s01i = 0, s10r = 0, s10i = 0, s11r = 0, s11i = 0;
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
        if (nbits >= SUM_PARTS_MIN_BITS || par_ > 1) {  /* fixed parts (threads: one large state) */
            double part[SUM_PARTS][8];
#pragma omp parallel for if (par_ > 1) num_threads(par_) schedule(static)
            for (int q = 0; q < SUM_PARTS; q++) {
                double s00r = 0, s00i = 0, s01r = 0, s01i = 0, s10r = 0, s10i = 0, s11r = 0,
                       s11i = 0;
                FOR_GROUPS_PART(g, nbits, q, SUM_PARTS, OVERLAP_1Q_BODY);
                double *o = part[q];
                o[0] = s00r; o[1] = s00i; o[2] = s01r; o[3] = s01i;
                o[4] = s10r; o[5] = s10i; o[6] = s11r; o[7] = s11i;
            }
            double t[8];
            sum_parts(part, t);
            s00r = t[0]; s00i = t[1]; s01r = t[2]; s01i = t[3];
            s10r = t[4]; s10i = t[5]; s11r = t[6]; s11i = t[7];
        } else {
            FOR_GROUPS(g, nbits, OVERLAP_1Q_BODY);
        }
#undef OVERLAP_1Q_BODY
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
#define OVERLAP_2Q_BODY                                                                        \
    {                                                                                          \
        R lr[4], li[4], pr[4], pi[4];                                                          \
        lr[0] = RE(lam, base); li[0] = IM(lam, base);                                          \
        lr[1] = RE(lam, base + o1); li[1] = IM(lam, base + o1);                                \
        lr[2] = RE(lam, base + o2); li[2] = IM(lam, base + o2);                                \
        lr[3] = RE(lam, base + o3); li[3] = IM(lam, base + o3);                                \
        pr[0] = RE(psi, base); pi[0] = IM(psi, base);                                          \
        pr[1] = RE(psi, base + o1); pi[1] = IM(psi, base + o1);                                \
        pr[2] = RE(psi, base + o2); pi[2] = IM(psi, base + o2);                                \
        pr[3] = RE(psi, base + o3); pi[3] = IM(psi, base + o3);                                \
        for (int r = 0; r < 4; r++)                                                            \
            for (int c = 0; c < 4; c++) { OVERLAP_PAIR(l, p, r, c) }                           \
    }
        if (nbits >= SUM_PARTS_MIN_BITS || par_ > 1) {  /* fixed parts (threads: one large state) */
            double part[SUM_PARTS][32];
#pragma omp parallel for if (par_ > 1) num_threads(par_) schedule(static)
            for (int q = 0; q < SUM_PARTS; q++) {
                double *sr = part[q], *si = part[q] + 16;
                for (int e = 0; e < 32; e++) part[q][e] = 0;
                FOR_GROUPS_PART(g, nbits, q, SUM_PARTS, OVERLAP_2Q_BODY);
            }
            for (int e = 0; e < 16; e++)
                for (int q = 0; q < SUM_PARTS; q++) {
                    sr[e] += part[q][e];
                    si[e] += part[q][16 + e];
                }
        } else {
            FOR_GROUPS(g, nbits, OVERLAP_2Q_BODY);
        }
#undef OVERLAP_2Q_BODY
        for (int e = 0; e < 16; e++) { out[2 * e] = sr[e]; out[2 * e + 1] = si[e]; }
        return;
    }
    int cnt = diag ? d : d * d;
    for (int i = 0; i < 2 * cnt; i++) out[i] = 0;
    if (!diag && need != 0) {  /* only the entries the contraction will use */
        int ne = 0, *er = sc->er, *ec = sc->ec;
        for (int r = 0; r < d; r++)
            for (int c = 0; c < d; c++)
                if (need[2 * (r * d + c)] != 0 || need[2 * (r * d + c) + 1] != 0) {
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

/* Re sum_rc D[r][c] M[r][c] (D of the data's precision, M double) */
static double SFX(contract)(const gate_t *g, const R *dm, const double *m) {
    int d = 1 << g->k;
    int cnt = g->kind == K_DIAG ? d : d * d;
    double acc = 0;
    for (int e = 0; e < cnt; e++) acc += (double)dm[2 * e] * m[2 * e] - (double)dm[2 * e + 1] * m[2 * e + 1];
    return acc;
}

static double SFX(contract_d)(const double *dm, const double *m, int cnt) {
    double acc = 0;
    for (int e = 0; e < cnt; e++) acc += dm[2 * e] * m[2 * e] - dm[2 * e + 1] * m[2 * e + 1];
    return acc;
}

/* ---------------------------------------------------------------------------------------- */
/* programs                                                                                  */

/* Coded gate g's matrix (and with deriv its derivatives) for binding b into its workspace
 * w = [U, dU_0, .., dU_{np-1}]; hdr = [angles (3), state] (state 0 empty, 1 U valid, 2 U and
 * the derivatives valid, for the stored angles). */
static const R *SFX(coded_data)(const gate_t *g, double *hdr, R *w, const double *theta,
                                i64 tstride, i64 b, int deriv) {
    double a[3] = {0, 0, 0}, tmp[CODED_MAX_USIZE];
    for (int j = 0; j < g->np; j++)
        a[j] = (g->col[j] >= 0 ? g->scale[j] * theta[b * tstride + g->col[j]] : 0.0) + g->shift[j];
    int same = 1;
    for (int j = 0; j < g->np; j++) same &= (a[j] == hdr[j]);
    int have = same ? (int)hdr[3] : 0;
    if (have < 1) {
        gate_eval(g, a, tmp);
        for (i64 e = 0; e < g->usize; e++) w[e] = (R)tmp[e];
    }
    if (deriv && have < 2)
        for (int j = 0; j < g->np; j++) {
            gate_deriv(g, a, j, tmp);
            R *dst = w + g->usize * (1 + j);
            for (i64 e = 0; e < g->usize; e++) dst[e] = (R)tmp[e];
        }
    if (have < 1 + deriv) {
        for (int j = 0; j < g->np; j++) hdr[j] = a[j];
        hdr[3] = 1 + deriv;
    }
    return w;
}

/* shared_cols (P entries, may be NULL): nonzero where a theta column is one value broadcast
 * over the batch by construction, so that only the sum of its gradient over the bindings
 * matters. Decodes nops gates and nextra slot records; scratch for nthreads threads. */
static int SFX(ctx_init)(SFX(ctx_t) *c, const qd_program *prog, const qd_program *extra,
                         const qd_angles *ang, i64 B, const i64 *shared_cols, int nthreads,
                         int n, int tiles, int fwd) {
    i64 nops = prog->nops, nextra = extra ? extra->nops : 0;
    memset(c, 0, sizeof(*c));
    c->ngates = nops;
    c->gates = (gate_t *)malloc((size_t)(nops + nextra + 1) * sizeof(gate_t));
    c->ws_off = (i64 *)malloc((size_t)(nops + 1) * sizeof(i64));
    c->theta = ang->theta;
    c->tstride = ang->rows > 1 ? ang->P : 0;
    i64 P = ang->theta ? ang->P : 0;
    char *ucol = (char *)malloc((size_t)(P + 1));
    if (!c->gates || !c->ws_off || !ucol) {
        free(ucol);
        return QD_ENOMEM;
    }
    /* columns whose value is the same in every row: their gates apply to many states at once */
    for (i64 k = 0; k < P; k++) {
        int same = 1;
        if (c->tstride)
            for (i64 b = 1; b < B && same; b++) same = c->theta[b * c->tstride + k] == c->theta[k];
        ucol[k] = (char)same;
    }
    int maxk = 2;
    c->wsize = 0;
    for (i64 i = 0; i < nops + nextra; i++) {
        gate_t *g = &c->gates[i];
        if (i < nops) decode(&prog->recs[i], prog->data, RSIZE, g);
        else decode(&extra->recs[i - nops], extra->data, RSIZE, g);
        if (g->k > maxk) maxk = g->k;
        if (i >= nops) continue;
        c->ws_off[i] = c->wsize;
        c->wsize += g->code ? g->usize * (1 + g->np) : 0;
        g->uniform = g->code ? 1 : g->stride == 0;
        g->gshared = g->code ? 1 : 0;
        for (int j = 0; j < g->np; j++) {
            if (g->col[j] < 0) continue;
            g->uniform &= ucol[g->col[j]];
            if ((g->tmask_p >> j) & 1)
                g->gshared &= shared_cols ? (int)(shared_cols[g->col[j]] != 0) : 0;
        }
        g->gshared &= g->uniform;
    }
    free(ucol);
    size_t nt = (size_t)(nthreads > 1 ? nthreads : 1);
    if (c->wsize) {
        c->ws = (R *)calloc((size_t)c->wsize * nt, sizeof(R));
        c->whdr = (double *)calloc((size_t)(4 * nops) * nt, sizeof(double));
        if (!c->ws || !c->whdr) return QD_ENOMEM;
    }
    /* scratch per thread, sized by the widest gate */
    size_t dd = (size_t)1 << (2 * maxk), d = (size_t)1 << maxk;
    size_t bytes = sizeof(R) * 4 * dd + sizeof(int) * (3 * dd + 3 * d + 1) + sizeof(double) * 2 * dd;
    bytes = (bytes + 63) & ~(size_t)63;
    c->scr_mem = malloc(bytes * nt + 64);
    c->scr = (SFX(scratch_t) *)malloc(sizeof(SFX(scratch_t)) * nt);
    if (!c->scr_mem || !c->scr) return QD_ENOMEM;
    c->tiles = tiles;
    if (n >= TILE_MIN_N && tiles) {
        c->tk = tile_high(fwd, RSIZE);
        if (c->tk > n - TILE_LOW) c->tk = n - TILE_LOW;  /* no larger than the state */
        c->tbytes = sizeof(R) * 4 * ((size_t)1 << (TILE_LOW + c->tk)) * nt;
        c->tbuf = (R *)keep_get(c->tbytes);
        if (!c->tbuf) return QD_ENOMEM;
    }
    for (size_t t = 0; t < nt; t++) {
        char *p = (char *)c->scr_mem + t * bytes;
        SFX(scratch_t) *s = &c->scr[t];
        s->m = (double *)p; p += sizeof(double) * 2 * dd;
        s->u = (R *)p; p += sizeof(R) * 2 * dd;
        s->vr = (R *)p; p += sizeof(R) * dd;
        s->vi = (R *)p; p += sizeof(R) * dd;
        s->cols = (int *)p; p += sizeof(int) * dd;
        s->er = (int *)p; p += sizeof(int) * dd;
        s->ec = (int *)p; p += sizeof(int) * dd;
        s->ptr = (int *)p; p += sizeof(int) * (d + 1);
        s->rows = (int *)p; p += sizeof(int) * d;
        s->colv = (int *)p;
    }
    return QD_OK;
}

static void SFX(ctx_free)(SFX(ctx_t) *c) {
    free(c->gates);
    free(c->ws_off);
    free(c->ws);
    free(c->whdr);
    free(c->scr);
    free(c->scr_mem);
    keep_put(c->tbuf, c->tbytes);
}

/* The data of gate i for binding b (coded gates: evaluated into this thread's workspace). */
static const R *SFX(gate_data)(const SFX(ctx_t) *c, i64 i, i64 b, int tid, int deriv) {
    const gate_t *g = &c->gates[i];
    if (!g->code) return SFX(data_of)(g, b);
    return SFX(coded_data)(g, c->whdr + 4 * (tid * c->ngates + i), c->ws + tid * c->wsize + c->ws_off[i],
                           c->theta, c->tstride, b, deriv);
}

/* Apply gate i (or its inverse) to the tile of states st (binding b0 first). */
static void SFX(apply_tile)(R *st, int n, int tb, const SFX(ctx_t) *c, i64 i, i64 b0, int dag,
                            int par, int tid) {
    const gate_t *g = &c->gates[i];
    SFX(scratch_t) *sc = &c->scr[tid];
    if (g->uniform) {
        SFX(apply_range)(st, n + tb, g, SFX(gate_data)(c, i, b0, tid, 0), dag, par, sc);
        return;
    }
    i64 N = (i64)1 << n;
    for (i64 t = 0; t < ((i64)1 << tb); t++)
        SFX(apply_range)(st + 2 * N * t, n, g, SFX(gate_data)(c, i, b0 + t, tid, 0), dag, par, sc);
}

/* Gates [i0, i1) (all with bits below cb), or their inverses in reverse order, applied chunk
 * by chunk: one pass over memory for the whole run. ``us[i]`` is gate i's data. */
static void SFX(run_chunked)(R *st, int n, int cb, const SFX(ctx_t) *c, const R **us, i64 i0,
                             i64 i1, int dag, int par, int tid) {
    i64 nch = (i64)1 << (n - cb);
#pragma omp parallel for if (par > 1) num_threads(par) schedule(static)
    for (i64 ch = 0; ch < nch; ch++) {
        R *chunk = st + 2 * (ch << cb);
        SFX(scratch_t) *sc = &c->scr[par > 1 ? THREAD_ID : tid];
        for (i64 t = 0; t < i1 - i0; t++) {
            i64 i = dag ? i1 - 1 - t : i0 + t;
            SFX(apply_range)(chunk, cb, &c->gates[i], us[i], dag, 1, sc);
        }
    }
}


/* The tile buffer of thread tid (two tiles: which 0 psi, 1 lam). */
static R *SFX(tile_buf)(const SFX(ctx_t) *c, int tid, int which) {
    return c->tbuf + ((size_t)(2 * tid + which) << (TILE_LOW + c->tk + 1));
}

/* Copy tile t of st into buf (dir 0) or back (dir 1). */
static void SFX(tile_copy)(R *st, R *buf, const tileset_t *ts, i64 t, int dir) {
    i64 base = tile_base(ts, t);
    const size_t run = sizeof(R) * 2 * ((size_t)1 << TILE_LOW);
    for (i64 r = 0; r < ((i64)1 << ts->k); r++) {
        R *mem = st + 2 * (base + tile_run_offset(ts, r)), *loc = buf + 2 * (r << TILE_LOW);
        if (dir) memcpy(mem, loc, run);
        else memcpy(loc, mem, run);
    }
}

/* The next run of a schedule that may reorder gates on disjoint bits (which commute): walking
 * the gates not yet done (done[i] == 0) at positions [t, tend) (in order, or reversed when
 * rev: position e is gate e, or nops - 1 - e), a gate joins the run when its bits fit the tile set
 * and no gate skipped before it shares a bit with it; a gate that does not fit blocks its bits
 * for the rest of the walk. The run's gates go to order[] (in application order) and are marked
 * done; returns their count (0: the first pending gate fits no tile set). One memory pass per
 * run: a layer of one-qubit gates and the entangling gates after it share passes where the
 * gates' order would split them. gl (optional): the gate at position i is gl[i] (a list of
 * fused ops) instead of c->gates[i]. */
static int SFX(tile_schedule)(const SFX(ctx_t) *c, const gate_t *const *gl, i64 t, i64 tend,
                              i64 nops, int rev, char *done, i64 *order, tileset_t *ts,
                              int nbits) {
    const i64 all = nbits >= 63 ? -1 : (((i64)1 << nbits) - 1);
    i64 blocked = 0;
    int cnt = 0;
    ts->k = 0;
    ts->kmax = c->tk;
    for (i64 e = t; e < tend && (blocked & all) != all; e++) {
        i64 i = rev ? nops - 1 - e : e;
        if (done[i]) continue;
        const gate_t *g = gl ? gl[i] : &c->gates[i];
        i64 gb = g->tmask | g->cmask;
        if (!(gb & blocked) && tile_add(ts, g)) {
            order[cnt++] = i;
            done[i] = 1;
        } else {
            blocked |= gb;
        }
    }
    return cnt;
}

/* ---------------------------------------------------------------------------------------- */
/* two-bit gate fusion (states up to the last-level cache)                                    */

/* Gates on at most two bits are merged into blocks while they are applied: a block is the
 * product of consecutive gates on one bit, or on the same two bits (one-qubit gates, their
 * singly controlled forms, two-qubit gates), kept as a 2x2 or 4x4 matrix in double precision
 * and applied in one pass when a gate that does not fit it touches its bits (blocks on
 * disjoint bits stay open side by side: they commute). CNOT, CZ and the like cost no pass of
 * their own: CNOT(a, b) after one-qubit gates on a and b is one 4x4 pass with the flops of the
 * one-qubit gates, and a 4x4 block whose rows have at most two entries (a one-qubit gate and a
 * permutation) runs with the flops of one one-qubit gate. A block whose lower bit is below
 * FZ_VB = 2 (contiguous runs of at most 32 bytes: half-width or narrower vectors; complex128
 * blocks on bit 1 took 2.5-4.6x lightning.qubit's time per gate that way, measured) runs in
 * lane form (fz_lane: one vector per group of amplitudes, per-lane coefficients). A singly
 * controlled one-qubit gate whose control has no pending gate joins its target's block with the
 * control as a selector bit (two matrices: where the selector is 0 and where it is 1), so a CNOT
 * chain takes one pass per two links. Other gates flush the blocks on their bits and run as
 * they are (low-bit runs still share chunked passes). Used for one state of at least
 * 2^FZ_MIN_N amplitudes, and on the ops of tile runs. */
#undef FZ_VB
#define FZ_VB 2

typedef struct {
    const gate_t *g;  /* the gate (fused: a dense gate on the block's bits) */
    const R *u;       /* its data */
    int dag;          /* apply the inverse (original gates only) */
    int fused;        /* a fused 4x4 block */
} SFX(fzop_t);

typedef struct {
    int nb, bl[2];    /* bits: bl[0] (and bl[1] < bl[0] for two bits) */
    int cnt;          /* gates in the block */
    i64 first;        /* the gate when cnt == 1 */
    int sel;          /* selector bit (-1: none): m where it is 0, m1 where it is 1 */
    double m[32];     /* 2x2 or 4x4 complex, row-major; local index bit (nb - 1 - j) <-> bl[j] */
    double m1[32];
} SFX(fzblk_t);

/* Whether g may join a block: one or two bits in all (without vector kernels: each at or above
 * FZ_VB). */
static int SFX(fz_ok)(const gate_t *g) {
    i64 all = g->tmask | g->cmask;
    int cnt = __builtin_popcountll((unsigned long long)all);
    if (cnt < 1 || cnt > 2 || (!QD_VEC && (all & (((i64)1 << FZ_VB) - 1)))) return 0;
    if (g->k == 1) return g->kind == K_DENSE || g->kind == K_DIAG || g->kind == K_FLIP;
    return g->k == 2 && g->cmask == 0;
}

/* E (D x D complex, D = 2^nb) = gate g (data u, already the inverse where applied so) on the
 * block bits bl. */
static void SFX(fz_expand)(const gate_t *g, const R *u, int nb, const int *bl, double *E) {
    const int D = 1 << nb, d = 1 << g->k;
    memset(E, 0, sizeof(double) * 2 * (size_t)(D * D));
    for (int m = 0; m < D; m++) {
        i64 x = 0;
        for (int j = 0; j < nb; j++)
            if ((m >> (nb - 1 - j)) & 1) x |= (i64)1 << bl[j];
        if ((x & g->cmask) != g->cmask) { E[2 * (m * D + m)] = 1; continue; }
        int gi = 0;
        for (int j = 0; j < g->k; j++) gi |= (int)((x >> g->bits[j]) & 1) << (g->k - 1 - j);
        const i64 rest = x & ~g->tmask;
        for (int gr = 0; gr < d; gr++) {
            double vr = 0, vi = 0;
            if (g->kind == K_DENSE) { vr = u[2 * (gr * d + gi)]; vi = u[2 * (gr * d + gi) + 1]; }
            else if (g->kind == K_DIAG) { if (gr == gi) { vr = u[2 * gi]; vi = u[2 * gi + 1]; } }
            else if (g->kind == K_FLIP) { vr = gr == d - 1 - gi; }
            else { vr = gr == (gi == 1 ? 2 : gi == 2 ? 1 : gi); }  /* swap */
            if (vr == 0 && vi == 0) continue;
            i64 y = rest | g->off[gr];
            int r = 0;
            for (int j = 0; j < nb; j++) r |= (int)((y >> bl[j]) & 1) << (nb - 1 - j);
            E[2 * (r * D + m)] += vr;
            E[2 * (r * D + m) + 1] += vi;
        }
    }
}

/* M <- E M (D x D complex). */
static void SFX(fz_mul)(double *M, const double *E, int D) {
    double t[32];
    for (int r = 0; r < D; r++)
        for (int c = 0; c < D; c++) {
            double sr = 0, si = 0;
            for (int q = 0; q < D; q++) {
                double er = E[2 * (r * D + q)], ei = E[2 * (r * D + q) + 1];
                double mr = M[2 * (q * D + c)], mi = M[2 * (q * D + c) + 1];
                sr += er * mr - ei * mi;
                si += er * mi + ei * mr;
            }
            t[2 * (r * D + c)] = sr;
            t[2 * (r * D + c) + 1] = si;
        }
    memcpy(M, t, sizeof(double) * 2 * (size_t)(D * D));
}

/* The pairing of a 4x4 m's columns into two pairs such that every row reads one pair only
 * and each pair feeds two rows (a one-qubit gate times a permutation): io[0..3] the columns
 * (pair 0, pair 1), io[4..7] the rows they feed (in the same order); returns 0 if none. */
static int SFX(fz_pairs)(const R *m, int *io) {
    static const int P[3][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}, {0, 3, 1, 2}};
    for (int t = 0; t < 3; t++) {
        int rows[2][4], cnt[2] = {0, 0}, ok = 1;
        for (int r = 0; r < 4 && ok; r++) {
            int in[2] = {0, 0};
            for (int c = 0; c < 4; c++)
                if (m[2 * (4 * r + c)] != 0 || m[2 * (4 * r + c) + 1] != 0)
                    in[(c == P[t][2] || c == P[t][3]) ? 1 : 0] = 1;
            if (in[0] && in[1]) { ok = 0; break; }
            int q = in[1];
            rows[q][cnt[q]++ & 3] = r;
        }
        if (!ok || cnt[0] != 2 || cnt[1] != 2) continue;
        for (int e = 0; e < 4; e++) io[e] = P[t][e];
        io[4] = rows[0][0]; io[5] = rows[0][1]; io[6] = rows[1][0]; io[7] = rows[1][1];
        return 1;
    }
    return 0;
}

#if QD_VEC
/* Vectors [v0, v1) of NV / 2 amplitudes (of the 2^(nbits - 2) free amplitudes; 2^lo >= NV / 2)
 * of a 4x4 on bits hi > lo: paired (pc: the two 2x2 blocks, o: column then row offsets in
 * reals) or dense (m). One function per vector width (64 bytes down to one amplitude), so
 * that gates on the lowest bits fuse too. */
/* J: the first amplitude of vector q's group (zeros inserted at bits lo and hi) */
#define FZ_GROUP(q, J)                                                                         \
    i64 J = (q) * va;                                                                          \
    J = ((J & ~ma) << 1) | (J & ma);                                                           \
    J = ((J & ~mb) << 1) | (J & mb);                                                           \
    J = ((J & ~mc) << 1) | (J & mc) | sb;
/* prefetch the four amplitude groups of vector q (for the streams of a middle-bit pass) */
#define FZ_PF(q)                                                                               \
    do {                                                                                       \
        FZ_GROUP(q, t_)                                                                        \
        PF_AT(st, 2 * t_, sizeof(R)); PF_AT(st, 2 * t_ + olo, sizeof(R));                      \
        PF_AT(st, 2 * t_ + ohi, sizeof(R)); PF_AT(st, 2 * t_ + ohi + olo, sizeof(R));          \
    } while (0)
/* The forms of a paired block's two 2x2 products (pc: pair 0's rows from its columns, then
 * pair 1's) that need two vector products per output instead of four: every entry real (a
 * Givens rotation, an excitation), real diagonals with imaginary off-diagonals (IsingXX, YY,
 * XY, iSWAP), diagonal (IsingZZ). */
#ifndef QD_FZ_FORMS_ONCE
#define QD_FZ_FORMS_ONCE
enum { FZ_GENERAL = 0, FZ_REAL, FZ_RX, FZ_DIAG };
#endif
static int SFX(fz_pair_form)(const R *pc) {
    int real = 1, rx = 1, diag = 1;
    for (int e = 0; e < 8; e++) {
        const int on = e == 0 || e == 3 || e == 4 || e == 7;  /* a row from its own column */
        real &= pc[2 * e + 1] == 0;
        rx &= on ? pc[2 * e + 1] == 0 : pc[2 * e] == 0;
        diag &= on || (pc[2 * e] == 0 && pc[2 * e + 1] == 0);
    }
    return real ? FZ_REAL : rx ? FZ_RX : diag ? FZ_DIAG : FZ_GENERAL;
}
/* Whether pair h of a paired block maps its two amplitudes onto themselves unchanged (rows
 * from the same columns, the identity 2x2). */
static int SFX(fz_pair_identity)(const R *pc, const i64 *o, int h) {
    const R *c = pc + 8 * h;
    return o[2 * h] == o[4 + 2 * h] && o[2 * h + 1] == o[5 + 2 * h] && c[0] == 1 && c[1] == 0 &&
           c[2] == 0 && c[3] == 0 && c[4] == 0 && c[5] == 0 && c[6] == 1 && c[7] == 0;
}
/* the paired loop with outputs Y0-Y3 (expressions of a0-a3, their re/im swaps s0-s3 and the
 * coefficient vectors); the arguments after Y3: the re/im swap */
#define FZ_PAIRED(Y0, Y1, Y2, Y3, ...)                                                         \
    FZ_RUNS({                                                                                  \
        if (pf) FZ_PF(v + dv);                                                                 \
        R *p = st + 2 * j;                                                                     \
        V a0, a1, a2, a3;                                                                      \
        memcpy(&a0, p + o0, sizeof(V)); memcpy(&a1, p + o1, sizeof(V));                        \
        memcpy(&a2, p + o2, sizeof(V)); memcpy(&a3, p + o3, sizeof(V));                        \
        QD_INREG(a0); QD_INREG(a1); QD_INREG(a2); QD_INREG(a3);                                \
        V s0 = SHUF(a0, __VA_ARGS__), s1 = SHUF(a1, __VA_ARGS__);                              \
        V s2 = SHUF(a2, __VA_ARGS__), s3 = SHUF(a3, __VA_ARGS__);                              \
        (void)s0; (void)s1; (void)s2; (void)s3;                                                \
        V y0 = Y0, y1 = Y1, y2 = Y2, y3 = Y3;                                                  \
        memcpy(p + o4, &y0, sizeof(V)); memcpy(p + o5, &y1, sizeof(V));                        \
        memcpy(p + o6, &y2, sizeof(V)); memcpy(p + o7, &y3, sizeof(V));                        \
    })
/* the paired loop on one pair: amplitudes at i0, i1 in, Y0, Y1 out to w0, w1 (a pair that is
 * the identity is neither read nor written) */
#define FZ_ONEPAIR(Y0, Y1, ...)                                                                \
    FZ_RUNS({                                                                                  \
        if (pf) FZ_PF(v + dv);                                                                 \
        R *p = st + 2 * j;                                                                     \
        V a0, a1;                                                                              \
        memcpy(&a0, p + i0, sizeof(V)); memcpy(&a1, p + i1, sizeof(V));                        \
        QD_INREG(a0); QD_INREG(a1);                                                            \
        V s0 = SHUF(a0, __VA_ARGS__), s1 = SHUF(a1, __VA_ARGS__);                              \
        V y0 = Y0, y1 = Y1;                                                                    \
        memcpy(p + w0, &y0, sizeof(V)); memcpy(p + w1, &y1, sizeof(V));                        \
    })
/* vectors [v0, v1) with j the first amplitude of vector v's group: computed once per run of
 * vectors below the lowest inserted zero (contiguous: the next vector's group starts va
 * amplitudes on), the next run's start stepped from this one's (set the inserted bits, add a
 * run's amplitudes, clear them, the selector's value back: a block on bit 3 in complex64 took
 * 2-2.5x lightning.qubit's time per gate computing every vector's group index) */
#define FZ_RUNS(...)                                                                           \
    {                                                                                          \
        const i64 mz_ = (ma + 1) | (mb + 1) | (mc >= 0 ? mc + 1 : 0), rs_ = run * va;          \
        FZ_GROUP(v0, j)                                                                        \
        if (run == 1) {                                                                        \
            for (i64 v = v0; v < v1; v++) {                                                    \
                __VA_ARGS__                                                                    \
                j = (((j | mz_) + va) & ~mz_) | sb;                                            \
            }                                                                                  \
        } else {                                                                               \
            for (i64 v = v0; v < v1;) {                                                        \
                const i64 end_ = (v | (run - 1)) + 1 < v1 ? (v | (run - 1)) + 1 : v1;          \
                const i64 j0_ = j - (v & (run - 1)) * va;                                      \
                for (; v < end_; v++, j += va) __VA_ARGS__                                     \
                j = (((j0_ | mz_) + rs_) & ~mz_) | sb;                                         \
            }                                                                                  \
        }                                                                                      \
    }
#define FZ_PART(NAME, NV, ...)                                                                 \
typedef R SFX(NAME##_t) __attribute__((vector_size(NV * sizeof(R))));                          \
QD_FMA static void SFX(NAME)(R *restrict st, int hi, int lo, int paired, const R *pc,         \
                             const i64 *o_, const R *m, i64 v0, i64 v1, const i64 *ins,        \
                             int pf_ok) {                                                      \
    typedef SFX(NAME##_t) V;                                                                   \
    const i64 va = NV / 2, olo = (i64)2 << lo, ohi = (i64)2 << hi;                             \
    const i64 ma = ins[0], mb = ins[1], mc = ins[2], sb = ins[3];                              \
    const i64 rlo = olo * (i64)sizeof(R), dv = PF_BYTES / (NV * (i64)sizeof(R));               \
    const int pf = pf_ok && pf_run(rlo >= 512 ? rlo : ohi * (i64)sizeof(R));                   \
    const i64 run = ma + 1 > va ? (ma + 1) / va : 1;  /* vectors per contiguous run */         \
    if (paired) {                                                                              \
        V Vr[8], Vi[8];                                                                        \
        for (int e = 0; e < 8; e++)                                                            \
            for (int l = 0; l < NV; l++) {                                                     \
                Vr[e][l] = pc[2 * e];                                                          \
                Vi[e][l] = (l & 1) ? pc[2 * e + 1] : -pc[2 * e + 1];                           \
            }                                                                                  \
        const i64 o0 = o_[0], o1 = o_[1], o2 = o_[2], o3 = o_[3];                              \
        const i64 o4 = o_[4], o5 = o_[5], o6 = o_[6], o7 = o_[7];                              \
        const int id0 = SFX(fz_pair_identity)(pc, o_, 0), id1 = SFX(fz_pair_identity)(pc, o_, 1); \
        if (id0 != id1) {  /* one pair is the identity (an excitation, iSWAP): the other only */ \
            const int c = id0 ? 4 : 0;                                                         \
            const i64 i0 = id0 ? o2 : o0, i1 = id0 ? o3 : o1;                                  \
            const i64 w0 = id0 ? o6 : o4, w1 = id0 ? o7 : o5;                                  \
            FZ_ONEPAIR(Vr[c] * a0 + Vi[c] * s0 + Vr[c + 1] * a1 + Vi[c + 1] * s1,               \
                       Vr[c + 2] * a0 + Vi[c + 2] * s0 + Vr[c + 3] * a1 + Vi[c + 3] * s1,       \
                       __VA_ARGS__);                                                           \
            return;                                                                            \
        }                                                                                      \
        switch (SFX(fz_pair_form)(pc)) {                                                       \
        case FZ_REAL:                                                                          \
            FZ_PAIRED(Vr[0] * a0 + Vr[1] * a1, Vr[2] * a0 + Vr[3] * a1,                        \
                      Vr[4] * a2 + Vr[5] * a3, Vr[6] * a2 + Vr[7] * a3, __VA_ARGS__);          \
            break;                                                                             \
        case FZ_RX:                                                                            \
            FZ_PAIRED(Vr[0] * a0 + Vi[1] * s1, Vi[2] * s0 + Vr[3] * a1,                        \
                      Vr[4] * a2 + Vi[5] * s3, Vi[6] * s2 + Vr[7] * a3, __VA_ARGS__);          \
            break;                                                                             \
        case FZ_DIAG:                                                                          \
            FZ_PAIRED(Vr[0] * a0 + Vi[0] * s0, Vr[3] * a1 + Vi[3] * s1,                        \
                      Vr[4] * a2 + Vi[4] * s2, Vr[7] * a3 + Vi[7] * s3, __VA_ARGS__);          \
            break;                                                                             \
        default:                                                                               \
            FZ_PAIRED(Vr[0] * a0 + Vi[0] * s0 + Vr[1] * a1 + Vi[1] * s1,                       \
                      Vr[2] * a0 + Vi[2] * s0 + Vr[3] * a1 + Vi[3] * s1,                       \
                      Vr[4] * a2 + Vi[4] * s2 + Vr[5] * a3 + Vi[5] * s3,                       \
                      Vr[6] * a2 + Vi[6] * s2 + Vr[7] * a3 + Vi[7] * s3, __VA_ARGS__);         \
        }                                                                                      \
        return;                                                                                \
    }                                                                                          \
    V Vr[16], Vi[16];                                                                          \
    for (int e = 0; e < 16; e++)                                                               \
        for (int l = 0; l < NV; l++) {                                                         \
            Vr[e][l] = m[2 * e];                                                               \
            Vi[e][l] = (l & 1) ? m[2 * e + 1] : -m[2 * e + 1];                                 \
        }                                                                                      \
    FZ_RUNS({                                                                                  \
        if (pf) FZ_PF(v + dv);                                                                 \
        R *p = st + 2 * j;                                                                     \
        V a0, a1, a2, a3;                                                                      \
        memcpy(&a0, p, sizeof(V)); memcpy(&a1, p + olo, sizeof(V));                            \
        memcpy(&a2, p + ohi, sizeof(V)); memcpy(&a3, p + ohi + olo, sizeof(V));                \
        QD_INREG(a0); QD_INREG(a1); QD_INREG(a2); QD_INREG(a3);                                \
        V s0 = SHUF(a0, __VA_ARGS__), s1 = SHUF(a1, __VA_ARGS__);                              \
        V s2 = SHUF(a2, __VA_ARGS__), s3 = SHUF(a3, __VA_ARGS__);                              \
        V y[4];                                                                                \
        for (int r = 0; r < 4; r++)                                                            \
            y[r] = Vr[4 * r] * a0 + Vi[4 * r] * s0 + Vr[4 * r + 1] * a1 + Vi[4 * r + 1] * s1 + \
                   Vr[4 * r + 2] * a2 + Vi[4 * r + 2] * s2 + Vr[4 * r + 3] * a3 +             \
                   Vi[4 * r + 3] * s3;                                                         \
        memcpy(p, &y[0], sizeof(V)); memcpy(p + olo, &y[1], sizeof(V));                        \
        memcpy(p + ohi, &y[2], sizeof(V)); memcpy(p + ohi + olo, &y[3], sizeof(V));            \
    })                                                                                         \
}
#if RBYTES == 4
FZ_PART(fz_part16, 16, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14)
#endif
FZ_PART(fz_part8, 8, 1, 0, 3, 2, 5, 4, 7, 6)
FZ_PART(fz_part4, 4, 1, 0, 3, 2)
FZ_PART(fz_part2, 2, 1, 0)
#undef FZ_PART
#undef FZ_PAIRED
#undef FZ_ONEPAIR
#undef FZ_RUNS
#undef FZ_PF
#undef FZ_GROUP

/* The widest vector part for lo: reals per vector. ins: the masks of the zeros inserted
 * into a vector's group index (ascending bits; the last all ones unless a selector bit is
 * fixed) and the selector's value there. pf_ok: the state is large enough for the middle-bit
 * prefetches (below PF_LIGHT_LO bytes it stays in the core's caches, where they cost up to
 * 20%, measured). */
static void SFX(fz_part)(R *restrict st, int hi, int lo, int paired, const R *pc,
                         const i64 *o, const R *m, i64 v0, i64 v1, int nv, const i64 *ins,
                         int pf_ok) {
    switch (nv) {
#if RBYTES == 4
    case 16: SFX(fz_part16)(st, hi, lo, paired, pc, o, m, v0, v1, ins, pf_ok); break;
#endif
    case 8: SFX(fz_part8)(st, hi, lo, paired, pc, o, m, v0, v1, ins, pf_ok); break;
    case 4: SFX(fz_part4)(st, hi, lo, paired, pc, o, m, v0, v1, ins, pf_ok); break;
    default: SFX(fz_part2)(st, hi, lo, paired, pc, o, m, v0, v1, ins, pf_ok); break;
    }
}
#endif

#if QD_VEC
/* A 4x4 block whose lower bit lo lies inside one vector register (lo < FZ_VB: the contiguous
 * runs below it are too short for the vector parts above): the lane form. A group of 64 bytes
 * (FZL_GB bits: 4 amplitudes in complex128, 8 in complex64) is one vector; the block's bits
 * inside it are constant shuffles, and every output lane e sums, over four sources src_s (the
 * group at the block's outer bit hc, or the group itself, with the in-group block bits flipped
 * or not), A_s[e] src_s[e] + B_s[e] src_s[e ^ 1] with per-lane coefficients read off m (the
 * row and column of lane e depend on its own block bits). The same flops per amplitude as the
 * dense vector parts, so a CNOT or a rotation on the lowest bits joins the blocks on its
 * partner bit instead of taking passes of its own. hi >= FZL_GB: sources (hc, flip lo),
 * outputs the two groups at hi = 0 and 1; hi < FZL_GB: sources (flip hi, flip lo) of one
 * group. */
#define FZL_NV (64 / RBYTES)
#define FZL_GB (RBYTES == 4 ? 3 : 2)
static void SFX(fz_lane_coeffs)(const R *m, int hi, int lo, R (*A)[16], R (*B)[16]) {
    const int outer = hi >= FZL_GB;
    for (int h = 0; h < 1 + outer; h++)
        for (int s = 0; s < 4; s++)
            for (int a = 0; a < FZL_NV / 2; a++) {
                const int bl = (a >> lo) & 1, bh = outer ? h : (a >> hi) & 1;
                const int fl = s & 1, fh = s >> 1;  /* outer: fh is the source group hc */
                const int r = 2 * bh + bl, c = 2 * (outer ? fh : bh ^ fh) + (bl ^ fl);
                const R ur = m[2 * (4 * r + c)], ui = m[2 * (4 * r + c) + 1];
                R *pa = A[4 * h + s], *pb = B[4 * h + s];
                pa[2 * a] = ur; pa[2 * a + 1] = ur;
                pb[2 * a] = -ui; pb[2 * a + 1] = ui;
            }
}
/* shuffles of a group: X1 re/im, Xk the flip of amplitude bits k (1: bit 0, 2: bit 1, ...) */
#if RBYTES == 4
#define FZL_X1 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14
#define FZL_X2 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13
#define FZL_X4 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11
#define FZL_X6 6, 7, 4, 5, 2, 3, 0, 1, 14, 15, 12, 13, 10, 11, 8, 9
#define FZL_X8 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7
#define FZL_X10 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5
#define FZL_X12 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3
#define FZL_X7 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8
#define FZL_X11 11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5, 4
#define FZL_X13 13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2
#else
#define FZL_X1 1, 0, 3, 2, 5, 4, 7, 6
#define FZL_X2 2, 3, 0, 1, 6, 7, 4, 5
#define FZL_X4 4, 5, 6, 7, 0, 1, 2, 3
#define FZL_X6 6, 7, 4, 5, 2, 3, 0, 1
#define FZL_X7 7, 6, 5, 4, 3, 2, 1, 0
#endif
/* groups [g0, g1) of the outer form (groups at hi = 0; partner + ohi reals) and of the inner
 * form (every group); XL: the flip of lo, XH: of hi, XB: of both */
#define FZL_T(M, k, E) ((((M) >> (k)) & 1) ? (E) : Z)
#define FZL_OUTER(XL, MA, MB)                                                                  \
    for (i64 g = g0; g < g1; g++) {                                                            \
        i64 G = ((g & ~mh) << 1) | (g & mh);                                                   \
        if (pf) {                                                                              \
            i64 T = g + dv;                                                                    \
            T = ((T & ~mh) << 1) | (T & mh);                                                   \
            PF_AT(st, FZL_NV * T, sizeof(R)); PF_AT(st, FZL_NV * T + ohi, sizeof(R));          \
        }                                                                                      \
        R *p = st + FZL_NV * G;                                                                \
        V v0, v1;                                                                              \
        memcpy(&v0, p, sizeof v0); memcpy(&v1, p + ohi, sizeof v1);                            \
        QD_INREG(v0); QD_INREG(v1);                                                            \
        const V f0 = SHUF(v0, XL), f1 = SHUF(v1, XL);                                          \
        const V y0 = FZL_T(MA, 0, A[0] * v0) + FZL_T(MA, 1, A[1] * f0) +                       \
                     FZL_T(MA, 2, A[2] * v1) + FZL_T(MA, 3, A[3] * f1) +                       \
                     ((MB) & 15 ? SHUF(FZL_T(MB, 0, B[0] * v0) + FZL_T(MB, 1, B[1] * f0) +     \
                                       FZL_T(MB, 2, B[2] * v1) + FZL_T(MB, 3, B[3] * f1),      \
                                       FZL_X1) : Z);                                           \
        const V y1 = FZL_T(MA, 4, A[4] * v0) + FZL_T(MA, 5, A[5] * f0) +                       \
                     FZL_T(MA, 6, A[6] * v1) + FZL_T(MA, 7, A[7] * f1) +                       \
                     ((MB) & 240 ? SHUF(FZL_T(MB, 4, B[4] * v0) + FZL_T(MB, 5, B[5] * f0) +    \
                                        FZL_T(MB, 6, B[6] * v1) + FZL_T(MB, 7, B[7] * f1),     \
                                        FZL_X1) : Z);                                          \
        memcpy(p, &y0, sizeof y0); memcpy(p + ohi, &y1, sizeof y1);                            \
    }
#define FZL_INNER(XL, XH, XB, MA, MB)                                                          \
    for (i64 g = g0; g < g1; g++) {                                                            \
        R *p = st + FZL_NV * g;                                                                \
        V v;                                                                                   \
        memcpy(&v, p, sizeof v);                                                               \
        QD_INREG(v);                                                                           \
        const V fl = SHUF(v, XL), fh = SHUF(v, XH), fb = SHUF(v, XB);                          \
        const V y = FZL_T(MA, 0, A[0] * v) + FZL_T(MA, 1, A[1] * fl) +                         \
                    FZL_T(MA, 2, A[2] * fh) + FZL_T(MA, 3, A[3] * fb) +                        \
                    ((MB) ? SHUF(FZL_T(MB, 0, B[0] * v) + FZL_T(MB, 1, B[1] * fl) +            \
                                 FZL_T(MB, 2, B[2] * fh) + FZL_T(MB, 3, B[3] * fb), FZL_X1)    \
                          : Z);                                                                \
        memcpy(p, &y, sizeof y);                                                               \
    }
/* A real diagonal and imaginary partners flipping both bits (IsingXX/YY/XY, iSWAP on the
 * lowest bits): out[e] = A0[e] v[e] + b3[e] v[e ^ XB ^ 1], the partner's re/im swap folded
 * into its shuffle (XB1 = XB ^ 1; b3: the partner's coefficients as given): one shuffle per
 * vector instead of two (complex64 IsingXX on bits (1, 0) at n = 16: 4.2 -> 2.8 us in one
 * build, where the other gates' lane loops took 2.8 us; 2.9 us with two in another, measured). */
#define FZL_INNER_XP(XB1)                                                                      \
    {                                                                                          \
        V b3;                                                                                  \
        memcpy(&b3, B_[3], sizeof b3);                                                         \
        const V a0 = A[0];                                                                     \
        for (i64 g = g0; g < g1; g++) {                                                        \
            R *p = st + FZL_NV * g;                                                            \
            V v;                                                                               \
            memcpy(&v, p, sizeof v);                                                           \
            QD_INREG(v);                                                                       \
            const V y = a0 * v + b3 * SHUF(v, XB1);                                            \
            memcpy(p, &y, sizeof y);                                                           \
        }                                                                                      \
    }
/* The terms a block's lane coefficients use (a bit per term: outer y0 from v0, f0, v1, f1,
 * then y1 from the same; inner v, fl, fh, fb), of the real parts (A) and the imaginary
 * parts (B), and the forms whose loops skip the others: a diagonal (IsingZZ: each amplitude
 * from itself), the pairs that flip both bits (IsingXX/YY/XY, iSWAP: a real diagonal and
 * imaginary partners; a Givens rotation or excitation: all real; any such pairs). */
#define FZL_SUB(m, f) (((m) & ~(f)) == 0)
#define FZL_FORMS(LOOP, DG, FB, FBP, ALL)                                                      \
    if (FZL_SUB(ma, DG) && FZL_SUB(mb, DG)) { LOOP(DG, DG) }                                   \
    else if (FZL_SUB(ma, FB) && mb == 0) { LOOP(FB, 0) }                                       \
    else if (FZL_SUB(ma, DG) && FZL_SUB(mb, FBP)) { LOOP(DG, FBP) }                            \
    else if (FZL_SUB(ma, FB) && FZL_SUB(mb, FB)) { LOOP(FB, FB) }                              \
    else { LOOP(ALL, ALL) }
typedef R SFX(vl) __attribute__((vector_size(64)));
QD_FMA static void SFX(fz_lane_part)(R *restrict st, int hi, int lo, const R (*A_)[16],
                                     const R (*B_)[16], i64 g0, i64 g1, int pf_ok) {
    typedef SFX(vl) V;
    V A[8], B[8];
    const V Z = {0};
    int ma = 0, mb = 0;
    for (int q = 0; q < 8; q++) {
        memcpy(&A[q], A_[q], sizeof(V));
        V b;
        memcpy(&b, B_[q], sizeof(V));
        B[q] = SHUF(b, FZL_X1);  /* B x[e ^ 1] = (Bs x) re/im swapped */
        for (int l = 0; l < FZL_NV && (q < 4 || hi >= FZL_GB); l++) {  /* inner: 4 terms */
            ma |= (A_[q][l] != 0) << q;
            mb |= (B_[q][l] != 0) << q;
        }
    }
    if (hi >= FZL_GB) {
        const i64 ohi = (i64)2 << hi, mh = ((i64)1 << (hi - FZL_GB)) - 1;
        const i64 dv = PF_BYTES / 64;
        const int pf = pf_ok && pf_run(ohi * (i64)sizeof(R));
        /* diagonal: y0 from v0, y1 from v1; both-bit partners: y0 from f1, y1 from f0 */
#define FZL_O2(MA, MB) FZL_OUTER(FZL_X2, MA, MB)
#define FZL_O4(MA, MB) FZL_OUTER(FZL_X4, MA, MB)
#if RBYTES == 4
#define FZL_O8(MA, MB) FZL_OUTER(FZL_X8, MA, MB)
        switch (lo) {
        case 0: FZL_FORMS(FZL_O2, 0x41, 0x69, 0x28, 0xff) break;
        case 1: FZL_FORMS(FZL_O4, 0x41, 0x69, 0x28, 0xff) break;
        default: FZL_FORMS(FZL_O8, 0x41, 0x69, 0x28, 0xff) break;
        }
#undef FZL_O8
#else
        if (lo == 0) { FZL_FORMS(FZL_O2, 0x41, 0x69, 0x28, 0xff) }
        else { FZL_FORMS(FZL_O4, 0x41, 0x69, 0x28, 0xff) }
#endif
#undef FZL_O2
#undef FZL_O4
        return;
    }
#define FZL_I246(MA, MB) FZL_INNER(FZL_X2, FZL_X4, FZL_X6, MA, MB)
    const int xp = FZL_SUB(ma, 0x1) && mb == 0x8;  /* a real diagonal, imaginary partners */
#if RBYTES == 4
#define FZL_I2810(MA, MB) FZL_INNER(FZL_X2, FZL_X8, FZL_X10, MA, MB)
#define FZL_I4812(MA, MB) FZL_INNER(FZL_X4, FZL_X8, FZL_X12, MA, MB)
    if (xp) {
        if (hi == 1) FZL_INNER_XP(FZL_X7)
        else if (lo == 0) FZL_INNER_XP(FZL_X11)
        else FZL_INNER_XP(FZL_X13)
    }
    else if (hi == 1) { FZL_FORMS(FZL_I246, 0x1, 0x9, 0x8, 0xf) }      /* lo = 0 */
    else if (lo == 0) { FZL_FORMS(FZL_I2810, 0x1, 0x9, 0x8, 0xf) }     /* hi = 2 */
    else { FZL_FORMS(FZL_I4812, 0x1, 0x9, 0x8, 0xf) }                  /* hi = 2, lo = 1 */
#undef FZL_I2810
#undef FZL_I4812
#else
    if (xp) FZL_INNER_XP(FZL_X7)
    else { FZL_FORMS(FZL_I246, 0x1, 0x9, 0x8, 0xf) }                   /* hi = 1, lo = 0 */
#endif
#undef FZL_I246
}
#undef FZL_OUTER
#undef FZL_INNER
#undef FZL_INNER_XP
#undef FZL_T
#undef FZL_SUB
#undef FZL_FORMS
#undef FZL_X1
#undef FZL_X2
#undef FZL_X4
#undef FZL_X6
#undef FZL_X7
#if RBYTES == 4
#undef FZL_X8
#undef FZL_X10
#undef FZL_X11
#undef FZL_X12
#undef FZL_X13
#endif

static void SFX(fz_lane)(R *st, int nbits, int hi, int lo, const R *m, int par) {
    R A[8][16], B[8][16];
    SFX(fz_lane_coeffs)(m, hi, lo, A, B);
    const i64 ng = (i64)1 << (nbits - FZL_GB - (hi >= FZL_GB));
    const int pf_ok = (RSIZE << (nbits + 1)) >= PF_LIGHT_LO;  /* as fz_part */
    if (par > 1 && nbits >= PAR_MIN_BITS) {
#pragma omp parallel num_threads(par)
        {
            i64 g0, g1;
            share(ng, THREAD_ID, NUM_THREADS, &g0, &g1);
            SFX(fz_lane_part)(st, hi, lo, (const R(*)[16])A, (const R(*)[16])B, g0, g1, pf_ok);
        }
        return;
    }
    SFX(fz_lane_part)(st, hi, lo, (const R(*)[16])A, (const R(*)[16])B, 0, ng, pf_ok);
}
#undef FZL_NV
#undef FZL_GB
#endif

/* A dense 4x4 m (R, row-major; local index 2 b_hi + b_lo) on bits hi > lo of 2^nbits
 * amplitudes, in one pass: as two 2x2 products where m is a one-qubit gate times a permutation
 * (the flops of one one-qubit gate), else all 16 entries. sel >= 0 (a selector bit above the
 * 64-byte vectors): m where bit sel is 0 and m1 where it is 1, two half passes in one
 * parallel region. */
static void SFX(fz_apply2)(R *st, int nbits, int hi, int lo, const R *m, int par, int sel,
                           const R *m1) {
#if QD_VEC
    if (lo < FZ_VB) {  /* never with a selector */
        SFX(fz_lane)(st, nbits, hi, lo, m, par);
        return;
    }
#endif
    const int nh = sel >= 0 ? 2 : 1;  /* halves: the selector's values */
    const i64 olo = (i64)2 << lo, ohi = (i64)2 << hi;  /* reals */
    int paired[2];
    i64 o[2][8], ins[2][4];
    R pc[2][16];
    /* zeros inserted into the group index at lo, hi (and sel), in ascending order */
    int pos[3] = {lo, hi, sel >= 0 ? sel : 63}, np = sel >= 0 ? 3 : 2;
    for (int x = 0; x < 2; x++)
        for (int y = 0; y + 1 < np - x; y++)
            if (pos[y] > pos[y + 1]) { int t_ = pos[y]; pos[y] = pos[y + 1]; pos[y + 1] = t_; }
    for (int h = 0; h < nh; h++) {
        const R *mh = h ? m1 : m;
        int io[8] = {0, 1, 2, 3, 0, 1, 2, 3};
        paired[h] = SFX(fz_pairs)(mh, io);
        for (int e = 0; e < 8; e++) o[h][e] = (io[e] >> 1) * ohi + (io[e] & 1) * olo;
        /* the pair coefficients: rows io[4+q], io[5+q] (q = 0, 2) from columns io[q], io[q+1] */
        for (int q = 0; q < 4; q += 2)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    int r = io[4 + q + a], cl = io[q + b];
                    pc[h][2 * (2 * q + 2 * a + b)] = mh[2 * (4 * r + cl)];
                    pc[h][2 * (2 * q + 2 * a + b) + 1] = mh[2 * (4 * r + cl) + 1];
                }
        ins[h][0] = ((i64)1 << pos[0]) - 1;
        ins[h][1] = ((i64)1 << pos[1]) - 1;
        ins[h][2] = sel >= 0 ? ((i64)1 << pos[2]) - 1 : -1;
        ins[h][3] = sel >= 0 ? (i64)h << sel : 0;
    }
    const i64 ngr = (i64)1 << (nbits - np);
#if QD_VEC
    int nv = 64 / (int)sizeof(R);  /* reals per vector: 64 bytes, or 2^lo amplitudes */
    while (nv > 2 && ((i64)nv >> 1) > ((i64)1 << lo)) nv >>= 1;
    const i64 nvec = ngr / (nv / 2);
    const int pf_ok = (RSIZE << (nbits + 1)) >= PF_LIGHT_LO;
    if (par > 1 && nbits >= PAR_MIN_BITS) {  /* both halves in one region */
#pragma omp parallel num_threads(par)
        {
            i64 v0, v1;
            share(nvec, THREAD_ID, NUM_THREADS, &v0, &v1);
            for (int h = 0; h < nh; h++)
                SFX(fz_part)(st, hi, lo, paired[h], pc[h], o[h], h ? m1 : m, v0, v1, nv, ins[h],
                             pf_ok);
        }
        return;
    }
    for (int h = 0; h < nh; h++)
        SFX(fz_part)(st, hi, lo, paired[h], pc[h], o[h], h ? m1 : m, 0, nvec, nv, ins[h],
                     pf_ok);
#else
    (void)pc; (void)paired; (void)o;
    for (int h = 0; h < nh; h++) {
        const R *mh = h ? m1 : m;
        const i64 *in = ins[h];
#pragma omp parallel for if (par > 1 && nbits >= PAR_MIN_BITS) num_threads(par) schedule(static)
        for (i64 j0 = 0; j0 < ngr; j0++) {
            i64 j = ((j0 & ~in[0]) << 1) | (j0 & in[0]);
            j = ((j & ~in[1]) << 1) | (j & in[1]);
            j = ((j & ~in[2]) << 1) | (j & in[2]) | in[3];
            R *p[4] = {st + 2 * j, st + 2 * j + olo, st + 2 * j + ohi, st + 2 * j + ohi + olo};
            R xr[4], xi[4];
            for (int c = 0; c < 4; c++) { xr[c] = p[c][0]; xi[c] = p[c][1]; }
            for (int r = 0; r < 4; r++) {
                R yr = 0, yi = 0;
                for (int c = 0; c < 4; c++) {
                    yr += mh[2 * (4 * r + c)] * xr[c] - mh[2 * (4 * r + c) + 1] * xi[c];
                    yi += mh[2 * (4 * r + c)] * xi[c] + mh[2 * (4 * r + c) + 1] * xr[c];
                }
                p[r][0] = yr; p[r][1] = yi;
            }
        }
    }
#endif
}

/* One op of a fused list on 2^nbits amplitudes. */
static void SFX(fz_one)(R *st, int nbits, const SFX(fzop_t) *op, int par, SFX(scratch_t) *sc) {
    if (op->fused == 2)  /* a selector block: u where the selector bit is 0, u + 32 where 1 */
        SFX(fz_apply2)(st, nbits, op->g->bits[0], op->g->bits[1], op->u, par,
                       __builtin_ctzll((unsigned long long)op->g->cmask), op->u + 32);
    else if (op->fused)
        SFX(fz_apply2)(st, nbits, op->g->bits[0], op->g->bits[1], op->u, par, -1, 0);
    else
        SFX(apply_range)(st, nbits, op->g, op->u, op->dag, par, sc);
}

/* A fused list: ops, the fused gates and their data. */
typedef struct {
    SFX(fzop_t) *ops;
    gate_t *fg;
    R *fu;
    i64 nout;
} SFX(fzlist_t);

static void SFX(fz_free)(SFX(fzlist_t) *L) {
    free(L->ops); free(L->fg); free(L->fu);
}

/* The gates gs[0..cnt) with data ud[..] (in application order; their inverses when dag) as a
 * fused list. Returns 0 when out of memory. */
/* cbits: the ops whose bits all lie below it run in cache-resident chunks or tiles; a selector
 * block there may have any selector, elsewhere its selector splits the state into runs of at
 * least FZ_SEL_RUN bytes (the two half passes then stream like one). */
#define FZ_SEL_RUN 4096
static int SFX(fz_build)(const gate_t *const *gs, const R *const *ud, i64 cnt, int dag,
                         int cbits, SFX(fzlist_t) *L) {
    SFX(fzop_t) *ops = (SFX(fzop_t) *)malloc(sizeof(SFX(fzop_t)) * (size_t)(cnt + 1));
    gate_t *fg = (gate_t *)malloc(sizeof(gate_t) * (size_t)(cnt + 1));
    R *fu = (R *)malloc(sizeof(R) * 64 * (size_t)(cnt + 1));
    SFX(fzblk_t) *blk = (SFX(fzblk_t) *)malloc(sizeof(SFX(fzblk_t)) * 64);
    L->ops = ops; L->fg = fg; L->fu = fu; L->nout = 0;
    if (!ops || !fg || !fu || !blk) {
        SFX(fz_free)(L);
        free(blk);
        return 0;
    }
    memset(blk, 0, sizeof(SFX(fzblk_t)) * 64);
    int open[64];        /* block of each bit, -1: none */
    int nsel[64];        /* open blocks with this selector bit */
    for (int p = 0; p < 64; p++) { open[p] = -1; nsel[p] = 0; }
    i64 selmask = 0;     /* bits with nsel > 0 */
    i64 nout = 0, nfg = 0;
    R ubuf[32];
    double E[32];
#define FZ_EMIT_GATE(i)                                                                        \
    do {                                                                                       \
        ops[nout].g = gs[i]; ops[nout].u = ud[i]; ops[nout].dag = dag;                          \
        ops[nout].fused = 0; nout++;                                                           \
    } while (0)
    /* a one-bit block with a selector becomes the two-bit block diag(m, m1) on (selector, bit) */
#define FZ_PROMOTE(k_)                                                                         \
    do {                                                                                       \
        const int s_ = (k_)->sel, t_ = (k_)->bl[0], shi_ = s_ > t_;                            \
        double M_[32];                                                                         \
        memset(M_, 0, sizeof M_);                                                              \
        for (int v_ = 0; v_ < 2; v_++)                                                         \
            for (int r_ = 0; r_ < 2; r_++)                                                     \
                for (int c2_ = 0; c2_ < 2; c2_++) {                                            \
                    const double *src_ = v_ ? (k_)->m1 : (k_)->m;                              \
                    int R_ = shi_ ? 2 * v_ + r_ : 2 * r_ + v_;                                 \
                    int C_ = shi_ ? 2 * v_ + c2_ : 2 * c2_ + v_;                               \
                    M_[2 * (4 * R_ + C_)] = src_[2 * (2 * r_ + c2_)];                          \
                    M_[2 * (4 * R_ + C_) + 1] = src_[2 * (2 * r_ + c2_) + 1];                  \
                }                                                                              \
        memcpy((k_)->m, M_, sizeof M_);                                                        \
        (k_)->bl[0] = shi_ ? s_ : t_; (k_)->bl[1] = shi_ ? t_ : s_;                            \
        (k_)->nb = 2;                                                                          \
        (k_)->sel = -1;                                                                        \
        open[s_] = open[t_];                                                                   \
        if (--nsel[s_] == 0) selmask &= ~((i64)1 << s_);                                       \
    } while (0)
    /* apply (emit) the block open on bit p, if any */
#define FZ_FLUSH(p)                                                                            \
    do {                                                                                       \
        int b_ = open[p];                                                                      \
        if (b_ < 0) break;                                                                     \
        SFX(fzblk_t) *k_ = &blk[b_];                                                           \
        if (k_->sel >= 0 && k_->nb == 1) FZ_PROMOTE(k_);                                       \
        const int nb_ = k_->nb, s_ = k_->sel;                                                  \
        for (int j_ = 0; j_ < nb_; j_++) open[k_->bl[j_]] = -1;                                \
        k_->nb = 0;                                                                            \
        if (s_ >= 0 && --nsel[s_] == 0) selmask &= ~((i64)1 << s_);                            \
        if (k_->cnt == 1) { FZ_EMIT_GATE(k_->first); break; }                                  \
        gate_t *f_ = &fg[nfg];                                                                 \
        R *d_ = fu + 64 * nfg;                                                                 \
        nfg++;                                                                                 \
        memset(f_, 0, sizeof(gate_t));                                                         \
        f_->kind = K_DENSE; f_->k = nb_;                                                       \
        if (s_ >= 0) f_->cmask = (i64)1 << s_;                                                 \
        for (int j_ = 0; j_ < nb_; j_++) f_->bits[j_] = k_->bl[j_];                            \
        layout_bits(f_);                                                                       \
        f_->usize = 2 << (2 * nb_);                                                            \
        for (int e_ = 0; e_ < (int)f_->usize; e_++) d_[e_] = (R)k_->m[e_];                     \
        if (s_ >= 0)                                                                           \
            for (int e_ = 0; e_ < 32; e_++) d_[32 + e_] = (R)k_->m1[e_];                       \
        ops[nout].g = f_; ops[nout].u = d_; ops[nout].dag = 0;                                 \
        ops[nout].fused = s_ >= 0 ? 2 : nb_ == 2; nout++;                                      \
    } while (0)
    /* before a gate on bits mask: the blocks with a selector among them are applied (a
     * one-bit one becomes a plain two-bit block the gate may join) */
#define FZ_FLUSH_SEL(mask)                                                                     \
    do {                                                                                       \
        if (!((mask) & selmask)) break;                                                        \
        for (int q_ = 0; q_ < 64; q_++) {                                                      \
            SFX(fzblk_t) *k_ = &blk[q_];                                                       \
            if (!k_->nb || k_->sel < 0 || !(((mask) >> k_->sel) & 1)) continue;                \
            if (k_->nb == 1) FZ_PROMOTE(k_);                                                   \
            else FZ_FLUSH(k_->bl[0]);                                                          \
        }                                                                                      \
    } while (0)
    for (i64 i = 0; i < cnt; i++) {
        const gate_t *g = gs[i];
        const i64 all = g->tmask | g->cmask;
        FZ_FLUSH_SEL(all);
        if (!SFX(fz_ok)(g)) {
            for (int q = 0; q < g->nspecial; q++) FZ_FLUSH(g->special[q]);
            FZ_EMIT_GATE(i);
            continue;
        }
        const R *u = g->kind == K_FLIP || g->kind == K_SWAP ? 0 : SFX(effective)(g, ud[i], dag, ubuf);
        int a = g->special[g->nspecial - 1], b = g->nspecial > 1 ? g->special[0] : -1;
        int ba = open[a], bb = b >= 0 ? open[b] : -1;
        int nb = b >= 0 ? 2 : 1;
        /* a singly controlled one-qubit gate whose control has no pending one-qubit gate of
         * its own joins the block of its target with the control as a selector bit (the
         * block's bits and the selector all clear of the 64-byte vectors): a CNOT chain
         * then takes one pass per two links, not one per link */
        if (QD_VEC && g->k == 1 && nb == 2 && (ba < 0 || ba != bb)) {
            const int t = g->bits[0], cb_ = a == t ? b : a;
            int X = open[t], Y = open[cb_];
            /* the selector above the amplitudes of one 64-byte vector */
            int ok = cb_ >= (RBYTES == 4 ? 3 : 2) && t >= FZ_VB && (Y < 0 || blk[Y].nb == 2);
            int hi_bits = cb_ >= cbits || t >= cbits;
            if (ok && X >= 0) {
                ok = (blk[X].sel < 0 || blk[X].sel == cb_);
                for (int j = 0; j < blk[X].nb; j++) {
                    ok &= blk[X].bl[j] >= FZ_VB;
                    hi_bits |= blk[X].bl[j] >= cbits;
                }
            }
            if (hi_bits && ((size_t)2 * RSIZE << cb_) < FZ_SEL_RUN) ok = 0;
            if (ok) {
                if (Y >= 0) FZ_FLUSH(cb_);
                X = open[t];
                if (X < 0) {
                    int slot = 0;
                    while (blk[slot].nb != 0) slot++;
                    SFX(fzblk_t) *k = &blk[slot];
                    k->nb = 1; k->bl[0] = t; k->bl[1] = -1; k->cnt = 0; k->sel = -1;
                    memset(k->m, 0, sizeof k->m);
                    k->m[0] = 1; k->m[6] = 1;
                    open[t] = X = slot;
                }
                SFX(fzblk_t) *k = &blk[X];
                if (k->sel < 0) {
                    k->sel = cb_;
                    memcpy(k->m1, k->m, sizeof k->m);
                    if (nsel[cb_]++ == 0) selmask |= (i64)1 << cb_;
                }
                gate_t gt = *g;  /* the target's gate, uncontrolled, on the block's bits */
                gt.cmask = 0;
                layout_bits(&gt);
                SFX(fz_expand)(&gt, u, k->nb, k->bl, E);
                SFX(fz_mul)(k->m1, E, 1 << k->nb);
                if (k->cnt == 0) k->first = i;
                k->cnt++;
                continue;
            }
        }
        int target = -1;
        if (ba >= 0 && (nb == 1 || ba == bb)) {
            target = ba;  /* the block on these bits (or a two-bit block holding a) */
        } else {
            if (ba >= 0 && blk[ba].nb == 2) { FZ_FLUSH(a); ba = -1; }
            if (bb >= 0 && blk[bb].nb == 2) { FZ_FLUSH(b); bb = -1; }
            /* one selector at most, on bits clear of the vectors */
            if (ba >= 0 && bb >= 0 && blk[ba].sel >= 0 && blk[bb].sel >= 0 &&
                blk[ba].sel != blk[bb].sel) { FZ_FLUSH(b); bb = -1; }
            if (ba >= 0 && blk[ba].sel >= 0 && b >= 0 && b < FZ_VB) { FZ_FLUSH(a); ba = -1; }
            /* a short-run selector stays on bits that run in cache */
            if (ba >= 0 && blk[ba].sel >= 0 && a >= cbits &&
                ((size_t)2 * RSIZE << blk[ba].sel) < FZ_SEL_RUN) { FZ_FLUSH(a); ba = -1; }
            if (bb >= 0 && blk[bb].sel >= 0 && a >= cbits &&
                ((size_t)2 * RSIZE << blk[bb].sel) < FZ_SEL_RUN) { FZ_FLUSH(b); bb = -1; }
            if (bb >= 0 && blk[bb].sel >= 0 && a < FZ_VB) { FZ_FLUSH(b); bb = -1; }
            /* a new block on a (and b), from the one-bit blocks there */
            int slot = 0;
            while (blk[slot].nb != 0) slot++;  /* open blocks hold disjoint bits: < 64 */
            SFX(fzblk_t) *k = &blk[slot];
            const int sa = ba >= 0 ? blk[ba].sel : -1, sbb = bb >= 0 ? blk[bb].sel : -1;
            k->nb = nb; k->bl[0] = a; k->bl[1] = b;
            k->sel = sa >= 0 ? sa : sbb;
            const int D = 1 << nb;
            for (int v = 0; v < 1 + (k->sel >= 0); v++) {
                double *dst = v ? k->m1 : k->m;
                memset(dst, 0, sizeof k->m);
                for (int r = 0; r < D; r++)
                    for (int q = 0; q < D; q++) {
                        double hr = 1, hi_ = 0, lr = 1, li = 0;
                        int rh = nb == 2 ? r >> 1 : r, qh = nb == 2 ? q >> 1 : q;
                        if (ba >= 0) {
                            const double *ma_ = v && sa >= 0 ? blk[ba].m1 : blk[ba].m;
                            hr = ma_[2 * (rh * 2 + qh)]; hi_ = ma_[2 * (rh * 2 + qh) + 1];
                        } else if (rh != qh) hr = 0;
                        if (nb == 2) {
                            int rl = r & 1, ql = q & 1;
                            if (bb >= 0) {
                                const double *mb_ = v && sbb >= 0 ? blk[bb].m1 : blk[bb].m;
                                lr = mb_[2 * (rl * 2 + ql)]; li = mb_[2 * (rl * 2 + ql) + 1];
                            } else if (rl != ql) lr = 0;
                        }
                        dst[2 * (r * D + q)] = hr * lr - hi_ * li;
                        dst[2 * (r * D + q) + 1] = hr * li + hi_ * lr;
                    }
            }
            /* the selector counts move with the blocks (two with the same selector: one) */
            if (sa >= 0 && sbb >= 0 && --nsel[sa] == 0) selmask &= ~((i64)1 << sa);
            k->cnt = (ba >= 0 ? blk[ba].cnt : 0) + (bb >= 0 ? blk[bb].cnt : 0);
            k->first = ba >= 0 ? blk[ba].first : bb >= 0 ? blk[bb].first : i;
            if (ba >= 0) blk[ba].nb = 0;
            if (bb >= 0) blk[bb].nb = 0;
            open[a] = slot;
            if (b >= 0) open[b] = slot;
            target = slot;
        }
        SFX(fzblk_t) *k = &blk[target];
        SFX(fz_expand)(g, u, k->nb, k->bl, E);
        SFX(fz_mul)(k->m, E, 1 << k->nb);
        if (k->sel >= 0) SFX(fz_mul)(k->m1, E, 1 << k->nb);
        if (k->cnt == 0) k->first = i;
        k->cnt++;
        (void)all;
    }
    for (int p = 0; p < 64; p++) FZ_FLUSH(p);
#undef FZ_FLUSH_SEL
#undef FZ_FLUSH
#undef FZ_PROMOTE
#undef FZ_EMIT_GATE
    free(blk);
    L->nout = nout;
    return 1;
}

/* The gates from position start (in order, or their inverses in reverse order), fused into
 * two-bit blocks, then applied: consecutive ops whose bits all lie below CHUNK_BITS share
 * chunked passes. Returns 0 when out of memory (nothing applied). */
/* Ops that fit a chunk of 2^cb amplitudes move later, past ops that do not fit and act on
 * other bits (ops on disjoint bits commute), up to the next op that fits: they then share that
 * op's chunked pass instead of taking a pass of their own (SEL: the rotation on bit 0 waits
 * for the layer's low-bit blocks). At most 64 places per op. */
static void SFX(fz_sink)(SFX(fzop_t) *ops, i64 nout, int cb) {
    for (i64 i = nout - 2; i >= 0; i--) {
        if (!fits_chunk(ops[i].g, cb)) continue;
        for (i64 j = i; j + 1 < nout && j - i < 64; j++) {
            const gate_t *a = ops[j].g, *b = ops[j + 1].g;
            if (fits_chunk(b, cb) || ((a->tmask | a->cmask) & (b->tmask | b->cmask))) break;
            SFX(fzop_t) tmp = ops[j];
            ops[j] = ops[j + 1];
            ops[j + 1] = tmp;
        }
    }
}

/* The program's gates from position start on (or their inverses, last first), fused into L;
 * 0 when there is no memory for it. */
static int SFX(fz_program)(const SFX(ctx_t) *c, const R **us, i64 nops, int dag, i64 start,
                           int cbits, SFX(fzlist_t) *L) {
    const i64 cnt = nops - start;
    const gate_t **gs = (const gate_t **)malloc(sizeof(gate_t *) * (size_t)(cnt + 1));
    const R **ud = (const R **)malloc(sizeof(R *) * (size_t)(cnt + 1));
    int ok = gs && ud;
    if (ok) {
        for (i64 t = start; t < nops; t++) {
            const i64 i = dag ? nops - 1 - t : t;
            gs[t - start] = &c->gates[i];
            ud[t - start] = us[i];
        }
        ok = SFX(fz_build)(gs, ud, cnt, dag, cbits, L);
    }
    free(gs); free(ud);
    return ok;
}

static int SFX(run_fused)(R *st, int n, const SFX(ctx_t) *c, const R **us, i64 nops, int dag,
                          int par, int tid, i64 start) {
    /* runs of ops on the low bits share chunked passes (chunks of up to 512 KiB, at least 8
     * of them; none below 2^15 amplitudes) */
    const int fcb = RSIZE == 4 ? 16 : 15;
    int cb = n - 3 < fcb ? n - 3 : fcb;
    if (cb < CHUNK_BITS) cb = n;
    SFX(fzlist_t) L;
    if (!SFX(fz_program)(c, us, nops, dag, start, cb, &L)) return 0;
    const SFX(fzop_t) *ops = L.ops;
    const i64 nout = L.nout;
    if (cb < n) SFX(fz_sink)(L.ops, nout, cb);
    i64 t = 0;
    while (t < nout) {
        i64 e = t;
        if (cb < n)
            while (e < nout && fits_chunk(ops[e].g, cb)) e++;
        if (e - t < 2) {
            SFX(fz_one)(st, n, &ops[t], par, &c->scr[tid]);
            t++;
            continue;
        }
        const i64 nch = (i64)1 << (n - cb), t0 = t;
#pragma omp parallel for if (par > 1) num_threads(par) schedule(static)
        for (i64 ch = 0; ch < nch; ch++) {
            SFX(scratch_t) *sc = &c->scr[par > 1 ? THREAD_ID : tid];
            for (i64 q = t0; q < e; q++) SFX(fz_one)(st + 2 * (ch << cb), cb, &ops[q], 1, sc);
        }
        t = e;
    }
    SFX(fz_free)(&L);
    return 1;
}

/* Fused ops ops[order[0..cnt)] (all within ts) applied tile by tile: each relocated into the
 * tile, then every tile gathered into this thread's buffer (in place when the run has no high
 * bits), the ops applied in order, the tile written back. No memory for the relocated ops: one
 * by one on the whole state. */
static void SFX(run_tiles)(R *st, int n, const SFX(ctx_t) *c, const SFX(fzop_t) *ops,
                           const i64 *order, int cnt, const tileset_t *ts, int par, int tid) {
    gate_t *loc = (gate_t *)malloc(sizeof(gate_t) * (size_t)cnt);
    SFX(fzop_t) *lops = (SFX(fzop_t) *)malloc(sizeof(SFX(fzop_t)) * (size_t)cnt);
    if (!loc || !lops) {
        free(loc); free(lops);
        for (int q = 0; q < cnt; q++) SFX(fz_one)(st, n, &ops[order[q]], par, &c->scr[tid]);
        return;
    }
    for (int q = 0; q < cnt; q++) {
        relocate(ops[order[q]].g, ts, &loc[q]);
        lops[q] = ops[order[q]];
        lops[q].g = &loc[q];
    }
    const int tb = TILE_LOW + ts->k;
    const i64 ntile = (i64)1 << (n - tb);
#pragma omp parallel for if (par > 1) num_threads(par) schedule(static)
    for (i64 t = 0; t < ntile; t++) {
        int me = par > 1 ? THREAD_ID : tid;
        R *buf = ts->k ? SFX(tile_buf)(c, me, 0) : st + 2 * (t << TILE_LOW);
        if (ts->k) SFX(tile_copy)(st, buf, ts, t, 0);
        for (int q = 0; q < cnt; q++) SFX(fz_one)(buf, tb, &lops[q], 1, &c->scr[me]);
        if (ts->k) SFX(tile_copy)(st, buf, ts, t, 1);
    }
    free(loc);
    free(lops);
}

/* A large state's forward in tile runs: the program is fused into two-bit blocks first (a
 * CNOT and the rotations on its wires stay one block), then the fused ops are scheduled into
 * runs (tile_schedule over the ops) and each run applied tile by tile; an op no tile set holds
 * runs on the whole state. 0 when there is no memory for the schedule. */
static int SFX(run_tiled)(R *st, int n, const SFX(ctx_t) *c, const R **us, i64 nops, int dag,
                          int par, int tid, i64 start) {
    SFX(fzlist_t) L;
    if (!SFX(fz_program)(c, us, nops, dag, start, TILE_LOW + c->tk, &L)) return 0;
    const i64 nout = L.nout;
    i64 *order = (i64 *)malloc(sizeof(i64) * (size_t)(nout + 1));
    char *done = (char *)calloc((size_t)(nout + 1), 1);
    const gate_t **gl = (const gate_t **)malloc(sizeof(gate_t *) * (size_t)(nout + 1));
    if (!order || !done || !gl) {
        free(order); free(done); free(gl);
        SFX(fz_free)(&L);
        return 0;
    }
    for (i64 q = 0; q < nout; q++) gl[q] = L.ops[q].g;
    i64 t = 0;
    while (t < nout) {
        if (done[t]) { t++; continue; }
        tileset_t ts;
        int cnt = SFX(tile_schedule)(c, gl, t, nout, nout, 0, done, order, &ts, n);
        if (cnt < 2) {  /* one op: on the whole state */
            i64 q = cnt == 1 ? order[0] : t;
            done[q] = 1;
            SFX(fz_one)(st, n, &L.ops[q], par, &c->scr[tid]);
            continue;
        }
        SFX(run_tiles)(st, n, c, L.ops, order, cnt, &ts, par, tid);
    }
    free(order); free(done); free(gl);
    SFX(fz_free)(&L);
    return 1;
}

static void SFX(run_one)(R *st, int n, const SFX(ctx_t) *c, const R **us, i64 nops, i64 b,
                         int dag, int par, int tid, i64 start) {
    const gate_t *gates = c->gates;
    for (i64 i = start; i < nops; i++) us[i] = SFX(gate_data)(c, i, b, tid, 0);
    /* forward runs: tiles pay off once the state is larger than the last-level cache (below,
     * the kernels are compute-bound and the tile copies cost more than the passes saved) */
    if (c->tbuf && (c->tiles == 2 || (RSIZE << (n + 1)) >= ((size_t)32 << 20)) &&
        SFX(run_tiled)(st, n, c, us, nops, dag, par, tid, start))
        return;
    /* below: gates on two bits fused into blocks */
    if (c->tiles && n >= FZ_MIN_N && SFX(run_fused)(st, n, c, us, nops, dag, par, tid, start))
        return;
    /* tiles off (QDIFF_NATIVE_TILES=0): every gate its own pass, no chunks shared either */
    int cb = c->tiles && n > CHUNK_BITS + 2 ? CHUNK_BITS : n;
    i64 t = start;
    while (t < nops) {
        i64 i = dag ? nops - 1 - t : t;
        i64 e = t;
        if (cb < n)
            while (e < nops && fits_chunk(&gates[dag ? nops - 1 - e : e], cb)) e++;
        if (e - t < 2) {
            SFX(apply_range)(st, n, &gates[i], us[i], dag, par, &c->scr[tid]);
            t++;
        } else {
            if (dag) SFX(run_chunked)(st, n, cb, c, us, nops - e, nops - t, 1, par, tid);
            else SFX(run_chunked)(st, n, cb, c, us, t, e, 0, par, tid);
            t = e;
        }
    }
}

/* The leading one-qubit gates (no controls) of a program, applied to |0...0>, give a product
 * state; CNOTs after them whose control lies above their target (a ladder down the wires, as
 * in entangling layers) only permute its basis states: the final index x holds the product's
 * amplitude at y, y_p = x_p ^ parity(x & m_p) with m_p over bits above p, so the state is
 * still written directly, bit by bit from the top, in one pass instead of one per gate.
 * Returns the first gate not in that prefix (0: nothing written). */
static int SFX(prefix_cnot)(const gate_t *g) {
    return g->kind == K_FLIP && g->k == 1 && __builtin_popcountll((unsigned long long)g->cmask) == 1 &&
           g->cmask > g->tmask;
}
static i64 SFX(product_prefix)(const SFX(ctx_t) *c, i64 nops, int n) {
    i64 e = 0;
    while (e < nops) {
        const gate_t *g = &c->gates[e];
        if (g->k != 1 || g->cmask || !(g->kind == K_DENSE || g->kind == K_DIAG || g->kind == K_FLIP))
            break;
        e++;
    }
    if (e == 0) return 0;
    while (e < nops && SFX(prefix_cnot)(&c->gates[e])) e++;
    return e >= 2 && n >= 2 ? e : 0;
}

#ifndef QD_PARITY64
#define QD_PARITY64
static inline int parity64(i64 x) { return __builtin_parityll((unsigned long long)x); }
/* x (2^(top-bot+1) complex, double): the permuted product of the one-qubit factors v[p] of
 * bits top down to bot, doubled in from the top (x[0] = 1 first): y_p = x_p ^ parity(x &
 * m_p & mask), m_p over the bits above p. */
static void product_double(double *x, const double (*v)[4], const i64 *m, int top, int bot,
                           i64 mask) {
    x[0] = 1;
    x[1] = 0;
    i64 len = 1;
    for (int p = top; p >= bot; p--) {
        const i64 mj = (m[p] & mask) >> (p + 1);
        for (i64 j = len - 1; j >= 0; j--) {
            const double xr = x[2 * j], xi = x[2 * j + 1];
            const int f = parity64(j & mj);
            const double *w0 = v[p] + 2 * f, *w1 = v[p] + 2 * (f ^ 1);
            x[4 * j] = xr * w0[0] - xi * w0[1];
            x[4 * j + 1] = xr * w0[1] + xi * w0[0];
            x[4 * j + 2] = xr * w1[0] - xi * w1[1];
            x[4 * j + 3] = xr * w1[1] + xi * w1[0];
        }
        len *= 2;
    }
}
#endif

/* A large product state in runs of 2^K amplitudes (K = PT_BITS, n - 6 below 2^18
 * amplitudes): with h the bits above a run, the run's low bits read y_low = A x_low ^ F(h)
 * (A: the low bits' parity masks, F_p = parity(h & m_p above the run)), so the run is hf[h]
 * times R0(x_low ^ d) with A d = F and R0 the low bits' permuted product; R0 is tabulated
 * once, in one copy per XOR of the bits inside a 64-byte vector, and every run is one complex
 * scale of a table read in whole vectors (product_run). 0 when there is no memory for the
 * tables. */
#define PT_BITS 12
#define PT_MIN_N 16
#if RBYTES == 4
#define PT_X1 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14
#else
#define PT_X1 1, 0, 3, 2, 5, 4, 7, 6
#endif
/* o[vector vb] = (sr + i si) t[vector vb ^ dh], nv vectors */
QD_FMA static void SFX(product_run)(R *restrict o, const R *restrict t, i64 dh, i64 nv, R sr,
                                    R si) {
    typedef SFX(vl) V;
    V a, b;
    for (int e = 0; e < (int)(64 / sizeof(R)); e++) {
        a[e] = sr;
        b[e] = e & 1 ? si : -si;
    }
    for (i64 vb = 0; vb < nv; vb++) {
        V x;
        memcpy(&x, t + (64 / sizeof(R)) * (vb ^ dh), sizeof x);
        QD_INREG(x);
        const V y = a * x + b * SHUF(x, PT_X1);
        memcpy(o + (64 / sizeof(R)) * vb, &y, sizeof y);
    }
}
#undef PT_X1
static int SFX(product_tables)(R *st, int n, const double (*v)[4], const i64 *m, int par) {
    enum { G = 64 / (2 * RBYTES) };  /* amplitudes per 64-byte vector */
    const int K = n - 6 < PT_BITS ? n - 6 : PT_BITS, nh = n - K;
    const i64 L = (i64)1 << K, low = L - 1;
    const size_t tbytes = sizeof(R) * 2 * (size_t)L * G;
    const size_t bytes = tbytes + sizeof(double) * (2 * (size_t)L + ((size_t)2 << nh));
    char *blk = (char *)keep_get(bytes);
    if (!blk) return 0;
    R *tab = (R *)blk;
    double *r0 = (double *)(blk + tbytes), *hf = r0 + 2 * L;
    product_double(r0, v, m, K - 1, 0, low);  /* the runs' own bits */
    product_double(hf, v, m, n - 1, K, -1);   /* the bits above the runs */
    for (int dl = 0; dl < G; dl++)
        for (i64 z = 0; z < L; z++) {
            tab[2 * (dl * L + z)] = (R)r0[2 * (z ^ dl)];
            tab[2 * (dl * L + z) + 1] = (R)r0[2 * (z ^ dl) + 1];
        }
#pragma omp parallel for if (par > 1) num_threads(par) schedule(static)
    for (i64 h = 0; h < ((i64)1 << nh); h++) {
        i64 d = 0;  /* A d = F(h), solved from the top bit down (A is unit upper triangular) */
        for (int p = K - 1; p >= 0; p--)
            d |= (i64)(parity64(h & (m[p] >> K)) ^ parity64(d & m[p] & low)) << p;
        SFX(product_run)(st + 2 * (h << K), tab + 2 * (d & (G - 1)) * L, d / G, L / G,
                         (R)hf[2 * h], (R)hf[2 * h + 1]);
    }
    keep_put(blk, bytes);
    return 1;
}

static void SFX(write_product)(R *st, int n, const SFX(ctx_t) *c, i64 pe, i64 b, int tid,
                               int par) {
    double v[QD_MAXN][4];
    i64 m[QD_MAXN];  /* the parity masks of the CNOTs after the one-qubit gates */
    for (int p = 0; p < n; p++) { v[p][0] = 1; v[p][1] = 0; v[p][2] = 0; v[p][3] = 0; m[p] = 0; }
    for (i64 i = 0; i < pe; i++) {
        const gate_t *g = &c->gates[i];
        if (g->cmask) {  /* CNOT(cb -> t), cb > t: y_t gains x_cb, and so does every y_p reading t */
            const int t = __builtin_ctzll((unsigned long long)g->tmask);
            const i64 cbit = g->cmask;
            for (int p = 0; p < n; p++)
                if (p == t || ((m[p] >> t) & 1)) m[p] ^= cbit;
            continue;
        }
        int p = g->special[0];
        double a0r = v[p][0], a0i = v[p][1], a1r = v[p][2], a1i = v[p][3];
        if (g->kind == K_FLIP) {
            v[p][0] = a1r; v[p][1] = a1i; v[p][2] = a0r; v[p][3] = a0i;
            continue;
        }
        const R *u = SFX(gate_data)(c, i, b, tid, 0);
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
    if (n >= PT_MIN_N && SFX(product_tables)(st, n, (const double (*)[4])v, m, par)) return;
    /* the top nh bits' factors hf (double), then every run of 2^nl amplitudes from its
     * factor by doubling over the low bits (in parallel over the runs) */
    int nl = par > 1 && n >= PAR_MIN_BITS ? n / 2 : n, nh = n - nl;
    double one[2];
    double *hf = nh ? (double *)malloc(sizeof(double) * ((size_t)2 << nh)) : one;
    if (!hf) {  /* no memory for the factors: the whole state as one run, one thread */
        nl = n;
        nh = 0;
        hf = one;
    }
    product_double(hf, (const double (*)[4])v, m, n - 1, nl, -1);
#pragma omp parallel for if (nh > 0) num_threads(par) schedule(static)
    for (i64 h = 0; h < ((i64)1 << nh); h++) {
        R *o = st + 2 * (h << nl);
        o[0] = (R)hf[2 * h];
        o[1] = (R)hf[2 * h + 1];
        i64 ln = 1;
        for (int p = nl - 1; p >= 0; p--) {
            /* the bits above p: h's, then the run's bits p+1 .. nl-1 (j) */
            const i64 mj = m[p] >> (p + 1);
            const int fh = parity64(h & (m[p] >> nl));
            for (i64 j = ln - 1; j >= 0; j--) {
                const R xr = o[2 * j], xi = o[2 * j + 1];
                const int f = fh ^ parity64(j & mj & (((i64)1 << (nl - 1 - p)) - 1));
                const double *w0 = v[p] + 2 * f, *w1 = v[p] + 2 * (f ^ 1);
                o[4 * j] = (R)(xr * w0[0] - xi * w0[1]);
                o[4 * j + 1] = (R)(xr * w0[1] + xi * w0[0]);
                o[4 * j + 2] = (R)(xr * w1[0] - xi * w1[1]);
                o[4 * j + 3] = (R)(xr * w1[1] + xi * w1[0]);
            }
            ln *= 2;
        }
    }
    if (hf != one) free(hf);
}

/* |0...0> written over a state of 2^n amplitudes whose content is not read, split over par
 * threads from 2^PAR_MIN_BITS amplitudes on (static blocks, as the gates split the state). */
static void SFX(write_zero)(R *st, int n, int par) {
    const i64 amps = (i64)1 << n, blk = (i64)1 << 14, nblk = (amps + blk - 1) / blk;
#pragma omp parallel for if (par > 1 && n >= PAR_MIN_BITS && nblk > 1) num_threads(par) \
    schedule(static)
    for (i64 k = 0; k < nblk; k++) {
        const i64 x0 = k * blk, x1 = x0 + blk < amps ? x0 + blk : amps;
        memset(st + 2 * x0, 0, sizeof(R) * 2 * (size_t)(x1 - x0));
    }
    st[0] = (R)1;
}

/* Apply the program (in order, or its inverse when dagger) to every state of the batch. */
static int SFX(run)(qd_run_args *a) {
    int n = a->n, nthreads = a->nthreads, dag = a->dagger;
    i64 B = a->batch, nops = a->prog.nops;
    int nt = (B > 1 && nthreads > 1) ? nthreads : 1;
    SFX(ctx_t) c;
    i64 ntiles = make_tiles(n, B, 0);
    tile_t *tiles = (tile_t *)malloc((size_t)ntiles * sizeof(tile_t));
    const R **us = (const R **)malloc((size_t)(nops + 1) * (size_t)nt * sizeof(R *));
    int rc = SFX(ctx_init)(&c, &a->prog, 0, &a->angles, B, 0, nthreads, n, a->tiles, 1);
    if (!us || !tiles || rc) {
        free(us);
        free(tiles);
        SFX(ctx_free)(&c);
        return rc ? rc : QD_ENOMEM;
    }
    make_tiles(n, B, tiles);
    i64 N = (i64)1 << n;
    R *states = (R *)a->states;
    /* from_zero: the input is |0...0> and its content is not read (it may be uninitialised
     * memory): a leading product prefix is written directly, or else |0...0> itself, in the
     * same parallel split as the gates (first touch of fresh pages on every thread) */
    i64 pe = a->from_zero && !dag ? SFX(product_prefix)(&c, nops, n) : 0;
    const int zfill = a->from_zero && !pe;
    if (B == 1) {  /* one state: the kernels split it over the threads (from STATE_PAR_MIN_BITS) */
        const int par = n >= STATE_PAR_MIN_BITS ? nthreads : 1;
        if (pe) SFX(write_product)(states, n, &c, pe, 0, 0, par);
        if (zfill) SFX(write_zero)(states, n, par);
        SFX(run_one)(states, n, &c, us, nops, 0, dag, par, 0, pe);
        ntiles = 0;
    }
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
    for (i64 k = 0; k < ntiles; k++) {
        int tid = nt > 1 ? THREAD_ID : 0;
        i64 b0 = tiles[k].b0;
        int tb = tiles[k].tb;
        R *st = states + 2 * N * b0;
        if (pe)
            for (i64 t = 0; t < ((i64)1 << tb); t++)
                SFX(write_product)(st + 2 * N * t, n, &c, pe, b0 + t, tid, 1);
        if (zfill)
            for (i64 t = 0; t < ((i64)1 << tb); t++) SFX(write_zero)(st + 2 * N * t, n, 1);
        if (tb == 0) {
            SFX(run_one)(st, n, &c, us + (nops + 1) * tid, nops, b0, dag, 1, tid, pe);
        } else {
            for (i64 t = pe; t < nops; t++)
                SFX(apply_tile)(st, n, tb, &c, dag ? nops - 1 - (t - pe) : t, b0, dag, 1, tid);
        }
    }
    free(us);
    free(tiles);
    SFX(ctx_free)(&c);
    return QD_OK;
}

/* The gradients of coded gate i at tile (p, l) after psi <- U_i^dag psi: one overlap for all
 * of its trainable angles (k >= 3: restricted to dU's nonzero entries). */
static void SFX(coded_grads)(const SFX(ctx_t) *c, i64 i, R *p, R *l, int n, int tb, i64 b0,
                             int par, int tid, double *gtheta, i64 P) {
    const gate_t *g = &c->gates[i];
    int train = g->tmask_p, first = __builtin_ctz((unsigned)train);
    i64 N = (i64)1 << n, reps = g->gshared ? 1 : (i64)1 << tb;
    double *m = c->scr[tid].m;
    for (i64 t = 0; t < reps; t++) {
        i64 b = b0 + t;
        const R *u = SFX(gate_data)(c, i, b, tid, 1);
        const R *du0 = u + g->usize * (1 + first);
        int bits = g->gshared ? n + tb : n;
        SFX(overlap_matrix)(l + 2 * N * t, p + 2 * N * t, bits, g, m, par, g->k >= 3 ? du0 : 0,
                            &c->scr[tid]);
        for (int j = 0; j < g->np; j++)
            if ((train >> j) & 1)
                gtheta[b * P + g->col[j]] +=
                    g->scale[j] * 2.0 * SFX(contract)(g, u + g->usize * (1 + j), m);
    }
}

/* The fused adjoint step of an uncontrolled dense one-qubit coded gate (overlap on the values
 * before the step, psi and lam updated in the same pass). */
static void SFX(fused_step)(const SFX(ctx_t) *c, i64 i, R *p, R *l, int n, int tb, i64 b0,
                            int par, int tid, int do_lam, double *gtheta, i64 P) {
    const gate_t *g = &c->gates[i];
    int train = g->tmask_p;
    i64 N = (i64)1 << n, reps = g->gshared ? 1 : (i64)1 << tb;
    int bits = g->gshared ? n + tb : n;
    for (i64 t = 0; t < reps; t++) {
        i64 b = b0 + t;
        const R *u = SFX(gate_data)(c, i, b, tid, 1);
        R v[8];
        double gm[8], m[8];
        SFX(effective)(g, u, 1, v);  /* v = U^dag */
        SFX(adjoint_step_1q)(p + 2 * N * t, l + 2 * N * t, bits, g->special[0], v, do_lam, m,
                             par);
        for (int j = 0; j < g->np; j++)
            if ((train >> j) & 1) {
                SFX(mul2)(u + g->usize * (1 + j), v, gm);  /* dU_j U^dag */
                gtheta[b * P + g->col[j]] += g->scale[j] * 2.0 * SFX(contract_d)(gm, m, 4);
            }
    }
}


/* One coded gate i of the adjoint sweep on its own (no slots): psi <- U^dag psi, the
 * gradients of its trainable angles, lam <- U^dag lam when do_lam. */
static void SFX(coded_step)(const SFX(ctx_t) *c, i64 i, R *p, R *l, int n, int tb, i64 b0,
                            int par, int tid, int do_lam, double *gtheta, i64 P) {
    const gate_t *g = &c->gates[i];
    if (g->tmask_p && g->kind == K_DENSE && g->k == 1 && g->cmask == 0 &&
        (QD_VEC || g->special[0] <= 7 || par > 1)) {
        SFX(fused_step)(c, i, p, l, n, tb, b0, par, tid, do_lam, gtheta, P);
        return;
    }
    SFX(apply_tile)(p, n, tb, c, i, b0, 1, par, tid);
    if (g->tmask_p) SFX(coded_grads)(c, i, p, l, n, tb, b0, par, tid, gtheta, P);
    if (do_lam) SFX(apply_tile)(l, n, tb, c, i, b0, 1, par, tid);
}

/* The tiled adjoint sweep of one binding. The whole schedule (runs of coded gates within a tile
 * set, scheduled across commuting gates in sweep order) is made first; consecutive runs then
 * execute in ONE parallel region: the gates' matrices, derivatives and relocations are
 * evaluated once (gates split over the threads), then run after run the threads take chunks of
 * tiles (guided: contiguous blocks of decreasing size, so a thread slowed by other work holds
 * up the run by one chunk at most),
 * with a barrier between runs. In a run, the psi and lam tiles are uncomputed together and
 * every trainable angle's overlap is summed over the tiles (the overlap of a gate is a sum over
 * all amplitudes, so its tile parts add up): per chunk of tiles (at most TS_CHUNKS per run,
 * independent of the thread count), then over the chunks in order, so the gradients do not
 * depend on the number of threads. A gate no tile set holds is applied on its own between
 * regions. lam is not uncomputed through the sweep's last gate. */
#define TS_CHUNKS 64
#define TS_SEG_GATES 1024  /* gates per region (bounds the relocated gates and partial sums) */

typedef struct {
    i64 pos;       /* first position of the run in the sweep order */
    int cnt;       /* gates in the run; 0: one gate applied on its own (not in a tile set) */
    int nch;       /* chunks of tiles */
    i64 acc;       /* offset of the run's partial sums (nch * QD_MAXA * cnt doubles) */
    tileset_t ts;
} SFX(trun_t);

/* The tile work of one chunk of run r: tiles [t0, t1), partial sums into a (QD_MAXA per gate). */
static void SFX(sweep_chunk)(const SFX(ctx_t) *c, const SFX(trun_t) *r, const gate_t *loc,
                             const R *const *us, const R *vs, const double *gms, R *psi, R *lam,
                             int last, int me, i64 t0, i64 t1, double *a) {
    const tileset_t *ts = &r->ts;
    const int tb = TILE_LOW + ts->k, cnt = r->cnt;
    SFX(scratch_t) *sc = &c->scr[me];
    double m8[8];
    for (i64 t = t0; t < t1; t++) {
        R *pb = ts->k ? SFX(tile_buf)(c, me, 0) : psi + 2 * (t << TILE_LOW);
        R *lb = ts->k ? SFX(tile_buf)(c, me, 1) : lam + 2 * (t << TILE_LOW);
        if (ts->k) {
            SFX(tile_copy)(psi, pb, ts, t, 0);
            SFX(tile_copy)(lam, lb, ts, t, 0);
        }
        for (int q = 0; q < cnt; q++) {
            const gate_t *g = &loc[q];
            const R *u = us[q];
            int do_lam = !(last && q == cnt - 1), train = g->tmask_p;
            if (train && g->kind == K_DENSE && g->k == 1 && g->cmask == 0) {
                SFX(adjoint_step_1q)(pb, lb, tb, g->special[0], vs + 8 * q, do_lam, m8, 1);
                for (int j = 0; j < g->np; j++)
                    if ((train >> j) & 1)
                        a[QD_MAXA * q + j] += SFX(contract_d)(gms + 8 * (QD_MAXA * q + j), m8, 4);
                continue;
            }
            SFX(apply_range)(pb, tb, g, u, 1, 1, sc);
            if (train) {
                const R *du0 = u + g->usize * (1 + __builtin_ctz((unsigned)train));
                SFX(overlap_matrix)(lb, pb, tb, g, sc->m, 1, g->k >= 3 ? du0 : 0, sc);
                for (int j = 0; j < g->np; j++)
                    if ((train >> j) & 1)
                        a[QD_MAXA * q + j] += SFX(contract)(g, u + g->usize * (1 + j), sc->m);
            }
            if (do_lam) SFX(apply_range)(lb, tb, g, u, 1, 1, sc);
        }
        if (ts->k) {
            SFX(tile_copy)(psi, pb, ts, t, 1);
            SFX(tile_copy)(lam, lb, ts, t, 1);
        }
    }
}

/* Gate at sweep position e of a region (order[e]) prepared for its run: relocated into loc[e],
 * its data (and derivatives when trainable) evaluated into thread me's workspace, and for a
 * trainable dense one-qubit gate U^dag (vs) and dU_j U^dag (gms). */
static void SFX(sweep_prepare)(const SFX(ctx_t) *c, const i64 *order, const tileset_t *ts,
                               i64 e, i64 b, int me, gate_t *loc, const R **us, R *vs,
                               double *gms) {
    const gate_t *g = &c->gates[order[e]];
    relocate(g, ts, &loc[e]);
    us[e] = SFX(gate_data)(c, order[e], b, me, g->tmask_p != 0);
    if (g->tmask_p && g->kind == K_DENSE && g->k == 1 && g->cmask == 0) {
        SFX(effective)(g, us[e], 1, vs + 8 * e);  /* U^dag */
        for (int j = 0; j < g->np; j++)
            SFX(mul2)(us[e] + g->usize * (1 + j), vs + 8 * e, gms + 8 * (QD_MAXA * e + j));
    }
}

/* The tiled sweep of binding b from gate nops - 1 down to lo on psi p and lam l, par threads
 * (tid: the calling thread's scratch when par == 1). QD_ENOMEM before anything is touched. */
static int SFX(sweep_tiled)(const SFX(ctx_t) *c, R *psi, R *lam, int n, i64 b, i64 lo,
                            int par, int tid, double *gtheta, i64 P) {
    const i64 nops = c->ngates, nsw = nops - lo;
    char *done = (char *)calloc((size_t)(nops + 1), 1);
    i64 *order = (i64 *)malloc(sizeof(i64) * (size_t)(nsw + 1));
    SFX(trun_t) *runs = (SFX(trun_t) *)malloc(sizeof(SFX(trun_t)) * (size_t)(nsw + 1));
    i64 *rix = (i64 *)malloc(sizeof(i64) * (size_t)(nsw + 1));  /* run of each position */
    if (!done || !order || !runs || !rix) {
        free(done); free(order); free(runs); free(rix);
        return QD_ENOMEM;
    }
    /* the schedule */
    i64 nr = 0, pos = 0, t = 0, seg_cap = nsw < TS_SEG_GATES ? nsw : TS_SEG_GATES;
    while (t < nsw) {
        i64 i = nops - 1 - t;
        if (done[i]) { t++; continue; }
        SFX(trun_t) *r = &runs[nr++];
        int cnt = SFX(tile_schedule)(c, 0, t, nsw, nops, 1, done, order + pos, &r->ts, n);
        r->pos = pos;
        if (cnt < 2) {  /* one gate (the first pending one if it fits no tile set): in place */
            if (cnt == 0) order[pos] = i;
            done[order[pos]] = 1;
            cnt = 0;
        }
        r->cnt = cnt;
        r->nch = 0;
        for (i64 e = pos; e < pos + (cnt ? cnt : 1); e++) rix[e] = nr - 1;
        if (cnt) {
            i64 ntile = (i64)1 << (n - TILE_LOW - r->ts.k);
            r->nch = (int)(ntile < TS_CHUNKS ? ntile : TS_CHUNKS);
        }
        if (cnt > seg_cap) seg_cap = cnt;
        pos += cnt ? cnt : 1;
    }
    free(done);
    /* per region: relocated gates, data pointers, U^dag and dU U^dag, partial sums */
    gate_t *loc = (gate_t *)malloc(sizeof(gate_t) * (size_t)seg_cap);
    const R **us = (const R **)malloc(sizeof(R *) * (size_t)seg_cap);
    R *vs = (R *)malloc(sizeof(R) * 8 * (size_t)seg_cap);
    double *gms = (double *)malloc(sizeof(double) * 8 * QD_MAXA * (size_t)seg_cap);
    double *acc = (double *)malloc(sizeof(double) * TS_CHUNKS * QD_MAXA * (size_t)seg_cap);
    if (!loc || !us || !vs || !gms || !acc) {
        free(loc); free(us); free(vs); free(gms); free(acc); free(order); free(runs); free(rix);
        return QD_ENOMEM;
    }
    for (i64 r0 = 0; r0 < nr;) {
        const SFX(trun_t) *r = &runs[r0];
        if (!r->cnt) {
            SFX(coded_step)(c, order[r->pos], psi, lam, n, 0, b, par, tid, r0 < nr - 1, gtheta, P);
            r0++;
            continue;
        }
        /* the region: runs [r0, r1), sweep positions [p0, p1) */
        i64 r1 = r0, p0 = r->pos, p1 = p0, nacc = 0;
        while (r1 < nr && runs[r1].cnt && (r1 == r0 || p1 - p0 + runs[r1].cnt <= seg_cap)) {
            runs[r1].acc = nacc;
            nacc += (i64)runs[r1].nch * QD_MAXA * runs[r1].cnt;
            p1 += runs[r1].cnt;
            r1++;
        }
        memset(acc, 0, sizeof(double) * (size_t)nacc);
#pragma omp parallel num_threads(par) if (par > 1)
        {
            int me = par > 1 ? THREAD_ID : tid;
#pragma omp for schedule(static)
            for (i64 e = p0; e < p1; e++)
                SFX(sweep_prepare)(c, order + p0, &runs[rix[e]].ts, e - p0, b, me, loc, us, vs,
                                   gms);
            for (i64 q = r0; q < r1; q++) {
                const SFX(trun_t) *rq = &runs[q];
                const i64 off = rq->pos - p0, ntile = (i64)1 << (n - TILE_LOW - rq->ts.k);
                const int last = q == nr - 1;
#pragma omp for schedule(guided)
                for (int ch = 0; ch < rq->nch; ch++)
                    SFX(sweep_chunk)(c, rq, loc + off, us + off, vs + 8 * off, gms + 8 * QD_MAXA * off,
                                     psi, lam, last, me, ntile * ch / rq->nch,
                                     ntile * (ch + 1) / rq->nch,
                                     acc + rq->acc + (i64)ch * QD_MAXA * rq->cnt);
            }
        }
        for (i64 q = r0; q < r1; q++) {
            const SFX(trun_t) *rq = &runs[q];
            for (int k = 0; k < rq->cnt; k++) {
                const gate_t *g = &c->gates[order[rq->pos + k]];
                for (int j = 0; j < g->np; j++)
                    if ((g->tmask_p >> j) & 1) {
                        double sum = 0;
                        for (int ch = 0; ch < rq->nch; ch++)
                            sum += acc[rq->acc + (i64)ch * QD_MAXA * rq->cnt + QD_MAXA * k + j];
                        gtheta[b * P + g->col[j]] += g->scale[j] * 2.0 * sum;
                    }
            }
        }
        r0 = r1;
    }
    free(loc); free(us); free(vs); free(gms); free(acc); free(order); free(runs); free(rix);
    return QD_OK;
}

/* ldiag: lam = ldiag * psi (a real diagonal per binding, e.g. a sum of Z words), formed in
 * this thread's scratch together with a copy of psi, which stays untouched. With mb > 0 the
 * diagonal at amplitude x of binding b is dg[b, y >> mb] + dl[b, y & (2^mb - 1)], y the index
 * of x in its state of 2^n (Z words within either half of the register: no diagonal of 2^n
 * entries is written or read); the sum is rounded to R as the whole diagonal's would be. */
static void SFX(diag_lam)(const R *src, const R *dg, const R *dl, int n, int mb, R *sp, R *sl,
                          i64 amps, int par) {
    const i64 blk = (i64)1 << 14, nblk = (amps + blk - 1) / blk;
    const i64 lmask = ((i64)1 << mb) - 1, smask = ((i64)1 << n) - 1, H = (i64)1 << (n - mb);
#pragma omp parallel for if (par > 1 && nblk > 1) num_threads(par) schedule(static)
    for (i64 k = 0; k < nblk; k++) {
        i64 x0 = k * blk, x1 = x0 + blk < amps ? x0 + blk : amps;
        memcpy(sp + 2 * x0, src + 2 * x0, sizeof(R) * 2 * (size_t)(x1 - x0));
        if (!mb) {
            for (i64 x = x0; x < x1; x++) {
                sl[2 * x] = dg[x] * src[2 * x];
                sl[2 * x + 1] = dg[x] * src[2 * x + 1];
            }
            continue;
        }
        for (i64 x = x0; x < x1;) {  /* a run of up to 2^mb amplitudes: one high part */
            const i64 b = x >> n, y = x & smask, base = x - (y & lmask);
            i64 e = base + lmask + 1;
            if (e > x1) e = x1;
            const R h = dg[b * H + (y >> mb)];
            const R *lo = dl + (b << mb);
            for (i64 z = x; z < e; z++) {
                const R d = h + lo[z - base];
                sl[2 * z] = d * src[2 * z];
                sl[2 * z + 1] = d * src[2 * z + 1];
            }
            x = e;
        }
    }
}

/* Adjoint sweep. For i = nops-1 .. lo: psi <- U_i^dag psi; the gradients of gate i (coded
 * gates: their trainable angles into gtheta; slots: the slots of gate i into grads, one
 * overlap shared by slots of the same geometry); then lam <- U_i^dag lam. */
/* The adjoint sweep of the states of tile k (thread tid's scratch; par threads inside). */
static void SFX(adjoint_tile)(qd_adjoint_args *a, const SFX(ctx_t) *cp, const tile_t *tiles,
                              i64 k, R *scratch, i64 tile_amps, int slots, int tid, int par) {
    const SFX(ctx_t) c = *cp;
    const int n = a->n;
    const i64 nops = a->prog.nops, nslots = slots ? a->slots.nops : 0, lo = a->lo;
    const i64 P = a->angles.theta ? a->angles.P : 0, N = (i64)1 << n;
    const gate_t *gates = c.gates, *sg = c.gates + nops;
    R *psi = (R *)a->psi, *lam = (R *)a->lam;
    const R *ldiag = (const R *)a->ldiag;
    i64 b0 = tiles[k].b0;
    int tb = tiles[k].tb;
    R *p = psi + 2 * N * b0, *l = lam ? lam + 2 * N * b0 : 0;
    if (ldiag) {
        R *sp = scratch + (i64)4 * tile_amps * tid;
        const int mb = (int)a->ldiag_bits;
        SFX(diag_lam)(p, ldiag + (N >> mb) * b0, mb ? (const R *)a->ldiag_lo + (b0 << mb) : 0, n,
                      mb, sp, sp + 2 * tile_amps, N << tb, par);
        p = sp;
        l = sp + 2 * tile_amps;
    }
    double *m = c.scr[tid].m;
    i64 s = nslots - 1;
    int tiled = !slots && tb == 0 && n >= TILE_MIN_N && c.tbuf;
    if (tiled &&  /* runs of gates in cache tiles, scheduled across commuting gates */
        SFX(sweep_tiled)(&c, p, l, n, b0, lo, par, tid, a->gtheta, P) == QD_OK)
        return;  /* (no memory for the schedule: gate by gate below) */
    for (i64 i = nops - 1; i >= lo; i--) {
        const gate_t *g = &gates[i];
        if (g->tmask_p && g->kind == K_DENSE && g->k == 1 && g->cmask == 0 &&
            (QD_VEC || g->special[0] <= 7 || par > 1)) {
            SFX(fused_step)(&c, i, p, l, n, tb, b0, par, tid, i > lo, a->gtheta, P);
            continue;
        }
        SFX(apply_tile)(p, n, tb, &c, i, b0, 1, par, tid);
        if (g->tmask_p) SFX(coded_grads)(&c, i, p, l, n, tb, b0, par, tid, a->gtheta, P);
        i64 prev = -1;
        for (; s >= 0 && a->slot_op[s] == i; s--) {  /* tb == 0 here: b == b0 */
            /* k >= 3: a sparse M for this slot's dU, never shared */
            const R *need = sg[s].k >= 3 ? SFX(data_of)(&sg[s], b0) : 0;
            if (need || prev < 0 || !same_geometry(&a->slots.recs[s], &a->slots.recs[prev]))
                SFX(overlap_matrix)(l, p, n, &sg[s], m, par, need, &c.scr[tid]);
            prev = s;
            a->grads[b0 * nslots + s] = 2.0 * SFX(contract)(&sg[s], SFX(data_of)(&sg[s], b0), m);
        }
        if (i > lo) SFX(apply_tile)(l, n, tb, &c, i, b0, 1, par, tid);
    }
}

static int SFX(adjoint)(qd_adjoint_args *a, int slots) {
    int n = a->n, nthreads = a->nthreads;
    i64 B = a->batch;
    int nt = (B > 1 && nthreads > 1) ? nthreads : 1;
    SFX(ctx_t) c;
    /* fallback slots are per binding: no tiles then */
    i64 ntiles = slots ? B : make_tiles(n, B, 0);
    tile_t *tiles = (tile_t *)malloc((size_t)ntiles * sizeof(tile_t));
    int rc = SFX(ctx_init)(&c, &a->prog, slots ? &a->slots : 0, &a->angles, B, a->shared_cols,
                           nthreads, n, a->tiles, 0);
    R *scratch = 0;
    i64 tile_amps = 0;
    if (!rc && tiles) {
        if (slots) {
            for (i64 b = 0; b < B; b++) { tiles[b].b0 = b; tiles[b].tb = 0; }
        } else {
            make_tiles(n, B, tiles);
        }
        if (a->ldiag) {
            for (i64 k = 0; k < ntiles; k++)
                if (((i64)1 << (n + tiles[k].tb)) > tile_amps) tile_amps = (i64)1 << (n + tiles[k].tb);
            scratch = (R *)keep_get((size_t)(4 * tile_amps) * (size_t)nt * sizeof(R));
            if (!scratch) rc = QD_ENOMEM;
        }
    }
    if (rc || !tiles) {
        free(tiles);
        SFX(ctx_free)(&c);
        return rc ? rc : QD_ENOMEM;
    }
    /* one state of fewer than 2^STATE_PAR_MIN_BITS amplitudes is swept by one thread: gate by gate
     * (no cache tiles below TILE_MIN_N), a parallel region per kernel call costs about what the
     * split saves on a state this small, and much more whenever a thread waits for a core */
    int par = B == 1 && n >= STATE_PAR_MIN_BITS ? nthreads : 1;
    /* one tile (one state, its kernels split over the threads): no enclosing region, so that
     * the kernels' own parallel regions are top-level and reuse the runtime's threads (nested
     * in an inactive region, GNU OpenMP starts and ends fresh threads for every one) */
    if (nt == 1) {
        for (i64 k = 0; k < ntiles; k++)
            SFX(adjoint_tile)(a, &c, tiles, k, scratch, tile_amps, slots, 0, par);
    } else {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (i64 k = 0; k < ntiles; k++)
            SFX(adjoint_tile)(a, &c, tiles, k, scratch, tile_amps, slots, THREAD_ID, par);
    }
    free(tiles);
    SFX(ctx_free)(&c);  /* its tile buffers first: the larger scratch may take their room */
    keep_put(scratch, (size_t)(4 * tile_amps) * (size_t)nt * sizeof(R));
    return QD_OK;
}
