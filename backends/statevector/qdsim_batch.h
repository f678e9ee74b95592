/* Batched small states in the lane layout, for one precision (included by qdsim.c with R and
 * SFX set, like qdsim_kernels.h).
 *
 * A batch of B states of 2^n amplitudes (n small) is cut into chunks of W bindings ("lanes");
 * a chunk is stored row by row: row r holds amplitude r of the W states as W reals then W
 * imaginary parts. Every gate is a loop over rows whose innermost loop runs over the lanes, so
 * it vectorises for any wire, and a chunk (psi and lam of the adjoint) stays in cache while the
 * whole circuit runs over it. Gates whose matrix is the same for the whole batch (weights)
 * use one matrix; others (per-binding angles, e.g. an embedding) a matrix per lane. X-type
 * flips and swaps move no data: a row table (logical index -> row) is permuted instead.
 *
 * Angles come straight from the argument tensors: theta[b, j] = scale * src[idx[b, j]] + offset
 * (src: the concatenation of the sources), checked finite. Outputs are Z words (with
 * coefficients) of every binding. The adjoint sweep forms lam = (sum_k cot[b, k] Z_k) psi,
 * runs back over the gates after the product prefix (the leading one-qubit gates, whose state
 * is a product written directly), takes the prefix gates' gradients in closed form from lam
 * contracted with the other wires' factors, and scatters every gradient into the sources (the
 * gradient buffers are zeroed first: written, not added to). */

#ifndef QD_VSINCOS_DEFINED
#define QD_VSINCOS_DEFINED
/* sin and cos of n angles, vectorised: reduction by pi/2 with a three-part constant in fused
 * multiply-adds (immune to the reassociation the build allows) and fdlibm's kernel polynomials
 * on [-pi/4, pi/4] (error within an ulp or two); libm for a batch with any |x| >= 8e5. */
static void qd_vsincos(const double *restrict x, double *restrict s, double *restrict c,
                       long long n) {
    double big = 0;  /* a NaN leaves big as it is (as fmax would); inline, vectorised */
    for (long long i = 0; i < n; i++) { double ax = fabs(x[i]); big = ax > big ? ax : big; }
    if (!(big < 8.0e5)) {
        for (long long i = 0; i < n; i++) { s[i] = sin(x[i]); c[i] = cos(x[i]); }
        return;
    }
    const double inv = 6.36619772367581382433e-01, p1 = 1.57079632673412561417e+00,
                 p2 = 6.07710050630396597660e-11, p3 = 2.02226624871116645580e-21;
    const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                 S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                 S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                 C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                 C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    _Pragma("GCC ivdep") for (long long i = 0; i < n; i++) {
        double k = __builtin_round(x[i] * inv);
        double y = fma(-k, p3, fma(-k, p2, fma(-k, p1, x[i])));  /* fused: no reassociation */
        double z = y * y;
        double ps = y + y * z * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));
        double pc = 1.0 - 0.5 * z + z * z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
        long long q = (long long)k & 3;
        double sv = (q & 1) ? pc : ps, cv = (q & 1) ? ps : pc;
        s[i] = (q & 2) ? -sv : sv;
        c[i] = ((q + 1) & 2) ? -cv : cv;
    }
}
#endif
/* The lane kernels below run in cache (a chunk's psi and lam stay there through the whole
 * circuit), so they are bound by the floating-point units: their products and sums contract
 * into fused multiply-adds, as the forward's in-cache kernels do (the build's -std=c99 turns
 * contraction off elsewhere; qd_vsincos above keeps its own explicit ones): a training step's
 * run + gradient measured 4-9% faster at 8 qubits (batch 32 and 256), within +-4% at 4. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize ("fp-contract=fast")
#endif

#define BLM(e) ml[(e) * W + l]
/* the lane loops: rows of one chunk never overlap (GCC ignores restrict on local pointers) */
#define LANES _Pragma("GCC ivdep") for (i64 l = 0; l < W; l++)

/* Per-call context of the batched kernels. */
typedef struct {
    int n;
    i64 d, B, W, nch, bpad, P, nops, pe, K;
    gate_t *gates;
    double *theta;     /* P x Bpad (column j of binding b at j * bpad + b, a column's bindings
                          contiguous); a batch-shared column is held (and read) in row 0 only */
    int own_theta;
    char *cshared;     /* per column: the same source element in every row */
    double **umat;     /* per gate: uniform matrix and derivatives (double), or NULL */
    double *tab;       /* d x K: coefficient times the sign of Z word k on basis state i */
    i64 *fperm;        /* the row table after the program (prefix excluded) */
    i64 maxu;          /* largest usize * (1 + np) of a gate */
    int rform;         /* the scratch holds the real form's buffers (breal_factors) */
} SFX(bctx_t);
#define BTH(c, b, j) ((c)->theta[(j) * (c)->bpad + (b)])

static void SFX(bctx_free)(SFX(bctx_t) *c) {
    if (c->umat)
        for (i64 i = 0; i < c->nops; i++) free(c->umat[i]);
    free(c->umat);
    free(c->gates);
    if (c->own_theta) free(c->theta);
    free(c->cshared);
    free(c->tab);
    free(c->fperm);
}

