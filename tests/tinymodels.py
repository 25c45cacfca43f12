"""Tiny models of every backbone kind with visionpe encodings, shared by the meta-device and the sharding tests."""
import torch
from torchvision.models.vision_transformer import VisionTransformer
from torchvision.models.video.swin_transformer import SwinTransformer3d

import visionpe as vpe

BUILDS = {
    "vit": lambda: vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed+learned", img_size=16, patch_size=4,
                                    embed_dim=16, depth=2, num_heads=2, num_classes=3),
    "vit-cpb": lambda: vpe.create_model("vit_tiny_patch16_224", pe="cpb+rope_axial", img_size=16, patch_size=4,
                                        embed_dim=16, depth=2, num_heads=2, num_classes=3),
    "swin": lambda: vpe.create_model("swin_tiny_patch4_window7_224", pe="swin_bias+rope_mixed", img_size=32,
                                     patch_size=4, embed_dim=16, depths=(2, 1), num_heads=(1, 2), window_size=4,
                                     num_classes=3),
    "swinv2": lambda: vpe.create_model("swinv2_tiny_window8_256", pe="cpb", img_size=32, patch_size=4, embed_dim=16,
                                       depths=(1, 1), num_heads=(1, 2), window_size=4, num_classes=3),
    "video-vit": lambda: vpe.create_video_model("vit_tiny_patch16_224", pe="rope_mixed+learned", num_frames=4,
                                                img_size=16, tubelet_size=(2, 4, 4), embed_dim=24, num_heads=2,
                                                depth=2, num_classes=3),
    "video-swin": lambda: vpe.apply(SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2],
                                                      num_heads=[2, 2], window_size=[2, 4, 4], num_classes=3),
                                    "swin_bias+rope_axial"),
    "torchvision-vit": lambda: vpe.apply(VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2,
                                                           hidden_dim=16, mlp_dim=32, num_classes=3), "alibi+learned"),
}
try:
    import transformers
except ImportError:
    transformers = None
if transformers is not None:
    BUILDS["hf-vit"] = lambda: vpe.apply(transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4, num_labels=3,
        intermediate_size=32)), "rope_mixed+learned")
VIDEO = {"video-vit", "video-swin"}


def example_input(name: str) -> torch.Tensor:
    """A batch of 2 the model ``name`` takes."""
    if name in VIDEO:
        return torch.randn(2, 3, 4, 16, 16)
    return torch.randn(2, 3, *((32, 32) if "swin" in name else (16, 16)))


def logits(out):
    return out.logits if hasattr(out, "logits") else out
