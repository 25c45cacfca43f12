"""Every command-line mistake, one row each: the script, its arguments, and the words of the ONE line it must print.

A row is ``(script, args, words, setup)``: running ``script`` with ``args`` must exit with status 2 after printing
exactly one line ``prog: error: ...`` on stderr that holds every word (plain text) and no traceback. ``setup``
(optional) names a function below that prepares the files the row needs. Placeholders: ``{tmp}`` a fresh folder,
``{run}`` a copy of a finished tiny run (made once per module), ``{yaml}`` a file written by the setup. Scripts run
in this process (train_vit.py through runpy, the others through their ``main``), so a row costs milliseconds; a
new option adds rows here (issue 9's matrix).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from trainutil import ROOT, TINY, parser_of, run_script, train_main

from visionpe.cli import UserError
from visionpe.train import settings


SCRIPTS = {"sweep": "resolution_sweep", "visualize": "visualize", "benchmark": "benchmark", "speed": "bench_speed",
           "export": "export", "predict": "predict", "convert": "convert_benchmark"}
PROG = {"train": "visionpe train", "sweep": "visionpe sweep", "visualize": "visionpe visualize",
        "benchmark": "visionpe benchmark", "speed": "visionpe bench-speed", "export": "visionpe export",
        "predict": "visionpe predict", "convert": "visionpe convert-benchmark"}
PYTHON_TAG = '!!python/object/apply:os.system ["touch {tmp}/pwned"]'


# -- setups: each prepares files in `tmp` (and in the run copy `run`) and returns the {yaml} path -----------------
def recipe(tmp, run, text):
    path = tmp / "recipe.yaml"
    path.write_text(text.replace("{tmp}", str(tmp)))
    return path


def run_config(run, **changes):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(changes)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


SETUPS = {
    "python_tag_recipe": lambda tmp, run: recipe(tmp, run, f"epochs: {PYTHON_TAG}\n"),
    "bad_yaml_recipe": lambda tmp, run: recipe(tmp, run, "epochs: [1, 2\nlr: : :\n"),
    "list_recipe": lambda tmp, run: recipe(tmp, run, "- epochs\n- lr\n"),
    "unknown_key_recipe": lambda tmp, run: recipe(tmp, run, "bogus_setting: 1\n"),
    "string_size_recipe": lambda tmp, run: recipe(tmp, run, "eval_batch_size: ten\n"),
    "string_decay_recipe": lambda tmp, run: recipe(tmp, run, "weight_decay: fast\n"),
    "string_log_recipe": lambda tmp, run: recipe(tmp, run, "log: tensorboard\n"),
    "derived_key_recipe": lambda tmp, run: recipe(tmp, run, "num_classes: 3\n"),
    "binary_recipe": lambda tmp, run: (tmp / "recipe.yaml").write_bytes(b"\xff\xfe\x00garbage") and tmp / "recipe.yaml",
    "empty_dir": lambda tmp, run: (tmp / "empty").mkdir(),
    "empty_imagefolder": lambda tmp, run: [(tmp / "folder" / s).mkdir(parents=True) for s in ("train", "val")],
    "imagefolder_without_images": lambda tmp, run: [(tmp / "folder" / s / "cat").mkdir(parents=True)
                                                    for s in ("train", "val")],
    "output_is_a_file": lambda tmp, run: (tmp / "afile").write_text("not a folder"),
    "dangling_latest": lambda tmp, run: ((run / "checkpoint").mkdir(), (run / "checkpoint" / "latest").write_text(
        "epoch-9\n")),
    "truncate_state": lambda tmp, run: (run / "state.pt").write_bytes((run / "state.pt").read_bytes()[:1000]),
    "random_state": lambda tmp, run: (run / "state.pt").write_bytes(torch.randint(0, 256, (5000,),
                                                                      dtype=torch.uint8).numpy().tobytes()),
    "truncate_last": lambda tmp, run: (run / "last.safetensors").write_bytes(
        (run / "last.safetensors").read_bytes()[:500]),
    "random_last": lambda tmp, run: (run / "last.safetensors").write_bytes(b"\x07" * 3000),
    "remove_last": lambda tmp, run: (run / "last.safetensors").unlink(),
    "python_tag_config": lambda tmp, run: (run / "config.yaml").write_text(
        (run / "config.yaml").read_text() + f"pwn: {PYTHON_TAG.replace('{tmp}', str(tmp))}\n"),
    "config_without_model": lambda tmp, run: (run / "config.yaml").write_text(
        "\n".join(line for line in (run / "config.yaml").read_text().splitlines() if not line.startswith("model:"))),
    "config_unknown_key": lambda tmp, run: run_config(run, bogus_setting=1),
    "config_bad_pe": lambda tmp, run: run_config(run, pe="rope_bogus"),
    "config_bad_data": lambda tmp, run: run_config(run, data="imagenet-1k"),
    "config_bad_classes": lambda tmp, run: run_config(run, num_classes=0),
    "config_other_size": lambda tmp, run: run_config(run, model_kwargs={"embed_dim": 32, "depth": 1,
                                                                         "num_heads": 2}),
    "no_config": lambda tmp, run: (run / "config.yaml").unlink(),
    "rows_missing_title": lambda tmp, run: rows_file(tmp, "part: s\nrows: [{label: a, args: --pe learned}]\n"),
    "rows_bad_part": lambda tmp, run: rows_file(tmp, "part: a b\ntitle: t\nrows: [{label: a, args: --pe learned}]\n"),
    "rows_empty": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: []\n"),
    "rows_no_args": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a}]\n"),
    "rows_unknown_key": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: x, "
                                                        "colour: red}]\n"),
    "rows_sets_seed": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --seed 3}]\n"),
    "rows_bad_scaling": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --pe "
                                                        "rope_mixed, scaling: [linear]}]\n"),
    "rows_same_label": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a b, args: --pe learned}, "
                                                       "{label: a-b, args: --pe sincos}]\n"),
    "rows_bad_pe": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --pe rope_bogus}]\n"),
    "rows_empty_ok": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --pe learned}]\n"),
    "rows_bad_flag": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --bogus-flag 1}]\n"),
    "rows_bad_protocol": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --pe learned, "
                                                         "protocol: [squash]}]\n"),
    "rows_bad_compare": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --pe learned}]\n"
                                                        "compare: [a]\n"),
    "rows_native_swin": lambda tmp, run: rows_file(tmp, "part: s\ntitle: t\nrows: [{label: a, args: --model "
                                                        "swin_tiny_patch4_window7_224 --pe swin_bias, "
                                                        "protocol: [native]}]\n"),
    "config_swin": lambda tmp, run: run_config(run, model="swin_tiny_patch4_window7_224", pe="swin_bias",
                                               model_kwargs={}),
    "user_code_clash": lambda tmp, run: user_code(tmp, "import visionpe as vpe\n"
                                                       "vpe.register('rope_axial', vpe.AxialRoPE.__mro__[1])\n"),
    "user_code_syntax": lambda tmp, run: user_code(tmp, "def broken(:\n"),
    "user_code_raises": lambda tmp, run: user_code(tmp, "raise RuntimeError('the user code failed')\n"),
}


def image_classes(tmp, layout, corrupt=None):
    """``tmp/folder/<split>/<class>/`` with 4 small PNGs a class; ``corrupt``: a path under ``folder`` written as a
    damaged PNG."""
    from PIL import Image
    for split, classes in layout.items():
        for c in classes:
            (tmp / "folder" / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (12, 12), (60 * i, 80, 200)).save(tmp / "folder" / split / c / f"{i}.png")
    if corrupt:
        (tmp / "folder" / corrupt).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)


def clip_classes(tmp, clips):
    """``tmp/folder/<split>/<class>/<clip>/`` frame folders: ``clips`` maps ``split/class/clip`` to a frame count."""
    from PIL import Image
    for name, frames in clips.items():
        (tmp / "folder" / name).mkdir(parents=True)
        for k in range(frames):
            Image.new("RGB", (8, 8), (20 * k, 0, 0)).save(tmp / "folder" / name / f"{k:03d}.png")


def idx_files(tmp, cut=0, bad_label=False):
    """MNIST idx files of 64 train and 32 test images in ``tmp/idx``; ``cut`` bytes cut from the test images' end,
    ``bad_label``: a test label of 10."""
    import numpy as np
    (tmp / "idx").mkdir()
    for stem, n in (("train", 64), ("t10k", 32)):
        for kind, array in (("images-idx3-ubyte", np.zeros((n, 28, 28))), ("labels-idx1-ubyte", np.arange(n) % 10)):
            if bad_label and kind.startswith("labels") and stem == "t10k":
                array[3] = 10
            body = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
            body += array.astype(np.uint8).tobytes()
            cut_here = cut if stem == "t10k" and kind.startswith("images") else 0
            (tmp / "idx" / f"{stem}-{kind}").write_bytes(body[:len(body) - cut_here])


def partial_run(tmp, remains=False):
    """``tmp/partial``: a run killed before its config.yaml existed (a stray temporary of it), or, with
    ``remains``, during --overwrite's deletion of a previous run (its state.pt and metrics left)."""
    (tmp / "partial").mkdir()
    (tmp / "partial" / ".config.yaml.k1ll3d.tmp").write_text("model: vit")
    if remains:
        (tmp / "partial" / "state.pt").write_bytes(b"old")
        (tmp / "partial" / "metrics.jsonl").write_text("{}\n")


