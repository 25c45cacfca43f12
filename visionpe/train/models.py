"""The model zoo of the workbench: the one place a model is made from a run's settings (training, resume, sweep,
benchmark, visualization), and what a model name may be.

A ``--model`` name is a timm model whose module a registered adapter takes (ViT/DeiT, distilled DeiT, Swin v1/v2,
Eva), or a name an adapter constructs itself (torchvision's Video Swin ``swin3d_t/s/b`` and image ViT
``tv_vit_*``, or a user's backbone registered through ``--import``); the help and the messages list them from the
registered adapters (:func:`model_help`, :func:`supported_text`). A video run (``num_frames`` set) builds a tubelet
timm ViT (:func:`visionpe.create_video_model`) or a video adapter's named model with the tubelet as its patch.
"""
from __future__ import annotations

from pathlib import Path

import timm
import torch

from ..backbones.adapter import ADAPTERS, named_constructor, timm_adapter
from ..backbones.api import any_size_kwargs, native_timm_modules, unsupported_reason
from ..cli import UserError, user_errors

TIMM_NATIVE = "timm"  # pe: the timm model with its own position encoding, untouched (benchmark reference rows)
DERIVED_MODEL_KWARGS = ("img_size", "patch_size", "num_classes", "in_chans", "drop_path_rate")  # set from settings


def tubelet(cfg: dict) -> tuple[int, int, int]:
    """A video run's tubelet: ``tubelet_size`` if given, else ``(1, patch, patch)`` (see the --tubelet-size help)."""
    if cfg.get("tubelet_size"):
        return tuple(int(v) for v in cfg["tubelet_size"])
    patch = cfg["patch_size"]
    return (1, *((patch, patch) if isinstance(patch, int) else tuple(patch)))


def is_vit(name: str) -> bool:
    """``name`` is a timm ViT/DeiT (the family the workbench's default sizes and tubelet video models are for)."""
    return timm.is_model(name) and timm.models.is_model_in_modules(name, ["vision_transformer"])


