"""Circle-RoPE (Wang et al., "Circle-RoPE: Cone-like Decoupled Rotary Positional Embedding for Large Vision-Language
Models", arXiv 2505.16416; official code ``lose4578/CircleRoPE``, ``code/circle_rope.py``): the image's patch
indices placed on a ring orthogonal to the text axis of M-RoPE's 3D position space.

In Qwen2-VL's M-RoPE a text token sits at ``(p, p, p)`` and image patches at grid indices, so a text token is
nearer some patches than others for no reason but the order of concatenation. Circle-RoPE's circular image token
projection puts every patch on a circle of radius ``R`` centred on the text axis, in the plane orthogonal to
``(1, 1, 1)``: every text token is then equidistant from all patches (the apex of a cone; the paper's per-token
distance is 0). For patch ``(h, w)`` of an ``H x W`` grid, ``n`` its raster index:

1. centre: ``x = w - (w_max + w_min) / 2``, ``y = h - (h_max + h_min) / 2``;
2. mixed angle: ``phi = alpha * phi_norm + (1 - alpha) * 2 pi n / (H W)``, ``phi_norm`` the polar angle
   ``atan2(y, x)`` stretched linearly from its range over the grid onto ``[0, 2 pi]``;
3. circle: ``(R cos phi, R sin phi)``, ``R = radius`` (``"auto"``: the largest centred index);
   ``dff_rate = r`` blends ``(1 - r)`` of it with ``r`` of the centred ``(x, y)`` (the official ``dff_rate``);
4. the plane turned orthogonal to the text axis: ``(w', h', t') = a u + b v`` for the point ``(a, b)``, with
   ``u = (-1, 1, 0) / sqrt 2`` and ``v = (-1, -1, 2) / sqrt 6`` (the official construction from ``(1, 1, 1)``).

The positions ``(t', h', w')`` then take M-RoPE's rotation: one spectrum ``theta^(-p/P)`` over the ``P = head_dim /
2`` pairs, cut into consecutive chunks of ``sections = (t, h, w)`` pairs. The official model is Qwen2.5-VL's LLM
(``sections=(16, 24, 24)``, ``theta=1e6``, ``pairs="half"``, ``radius=10``, ``alpha=0.5``); the defaults here are
the package's (interleaved pairs, ``theta=100``, ``sections`` by :func:`~visionpe.rotary.rope.section_rule`'s
``"rest_first"``). The official code's last shift of every coordinate onto the positive axis
(``move_to_positive``) adds one constant to every position, which cancels in every score, and is left out.

The placement reads the grid's shape (the angles are spread over the patches it has), so scores are not a
function of index differences: not relative, by design.

The paper's alternating geometry encoding (AGE) places the image on the ring in some layers and on M-RoPE's plain
grid in the others (the official ``AGE_index_dict``: ``strategy_4`` alternates, the ring in layers 0, 2, 4, ...;
``strategy_2`` puts it in the first half, ``strategy_3`` in the second). ``placement="grid"`` is that plain placement,
``(t', h', w') = (0, h, w)`` (an image's time is one constant) with the same M-RoPE rotation, and
:func:`alternate_geometry` gives the blocks of a patched model their placements by such a pattern. visionpe builds a
model's per-block encodings from one name and one set of keywords, with no block index, so the per-layer choice is
made on the patched model, not by ``pe=`` or ``pe_kwargs``. What is not here: multi-image time.
"""
from __future__ import annotations

import math

import torch

from .._checks import check_choice, check_number, to_shape
from ..grid import Grid
from .placed import PlacedRoPE
from .rope import mrope_axes, section_rule

TEXT_PLANE = torch.tensor([[-1.0 / math.sqrt(2), 1.0 / math.sqrt(2), 0.0],  # u, then v, in (w, h, t) components
                           [-1.0 / math.sqrt(6), -1.0 / math.sqrt(6), 2.0 / math.sqrt(6)]])


