/* qdiff native CPU statevector kernels (optional fast path of qdiff.backends.statevector).
 *
 * A state batch is B contiguous vectors of N = 2^n complex numbers (interleaved re, im),
 * wire 0 the most significant bit, exactly torch's (B, 2**n) complex layout, in complex128 or
 * complex64. A circuit arrives as a program: one qd_record per gate (qdsim.h) and one buffer of
 * complex gate data, so a whole forward pass (or a whole adjoint sweep) is ONE call with no
 * Python or dispatch per gate. Every record is validated (qd_validate_*) before any state is
 * touched: an index out of range is an error code, never a stray read or write.
 *
 * Coded gates (a code from CODES below) carry no data: the kernels evaluate their matrices and
 * derivatives from the angles themselves, once per binding, and keep them while the angles
 * stay the same (a weight shared by the batch: once per call).
 *
 * Every kernel walks groups of 2^k amplitudes that differ only in the target bits; the loop
 * over the lowest free bits is innermost and contiguous, so the compiler vectorises it
 * (uncontrolled one-qubit gates, their overlaps and singly-controlled X use block loops with
 * compile-time widths instead). Large states are processed in cache-sized chunks: runs of
 * gates whose bits all lie below CHUNK_BITS are applied chunk by chunk, one pass over memory
 * for the whole run. Small states are processed in batch tiles of up to 2^TILE_BITS
 * amplitudes: a gate with the same matrix for every binding applies to the tile at once.
 * One large state is split over the threads inside each kernel; a batch of states is split
 * over the threads by tiles.
 *
 * The kernels are written once (qdsim_kernels.h) and compiled for both precisions: R is the
 * real type of the states and gate data; angles, matrices of coded gates and gradient sums
 * are evaluated in double.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "qdsim.h"
#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID omp_get_thread_num()
#define NUM_THREADS omp_get_num_threads()
#else
#define THREAD_ID 0
#define NUM_THREADS 1
#endif

typedef int64_t i64;

/* Vector extensions (GCC >= 12, clang): kernels that permute amplitudes inside a vector
 * register are written with constant shuffles; other compilers get the scalar loops. */
#ifndef QD_VEC
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define QD_VEC 1
#endif
#endif
#endif
#ifndef QD_VEC
#define QD_VEC 0
#endif

#define MAXK QD_MAXK
#define CHUNK_BITS 12
#define TILE_BITS 10
#define PAR_MIN_BITS 12  /* one state is split over threads from 2^12 amplitudes on */
/* ... but a forward run, an adjoint sweep and the Z-word marginals split one state only from
 * 2^STATE_PAR_MIN_BITS amplitudes on, all three from the same size: below, their passes take a
 * few microseconds each, about what a parallel region's start and end cost, and several times
 * that when the cores sit on different dies (SEL(6) at n = 12-14 took 1.3-2.7x the time of one
 * thread on 2 cores, and its gradient at n = 14-15 up to 1.4x, where a pass split over the
 * threads next to one that was not moves half the state between the cores' caches, measured) */
#define STATE_PAR_MIN_BITS 16

/* Software prefetch for passes over a state out of the core's caches whose contiguous runs
 * are 512 bytes to 32 KiB long (gates on middle bits): the hardware prefetchers lose track of
 * several interleaved streams that jump every few lines, and such passes ran at up to 3x the
 * time of the same gate on a high bit. The loops then prefetch the element PF_BYTES further
 * along each stream's traversal (for write: every line is stored too). Shorter runs read like
 * one sequential stream, longer ones are followed by the hardware. */
#define PF_BYTES 4096

static inline int pf_run(i64 run_bytes) { return run_bytes >= 512 && run_bytes <= 32768; }
/* The forward's two-product one-qubit block loops (RX, RY, H: two loads, two shuffles and four
 * products per pair of vectors) skip the prefetches for states of PF_LIGHT_LO to PF_LIGHT_HI
 * bytes, which stay in the last-level cache between passes: there they cost 15-30% more time
 * on middle bits (the general four-product loop still gained from them, as did both loops on
 * larger states). */
#define PF_LIGHT_LO ((size_t)2 << 20)
#define PF_LIGHT_HI ((size_t)16 << 20)
/* Offset (in elements, from the start of a block's first half) of the element d further along
 * the traversal of halves of w elements (w a power of two; blocks of 2w). */
static inline i64 pf_ahead(i64 e, i64 d, i64 w) {
    i64 t = e + d;
    return ((t & ~(w - 1)) << 1) | (t & (w - 1));
}
/* Prefetch for write the address off elements of size sz past base (an address, never
 * dereferenced: the target may lie past the end of the state near its end). */
#define PF_AT(base, off, sz)                                                                   \
    __builtin_prefetch((const void *)((uintptr_t)(base) + (uintptr_t)((off) * (sz))), 1)

/* The forward's one-qubit (vector and lane) and 4x4 kernels are compute-bound in cache: there
 * products and sums contract into fused multiply-adds (the build's -std=c99 turns contraction
 * off elsewhere; 3-20% less time for a general one-qubit gate measured). */
#if defined(__GNUC__) && !defined(__clang__)
#define QD_FMA __attribute__((optimize("fp-contract=fast")))
/* The same with the sums kept in the order written: the lane kernels of a general one-qubit
 * gate spell out one chain of multiply-adds per output; reassociated (a tree of products and a
 * final add) it was measured 4-10% slower at 2^16-2^20 amplitudes. */
#define QD_FMA_CHAIN __attribute__((optimize("fp-contract=fast", "no-associative-math")))
#else
#define QD_FMA
#define QD_FMA_CHAIN
#endif

/* A vector loaded from the state kept in a register: left to itself GCC folds each use of a
 * loaded vector into an arithmetic instruction's memory operand, so a kernel that uses an
 * amplitude vector 2-4 times reads its line 2-4 times, and while that line is still on its way
 * from the last-level cache every read waits for it (a general one-qubit gate on the lowest
 * bits of a 16 MiB state took 1.5x the time of the same gate on a high bit; with the vector
 * held in a register, 1.0x, measured). Only where a 64-byte vector is one register. */
#if QD_VEC && defined(__GNUC__) && defined(__AVX512F__)
#define QD_INREG(x) __asm__("" : "+v"(x))
#else
#define QD_INREG(x) ((void)0)
#endif

enum { K_DENSE = QD_DENSE, K_DIAG = QD_DIAG, K_FLIP = QD_FLIP, K_SWAP = QD_SWAP };
enum { C_NONE = 0, C_RX, C_RY, C_RZ, C_PHASE, C_ROT, C_RXX, C_RYY, C_RZZ, C_SEXC, C_MRZ, C_DEXC,
       C_NCODES };

/* The formulas the kernels know, by the name a Gate record gives as its native_code: the kind
 * of matrix, the number of target bits (0: any) and of angles. */
