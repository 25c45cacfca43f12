"""LookHere's extrapolation protocol (Fuller et al. 2024, appendix): one declared parameter of each encoding tuned
per test size on held-out training images, reported next to the untuned numbers (``visionpe sweep --tune``).

    visionpe sweep runs/A runs/B --res 32 64 128 --tune                 # untuned and tuned rows side by side
    visionpe sweep runs/A --res 32 64 --tune --holdout 500

The knob is the one the encoding declares (:attr:`visionpe.encoding.Encoding.knob`): RoPE's ``theta`` (axial
RoPE), its resolution ``scaling`` (RoPE-Mixed, whose learned frequencies no longer read ``theta``), ALiBi's
``slope_scale``, LookHere's ``global_slope``, FIRE's ``threshold_scale``, the learned table's ``interpolation``; in a
combination, the first member that declares one (tokens, then rotary, then bias). A knob is a constructor keyword
that holds no weight, so each candidate is the run's model rebuilt with it and the trained weights loaded strictly.

The held-out images are training images the run never trained on: indices ``n .. n + holdout - 1`` of the training
split, where the run trained on its first ``n`` (``train_samples``; a built-in task renders scenes by index, a real
set takes a fixed random subset whose first ``n`` are the same for any larger count), shown without augmentation
at each test size under the protocol (a built-in task's held-out scenes as its training scenes are drawn: the whole
scene at the size, which is the validation view except under ``crop`` with ``crop_pct`` below 1). At every test size the candidate of the best held-out top-1 is chosen (a tie
keeps the trained value), and only then is it evaluated on the validation set, which the choice never reads. A
run that trained on a whole real set leaves nothing to hold out: train it with ``--train-samples`` below the set's
size. Image runs only.
"""
from __future__ import annotations

from torch.utils.data import Subset

from .. import data as vdata
from ..backbones import encodings_of
from ..cli import UserError, one_line
from ..data.scenes import num_scenes
from ..encoding import Knob, constructor_keywords
from . import evaluation, metrics, models, rundir
from .settings import TrainSettings, check_rendered, transforms_of

FAMILIES = ("tokens", "rotary", "bias")  # the order in which a combination's knob is looked for


def add_arguments(group, *, tune: str, holdout: str) -> None:
    """``--tune`` and ``--holdout N`` on an argparse group, as ``visionpe sweep`` and ``visionpe benchmark`` take them
    (``tune``, ``holdout``: their help texts)."""
    group.add_argument("--tune", action="store_true", help=tune)
    group.add_argument("--holdout", type=int, default=None, metavar="N", help=holdout)


def model_knob(model) -> tuple[object, Knob] | None:
    """``(encoding, knob)`` of the first encoding of ``model`` (tokens, rotary, bias) that declares a knob its
    constructor takes, or None."""
    found = encodings_of(model)
    for family in FAMILIES:
        for enc in found[family][:1]:  # per-block encodings share their settings
            knob = enc.knob
            if knob is not None and knob.name in constructor_keywords(type(enc)):
                return enc, knob
    return None


def candidates(enc, knob: Knob) -> tuple[object, list]:
    """``(trained value, candidate values)``: factors on the trained value for a relative knob, the values
    themselves otherwise; the trained value is always a candidate."""
    trained = getattr(enc, knob.name)
    values = [factor * trained for factor in knob.values] if knob.relative else list(knob.values)
    if trained not in values:
        values.insert(0, trained)
    return trained, values


def training_count(settings: TrainSettings) -> int:
    """How many training images the run trained on: ``train_samples``, a built-in task's default, else an error."""
    if settings.train_samples is not None:
        return int(settings.train_samples)
    if vdata.get_spec(settings.data).synthetic:
        return num_scenes("train", None)
    raise UserError(f"--tune holds out training images the run never saw, but the run trained on the whole "
                    f"{settings.data} training set: train it with --train-samples below the set's size")


def holdout_set(settings: TrainSettings, size, protocol: str, holdout: int) -> Subset:
    """The held-out training images at ``size`` under ``protocol``: indices ``n .. n + holdout - 1`` of the
    training split, without augmentation (``n``: :func:`training_count`)."""
    n = training_count(settings)
    rendered = vdata.takes_option(vdata.get_spec(settings.data), "first")  # a built-in task renders those scenes only
    try:
        ds = vdata.build_dataset(settings.data, "train", size, data_dir=settings.data_dir, download=settings.download,
                                 seed=settings.seed, num_samples=holdout if rendered else n + holdout, augment=False,
                                 transforms=transforms_of(settings, protocol), first=n if rendered else 0)
    except (vdata.DataMissing, ValueError) as err:
        raise UserError(one_line(err)) from None
    if rendered:
        return Subset(ds, range(holdout))
    if len(ds) < n + holdout:
        raise UserError(f"--holdout {holdout}: the {settings.data} training split holds {len(ds)} images, the run "
                        f"trained on {n}; train with fewer --train-samples or give a smaller --holdout")
    return Subset(ds, range(n, n + holdout))


