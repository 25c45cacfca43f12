"""Hugging Face transformers' ViT, DeiT, DINOv2 and Swin with visionpe encodings: transformers itself is the oracle
(tiny configs built here; nothing is downloaded)."""
import copy
import inspect
import os
import subprocess
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported here: the tests never reach the hub
transformers = pytest.importorskip("transformers")
from transformers import (DeiTConfig, DeiTForImageClassification, DeiTForImageClassificationWithTeacher,  # noqa: E402
                          DeiTModel, Dinov2Config, Dinov2ForImageClassification, Dinov2Model, ResNetConfig,
                          ResNetModel, SwinConfig, SwinForImageClassification, SwinModel, ViTConfig,
                          ViTForImageClassification, ViTModel)

import visionpe as vpe  # noqa: E402
from visionpe.backbones.hf import (CheckpointsCarryDraws, GridAttention, GridSwinLayer, attention_slot,  # noqa: E402
                                   swin_window)
from visionpe.grid import Grid  # noqa: E402
from visionpe.tokens import Learned  # noqa: E402
from conftest import (compiled_matches_eager_and_trains, perturbed, requires, requires_that,  # noqa: E402
                      run_concurrently)
from trainutil import ROOT  # noqa: E402

VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
           patch_size=8, num_labels=5)
DINO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, image_size=32, patch_size=8,
            num_labels=5)
SWIN = dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4, num_labels=5)
# class -> (config class, keywords, keywords of a call at another size: DINOv2 always interpolates)
VIT_LIKE = {ViTForImageClassification: (ViTConfig, VIT, {"interpolate_pos_encoding": True}),
            ViTModel: (ViTConfig, VIT, {"interpolate_pos_encoding": True}),
            DeiTForImageClassification: (DeiTConfig, VIT, {"interpolate_pos_encoding": True}),
            DeiTForImageClassificationWithTeacher: (DeiTConfig, VIT, {"interpolate_pos_encoding": True}),
            DeiTModel: (DeiTConfig, VIT, {"interpolate_pos_encoding": True}),
            Dinov2ForImageClassification: (Dinov2Config, DINO, {}),
            Dinov2Model: (Dinov2Config, DINO, {})}


# what newer transformers' models take and older ones do not: the oracles of the tests that use it
MASKS = requires_that("attention_mask" in inspect.signature(ViTModel.forward).parameters,
                      "transformers >= 5: ViTModel(..., attention_mask=) as the oracle")
KWARGS = requires_that("kwargs" in inspect.signature(ViTForImageClassification.forward).parameters,
                       "a transformers whose classification heads pass keywords on to the base model (4.57 does, "
                       "4.46 does not)")


def _attention(layer):
    """A patched layer's GridAttention (transformers 5: the layer's ``attention``; 4: the self-attention in it)."""
    return getattr(*attention_slot(layer))


def _perturb(model):
    return perturbed(model).eval()


def _build(cls, **config):
    torch.manual_seed(0)
    config_cls, kw, _ = VIT_LIKE.get(cls, (SwinConfig, SWIN, {}))
    return _perturb(cls(config_cls(**{**kw, **config})))


