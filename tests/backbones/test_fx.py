"""torch.fx: visionpe models trace symbolically (timm's FX feature extraction, torchvision's
``create_feature_extractor``) into a graph that serves any resolution: the positions are computed, at run time, from
the size the graph is given (the functions that read the grid are one call each in the graph, ``torch.fx.wrap``), so
the traced model equals the eager one at sizes it was not traced at, in every family."""
import pytest
import torch
from timm.models import create_feature_extractor as timm_feature_extractor
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import visionpe as vpe
from visionpe.backbones.adapter import named_constructor

TINY_VIT = dict(img_size=32, patch_size=8, num_classes=5, depth=2)
SIZES = [(32, 32), (48, 64), (24, 40)]  # the traced size, then two it was not traced at (one non-square)
MODELS = {
    "vit": lambda pe: vpe.create_model("vit_tiny_patch16_224", pe=pe, **TINY_VIT),
    "deit_distilled": lambda pe: vpe.create_model("deit_tiny_distilled_patch16_224", pe=pe, **TINY_VIT),
    "eva": lambda pe: vpe.create_model("vit_small_patch16_rope_224", pe=pe, embed_dim=64, num_heads=2, **TINY_VIT),
    "swin": lambda pe: vpe.create_model("swin_tiny_patch4_window7_224", pe=pe, img_size=32, patch_size=4,
                                        window_size=2, embed_dim=16, depths=(2, 2), num_heads=(1, 2), num_classes=5),
}
CASES = [("vit", "learned"), ("vit", "peg"), ("vit", "rope_mixed"), ("vit", "rel_bias"), ("vit", "lookhere"),
         ("deit_distilled", "sincos+alibi"), ("eva", "native"), ("eva", "fire"), ("swin", "native"),
         ("swin", "rope_axial"), ("swin", "cpb")]


@pytest.mark.parametrize("backbone, pe", CASES)
def test_timm_fx_graph_serves_any_size(backbone, pe):
    torch.manual_seed(0)
    model = MODELS[backbone](pe).eval()
    graph = timm_feature_extractor(model, return_nodes=[get_graph_node_names(model)[1][-1]])  # the output node
    with torch.no_grad():
        for size in SIZES:
            x = torch.randn(2, 3, *size)
            traced = next(iter(graph(x).values()))
            torch.testing.assert_close(traced, model(x), rtol=0, atol=1e-5, msg=f"{backbone} {pe} at {size}")


def test_torchvision_feature_extractor_takes_blocks_at_any_size():
    """torchvision's own create_feature_extractor (no timm leaf lists) on visionpe's torchvision ViT: a block's
    output at sizes the graph was not traced at equals the eager model's (read by a forward hook)."""
    torch.manual_seed(0)
    build = named_constructor("tv_vit_b_16")[1]
    model = vpe.apply(build(num_classes=5, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
                      pe="rope_mixed").eval()
    extractor = create_feature_extractor(model, return_nodes={"encoder.layers.encoder_layer_0": "block0",
                                                              "heads": "logits"})
    seen = {}
    model.encoder.layers[0].register_forward_hook(lambda m, i, out: seen.__setitem__("block0", out))
    with torch.no_grad():
        for size in SIZES:
            x = torch.randn(2, 3, *size)
            got = extractor(x)
            torch.testing.assert_close(got["logits"], model(x), rtol=0, atol=1e-5)
            torch.testing.assert_close(got["block0"], seen["block0"], rtol=0, atol=1e-5)
