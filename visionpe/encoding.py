"""What every encoding is: a module of one family that builds itself for a model and describes itself.

The three family bases (:class:`~visionpe.tokens.TokenEncoding`, :class:`~visionpe.rotary.RotaryEncoding`,
:class:`~visionpe.bias.BiasEncoding`) derive from :class:`Encoding`; so does a user's own encoding, which
:func:`visionpe.register` then makes available to ``build``, ``create_model``, the CLI and visualization.

One constructor vocabulary: a model offers a :class:`ModelContext` (``grid_shape``, its training patch grid;
``ndim``; ``dim``, the token width; ``num_heads``; ``head_dim``; ``num_prefix_tokens``; ``num_registers``), and
:meth:`Encoding.for_model` passes each encoding the words its constructor names. Classes whose native grid has a more specific name map it in
:meth:`Encoding.model_defaults` (``window_size`` of a window bias, ``ref_shape`` of RoPE scaling).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ModelContext:
    """What a model offers the encodings built into it (one block's view for per-block encodings).

    ``grid_shape``: the training patch grid (a Swin block's window); ``dim``: token width; ``num_heads`` and
    ``head_dim`` of the attention; ``num_prefix_tokens``: prefix tokens that own a position vector (timm's
    ``pos_embed`` rows for class/register tokens; 0 with ``no_embed_class``); ``depth``: number of blocks;
    ``num_registers``: how many of a grid's prefix tokens are register tokens, the last ones (timm's ``reg_tokens``,
    after the class token), which an encoding may place on a grid of their own (ViT-5's ``vit5_rope``).
    """

    grid_shape: tuple[int, ...]
    dim: int
    num_heads: int
    head_dim: int
    num_prefix_tokens: int = 0
    depth: int = 1
    num_registers: int = 0

    @property
    def ndim(self) -> int:
        return len(self.grid_shape)

    def words(self) -> dict:
        """The shared constructor vocabulary with this model's values."""
        return dict(grid_shape=tuple(self.grid_shape), ndim=self.ndim, dim=self.dim, num_heads=self.num_heads,
                    head_dim=self.head_dim, num_prefix_tokens=self.num_prefix_tokens, depth=self.depth,
                    num_registers=self.num_registers)


class Encoding(nn.Module):
    """Base of every positional encoding. Subclasses set ``family`` and implement ``forward``.

    What visualization, the sweep and the optimizer ask of an encoding are methods here, overridden
    where an encoding differs: :meth:`no_weight_decay`, :meth:`adapt`, :meth:`similarity_label`,
    :meth:`similarity_note` (and per family ``position_vectors`` or ``pair_map``).
    """

    family: str = ""
    ndims: tuple[int, ...] = (1, 2, 3)  # grid axes it is defined for (LookHere is 2D, VideoRoPE 3D by definition)
    masks_pairs: bool = False  # some token pairs are masked (-inf bias: a directional encoding such as LookHere)

    # -- building for a model -----------------------------------------------------------------------
    @classmethod
    def model_defaults(cls, context: ModelContext) -> dict:
        """Constructor keywords this encoding takes from a model: the words of :meth:`ModelContext.words` that
        its ``__init__`` names."""
        return {k: v for k, v in context.words().items() if k in constructor_keywords(cls)}

    @classmethod
    def for_model(cls, context: ModelContext, **kwargs) -> "Encoding":
        """Build for a model; ``kwargs`` (the user's) override the model's defaults."""
        return cls(**{**cls.model_defaults(context), **kwargs})

    # -- describing itself --------------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of parameters the optimizer must not decay: all of them by default,
        since position tables, frequencies and bias MLPs are position parameters."""
        return {name for name, _ in self.named_parameters()}

    def adapt(self, shape, new_shape, scaling: str | None = None) -> tuple["Encoding", str]:
        """The encoding as it runs on ``new_shape`` after its own adaptation from its native grid ``shape``, and a
        label naming that adaptation. ``self`` is never modified (a copy is adapted when needed)."""
        if scaling not in (None, "none"):
            raise ValueError(f"scaling={scaling!r} applies to rotary encodings only, not to {type(self).__name__}")
        return self, "native grid" if tuple(shape) == tuple(new_shape) else self.adaptation_label()

    def adaptation_label(self) -> str:
        """How this encoding meets a grid other than its native one (figure labels)."""
        return "evaluated on the new grid"

    def similarity_label(self, head: int | None = None) -> str:
        """What :func:`visionpe.viz.similarity` shows for this encoding (colour-bar label)."""
        raise NotImplementedError

    def similarity_note(self) -> str:
        """One phrase on how the similarity map is defined for this encoding (figure titles); may be empty."""
        return ""


def constructor_keywords(cls: type) -> tuple[str, ...]:
    """Keyword names of ``cls.__init__`` (without ``self``)."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")
