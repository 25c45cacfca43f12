"""Backbone adapters: timm ViT/DeiT (``vit.py``), timm Swin v1/v2 (``swin.py``), the tubelet video ViT
(``video.py``), torchvision Video Swin (``video_swin.py``), sharing ``adapter.py``; :func:`apply` and
:func:`create_model` dispatch by model class."""
from .adapter import PositionalModel, parse_pe
from .api import ADAPTERS, apply, create_model, encodings_of
from .swin import SwinTransformerPE, SwinTransformerV2PE, WindowAttention
from .video import TubeletEmbed, create_video_model, inflate_patch_embed, video_sections
from .video_swin import SwinTransformer3dPE, VideoWindowAttention
from .vit import GridBlock, VisionTransformerPE

__all__ = ["ADAPTERS", "GridBlock", "PositionalModel", "SwinTransformer3dPE", "SwinTransformerPE",
           "SwinTransformerV2PE", "TubeletEmbed", "VideoWindowAttention", "VisionTransformerPE", "WindowAttention",
           "apply", "create_model", "create_video_model", "encodings_of", "inflate_patch_embed", "parse_pe",
           "video_sections"]
