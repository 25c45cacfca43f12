"""Folders of video files: ``video-files`` reads ``data_dir/train/<class>/<clip>.mp4|avi|webm|mkv`` (and ``val/``),
the layout UCF101, HMDB51, Kinetics and Something-Something take once their split lists are made into folders
(README: "Video files").

Decoding: PyTorch's ``torchcodec`` when it loads (it needs FFmpeg 4-9 shared libraries on the system), else PyAV
(``av``, whose wheels carry FFmpeg). Both give the same frames (tested). Measured on one thread (the medians of 9
reads of 16 frames, spread evenly or a strided segment, from 250-frame 224 px H.264 clips with x264's default and a
32-frame keyframe interval): torchcodec 1.2-2.6x faster than PyAV, because it seeks to the keyframe before a frame
instead of decoding from the start. :func:`decoder` says which one this machine uses.

Sampling of a clip of ``n`` frames into ``T`` (``num_frames``), by :func:`clip_indices`:

- default: ``T`` frames spread evenly over the whole clip (``linspace(0, n - 1, T)`` rounded), in training and
  evaluation alike;
- ``frame_stride=s``: a segment of ``T`` frames ``s`` apart; in training its start is drawn uniformly from the starts
  that fit, in evaluation it is the centre segment. A clip shorter than the segment (``(T - 1) s + 1`` frames) is
  read as without a stride, ``T`` frames spread evenly over it: clips of a real set differ in length, and clamping
  the segment to the clip's last frame would freeze its end. When none of :data:`STRIDE_PROBES` clips spread over a
  split holds the segment, the data set is refused (the stride cannot be what was meant).

Space: in training one random-resized crop (torchvision's ``RandomResizedCrop`` draw: area ``scale`` (0.08, 1), aspect
``ratio`` (3/4, 4/3)) and one horizontal flip with probability ``hflip`` (default 0.5; 0 for a set whose labels are
directions, e.g. Something-Something's "moving left" / "moving right") for every frame of the clip; in evaluation the
shorter side is resized to ``img_size`` and the centre ``img_size`` square kept. Resizing is bicubic with
antialiasing. Every random draw is a function of ``(seed, epoch, index)`` only, so a clip is the same on every process
and after ``--resume``.

Time: with ``tokens_per_second=R`` a sample is ``(clip, label, time_step)``: ``time_step`` is the distance between
neighbouring temporal tokens on an absolute time axis of ``R`` positions per second, Qwen2.5-VL's
``second_per_grid_t * tokens_per_second`` with ``second_per_grid_t = tubelet_frames * (mean distance of the sampled
frames) / fps`` and ``fps`` the container's (:func:`frame_rate`). A model takes it as ``model(clip,
time_spacing=time_step)``, so clips of different frame rates (or strides) put the same motion at the same time
positions.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

from .._checks import check_number, check_positive_int
from .base import PositionDataset, fixed_subset
from .folders import IMAGENET_MEAN, IMAGENET_STD
from .registry import DataDamaged, DataMissing, register_dataset

VIDEO_SUFFIXES = (".mp4", ".avi", ".webm", ".mkv")
DECODERS = ("torchcodec", "av")
STRIDE_PROBES = 8  # clips of a split whose lengths are read to check that a frame_stride segment fits one


@lru_cache(maxsize=None)
def decoder() -> str:
    """The decoder of this machine: ``"torchcodec"`` if it imports and finds FFmpeg, else ``"av"`` (PyAV); a
    :class:`DataMissing` naming the install when neither is there."""
    try:
        import torchcodec
        if torchcodec.ffmpeg_major_version is not None:
            return "torchcodec"
    except (ImportError, OSError, RuntimeError):
        pass
    try:
        import av  # noqa: F401
    except ImportError:
        raise DataMissing("video-files needs a video decoder: pip install 'visionpe[video]' (PyAV; torchcodec is used "
                          "instead when FFmpeg 4-9 is installed)") from None
    return "av"


def clip_indices(num_available: int, num_frames: int, stride: int | None = None, start: int | None = None) -> list[int]:
    """The frames of a clip of ``num_available`` frames to read, ``num_frames`` of them.

    ``stride=None``: spread evenly over the clip (frames repeat in a clip of fewer than ``num_frames``).
    ``stride=s``: ``num_frames`` frames ``s`` apart from ``start`` (default the centre segment; a start beyond
    :func:`latest_start` is a ValueError); a clip shorter than the segment is read as with ``stride=None``."""
    if num_available < 1:
        raise ValueError(f"a clip needs at least one frame, got num_available={num_available}")
    latest = 0 if stride is None else latest_start(num_available, num_frames, stride)
    start = latest // 2 if start is None else start
    if not 0 <= start <= latest:
        raise ValueError(f"start={start} must be in [0, {latest}] for {num_frames} frames {stride} apart in a clip "
                         f"of {num_available}")
    if stride is None or segment_length(num_frames, stride) > num_available:
        return [int(v) for v in np.linspace(0, num_available - 1, num_frames).round()]
    return [start + k * stride for k in range(num_frames)]


def segment_length(num_frames: int, stride: int) -> int:
    """Frames a segment of ``num_frames`` frames ``stride`` apart spans."""
    return (num_frames - 1) * stride + 1


def latest_start(num_available: int, num_frames: int, stride: int) -> int:
    """The last start of a segment of ``num_frames`` frames ``stride`` apart that fits in the clip (0 if none fits)."""
    return max(num_available - segment_length(num_frames, stride), 0)


def decode_clip(path: str, choose: Callable[[int], list[int]], backend: str | None = None) -> torch.Tensor:
    """The frames ``choose(n)`` of the video file ``path`` (``n``: its number of frames), uint8 ``(T, 3, H, W)`` RGB.

    ``backend``: ``"torchcodec"`` or ``"av"`` (default: :func:`decoder`). A file that cannot be decoded is a
    ValueError naming it."""
    read = {"torchcodec": _decode_torchcodec, "av": _decode_av}
    return _reading(path, backend, lambda name: read[name](path, choose))


def clip_length(path: str, backend: str | None = None) -> int:
    """The number of frames of the video file ``path``, as :func:`decode_clip` counts them; a file that cannot be
    read is a :class:`DataDamaged` naming it."""
    count = {"torchcodec": lambda: _torchcodec_decoder(path).metadata.num_frames, "av": lambda: _av_length(path)}
    return _reading(path, backend, lambda name: count[name]())


def frame_rate(path: str, backend: str | None = None) -> float:
    """Frames per second of the video file ``path``, from its container (the stream's average rate, FFmpeg's
    ``avg_frame_rate``: the same from either decoder); a file that cannot be read or that states no rate is a
    :class:`DataDamaged` naming it."""
    rate = {"torchcodec": lambda: _torchcodec_rate(path), "av": lambda: _av_rate(path)}

    def read(name: str) -> float:
        fps = rate[name]()
        if fps is None or not float(fps) > 0:
            raise ValueError(f"the container states no frame rate (got {fps})")
        return float(fps)
    return _reading(path, backend, read)


def time_step(indices: list[int], fps: float, tokens_per_second: float, tubelet_frames: int = 1) -> float:
    """The step between neighbouring temporal tokens of a clip of the frames ``indices`` (of a video at ``fps``) on an
    axis of ``tokens_per_second`` positions per second, each token ``tubelet_frames`` frames: Qwen2.5-VL's
    ``second_per_grid_t * tokens_per_second``, with the frames' mean distance (1 for a single frame)."""
    spread = (indices[-1] - indices[0]) / (len(indices) - 1) if len(indices) > 1 else 1.0  # frames between samples
    return tubelet_frames * spread / fps * tokens_per_second