SETUPS.update({
    "killed_before_config": lambda tmp, run: partial_run(tmp),
    "remains_without_config": lambda tmp, run: partial_run(tmp, remains=True),
    "idx_truncated": lambda tmp, run: idx_files(tmp, cut=28 * 28),
    "idx_bad_label": lambda tmp, run: idx_files(tmp, bad_label=True),
    "imagefolder_other_classes": lambda tmp, run: image_classes(tmp, {"train": ("cat", "dog"),
                                                                      "val": ("dog", "zebra")}),
    "imagefolder_corrupt_train": lambda tmp, run: image_classes(tmp, {"train": ("cat", "dog"), "val": ("cat", "dog")},
                                                                corrupt="train/dog/broken.png"),
    "imagefolder_corrupt_val": lambda tmp, run: image_classes(tmp, {"train": ("cat", "dog"), "val": ("cat", "dog")},
                                                              corrupt="val/cat/broken.png"),
    "videofolder_empty_clip": lambda tmp, run: clip_classes(tmp, {"train/a/c1": 2, "train/b/c1": 2, "train/b/c2": 0,
                                                                  "val/a/c1": 2}),
})
FOLDER_RUN = ["--data", "imagefolder", "--data-dir", "{tmp}/folder", "--batch-size", "2", "--epochs", "1"]


def user_code(tmp, text):
    path = tmp / "user_code.py"
    path.write_text(text)
    return path


def rows_file(tmp, text):
    path = tmp / "rows.yaml"
    path.write_text(text)
    return path