/* Swap rows in the table for a flip or swap gate (its own inverse). */
static void SFX(bperm)(i64 *perm, i64 d, const gate_t *g) {
    for (i64 i = 0; i < d; i++) {
        if ((i & g->cmask) != g->cmask) continue;
        i64 j;
        if (g->kind == K_FLIP) {  /* each pair once: from its smaller index */
            j = i ^ g->tmask;
            if (j < i) continue;
        } else {  /* swap: exchange bits 0 and 1 of the gate; each pair once: from bit 0 set */
            i64 b0 = (i64)1 << g->bits[0], b1 = (i64)1 << g->bits[1];
            if (!(i & b0) || (i & b1)) continue;
            j = i ^ b0 ^ b1;
        }
        i64 t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
}

/* Rot(phi, theta, omega) = RZ(omega) RY(theta) RZ(phi) as gate_eval writes it, from one sine
 * and cosine per half angle; with deriv also dU/da_j = U(a_j + pi) / 2 (a product of Pauli
 * rotations), the shifted half angles' sines and cosines read off the same values. */
static void SFX(brot_fill)(double *u, double ar, double ai, double br, double bi, double ct,
                           double st, double f) {
    u[0] = f * ar * ct; u[1] = f * ai * ct; u[2] = -f * br * st; u[3] = -f * bi * st;
    u[4] = f * br * st; u[5] = -f * bi * st; u[6] = f * ar * ct; u[7] = -f * ai * ct;
}

static void SFX(brot_eval)(const double *a, int deriv, double *u) {
    double ct = cos(0.5 * a[1]), st = sin(0.5 * a[1]);
    /* e^{-i(phi + omega)/2} = ar + i ai and e^{i(phi - omega)/2} = br + i bi as products
     * of the half angles' phases (their sum drops omega once |phi| is ~1e16 |omega|) */
    double cp = cos(0.5 * a[0]), sp = sin(0.5 * a[0]);
    double co = cos(0.5 * a[2]), so = sin(0.5 * a[2]);
    double ar = cp * co - sp * so, ai = -(sp * co + cp * so);
    double br = cp * co + sp * so, bi = sp * co - cp * so;
    SFX(brot_fill)(u, ar, ai, br, bi, ct, st, 1.0);
    if (!deriv) return;
    SFX(brot_fill)(u + 8, ai, -ar, -bi, br, ct, st, 0.5);   /* phi + pi: ap - pi/2, bp + pi/2 */
    SFX(brot_fill)(u + 16, ar, ai, br, bi, -st, ct, 0.5);   /* theta + pi */
    SFX(brot_fill)(u + 24, ai, -ar, bi, -br, ct, st, 0.5);  /* omega + pi: ap - pi/2, bp - pi/2 */
}

static int SFX(bctx_init)(SFX(bctx_t) *c, qd_batch_args *a, int deriv) {
    memset(c, 0, sizeof(*c));
    int n = a->n;
    i64 B = a->batch, W = a->lanes, P = a->P, K = a->K, nops = a->prog.nops;
    c->n = n; c->d = (i64)1 << n; c->B = B; c->W = W; c->P = P; c->K = K; c->nops = nops;
    c->nch = (B + W - 1) / W;
    i64 bpad = c->nch * W, d = c->d;
    c->bpad = bpad;
    c->gates = (gate_t *)malloc(sizeof(gate_t) * (size_t)(nops + 1));
    c->own_theta = !a->theta;
    c->theta = a->theta ? a->theta : (double *)malloc(sizeof(double) * (size_t)(bpad * P + 1));
    c->cshared = (char *)malloc((size_t)P + 1);
    c->umat = (double **)calloc((size_t)nops + 1, sizeof(double *));
    c->tab = (double *)malloc(sizeof(double) * (size_t)(d * K + 1));
    c->fperm = (i64 *)malloc(sizeof(i64) * (size_t)d);
    if (!c->gates || !c->theta || !c->cshared || !c->umat || !c->tab || !c->fperm)
        return QD_ENOMEM;
    /* the angles from the sources */
    i64 total = 0;
    for (int s = 0; s < a->nsrc; s++) total += a->src_len[s];
    for (i64 j = 0; j < P; j++) {
        int same = 1;
        if (a->cshared) {
            same = a->cshared[j] != 0;
        } else {
            for (i64 b = 1; b < B && same; b++)
                same = a->idx[b * P + j] == a->idx[j] &&
                       (!a->scale || (a->scale[b * P + j] == a->scale[j] &&
                                      a->offset[b * P + j] == a->offset[j]));
        }
        c->cshared[j] = (char)same;
    }
    if (!(a->theta && a->theta_ready))
        for (i64 j = 0; j < P; j++)
            for (i64 b = 0; b < B; b++) {
                if (b && c->cshared[j]) break;  /* one source element for every row: row 0 */
                i64 x = a->idx[b * P + j], s = 0;
                while (x >= a->src_len[s]) x -= a->src_len[s++];
                double v = a->src[s][x];
                if (a->scale) v = a->scale[b * P + j] * v + a->offset[b * P + j];
                if (!isfinite(v)) return QD_ENONFINITE;
                BTH(c, b, j) = v;
            }
    for (i64 b = B; b < bpad; b++)  /* padding lanes: a valid binding (cotangent zero) */
        for (i64 j = 0; j < P; j++)
            if (!c->cshared[j]) BTH(c, b, j) = BTH(c, 0, j);
    (void)total;
    /* gates */
    c->maxu = 8;
    for (i64 i = 0; i < nops; i++) {
        gate_t *g = &c->gates[i];
        decode(&a->prog.recs[i], a->prog.data, RSIZE, g);
        i64 us = g->usize * (1 + g->np);
        if (us > c->maxu) c->maxu = us;
        g->uniform = g->code ? 1 : g->stride == 0;
        for (int j = 0; j < g->np; j++)
            if (g->col[j] >= 0) g->uniform &= c->cshared[g->col[j]];
        if (g->kind == K_FLIP || g->kind == K_SWAP || !g->uniform) continue;
        double *u = (double *)malloc(sizeof(double) * (size_t)us);
        if (!u) return QD_ENOMEM;
        c->umat[i] = u;
        if (g->code) {
            double ang[3] = {0, 0, 0};
            for (int j = 0; j < g->np; j++)
                ang[j] = (g->col[j] >= 0 ? g->scale[j] * BTH(c, 0, g->col[j]) : 0.0) + g->shift[j];
            if (g->code == C_ROT) SFX(brot_eval)(ang, deriv, u);
            else {
                gate_eval(g, ang, u);
                for (int j = 0; j < g->np && deriv; j++) gate_deriv(g, ang, j, u + g->usize * (1 + j));
            }
        } else {
            const R *src = (const R *)g->data;
            for (i64 e = 0; e < g->usize; e++) u[e] = src[e];
        }
    }
    /* the product prefix: leading uncontrolled one-qubit gates */
    i64 pe = 0;
    while (pe < nops) {
        const gate_t *g = &c->gates[pe];
        if (g->k != 1 || g->cmask || !(g->kind == K_DENSE || g->kind == K_DIAG || g->kind == K_FLIP))
            break;
        pe++;
    }
    c->pe = pe;
    for (i64 i = 0; i < d; i++) c->fperm[i] = i;
    for (i64 i = pe; i < nops; i++)
        if (c->gates[i].kind == K_FLIP || c->gates[i].kind == K_SWAP)
            SFX(bperm)(c->fperm, d, &c->gates[i]);
    for (i64 i = 0; i < d; i++)
        for (i64 k = 0; k < K; k++)
            c->tab[i * K + k] = (__builtin_popcountll((unsigned long long)(i & a->words[k])) & 1)
                                    ? -a->coeffs[k] : a->coeffs[k];
    return QD_OK;
}

/* Per-lane matrices of gate i for the chunk's lanes (bindings b0 ..): U (and with deriv the
 * derivatives), element e of lane l at ml[e * W + l]. */
static void SFX(blane_mats)(const SFX(bctx_t) *c, i64 i, i64 b0, int deriv, R *ml) {
    const gate_t *g = &c->gates[i];
    i64 W = c->W, us = g->usize;
    double tmp[CODED_MAX_USIZE];
    if (g->code == C_RX || g->code == C_RY || g->code == C_RZ) {
        /* the Pauli rotations of gate_eval, U and dU/da = U(a + pi) / 2 from one sine and
         * cosine of the half angle */
        const int code = g->code;
        double half[QD_BATCH_MAXW], vcs[QD_BATCH_MAXW], vsn[QD_BATCH_MAXW];
        const i64 col = g->col[0];
        const i64 step = col >= 0 && !c->cshared[col] ? 1 : 0;
        const double *th = col >= 0 ? &BTH(c, step ? b0 : 0, col) : c->theta;
        LANES half[l] = 0.5 * ((col >= 0 ? g->scale[0] * th[l * step] : 0.0) + g->shift[0]);
        qd_vsincos(half, vsn, vcs, W);
        /* U from (cos, sin), then dU from (-sin / 2, cos / 2): one straight loop per matrix
         * and kind, so each vectorises over the lanes */
        for (int dv = 0; dv <= deriv; dv++) {
            const double fc = dv ? -0.5 : 1.0, fs = dv ? 0.5 : 1.0;
            const double *restrict ca = dv ? vsn : vcs, *restrict sa = dv ? vcs : vsn;
            R *restrict o = ml + (dv ? us : 0) * W;
            if (code == C_RZ) {
                LANES {
                    const double cc = fc * ca[l], ss = fs * sa[l];
                    o[l] = (R)cc; o[W + l] = (R)-ss; o[2 * W + l] = (R)cc; o[3 * W + l] = (R)ss;
                }
            } else if (code == C_RX) {
                LANES {
                    const double cc = fc * ca[l], ss = fs * sa[l];
                    o[l] = (R)cc; o[W + l] = 0; o[2 * W + l] = 0; o[3 * W + l] = (R)-ss;
                    o[4 * W + l] = 0; o[5 * W + l] = (R)-ss; o[6 * W + l] = (R)cc; o[7 * W + l] = 0;
                }
            } else {
                LANES {
                    const double cc = fc * ca[l], ss = fs * sa[l];
                    o[l] = (R)cc; o[W + l] = 0; o[2 * W + l] = (R)-ss; o[3 * W + l] = 0;
                    o[4 * W + l] = (R)ss; o[5 * W + l] = 0; o[6 * W + l] = (R)cc; o[7 * W + l] = 0;
                }
            }
        }
        return;
    }
    LANES {
        if (g->code) {
            double ang[3] = {0, 0, 0};
            for (int j = 0; j < g->np; j++) {
                const i64 col = g->col[j];
                ang[j] = (col >= 0 ? g->scale[j] * BTH(c, c->cshared[col] ? 0 : b0 + l, col)
                                   : 0.0) + g->shift[j];
            }
            gate_eval(g, ang, tmp);
            for (i64 e = 0; e < us; e++) ml[e * W + l] = (R)tmp[e];
            if (deriv)
                for (int j = 0; j < g->np; j++) {
                    gate_deriv(g, ang, j, tmp);
                    for (i64 e = 0; e < us; e++) ml[(us * (1 + j) + e) * W + l] = (R)tmp[e];
                }
        } else {
            i64 b = b0 + l < c->B ? b0 + l : 0;
            const R *src = SFX(data_of)(g, b);
            for (i64 e = 0; e < us; e++) ml[e * W + l] = src[e];
        }
    }
}

/* The matrices of gate i for the chunk as lane arrays (uniform gates broadcast). */
static void SFX(blane_all)(const SFX(bctx_t) *c, i64 i, i64 b0, int deriv, R *ml) {
    const gate_t *g = &c->gates[i];
    if (!c->umat[i]) {
        SFX(blane_mats)(c, i, b0, deriv, ml);
        return;
    }
    i64 W = c->W, cnt = g->usize * (deriv ? 1 + g->np : 1);
    for (i64 e = 0; e < cnt; e++)
        LANES ml[e * W + l] = (R)c->umat[i][e];
}

/* Lane matrices (count matrices of d x d complex, or diagonals) replaced by their adjoints. */
static void SFX(blane_dagger)(const gate_t *g, R *ml, i64 W) {
    int d = 1 << g->k;
    if (g->kind == K_DIAG) {
        for (int m = 0; m < d; m++)
            LANES ml[(2 * m + 1) * W + l] = -ml[(2 * m + 1) * W + l];
        return;
    }
    for (int r = 0; r < d; r++)
        for (int q = r; q < d; q++) {
            i64 x = r * d + q, y = q * d + r;
            LANES {
                R xr = ml[2 * x * W + l], xi = ml[(2 * x + 1) * W + l];
                R yr = ml[2 * y * W + l], yi = ml[(2 * y + 1) * W + l];
                ml[2 * x * W + l] = yr; ml[(2 * x + 1) * W + l] = -yi;
                ml[2 * y * W + l] = xr; ml[(2 * y + 1) * W + l] = -xi;
            }
        }
}

/* One-qubit dense matrix on the pair (x, y) of rows (W lanes each: re then im). */
#define B1Q_BODY(M)                                                                            \
    LANES {                                                              \
        R a0r = x[l], a0i = x[W + l], a1r = y[l], a1i = y[W + l];                              \
        x[l] = M(0) * a0r - M(1) * a0i + M(2) * a1r - M(3) * a1i;                              \
        x[W + l] = M(0) * a0i + M(1) * a0r + M(2) * a1i + M(3) * a1r;                          \
        y[l] = M(4) * a0r - M(5) * a0i + M(6) * a1r - M(7) * a1i;                              \
        y[W + l] = M(4) * a0i + M(5) * a0r + M(6) * a1i + M(7) * a1r;                          \
    }
#define BU(e) u##e
#define BL(e) ml[(e) * W + l]

/* Apply gate g (data: uniform matrix um, or lane matrices ml; already the adjoint when the
 * caller wants U^dag) to the chunk S with row table perm. */
static void SFX(bapply)(R *S, const i64 *perm, i64 d, i64 W, const gate_t *g, const R *um,
                        const R *ml, R *tmp) {
    const i64 rw = 2 * W;
    if (g->kind == K_DENSE && g->k == 1) {
        const i64 o1 = g->off[1];
        if (um) {
            const R u0 = um[0], u1 = um[1], u2 = um[2], u3 = um[3];
            const R u4 = um[4], u5 = um[5], u6 = um[6], u7 = um[7];
            for (i64 i = 0; i < d; i++) {
                if ((i & g->tmask) || (i & g->cmask) != g->cmask) continue;
                R *restrict x = S + rw * perm[i], *restrict y = S + rw * perm[i + o1];
                B1Q_BODY(BU)
            }
        } else {
            for (i64 i = 0; i < d; i++) {
                if ((i & g->tmask) || (i & g->cmask) != g->cmask) continue;
                R *restrict x = S + rw * perm[i], *restrict y = S + rw * perm[i + o1];
                B1Q_BODY(BL)
            }
        }
        return;
    }
    const int dk = 1 << g->k;
    if (g->kind == K_DIAG) {
        for (i64 i = 0; i < d; i++) {
            if ((i & g->cmask) != g->cmask) continue;
            int m = 0;
            for (int j = 0; j < g->k; j++) m = (m << 1) | (int)((i >> g->bits[j]) & 1);
            R *restrict x = S + rw * perm[i];
            if (um) {
                const R dr = um[2 * m], di = um[2 * m + 1];
                LANES {
                    R ar = x[l], ai = x[W + l];
                    x[l] = dr * ar - di * ai;
                    x[W + l] = dr * ai + di * ar;
                }
            } else {
                const R *restrict mr = ml + 2 * m * W, *restrict mi = mr + W;
                LANES {
                    R ar = x[l], ai = x[W + l];
                    x[l] = mr[l] * ar - mi[l] * ai;
                    x[W + l] = mr[l] * ai + mi[l] * ar;
                }
            }
        }
        return;
    }
    /* dense k >= 2: rows of a group into tmp, then the matrix rows back */
    for (i64 i = 0; i < d; i++) {
        if ((i & g->tmask) || (i & g->cmask) != g->cmask) continue;
        for (int m = 0; m < dk; m++) memcpy(tmp + rw * m, S + rw * perm[i + g->off[m]], sizeof(R) * (size_t)rw);
        for (int r = 0; r < dk; r++) {
            R *restrict y = S + rw * perm[i + g->off[r]];
            LANES { y[l] = 0; y[W + l] = 0; }
            for (int q = 0; q < dk; q++) {
                i64 e = r * dk + q;
                const R *restrict x = tmp + rw * q;
                if (um) {
                    const R mr = um[2 * e], mi = um[2 * e + 1];
                    if (mr == 0 && mi == 0) continue;
                    LANES {
                        y[l] += mr * x[l] - mi * x[W + l];
                        y[W + l] += mr * x[W + l] + mi * x[l];
                    }
                } else {
                    const R *restrict mr = ml + 2 * e * W, *restrict mi = mr + W;
                    LANES {
                        y[l] += mr[l] * x[l] - mi[l] * x[W + l];
                        y[W + l] += mr[l] * x[W + l] + mi[l] * x[l];
                    }
                }
            }
        }
    }
}

/* The adjoint of a uniform gate's matrix (R) into buf. */
static const R *SFX(bdag_uniform)(const gate_t *g, const double *u, R *buf) {
    int d = 1 << g->k;
    if (g->kind == K_DIAG) {
        for (int m = 0; m < d; m++) { buf[2 * m] = (R)u[2 * m]; buf[2 * m + 1] = (R)-u[2 * m + 1]; }
        return buf;
    }
    for (int r = 0; r < d; r++)
        for (int q = 0; q < d; q++) {
            buf[2 * (r * d + q)] = (R)u[2 * (q * d + r)];
            buf[2 * (r * d + q) + 1] = (R)-u[2 * (q * d + r) + 1];
        }
    return buf;
}

static const R *SFX(bto_r)(const double *u, i64 cnt, R *buf) {
    for (i64 e = 0; e < cnt; e++) buf[e] = (R)u[e];
    return buf;
}

/* A prefix gate's matrices for the chunk as lane arrays: element e of lane l at m[e * W + l]
 * (a batch-uniform matrix broadcast, so every lane loop over them vectorises). */
typedef struct { const R *m; } SFX(pmat_t);
#define PM(pm, e) ((pm).m[(e) * W + l])

/* Per-lane factor vectors of the product prefix: v[(p * 4 + e) * W + l] (e: re0 im0 re1 im1)
 * for bit p after the prefix gates (pm: their matrices). */
static void SFX(bprefix_vectors)(const SFX(bctx_t) *c, const SFX(pmat_t) *pm, double *v) {
    i64 W = c->W;
    for (int p = 0; p < c->n; p++)
        LANES {
            v[(p * 4 + 0) * W + l] = 1; v[(p * 4 + 1) * W + l] = 0;
            v[(p * 4 + 2) * W + l] = 0; v[(p * 4 + 3) * W + l] = 0;
        }
    for (i64 i = 0; i < c->pe; i++) {
        const gate_t *g = &c->gates[i];
        int p = g->bits[0];
        double *v0r = v + (p * 4) * W, *v0i = v0r + W, *v1r = v0i + W, *v1i = v1r + W;
        if (g->kind == K_FLIP) {
            LANES {
                double t = v0r[l]; v0r[l] = v1r[l]; v1r[l] = t;
                t = v0i[l]; v0i[l] = v1i[l]; v1i[l] = t;
            }
            continue;
        }
        const SFX(pmat_t) u = pm[i];
        if (g->kind == K_DIAG) {
            LANES {
                double a0r = v0r[l], a0i = v0i[l], a1r = v1r[l], a1i = v1i[l];
                v0r[l] = PM(u, 0) * a0r - PM(u, 1) * a0i; v0i[l] = PM(u, 0) * a0i + PM(u, 1) * a0r;
                v1r[l] = PM(u, 2) * a1r - PM(u, 3) * a1i; v1i[l] = PM(u, 2) * a1i + PM(u, 3) * a1r;
            }
        } else {
            LANES {
                double a0r = v0r[l], a0i = v0i[l], a1r = v1r[l], a1i = v1i[l];
                v0r[l] = PM(u, 0) * a0r - PM(u, 1) * a0i + PM(u, 2) * a1r - PM(u, 3) * a1i;
                v0i[l] = PM(u, 0) * a0i + PM(u, 1) * a0r + PM(u, 2) * a1i + PM(u, 3) * a1r;
                v1r[l] = PM(u, 4) * a0r - PM(u, 5) * a0i + PM(u, 6) * a1r - PM(u, 7) * a1i;
                v1i[l] = PM(u, 4) * a0i + PM(u, 5) * a0r + PM(u, 6) * a1i + PM(u, 7) * a1r;
            }
        }
    }
}

/* Rows 0 .. 2^len of the kron product (most significant first) of the factor vectors of the
 * bits in order[0..cnt) (descending), written into S (identity table). */
static void SFX(bkron)(R *S, i64 W, const double *v, const int *order, int cnt) {
    const i64 rw = 2 * W;
    LANES { S[l] = 1; S[W + l] = 0; }
    i64 len = 1;
    for (int q = 0; q < cnt; q++) {
        int p = order[q];
        const double *v0r = v + (p * 4) * W, *v0i = v0r + W, *v1r = v0i + W, *v1i = v1r + W;
        for (i64 j = len - 1; j >= 0; j--) {
            R *restrict x = S + rw * j, *restrict y0 = S + rw * 2 * j, *restrict y1 = y0 + rw;
            LANES {
                double xr = x[l], xi = x[W + l];
                y1[l] = (R)(xr * v1r[l] - xi * v1i[l]);
                y1[W + l] = (R)(xr * v1i[l] + xi * v1r[l]);
                y0[l] = (R)(xr * v0r[l] - xi * v0i[l]);
                y0[W + l] = (R)(xr * v0i[l] + xi * v0r[l]);
            }
        }
        len *= 2;
    }
}

/* Scratch per thread: two chunks (lam and a spare), lane matrices, factor vectors, sums; all
 * of it one block kept between calls (keep_get): a call reuses the previous one's memory
 * instead of a dozen mallocs and frees, so its addresses stay the same from call to call. */
typedef struct {
    R *lam, *ml, *tmp;
    double *v, *acc, *wchain;
    i64 *perm, *chain;
    R *pml;                 /* the prefix gates' lane matrices */
    SFX(pmat_t) *pm;
    double *tree, *envs;    /* single precision: benv's scratch; every wire's environment */
    double *rv, *rdv, *et, *ew, *renv, *dt;  /* the real form's factors, derivatives, rows,
                                                contractions, environments, two temporaries */
    R *mt;                  /* the real form's matrix Re(D^dag V^dag) (d rows of 2d) */
    double *vt;             /* the real form's V D (d rows of 2d: real parts, imaginary parts) */
    void *mem;              /* the block all of it lies in, and its size */
    size_t bytes;
} SFX(bscr_t);

#ifndef QD_BCARVE_DEFINED
#define QD_BCARVE_DEFINED
/* Carve n bytes, 64-byte aligned, from a block (base 0: only count). */
static void *bcarve(char *base, size_t *off, size_t n) {
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + (n ? n : 1);
    return base ? base + at : 0;
}

/* A kept block (keep_get) of bytes plus room to align its start to 64 bytes; *off: the
 * aligned start. */
static char *bblock(size_t bytes, size_t *alloc, size_t *off) {
    *alloc = bytes + 64;
    char *mem = (char *)keep_get(*alloc);
    *off = mem ? (size_t)((64 - ((uintptr_t)mem & 63)) & 63) : 0;
    return mem;
}

/* A kept block carved into cnt parts of sizes[k] bytes each (64-byte aligned): part[k] (all 0
 * when there is no memory). Returns the block, for keep_put(block, *alloc). */
static char *bparts(const size_t *sizes, int cnt, void **part, size_t *alloc) {
    size_t bytes = 0, off;
    for (int k = 0; k < cnt; k++) bcarve(0, &bytes, sizes[k]);
    char *mem = bblock(bytes, alloc, &off);
    for (int k = 0; k < cnt; k++) part[k] = mem ? bcarve(mem, &off, sizes[k]) : 0;
    return mem;
}
#endif

static void SFX(bscr_layout)(const SFX(bctx_t) *c, SFX(bscr_t) *s, char *base, size_t *off) {
    i64 W = c->W, d = c->d;
    s->lam = (R *)bcarve(base, off, sizeof(R) * (size_t)(2 * W * d));
    s->ml = (R *)bcarve(base, off, sizeof(R) * (size_t)(W * c->maxu * 2 + 8 * W));
    s->tmp = (R *)bcarve(base, off, sizeof(R) * (size_t)(2 * W * (1 << MAXK)));
    s->v = (double *)bcarve(base, off, sizeof(double) * (size_t)(4 * W * (c->n + 1)));
    s->acc = (double *)bcarve(base, off, sizeof(double) * (size_t)(W * (8 + c->K + 4 * (c->n + 1))));
    s->perm = (i64 *)bcarve(base, off, sizeof(i64) * (size_t)d);
    s->wchain = (double *)bcarve(base, off, sizeof(double) * (size_t)(4 * W * (c->pe + c->n + 2)));
    s->chain = (i64 *)bcarve(base, off, sizeof(i64) * (size_t)(c->pe + 1));
    s->pml = (R *)bcarve(base, off, sizeof(R) * (size_t)(c->pe * c->maxu * W + 1));
    s->pm = (SFX(pmat_t) *)bcarve(base, off, sizeof(SFX(pmat_t)) * (size_t)(c->pe + 1));
    /* benv's scratch: the spare chunk in double precision (d rows of 2W doubles), else this */
    const int tree = c->pe && sizeof(R) != sizeof(double);
    s->tree = tree ? (double *)bcarve(base, off, sizeof(double) * (size_t)(2 * W * d)) : 0;
    s->envs = c->pe ? (double *)bcarve(base, off, sizeof(double) * (size_t)(4 * W * c->n)) : 0;
    const int rf = c->rform;
    s->rv = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(2 * W * c->n)) : 0;
    s->rdv = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(4 * W * (3 * c->pe + 1))) : 0;
    s->et = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(d * W)) : 0;
    s->ew = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(d * W)) : 0;
    s->renv = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(2 * W * c->n)) : 0;
    s->dt = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(8 * W)) : 0;
    s->mt = rf ? (R *)bcarve(base, off, sizeof(R) * (size_t)(2 * d * d)) : 0;
    s->vt = rf ? (double *)bcarve(base, off, sizeof(double) * (size_t)(2 * d * d)) : 0;
}

