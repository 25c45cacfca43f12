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


# -- absolute time: clips at different frame rates on one time axis ----------------------------------------------
TIMED = dict(num_frames=12, img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2, depth=1, num_classes=3)
SECONDS_PER_POSITION = 1 / 12  # one time position: two frames at 24 fps (the tubelet's), one tubelet at 12 fps is 2


def moving_square(fps: int, seconds: float, speed: float = 8.0) -> torch.Tensor:
    """A bright 4 px square moving ``speed`` pixels a second along x, rendered at ``fps`` for ``seconds``: a clip
    ``(1, 3, fps * seconds, 16, 16)``, the same motion at every frame rate."""
    frames = round(fps * seconds)
    clip = torch.zeros(1, 3, frames, 16, 16)
    for k in range(frames):
        x = round(speed * k / fps)
        clip[0, :, k, 6:10, x:x + 4] = 1.0
    return clip


def time_step(fps: int) -> float:
    """The time coordinate step between neighbouring temporal tokens of a clip at ``fps``: a tubelet of 2 frames lasts
    2 / fps seconds, ``SECONDS_PER_POSITION`` is one position."""
    return 2 / fps / SECONDS_PER_POSITION


def per_token(table: torch.Tensor, grid: Grid) -> torch.Tensor:
    """A table over a grid's tokens ``(..., P + N, ...)`` (token axis -2 of rows, or 1 of a ``(heads, T, ...)``)
    -> its patches on the grid ``(T, H, W, ...)``: ``table`` given as ``(P + N, ...)``."""
    return table[grid.prefix:].reshape(*grid.shape, *table.shape[1:])


@pytest.mark.parametrize("pe", ["rope_axial", "alibi"])
def test_the_same_motion_at_12_and_24_fps_gets_the_same_positions(pe):
    """A second of a moving square at 12 fps (12 frames, 6 temporal tokens, step 2) and at 24 fps (24 frames, 12
    tokens, step 1), and its first half second at 24 fps (12 frames, step 1): with time_spacing, token ``k`` at 12 fps
    and token ``2k`` at 24 fps (the same instant) get the same time coordinate, the same rotation (rope_axial, whose
    model interpolates to its 6-token training grid: the absolute time axis is left alone) and the same bias to every
    pair (alibi); the half-second clip's tokens sit at the first half of the second. With index time the half second
    and the whole second at 12 fps get the same positions (and rope_axial's interpolation puts the 24 fps clip on the
    12 fps one only because the two last the same second)."""
    torch.manual_seed(0)
    model = create_video_model("vit_tiny_patch16_224", pe=pe, **TIMED).eval()
    slow, fast, half = moving_square(12, 1.0), moving_square(24, 1.0), moving_square(24, 0.5)
    grids = {name: model.embed(clip, time_spacing=time_step(fps))[1].grid
             for name, clip, fps in (("slow", slow, 12), ("fast", fast, 24), ("half", half, 24))}
    coords = {name: per_token(torch.cat([torch.zeros(g.prefix, 3), g.coords()]), g) for name, g in grids.items()}
    assert coords["slow"].shape[0] == 6 and coords["fast"].shape[0] == 12
    torch.testing.assert_close(coords["slow"], coords["fast"][::2], rtol=0, atol=0)  # the same instants
    torch.testing.assert_close(coords["half"], coords["fast"][:6], rtol=0, atol=0)
    assert coords["slow"][1, 0, 0, 0] == 2.0 and coords["half"][1, 0, 0, 0] == 1.0  # 1/6 s and 1/12 s
    if pe == "rope_axial":
        rotary = encodings_of(model)["rotary"][0]
        assert rotary.scaling == "pi" and rotary.ref_shape == (6, 4, 4)
        rows = {name: per_token(rotary.rotations(g)[0], g) for name, g in grids.items()}  # (T, H, W, pairs, 2)
    else:
        bias = encodings_of(model)["bias"][0]
        rows = {name: bias(g)[:, g.prefix:, g.prefix:].reshape(2, *g.shape, *g.shape) for name, g in grids.items()}
        rows = {name: r.movedim(0, -1) for name, r in rows.items()}  # (T, H, W, T, H, W, heads): every pair
    fast_at_slow = rows["fast"][::2, :, :, ::2] if pe == "alibi" else rows["fast"][::2]
    torch.testing.assert_close(rows["slow"], fast_at_slow, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows["half"], rows["fast"][:6, :, :, :6] if pe == "alibi" else rows["fast"][:6],
                               rtol=1e-6, atol=1e-6)
    assert not torch.allclose(rows["slow"], rows["half"], atol=1e-4)  # a second is not half a second
    # index time: the half second and the whole second at 12 fps have one grid, so the same positions
    index = {name: model.embed(clip)[1].grid for name, clip in (("slow", slow), ("half", half))}
    assert index["slow"] == index["half"] and index["slow"].spacing is None