T, S, V, B, Q, E = "train", "sweep", "visualize", "benchmark", "speed", "export"
ROWS = [
    # -- train_vit.py: model ---------------------------------------------------------------------------------
    (T, ["--pe", "rope_bogus"], ["rope_bogus", "rope_mixed"]),
    (T, ["--pe", "rope_axial+rope_mixed"], ["pe"]),
    (T, ["--pe-kwargs", "bogus_keyword=3"], ["bogus_keyword"]),
    (T, ["--pe-kwargs", "theta"], ["KEY=VALUE"]),
    (T, ["--pe-kwargs", "theta=[1, 2"], ["not plain YAML"]),
    (T, ["--pe-kwargs", "theta=!!python/object/apply:os.system [\"touch {tmp}/pwned\"]"], ["not plain YAML"]),
    (T, ["--model", "vit_nonexistent_224"], ["vit_nonexistent_224"]),
    (T, ["--model-kwargs", "bogus=1"], ["bogus"]),
    (T, ["--model-kwargs", "embed_dim"], ["KEY=VALUE"]),
    (T, ["--depth", "-1"], ["depth", ">= 1", "-1"]),
    (T, ["--depth", "0"], ["depth", ">= 1"]),
    (T, ["--embed-dim", "0"], ["embed_dim", ">= 1"]),
    (T, ["--embed-dim", "18", "--num-heads", "4"], ["embed_dim 18", "num_heads 4"]),
    (T, ["--num-heads", "three"], ["--num-heads", "three"]),
    (T, ["--img-size", "18"], ["img_size 18", "patch_size 4"]),
    (T, ["--img-size", "0"], ["img_size"]),
    (T, ["--img-size", "-16"], ["img_size"]),
    (T, ["--patch-size", "0"], ["patch_size", ">= 1"]),
    (T, ["--drop-path", "1"], ["drop_path", "[0, 1)"]),
    (T, ["--drop-path", "-0.1"], ["drop_path"]),
    (T, ["--init-from", "{tmp}/nowhere", "--pe", "rope_mixed"], ["--init-from", "{tmp}/nowhere", "no such run"]),
    (T, ["--init-from", "{run}", "--embed-dim", "32"], ["--init-from", "does not fit", "embed_dim=32"]),
    (T, ["--init-head-reset"], ["--init-head-reset needs --init-from"]),
    (T, ["--pretrained", "--init-from", "{run}"], ["--pretrained and --init-from", "give one"]),
    (T, ["--pretrained-path", "{tmp}/vit.safetensors"], ["--pretrained-path", "needs --pretrained"]),
    (T, ["--pretrained", "--pretrained-path", "{tmp}/missing.safetensors", "--embed-dim", "16"],
     ["--pretrained-path", "{tmp}/missing.safetensors", "no such file"]),
    (T, ["--pretrained", "--pretrained-path", "{yaml}", "--embed-dim", "16"],
     ["--pretrained vit_tiny_patch16_224", "timm could not load", "user_code.py"], "user_code_syntax"),
    # -- data ---------------------------------------------------------------------------------------------------
    (T, ["--data", "imagenet-1k"], ["--data", "imagenet-1k", "shapes-position"]),
    (T, ["--data", "mnist", "--data-dir", "{tmp}"], ["mnist", "{tmp}", "--download"]),
    (T, ["--data", "fashion-mnist", "--data-dir", "{tmp}/empty"], ["fashion-mnist", "{tmp}/empty"], "empty_dir"),
    (T, ["--data", "cifar10"], ["cifar10", "--data-dir"]),
    (T, ["--data", "imagefolder"], ["imagefolder", "--data-dir"]),
    (T, ["--data", "imagefolder", "--data-dir", "{tmp}/folder"], ["{tmp}/folder/train", "no images"],
     "empty_imagefolder"),
    (T, ["--data", "imagefolder", "--data-dir", "{tmp}/folder"], ["no images"], "imagefolder_without_images"),
    (T, ["--data", "imagefolder", "--data-dir", "{tmp}/nowhere"], ["{tmp}/nowhere", "does not exist"]),
    (T, ["--train-samples", "0"], ["train_samples", ">= 1"]),
    (T, ["--val-samples", "-3"], ["val_samples", ">= 1"]),
    (T, ["--train-samples", "many"], ["--train-samples", "many"]),
    (T, ["--workers", "-1"], ["workers must be an integer in [0, 256]", "got -1"]),
    (T, ["--workers", str(10**18)], ["workers must be an integer in [0, 256]", "each is a process"]),
    (T, ["--data-dir", "{tmp}"], ["--data-dir is for data read from files", "--data shapes-position is rendered"]),
    (T, ["--download"], ["--download is for data read from files", "leave it out"]),
    (T, ["--data", "video-files", "--num-frames", "4"], ["video-files", "--data-dir"]),
    (T, ["--data", "video-files", "--num-frames", "4", "--data-dir", "{tmp}/nowhere"],
     ["video-files", "{tmp}/nowhere/train", "does not exist"]),
    (T, ["--data", "video-files", "--num-frames", "4", "--data-dir", "{tmp}/folder"], ["video-files", "holds no clips"],
     "empty_imagefolder"),
    (T, ["--frame-stride", "2"], ["--frame-stride", "video runs"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--frame-stride", "2"],
     ["moving-shapes", "does not take --frame-stride"]),
    (T, ["--data", "video-files", "--num-frames", "4", "--frame-stride", "0"], ["frame_stride", ">= 1"]),
    (T, ["--max-patches", "0"], ["max_patches", "[1, 65536]", "got 0"]),
    (T, ["--max-patches", "16", "--model", "swin_tiny_patch4_window7_224"], ["--max-patches", "ViT", "swin_tiny"]),
    (T, ["--max-patches", "16", "--pe", "timm_unpatched"], ["--max-patches", "pe=timm_unpatched"]),
    (T, ["--max-patches", "16", "--data", "moving-shapes", "--num-frames", "4"], ["--max-patches", "video"]),
    (T, ["--max-patches", "16", "--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", "global_pool=map"],
     ["--max-patches", "global_pool", "map"]),
    (T, ["--max-patches", "16", "--mixup", "0.5"], ["--mixup", "--max-patches"]),
    (T, ["--max-patches", "16", "--train-res", "16", "24"], ["--train-res", "--max-patches"]),
    (T, ["--max-patches", "16", "--train-crop-mode", "rkrc"], ["train_crop_mode", "max_patches"]),
    (T, ["--max-patches", "16", "--train-crop-mode", "src"], ["train_crop_mode 'src'", "max_patches"]),
    (T, ["--max-patches", "many"], ["--max-patches", "many"]),
    (T, ["--max-patches", "16", "--compile"], ["--compile", "--max-patches"]),
    (T, ["--interpolation", "cubic"], ["--interpolation", "cubic", "bicubic"]),
    # -- video ------------------------------------------------------------------------------------------------
    (T, ["--num-frames", "4"], ["--num-frames", "shapes-position", "image data set"]),
    (T, ["--data", "moving-shapes"], ["moving-shapes", "video data set", "--num-frames"]),
    (T, ["--data", "moving-shapes", "--num-frames", "0"], ["num_frames", ">= 1"]),
    (T, ["--data", "moving-shapes", "--num-frames", "two"], ["--num-frames", "two"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--tubelet-size", "3", "4", "4"],
     ["num_frames 4", "multiple", "3 frames"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--tubelet-size", "2", "4"], ["tubelet_size", "3 integers"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--tubelet-size", "2", "8", "8"],
     ["tubelet_size 2 8 8", "patch_size 4"]),
    (T, ["--tubelet-size", "1", "4", "4"], ["--tubelet-size", "video runs"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--tubelet-size", "2", "4", "4", "--eval-frames", "3"],
     ["eval_frames 3", "2 frames"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--eval-frames", "0"], ["eval_frames 0"]),
    (T, ["--eval-frames", "8"], ["--eval-frames", "video runs"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--model", "swin_tiny_patch4_window7_224"],
     ["swin_tiny_patch4_window7_224", "not a ViT"]),
    (T, ["--model", "swin3d_t"], ["swin3d_t", "video model", "--num-frames"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--model", "swin3d_t"], ["swin3d_t", "depth", "depths"]),
    # -- optimizer and schedule ----------------------------------------------------------------------------------
    (T, ["--opt", "sgdx"], ["sgdx", "adamw"]),
    (T, ["--weight-decay", "-0.1"], ["weight_decay", ">= 0"]),
    (T, ["--clip-grad", "-1"], ["clip_grad", ">= 0"]),
    (T, ["--batch-size", "0"], ["batch_size", ">= 1"]),
    (T, ["--batch-size", "1000"], ["batch_size 1000", "larger than the training set"]),
    (T, ["--amp", "fp8"], ["--amp", "fp8", "bf16"]),
    (T, ["--amp", "fp16", "--device", "cpu"], ["amp=fp16", "CUDA", "bf16"]),
    (T, ["--grad-accum-steps", "0"], ["grad_accum_steps", ">= 1"]),
    (T, ["--grad-accum-steps", "1.5"], ["--grad-accum-steps", "1.5"]),
    (T, ["--layer-decay", "0"], ["layer_decay", "(0, 1]"]),
    (T, ["--layer-decay", "1.5"], ["layer_decay", "(0, 1]", "1.5"]),
    (T, ["--bce-loss", "--bce-target-thresh", "1.5"], ["bce_target_thresh", "[0, 1)"]),
    (T, ["--bce-target-thresh", "0.2"], ["--bce-target-thresh needs --bce-loss"]),
    (T, ["--model-ema", "--model-ema-decay", "1"], ["model_ema_decay", "[0, 1)"]),
    (T, ["--model-ema-decay", "-0.1"], ["model_ema_decay", "[0, 1)"]),
    (T, ["--model-ema-warmup"], ["--model-ema-warmup needs --model-ema"]),
    (T, ["--compile=yes"], ["--compile", "ignored explicit argument"]),
    (T, ["--channels-last=1"], ["--channels-last", "ignored explicit argument"]),
    (T, ["--epochs", "0"], ["epochs", ">= 1"]),
    (T, ["--epochs", "two"], ["--epochs", "two"]),
    (T, ["--epochs", "1.5"], ["--epochs", "1.5"]),
    (T, ["--lr", "0"], ["lr", "> 0"]),
    (T, ["--lr", "-1"], ["lr", "> 0"]),
    (T, ["--lr", "nan"], ["lr", "number"]),
    (T, ["--lr", "fast"], ["--lr", "fast"]),
    (T, ["--min-lr", "-0.5"], ["min_lr", ">= 0"]),
    (T, ["--warmup-epochs", "5"], ["warmup_epochs", "[0, epochs=2]"]),
    (T, ["--warmup-epochs", "-1"], ["warmup_epochs"]),
    (T, ["--aug-repeats", "1"], ["aug_repeats", "0 (off)", "[2, 32]"]),
    (T, ["--aug-repeats", "-2"], ["aug_repeats", "got -2"]),
    # -- augmentation, evaluation, run ----------------------------------------------------------------------------
    (T, ["--label-smoothing", "1.5"], ["label_smoothing", "[0, 1)"]),
    (T, ["--mixup", "-1"], ["mixup", ">= 0"]),
    (T, ["--cutmix", "-0.5"], ["cutmix", ">= 0"]),
    (T, ["--mixup", "0.5", "--batch-size", "15"], ["even batch_size"]),
    (T, ["--scale", "0.5"], ["scale", "two numbers"]),
    (T, ["--scale", "0", "1"], ["scale", "0.0 < low <= high"]),
    (T, ["--scale", "x", "1"], ["--scale", "'x'"]),
    (T, ["--ratio", "2", "1"], ["ratio", "low <= high"]),
    (T, ["--hflip", "1.5"], ["hflip", "1.5"]),
    (T, ["--color-jitter", "-0.4"], ["color_jitter", ">= 0.0"]),
    (T, ["--aa", "rand-q9"], ["aa 'rand-q9'", "timm auto-augment", "rand-m9-mstd0.5-inc1"]),
    (T, ["--reprob", "2"], ["reprob", "<= 1.0"]),
    (T, ["--remode", "noise"], ["--remode", "noise", "pixel"]),
    (T, ["--recount", "0"], ["recount", ">= 1"]),
    (T, ["--train-crop-mode", "random"], ["--train-crop-mode", "random", "rrc"]),
    (T, ["--train-crop-mode", "SRC"], ["--train-crop-mode", "SRC", "src"]),
    (T, ["--aa", "3b"], ["aa '3b'", "timm auto-augment", "3a"]),
    (T, ["--grayscale-prob", "-0.1"], ["grayscale_prob", ">= 0.0"]),
    (T, ["--gaussian-blur-prob", "3"], ["gaussian_blur_prob", "<= 1.0"]),
    (T, ["--eval-res", "30"], ["eval_res 30", "patch_size 4"]),
    (T, ["--train-res", "30"], ["train_res 30", "patch_size 4"]),
    (T, ["--train-res", "x"], ["--train-res", "'x'"]),
    (T, ["--eval-res", "0"], ["eval_res 0"]),
    (T, ["--eval-res", "x"], ["--eval-res", "'x'"]),
    (T, ["--eval-batch-size", "-5"], ["eval_batch_size", ">= 1"]),
    (T, ["--eval-protocol", "squash"], ["--eval-protocol", "squash", "resize", "crop", "native"]),
    (T, ["--eval-protocol", "native", "--model", "swin_tiny_patch4_window7_224"], ["eval_protocol native", "ViT"]),
    (T, ["--eval-protocol", "crop", "--data", "moving-shapes", "--num-frames", "4"],
     ["eval_protocol crop", "video runs evaluate with resize"]),
    (T, ["--crop-pct", "0"], ["crop_pct", "> 0.0"]),
    (T, ["--crop-pct", "1.5"], ["crop_pct", "<= 1.0"]),
    (T, ["--seed", "-1"], ["seed", ">= 0"]),
    (T, ["--device", "tpu"], ["--device", "tpu", "cpu"]),
    (T, ["--log", "mlflow"], ["--log", "mlflow", "tensorboard", "wandb"]),
    (T, ["--config", "{yaml}"], ["log must be a list of tensorboard, wandb", "'tensorboard'"], "string_log_recipe"),
    (T, ["--config", "no_such_recipe"], ["no_such_recipe", "does not exist", "shipped", "shapes_tiny"]),
    (T, ["--threads", "-2"], ["threads", ">= 0"]),
    (T, ["--stop-after", "-1"], ["stop_after", ">= 0"]),
    (T, ["--checkpoint-every-steps", "-1"], ["checkpoint_every_steps", ">= 0"]),
    (T, ["--checkpoint-every-minutes", "-5"], ["checkpoint_every_minutes", ">= 0"]),
    (T, ["--checkpoint-every-minutes", "soon"], ["--checkpoint-every-minutes", "soon"]),
    (T, ["--parallel", "zero3"], ["--parallel", "zero3", "ddp", "fsdp"]),
    (T, ["--parallel", "fsdp", "--pe", "timm_unpatched"], ["--parallel fsdp", "--pe timm_unpatched", "--parallel ddp"]),
    (T, ["--meta-init"], ["--meta-init", "--parallel fsdp"]),
    (T, ["--no-fsdp-reshard-after-forward"], ["--no-fsdp-reshard-after-forward", "--parallel fsdp"]),
    (T, ["--parallel", "fsdp", "--meta-init", "--pretrained"], ["--meta-init", "--pretrained", "fresh"]),
    (T, ["--fsdp-reshard-after-forward=no"], ["--fsdp-reshard-after-forward", "ignored explicit argument"]),
    (T, ["--grad-checkpointing=yes"], ["--grad-checkpointing", "ignored explicit argument"]),
    (T, ["--output", "{tmp}/afile"], ["{tmp}/afile", "not a directory"], "output_is_a_file"),
    (T, ["--unknown-flag"], ["unrecognized", "--unknown-flag"]),
    # -- YAML recipes -----------------------------------------------------------------------------------------------
    (T, ["--config", "{tmp}/missing.yaml"], ["{tmp}/missing.yaml", "does not exist"]),
    (T, ["--config", "{yaml}"], ["not plain YAML"], "python_tag_recipe"),
    (T, ["--config", "{yaml}"], ["not plain YAML"], "bad_yaml_recipe"),
    (T, ["--config", "{yaml}"], ["mapping"], "list_recipe"),
    (T, ["--config", "{yaml}"], ["bogus_setting"], "unknown_key_recipe"),
    (T, ["--config", "{yaml}"], ["eval_batch_size", "integer", "ten"], "string_size_recipe"),
    (T, ["--config", "{yaml}"], ["weight_decay", "number", "fast"], "string_decay_recipe"),
    (T, ["--config", "{yaml}"], ["num_classes", "derived"], "derived_key_recipe"),
    (T, ["--config", "{yaml}"], ["not a text file"], "binary_recipe"),
    (T, ["--config", "{tmp}"], ["directory"]),
    # -- run directory and resume ---------------------------------------------------------------------------------
    (T, ["--output", "{run}"], ["already holds a run", "--resume", "--overwrite"]),
    (T, ["--resume", "{tmp}/nothing-here"], ["no run to continue", "nothing-here"]),
    (T, ["--resume", "{tmp}/partial"], ["no run to continue", "{tmp}/partial", "no config.yaml",
                                        "rerun the same command without --resume"], "killed_before_config"),
    (T, ["--resume", "{tmp}/partial"], ["no run to continue", "state.pt", "with --overwrite"],
     "remains_without_config"),
    (T, ["--output", "{tmp}/partial"], ["remains of a run without config.yaml", "state.pt",
                                        "rerun the same command with --overwrite"], "remains_without_config"),
    (T, ["--resume", "{run}", "--overwrite"], ["--overwrite"]),
    (T, ["--resume", "{run}"], ["state.pt", "damaged"], "truncate_state"),
    (T, ["--resume", "{run}"], ["latest", "epoch-9", "no complete DCP checkpoint", "--overwrite"], "dangling_latest"),
    (T, ["--resume", "{run}"], ["state.pt", "damaged"], "random_state"),
    (T, ["--resume", "{run}"], ["not plain YAML"], "python_tag_config"),
    (T, ["--resume", "{run}"], ["bogus_setting"], "config_unknown_key"),
    (T, ["--resume", "{run}", "--pe", "rope_axial"], ["cannot change", "pe ('rope_mixed' -> 'rope_axial')"]),
    (T, ["--resume", "{run}", "--embed-dim", "32"], ["cannot change", "model_kwargs.embed_dim (16 -> 32)"]),
    (T, ["--resume", "{run}", "--pe-kwargs", "theta=10"], ["cannot change", "pe_kwargs"]),
    (T, ["--resume", "{run}", "--lr", "0.1", "--epochs", "5"], ["cannot change", "lr (0.003 -> 0.1)", "may change"]),
    (T, ["--resume", "{run}", "--epochs", "1"], ["--epochs 1", "trained 2 epoch(s)", "--epochs >= 2"]),
    (T, ["--resume", "{run}", "--model-ema"], ["cannot change", "model_ema (False -> True)"]),
    (T, ["--resume", "{run}", "--grad-accum-steps", "2"], ["cannot change", "grad_accum_steps (1 -> 2)"]),
    # -- resolution_sweep.py ----------------------------------------------------------------------------------------
    (S, ["{tmp}/nowhere", "--res", "16"], ["{tmp}/nowhere", "not found"]),
    (S, ["{tmp}", "--res", "16"], ["config.yaml", "not found"]),
    (S, ["{run}", "--res", "18"], ["resolution 18", "patch_size 4"]),
    (S, ["{run}", "--res", "0"], ["--res", "positive"]),
    (S, ["{run}", "--res", "x"], ["--res", "'x'"]),
    (S, ["{run}"], ["--res", "required"]),
    (S, ["{run}", "--res", "16", "--scaling", "bogus"], ["--scaling", "bogus", "yarn"]),
    (S, ["{run}", "--res", "16", "--interpolation", "cubic"], ["--interpolation", "cubic", "bicubic"]),
    (S, ["{run}", "--res", "16", "--weights", "middle"], ["--weights", "middle"]),
    (S, ["{run}", "--res", "16", "--weights", "ema"], ["has no EMA weights", "--model-ema"]),
    (S, ["{run}", "--res", "16", "--batch-size", "0"], ["--batch-size", ">= 1"]),
    (S, ["{run}", "--res", "16", "--val-samples", "0"], ["--val-samples", ">= 1"]),
    (S, ["{run}", "--res", "16", "--device", "tpu"], ["--device", "tpu"]),
    (S, ["{run}", "--res", "16", "--frames", "4"], ["--frames", "video runs", "image run"]),
    (S, ["{run}", "--res", "16", "--frames", "0"], ["--frames", "positive"]),
    (S, ["{run}", "--res", "16", "--eval-protocol", "squash"], ["--eval-protocol", "squash", "native"]),
    (S, ["{run}", "--res", "16", "--crop-pct", "0"], ["--crop-pct", "(0, 1]"]),
    (S, ["{run}", "--res", "16", "--holdout", "8"], ["--holdout 8", "--tune"]),
    (S, ["{run}", "--res", "16", "--tune", "--holdout", "0"], ["--holdout", ">= 1"]),
    (S, ["{run}", "--res", "16", "--eval-protocol", "native"], ["--eval-protocol native", "ViT", "swin"],
     "config_swin"),
    (S, ["{run}", "--res", "16"], ["last.safetensors", "damaged"], "truncate_last"),
    (S, ["{run}", "--res", "16"], ["last.safetensors", "damaged"], "random_last"),
    (S, ["{run}", "--res", "16"], ["last.safetensors", "not found"], "remove_last"),
    (S, ["{run}", "--res", "16"], ["config.yaml", "not plain YAML"], "python_tag_config"),
    (S, ["{run}", "--res", "16"], ["config.yaml", "lacks", "model"], "config_without_model"),
    (S, ["{run}", "--res", "16"], ["bogus_setting"], "config_unknown_key"),
    (S, ["{run}", "--res", "16"], ["rope_bogus"], "config_bad_pe"),
    (S, ["{run}", "--res", "16"], ["data", "imagenet-1k"], "config_bad_data"),
    (S, ["{run}", "--res", "16"], ["num_classes", ">= 1"], "config_bad_classes"),
    (S, ["{run}", "--res", "16"], ["does not fit"], "config_other_size"),
    (S, ["{run}", "--res", "16"], ["config.yaml", "not found"], "no_config"),
    # -- visualize.py ----------------------------------------------------------------------------------------------
    (V, ["--pe", "nope"], ["nope", "sincos"]),
    (V, ["--kind", "bogus", "--pe", "sincos"], ["bogus", "similarity"]),
    (V, ["--pe", "sincos", "--grid", "0", "4"], ["--grid"]),
    (V, ["--pe", "rope_axial", "--scaling", "bogus"], ["--scaling", "bogus"]),
    (V, ["--pe", "sincos", "--dpi", "0"], ["--dpi", ">= 1"]),
    (V, ["--pe", "alibi", "--num-heads", "0"], ["--num-heads", ">= 1"]),
    (V, ["--pe", "rope_axial", "--theta", "-1"], ["--theta", "> 0"]),
    (V, ["--run", "{tmp}/nowhere"], ["not found"]),
    (V, ["--run", "{run}", "--checkpoint", "{run}/best.safetensors"], ["not allowed with"]),
    (V, ["--run", "{run}", "--which", "middle"], ["--which", "middle"]),
    (V, ["--run", "{run}", "--which", "ema"], ["has no EMA weights", "--model-ema"]),
    (V, ["--run", "{run}", "--pe", "alibi"], ["no alibi encoding"]),
    (V, ["--run", "{run}", "--layer", "-1"], ["--layer", ">= 0"]),
    (V, ["--run", "{run}"], ["config.yaml", "not plain YAML"], "python_tag_config"),
    (V, ["--run", "{run}"], ["not found"], "no_config"),
    (V, ["--checkpoint", "{run}/last.safetensors"], ["last.safetensors", "damaged"], "truncate_last"),
    (V, ["--run", "{run}", "--which", "last"], ["last.safetensors", "damaged"], "random_last"),
    # -- benchmark.py (checks every run's settings before the first process starts) --------------------------------
    (B, ["--pe", "rope_bogus", "--data", "shapes-position"], ["rope_bogus"]),
    (B, ["--data", "imagenet-1k"], ["data", "imagenet-1k"]),
    (B, ["--config", "{yaml}"], ["not plain YAML"], "python_tag_recipe"),
    (B, ["--jobs", "0"], ["--jobs", ">= 1"]),
    (B, ["--res", "30", "--data", "shapes-position", "--pe", "learned"], ["--res 30", "patch_size"]),
    (B, ["--scaling", "bogus"], ["--scaling", "bogus"]),
    (B, ["--data", "shapes-position", "--pe", "learned", "--frames", "4"], ["--frames", "video"]),
    (B, ["--data", "moving-shapes", "--pe", "learned"], ["moving-shapes", "--num-frames"]),
    (B, ["--data", "moving-shapes", "--pe", "learned", "--frames", "3", "--", "--num-frames", "4", "--tubelet-size",
         "2", "4", "4"], ["--frames 3", "2 frames"]),
    (B, ["--data", "shapes-position", "--pe", "learned", "--", "--lr", "-1"], ["lr", "> 0"]),
    (B, ["--res", "32x30", "--data", "shapes-position", "--pe", "learned"], ["--res 32x30", "patch_size"]),
    (B, ["--res", "32xx", "--data", "shapes-position", "--pe", "learned"], ["--res", "32xx", "HxW"]),
    (B, ["--rows", "{tmp}/nowhere.yaml", "--data", "shapes-position"], ["{tmp}/nowhere.yaml"]),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["missing 'title'"], "rows_missing_title"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["part must be"], "rows_bad_part"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["non-empty list"], "rows_empty"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["row 0", "label, args"], "rows_no_args"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["row 0", "colour"], "rows_unknown_key"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["row 'a'", "seed", "the benchmark sets"],
     "rows_sets_seed"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["scaling", "linear", "pi"], "rows_bad_scaling"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["two rows", "a-b"], "rows_same_label"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["rope_bogus"], "rows_bad_pe"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["--bogus-flag"], "rows_bad_flag"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["protocol", "squash", "native"], "rows_bad_protocol"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["compare", "[label, label]"], "rows_bad_compare"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position"], ["eval_protocol native", "ViT"], "rows_native_swin"),
    (B, ["--rows", "{yaml}", "--data", "shapes-position", "--swin"], ["--rows", "--swin"], "rows_empty_ok"),
    # -- values that were accepted before and gave wrong or surprising results (issue 22) -------------------------
    (T, ["--lr", "1e-4", "--min-lr", "1.0"], ["min_lr 1.0 must not exceed lr 0.0001"]),
    (T, ["--model", "resnet18"], ["--model resnet18", "no adapter"]),
    (T, ["--model", "vit_base_patch16_18x2_224"], ["--model vit_base_patch16_18x2_224", "parallel blocks",
                                                  "--pe timm_unpatched"]),
    (T, ["--init-grid", "16", "4"], ["--init-grid needs --init-from"]),
    (S, ["{run}", "--res", "16", "--out", "{tmp}/afile"], ["--out", "is a file"], "output_is_a_file"),
    (T, ["--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", "mlp_ratio=-2"],
     ["mlp_ratio", "--model-kwargs", "> 0", "-2"]),
    (T, ["--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", "mlp_ratio=inf"], ["mlp_ratio", "> 0"]),
    (T, ["--model-kwargs", "embed_dim=16", "depth=1", "num_heads=2", "reg_tokens=-1"],
     ["cannot build vit_tiny_patch16_224", "--model-kwargs", "reg_tokens=-1", "negative dimension"]),  # torch's error
    (T, ["--lr", "1e10", "--weight-decay", "0", "--epochs", "2", "--warmup-epochs", "0", "--train-samples", "16"],
     # 1 step an epoch; no weight decay (lr x weight_decay >= 1 is refused before training)
     ["non-finite validation loss", "after epoch 1", "no epoch was saved", "lower --lr"]),
    (T, ["--train-samples", "1e12"], ["--train-samples", "invalid int value", "'1e12'"]),
    (T, ["--train-samples", "1000000000000"], ["train_samples 1000000000000", "rendered train scenes", "at most"]),
    (T, ["--val-samples", "1000000000000"], ["val_samples 1000000000000", "rendered val scenes", "at most"]),
    (T, ["--img-size", "100000"], ["img_size 100000", "625000000 patches", "at most 65536"]),
    (T, ["--eval-res", "100000"], ["eval_res 100000", "at most 65536"]),
    (T, ["--train-res", "100000"], ["train_res 100000", "at most 65536"]),
    (T, ["--img-size", "4096", "--patch-size", "2048", "--batch-size", "100000"],
     ["batch_size 100000 at 4096 px", "float32 input", "at most", "half of this machine's"]),
    (T, ["--data", "moving-shapes", "--num-frames", "64", "--img-size", "136"], ["img_size 136", "per clip",
                                                                                 "at most 65536"]),
    (S, ["{run}", "--res", "100000"], ["--res 100000", "at most 65536"]),
    (S, ["{run}", "--res", "1024", "--val-samples", "1000000000"], ["val_samples 1000000000", "at most"]),
    (T, ["--data", "imagefolder", "--data-dir", "{tmp}/folder"],
     ["class folders", "{tmp}/folder/train lacks zebra", "{tmp}/folder/val lacks cat"], "imagefolder_other_classes"),
    (T, FOLDER_RUN, ["cannot read the image {tmp}/folder/train/dog/broken.png"], "imagefolder_corrupt_train"),
    (T, ["--data", "mnist", "--data-dir", "{tmp}/idx"],
     ["{tmp}/idx/t10k-images-idx3-ubyte", "truncated", f"{16 + 31 * 784} bytes, expected {16 + 32 * 784}"],
     "idx_truncated"),
    (T, ["--data", "mnist", "--data-dir", "{tmp}/idx"],
     ["{tmp}/idx/t10k-labels-idx1-ubyte", "labels out of range [0, 10)", "10 at index 3"], "idx_bad_label"),
    (T, FOLDER_RUN + ["--workers", "1"], ["cannot read the image {tmp}/folder/train/dog/broken.png"],
     "imagefolder_corrupt_train"),  # raised in a loader worker: still one line
    (T, FOLDER_RUN, ["cannot read the image {tmp}/folder/val/cat/broken.png"], "imagefolder_corrupt_val"),
    (T, ["--data", "videofolder", "--num-frames", "2", "--data-dir", "{tmp}/folder", "--batch-size", "2"],
     ["videofolder", "clip folder", "{tmp}/folder/train/b/c2", "holds no frames"], "videofolder_empty_clip"),
    (V, ["--run", "{run}", "--pe", "rope_mixed", "--layer", "99"], ["layer=99 is out of range", "layers 0..0"]),
    (Q, ["--threads", "-2"], ["--threads must be an integer in [1, 4096]"]),
    (Q, ["--repeats", "0"], ["--repeats must be an integer in [1, 1000]"]),
    (Q, ["--batch", "0"], ["--batch must be an integer in [1, 4096]"]),
    (Q, ["--min-run-time", "-1"], ["--min-run-time must be a number of seconds in (0, 3600.0]"]),
    (Q, ["--quick", "--out", "{tmp}"], ["is a directory"]),
    # -- visionpe export ---------------------------------------------------------------------
    (E, ["{tmp}/nowhere", "--format", "pt2"], ["{tmp}/nowhere", "not found"]),
    (E, ["{tmp}", "--format", "pt2"], ["config.yaml", "not found"]),
    (E, ["{run}"], ["--format", "required"]),
    (E, ["{run}", "--format", "tflite"], ["--format", "tflite", "pt2", "onnx"]),
    (E, ["{run}", "--format", "onnx"], ["--format onnx needs the export extra", "visionpe[export]",
                                        "missing:", "onnxruntime"], "no_onnxruntime"),
    (E, ["{run}", "--format", "pt2", "--weights", "middle"], ["--weights", "middle", "best"]),
    (E, ["{run}", "--format", "pt2", "--weights", "ema"], ["has no EMA weights", "--model-ema"]),
    (E, ["{run}", "--format", "pt2", "--sizes", "24"], ["--sizes", "give --dynamic too"]),
    (E, ["{run}", "--format", "pt2", "--dynamic", "--sizes", "18"], ["--sizes 18", "multiple", "patch", "4x4"]),
    (E, ["{run}", "--format", "pt2", "--dynamic", "--sizes", "4x16x16"], ["--sizes 4x16x16", "image run",
                                                                          "PX or HxW"]),
    (E, ["{run}", "--format", "pt2", "--dynamic", "--sizes", "16y16"], ["--sizes", "'16y16'", "HxW"]),
    (E, ["{run}", "--format", "pt2", "--dynamic", "--sizes", "4096"], ["--sizes 4096", "at most 65536 patches"]),
    (E, ["{run}", "--format", "pt2", "--out", "{tmp}"], ["--out", "is a directory", ".pt2"]),
    (E, ["{run}", "--format", "onnx", "--out", "{tmp}/model.pt2"], ["--out", "model.pt2", "ending in .onnx"]),
    (E, ["{run}", "--format", "pt2"], ["best.safetensors", "not found"], "remove_best"),
    (E, ["{run}", "--format", "pt2", "--weights", "last"], ["last.safetensors", "damaged"], "truncate_last"),
    (E, ["{run}", "--format", "pt2"], ["config.yaml", "not plain YAML"], "python_tag_config"),
    (E, ["{run}", "--format", "pt2"], ["does not fit"], "config_other_size"),
    (E, ["{run}", "--format", "pt2", "--import", "no_such_module_for_visionpe"], ["cannot import"]),
    # -- --import: user code, imported before anything is built -----------------------------------------------
    (T, ["--import", "no_such_module_for_visionpe"], ["--import no_such_module_for_visionpe", "cannot import"]),
    (T, ["--import", "{tmp}/missing.py"], ["{tmp}/missing.py", "no such file"]),
    (T, ["--import", "{yaml}"], ["user_code.py", "rope_axial", "already registered"], "user_code_clash"),
    (T, ["--import", "{yaml}"], ["user_code.py", "syntax error at line 1"], "user_code_syntax"),
    (T, ["--import", "{yaml}"], ["user_code.py", "RuntimeError", "the user code failed"], "user_code_raises"),
    (S, ["{run}", "--res", "16", "--import", "no_such_module_for_visionpe"], ["cannot import"]),
    (V, ["--pe", "sincos", "--import", "{tmp}/missing.py"], ["no such file"]),
    (B, ["--data", "shapes-position", "--import", "no_such_module_for_visionpe"], ["cannot import"]),
    # -- pe=timm_unpatched (timm's own model, benchmark control rows); its old spelling names the new one ---------------
    (T, ["--pe", "timm"], ["--pe timm is now --pe timm_unpatched"]),
    (T, ["--pe", "timm_unpatched", "--pe-kwargs", "theta=10"], ["pe=timm_unpatched", "--model-kwargs", "theta"]),
    (T, ["--pe", "timm_unpatched", "--data", "moving-shapes", "--num-frames", "4"],
     ["pe=timm_unpatched", "--num-frames"]),
    (T, ["--pe", "timm_unpatched", "--model", "resnet18"], ["pe=timm_unpatched", "resnet18", "vision_transformer"]),
]


# -- issue 32: data and augmentation (timm's lenient --aa, unbounded rates, video files, one class, offline) --------
_PATCH = []  # the running row's monkeypatch: a setup may patch something for its row alone


def video_clips(tmp, clips: dict, cut: str | None = None):
    """``tmp/folder/<split>/<class>/<name>.mp4`` clips of grey frames (PyAV; the row skips without it): ``clips`` maps
    ``split/class/name`` to a frame count; ``cut``: a clip of them written truncated to half its bytes."""
    av = pytest.importorskip("av")
    for name, frames in clips.items():
        path = tmp / "folder" / f"{name}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(path), "w") as container:
            stream = container.add_stream("mpeg4", rate=8)
            stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
            for k in range(frames):
                image = av.VideoFrame.from_ndarray(torch.full((16, 16, 3), 16 * k, dtype=torch.uint8).numpy(), "rgb24")
                for packet in stream.encode(image):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        if name == cut:
            path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def offline(tmp, run):
    """No network for this row: every URL torchvision opens fails as it does without one."""
    import urllib.error
    import urllib.request

    def refuse(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    _PATCH[0].setattr(urllib.request, "urlopen", refuse)


SETUPS.update({
    "imagefolder_one_class": lambda tmp, run: image_classes(tmp, {"train": ("cat",), "val": ("cat",)}),
    "video_short_clips": lambda tmp, run: video_clips(tmp, {"train/a/c1": 6, "train/b/c1": 6, "val/a/c1": 6}),
    "video_truncated": lambda tmp, run: video_clips(tmp, {"train/a/c1": 6, "train/a/c2": 6, "train/b/c1": 6,
                                                          "val/a/c1": 6, "val/b/c1": 6}, cut="train/a/c2"),
    "offline": offline,
})


def without(tmp, run, package):
    """``package`` is not installed for this row (importlib finds no spec for it)."""
    import importlib.util
    real = importlib.util.find_spec
    _PATCH[0].setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))


def nan_weights(run, name="last.safetensors"):
    """One NaN in the first tensor of ``run/name``."""
    from safetensors.torch import load_file, save_file
    state = load_file(run / name)
    state[next(iter(state))].view(-1)[0] = float("nan")
    save_file(state, run / name)


SETUPS.update({
    "no_onnxruntime": lambda tmp, run: without(tmp, run, "onnxruntime"),
    "remove_best": lambda tmp, run: (run / "best.safetensors").unlink(),
    "nan_last": lambda tmp, run: nan_weights(run),
})
VIDEO_RUN = ["--data", "video-files", "--num-frames", "4", "--data-dir", "{tmp}/folder", "--batch-size", "2",
             "--epochs", "1"]
ROWS += [
    # -- issue 43: no number from non-finite weights, and the remaining unclear cases -----------------------------
    (S, ["{run}", "--res", "16"], ["last.safetensors", "holds 1 NaN or infinite value"], "nan_last"),
    (V, ["--run", "{run}", "--which", "last"], ["last.safetensors", "holds 1 NaN or infinite value"], "nan_last"),
    (T, ["--scale", "1e30", "1e30"], ["scale must be two numbers with 0.0 < low <= high <= 1", "1e+30"]),
    (T, ["--scale", "0.5", "1.5"], ["scale", "<= high <= 1", "area"]),
    (T, ["--ratio", "1e30", "1e30"], ["ratio must be two numbers with 0.01 < low <= high <= 100", "1e+30"]),
    (T, ["--ratio", "1e-30", "1"], ["ratio", "0.01 < low"]),
    (T, ["--max-patches", str(10**18)], ["max_patches must be an integer in [1, 65536]", str(10**18)]),
    (T, ["--aug-repeats", str(10**18)], ["aug_repeats must be 0 (off) or an integer in [2, 32]", str(10**18)]),
    (T, ["--threads", str(10**18)], ["threads must be an integer in [0, 4096]", "CPU cores", str(10**18)]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--eval-frames", str(10**18)],
     [f"eval_frames {10**18} at img_size 16", "patches per clip", "at most 65536"]),
    (S, ["{run}", "--res", "16", "--tune", "--holdout", str(10**12)],
     [f"--holdout {10**12}", "rendered held-out training scenes of shapes-position", "at most"]),
    (B, ["--data", "shapes-position", "--pe", "learned", "--tune", "--holdout", str(10**12)],
     [f"--holdout {10**12}", "rendered held-out training scenes", "at most"]),
    (T, ["--pe", "vit5_rope", "--pe-kwargs", "num_registers=4"], ["num_registers=4", "0 register tokens",
                                                                   "reg_tokens=4"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--pe", "rope_axial", "--embed-dim", "8"],
     ["head_dim=4 is too small for RoPE on a (T, H, W) grid", "at least 6"]),
    (T, ["--init-from", "{run}", "--init-grid", "3", "5"], ["--init-grid 3 5", "pos_embed", "holds no pos_embed",
                                                            "leave out --init-grid"]),
    (T, ["--aa", "rand-zz"], ["aa 'rand-zz'", "'zz'", "timm would skip it"]),
    (T, ["--aa", "rand-m1000"], ["aa 'rand-m1000'", "m1000", "timm's range 0..10"]),
    (T, ["--aa", "rand-m9-m5"], ["aa 'rand-m9-m5'", "m is given twice"]),
    (T, ["--aa", "rand-tfoo"], ["aa 'rand-tfoo'", "transform set 'foo'"]),
    (T, ["--aa", "augmix-m20"], ["aa 'augmix-m20'", "m20", "0..10"]),
    (T, ["--aa", "rand-n100"], ["aa 'rand-n100'", "n100", "15 ops"]),
    (T, ["--color-jitter", "1e30"], ["color_jitter must be in [0, 1]", "1e+30", "saturate"]),
    (T, ["--color-jitter", "inf"], ["color_jitter", "finite", "inf"]),
    (T, ["--cutmix", "inf"], ["cutmix must be a finite number >= 0", "got inf"]),
    (T, ["--mixup", "inf"], ["mixup must be a finite number >= 0", "got inf"]),
    (T, ["--weight-decay", "inf"], ["weight_decay inf with lr", "must be < 1"]),
    (T, ["--weight-decay", "1e30"], ["weight_decay 1e+30 with lr", "lr x weight_decay"]),
    (T, ["--reprob", "1", "--recount", "1000000"], ["recount must be an integer in [1, 100]", "1000000"]),
    (T, [*VIDEO_RUN, "--frame-stride", "100"], ["frame_stride 100", "span 301 frames", "none of 2 clips",
                                                 "{tmp}/folder/train", "lower --frame-stride"], "video_short_clips"),
    (T, ["--tokens-per-second", "2"], ["--tokens-per-second", "video runs"]),
    (T, ["--data", "moving-shapes", "--num-frames", "4", "--tokens-per-second", "2"],
     ["moving-shapes", "does not take --tokens-per-second", "no frame rate"]),
    (T, [*VIDEO_RUN, "--tokens-per-second", "0"], ["tokens_per_second", "> 0", "got 0.0"]),
    (T, [*VIDEO_RUN, "--tokens-per-second", "2", "--mixup", "0.8"], ["--mixup blends two clips", "no one time step"]),
    (T, [*VIDEO_RUN, "--tokens-per-second", "2", "--pe", "learned"],
     ["--tokens-per-second", "--pe learned", "Learned indexes a table", "encodings that read it: sincos, rope_axial"],
     "video_short_clips"),
    (T, [*VIDEO_RUN, "--tokens-per-second", "2", "--pe", "none"], ["--pe none has no encoding", "rope_mixed"],
     "video_short_clips"),
    (T, [*VIDEO_RUN, "--batch-size", "3"], ["video-files: cannot decode {tmp}/folder/train/a/c2.mp4",
                                            "truncated", "remove or replace it"], "video_truncated"),  # every clip read
    (T, ["--data", "imagefolder", "--data-dir", "{tmp}/folder", "--batch-size", "2"],
     ["imagefolder: 1 class (cat)", "{tmp}/folder", "at least 2"], "imagefolder_one_class"),
    (T, ["--data", "cifar10", "--data-dir", "{tmp}/cifar", "--download"],
     ["cifar10: --download could not fetch it into '{tmp}/cifar'", "URLError", "name resolution"], "offline"),
    (T, ["--data", "mnist", "--data-dir", "{tmp}/mnist", "--download"],
     ["mnist: --download could not fetch it into '{tmp}/mnist'", "without a network"], "offline"),
]


def damaged_record(tmp, run, text):
    """A run's record (visionpe benchmark --records) that cannot be read as one: never taken for absent."""
    path = tmp / "records" / "vit" / "shapes-position" / "learned" / "s0.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)


SETUPS.update({
    "record_not_json": lambda tmp, run: damaged_record(tmp, run, "{not json"),
    "record_other_format": lambda tmp, run: damaged_record(tmp, run, '{"format": "something else"}'),
})
RECORD_RUN = ["--data", "shapes-position", "--pe", "learned", "--seeds", "0", "--records", "{tmp}/records"]
ROWS += [
    (B, RECORD_RUN, ["record", "records/vit/shapes-position/learned/s0.json", "cannot be read", "remove it"],
     "record_not_json"),
    (B, RECORD_RUN, ["is not a visionpe.bench.accuracy.record/1 record", "'something else'"], "record_other_format"),
]


def image_file(tmp, run, name="image.png", data=None):
    """``tmp/name``: a small PNG, or ``data`` (bytes) under that name."""
    from PIL import Image
    if data is None:
        Image.new("RGB", (20, 12), (200, 40, 90)).save(tmp / name)
    else:
        (tmp / name).write_bytes(data)
    return tmp / name


SETUPS.update({
    "image": image_file,
    "image_nan_last": lambda tmp, run: (nan_weights(run), image_file(tmp, run))[1],
    "image_damaged": lambda tmp, run: image_file(tmp, run, "damaged.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40),
    "image_python_tag_config": lambda tmp, run: (SETUPS["python_tag_config"](tmp, run), image_file(tmp, run))[1],
    "image_text": lambda tmp, run: image_file(tmp, run, "notes.jpg", b"not an image at all"),
})
P = "predict"
ROWS += [
    # -- visionpe predict (issue 43: class names used by a command that prints predictions) ------------------------
    (P, ["{run}"], ["IMAGE", "required"]),
    (P, ["{run}", "{tmp}/missing.jpg"], ["IMAGE '{tmp}/missing.jpg' not found"]),
    (P, ["{run}", "{tmp}"], ["IMAGE '{tmp}' not found", "a directory: give image files"]),
    (P, ["{run}", "{yaml}"], ["cannot read the image {tmp}/damaged.png"], "image_damaged"),
    (P, ["{run}", "{yaml}"], ["cannot read the image {tmp}/notes.jpg", "UnidentifiedImageError"], "image_text"),
    (P, ["{tmp}/nowhere", "{yaml}"], ["{tmp}/nowhere", "not found"], "image"),
    (P, ["{run}", "{yaml}"], ["shapes-position", "rendered", "imagefolder"], "image"),
    (P, ["{run}", "{yaml}", "--top-k", "0"], ["--top-k must be an integer >= 1", "got 0"], "image"),
    (P, ["{run}", "{yaml}", "--top-k", "-3"], ["--top-k must be an integer >= 1", "got -3"], "image"),
    (P, ["{run}", "{yaml}", "--top-k", str(10**18)], [f"--top-k {10**18}", "has 9 classes", "at most"], "image"),
    (P, ["{run}", "{yaml}", "--top-k", "two"], ["--top-k", "'two'"], "image"),
    (P, ["{run}", "{yaml}", "--weights", "middle"], ["--weights", "middle", "best"], "image"),
    (P, ["{run}", "{yaml}", "--weights", "ema"], ["has no EMA weights", "--model-ema"], "image"),
    (P, ["{run}", "{yaml}", "--weights", "last"], ["last.safetensors", "holds 1 NaN or infinite value"],
     "image_nan_last"),
    (P, ["{run}", "{yaml}", "--img-size", "18"], ["--img-size 18", "positive multiple", "patch_size 4"], "image"),
    (P, ["{run}", "{yaml}", "--img-size", "16x2"], ["--img-size 16x2", "positive multiple"], "image"),
    (P, ["{run}", "{yaml}", "--img-size", "0"], ["--img-size", "'0'", "positive"], "image"),
    (P, ["{run}", "{yaml}", "--img-size", "16y16"], ["--img-size", "'16y16'", "HxW"], "image"),
    (P, ["{run}", "{yaml}", "--img-size", str(4 * 10**18)], [f"--img-size {4 * 10**18}", "at most 65536"], "image"),
    (P, ["{run}", "{yaml}"], ["config.yaml", "not plain YAML"], "image_python_tag_config"),
    (P, ["{run}", "{yaml}", "--import", "no_such_module_for_visionpe"], ["cannot import"], "image"),
]


ROWS += [
    # -- issue 43: the fresh probe's cases (visualize: flags of another kind ignored, matplotlib's errors) -------------
    (V, ["--run", "{run}", "--new-grid", "8", "8"], ["--new-grid is for --kind resolution or explore",
                                                      "not --kind similarity"]),
    (V, ["--run", "{run}", "--query", "1", "1"], ["--query is for --kind video", "leave it out"]),
    (V, ["--pe", "sincos", "--head", "1"], ["--head picks a head of a rotary or bias encoding", "sincos",
                                            "tokens encoding"]),
    (V, ["--pe", "sincos", "--dpi", str(10**18)], ["--dpi must be an integer in [1, 1200]", str(10**18)]),
    (V, ["--pe", "sincos", "--out", "{tmp}/x.yaml"], ["--out {tmp}/x.yaml", "a figure is written as one of", "png",
                                                      "svg"]),
    (V, ["--pe", "sincos", "--kind", "explore", "--out", "{tmp}/x.png"], ["--kind explore writes an HTML page"]),
    (V, ["--run", "{run}", "--dim", str(10**18)], ["--dim builds a fresh encoding", "--run/--checkpoint shows the "
                                                    "trained one"]),
    (V, ["--run", "{run}", "--theta", "inf", "--seed", "3"], ["--theta, --seed build a fresh encoding"]),
    # bench-speed: counts and times that never end
    (Q, ["--batch", str(10**18)], ["--batch must be an integer in [1, 4096]", str(10**18)]),
    (Q, ["--repeats", str(10**18)], ["--repeats must be an integer in [1, 1000]"]),
    (Q, ["--slow-repeats", str(10**18)], ["--slow-repeats must be an integer in [1, 1000]"]),
    (Q, ["--scale-repeats", str(10**18)], ["--scale-repeats must be an integer in [1, 1000]"]),
    (Q, ["--min-run-time", "inf"], ["--min-run-time must be a number of seconds in (0, 3600.0]", "got inf"]),
    (Q, ["--threads", str(10**18)], ["--threads must be an integer in [1, 4096]", str(10**18)]),
    # bench-speed: the old spelling of --parts names the new one
    (Q, ["--sections", "rope"], ["--sections is now --parts", "default rope forward"]),
    (Q, ["--sections=rope"], ["--sections is now --parts"]),
    # convert-benchmark: --to checked before the recipe is resolved with it (the message named "pe")
    ("convert", ["--to", "abc", "--report-only", "--out", "{tmp}/c", "--doc", "{tmp}/C.md"],
     ["--to abc", "is not a known encoding"]),
]


def invoke(script, argv):
    if script == T:
        return train_main(TINY + argv)
    return run_script(SCRIPTS[script], argv)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    train_main(TINY + ["--pe", "rope_mixed", "--output", str(out)])
    return out


CASES = [(*row, None) if len(row) == 3 else row for row in ROWS]


@pytest.mark.parametrize("script, args, words, setup", CASES,
                         ids=[f"{c[0]}-{' '.join(c[1])[:40]}-{c[3] or ''}" for c in CASES])
def test_mistake_is_one_line_and_exit_2(script, args, words, setup, finished_run, tmp_path, capsys, monkeypatch):
    _PATCH[:] = [monkeypatch]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    yaml_path = SETUPS[setup](tmp_path, run) if setup else None
    fill = lambda s: (s.replace("{tmp}", str(tmp_path)).replace("{run}", str(run))
                      .replace("{yaml}", str(yaml_path)))
    argv = [fill(a) for a in args]
    if script == T and "--output" not in argv and "--resume" not in argv:
        argv += ["--output", str(tmp_path / "out")]
    if script == V and "--out" not in argv:
        argv += ["--out", str(tmp_path / "x.png")]
    if script == B:
        argv = ["--out", str(tmp_path / "bench"), "--doc", str(tmp_path / "B.md"), *argv]
    with pytest.raises(SystemExit) as exit_info:
        invoke(script, argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"{PROG[script]}: error: "), err
    assert "Traceback" not in err
    missing = [w for w in map(fill, words) if w not in err]
    assert not missing, f"{err!r} lacks {missing}"
    assert not (tmp_path / "pwned").exists()  # YAML tags never run code


def test_table_covers_every_training_flag():
    """Each training setting has at least one row (a new setting needs its bad values here)."""
    flags = {a.split("=")[0] for row in ROWS if row[0] == T for a in row[1] if a.startswith("--")}  # --flag=value too
    flag = lambda key: "--import" if key == "imports" else "--" + key.replace("_", "-")
    missing = [k for k in settings.DEFAULTS if flag(k) not in flags
               and k not in ("download", "overwrite", "progress", "no_aug")]  # booleans: argparse takes only the flag
    assert not missing, missing
    assert sum(row[0] == T for row in ROWS) >= 40


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(UserError, match="depth"):
        train_main(TINY + ["--depth", "-1", "--output", str(tmp_path / "r"), "--debug"])


@pytest.mark.parametrize("command", [T, S, V, B, E, P])
def test_help_groups_flags_and_explains_each(command, capsys):
    parser = parser_of(command)
    undocumented = [a.dest for a in parser._actions if not a.help]
    assert not undocumented
    assert len([g for g in parser._action_groups if g._group_actions]) >= 3
    with pytest.raises(SystemExit) as exit_info:
        invoke(command, ["--help"])
    assert exit_info.value.code == 0
    assert "settings:" in capsys.readouterr().out or command != T


def test_nothing_imports_train_vit():
    """train_vit.py is the entry point users run; the package holds what others need."""
    needles = ("import " + "train_vit", "from " + "train_vit")  # split, so that this file does not match
    offenders = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "__pycache__")]
        for name in files:
            path = Path(folder) / name
            if name.endswith(".py") and any(n in path.read_text() for n in needles):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders

