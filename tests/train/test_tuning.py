"""LookHere's protocol (visionpe sweep --tune, visionpe.train.tuning): every declared knob is a constructor keyword
that holds no weight, the held-out images are training images the run never saw and no validation image, the knob
is chosen on them only, and the untuned and tuned rows come side by side."""
import csv

import pytest
import torch

import visionpe
from trainutil import TINY, run_script, train_main
from visionpe import data
from visionpe.bias.alibi import alibi_slopes
from visionpe.cli import UserError
from visionpe.train import evaluation, models, restore, sampling, settings, tuning
from visionpe.train.metrics import Evaluation

KNOBS = {"rope_axial": "theta", "rope_mixed": "scaling", "alibi": "slope_scale", "lookhere": "global_slope",
         "fire": "threshold_scale", "learned": "interpolation"}


@pytest.fixture(scope="module")
def alibi_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "alibi"
    train_main(TINY + ["--pe", "alibi", "--epochs", "1", "--output", str(out)])
    return out


@pytest.mark.parametrize("pe", sorted(KNOBS))
def test_each_encoding_declares_a_knob_that_holds_no_weight(pe):
    model = visionpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=16, patch_size=4, embed_dim=16, depth=1,
                                  num_heads=2, num_classes=3)
    enc, knob = tuning.model_knob(model)
    assert knob.name == KNOBS[pe]
    trained, values = tuning.candidates(enc, knob)
    others = [v for v in values if v != trained]
    other = max(others) if knob.relative else others[0]  # the largest factor acts on every grid (FIRE: past its span)
    tuned = visionpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=16, patch_size=4, embed_dim=16, depth=1,
                                  num_heads=2, num_classes=3, pe_kwargs={knob.name: other})
    tuned.load_state_dict(model.state_dict(), strict=True)  # the same weights load at any value
    assert getattr(tuning.model_knob(tuned)[0], knob.name) == other
    grid = visionpe.Grid((8, 8), prefix=1)  # off the training grid, where every knob acts
    with torch.no_grad():
        change = encoding_output(enc, grid) - encoding_output(tuning.model_knob(tuned)[0], grid)
    assert change.nan_to_num().abs().max() > 1e-3  # (LookHere's masked pairs are -inf in both: nan, read as 0)


def test_a_combination_tunes_its_first_member_with_a_knob_and_sincos_has_none():
    def knob_name(pe):
        model = visionpe.create_model("vit_tiny_patch16_224", pe=pe, img_size=16, patch_size=4, embed_dim=16,
                                      depth=1, num_heads=2, num_classes=3)
        found = tuning.model_knob(model)
        return None if found is None else found[1].name

    assert knob_name("sincos") is None
    assert knob_name("rope_axial+alibi") == "theta"  # rotary before bias
    assert knob_name("learned+rope_mixed") == "interpolation"  # tokens first


def encoding_output(enc, grid):
    """What the encoding gives the attention on ``grid``: the token table, the rotations or the bias."""
    if enc.family == "tokens":
        return enc(torch.zeros(1, grid.num_tokens, 16), grid)
    return enc.eval().rotations(grid) if enc.family == "rotary" else enc.eval()(grid)


def test_alibi_slope_scale_and_fire_threshold_scale_are_factors():
    grid = visionpe.Grid((3, 4))
    base, scaled = visionpe.build("alibi", num_heads=4), visionpe.build("alibi", num_heads=4, slope_scale=1.6)
    torch.testing.assert_close(scaled.slopes, 1.6 * alibi_slopes(4))
    torch.testing.assert_close(scaled(grid), 1.6 * base(grid))
    fire = visionpe.build("fire", num_heads=2, grid_shape=(4, 4), threshold_scale=3.0)
    assert float(fire.threshold().detach()) == pytest.approx(3.0 * float(fire.threshold_init))
    with pytest.raises(ValueError, match="slope_scale"):
        visionpe.build("alibi", num_heads=4, slope_scale=-1.0)


