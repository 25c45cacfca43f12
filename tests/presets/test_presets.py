"""The catalogue and its ways in: ``vpe.presets()``, ``vpe.preset(name)``, ``pe="preset:NAME"`` in every backbone
visionpe patches and on the command line, the token orders, and the errors."""
import math
import re
from pathlib import Path

import pytest
import torch
from trainutil import TINY, train_main

import visionpe as vpe
from visionpe import Grid, ModelContext
from visionpe.backbones import parse_pe
from visionpe.presets import PRESETS, attention_windows, get_preset, merge_windows, prefix_last
from visionpe.registry import ENCODINGS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "presets.md"
IMAGE = [name for name, p in PRESETS.items() if all(c.get("ndim", 2) == 2 for _, c in p.encodings.values())]
VIDEO = [name for name in PRESETS if name not in IMAGE]
REQUIRED = ("siglip2", "qwen2_5_vl", "qwen3_vl", "perception_encoder", "aimv2", "dinov3", "vjepa2", "pixtral",
            "llama4", "wan", "cosmos", "moonvit", "sam3", "glm4v")


def test_catalogue_lists_every_preset_with_one_line():
    listed = vpe.presets()
    assert set(REQUIRED) <= set(listed) and len(listed) >= 15
    for name, line in listed.items():
        record = get_preset(name)
        assert line == f"{record.model}: {record.summary}" and "\n" not in line
        for family, (encoding, _) in record.encodings.items():  # compositions of registered encodings only
            assert ENCODINGS[encoding].family == family


def test_docs_table_has_every_preset_and_its_reference():
    text = DOCS.read_text().split("## The presets", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+)$", text, flags=re.M))
    assert set(rows) == set(PRESETS), "docs/presets.md's table must have one row per preset"
    for name, row in rows.items():
        assert all(f"`{encoding}`" in row for encoding in get_preset(name).composition.split("+")), name


def test_docs_code_runs():
    """The guide's Python blocks run as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), {})


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_builds_for_the_published_sizes(name):
    record = get_preset(name)
    scheme = vpe.preset(name)
    assert set(scheme.encodings) == set(record.encodings)
    for family, (encoding, conventions) in record.encodings.items():
        module = scheme.encodings[family]
        assert type(module) is ENCODINGS[encoding] and module.family == family
    if scheme.rotary is not None:
        assert scheme.rotary.head_dim == record.native.get("head_dim", record.native["dim"] // record.native[
            "num_heads"])


def test_overrides_replace_conventions_and_sizes():
    scheme = vpe.preset("qwen3_vl", dim=48, num_heads=2, theta=100.0, interpolation="bicubic")
    assert scheme.rotary.head_dim == 24 and scheme.rotary.theta == 100.0
    assert scheme.tokens.interpolation == "bicubic" and scheme.tokens.align_corners  # the rest stays
    assert vpe.preset("siglip2", grid_shape=(8, 8)).tokens.grid_shape == (8, 8)
    with pytest.raises(ValueError, match=r"takes no keyword 'window_size'"):
        vpe.preset("qwen3_vl", window_size=7)
    with pytest.raises(ValueError, match=r"preset 'qwen4' is not known; presets: siglip2, "):
        vpe.preset("qwen4")


def test_a_backbone_builds_what_the_preset_builds():
    """``pe="preset:NAME"`` in a backbone and ``Preset.build`` for the backbone's context are the same encodings."""
    for name in IMAGE:
        model = vpe.create_model("vit_tiny_patch16_224", pe=f"preset:{name}", img_size=32, patch_size=8,
                                 embed_dim=32, num_heads=2, depth=2, num_classes=3)
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        context = ModelContext((4, 4), 32, 2, 16, num_prefix_tokens=prefix, depth=2)
        scheme = get_preset(name).build(context)
        found = vpe.encodings_of(model)
        for family, module in scheme.encodings.items():
            assert repr(found[family][0]) == repr(module), (name, family)
        assert model.pe == f"preset:{name}"


@pytest.mark.parametrize("name", IMAGE)
def test_image_presets_run_in_a_vit_at_any_size(name):
    model = vpe.create_model("vit_tiny_patch16_224", pe=f"preset:{name}", img_size=32, patch_size=8, embed_dim=32,
                             num_heads=2, depth=1, num_classes=3).eval()
    for size in [(32, 32), (48, 24)]:
        out = model(torch.randn(2, 3, *size))
        assert out.shape == (2, 3) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", VIDEO)
