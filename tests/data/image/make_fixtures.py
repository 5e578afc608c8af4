#!/usr/bin/env python3
"""Tiny PNG/PNM fixtures for tests/test_image_io.c and tests/cli/image_*.sh,
written by a minimal PNG encoder (zlib + struct only, so no imaging library is
needed). Each image's expected pixels follow a formula the test recomputes:
    value(y, x, c) = (y * 7 + x * 13 + c * 29) % (maxval + 1)    (raw samples)
Run from this folder: python3 make_fixtures.py"""
import struct
import zlib


def chunk(kind, data):
    c = struct.pack(">I", len(data)) + kind + data
    return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w, h, depth, ctype, rows_bytes, extra=b"", interlace=0):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
            chunk(b"IDAT", zlib.compress(rows_bytes)) + chunk(b"IEND", b""))


def val(y, x, c, maxval):
    return (y * 7 + x * 13 + c * 29) % (maxval + 1)


def pack_row(samples, depth):
    if depth == 8:
        return bytes(samples)
    if depth == 16:
        return b"".join(struct.pack(">H", s) for s in samples)
    out, acc, nbits = bytearray(), 0, 0
    for s in samples:
        acc = (acc << depth) | s
        nbits += depth
        if nbits == 8:
            out.append(acc)
            acc, nbits = 0, 0
    if nbits:
        out.append(acc << (8 - nbits))
    return bytes(out)


def raw(w, h, ch, depth, pixel):
    data = bytearray()
    for y in range(h):
        data.append(0)  # filter none
        data += pack_row([pixel(y, x, c) for x in range(w) for c in range(ch)], depth)
    return bytes(data)


def adam7(w, h, ch, depth, pixel):
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    data = bytearray()
    for x0, y0, dx, dy in passes:
        xs = list(range(x0, w, dx))
        ys = list(range(y0, h, dy))
        if not xs or not ys:
            continue
        for y in ys:
            data.append(0)
            data += pack_row([pixel(y, x, c) for x in xs for c in range(ch)], depth)
    return bytes(data)


def write(name, data):
    with open(name, "wb") as f:
        f.write(data)


W, H = 5, 3
# 8-bit RGB, gray, gray+alpha, RGBA
for ctype, ch, name in [(2, 3, "rgb8"), (0, 1, "gray8"), (4, 2, "graya8"), (6, 4, "rgba8")]:
    write(name + ".png", png(W, H, 8, ctype, raw(W, H, ch, 8, lambda y, x, c: val(y, x, c, 255))))
# 16-bit RGB (scaled to 8 bits on load)
write("rgb16.png", png(W, H, 16, 2, raw(W, H, 3, 16, lambda y, x, c: val(y, x, c, 255) * 257)))
# 1-bit and 4-bit gray
write("gray1.png", png(W, H, 1, 0, raw(W, H, 1, 1, lambda y, x, c: val(y, x, c, 1))))
write("gray4.png", png(W, H, 4, 0, raw(W, H, 1, 4, lambda y, x, c: val(y, x, c, 15))))
# palette of 4 colours, the last one transparent (tRNS) -> RGBA
pal = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (10, 20, 30)]
plte = chunk(b"PLTE", bytes(v for rgb in pal for v in rgb))
trns = chunk(b"tRNS", bytes([255, 255, 255, 0]))
write("palette.png", png(W, H, 2, 3, raw(W, H, 1, 2, lambda y, x, c: (y + x) % 4), plte + trns))
# interlaced 8-bit RGB, 9 x 10 (every Adam7 pass non-empty)
write("interlaced.png", png(9, 10, 8, 2, adam7(9, 10, 3, 8, lambda y, x, c: val(y, x, c, 255)), interlace=1))
# netpbm: P6 maxval 255 with a comment, P5 maxval 65535
ppm = b"P6\n# a comment\n5 3\n255\n" + bytes(val(y, x, c, 255) for y in range(H) for x in range(W) for c in range(3))
write("rgb.ppm", ppm)
pgm = b"P5 5 3 65535\n" + b"".join(struct.pack(">H", val(y, x, 0, 65535)) for y in range(H) for x in range(W))
write("gray16.pgm", pgm)
# a small picture for the CLI tests: 24 x 16 RGB, a bright square on a gradient
def scene(y, x, c):
    if 4 <= y < 10 and 14 <= x < 20:
        return [250, 240, 40][c]
    return [x * 10, y * 12, 128][c]
write("scene.png", png(24, 16, 8, 2, raw(24, 16, 3, 8, scene)))
