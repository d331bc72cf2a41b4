/* A disk-tier page file read whole in one call (runtime/kv/tier/native_reads.py), so that a prefetch reader thread
 * gives up Python's GIL once per page instead of at each of open, fstat, the read and close: with two reader
 * threads each hand-over of the GIL woke the other thread, and on a 2-vCPU VM a wake-up costs tens of
 * microseconds; the readers then spent half their time waiting to run.
 *
 * page_read_split opens `path` without following a symlink (nor waiting on a FIFO), checks it is a regular file,
 * and reads it with preadv: its last rows * row_bytes bytes into the rows at dst, dst + row_stride, ... (row_bytes
 * each, in order) and the bytes before them into head (head_cap bytes at most). *size gets the file's size. Returns 0 once the
 * whole file is read; 1, having read nothing, when the file is shorter than the rows or its head longer than
 * head_cap (the caller reads it another way); -errno on an error: -EISDIR for a file that is not regular, -EIO for
 * a file that ends before its size (it shrank while read), -EINVAL for a hasher that failed.
 *
 * With a hasher (state non-NULL), it also hashes every byte from offset 40 to the end of the file (a page file's
 * checksummed body: runtime/kv/tier/disk_format.py) with XXH3-128 through the streaming functions handed in (the
 * xxhash library the Python package ships: runtime/kv/tier/native_reads.py), and writes the digest in xxhash's
 * canonical form (high then low half, big-endian) to digest: the whole page's check then costs the GIL nothing
 * either. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define BATCH 128 /* buffers per preadv: well under any IOV_MAX */
#define BODY_START 40

typedef struct {
    unsigned long long low64, high64; /* xxhash's XXH128_hash_t */
} hash128;
typedef int (*reset_fn)(void *state);
typedef int (*update_fn)(void *state, const void *data, size_t len);
typedef hash128 (*digest_fn)(const void *state);

static int hash_body(void *state, void *reset, void *update, void *digest, const unsigned char *head, long head_len,
                     const unsigned char *dst, long row_bytes, int rows, long row_stride, unsigned char *out) {
    if (((reset_fn)reset)(state) != 0) return -1;
    if (head_len > BODY_START && ((update_fn)update)(state, head + BODY_START, (size_t)(head_len - BODY_START)) != 0)
        return -1;
    for (int r = 0; r < rows; r++)
        if (((update_fn)update)(state, dst + (long)r * row_stride, (size_t)row_bytes) != 0) return -1;
    const hash128 h = ((digest_fn)digest)(state);
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(h.high64 >> (56 - 8 * i));
        out[8 + i] = (unsigned char)(h.low64 >> (56 - 8 * i));
    }
    return 0;
}

static long segment_length(int seg, long head_len, long row_bytes) { return seg < 0 ? head_len : row_bytes; }

int page_read_split(const char *path, unsigned char *head, long head_cap, unsigned char *dst, long row_bytes,
                    int rows, long row_stride, long *size, void *state, void *reset, void *update, void *digest,
                    unsigned char *digest_out) {
    if (row_bytes < 0 || rows < 0 || head_cap < 0) return -EINVAL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
    if (fd < 0) return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EISDIR;
        goto done;
    }
    *size = (long)st.st_size;
    const long payload = row_bytes * rows, total = (long)st.st_size;
    if (total < payload || total - payload > head_cap) {
        rc = 1;
        goto done;
    }
    const long head_len = total - payload;
    long got = 0, offset = 0; /* bytes read; where the next byte goes within segment `seg` (-1: head, else a row) */
    int seg = -1;
    while (got < total) {
        struct iovec iov[BATCH];
        int n = 0;
        for (int s = seg; s < rows && n < BATCH; s++) {
            const long len = segment_length(s, head_len, row_bytes) - (s == seg ? offset : 0);
            if (len <= 0) continue;
            unsigned char *base = s < 0 ? head : dst + (long)s * row_stride;
            iov[n].iov_base = base + (s == seg ? offset : 0);
            iov[n].iov_len = (size_t)len;
            n++;
        }
        const ssize_t r = preadv(fd, iov, n, (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = -errno;
            goto done;
        }
        if (r == 0) {
            rc = -EIO;
            goto done;
        }
        got += r;
        for (long left = r; left > 0;) { /* move (seg, offset) past the bytes just read */
            const long rest = segment_length(seg, head_len, row_bytes) - offset;
            if (left >= rest) {
                left -= rest;
                seg++;
                offset = 0;
            } else {
                offset += left;
                left = 0;
            }
        }
    }
    if (state != NULL && hash_body(state, reset, update, digest, head, head_len, dst, row_bytes, rows, row_stride,
                                   digest_out) != 0)
        rc = -EINVAL;
done:
    close(fd);
    return rc;
}
