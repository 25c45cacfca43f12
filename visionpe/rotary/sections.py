"""How a rotary encoding's rotation pairs are split between grid axes when the head does not split evenly."""
from __future__ import annotations


def video_sections(head_dim: int) -> tuple[int, int, int]:
    """Rotation pairs per ``(T, H, W)`` axis when ``head_dim / 2`` does not split in three: the spatial axes take
    the remainder (64 -> ``(10, 11, 11)``)."""
    pairs = head_dim // 2
    base, rest = divmod(pairs, 3)
    return base, base + (rest >= 2), base + (rest >= 1)