def _reading(path: str, backend: str | None, read: Callable[[str], object]):
    """``read(backend)`` (default backend: :func:`decoder`), a file that cannot be read a :class:`DataDamaged` (a
    ValueError) naming it."""
    backend = backend or decoder()
    if backend not in DECODERS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: {', '.join(DECODERS)}")
    try:
        return read(backend)
    except (ValueError, RuntimeError, OSError, EOFError) as err:  # PyAV's EOFError of a truncated file is no OSError
        message = " ".join(str(err).split())[:300]
        raise DataDamaged(f"video-files: cannot decode {path} ({type(err).__name__}: {message}): a damaged, truncated "
                          "or not a video file (remove or replace it)") from None


def _torchcodec_decoder(path: str):
    from torchcodec.decoders import VideoDecoder
    return VideoDecoder(path, seek_mode="exact", dimension_order="NCHW")


def _decode_torchcodec(path: str, choose) -> torch.Tensor:
    video = _torchcodec_decoder(path)
    return video.get_frames_at(choose(video.metadata.num_frames)).data


def _av_stream(container):
    """The first video stream of an open PyAV container and its number of frames."""
    if not container.streams.video:
        raise ValueError("the file holds no video stream (truncated, or not a video?)")
    stream = container.streams.video[0]
    count = stream.frames  # from the header; 0 where the container does not store it (webm, mkv)
    if count == 0:
        count = sum(1 for packet in container.demux(stream) if packet.size)
        container.seek(0)
    return stream, count


