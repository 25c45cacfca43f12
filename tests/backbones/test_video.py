"""Video ViT on tubelets: 3D grids through the same encodings."""
import pytest
import torch

from visionpe import Grid, encodings_of
from visionpe.backbones.video import TubeletEmbed, create_video_model, inflate_patch_embed

KW = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1, num_classes=3)


@pytest.mark.parametrize("pe", ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb",
                                "alibi", "rope_mixed+learned"])
def test_every_encoding_on_clips_of_any_length(pe):
    model = create_video_model("vit_tiny_patch16_224", pe=pe, **KW)
    for clip in [(4, 16, 16), (8, 24, 16), (2, 8, 8)]:
        out = model(torch.randn(1, 3, *clip))
        assert out.shape == (1, 3)
        out.sum().backward()
    for enc in sum(encodings_of(model).values(), []):
        assert getattr(enc, "ndim", 3) == 3 or getattr(enc, "window_size", (0, 0, 0)).__len__() == 3


def test_grid_is_three_dimensional():
    model = create_video_model("vit_tiny_patch16_224", pe="rope_axial", **KW)
    _, layout = model.embed(torch.randn(1, 3, 6, 8, 12))
    assert layout.grid == Grid((3, 2, 3), prefix=1)


def test_inflated_patch_embed_gives_image_tokens_for_a_static_clip():
    import timm
    image = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=24, num_heads=2, depth=1)
    tubelet = inflate_patch_embed(image.patch_embed, TubeletEmbed(4, 16, (2, 4, 4), 3, 24))
    frame = torch.randn(1, 3, 16, 16)
    clip = frame[:, :, None].repeat(1, 1, 4, 1, 1)
    image_tokens = image.patch_embed(frame).reshape(1, 4, 4, 24)
    assert torch.allclose(tubelet(clip)[:, 0], image_tokens, atol=1e-5)
    assert torch.allclose(tubelet(clip)[:, 1], image_tokens, atol=1e-5)


def test_clip_not_divisible_by_tubelet_is_a_clear_error():
    model = create_video_model("vit_tiny_patch16_224", pe="rope_axial", **KW)
    with pytest.raises(ValueError, match=r"multiple of \(2, 4, 4\)"):
        model(torch.randn(1, 3, 3, 16, 16))


def test_rope_on_head_dim_not_divisible_by_six_gets_sections():
    model = create_video_model("vit_tiny_patch16_224", pe="rope_mixed", num_frames=4, img_size=16,
                               tubelet_size=(2, 4, 4), embed_dim=64, num_heads=2, depth=1, num_classes=3)
    rotary = encodings_of(model)["rotary"][0]
    assert rotary.sections == (5, 5, 6) and rotary.freqs.shape == (3, 2, 16)
    model(torch.randn(1, 3, 4, 16, 16)).sum().backward()