static int SFX(bscr_alloc)(const SFX(bctx_t) *c, SFX(bscr_t) *s) {
    size_t bytes = 0, off;
    SFX(bscr_layout)(c, s, 0, &bytes);
    char *mem = bblock(bytes, &s->bytes, &off);
    s->mem = mem;
    if (!mem) return QD_ENOMEM;
    SFX(bscr_layout)(c, s, mem, &off);
    return QD_OK;
}

static void SFX(bscr_free)(SFX(bscr_t) *s) {
    keep_put(s->mem, s->bytes);
    s->mem = 0;
}

/* The prefix gates' matrices for the chunk at b0 (deriv: and the derivatives of trainable
 * ones) into s->pm. */
static void SFX(bprefix_mats)(const SFX(bctx_t) *c, i64 b0, int deriv, SFX(bscr_t) *s) {
    for (i64 t = 0; t < c->pe; t++) {
        const gate_t *g = &c->gates[t];
        SFX(pmat_t) *pm = &s->pm[t];
        if (g->kind == K_FLIP) { pm->m = 0; continue; }
        int dv = deriv && g->tmask_p;
        R *u = s->pml + t * c->maxu * c->W;
        if (c->umat[t]) {
            i64 W = c->W;
            for (i64 e = 0; e < g->usize * (dv ? 1 + g->np : 1); e++) {
                const R v = (R)c->umat[t][e];
                LANES u[e * W + l] = v;
            }
        } else {
            SFX(blane_mats)(c, t, b0, dv, u);
        }
        pm->m = u;
    }
}

/* The chunk's state after the program: the product prefix written, the other gates applied. */
static void SFX(bforward_chunk)(const SFX(bctx_t) *c, R *S, i64 b0, SFX(bscr_t) *s) {
    i64 d = c->d, W = c->W;
    int order[QD_MAXN];
    for (int q = 0; q < c->n; q++) order[q] = c->n - 1 - q;
    if (c->pe) {
        SFX(bprefix_mats)(c, b0, 0, s);
        SFX(bprefix_vectors)(c, s->pm, s->v);
        SFX(bkron)(S, W, s->v, order, c->n);
    } else {
        memset(S, 0, sizeof(R) * (size_t)(2 * W * d));
        LANES S[l] = 1;
    }
    for (i64 i = 0; i < d; i++) s->perm[i] = i;
    R ubuf[CODED_MAX_USIZE];
    for (i64 i = c->pe; i < c->nops; i++) {
        const gate_t *g = &c->gates[i];
        if (g->kind == K_FLIP || g->kind == K_SWAP) {
            SFX(bperm)(s->perm, d, g);
            continue;
        }
        if (c->umat[i]) {
            SFX(bapply)(S, s->perm, d, W, g, SFX(bto_r)(c->umat[i], g->usize, ubuf), 0, s->tmp);
        } else {
            SFX(blane_mats)(c, i, b0, 0, s->ml);
            SFX(bapply)(S, s->perm, d, W, g, 0, s->ml, s->tmp);
        }
    }
}

static void SFX(boutputs)(const SFX(bctx_t) *c, const R *S, i64 b0, double *out, double *acc) {
    i64 d = c->d, W = c->W, K = c->K, rw = 2 * W;
    for (i64 e = 0; e < K * W; e++) acc[e] = 0;
    for (i64 i = 0; i < d; i++) {
        const R *x = S + rw * c->fperm[i];
        for (i64 k = 0; k < K; k++) {
            const double t = c->tab[i * K + k];
            double *restrict o = acc + k * W;
            LANES o[l] += t * ((double)x[l] * x[l] + (double)x[W + l] * x[W + l]);
        }
    }
    for (i64 l = 0; l < W && b0 + l < c->B; l++)
        for (i64 k = 0; k < K; k++) out[(b0 + l) * K + k] = acc[k * W + l];
}

/* Add scale * 2 Re(val) for angle j of gate g to the chunk's gradient rows (gtheta: P x Bpad,
 * like theta): per lane, or (a batch-shared column) the lanes' sum into the chunk's first row.
 * vr: per-lane values. */
static void SFX(bgrad_add)(const SFX(bctx_t) *c, const gate_t *g, int j, i64 b0,
                           const double *vr, double *gtheta) {
    i64 W = c->W, col = g->col[j];
    double f = 2.0 * g->scale[j], *gc = gtheta + col * c->bpad + b0;
    if (c->cshared[col]) {
        double sum = 0;
        for (i64 l = 0; l < W && b0 + l < c->B; l++) sum += vr[l];
        gc[0] += f * sum;
        return;
    }
    for (i64 l = 0; l < W && b0 + l < c->B; l++) gc[l] += f * vr[l];
}

/* gm = a b for 2x2 complex a and b, all double. */
static void SFX(dmul2)(const double *a, const double *b, double *gm) {
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 2; q++) {
            double sr = 0, si = 0;
            for (int t = 0; t < 2; t++) {
                double ar = a[2 * (2 * r + t)], ai = a[2 * (2 * r + t) + 1];
                double br = b[2 * (2 * t + q)], bi = b[2 * (2 * t + q) + 1];
                sr += ar * br - ai * bi;
                si += ar * bi + ai * br;
            }
            gm[2 * (2 * r + q)] = sr;
            gm[2 * (2 * r + q) + 1] = si;
        }
}

