"""Named models keep their size: ``--model NAME`` builds timm's architecture at timm's sizes, the tiny CPU model is
the named preset ``tiny`` (the default only when --model is not given), ``--model-kwargs`` add to the model's own
keywords, and the first line of a run says its parameter count and where its sizes came from."""
import pytest
import timm

from trainutil import TINY, train_main
from visionpe.cli import UserError
from visionpe.train import models, restore, settings

SHAPES = ["--data", "shapes-position"]  # 9 classes, 32 px, patch 4 by default


def built(argv):
    """The settings and the model of ``visionpe train ARGV``, made the way the command makes them."""
    cfg = restore.new_config(settings.parse_args(SHAPES + argv))
    return cfg, models.build_model(cfg)


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def timm_vit(name: str, **kwargs):
    """timm's own model at the run's resolution, patch and classes: the oracle of the sizes."""
    return timm.create_model(name, pretrained=False, img_size=32, patch_size=4, num_classes=9, **kwargs)


def test_a_named_model_builds_timms_vit_small():
    cfg, model = built(["--model", "vit_small_patch16_224"])
    assert count(model) == count(timm_vit("vit_small_patch16_224"))  # ViT-S: 384 wide, 12 blocks, 6 heads
    assert 21e6 < count(model) < 23e6, count(model)
    assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads) == (384, 12, 6)
    assert cfg["model_kwargs"] == {} and cfg["sizes_from"] == "timm's vit_small_patch16_224"


def test_model_kwargs_add_to_the_models_own():
    cfg, model = built(["--model", "vit_small_patch16_224", "--model-kwargs", "mlp_ratio=2"])
    assert count(model) == count(timm_vit("vit_small_patch16_224", mlp_ratio=2))  # still 384 wide, 12 blocks
    assert cfg["sizes_from"] == "timm's vit_small_patch16_224 + --model-kwargs mlp_ratio=2"
    cfg = settings.resolve({"model": "tiny", "model_kwargs": {"mlp_ratio": 2}})
    assert cfg["model_kwargs"] == {**models.PRESETS["tiny"][1], "mlp_ratio": 2}
    # a recipe's keywords, then the command line's, add to those below them
    cfg = settings.resolve({"config": "shapes_tiny", "model_kwargs": {"mlp_ratio": 3}, "depth": 2})
    recipe = settings.read_recipe("shapes_tiny")["model_kwargs"]
    assert cfg["model_kwargs"] == {**recipe, "mlp_ratio": 3, "depth": 2}
    assert cfg["sizes_from"].endswith("+ --model-kwargs mlp_ratio=3 + --depth 2"), cfg["sizes_from"]


def test_the_default_is_the_tiny_preset_and_only_when_no_model_is_named():
    default, preset = settings.resolve({}), settings.resolve({"model": "tiny"})
    model, sizes = models.PRESETS["tiny"]
    assert (default["model"], default["model_kwargs"]) == (preset["model"], preset["model_kwargs"]) == (model, sizes)
    assert default["sizes_from"].startswith("the default tiny") and preset["sizes_from"].startswith("--model tiny")
    named = settings.resolve({"model": model})  # the preset's architecture named: timm's ViT-Ti
    assert named["model_kwargs"] == {}
    assert count(models.build_model(named)) == count(timm_vit(model))
    with pytest.raises(UserError, match="--model tiny.*has none"):  # no pretrained weights of visionpe's sizes
        settings.resolve({"model": "tiny", "pretrained": True})
    assert settings.resolve({"pretrained": True})["model_kwargs"] == {}  # the default's architecture, timm's sizes


def test_the_first_line_says_the_size_and_a_resumed_run_keeps_its_sizes(tmp_path, capsys):
    out = tmp_path / "run"
    train_main(TINY + ["--stop-after", "1", "--output", str(out)])
    first = capsys.readouterr().out.splitlines()[0]
    cfg = restore.load_run(out)
    params = count(models.build_model(cfg))
    assert first.startswith(f"{cfg['model']} pe=learned {params / 1e6:.3f}M params (sizes: the default tiny ("), first
    assert "+ --embed-dim 16 + --depth 1 + --num-heads 2)" in first, first
    train_main(["--resume", str(out), "--no-progress"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{cfg['model']} pe=learned {params / 1e6:.3f}M params (sizes: the run's config.yaml)")
    assert restore.load_run(out)["model_kwargs"] == cfg["model_kwargs"]
