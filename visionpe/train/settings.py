"""The settings of a training run: every setting, its default, what it does, the values it takes, and the rules of
``--resume``.

Settings resolve as ``DEFAULTS < YAML recipe (--config) < command line``; a resumed run starts from its own
``config.yaml`` instead of the defaults (:func:`visionpe.train.restore.resume_config`). Every value is checked by
:func:`check`, one group at a time, whatever its source, and a bad one is a :class:`~visionpe.cli.UserError`
naming the setting and the values it takes. Each setting ``key`` is ``--key-with-dashes`` on the command line
and ``key:`` in YAML. User code named by ``--import`` (or ``imports:`` in a recipe) is imported before anything
is checked, so its encodings, data sets and backbones are known names.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import data as vdata
from ..cli import Parser, UserError, add_import, import_user_code, one_line
from ..cli.recipes import recipe_path
from .models import (DEFAULT_MODEL, DERIVED_MODEL_KWARGS, PRESETS, RENAMED_PE, TIMM_UNPATCHED, check_model, is_vit,
                     model_help, model_kwargs, named_constructor, preset_text, sizes_text, tubelet)

MODEL, DATA, OPTIM, SCHED, AUG, EVAL, RUN = ("model", "data", "optimizer", "learning-rate schedule",
                                             "augmentation and regularization", "evaluation", "run and misc")
GROUPS = (MODEL, DATA, OPTIM, SCHED, AUG, EVAL, RUN)
AMP = ("auto", "bf16", "fp16", "none")
DEVICES = ("auto", "cpu", "cuda")
PARALLEL = ("ddp", "fsdp")  # visionpe.train.parallel.MODES
SIZE_KEYS = ("embed_dim", "depth", "num_heads")  # command-line shortcuts into model_kwargs
RUN_KEYS = ("num_classes", "in_chans", "classes")  # written to / read from config.yaml only (classes: a folder's)
NOT_SAVED = ("overwrite", "stop_after")  # how to run, not what the run is
REPORTED = ("sizes_from",)  # what resolve found out about the settings: in the run's header, not in config.yaml
# settings a resumed run may change: they do not change what is trained (the rest is refused on --resume)
SAFE_ON_RESUME = ("eval_res", "eval_frames", "eval_batch_size", "workers", "threads", "progress", "device",
                  "stop_after", "download", "imports", "compile", "channels_last", "checkpoint_every_steps",
                  "checkpoint_every_minutes", "log", "parallel", "fsdp_reshard_after_forward", "grad_checkpointing")
EXTEND_ON_RESUME = ("epochs",)  # --resume DIR --epochs N: the run continues to N epochs on the schedule of that length
LOGGERS = ("tensorboard", "wandb")  # --log: visionpe.train.metrics.LOGGER_CLASSES


@dataclass(frozen=True)
class Setting:
    default: object
    group: str
    kind: str  # int, float, bool, str, choice, ints, floats, strs, choices, mapping, int?, float?, str?, choice?
    help: str
    choices: tuple = ()
    metavar: str | None = None


def _data_help() -> str:
    return (f"data set: one of {', '.join(vdata.DATASETS)}, or one registered by --import "
            "(visionpe.data.register_dataset)")


def _pe_help() -> str:
    import visionpe
    return (f"positional encoding: one of {', '.join(visionpe.available())}; a combination of one per family joined by '+' "
            f"(e.g. rope_mixed+learned); none; or {TIMM_UNPATCHED}: timm's model exactly as timm builds it, no "
            "visionpe module in it (a control row: timm's learned ViT, an Eva RoPE ViT with its rope_* keywords in "
            "--model-kwargs; not visionpe.apply's pe='native', visionpe's adapter replaying a model's own encoding)")


S = Setting
TRANSFORM_GROUPS = {"train": AUG, "eval": EVAL, "both": DATA}  # a Transforms field's stage -> its settings group
FIELD_KINDS = {"tuple": "floats", "float": "float", "float | None": "float?", "int": "int", "bool": "bool",
               "str": "str", "str | None": "str?"}  # a Transforms field's annotation -> the kind of its setting


def transform_settings(stage: str) -> dict[str, Setting]:
    """The settings of :class:`visionpe.data.Transforms`'s fields of ``stage`` (``train``, ``eval``, ``both``), made
    from the fields (:func:`visionpe.data.transforms.setting_fields`): default (a tuple as a YAML list), kind (from
    the annotation; ``choice`` / ``choice?`` where the field has choices), help, choices, metavar. The fields are the
    one place of these facts."""
    out = {}
    for f in vdata.transforms.setting_fields():
        if f.metadata["stage"] == stage:
            kind = FIELD_KINDS[f.type]
            if f.metadata["choices"]:
                kind = "choice?" if kind.endswith("?") else "choice"
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            out[f.name] = Setting(default, TRANSFORM_GROUPS[stage], kind, f.metadata["help"], f.metadata["choices"],
                                  f.metadata["metavar"])
    return out


SETTINGS: dict[str, Setting] = {
    # model
    "model": S(DEFAULT_MODEL, MODEL, "str", "", metavar="NAME"),  # help from the backbones (models.py)
    "pe": S("learned", MODEL, "str", "", metavar="NAME"),  # help filled from the registry
    "pe_kwargs": S({}, MODEL, "mapping", "encoding keywords as KEY=VALUE (VALUE read as YAML), e.g. theta=100 "
                   "scaling=pi; see visionpe.build for each encoding's keywords", metavar="KEY=VALUE"),
    "img_size": S(32, MODEL, "int", "training resolution in pixels (square); a positive multiple of patch_size, at most 65536 "
                  "patches per image (a 256x256 grid; video: per clip)",
                  metavar="PX"),
    "patch_size": S(4, MODEL, "int", "patch side in pixels; an integer >= 1", metavar="PX"),
    "model_kwargs": S({}, MODEL, "mapping", "model keywords as KEY=VALUE (embed_dim, depth, num_heads, mlp_ratio, "
                      "global_pool, ...), added to the model's own (timm's sizes of a named model, the preset's, a "
                      "recipe's model_kwargs)", metavar="KEY=VALUE"),
    "tubelet_size": S([], MODEL, "ints", "video: tubelet T P P (frames, height, width of one token); P must be "
                      "patch_size. Default 1 P P: one token per frame patch, so the order of frames is carried only "
                      "by the positional encoding (an encoding without a time axis cannot tell the direction of "
                      "motion), and any frame count can be evaluated; 2 P P is ViViT/VideoMAE's (half the tokens, "
                      "but each token sees local motion inside itself); num_frames and eval_frames must be "
                      "multiples of T", metavar="N"),
    "init_from": S(None, MODEL, "str?", "start from another model's weights and train them as a NEW run (a fresh "
                   "optimizer and schedule; not --resume): a run directory (its last.safetensors), a weights file in "
                   "one (DIR/best.safetensors), or a timm/visionpe checkpoint (.safetensors, .pth, .pt). Every "
                   "non-positional weight is kept; positional ones are converted where that has a meaning (a learned "
                   "table, or timm's pos_embed, into a target that has learned, resampled to its grid), the rest are "
                   "dropped or start fresh; the kept / converted / new / dropped report is printed and stored in "
                   "metrics.jsonl. From a run, model, model_kwargs, img_size, patch_size, data and data_dir default "
                   "to the source run's (a recipe or flags override them), so '--init-from DIR --pe rope_mixed' "
                   "converts that run. Other sizes (embed_dim, depth, patch_size, model) are an error naming the "
                   "keys; so is another classifier head unless --init-head-reset", metavar="PATH"),
    "init_grid": S([], MODEL, "ints", "with --init-from: the patch grid H W of the source's pos_embed, which a timm "
                   "checkpoint does not store (default: the source run's grid; for a checkpoint of no run the new "
                   "model's grid when the patch counts agree, else square, and the report says what it assumed)",
                   metavar="N"),
    "init_head_reset": S(False, MODEL, "bool", "with --init-from: do not take the source's classifier head "
                         "(head.*); train a new one (needed when the number of classes differs)"),
    "pretrained": S(False, MODEL, "bool", "start from timm's pretrained weights of --model (a tag picks them, e.g. "
                    "vit_small_patch16_224.augreg_in1k): timm builds its own model of the run's sizes with them (its "
                    "pos_embed and patch embedding resampled, input channels adapted, a new classifier head when the "
                    "classes differ), then visionpe.load_timm_checkpoint converts the position weights into --pe; the "
                    "kept / converted / new / dropped report is printed and stored in metrics.jsonl. timm fetches the "
                    "weights from the Hugging Face hub unless --pretrained-path names a local file. Without "
                    "--model-kwargs / --embed-dim / --depth / --num-heads the model keeps its own sizes"),
    "pretrained_path": S(None, MODEL, "str?", "with --pretrained: a local weights file (.safetensors, .pth, .bin) "
                         "instead of a download, given to timm as pretrained_cfg_overlay=dict(file=PATH, "
                         "num_classes=-1) as timm's train.py does (so the classifier head is always new)",
                         metavar="FILE"),
    "drop_path": S(0.0, AUG, "float", "stochastic depth rate (timm drop_path_rate); in [0, 1)", metavar="P"),
    # data
    "data": S("shapes-position", DATA, "str", "", metavar="NAME"),  # help filled from the data registry
    "data_dir": S(None, DATA, "str?", "folder of a real data set (torchvision layout; imagefolder: DIR/train/<class>/ "
                  "and DIR/val/<class>/); must hold the data unless --download", metavar="DIR"),
    "download": S(False, DATA, "bool", "fetch a torchvision data set into --data-dir if it is not there"),
    "num_frames": S(None, DATA, "int?", "frames per clip: required by the video data sets (moving-shapes, "
                    "shape-endpoint, videofolder), refused by image ones; the model is then a video model "
                    "(--tubelet-size); a multiple of the tubelet's frames", metavar="T"),
    "frame_stride": S(None, DATA, "int?", "video files: sample each clip as num_frames frames STRIDE apart (a random "
                      "segment when training, the centre segment when evaluating); default: num_frames frames spread "
                      "evenly over the whole clip, as a clip shorter than the segment is read (a stride none of the "
                      "clips probed in a split holds is refused); an integer >= 1, for data sets that take it "
                      "(video-files)",
                      metavar="STRIDE"),
    "tokens_per_second": S(None, DATA, "float?", "video files: put clips on an absolute time axis of R positions per "
                           "second, each clip's frame rate read from its container (Qwen2.5-VL's tokens_per_second: a "
                           "temporal token's position is its time in seconds times R), so clips at different frame "
                           "rates or strides share one time axis (the models' time_spacing=); default: index time, one "
                           "position per temporal token; a number > 0, for data sets that take it (video-files), with "
                           "an encoding that reads coordinates (rope, alibi, sincos, ...; not a table), not with "
                           "mixup/cutmix", metavar="R"),
    "train_samples": S(None, DATA, "int?", "training images: synthetic scenes rendered (default 10000; held in memory, "
                       "so at most what this machine's memory holds), real sets a fixed random subset (default all); "
                       "an integer >= 1", metavar="N"),
    "val_samples": S(None, DATA, "int?", "validation images (synthetic default 2000, rendered in memory at each "
                     "eval_res: at most what memory holds; real default all); an integer >= 1", metavar="N"),
    "workers": S(0, DATA, "int", "DataLoader worker processes; an integer in [0, 256] (0 = load in the main process)",
                 metavar="N"),
    "max_patches": S(None, DATA, "int?", "train each image at its native aspect ratio within this many patches "
                     "(NaFlex's token budget: timm's RandomResizedCropToSequence for real images, the built-in tasks "
                     "rendered at their aspect ratio), batches of mixed grids through the model's forward_batch; the "
                     "budget of img_size under the native evaluation protocol (the default protocol then). A ViT "
                     "with a visionpe encoding (global_pool token or avg); images only; not with mixup, cutmix or "
                     "train_res; an integer in [1, 65536] (default: square images at img_size)", metavar="N"),
    **transform_settings("both"),  # interpolation
    # optimizer
    "opt": S("adamw", OPTIM, "str", "timm optimizer name (timm.optim.list_optimizers()), e.g. adamw, sgd, lamb",
             metavar="NAME"),
    "weight_decay": S(0.05, OPTIM, "float", "weight decay; a number >= 0; never applied to position parameters "
                      "(model.no_weight_decay())", metavar="WD"),
    "clip_grad": S(1.0, OPTIM, "float", "max global gradient norm; a number >= 0 (0 = off)", metavar="NORM"),
    "batch_size": S(128, OPTIM, "int", "global batch size over all processes (each of N takes batch_size / N); an "
                    "integer >= 1 whose float32 input batch takes at most half of this machine's memory",
                    metavar="N"),
    "amp": S("auto", OPTIM, "choice", "mixed precision: auto = bf16 autocast on CUDA, none on CPU; bf16; fp16 (CUDA "
             "only: float16 autocast with timm's NativeScaler gradient scaler); none", choices=AMP),
    "grad_accum_steps": S(1, OPTIM, "int", "gradient accumulation as timm's train.py: an optimizer step sums the "
                          "gradients of N loader batches of batch_size, each batch's loss divided by N, so one step "
                          "is a step on batch_size x N images; the schedule counts optimizer steps (ceil(batches / N) "
                          "an epoch, the last step taking what is left); under torchrun the gradients are "
                          "synchronised only on the last batch of each step (DDP no_sync); an integer >= 1",
                          metavar="N"),
    "layer_decay": S(None, OPTIM, "float?", "layer-wise learning-rate decay for fine-tuning (BEiT; timm "
                     "create_optimizer_v2(layer_decay=...), timm's layer groups): the head learns at lr, each group "
                     "below it decay times slower (ViT: block i of L at lr x decay^(L - i), the stem: patch "
                     "embedding, class token and a tokens position encoding, at lr x decay^(L + 1)); position "
                     "parameters keep no weight decay; in (0, 1]", metavar="DECAY"),
    "bce_loss": S(False, OPTIM, "bool", "binary cross-entropy over classes (timm BinaryCrossEntropy; DeiT-III) instead "
                  "of softmax cross-entropy, combined with mixup/cutmix and label smoothing as timm's train.py "
                  "combines them (with mixup the targets arrive smoothed; else label_smoothing smooths the one-hot targets); "
                  "also without either (timm's train.py falls back to cross-entropy there)"),
    "bce_target_thresh": S(None, OPTIM, "float?", "with --bce-loss: targets above this value become 1, the rest 0 "
                           "(timm's target_threshold; DeiT-III uses 0.0 with mixup); in [0, 1)", metavar="T"),
    "model_ema": S(False, OPTIM, "bool", "keep an exponential moving average of the weights (timm ModelEmaV3, updated "
                   "after every optimizer step), evaluated each epoch beside the model (ema_val_acc in metrics.jsonl), "
                   "saved as ema.safetensors and measured in the final resolution table"),
    "model_ema_decay": S(0.9998, OPTIM, "float", "EMA decay per optimizer step (timm's default); in [0, 1)",
                         metavar="D"),
    "model_ema_warmup": S(False, OPTIM, "bool", "timm's EMA decay warmup: decay = min(model_ema_decay, 1 - (1 + "
                          "step)^(-2/3)), so early steps follow the model closely"),
    # schedule
    "epochs": S(10, SCHED, "int", "training epochs; an integer >= 1", metavar="N"),
    "lr": S(1e-3, SCHED, "float", "peak learning rate after warmup; a number > 0", metavar="LR"),
    "min_lr": S(1e-5, SCHED, "float", "learning rate at the end of the cosine decay; a number >= 0", metavar="LR"),
    "warmup_epochs": S(1.0, SCHED, "float", "linear warmup length in epochs (fractions allowed); in [0, epochs]",
                       metavar="E"),
    "aug_repeats": S(0, SCHED, "int", "repeated augmentation (DeiT; timm RepeatAugSampler): each image appears N times "
                     "per epoch with its own augmentation, on different processes under torchrun; an epoch keeps "
                     "timm's length (about the data set's size in total, so about 1/N of the images each epoch); 0 "
                     "= off, else an integer in [2, 32]", metavar="N"),
    # augmentation and regularization
    "train_res": S([], AUG, "ints", "multi-resolution training (ResFormer / FlexiViT): each step's batch is resized "
                   "(bicubic, antialias) to one of these sizes, drawn from (seed, epoch, step), so every process "
                   "draws the same; the learning-rate schedule is unchanged; each a positive multiple of patch_size; "
                   "images only (empty = train at img_size only); at most 65536 patches per image", metavar="PX"),
    "label_smoothing": S(0.1, AUG, "float", "label smoothing; in [0, 1)", metavar="EPS"),
    "mixup": S(0.0, AUG, "float", "timm Mixup alpha; a number >= 0 (0 = off); needs an even batch_size",
               metavar="ALPHA"),
    "cutmix": S(0.0, AUG, "float", "timm CutMix alpha; a number >= 0 (0 = off); needs an even batch_size",
                metavar="ALPHA"),
    # timm's image transforms (timm.data.create_transform), by timm train.py's names; real image sets only (the
    # built-in tasks are rendered, not augmented: a flip or a crop would change their labels)
    **transform_settings("train"),
    # evaluation
    "eval_res": S([], EVAL, "ints", "test resolutions (pixels) for the last and the best model after training, each a "
                  "positive multiple of patch_size, at most 65536 patches per image; the training resolution is always included",
                  metavar="PX"),
    "eval_frames": S([], EVAL, "ints", "video: test frame counts for the last and the best model after training, "
                     "crossed with eval_res (a frames x resolution table); the built-in tasks sample the same clip "
                     "duration, so more frames = a higher frame rate; each a multiple of the tubelet's frames; "
                     "num_frames is always included. RoPE adapts time as space (pe_kwargs scaling=none "
                     "extrapolates, scaling=pi interpolates to the training grid), learned tables are resampled",
                     metavar="T"),
    "eval_batch_size": S(256, EVAL, "int", "batch size of evaluation; an integer >= 1", metavar="N"),
    **transform_settings("eval"),  # eval_protocol, crop_pct
    # run
    "seed": S(0, RUN, "int", "seed of the model, data order, synthetic scenes and augmentation; an integer >= 0",
              metavar="N"),
    "device": S("auto", RUN, "choice", "auto = CUDA if available, else CPU", choices=DEVICES),
    "threads": S(0, RUN, "int", "torch.set_num_threads; an integer in [0, 4096] (0 = torch's default; more than "
                 "the machine's CPU cores is warned about: they oversubscribe)", metavar="N"),
    "output": S(None, RUN, "str?", "run directory (default runs/YYYYMMDD-HHMMSS-<data>-<pe>-s<seed>: the start time, "
                "then what is trained, with the data folder's name after <data> when --data-dir is given)", metavar="DIR"),
    "overwrite": S(False, RUN, "bool", "delete the previous run's files in the run directory and start again"),
    "stop_after": S(0, RUN, "int", "stop after this many epochs as if interrupted (0 = never); --resume continues; "
                    "an integer >= 0", metavar="N"),
    "progress": S(True, RUN, "bool", "a progress bar per epoch (only on a terminal)"),
    "compile": S(False, RUN, "bool", "torch.compile the model for training and the per-epoch evaluation (the final "
                 "resolution table runs it eagerly: one pass per size would not repay compiling); weights are saved "
                 "from the eager module, so they load anywhere"),
    "channels_last": S(False, RUN, "bool", "channels-last memory layout for the model and its input batches "
                       "(channels_last_3d for clips; under --parallel fsdp the batches only: FSDP2 shards contiguous "
                       "parameters)"),
    "parallel": S("ddp", RUN, "choice", "data parallelism under torchrun: ddp = every process holds the whole model "
                  "(DistributedDataParallel; state.pt commits); fsdp = FSDP2 (torch >= 2.6): every process holds a "
                  "shard of each parameter, gradient and optimizer state, sharded per transformer block and at the "
                  "root, encodings' parameters float32 (on CUDA with amp bf16/auto: bf16 parameters in the blocks "
                  "instead of autocast, gradients reduced in float32); commits are distributed checkpoints "
                  "(RUN/checkpoint/, each process writing its shards) that resume on another process count at an "
                  "epoch's end; one process is a group of one. Not with amp fp16 or pe timm_unpatched", choices=PARALLEL),
    "fsdp_reshard_after_forward": S(True, RUN, "bool", "with --parallel fsdp: free each block's gathered parameters "
                                    "after its forward and gather them again for the backward (ZeRO-3); off keeps "
                                    "them until the backward (more memory, fewer all-gathers)"),
    "meta_init": S(False, RUN, "bool", "with --parallel fsdp: build the model on the meta device, shard it, then "
                   "materialise and initialise each process's shards (visionpe.reset_parameters), so no process "
                   "holds the whole model; the initial weights are drawn as timm draws them but not the same numbers "
                   "as a build on a device (off: the model of a DDP or one-process run); not with --init-from or "
                   "--pretrained"),
    "grad_checkpointing": S(False, RUN, "bool", "activation checkpointing per transformer block (the model's "
                            "set_grad_checkpointing): each block's activations are recomputed in the backward, "
                            "less memory for a second forward; the same gradients"),
    "checkpoint_every_steps": S(0, RUN, "int", "also commit state.pt every N optimizer steps within an epoch, so a "
                                "long epoch can be resumed from where it was killed (exactly: the sampler position, "
                                "RNG streams, schedule, EMA; the exports stay those of the last finished epoch); 0 = "
                                "only at the end of each epoch; an integer >= 0", metavar="N"),
    "checkpoint_every_minutes": S(0.0, RUN, "float", "also commit state.pt within an epoch when this many minutes "
                                  "have passed since the last commit (decided on rank 0, the same step on every "
                                  "process); 0 = off; a number >= 0", metavar="MIN"),
    "log": S([], RUN, "choices", "loggers besides the console, metrics.jsonl and summary.csv, of "
             f"{', '.join(LOGGERS)}: TensorBoard event files in RUN/tensorboard/ (pip install 'visionpe[tensorboard]'), "
             "a Weights & Biases run (pip install 'visionpe[wandb]'; WANDB_PROJECT, WANDB_MODE=offline); every epoch "
             "once, also across --resume", choices=LOGGERS, metavar="NAME"),
    "imports": S([], RUN, "strs", "", metavar="MODULE_OR_FILE"),  # --import: cli.add_import
}


DEFAULTS = {key: s.default for key, s in SETTINGS.items()}
KIND_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "choice": str, "ints": list[int],
              "floats": list[float], "strs": list[str], "choices": list[str], "mapping": dict}  # a kind -> its type
# fields beside the settings: derived from the data and the model (RUN_KEYS, in config.yaml), or what resolve found
# out about the settings (REPORTED, in the run's header only)
DERIVED = {"num_classes": int | None, "in_chans": int | None, "classes": list[str] | None, "sizes_from": str | None}


class SettingsRecord(Mapping):
    """What :class:`TrainSettings` adds to its fields: a read-only mapping view (``dict(settings)``, YAML, code that
    reads settings by name), :meth:`replace` and :meth:`as_dict`."""

    def __getitem__(self, key: str):
        if key not in FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(FIELDS)

    def __len__(self) -> int:
        return len(FIELDS)

    def replace(self, **changes) -> "TrainSettings":
        """A copy with ``changes`` (setting=value) applied, unchecked: the caller checks what it changes."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Every field by name, values copied (:func:`copied`)."""
        return {key: copied(getattr(self, key)) for key in FIELDS}


