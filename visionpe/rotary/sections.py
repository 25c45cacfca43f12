"""How a rotary encoding's rotation pairs are split between grid axes when the head does not split evenly."""
from __future__ import annotations



def video_sections(head_dim: int) -> tuple[int, int, int]:
    """Rotation pairs per ``(T, H, W)`` axis when ``head_dim / 2`` does not split in three: the spatial axes take
    the remainder (64 -> ``(10, 11, 11)``). A head of fewer than 3 pairs (``head_dim < 6``) leaves an axis without a
    pair: a ValueError naming head_dim and the minimum."""
    pairs = head_dim // 2
    if pairs < 3:
        raise ValueError(f"head_dim={head_dim} is too small for RoPE on a (T, H, W) grid: each of the 3 axes needs at "
                         f"least one rotation pair (2 channels), so head_dim must be at least 6; give more embed_dim "
                         f"per head (fewer num_heads)")
    base, rest = divmod(pairs, 3)
    return base, base + (rest >= 2), base + (rest >= 1)

