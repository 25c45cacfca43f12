"""visionpe models in timm's registry (``vpe_<timm name>``): timm's own create_model, tags, loaders and CLI parsing
are the oracles; pretrained weights come from files the tests write (never a download)."""
import argparse
import logging
import re
import socket
import warnings
from pathlib import Path

import pytest
import timm
import timm.optim
import torch
from safetensors.torch import save_file
from timm.data import resolve_data_config
from timm.utils import ParseKwargs

import visionpe as vpe
from visionpe.backbones import PositionalModel, timm_registry
from visionpe.backbones.timm_registry import PREFIX, supported_timm_names, unsupported_timm_names

from conftest import perturbed, requires_that

VIT = "vit_small_patch16_224"
TINY = {VIT: dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10),
        "swin_tiny_patch4_window7_224": dict(img_size=32, patch_size=4, embed_dim=16, depths=(1, 1),
                                             num_heads=(2, 2), window_size=4, num_classes=10),
        "swinv2_tiny_window8_256": dict(img_size=32, patch_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2),
                                        window_size=4, num_classes=10)}
SWIN, SWINV2, DEIT = "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "deit_small_patch16_224"
TINY[DEIT] = TINY[VIT]


def _perturbed(model):
    return perturbed(model).eval()


def _logits(model, size=32):
    torch.manual_seed(123)
    with torch.no_grad():
        return model.eval()(torch.randn(2, 3, size, size))


def test_list_models_has_every_supported_architecture_and_timms_tags():
    listed = timm.list_models(f"{PREFIX}*")
    assert listed == sorted(listed, key=timm.models._registry._natural_key)
    assert set(listed) == {PREFIX + name for name in supported_timm_names()}
    for name in (VIT, "deit_small_patch16_224", "deit3_small_patch16_224", SWIN, SWINV2):
        assert PREFIX + name in listed
    assert PREFIX + "deit_tiny_distilled_patch16_224" in listed  # both heads, as transformers' DeiT
    assert not set(listed) & {PREFIX + name for name in unsupported_timm_names()}
    assert set(timm.list_models(module="timm_registry")) == set(listed)
    # the pretrained tags are timm's, and so is each tag's weight source
    tags = timm.list_pretrained(f"{VIT}.*")
    assert len(tags) > 1 and timm.list_pretrained(f"{PREFIX}{VIT}.*") == [PREFIX + t for t in tags]
    for tagged in tags:
        ours, theirs = timm.get_pretrained_cfg(PREFIX + tagged), timm.get_pretrained_cfg(tagged)
        assert (ours.hf_hub_id, ours.url, ours.tag, ours.num_classes) == \
            (theirs.hf_hub_id, theirs.url, theirs.tag, theirs.num_classes)
        assert ours.architecture == PREFIX + VIT
    assert timm.get_pretrained_cfg(PREFIX + VIT).tag == timm.get_pretrained_cfg(VIT).tag  # the same default tag


def test_registering_again_changes_nothing():
    before = timm.list_models(f"{PREFIX}*")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # timm warns when a name is registered over
        names = timm_registry.register_models()
    assert set(names) == set(before) and timm.list_models(f"{PREFIX}*") == before


def test_adapter_of_name_answers_the_constructor_and_the_adapter_at_once():
    import torchvision.models.vision_transformer as tv
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer import VisionTransformer

    from visionpe.backbones.adapter import adapter_of_name
    assert [(a.base, build) for a, build in map(adapter_of_name, (VIT, SWIN))] == [(VisionTransformer, None),
                                                                                    (SwinTransformer, None)]
    adapter, build = adapter_of_name("tv_vit_b_16")  # a name the adapter constructs itself
    model = build(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2)
    assert adapter.base is tv.VisionTransformer and type(model) is tv.VisionTransformer
    assert adapter_of_name("resnet18") == (None, None)  # timm's, but no adapter takes its module
    assert adapter_of_name("no_such_model") == (None, None)


@pytest.mark.parametrize("name,pe", [(VIT, "rope_mixed"), (SWIN, "rope_mixed"), (VIT, "rope_axial+alibi")])
def test_create_model_builds_and_trains_one_step(name, pe):
    model = timm.create_model(PREFIX + name, pe=pe, **TINY[name])
    assert isinstance(model, PositionalModel) and model.pe == pe
    rotary = vpe.encodings_of(model)["rotary"]
    assert rotary and all(r.family == "rotary" for r in rotary)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    learned_freqs = [k for k in grads if k.endswith("rotary.freqs")]
    assert (pe.startswith("rope_mixed")) == bool(learned_freqs)
    assert all(grads[k].abs().sum() > 0 for k in learned_freqs)  # the encoding is trained, not only the body
    opt.step()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert set(learned_freqs) <= set(changed) and any(k.startswith("head.") for k in changed)
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 10)  # any input size


