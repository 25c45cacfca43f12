"""The models of the device tests: every family in a timm ViT, timm Swin (v1, v2), a tubelet video ViT and
torchvision's Video Swin, small enough for the CPU run, with head_dim 16 so that flash attention can take them."""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import pytest
import torch
from conftest import requires

import visionpe as vpe

# pooled over all tokens: with the class token alone, the last block's bias (zero on the prefix row) reaches nothing
VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, global_pool="avg")
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=32, depths=(2, 1), num_heads=(2, 4), num_classes=5,
            drop_path_rate=0.0)  # timm's Swin default 0.1 would draw per step
VIDEO = dict(num_frames=4, img_size=16, tubelet_size=(2, 4, 4), embed_dim=48, depth=1, num_heads=3, num_classes=5,
             global_pool="avg")
VIDEO_SWIN = dict(patch_size=[2, 4, 4], embed_dim=32, depths=[2, 1], num_heads=[2, 4], window_size=[2, 4, 4],
                  num_classes=5, stochastic_depth_prob=0.0)  # torchvision's default 0.1 would draw per step

# FlexAttention compiles a graph per layout kind, score function and (CPU) shape; past dynamo's recompile limit (8)
# calls would run flex_attention's unfused reference instead of the kernel under test
for _name in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, max(64, getattr(torch._dynamo.config, _name)))

VIT_PES = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi", "bucket_bias",
           "rope_mixed+learned", "rope_axial+alibi"]
SWIN_PES = ["swin_bias", "cpb", "bucket_bias", "alibi", "rope_axial", "rope_mixed"]
VIDEO_PES = ["sincos", "learned", "rope_axial", "rope_mixed", "rel_bias", "alibi"]
VIDEO_SWIN_PES = ["swin_bias", "cpb", "rope_mixed"]