def _field(key: str, s: Setting):
    kind = s.kind.rstrip("?")
    typ = KIND_TYPES[kind] | None if s.kind.endswith("?") else KIND_TYPES[kind]
    if isinstance(s.default, (list, dict)):  # a fresh copy for each record
        return key, typ, dataclasses.field(default_factory=lambda d=s.default: copied(d), metadata={"setting": s})
    return key, typ, dataclasses.field(default=s.default, metadata={"setting": s})


TrainSettings = dataclasses.make_dataclass(
    "TrainSettings", [_field(k, s) for k, s in SETTINGS.items()] + [(k, t, None) for k, t in DERIVED.items()],
    bases=(SettingsRecord,), frozen=True, kw_only=True)
TrainSettings.__module__ = __name__
TrainSettings.__doc__ = """The settings of one training run, typed and frozen: a field per :data:`SETTINGS` entry
(its name, its kind's type from :data:`KIND_TYPES`, its default; ``dataclasses.fields(TrainSettings)[i].metadata
["setting"]`` is the entry, with its help and choices), then the :data:`DERIVED` fields. Built once from the command
line and the YAML recipe by :func:`resolve`, read from a run folder by :func:`visionpe.train.restore.load_run`;
checked by :func:`check`. Code reads ``settings.lr``; a change is :meth:`~SettingsRecord.replace`."""
FIELDS = tuple(f.name for f in dataclasses.fields(TrainSettings))
# settings that only timm's transforms of real images read (a built-in task is rendered, not augmented)
TRANSFORM_KEYS = tuple(f.name for f in vdata.transforms.setting_fields() if f.metadata["stage"] != "eval")