@pytest.mark.parametrize("pe", list(vpe.available()))
def test_every_encoding_builds_through_the_registry(pe):
    if 2 not in vpe.registry.ENCODINGS[pe].ndims:
        pytest.skip(f"{pe} is defined on {vpe.registry.ENCODINGS[pe].ndims}-axis grids, not on an image ViT's")
    kwargs = dict(TINY[VIT], depth=1)
    if pe == "swin_bias":  # window attention only: the same error as visionpe.create_model
        with pytest.raises(ValueError, match="rel_bias"):
            timm.create_model(PREFIX + VIT, pe=pe, **kwargs)
        return
    model = timm.create_model(PREFIX + VIT, pe=pe, **kwargs)
    assert model.pe == pe and [e for found in vpe.encodings_of(model).values() for e in found]
    for size in (32, 48):
        out = _logits(model, size)
        assert out.shape == (2, 10) and torch.isfinite(out).all()


@pytest.mark.parametrize("kwargs,message", [(dict(pe="rope_fancy"), "'rope_fancy'"),
                                            (dict(pe="rope_mixed", pe_kwargs={"thetaa": 10}), "'thetaa'"),
                                            (dict(pe="rope_mixed", pe_kwargs="scaling=pi"), "pe_kwargs must be")])
def test_bad_pe_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        timm.create_model(PREFIX + VIT, **TINY[VIT], **kwargs)


@pytest.mark.parametrize("name,native", [(VIT, "learned"), (DEIT, "learned"), (SWIN, "swin_bias"),
                                         (SWINV2, "cpb")])
def test_default_pe_is_the_architectures_own(name, native):
    assert timm.create_model(PREFIX + name, **TINY[name]).pe == native


def _file(path, **overlay) -> dict:
    """``pretrained_cfg_overlay`` for a weights file; ``custom_load=False`` because timm 1.0.19 keeps the tag's
    (vit_small_patch16_224's default tag loads .npz files), where newer timm resets it for a file."""
    return dict(file=str(path), custom_load=False, **overlay)


def _tiny_timm_checkpoint(name, tmp_path, suffix=".safetensors"):
    """A plain timm model with perturbed weights, saved the way timm's hub files are (a state dict)."""
    torch.manual_seed(0)
    timm_model = _perturbed(timm.create_model(name, **TINY[name]))
    path = tmp_path / f"{name}{suffix}"
    state = {k: v.contiguous() for k, v in timm_model.state_dict().items()}
    save_file(state, path) if suffix == ".safetensors" else torch.save(state, path)
    return timm_model, path


@pytest.mark.parametrize("name,suffix", [(VIT, ".safetensors"), (DEIT, ".pth"), (SWIN, ".safetensors"),
                                         (SWINV2, ".pth")])
def test_pretrained_file_keeps_the_weights(name, suffix, tmp_path):
    timm_model, path = _tiny_timm_checkpoint(name, tmp_path, suffix)
    model = timm.create_model(PREFIX + name, pretrained=True, pretrained_cfg_overlay=_file(path, num_classes=10),
                              **TINY[name])
    by_hand = vpe.create_model(name, pe=model.pe, **TINY[name])
    report = vpe.load_timm_checkpoint(by_hand, path)
    assert not report.dropped and not report.new
    assert torch.equal(_logits(model), _logits(by_hand))
    assert (_logits(model) - _logits(timm_model)).abs().max() < 1e-5  # the architecture's own pe: timm's logits
    assert model.pretrained_cfg["file"] == str(path)


def test_pretrained_into_another_encoding_keeps_every_other_weight(tmp_path, caplog):
    timm_model, path = _tiny_timm_checkpoint(VIT, tmp_path)
    with caplog.at_level(logging.INFO, logger="visionpe.weights"):
        model = timm.create_model(PREFIX + VIT, pretrained=True, pe="rope_mixed", **TINY[VIT],
                                  pretrained_cfg_overlay=_file(path, num_classes=10))
    source = timm_model.state_dict()
    state = model.state_dict()
    kept = [k for k in state if k in source]
    assert len(kept) == len(source) - 1  # all but timm's pos_embed
    assert all(torch.equal(state[k], source[k]) for k in kept)
    [record] = caplog.records  # load_timm_checkpoint's one report: the grid came from timm's model, nothing assumed
    assert record.levelname == "INFO" and record.getMessage().endswith(
        "positional, not loaded: pos_embed (dropped); blocks.*.attn.rotary.freqs (2) (new)")