@dataclass(frozen=True)
class Case:
    """One model with one encoding and the input shape it runs on (not its training size: a resolution change)."""

    backbone: str  # vit, swin, swinv2, video, video_swin
    pe: str
    shape: tuple[int, ...]  # input without the batch axis

    @property
    def id(self) -> str:
        return f"{self.backbone}-{self.pe}"

    @property
    def family(self) -> set[str]:
        return {vpe.available()[name] for name in self.pe.split("+") if name != "none"}

    def build(self, attention: str = "auto") -> torch.nn.Module:
        """The model in eval mode, with attention logits of order 1 (timm's qkv init makes them ~0, so attention is
        near uniform and positions barely reach the output) and every position parameter drawn large enough to count
        (fresh tables are ~0)."""
        torch.manual_seed(0)
        if self.backbone == "vit":
            model = vpe.create_model("vit_tiny_patch16_224", pe=self.pe, attention=attention, **VIT)
        elif self.backbone == "swin":
            model = vpe.create_model("swin_tiny_patch4_window7_224", pe=self.pe, attention=attention, **SWIN)
        elif self.backbone == "swinv2":
            model = vpe.create_model("swinv2_tiny_window8_256", pe=self.pe, attention=attention, **SWIN)
        elif self.backbone == "video":
            model = vpe.create_video_model("vit_tiny_patch16_224", pe=self.pe, attention=attention, **VIDEO)
        else:
            from torchvision.models.video.swin_transformer import SwinTransformer3d
            model = vpe.apply(SwinTransformer3d(**VIDEO_SWIN), pe=self.pe, attention=attention)
        for name, p in model.named_parameters():
            if name.endswith("qkv.weight"):
                torch.nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif self.backbone == "swinv2" and name.endswith(("norm1.weight", "norm2.weight")):
                torch.nn.init.ones_(p)  # Swin-V2's residual post-norms start at 0: no attention reaches the output
        for enc in sum(vpe.encodings_of(model).values(), []):
            for p in enc.parameters():
                torch.nn.init.normal_(p, std=0.5)
        return model.eval()

    def features(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Every token after the last block and norm (not the pooled logits: a class token or a mean over tokens
        sees positions only at second order)."""
        if self.backbone == "video_swin":
            return model.norm(model.features(model.pos_drop(model.patch_embed(x))))
        return model.forward_features(x)

    def input(self, batch: int = 2, seed: int = 1, shape=None) -> torch.Tensor:
        return torch.randn(batch, *(shape or self.shape), generator=torch.Generator().manual_seed(seed))

    def other_shapes(self) -> list[tuple[int, ...]]:
        """The input transposed (the same token count: the case that once mixed sizes between threads) and one
        smaller size."""
        *lead, h, w = self.shape
        if self.backbone.startswith("video"):  # (C, T, H, W): half the frames, smaller frames
            smaller = (lead[0], lead[1] // 2, h - 4, w - 4)
        else:
            smaller = (lead[0], h - 8, w - 8)
        return [(*lead, w, h), smaller]


CASES = [Case("vit", pe, (3, 32, 40)) for pe in VIT_PES]
CASES += [Case("swin", pe, (3, 32, 48)) for pe in SWIN_PES] + [Case("swinv2", "cpb", (3, 32, 48))]
CASES += [Case("video", pe, (3, 4, 16, 24)) for pe in VIDEO_PES]
CASES += [Case("video_swin", pe, (3, 4, 32, 40)) for pe in VIDEO_SWIN_PES]
# attention="flex" in the models: both kinds of pair function (a per-offset table, a function of coordinates, the
# latter with a rotary encoding) and Swin's shifted windows (an extra mask read per pair); few, since each is a
# kernel compiled per dtype, layout kind and number of heads (tens of seconds each on a GPU)
FLEX_CASES = [Case("vit", "rel_bias", (3, 32, 40)), Case("vit", "rope_axial+alibi", (3, 32, 40)),
              Case("swin", "swin_bias", (3, 32, 48))]


# the CPU run (the default --device) takes one case per backbone and family, and one flex case (CPU flex is tested
# through and through in tests/encodings/test_flex_attention.py); --device cuda takes every case
CPU_FLEX = {"vit-rel_bias", "vit-rel_bias-flex"}
CPU_CASES = {"vit-learned", "vit-rope_mixed", "vit-rel_bias", "vit-rope_axial+alibi", "swin-swin_bias",
             "swin-rope_mixed", "swinv2-cpb", "video-rope_mixed", "video_swin-swin_bias"}


def params(runs, cpu: set[str] | None = None) -> list:
    """``pytest.param`` of each case (or tuple whose first item is a case), with the ``cuda_matrix`` marker (deselected
    by the CPU run, tests/conftest.py) unless its case is in :data:`CPU_CASES` or, given ``cpu``, its id is."""
    out = []
    for run in runs:
        values = run if isinstance(run, tuple) else (run,)
        name = "-".join([values[0].id, *map(str, values[1:])])
        on_cpu = name in cpu if cpu is not None else values[0].id in CPU_CASES
        marks = [] if on_cpu else [pytest.mark.cuda_matrix]
        if "flex" in values[1:] or getattr(values[0], "attention", None) == "flex":
            marks.append(requires("torch", "2.5", "torch.nn.attention.flex_attention"))
        out.append(pytest.param(*values, id=name, marks=marks))
    return out


@contextlib.contextmanager
def exact_float32():
    """float32 matmuls and convolutions without TF32 (CUDA's cuDNN convolutions default to TF32)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def autocast(device: torch.device, precision: str):
    """bf16 autocast (the training recipe's mixed precision) or exact float32."""
    if precision == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return exact_float32()


def float64_reference(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 CPU copy with SDPA: the reference every device and precision is held to."""
    return vpe.set_attention(copy.deepcopy(model).cpu().double(), "sdpa")


def tensors_of(table) -> list[torch.Tensor]:
    if isinstance(table, torch.Tensor):
        return [table]
    return [t for part in table for t in tensors_of(part)] if isinstance(table, (tuple, list)) else []
