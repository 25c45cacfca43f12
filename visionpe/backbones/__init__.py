"""Backbone adapters: timm ViT/DeiT (``vit.py``), timm Swin v1/v2 (``swin.py``), the tubelet video ViT
(``video.py``), sharing ``adapter.py``; :func:`apply` and :func:`create_model` dispatch by model class."""
from .adapter import PositionalModel, parse_pe
from .api import ADAPTERS, apply, create_model, encodings_of
from .swin import SwinTransformerPE, SwinTransformerV2PE, WindowAttention
from .video import TubeletEmbed, create_video_model, inflate_patch_embed, video_sections
from .vit import GridBlock, VisionTransformerPE

__all__ = ["ADAPTERS", "GridBlock", "PositionalModel", "SwinTransformerPE", "SwinTransformerV2PE", "TubeletEmbed",
           "VisionTransformerPE", "WindowAttention", "apply", "create_model", "create_video_model", "encodings_of",
           "inflate_patch_embed", "parse_pe", "video_sections"]
