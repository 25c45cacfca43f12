"""timm's distilled DeiT (``VisionTransformerDistilled``: ``deit_*_distilled_*``) with visionpe encodings, at any
input size: the timm ViT adapter's forward and blocks (:mod:`.vit`), with the class and distillation tokens as the
prefix and timm's two heads, as transformers' ``DeiTForImageClassificationWithTeacher`` is adapted (``hf.py``)."""
from __future__ import annotations

import torch
from timm.models.deit import VisionTransformerDistilled

from ..attention import Attention
from .adapter import Adapter, register_adapter
from .vit import VIT_RECORD, GridTransformer, ScriptedGridForward, apply_vit


class VisionTransformerDistilledPE(GridTransformer, VisionTransformerDistilled):
    """timm's ``VisionTransformerDistilled`` with visionpe encodings: the class and distillation tokens are the
    prefix (a ``learned`` table takes over both of ``pos_embed``'s prefix rows), and both heads are timm's (their
    average; each one's logits in training with ``set_distilled_training(True)``)."""

    def prefix_tokens(self) -> list[torch.Tensor]:
        return [self.cls_token, self.dist_token]

    def __prepare_scriptable__(self) -> "ScriptedVisionTransformerDistilled":
        return ScriptedVisionTransformerDistilled.of(self)


class ScriptedVisionTransformerDistilled(ScriptedGridForward, VisionTransformerDistilled):
    """What ``torch.jit.script`` compiles for a :class:`VisionTransformerDistilledPE` (:class:`.ScriptedGridForward`:
    the class and distillation tokens as the prefix, timm's two heads)."""


register_adapter(Adapter(VisionTransformerDistilled, VisionTransformerDistilledPE, apply_vit, (Attention,),
                         examples=("deit_tiny_distilled_patch16_224",), **VIT_RECORD))