def model_kwargs(cfg: dict) -> dict:
    """Everything the model's constructor needs besides the name, in timm's keyword names: the run's
    ``model_kwargs``, resolution, patch (a video adapter's named model: the tubelet), classes, channels, drop path."""
    kw = {k: v for k, v in dict(cfg.get("model_kwargs") or {}).items() if k != "drop_path_rate"}
    kw.update(img_size=cfg["img_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
              in_chans=cfg["in_chans"])
    named = named_constructor(cfg["model"])
    if named is not None and named[0].video and cfg.get("num_frames"):
        kw["patch_size"] = tubelet(cfg)
    if cfg.get("drop_path") or named is not None:
        kw["drop_path_rate"] = cfg.get("drop_path") or 0.0
    return kw


def supported_text(video: bool | None = None) -> str:
    """The registered backbones with example names, for help texts and messages: ``"timm VisionTransformer
    (vit_tiny_patch16_224, ...), ..."``; ``video`` True/False: only the video/image ones."""
    parts = []
    for adapter in ADAPTERS.values():
        if not adapter.examples or (video is not None and adapter.video != video):
            continue
        parts.append(f"{adapter.name} ({', '.join(adapter.examples)})")
    return "; ".join(parts)


def model_help() -> str:
    """The ``--model`` help, from the registered adapters."""
    return (f"model name: a timm model of a backbone visionpe adapts, or a name an adapter builds itself: "
            f"{supported_text(video=False)}; or a backbone registered by --import. With --num-frames (video) a timm "
            f"ViT, built as its tubelet version (visionpe.create_video_model), or a video backbone: "
            f"{supported_text(video=True)} (its sizes; --model-kwargs embed_dim=, depths=[..], num_heads=[..], "
            f"window_size=[t,h,w] make a smaller one; its patch is --tubelet-size)")


def check_model(cfg: dict) -> None:
    """The model name and the run agree: a known name, a video model for video data and only then, ``pe=timm`` on a
    model timm runs natively; a :class:`UserError` naming what is allowed otherwise."""
    name, video = cfg["model"], cfg.get("num_frames") is not None
    named = named_constructor(name)
    if named is None and not timm.is_model(name):
        raise UserError(f"unknown model {name!r}; try e.g. {supported_text()}, or a model registered by --import")
    adapter = named[0] if named is not None else timm_adapter(name)
    if cfg["pe"] == TIMM_NATIVE:
        if video or named is not None or adapter is None:
            raise UserError(f"pe=timm trains one of timm's image models as timm builds it (modules "
                            f"{', '.join(native_timm_modules())}), got --model {name}"
                            + (" with --num-frames" if video else ""))
        return
    if adapter is None:
        raise UserError(f"--model {name}: visionpe has no adapter for it (supported: {supported_text()}; or a "
                        "backbone registered by --import)")
    reason = unsupported_reason(name) if named is None else None
    if reason is not None:
        raise UserError(f"--model {name}: {reason}; or --pe timm to train {name} as timm builds it")
    if named is not None and named[0].video != video:
        raise UserError(f"--model {name} is a video model ({named[0].name}): it needs video data and --num-frames"
                        if named[0].video else f"--model {name} takes images, not --num-frames")
    if video and named is None and not is_vit(name):
        raise UserError(f"video runs (--num-frames) build a tubelet timm ViT or a video backbone: --model {name} is "
                        f"not a ViT (vit_*, deit_*) nor a video model ({supported_text(video=True)})")


def build_model(cfg: dict) -> torch.nn.Module:
    """The model of a run's settings, with its encoding: a timm model (:func:`visionpe.create_model`), an adapter's
    named model then :func:`visionpe.apply`, a tubelet video ViT, or timm's own model (``pe=timm``)."""
    import visionpe
    kwargs = model_kwargs(cfg)
    named = named_constructor(cfg["model"])
    given = " ".join(f"{k}={v}" for k, v in dict(cfg.get("model_kwargs") or {}).items())
    what = f"cannot build {cfg['model']} with pe={cfg['pe']}" + (f" and --model-kwargs {given}" if given else "")
    # a constructor refuses bad keywords in many ways (a negative width: torch's RuntimeError, a failed assert)
    with user_errors(what, (ValueError, TypeError, AssertionError, RuntimeError, ZeroDivisionError)):
        if named is not None:
            return visionpe.apply(named[1](**kwargs), cfg["pe"], **cfg["pe_kwargs"])
        if cfg.get("num_frames"):
            kwargs.pop("patch_size", None)
            return visionpe.create_video_model(cfg["model"], pe=cfg["pe"], num_frames=cfg["num_frames"],
                                               tubelet_size=tubelet(cfg), pe_kwargs=cfg["pe_kwargs"], **kwargs)
        if cfg["pe"] == TIMM_NATIVE:
            return timm_native(cfg["model"], kwargs)
        return visionpe.create_model(cfg["model"], pe=cfg["pe"], pe_kwargs=cfg["pe_kwargs"], **kwargs)


def timm_native(name: str, kwargs: dict) -> torch.nn.Module:
    """``pe=timm``: the model exactly as timm builds it, its own position encoding included, made to run at any
    input size the way timm does it (its adapter's any-size keywords: learned tables resampled bicubic and RoPE
    recomputed per grid for ViT/Eva, ``strict_img_size=False`` for Swin)."""
    return timm.create_model(name, pretrained=False, **any_size_kwargs(name, kwargs))


def pretrained_source(cfg: dict) -> tuple[torch.nn.Module, str]:
    """``--pretrained``: timm's own model of the run (``--model``, its sizes, resolution, patch, channels and classes;
    a video run's image model) with timm's pretrained weights, and the name of their source. timm adapts them to the
    run as it does for fine-tuning (its pretrained filter resamples ``pos_embed`` and the patch embedding, the input
    convolution takes the run's channels, and the classifier head is new when the classes differ); the weights come
    from the Hugging Face hub, or from ``pretrained_path`` through ``pretrained_cfg_overlay=dict(file=...,
    num_classes=-1)`` as timm's train.py gives a local file (its head is always new). Any failure, a download
    included, is a :class:`UserError` naming the model."""
    path = cfg.get("pretrained_path")
    kwargs = model_kwargs(cfg)
    kwargs.pop("drop_path_rate", None)  # the source is only read
    if cfg["pe"] == TIMM_NATIVE:
        kwargs = any_size_kwargs(cfg["model"], kwargs)
    overlay = {}
    if path is not None:
        if not Path(path).is_file():
            raise UserError(f"--pretrained-path {path}: no such file")
        # custom_load: only big_vision's .npz files take timm's custom loader (timm 1.0.19 keeps the default tag's
        # custom_load=True for a file too, and would read a PyTorch file as .npz)
        overlay = {"pretrained_cfg_overlay": {"file": str(path), "num_classes": -1,
                                              "custom_load": Path(path).suffix == ".npz"}}
    source = f"timm:{cfg['model']}" + (f" from {path}" if path is not None else "")
    try:
        return timm.create_model(cfg["model"], pretrained=True, **overlay, **kwargs), source
    except Exception as err:  # timm and the hub raise many kinds (RuntimeError, OSError, HTTP errors, ...)
        where = f"the file {path}" if path is not None else "the Hugging Face hub (give --pretrained-path FILE offline)"
        raise UserError(f"--pretrained {cfg['model']}: timm could not load its weights from {where} "
                        f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None


def run_grid(cfg: dict) -> tuple[int, ...]:
    """Patch grid of a trained model: ``img_size // patch_size`` per axis (either may be an int or a list);
    a video run (``num_frames`` set) adds ``num_frames // tubelet_size[0]`` in front."""
    img = cfg["img_size"]
    img = (img, img) if isinstance(img, int) else tuple(img)
    patch = cfg["patch_size"]
    patch = (patch,) * len(img) if isinstance(patch, int) else tuple(patch)
    if cfg.get("num_frames"):
        img, patch = (int(cfg["num_frames"]), *img), tubelet(cfg)
    if len(patch) != len(img):
        raise UserError(f"img_size={cfg['img_size']!r} and patch_size={cfg['patch_size']!r} differ in axes")
    return tuple(int(i) // int(p) for i, p in zip(img, patch))
