"""What is measured on which model: the setups (a model recipe and its input batch) of every part, full size or
``--quick``."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import yaml

import visionpe as vpe
from ...backbones.adapter import parse_pe
from ...cli.recipes import recipe_path
from ...presets import conventions_of
from ...registry import ENCODINGS

TINY_RECIPE = recipe_path("bench_vit_tiny")
VIDEO_RECIPE = recipe_path("bench_video_tiny")
NUM_CLASSES = 10


def defined_on(pe: str, ndim: int) -> bool:
    """Whether every encoding of ``pe`` (a name, a ``+`` combination or ``preset:NAME``) is defined on ``ndim``-D
    grids: an image-only one (Circle-RoPE, an image model's preset, whose conventions say ``ndim=2``) has no row in a
    video table."""
    names = parse_pe(pe)
    words = conventions_of(names)
    return all(ndim in ENCODINGS[name].ndims and words.get(name, {}).get("ndim", ndim) == ndim
               for name in names.values())


@dataclass(frozen=True)
class Setup:
    """A model recipe and its input batch: ``create(pe)`` builds the model (same seed for every encoding)."""

    label: str
    model: str
    kwargs: dict
    batch: int
    size: tuple[int, ...]  # input size, (H, W), or (T, H, W) for a video model
    video: dict | None = None  # create_video_model keywords (num_frames, tubelet_size)
    slow: bool = False  # a call lasts longer than --min-run-time: timed over --slow-repeats rounds of one call

    def create(self, pe: str, device) -> torch.nn.Module:
        torch.manual_seed(0)
        if self.video is None:
            model = vpe.create_model(self.model, pe=pe, num_classes=NUM_CLASSES, **self.kwargs)
        else:
            model = vpe.create_video_model(self.model, pe=pe, num_classes=NUM_CLASSES, **self.video, **self.kwargs)
        return model.to(device)

    def input(self, device, size: tuple[int, ...] | None = None) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randn(self.batch, 3, *(size or self.size), generator=generator).to(device)

    def labels(self, device) -> torch.Tensor:
        return torch.randint(NUM_CLASSES, (self.batch,), generator=torch.Generator().manual_seed(1)).to(device)

    def tokens(self, model: torch.nn.Module) -> int:
        """Tokens per sample: prefix + patches."""
        patches = math.prod(s // p for s, p in zip(self.size, model.patch_embed.patch_size))
        return model.num_prefix_tokens + patches


@dataclass(frozen=True)
class Plan:
    """Model and input sizes of every part: the full ones, or tiny ones under ``--quick``."""

    vit: Setup  # ViT-S/16 at 224 px: forward, train, memory, timm, cache
    tiny: Setup  # the small training config: forward, train, memory
    compiled: Setup  # the compile part's per-encoding model (the small training config; quick: the quick ViT)
    large: tuple[Setup, ...]  # the scale part's grids
    rope: tuple[int, tuple[int, int], int, tuple[int, ...]]  # heads, patch grid, head_dim, batches
    swin: dict[str, tuple[str, dict, tuple[int, int]]]  # (timm name, kwargs, input size) of Swin-T and SwinV2-T
    alt_size: tuple[int, int]  # the cache part's second input size
    flex: tuple[int, int, tuple[tuple[int, int], ...]]  # heads, head_dim, (batch, grid side) of each flex table
    flex_models: tuple[Setup, ...] = ()  # the flex-models part's ViT at each token count
    video: tuple[Setup, ...] = ()  # the video part's tubelet video ViTs


def tiny_recipe(batch: int | None = None) -> Setup:
    """The model of ``bench_vit_tiny`` (the CPU training benchmark's recipe) at its batch size."""
    cfg = yaml.safe_load(TINY_RECIPE.read_text())
    size = cfg["img_size"]
    kwargs = dict(cfg.get("model_kwargs", {}), img_size=size, patch_size=cfg["patch_size"])
    return Setup(f"{cfg['model']} of {TINY_RECIPE.name} ({kwargs['embed_dim']}-dim, {kwargs['depth']} blocks, "
                 f"{size} px / {cfg['patch_size']})", cfg["model"], kwargs, batch or cfg["batch_size"], (size, size))


def video_recipe() -> Setup:
    """The tubelet video ViT of ``bench_video_tiny`` (the CPU video benchmark's recipe) at its batch
    size, clips of its frame count and size."""
    cfg = yaml.safe_load(VIDEO_RECIPE.read_text())
    size, patch, frames = cfg["img_size"], cfg["patch_size"], cfg["num_frames"]
    tubelet = tuple(cfg.get("tubelet_size") or (1, patch, patch))
    return Setup(f"{cfg['model']} of {VIDEO_RECIPE.name} ({cfg['model_kwargs']['embed_dim']}-dim, "
                 f"{cfg['model_kwargs']['depth']} blocks, tubelets {'x'.join(map(str, tubelet))})", cfg["model"],
                 dict(cfg.get("model_kwargs", {}), img_size=size), cfg["batch_size"], (frames, size, size),
                 video=dict(num_frames=frames, tubelet_size=tubelet))


def flex_model_setups(quick: bool, batch: int, device_type: str) -> tuple[Setup, ...]:
    """The flex-models part's ViT-S/16: 197 and 4097 tokens with 2 of its 12 blocks on CPU (a 4097-token training
    step of all 12 takes about 20 s there); 4097 and 16385 tokens with all 12 blocks on CUDA."""
    if quick:
        kw = dict(embed_dim=32, depth=2, num_heads=2, img_size=32, patch_size=8)
        return (Setup("quick ViT (32 px / 8)", "vit_tiny_patch16_224", kw, 2, (32, 32)),
                Setup("quick ViT (64 px / 8)", "vit_tiny_patch16_224", kw, 1, (64, 64)))
    if device_type == "cuda":
        return (Setup("ViT-S/16, 1024 px", "vit_small_patch16_224", {}, 1, (1024, 1024)),
                Setup("ViT-S/16, 2048 px", "vit_small_patch16_224", {}, 1, (2048, 2048)))
    blocks = {"depth": 2}
    return (Setup("ViT-S/16 with 2 blocks, 224 px", "vit_small_patch16_224", blocks, batch, (224, 224)),
            Setup("ViT-S/16 with 2 blocks, 1024 px", "vit_small_patch16_224", blocks, 1, (1024, 1024)))


def make_plan(quick: bool, batch: int, device_type: str = "cpu") -> Plan:
    """The full sizes (ViT-S/16, Swin-T, 1024 px...) or, with ``quick``, tiny models that run in seconds."""
    if quick:
        width = dict(embed_dim=48, depth=2, num_heads=2)  # 48: sin and cos channels for 3 axes
        kw = dict(width, img_size=32, patch_size=8)
        swin = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2))
        vit = Setup("quick ViT (32 px / 8)", "vit_tiny_patch16_224", kw, 2, (32, 32))
        return Plan(
            vit=vit,
            tiny=tiny_recipe(batch=8),
            compiled=vit,
            large=(Setup("quick ViT, 64 px", "vit_tiny_patch16_224", kw, 1, (64, 64)),
                   Setup("quick video ViT, 4 frames of 32 px", "vit_tiny_patch16_224", dict(width, img_size=32), 1,
                         (4, 32, 32),
                         video=dict(num_frames=4, tubelet_size=(2, 8, 8)))),
            rope=(2, (4, 4), 16, (2, 4)),
            swin={"Swin-T": ("swin_tiny_patch4_window7_224", swin, (32, 32)),
                  "SwinV2-T": ("swinv2_tiny_window8_256", swin, (32, 32))},
            alt_size=(48, 48),
            flex=(2, 16, ((2, 4),)),
            flex_models=flex_model_setups(quick, batch, device_type),
            video=(Setup("quick video ViT", "vit_tiny_patch16_224", dict(width, img_size=32), 2, (4, 32, 32),
                         video=dict(num_frames=4, tubelet_size=(2, 8, 8))),))
    return Plan(
        vit=Setup("vit_small_patch16_224 (ViT-S/16), 224 px", "vit_small_patch16_224", {}, batch, (224, 224),
                  slow=True),
        tiny=tiny_recipe(),
        compiled=tiny_recipe(),
        large=(Setup("ViT-S/16, 1024 px", "vit_small_patch16_224", {}, 1, (1024, 1024)),
               Setup("ViT-S/16 video, 16 frames of 224 px, tubelets 2x16x16", "vit_small_patch16_224", {}, 1,
                     (16, 224, 224), video=dict(num_frames=16, tubelet_size=(2, 16, 16)))),
        rope=(6, (14, 14), 64, (batch, 64)),
        swin={"Swin-T": ("swin_tiny_patch4_window7_224", {}, (224, 224)),
              "SwinV2-T": ("swinv2_tiny_window8_256", {}, (256, 256))},
        alt_size=(256, 256),
        flex=(6, 64, ((batch, 14), (1, 64))),
        flex_models=flex_model_setups(quick, batch, device_type),
        video=(video_recipe(),
               Setup("ViT-S/16 video, tubelets 2x16x16", "vit_small_patch16_224", {}, 2, (8, 224, 224),
                     video=dict(num_frames=8, tubelet_size=(2, 16, 16)), slow=True)))