static const struct { const char *name; int kind, k, np; } CODES[C_NCODES] = {
    {"", 0, 0, 0},
    {"rx", K_DENSE, 1, 1},
    {"ry", K_DENSE, 1, 1},
    {"rz", K_DIAG, 1, 1},
    {"phase", K_DIAG, 1, 1},
    {"rot", K_DENSE, 1, 3},
    {"rxx", K_DENSE, 2, 1},
    {"ryy", K_DENSE, 2, 1},
    {"rzz", K_DIAG, 2, 1},
    {"single_excitation", K_DENSE, 2, 1},
    {"multirz", K_DIAG, 0, 1},
    {"double_excitation", K_DENSE, 4, 1},
};

int qd_abi_version(void) { return QD_ABI_VERSION; }

int qd_gate_code(const char *formula) {
    for (int c = 1; c < C_NCODES; c++)
        if (strcmp(CODES[c].name, formula) == 0) return c;
    return 0;
}

int qd_code_info(int code, int32_t *kind, int32_t *k, int32_t *nangles) {
    if (code <= 0 || code >= C_NCODES) return QD_ECODE;
    *kind = CODES[code].kind;
    *k = CODES[code].k;
    *nangles = CODES[code].np;
    return QD_OK;
}

#define FIELD(name) #name, (int)offsetof(qd_record, name), (int)sizeof(((qd_record *)0)->name)

int qd_record_layout(char *buf, int cap) {
    int w = snprintf(buf, (size_t)cap,
                     "%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;"
                     "%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d;%s:%d:%d",
                     (int)sizeof(qd_record), FIELD(kind), FIELD(k), FIELD(bits), FIELD(cmask),
                     FIELD(offset), FIELD(stride), FIELD(code), FIELD(nangles), FIELD(col),
                     FIELD(train), FIELD(reserved), FIELD(scale), FIELD(shift));
    return w < cap ? QD_OK : QD_EARGS;
}

void qd_args_sizes(int64_t out[4]) {
    out[0] = (int64_t)sizeof(qd_program);
    out[1] = (int64_t)sizeof(qd_angles);
    out[2] = (int64_t)sizeof(qd_run_args);
    out[3] = (int64_t)sizeof(qd_adjoint_args);
}

static const char *ERRORS[QD_NERRORS] = {
    "ok",
    "out of memory",
    "invalid arguments (sizes, pointers, thread count or sweep bounds)",
    "unknown record kind",
    "target count out of range (1..MAXK; a swap has 2)",
    "target bit out of range or repeated",
    "control mask out of range or overlapping the targets",
    "gate data outside the data buffer",
    "unknown gate code, or a code that does not match the record's kind, width or angle count",
    "theta column out of range, or angles without theta",
    "trainable-angle mask names an angle without a theta column",
    "slot record invalid (kind, order or gate index)",
    "unknown precision",
    "a gate angle is NaN or infinite",
};

const char *qd_strerror(int code) {
    return code >= 0 && code < QD_NERRORS ? ERRORS[code] : "unknown error";
}

/* ---------------------------------------------------------------------------------------- */
/* validation                                                                                 */

/* Record r of a program on n qubits, batch B, data of len complex numbers, P theta columns
 * (has_theta: theta given). slot: a slot record of the fallback adjoint sweep. */
static int check_record(const qd_record *r, int n, i64 B, i64 len, i64 P, int has_theta,
                        int slot) {
    if (r->kind < 0 || r->kind >= QD_NKINDS) return QD_EKIND;
    if (r->k < 1 || r->k > MAXK || (r->kind == K_SWAP && r->k != 2)) return QD_EK;
    i64 tmask = 0;
    for (int j = 0; j < r->k; j++) {
        if (r->bits[j] < 0 || r->bits[j] >= n || ((tmask >> r->bits[j]) & 1)) return QD_EBITS;
        tmask |= (i64)1 << r->bits[j];
    }
    if (r->cmask < 0 || (r->cmask >> n) != 0 || (r->cmask & tmask)) return QD_ECMASK;
    if (slot && (r->code != 0 || (r->kind != K_DENSE && r->kind != K_DIAG))) return QD_ESLOT;
    if (r->code != 0) {
        int c = r->code;
        if (c < 0 || c >= C_NCODES || CODES[c].kind != r->kind ||
            (CODES[c].k && CODES[c].k != r->k) || CODES[c].np != r->nangles)
            return QD_ECODE;
        for (int j = 0; j < r->nangles; j++) {
            if (r->col[j] < -1 || r->col[j] >= P || (r->col[j] >= 0 && !has_theta))
                return QD_ECOLUMN;
            if (((r->train >> j) & 1) && r->col[j] < 0) return QD_ETRAIN;
        }
        if (r->train & ~((1 << r->nangles) - 1)) return QD_ETRAIN;
        return QD_OK;
    }
    if (r->nangles != 0 || r->train != 0) return QD_ECODE;
    if (r->kind == K_FLIP || r->kind == K_SWAP) return QD_OK;  /* no data read */
    i64 d = (i64)1 << r->k, need = r->kind == K_DIAG ? d : d * d;
    if (r->offset < 0 || r->stride < 0 || r->offset > len || need > len - r->offset)
        return QD_EDATA;
    if (B > 1 && r->stride > 0 && r->stride > (len - r->offset - need) / (B - 1))
        return QD_EDATA;
    return QD_OK;
}

static int check_program(const qd_program *p, int n, i64 B, const qd_angles *a, int slot,
                         i64 first, i64 *bad) {
    if (p->nops < 0 || (p->nops > 0 && !p->recs) || p->data_len < 0 ||
        (p->data_len > 0 && !p->data))
        return QD_EARGS;
    for (i64 i = 0; i < p->nops; i++) {
        int rc = check_record(&p->recs[i], n, B, p->data_len, a->P, a->theta != 0, slot);
        if (rc) {
            *bad = first + i;
            return rc;
        }
    }
    return QD_OK;
}

static int check_common(int dtype, int n, i64 B, const qd_angles *a, int nthreads) {
    if (dtype != QD_C128 && dtype != QD_C64) return QD_EDTYPE;
    if (n < 0 || n > QD_MAXN || B < 0 || nthreads < 1 || nthreads > 4096) return QD_EARGS;
    if (a->theta && (a->P < 0 || (a->rows != 1 && a->rows != B))) return QD_ECOLUMN;
    if (!a->theta && a->P != 0) return QD_ECOLUMN;
    return QD_OK;
}

static int check_run(qd_run_args *a) {
    int rc = check_common(a->dtype, a->n, a->batch, &a->angles, a->nthreads);
    if (rc) return rc;
    if (a->batch > 0 && !a->states) return QD_EARGS;
    return check_program(&a->prog, a->n, a->batch, &a->angles, 0, 0, &a->bad_record);
}

