/* qdot.c's portable rows (QDOT_PATH 0): each block unpacked to int16 values, integer sums in C that the compiler
 * vectorises. The same numbers as the vector paths within float32 rounding (the integer sums are exact in both).
 * Included by qdot.c only, after ggml_blocks.h and qdot_acts.h. */
#ifndef QDOT_PORTABLE_H
#define QDOT_PORTABLE_H

/* Weight block `blk` of a row as int16 values (a Q6_K value times its 16-element scale), with the float scale
 * that multiplies the integer sum and the min that multiplies xs. */
static inline void unpack_block(int kind, const uint8_t *row, int blk, int16_t *v, float *dw, float *m) {
    *m = 0.0f;
    switch (kind) {
    case KIND_Q4_0:
    case KIND_Q4_1: {
        const int one = kind == KIND_Q4_1;
        const uint8_t *qs = one ? ((const block_q4_1 *)row)[blk].qs : ((const block_q4_0 *)row)[blk].qs;
        for (int j = 0; j < 16; j++) {
            v[j] = (int16_t)((qs[j] & 0x0F) - (one ? 0 : 8));
            v[j + 16] = (int16_t)((qs[j] >> 4) - (one ? 0 : 8));
        }
        *dw = half_to_float(one ? ((const block_q4_1 *)row)[blk].d : ((const block_q4_0 *)row)[blk].d);
        if (one) *m = half_to_float(((const block_q4_1 *)row)[blk].m);
        break;
    }
    case KIND_Q5_0: {
        const block_q5_0 *w = (const block_q5_0 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = (int16_t)(q5_value(w->qs, w->qh, j) - 16);
        *dw = half_to_float(w->d);
        break;
    }
    case KIND_Q5_1: {
        const block_q5_1 *w = (const block_q5_1 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = (int16_t)q5_value(w->qs, w->qh, j);
        *dw = half_to_float(w->d);
        *m = half_to_float(w->m);
        break;
    }
    case KIND_Q8_0: {
        const block_q8_0 *w = (const block_q8_0 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = w->qs[j];
        *dw = half_to_float(w->d);
        break;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K, s = blk % 8;
        const block_q4_K *w4 = (const block_q4_K *)row + blk / 8;
        const block_q5_K *w5 = (const block_q5_K *)row + blk / 8;
        uint8_t sc[8], mn[8];
        k_scales_mins(five ? w5->scales : w4->scales, sc, mn);
        const uint8_t *q = (five ? w5->qs : w4->qs) + 32 * (s / 2);
        for (int l = 0; l < QK; l++) {
            int x = (q[l] >> (4 * (s % 2))) & 0x0F;
            if (five) x |= ((w5->qh[l] >> s) & 1) << 4;
            v[l] = (int16_t)x;
        }
        *dw = half_to_float(five ? w5->d : w4->d) * (float)sc[s];
        *m = -(half_to_float(five ? w5->dmin : w4->dmin) * (float)mn[s]);
        break;
    }
    case KIND_Q6_K: {
        const block_q6_K *w = (const block_q6_K *)row + blk / 8;
        const int h = (blk % 8) / 4, g = blk % 4;
        const uint8_t *ql = w->ql + 64 * h, *qh = w->qh + 32 * h;
        for (int l = 0; l < QK; l++) {
            const int lo = g < 2 ? ql[l + 32 * g] & 0x0F : ql[l + 32 * (g - 2)] >> 4;
            const int x = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
            v[l] = (int16_t)(x * w->scales[8 * h + 2 * g + l / 16]);
        }
        *dw = half_to_float(w->d);
        break;
    }
    default:
        *dw = 0.0f;
        memset(v, 0, QK * sizeof *v);
    }
}

static inline void row_kind(int kind, int wide, const uint8_t *row, const acts *a, int ntok, float *out) {
    float acc[BLOCKDOT_MAX_TOKENS] = {0};
    int16_t v[QK];
    for (int b = 0; b < a->nb; b++) {
        float dw, m;
        unpack_block(kind, row, b, v, &dw, &m);
        for (int t = 0; t < ntok; t++) {
            const int8_t *xq = a->q + (size_t)t * a->cols + (size_t)b * QK;
            const int8_t *xl = wide ? a->ql + (size_t)t * a->cols + (size_t)b * QK : NULL;
            int64_t sum = 0; /* 16-bit activations times Q6_K's scaled values pass 2^31 over a block */
            for (int j = 0; j < QK; j++) sum += (int64_t)v[j] * (wide ? 256 * xq[j] + xl[j] : xq[j]);
            const size_t i = (size_t)t * a->nb + b;
            acc[t] += (dw * a->d[i]) * (float)sum + m * a->s[i];
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = acc[t];
}
#endif
