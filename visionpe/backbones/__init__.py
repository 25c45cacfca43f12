"""Backbone adapters, one module a model family, each registered once (:func:`register_adapter`): timm ViT/DeiT
(``vit.py``), timm Swin v1/v2 (``swin.py``), torchvision Video Swin (``video_swin.py``), sharing ``adapter.py``;
the tubelet video ViT (``video.py``) builds on the ViT adapter. :func:`apply`, :func:`create_model` and
:func:`encodings_of` ask the registry."""
from . import vit, swin, video_swin  # noqa: F401, I001  (each registers its adapter, in this order)
from .adapter import (ADAPTERS, Adapter, PositionalModel, adapter_for, named_constructor, parse_pe,
                      register_adapter)
from .api import apply, create_model, encodings_of
from .swin import SwinTransformerPE, SwinTransformerV2PE, WindowAttention
from .video import TubeletEmbed, create_video_model, inflate_patch_embed
from .video_swin import SwinTransformer3dPE, VideoWindowAttention
from .vit import GridBlock, VisionTransformerPE

__all__ = ["ADAPTERS", "Adapter", "GridBlock", "PositionalModel", "SwinTransformer3dPE", "SwinTransformerPE",
           "SwinTransformerV2PE", "TubeletEmbed", "VideoWindowAttention", "VisionTransformerPE", "WindowAttention",
           "adapter_for", "apply", "create_model", "create_video_model", "encodings_of", "inflate_patch_embed",
           "named_constructor", "parse_pe", "register_adapter"]
