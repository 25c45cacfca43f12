"""video-files: folders of .mp4/.avi/.webm/.mkv clips, encoded here with PyAV (moving squares, frames numbered by
their brightness), decoded frame-accurately by torchcodec or PyAV (the same frames), sampled evenly or in strided
segments, cropped and flipped alike in every frame, and trained on by a tiny video ViT."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from torchvision.transforms import v2 as T
from trainutil import TINY, train_main

from visionpe import data as vdata
from visionpe.data import video_files

av = pytest.importorskip("av")

CODECS = {".mp4": "mpeg4", ".avi": "mpeg4", ".webm": "libvpx-vp9", ".mkv": "ffv1"}
HEIGHT, WIDTH = 32, 40
BACKENDS = [pytest.param("av"), pytest.param("torchcodec", marks=pytest.mark.skipif(
    video_files.decoder() != "torchcodec", reason="torchcodec finds no FFmpeg 4-9 libraries on this machine"))]


def write_clip(path, frames: np.ndarray, rate: int = 8) -> None:
    """``frames`` uint8 ``(T, H, W, 3)`` into ``path`` at ``rate`` frames per second, with the codec its suffix
    takes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODECS[path.suffix], rate=rate)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.bit_rate = 4_000_000
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def moving_square(count: int, step: int = 2, direction: int = 1) -> np.ndarray:
    """A bright square moving ``step`` pixels a frame along x (left to right, or back with ``direction=-1``)."""
    frames = np.full((count, HEIGHT, WIDTH, 3), 20, dtype=np.uint8)
    for k in range(count):
        x = 4 + step * k if direction > 0 else WIDTH - 12 - step * k
        frames[k, 10:18, x:x + 8] = (240, 200, 60)
    return frames


def numbered(count: int) -> np.ndarray:
    """Frame ``k`` is uniform grey ``8 + 16 k``: crops and flips keep its number readable."""
    return np.stack([np.full((HEIGHT, WIDTH, 3), 8 + 16 * k, dtype=np.uint8) for k in range(count)])


def square_x(frame: torch.Tensor) -> float:
    """Column of the square's centre in a decoded uint8 frame ``(3, H, W)``."""
    cols = torch.nonzero(frame[0] > 128, as_tuple=True)[1].float()
    return cols.mean().item() - 3.5


