"""One patched model serves concurrent forwards at different sizes: the grid travels with each call, so every
thread gets exactly the single-threaded output (issue 9: shared grid state mixed sizes between threads)."""
import pytest
import torch
from conftest import run_concurrently

import visionpe as vpe

VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3)
SWIN = {"swin_tiny_patch4_window7_224": dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1),
                                             num_heads=(2, 2), num_classes=3),
        "swinv2_tiny_window8_256": dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1),
                                        num_heads=(2, 2), num_classes=3)}
VIT_PES = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi",
           "rope_mixed+learned", "rope_axial+alibi"]
SWIN_PES = ["swin_bias", "cpb", "alibi", "rope_axial", "rope_mixed"]
# sizes with equal token counts (16x24 / 24x16) are the case that gave wrong answers without any error
CASES = [("vit_tiny_patch16_224", pe, VIT, [(16, 24), (24, 16), (16, 16), (32, 20)]) for pe in VIT_PES]
CASES += [(name, pe, kw, [(32, 48), (48, 32), (32, 32)]) for name, kw in SWIN.items() for pe in SWIN_PES]


@pytest.mark.parametrize("name,pe,kw,sizes", CASES, ids=[f"{c[0].split('_')[0]}-{c[1]}" for c in CASES])
def test_concurrent_forwards_equal_single_threaded(one_thread_kernels, name, pe, kw, sizes):
    torch.manual_seed(0)
    model = vpe.create_model(name, pe=pe, **kw).eval()
    inputs = [torch.randn(2, 3, *size) for size in sizes]
    errors = run_concurrently(model, inputs, iterations=24)
    assert not errors, errors[:5]


def test_hundreds_of_concurrent_forwards_at_transposed_sizes(one_thread_kernels):
    """The reported case: one RoPE ViT at 32x48 and 48x32 (same token count) from two threads, 300 forwards."""
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial+learned", img_size=32, patch_size=8,
                             embed_dim=16, depth=2, num_heads=2, num_classes=3).eval()
    inputs = [torch.randn(1, 3, 32, 48), torch.randn(1, 3, 48, 32)]
    errors = run_concurrently(model, inputs, iterations=150, threads=2)
    assert not errors, errors[:5]
