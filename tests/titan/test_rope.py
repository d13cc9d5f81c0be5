"""The cpu `qwen3_pilot::rope_hf` (kernels/rope.py) against RoPE worked out independently: by hand on one
vector, and pair by pair with math.cos/math.sin. The HF convention rotates the pairs (x[i], x[i + H/2]) by
the angle of frequency i: y[i] = x[i] cos - x[i + H/2] sin, y[i + H/2] = x[i + H/2] cos + x[i] sin.
`backward=True` is the map's transpose, i.e. the rotation by minus the angle."""

from __future__ import annotations

import math

import torch

from qwen3_pilot.titan.kernels.rope import rope_hf


def one_position(x, cos, sin):
    """(1, 1, 1, H) tensors of one vector and its tables, as the op takes them."""
    return torch.tensor([[[x]]]), torch.tensor([cos]), torch.tensor([sin])


def test_rope_hf_rotates_each_first_half_second_half_pair_by_hand():
    # head_dim 4: the pairs (x0, x2) and (x1, x3); angles 90 degrees and 0, tables [c0, c1, c0, c1].
    q, cos, sin = one_position([1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0])
    k = torch.tensor([[[[5.0, 6.0, 7.0, 8.0]]]])
    q_out, k_out = rope_hf(q, k, cos, sin, False)
    # (1, 3) by +90 degrees: (1*0 - 3*1, 3*0 + 1*1) = (-3, 1); (2, 4) by 0 stays.
    assert q_out.flatten().tolist() == [-3.0, 2.0, 1.0, 4.0]
    assert k_out.flatten().tolist() == [-7.0, 6.0, 5.0, 8.0]
    q_back, k_back = rope_hf(q, k, cos, sin, True)
    # By -90 degrees: (1*0 + 3*1, 3*0 - 1*1) = (3, -1).
    assert q_back.flatten().tolist() == [3.0, 2.0, -1.0, 4.0]
    assert k_back.flatten().tolist() == [7.0, 6.0, -5.0, 8.0]


def rotated_by_loop(x, angles, sign):
    """x (batch, heads, seq, H) rotated pair by pair by sign x angles[position][i], in float64 Python."""
    out = x.tolist()
    half = x.shape[-1] // 2
    for b, heads in enumerate(out):
        for h, positions in enumerate(heads):
            for p, vector in enumerate(positions):
                source = x[b, h, p].tolist()
                for i in range(half):
                    c, s = math.cos(sign * angles[p][i]), math.sin(sign * angles[p][i])
                    vector[i] = source[i] * c - source[i + half] * s
                    vector[i + half] = source[i + half] * c + source[i] * s
    return torch.tensor(out)


def test_rope_hf_matches_a_per_pair_rotation_forward_and_backward():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=generator)
    k = torch.randn(2, 1, 5, 8, generator=generator)
    angles = [[0.3 * (p + 1) * (i + 1) for i in range(4)] for p in range(5)]  # all distinct, up to 6 rad
    cos = torch.tensor([[math.cos(a) for a in row] * 2 for row in angles])
    sin = torch.tensor([[math.sin(a) for a in row] * 2 for row in angles])
    for backward, sign in ((False, 1.0), (True, -1.0)):
        q_out, k_out = rope_hf(q, k, cos, sin, backward)
        torch.testing.assert_close(q_out, rotated_by_loop(q, angles, sign), rtol=0, atol=1e-5)
        torch.testing.assert_close(k_out, rotated_by_loop(k, angles, sign), rtol=0, atol=1e-5)