PLACEMENTS = ("circle", "grid")  # the ring, or M-RoPE's plain grid (the other layers of AGE)
AGE_PATTERNS = {"alternate": "strategy_4", "circle_first": "strategy_2", "grid_first": "strategy_3"}  # official names


def stretched_angles(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``atan2(y, x)`` mapped linearly from its range onto ``[0, 2 pi]`` (unchanged when it has none)."""
    angle = torch.atan2(y.float(), x.float()).to(y.dtype)  # float32: onnxruntime has no float64 Atan
    # on the negative x axis (y = +0, as centring gives) torch's atan2 is pi and onnxruntime's -pi: pin torch's
    angle = torch.where((y == 0) & (x < 0), torch.full_like(angle, math.pi), angle)
    low, span = angle.min(), angle.max() - angle.min()
    return torch.where(span > 0, (angle - low) / torch.where(span > 0, span, 1.0) * (2 * math.pi), angle)


def circle_positions(coords: torch.Tensor, radius, alpha: float, dff_rate: float = 0.0) -> torch.Tensor:
    """Circle-RoPE's positions ``(N, 3)`` as ``(t', h', w')`` of patches with index coordinates ``coords (N, 2)``
    ``(h, w)`` in raster order; ``radius`` a number or ``"auto"``."""
    centred = coords - (coords.amax(0) + coords.amin(0)) / 2
    y, x = centred.unbind(-1)
    index = torch.arange(coords.shape[0], dtype=coords.dtype, device=coords.device) / coords.shape[0]
    phi = alpha * stretched_angles(x, y) + (1 - alpha) * 2 * math.pi * index
    r = centred.amax().abs() if radius == "auto" else radius
    plane = torch.stack([r * phi.cos(), r * phi.sin()], -1)  # (N, 2)
    plane = (1 - dff_rate) * plane + dff_rate * torch.stack([x, y], -1)
    whc = plane @ TEXT_PLANE.to(coords)  # (N, 3): (w', h', t')
    return whc.flip(-1)


class CircleRoPE(PlacedRoPE):
    """Circle-RoPE on 2D grids: ``pe(q, k, grid) -> (q, k)``; see the module docstring.

    ``radius``: the ring's radius in index units (default 10, the official config) or ``"auto"``; ``alpha`` in
    ``[0, 1]``: the weight of the polar angle against the raster order (default 0.5); ``dff_rate`` in ``[0, 1]``:
    the share of the centred grid kept (default 0: the ring); ``sections``: pairs for ``(t, h, w)`` (sum
    ``head_dim / 2``); ``theta``, ``pairs``: RoPE's. ``placement`` (keyword-only): ``"circle"`` (default) or
    ``"grid"``, M-RoPE's plain ``(0, h, w)`` with the same rotation (the other layers of the paper's AGE; see
    :func:`alternate_geometry`).
    """

    ndims = (2,)
    num_components = 3

    def __init__(self, head_dim: int, num_heads: int = 1, ndim: int = 2, radius=10.0, alpha: float = 0.5,
                 dff_rate: float = 0.0, sections=None, theta: float = 100.0, pairs: str = "interleaved", *,
                 placement: str = "circle"):
        if ndim != 2:
            raise ValueError(f"circle_rope places the patches of an image grid on a ring: ndim must be 2, got "
                             f"ndim={ndim!r}")
        if isinstance(radius, str) and radius != "auto":
            raise ValueError(f"radius={radius!r} must be a number > 0 or 'auto'")
        if radius != "auto":
            radius = check_number("radius", radius, minimum=0.0, inclusive=False)
        self.radius = radius
        self.alpha = check_number("alpha", alpha, minimum=0.0, maximum=1.0)
        self.dff_rate = check_number("dff_rate", dff_rate, minimum=0.0, maximum=1.0)
        check_choice("placement", placement, PLACEMENTS)
        self.placement = placement
        self.sections = section_rule("rest_first", head_dim, 3)[0] if sections is None else \
            to_shape("sections", sections, 3)
        if sum(self.sections) != head_dim // 2:
            raise ValueError(f"sections={self.sections} must sum to head_dim / 2 = {head_dim // 2} (pairs for t, h, "
                             "w)")
        super().__init__(head_dim, num_heads, ndim, theta, pairs)

    def pair_components(self) -> list[int]:
        return mrope_axes(self.sections, self.num_pairs, interleaved=False)

    def place(self, coords: torch.Tensor, grid: Grid, scales: torch.Tensor) -> torch.Tensor:
        """``(N, 3)`` positions ``(t', h', w')``: on the ring, or ``(0, h, w)`` with ``placement="grid"``."""
        if self.placement == "grid":
            return torch.cat([coords.new_zeros(coords.shape[0], 1), coords], -1)
        return circle_positions(coords, self.radius, self.alpha, self.dff_rate)

    def similarity_note(self) -> str:
        if self.placement == "grid":
            return "score of one isotropic q rotated to i and to j; M-RoPE on the grid, relative"
        return "score of one isotropic q rotated to i and to j; patches on a ring, not relative"

    def with_placement(self, placement: str) -> "CircleRoPE":
        """The same encoding (sizes, ring, sections, ``theta``, ``pairs``) with another ``placement``."""
        return CircleRoPE(self.head_dim, self.num_heads, self.ndim, self.radius, self.alpha, self.dff_rate,
                          self.sections, self.theta, self.pairs, placement=placement).to(self.freqs.device)

    def extra_repr(self) -> str:
        placement = "" if self.placement == "circle" else f", placement={self.placement!r}"
        return super().extra_repr() + (f", radius={self.radius!r}, alpha={self.alpha}, dff_rate={self.dff_rate}, "
                                       f"sections={self.sections}{placement}")


def age_placements(pattern, depth: int) -> tuple[str, ...]:
    """The placement of each of ``depth`` blocks: ``pattern`` one of :data:`AGE_PATTERNS` (``"alternate"``: the ring
    in blocks 0, 2, 4, ...; ``"circle_first"``: in the first ``ceil(depth / 2)``; ``"grid_first"``: in the last
    ``floor(depth / 2)``) or a sequence of ``depth`` placements from :data:`PLACEMENTS`."""
    if isinstance(pattern, str):
        check_choice("pattern", pattern, tuple(AGE_PATTERNS))
        half = (depth + 1) // 2
        ring = {"alternate": lambda i: i % 2 == 0, "circle_first": lambda i: i < half,
                "grid_first": lambda i: i >= depth - depth // 2}[pattern]
        return tuple("circle" if ring(i) else "grid" for i in range(depth))
    placements = tuple(pattern) if isinstance(pattern, (list, tuple)) else None
    if placements is None or len(placements) != depth or any(p not in PLACEMENTS for p in placements):
        raise ValueError(f"pattern={pattern!r} must be one of {', '.join(map(repr, AGE_PATTERNS))} or a sequence of "
                         f"{depth} placements (one per block with circle_rope) from {PLACEMENTS}")
    return placements


def alternate_geometry(model: torch.nn.Module, pattern="alternate") -> tuple[str, ...]:
    """Circle-RoPE's alternating geometry encoding on a model patched with ``pe="circle_rope"``: the attention of
    block ``i`` (in module order) keeps the ring or takes ``placement="grid"`` as :func:`age_placements` says
    (one grid module shared by the grid blocks). Returns the placements, one per block. Parameter-free: the weights
    are untouched, and re-applying an encoding (``vpe.apply``) builds every block's from ``pe_kwargs`` again."""
    blocks = [m for m in model.modules() if isinstance(getattr(m, "rotary", None), CircleRoPE)]
    if not blocks:
        raise ValueError("alternate_geometry needs a model patched with pe='circle_rope' (e.g. vpe.create_model(..., "
                         "pe='circle_rope')); this one has no circle_rope attention")
    placements = age_placements(pattern, len(blocks))
    made: dict = {}
    for block, placement in zip(blocks, placements):
        ring = block.rotary
        if ring.placement != placement:
            key = (id(ring), placement)
            block.rotary = made.setdefault(key, ring.with_placement(placement))
    return placements
