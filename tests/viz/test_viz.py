"""visionpe.viz and visionpe visualize: the numbers behind the pictures, the PNGs, the CLI."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import visionpe
from visionpe import ModelContext
from visionpe.registry import ENCODINGS
from visionpe import Grid, viz
from trainutil import run_script

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {2: (4, 4), 3: (2, 3, 3)}


def make(name: str, shape, num_heads: int = 2, seed: int = 0):
    """A small fresh encoding for the grid ``shape``, built as a model would build it, RoPE extrapolating
    (``scaling="none"``, the raw rotation whose relative property these tests check)."""
    context = ModelContext(tuple(shape), dim=48, num_heads=num_heads, head_dim=24)
    torch.manual_seed(seed)
    pe = ENCODINGS[name].for_model(context, **({"scaling": "none"} if name.startswith("rope") else {}))
    if pe.family == "bias":  # fresh learned tables are ~0; make every offset distinct and visible
        with torch.no_grad():
            for p in pe.parameters():
                p.normal_()
    return pe


def index(shape, position) -> int:
    return int(torch.tensor(position) @ torch.tensor([math.prod(shape[i + 1:]) for i in range(len(shape))]))


# -- numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ["sincos", "rope_axial", "rope_mixed"])
def test_self_similarity_is_the_maximum_of_each_tile(name, ndim):
    shape = SHAPES[ndim]
    sim = viz.similarity(make(name, shape), shape)
    n = math.prod(shape)
    assert sim.shape == (n, n)
    torch.testing.assert_close(sim.diagonal(), torch.ones(n))
    torch.testing.assert_close(sim.max(dim=1).values, sim.diagonal())
    off_diagonal = sim[~torch.eye(n, dtype=torch.bool)]
    assert (off_diagonal < 1 - 1e-4).all()  # every other position is strictly less similar


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_rope_kernel_depends_only_on_the_offset(name, ndim):
    shape = SHAPES[ndim]
    pe = make(name, shape)
    shifted = Grid(shape, offset=(1,) * ndim)
    maps = viz.pair_maps(pe, shape)
    torch.testing.assert_close(viz.pair_maps(pe, shifted), maps, atol=1e-5, rtol=0)
    # inside one grid: the sub-grid starting at 1 sees the same kernel as the one starting at 0
    bigger = tuple(s + 1 for s in shape)
    big = viz.pair_maps(pe, bigger)
    coords = Grid(bigger).coords()
    lo, hi = (coords < torch.tensor(shape)).all(1), (coords >= 1).all(1)
    torch.testing.assert_close(big[:, lo][:, :, lo], big[:, hi][:, :, hi], atol=1e-5, rtol=0)
    torch.testing.assert_close(big[:, lo][:, :, lo], maps, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_rope_kernel_is_the_expected_score_of_rotated_isotropic_vectors(name):
    """K[i, j] = E<R_i x, R_j x> / E|x|^2 = trace(R_i^T R_j) / head_dim, with R from the module's rotate()."""
    shape = (3, 4)
    pe = make(name, shape)
    d, n = pe.head_dim, math.prod(shape)
    basis = torch.eye(d)[:, None, None, :].expand(d, pe.num_heads, n, d)  # x = e_b at every position
    rotated = pe.rotate(basis.contiguous(), Grid(shape))  # (d, heads, N, d): R_n e_b
    expected = torch.einsum("bhid,bhjd->hij", rotated, rotated) / d
    torch.testing.assert_close(viz.pair_maps(pe, shape).expand_as(expected), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(viz.similarity(pe, shape, head=1), expected[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(viz.similarity(pe, shape), expected.mean(0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", ["swin_bias", "rel_bias", "cpb", "alibi"])
def test_bias_map_equals_the_modules_bias_rows(name, ndim):
    shape = SHAPES[ndim]
    pe = make(name, shape)
    bias = pe(Grid(shape, prefix=1)).detach()[:, 1:, 1:]  # prefix rows/columns are never shown
    for head in range(pe.num_heads):
        torch.testing.assert_close(viz.similarity(pe, shape, head=head), bias[head])
    torch.testing.assert_close(viz.similarity(pe, shape), bias.mean(0))
    q = viz.centre(shape)
    torch.testing.assert_close(viz.query_map(viz.similarity(pe, shape, head=0), shape, q),
                               bias[0, index(shape, q)].reshape(shape))
    with pytest.raises(ValueError, match="head=2 is out of range"):
        viz.similarity(pe, shape, head=2)


def test_token_similarities():
    shape = (4, 4)
    learned = make("learned", shape)
    table = learned.table.detach().reshape(16, -1)
    torch.testing.assert_close(viz.similarity(learned, shape), torch.nn.functional.cosine_similarity(
        table[:, None], table[None], dim=-1))
    factorized = visionpe.build("learned", dim=48, grid_shape=shape, factorized=True)
    assert torch.allclose(viz.similarity(factorized, shape).diagonal(), torch.ones(16))
    # PEG has no position vectors: its output for a constant input differs only near the borders
    peg = viz.similarity(make("peg", shape), shape)
    interior = [index(shape, (h, w)) for h in (1, 2) for w in (1, 2)]
    torch.testing.assert_close(peg[interior][:, interior], torch.ones(4, 4))
    assert peg[index(shape, (0, 0)), index(shape, (1, 1))] < 0.999
    with pytest.raises(ValueError, match="no position vectors"):
        viz.position_vectors(make("alibi", shape), shape)


def test_mosaic_places_each_query_tile_at_its_grid_position():
    shape = (2, 3)
    sim = torch.arange(36.0).reshape(6, 6)
    mosaic = viz.similarity_mosaic(sim, shape, gap=1)
    assert mosaic.shape == (2 * 3 - 1, 3 * 4 - 1)
    for qh in range(2):
        for qw in range(3):
            tile = mosaic[qh * 3:qh * 3 + 2, qw * 4:qw * 4 + 3]
            torch.testing.assert_close(tile, sim[qh * 3 + qw].reshape(2, 3))
    assert mosaic[2].isnan().all() and mosaic[:, 3].isnan().all()
    # 3D: each tile is a strip of T key frames (1 NaN column apart), frame blocks stacked downwards
    shape3 = (2, 2, 3)
    sim3 = torch.randn(12, 12)
    mosaic3 = viz.similarity_mosaic(sim3, shape3, gap=1)
    tile_h, tile_w = 2, 2 * 3 + 1
    assert mosaic3.shape == (2 * (2 * (tile_h + 2) - 2) + 4, 3 * (tile_w + 2) - 2)
    q = (1, 0, 2)
    top = (2 * (tile_h + 2) - 2 + 4) * q[0] + (tile_h + 2) * q[1]
    left = (tile_w + 2) * q[2]
    tile = mosaic3[top:top + tile_h, left:left + tile_w]
    row = sim3[index(shape3, q)].reshape(2, 2, 3)
    torch.testing.assert_close(tile[:, :3], row[0])
    torch.testing.assert_close(tile[:, 4:], row[1])
    assert tile[:, 3].isnan().all()


def test_frequencies_against_the_axial_reference():
    mixed = make("rope_mixed", (4, 4), num_heads=3)
    freqs = viz.rope_frequencies(mixed)
    assert freqs.shape == (3, 12, 2)
    torch.testing.assert_close(freqs, mixed.freqs.detach().permute(1, 2, 0))
    reference = viz.axial_reference(mixed)
    # RoPE-Mixed's initialisation rotates the axial vectors: the same magnitudes, other directions
    torch.testing.assert_close(freqs.norm(dim=-1).sort(-1).values, reference.norm(dim=-1).sort().values.expand(3, -1))
    axial = viz.rope_frequencies(make("rope_axial", (4, 4)))
    assert axial.shape == (1, 12, 2)
    assert ((axial[0] == 0).sum(-1) == 1).all()  # every axial frequency lies on an axis
    torch.testing.assert_close(axial[0], viz.axial_reference(make("rope_axial", (4, 4))))


def test_resolution_adaptations():
    shape, big = (4, 4), (8, 8)
    learned = make("learned", shape)
    sim, new_sim, label = viz.resolution_similarity(learned, shape, big)
    assert "resampled" in label and new_sim.shape == (64, 64)
    torch.testing.assert_close(new_sim, viz.cosine_similarity(learned.patch_table(Grid(big)).detach()))
    # RoPE with position interpolation: the 8x8 grid at even coordinates sees the 4x4 kernel
    rope = make("rope_mixed", shape)
    sim, new_sim, label = viz.resolution_similarity(rope, shape, big, scaling="pi")
    assert "pi" in label and rope.scaling == "none"  # the module itself is untouched
    even = (Grid(big).coords() % 2 == 0).all(1)
    torch.testing.assert_close(new_sim[even][:, even], sim, atol=1e-5, rtol=0)
    _, extrapolated, label = viz.resolution_similarity(rope, shape, big)
    assert "extrapolated" in label
    inside = (Grid(big).coords() < 4).all(1)  # extrapolation: the native positions keep their kernel
    torch.testing.assert_close(extrapolated[inside][:, inside], sim, atol=1e-5, rtol=0)
    # a fixed Swin window: a resized copy; the original keeps its window
    swin = make("swin_bias", shape)
    _, new_sim, label = viz.resolution_similarity(swin, shape, big)
    assert "resized" in label and swin.window_size == shape and new_sim.shape == (64, 64)
    with pytest.raises(ValueError, match="rotary encodings only"):
        viz.resolution_similarity(swin, shape, big, scaling="pi")


# -- pictures -----------------------------------------------------------------------------------------
REPRESENTATIVE = {"tokens": "learned", "rotary": "rope_mixed", "bias": "cpb"}
VALID = {"similarity": ("tokens", "rotary", "bias"), "resolution": ("tokens", "rotary", "bias"),
         "video": ("tokens", "rotary", "bias"), "heatmap": ("tokens", "rotary"), "freqs": ("rotary",)}


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("kind", viz.KINDS)
@pytest.mark.parametrize("family", ["tokens", "rotary", "bias"])
def test_each_kind_and_family_writes_a_png(tmp_path, family, kind, ndim):
    shape = SHAPES[ndim]
    pe = make(REPRESENTATIVE[family], shape)
    if family not in VALID[kind]:
        with pytest.raises(ValueError, match=f"{family} encoding"):
            viz.render(pe, kind, shape)
        return
    out = viz.save(viz.render(pe, kind, shape, head=0 if family == "bias" else None), tmp_path / "x.png", dpi=40)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name", sorted(set(visionpe.available()) - set(REPRESENTATIVE.values())))
def test_similarity_png_for_every_encoding(tmp_path, name, ndim):
    if ndim not in ENCODINGS[name].ndims:
        pytest.skip(f"{name} is defined for {ENCODINGS[name].ndims}D grids")
    shape = SHAPES[ndim]
    out = viz.save(viz.render(make(name, shape), "similarity", shape), tmp_path / f"{name}.png", dpi=40)
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("name", [n for n, family in visionpe.available().items() if family == "rotary"])
def test_freqs_applies_to_every_rotary_encoding_with_frequency_vectors(tmp_path, name):
    """``--kind freqs`` is offered (and drawn) exactly where the encoding's rotations have frequency vectors: ComRoPE's
    eigenfrequencies included, LieRE's, Spherical RoPE's and GeoPE's non-commuting rotations not."""
    shape = SHAPES[2] if 2 in ENCODINGS[name].ndims else SHAPES[3]
    pe = make(name, shape)
    try:
        pe.frequency_vectors()
        has = True
    except ValueError:
        has = False
    assert ("freqs" in viz.kinds_for(pe)) == has
    assert has == (name not in ("liere", "spherical_rope", "geope"))
    if has:
        out = viz.save(viz.render(pe, "freqs", shape), tmp_path / f"{name}.png", dpi=40)
        assert out.stat().st_size > 1000


def test_lookhere_mean_over_heads_is_over_the_heads_that_see_each_key(tmp_path):
    """LookHere's heads look in different directions, so nearly every key is outside some head's view: a plain mean
    over heads is NaN (blank) there. The map is the mean over the heads that see the pair (written here from the
    per-head maps), NaN only where none does; one head is that head's map."""
    pe = make("lookhere", (4, 4), num_heads=8)
    maps = pe.pair_map(Grid((4, 4)))  # (heads, N, N), NaN outside a head's field of view
    seen = maps.isfinite()
    assert maps.isnan().any(0).float().mean() > 0.5  # a plain mean would blank most of the map
    expected = torch.where(seen, maps, 0.0).sum(0) / seen.sum(0)  # NaN (0/0) where no head sees the key
    got = viz.similarity(pe, (4, 4))
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert got.isfinite().float().mean() > 0.9
    torch.testing.assert_close(viz.similarity(pe, (4, 4), head=3), maps[3], equal_nan=True)
    assert "heads that see the key" in viz.quantity_of(pe)
    out = viz.save(viz.render(pe, "similarity", (4, 4)), tmp_path / "lookhere.png", dpi=40)
    assert out.stat().st_size > 1000


def test_cli_draws_comrope_frequencies(tmp_path, capsys):
    out = tmp_path / "comrope_freqs.png"
    assert run_script("visualize", ["--pe", "comrope", "--kind", "freqs", "--grid", "4", "4", "--head-dim", "16",
                                    "--num-heads", "2", "--out", str(out), "--dpi", "40"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- command line -------------------------------------------------------------------------------------
def test_cli_bad_pe_exits_2_with_one_line():
    result = subprocess.run([sys.executable, "-m", "visionpe", "visualize", "--pe", "nope", "--grid", "4", "4"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0] and "sincos" in lines[0], result.stderr


@pytest.mark.parametrize("argv, message", [
    (["--pe", "sincos", "--grid", "0", "4"], "--grid"),
    (["--pe", "sincos", "--kind", "freqs"], "--kind freqs does not apply to sincos (tokens); kinds for it: "),
    (["--run", "/nonexistent/run"], "not found"),
    (["--pe", "rope_axial", "--grid", "4", "4", "--head", "7"], "head=7"),
    (["--pe", "rope_axial", "--grid", "2", "3", "3", "--kind", "video", "--query", "5", "0", "0"], "query"),
])
def test_cli_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        run_script("visualize", argv + ["--out", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_cli_fresh_encoding(tmp_path):
    for argv in (["--pe", "sincos", "--grid", "4", "4", "--dim", "32"],
                 ["--pe", "rope_axial", "--grid", "2", "4", "4", "--kind", "video", "--head-dim", "24"],
                 ["--pe", "rope_axial", "--grid", "4", "4", "--kind", "resolution", "--scaling", "yarn",
                  "--new-grid", "6", "6", "--head-dim", "16", "--num-heads", "2"]):
        out = tmp_path / f"{argv[1]}_{len(argv)}.png"
        assert run_script("visualize", argv + ["--out", str(out), "--dpi", "40"]) == 0
        assert out.stat().st_size > 1000


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A train_vit.py-style run directory with a tiny rope_mixed+learned ViT."""
    from safetensors.torch import save_file

    directory = tmp_path_factory.mktemp("run")
    cfg = {"model": "vit_tiny_patch16_224", "pe": "rope_mixed+learned", "img_size": 16, "patch_size": 4,
           "num_classes": 3, "model_kwargs": {"depth": 2, "embed_dim": 48, "num_heads": 2}}
    torch.manual_seed(0)
    model = visionpe.create_model(cfg["model"], pe=cfg["pe"], img_size=16, patch_size=4, num_classes=3,
                                  **cfg["model_kwargs"])
    with torch.no_grad():
        visionpe.encodings_of(model)["rotary"][1].freqs.mul_(3.0)  # layer 1 differs from a fresh model
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "best.safetensors"))
    save_file(state, str(directory / "last.safetensors"))
    (directory / "config.yaml").write_text(yaml.safe_dump(cfg))
    return directory, model


def test_load_run_gives_the_trained_encodings(run_dir):
    from visionpe.train import models, restore
    directory, model = run_dir
    loaded, cfg = restore.load_model(directory)
    assert models.run_grid(cfg) == (4, 4)
    rope = viz.pick_encoding(loaded, "rope_mixed", layer=1)
    torch.testing.assert_close(viz.rope_frequencies(rope), viz.rope_frequencies(
        visionpe.encodings_of(model)["rotary"][1]))
    learned = viz.pick_encoding(loaded, "learned")
    torch.testing.assert_close(viz.similarity(learned, (4, 4)), viz.similarity(
        visionpe.encodings_of(model)["tokens"][0], (4, 4)))
    with pytest.raises(ValueError, match="no alibi encoding"):
        viz.pick_encoding(loaded, "alibi")
    with pytest.raises(ValueError, match="layer=5"):
        viz.pick_encoding(loaded, "rope_mixed", layer=5)


def test_cli_from_a_run_directory(run_dir, tmp_path, capsys):
    directory, _ = run_dir
    for argv in (["--run", str(directory)],  # default: the first encoding of the config, rope_mixed
                 ["--run", str(directory), "--pe", "rope_mixed", "--layer", "1", "--kind", "freqs"],
                 ["--checkpoint", str(directory / "last.safetensors"), "--pe", "learned", "--kind", "resolution"],
                 ["--run", str(directory), "--pe", "learned", "--kind", "heatmap"]):
        out = tmp_path / f"{len(argv)}_{argv[-1]}.png"
        assert run_script("visualize", argv + ["--out", str(out), "--dpi", "40"]) == 0
        assert out.stat().st_size > 1000
    with pytest.raises(SystemExit) as exit_info:
        run_script("visualize", ["--run", str(directory), "--pe", "alibi", "--out", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:  # a tokens table is one for the whole model: no layer (issue 43)
        run_script("visualize", ["--run", str(directory), "--pe", "learned", "--layer", "1", "--out",
                                 str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--layer 1 picks a block's encoding; learned is a tokens encoding" in err, err


def test_visualize_prints_the_file_it_wrote(tmp_path, capsys):
    """``visionpe visualize --out DIR`` (no suffix) writes ``DIR.png`` and prints that path, not ``DIR`` (issue 43)."""
    from trainutil import run_script
    run_script("visualize", ["--pe", "sincos", "--grid", "4", "4", "--out", str(tmp_path / "pictures")])
    written = tmp_path / "pictures.png"
    assert written.is_file() and not (tmp_path / "pictures").exists()
    assert capsys.readouterr().out.strip() == str(written)