def default_holdout(settings: TrainSettings) -> int:
    """LookHere's 1 % of the training images, at least 100."""
    return max(100, training_count(settings) // 100)


def check_run(run, settings: TrainSettings, holdout: int | None, sizes=()) -> None:
    """The run can be tuned: an image run with training images left over to hold out (checked before any
    evaluation), :func:`check_holdout`."""
    if settings.num_frames:
        raise UserError(f"--tune is for image runs; {run} is a video run ({settings.data})")
    check_holdout(settings, holdout, sizes)


def check_holdout(settings: TrainSettings, holdout: int | None, sizes=()) -> None:
    """``--holdout`` (None: :func:`default_holdout`) fits the run: an integer >= 1, after the images it trained on
    (:func:`training_count`), and for a built-in task its scenes, rendered at the training size and each of ``sizes``,
    within this machine's memory (:func:`~visionpe.train.settings.check_rendered`)."""
    training_count(settings)  # a run on a whole real set leaves nothing to hold out
    if holdout is not None and (isinstance(holdout, bool) or not isinstance(holdout, int) or holdout < 1):
        raise UserError(f"--holdout must be an integer >= 1, got {holdout!r}")
    count = default_holdout(settings) if holdout is None else holdout
    check_rendered("--holdout", count, settings, "held-out training", [settings.img_size, *sizes])


def tune_rows(run, settings: TrainSettings, protocol: str, state, path, keys, wanted, train_key, val_sets: dict,
              eval_kw: dict, holdout: int | None, base_row, log=print) -> list[dict]:
    """``untuned`` and ``tuned`` rows of one run under one protocol at every size of ``wanted`` (``keys``: those
    measured, the training size ``train_key`` among them): the run's own knob value, and the candidate of the best
    held-out top-1 at that size. ``base_row(key)``: the columns every row of that size shares."""
    check_run(run, settings, holdout)
    holdout = default_holdout(settings) if holdout is None else holdout
    found = model_knob(models.build_model(settings))
    if found is None:
        knob, trained, values = None, "", [""]
    else:
        knob, (trained, values) = found[1], candidates(*found)
    held = {k: holdout_set(settings, k, protocol, holdout) for k in keys}

    def model_with(value):
        kwargs = {} if knob is None else {knob.name: value}
        model = models.build_model(settings.replace(pe_kwargs={**settings.pe_kwargs, **kwargs}))
        rundir.load_state(model, state, path)
        return model.to(eval_kw["device"])

    scores = {}  # value -> {key: Evaluation on the held-out images}
    for value in values:
        scores[value] = evaluation.evaluate_resolutions(model_with(value), held, **eval_kw)
    chosen = {k: max(values, key=lambda v: (scores[v][k].acc, v == trained)) for k in keys}
    measured = {"untuned": evaluation.evaluate_resolutions(model_with(trained), val_sets, **eval_kw), "tuned": {}}
    for value in dict.fromkeys(chosen.values()):
        at = [k for k in keys if chosen[k] == value]
        model = model_with(value)
        measured["tuned"].update(evaluation.evaluate_resolutions(model, {k: val_sets[k] for k in at}, **eval_kw))
    rows = []
    for label, picked in (("untuned", {k: trained for k in keys}), ("tuned", chosen)):
        table = metrics.retention_table(measured[label], train_key)
        for k in wanted:
            m = table[k]
            rows.append({**base_row(k), "adaptation": label, "acc": round(m["acc"], 4), "loss": m["loss"],
                         "retention": None if m["retention"] is None else round(m["retention"], 5), "knob": "" if knob is None else knob.name,
                         "knob_value": value_cell(picked[k]), "holdout_acc": round(scores[picked[k]][k].acc, 4)})
        log(f"{run.name:40s} {label:8s} {'' if knob is None else knob.name:15s} " + "  ".join(
            f"{metrics.key_text(k)}px {table[k]['acc']:6.2f} ({value_cell(picked[k])})" for k in wanted))
    return rows


def value_cell(value) -> str:
    """A knob value as the CSV shows it (numbers to 6 significant digits)."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)