def test_holdout_is_unseen_training_images_and_no_validation_image(alibi_run):
    cfg = restore.load_run(alibi_run)
    n = cfg["train_samples"]
    held = tuning.holdout_set(cfg, 16, "resize", 12)
    train_more = data.build_dataset(cfg["data"], "train", 16, seed=cfg["seed"], num_samples=n + 12)
    assert len(held) == 12
    images = torch.stack([held[i][0] for i in range(12)])
    torch.testing.assert_close(images, torch.stack([train_more[i][0] for i in range(n, n + 12)]))
    seen = torch.stack([train_more[i][0] for i in range(n)])  # the images the run trained on
    val = sampling.dataset(cfg, "val", 16)
    val_images = torch.stack([val[i][0] for i in range(len(val))])
    for other in (seen, val_images):
        same = (images[:, None] - other[None]).flatten(2).abs().amax(-1) == 0  # (12, M)
        assert not same.any()
    with pytest.raises(ValueError, match="first=3"):  # a real set holds out a subset's next images instead
        data.build_dataset("fashion-mnist", "train", 28, first=3)
    with pytest.raises(UserError, match="--train-samples"):
        tuning.training_count(settings.TrainSettings(data="fashion-mnist"))


def test_knob_is_chosen_on_the_holdout_only(alibi_run, tmp_path, monkeypatch):
    """The held-out images prefer slope_scale 2, the validation set 0.5: the tuned rows must take 2 and report its
    validation accuracy (a choice made on the validation set would take 0.5)."""
    def fake_evaluate(model, dataset, **_):
        scale = visionpe.encodings_of(model)["bias"][0].slope_scale
        if isinstance(dataset, torch.utils.data.Subset):  # the held-out images
            return Evaluation(90.0 if scale == 2.0 else 40.0, 1.0, len(dataset))
        return Evaluation(70.0 if scale == 0.5 else 20.0 + scale, 1.0, len(dataset))

    monkeypatch.setattr(evaluation, "evaluate", fake_evaluate)
    rows = run_script("resolution_sweep", [str(alibi_run), "--res", "16", "32", "--tune", "--holdout", "8",
                                           "--out", str(tmp_path)])
    with open(tmp_path / "sweep.csv") as f:
        table = [r for r in csv.DictReader(f) if r["adaptation"] in ("tuned", "untuned")]
    assert len(table) == len(rows) - 2 == 4  # untuned and tuned at both sizes, after the default rows
    for r in table:
        assert r["knob"] == "slope_scale"
        want = ("2", 22.0, 90.0) if r["adaptation"] == "tuned" else ("1", 21.0, 40.0)
        assert (r["knob_value"], float(r["acc"]), float(r["holdout_acc"])) == want


def test_tuned_rows_end_to_end_and_bad_options(alibi_run, tmp_path, capsys):
    rows = run_script("resolution_sweep", [str(alibi_run), "--res", "16", "32", "--tune", "--holdout", "8",
                                           "--out", str(tmp_path)])
    tuned = {(r["adaptation"], r["res"]): r for r in rows if r["adaptation"] in ("tuned", "untuned")}
    assert set(tuned) == {(a, s) for a in ("untuned", "tuned") for s in (16, 32)}
    assert tuned[("untuned", 32)]["acc"] == next(r["acc"] for r in rows if r["adaptation"] == "default"
                                                 and r["res"] == 32)
    cfg = restore.load_run(alibi_run)
    _, values = tuning.candidates(*tuning.model_knob(models.build_model(cfg)))
    assert all(float(r["knob_value"]) in values for r in tuned.values())
    for argv, words in ((["--holdout", "8"], "--tune"), (["--tune", "--holdout", "0"], ">= 1")):
        with pytest.raises(SystemExit) as exc:
            run_script("resolution_sweep", [str(alibi_run), "--res", "16", *argv, "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and words in err and "\n" not in err
