"""Every backbone built on the meta device, materialised with ``to_empty`` and initialised by
``visionpe.reset_parameters``: derived buffers exactly an eager build's, every weight finite and at the eager build's
scale (the backbone's own init scheme, the encodings' own), and the model trains."""
import pytest
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
REFUSED = {"swinv2": "timm SwinTransformerV2", "video-swin": "torchvision SwinTransformer3d",
           "torchvision-vit": "torchvision VisionTransformer"}  # initialised inside their constructors only


def logits(out):
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("name", list(REFUSED))
def test_backbones_that_initialise_in_their_constructors_are_refused(name):
    with torch.device("meta"):
        model = BUILDS[name]()
    model.to_empty(device="cpu")
    with pytest.raises(ValueError, match=f"{REFUSED[name]} initialises its weights inside its constructors"):
        vpe.reset_parameters(model)


@pytest.mark.parametrize("name", [n for n in BUILDS if n not in REFUSED])
def test_a_meta_build_materialised_and_reset_is_an_eager_build(name):
    torch.manual_seed(0)
    eager = BUILDS[name]()
    with torch.device("meta"):
        model = BUILDS[name]()
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    assert vpe.reset_parameters(model) is model
    assert [(n, b.dtype) for n, b in model.named_buffers()] == [(n, b.dtype) for n, b in eager.named_buffers()]
    for (n, b), (_, e) in zip(model.named_buffers(), eager.named_buffers()):
        assert torch.equal(b, e), n
    assert model.state_dict().keys() == eager.state_dict().keys()
    for n, p in model.named_parameters():
        assert torch.isfinite(p).all(), n
        reference = eager.get_parameter(n)
        if p.numel() > 8 and reference.std() > 0:
            assert 0.5 < float(p.detach().std() / reference.detach().std()) < 2, n  # the same scheme, another draw
    x = torch.randn(2, 3, 4, 16, 16) if name in VIDEO else torch.randn(2, 3, *((32, 32) if "swin" in name else (16, 16)))
    loss = logits(model(x)).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