SIZE_HELP = {"embed_dim": "token width (sets model_kwargs.embed_dim); an integer >= 1",
             "depth": "number of transformer blocks (sets model_kwargs.depth); an integer >= 1",
             "num_heads": "attention heads (sets model_kwargs.num_heads); an integer >= 1"}


def _kv(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not plain YAML ({one_line(err)})") from None


def _default_text(key: str) -> str:
    default = DEFAULTS[key]
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, dict):
        return " ".join(f"{k}={v}" for k, v in default.items()) or "none"
    if isinstance(default, list):
        return " ".join(map(str, default)) or "none"
    return str(default)


def build_parser(prog: str = "visionpe train", description: str = "", epilog: str = "") -> Parser:
    """The training command line, flags grouped as timm's train.py groups them."""
    usage = f"{prog} [--config RECIPE] [--model NAME] [--pe NAME] [--data NAME] [--epochs N] [SETTING ...]"
    if prog == "visionpe train":
        usage += f"\n       {prog} --resume DIR [--epochs N] [SETTING ...]"
    p = Parser(prog=prog, usage=usage, description=description, epilog=epilog, argument_default=argparse.SUPPRESS)
    groups = {g: p.add_argument_group(f"{g} settings") for g in GROUPS}
    groups[RUN].add_argument("--config", metavar="YAML|NAME", help="YAML recipe: a mapping of settings (keys as "
                             "below, with underscores), a file or the name of a recipe shipped with visionpe (e.g. "
                             "shapes_tiny, deit3_small_rope_imagenet: visionpe/configs/); the command line overrides "
                             "it")
    groups[RUN].add_argument("--resume", nargs="?", const=True, metavar="DIR",
                             help="continue the run in DIR (default: --output) exactly where it stopped; only "
                                  f"{', '.join(SAFE_ON_RESUME)} may change; --epochs N extends a run (finished or "
                                  "not) to N epochs, its schedule continued to the new length as timm's --resume")
    for key, s in SETTINGS.items():
        if key == "imports":
            add_import(p, groups[RUN])
            continue
        flag = "--" + key.replace("_", "-")
        text = (s.help or {"pe": _pe_help, "data": _data_help, "model": model_help}[key]()) + \
            ("" if s.default is None else f" (default: {_default_text(key)})")
        g = groups[s.group]
        if s.kind == "mapping":
            g.add_argument(flag, nargs="*", type=_kv, metavar=s.metavar, help=text)
        elif s.kind == "bool" and key.startswith("no_"):  # --no-aug and its opposite --aug (not --no-no-aug)
            either = g.add_mutually_exclusive_group()
            either.add_argument(flag, dest=key, action="store_true", help=text)
            either.add_argument("--" + key[3:].replace("_", "-"), dest=key, action="store_false",
                                help=f"the opposite of {flag} (e.g. over a recipe's {key}: true)")
        elif s.kind == "bool":
            g.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        elif s.kind == "ints":
            g.add_argument(flag, nargs="*", type=int, metavar=s.metavar, help=text)
        elif s.kind in ("choice", "choice?"):
            g.add_argument(flag, choices=s.choices, help=text)
        elif s.kind == "choices":
            g.add_argument(flag, nargs="*", choices=s.choices, metavar=s.metavar, help=text)
        elif s.kind == "floats":
            g.add_argument(flag, nargs="*", type=float, metavar=s.metavar, help=text)
        else:
            kind = {"int": int, "int?": int, "float": float, "float?": float}.get(s.kind, str)
            g.add_argument(flag, type=kind, metavar=s.metavar, help=text)
        if key == "model_kwargs":
            for size in SIZE_KEYS:
                g.add_argument("--" + size.replace("_", "-"), type=int, metavar="N", help=SIZE_HELP[size])
    p.add_debug(groups[RUN])
    return p