def frame_numbers(clip: torch.Tensor, ds) -> list[int]:
    """The numbers of the frames of a normalised clip ``(3, T, H, W)`` of :func:`numbered` frames."""
    pixels = (clip * ds.std + ds.mean) * 255
    return [round((pixels[:, t].mean().item() - 8) / 16) for t in range(clip.shape[1])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suffix", list(CODECS))
def test_every_container_gives_the_frames_asked_for(tmp_path, suffix, backend):
    path = tmp_path / f"clip{suffix}"
    write_clip(path, moving_square(12))
    counts = []

    def choose(count):
        counts.append(count)
        return [0, 5, 11, 11, 3]

    frames = video_files.decode_clip(str(path), choose, backend)
    assert counts == [12] and frames.shape == (5, 3, HEIGHT, WIDTH) and frames.dtype == torch.uint8
    assert [round((square_x(f) - 4) / 2) for f in frames] == [0, 5, 11, 11, 3]  # frame-accurate, in the asked order


@pytest.mark.skipif(video_files.decoder() != "torchcodec", reason="torchcodec finds no FFmpeg 4-9 libraries")
@pytest.mark.parametrize("suffix", list(CODECS))
def test_torchcodec_and_pyav_decode_the_same_frames(tmp_path, suffix):
    path = tmp_path / f"clip{suffix}"
    write_clip(path, moving_square(16))
    choose = lambda count: video_files.clip_indices(count, 6, stride=2)
    assert torch.equal(video_files.decode_clip(str(path), choose, "torchcodec"),
                       video_files.decode_clip(str(path), choose, "av"))


def test_decoder_falls_back_to_pyav_and_names_the_install(monkeypatch):
    video_files.decoder.cache_clear()
    try:
        torchcodec = pytest.importorskip("torchcodec")
        monkeypatch.setattr(torchcodec, "ffmpeg_major_version", None)  # installed, but no FFmpeg found
        assert video_files.decoder() == "av"
        video_files.decoder.cache_clear()
        monkeypatch.setitem(sys.modules, "torchcodec", None)
        monkeypatch.setitem(sys.modules, "av", None)
        with pytest.raises(vdata.DataMissing, match=r"pip install 'visionpe\[video\]'"):
            video_files.decoder()
    finally:
        video_files.decoder.cache_clear()
    with pytest.raises(ValueError, match="backend='ffmpeg' is not supported"):
        video_files.decode_clip("x.mp4", lambda n: [0], "ffmpeg")


def test_clip_indices_even_or_strided_segments():
    assert video_files.clip_indices(10, 4) == [0, 3, 6, 9]
    assert video_files.clip_indices(3, 5) == [0, 0, 1, 2, 2]  # a short clip repeats frames evenly
    assert video_files.clip_indices(20, 4, stride=3) == [5, 8, 11, 14]  # the centre segment: starts 0..10
    assert video_files.clip_indices(20, 4, stride=3, start=10) == [10, 13, 16, 19]
    assert video_files.clip_indices(5, 4, stride=2) == [0, 1, 3, 4]  # shorter than the segment: read evenly
    with pytest.raises(ValueError, match=r"start=11 must be in \[0, 10\]"):
        video_files.clip_indices(20, 4, stride=3, start=11)
    with pytest.raises(ValueError, match="at least one frame"):
        video_files.clip_indices(0, 4)


def numbered_folder(tmp_path, frames: int = 15):
    for split in ("train", "val"):
        for c, suffix in (("a", ".mp4"), ("b", ".mkv")):
            write_clip(tmp_path / split / c / f"clip{suffix}", numbered(frames))
    return tmp_path


def test_training_draws_a_segment_per_epoch_evaluation_takes_the_centre(tmp_path):
    root = numbered_folder(tmp_path)
    train = vdata.build_dataset("video-files", "train", 16, data_dir=str(root), num_frames=4, frame_stride=3, seed=2)
    starts = []
    for epoch in range(8):
        train.set_epoch(epoch)
        numbers = frame_numbers(train[0][0], train)
        assert numbers == list(range(numbers[0], numbers[0] + 10, 3)) and 0 <= numbers[0] <= 15 - 10
        assert frame_numbers(train[0][0], train) == numbers  # a function of (seed, epoch, index)
        starts.append(numbers[0])
    assert len(set(starts)) >= 3
    val = vdata.build_dataset("video-files", "val", 16, data_dir=str(root), num_frames=4, frame_stride=3)
    assert frame_numbers(val[1][0], val) == [2, 5, 8, 11]  # the centre segment (starts 0..5)
    spread = vdata.build_dataset("video-files", "val", 16, data_dir=str(root), num_frames=5)
    assert frame_numbers(spread[0][0], spread) == [0, 4, 7, 10, 14]  # evenly over the clip
    assert spread[0][0].shape == (3, 5, 16, 16) and spread[0][1] == 0 and spread[1][1] == 1


def test_one_crop_and_one_flip_for_every_frame_of_a_clip(tmp_path):
    still = np.repeat(moving_square(1), 6, axis=0)  # six identical, left-right asymmetric frames
    still[:, 24:, :10] = (30, 220, 90)
    write_clip(tmp_path / "train" / "a" / "still.mkv", still)
    write_clip(tmp_path / "train" / "b" / "still.mkv", still)  # a classifier needs 2 classes
    ds = vdata.build_dataset("video-files", "train", 16, data_dir=str(tmp_path), num_frames=6, seed=4)
    views = []
    for epoch in range(6):
        ds.set_epoch(epoch)
        clip = ds[0][0]
        assert all(torch.equal(clip[:, t], clip[:, 0]) for t in range(6)), epoch  # the same crop in every frame
        views.append(clip[:, 0])
    assert len({v.sum().item() for v in views}) >= 4  # a new crop each epoch
    # with the whole frame as the only crop, a view is the resized frame or its mirror, and both occur
    whole = video_files.VideoFileDataset(str(tmp_path / "train"), 16, 6, augment=True, seed=4, scale=(1.0, 1.0),
                                         ratio=(WIDTH / HEIGHT, WIDTH / HEIGHT))
    frames = video_files.decode_clip(str(tmp_path / "train" / "a" / "still.mkv"), lambda n: [0])
    resized = whole.normalize(T.functional.resize(frames, [16, 16], interpolation=T.InterpolationMode.BICUBIC,
                                                  antialias=True).permute(1, 0, 2, 3))[:, 0]
    flips = []
    for epoch in range(10):
        whole.set_epoch(epoch)
        view = whole[0][0][:, 0]
        assert torch.equal(view, resized) or torch.equal(view, resized.flip(-1)), epoch
        flips.append(torch.equal(view, resized.flip(-1)))
    assert any(flips) and not all(flips)


def test_evaluation_resizes_the_shorter_side_and_takes_the_centre(tmp_path):
    write_clip(tmp_path / "val" / "a" / "move.webm", moving_square(9))
    write_clip(tmp_path / "val" / "b" / "move.webm", moving_square(9))  # a classifier needs 2 classes
    ds = vdata.build_dataset("video-files", "val", 24, data_dir=str(tmp_path), num_frames=3)
    frames = video_files.decode_clip(str(tmp_path / "val" / "a" / "move.webm"), lambda n: [0, 4, 8])
    expected = T.Compose([T.Resize(24, interpolation=T.InterpolationMode.BICUBIC, antialias=True),
                          T.CenterCrop(24)])(frames)
    torch.testing.assert_close(ds[0][0], ds.normalize(expected.permute(1, 0, 2, 3)), rtol=0, atol=0)
    ds.set_epoch(5)
    assert torch.equal(ds[0][0], ds.normalize(expected.permute(1, 0, 2, 3)))  # no augmentation in evaluation


def test_folder_layout_and_its_errors(tmp_path):
    write_clip(tmp_path / "train" / "b" / "x.avi", moving_square(4))
    write_clip(tmp_path / "train" / "a" / "y.mp4", moving_square(4))
    (tmp_path / "train" / "a" / "notes.txt").write_text("not a clip")
    write_clip(tmp_path / "val" / "b" / "z.webm", moving_square(4))
    train = vdata.build_dataset("video-files", "train", 8, data_dir=str(tmp_path), num_frames=2)
    val = vdata.build_dataset("video-files", "val", 8, data_dir=str(tmp_path), num_frames=2)
    assert train.classes == ["a", "b"] and len(train) == 2 and val.labels == [1]  # val numbered by train's classes
    assert vdata.info("video-files") == {"num_classes": None, "in_chans": 3, "synthetic": False, "video": True}
    write_clip(tmp_path / "val" / "c" / "w.mp4", moving_square(4))
    with pytest.raises(vdata.DataMissing, match="class folders the training split lacks: c"):
        vdata.build_dataset("video-files", "val", 8, data_dir=str(tmp_path), num_frames=2)
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    with pytest.raises(vdata.DataMissing, match="holds no clips"):
        vdata.build_dataset("video-files", "train", 8, data_dir=str(tmp_path / "empty"), num_frames=2)
    with pytest.raises(vdata.DataMissing, match="needs --data-dir"):
        vdata.build_dataset("video-files", "train", 8, num_frames=2)
    with pytest.raises(ValueError, match="does not take frame_stride"):
        vdata.build_dataset("moving-shapes", "train", 8, num_samples=2, num_frames=2, frame_stride=2)
    (tmp_path / "train" / "a" / "broken.mp4").write_bytes(b"\x00" * 64)
    broken = vdata.build_dataset("video-files", "train", 8, data_dir=str(tmp_path), num_frames=2)
    with pytest.raises(ValueError, match="cannot decode .*broken.mp4"):
        broken[0]
    subset = vdata.build_dataset("video-files", "train", 8, data_dir=str(tmp_path), num_frames=2, num_samples=1)
    assert len(subset) == 1


def ramp(count: int) -> np.ndarray:
    """Frames brightening from left to right: any crop of one still does, and its mirror darkens."""
    row = np.linspace(0, 255, WIDTH).astype(np.uint8)
    return np.broadcast_to(row[None, None, :, None], (count, HEIGHT, WIDTH, 3)).copy()


def brightens_to_the_right(clip: torch.Tensor) -> list[bool]:
    """For each frame of a normalised clip ``(3, T, H, W)``: does its brightness grow from left to right?"""
    columns = clip.mean(dim=(0, 2))  # (T, W)
    return [bool(c[-1] > c[0]) for c in columns]


def ramp_folder(tmp_path):
    for split in ("train", "val"):
        for c in ("a", "b"):
            for i in range(3):
                write_clip(tmp_path / split / c / f"{i}.mp4", ramp(6))
    return tmp_path


def test_hflip_0_flips_no_training_clip_and_the_default_flips_some(tmp_path):
    """--hflip reaches video-files (a direction-of-motion set needs 0): through the run's settings, with --hflip 0
    no training clip of any epoch is mirrored (no note calls the flag ignored); by default about half are."""
    from visionpe.train import sampling, settings
    root = ramp_folder(tmp_path)
    base = {"data": "video-files", "data_dir": str(root), "num_frames": 2, "img_size": 16, "output": str(tmp_path)}
    kept = settings.resolve({**base, "hflip": 0.0})
    ds = sampling.dataset(kept, "train", 16)
    assert ds.hflip == 0.0 and sampling.data_notes(kept) == []
    default = sampling.dataset(settings.resolve(base), "train", 16)
    assert default.hflip == 0.5
    unflipped, flipped = [], []
    for epoch in range(4):
        ds.set_epoch(epoch), default.set_epoch(epoch)
        for i in range(len(ds)):
            unflipped += brightens_to_the_right(ds[i][0])
            flipped += brightens_to_the_right(default[i][0])
    assert all(unflipped) and len(unflipped) == 4 * 6 * 2
    assert 0 < sum(flipped) < len(flipped)
    with pytest.raises(ValueError, match="hflip must be <= 1.0"):
        video_files.VideoFileDataset(str(root / "train"), 16, 2, hflip=1.5)


def test_a_stride_no_clip_holds_is_refused_and_a_short_clip_is_read_evenly(tmp_path):
    for c in ("a", "b"):
        write_clip(tmp_path / "train" / c / "short.mp4", numbered(6))
    with pytest.raises(ValueError, match=r"frame_stride 3: 4 frames 3 apart span 10 frames, and none of 2 clips .*"
                                         r"has 6\); lower --frame-stride"):
        vdata.build_dataset("video-files", "train", 16, data_dir=str(tmp_path), num_frames=4, frame_stride=3)
    write_clip(tmp_path / "train" / "b" / "zlong.mp4", numbered(12))
    ds = vdata.build_dataset("video-files", "train", 16, data_dir=str(tmp_path), num_frames=4, frame_stride=3,
                             augment=False)
    assert frame_numbers(ds[0][0], ds) == [0, 2, 3, 5]  # 6 frames: spread evenly, as without a stride
    assert frame_numbers(ds[2][0], ds) == [1, 4, 7, 10]  # 12 frames: the centre segment


@pytest.mark.parametrize("cut", [0.5, 0.8])
def test_a_truncated_file_is_one_error_naming_it(tmp_path, cut):
    write_clip(tmp_path / "whole.mp4", numbered(12))
    data = (tmp_path / "whole.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[:int(len(data) * cut)])
    for call in (lambda: video_files.decode_clip(str(tmp_path / "cut.mp4"), lambda n: [0, 1]),
                 lambda: video_files.clip_length(str(tmp_path / "cut.mp4"))):
        with pytest.raises(vdata.DataDamaged, match=r"video-files: cannot decode .*cut.mp4 \(.*truncated") as info:
            call()
        assert "\n" not in str(info.value)
    assert video_files.clip_length(str(tmp_path / "whole.mp4")) == 12


def test_a_tiny_video_vit_trains_on_video_files_from_image_weights(tmp_path):
    """A tubelet ViT from timm image weights (--pretrained-path: the patch embedding inflated over the tubelet), on
    clips of every container, evaluated at other frame counts and sizes."""
    image = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, embed_dim=16,
                              depth=1, num_heads=2, num_classes=5)
    save_file({k: v.contiguous() for k, v in image.state_dict().items()}, tmp_path / "image.safetensors")
    for split, count in (("train", 4), ("val", 2)):
        for c, direction in (("right", 1), ("left", -1)):
            for i in range(count):
                write_clip(tmp_path / "clips" / split / c / f"{i}{list(CODECS)[i % 4]}",
                           moving_square(10 + i, direction=direction))
    out = tmp_path / "run"
    summary = train_main([*TINY, "--data", "video-files", "--data-dir", str(tmp_path / "clips"), "--num-frames", "4",
                          "--frame-stride", "2", "--batch-size", "4", "--epochs", "1", "--pe", "rope_mixed+learned",
                          "--tubelet-size", "2", "4", "4", "--eval-frames", "2", "--eval-res", "24", "--channels-last",
                          "--pretrained", "--pretrained-path", str(tmp_path / "image.safetensors"),
                          "--output", str(out)])
    assert summary["num_frames"] == 4 and summary["data"] == "video-files"
    init = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert init["kind"] == "init" and "pos_embed -> pe_tokens.table" in init["converted"]
    assert any("inflated over 2 frames" in c for c in init["converted"])
    assert set(summary["results"]["last"]) == {"2x16", "2x24", "4x16", "4x24"}
    assert summary["final_train_loss"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suffix", list(CODECS))
def test_frame_rate_is_the_containers(tmp_path, suffix, backend):
    for rate in (12, 24):
        write_clip(tmp_path / f"{rate}{suffix}", numbered(6), rate=rate)
        assert video_files.frame_rate(str(tmp_path / f"{rate}{suffix}"), backend) == pytest.approx(rate)
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    with pytest.raises(vdata.DataDamaged, match="cannot decode .*junk.mp4"):
        video_files.frame_rate(str(tmp_path / "junk.mp4"), backend)


def test_time_step_is_qwen25_vl_second_per_grid_t_times_tokens_per_second():
    """Qwen2.5-VL: ``second_per_grid_t = temporal_patch_size / fps`` of the sampled frames, and a temporal token's
    position is ``t * second_per_grid_t * tokens_per_second``; frames sampled ``s`` apart are at ``fps / s``."""
    fps, tps = 24.0, 2.0
    for stride, patch in ((1, 2), (3, 2), (2, 1)):
        indices = list(range(5, 5 + 8 * stride, stride))
        assert video_files.time_step(indices, fps, tps, patch) == pytest.approx(patch / (fps / stride) * tps)
    assert video_files.time_step([0, 8, 15, 23], fps, tps) == pytest.approx(23 / 3 / fps * tps)  # the mean distance
    assert video_files.time_step([4], fps, tps) == pytest.approx(1 / fps * tps)


def test_the_same_motion_at_12_and_24_fps_gets_the_same_time_steps(tmp_path):
    """One second of a square moving 24 px: 24 frames at 24 fps read 2 apart, and 12 frames at 12 fps read 1 apart,
    are the same frames in time, so each clip's time step (and thus its tokens' time positions) is the same."""
    for split in ("train", "val"):
        for c in ("a", "b"):
            write_clip(tmp_path / "24" / split / c / "m.mp4", moving_square(24, step=1), rate=24)
            write_clip(tmp_path / "12" / split / c / "m.mp4", moving_square(12, step=2), rate=12)
    steps = {}
    for rate, stride in ((24, 2), (12, 1)):
        ds = vdata.build_dataset("video-files", "val", 16, data_dir=str(tmp_path / str(rate)), num_frames=4,
                                 frame_stride=stride, tokens_per_second=2.0, tubelet_frames=2)
        clip, label, steps[rate] = ds[0]
        assert clip.shape == (3, 4, 16, 16) and label == 0
    assert steps[24] == pytest.approx(steps[12]) == pytest.approx(2 * (2 / 24) * 2.0)  # 2 frames of 1/12 s, 2/s
    index_time = vdata.build_dataset("video-files", "val", 16, data_dir=str(tmp_path / "24"), num_frames=4)
    assert len(index_time[0]) == 2  # without tokens_per_second: (clip, label)
    with pytest.raises(ValueError, match="moving-shapes does not take tokens_per_second"):
        vdata.build_dataset("moving-shapes", "train", 8, num_samples=2, num_frames=2, tokens_per_second=2.0)
    with pytest.raises(ValueError, match="tokens_per_second must be > 0"):
        vdata.build_dataset("video-files", "val", 16, data_dir=str(tmp_path / "24"), num_frames=4,
                            tokens_per_second=0.0)


def test_a_tiny_video_vit_trains_with_each_clips_frame_rate(tmp_path, monkeypatch, capsys):
    """``--tokens-per-second``: clips at 8 and 16 fps in one run; every batch reaches the model's time axis with
    each clip's own step from its container (Qwen2.5-VL's formula: 2-frame tubelets of frames 2 apart at 2/s)."""
    from visionpe.backbones import vit
    seen = set()

    def spy(grid, time_spacing, batch):
        seen.update([None] if time_spacing is None else time_spacing.tolist())  # (B,) steps from the loader
        return time_layout(grid, time_spacing, batch)
    time_layout = vit.time_layout
    monkeypatch.setattr(vit, "time_layout", spy)
    for split, count in (("train", 4), ("val", 2)):
        for c, direction in (("right", 1), ("left", -1)):
            for i in range(count):
                rate = 8 if i % 2 else 16
                write_clip(tmp_path / "clips" / split / c / f"{i}.mp4", moving_square(12, direction=direction), rate)
    summary = train_main([*TINY, "--data", "video-files", "--data-dir", str(tmp_path / "clips"), "--num-frames", "4",
                          "--frame-stride", "2", "--batch-size", "4", "--epochs", "1", "--pe", "rope_mixed",
                          "--tubelet-size", "2", "4", "4", "--tokens-per-second", "2", "--eval-frames", "2",
                          "--output", str(tmp_path / "run")])
    assert summary["tokens_per_second"] == 2.0 and summary["final_train_loss"] > 0
    assert "time 2 positions/s at each clip's frame rate" in capsys.readouterr().out
    assert sorted(seen) == pytest.approx([2 * 2 / 16 * 2.0, 2 * 2 / 8 * 2.0])  # 0.5 at 16 fps, 1.0 at 8 fps
