"""A user's own encoding, registered once, works everywhere a built-in one does; a user's own backbone, one Adapter
record in one file, reaches every place that lists backbones; and the grid offset a model's forward takes reaches
every encoding."""
import subprocess
import sys

import pytest
import torch
from trainutil import ROOT
from usercode import BACKBONE, write

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
        if context.ndim not in cls.ndims:  # videorope is 3D by definition
            continue
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


# A user's backbone in one file: its model (tests/usercode.py's ToyViT, registered in timm by its own entrypoints
# here) and ONE Adapter record, from which visionpe's timm registry, the training CLI's help and messages, the error
# messages and load_timm_checkpoint learn everything they say about it.
USER_BACKBONE = BACKBONE[:BACKBONE.index("register_adapter(")] + '''
from timm.models import build_model_with_cfg, register_model


def renamed_blocks(state, report):
    """An older ToyViT named its blocks ``layers.N``."""
    out = {}
    for key, value in state.items():
        new = "blocks." + key[len("layers."):] if key.startswith("layers.") else key
        if new != key:
            report.converted.append(f"{key} -> {new}")
        out[new] = value
    return out


@register_model
def toy_vit_tiny(pretrained=False, **kwargs):
    return build_model_with_cfg(ToyViT, "toy_vit_tiny", pretrained, **kwargs)


@register_model
def toy_vit_huge(pretrained=False, **kwargs):
    return build_model_with_cfg(ToyViT, "toy_vit_huge", pretrained, **dict(dict(embed_dim=64, depth=2), **kwargs))


register_adapter(Adapter(ToyViT, ToyViTPE, put_encodings, (vpe.Attention,), library="user",
                         timm_modules=(__name__,), native="rope_axial", families=("rotary", "bias"),
                         refuses={"lookhere": "looks in fixed directions, which a toy does not have; use alibi"},
                         unsupported={"toy_vit_huge": "too big for a toy"}, examples=("toy_vit_tiny",),
                         checkpoint_hooks=(renamed_blocks,)))
'''

# run in a fresh process: timm's registry has no way to forget a name, and the user's names must not leak into the
# other tests' timm registry
USER_CHECKS = '''
import sys

import pytest
import timm
import torch

import visionpe as vpe
from visionpe import cli
from visionpe.cli import UserError
from visionpe.train import models
from visionpe.train.settings import TrainSettings

cli.import_user_code([sys.argv[1]])
# timm's registry: the supported name, with the native encoding by default; the unsupported one left out
assert timm.list_models("vpe_toy*") == ["vpe_toy_vit_tiny"], timm.list_models("vpe_toy*")
model = timm.create_model("vpe_toy_vit_tiny", num_classes=3)
assert type(model).__name__ == "ToyViTPE" and model.pe == "rope_axial"
assert model(torch.randn(2, 3, 16, 24)).shape == (2, 3)
assert timm.create_model("vpe_toy_vit_tiny", pe="alibi").pe == "alibi"
assert model.pretrained_cfg["fixed_input_size"] is False
# messages, generated from the record
with pytest.raises(ValueError, match=r"ToyViT takes rotary and bias encodings \\(rope_axial, .*alibi.*\\); tokens "
                                     r"encodings \\(learned\\)") as info:
    vpe.apply(timm.create_model("toy_vit_tiny"), "learned")
assert "lookhere" not in str(info.value)
with pytest.raises(ValueError, match="lookhere looks in fixed directions, which a toy does not have; use alibi"):
    vpe.apply(timm.create_model("toy_vit_tiny"), "lookhere")
with pytest.raises(ValueError, match=r"supported: .*user ToyViT"):
    vpe.apply(torch.nn.Linear(2, 2), "learned")
with pytest.raises(ValueError, match="user ToyViT does not take it: too big for a toy"):
    vpe.create_model("toy_vit_huge", pe="alibi")
# the training CLI: --model's help and its messages
assert "user ToyViT (toy_vit_tiny)" in models.model_help()
cfg = TrainSettings(model="toy_vit_huge", pe="rope_axial")
with pytest.raises(UserError, match="--model toy_vit_huge: user ToyViT does not take it: too big for a toy"):
    models.check_model(cfg)
with pytest.raises(UserError, match=r"unknown model 'toy_vit_small'; try e.g. .*user ToyViT \\(toy_vit_tiny\\)"):
    models.check_model(cfg.replace(model="toy_vit_small"))
# load_timm_checkpoint runs the record's checkpoint hook: an older checkpoint's names are converted
old = {k.replace("blocks.", "layers.", 1): v + 1 for k, v in model.state_dict().items()}
report = vpe.load_timm_checkpoint(model, old, strict=True)
assert "layers.0.qkv.weight -> blocks.0.qkv.weight" in report.converted and not report.new and not report.dropped
assert torch.equal(model.blocks[0].qkv.weight, old["layers.0.qkv.weight"])
print("user backbone: ok")
'''


def test_a_user_adapter_reaches_the_registry_the_cli_the_messages_and_the_loader(tmp_path):
    """One user file with one Adapter record: timm's vpe_* registry (with its native encoding, without its
    unsupported name), the --model help of train_vit.py (imported by --import before the help is written), the
    'supported' and 'takes' messages, and load_timm_checkpoint's conversion hook."""
    user = write(tmp_path, "toy_backbone", USER_BACKBONE)
    checks = tmp_path / "checks.py"
    checks.write_text(USER_CHECKS)
    done = subprocess.run([sys.executable, str(checks), str(user)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "user backbone: ok" in done.stdout, done.stderr[-3000:]
    helped = subprocess.run([sys.executable, str(ROOT / "train_vit.py"), "--import", str(user), "--help"],
                            capture_output=True, text=True, timeout=600)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "user ToyViT (toy_vit_tiny)" in " ".join(helped.stdout.split())
