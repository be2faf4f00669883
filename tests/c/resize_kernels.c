/* Every resize kernel this CPU runs against the scalar one (which tests/test_resize.py
 * holds to Pillow's pixels), outside Python: built by tests/test_resize_arm.py for AArch64
 * and run under qemu-aarch64, so the NEON kernels are checked on a machine without them.
 * Random images (3- and 4-byte pixels), boxes and sizes, flipped or not, both pass
 * orders; the image's last byte at the end of its allocation.  Prints "kernels N cases M
 * equal" and exits 0, or names the first case that differs and exits 1. */
#include "../../asyncloader/_decode/_resize.c"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t state = 88172645463325252ULL;

static uint32_t next(void) { /* xorshift64 */
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)(state >> 32);
}

static int below(int n) { return (int)(next() % (uint32_t)n); }

/* `len` bytes that end where a page no process may read begins: a kernel reading past the
 * image's last byte dies of it. */
static uint8_t *guarded(size_t len, void **map, size_t *map_len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (len + page - 1) / page * page;
    *map_len = span + page;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED || mprotect((uint8_t *)*map + span, page, PROT_NONE) != 0) {
        exit(2);
    }
    return (uint8_t *)*map + span - len;
}

int main(int argc, char **argv) {
    int cases = argc > 1 ? atoi(argv[1]) : 2000, best = best_simd(), done = 0;
    for (int i = 0; i < cases; i++) {
        int ch = 3 + below(2), w = 1 + below(i % 4 == 0 ? 600 : 40), hgt = 1 + below(40);
        size_t len = (size_t)w * hgt * ch;
        void *map;
        size_t map_len;
        uint8_t *src = guarded(len, &map, &map_len);
        for (size_t j = 0; j < len; j++) {
            src[j] = (uint8_t)next();
        }
        resize_job job;
        memset(&job, 0, sizeof(job));
        job.src = src;
        job.width = w;
        job.height = hgt;
        job.channels = ch;
        float x0 = (float)below(w) * (below(2) ? 0.37f : 1.0f), y0 = (float)below(hgt);
        job.box[0] = x0;
        job.box[1] = y0;
        job.box[2] = x0 + (float)(w - x0) * (0.25f + 0.75f * (float)below(1000) / 999.0f);
        job.box[3] = (float)hgt;
        job.ow = 1 + below(i % 3 == 0 ? 300 : 30);
        job.oh = 1 + below(30);
        job.flip = below(2);
        job.vertical_first = below(2);
        size_t out_len = (size_t)job.ow * job.oh * 3;
        uint8_t *want = malloc(out_len), *got = malloc(out_len);
        job.out = want;
        job.simd = 0;
        if (!run_resize(&job)) {
            return 2;
        }
        for (int simd = 1; simd <= best; simd++) {
            job.out = got;
            job.simd = simd;
            memset(got, 0xAB, out_len);
            if (!run_resize(&job)) {
                return 2;
            }
            if (memcmp(want, got, out_len) != 0) {
                printf("kernel %d differs: %dx%dx%d box (%g %g %g %g) to %dx%d flip %d "
                       "vertical_first %d\n",
                       simd, w, hgt, ch, job.box[0], job.box[1], job.box[2], job.box[3], job.ow,
                       job.oh, job.flip, job.vertical_first);
                return 1;
            }
            done++;
        }
        munmap(map, map_len);
        free(want);
        free(got);
    }
    printf("kernels %d cases %d equal\n", best, done);
    return 0;
}
