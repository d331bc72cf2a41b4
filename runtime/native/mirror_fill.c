/* A decode mirror row filled from the paged pool in one call (runtime/kv/mirror.py, DecodeMirror._load).
 *
 * The mirror keeps each decoding sequence's K/V head-major and contiguous ([kv_heads, capacity, head_dim] a row
 * and layer); the pool keeps them in pages ([num_blocks, page_size, kv_heads, head_dim] a layer). A row is filled
 * when its sequence joins the decode batch: after every prompt. In PyTorch that was a gather and a transposed copy
 * per layer for K and for V, over a hundred OpenMP regions for SmolLM2, each ending at a barrier; beside busy
 * programs a barrier waits for whichever thread the scheduler took off its core, and the fill after a 512-token
 * prompt took a median 134 ms and up to 0.95 s on two threads beside two busy processes (6 and 10 ms here;
 * scripts/bench_mirror_fill.py --engine, docs/benchmarks.md). Here it is one region (no region at all on one
 * thread), each thread copying whole layers' K or V, position by position: the same values, copied. */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Copies positions [0, n) of one sequence into mirror rows. Layer l's K pages start at pool_k + l * layer_stride
 * and its V pages at pool_v + l * layer_stride (floats), each `num_blocks` pages of [page_size, kv_heads,
 * head_dim]; the sequence's pages are pages[0 .. ceil(n / page_size)). Layer l's K row starts at mirror_k[l] and
 * its V row at mirror_v[l], each [kv_heads, capacity, head_dim]. `threads` share the layers (1 or less: the
 * caller's thread alone). Returns 0, or -1 for arguments out of range (a page id outside the pool, more positions
 * than the capacity or the pages hold, a size below 1), with nothing written. */
int native_mirror_fill(const float *pool_k, const float *pool_v, long layer_stride, int num_layers, int num_blocks,
                       int page_size, int kv_heads, int head_dim, const int64_t *pages, int npages, int n,
                       float *const *mirror_k, float *const *mirror_v, int capacity, int threads) {
    const long layer_floats = (long)num_blocks * page_size * kv_heads * head_dim;
    if (num_layers < 1 || num_blocks < 1 || page_size < 1 || kv_heads < 1 || head_dim < 1 || n < 0 || npages < 0 ||
        n > capacity || (long)npages * page_size < n || layer_stride < layer_floats)
        return -1;
    const int used = (n + page_size - 1) / page_size;
    for (int i = 0; i < used; i++)
        if (pages[i] < 0 || pages[i] >= num_blocks) return -1;
    for (int l = 0; l < num_layers; l++)
        if (mirror_k[l] == NULL || mirror_v[l] == NULL) return -1;
    const size_t row_bytes = (size_t)head_dim * sizeof(float);
    const long items = 2L * num_layers;
#pragma omp parallel for num_threads(threads > 1 ? threads : 1) if (threads > 1) schedule(static)
    for (long item = 0; item < items; item++) {
        const int layer = (int)(item / 2);
        const float *src = (item % 2 ? pool_v : pool_k) + (size_t)layer * (size_t)layer_stride;
        float *dst = item % 2 ? mirror_v[layer] : mirror_k[layer];
        for (int p = 0; p < n; p++) {
            const float *at = src + ((size_t)pages[p / page_size] * page_size + (size_t)(p % page_size)) *
                                        (size_t)kv_heads * head_dim;
            for (int h = 0; h < kv_heads; h++)
                memcpy(dst + ((size_t)h * capacity + p) * head_dim, at + (size_t)h * head_dim, row_bytes);
        }
    }
    return 0;
}