def parse_args(argv, prog: str = "visionpe train", description: str = "", epilog: str = "") -> dict:
    """The settings given on the command line (only those), plus ``config``/``resume``/``debug`` if given. Its
    ``--import`` code is imported first, so ``--help`` lists the user's encodings, data sets and backbones."""
    first = Parser(add_help=False)
    add_import(first)
    import_user_code(first.parse_known_args(argv)[0].imports)
    args = vars(build_parser(prog, description, epilog).parse_args(argv))
    for key in ("pe_kwargs", "model_kwargs"):
        if key in args:
            args[key] = dict(args[key])
    return args


def read_yaml(path, what: str = "config file") -> dict:
    """A YAML mapping from ``path`` (``yaml.safe_load``: Python tags are refused), or a :class:`UserError`."""
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
    except FileNotFoundError:
        raise UserError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{what} {str(path)!r} is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {str(path)!r} is not a text file") from None
    except yaml.YAMLError as err:
        raise UserError(f"{what} {str(path)!r} is not plain YAML (only plain mappings, no tags): "
                        f"{one_line(err)}") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise UserError(f"{what} {str(path)!r} must hold a mapping of settings, got {type(cfg).__name__}")
    return cfg


def read_recipe(spec) -> dict:
    """The settings of a recipe (``--config``): a YAML file, or the name of one shipped with visionpe
    (:func:`visionpe.cli.recipes.recipe_path`)."""
    return read_yaml(recipe_path(spec))


def resolve(args: dict, base: TrainSettings | None = None, origin: str = "the run's config.yaml") -> TrainSettings:
    """The run's settings, built once: defaults (or ``base``, a resumed run's) < ``args['config']`` YAML < the other
    ``args``; checked (:func:`check`). ``model_kwargs`` add to those below them; a model preset (``--model tiny``,
    the default) becomes its timm model and sizes. ``sizes_from`` (reported, not saved) says where the model's sizes
    came from: the preset, timm's model, ``origin`` for a ``base``, then the recipe's and the command line's keywords.

    Fills the derived ``num_classes`` and ``in_chans`` (kept from ``base`` when the data set is unchanged; an
    ImageFolder's class count is ``None`` until its data is loaded) and the default ``output``
    (:func:`default_output`)."""
    values = copied(DEFAULTS) if base is None else {k: v for k, v in base.as_dict().items() if k not in REPORTED}
    recipe = {}
    if args.get("config"):
        recipe = read_recipe(args["config"])
        misplaced = sorted(set(recipe) & set(RUN_KEYS))
        if misplaced:
            raise UserError(f"config file {args['config']!r}: {', '.join(misplaced)} are derived from the data and "
                            "the model, not settings; remove them")
    given = [f"{what} {sizes_text(kw)}" for what, kw in ((f"recipe {args.get('config')}", recipe.get("model_kwargs")),
                                                       ("--model-kwargs", args.get("model_kwargs"))) if kw]
    given += [f"--{k.replace('_', '-')} {args[k]}" for k in SIZE_KEYS if k in args]  # what added to the sizes
    values.update(copied(kwargs_added(values, recipe)))
    values.update({k: copied(v) for k, v in kwargs_added(values, args).items() if k in DEFAULTS and k != "imports"})
    imports = [*(values.get("imports") or []), *(args.get("imports") or [])]
    if not isinstance(imports, list) or not all(isinstance(v, str) for v in imports):
        raise UserError(f"imports must be a list of module names or .py files, got {values.get('imports')!r}")
    values["imports"] = list(dict.fromkeys(import_user_code(imports)))  # before any name is checked
    for key in ("model_kwargs", "pe_kwargs"):
        if values.get(key) is None:
            values[key] = {}
    for key in SIZE_KEYS:
        if key in args and isinstance(values["model_kwargs"], dict):
            values["model_kwargs"][key] = args[key]
    if base is None or values["model"] in PRESETS:
        origin = expand_preset(values, given="model" in args or "model" in recipe)
    unknown = sorted(set(values) - set(DEFAULTS) - set(RUN_KEYS))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    settings = check(values)
    derived = {"eval_protocol": eval_protocol(settings), "sizes_from": " + ".join([origin, *given])}
    if base is None or settings.data != base.data or base.num_classes is None:
        info = vdata.info(settings.data)  # classes: a folder's names, read again with its data
        derived.update(num_classes=info["num_classes"], in_chans=info["in_chans"], classes=None)
    settings = settings.replace(**derived)
    return settings if settings.output is not None else settings.replace(output=default_output(settings))


