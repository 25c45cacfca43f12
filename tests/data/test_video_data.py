"""Built-in video tasks: clips in continuous time (any frame count, any size), labels that need frame order."""
import math

import numpy as np
import pytest
import torch
from PIL import Image

from visionpe import data


def centroid(frame: torch.Tensor) -> tuple[float, float]:
    """Centre ``(x, y)`` in [0, 1] of the pixels brighter than the dark background, frame ``(3, H, W)`` normalized."""
    mask = (frame * 0.5 + 0.5).max(0).values > 0.45
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return (xs.float().mean().item() + 0.5) / frame.shape[-1], (ys.float().mean().item() + 0.5) / frame.shape[-2]


def test_moving_shapes_label_is_the_direction_of_motion():
    ds = data.build_dataset("moving-shapes", "val", 48, num_samples=40, num_frames=6)
    assert ds.num_classes == 8 and ds[0][0].shape == (3, 6, 48, 48)
    for clip, label in ds:
        (x0, y0), (x1, y1) = centroid(clip[:, 0]), centroid(clip[:, -1])
        angle = math.atan2(-(y1 - y0), x1 - x0) % (2 * math.pi)  # y grows downwards
        error = (angle - 2 * math.pi * label / 8 + math.pi) % (2 * math.pi) - math.pi
        assert abs(error) < math.pi / 8, (label, angle)
    assert len({label for _, label in ds}) == 8


def test_shape_endpoint_label_is_the_final_cell_of_the_warm_shape():
    for i in range(30):
        sc = data.clip_scene("shape-endpoint", 0, i, "val")
        kind, start, end, radius, colour = sc["shapes"][0]
        assert 3 * int(end[1] * 3) + int(end[0] * 3) == sc["label"] != 3 * int(start[1] * 3) + int(start[0] * 3)
        assert all(s == e for _, s, e, _, _ in sc["shapes"][1:])  # distractors stand still


def test_more_frames_is_the_same_clip_at_a_higher_frame_rate_and_deterministic():
    eight = data.build_dataset("moving-shapes", "train", 16, num_samples=4, num_frames=8, seed=3)
    fifteen = data.build_dataset("moving-shapes", "train", 16, num_samples=4, num_frames=15, seed=3)
    torch.testing.assert_close(fifteen.images[:, :, ::2], eight.images)  # instants k/14 for even k are k/7
    again = data.build_dataset("moving-shapes", "train", 16, num_samples=4, num_frames=8, seed=3)
    assert torch.equal(again.images, eight.images)
    other = data.build_dataset("moving-shapes", "train", 16, num_samples=4, num_frames=8, seed=4)
    assert not torch.equal(other.images, eight.images)


def test_image_and_video_sets_are_not_mixed_up():
    with pytest.raises(ValueError, match="video data set: give num_frames"):
        data.build_dataset("moving-shapes", "train", 16, num_samples=2)
    with pytest.raises(ValueError, match="image data set: do not give num_frames"):
        data.build_dataset("shapes-position", "train", 16, num_samples=2, num_frames=4)
    with pytest.raises(ValueError, match="num_frames must be a positive integer"):
        data.build_dataset("moving-shapes", "train", 16, num_samples=2, num_frames=0)
    assert data.info("moving-shapes") == {"num_classes": 8, "in_chans": 3, "synthetic": True, "video": True}


def write_clip(folder, frames: int, colour) -> None:
    folder.mkdir(parents=True)
    for k in range(frames):
        Image.fromarray(np.full((10, 12, 3), colour, dtype=np.uint8)).save(folder / f"{k:03d}.png")


def test_videofolder_reads_clips_of_frames(tmp_path):
    write_clip(tmp_path / "train" / "red" / "a", 5, (200, 0, 0))
    write_clip(tmp_path / "train" / "blue" / "b", 3, (0, 0, 200))
    ds = data.build_dataset("videofolder", "train", 8, data_dir=str(tmp_path), num_frames=4)
    assert len(ds) == 2 and ds.num_classes == 2
    clip, label = ds[0]
    assert clip.shape == (3, 4, 8, 8) and label == 0  # classes sorted: blue, red
    with pytest.raises(data.DataMissing, match="holds no clips"):
        (tmp_path / "val" / "empty").mkdir(parents=True)
        data.build_dataset("videofolder", "val", 8, data_dir=str(tmp_path), num_frames=4)
    (tmp_path / "train" / "red" / "c").mkdir()  # an empty clip folder: refused when the set is built, named
    with pytest.raises(data.DataMissing, match="clip folder .*red/c' holds no frames"):
        data.build_dataset("videofolder", "train", 8, data_dir=str(tmp_path), num_frames=4)
    with pytest.raises(data.DataMissing, match="needs --data-dir"):
        data.build_dataset("videofolder", "train", 8, num_frames=4)


def test_videofolder_val_is_mapped_by_class_name(tmp_path):
    """The training split numbers the classes: a val subset keeps train's index of each name; a val class that
    train lacks is an error listing the classes missing on each side (issue 22)."""
    for cls in ("blue", "red"):
        write_clip(tmp_path / "train" / cls / "a", 2, (0, 0, 200))
    write_clip(tmp_path / "val" / "red" / "a", 2, (200, 0, 0))
    val = data.build_dataset("videofolder", "val", 8, data_dir=str(tmp_path), num_frames=2)
    assert val.num_classes == 2 and val.labels == [1]  # red is class 1 in train (blue, red)
    write_clip(tmp_path / "val" / "green" / "a", 2, (0, 200, 0))
    with pytest.raises(data.DataDamaged, match="train lacks green; .*val lacks blue"):
        data.build_dataset("videofolder", "val", 8, data_dir=str(tmp_path), num_frames=2)