def test_video_presets_run_in_a_video_vit(name):
    model = vpe.create_video_model("vit_tiny_patch16_224", pe=f"preset:{name}", num_frames=4, img_size=32,
                                   tubelet_size=(2, 8, 8), embed_dim=32, num_heads=2, depth=1, num_classes=3).eval()
    rotary = vpe.encodings_of(model)["rotary"][0]
    # the preset's own split of the 8 pairs, not the video backbone's default (video_sections: (2, 3, 3))
    expected = {"wan": ((4, 2, 2), 0), "cosmos": ((4, 2, 2), 0), "vjepa2": ((2, 2, 2), 2)}[name]
    assert (rotary.sections, rotary.unrotated_pairs) == expected
    out = model(torch.randn(1, 3, 6, 32, 40))
    assert out.shape == (1, 3) and torch.isfinite(out).all()


def test_apply_keywords_and_mistakes():
    import timm
    model = vpe.apply(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, num_heads=2,
                                        depth=1, num_classes=3), pe="preset:dinov3", theta=50.0)
    rotary = vpe.encodings_of(model)["rotary"][0]
    assert rotary.theta == 50.0 and rotary.coordinates.normalized  # the user's keyword over the convention
    assert parse_pe("preset:pixtral") == {"rotary": "rope_axial"}
    with pytest.raises(ValueError, match="preset 'nope' is not known"):
        parse_pe("preset:nope")
    with pytest.raises(ValueError, match="combines with nothing"):
        parse_pe("preset:siglip2+alibi")
    with pytest.raises(ValueError, match=r"ndim=3 is for 3-axis grids, but the model's grid \(4, 4\) has 2 axes"):
        vpe.create_model("vit_tiny_patch16_224", pe="preset:wan", img_size=32, patch_size=8, embed_dim=32,
                         num_heads=2, depth=1)


def test_cli_trains_a_preset(tmp_path, capsys):
    summary = train_main(TINY + ["--pe", "preset:qwen3_vl", "--epochs", "1", "--output", str(tmp_path / "run")])
    assert summary is not None and (tmp_path / "run" / "config.yaml").exists()
    with pytest.raises(SystemExit) as exc:
        train_main(TINY + ["--pe", "preset:qwen9", "--output", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "preset 'qwen9' is not known" in err


# -- token orders --------------------------------------------------------------------------------------------------
def test_merge_windows_order():
    grid = Grid((4, 6), prefix=1)
    order = merge_windows(grid)
    assert order[0] == 0 and sorted(order.tolist()) == list(range(grid.num_tokens))
    assert order[1:5].tolist() == [1, 2, 7, 8]  # the first 2x2 window: patches (0,0) (0,1) (1,0) (1,1)
    video = merge_windows(Grid((2, 4, 6)))
    assert torch.equal(video[24:], video[:24] + 24)  # frame by frame
    with pytest.raises(ValueError, match="multiples of merge=2"):
        merge_windows(Grid((5, 6)))


def test_attention_windows_and_prefix_last():
    order = attention_windows(Grid((8, 12)), merge=2, window=8)
    assert sorted(order.tolist()) == list(range(96))
    assert {int(p) // 12 for p in order[:64]} == set(range(8))  # the first window: rows 0..7, columns 0..7
    assert {int(p) % 12 for p in order[:64]} == set(range(8))
    grid = Grid((2, 3), prefix=1)
    assert prefix_last(grid).tolist() == [1, 2, 3, 4, 5, 6, 0]
    scheme = vpe.preset("llama4", dim=32, num_heads=2)
    with pytest.raises(ValueError, match="reorder the tokens with token_order"):
        scheme.layout(grid)
    qwen = vpe.preset("qwen2_5_vl", dim=32, num_heads=2)
    layout = qwen.layout(Grid((4, 4)))
    assert torch.equal(layout.keep[0], merge_windows(Grid((4, 4))))
    assert vpe.preset("siglip2", dim=16).layout(Grid((4, 4))).keep is None


def test_presets_need_no_transformers_to_build():
    """The catalogue is plain visionpe: building every preset imports neither transformers nor diffusers."""
    import subprocess
    import sys
    code = ("import sys, visionpe as vpe\n"
            "[vpe.preset(n, dim=32, num_heads=2, grid_shape=(4, 4, 4) if n in ('vjepa2', 'wan', 'cosmos') else (4, 4))"
            " for n in vpe.presets()]\n"
            "assert not {'transformers', 'diffusers'} & set(sys.modules), sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_preset_tables_are_exact_to_float32():
    """No silent precision loss: a preset's rotations at large positions equal the float64 closed form."""
    pe = vpe.preset("wan").rotary
    grid = Grid((1, 1, 4000))
    angles = torch.arange(4000, dtype=torch.float64)[:, None] * pe.frequencies(torch.float64)[2, 0]
    rotations = pe.rotations(grid)[0].double()
    assert (rotations[..., 0] - angles.cos()).abs().max() < 1e-6 and math.isfinite(float(rotations.sum()))