def default_output(settings: TrainSettings, now: datetime.datetime | None = None) -> str:
    """The run folder of a run given no ``--output``, as timm's train.py names its folders (the start time, then
    what is trained): ``runs/YYYYMMDD-HHMMSS-<data>[-<data_dir's name>]-<pe>-s<seed>``, with ``-1``, ``-2``, ... added
    when that folder exists already (two runs started in the same second). So a new run never lands in an older
    run's folder by default, and the name still says what was trained. ``now``: the start time (default: now)."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    folder = [re.sub(r"[^\w.-]+", "_", Path(settings.data_dir).resolve().name)] if settings.data_dir else []
    name = "-".join(["runs/" + stamp, settings.data, *folder, settings.pe.replace("+", "-"), f"s{settings.seed}"])
    candidates = itertools.chain([name], (f"{name}-{i}" for i in itertools.count(1)))
    return next(n for n in candidates if not Path(n).exists())


def kwargs_added(values: dict, layer: dict) -> dict:
    """A layer of settings (a recipe, the command line) with its ``model_kwargs`` added to those of ``values``, the
    layers below it (its other settings replace theirs)."""
    if isinstance(layer.get("model_kwargs"), dict) and isinstance(values.get("model_kwargs"), dict):
        return {**layer, "model_kwargs": {**values["model_kwargs"], **layer["model_kwargs"]}}
    return layer


def expand_preset(values: dict, given: bool) -> str:
    """A model preset (:data:`~visionpe.train.models.PRESETS`, e.g. the default ``tiny``) in ``values`` replaced by its
    timm model and sizes (the sizes given add to them); returns where the model's sizes come from, in words:
    ``"the tiny default (vit_tiny_patch16_224 at ...)"``, ``"--model tiny (...)"``, ``"timm's vit_small_patch16_224"``.
    """
    name = values["model"]
    if name not in PRESETS:
        return f"{name}'s own" if named_constructor(name) else f"timm's {name}"
    model, kwargs = PRESETS[name]
    if values.get("pretrained") is True:
        if given:
            raise UserError(f"--pretrained loads timm's weights of a timm model at timm's sizes; --model {name} is "
                            f"visionpe's {preset_text(name)}, which has none: give --model NAME (e.g. {model})")
        values["model"] = model  # the default's architecture at the sizes of timm's weights
        return f"timm's {model} (the default {name}'s architecture, at the sizes of its pretrained weights)"
    if isinstance(values["model_kwargs"], dict):
        values["model"], values["model_kwargs"] = model, {**kwargs, **values["model_kwargs"]}
    return ("--model " if given else "the default ") + preset_text(name)


def copied(value):
    """A copy of a settings value: nested dicts and lists copied, everything else shared (immutable)."""
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copied(v) for v in value]
    return value


MAX_PATCHES = 65536  # patches per image (a 256 x 256 grid; 1024 px at patch 4, 4096 px at patch 16): attention
# over more tokens does not fit memory (the (heads, T, T) bias and score tables of one image alone exceed 17 GB)
BATCH_MEMORY_SHARE = 0.5  # one float32 input batch may take at most this share of the machine's memory
MAX_AUG_REPEATS = 32  # repeated augmentation: an epoch keeps its length, so it sees about 1/N of the images
MAX_THREADS = 4096  # torch.set_num_threads: more than any machine's cores (beyond the cores a run is warned)
MAX_WORKERS = 256  # DataLoader worker processes: each is a process holding a copy of the data set's state


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int:
    """The physical memory of this machine in bytes (0 when the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**40:.3g} TiB" if num_bytes >= 2**40 else f"{num_bytes / 2**30:.3g} GiB"


def check_patches(what: str, size, patch_size: int, frames: int = 1) -> None:
    """An image (or clip) of ``size`` (pixels: an int or ``(height, width)``) has at most :data:`MAX_PATCHES`
    patches of ``patch_size`` (times ``frames`` tubelets in time); a :class:`UserError` naming ``what`` and the
    limit otherwise."""
    height, width = (size, size) if isinstance(size, int) else size
    count = (height // patch_size) * (width // patch_size) * max(1, frames)
    need(count <= MAX_PATCHES, f"{what} {size if isinstance(size, int) else f'{height}x{width}'} with patch_size "
         f"{patch_size} gives {count} patches per {'clip' if frames > 1 else 'image'}; at most {MAX_PATCHES} (a "
         f"256x256 grid, e.g. {256 * patch_size} px) fit attention in memory")


def check_memory(settings: TrainSettings, memory: int | None = None) -> None:
    """Sizes that fit this machine's memory (``memory`` bytes, default :func:`machine_memory`), checked before
    anything is allocated: one float32 input batch (training and evaluation) within :data:`BATCH_MEMORY_SHARE` of
    it, and a built-in task's rendered scenes (uint8, held in memory: the training set at img_size, the validation
    set at img_size and each eval_res) within it. A :class:`UserError` giving the size and the limit otherwise."""
    memory = machine_memory() if memory is None else memory
    if memory <= 0:
        return
    spec = vdata.get_spec(settings.data)
    chans = settings.in_chans or spec.in_chans
    frames = settings.num_frames or 1
    area = lambda size: size * size if isinstance(size, int) else size[0] * size[1]
    train_area = max(area(s) for s in [settings.img_size, *settings.train_res])
    eval_area = max(area(s) for s in [settings.img_size, *settings.eval_res])
    for key, batch, pixels in (("batch_size", settings.batch_size, train_area),
                               ("eval_batch_size", settings.eval_batch_size, eval_area)):
        need(batch * chans * pixels * frames * 4 <= memory * BATCH_MEMORY_SHARE,
             f"{key} {batch} at {math.isqrt(pixels)} px is {gib(batch * chans * pixels * frames * 4)} of float32 input "
             f"alone; at most {gib(memory * BATCH_MEMORY_SHARE)} (half of this machine's {gib(memory)}): give a smaller "
             f"{key} or size")
    defaults = vdata.scenes.DEFAULT_SIZES
    for key, split, sizes in (("train_samples", "train", [settings.img_size]),
                              ("val_samples", "val", {settings.img_size, *settings.eval_res})):
        check_rendered(key, getattr(settings, key) if getattr(settings, key) is not None else defaults[split], settings, split, sizes, memory)


def check_rendered(what: str, count: int, settings: TrainSettings, split: str, sizes,
                   memory: int | None = None) -> None:
    """A built-in task's ``count`` scenes of ``split`` rendered at each of ``sizes`` (uint8, held in memory) fit this
    machine's memory (``memory`` bytes, default :func:`machine_memory`); a :class:`UserError` naming ``what``, the
    size and how many fit otherwise. Real sets are read at their own size, a sample at a time: nothing to check."""
    memory = machine_memory() if memory is None else memory
    spec = vdata.get_spec(settings.data)
    if memory <= 0 or not spec.synthetic:
        return
    area = lambda size: size * size if isinstance(size, int) else size[0] * size[1]
    per_sample = (settings.in_chans or spec.in_chans) * (settings.num_frames or 1) * sum(map(area, set(sizes)))
    most = memory // per_sample
    need(count <= most, f"{what} {count}: the rendered {split} scenes of {settings.data} would take "
         f"{gib(count * per_sample)} in memory, more than this machine's {gib(memory)}; at most {most} fit")


def need(ok, message: str) -> None:
    """A :class:`UserError` with ``message`` unless ``ok``."""
    if not ok:
        raise UserError(message)


def check(values: Mapping, training: bool = True) -> TrainSettings:
    """The :class:`TrainSettings` of ``values`` (every setting by name, and any :data:`DERIVED` field), checked: the
    kind of each value, then each group's ranges and names (model, data and video, optimizer, schedule,
    augmentation, evaluation, run). ``training=False`` skips what only matters to training on this machine (the
    CUDA device). Floats given as strings (YAML reads ``1e-3`` as a string) become floats."""
    values = dict(values)
    check_kinds(values)
    settings = TrainSettings(**values)
    check_model_settings(settings)
    check_data(settings)
    check_video(settings)
    check_optimizer(settings)
    check_schedule(settings)
    check_augmentation(settings)
    check_evaluation(settings)
    check_run(settings, training)
    check_sizes(settings, training)
    return settings


def check_kinds(values: dict) -> None:
    """Each value is of its setting's kind (integer, number, true/false, name, choice, mapping, list)."""
    for key, s in SETTINGS.items():
        value = values[key]
        if s.kind in ("int", "int?"):
            if value is None and s.kind == "int?":
                continue
            need(isinstance(value, int) and not isinstance(value, bool), f"{key} must be an integer, got {value!r}")
        elif s.kind in ("float", "float?"):
            if value is None and s.kind == "float?":
                continue
            if isinstance(value, str):
                try:
                    value = values[key] = float(value)
                except ValueError:
                    pass
            need(isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value),
                 f"{key} must be a number, got {value!r}")
        elif s.kind == "bool":
            need(isinstance(value, bool), f"{key} must be true or false, got {value!r}")
        elif s.kind in ("str", "str?"):
            if value is None and s.kind == "str?":
                continue
            need(isinstance(value, str) and value != "", f"{key} must be a non-empty string, got {value!r}")
        elif s.kind in ("choice", "choice?"):
            if value is None and s.kind == "choice?":
                continue
            need(value in s.choices, f"{key} must be one of {', '.join(s.choices)}, got {value!r}")
        elif s.kind == "mapping":
            need(isinstance(value, dict) and all(isinstance(k, str) for k in value),
                 f"{key} must be a mapping of KEY=VALUE, got {value!r}")
        elif s.kind == "ints":
            need(isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
                 f"{key} must be a list of integers, got {value!r}")
        elif s.kind == "floats":
            need(isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value), f"{key} must be a list of numbers, got {value!r}")
        elif s.kind == "strs":
            need(isinstance(value, list) and all(isinstance(v, str) and v for v in value),
                 f"{key} must be a list of names, got {value!r}")
        elif s.kind == "choices":
            need(isinstance(value, list) and all(isinstance(v, str) and v in s.choices for v in value),
                 f"{key} must be a list of {', '.join(s.choices)}, got {value!r}")


