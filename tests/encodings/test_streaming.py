"""Streaming clips: a clip that starts at frame t0 (and a crop at (h0, w0)) gets, through the model, exactly the
positions of the matching slice of the whole video."""
import pytest
import torch

import visionpe as vpe

KW = dict(num_frames=8, img_size=12, tubelet_size=(2, 4, 4), embed_dim=24, depth=1, num_heads=2, num_classes=3)
WHOLE, CLIP, START = (4, 3, 3), (2, 2, 3), (1, 1, 0)  # token grids: whole video, clip, clip start (tubelets)


def slice_index(whole, clip, start) -> torch.Tensor:
    """Row-major indices of the clip's patches among the whole video's."""
    index = torch.arange(torch.Size(whole).numel()).reshape(whole)
    return index[tuple(slice(s, s + n) for s, n in zip(start, clip))].reshape(-1)


def clips(model):
    torch.manual_seed(0)
    video = torch.randn(1, 3, 8, 12, 12)
    t, h, w = (s * p for s, p in zip(START, model.patch_embed.patch_size))
    ct, ch, cw = (s * p for s, p in zip(CLIP, model.patch_embed.patch_size))
    return video, video[:, :, t:t + ct, h:h + ch, w:w + cw]


@pytest.mark.parametrize("pe", ["sincos", "learned"])
def test_tokens_encoding_of_a_clip_is_the_slice_of_the_whole(pe):
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, class_token=False, global_pool="avg", **KW).eval()
    video, clip = clips(model)
    with torch.no_grad():
        whole, _ = model.embed(video)
        part, layout = model.embed(clip, grid_offset=START)
    assert layout.grid.offset == tuple(map(float, START))
    torch.testing.assert_close(part, whole[:, slice_index(WHOLE, CLIP, START)], atol=1e-6, rtol=1e-6)
    with torch.no_grad():  # without the offset the clip would get the first frames' positions
        unshifted, _ = model.embed(clip)
    assert not torch.allclose(unshifted, part)


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi", "bucket_bias"])
def test_rotary_and_bias_of_a_clip_are_the_slice_of_the_whole(pe):
    # streaming continues integer positions: RoPE without scaling (the model default interpolates, see below)
    kwargs = {"scaling": "none"} if pe.startswith("rope") else {}
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=kwargs, **KW).eval()
    video, clip = clips(model)
    (enc,) = [e for family in ("rotary", "bias") for e in vpe.encodings_of(model)[family]][:1]
    for p in enc.parameters():
        torch.nn.init.normal_(p)
    _, whole = model.embed(video)
    _, part = model.embed(clip, grid_offset=START)
    index = torch.cat([torch.arange(1), 1 + slice_index(WHOLE, CLIP, START)])  # class token first
    with torch.no_grad():
        if enc.family == "rotary":
            torch.testing.assert_close(enc.cis(part.grid), enc.cis(whole.grid)[:, index])
        else:
            torch.testing.assert_close(enc(part.grid), enc(whole.grid)[:, index][:, :, index])


def test_clip_by_clip_logits_equal_the_sliced_video_for_relative_encodings():
    """RoPE is relative: a clip with its offset, run alone, equals the same clip without it (and the model output
    does not depend on where the clip starts), while sincos's output does."""
    rope = vpe.create_video_model("vit_tiny_patch16_224", pe="rope_axial", pe_kwargs={"scaling": "none"}, **KW).eval()
    sincos = vpe.create_video_model("vit_tiny_patch16_224", pe="sincos", **KW).eval()
    _, clip = clips(rope)
    with torch.no_grad():
        torch.testing.assert_close(rope(clip, grid_offset=START), rope(clip), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(sincos(clip, grid_offset=START), sincos(clip), atol=1e-5)


@pytest.mark.parametrize("pe,invariant", [("none", True), ("rope_axial", False), ("rope_mixed", False),
                                          ("sincos", False), ("alibi", False)])
def test_reordering_tubelets_in_time_changes_only_encoded_models(pe, invariant):
    """Without position a video model is a set function of its tubelets: moving whole tubelets in time (a cyclic
    shift, which changes temporal distances, unlike a reversal that ALiBi's symmetric distance cannot see) leaves
    the output unchanged; any encoding with a time axis makes it order-aware."""
    torch.manual_seed(0)
    # two blocks: in one block only the class token's row reaches the output, and prefix rows carry no bias
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, **{**KW, "depth": 2}).eval()
    for block in model.blocks:  # peaked attention, as in a trained model: positions change the scores visibly
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.5)
    video = torch.randn(1, 3, 8, 12, 12)
    tubelets = list(video.split(2, dim=2))  # tubelet length 2
    shifted = torch.cat(tubelets[1:] + tubelets[:1], dim=2)
    with torch.no_grad():
        same = torch.allclose(model(video), model(shifted), atol=1e-5)
    assert same == invariant


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
def test_interpolating_rope_refuses_an_offset_clip_of_another_size(pe):
    """With the model default (scaling="pi") a clip smaller than the training grid would be stretched as a whole
    input while its offset places it in a longer video: a silent wrong answer, so it is an error naming the fix."""
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=pe, **KW).eval()
    _, clip = clips(model)
    with pytest.raises(ValueError, match="scaling='none'"):
        model(clip, grid_offset=START)
    video = torch.randn(1, 3, 8, 12, 12)  # at the training grid an offset is fine (no rescaling)
    assert torch.isfinite(model(video, grid_offset=(1, 0, 0))).all()

