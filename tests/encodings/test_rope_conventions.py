"""RoPE's conventions as records (visionpe.rotary.conventions): small keyword-only constructors, frozen records that
name the bad parameter, and the one map from the flat keywords (``vpe.build``, presets, ``for_model``) onto them."""
import dataclasses
import inspect
import pickle

import pytest
import torch

import visionpe as vpe
from visionpe import CoordinateSystem, Grid, ModelContext
from visionpe.rotary import (AxialRoPE, ChannelLayout, FrequencyBands, HARoPE, MixedRoPE, RegisterRoPE,
                             ResolutionScaling, RIFLEx, SpiralRoPE, VideoRoPE)


def parameters(cls) -> list[inspect.Parameter]:
    return [p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"]


def test_axial_rope_takes_at_most_ten_keyword_only_arguments():
    params = parameters(AxialRoPE)
    assert len(params) <= 10
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), [p.name for p in params]


@pytest.mark.parametrize("cls", [VideoRoPE, RIFLEx, SpiralRoPE, HARoPE, RegisterRoPE])
def test_the_variants_take_a_few_keyword_only_arguments(cls):
    params = parameters(cls)
    assert len(params) <= 11
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), [p.name for p in params]


def test_mixed_rope_takes_its_sizes_then_keywords():
    params = parameters(MixedRoPE)
    assert len(params) <= 10 and [p.name for p in params[:2]] == ["head_dim", "num_heads"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:])


@pytest.mark.parametrize("record", [FrequencyBands(), ChannelLayout(), ResolutionScaling()])
def test_records_are_frozen_hashable_and_pickle(record):
    field = dataclasses.fields(record)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, field, getattr(record, field))
    assert hash(record) == hash(type(record)()) and pickle.loads(pickle.dumps(record)) == record


def test_records_keep_lists_as_tuples():
    channels = ChannelLayout(sections=[2, 2], head_axes=["x", "y"])
    assert channels.sections == (2, 2) and channels.head_axes == ("x", "y") and hash(channels)
    assert FrequencyBands(ntk_factor=[2, 1]).ntk_factor == (2.0, 1.0)


@pytest.mark.parametrize("make, match", [
    (lambda: FrequencyBands(spectrum="mrope3"), r"spectrum='mrope3' is not supported; allowed values: 'axial'"),
    (lambda: FrequencyBands(min_period=1.0), r"min_period and max_period go together"),
    (lambda: FrequencyBands(min_period=2.0, max_period=1.0), r"max_period must be >= 2.0"),
    (lambda: FrequencyBands(max_res=1), r"max_res must be >= 2.0"),
    (lambda: FrequencyBands(linear_bands=True), r"linear_bands=True .* need max_res"),
    (lambda: FrequencyBands(linear_bands="yes"), r"linear_bands must be True or False"),
    (lambda: FrequencyBands(ntk_factor=0.5), r"ntk_factor must be >= 1.0"),
    (lambda: FrequencyBands(ntk_factor="2"), r"ntk_factor='2' must be one number >= 1"),
    (lambda: FrequencyBands(rotate_fraction=1.5), r"rotate_fraction must be <= 1.0"),
    (lambda: ChannelLayout(pairs="adjacent"), r"pairs='adjacent' is not supported; allowed values: 'interleaved'"),
    (lambda: ChannelLayout(sections="thirds"), r"sections='thirds' is not supported; allowed values: 'rest_first'"),
    (lambda: ChannelLayout(axis_order="yx"), r"axis_order='yx' is not supported"),
    (lambda: ChannelLayout(pair_order="zigzag"), r"pair_order='zigzag' is not supported"),
    (lambda: ChannelLayout(channel_frequencies="twice"), r"channel_frequencies='twice' is not supported"),
    (lambda: ChannelLayout(inert_axes=-1), r"inert_axes=-1 must be an integer >= 0"),
    (lambda: ChannelLayout(directions="spiral"), r"directions='spiral' is not supported"),
    (lambda: ResolutionScaling(scaling="linear"), r"scaling='linear' is not supported; allowed values: 'none'"),
    (lambda: ResolutionScaling(yarn_alpha=40.0), r"yarn_alpha=40.0 must be smaller than yarn_beta=32.0"),
])
def test_record_errors_name_the_parameter(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_flat_keywords_and_records_build_the_same_encoding():
    flat = vpe.build("rope_axial", head_dim=24, ndim=3, theta=1000.0, pairs="half", sections="rest_first",
                     axis_order="ij", ntk_factor=(2.0, 1.0, 1.0), scaling="yarn", ref_shape=(2, 3, 3), yarn_beta=16.0,
                     shift_coords=0.5)
    records = AxialRoPE(head_dim=24, ndim=3, theta=1000.0, ref_shape=(2, 3, 3),
                        bands=FrequencyBands(ntk_factor=(2.0, 1.0, 1.0)),
                        channels=ChannelLayout(pairs="half", sections="rest_first", axis_order="ij"),
                        coordinates=CoordinateSystem(shift_coords=0.5),
                        resolution=ResolutionScaling(scaling="yarn", yarn_beta=16.0))
    assert repr(flat) == repr(records)
    grid = Grid((3, 4, 5), prefix=1)
    assert torch.equal(flat.rotations(grid), records.rotations(grid))
    assert flat.sections == (4, 4, 4) and flat.pairs == "half" and flat.yarn_beta == 16.0


def test_a_flat_keyword_replaces_that_field_of_the_record_given():
    pe = vpe.build("rope_axial", head_dim=16, channels=ChannelLayout(pairs="half", axis_order="ij"),
                   pairs="interleaved")
    assert (pe.pairs, pe.axis_order) == ("interleaved", "ij")


def test_a_field_a_class_does_not_take_is_refused_either_way():
    with pytest.raises(ValueError, match=r"MixedRoPE does not take max_res \(got max_res=224.0\)"):
        MixedRoPE(8, 2, bands=FrequencyBands(max_res=224))
    with pytest.raises(ValueError, match=r"VideoRoPE does not take spectrum \(got spectrum='mrope'\)"):
        VideoRoPE(head_dim=24, bands=FrequencyBands(spectrum="mrope"))
    with pytest.raises(ValueError, match=r"rope_mixed does not take 'max_res'"):
        vpe.build("rope_mixed", head_dim=8, num_heads=2, max_res=224)
    with pytest.raises(ValueError, match=r"channels must be a ChannelLayout .*got \{'pairs': 'half'\}"):
        AxialRoPE(head_dim=16, channels={"pairs": "half"})


def test_a_variant_keeps_its_own_record_defaults():
    assert vpe.build("vit5_rope", head_dim=16).axis_order == "ij"  # ViT-5's y pairs first
    assert vpe.build("videorope", head_dim=24).spectrum == "videorope"
    assert vpe.build("rope_mixed", head_dim=8, num_heads=2).directions == "random"


def test_in_a_model_a_resolution_record_keeps_its_scaling():
    context = ModelContext((4, 4), 32, 2, 16)
    assert AxialRoPE.for_model(context).scaling == "pi"  # a model interpolates index coordinates by default
    assert AxialRoPE.for_model(context, resolution=ResolutionScaling()).scaling == "none"
    normalized = AxialRoPE.for_model(context, coordinates=CoordinateSystem(coords="normalized"))
    assert normalized.scaling == "none" and normalized.ref_shape == (4, 4)
