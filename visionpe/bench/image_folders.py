"""Write a small image folder (DIR/train/<class>/*.jpg, DIR/val/<class>/*.jpg) to measure training recipes on:
nothing is downloaded, and the same arguments write the same files.

  objects  photo-like procedural scenes: one object of a class (circle, triangle, square, star, cross, ring,
           crescent, arrow) at a random scale (0.4 to 0.96 of the image's shorter side across), place and
           rotation, in its class's typical look (its own hue, give or take a little more than half the distance
           to the next class's, and 60 % of the time its own procedural texture: value noise, stripes, checks,
           dots, wood grain, gradient), standing apart in mean colour from the textured background it covers,
           among clutter and distractor blobs and strokes of any colour and texture (some over the object), under
           a lighting field, a colour cast, sensor noise and sometimes a blur. The label is the object's: a crop
           without it has lost it.
  photos   crops of real photographs: one class per photograph of --src (its file name), e.g. the 12 nature
           photos of Debian's mate-backgrounds package (apt-get install mate-backgrounds; --src
           /usr/share/backgrounds/mate/nature). Each photo is split across its longer side into a training part
           and a held-out part (HELD_OUT of the side, at the start or the end, drawn per photo; a gap between them),
           so no val crop shares a pixel with a training crop: val asks which scene an unseen part comes from.
           Crops are of a random scale (SCALE of the photo's shorter side) and aspect ratio.
  fashion-mnist  real images: Fashion-MNIST's 28x28 grayscale PNGs as they are, train/ from its training split,
           val/ from its test split, each class's images drawn by --seed (Debian's dataset-fashion-mnist idx files in
           /usr/share/datasets/fashion-mnist/, read by visionpe's loader; --sides and --src do not apply).

objects and photos write JPEGs of random sizes (the longer side 48-256 px, aspect ratio 0.5-2, either
orientation). Each image is drawn from NumPy's generator seeded by (seed, split, class, index), so a file does not
depend on the others.

  visionpe make-image-folders objects --out /tmp/folders/objects --seed 0
  visionpe make-image-folders photos --src /usr/share/backgrounds/mate/nature --out /tmp/folders/photos
  visionpe make-image-folders fashion-mnist --out /tmp/folders/fashion

The small-folder benchmark (``visionpe small-folder-benchmark``) writes the first two itself where they are missing.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .. import cli
from ..cli import UserError

FOLDER_KINDS = ("objects", "photos")  # what write_folder writes
OBJECTS = ("circle", "triangle", "square", "star", "cross", "ring", "crescent", "arrow")
TEXTURES = ("noise", "stripes", "checks", "dots", "wood", "gradient")
SIDES = (48, 256)  # the longer side of a written image, in pixels
ASPECT = (0.5, 2.0)  # width / height of a written image
SCALE = (0.1, 0.45)  # a photo crop's side (geometric mean of width and height) over the photo's shorter side
HELD_OUT, GAP = 0.3, 0.03  # the photo's held-out part and the gap before it, as fractions of its longer side
SUPERSAMPLE = 4
HUE_SPREAD = 0.1  # an object's hue around its class's (classes 1 / 8 of the hue circle apart)
MIN_CONTRAST = 0.6  # an object's fill and the background under it differ by this much (L1 of mean RGB in [0, 1])
SPLIT_IDS = {"train": 0, "val": 1, "layout": 2}  # layout: which end of a photo is held out
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")
PER_CLASS = {"objects": (375, 75), "photos": (300, 50), "fashion-mnist": (300, 100)}  # (train, val) per class
FASHION_CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")


def image_rng(seed: int, split: str, label: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLIT_IDS[split], label, index])


def random_size(rng, sides=SIDES, aspect=ASPECT) -> tuple[int, int]:
    """``(height, width)``: the longer side log-uniform in ``sides``, width / height log-uniform in ``aspect``."""
    longer = math.exp(rng.uniform(*np.log(sides)))
    ratio = math.exp(rng.uniform(*np.log(aspect)))
    height, width = (longer / ratio, longer) if ratio >= 1 else (longer, longer * ratio)
    return max(8, round(height)), max(8, round(width))


# -- procedural textures: (H, W, 3) float arrays in [0, 1] ------------------------------------------------------
def random_colour(rng, hue: float | None = None) -> np.ndarray:
    """An RGB colour of ``hue`` (default: random) and random saturation and value (HSV cone), floats in [0, 1]."""
    hue = rng.uniform() if hue is None else hue % 1.0
    sat, val = rng.uniform(0.1, 1.0), rng.uniform(0.15, 1.0)
    k = (np.array([5.0, 3.0, 1.0]) + hue * 6) % 6
    return val - val * sat * np.clip(np.minimum(k, 4 - k), 0, 1)


def value_noise(rng, height: int, width: int, octaves: int = 4) -> np.ndarray:
    """Fractal value noise in [0, 1] (H, W): random grids of doubling resolution, bicubic-upsampled and summed."""
    total = np.zeros((height, width))
    cells = int(rng.integers(2, 5))
    for octave in range(octaves):
        grid = rng.uniform(0, 1, (cells << octave,) * 2).astype(np.float32)
        total += np.asarray(Image.fromarray(grid, "F").resize((width, height), Image.BICUBIC)) * 0.5 ** octave
    total -= total.min()
    return total / max(total.max(), 1e-6)


def texture(rng, height: int, width: int, strength: float = 1.0, kind: str | None = None,
            hue: float | None = None) -> np.ndarray:
    """A procedural texture of ``kind`` (one of :data:`TEXTURES`; default random) from a colour towards another (all
    the way at ``strength`` 1), both of random hue or within 0.05 of ``hue``, (H, W, 3)."""
    kind = TEXTURES[rng.integers(len(TEXTURES))] if kind is None else kind
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    angle = rng.uniform(0, math.pi)
    u, v = x * math.cos(angle) + y * math.sin(angle), -x * math.sin(angle) + y * math.cos(angle)
    freq = rng.uniform(2, 10)  # periods across the longer side
    if kind == "noise":
        t = value_noise(rng, height, width)
    elif kind == "stripes":
        t = 0.5 + 0.5 * np.sin(2 * math.pi * freq * u + rng.uniform(0, 2 * math.pi))
    elif kind == "checks":
        t = ((np.floor(freq * u) + np.floor(freq * v)) % 2).astype(float)
    elif kind == "dots":
        t = (np.hypot((freq * u) % 1 - 0.5, (freq * v) % 1 - 0.5) < rng.uniform(0.15, 0.4)).astype(float)
    elif kind == "wood":
        t = 0.5 + 0.5 * np.sin(2 * math.pi * freq * u + rng.uniform(2, 8) * value_noise(rng, height, width))
    else:  # gradient
        t = np.clip(u * rng.uniform(0.7, 1.5), 0, 1)
    a, b = (random_colour(rng, None if hue is None else hue + rng.uniform(-0.05, 0.05)) for _ in range(2))
    return a + (b - a) * strength * t[..., None]


# -- object masks -----------------------------------------------------------------------------------------------
def regular(points: int, radius: float, turn: float, inner: float | None = None) -> list[tuple[float, float]]:
    """Vertices of a regular polygon (or a star with ``inner`` radius between the tips) around the origin."""
    count = points * (2 if inner else 1)
    return [((inner if inner and k % 2 else radius) * math.cos(turn + 2 * math.pi * k / count),
             (inner if inner and k % 2 else radius) * math.sin(turn + 2 * math.pi * k / count)) for k in range(count)]


def rotated(points, turn: float):
    c, s = math.cos(turn), math.sin(turn)
    return [(x * c - y * s, x * s + y * c) for x, y in points]


def object_mask(kind: str, height: int, width: int, cx: float, cy: float, radius: float, turn: float,
                rng) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] (H, W) of an object of ``kind`` centred at ``(cx, cy)`` pixels whose
    circumscribed radius is ``radius`` pixels, rotated by ``turn`` radians (drawn at 4x, box-filtered)."""
    s = SUPERSAMPLE
    canvas = Image.new("L", (width * s, height * s))
    draw = ImageDraw.Draw(canvas)

    def polygon(points, fill=255):
        draw.polygon([((cx + x) * s, (cy + y) * s) for x, y in points], fill=fill)

    def disc(dx, dy, r, fill=255):
        draw.ellipse([(cx + dx - r) * s, (cy + dy - r) * s, (cx + dx + r) * s, (cy + dy + r) * s], fill=fill)

    r = radius
    if kind == "circle":
        disc(0, 0, r)
    elif kind in ("triangle", "square", "pentagon", "hexagon"):
        polygon(regular({"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}[kind], r, turn))
    elif kind == "star":
        polygon(regular(5, r, turn, inner=r * rng.uniform(0.38, 0.5)))
    elif kind == "cross":
        a = r * rng.uniform(0.25, 0.35)  # half the arm width
        b = math.sqrt(r * r - a * a)  # half the arm length: the arm's corners on the circumscribed circle
        polygon(rotated([(a, a), (a, b), (-a, b), (-a, a), (-b, a), (-b, -a), (-a, -a), (-a, -b), (a, -b), (a, -a),
                         (b, -a), (b, a)], turn))
    elif kind == "ring":
        disc(0, 0, r)
        disc(0, 0, r * rng.uniform(0.45, 0.65), fill=0)
    elif kind == "crescent":
        disc(0, 0, r)
        shift = r * rng.uniform(0.35, 0.55)
        disc(shift * math.cos(turn), shift * math.sin(turn), r * rng.uniform(0.8, 0.95), fill=0)
    elif kind == "arrow":
        w, head = r * rng.uniform(0.18, 0.26), r * rng.uniform(0.45, 0.6)
        polygon(rotated([(-r, -w), (r - head, -w), (r - head, -2.2 * w), (r, 0), (r - head, 2.2 * w),
                         (r - head, w), (-r, w)], turn))
    else:
        raise ValueError(f"object kind {kind!r} is not one of {', '.join(OBJECTS)}")
    return np.asarray(canvas.resize((width, height), Image.BOX), dtype=np.float64) / 255


def blob_mask(rng, height: int, width: int, cx: float, cy: float, radius: float) -> np.ndarray:
    """A distractor: an irregular star-convex blob (noisy radius) or a thick stroke, anti-aliased (H, W)."""
    s = SUPERSAMPLE
    canvas = Image.new("L", (width * s, height * s))
    draw = ImageDraw.Draw(canvas)
    if rng.uniform() < 0.6:
        count = int(rng.integers(7, 14))
        radii = radius * rng.uniform(0.5, 1.0, count)
        turns = np.sort(rng.uniform(0, 2 * math.pi, count))
        draw.polygon([((cx + r * math.cos(t)) * s, (cy + r * math.sin(t)) * s) for r, t in zip(radii, turns)],
                     fill=255)
    else:
        points = [(cx + radius * rng.uniform(-1, 1), cy + radius * rng.uniform(-1, 1)) for _ in range(3)]
        draw.line([(x * s, y * s) for x, y in points], fill=255, width=max(1, int(radius * rng.uniform(0.1, 0.3) * s)))
    return np.asarray(canvas.resize((width, height), Image.BOX), dtype=np.float64) / 255


def lighting(rng, height: int, width: int) -> np.ndarray:
    """A smooth multiplicative light field (H, W, 1): a linear ramp times a soft spot, around a random level."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = 1 + rng.uniform(0, 0.6) * ((x * math.cos(angle) + y * math.sin(angle)) - 0.5)
    sy, sx = rng.uniform(0, height / max(height, width)), rng.uniform(0, width / max(height, width))
    spot = 1 + rng.uniform(0, 0.5) * np.exp(-((x - sx) ** 2 + (y - sy) ** 2) / (2 * rng.uniform(0.1, 0.4) ** 2))
    return (rng.uniform(0.6, 1.2) * ramp * spot)[..., None]


def compose(base: np.ndarray, layer: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return base * (1 - mask[..., None]) + layer * mask[..., None]


def class_look(rng, label: int) -> tuple[str, float]:
    """The texture kind and hue of an object of class ``label``, as an object category has a typical look: its own
    texture (``TEXTURES[label % 6]``) 60 % of the time, else any; a hue within :data:`HUE_SPREAD` of its own
    (``label / len(OBJECTS)``), so neighbouring classes share hues. Backgrounds, clutter and distractors take any."""
    kind = TEXTURES[label % len(TEXTURES)] if rng.uniform() < 0.6 else TEXTURES[rng.integers(len(TEXTURES))]
    return kind, label / len(OBJECTS) + rng.uniform(-HUE_SPREAD, HUE_SPREAD)


def object_image(rng, label: int, sides=SIDES) -> Image.Image:
    """One scene of class ``OBJECTS[label]`` (an RGB PIL image of :func:`random_size`): the class's shape, in its
    typical look (:func:`class_look`)."""
    height, width = random_size(rng, sides)
    short = min(height, width)
    img = texture(rng, height, width, strength=rng.uniform(0.3, 1.0))

    def place(radius):  # a centre that keeps a shape of this radius inside the image
        margin = radius
        return rng.uniform(margin, max(margin, width - margin)), rng.uniform(margin, max(margin, height - margin))

    for _ in range(int(rng.integers(2, 9))):  # background clutter: small textured blobs and strokes
        radius = short * rng.uniform(0.03, 0.08)
        img = compose(img, texture(rng, height, width), blob_mask(rng, height, width, *place(radius), radius)
                      * rng.uniform(0.5, 1))
    radius = short * rng.uniform(0.2, 0.48)  # the object: 0.4 to 0.96 of the shorter side across
    cx, cy = place(radius)
    mask = object_mask(OBJECTS[label], height, width, cx, cy, radius, rng.uniform(0, 2 * math.pi), rng)
    if rng.uniform() < 0.4:  # a soft drop shadow
        shadow = np.asarray(Image.fromarray((mask * 255).astype(np.uint8)).filter(
            ImageFilter.GaussianBlur(max(1.0, radius * 0.15))), dtype=np.float64) / 255
        offset = (int(radius * rng.uniform(-0.15, 0.15)), int(radius * rng.uniform(-0.15, 0.15)))
        img = compose(img, img * 0.45, np.roll(shadow, offset, axis=(0, 1)) * 0.8)
    inside = mask > 0.5
    for _ in range(8):  # a fill that stands out from what it covers (mean colour distance), else the last drawn
        fill = texture(rng, height, width, rng.uniform(0.2, 0.6), *class_look(rng, label))
        if not inside.any() or np.abs(fill[inside].mean(0) - img[inside].mean(0)).sum() > MIN_CONTRAST:
            break
    img = compose(img, fill, mask)
    for _ in range(int(rng.integers(0, 3))):  # distractors, smaller than the object, some over it
        small = radius * rng.uniform(0.15, 0.4)
        img = compose(img, texture(rng, height, width), blob_mask(rng, height, width, *place(small), small))
    cast = rng.uniform(0.8, 1.2, 3)
    img = img * lighting(rng, height, width) * cast + rng.normal(0, rng.uniform(0, 0.05), img.shape)
    out = Image.fromarray((np.clip(img, 0, 1) * 255).round().astype(np.uint8), "RGB")
    return out.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2))) if rng.uniform() < 0.25 else out


# -- photo crops ----------------------------------------------------------------------------------------------
def photo_parts(size: tuple[int, int], held_out_at_start: bool) -> dict[str, tuple[int, int, int, int]]:
    """The training and the held-out box ``(left, top, right, bottom)`` of a photo of ``size`` ``(W, H)``: split
    across its longer side, the held-out part :data:`HELD_OUT` of it at the start or the end, :data:`GAP` between."""
    width, height = size
    long = max(width, height)
    cut, gap = round(long * HELD_OUT), round(long * GAP)
    spans = ({"val": (0, cut), "train": (cut + gap, long)} if held_out_at_start else
             {"train": (0, long - cut - gap), "val": (long - cut, long)})
    return {split: (a, 0, b, height) if width >= height else (0, a, width, b) for split, (a, b) in spans.items()}


def photo_crop(rng, photo: Image.Image, box: tuple[int, int, int, int], sides=SIDES) -> Image.Image:
    """A crop inside ``box`` of ``photo``: side :data:`SCALE` of the photo's shorter side, width / height in
    :data:`ASPECT`, at a random place; then resized (bicubic, antialiased) to a random size of that aspect ratio. The
    crop is cut out before it is resized, so the resampling filter reads no pixel outside it."""
    left, top, right, bottom = box
    short = min(photo.size)
    for _ in range(100):
        side = short * math.exp(rng.uniform(*np.log(SCALE)))
        ratio = math.exp(rng.uniform(*np.log(ASPECT)))
        w, h = round(side * math.sqrt(ratio)), round(side / math.sqrt(ratio))
        if w <= right - left and h <= bottom - top:
            break
    else:
        raise ValueError(f"no crop of scale {SCALE} fits the part {box} of a {photo.size[0]}x{photo.size[1]} photo")
    x, y = int(rng.integers(left, right - w + 1)), int(rng.integers(top, bottom - h + 1))
    longer = math.exp(rng.uniform(*np.log(sides)))
    out = (round(longer), max(8, round(longer * h / w))) if w >= h else (max(8, round(longer * w / h)), round(longer))
    return photo.crop((x, y, x + w, y + h)).resize(out, Image.BICUBIC, reducing_gap=2.0)  # no pixel outside read


def photo_sources(src: Path) -> list[Path]:
    if not src.is_dir():
        raise UserError(f"--src {src} is not a folder (photos: a folder of photographs, e.g. "
                        "/usr/share/backgrounds/mate/nature after apt-get install mate-backgrounds)")
    files = sorted(p for p in src.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    if len(files) < 2:
        raise UserError(f"--src {src} holds {len(files)} photographs (*.jpg, *.jpeg, *.png); photos needs at least 2, "
                        "one class each")
    return files


# -- the folder ---------------------------------------------------------------------------------------------------
def write_folder(kind: str, out: Path, seed: int = 0, train_per_class: int = 375, val_per_class: int = 75,
                 src: Path | None = None, sides=SIDES, quality: tuple[int, int] = (75, 95)) -> dict[str, int]:
    """Write the folder of ``kind`` (``objects`` or ``photos``) to ``out``; returns the images written per split."""
    if kind == "objects":
        classes = list(OBJECTS)
        draw = lambda rng, label, split: object_image(rng, label, sides)  # noqa: E731
    elif kind == "photos":
        if src is None:
            raise ValueError("photos needs src, a folder of photographs (one class each)")
        files = photo_sources(Path(src))
        classes = [p.stem.lower() for p in files]
        photos = [Image.open(p).convert("RGB") for p in files]
        parts = [photo_parts(im.size, bool(image_rng(seed, "layout", label, 0).integers(2)))
                 for label, im in enumerate(photos)]
        draw = lambda rng, label, split: photo_crop(rng, photos[label], parts[label][split], sides)  # noqa: E731
    else:
        raise UserError(f"kind {kind!r} is not one of objects, photos")
    written = {}
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label, name in enumerate(classes):
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                rng = image_rng(seed, split, label, index)
                image = draw(rng, label, split)
                image.save(folder / f"{index:05d}.jpg", quality=int(rng.integers(quality[0], quality[1] + 1)))
        written[split] = count * len(classes)
    return written


def write_fashion_mnist(out: Path, seed: int = 0, train_per_class: int = 300,
                        val_per_class: int = 100) -> dict[str, int]:
    """Write Fashion-MNIST's images (train/ from its training split, val/ from its test split) to ``out`` as PNGs,
    ``*_per_class`` of each class drawn without replacement by ``seed``; returns the images written per split."""
    from visionpe.data.torchvision_sets import _native

    picks = {}
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        images, labels = _native("fashion-mnist", split, None, False)  # uint8 (N, 1, 28, 28), int64 (N,)
        order = np.random.default_rng([seed, SPLIT_IDS[split]]).permutation(len(labels))
        picks[split] = images, [order[labels.numpy()[order] == label][:count] for label in range(len(FASHION_CLASSES))]
        if min(map(len, picks[split][1])) < count:
            raise UserError(f"--{split}-per-class {count}: Fashion-MNIST's {split} split holds "
                            f"{min(map(len, picks[split][1]))} images of a class")
    for split, (images, per_class) in picks.items():
        for name, picked in zip(FASHION_CLASSES, per_class):
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index, i in enumerate(picked):
                Image.fromarray(images[i, 0].numpy(), "L").save(folder / f"{index:05d}.png")
    return {split: len(FASHION_CLASSES) * len(per_class[0]) for split, (_, per_class) in picks.items()}


def build_parser() -> cli.Parser:
    head, _, tail = __doc__.partition("\n\n")
    p = cli.Parser(prog="visionpe make-image-folders", description=head, epilog=tail)
    p.add_argument("kind", choices=(*FOLDER_KINDS, "fashion-mnist"),
                   help="objects: procedural scenes; photos: crops of --src; fashion-mnist: real images")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the folder to write (train/ and val/)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of every image (default 0)")
    p.add_argument("--src", type=Path, metavar="DIR", help="photos: the folder of photographs, one class each")
    (train, val), (photo_train, photo_val) = PER_CLASS["objects"], PER_CLASS["photos"]
    p.add_argument("--train-per-class", type=int, metavar="N",
                   help=f"training images per class (default: objects {train}, photos {photo_train}, fashion-mnist "
                        f"{PER_CLASS['fashion-mnist'][0]})")
    p.add_argument("--val-per-class", type=int, metavar="N",
                   help=f"validation images per class (default: objects {val}, photos {photo_val}, fashion-mnist "
                        f"{PER_CLASS['fashion-mnist'][1]})")
    p.add_argument("--sides", type=int, nargs=2, default=list(SIDES), metavar=("MIN", "MAX"),
                   help=f"range of an image's longer side in pixels (default {SIDES[0]} {SIDES[1]})")
    p.add_debug()
    return p


def main(argv) -> dict[str, int]:
    """``visionpe make-image-folders ARGV``: the images written per split; a user mistake is a
    :class:`~visionpe.cli.UserError`."""
    args = build_parser().parse_args(argv)
    if args.kind == "photos" and args.src is None:
        raise UserError("photos needs --src DIR, a folder of photographs (e.g. /usr/share/backgrounds/mate/nature "
                        "after apt-get install mate-backgrounds)")
    for i, name in enumerate(("train_per_class", "val_per_class")):
        if getattr(args, name) is None:
            setattr(args, name, PER_CLASS[args.kind][i])
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        raise UserError(f"--seed must be an integer >= 0, got {args.seed}")
    if not 8 <= args.sides[0] <= args.sides[1]:
        raise UserError(f"--sides must be two integers 8 <= MIN <= MAX, got {args.sides[0]} {args.sides[1]}")
    if args.out.exists() and any(args.out.iterdir()):
        raise UserError(f"--out {args.out} is not empty; give a new folder")
    if args.kind == "fashion-mnist":
        written = write_fashion_mnist(args.out, args.seed, args.train_per_class, args.val_per_class)
    else:
        written = write_folder(args.kind, args.out, args.seed, args.train_per_class, args.val_per_class, args.src,
                               tuple(args.sides))
    print(f"wrote {written['train']} training and {written['val']} validation images to {args.out}")
    return written

