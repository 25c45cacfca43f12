"""The model zoo of the workbench: the one place a model is made from a run's settings (training, resume, sweep,
benchmark, visualization), and what a model name may be.

A ``--model`` name is a timm model whose module a registered adapter takes (ViT/DeiT, distilled DeiT, Swin v1/v2,
Eva), or a name an adapter constructs itself (torchvision's Video Swin ``swin3d_t/s/b`` and image ViT
``tv_vit_*``, or a user's backbone registered through ``--import``); the help and the messages list them from the
registered adapters (:func:`model_help`, :func:`supported_text`). A video run (``num_frames`` set) builds a tubelet
timm ViT (:func:`visionpe.create_video_model`) or a video adapter's named model with the tubelet as its patch.

``settings`` here is always a run's :class:`~visionpe.train.settings.TrainSettings`, read by field; it is named, not
imported: settings.py is built on this module (its ``--model`` help, checks and saved form).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import timm
import torch

from ..backbones.adapter import ADAPTERS, adapter_of_name, named_constructor
from ..backbones.api import native_timm_modules, unsupported_reason
from ..cli import UserError, user_errors
from ..encoding import Encoding
from ..registry import ENCODINGS

# pe: timm's model as timm builds it, no visionpe module in it (its own encoding: the benchmark's control rows). Not
# pe="native", which is a visionpe adapter replaying a model's own encoding inside visionpe's attention.
TIMM_UNPATCHED = "timm_unpatched"
RENAMED_PE = {"timm": TIMM_UNPATCHED}  # an old spelling -> the name it has now (an error naming it)
# the workbench's own model names: a timm architecture at the sizes given here (a named model keeps timm's sizes)
PRESETS = {"tiny": ("vit_tiny_patch16_224", {"embed_dim": 64, "depth": 4, "num_heads": 4})}
DEFAULT_MODEL = "tiny"  # the model when --model is not given: small enough to train in minutes on a CPU
DERIVED_MODEL_KWARGS = ("img_size", "patch_size", "num_classes", "in_chans", "drop_path_rate")  # set from settings


def tubelet(settings) -> tuple[int, int, int]:
    """A video run's tubelet: ``tubelet_size`` if given, else ``(1, patch, patch)`` (see the --tubelet-size help)."""
    if settings.tubelet_size:
        return tuple(int(v) for v in settings.tubelet_size)
    patch = settings.patch_size
    return (1, *((patch, patch) if isinstance(patch, int) else tuple(patch)))


def is_vit(name: str) -> bool:
    """``name`` is a timm ViT/DeiT (the family the workbench's default sizes and tubelet video models are for)."""
    return timm.is_model(name) and timm.models.is_model_in_modules(name, ["vision_transformer"])


@dataclass(frozen=True)
class ModelPlan:
    """A run's model resolved once from its settings (:func:`model_plan`), handed to what builds it and to what
    reads its pretrained source instead of asking the adapters again: ``named`` the adapter's own constructor
    ``(adapter, build)`` of ``--model`` (None: a timm model) and ``kwargs`` its keywords (:func:`constructor_kwargs`;
    with ``pe=timm_unpatched`` also what makes timm's own model run at any input size the way timm does it, its
    adapter's any-size keywords: learned tables resampled bicubic and RoPE recomputed per grid for ViT/Eva,
    ``strict_img_size=False`` for Swin)."""
    named: tuple | None
    kwargs: dict


def model_plan(settings) -> ModelPlan:
    """The :class:`ModelPlan` of a run: its constructor and adapter asked once of the adapters
    (:func:`~visionpe.backbones.adapter.adapter_of_name`), its keywords computed once."""
    adapter, build = adapter_of_name(settings.model)
    named = (adapter, build) if build is not None else None
    kwargs = constructor_kwargs(settings, named)
    if settings.pe == TIMM_UNPATCHED and adapter is not None and adapter.any_size is not None:
        with building(settings):  # what any_size_kwargs adds, from the adapter in hand
            kwargs = adapter.any_size(kwargs)
    return ModelPlan(named, kwargs)


def building(settings):
    """The context of building a run's model: what a constructor (or its keywords' checks) refuses, in many ways (a
    negative width: torch's RuntimeError, a failed assert), becomes a :class:`UserError` naming the model, the
    encoding and ``--model-kwargs``."""
    given = " ".join(f"{k}={v}" for k, v in dict(settings.model_kwargs or {}).items())
    what = f"cannot build {settings.model} with pe={settings.pe}" + (f" and --model-kwargs {given}" if given else "")
    return user_errors(what, (ValueError, TypeError, AssertionError, RuntimeError, ZeroDivisionError))


