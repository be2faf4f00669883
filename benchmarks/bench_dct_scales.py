"""libjpeg-turbo's DCT scales of M/8 against a whole decode: would a bucket's decode gain
from the scales between 1/2 and 1 that Pillow's ``draft`` does not offer?

A bucket covers its whole image, resized by about 0.6-0.7 for the photos of
``bench_buckets.py``: no power-of-two scale (``draft``'s 1/2, 1/4, 1/8) fits, so each
photo is decoded whole.  libjpeg (6b and later, libjpeg-turbo too) also decodes at M/8 for
M from 1 to 16 (``scale_num = M, scale_denom = 8``): 6/8 or 5/8 would fit there, with a
quarter to 40 % fewer pixels to transform and resize.  This measures what each scale costs
libjpeg-turbo itself, with no Python between: a small C program (built here with ``cc``
against the system's libjpeg, ``-O2``) decodes every photo of the folder at one scale to
RGBX, ``--repeat`` times, and prints its CPU milliseconds per image; the scales alternate
in each of ``--rounds`` rounds; medians.  Printed: CPU ms per image, the ratio of each
scale's rate to the whole decode's, the decoded size of the first photo, and the C
program's peak RSS.

Run: ``python benchmarks/bench_dct_scales.py [--images 300] [--rounds 5] [--repeat 5]
[--json FILE]`` (the folder is ``bench_buckets.py``'s: the demo's photos cut to 1:1, 3:2
and 2:3, about 427 pixels on the long side).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_buckets import shaped_folder

SCALES = (8, 7, 6, 5, 4)  # M in M/8; 8 is the whole decode, 4 is draft's 1/2

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <jpeglib.h>

/* decode M REPEAT FILE...: each FILE decoded at M/8 to RGBX, REPEAT times; prints the
   CPU ms per decode, the first file's decoded width and height, and this program's peak
   RSS in KiB (VmHWM: its own, not that of the process it was started from). */
static long peak_kib(void) {
    char line[256];
    long kib = -1;
    FILE *status = fopen("/proc/self/status", "r");
    while (status && fgets(line, sizeof line, status)) {
        if (sscanf(line, "VmHWM: %ld", &kib) == 1) break;
    }
    if (status) fclose(status);
    return kib;
}

int main(int argc, char **argv) {
    int num = atoi(argv[1]), repeat = atoi(argv[2]);
    double cpu = 0;
    unsigned first_w = 0, first_h = 0;
    for (int f = 3; f < argc; f++) {
        FILE *fp = fopen(argv[f], "rb");
        if (!fp) { perror(argv[f]); return 1; }
        fseek(fp, 0, SEEK_END);
        long n = ftell(fp);
        rewind(fp);
        unsigned char *data = malloc(n);
        if (fread(data, 1, n, fp) != (size_t)n) { perror(argv[f]); return 1; }
        fclose(fp);
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        for (int r = 0; r < repeat; r++) {
            struct jpeg_decompress_struct c;
            struct jpeg_error_mgr e;
            c.err = jpeg_std_error(&e);
            jpeg_create_decompress(&c);
            jpeg_mem_src(&c, data, n);
            jpeg_read_header(&c, TRUE);
            c.out_color_space = JCS_EXT_RGBX;
            c.scale_num = num;
            c.scale_denom = 8;
            jpeg_start_decompress(&c);
            size_t stride = (size_t)c.output_width * 4;
            unsigned char *out = malloc(stride * c.output_height);
            while (c.output_scanline < c.output_height) {
                JSAMPROW row = out + c.output_scanline * stride;
                jpeg_read_scanlines(&c, &row, 1);
            }
            if (f == 3) { first_w = c.output_width; first_h = c.output_height; }
            jpeg_finish_decompress(&c);
            jpeg_destroy_decompress(&c);
            free(out);
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        cpu += (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
        free(data);
    }
    printf("%.6f %u %u %ld\n", cpu * 1000 / ((double)repeat * (argc - 3)), first_w, first_h,
           peak_kib());
    return 0;
}
"""


def build(folder: Path) -> Path:
    source, exe = folder / "decode.c", folder / "decode"
    source.write_text(PROGRAM)
    subprocess.run(["cc", "-O2", str(source), "-o", str(exe), "-ljpeg"], check=True)
    return exe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        photos = sorted(str(p) for p in shaped_folder(root, args.images).glob("*.jpg"))
        exe = build(root)
        ms: dict[int, list[float]] = {m: [] for m in SCALES}
        size: dict[int, str] = {}
        peak_mb = 0.0
        for _ in range(args.rounds):
            for m in SCALES:
                cmd = [str(exe), str(m), str(args.repeat), *photos]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                each, w, h, hwm_kb = out.split()
                ms[m].append(float(each))
                size[m] = f"{w} x {h}"
                peak_mb = max(peak_mb, int(hwm_kb) / 1024)
    whole = statistics.median(ms[8])
    print(f"{len(photos)} photos, {args.rounds} rounds of {args.repeat} decodes each, medians")
    print("| scale | CPU ms per image | × the whole decode's rate | the first photo decoded |")
    print("|---|---|---|---|")
    rows = []
    for m in SCALES:
        median = statistics.median(ms[m])
        rows.append({"scale": f"{m}/8", "cpu_ms": median, "rate_ratio": whole / median})
        print(f"| {m}/8 | {median:.3f} | {whole / median:.2f} | {size[m]} |")
    print(f"peak RSS of the decoding program: {peak_mb:.1f} MB")
    if args.json:
        record = {"rows": rows, "rounds": ms, "photos": len(photos), "peak_rss_mb": peak_mb}
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