def check_model_settings(settings: TrainSettings) -> None:
    """The model name (a known backbone that fits the run), its sizes, the encoding, the patch and image sizes."""
    from ..backbones import parse_pe
    need(settings.pe not in RENAMED_PE, f"--pe {settings.pe} is now --pe {RENAMED_PE.get(settings.pe)} (timm's model as "
         "timm builds it, with its own encoding)")
    check_model(settings)
    for key in ("patch_size",):
        need(getattr(settings, key) >= 1, f"{key} must be an integer >= 1, got {getattr(settings, key)}")
    need(settings.img_size >= settings.patch_size and settings.img_size % settings.patch_size == 0,
         f"img_size {settings.img_size} must be a positive multiple of patch_size {settings.patch_size}")
    for key in SIZE_KEYS if is_vit(settings.model) else ("embed_dim",):  # other models' depth and heads are per stage
        value = settings.model_kwargs.get(key)
        need(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
             f"{key} (model_kwargs.{key}) must be an integer >= 1, got {value!r}")
    ratio = settings.model_kwargs.get("mlp_ratio")
    need(ratio is None or (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio)
                           and ratio > 0),
         f"mlp_ratio (--model-kwargs mlp_ratio=) must be a number > 0 (the MLP's hidden width / embed_dim), got "
         f"{ratio!r}")
    dim, heads = settings.model_kwargs.get("embed_dim"), settings.model_kwargs.get("num_heads")
    need(not isinstance(heads, int) or dim is None or heads is None or dim % heads == 0,
         f"embed_dim {dim} must be divisible by num_heads {heads}")
    if settings.pe == TIMM_UNPATCHED:
        need(not settings.pe_kwargs, f"pe={TIMM_UNPATCHED} keeps timm's own encoding: give its keywords in "
             f"--model-kwargs (e.g. ref_feat_shape=8, rope_type=dinov3), not --pe-kwargs {' '.join(settings.pe_kwargs)}")
    else:
        try:
            parse_pe(settings.pe)
        except ValueError as err:
            raise UserError(f"pe: {one_line(err)} (or 'none', or '{TIMM_UNPATCHED}')") from None
    need(not settings.init_head_reset or settings.init_from, "--init-head-reset needs --init-from PATH (it resets the "
         "classifier head of the weights taken from PATH)")
    need(not settings.init_grid or settings.init_from, "--init-grid needs --init-from PATH (it is the patch grid of the "
         "pos_embed in PATH)")
    need(not settings.init_grid or (len(settings.init_grid) == 2 and all(v >= 1 for v in settings.init_grid)),
         f"init_grid must be 2 integers >= 1 (height width, in patches), got {' '.join(map(str, settings.init_grid))}")
    need(not settings.pretrained_path or settings.pretrained, "--pretrained-path FILE needs --pretrained (it names where "
         "timm's pretrained weights come from)")
    need(not (settings.pretrained and settings.init_from), "--pretrained and --init-from both give the starting weights; "
         "give one of them")
    need(not settings.pretrained or named_constructor(settings.model) is None, f"--pretrained takes timm's weights of a "
         f"timm model; --model {settings.model} is not one (use --init-from PATH for a checkpoint of it)")


def check_data(settings: TrainSettings) -> None:
    """A registered data set, sample counts, loader workers, the native-aspect token budget."""
    need(settings.data in vdata.DATASETS, f"unknown data set --data {settings.data!r}; choose from: "
         f"{', '.join(vdata.DATASETS)} (or register one with --import)")
    for key in ("train_samples", "val_samples"):
        need(getattr(settings, key) is None or getattr(settings, key) >= 1,
             f"{key} must be an integer >= 1, got {getattr(settings, key)}")
    spec = vdata.get_spec(settings.data)
    for key, given in (("data_dir", settings.data_dir is not None), ("download", bool(settings.download))):
        need(not given or vdata.takes_option(spec, key), f"--{key.replace('_', '-')} is for data read from files; "
             f"--data {settings.data} is rendered and reads none: leave it out")
    need(0 <= settings.workers <= MAX_WORKERS, f"workers must be an integer in [0, {MAX_WORKERS}] (each is a process), "
         f"got {settings.workers}")
    if settings.max_patches is not None:
        need(1 <= settings.max_patches <= MAX_PATCHES, f"max_patches must be an integer in [1, {MAX_PATCHES}] (the "
             f"patches of one image; more do not fit attention in memory), got {settings.max_patches}")
        reason = mixed_sizes_refused(settings)
        need(reason is None, f"--max-patches trains batches of mixed sizes: {reason}")