/* gm = a b for 2x2 complex a (double) and b (R): b widened, then dmul2. */
static void SFX(bmul2)(const double *a, const R *b, double *gm) {
    double bd[8];
    for (int e = 0; e < 8; e++) bd[e] = (double)b[e];
    SFX(dmul2)(a, bd, gm);
}

/* Lanes are taken 8 at a time (a vector) with the 8 overlap sums in registers. */
#define BSTEP_HEAD(M)                                                                          \
        R a0r = x[q], a0i = x[W + q], a1r = y[q], a1i = y[W + q];                              \
        R l0r = lx[q], l0i = lx[W + q], l1r = ly[q], l1i = ly[W + q];                          \
        m0[q] += l0r * a0r + l0i * a0i; m1[q] += l0r * a0i - l0i * a0r;                        \
        m2[q] += l0r * a1r + l0i * a1i; m3[q] += l0r * a1i - l0i * a1r;                        \
        m4[q] += l1r * a0r + l1i * a0i; m5[q] += l1r * a0i - l1i * a0r;                        \
        m6[q] += l1r * a1r + l1i * a1i; m7[q] += l1r * a1i - l1i * a1r;                        \
        x[q] = M(0) * a0r - M(1) * a0i + M(2) * a1r - M(3) * a1i;                              \
        x[W + q] = M(0) * a0i + M(1) * a0r + M(2) * a1i + M(3) * a1r;                          \
        y[q] = M(4) * a0r - M(5) * a0i + M(6) * a1r - M(7) * a1i;                              \
        y[W + q] = M(4) * a0i + M(5) * a0r + M(6) * a1i + M(7) * a1r;
#define BSTEP_LAM(M)                                                                           \
        lx[q] = M(0) * l0r - M(1) * l0i + M(2) * l1r - M(3) * l1i;                             \
        lx[W + q] = M(0) * l0i + M(1) * l0r + M(2) * l1i + M(3) * l1r;                         \
        ly[q] = M(4) * l0r - M(5) * l0i + M(6) * l1r - M(7) * l1i;                             \
        ly[W + q] = M(4) * l0i + M(5) * l0r + M(6) * l1i + M(7) * l1r;
#define BSTEP_LOOP(M, LAM)                                                                     \
    for (i64 lb = 0; lb < W; lb += 8) {                                                        \
        double m0[8] = {0}, m1[8] = {0}, m2[8] = {0}, m3[8] = {0};                             \
        double m4[8] = {0}, m5[8] = {0}, m6[8] = {0}, m7[8] = {0};                             \
        for (i64 i = 0; i < d; i++) {                                                          \
            if ((i & g->tmask) || (i & g->cmask) != g->cmask) continue;                        \
            R *restrict x = S + rw * perm[i] + lb, *restrict y = S + rw * perm[i + o1] + lb;   \
            R *restrict lx = L + rw * perm[i] + lb, *restrict ly = L + rw * perm[i + o1] + lb; \
            _Pragma("GCC ivdep") for (int q = 0; q < 8; q++) {                                 \
                BSTEP_HEAD(M)                                                                  \
                LAM                                                                            \
            }                                                                                  \
        }                                                                                      \
        for (int q = 0; q < 8; q++) {                                                          \
            m[0 * W + lb + q] = m0[q]; m[1 * W + lb + q] = m1[q];                              \
            m[2 * W + lb + q] = m2[q]; m[3 * W + lb + q] = m3[q];                              \
            m[4 * W + lb + q] = m4[q]; m[5 * W + lb + q] = m5[q];                              \
            m[6 * W + lb + q] = m6[q]; m[7 * W + lb + q] = m7[q];                              \
        }                                                                                      \
    }
#define BLQ(e) ml[(e) * W + lb + q]

/* Adjoint step of an uncontrolled or controlled dense one-qubit gate: the overlaps M[r][q] =
 * sum conj(lam_r) psi_q on the values before the step (per lane), psi <- V psi and lam <- V
 * lam with V = U^dag (uniform: vu; else lane matrices ml), in one pass. W: a multiple of 8. */
static void SFX(bstep_1q)(const SFX(bctx_t) *c, const gate_t *g, R *S, R *L, const i64 *perm,
                          const R *vu, const R *ml, int do_lam, double *restrict m) {
    const i64 d = c->d, W = c->W, rw = 2 * W, o1 = g->off[1];
    if (vu) {
        const R u0 = vu[0], u1 = vu[1], u2 = vu[2], u3 = vu[3];
        const R u4 = vu[4], u5 = vu[5], u6 = vu[6], u7 = vu[7];
        if (do_lam) BSTEP_LOOP(BU, BSTEP_LAM(BU))
        else BSTEP_LOOP(BU, )
    } else {
        if (do_lam) BSTEP_LOOP(BLQ, BSTEP_LAM(BLQ))
        else BSTEP_LOOP(BLQ, )
    }
}

/* The gradient contributions of gate i at the chunk (psi already uncomputed through it:
 * <lam| dU_j |psi> per lane) for its trainable angles, any kind and width. */
static void SFX(boverlap_generic)(const SFX(bctx_t) *c, i64 i, const R *S, const R *L,
                                  const i64 *perm, const R *ml, R *tmp, double *vr, i64 b0,
                                  double *gtheta) {
    const gate_t *g = &c->gates[i];
    i64 d = c->d, W = c->W, rw = 2 * W;
    int dk = 1 << g->k;
    for (int j = 0; j < g->np; j++) {
        if (!((g->tmask_p >> j) & 1)) continue;
        const R *du = ml + g->usize * (1 + j) * W;  /* lane arrays of dU_j */
        LANES vr[l] = 0;
        for (i64 i0 = 0; i0 < d; i0++) {
            if ((i0 & g->cmask) != g->cmask) continue;
            if (g->kind == K_DIAG) {
                int mm = 0;
                for (int q = 0; q < g->k; q++) mm = (mm << 1) | (int)((i0 >> g->bits[q]) & 1);
                const R *x = S + rw * perm[i0], *lr = L + rw * perm[i0];
                const R *dr = du + 2 * mm * W, *di = dr + W;
                LANES {
                    R tr = dr[l] * x[l] - di[l] * x[W + l], ti = dr[l] * x[W + l] + di[l] * x[l];
                    vr[l] += (double)lr[l] * tr + (double)lr[W + l] * ti;
                }
                continue;
            }
            if (i0 & g->tmask) continue;
            for (int r = 0; r < dk; r++) {
                const R *lr = L + rw * perm[i0 + g->off[r]];
                LANES { tmp[l] = 0; tmp[W + l] = 0; }
                for (int q = 0; q < dk; q++) {
                    const R *x = S + rw * perm[i0 + g->off[q]];
                    const R *dr = du + 2 * (r * dk + q) * W, *di = dr + W;
                    LANES {
                        tmp[l] += dr[l] * x[l] - di[l] * x[W + l];
                        tmp[W + l] += dr[l] * x[W + l] + di[l] * x[l];
                    }
                }
                LANES vr[l] += (double)lr[l] * tmp[l] + (double)lr[W + l] * tmp[W + l];
            }
        }
        SFX(bgrad_add)(c, g, j, b0, vr, gtheta);
    }
}

/* T' = T (m bits, rows of 2W doubles) contracted over its bit at position k with the factor
 * vector fv (lanes f0r f0i f1r f1i): T'[j] = T[j with 0 at k] f0 + T[j with 1 at k] f1. */
static void SFX(bcontract)(const double *T, int m, int k, const double *fv, double *out, i64 W) {
    const i64 rw = 2 * W, half = (i64)1 << (m - 1), low = ((i64)1 << k) - 1;
    const double *f0r = fv, *f0i = fv + W, *f1r = fv + 2 * W, *f1i = fv + 3 * W;
    for (i64 j = 0; j < half; j++) {
        const i64 i0 = ((j >> k) << (k + 1)) | (j & low);
        const double *a = T + rw * i0, *b = a + rw * ((i64)1 << k);
        double *o = out + rw * j;
        LANES {
            const double ar = a[l], ai = a[W + l], br = b[l], bi = b[W + l];
            o[l] = ar * f0r[l] - ai * f0i[l] + br * f1r[l] - bi * f1i[l];
            o[W + l] = ar * f0i[l] + ai * f0r[l] + br * f1i[l] + bi * f1r[l];
        }
    }
}

/* The same from conj(lam) (lam: rows of 2W reals of the precision). */
static void SFX(bcontract_lam)(const R *T, int m, int k, const double *fv, double *out, i64 W) {
    const i64 rw = 2 * W, half = (i64)1 << (m - 1), low = ((i64)1 << k) - 1;
    const double *f0r = fv, *f0i = fv + W, *f1r = fv + 2 * W, *f1i = fv + 3 * W;
    for (i64 j = 0; j < half; j++) {
        const i64 i0 = ((j >> k) << (k + 1)) | (j & low);
        const R *a = T + rw * i0, *b = a + rw * ((i64)1 << k);
        double *o = out + rw * j;
        LANES {
            const double ar = a[l], ai = -(double)a[W + l], br = b[l], bi = -(double)b[W + l];
            o[l] = ar * f0r[l] - ai * f0i[l] + br * f1r[l] - bi * f1i[l];
            o[W + l] = ar * f0i[l] + ai * f0r[l] + br * f1i[l] + bi * f1r[l];
        }
    }
}

/* T' = T (m bits, rows of W doubles) contracted over its bit at position k with the real
 * factor fv (lanes f0 f1): T'[j] = T[j with 0 at k] f0 + T[j with 1 at k] f1. */
static void SFX(bcontract_real)(const double *T, int m, int k, const double *fv, double *out,
                                i64 W) {
    const i64 half = (i64)1 << (m - 1), low = ((i64)1 << k) - 1;
    const double *f0 = fv, *f1 = fv + W;
    for (i64 j = 0; j < half; j++) {
        const i64 i0 = ((j >> k) << (k + 1)) | (j & low);
        const double *a = T + W * i0, *b = a + W * ((i64)1 << k);
        double *o = out + W * j;
        LANES o[l] = a[l] * f0[l] + b[l] * f1[l];
    }
}

/* For every bit of T (m bits at positions 0 .. m-1, wires pos[0 .. m)), T contracted over all
 * its other bits with their factor vectors, into env + f * wire. Complex (real = 0): rows of
 * 2W doubles, factors and environments of f = 4W (e0r e0i e1r e1i), T is conj(lam) when lam
 * is given (the top level), else T (double); real: rows of W doubles, factors and
 * environments of f = 2W (e0 e1). Divide and conquer: each half of the bits is contracted
 * away once for the other half, about 2^(m+1) products per lane in all (one bkron and
 * contraction per wire would take m 2^m). bump: scratch of 2^m - 2 rows. */
static void SFX(benv)(const double *T, const R *lam, int m, const int *pos, const double *v,
                      double *bump, double *env, i64 W, int real) {
    const i64 rw = real ? W : 2 * W, f = 2 * rw;
    if (m == 1) {
        double *e = env + f * pos[0];
        if (!lam) {
            memcpy(e, T, sizeof(double) * (size_t)f);
            return;
        }
        for (i64 e2 = 0; e2 < 4 * W; e2 += 2 * W)
            LANES { e[e2 + l] = lam[e2 + l]; e[e2 + W + l] = -(double)lam[e2 + W + l]; }
        return;
    }
    const int h = m / 2;
    for (int side = 0; side < 2; side++) {  /* 0: keep positions [0, h); 1: keep [h, m) */
        const double *cur = T;
        double *b = bump;
        int mm = m;
        for (int t = 0; t < (side ? h : m - h); t++) {
            const int k = side ? 0 : mm - 1, wire = side ? pos[t] : pos[m - 1 - t];
            if (real) SFX(bcontract_real)(cur, mm, k, v + f * wire, b, W);
            else if (lam && t == 0) SFX(bcontract_lam)(lam, mm, k, v + f * wire, b, W);
            else SFX(bcontract)(cur, mm, k, v + f * wire, b, W);
            cur = b;
            b += rw << (mm - 1);
            mm--;
        }
        SFX(benv)(cur, 0, mm, side ? pos + h : pos, v, b, env, W, real);
    }
}

/* o = G a for prefix gate g (lane matrix u) on one wire's factor vectors (4W doubles: re0
 * im0 re1 im1 of every lane); o does not alias a. */