def _main(out):
    """The tensor to compare: logits of a task model, the last hidden state of a base model."""
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("cls", list(VIT_LIKE), ids=lambda c: c.__name__)
def test_learned_reproduces_transformers_at_every_size_it_runs(cls):
    """``pe="learned"`` is the model's own encoding: transformers' logits at the trained size, and at other sizes
    those of its ``interpolate_pos_encoding`` (DINOv2: always), square or not, larger or smaller."""
    ref = _build(cls)
    model = vpe.apply(copy.deepcopy(ref), "learned")
    base = model.base_model
    assert type(base).__name__ == f"{type(ref.base_model).__name__}PE" and base.embeddings.position_embeddings is None
    table = ref.base_model.embeddings.position_embeddings[0]
    prefix = 2 if "DeiT" in cls.__name__ else 1
    assert torch.equal(base.pe_tokens.prefix, table[:prefix])
    assert torch.equal(base.pe_tokens.table.reshape(16, -1), table[prefix:])
    assert base.pe_tokens.antialias is False  # transformers' resampling
    other = VIT_LIKE[cls][2]
    for size, kw in (((32, 32), {}), ((48, 48), other), ((32, 48), other), ((16, 24), other), ((40, 16), other)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert (_main(model(x)) - _main(ref(x, **kw))).abs().max() < 1e-5, size


@pytest.mark.parametrize("cls", [ViTModel, DeiTModel, Dinov2Model], ids=lambda c: c.__name__)
@pytest.mark.parametrize("size", [(48, 48), (24, 40), (16, 16), (32, 24)])
def test_learned_resampling_equals_transformers_interpolate_pos_encoding(cls, size):
    """The table of each grid against transformers' own ``interpolate_pos_encoding`` (bicubic, no antialias)."""
    ref = _build(cls)
    tokens = vpe.apply(copy.deepcopy(ref), "learned").pe_tokens
    embeddings = ref.embeddings
    prefix = 2 if cls is DeiTModel else 1
    grid = Grid((size[0] // 8, size[1] // 8), prefix=prefix)
    with torch.no_grad():
        theirs = embeddings.interpolate_pos_encoding(torch.zeros(1, grid.num_tokens, 32), *size)
        ours = tokens(torch.zeros(1, grid.num_tokens, 32), grid)
    assert (ours - theirs).abs().max() < 1e-6


def test_swin_bias_reproduces_transformers_swin():
    """``pe="swin_bias"`` takes over transformers' table: its logits at every size transformers runs (padded
    patches and windows, shifted windows, a stage whose map equals the window)."""
    ref = _build(SwinForImageClassification)
    model = vpe.apply(copy.deepcopy(ref), "swin_bias")
    layers = [layer for stage in model.swin.encoder.layers for layer in stage.blocks]
    assert all(type(layer) is GridSwinLayer and isinstance(_attention(layer), GridAttention) for layer in layers)
    source = ref.swin.encoder.layers[0].blocks[1].attention
    source = getattr(source, "relative_position_bias", getattr(source, "self", None))  # 5's module, 4's attention
    assert torch.equal(_attention(layers[1]).bias.relative_position_bias_table, source.relative_position_bias_table)
    for size in ((32, 32), (64, 48), (36, 52), (30, 34), (33, 31)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert (model(x).logits - copy.deepcopy(ref)(x).logits).abs().max() < 1e-5, size


def test_swin_window_rule_is_per_call():
    """transformers' Swin layer shrinks its window and drops its shift for a small map by writing to itself, and keeps
    them: its answer at one size depends on the sizes it ran before (and a map smaller than the window fails, its bias
    being the full window's). The patched layer computes window and shift per call from the configured ones."""
    ref = _build(SwinForImageClassification)
    small, large = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 64, 64)  # stage 2 maps: 4x4 (= window), 8x8
    with torch.no_grad():
        expected_large = copy.deepcopy(ref)(large).logits
        hurt = copy.deepcopy(ref)
        hurt(small)  # stage 2's shifted block: shift 2 -> 0, for good
        assert hurt.swin.encoder.layers[1].blocks[1].shift_size == 0
        assert (hurt(large).logits - expected_large).abs().max() > 1e-4  # history changed transformers' answer
        with pytest.raises(RuntimeError):
            copy.deepcopy(ref)(torch.randn(1, 3, 24, 24))  # stage 2: a 3x3 map, window 4 -> 3, 4x4 bias
        model = vpe.apply(hurt, "swin_bias")  # apply restores the configured window and shift
        assert [(b.window_size, b.shift_size) for s in model.swin.encoder.layers for b in s.blocks] == [(4, 0),
                                                                                                        (4, 2)] * 2
        for _ in range(2):
            assert (model(small).logits - ref(small).logits).abs().max() < 1e-5
            assert (model(large).logits - expected_large).abs().max() < 1e-5
            assert model(torch.randn(1, 3, 24, 24)).logits.shape == (1, 5)  # runs where transformers fails
    assert swin_window((3, 5), 4, 2) == (3, 0) and swin_window((4, 9), 4, 2) == (4, 0)
    assert swin_window((5, 9), 4, 2) == (4, 2)


@MASKS
@pytest.mark.parametrize("cls", [ViTModel, Dinov2Model], ids=lambda c: c.__name__)
def test_outputs_keep_their_meaning(cls):
    """hidden_states (selected or all), attentions (against transformers' eager attention), pooler, tuples; with a
    padding mask and masked patches (replaced by the mask token, positions kept)."""
    kw = {"use_mask_token": True} if cls is ViTModel else {}
    torch.manual_seed(0)
    config_cls, config, _ = VIT_LIKE[cls]
    ref = _perturb(cls(config_cls(**config, attn_implementation="eager"), **kw))
    model = vpe.apply(copy.deepcopy(ref), "learned")
    x, masked = torch.randn(2, 3, 32, 32), torch.rand(2, 16) > 0.5
    attention_mask = torch.ones(2, 17, dtype=torch.long)
    attention_mask[0, 3:9] = 0
    call = dict(bool_masked_pos=masked, attention_mask=attention_mask, output_hidden_states=True,
                output_attentions=True)
    with torch.no_grad():
        ours, theirs = model(x, **call), ref(x, **call)
        for key in ("last_hidden_state", "pooler_output"):
            assert (ours[key] - theirs[key]).abs().max() < 1e-5, key
        for key in ("hidden_states", "attentions"):
            assert len(ours[key]) == len(theirs[key]) == (3 if key == "hidden_states" else 2)
            assert all((a - b).abs().max() < 1e-5 for a, b in zip(ours[key], theirs[key])), key
        assert ours.attentions[0].shape == (2, 2, 17, 17) and ours.attentions[0][0, :, :, 3:9].abs().max() == 0
        selected = model(x, output_hidden_states=[0, -1]).hidden_states
        assert [h is None for h in selected] == [h is None for h in ref(x, output_hidden_states=[0, -1]).hidden_states]
        assert [h is None for h in selected] == [False, True, False]
        as_tuple = model(x, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(x).last_hidden_state)
    assert model(x, output_attentions=True).attentions is not None  # SDPA's transformers model would give none


def test_swin_outputs_keep_their_meaning():
    torch.manual_seed(0)
    ref = _perturb(SwinModel(SwinConfig(**SWIN, attn_implementation="eager"), use_mask_token=True))
    model = vpe.apply(copy.deepcopy(ref), "swin_bias")
    x, masked = torch.randn(2, 3, 48, 40), torch.rand(2, 120) > 0.5
    call = dict(bool_masked_pos=masked, output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        ours, theirs = model(x, **call), ref(x, **call)
    for key in ("last_hidden_state", "pooler_output"):
        assert (ours[key] - theirs[key]).abs().max() < 1e-5, key
    for key in ("hidden_states", "attentions", "reshaped_hidden_states"):
        assert len(ours[key]) == len(theirs[key]) > 0
        assert all((a - b).abs().max() < 1e-5 for a, b in zip(ours[key], theirs[key])), key


@pytest.mark.parametrize("cls", [ViTForImageClassification, SwinForImageClassification], ids=lambda c: c.__name__)
def test_concurrent_forwards_at_different_sizes_equal_single_threaded(cls):
    """One patched model, calls at different sizes from several threads (for Swin, sizes that shrink the window at
    stage 2 and sizes that do not): each gets its single-threaded output."""
    model = vpe.apply(_build(cls), "rope_axial+learned" if cls is ViTForImageClassification else "rope_axial+swin_bias")
    sizes = [(32, 48), (48, 32), (16, 16)] if cls is ViTForImageClassification else [(24, 24), (32, 48), (48, 32)]
    inputs = [torch.randn(1, 3, *s) for s in sizes]
    errors = run_concurrently(lambda x: model(x).logits, inputs, iterations=24, threads=3)
    assert not errors, errors[:3]


@pytest.mark.parametrize("cls,pe,config", [(ViTForImageClassification, "rope_mixed+learned", {}),
                                           (SwinForImageClassification, "rope_mixed+swin_bias",
                                            dict(depths=[2], num_heads=[2]))],  # one stage: a shifted block
                         ids=["vit", "swin"])
@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_fullgraph_compile_matches_eager_and_trains(cls, pe, config):
    model = vpe.apply(_build(cls, **config), pe)
    assert not compiled_matches_eager_and_trains(model, torch.randn(2, 3, 32, 40), output=lambda out: out.logits)


def _checkpointing(model, on: bool):
    """transformers' activation checkpointing on or off (5's name, or 4's ``gradient_checkpointing_*``)."""
    name = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    getattr(model, f"{name}_checkpointing_{'enable' if on else 'disable'}")()


AUGMENTED = dict(coords="normalized", jitter_coords=1.5)  # coordinates drawn once per training forward


@pytest.mark.parametrize("cls,pe,kw", [(ViTForImageClassification, "rope_mixed+learned", {}),
                                       (ViTForImageClassification, "rope_mixed", AUGMENTED),
                                       (DeiTForImageClassification, "rope_axial", AUGMENTED),
                                       (Dinov2ForImageClassification, "rope_mixed", AUGMENTED),
                                       (SwinForImageClassification, "rope_mixed+swin_bias", AUGMENTED)],
                         ids=["vit", "vit-augmented", "deit-augmented", "dinov2-augmented", "swin-augmented"])
@pytest.mark.parametrize("enabled", ["after", "before"], ids=["enabled-after-apply", "enabled-before-apply"])
def test_gradient_checkpointing_gives_the_same_gradients(cls, pe, kw, enabled):
    """transformers' own activation checkpointing recomputes each layer (and each Swin stage) in the backward pass:
    with coordinate augmentation the recomputation must reuse the forward's one draw, not draw again per layer
    (gradients then differed by about 5e-3 without an error)."""
    model = _build(cls)
    if enabled == "before":
        _checkpointing(model, True)
    model = vpe.apply(model, pe, **kw).train()
    x = torch.randn(2, 3, 32, 40)

    def gradients(seed):
        model.zero_grad()
        torch.manual_seed(seed)
        model(x).logits.sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    if enabled == "before":
        _checkpointing(model, False)
    plain = gradients(1)
    _checkpointing(model, True)
    assert any(isinstance(m, CheckpointsCarryDraws) for m in model.modules())  # every layer (and Swin stage)
    switches = [m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert switches and all(switches), "checkpointing is not on"  # 5: each layer and stage; 4: each encoder
    checkpointed = gradients(1)
    assert checkpointed.keys() == plain.keys()
    assert all(torch.allclose(checkpointed[n], plain[n], atol=1e-6) for n in plain), \
        max((checkpointed[n] - plain[n]).abs().max().item() for n in plain)
    if kw:  # the draw matters: another seed gives other gradients
        other = gradients(2)
        assert any(not torch.allclose(other[n], plain[n], atol=1e-6) for n in plain)


def test_save_and_load_weights_round_trip(tmp_path):
    model = vpe.apply(_build(DeiTForImageClassificationWithTeacher), "rope_mixed+learned")
    vpe.save_weights(model, tmp_path / "w.safetensors")
    other = vpe.apply(DeiTForImageClassificationWithTeacher(DeiTConfig(**VIT)), "rope_mixed+learned").eval()
    vpe.load_weights(other, tmp_path / "w.safetensors")
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        assert torch.equal(model(x).logits, other(x).logits)


def test_apply_keeps_every_weight_and_transformers_names():
    ref = _build(Dinov2ForImageClassification)
    before = ref.state_dict()
    model = vpe.apply(copy.deepcopy(ref), "rope_axial+learned")
    after = model.state_dict()
    kept = set(before) - {"dinov2.embeddings.position_embeddings"}
    assert kept <= set(after) and all(torch.equal(before[k], after[k]) for k in kept)
    assert set(after) - kept == {"dinov2.pe_tokens.table", "dinov2.pe_tokens.prefix"}  # axial RoPE has no weights
    assert model.pe == "rope_axial+learned" and model.pe_tokens is model.dinov2.pe_tokens
    assert isinstance(vpe.encodings_of(model)["tokens"][0], Learned) and len(vpe.encodings_of(model)["rotary"]) == 2


def test_bad_input_and_unsupported_classes():
    with pytest.raises(ValueError, match=r"model class transformers\.models\.resnet\.modeling_resnet\.ResNetModel is "
                                         r"not supported; supported: .*transformers ViTModel"):
        vpe.apply(ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1])), "learned")
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.apply(_build(ViTModel), "swin_bias")
    with pytest.raises(ValueError, match="tokens encodings"):
        vpe.apply(_build(SwinModel), "learned")
    with pytest.raises(ValueError, match="rel_bias is a global"):
        vpe.apply(_build(SwinModel), "rel_bias")
    with pytest.raises(ValueError, match="use_absolute_embeddings=True is not supported"):
        vpe.apply(SwinModel(SwinConfig(**SWIN, use_absolute_embeddings=True)), "swin_bias")
    model = vpe.apply(_build(ViTModel), "learned")
    with pytest.raises(ValueError, match="each side must be a positive multiple of"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="needs a mask token"):
        model(torch.randn(1, 3, 32, 32), bool_masked_pos=torch.zeros(1, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, tokens=17\)"):
        model(torch.randn(1, 3, 32, 32), attention_mask=torch.ones(1, 16))


def test_transformers_stays_optional():
    """``import visionpe`` never imports transformers; without it the backbones load and the other adapters work."""
    probe = ("import builtins, sys, traceback\n"
             "importers, plain = [], builtins.__import__\n"
             "def recording(name, *args, **kwargs):\n"
             "    if name.split('.')[0] == 'transformers' and 'transformers' not in sys.modules:\n"
             "        importers.append(traceback.extract_stack()[-2].filename)  # the module that imports it\n"
             "    return plain(name, *args, **kwargs)\n"
             "builtins.__import__ = recording\n"
             "import visionpe as vpe\n"
             "builtins.__import__ = plain\n"
             "assert not [f for f in importers if 'visionpe' in f], importers  # torch 2.1's onnx imports it itself\n"
             "sys.modules['transformers'] = None  # as if not installed: importing it raises ImportError\n"
             "import torch, visionpe.backbones\n"
             "from torchvision.models.vision_transformer import VisionTransformer\n"
             "assert not any(a.library == 'transformers' for a in vpe.backbones.ADAPTERS.values())\n"
             "m = vpe.apply(VisionTransformer(16, 4, 1, 2, 16, 32, num_classes=3), 'rope_mixed')\n"
             "print(tuple(m(torch.randn(1, 3, 24, 16)).shape))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "(1, 3)", done.stderr


@KWARGS
def test_grid_offset_reaches_the_encodings_through_the_task_model():
    """``grid_offset`` (a crop of a larger image) travels with the call: a 2x2 crop at offset (1, 2) reads that window
    of the learned 4x4 table, through the classification head's forward too."""
    model = vpe.apply(_build(ViTForImageClassification), "learned")
    x = torch.randn(2, 3, 16, 16)
    tokens, layout = model.vit.embed(x, grid_offset=(1, 2))
    patches = model.vit.embeddings.patch_embeddings.projection(x).flatten(2).transpose(1, 2)
    window = model.vit.pe_tokens.table[1:3, 2:4].reshape(4, -1)
    assert layout.grid.offset == (1, 2) and (tokens[:, 1:] - (patches + window)).abs().max() < 1e-6
    with torch.no_grad():
        shifted = model(x, grid_offset=(1, 2)).logits
        assert not torch.allclose(shifted, model(x).logits)
        assert torch.equal(shifted, model.classifier(model.vit(x, grid_offset=(1, 2)).last_hidden_state[:, 0]))


def test_apply_twice_switches_encoding_and_keeps_the_table():
    ref = _build(DeiTForImageClassification)
    model = vpe.apply(copy.deepcopy(ref), "learned")
    table = model.deit.pe_tokens.table.detach().clone()
    vpe.apply(model, "rope_mixed+learned")
    assert model.pe == "rope_mixed+learned" and torch.equal(model.deit.pe_tokens.table, table)
    assert len(vpe.encodings_of(model)["rotary"]) == 2
    vpe.apply(model, "learned")  # RoPE removed again: transformers' logits
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x).logits - ref(x).logits).abs().max() < 1e-5


def test_apply_twice_to_swin_keeps_its_table():
    ref = _build(SwinForImageClassification)
    model = vpe.apply(copy.deepcopy(ref), "swin_bias")
    vpe.apply(model, "rope_axial+swin_bias")
    vpe.apply(model, "swin_bias")
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        assert (model(x).logits - ref(x).logits).abs().max() < 1e-5