def model_kwargs(settings) -> dict:
    """Everything the model's constructor needs besides the name, in timm's keyword names: the run's
    ``model_kwargs``, resolution, patch (a video adapter's named model: the tubelet), classes, channels, drop path."""
    return constructor_kwargs(settings, named_constructor(settings.model))


def constructor_kwargs(settings, named: tuple | None) -> dict:
    """:func:`model_kwargs` of a model whose adapter's named constructor is ``named`` (``(adapter, constructor)``,
    or None for a timm model): asked once by :func:`model_plan`."""
    kw = {k: v for k, v in dict(settings.model_kwargs or {}).items() if k != "drop_path_rate"}
    kw.update(img_size=settings.img_size, patch_size=settings.patch_size, num_classes=settings.num_classes,
              in_chans=settings.in_chans)
    if named is not None and named[0].video and settings.num_frames:
        kw["patch_size"] = tubelet(settings)
    if settings.drop_path or named is not None:
        kw["drop_path_rate"] = settings.drop_path or 0.0
    return kw


def sizes_text(kwargs) -> str:
    """Model keywords as ``k=v`` words: ``"embed_dim=64 depth=4 num_heads=4"`` (anything else as it is)."""
    return " ".join(f"{k}={v}" for k, v in kwargs.items()) if isinstance(kwargs, dict) else repr(kwargs)


def preset_text(name: str) -> str:
    """A preset in words: ``"tiny (vit_tiny_patch16_224 at embed_dim=64 depth=4 num_heads=4)"``."""
    model, kwargs = PRESETS[name]
    return f"{name} ({model} at {sizes_text(kwargs)})"


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
    presets = ", ".join(preset_text(name) for name in PRESETS)
    return (f"model name: {presets}, the default: a model small enough for a CPU; or a timm model of a backbone "
            f"visionpe adapts, built at timm's own sizes (--model-kwargs adds to them), or a name an adapter builds "
            f"itself: {supported_text(video=False)}; or a backbone registered by --import. With --num-frames (video) a timm "
            f"ViT, built as its tubelet version (visionpe.create_video_model), or a video backbone: "
            f"{supported_text(video=True)} (its sizes; --model-kwargs embed_dim=, depths=[..], num_heads=[..], "
            f"window_size=[t,h,w] make a smaller one; its patch is --tubelet-size)")


def check_model(settings) -> None:
    """The model name and the run agree: a known name, a video model for video data and only then, ``pe=timm_unpatched`` on a
    model timm runs natively; a :class:`UserError` naming what is allowed otherwise."""
    name, video = settings.model, settings.num_frames is not None
    adapter, build = adapter_of_name(name)
    if build is None and not timm.is_model(name):
        raise UserError(f"unknown model {name!r}; try e.g. {supported_text()}, or a model registered by --import")
    if settings.pe == TIMM_UNPATCHED:
        if video or build is not None or adapter is None:
            raise UserError(f"pe=timm_unpatched trains one of timm's image models as timm builds it (modules "
                            f"{', '.join(native_timm_modules())}), got --model {name}"
                            + (" with --num-frames" if video else ""))
        return
    if adapter is None:
        raise UserError(f"--model {name}: visionpe has no adapter for it (supported: {supported_text()}; or a "
                        "backbone registered by --import)")
    reason = unsupported_reason(name) if build is None else None
    if reason is not None:
        raise UserError(f"--model {name}: {reason}; or --pe timm_unpatched to train {name} as timm builds it")
    if build is not None and adapter.video != video:
        raise UserError(f"--model {name} is a video model ({adapter.name}): it needs video data and --num-frames"
                        if adapter.video else f"--model {name} takes images, not --num-frames")
    if video and build is None and not is_vit(name):
        raise UserError(f"video runs (--num-frames) build a tubelet timm ViT or a video backbone: --model {name} is "
                        f"not a ViT (vit_*, deit_*) nor a video model ({supported_text(video=True)})")