static void SFX(bvec_apply)(const gate_t *g, SFX(pmat_t) u, const double *a, double *o, i64 W) {
    const double *a0r = a, *a0i = a + W, *a1r = a + 2 * W, *a1i = a + 3 * W;
    double *w0r = o, *w0i = o + W, *w1r = o + 2 * W, *w1i = o + 3 * W;
    if (g->kind == K_FLIP) {
        LANES { w0r[l] = a1r[l]; w0i[l] = a1i[l]; w1r[l] = a0r[l]; w1i[l] = a0i[l]; }
    } else if (g->kind == K_DIAG) {
        LANES {
            w0r[l] = PM(u, 0) * a0r[l] - PM(u, 1) * a0i[l]; w0i[l] = PM(u, 0) * a0i[l] + PM(u, 1) * a0r[l];
            w1r[l] = PM(u, 2) * a1r[l] - PM(u, 3) * a1i[l]; w1i[l] = PM(u, 2) * a1i[l] + PM(u, 3) * a1r[l];
        }
    } else {
        LANES {
            w0r[l] = PM(u, 0) * a0r[l] - PM(u, 1) * a0i[l] + PM(u, 2) * a1r[l] - PM(u, 3) * a1i[l];
            w0i[l] = PM(u, 0) * a0i[l] + PM(u, 1) * a0r[l] + PM(u, 2) * a1i[l] + PM(u, 3) * a1r[l];
            w1r[l] = PM(u, 4) * a0r[l] - PM(u, 5) * a0i[l] + PM(u, 6) * a1r[l] - PM(u, 7) * a1i[l];
            w1i[l] = PM(u, 4) * a0i[l] + PM(u, 5) * a0r[l] + PM(u, 6) * a1i[l] + PM(u, 7) * a1r[l];
        }
    }
}

/* Every wire's forward chain through the prefix gates (s->pm): w_0 = |0>, then one factor
 * vector per gate on the wire, wire p's from s->wchain + 4W * wo[p] (wo[n]: the end); the last
 * one of each wire into s->v. */
static void SFX(bchains)(const SFX(bctx_t) *c, SFX(bscr_t) *s, i64 *wo) {
    const i64 W = c->W;
    i64 pos = 0;
    for (int p = 0; p < c->n; p++) {
        wo[p] = pos;
        double *ws = s->wchain + 4 * W * pos;
        LANES { ws[l] = 1; ws[W + l] = 0; ws[2 * W + l] = 0; ws[3 * W + l] = 0; }
        pos++;
        for (i64 t = 0; t < c->pe; t++) {
            const gate_t *h = &c->gates[t];
            if (h->bits[0] != p) continue;
            SFX(bvec_apply)(h, s->pm[t], s->wchain + 4 * W * (pos - 1), s->wchain + 4 * W * pos, W);
            pos++;
        }
        memcpy(s->v + 4 * W * p, s->wchain + 4 * W * (pos - 1), sizeof(double) * (size_t)(4 * W));
    }
    wo[c->n] = pos;
}

/* The prefix gates' gradients: lam (at the prefix's end, identity table) contracted with the
 * other wires' factors gives per wire p the 2-vector e_p[s] = sum conj(lam) ((x)_{p' != p}
 * v_p' (x) |s>); with the chain of prefix gates on p, w_q = G_q .. G_1 |0> (forward) and the
 * row vector e <- e G_q (backward), the gradient of angle j of G_q is 2 Re(e dG_qj w_{q-1}).
 * spare: a chunk of scratch (not L). */
static void SFX(bprefix_grads)(const SFX(bctx_t) *c, const R *L, R *spare, i64 b0,
                               SFX(bscr_t) *s, double *gtheta) {
    i64 W = c->W;
    int n = c->n;
    double *v = s->v, *vr = s->acc;
    SFX(bprefix_mats)(c, b0, 1, s);
    i64 wo[QD_MAXN + 1];
    SFX(bchains)(c, s, wo);
    int trained = 0;
    for (i64 i = 0; i < c->pe; i++) trained |= c->gates[i].tmask_p;
    if (trained) {  /* every wire's e_p: conj(lam) contracted with the other wires' factors */
        int wires[QD_MAXN];
        for (int p = 0; p < n; p++) wires[p] = p;  /* bit p of a row index: wire p's factor */
        SFX(benv)(0, L, n, wires, v, sizeof(R) == sizeof(double) ? (double *)spare : s->tree,
                  s->envs, W, 0);
    }
    for (int p = 0; p < n; p++) {
        int train = 0;
        for (i64 i = 0; i < c->pe; i++)
            if (c->gates[i].bits[0] == p) train |= c->gates[i].tmask_p;
        if (!train) continue;
        double *e0r = s->envs + 4 * W * p, *e0i = e0r + W, *e1r = e0i + W, *e1i = e1r + W;
        i64 q = wo[p + 1] - wo[p] - 1;  /* gates on p */
        for (i64 t = c->pe - 1; t >= 0 && q > 0; t--) {
            const gate_t *h = &c->gates[t];
            if (h->bits[0] != p) continue;
            q--;  /* w_q: the vector before gate t */
            if (h->kind == K_FLIP) {
                LANES {
                    double x = e0r[l]; e0r[l] = e1r[l]; e1r[l] = x;
                    x = e0i[l]; e0i[l] = e1i[l]; e1i[l] = x;
                }
                continue;
            }
            const double *a0r = s->wchain + 4 * W * (wo[p] + q), *a0i = a0r + W, *a1r = a0i + W,
                         *a1i = a1r + W;
            const SFX(pmat_t) u = s->pm[t];
            int diag = h->kind == K_DIAG;
            for (int j = 0; j < h->np; j++) {
                if (!((h->tmask_p >> j) & 1)) continue;
                SFX(pmat_t) du = u;
                du.m = u.m + h->usize * (1 + j) * W;
                if (diag) {
                    LANES {
                        double t0r = PM(du, 0) * a0r[l] - PM(du, 1) * a0i[l], t0i = PM(du, 0) * a0i[l] + PM(du, 1) * a0r[l];
                        double t1r = PM(du, 2) * a1r[l] - PM(du, 3) * a1i[l], t1i = PM(du, 2) * a1i[l] + PM(du, 3) * a1r[l];
                        vr[l] = e0r[l] * t0r - e0i[l] * t0i + e1r[l] * t1r - e1i[l] * t1i;
                    }
                } else {
                    LANES {
                        double t0r = PM(du, 0) * a0r[l] - PM(du, 1) * a0i[l] + PM(du, 2) * a1r[l] - PM(du, 3) * a1i[l];
                        double t0i = PM(du, 0) * a0i[l] + PM(du, 1) * a0r[l] + PM(du, 2) * a1i[l] + PM(du, 3) * a1r[l];
                        double t1r = PM(du, 4) * a0r[l] - PM(du, 5) * a0i[l] + PM(du, 6) * a1r[l] - PM(du, 7) * a1i[l];
                        double t1i = PM(du, 4) * a0i[l] + PM(du, 5) * a0r[l] + PM(du, 6) * a1i[l] + PM(du, 7) * a1r[l];
                        vr[l] = e0r[l] * t0r - e0i[l] * t0i + e1r[l] * t1r - e1i[l] * t1i;
                    }
                }
                SFX(bgrad_add)(c, h, j, b0, vr, gtheta);
            }
            if (diag) {  /* e <- e G */
                LANES {
                    double x0r = e0r[l], x0i = e0i[l], x1r = e1r[l], x1i = e1i[l];
                    e0r[l] = x0r * PM(u, 0) - x0i * PM(u, 1); e0i[l] = x0r * PM(u, 1) + x0i * PM(u, 0);
                    e1r[l] = x1r * PM(u, 2) - x1i * PM(u, 3); e1i[l] = x1r * PM(u, 3) + x1i * PM(u, 2);
                }
            } else {
                LANES {
                    double x0r = e0r[l], x0i = e0i[l], x1r = e1r[l], x1i = e1i[l];
                    e0r[l] = x0r * PM(u, 0) - x0i * PM(u, 1) + x1r * PM(u, 4) - x1i * PM(u, 5);
                    e0i[l] = x0r * PM(u, 1) + x0i * PM(u, 0) + x1r * PM(u, 5) + x1i * PM(u, 4);
                    e1r[l] = x0r * PM(u, 2) - x0i * PM(u, 3) + x1r * PM(u, 6) - x1i * PM(u, 7);
                    e1i[l] = x0r * PM(u, 3) + x0i * PM(u, 2) + x1r * PM(u, 7) + x1i * PM(u, 6);
                }
            }
        }
    }
}

/* The reverse sweep of a chunk (b0: its first binding) over gates nops-1 .. stop: psi <- U^dag
 * psi, the trainable angles' gradients, lam <- U^dag lam while a trainable gate lies before
 * (lo: the first one); s->perm holds the chunk's row table. */
static void SFX(bsweep)(const SFX(bctx_t) *cp, R *S, R *L, i64 b0, i64 lo, i64 stop,
                        SFX(bscr_t) *s, double *gtheta) {
    const SFX(bctx_t) c = *cp;
    const i64 d = c.d, W = c.W, K = c.K;
    R vbuf[CODED_MAX_USIZE];
    for (i64 i = c.nops - 1; i >= stop; i--) {
        const gate_t *g = &c.gates[i];
        int do_lam = i > lo;
        if (g->kind == K_FLIP || g->kind == K_SWAP) {
            SFX(bperm)(s->perm, d, g);
            continue;
        }
        if (g->tmask_p && g->kind == K_DENSE && g->k == 1) {
            const R *vu = 0;
            R *ml = s->ml;
            if (c.umat[i]) vu = SFX(bdag_uniform)(g, c.umat[i], vbuf);
            else SFX(blane_mats)(&c, i, b0, 1, ml);
            /* lane arrays of V = U^dag after the derivatives (per-lane gates) */
            R *vl = ml + W * g->usize * (1 + g->np);
            if (!vu) {
                memcpy(vl, ml, sizeof(R) * (size_t)(W * g->usize));
                SFX(blane_dagger)(g, vl, W);
            }
            double *m = s->acc;
            SFX(bstep_1q)(&c, g, S, L, s->perm, vu, vl, do_lam, m);
            /* grad_j = Re sum_rq (dU_j U^dag)[r][q] M[r][q] per lane */
            double *vr = s->acc + 8 * W + K * W;
            double ms[8];  /* the lanes' sums of M (once per gate, when a shared angle needs them) */
            int summed = 0;
            for (int j = 0; j < g->np; j++) {
                if (!((g->tmask_p >> j) & 1)) continue;
                if (vu && c.cshared[g->col[j]]) {  /* one matrix, one column: lane sums */
                    double gm[8], acc = 0;
                    if (!summed) {
                        for (int e = 0; e < 8; e++) {
                            double t = 0;
                            LANES t += m[e * W + l];
                            ms[e] = t;
                        }
                        summed = 1;
                    }
                    SFX(bmul2)(c.umat[i] + 8 * (1 + j), vbuf, gm);
                    for (int e = 0; e < 4; e++) acc += gm[2 * e] * ms[2 * e] - gm[2 * e + 1] * ms[2 * e + 1];
                    gtheta[g->col[j] * c.bpad + b0] += 2.0 * g->scale[j] * acc;
                    continue;
                }
                LANES {
                    double du[8], uu[8], gm[8];
                    for (int e = 0; e < 8; e++) {
                        du[e] = vu ? c.umat[i][8 * (1 + j) + e] : ml[(8 * (1 + j) + e) * W + l];
                        uu[e] = vu ? vbuf[e] : vl[e * W + l];  /* U^dag */
                    }
                    SFX(dmul2)(du, uu, gm);
                    double acc = 0;
                    for (int e = 0; e < 4; e++)
                        acc += gm[2 * e] * m[(2 * e) * W + l] - gm[2 * e + 1] * m[(2 * e + 1) * W + l];
                    vr[l] = acc;
                }
                SFX(bgrad_add)(&c, g, j, b0, vr, gtheta);
            }
            continue;
        }
        /* any other gate: psi <- U^dag psi, overlaps, lam <- U^dag lam */
        R *ml = s->ml;
        SFX(blane_all)(&c, i, b0, g->tmask_p != 0, ml);
        R *vl = ml + W * g->usize * (1 + g->np);
        memcpy(vl, ml, sizeof(R) * (size_t)(W * g->usize));
        SFX(blane_dagger)(g, vl, W);
        SFX(bapply)(S, s->perm, d, W, g, 0, vl, s->tmp);
        if (g->tmask_p)
            SFX(boverlap_generic)(&c, i, S, L, s->perm, ml, s->tmp,
                                  s->acc + 8 * W + K * W, b0, gtheta);
        if (do_lam) SFX(bapply)(L, s->perm, d, W, g, 0, vl, s->tmp);
    }
}