static int check_adjoint(qd_adjoint_args *a, int slots) {
    int rc = check_common(a->dtype, a->n, a->batch, &a->angles, a->nthreads);
    if (rc) return rc;
    if (a->batch > 0 && (!a->psi || (!a->lam) == (!a->ldiag))) return QD_EARGS;
    if (a->lo < 0 || a->lo > a->prog.nops) return QD_EARGS;
    if (slots && a->ldiag) return QD_EARGS;
    if (a->ldiag_bits < 0 || a->ldiag_bits > a->n || (a->ldiag_bits && a->batch > 0 &&
                                                      (!a->ldiag || !a->ldiag_lo)))
        return QD_EARGS;
    rc = check_program(&a->prog, a->n, a->batch, &a->angles, 0, 0, &a->bad_record);
    if (rc) return rc;
    int train = 0;
    for (i64 i = 0; i < a->prog.nops; i++) train |= a->prog.recs[i].train;
    if (train && (!a->gtheta || !a->angles.theta)) return QD_EARGS;
    if (!slots) return a->slots.nops ? QD_EARGS : QD_OK;
    rc = check_program(&a->slots, a->n, a->batch, &a->angles, 1, a->prog.nops, &a->bad_record);
    if (rc) return rc;
    if (a->slots.nops && (!a->slot_op || !a->grads)) return QD_EARGS;
    for (i64 s = 0; s < a->slots.nops; s++)
        if (a->slot_op[s] < 0 || a->slot_op[s] >= a->prog.nops ||
            (s && a->slot_op[s] < a->slot_op[s - 1])) {
            a->bad_record = a->prog.nops + s;
            return QD_ESLOT;
        }
    return QD_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* decoded gates                                                                              */

typedef struct {
    int kind, k, nspecial;
    i64 cmask, tmask;
    i64 off[1 << MAXK];      /* offset of local index m from the group base */
    int special[64];         /* sorted bit positions of targets and controls */
    int bits[MAXK];
    const void *data;        /* this gate's data (binding 0) */
    i64 stride;              /* complex numbers between bindings' data */
    int code, np, tmask_p;   /* coded gates: code, number of angles, trainable-angle mask */
    i64 col[QD_MAXA];
    double scale[QD_MAXA], shift[QD_MAXA];
    i64 usize;               /* reals of one matrix (or diagonal) of this gate */
    int uniform;             /* the same matrix for every binding of the call */
    int gshared;             /* uniform, and its trainable angles' columns are batch-shared */
} gate_t;

/* rsize: bytes of one real of the data's precision */
/* The masks, group offsets and sorted special bits of g from its bits, k and cmask. */
static void layout_bits(gate_t *g) {
    g->tmask = 0;
    for (int j = 0; j < g->k; j++) g->tmask |= (i64)1 << g->bits[j];
    for (i64 m = 0; m < ((i64)1 << g->k); m++) {
        i64 o = 0;
        for (int j = 0; j < g->k; j++)
            if ((m >> (g->k - 1 - j)) & 1) o |= (i64)1 << g->bits[j];
        g->off[m] = o;
    }
    i64 all = g->tmask | g->cmask;
    g->nspecial = 0;
    for (unsigned long long m = (unsigned long long)all & ((1ULL << 63) - 1); m; m &= m - 1)
        g->special[g->nspecial++] = __builtin_ctzll(m);
}

static void decode(const qd_record *r, const void *data, size_t rsize, gate_t *g) {
    g->kind = r->kind;
    g->k = r->k;
    g->cmask = r->cmask;
    g->data = (const char *)data + rsize * 2 * (size_t)(r->code ? 0 : r->offset);
    g->stride = r->code ? 0 : r->stride;
    for (int j = 0; j < g->k; j++) g->bits[j] = r->bits[j];
    layout_bits(g);
    g->code = r->code;
    g->np = g->code ? r->nangles : 0;
    g->tmask_p = r->train;
    for (int j = 0; j < g->np; j++) {
        g->col[j] = r->col[j];
        g->scale[j] = r->scale[j];
        g->shift[j] = r->shift[j];
    }
    i64 d = (i64)1 << g->k;
    g->usize = 2 * (g->kind == K_DIAG ? d : d * d);
}

/* ---------------------------------------------------------------------------------------- */
/* cache tiles of a large state: runs of gates applied in one pass                            */

/* A run of gates whose bits all lie in the TILE_LOW low bits and at most tile_high() other
 * ("high") bits is applied tile by tile: a tile is the 2^(TILE_LOW + k) amplitudes that share
 * the values of every other bit, i.e. 2^k contiguous runs of 2^TILE_LOW amplitudes, gathered
 * into a buffer that stays in cache, where every gate of the run is applied with its bits
 * relocated (high bit h_j becomes bit TILE_LOW + j); then written back. One pass over memory
 * for the whole run, one parallel region (threads own tiles) instead of one per gate. */
#define TILE_LOW 10
#define TILE_HMAX 7  /* high bits a tile set can hold */
#define TILE_MIN_N 16

typedef struct {
    int k;                /* high bits in use */
    int kmax;             /* at most this many (the call's tile width: tile_high) */
    int hbits[TILE_HMAX]; /* ascending */
} tileset_t;

/* High bits of a tile for a call: the adjoint sweep keeps a psi and a lam tile per thread,
 * 512 KiB together (2^14 amplitudes each in complex128, 2^15 in complex64); a forward run
 * keeps only the state's tile, so it takes 1 MiB, a core's L2 cache on the machines measured
 * (2^16 amplitudes in complex128, 2^17 in complex64): fewer runs, so fewer memory passes
 * (SEL(L=6) at n = 22: 11 forward runs instead of 29 with 2^14-amplitude tiles, 0.78x
 * (complex64) and 0.87x (complex128) of the time; a 2 MiB tile was no faster; the complex64
 * gradient took 0.93x the time with 2^15- instead of 2^14-amplitude tiles). */
static int tile_high(int forward, size_t rsize) {
    if (forward) return rsize == 4 ? 7 : 6;
    return rsize == 4 ? 5 : 4;
}

/* Add g's bits to ts if they fit (returns 1), else leave ts as it was (returns 0). */
static int tile_add(tileset_t *ts, const gate_t *g) {
    tileset_t t = *ts;
    for (int s = 0; s < g->nspecial; s++) {
        int p = g->special[s], have = 0;
        if (p < TILE_LOW) continue;
        for (int j = 0; j < t.k; j++) have |= t.hbits[j] == p;
        if (have) continue;
        if (t.k == t.kmax) return 0;
        int j = t.k++;
        while (j > 0 && t.hbits[j - 1] > p) { t.hbits[j] = t.hbits[j - 1]; j--; }
        t.hbits[j] = p;
    }
    *ts = t;
    return 1;
}

/* First amplitude of tile t: t's bits spread over the bits above TILE_LOW that are not high. */
static i64 tile_base(const tileset_t *ts, i64 t) {
    i64 j = t << TILE_LOW;
    for (int s = 0; s < ts->k; s++) {
        int p = ts->hbits[s];
        j = ((j >> p) << (p + 1)) | (j & (((i64)1 << p) - 1));
    }
    return j;
}

/* Offset of the tile's r-th run of 2^TILE_LOW amplitudes. */
static i64 tile_run_offset(const tileset_t *ts, i64 r) {
    i64 o = 0;
    for (int j = 0; j < ts->k; j++)
        if ((r >> j) & 1) o |= (i64)1 << ts->hbits[j];
    return o;
}

/* g with its bits relocated into the tile (dst: a copy of src). */
static void relocate(const gate_t *src, const tileset_t *ts, gate_t *dst) {
    *dst = *src;
    int lpos[64];
    for (int b = 0; b < 64; b++) lpos[b] = b;
    for (int j = 0; j < ts->k; j++) lpos[ts->hbits[j]] = TILE_LOW + j;
    for (int j = 0; j < src->k; j++) dst->bits[j] = lpos[src->bits[j]];
    dst->cmask = 0;
    for (int b = 0; b < 63; b++)
        if ((src->cmask >> b) & 1) dst->cmask |= (i64)1 << lpos[b];
    layout_bits(dst);
}

/* Whether two slot records act on the same amplitudes the same way (one overlap for both). */
static int same_geometry(const qd_record *a, const qd_record *b) {
    if (a->kind != b->kind || a->k != b->k || a->cmask != b->cmask) return 0;
    for (int j = 0; j < a->k; j++)
        if (a->bits[j] != b->bits[j]) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* coded gates: matrices and derivatives from the angles (double precision)                   */

#define SET(u, e, re, im) do { (u)[2 * (e)] = (re); (u)[2 * (e) + 1] = (im); } while (0)

/* U(a) of a coded gate into u (g->usize doubles). */
static void gate_eval(const gate_t *g, const double *a, double *u) {
    memset(u, 0, sizeof(double) * (size_t)g->usize);
    double c = cos(0.5 * a[0]), s = sin(0.5 * a[0]);
    switch (g->code) {
    case C_RX: SET(u, 0, c, 0); SET(u, 1, 0, -s); SET(u, 2, 0, -s); SET(u, 3, c, 0); break;
    case C_RY: SET(u, 0, c, 0); SET(u, 1, -s, 0); SET(u, 2, s, 0); SET(u, 3, c, 0); break;
    case C_RZ: SET(u, 0, c, -s); SET(u, 1, c, s); break;
    case C_PHASE: SET(u, 0, 1, 0); SET(u, 1, cos(a[0]), sin(a[0])); break;
    case C_ROT: {  /* RZ(omega) RY(theta) RZ(phi), angles (phi, theta, omega) */
        double ct = cos(0.5 * a[1]), st = sin(0.5 * a[1]);
        /* e^{-i(phi + omega)/2} = ar + i ai and e^{i(phi - omega)/2} = br + i bi as products
         * of the half angles' phases (their sum drops omega once |phi| is ~1e16 |omega|) */
        double cp = cos(0.5 * a[0]), sp = sin(0.5 * a[0]);
        double co = cos(0.5 * a[2]), so = sin(0.5 * a[2]);
        double ar = cp * co - sp * so, ai = -(sp * co + cp * so);
        double br = cp * co + sp * so, bi = sp * co - cp * so;
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
        memset(du, 0, sizeof(double) * (size_t)g->usize);
        SET(du, 1, -sin(a[0]), cos(a[0]));
        return;
    case C_SEXC:
        memset(du, 0, sizeof(double) * (size_t)g->usize);
        SET(du, 5, -0.5 * s, 0); SET(du, 6, -0.5 * c, 0); SET(du, 9, 0.5 * c, 0);
        SET(du, 10, -0.5 * s, 0);
        return;
    case C_DEXC:
        memset(du, 0, sizeof(double) * (size_t)g->usize);
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

#define CODED_MAX_USIZE 512  /* reals of the largest coded matrix (DoubleExcitation, 16x16) */

/* Group base for free index j: insert zeros at the special bits, then set the controls. */
static inline i64 group_base(const gate_t *g, i64 j) {
    for (int s = 0; s < g->nspecial; s++) {
        int p = g->special[s];
        j = ((j >> p) << (p + 1)) | (j & (((i64)1 << p) - 1));
    }
    return j | g->cmask;
}

static int fits_chunk(const gate_t *g, int cb) {
    return g->nspecial == 0 || g->special[g->nspecial - 1] < cb;
}

/* Contiguous share [*lo, *hi) of count items for thread t of nt. */
static void share(i64 count, int t, int nt, i64 *lo, i64 *hi) {
    *lo = count * t / nt;
    *hi = count * (t + 1) / nt;
}

/* The part of a one-qubit block loop (nblk blocks of two halves of w reals) for thread t of
 * nt: whole blocks [j0, j1) when there are enough blocks, else the reals [e0, e1) of every
 * half block (multiples of 16: the vector accumulators stay aligned). */
static void split_1q(i64 nblk, i64 w, int t, int nt, i64 *j0, i64 *j1, i64 *e0, i64 *e1) {
    if (nblk >= nt || w < 16 * (i64)nt) {
        if (nblk >= nt) share(nblk, t, nt, j0, j1);
        else { *j0 = 0; *j1 = t == 0 ? nblk : 0; }
        *e0 = 0;
        *e1 = w;
        return;
    }
    i64 a, b;
    share(w / 16, t, nt, &a, &b);
    *j0 = 0;
    *j1 = nblk;
    *e0 = 16 * a;
    *e1 = 16 * b;
}

/* Sums over one state of at least 2^SUM_PARTS_MIN_BITS amplitudes (the adjoint's overlaps,
 * where one state is split over threads) are taken in SUM_PARTS fixed parts, each summed from
 * zero, and the parts are added in order however many threads share them: the gradients are
 * the same bits for any number of threads. */
#define SUM_PARTS 16
#define SUM_PARTS_MIN_BITS 16

/* out[e] = the SUM_PARTS parts' sums of entry e, added in part order */
static void sum_parts(double (*part)[8], double *out) {
    for (int e = 0; e < 8; e++) {
        double acc = 0;
        for (int q = 0; q < SUM_PARTS; q++) acc += part[q][e];
        out[e] = acc;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* loops over the groups of a gate                                                           */

/* Run BODY for every group base of part q_ of nq_ (contiguous shares of the outer loop; 0 of
 * 1: every group), PRAGMA before the outer loop. */
#define FOR_GROUPS_IN(g, nbits, PRAGMA, q_, nq_, ...)                                          \
    do {                                                                                       \
        i64 ngroups_ = (i64)1 << ((nbits) - (g)->nspecial), a_, b_;                            \
        int pmin_ = (g)->nspecial ? (g)->special[0] : 0;                                       \
        i64 inner_ = (i64)1 << pmin_;                                                          \
        if (inner_ > ngroups_) inner_ = ngroups_;                                              \
        if (inner_ >= 4) {                                                                     \
            share(ngroups_ / inner_, q_, nq_, &a_, &b_);                                       \
            PRAGMA                                                                             \
            for (i64 o_ = a_; o_ < b_; o_++) {                                                 \
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
            int lowc_ = 0;                                                                     \
            while (lowc_ < (g)->nspecial && (g)->special[lowc_] == lowc_) lowc_++;             \
            i64 lowrun_ = (i64)1 << ((lowc_ < (g)->nspecial ? (g)->special[lowc_] : (nbits))  \
                                     - lowc_);                                                 \
            if (lowrun_ > ngroups_) lowrun_ = ngroups_;                                        \
            if (run_ >= 4) {                                                                   \
                share(ngroups_ / (run_ * inner_), q_, nq_, &a_, &b_);                          \
                PRAGMA                                                                         \
                for (i64 o_ = a_; o_ < b_; o_++) {                                             \
                    i64 base0_ = group_base(g, o_ * run_ * inner_);                            \
                    for (i64 lo_ = 0; lo_ < inner_; lo_++)                                     \
                        for (i64 l_ = 0; l_ < run_; l_++) {                                    \
                            i64 base = base0_ + lo_ + l_ * step_;                              \
                            __VA_ARGS__                                                        \
                        }                                                                      \
                }                                                                              \
            } else if (pmin_ == 0 && lowrun_ >= 4) {                                           \
                /* special bits 0..c-1: runs of groups 2^c apart up to the next special bit */ \
                share(ngroups_ / lowrun_, q_, nq_, &a_, &b_);                                  \
                PRAGMA                                                                         \
                for (i64 o_ = a_; o_ < b_; o_++) {                                             \
                    i64 base0_ = group_base(g, o_ * lowrun_);                                  \
                    for (i64 l_ = 0; l_ < lowrun_; l_++) {                                     \
                        i64 base = base0_ + (l_ << lowc_);                                     \
                        __VA_ARGS__                                                            \
                    }                                                                          \
                }                                                                              \
            } else {                                                                           \
                share(ngroups_, q_, nq_, &a_, &b_);                                            \
                PRAGMA                                                                         \
                for (i64 j_ = a_; j_ < b_; j_++) {                                             \
                    i64 base = group_base(g, j_);                                              \
                    __VA_ARGS__                                                                \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)

/* Run BODY for every group base: the innermost loop runs over contiguous amplitudes when the
 * lowest special bit is >= 2 (vectorised), otherwise one flat loop over groups. The parallel
 * variant splits the loop over par_ threads (one large state). */
#define FOR_GROUPS_(g, nbits, PRAGMA, ...) FOR_GROUPS_IN(g, nbits, PRAGMA, 0, 1, __VA_ARGS__)
#define FOR_GROUPS(g, nbits, ...) FOR_GROUPS_(g, nbits, , __VA_ARGS__)
#define FOR_GROUPS_PAR(g, nbits, ...)                                                          \
    FOR_GROUPS_(g, nbits, _Pragma("omp parallel for num_threads(par_) schedule(static)"),      \
                __VA_ARGS__)
#define FOR_GROUPS_ANY(g, nbits, ...)                                                          \
    do {                                                                                       \
        if (par_ > 1) FOR_GROUPS_PAR(g, nbits, __VA_ARGS__);                                   \
        else FOR_GROUPS(g, nbits, __VA_ARGS__);                                                \
    } while (0)

/* FOR_GROUPS over part q_ of nq_ of the groups, one thread. */
#define FOR_GROUPS_PART(g, nbits, q_, nq_, ...) FOR_GROUPS_IN(g, nbits, , q_, nq_, __VA_ARGS__)

#define RE(p, i) (p)[2 * (i)]
#define IM(p, i) (p)[2 * (i) + 1]

/* Small states are processed in tiles of 2^tb consecutive states: a gate whose matrix is the
 * same for all bindings applies to the tile as ONE state of n + tb qubits (the batch index
 * is the high bits), so the per-gate cost is paid once per tile instead of once per state. */
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

/* ---------------------------------------------------------------------------------------- */
/* scratch kept between calls                                                                 */

/* The large per-call scratch (the adjoint's copies of psi and lam, the tile buffers) is kept
 * for the next call instead of being freed: a fresh block's pages are mapped and zeroed by the
 * kernel on first touch (a fault per 4 KiB page, about 2 us each on a virtual machine: 1000 or
 * more faults per SEL gradient at 18 qubits). At most QD_KEEP_SLOTS blocks and QD_KEEP_MAX
 * bytes in all are kept; larger requests are malloc'd and freed per call as before.
 * qd_scratch_release() frees every kept block not in use. The table's lock is only ever
 * tried: a call that finds it taken (another thread's call, or a fork while it was held)
 * takes a fresh block and frees it after (a kept block it holds it hands back by its busy
 * flag alone), so nothing waits and nothing deadlocks. Callers
 * write a block before they read it: no data passes from one call to the next. */
#define QD_KEEP_SLOTS 4
#define QD_KEEP_MAX ((size_t)64 << 20)

typedef struct { void *p; size_t bytes; int busy; } keep_t;
static keep_t qd_keep[QD_KEEP_SLOTS];
static char qd_keep_lock;

static int keep_try_lock(void) { return !__atomic_test_and_set(&qd_keep_lock, __ATOMIC_ACQUIRE); }
static void keep_unlock(void) { __atomic_clear(&qd_keep_lock, __ATOMIC_RELEASE); }

/* A block of at least bytes: the smallest free kept one that is large enough and at most
 * twice as large (a small request does not take the block a large one will need), else
 * malloc. */
static void *keep_get(size_t bytes) {
    void *p = 0;
    if (keep_try_lock()) {
        int best = -1;
        for (int i = 0; i < QD_KEEP_SLOTS; i++)
            if (qd_keep[i].p && !__atomic_load_n(&qd_keep[i].busy, __ATOMIC_ACQUIRE) &&
                qd_keep[i].bytes >= bytes &&
                qd_keep[i].bytes / 2 <= bytes &&
                (best < 0 || qd_keep[i].bytes < qd_keep[best].bytes))
                best = i;
        if (best >= 0) {
            qd_keep[best].busy = 1;
            p = qd_keep[best].p;
        }
        keep_unlock();
    }
    return p ? p : malloc(bytes ? bytes : 1);
}

/* Hand back a block of keep_get(bytes): kept when it is one of the table's, or when it fits
 * the budget and a slot once free blocks smaller than it are dropped (smallest first: the
 * larger a block, the more first-touch faults keeping it saves), else freed. */
static void keep_put(void *p, size_t bytes) {
    if (!p) return;
    if (!keep_try_lock()) {
        /* the table is taken (another thread's keep_get/keep_put): a block of the table is
         * handed back by clearing its busy flag, which only its holder (this caller) changes
         * while it is set; any other block is freed. Never free a kept block here: its slot
         * would stay busy with a dangling pointer. */
        for (int i = 0; i < QD_KEEP_SLOTS; i++)
            if (__atomic_load_n(&qd_keep[i].p, __ATOMIC_ACQUIRE) == p &&
                __atomic_load_n(&qd_keep[i].busy, __ATOMIC_ACQUIRE)) {
                __atomic_store_n(&qd_keep[i].busy, 0, __ATOMIC_RELEASE);
                return;
            }
        free(p);
        return;
    }
    void *drop[QD_KEEP_SLOTS + 1] = {0};
    int nd = 0;
    drop[nd++] = p;
    {
        int mine = 0;
        for (int i = 0; i < QD_KEEP_SLOTS; i++)
            if (qd_keep[i].p == p) { qd_keep[i].busy = 0; mine = 1; nd = 0; break; }
        while (!mine && bytes <= QD_KEEP_MAX) {
            size_t held = 0;
            int empty = -1, small = -1;
            for (int i = 0; i < QD_KEEP_SLOTS; i++) {
                if (!qd_keep[i].p) { if (empty < 0) empty = i; continue; }
                held += qd_keep[i].bytes;
                if (!__atomic_load_n(&qd_keep[i].busy, __ATOMIC_ACQUIRE) &&
                    qd_keep[i].bytes < bytes &&
                    (small < 0 || qd_keep[i].bytes < qd_keep[small].bytes))
                    small = i;
            }
            if (empty >= 0 && held + bytes <= QD_KEEP_MAX) {
                qd_keep[empty].p = p;
                qd_keep[empty].bytes = bytes;
                qd_keep[empty].busy = 0;
                drop[0] = 0;  /* p is kept */
                break;
            }
            if (small < 0) break;  /* nothing smaller to drop: p is freed */
            drop[nd++] = qd_keep[small].p;
            qd_keep[small].p = 0;
            qd_keep[small].bytes = 0;
        }
        keep_unlock();
    }
    for (int i = 0; i < nd; i++) free(drop[i]);
}

/* Free every kept block not in use; returns the bytes still kept (blocks in use). */
int64_t qd_scratch_release(void) {
    void *drop[QD_KEEP_SLOTS] = {0};
    int64_t left = 0;
    if (!keep_try_lock()) return -1;
    for (int i = 0; i < QD_KEEP_SLOTS; i++) {
        if (qd_keep[i].p && !__atomic_load_n(&qd_keep[i].busy, __ATOMIC_ACQUIRE)) {
            drop[i] = qd_keep[i].p;
            qd_keep[i].p = 0;
            qd_keep[i].bytes = 0;
        }
        left += qd_keep[i].p ? (int64_t)qd_keep[i].bytes : 0;
    }
    keep_unlock();
    for (int i = 0; i < QD_KEEP_SLOTS; i++) free(drop[i]);
    return left;
}

/* Bytes kept between calls (in use or not); -1 when the table is busy. */
int64_t qd_scratch_held(void) {
    int64_t held = 0;
    if (!keep_try_lock()) return -1;
    for (int i = 0; i < QD_KEEP_SLOTS; i++) held += qd_keep[i].p ? (int64_t)qd_keep[i].bytes : 0;
    keep_unlock();
    return held;
}

/* ---------------------------------------------------------------------------------------- */
/* the kernels, once per precision                                                            */

#define R double
#define RBYTES 8
#define SFX(name) name##_c128
#define RSIZE sizeof(double)
#include "qdsim_kernels.h"
#undef R
#undef RBYTES
#undef SFX
#undef RSIZE

#define R float
#define RBYTES 4
#define SFX(name) name##_c64
#define RSIZE sizeof(float)
#include "qdsim_kernels.h"
#undef R
#undef RBYTES
#undef SFX
#undef RSIZE

/* batched small states in the lane layout (qdsim_batch.h), once per precision */
#define R double
#define SFX(name) name##_c128
#define RSIZE sizeof(double)
#include "qdsim_batch.h"
#undef R
#undef SFX
#undef RSIZE

#define R float
#define SFX(name) name##_c64
#define RSIZE sizeof(float)
#include "qdsim_batch.h"
#undef R
#undef SFX
#undef RSIZE

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                              */

int qd_run(qd_run_args *a) {
    a->bad_record = -1;
    int rc = check_run(a);
    if (rc) return rc;
    if (a->batch == 0) return QD_OK;
    return a->dtype == QD_C64 ? run_c64(a) : run_c128(a);
}

int qd_adjoint_coded(qd_adjoint_args *a) {
    a->bad_record = -1;
    int rc = check_adjoint(a, 0);
    if (rc) return rc;
    if (a->batch == 0) return QD_OK;
    return a->dtype == QD_C64 ? adjoint_c64(a, 0) : adjoint_c128(a, 0);
}

int qd_adjoint_slots(qd_adjoint_args *a) {
    a->bad_record = -1;
    int rc = check_adjoint(a, 1);
    if (rc) return rc;
    if (a->batch == 0) return QD_OK;
    return a->dtype == QD_C64 ? adjoint_c64(a, 1) : adjoint_c128(a, 1);
}

/* |s_i|^2 for count complex numbers (probabilities of a batch of states). */
int qd_abs2(int32_t dtype, const void *s, void *out, int64_t count) {
    if (count < 0 || (count > 0 && (!s || !out))) return QD_EARGS;
    if (dtype == QD_C128) {
        const double *x = (const double *)s;
        double *o = (double *)out;
        for (i64 i = 0; i < count; i++) o[i] = x[2 * i] * x[2 * i] + x[2 * i + 1] * x[2 * i + 1];
    } else if (dtype == QD_C64) {
        const float *x = (const float *)s;
        float *o = (float *)out;
        for (i64 i = 0; i < count; i++) o[i] = x[2 * i] * x[2 * i] + x[2 * i + 1] * x[2 * i + 1];
    } else {
        return QD_EDTYPE;
    }
    return QD_OK;
}

/* The probabilities |s_b(x)|^2 of B states of 2^n amplitudes summed to their high bits
 * (hi[b, x >> lb]: 2^(n - lb) entries a binding) and to their lb low bits (lo[b, x & (2^lb - 1)]),
 * in one pass, in double precision, rounded once to the states' real type: the marginals of the
 * two halves of a register that Z words are read off. A binding's rows (x >> lb) are cut into
 * ZM_BLOCKS blocks whatever the thread count, each block's sums to the low bits start from zero
 * and are added in block order, so the results are the same bits for any number of threads:
 * bindings are split over the threads when there are several, else a binding's blocks are. */
#define ZM_BLOCKS 16
#define ZM_MIN_AMPS ((i64)1 << STATE_PAR_MIN_BITS)  /* one binding is split over threads from here on */

/* Rows [h0, h1) of one state (rows of L amplitudes): their sums into hi, their sums to the low
 * bits into tmp (from zero). One function per type, called by every path, and the blocks' sums
 * added by zm_reduce alone: the same instructions whatever the split. */
#define ZM_BLOCK_FN(T, NAME)                                                                   \
    static __attribute__((noinline)) void NAME(const T *src, i64 h0, i64 h1, i64 L, T *hi,    \
                                               double *tmp) {                                  \
        for (i64 l = 0; l < L; l++) tmp[l] = 0;                                                \
        for (i64 h = h0; h < h1; h++) {                                                        \
            const T *row = src + 2 * (h * L);                                                  \
            double rs = 0;                                                                     \
            for (i64 l = 0; l < L; l++) {                                                      \
                double v = (double)row[2 * l] * row[2 * l] + (double)row[2 * l + 1] * row[2 * l + 1]; \
                rs += v;                                                                       \
                tmp[l] += v;                                                                   \
            }                                                                                  \
            hi[h] = (T)rs;                                                                     \
        }                                                                                      \
    }
ZM_BLOCK_FN(double, zm_block_c128)
ZM_BLOCK_FN(float, zm_block_c64)

/* acc[l] = sum over blocks k in order of part[k * L + l] */
static __attribute__((noinline)) void zm_reduce(const double *part, i64 nblk, i64 L,
                                                double *acc) {
    for (i64 l = 0; l < L; l++) acc[l] = part[l];
    for (i64 k = 1; k < nblk; k++)
        for (i64 l = 0; l < L; l++) acc[l] += part[k * L + l];
}

#define ZM_BODY(T, BLOCK)                                                                      \
    do {                                                                                       \
        const T *s = (const T *)sv;                                                            \
        T *hi = (T *)hv, *lo = (T *)lv;                                                        \
        const i64 L = (i64)1 << lb, H = (i64)1 << (n - lb);                                    \
        const i64 nblk = H < ZM_BLOCKS ? H : ZM_BLOCKS;                                        \
        const int nt = nthreads > 1 ? nthreads : 1;                                            \
        const int bpar = B > 1 && nt > 1, split = !bpar && nt > 1 && H * L >= ZM_MIN_AMPS;   \
        /* nblk + 1 vectors of L doubles (the blocks' sums, their total) per thread when the   \
         * bindings are split, once otherwise */                                               \
        const i64 per = (nblk + 1) * L;                                                        \
        double *buf = (double *)malloc(sizeof(double) * (size_t)(per * (bpar ? nt : 1)));     \
        if (!buf) return QD_ENOMEM;                                                            \
        if (bpar) {                                                                            \
            _Pragma("omp parallel for num_threads(nt) schedule(static)")                       \
            for (i64 b = 0; b < B; b++) {                                                      \
                double *part = buf + per * THREAD_ID, *acc = part + nblk * L;                  \
                for (i64 k = 0; k < nblk; k++)                                                 \
                    BLOCK(s + 2 * (b << n), H * k / nblk, H * (k + 1) / nblk, L, hi + b * H,  \
                          part + k * L);                                                       \
                zm_reduce(part, nblk, L, acc);                                                 \
                for (i64 l = 0; l < L; l++) lo[b * L + l] = (T)acc[l];                         \
            }                                                                                  \
        } else {                                                                               \
            double *part = buf, *acc = buf + nblk * L;                                         \
            for (i64 b = 0; b < B; b++) {                                                      \
                _Pragma("omp parallel for if (split) num_threads(nt) schedule(static)")        \
                for (i64 k = 0; k < nblk; k++)                                                 \
                    BLOCK(s + 2 * (b << n), H * k / nblk, H * (k + 1) / nblk, L, hi + b * H,  \
                          part + k * L);                                                       \
                zm_reduce(part, nblk, L, acc);                                                 \
                for (i64 l = 0; l < L; l++) lo[b * L + l] = (T)acc[l];                         \
            }                                                                                  \
        }                                                                                      \
        free(buf);                                                                             \
    } while (0)

int qd_zmarginals(int32_t dtype, const void *sv, int64_t B, int32_t n, int32_t lb, void *hv,
                  void *lv, int32_t nthreads) {
    if (B < 0 || n < 0 || n > 62 || lb < 0 || lb > n || nthreads < 1 || nthreads > 4096 ||
        (B > 0 && (!sv || !hv || !lv)))
        return QD_EARGS;
    if (dtype == QD_C128) ZM_BODY(double, zm_block_c128);
    else if (dtype == QD_C64) ZM_BODY(float, zm_block_c64);
    else return QD_EDTYPE;
    return QD_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Pauli sums by flip groups                                                                   */

/* out[b, i] (+)= sum_g d[g, i] x[b, i ^ m_g]: a Pauli sum applied to B states of 2^n
 * amplitudes (complex, or real for a real matrix), its terms grouped by X/Y flip mask m_g, each
 * group one diagonal: row drow[g] of d (the states' real type, or complex when dcomplex), or,
 * where drow[g] < 0 (a group of X words alone), the constant consts[g]. The output is formed a
 * block of PA_BITS amplitudes at a time in a buffer in L1, every group added in order: the
 * partner block of mask m is the block at i0 ^ (m's high bits), read in runs as long as m's
 * low bits allow (1 << ctz of them), so each group streams its diagonal (if any) and one block
 * of x per block of out. Every output entry is summed by one thread in group order: the same
 * bits for any number of threads. Blocks of all states are split over the threads. */
#define PA_BITS 10

/* a[r] += d * s[r] over a run: XC complex states, DC complex d, CONST one d for the run */
#define PA_RUN(T, XC, DC, CONST, len)                                                          \
    for (i64 r = 0; r < len; r++) {                                                            \
        const T dr = CONST ? kr : (DC ? dc[2 * r] : dc[r]);                                    \
        const T di = CONST ? ki : (DC ? dc[2 * r + 1] : (T)0);                                 \
        if (XC && DC) {                                                                        \
            a[2 * r] += dr * src[2 * r] - di * src[2 * r + 1];                                 \
            a[2 * r + 1] += dr * src[2 * r + 1] + di * src[2 * r];                             \
        } else if (XC) {                                                                       \
            a[2 * r] += dr * src[2 * r];                                                       \
            a[2 * r + 1] += dr * src[2 * r + 1];                                               \
        } else {                                                                               \
            a[r] += dr * src[r];                                                               \
        }                                                                                      \
    }

/* the run of len entries of out from c, from the partner entries at src */
#define PA_CHUNK(T, XC, DC, c, srcp, len)                                                      \
    {                                                                                          \
        const T *src = (srcp);                                                                 \
        T *a = acc + W * (c);                                                                  \
        const i64 run_ = (len);                                                                \
        if (row < 0) {                                                                         \
            const T *dc = 0;  /* not read for a constant */                                    \
            PA_RUN(T, XC, DC, 1, run_)                                                         \
        } else {                                                                               \
            const T *dc = dg + WD * (c);                                                       \
            PA_RUN(T, XC, DC, 0, run_)                                                         \
        }                                                                                      \
    }

#define PA_BODY(T, XC, DC)                                                                     \
    do {                                                                                       \
        const int W = XC ? 2 : 1, WD = DC ? 2 : 1;                                             \
        const T *xs = (const T *)xv, *ds = (const T *)dv, *ks = (const T *)kv;                 \
        T *os = (T *)outv;                                                                     \
        const int bb = n < PA_BITS ? n : PA_BITS;                                              \
        const i64 BS = (i64)1 << bb, nblk = (i64)1 << (n - bb), total = B * nblk;             \
        const int nt = nthreads > 1 && (B << n) >= ((i64)1 << PAR_MIN_BITS) ? nthreads : 1;   \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (nt > 1)")              \
        for (i64 t = 0; t < total; t++) {                                                      \
            T acc[2 << PA_BITS];                                                               \
            const i64 b = t / nblk, i0 = (t % nblk) << bb;                                     \
            const T *x = xs + W * (b << n);                                                    \
            T *o = os + W * ((b << n) + i0);                                                   \
            for (i64 j = 0; j < W * BS; j++) acc[j] = accumulate ? o[j] : (T)0;                \
            for (i64 g = 0; g < G; g++) {                                                      \
                const i64 m = masks[g], lo = m & (BS - 1), row = drow[g];                      \
                const T *xp = x + W * (i0 ^ (m & ~(BS - 1)));                                  \
                const T *dg = row < 0 ? 0 : ds + WD * ((row << n) + i0);                       \
                const T kr = row < 0 ? ks[WD * g] : (T)0;                                      \
                const T ki = row < 0 && DC ? ks[WD * g + 1] : (T)0;                            \
                const i64 run = lo ? (lo & -lo) : BS;                                          \
                if (run >= 4 || lo == 0) {  /* lo == 0: the whole block, any size */          \
                    for (i64 c = 0; c < BS; c += run)                                          \
                        PA_CHUNK(T, XC, DC, c, xp + W * (c ^ lo), run)                         \
                } else if (run == 2) {                                                         \
                    for (i64 c = 0; c < BS; c += 2)                                            \
                        PA_CHUNK(T, XC, DC, c, xp + W * (c ^ lo), 2)                           \
                } else {  /* pairs: partner pair at c ^ (lo - 1), its two entries swapped */   \
                    for (i64 c = 0; c < BS; c += 2) {                                          \
                        const T *sp = xp + W * (c ^ (lo - 1));                                 \
                        PA_CHUNK(T, XC, DC, c, sp + W, 1)                                      \
                        PA_CHUNK(T, XC, DC, c + 1, sp, 1)                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            memcpy(o, acc, sizeof(T) * W * (size_t)BS);                                        \
        }                                                                                      \
    } while (0)

int qd_pauli_apply(int32_t dtype, const void *xv, int64_t B, int32_t n, int64_t G,
                   const int64_t *masks, const int64_t *drow, int64_t D, const void *dv,
                   const void *kv, int32_t dcomplex, void *outv, int32_t accumulate,
                   int32_t nthreads) {
    if (B < 0 || n < 0 || n > 62 || G < 0 || D < 0 || nthreads < 1 || nthreads > 4096 ||
        (B > 0 && (!xv || !outv)) || (B > 0 && G > 0 && (!masks || !drow || !kv)) ||
        (D > 0 && !dv) || (B > 0 && xv == outv))
        return QD_EARGS;
    for (i64 g = 0; g < G; g++)
        if (masks[g] < 0 || (masks[g] >> n) != 0 || drow[g] >= D) return QD_EARGS;
    if (B == 0) return QD_OK;
    if (dtype == QD_C128) {
        if (dcomplex) PA_BODY(double, 1, 1); else PA_BODY(double, 1, 0);
    } else if (dtype == QD_C64) {
        if (dcomplex) PA_BODY(float, 1, 1); else PA_BODY(float, 1, 0);
    } else if (dtype == QD_F64 && !dcomplex) {
        PA_BODY(double, 0, 0);
    } else if (dtype == QD_F32 && !dcomplex) {
        PA_BODY(float, 0, 0);
    } else {
        return QD_EDTYPE;
    }
    return QD_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* batched small states                                                                       */

int64_t qd_batch_args_size(void) { return (int64_t)sizeof(qd_batch_args); }

static int check_batch(qd_batch_args *a, int adjoint) {
    if (a->dtype != QD_C128 && a->dtype != QD_C64) return QD_EDTYPE;
    if (a->n < 0 || a->n > QD_BATCH_MAXN || a->batch < 0 || a->lanes < 8 || a->lanes > QD_BATCH_MAXW || a->lanes % 8 ||
        a->nthreads < 1 || a->nthreads > 4096 || a->P < 0 || a->K < 0 || a->nsrc < 0)
        return QD_EARGS;
    if (a->batch == 0) return QD_OK;
    if (!a->psi || (a->K && (!a->words || !a->coeffs)) || (!a->scale) != (!a->offset))
        return QD_EARGS;
    if (adjoint ? (!a->cot || (a->nsrc && !a->gout)) : !a->out) return QD_EARGS;
    i64 total = 0;
    for (int s = 0; s < a->nsrc; s++) {
        if (!a->src_len || a->src_len[s] < 0 || (a->src_len[s] > 0 && (!a->src || !a->src[s])))
            return QD_EARGS;
        total += a->src_len[s];
    }
    if (a->P) {
        if (!a->idx) return QD_ECOLUMN;
        /* the entries the kernels read: a column flagged batch-shared (cshared) only in the
         * first row of each chunk, any other in every row */
        i64 per[256], np = 0;
        for (i64 j = 0; a->cshared && a->P <= 256 && j < a->P; j++)
            if (!a->cshared[j]) per[np++] = j;
        if (!a->cshared || a->P > 256) np = -1;
        for (i64 b = 0; b < a->batch; b++) {
            const int64_t *row = a->idx + b * a->P;
            if (np < 0 || b % a->lanes == 0) {
                int bad = 0;
                for (i64 j = 0; j < a->P; j++) bad |= row[j] < 0 || row[j] >= total;
                if (bad) return QD_ECOLUMN;
            } else {
                for (i64 t = 0; t < np; t++)
                    if (row[per[t]] < 0 || row[per[t]] >= total) return QD_ECOLUMN;
            }
        }
    }
    for (i64 k = 0; k < a->K; k++)
        if (a->words[k] < 0 || (a->words[k] >> a->n) != 0) return QD_EARGS;
    qd_angles ang = {a->P ? (const double *)a->idx : 0, a->batch, a->P};  /* columns only */
    return check_program(&a->prog, a->n, a->batch, &ang, 0, 0, &a->bad_record);
}

int qd_batch_run(qd_batch_args *a) {
    a->bad_record = -1;
    int rc = check_batch(a, 0);
    if (rc || a->batch == 0) return rc;
    return a->dtype == QD_C64 ? batch_run_c64(a) : batch_run_c128(a);
}

int qd_batch_adjoint(qd_batch_args *a) {
    a->bad_record = -1;
    int rc = check_batch(a, 1);
    if (rc || a->batch == 0) return rc;
    return a->dtype == QD_C64 ? batch_adjoint_c64(a) : batch_adjoint_c128(a);
}
