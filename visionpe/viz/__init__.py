"""Pictures of what a positional encoding knows about space, for every family, on 1D/2D/3D grids.

Numbers and pictures are separate: :mod:`visionpe.viz.numbers` returns tensors (and is what the tests check);
:mod:`visionpe.viz.draw` only lays those numbers out with matplotlib and returns a ``matplotlib.figure.Figure``
(no pyplot, no global state); :func:`save` writes it as a PNG. :mod:`visionpe.viz.explorer` writes the same
numbers into one self-contained HTML page (:func:`write_explorer`) where pointing at a patch shows its map, per
layer, head and grid.

What the *similarity* between two patch positions ``i`` and ``j`` means in each family:

- **tokens** (``sincos``, ``learned`` joint or factorized): the cosine similarity of the position vectors
  ``e_i, e_j`` (the ViT paper's figure). ``peg`` has no position vectors: it is a convolution of the
  tokens. We show the cosine similarity of its output for a constant input (all ones), ``PEG(1)_i``:
  the only position signal PEG has is the zero padding at the borders, so interior positions come out
  identical (similarity 1) and only the border rows/columns differ.
- **rotary** (``rope_axial``, ``rope_mixed``): the positional kernel RoPE imposes on a query/key pair,
  ``K_h[i, j] = Re(sum_p conj(cis[h, i, p]) * cis[h, j, p]) / (head_dim / 2)``. It is the expected score
  ``E[<R_i x, R_j x>] / E[|x|^2]`` between the same vector ``x`` rotated to position ``i`` and to position
  ``j``, for an isotropic random ``x`` (``q = k``): each rotation pair ``p`` carries ``E|x_p|^2 = 2 / head_dim``
  of the energy. ``K[i, i] = 1`` (YaRN: its attention factor squared), ``|K| <= K[i, i]`` and ``K[i, j]`` depends
  only on the offset ``c_j - c_i``. Shown for one head or averaged over heads.
- **bias** (``swin_bias``, ``rel_bias``, ``cpb``, ``alibi``): the bias row ``pe(grid)[h, i, :]`` added to the
  logits of query ``i``, for one head or averaged over heads.

Prefix tokens (class, registers) have no spatial position and never appear in these maps.
"""
from .draw import *  # noqa: F401,F403
from .draw import __all__ as _draw
from .explorer import explorer_html, write_explorer  # noqa: F401  (in __all__ below)
from .fresh import fresh_encoding  # noqa: F401  (in __all__ below)
from .numbers import *  # noqa: F401,F403
from .numbers import __all__ as _numbers

__all__ = sorted(set(_numbers) | set(_draw) | {"explorer_html", "fresh_encoding", "write_explorer"})