/* lam = (sum_k cot[b, k] Z_k) psi for the chunk at b0 (rows of the final row table; padding
 * lanes zero); cot: K x W scratch. */
static void SFX(blam)(const SFX(bctx_t) *c, const R *S, R *L, i64 b0, const double *acot,
                      double *cot) {
    const i64 d = c->d, W = c->W, rw = 2 * W, K = c->K;
    for (i64 k = 0; k < K; k++)
        LANES cot[k * W + l] = b0 + l < c->B ? acot[(b0 + l) * K + k] : 0.0;
    for (i64 i = 0; i < d; i++) {
        i64 r = c->fperm[i];
        const R *x = S + rw * r;
        R *y = L + rw * r;
        double dg[QD_BATCH_MAXW];
        LANES dg[l] = 0;
        for (i64 k = 0; k < K; k++) {
            const double t = c->tab[i * K + k], *ck = cot + k * W;
            LANES dg[l] += t * ck[l];
        }
        LANES {
            y[l] = (R)(dg[l] * x[l]);
            y[W + l] = (R)(dg[l] * x[W + l]);
        }
    }
}

/* 8 lanes as one vector (GCC vector extension: unaligned, aliasing its element type). */
typedef R SFX(v8) __attribute__((vector_size(8 * sizeof(R)), aligned(sizeof(R)), may_alias));
typedef double SFX(v8d) __attribute__((vector_size(64), aligned(8), may_alias));
#define V8(p) (*(const SFX(v8) *)(p))

/* rho[r][q] += sum over the chunk's lanes of psi_r conj(lam_q) (logical indices; d even):
 * 2 x 2 blocks of (r, q), 8 lanes at a time with the sums in vector registers. */
static void SFX(brho_add)(const SFX(bctx_t) *c, const R *S, const R *L, double *rho) {
    const i64 d = c->d, W = c->W, rw = 2 * W;
    for (i64 r = 0; r < d; r += 2)
        for (i64 q = 0; q < d; q += 2) {
            const R *x0 = S + rw * c->fperm[r], *x1 = S + rw * c->fperm[r + 1];
            const R *y0 = L + rw * c->fperm[q], *y1 = L + rw * c->fperm[q + 1];
            SFX(v8d) s00r = {0}, s00i = {0}, s01r = {0}, s01i = {0};
            SFX(v8d) s10r = {0}, s10i = {0}, s11r = {0}, s11i = {0};
            for (i64 lb = 0; lb < W; lb += 8) {
                SFX(v8d) ar, ai, br, bi, pr, pi, qr, qi;
                for (int u = 0; u < 8; u++) {  /* widened (a no-op in double precision) */
                    ar[u] = x0[lb + u]; ai[u] = x0[W + lb + u]; br[u] = x1[lb + u]; bi[u] = x1[W + lb + u];
                    pr[u] = y0[lb + u]; pi[u] = y0[W + lb + u]; qr[u] = y1[lb + u]; qi[u] = y1[W + lb + u];
                }
                s00r += ar * pr + ai * pi; s00i += ai * pr - ar * pi;
                s01r += ar * qr + ai * qi; s01i += ai * qr - ar * qi;
                s10r += br * pr + bi * pi; s10i += bi * pr - br * pi;
                s11r += br * qr + bi * qi; s11i += bi * qr - br * qi;
            }
            double t[8] = {0};
            for (int u = 0; u < 8; u++) {
                t[0] += s00r[u]; t[1] += s00i[u]; t[2] += s01r[u]; t[3] += s01i[u];
                t[4] += s10r[u]; t[5] += s10i[u]; t[6] += s11r[u]; t[7] += s11i[u];
            }
            double *o0 = rho + 2 * (r * d + q), *o1 = o0 + 2 * d;
            o0[0] += t[0]; o0[1] += t[1]; o0[2] += t[2]; o0[3] += t[3];
            o1[0] += t[4]; o1[1] += t[5]; o1[2] += t[6]; o1[3] += t[7];
        }
}

/* mu_r = sum_q V[r][q] lam_q for the chunk (lam in the final row table, mu in logical rows;
 * V[r][q] at v[2 * wv * r + q] (re) and v[2 * wv * r + wv + q] (im); d even): two rows at a
 * time, 8 lanes at a time with the sums in vector registers. */
static void SFX(bmu)(const SFX(bctx_t) *c, const R *v, i64 wv, const R *L, R *M) {
    const i64 d = c->d, W = c->W, rw = 2 * W;
    for (i64 r = 0; r < d; r += 2) {
        const R *v0 = v + 2 * wv * r, *v1 = v0 + 2 * wv;
        for (i64 lb = 0; lb < W; lb += 8) {
            SFX(v8) m0r = {0}, m0i = {0}, m1r = {0}, m1i = {0};
            for (i64 q = 0; q < d; q++) {
                const R *lq = L + rw * c->fperm[q] + lb;
                const SFX(v8) lr = V8(lq), li = V8(lq + W);
                const R ar = v0[q], ai = v0[wv + q], br = v1[q], bi = v1[wv + q];
                m0r += ar * lr - ai * li; m0i += ar * li + ai * lr;
                m1r += br * lr - bi * li; m1i += br * li + bi * lr;
            }
            R *o0 = M + rw * r + lb, *o1 = o0 + rw;
            for (int u = 0; u < 8; u++) {
                o0[u] = m0r[u]; o0[W + u] = m0i[u]; o1[u] = m1r[u]; o1[W + u] = m1i[u];
            }
        }
    }
}

/* The real form of the dense gradient. When each of a chunk's wire factors after the
 * per-binding prefix gates (and its derivative in each trained angle) has each of its two
 * components real on every lane, or imaginary on every lane (angle embeddings by RX or RY, bit
 * flips), every binding's start state is e_b = D e~_b with e~_b real and D a fixed diagonal of
 * powers of i. The chunk's share of rho then enters as E = sum_b e_b lam_b^dag at the start of
 * the body (V E at its end): D times a real-by-complex sum, half the multiply-adds of
 * psi lam^dag; and the prefix gradients 2 Re <mu_b | d e_b> read only Re(D^dag mu_b), a real
 * matrix Re(D^dag V^dag) times lam (half of V^dag lam's), contracted with real factors. */

/* Bits 0 and 1 of the phase mask of a component: (any real part nonzero, any imaginary part
 * nonzero) over the lanes of a factor vector's component s (4W doubles). */
static int SFX(bparts_nz)(const double *a, int s, i64 W) {
    const double *re = a + 2 * s * W, *im = re + W;
    int nr = 0, ni = 0;
    LANES { nr |= re[l] != 0; ni |= im[l] != 0; }
    return nr | ni << 1;
}

/* The chunk's real factors (chains built, s->pm with the trained prefix angles' derivatives
 * when deriv): per wire p, ph[p] has bit s set when component s is imaginary; the real factors
 * into s->rv (2W per wire: component 0, then 1), the derivatives' in each trained prefix angle
 * into s->rdv (2W each, wires in order, then gates and angles in order). 0 when a component
 * is neither real nor imaginary on all lanes. */
static int SFX(breal_factors)(const SFX(bctx_t) *c, SFX(bscr_t) *s, const i64 *wo, int deriv,
                              int *ph) {
    const i64 W = c->W;
    i64 k = 0;
    double *t0 = s->dt, *t1 = s->dt + 4 * W;
    for (int p = 0; p < c->n; p++) {
        const double *v = s->v + 4 * W * p;
        int nz[2] = {SFX(bparts_nz)(v, 0, W), SFX(bparts_nz)(v, 1, W)};
        i64 k0 = k, q = 0;
        for (i64 t = 0; t < c->pe && deriv; t++) {
            const gate_t *h = &c->gates[t];
            if (h->bits[0] != p) continue;
            q++;  /* w_q: the vector after gate t */
            for (int j = 0; j < h->np; j++) {
                if (!((h->tmask_p >> j) & 1)) continue;
                SFX(pmat_t) du = s->pm[t];
                du.m += h->usize * (1 + j) * W;
                /* d w / d angle = G_last .. G_{t+1} dG_t w_{q-1} */
                SFX(bvec_apply)(h, du, s->wchain + 4 * W * (wo[p] + q - 1), t0, W);
                for (i64 u = t + 1; u < c->pe; u++) {
                    const gate_t *h2 = &c->gates[u];
                    if (h2->bits[0] != p) continue;
                    SFX(bvec_apply)(h2, s->pm[u], t0, t1, W);
                    double *x = t0; t0 = t1; t1 = x;
                }
                memcpy(s->rdv + 4 * W * k++, t0, sizeof(double) * (size_t)(4 * W));
                nz[0] |= SFX(bparts_nz)(t0, 0, W);
                nz[1] |= SFX(bparts_nz)(t0, 1, W);
            }
        }
        if (nz[0] == 3 || nz[1] == 3) return 0;
        ph[p] = (nz[0] >> 1) | (nz[1] >> 1) << 1;
        for (int cs = 0; cs < 2; cs++)  /* the real part, or the imaginary one */
            memcpy(s->rv + 2 * W * p + cs * W, v + 2 * cs * W + ((ph[p] >> cs) & 1) * W,
                   sizeof(double) * (size_t)W);
        for (i64 e = k0; e < k; e++)  /* in place, in order: 4W per angle into 2W per angle */
            for (int cs = 0; cs < 2; cs++)
                memmove(s->rdv + 2 * W * e + cs * W,
                        s->rdv + 4 * W * e + 2 * cs * W + ((ph[p] >> cs) & 1) * W,
                        sizeof(double) * (size_t)W);
    }
    return 1;
}

/* e~ (d rows of W doubles, identity table): row x = prod_p rv_p[bit p of x]. */
static void SFX(breal_kron)(const double *rv, int n, i64 W, double *et) {
    LANES et[l] = 1;
    i64 len = 1;
    for (int p = n - 1; p >= 0; p--) {
        const double *f0 = rv + 2 * W * p, *f1 = f0 + W;
        for (i64 j = len - 1; j >= 0; j--) {
            const double *x = et + W * j;
            double *y0 = et + W * 2 * j, *y1 = y0 + W;
            LANES { const double a = x[l]; y1[l] = a * f1[l]; y0[l] = a * f0[l]; }
        }
        len *= 2;
    }
}

#ifndef QD_IPOW_DEFINED
#define QD_IPOW_DEFINED
/* (re + i im) i^m into o[0] (real part) and o[1] (imaginary part), m in 0..3. */
static inline void qd_ipow(int m, double re, double im, double *o) {
    o[0] = m == 0 ? re : m == 1 ? -im : m == 2 ? -re : im;
    o[1] = m == 0 ? im : m == 1 ? re : m == 2 ? -im : -re;
}
#endif

/* E[x][q] += D[x] sum over the chunk's lanes of e~_x conj(lam_q) (E: d x d real parts, then
 * d x d imaginary parts; dm[x]: D[x] = i^dm[x]; lam in the final row table; d a multiple of
 * 4): 4 x 2 blocks of (x, q), 8 lanes at a time with the sums in vector registers. */