def build_model(settings, plan: ModelPlan | None = None) -> torch.nn.Module:
    """The model of a run's settings, with its encoding: a timm model (:func:`visionpe.create_model`), an adapter's
    named model then :func:`visionpe.apply`, a tubelet video ViT, or timm's own model (``pe=timm_unpatched``).
    ``plan``: the run's :class:`ModelPlan` where the caller holds it (else resolved here)."""
    import visionpe
    plan = plan or model_plan(settings)
    named, kwargs = plan.named, dict(plan.kwargs)
    with building(settings):
        if named is not None:
            model = visionpe.apply(named[1](**kwargs), settings.pe, **settings.pe_kwargs)
        elif settings.num_frames:
            kwargs.pop("patch_size", None)
            model = visionpe.create_video_model(settings.model, pe=settings.pe, num_frames=settings.num_frames,
                                                tubelet_size=tubelet(settings), pe_kwargs=settings.pe_kwargs, **kwargs)
        elif settings.pe == TIMM_UNPATCHED:  # timm's own model, at any input size (the plan's keywords)
            return timm.create_model(settings.model, pretrained=False, **kwargs)
        else:
            return visionpe.create_model(settings.model, pe=settings.pe, pe_kwargs=settings.pe_kwargs, **kwargs)
    if settings.tokens_per_second is not None:
        check_time_axis(model, settings.pe)
    return model


def check_time_axis(model: torch.nn.Module, pe: str) -> None:
    """``--tokens-per-second``: every encoding of ``model`` reads the clips' time steps, and one at least is there
    (a table indexed by integer positions would refuse them mid-run; no encoding, ignore them); else a
    :class:`UserError`."""
    encodings = [m for m in model.modules() if isinstance(m, Encoding)]
    if not encodings:
        raise UserError(f"--tokens-per-second puts clips on an absolute time axis, but --pe {pe} has no encoding to "
                        "read it; give one that reads coordinates (e.g. rope_mixed, alibi, sincos)")
    for encoding in encodings:
        refusal = encoding.spacing_refusal()
        if refusal is not None:
            readers = ", ".join(name for name, cls in ENCODINGS.items() if cls.reads_spacing)
            raise UserError(f"--tokens-per-second puts clips on an absolute time axis, but in --pe {pe} "
                            f"{type(encoding).__name__} {refusal}; encodings that read it: {readers}")


def pretrained_source(settings, plan: ModelPlan) -> tuple[torch.nn.Module, str]:
    """``--pretrained``: timm's own model of the run (``--model``, its sizes, resolution, patch, channels and classes;
    a video run's image model) with timm's pretrained weights, and the name of their source. timm adapts them to the
    run as it does for fine-tuning (its pretrained filter resamples ``pos_embed`` and the patch embedding, the input
    convolution takes the run's channels, and the classifier head is new when the classes differ); the weights come
    from the Hugging Face hub, or from ``pretrained_path`` through ``pretrained_cfg_overlay=dict(file=...,
    num_classes=-1)`` as timm's train.py gives a local file (its head is always new). Any failure, a download
    included, is a :class:`UserError` naming the model. ``plan``: the run's :class:`ModelPlan` (its keywords)."""
    path = settings.pretrained_path
    kwargs = {k: v for k, v in plan.kwargs.items() if k != "drop_path_rate"}  # the source is only read
    overlay = {}
    if path is not None:
        if not Path(path).is_file():
            raise UserError(f"--pretrained-path {path}: no such file")
        # custom_load: only big_vision's .npz files take timm's custom loader (timm 1.0.19 keeps the default tag's
        # custom_load=True for a file too, and would read a PyTorch file as .npz)
        overlay = {"pretrained_cfg_overlay": {"file": str(path), "num_classes": -1,
                                              "custom_load": Path(path).suffix == ".npz"}}
    source = f"timm:{settings.model}" + (f" from {path}" if path is not None else "")
    try:
        return timm.create_model(settings.model, pretrained=True, **overlay, **kwargs), source
    except Exception as err:  # timm and the hub raise many kinds (RuntimeError, OSError, HTTP errors, ...)
        where = f"the file {path}" if path is not None else "the Hugging Face hub (give --pretrained-path FILE offline)"
        raise UserError(f"--pretrained {settings.model}: timm could not load its weights from {where} "
                        f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None


def run_grid(settings) -> tuple[int, ...]:
    """Patch grid of a trained model: ``img_size // patch_size`` per axis (either may be an int or a list);
    a video run (``num_frames`` set) adds ``num_frames // tubelet_size[0]`` in front."""
    img = settings.img_size
    img = (img, img) if isinstance(img, int) else tuple(img)
    patch = settings.patch_size
    patch = (patch,) * len(img) if isinstance(patch, int) else tuple(patch)
    if settings.num_frames:
        img, patch = (int(settings.num_frames), *img), tubelet(settings)
    if len(patch) != len(img):
        raise UserError(f"img_size={settings.img_size!r} and patch_size={settings.patch_size!r} differ in axes")
    return tuple(int(i) // int(p) for i, p in zip(img, patch))
