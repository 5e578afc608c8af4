#!/usr/bin/env python3
"""Fixtures of tests/test_conv_attention.c and tests/cli/image_conv_cli.sh
(numpy only): random kernels and images, and y3_ref.npy, the cross-correlation
of w3 with x3 (zero padding 1) plus b4, computed by numpy as an independent
oracle. Run from this folder."""
import numpy as np
r = np.random.default_rng(3)
np.save('w3.npy', r.standard_normal((4, 3, 3, 3)).astype(np.float32))
np.save('b4.npy', r.standard_normal(4).astype(np.float32))
np.save('x3.npy', r.standard_normal((3, 10, 12)).astype(np.float32))
np.save('x3_f64.npy', r.standard_normal((3, 7, 5)))
np.save('w5.npy', r.standard_normal((2, 3, 5, 5)).astype(np.float32))
np.save('w_even.npy', r.standard_normal((2, 3, 2, 2)).astype(np.float32))
np.save('x2.npy', r.standard_normal((2, 6, 6)).astype(np.float32))
np.save('i32.npy', np.zeros((3, 4, 4), np.int32))
w = np.load('w3.npy').astype(np.float64)
x = np.load('x3.npy').astype(np.float64)
b = np.load('b4.npy').astype(np.float64)
xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
y = np.zeros((4, 10, 12))
for a in range(3):
    for c in range(3):
        y += np.einsum('oc,chw->ohw', w[:, :, a, c], xp[:, a:a + 10, c:c + 12])
y += b[:, None, None]
np.save('y3_ref.npy', y.astype(np.float32))