def _torchcodec_rate(path: str):
    """The header's average rate (FFmpeg's, as PyAV reads it), else torchcodec's count over the duration."""
    metadata = _torchcodec_decoder(path).metadata
    return getattr(metadata, "average_fps_from_header", None) or metadata.average_fps


def _av_rate(path: str):
    import av
    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError("the file holds no video stream (truncated, or not a video?)")
        return container.streams.video[0].average_rate


def _av_length(path: str) -> int:
    import av
    with av.open(path) as container:
        return _av_stream(container)[1]


def _decode_av(path: str, choose) -> torch.Tensor:
    import av
    with av.open(path) as container:
        stream, count = _av_stream(container)
        wanted = choose(count)
        keep, frames, last = set(wanted), {}, max(wanted)
        for i, frame in enumerate(container.decode(stream)):
            if i in keep:
                frames[i] = torch.from_numpy(frame.to_ndarray(format="rgb24"))
            if i >= last:
                break
    if not frames:
        raise ValueError("no frame decoded")
    decoded = sorted(frames)
    pick = [frames[i] if i in frames else frames[decoded[-1]] for i in wanted]  # a header promising more frames
    return torch.stack(pick).permute(0, 3, 1, 2)


class VideoFileDataset(PositionDataset):
    """``root/<class>/<clip>.<suffix>`` clips, decoded lazily into ``(3, T, img_size, img_size)`` (see the module
    docstring for the sampling and the crops). ``classes``: the class folder names that number the labels (default:
    those of ``root``). ``hflip``: the probability of flipping a training clip left-right (0: never).
    ``tokens_per_second``: samples are ``(clip, label, time_step)`` on that absolute time axis, tokens of
    ``tubelet_frames`` frames (module docstring); None: ``(clip, label)``."""

    def __init__(self, root: str, img_size: int, num_frames: int, frame_stride: int | None = None,
                 augment: bool = False, seed: int = 0, classes=None, num_samples=None,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip: float = 0.5,
                 tokens_per_second: float | None = None, tubelet_frames: int = 1):
        if not os.path.isdir(root):
            raise DataMissing(f"video-files: {root!r} does not exist (expected DIR/train/<class>/<clip>.mp4 and "
                              "DIR/val/<class>/<clip>.mp4)")
        found = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        classes = list(classes) if classes is not None else found
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise DataMissing(f"video-files: {root!r} has class folders the training split lacks: "
                              f"{', '.join(unknown[:5])}")
        samples = [(os.path.join(root, c, name), label) for label, c in enumerate(classes) if c in found
                   for name in sorted(os.listdir(os.path.join(root, c))) if name.lower().endswith(VIDEO_SUFFIXES)]
        if not samples:
            raise DataMissing(f"video-files: {root!r} holds no clips (expected {root}/<class>/<clip> files ending in "
                              f"{', '.join(VIDEO_SUFFIXES)})")
        subset = fixed_subset(len(samples), num_samples)
        self.samples = samples if subset is None else [samples[i] for i in subset.tolist()]
        super().__init__("video-files", len(classes), IMAGENET_MEAN, IMAGENET_STD, sample_dims=3, seed=seed)
        self.classes, self.labels = classes, [label for _, label in self.samples]
        self.img_size, self.num_frames, self.frame_stride = img_size, num_frames, frame_stride
        self.augment, self.scale, self.ratio = augment, tuple(scale), tuple(ratio)
        self.hflip = check_number("hflip", hflip, 0.0, maximum=1.0)
        self.tokens_per_second = (None if tokens_per_second is None else
                                  check_number("tokens_per_second", tokens_per_second, 0.0, inclusive=False))
        self.tubelet_frames = check_positive_int("tubelet_frames", tubelet_frames)
        self._rates: dict[str, float] = {}  # path -> frames per second, read once per file
        if frame_stride is not None:
            self._check_stride(root)

    def _check_stride(self, root: str) -> None:
        """A ValueError when none of :data:`STRIDE_PROBES` clips spread over the split holds one segment of
        ``num_frames`` frames ``frame_stride`` apart: every clip would be read without the stride."""
        probes = sorted({int(i) for i in np.linspace(0, len(self.samples) - 1, STRIDE_PROBES).round()})
        lengths = {self.samples[i][0]: clip_length(self.samples[i][0]) for i in probes}
        need = segment_length(self.num_frames, self.frame_stride)
        if max(lengths.values()) < need:
            longest = max(lengths, key=lengths.get)
            raise ValueError(f"frame_stride {self.frame_stride}: {self.num_frames} frames {self.frame_stride} apart "
                             f"span {need} frames, and none of {len(lengths)} clips of {root} is that long (the "
                             f"longest, {longest}, has {lengths[longest]}); lower --frame-stride, or leave it out to "
                             "spread the frames over each clip")

    def __getitem__(self, index):
        path, label = self.samples[index]
        rng = np.random.default_rng([self.seed, self.epoch, index, 17]) if self.augment else None

        chosen = []

        def choose(count: int) -> list[int]:
            start = None
            if rng is not None and self.frame_stride is not None:
                start = int(rng.integers(latest_start(count, self.num_frames, self.frame_stride) + 1))
            chosen[:] = clip_indices(count, self.num_frames, self.frame_stride, start)
            return chosen

        frames = decode_clip(path, choose)
        frames = self._train_view(frames, rng) if rng is not None else self._eval_view(frames)
        clip = self.normalize(frames.permute(1, 0, 2, 3))
        if self.tokens_per_second is None:
            return clip, label
        if path not in self._rates:
            self._rates[path] = frame_rate(path)
        return clip, label, time_step(chosen, self._rates[path], self.tokens_per_second, self.tubelet_frames)

    def _train_view(self, frames: torch.Tensor, rng) -> torch.Tensor:
        """One random-resized crop and one flip, the same for every frame of ``frames (T, 3, H, W)``."""
        from torchvision.transforms import InterpolationMode, RandomResizedCrop
        from torchvision.transforms.v2 import functional as TF
        with torch.random.fork_rng(devices=[]):  # torchvision draws from the global generator: seed it, restore it
            torch.manual_seed(int(rng.integers(2**62)))
            top, left, height, width = RandomResizedCrop.get_params(frames, self.scale, self.ratio)
        frames = TF.resized_crop(frames, top, left, height, width, [self.img_size, self.img_size],
                                 interpolation=InterpolationMode.BICUBIC, antialias=True)
        return frames.flip(-1) if rng.random() < self.hflip else frames

    def _eval_view(self, frames: torch.Tensor) -> torch.Tensor:
        """The shorter side resized to ``img_size``, then the centre square."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF
        frames = TF.resize(frames, self.img_size, interpolation=InterpolationMode.BICUBIC, antialias=True)
        return TF.center_crop(frames, [self.img_size, self.img_size])


@register_dataset("video-files", num_classes=None, mean=IMAGENET_MEAN, std=IMAGENET_STD, kind="video")
def video_files(split: str, img_size: int, num_frames: int, data_dir=None, seed: int = 0, augment=None,
                num_samples=None, frame_stride: int | None = None, hflip: float | None = None,
                tokens_per_second: float | None = None, tubelet_frames: int = 1) -> VideoFileDataset:
    if data_dir is None:
        raise DataMissing("video-files needs --data-dir DIR holding train/<class>/<clip>.mp4 and "
                          "val/<class>/<clip>.mp4")
    train_root = os.path.join(data_dir, "train")
    classes = (sorted(d for d in os.listdir(train_root) if os.path.isdir(os.path.join(train_root, d)))
               if os.path.isdir(train_root) else None)  # the training split numbers the classes of every split
    return VideoFileDataset(os.path.join(data_dir, "train" if split == "train" else "val"), img_size, num_frames,
                            frame_stride=frame_stride, augment=(split == "train") if augment is None else augment,
                            seed=seed, classes=classes, num_samples=num_samples, hflip=0.5 if hflip is None else hflip,
                            tokens_per_second=tokens_per_second, tubelet_frames=tubelet_frames)