def test_clips_of_one_batch_take_their_own_time_step():
    """Per-clip steps in one batch (a (B,) tensor): every clip's logits, features and gradients are those it gets
    alone, for each family; equal steps are one grid; the index-time model is unchanged by time_spacing=1 when the
    training grid needs no interpolation."""
    torch.manual_seed(0)
    clips = torch.cat([moving_square(12, 1.0), moving_square(24, 0.5), moving_square(12, 1.0).flip(-1)])
    steps = torch.tensor([time_step(12), time_step(24), time_step(12)])
    for pe in ("rope_axial", "sincos", "fire", "videorope+alibi", "string"):
        model = create_video_model("vit_tiny_patch16_224", pe=pe, **TIMED)
        _, layout = model.embed(clips, time_spacing=steps)
        assert [g.spacing for g in layout.grids] == [(2.0, None, None), (1.0, None, None), (2.0, None, None)]
        features = model.forward_features(clips, time_spacing=steps)
        alone = torch.cat([model.forward_features(clips[i:i + 1], time_spacing=float(s)) for i, s in enumerate(steps)])
        torch.testing.assert_close(features, alone, rtol=1e-5, atol=1e-5)
        index = model.forward_features(clips)  # the steps were read (float32 noise is ~1e-7 here)
        assert (features - index).abs().max() > 1e-5
        features.square().sum().backward()  # gradients through the per-clip groups
        assert [n for n, p in model.named_parameters() if p.grad is None] == ["head.weight", "head.bias"]
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model(clips, time_spacing=torch.ones(3)), model(clips, time_spacing=1.0))
            assert model.embed(clips, time_spacing=torch.full((3,), 2.0))[1].grid.spacing == (2.0, None, None)


def test_concurrent_forwards_at_different_time_steps_equal_single_threaded():
    """The time step travels with the call: threads calling one model at different steps (one, per clip, none)
    never see each other's."""
    from conftest import run_concurrently
    torch.manual_seed(0)
    model = create_video_model("vit_tiny_patch16_224", pe="rope_mixed+alibi", **TIMED).eval()
    clips = torch.cat([moving_square(12, 1.0), moving_square(24, 0.5)])
    inputs = [(clips, torch.tensor([2.0, 1.0])), (clips, 2.0), (clips, None), (moving_square(24, 1.0), 1.0),
              (clips[:1], 0.5)]
    errors = run_concurrently(lambda pair: model.forward_features(pair[0], time_spacing=pair[1]), inputs,
                              iterations=20, threads=3)
    assert not errors, errors[:3]


@pytest.mark.parametrize("pe", ["learned", "rel_bias", "bucket_bias", "peg", "rope_axial+learned"])
def test_table_encodings_refuse_a_time_step(pe):
    model = create_video_model("vit_tiny_patch16_224", pe=pe, **TIMED)
    model(moving_square(12, 1.0))  # index time works
    with pytest.raises(ValueError, match=r"indexes a table by integer positions.*spacing \(2.0, None, None\)"):
        model(moving_square(12, 1.0), time_spacing=2.0)


@pytest.mark.parametrize("time_spacing,message", [
    (0.0, "time_spacing must be > 0"), (-1.0, "time_spacing must be > 0"), (float("nan"), "finite"),
    ("2", "finite number"), (torch.tensor([1.0, 2.0, 3.0]), "3 values but the batch has 2 clips"),
    (torch.ones(2, 1), r"\(batch,\) real tensor"), (torch.tensor([1.0, 0.0]), "must be > 0"),
])
def test_bad_time_steps_are_clear_errors(time_spacing, message):
    model = create_video_model("vit_tiny_patch16_224", pe="rope_axial", **TIMED)
    with pytest.raises(ValueError, match=message):
        model(torch.cat([moving_square(12, 1.0)] * 2), time_spacing=time_spacing)


def test_time_step_needs_a_clip_and_every_patch():
    import visionpe as vpe
    image = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", img_size=16, patch_size=4, embed_dim=24,
                             num_heads=2, depth=1, num_classes=3)
    with pytest.raises(ValueError, match=r"grid \(4, 4\) has 2 axes \(time_spacing is for video models\)"):
        image(torch.randn(1, 3, 16, 16), time_spacing=1.0)
    model = create_video_model("vit_tiny_patch16_224", pe="rope_axial", **TIMED)
    clips = torch.cat([moving_square(12, 1.0)] * 2)
    tokens, keep = model.forward_masked(clips, keep=torch.tensor([[0, 5]]), time_spacing=2.0)  # one step: a Layout
    assert tokens.shape == (2, 3, 24)
    with pytest.raises(ValueError, match="patch dropout and masking take one time step"):
        model.forward_masked(clips, keep=torch.tensor([[0, 5]]), time_spacing=torch.tensor([1.0, 2.0]))
