"""Mixed-size batches (NaFlexViT's setting): images of different sizes and aspect ratios in one padded batch, each
on its own grid, get exactly the outputs they get alone, for every family."""
import pytest
import torch

import visionpe as vpe
from visionpe import Grid, data
from visionpe.grid import MixedLayout

KW = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
PES = [("none", {}), ("sincos", {}), ("learned", {}), ("peg", {}), ("rope_axial", {"scaling": "pi"}),
       ("rope_mixed", {"scaling": "pi"}), ("rel_bias", {}), ("cpb", {}), ("alibi", {}), ("bucket_bias", {}),
       ("rope_mixed+learned", {"scaling": "yarn"}), ("rope_axial+rel_bias", {"coords": "normalized"})]


@pytest.mark.parametrize("pool", ["token", "avg"])
@pytest.mark.parametrize("pe,pe_kwargs", PES, ids=[p for p, _ in PES])
def test_each_image_of_a_mixed_batch_gets_its_own_positions(pe, pe_kwargs, pool):
    torch.manual_seed(0)
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=pe_kwargs, global_pool=pool, **KW).eval()
    for enc in sum(vpe.encodings_of(model).values(), []):  # fresh tables are ~0: make positions count
        for p in enc.parameters():
            torch.nn.init.normal_(p, std=0.5)
    images = [torch.randn(3, 16, 24), torch.randn(3, 24, 16), torch.randn(3, 16, 16), torch.randn(3, 16, 24)]
    with torch.no_grad():
        together = model.forward_batch(images)
        alone = torch.cat([model(image[None]) for image in images])
    torch.testing.assert_close(together, alone, atol=2e-5, rtol=2e-5)


def test_padding_is_invisible_to_attention():
    """attend over a mixed layout equals attend on each sample's real tokens alone; padded content is ignored."""
    torch.manual_seed(0)
    rotary = vpe.build("rope_axial", head_dim=8, num_heads=2)
    bias = vpe.build("rel_bias", num_heads=2, grid_shape=(3, 3))
    torch.nn.init.normal_(bias.relative_position_bias_table)
    grids = (Grid((2, 3), prefix=1), Grid((3, 3), prefix=1), Grid((2, 2), prefix=1))
    layout = MixedLayout(grids)
    q, k, v = torch.randn(3, 3, 2, layout.num_tokens, 8).unbind(0)
    out = vpe.attend(q, k, v, layout, rotary, bias)
    for b, grid in enumerate(grids):
        n = grid.num_tokens
        alone = vpe.attend(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n], grid, rotary, bias)
        torch.testing.assert_close(out[b:b + 1, :, :n], alone, atol=1e-6, rtol=1e-6)
    k2, v2 = k.clone(), v.clone()
    k2[2, :, grids[2].num_tokens:] = 1e3  # garbage in the padding
    v2[2, :, grids[2].num_tokens:] = 1e3
    torch.testing.assert_close(vpe.attend(q, k2, v2, layout, rotary, bias)[2, :, :5], out[2, :, :5])
    assert layout.key_mask().tolist() == [[True] * 7 + [False] * 3, [True] * 10, [True] * 5 + [False] * 5]


def test_mixed_layout_checks():
    with pytest.raises(ValueError, match="one per sample"):
        MixedLayout(())
    with pytest.raises(ValueError, match="same prefix"):
        MixedLayout((Grid((2, 2), prefix=1), Grid((2, 2))))
    layout = MixedLayout((Grid((2, 2), prefix=1), Grid((1, 2), prefix=1)))  # 2 grids for a batch of 4
    q = torch.randn(4, 2, layout.num_tokens, 8)
    for rotary, bias in [(vpe.build("rope_axial", head_dim=8, num_heads=2), None),
                         (None, vpe.build("alibi", num_heads=2))]:
        with pytest.raises(ValueError, match="2 grids but the batch has 4 samples"):
            vpe.attend(q, q, q, layout, rotary, bias)
    with pytest.raises(ValueError, match="2 grids but the batch has 4 samples"):
        layout.per_grid(torch.randn(4, layout.num_tokens, 8), lambda x, grid: x)
    model = vpe.create_model("vit_tiny_patch16_224", pe="learned", global_pool="max", **KW)
    with pytest.raises(ValueError, match="global_pool 'token' or 'avg'"):
        model.forward_batch([torch.randn(3, 16, 16)])
    with pytest.raises(ValueError, match="multiple of"):
        vpe.create_model("vit_tiny_patch16_224", pe="learned", **KW).eval().forward_batch([torch.randn(3, 16, 15)])


def test_native_aspect_ratio_within_a_token_budget():
    # both sides scaled by sqrt(64 / 1200) and floored to whole patches: 6.9 x 9.2 -> 6 x 9 = 54 <= 64
    assert data.native_aspect_size(480, 640, 16, 64) == (96, 144)
    assert data.native_aspect_size(100, 1000, 10, 16) == (10, 120)  # extreme ratio: one row of 12
    for h, w in [(33, 97), (512, 512), (1000, 200)]:
        height, width = data.native_aspect_size(h, w, 8, 50)
        assert height % 8 == width % 8 == 0 and (height // 8) * (width // 8) <= 50
        assert abs(height / width - h / w) / (h / w) < 0.6
    image = data.resize_to_budget(torch.rand(3, 30, 60), 4, 32)
    assert image.shape == (3, 16, 32)
    with pytest.raises(ValueError, match="max_patches"):
        data.native_aspect_size(10, 10, 4, 0)