def test_pretrained_with_other_classes_gets_a_fresh_head(tmp_path, caplog):
    """As timm does (and its train.py's ``--pretrained-path``, which overlays ``num_classes=-1``): a checkpoint head
    of another size is discarded, and the model's own head is not replaced by the reference model's."""
    timm_model, path = _tiny_timm_checkpoint(VIT, tmp_path)
    kwargs = dict(TINY[VIT], num_classes=5)
    with caplog.at_level(logging.INFO, logger="visionpe.weights"):
        model = timm.create_model(PREFIX + VIT, pretrained=True, pretrained_cfg_overlay=_file(path, num_classes=-1),
                                  **kwargs)
    assert "classifier head, not loaded: head.weight, head.bias (new)" in caplog.text
    source, state = timm_model.state_dict(), model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in source.items() if k in state and not k.startswith("head."))
    assert torch.equal(state["pe_tokens.table"], source["pos_embed"][0, 1:].reshape(4, 4, 32))
    assert model.head.weight.shape == (5, 32)


def test_pretrained_from_a_file_never_touches_the_network(tmp_path, monkeypatch):
    _, path = _tiny_timm_checkpoint(VIT, tmp_path)
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    with pytest.raises(OSError, match="network access"):  # the guard is in place
        socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    attempts.clear()
    timm.create_model(PREFIX + VIT, pretrained=True, pretrained_cfg_overlay=_file(path), **TINY[VIT])
    assert attempts == []


def test_a_fixed_size_cfg_builds_the_model_at_its_size_and_says_it_runs_at_any():
    """timm builds a model whose cfg says ``fixed_input_size`` at the cfg's input size (a 384 px ViT has a 24x24
    pos_embed); the vpe_* model has that grid too, and its cfg says the truth: it runs at any size."""
    name, kw = "vit_base_patch16_384", dict(depth=1, embed_dim=24, num_heads=2)
    assert timm.get_pretrained_cfg(name).fixed_input_size
    ours = timm.create_model(PREFIX + name, **kw)
    assert ours.patch_embed.grid_size == timm.create_model(name, **kw).patch_embed.grid_size == (24, 24)
    assert ours.pretrained_cfg["fixed_input_size"] is False
    assert timm.get_pretrained_cfg(PREFIX + name).fixed_input_size is False
    assert ours(torch.randn(1, 3, 64, 48)).shape == (1, 1000)
    assert timm.create_model(PREFIX + name, img_size=64, **kw).patch_embed.grid_size == (4, 4)  # the caller's wins


def test_tags_choose_timms_pretrained_cfg():
    tag = "augreg_in1k"
    model = timm.create_model(f"{PREFIX}{VIT}.{tag}", **TINY[VIT])
    assert model.pretrained_cfg["tag"] == tag
    assert model.pretrained_cfg["hf_hub_id"] == timm.get_pretrained_cfg(f"{VIT}.{tag}").hf_hub_id
    assert model.pretrained_cfg["mean"] == timm.get_pretrained_cfg(f"{VIT}.{tag}").mean
    with pytest.raises(RuntimeError, match="Invalid pretrained tag"):
        timm.create_model(f"{PREFIX}{VIT}.no_such_tag", **TINY[VIT])


