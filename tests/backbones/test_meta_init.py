"""Every backbone built on the meta device, materialised with ``to_empty`` and initialised by
``visionpe.reset_parameters``: derived buffers exactly an eager build's, every weight finite and at the eager build's
scale (the backbone's own init scheme, the encodings' own), and the model trains."""
import pytest
import torch
from tinymodels import BUILDS, example_input, logits

import visionpe as vpe
from conftest import requires_that


def _builds_on_meta(name: str) -> bool:
    """Whether the installed timm/torchvision construct ``name`` under ``torch.device("meta")`` (timm 1.0.19 reads
    its drop-path rates with ``.item()`` off a tensor, which a meta tensor cannot give)."""
    try:
        with torch.device("meta"):
            BUILDS[name]()
    except (NotImplementedError, RuntimeError):
        return False
    return True


def meta_cases(names):
    return [pytest.param(n, marks=requires_that(_builds_on_meta(n), f"{n} builds on the meta device (a newer timm)"))
            for n in names]


REFUSED = {"swinv2": "timm SwinTransformerV2", "video-swin": "torchvision SwinTransformer3d",
           "torchvision-vit": "torchvision VisionTransformer"}  # initialised inside their constructors only


@pytest.mark.parametrize("name", meta_cases(REFUSED))
def test_backbones_that_initialise_in_their_constructors_are_refused(name):
    with torch.device("meta"):
        model = BUILDS[name]()
    model.to_empty(device="cpu")
    with pytest.raises(ValueError, match=f"{REFUSED[name]} initialises its weights inside its constructors"):
        vpe.reset_parameters(model)


@pytest.mark.parametrize("name", meta_cases(n for n in BUILDS if n not in REFUSED))
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
    loss = logits(model(example_input(name))).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
