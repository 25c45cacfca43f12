"""transformers' DINOv3 (``DINOv3ViTModel``) with visionpe encodings: transformers' own model is the oracle (tiny
configs built here; nothing is downloaded)."""
import copy
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
dinov3 = pytest.importorskip("transformers.models.dinov3_vit", reason="transformers >= 4.56 has DINOv3")

import visionpe as vpe  # noqa: E402
from visionpe.backbones.hf_dinov3 import DINOv3ViTModelPE  # noqa: E402
from conftest import perturbed, saved_and_loaded  # noqa: E402

DINOV3 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8, num_register_tokens=4, layerscale_value=0.5)  # 4 as DINOv3


def _build(**config):
    torch.manual_seed(0)
    model = dinov3.DINOv3ViTModel(dinov3.DINOv3ViTConfig(**{**DINOV3, **config}))
    perturbed(model)
    return model.eval()


@pytest.mark.parametrize("config", [{}, {"use_gated_mlp": True, "rope_theta": 10.0, "num_register_tokens": 0}],
                         ids=["mlp-registers", "gated-no-registers"])
def test_native_gives_transformers_outputs_at_every_size(config):
    """``pe="native"`` is DINOv3's RoPE read from the config: the last hidden state and pooler output of
    transformers' model at the configured size and at others, square or not."""
    ref = _build(**config)
    model = vpe.apply(copy.deepcopy(ref), "native")
    assert type(model) is DINOv3ViTModelPE and model.rope_embeddings is None and model.pe == "rope_axial"
    rotary = vpe.encodings_of(model)["rotary"][0]
    assert rotary.theta == ref.config.rope_theta and "coords='normalized'" in repr(rotary)
    for size in ((32, 32), (48, 40), (24, 56), (16, 16)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            ours, theirs = model(x), ref(x)
        for key in ("last_hidden_state", "pooler_output"):
            assert (ours[key] - theirs[key]).abs().max() < 1e-5, (size, key)


def test_native_training_draws_as_transformers_draws():
    """In training DINOv3 rescales its coordinates by a log-uniform draw per forward (``pos_embed_rescale``, with
    shift and jitter): the same seed gives transformers' outputs, another seed others."""
    ref = _build(pos_embed_shift=0.1, pos_embed_jitter=1.5, pos_embed_rescale=2.0).train()
    model = vpe.apply(copy.deepcopy(ref), "native").train()
    x = torch.randn(2, 3, 32, 40)
    outputs = {}
    for name, net in (("ours", model), ("theirs", ref)):
        torch.manual_seed(5)
        outputs[name] = net(x).last_hidden_state
    assert (outputs["ours"] - outputs["theirs"]).abs().max() < 1e-5
    torch.manual_seed(6)
    assert (model(x).last_hidden_state - outputs["theirs"]).abs().max() > 1e-4


IMAGE_ENCODINGS = [pe for pe in vpe.available() if 2 in vpe.registry.ENCODINGS[pe].ndims and pe != "swin_bias"]


@pytest.mark.parametrize("pe", [*IMAGE_ENCODINGS, "learned+alibi", "cpb+rope_axial"])
def test_any_encoding_swaps_in_and_every_other_weight_is_kept(pe):
    """Every registered image encoding (and combinations) runs at other sizes with all of DINOv3's weights."""
    ref = _build()
    model = vpe.apply(copy.deepcopy(ref), pe)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in ref.state_dict().items())  # DINOv3's RoPE has no weights
    for size, patches in (((40, 24), 15), ((16, 32), 8)):
        with torch.no_grad():
            out = model(torch.randn(2, 3, *size)).last_hidden_state
        assert out.shape == (2, 1 + 4 + patches, 32) and torch.isfinite(out).all(), size


def test_swin_bias_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.apply(_build(), "swin_bias")


def test_save_pretrained_round_trip(tmp_path):
    model = vpe.apply(_build(), "rope_mixed")
    loaded = saved_and_loaded(model, dinov3.DINOv3ViTModel, tmp_path)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        assert torch.equal(loaded(x).last_hidden_state, model(x).last_hidden_state)
