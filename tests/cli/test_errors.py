"""Bad input: one ``ValueError`` that names the parameter and what is allowed."""
from contextlib import contextmanager

import pytest
import torch
from conftest import SHAPES, build_kwargs

import visionpe as vpe
from visionpe import Grid


@contextmanager
def raises(*fragments):
    """``pytest.raises(ValueError)`` whose message must contain every fragment (plain text, not regex)."""
    with pytest.raises(ValueError) as info:
        yield info
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"message {str(info.value)!r} lacks {missing}"


def test_unknown_name_lists_available():
    with raises("'rope_fancy'", *vpe.available()):
        vpe.build("rope_fancy", head_dim=16)


@pytest.mark.parametrize("name", ["sincos", "rope_axial", "swin_bias", "cpb"])
def test_unknown_keyword_names_it_and_the_allowed_ones(name):
    kw = build_kwargs(name, 2)
    allowed = next(iter(kw))  # the first keyword is always accepted
    with raises("bogus", allowed):
        vpe.build(name, bogus=1, **kw)


def test_sincos_2d_dim_divisible_by_4():
    with raises("dim=10", "divisible by 4"):
        vpe.build("sincos", dim=10)
    with raises("dim=16", "divisible by 6"):
        vpe.build("sincos", dim=16, ndim=3)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_3d_rope_head_dim_divisible_by_6_without_sections(name):
    with raises("head_dim=16", "divisible by 6"):
        vpe.build(name, head_dim=16, num_heads=2, ndim=3)
    vpe.build("rope_axial", head_dim=16, ndim=3, sections=(2, 3, 3))  # allowed with sections


@pytest.mark.parametrize("sections", [(2, 2, 2), (3, 3, 3), (4, 4)])
def test_sections_must_sum_to_half_head_dim(sections):
    with raises("sections", "8" if len(sections) == 3 else "ndim=3"):
        vpe.build("rope_axial", head_dim=16, ndim=3, sections=sections)


def call(pe, grid):
    """Run an encoding of any family on ``grid``."""
    if pe.family == "bias":
        return pe(grid)
    if pe.family == "rotary":
        q = torch.randn(1, pe.num_heads, grid.num_tokens, pe.head_dim)
        return pe(q, q, grid)
    return pe(torch.randn(1, grid.num_tokens, pe.dim if hasattr(pe, "dim") else 24), grid)


@pytest.mark.parametrize("ndim,wrong", [(2, 3), (3, 2)])
@pytest.mark.parametrize("name", ["sincos", "learned", "peg", "rope_axial", "rope_mixed", "swin_bias", "rel_bias",
                                  "cpb", "alibi"])
def test_grid_of_wrong_ndim(name, ndim, wrong):
    pe = vpe.build(name, **build_kwargs(name, ndim))
    with raises(f"{wrong} axes", f"ndim={ndim}"):
        call(pe, Grid(SHAPES[wrong], prefix=1))


@pytest.mark.parametrize("shape", [(0, 3), (3, -1), (2.5, 2), ()])
def test_grid_non_positive_sizes(shape):
    with raises("shape", "positive integer"):
        Grid(shape)


def test_grid_bad_prefix_and_offset():
    with raises("prefix", "positive integer"):
        Grid((2, 2), prefix=-1)
    with raises("offset", "one value per axis"):
        Grid((2, 2), offset=(1, 2, 3))


@pytest.mark.parametrize("name", ["swin_bias", "cpb"])
@pytest.mark.parametrize("window", [(0, 7), (7, -2), 0])
def test_window_size_non_positive(name, window):
    with raises("window_size", "positive integer"):
        vpe.build(name, num_heads=2, window_size=window)


def test_swin_grid_larger_than_window():
    pe = vpe.build("swin_bias", num_heads=2, window_size=(3, 3))
    with raises("(4, 3)", "window_size=(3, 3)", "resize"):
        pe(Grid((4, 3)))


@pytest.mark.parametrize("pretrained", [(0, 5), (-3, -3), (4, 4, 4)])
def test_cpb_pretrained_window_size(pretrained):
    with raises("pretrained_window_size"):
        vpe.build("cpb", num_heads=2, window_size=(4, 4), pretrained_window_size=pretrained)


@pytest.mark.parametrize("offset", [(2, 0), (0, 3), (-1, 0), (0.5, 0)])
def test_learned_offset_window_outside_table(offset):
    pe = vpe.build("learned", dim=8, grid_shape=(3, 5))
    with raises("offset", "(3, 5)"):
        pe.patch_table(Grid((2, 3), offset=offset))


@pytest.mark.parametrize("name,kw", [
    ("sincos", dict(dim=16, layout="xy")),
    ("rope_axial", dict(head_dim=16, pairs="adjacent")),
    ("rope_mixed", dict(head_dim=16, num_heads=2, pairs="adjacent")),
    ("rope_axial", dict(head_dim=16, scaling="linear", ref_shape=(4, 4))),
    ("rope_mixed", dict(head_dim=16, num_heads=2, scaling="dynamic", ref_shape=(4, 4))),
    ("learned", dict(dim=8, grid_shape=(3, 3), interpolation="cubic")),
    ("swin_bias", dict(num_heads=2, interpolation="lanczos")),
])
def test_wrong_choice_strings(name, kw):
    param = next(k for k in ("layout", "pairs", "scaling", "interpolation") if k in kw)
    allowed = {"layout": ["'mae'", "'timm'"], "pairs": ["'interleaved'", "'half'"],
               "scaling": ["'none'", "'pi'", "'ntk'", "'yarn'"],
               "interpolation": ["'bicubic'", "'bilinear'"]}[param]
    with raises(f"{param}={kw[param]!r}", *allowed):
        vpe.build(name, **kw)


def test_learned_resize_wrong_interpolation():
    pe = vpe.build("learned", dim=8, grid_shape=(3, 3))
    with raises("interpolation='cubic'", "'bicubic'"):
        pe.resize((4, 4), interpolation="cubic")


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn"])
def test_scaling_needs_ref_shape(name, scaling):
    with raises(f"scaling={scaling!r}", "ref_shape"):
        vpe.build(name, head_dim=16, num_heads=2, scaling=scaling)


@pytest.mark.parametrize("name,kw", [("sincos", dict(dim=16)), ("rope_axial", dict(head_dim=16)),
                                     ("alibi", dict(num_heads=2))])
def test_ndim_out_of_range(name, kw):
    with raises("ndim=4", "1, 2, 3"):
        vpe.build(name, ndim=4, **kw)
