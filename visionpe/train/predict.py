"""Classify image files with a trained run: the top-k classes of each, named by the run's class names.

    visionpe predict runs/A cat.jpg dog.png                  # runs/A's best weights, top 5, at the training size
    visionpe predict runs/A photos/*.jpg --top-k 1 --weights last
    visionpe predict runs/A big.jpg --img-size 64x96         # another size (the run's own resolution adaptation)

Each image is read as the run's data set reads its images (8-bit RGB; one channel for a grayscale set) and shown to
the model through the run's own evaluation transform (timm's ``create_transform`` under the run's ``--eval-protocol``,
``--interpolation``, ``--crop-pct`` and its data set's mean and std), at the training size unless ``--img-size``
says otherwise. A folder run (``imagefolder``) names each output by the class folders it was trained on (``classes``
in its ``config.yaml``); a run that keeps no names (e.g. CIFAR-10) prints output indices (``class 3``). One line per
image: ``IMAGE: NAME PROB%, ...``, most probable first.

Runs on rendered tasks (the synthetic ``shapes-*`` ...) and video runs take no image files: each is one line and
exit status 2, as every other mistake.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import cli
from .. import data as vdata
from ..cli import UserError
from ..data.folders import read_image
from . import evaluation, loop, restore, settings
from .metrics import key_text


def build_parser() -> cli.Parser:
    head, examples = __doc__.split("\n\n")[:2]
    p = cli.Parser(prog="visionpe predict", description=head, epilog=examples + "\n\n" + __doc__.split("\n\n", 2)[2])
    what = p.add_argument_group("what to classify")
    what.add_argument("run", type=Path, metavar="RUN",
                      help="a run directory written by visionpe train (or a .safetensors weights file inside one)")
    what.add_argument("images", type=Path, nargs="+", metavar="IMAGE", help="image files (any format Pillow reads)")
    how = p.add_argument_group("how")
    how.add_argument("--top-k", type=int, metavar="K",
                     help="classes printed per image, an integer from 1 to the run's class count (default: 5, or "
                          "every class of a run with fewer)")
    how.add_argument("--weights", default="best", choices=["best", "last", "ema"],
                     help="which weights of the run: best, last or ema (the EMA weights of a --model-ema run) "
                          "(default: best)")
    how.add_argument("--img-size", type=loop.parse_size, metavar="PX|HxW",
                     help="the size each image is shown at, PX or HxW, each side a positive multiple of the run's "
                          "patch_size, at most 65536 patches (default: the run's img_size)")
    misc = p.add_argument_group("misc")
    cli.add_import(p, misc)
    p.add_debug(misc)
    return p


def readable(name: str) -> bool:
    """Whether the data set ``name`` is of image files shown through timm's transforms (not rendered, not video)."""
    spec = vdata.get_spec(name)
    return spec.kind == "image" and not spec.synthetic and spec.takes_transforms


def check_run(run: Path, cfg: dict) -> vdata.DatasetSpec:
    """The data set spec of a run that classifies image files (:func:`readable`); a :class:`UserError` naming the
    run and its data otherwise."""
    if cfg.get("num_frames") or vdata.get_spec(cfg["data"]).kind != "image":
        raise UserError(f"{run} is a video run (--data {cfg['data']}): visionpe predict classifies images")
    if not readable(cfg["data"]):
        raise UserError(f"{run} was trained on --data {cfg['data']}, whose images are rendered, not read from files "
                        "through timm's transforms: visionpe predict classifies image files with runs trained on "
                        f"them ({', '.join(n for n in vdata.names(kind='image') if readable(n))})")
    return vdata.get_spec(cfg["data"])


def check_size(run: Path, cfg: dict, size) -> None:
    """``--img-size`` fits the run: each side a positive multiple of its patch_size, at most
    :data:`~visionpe.train.settings.MAX_PATCHES` patches."""
    patch = cfg["patch_size"]
    if any(s < patch or s % patch for s in ((size,) if isinstance(size, int) else size)):
        raise UserError(f"--img-size {key_text(size)}: each side must be a positive multiple of {run}'s patch_size "
                        f"{patch}")
    settings.check_patches("--img-size", size, patch)


def labels(cfg: dict) -> list[str]:
    """The name of each output: the run's class names, else ``class K``."""
    return list(cfg.get("classes") or [f"class {k}" for k in range(cfg["num_classes"])])


def read(path: Path):
    """The image file ``path`` as the run's data reads it: 8-bit RGB (:func:`visionpe.data.folders.read_image`)."""
    if not path.is_file():
        raise UserError(f"IMAGE {str(path)!r} not found" + (" (a directory: give image files)" if path.is_dir() else ""))
    try:
        return read_image(str(path))
    except vdata.DataDamaged as err:
        raise UserError(cli.one_line(err)) from None


def predict(model: torch.nn.Module, x: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most probable outputs of ``model`` for one image ``x`` ``(C, H, W)``: ``(indices, probabilities)``,
    most probable first."""
    with torch.no_grad():
        probs = evaluation.logits_of(model, x[None]).float().softmax(-1)[0]
    top = probs.topk(k)
    return top.indices.tolist(), top.values.tolist()


def main(argv) -> list[dict]:
    """``visionpe predict ARGV``: prints a line per image and returns ``[{"image", "top": [(name, index, p)]}]``;
    a user mistake is a :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    cli.import_user_code(args.imports)
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be an integer >= 1, got {args.top_k}")
    images = [read(path) for path in args.images]  # every file read before anything is printed
    model, cfg = restore.load_model(args.run, args.weights)
    k = min(5, cfg["num_classes"]) if args.top_k is None else args.top_k
    if k > cfg["num_classes"]:
        raise UserError(f"--top-k {k}: {args.run} has {cfg['num_classes']} classes (give at most that)")
    size = cfg["img_size"] if args.img_size is None else args.img_size
    check_size(args.run, cfg, size)
    spec = check_run(args.run, cfg)
    transform = settings.transforms_of(cfg).eval(size, spec.mean, spec.std)
    names, model = labels(cfg), model.float().cpu().eval()
    out = []
    for path, image in zip(args.images, images):
        x = transform(image.convert("L") if spec.in_chans == 1 else image)  # a grayscale set's one channel
        indices, probs = predict(model, x, k)
        top = [(names[i], i, p) for i, p in zip(indices, probs)]
        print(f"{path}: " + ", ".join(f"{name} {100 * p:.1f}%" for name, _, p in top), flush=True)
        out.append({"image": path, "top": top})
    return out