def mixed_sizes_refused(settings: TrainSettings) -> str | None:
    """Why the run's model cannot take batches of images of different sizes (``forward_batch``), or None."""
    if settings.num_frames is not None or vdata.get_spec(settings.data).video:
        return "it is for images, not video runs"
    if settings.pe == TIMM_UNPATCHED or not is_vit(settings.model):
        return (f"it needs a ViT (vit_*, deit_*) with a visionpe encoding (forward_batch), not --model {settings.model} "
                f"with pe={settings.pe}")
    kwargs = settings.model_kwargs if isinstance(settings.model_kwargs, dict) else {}
    if kwargs.get("global_pool", "token") not in ("token", "avg"):
        return f"pooling is over each image's own tokens: model_kwargs.global_pool token or avg, not " \
               f"{kwargs['global_pool']!r}"
    if kwargs.get("patch_drop_rate"):
        return "patch dropout is not supported with mixed sizes (model_kwargs.patch_drop_rate must be 0)"
    return None


def eval_protocol(settings: TrainSettings) -> str:
    """The run's evaluation protocol: ``eval_protocol``, or by default ``native`` with ``max_patches``, else
    ``resize`` (:func:`visionpe.data.transforms.default_protocol`)."""
    if settings.eval_protocol is not None:
        return settings.eval_protocol
    return vdata.transforms.default_protocol(settings.max_patches)


def transforms_of(settings: TrainSettings, protocol: str | None = None) -> vdata.Transforms:
    """The run's image transforms and protocol (``protocol`` overrides the run's), as
    :class:`visionpe.data.Transforms`; a bad value is a :class:`UserError` naming the setting."""
    try:
        return vdata.Transforms.from_settings({**settings, "eval_protocol": protocol or eval_protocol(settings)})
    except (ValueError, TypeError) as err:
        raise UserError(one_line(err)) from None


def check_video(settings: TrainSettings) -> None:
    """Video settings: num_frames exactly for video data, tubelet and frame counts that fit each other."""
    spec = vdata.get_spec(settings.data)
    video, frames = spec.video, settings.num_frames
    if frames is None:
        need(not video, f"--data {settings.data} is a video data set: give --num-frames T (frames per clip)")
        need(not settings.tubelet_size, "--tubelet-size is for video runs (video data and --num-frames)")
        need(not settings.eval_frames, "--eval-frames is for video runs (video data and --num-frames)")
        need(settings.frame_stride is None, "--frame-stride is for video runs (video files and --num-frames)")
        need(settings.tokens_per_second is None, "--tokens-per-second is for video runs (video files and --num-frames)")
        return
    if settings.tokens_per_second is not None:
        need(vdata.takes_option(spec, "tokens_per_second"), f"--data {settings.data} does not take --tokens-per-second "
             "(its clips state no frame rate; video-files reads it from each container)")
        need(settings.tokens_per_second > 0, f"tokens_per_second must be a number > 0, got {settings.tokens_per_second}")
        for key in ("mixup", "cutmix"):
            need(not getattr(settings, key), f"--{key} blends two clips, whose frame rates may differ, so the blend has no one time "
                 "step: it does not apply with --tokens-per-second")
    if settings.frame_stride is not None:
        need(vdata.takes_option(spec, "frame_stride"), f"--data {settings.data} does not take --frame-stride (video-files "
             "does)")
        need(settings.frame_stride >= 1, f"frame_stride must be an integer >= 1, got {settings.frame_stride}")
    need(video, f"--num-frames is for video data ({', '.join(vdata.names('video'))}); --data {settings.data} is an "
         "image data set")
    need(frames >= 1, f"num_frames must be an integer >= 1, got {frames}")
    need(not settings.train_res, "train_res is for image data; video runs train at img_size and num_frames (evaluate "
         "other sizes with --eval-res / --eval-frames)")
    tub = settings.tubelet_size
    if tub:
        need(len(tub) == 3 and all(v >= 1 for v in tub),
             f"tubelet_size must be 3 integers >= 1 (frames height width), got {' '.join(map(str, tub))}")
        need(tub[1] == tub[2] == settings.patch_size, f"tubelet_size {' '.join(map(str, tub))}: its frame patch "
             f"must be patch_size {settings.patch_size} (set --patch-size {tub[1]} for {tub[1]} px patches)")
    t = tubelet(settings)[0]
    need(frames % t == 0, f"num_frames {frames} must be a multiple of the tubelet's {t} frames "
         f"(tubelet_size {' '.join(map(str, tubelet(settings)))})")
    for f in settings.eval_frames:
        need(f >= 1 and f % t == 0, f"eval_frames {f} must be a positive multiple of the tubelet's {t} frames")


def check_optimizer(settings: TrainSettings) -> None:
    """A timm optimizer, batch size, decay, clipping."""
    from timm.optim import list_optimizers
    need(settings.opt.lower() in list_optimizers(),
         f"unknown optimizer opt={settings.opt!r}; e.g. adamw, adam, sgd, lamb, lion (timm.optim.list_optimizers())")
    need(settings.batch_size >= 1, f"batch_size must be an integer >= 1, got {settings.batch_size}")
    for key in ("weight_decay", "clip_grad"):
        need(getattr(settings, key) >= 0, f"{key} must be a number >= 0, got {getattr(settings, key)}")
    need(settings.weight_decay == 0 or settings.weight_decay * settings.lr < 1, f"weight_decay {settings.weight_decay} with lr {settings.lr}: each step "
         "shrinks the weights by lr x weight_decay, which must be < 1 (at 1 or more it zeroes or flips them)")
    need(settings.grad_accum_steps >= 1, f"grad_accum_steps must be an integer >= 1, got {settings.grad_accum_steps}")
    decay = settings.layer_decay
    need(decay is None or 0 < decay <= 1, f"layer_decay must be in (0, 1], got {decay}")
    thresh = settings.bce_target_thresh
    need(thresh is None or settings.bce_loss, "--bce-target-thresh needs --bce-loss (it binarizes the BCE targets)")
    need(thresh is None or 0 <= thresh < 1, f"bce_target_thresh must be in [0, 1), got {thresh}")
    need(0 <= settings.model_ema_decay < 1, f"model_ema_decay must be in [0, 1), got {settings.model_ema_decay}")
    need(not settings.model_ema_warmup or settings.model_ema, "--model-ema-warmup needs --model-ema (it warms up the "
         "EMA's decay)")


def check_schedule(settings: TrainSettings) -> None:
    """Epochs, peak and final learning rates (the cosine decays: min_lr <= lr), warmup."""
    need(settings.epochs >= 1, f"epochs must be an integer >= 1, got {settings.epochs}")
    need(settings.lr > 0, f"lr must be a number > 0, got {settings.lr}")
    need(settings.min_lr >= 0, f"min_lr must be a number >= 0, got {settings.min_lr}")
    need(settings.min_lr <= settings.lr, f"min_lr {settings.min_lr} must not exceed lr {settings.lr} (the cosine schedule "
         "decays from lr to min_lr)")
    need(0 <= settings.warmup_epochs <= settings.epochs,
         f"warmup_epochs must be in [0, epochs={settings.epochs}], got {settings.warmup_epochs}")
    need(settings.aug_repeats == 0 or 2 <= settings.aug_repeats <= MAX_AUG_REPEATS,
         f"aug_repeats must be 0 (off) or an integer in [2, {MAX_AUG_REPEATS}] (an epoch keeps its length, so it "
         f"sees about 1/aug_repeats of the images; DeiT uses 3), got {settings.aug_repeats}")


