"""Every registered encoding in every backbone of the torchvision and transformers adapters, on tiny models: it
applies where its family fits (and then runs at other sizes, trains, is excluded from weight decay and listed by
encodings_of) or is refused with a ValueError that says why."""
import pytest
import torch
from torchvision.models.vision_transformer import VisionTransformer

import visionpe as vpe

BACKBONES = {"torchvision-vit": lambda: VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2,
                                                          hidden_dim=16, mlp_dim=32, num_classes=3)}
try:
    import transformers
except ImportError:  # the extra is not installed: the torchvision rows still run
    transformers = None
if transformers is not None:
    VIT = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4, num_labels=3)
    BACKBONES.update({
        "hf-vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**VIT, intermediate_size=32)),
        "hf-deit-teacher": lambda: transformers.DeiTForImageClassificationWithTeacher(
            transformers.DeiTConfig(**VIT, intermediate_size=32)),
        "hf-dinov2": lambda: transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**VIT, mlp_ratio=2)),
        "hf-swin": lambda: transformers.SwinForImageClassification(transformers.SwinConfig(
            image_size=16, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4,
            num_labels=3))})
WINDOWED = {"hf-swin"}
PES = ["none", *vpe.available()]


def refusal(backbone: str, pe: str) -> str | None:
    """What the adapter must say when ``pe`` does not fit ``backbone``, None when it fits."""
    family = vpe.available().get(pe)
    if family is not None and 2 not in vpe.registry.ENCODINGS[pe].ndims:  # e.g. videorope: (T, H, W) grids only
        return "is defined on"
    if backbone in WINDOWED:
        return "tokens encodings" if family == "tokens" else ("rel_bias is a global" if pe == "rel_bias" else None)
    return "swin_bias needs window attention" if pe == "swin_bias" else None


def logits(out):
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("pe", PES)
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_every_encoding_applies_where_it_fits(backbone, pe):
    torch.manual_seed(0)
    model = BACKBONES[backbone]()
    why = refusal(backbone, pe)
    if why is not None:
        with pytest.raises(ValueError, match=why):
            vpe.apply(model, pe)
        return
    vpe.apply(model, pe)
    for size in ((16, 16), (24, 16), (8, 12)):
        out = logits(model(torch.randn(2, 3, *size)))
        assert out.shape == (2, 3) and torch.isfinite(out).all(), size
    # every encoding parameter (tables, frequencies, bias MLPs) is undecayed; PEG is a convolution, decayed as one
    expected = {n for n, _ in model.named_parameters() if "pe_tokens." in n or ".rotary." in n or ".bias." in n}
    expected = set() if pe == "peg" else expected
    assert model.no_weight_decay() == expected
    found = vpe.encodings_of(model)
    blocks = 4 if backbone in WINDOWED else 2
    family = vpe.available().get(pe)
    assert {k: len(v) for k, v in found.items()} == {f: (blocks if f in ("rotary", "bias") else 1) * (f == family)
                                                     for f in ("tokens", "rotary", "bias")}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,))
    losses = []
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(logits(model(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for enc in sum(found.values(), []):
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())