def test_timm_train_script_arguments(tmp_path):
    """What timm's train.py does with ``--model vpe_... --model-kwargs ...``: its ParseKwargs, its create_model
    keywords (None ones included), ``--initial-checkpoint``, its data config and its optimizer factory."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs)
    args = parser.parse_args(["--model-kwargs", "pe=rope_mixed", "pe_kwargs={'scaling': 'none'}", "img_size=32",
                              "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2"])
    train_py = dict(pretrained=False, in_chans=3, num_classes=10, drop_rate=0.0, drop_path_rate=None,
                    drop_block_rate=None, global_pool=None, bn_momentum=None, bn_eps=None, scriptable=False)
    model = timm.create_model(PREFIX + VIT, checkpoint_path="", **train_py, **args.model_kwargs)
    assert model.pe == "rope_mixed" and vpe.encodings_of(model)["rotary"][0].scaling == "none"
    config = resolve_data_config({}, model=model)
    assert config["mean"] == timm.get_pretrained_cfg(VIT).mean and config["input_size"] == (3, 224, 224)
    no_decay = {id(p) for group in timm.optim.create_optimizer_v2(model, "adamw", weight_decay=0.05).param_groups
                if group["weight_decay"] == 0.0 for p in group["params"]}
    assert id(model.blocks[0].attn.rotary.freqs) in no_decay
    # --initial-checkpoint / --resume: timm's own loader with a visionpe checkpoint
    vpe.save_weights(_perturbed(model), tmp_path / "model.safetensors")
    again = timm.create_model(PREFIX + VIT, checkpoint_path=str(tmp_path / "model.safetensors"), **train_py,
                              **args.model_kwargs)
    assert torch.equal(_logits(again), _logits(model))


@requires_that(timm.__version__ != "1.0.19", "a timm newer than 1.0.19: there, an overlay file without "
               "custom_load=False goes to the tag's .npz loader (train.py passes none; docs/backbones.md says so)")
def test_timm_train_script_reads_pretrained_path_only_with_pretrained(tmp_path):
    """timm's train.py turns ``--pretrained-path FILE`` into ``pretrained_cfg_overlay=dict(file=FILE,
    num_classes=-1)`` and passes ``pretrained=args.pretrained``: without ``--pretrained`` the file is never read (random
    weights, no message), so docs/backbones.md gives ``--pretrained --pretrained-path`` together."""
    timm_model, path = _tiny_timm_checkpoint(VIT, tmp_path)
    overlay = {"pretrained_cfg_overlay": dict(file=str(path), num_classes=-1)}  # train.py's factory_kwargs
    loaded = {}
    for pretrained in (False, True):
        torch.manual_seed(0)
        model = timm.create_model(PREFIX + VIT, pretrained=pretrained, **overlay, **TINY[VIT])
        loaded[pretrained] = torch.equal(model.state_dict()["blocks.0.attn.qkv.weight"],
                                         timm_model.state_dict()["blocks.0.attn.qkv.weight"])
    assert loaded == {False: False, True: True}
    readme = (Path(__file__).parents[2] / "docs" / "backbones.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [c for b in blocks for c in b.replace("\\\n", " ").splitlines() if c.startswith("python train.py")]
    with_file = [c for c in commands if "--pretrained-path" in c]
    assert with_file and all(re.search(r"--pretrained\s", c) for c in with_file), with_file
    assert "`--pretrained --pretrained-path FILE` your own timm checkpoint" in readme


def test_every_registered_name_builds_and_every_excluded_one_is_unsupported():
    """The scheme is checked against the installed timm: each registered name builds through the registry (one block
    a stage, narrow) with its architecture's own encoding, each name an adapter leaves out fails in visionpe saying
    why (so none is left out for nothing)."""
    def small(name):
        if "swin" in name:
            return dict(depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1), embed_dim=8)
        if timm.models.is_model_in_modules(name, ["maxxvit"]):  # two blocks in the last stages: CoAtNet's "C, T"
            return dict(embed_dim=(8, 8, 8, 8), depths=(1, 1, 2, 2), stem_width=8, transformer_dim_head=4)
        kv = dict(num_kv_heads=1) if "sapiens2" in name else {}  # its per-block tuple is for its own depth
        return dict(depth=1, embed_dim=24, num_heads=2, **kv)  # 24: every GLU MLP ratio gives an even hidden width

    for name, adapter in supported_timm_names().items():
        model = timm.create_model(PREFIX + name, **small(name))
        assert isinstance(model, PositionalModel) and model.pe == adapter.native_pe(model)[0], name
    excluded = unsupported_timm_names()
    assert excluded and not any(hasattr(timm_registry, PREFIX + n) for n in excluded)
    for name, why in excluded.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            vpe.create_model(name, **small(name))
        plain = timm.create_model(name, **small(name))
        with pytest.raises((ValueError, AttributeError)):  # not even as timm built it
            vpe.apply(plain, pe="native")


def test_create_model_features_only_is_timms_feature_wrapper_around_the_patched_model():
    """``vpe.create_model(..., features_only=True)`` as ``timm.create_model`` does it: timm's FeatureGetterNet around
    the visionpe model, at any size, equal to the registry's ``vpe_`` model with the same weights."""
    import visionpe as vpe
    kwargs = dict(img_size=32, patch_size=8, depth=2, features_only=True, out_indices=(0, 1))
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_mixed", **kwargs).eval()
    twin = timm.create_model("vpe_vit_tiny_patch16_224", pe="rope_mixed", **kwargs).eval()
    twin.load_state_dict(model.state_dict())
    assert type(model).__name__ == "FeatureGetterNet" and model.feature_info.channels() == [192, 192]
    x = torch.randn(1, 3, 48, 32)
    for ours, theirs in zip(model(x), twin(x)):
        assert ours.shape == (1, 192, 6, 4)
        torch.testing.assert_close(ours, theirs)


def test_patch_14_cfgs_declare_a_minimum_size_that_is_a_multiple_of_the_patch():
    """timm's tools pick a smaller size than the cfg's from ``min_input_size``: for a patch that divides none of
    timm's test sizes it is a multiple of the patch, and the model runs there."""
    name = "vpe_eva02_tiny_patch14_224"
    assert timm.models.get_pretrained_cfg_value(name, "min_input_size") == (3, 98, 98)
    assert timm.models.get_pretrained_cfg_value("vpe_vit_tiny_patch16_224", "min_input_size") is None
    model = timm.create_model(name, depth=1, num_classes=5).eval()
    assert model(torch.randn(1, 3, 98, 98)).shape == (1, 5)
