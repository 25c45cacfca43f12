"""Image weights into a video model: every weight carries over with a report, and a static clip reproduces the
image model's output where that holds by construction: tubelets of identical frames, time positions at zero, and
no prefix token (a class token would keep one copy while every patch key is repeated over time, which changes its
share of the softmax)."""
import pytest
import timm
import torch

import visionpe as vpe
from visionpe.weights.convert import spatial_tables

SIZES = dict(img_size=16, embed_dim=24, depth=2, num_heads=2, num_classes=3, class_token=False, global_pool="avg")


def static_clip(image: torch.Tensor, frames: int = 4) -> torch.Tensor:
    return image[:, :, None].expand(-1, -1, frames, -1, -1).contiguous()


@pytest.mark.parametrize("factorized", [False, "space_time"])
def test_timm_vit_checkpoint_inflates_into_a_learned_video_model(factorized):
    torch.manual_seed(0)
    image = timm.create_model("vit_tiny_patch16_224", pretrained=False, patch_size=4, **SIZES).eval()
    with torch.no_grad():
        image.pos_embed.normal_()  # a table far from zero: position matters
    video = vpe.create_video_model("vit_tiny_patch16_224", pe="learned", num_frames=4, tubelet_size=(2, 4, 4),
                                   pe_kwargs={"factorized": factorized}, **SIZES).eval()
    report = vpe.load_timm_checkpoint(video, image.state_dict(), strict=True)
    assert "patch_embed.proj.weight -> patch_embed.proj.weight (inflated over 2 frames (I3D))" in report.converted
    assert any(line.startswith("pos_embed -> pe_tokens.table") for line in report.converted)
    assert not report.dropped and not report.new
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(video(static_clip(x)), image(x), atol=1e-5, rtol=1e-5)
        # another clip length: the spatial table stays, the time table is resampled (zeros stay zeros)
        torch.testing.assert_close(video(static_clip(x, 8)), image(x), atol=1e-5, rtol=1e-5)


def test_image_rope_mixed_run_extends_with_a_zero_time_component():
    torch.manual_seed(0)
    image = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned", patch_size=4, **SIZES).eval()
    video = vpe.create_video_model("vit_tiny_patch16_224", pe="rope_mixed+learned", num_frames=4,
                                   tubelet_size=(2, 4, 4), **SIZES).eval()
    report = vpe.load_timm_checkpoint(video, image.state_dict(), strict=True)
    assert "blocks.0.attn.rotary.freqs -> blocks.0.attn.rotary.freqs (zero time component added)" in report.converted
    assert video.blocks[1].attn.rotary.freqs[-1].abs().sum() == 0  # xy order: (x, y, t)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(video(static_clip(x)), image(x), atol=1e-5, rtol=1e-5)
    # it learns time: the time component gets gradients
    video.train()
    clip = torch.randn(2, 3, 4, 16, 16)
    video(clip).sum().backward()
    assert video.blocks[0].attn.rotary.freqs.grad[-1].abs().sum() > 0


def test_per_axis_factors_are_the_additive_fit():
    """An exactly additive image table (rows + columns) is reproduced by per-axis factors; time starts at zero."""
    tokens = vpe.build("learned", dim=4, ndim=3, grid_shape=(2, 3, 5), factorized=True)
    rows, cols = torch.randn(3, 1, 4), torch.randn(1, 5, 4)
    tables = spatial_tables(tokens, rows + cols)
    tokens.load_state_dict(tables)
    table = tokens._grid_table((2, 3, 5))
    torch.testing.assert_close(table, (rows + cols)[None].expand(2, -1, -1, -1))


def test_space_time_table_is_spatial_plus_time():
    tokens = vpe.build("learned", dim=4, ndim=3, grid_shape=(2, 3, 3), factorized="space_time")
    assert tokens.table.shape == (3, 3, 4) and tokens.time_table.shape == (2, 4)
    full = tokens._grid_table((2, 3, 3))
    torch.testing.assert_close(full, tokens.table[None] + tokens.time_table[:, None, None])
    with pytest.raises(ValueError, match="space_time needs ndim=3"):
        vpe.build("learned", dim=4, ndim=2, factorized="space_time")
    tokens.resize((4, 6, 6))
    assert tokens.table.shape == (6, 6, 4) and tokens.time_table.shape == (4, 4)


def test_swin_bias_inflates_to_a_video_swin_table():
    """Video Swin's rule on the SwinBias class itself (it used to crash on an unexpected keyword)."""
    torch.manual_seed(0)
    image = vpe.build("swin_bias", num_heads=2, window_size=(3, 3))
    torch.nn.init.normal_(image.relative_position_bias_table)
    video = image.inflate((2, 3, 3))
    assert isinstance(video, vpe.SwinBias) and video.window_size == (2, 3, 3)
    full = video(vpe.Grid((2, 3, 3)))
    torch.testing.assert_close(full[:, :9, :9], image(vpe.Grid((3, 3))))  # same frame: the image's bias
    torch.testing.assert_close(full[:, :9, 9:], image(vpe.Grid((3, 3))))  # other frame: repeated over time