def check_augmentation(settings: TrainSettings) -> None:
    """Regularization rates, mixup/cutmix, multi-resolution training sizes."""
    need(0 <= settings.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {settings.label_smoothing}")
    need(0 <= settings.drop_path < 1, f"drop_path must be in [0, 1), got {settings.drop_path}")
    for key in ("mixup", "cutmix"):
        need(0 <= getattr(settings, key) < math.inf, f"{key} must be a finite number >= 0 (the alpha of timm's Beta(alpha, alpha) "
             f"mixing ratio), got {getattr(settings, key)}")
    if settings.mixup > 0 or settings.cutmix > 0:
        need(settings.batch_size % 2 == 0, f"mixup/cutmix need an even batch_size, got {settings.batch_size}")
    for res in settings.train_res:
        need(res >= settings.patch_size and res % settings.patch_size == 0,
             f"train_res {res} must be a positive multiple of patch_size {settings.patch_size}")
    if settings.max_patches is not None:
        for key in ("mixup", "cutmix"):
            need(not getattr(settings, key), f"--{key} mixes images of one size; it does not apply with --max-patches (mixed "
                 "sizes)")
        need(not settings.train_res, "--train-res resizes each batch to one square size; --max-patches keeps each "
             "image's own aspect ratio: give one of them")
        need(not settings.compile, "--compile compiles the model's forward; --max-patches trains through its "
             "forward_batch (lists of mixed sizes), which it would not compile: give one of them")
    transforms_of(settings)  # timm's transform settings: ranges, names, the auto-augment policy


def check_evaluation(settings: TrainSettings) -> None:
    """Test resolutions, the evaluation batch, the protocol and its crop fraction."""
    need(settings.eval_batch_size >= 1, f"eval_batch_size must be an integer >= 1, got {settings.eval_batch_size}")
    protocol = eval_protocol(settings)
    if protocol != "resize":
        need(not settings.num_frames, f"eval_protocol {protocol} is for images; video runs evaluate with resize")
    if protocol == "native":
        reason = mixed_sizes_refused(settings)
        need(reason is None, f"eval_protocol native shows each image at its own size: {reason}")
    for res in settings.eval_res:
        need(res >= settings.patch_size and res % settings.patch_size == 0,
             f"eval_res {res} must be a positive multiple of patch_size {settings.patch_size}")


def check_sizes(settings: TrainSettings, training: bool = True) -> None:
    """Every image and clip size within :data:`MAX_PATCHES` patches; when training here, the batches and a built-in
    task's rendered scenes within this machine's memory (:func:`check_memory`)."""
    frames = max([settings.num_frames or 1, *settings.eval_frames])
    t = tubelet(settings)[0] if settings.num_frames else 1
    check_patches("img_size", settings.img_size, settings.patch_size, (settings.num_frames or 1) // t)
    for f in settings.eval_frames:  # each is evaluated at img_size too
        check_patches(f"eval_frames {f} at img_size", settings.img_size, settings.patch_size, f // t)
    for key in ("train_res", "eval_res"):
        for size in getattr(settings, key):
            check_patches(key, size, settings.patch_size, frames // t)
    if training:
        check_memory(settings)


def check_run(settings: TrainSettings, training: bool) -> None:
    """Seed, threads, early stop, checkpoint intervals; the device (and what needs CUDA) when training here."""
    for key in ("threads", "stop_after", "seed", "checkpoint_every_steps"):
        need(getattr(settings, key) >= 0, f"{key} must be an integer >= 0, got {getattr(settings, key)}")
    need(settings.threads <= MAX_THREADS, f"threads must be an integer in [0, {MAX_THREADS}] (0 = torch's default; "
         f"this machine has {cpu_cores()} CPU cores), got {settings.threads}")
    need(settings.checkpoint_every_minutes >= 0,
         f"checkpoint_every_minutes must be a number >= 0, got {settings.checkpoint_every_minutes}")
    if training:
        import torch
        need(settings.device != "cuda" or torch.cuda.is_available(),
             "device=cuda but no CUDA device is available (use --device cpu or auto)")
        need(settings.amp != "fp16" or (settings.device != "cpu" and torch.cuda.is_available()),
             "amp=fp16 needs a CUDA device (float16 autocast with a gradient scaler); on the CPU use --amp bf16 or "
             "none")
    check_parallel(settings, training)


def run_warnings(settings: TrainSettings, updates: int) -> list[str]:
    """Settings a run takes but that likely defeat their purpose, one line each (the run goes on): ``threads``
    beyond this machine's cores, and an EMA whose decay leaves its weights mostly at their initial values over the
    run's ``updates`` optimizer steps (``decay ** updates > 1/2``) without timm's warmup."""
    lines = []
    cores = cpu_cores()
    if settings.threads > cores:
        lines.append(f"--threads {settings.threads} is more than the {cores} CPU cores this process may use: threads "
                     f"beyond the cores oversubscribe them and slow every step (0 lets torch choose)")
    decay = settings.model_ema_decay
    if settings.model_ema and not settings.model_ema_warmup and decay ** updates > 0.5:
        lines.append(f"--model-ema-decay {decay:g} averages over about {1 / (1 - decay):.0f} optimizer steps "
                     f"(1 / (1 - decay)) but this run makes {updates}: the EMA weights end {decay ** updates:.0%} "
                     f"their initial values; add --model-ema-warmup (timm's warmup) or lower the decay")
    return lines


def check_parallel(settings: TrainSettings, training: bool) -> None:
    """FSDP2's settings: what it does not take, and on this machine the torch release it needs."""
    fsdp = settings.parallel == "fsdp"
    need(not fsdp or settings.amp != "fp16", "--parallel fsdp with --amp fp16 would need a sharded gradient scaler, "
         "which the workbench does not have: use --amp bf16 (on CUDA bf16 parameters in the blocks, gradients "
         "reduced in float32) or --parallel ddp")
    need(not fsdp or settings.pe != TIMM_UNPATCHED, "--parallel fsdp shards a visionpe model per transformer block (its "
         "adapter names the blocks); --pe timm_unpatched is timm's model as is: give a visionpe encoding or --parallel ddp")
    need(fsdp or settings.fsdp_reshard_after_forward, f"--no-fsdp-reshard-after-forward is for --parallel fsdp (this "
         f"run is {settings.parallel})")
    need(fsdp or not settings.meta_init, f"--meta-init builds the model on the meta device for --parallel fsdp to shard "
         f"(this run is {settings.parallel}): give --parallel fsdp")
    need(not settings.meta_init or not (settings.init_from or settings.pretrained), "--meta-init starts from a fresh "
         "initialisation and --init-from / --pretrained load weights into the whole model: give one of them")
    if fsdp and training:
        from .parallel import unsupported
        reason = unsupported()
        need(reason is None, f"--parallel fsdp: {reason}; use --parallel ddp")


def saved_form(settings: TrainSettings) -> dict:
    """What config.yaml holds: the settings that define the run, with ``model_kwargs`` complete (everything
    ``visionpe.create_model(model, pe, pe_kwargs=..., **model_kwargs)`` needs)."""
    saved = {k: copied(v) for k, v in settings.items() if k not in NOT_SAVED + REPORTED
             and not (k == "classes" and v is None)}  # classes: an image folder's only
    saved["model_kwargs"] = model_kwargs(settings)
    return saved


def renamed(saved: Mapping) -> dict:
    """A run's saved settings with a name's old spelling replaced by its name now (:data:`RENAMED_PE`: ``pe: timm``
    is ``timm_unpatched``), so a run folder written before the rename loads, resumes and compares unchanged."""
    saved = dict(saved)
    if saved.get("pe") in RENAMED_PE:
        saved["pe"] = RENAMED_PE[saved["pe"]]
    return saved


def changes(old: Mapping, new: Mapping) -> list[tuple[str, object, object]]:
    """``[(setting, old value, new value)]`` between two resolved settings (``model_kwargs`` per key); each a
    :class:`TrainSettings` or a mapping of its fields (a commit's or a benchmark record's settings)."""
    old, new = (x if isinstance(x, TrainSettings) else TrainSettings(**renamed(x)) for x in (old, new))
    a, b = saved_form(old), saved_form(new)
    out = []
    for key in dict.fromkeys([*a, *b]):
        if key == "output":
            continue
        if key == "model_kwargs":
            for sub in dict.fromkeys([*a[key], *b[key]]):
                if a[key].get(sub) != b[key].get(sub) and sub not in DERIVED_MODEL_KWARGS:
                    out.append((f"model_kwargs.{sub}", a[key].get(sub), b[key].get(sub)))
        elif a.get(key) != b.get(key):
            out.append((key, a.get(key), b.get(key)))
    for key in NOT_SAVED:
        if getattr(old, key) != getattr(new, key) and key != "overwrite":
            out.append((key, getattr(old, key), getattr(new, key)))
    return out


def refused_changes(base: Mapping, settings: Mapping) -> list[tuple[str, object, object]]:
    """The changes from a run's settings ``base`` to ``settings`` that ``--resume`` refuses: everything not in
    :data:`SAFE_ON_RESUME` (they would change what is trained)."""
    return [d for d in changes(base, settings) if d[0] not in SAFE_ON_RESUME]