#define BRR_ACC(z) SFX(v8d) z##0r = {0}, z##0i = {0}, z##1r = {0}, z##1i = {0};
#define BRR_FMA(z, e) z##0r += e * pr; z##0i -= e * pi; z##1r += e * qr; z##1i -= e * qi;
static void SFX(brho_real)(const SFX(bctx_t) *c, const double *et, const R *L, const int *dm,
                           double *E) {
    const i64 d = c->d, W = c->W, rw = 2 * W;
    for (i64 x = 0; x < d; x += 4)
        for (i64 q = 0; q < d; q += 2) {
            const double *e0 = et + W * x, *e1 = e0 + W, *e2 = e1 + W, *e3 = e2 + W;
            const R *y0 = L + rw * c->fperm[q], *y1 = L + rw * c->fperm[q + 1];
            BRR_ACC(a) BRR_ACC(b) BRR_ACC(f) BRR_ACC(g)
            for (i64 lb = 0; lb < W; lb += 8) {
                SFX(v8d) pr, pi, qr, qi;
                for (int u = 0; u < 8; u++) {  /* widened (a no-op in double precision) */
                    pr[u] = y0[lb + u]; pi[u] = y0[W + lb + u]; qr[u] = y1[lb + u]; qi[u] = y1[W + lb + u];
                }
                const SFX(v8d) ea = *(const SFX(v8d) *)(e0 + lb), eb = *(const SFX(v8d) *)(e1 + lb);
                const SFX(v8d) ef = *(const SFX(v8d) *)(e2 + lb), eg = *(const SFX(v8d) *)(e3 + lb);
                BRR_FMA(a, ea) BRR_FMA(b, eb) BRR_FMA(f, ef) BRR_FMA(g, eg)
            }
            SFX(v8d) sums[16] = {a0r, a0i, a1r, a1i, b0r, b0i, b1r, b1i,
                                 f0r, f0i, f1r, f1i, g0r, g0i, g1r, g1i};
            for (int r = 0; r < 4; r++)
                for (int h = 0; h < 2; h++) {
                    double sr = 0, si = 0;
                    for (int u = 0; u < 8; u++) { sr += sums[4 * r + 2 * h][u]; si += sums[4 * r + 2 * h + 1][u]; }
                    double t[2];
                    qd_ipow(dm[x + r], sr, si, t);
                    E[(x + r) * d + q + h] += t[0];
                    E[d * d + (x + r) * d + q + h] += t[1];
                }
        }
}
#undef BRR_ACC
#undef BRR_FMA

/* mu~_x = sum_r mt[x][r] Re lam_r + mt[x][d + r] Im lam_r into et (d rows of W doubles; lam
 * in the final row table; d a multiple of 4): four rows at a time, 8 lanes at a time with the
 * sums in vector registers. */
static void SFX(bmu_real)(const SFX(bctx_t) *c, const R *mt, const R *L, double *et) {
    const i64 d = c->d, W = c->W, rw = 2 * W;
    for (i64 x = 0; x < d; x += 4) {
        const R *a0 = mt + 2 * d * x, *a1 = a0 + 2 * d, *a2 = a1 + 2 * d, *a3 = a2 + 2 * d;
        for (i64 lb = 0; lb < W; lb += 8) {
            SFX(v8) m0 = {0}, m1 = {0}, m2 = {0}, m3 = {0};
            for (i64 r = 0; r < d; r++) {
                const R *lq = L + rw * c->fperm[r] + lb;
                const SFX(v8) lr = V8(lq), li = V8(lq + W);
                m0 += a0[r] * lr; m0 += a0[d + r] * li;
                m1 += a1[r] * lr; m1 += a1[d + r] * li;
                m2 += a2[r] * lr; m2 += a2[d + r] * li;
                m3 += a3[r] * lr; m3 += a3[d + r] * li;
            }
            double *o = et + W * x + lb;
            for (int u = 0; u < 8; u++) {
                o[u] = m0[u]; o[W + u] = m1[u]; o[2 * W + u] = m2[u]; o[3 * W + u] = m3[u];
            }
        }
    }
}

/* The real form's prefix gradients of the chunk (breal_factors done; mu~ in s->et): every
 * wire's environment env_p[s] = mu~ contracted over the other bits with their real factors,
 * then for each trained angle 2 Re sum_s env_p[s] de~_p[s] (bgrad_add's factor 2). */
static void SFX(breal_grads)(const SFX(bctx_t) *c, SFX(bscr_t) *s, i64 b0, double *gtheta) {
    const i64 W = c->W;
    const int n = c->n;
    double *vr = s->acc;
    int wires[QD_MAXN];
    for (int p = 0; p < n; p++) wires[p] = p;  /* bit p of a row index: wire p's factor */
    SFX(benv)(s->et, 0, n, wires, s->rv, s->ew, s->renv, W, 1);
    i64 k = 0;
    for (int p = 0; p < n; p++) {
        const double *e0 = s->renv + 2 * W * p, *e1 = e0 + W;
        for (i64 t = 0; t < c->pe; t++) {
            const gate_t *h = &c->gates[t];
            if (h->bits[0] != p) continue;
            for (int j = 0; j < h->np; j++) {
                if (!((h->tmask_p >> j) & 1)) continue;
                const double *g0 = s->rdv + 2 * W * k, *g1 = g0 + W;
                k++;
                LANES vr[l] = e0[l] * g0[l] + e1[l] * g1[l];
                SFX(bgrad_add)(c, h, j, b0, vr, gtheta);
            }
        }
    }
}

/* The body's unitary V (gates pg .. nops-1, batch-uniform) over d lanes from the identity
 * (lane x: V e_x) in vb (2 wd x d of R, rows in the table perm), then into vl (d x d real
 * parts, then imaginary parts; row r, column x). */
static void SFX(bvbody)(const SFX(bctx_t) *c, i64 pg, i64 wd, R *vb, i64 *perm, R *tmp,
                        double *vl) {
    const i64 d = c->d;
    memset(vb, 0, sizeof(R) * (size_t)(2 * wd * d));
    for (i64 r = 0; r < d; r++) { vb[2 * wd * r + r] = 1; perm[r] = r; }
    R ubuf[CODED_MAX_USIZE];
    for (i64 i = pg; i < c->nops; i++) {
        const gate_t *g = &c->gates[i];
        if (g->kind == K_FLIP || g->kind == K_SWAP) { SFX(bperm)(perm, d, g); continue; }
        SFX(bapply)(vb, perm, d, wd, g, SFX(bto_r)(c->umat[i], g->usize, ubuf), 0, tmp);
    }
    for (i64 r = 0; r < d; r++) {
        const R *row = vb + 2 * wd * perm[r];
        for (i64 x = 0; x < d; x++) { vl[r * d + x] = row[x]; vl[d * d + r * d + x] = row[wd + x]; }
    }
}

/* mt = Re(D^dag V^dag) for D[x] = i^dm[x]: row x holds the coefficients of Re lam_r (first d)
 * and Im lam_r (next d) in Re(conj(D[x]) sum_r conj(V[r][x]) lam_r), i.e. the real and
 * imaginary parts of (V D)[r][x]. */
static void SFX(breal_mt)(const double *vl, i64 d, const int *dm, R *mt) {
    for (i64 x = 0; x < d; x++) {
        R *a = mt + 2 * d * x, *b = a + d;
        for (i64 r = 0; r < d; r++) {
            double t[2];
            qd_ipow(dm[x], vl[r * d + x], vl[d * d + r * d + x], t);
            a[r] = (R)t[0];
            b[r] = (R)t[1];
        }
    }
}

/* D[x] = i^dm[x] from the wires' phase masks (breal_factors). */
static void SFX(bphases)(const SFX(bctx_t) *c, const int *ph, int *dm) {
    for (i64 x = 0; x < c->d; x++) {
        int m = 0;
        for (int p = 0; p < c->n; p++) m += (ph[p] >> ((x >> p) & 1)) & 1;
        dm[x] = m & 3;
    }
}

/* The real form of a dense chunk (lam in L): its share of E, and (ptrain) its prefix
 * gradients. 0 (nothing done) when its factors are not real up to D. cg: the context with
 * the per-binding prefix (pe = pg). */
static int SFX(breal_chunk)(const SFX(bctx_t) *cg, const SFX(bctx_t) *c, const R *L, i64 b0,
                            int ptrain, const double *vl, SFX(bscr_t) *s, double *E,
                            double *gtheta) {
    i64 wo[QD_MAXN + 1];
    int ph[QD_MAXN], dm[QD_BATCH_MAXW];
    SFX(bprefix_mats)(cg, b0, ptrain, s);
    SFX(bchains)(cg, s, wo);
    if (!SFX(breal_factors)(cg, s, wo, ptrain, ph)) return 0;
    SFX(bphases)(c, ph, dm);
    SFX(breal_kron)(s->rv, c->n, c->W, s->et);
    SFX(brho_real)(c, s->et, L, dm, E);
    if (ptrain) {
        SFX(breal_mt)(vl, c->d, dm, s->mt);
        SFX(bmu_real)(c, s->mt, L, s->et);
        SFX(breal_grads)(cg, s, b0, gtheta);
    }
    return 1;
}

/* The dense form (every gate after the product prefix batch-uniform, a batch of at least four
 * times the register, d lanes within a chunk, at least d/2 gates after the prefix): 1, with
 * *pg the first of the prefix's trailing batch-uniform gates (they join the body V). */
static int SFX(bdense)(const SFX(bctx_t) *c, i64 *pg) {
    const i64 wd = (c->d + 7) / 8 * 8;
    i64 nd = 0;
    *pg = c->pe;
    if (c->d < 2 || c->B < 4 * c->d || wd > c->W) return 0;
    for (i64 i = c->pe; i < c->nops; i++) {
        const gate_t *g = &c->gates[i];
        if (g->kind == K_FLIP || g->kind == K_SWAP) continue;
        if (!c->umat[i]) return 0;
        nd++;
    }
    if (2 * nd < c->d) return 0;
    while (*pg > 0 && c->umat[*pg - 1]) (*pg)--;
    return 1;
}

/* psi_r = sum_x vt[r][x] e~_x (vt: d rows of d real parts, then d imaginary parts; d a
 * multiple of 4) into S in the final row table: four rows at a time, 8 lanes at a time with
 * the sums in vector registers. */
static void SFX(bpsi_real)(const SFX(bctx_t) *c, const double *vt, const double *et, R *S) {
    const i64 d = c->d, W = c->W, rw = 2 * W;
    for (i64 r = 0; r < d; r += 4) {
        const double *a0 = vt + 2 * d * r, *a1 = a0 + 2 * d, *a2 = a1 + 2 * d, *a3 = a2 + 2 * d;
        R *o0 = S + rw * c->fperm[r], *o1 = S + rw * c->fperm[r + 1];
        R *o2 = S + rw * c->fperm[r + 2], *o3 = S + rw * c->fperm[r + 3];
        for (i64 lb = 0; lb < W; lb += 8) {
            SFX(v8d) p0r = {0}, p0i = {0}, p1r = {0}, p1i = {0};
            SFX(v8d) p2r = {0}, p2i = {0}, p3r = {0}, p3i = {0};
            for (i64 x = 0; x < d; x++) {
                const SFX(v8d) e = *(const SFX(v8d) *)(et + W * x + lb);
                p0r += a0[x] * e; p0i += a0[d + x] * e;
                p1r += a1[x] * e; p1i += a1[d + x] * e;
                p2r += a2[x] * e; p2i += a2[d + x] * e;
                p3r += a3[x] * e; p3i += a3[d + x] * e;
            }
            for (int u = 0; u < 8; u++) {
                o0[lb + u] = (R)p0r[u]; o0[W + lb + u] = (R)p0i[u];
                o1[lb + u] = (R)p1r[u]; o1[W + lb + u] = (R)p1i[u];
                o2[lb + u] = (R)p2r[u]; o2[W + lb + u] = (R)p2i[u];
                o3[lb + u] = (R)p3r[u]; o3[W + lb + u] = (R)p3i[u];
            }
        }
    }
}

/* The real form of a dense chunk's forward: psi_b = (V D) e~_b, one real-by-complex product
 * per binding in place of the body's gates. 0 (nothing written) when its factors are not real
 * up to D. cg: the context with the per-binding prefix (pe = pg); vl: V (bvbody). */
static int SFX(breal_forward)(const SFX(bctx_t) *cg, const SFX(bctx_t) *c, R *S, i64 b0,
                              const double *vl, SFX(bscr_t) *s) {
    i64 wo[QD_MAXN + 1];
    int ph[QD_MAXN], dm[QD_BATCH_MAXW];
    const i64 d = c->d, dd = d * d;
    SFX(bprefix_mats)(cg, b0, 0, s);
    SFX(bchains)(cg, s, wo);
    if (!SFX(breal_factors)(cg, s, wo, 0, ph)) return 0;
    SFX(bphases)(c, ph, dm);
    for (i64 r = 0; r < d; r++)
        for (i64 x = 0; x < d; x++) {  /* V[r][x] i^dm[x] */
            double t[2];
            qd_ipow(dm[x], vl[r * d + x], vl[dd + r * d + x], t);
            s->vt[2 * d * r + x] = t[0];
            s->vt[2 * d * r + d + x] = t[1];
        }
    SFX(breal_kron)(s->rv, c->n, c->W, s->et);
    SFX(bpsi_real)(c, s->vt, s->et, S);
    return 1;
}

