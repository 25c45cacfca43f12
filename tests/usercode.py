"""A user's own code, as files that a test writes and imports with ``--import``: an encoding, a data set and a
backbone, each one file and one registration (nothing inside the package changes)."""
from __future__ import annotations

from pathlib import Path

ENCODING = '''
import torch
import visionpe as vpe


@vpe.register("NAME")                           # a user's encoding, usable as pe="rope_axial+NAME" anywhere
class CheckerBias(vpe.BiasEncoding):
    def __init__(self, num_heads: int, ndim: int = 2):
        super().__init__()
        self.num_heads, self.ndim = num_heads, ndim
        self.scale = torch.nn.Parameter(torch.ones(num_heads))

    def forward(self, grid):                    # (heads, P + N, P + N)
        parity = grid.coords().sum(-1).remainder(2) * 2 - 1
        return self.pad_prefix(self.scale[:, None, None] * parity.expand(grid.num_patches, -1), grid)
'''

DATASET = '''
import torch
from visionpe.data import ImageTensorDataset, register_dataset


@register_dataset("bright-half", num_classes=2, in_chans=1, mean=(0.5,), std=(0.5,), synthetic=True)
def bright_half(split, img_size, seed=0, num_samples=None):
    """Which half of the image (left 0, right 1) holds a bright square: a position task."""
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    num = num_samples or 64
    g = torch.Generator().manual_seed(2 * seed + (split != "train"))  # the same images in every process
    labels = torch.randint(0, 2, (num,), generator=g)
    images = torch.zeros(num, 1, height, width, dtype=torch.uint8)
    side = max(1, width // 4)
    for i, label in enumerate(labels.tolist()):
        top = int(torch.randint(0, height - side + 1, (1,), generator=g))
        left = int(torch.randint(0, width // 2 - side + 1, (1,), generator=g)) + label * (width // 2)
        images[i, :, top:top + side, left:left + side] = 255
    return ImageTensorDataset(images, labels, 2, (0.5,), (0.5,), name="bright-half")
'''

BACKBONE = '''
import torch
from torch import nn

import visionpe as vpe
from visionpe.backbones import Adapter, PositionalModel, register_adapter
from visionpe.backbones.adapter import EncodingSet


class ToyViT(nn.Module):
    """A user's own transformer: conv patches, visionpe attention blocks, mean pooling."""

    def __init__(self, num_classes=10, patch_size=4, in_chans=3, embed_dim=16, depth=1, num_heads=2):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size)
        self.patch_embed.patch_size = (patch_size, patch_size)
        self.norms = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(depth))
        self.blocks = nn.ModuleList(vpe.Attention(embed_dim, num_heads) for _ in range(depth))
        self.head = nn.Linear(embed_dim, num_classes)

    def no_weight_decay(self):
        return set()

    def forward(self, x):
        x = self.patch_embed.proj(x)
        grid = vpe.Grid(tuple(x.shape[2:]))
        x = x.flatten(2).transpose(1, 2)
        for norm, block in zip(self.norms, self.blocks):
            x = x + block(norm(x), grid)
        return self.head(x.mean(1))


class ToyViTPE(PositionalModel, ToyViT):
    def forward(self, x):
        self.check_input(x)
        return super().forward(x)


def put_encodings(model, names, kwargs):
    if "tokens" in names:
        raise ValueError("ToyViT takes rotary and bias encodings")
    encodings = EncodingSet(names, kwargs)
    dim = model.head.in_features
    for block in model.blocks:
        context = vpe.ModelContext((4, 4), dim, block.num_heads, block.head_dim)
        block.rotary = encodings.block("rotary", context, block.rotary)
        block.bias = encodings.block("bias", context, block.bias)


def toy_vit(num_classes=10, patch_size=4, in_chans=3, img_size=None, drop_path_rate=0.0, **sizes):
    return ToyViT(num_classes=num_classes, patch_size=patch_size, in_chans=in_chans, **sizes)


register_adapter(Adapter(ToyViT, ToyViTPE, put_encodings, (vpe.Attention,), library="user",
                         constructors={"toy_vit": toy_vit}))
'''


def write(folder: Path, name: str, text: str, encoding: str = "checker") -> Path:
    """``folder/name.py`` holding ``text``, a user encoding registered as ``encoding`` (each test file its own name:
    xdist runs tests of several files in one process); returns its path."""
    path = Path(folder) / f"{name}.py"
    path.write_text(text.replace("NAME", encoding).lstrip())
    return path


def forget(encoding: str) -> None:
    """Undo an import of user code in this process: the encoding's registration and every user module (so that the
    next ``--import`` or run runs it again, as a fresh process would)."""
    import sys

    from visionpe.registry import ENCODINGS
    ENCODINGS.pop(encoding, None)
    for name in [m for m in sys.modules if m.startswith("visionpe_user_")]:
        del sys.modules[name]
