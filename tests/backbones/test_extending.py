"""A user's own encoding, registered once, works everywhere a built-in one does; and the grid offset a model's
forward takes reaches every encoding."""
import pytest
import torch

import visionpe as vpe
from visionpe import Grid, viz


class CheckerBias(vpe.BiasEncoding):
    """A tiny custom bias: a learned scalar per head times (-1)^(row + col parity) of the key patch."""

    def __init__(self, num_heads: int, ndim: int = 2):
        super().__init__()
        self.num_heads, self.ndim = num_heads, ndim
        self.scale = torch.nn.Parameter(torch.arange(1.0, num_heads + 1))

    def forward(self, grid):
        grid = vpe.grid.as_grid(grid)
        parity = grid.coords().sum(-1).remainder(2) * 2 - 1  # (N,) of +-1
        bias = self.scale[:, None, None] * parity[None, None, :].expand(-1, grid.num_patches, -1)
        return self.pad_prefix(bias, grid)


@pytest.fixture
def checker():
    vpe.register("checker", CheckerBias)
    yield
    vpe.unregister("checker")


def test_registered_encoding_builds_trains_and_draws(checker, tmp_path):
    assert vpe.available()["checker"] == "bias"
    assert isinstance(vpe.build("checker", num_heads=2), CheckerBias)
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial+checker", img_size=16, patch_size=4,
                             embed_dim=16, depth=2, num_heads=2, num_classes=3)
    biases = vpe.encodings_of(model)["bias"]
    assert len(biases) == 2 and all(isinstance(b, CheckerBias) and b.num_heads == 2 for b in biases)
    model(torch.randn(2, 3, 16, 24)).sum().backward()
    assert biases[0].scale.grad is not None and biases[0].scale.grad.abs().sum() > 0
    assert "blocks.0.attn.bias.scale" in model.no_weight_decay()  # position parameters by default
    # visualization asks the encoding itself: the bias row of query 0 is its parity pattern
    sim = viz.similarity(biases[0], (2, 3), head=1)
    assert torch.equal(sim[0], torch.tensor([-2.0, 2, -2, 2, -2, 2]))
    assert viz.save(viz.render(biases[0], "similarity", (3, 3)), tmp_path / "c.png").stat().st_size > 1000


def test_register_rejects_bad_names_and_classes(checker):
    with pytest.raises(ValueError, match="already registered"):
        vpe.register("checker", vpe.ALiBi)
    with pytest.raises(ValueError, match="identifier"):
        vpe.register("my pe", CheckerBias)
    with pytest.raises(ValueError, match="must subclass"):
        vpe.register("plain", torch.nn.Linear)


def test_every_encoding_builds_itself_for_a_model_context():
    context = vpe.ModelContext((3, 4), dim=24, num_heads=2, head_dim=12, num_prefix_tokens=1)
    for name, cls in vpe.registry.ENCODINGS.items():
        pe = cls.for_model(context)
        assert pe.family == vpe.available()[name]
    assert vpe.registry.ENCODINGS["learned"].for_model(context).table.shape == (3, 4, 24)
    assert vpe.registry.ENCODINGS["rope_axial"].for_model(context, scaling="pi").ref_shape == (3, 4)
    assert vpe.registry.ENCODINGS["swin_bias"].for_model(context).window_size == (3, 4)


def test_public_surface_lists_lazy_names():
    names = dir(vpe)
    for name in ("create_model", "apply", "create_video_model", "encodings_of", "register", "Grid", "MixedRoPE",
                 "SwinBias", "TokenEncoding", "RotaryEncoding", "BiasEncoding"):
        assert name in names and getattr(vpe, name) is not None


@pytest.mark.parametrize("pe", ["sincos", "learned", "rope_axial", "alibi"])
def test_grid_offset_reaches_the_encodings(pe):
    """A crop at offset (1, 2): tokens encodings read the shifted positions; RoPE and ALiBi are relative, so a
    shifted grid gives the same output (translation invariance), through the model."""
    torch.manual_seed(0)
    kwargs = {"scaling": "none"} if pe.startswith("rope") else {}  # a crop continues integer positions
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=24, patch_size=4, embed_dim=16, depth=1,
                             num_heads=2, num_classes=3, global_pool="avg", class_token=False,
                             pe_kwargs=kwargs).eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        plain, shifted = model(x), model(x, grid_offset=(1, 2))
        tokens, layout = model.embed(x, grid_offset=(1, 2))
    assert layout.grid == Grid((3, 3), prefix=0, offset=(1, 2)) and layout.keep is None
    if pe in ("rope_axial", "alibi"):
        torch.testing.assert_close(shifted, plain, atol=1e-5, rtol=1e-5)
    else:
        assert not torch.allclose(shifted, plain)
    if pe == "learned":  # the window [1, 4) x [2, 5) of the 6x6 table
        patches = model.patch_embed(x).reshape(1, 9, 16)
        window = model.pe_tokens.table[1:4, 2:5].reshape(1, 9, 16)
        torch.testing.assert_close(tokens, patches + window)