static int SFX(batch_run)(qd_batch_args *a) {
    SFX(bctx_t) c;
    int rc = SFX(bctx_init)(&c, a, 0);
    if (rc) { SFX(bctx_free)(&c); return rc; }
    int nt = a->nthreads > 1 && c.nch > 1 ? a->nthreads : 1;
    if (nt > c.nch) nt = (int)c.nch;
    i64 pg;
    c.rform = SFX(bdense)(&c, &pg) && c.d >= 4;  /* the real form's chunks (breal_forward) */
    const i64 wd = (c.d + 7) / 8 * 8;
    SFX(bscr_t) *scr = (SFX(bscr_t) *)calloc((size_t)nt, sizeof(SFX(bscr_t)));
    if (!scr) { SFX(bctx_free)(&c); return QD_ENOMEM; }
    for (int t = 0; t < nt; t++) rc |= SFX(bscr_alloc)(&c, &scr[t]);
    char *vmem = 0;
    size_t valloc = 0;
    double *vl = 0;
    if (!rc && c.rform) {  /* the body's V: as lanes, then as a matrix (one kept block) */
        size_t vsz[2] = {sizeof(R) * (size_t)(2 * wd * c.d), sizeof(double) * (size_t)(2 * c.d * c.d)};
        void *vp[2];
        vmem = bparts(vsz, 2, vp, &valloc);
        if (!vmem) rc = QD_ENOMEM;
        else {
            vl = (double *)vp[1];
            SFX(bvbody)(&c, pg, wd, (R *)vp[0], scr[0].perm, scr[0].tmp, vl);
        }
    }
    if (!rc) {
        R *psi = (R *)a->psi;
        SFX(bctx_t) cg = c;  /* the per-binding prefix gates (before pg) */
        cg.pe = pg;
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
        for (i64 ch = 0; ch < c.nch; ch++) {
            SFX(bscr_t) *s = &scr[nt > 1 ? THREAD_ID : 0];
            R *S = psi + 2 * c.W * c.d * ch;
            if (!(c.rform && SFX(breal_forward)(&cg, &c, S, ch * c.W, vl, s)))
                SFX(bforward_chunk)(&c, S, ch * c.W, s);
            SFX(boutputs)(&c, S, ch * c.W, a->out, s->acc);
        }
    }
    keep_put(vmem, valloc);
    for (int t = 0; t < nt; t++) SFX(bscr_free)(&scr[t]);
    free(scr);
    SFX(bctx_free)(&c);
    return rc ? QD_ENOMEM : QD_OK;
}

static int SFX(batch_adjoint)(qd_batch_args *a) {
    for (int s = 0; s < a->nsrc; s++)  /* the gradients are written, not added */
        if (a->gout[s]) memset(a->gout[s], 0, sizeof(double) * (size_t)a->src_len[s]);
    SFX(bctx_t) c;
    int rc = SFX(bctx_init)(&c, a, 1);
    if (rc) { SFX(bctx_free)(&c); return rc; }
    i64 bpad = c.nch * c.W, lo = c.nops, P = c.P;
    for (i64 i = 0; i < c.nops; i++)
        if (c.gates[i].tmask_p) { lo = i; break; }
    /* the gradient rows (Bpad x P): only the trained columns are touched, a per-binding one
     * in every row, a batch-shared one in its chunks' first rows (where bgrad_add sums the
     * lanes); each chunk zeroes its own entries */
    /* the gradient rows, the trained flags and the column order: one kept block */
    size_t gsz[3] = {sizeof(double) * (size_t)(bpad * P + 1), (size_t)P + 1,
                     sizeof(i64) * (size_t)(P + 1)}, galloc = 0;
    void *gp[3];
    char *gmem = bparts(gsz, 3, gp, &galloc);
    double *gtheta = (double *)gp[0];
    char *trained = (char *)gp[1];
    i64 *cols = (i64 *)gp[2], nper = 0, nsh = 0;
    if (trained) memset(trained, 0, gsz[1]);
    int nt = a->nthreads > 1 && c.nch > 1 ? a->nthreads : 1;
    if (nt > c.nch) nt = (int)c.nch;
    SFX(bscr_t) *scr = (SFX(bscr_t) *)calloc((size_t)nt, sizeof(SFX(bscr_t)));
    if (!gmem || !scr) rc = QD_ENOMEM;
    if (!rc) {
        for (i64 i = 0; i < c.nops; i++)
            for (int j = 0; j < c.gates[i].np; j++)
                if ((c.gates[i].tmask_p >> j) & 1) trained[c.gates[i].col[j]] = 1;
        for (i64 j = 0; j < P; j++)  /* per-binding columns first, shared ones from the end */
            if (trained[j]) {
                if (c.cshared[j]) cols[P - 1 - nsh++] = j;
                else cols[nper++] = j;
            }
    }
    /* the dense form of the sweep (every gate after the product prefix the same for the whole
     * batch, a large batch, a small register): with rho = sum_b psi_b lam_b^dag, the shared
     * angles' gradients are 2 Re Tr(dU U^dag rho) along ONE sweep of d lanes X_c = rho e_c,
     * Y_c = e_c (rho <- U^dag rho U as the sweep goes); the prefix's lam is V^dag lam_b per
     * binding (V: the gates after the prefix) */
    const i64 wd = (c.d + 7) / 8 * 8;
    i64 pg = c.pe;
    const int dense = !rc && lo < c.nops && SFX(bdense)(&c, &pg);
    const int ptrain = dense && lo < pg;
    c.rform = dense && c.d >= 4;  /* the real form's chunks (breal_chunk): d a multiple of 4 */
    for (int t = 0; !rc && t < nt; t++) rc |= SFX(bscr_alloc)(&c, &scr[t]);
    double *rho = 0, *ebuf = 0, *vl = 0;
    R *xbuf = 0, *ybuf = 0, *vb = 0, *vdag = 0;
    char *dmem = 0;
    size_t dalloc = 0;
    if (!rc && dense) {  /* per thread rho (complex chunks) and E (real ones); the sweep's two
                          * blocks of d lanes; V as lanes and as a matrix; V^dag for bmu: one
                          * kept block, zeroed but for V (written whole) */
        const size_t db = sizeof(double) * (size_t)(nt * 2 * c.d * c.d);
        const size_t lb = sizeof(R) * (size_t)(2 * wd * c.d);
        size_t dsz[7] = {db, db, lb, lb, lb, sizeof(double) * (size_t)(2 * c.d * c.d),
                         ptrain ? lb : 0};
        void *dp[7];
        dmem = bparts(dsz, 7, dp, &dalloc);
        if (!dmem) {
            rc = QD_ENOMEM;
        } else {
            rho = (double *)dp[0];
            ebuf = (double *)dp[1];
            xbuf = (R *)dp[2];
            ybuf = (R *)dp[3];
            vb = (R *)dp[4];
            vl = (double *)dp[5];
            vdag = ptrain ? (R *)dp[6] : 0;
            memset(rho, 0, db);
            memset(ebuf, 0, db);
            memset(xbuf, 0, lb);
            memset(ybuf, 0, lb);
            SFX(bvbody)(&c, pg, wd, vb, scr[0].perm, scr[0].tmp, vl);
            for (i64 r = 0; r < c.d && vdag; r++)  /* row r, lane q: (V^dag)[r][q] */
                for (i64 q = 0; q < c.d; q++) {
                    vdag[2 * wd * r + q] = (R)vl[q * c.d + r];
                    vdag[2 * wd * r + wd + q] = (R)-vl[c.d * c.d + q * c.d + r];
                }
        }
    }
    if (!rc && lo < c.nops) {
        R *psi = (R *)a->psi;
        i64 d = c.d, W = c.W, rw = 2 * W;
        i64 stop = lo > c.pe ? lo : c.pe;
        SFX(bctx_t) cg = c;  /* the per-binding prefix gates (before pg) */
        cg.pe = pg;
#pragma omp parallel for if (nt > 1) num_threads(nt) schedule(static)
        for (i64 ch = 0; ch < c.nch; ch++) {
            int tid = nt > 1 ? THREAD_ID : 0;
            SFX(bscr_t) *s = &scr[tid];
            R *S = psi + rw * d * ch, *L = s->lam;
            i64 b0 = ch * W;
            for (i64 t = 0; t < nper; t++) memset(gtheta + cols[t] * bpad + b0, 0, sizeof(double) * (size_t)W);
            for (i64 t = 0; t < nsh; t++) gtheta[cols[P - 1 - t] * bpad + b0] = 0;
            SFX(blam)(&c, S, L, b0, a->cot, s->acc + 8 * W);
            if (dense) {  /* this chunk's share of E (real form) or rho, and its prefix gradients */
                if (c.rform && SFX(breal_chunk)(&cg, &c, L, b0, ptrain, vl, s,
                                                ebuf + tid * 2 * d * d, gtheta))
                    continue;
                SFX(brho_add)(&c, S, L, rho + tid * 2 * d * d);
                if (ptrain) {
                    SFX(bmu)(&c, vdag, wd, L, S);  /* mu over the chunk's states (read) */
                    SFX(bprefix_grads)(&cg, S, L, b0, s, gtheta);
                }
                continue;
            }
            memcpy(s->perm, c.fperm, sizeof(i64) * (size_t)d);
            SFX(bsweep)(&c, S, L, b0, lo, stop, s, gtheta);
            if (lo < c.pe) SFX(bprefix_grads)(&c, L, S, b0, s, gtheta);
        }
        if (dense) {  /* rho = (the complex chunks' rho) + V E, then the one sweep */
            SFX(bscr_t) *s = &scr[0];
            const i64 dd = d * d;
            for (int t = 1; t < nt; t++)
                for (i64 e = 0; e < 2 * dd; e++) {
                    rho[e] += rho[t * 2 * dd + e];
                    ebuf[e] += ebuf[t * 2 * dd + e];
                }
            SFX(bctx_t) cd = c;  /* d lanes (padded to a multiple of 8), batch-shared angles */
            cd.W = wd;
            double xr[QD_BATCH_MAXW], xi[QD_BATCH_MAXW];
            for (i64 r = 0; r < d; r++) {
                for (i64 q = 0; q < d; q++) { xr[q] = rho[2 * (r * d + q)]; xi[q] = rho[2 * (r * d + q) + 1]; }
                for (i64 x = 0; x < d; x++) {
                    const double vr = vl[r * d + x], vi = vl[dd + r * d + x];
                    const double *er = ebuf + x * d, *ei = ebuf + dd + x * d;
                    for (i64 q = 0; q < d; q++) {
                        xr[q] += vr * er[q] - vi * ei[q];
                        xi[q] += vr * ei[q] + vi * er[q];
                    }
                }
                R *row = xbuf + 2 * wd * c.fperm[r];
                for (i64 q = 0; q < d; q++) { row[q] = (R)xr[q]; row[wd + q] = (R)xi[q]; }
                ybuf[2 * wd * c.fperm[r] + r] = 1;
            }
            memcpy(s->perm, c.fperm, sizeof(i64) * (size_t)d);
            SFX(bsweep)(&cd, xbuf, ybuf, 0, lo, lo > pg ? lo : pg, s, gtheta);
        }
        /* scatter into the sources: a per-binding column from every row, a batch-shared one
         * from its chunks' first rows (where bgrad_add sums its lanes) */
        {
            for (i64 t = 0; t < nper + nsh; t++)
                for (i64 b = 0; b < c.B; b += t < nper ? 1 : c.W) {
                    i64 j = t < nper ? cols[t] : cols[P - 1 - (t - nper)];
                    double gv = gtheta[j * bpad + b];
                    if (gv == 0) continue;
                    if (a->scale) gv *= a->scale[b * P + j];
                    i64 x = a->idx[b * P + j], src = 0;
                    while (x >= a->src_len[src]) x -= a->src_len[src++];
                    if (a->gout[src]) a->gout[src][x] += gv;
                }
        }
    }
    keep_put(dmem, dalloc);
    for (int t = 0; t < nt && scr; t++) SFX(bscr_free)(&scr[t]);
    free(scr);
    keep_put(gmem, galloc);
    SFX(bctx_free)(&c);
    return rc;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
