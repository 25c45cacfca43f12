"""Backbone adapters, one module a model family, each registered once (:func:`register_adapter`): timm ViT/DeiT
(``vit.py``), timm Swin v1/v2 (``swin.py``), timm's distilled DeiT (``deit.py``), timm Eva (``eva.py``), timm BEiT
(``beit.py``), timm ``VisionTransformerRelPos`` (``vit_relpos.py``), timm ``VisionTransformerSAM`` (``sam.py``),
timm ``NaFlexVit`` (``naflex.py``), timm ``MaxxVit`` (``maxxvit.py``), timm ``Xcit`` (``xcit.py``), torchvision Video
Swin (``video_swin.py``) and image ViT (``torchvision_vit.py``), and, once transformers is imported, Hugging Face
ViT/DeiT/DINOv2/Swin (``hf.py``; DINOv3: ``hf_dinov3.py``; SigLIP 2's vision tower: ``hf_siglip2.py``; Qwen3-VL's
vision tower: ``hf_qwen3_vl.py``; ``save_pretrained`` / ``from_pretrained``: ``hf_pretrained.py``), sharing
``adapter.py`` (and ``windows.py``: the shifted-window mask); the tubelet video ViT (``video.py``) builds on the ViT
adapter. :func:`apply`,
:func:`create_model`, :func:`encodings_of`, :func:`~visionpe.load_timm_checkpoint`, timm's ``vpe_*`` registry
(``timm_registry.py``) and the training CLI ask the registry."""
import importlib
import importlib.util

from .._import_hook import when_imported
# each registers its adapter
from . import vit, swin, deit, eva, beit, vit_relpos, video_swin, torchvision_vit  # noqa: F401, I001
from . import maxxvit, naflex, sam, xcit  # noqa: F401, I001
from .adapter import (ADAPTERS, UNAVAILABLE, Adapter, PositionalModel, adapter_for, named_constructor, parse_pe,
                      register_adapter, repeated_blocks)
from .api import apply, create_model, encodings_of
from .beit import BeitPE
from .deit import VisionTransformerDistilledPE
from .swin import SwinTransformerPE, SwinTransformerV2PE, WindowAttention
from .torchvision_vit import GridMultiheadAttention, TorchvisionViTPE
from .video import TubeletEmbed, create_video_model, inflate_patch_embed
from .video_swin import SwinTransformer3dPE, VideoWindowAttention
from .vit import GridBlock, VisionTransformerPE

# the optional extra visionpe[hf]: the Hugging Face adapters register once transformers is imported (a model of it
# exists only then), before or after visionpe; visionpe itself never imports transformers
def _register_hf(_transformers) -> None:
    try:
        importlib.import_module(f"{__name__}.hf")
    except ImportError as err:  # an older transformers: its models are refused with this reason (and a warning)
        UNAVAILABLE["transformers"] = str(err)
        raise
    if importlib.util.find_spec("transformers.models.dinov3_vit") is not None:  # transformers >= 4.56
        importlib.import_module(f"{__name__}.hf_dinov3")
    if importlib.util.find_spec("transformers.models.qwen3_vl") is not None and hasattr(  # transformers 5's tower
            importlib.import_module("transformers.models.qwen3_vl.modeling_qwen3_vl"),  # (4.57's returns a tuple)
            "BaseModelOutputWithDeepstackFeatures"):
        importlib.import_module(f"{__name__}.hf_qwen3_vl")
    # SigLIP 2 exists from transformers 4.49; its tower is a PreTrainedModel (what the adapter patches) from 5
    if importlib.util.find_spec("transformers.models.siglip2") is not None \
            and int(_transformers.__version__.split(".")[0]) >= 5:
        importlib.import_module(f"{__name__}.hf_siglip2")


when_imported("transformers", _register_hf)

__all__ = ["ADAPTERS", "Adapter", "BeitPE", "GridBlock", "GridMultiheadAttention", "PositionalModel",
           "SwinTransformer3dPE", "SwinTransformerPE", "SwinTransformerV2PE", "TorchvisionViTPE",
           "TubeletEmbed", "VideoWindowAttention", "VisionTransformerDistilledPE", "VisionTransformerPE",
           "WindowAttention", "adapter_for", "apply", "create_model", "create_video_model", "encodings_of",
           "inflate_patch_embed", "named_constructor", "parse_pe", "register_adapter", "repeated_blocks"]
