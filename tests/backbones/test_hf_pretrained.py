"""Hugging Face round trips of patched transformers models: ``save_pretrained`` records the encoding, and
``vpe.from_pretrained`` gives back the same model (transformers' own loading is the path under test; tiny configs,
local folders, nothing downloaded)."""
import copy
import json
import os
import re
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported here: the tests never reach the hub
transformers = pytest.importorskip("transformers")
from transformers import (AutoModelForImageClassification, DeiTConfig,  # noqa: E402
                          DeiTForImageClassificationWithTeacher, Dinov2Config, Dinov2ForImageClassification,
                          Dinov2Model, ResNetModel, SwinConfig, SwinForImageClassification, SwinModel, ViTConfig,
                          ViTForImageClassification, ViTModel)

import visionpe as vpe  # noqa: E402
from test_hf import DINO, SWIN, VIT  # noqa: E402  (the tiny configs of the adapter's tests)
from conftest import perturbed  # noqa: E402

# (class, its config, pe, pe keywords): every family's trained weights (frequencies, a table taken over from the
# model, a bias MLP, a Swin table) and keywords JSON holds as lists
CASES = [(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {"theta": 10.0}),
         (ViTModel, ViTConfig(**VIT), "cpb+rope_axial", {"hidden_dim": 16, "scaling": "pi", "ref_shape": (4, 4)}),
         (DeiTForImageClassificationWithTeacher, DeiTConfig(**VIT), "learned+lookhere", {}),
         (Dinov2ForImageClassification, Dinov2Config(**DINO), "native", {}),
         (SwinForImageClassification, SwinConfig(**SWIN, use_absolute_embeddings=False), "native", {})]


def _trained(cls, config, pe, pe_kwargs):
    """A patched model whose every weight, the encoding's included, moved away from its initialisation."""
    torch.manual_seed(0)
    model = vpe.apply(cls(config), pe, **pe_kwargs)
    perturbed(model)
    return model.eval()


def _main(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _outputs(model, sizes=((32, 32), (48, 40))):
    torch.manual_seed(1)
    with torch.no_grad():
        return [_main(model(torch.randn(2, 3, *size))) for size in sizes]


@pytest.mark.parametrize("cls,config,pe,pe_kwargs", CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_save_pretrained_then_from_pretrained_gives_back_the_model(cls, config, pe, pe_kwargs, tmp_path):
    """The folder is transformers' (config.json naming the original class, model.safetensors) with the encoding
    recorded; loading it builds the patched class, transformers reports no key missing, unexpected or mismatched,
    every tensor (the trained encoding parameters included) and the logits at two sizes are the saved model's."""
    model = _trained(cls, config, pe, pe_kwargs)
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [cls.__name__]
    entry = saved["visionpe"]
    assert entry["pe"] == model.pe != "native"  # native recorded as what it stands for
    assert entry["pe_kwargs"] == json.loads(json.dumps(pe_kwargs)) and entry["version"] == vpe.__version__
    loaded, info = vpe.from_pretrained(cls, tmp_path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # no missing, unexpected, mismatched key, no error
    assert type(loaded) is type(model) and loaded.pe == model.pe and not loaded.training
    expected, state = model.state_dict(), loaded.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    for ours, theirs in zip(_outputs(loaded), _outputs(model)):
        assert (ours - theirs).abs().max() <= 1e-6


def test_the_recorded_encoding_is_applied_to_a_fresh_model_from_its_config(tmp_path):
    """``cls(config)`` of a saved config builds the encoding (what transformers' loading relies on), and the
    folder's config loads through an ``AutoModel`` class and through the patched class's own ``from_pretrained``;
    a second save of the loaded model writes the same folder."""
    model = _trained(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {"theta": 10.0})
    model.save_pretrained(tmp_path / "a")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "a")
    fresh = type(model)(config)
    assert fresh.pe == "rope_mixed" and vpe.encodings_of(fresh)["rotary"][0].theta == 10.0
    expected = _outputs(model)
    for loaded in (vpe.from_pretrained(AutoModelForImageClassification, tmp_path / "a"),
                   type(model).from_pretrained(tmp_path / "a")):
        assert type(loaded) is type(model)
        assert all(torch.equal(a, b) for a, b in zip(_outputs(loaded), expected))
    loaded.save_pretrained(tmp_path / "b")
    first, second = ({k: v for k, v in json.loads((tmp_path / f / "config.json").read_text()).items()
                      if k != "_name_or_path"} for f in "ab")  # transformers 4 writes where the model came from
    assert first == second


def _siglip2_classifier_config():
    siglip2 = pytest.importorskip("transformers.models.siglip2", reason="transformers >= 4.49 has SigLIP 2")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the SigLIP 2 adapter takes transformers 5's tower")
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, patch_size=4,
                  num_patches=16)
    text = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    return siglip2.Siglip2ForImageClassification, siglip2.Siglip2Config(text_config=text, vision_config=vision,
                                                                        num_labels=3)


@pytest.mark.parametrize("build", [lambda: (ViTForImageClassification, ViTConfig(**VIT)),
                                   lambda: (ViTModel, ViTConfig(**VIT)),
                                   lambda: (SwinForImageClassification,
                                            SwinConfig(**SWIN, use_absolute_embeddings=False)),
                                   _siglip2_classifier_config], ids=["vit-classifier", "vit", "swin", "siglip2"])
def test_apply_never_writes_into_the_callers_config(build, tmp_path):
    """Issue 43: ``vpe.apply(cls(cfg), pe)`` records the encoding in the model's own copy of ``cfg`` (and of its
    sub-configs): ``cfg`` stays as transformers' own construction leaves it, so a plain model built later from it
    saves no ``visionpe`` entry, and ``vpe.from_pretrained`` of that folder refuses it instead of giving it a fresh
    encoding; no module of the patched model holds the caller's config (or a sub-config of it)."""
    cls, config = build()
    plain = copy.deepcopy(config)
    cls(plain)  # what transformers' own construction writes into a config (4.46: _attn_implementation_autoset)
    model = vpe.apply(cls(config), "rope_mixed")
    assert config.to_dict() == plain.to_dict() and "visionpe" not in config.to_dict()
    assert model.config is not config and model.config.to_dict()["visionpe"]["pe"] == "rope_mixed"
    callers = {id(config)} | {id(getattr(config, k)) for k in getattr(config, "sub_configs", {})}
    assert not [name for name, m in model.named_modules() if id(vars(m).get("config")) in callers]
    cls(config).save_pretrained(tmp_path)
    assert "visionpe" not in json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="has no 'visionpe' entry"):
        vpe.from_pretrained(cls, tmp_path)


def test_plain_transformers_still_reads_the_folder(tmp_path):
    """The folder stays transformers': the original class loads it (without the encoding: the keys it lacks are
    reported by transformers), so nothing of visionpe's is needed to open it."""
    model = _trained(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {})
    model.save_pretrained(tmp_path)
    plain, info = ViTForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert type(plain) is ViTForImageClassification
    assert any("rotary" in k for k in info["unexpected_keys"])
    assert any("position_embeddings" in k for k in info["missing_keys"])


def test_save_pretrained_with_push_to_hub_uploads_after_the_config_is_written(tmp_path, monkeypatch):
    """``save_pretrained(..., push_to_hub=True)`` writes the folder (original class, encoding entry) and only then
    calls ``push_to_hub`` with the hub keywords (recorded here: nothing leaves the machine)."""
    model = _trained(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {})
    pushed = []
    monkeypatch.setattr(type(model), "push_to_hub", lambda self, repo_id, **kw: pushed.append(
        (repo_id, kw, json.loads((tmp_path / "config.json").read_text())["architectures"])))
    model.save_pretrained(tmp_path, push_to_hub=True, repo_id="me/vit-rope", commit_message="rope", private=True)
    assert pushed == [("me/vit-rope", {"token": None, "commit_message": "rope", "private": True},
                       ["ViTForImageClassification"])]


def test_apply_then_load_weights_is_the_other_route(tmp_path):
    """``vpe.save_weights`` / ``vpe.load_weights`` into a model given the same encoding: the same logits."""
    model = _trained(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {})
    vpe.save_weights(model, tmp_path / "w.safetensors")
    other = vpe.apply(ViTForImageClassification(ViTConfig(**VIT)), "rope_mixed").eval()
    vpe.load_weights(other, tmp_path / "w.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(_outputs(other), _outputs(model)))


def test_bad_input_is_named(tmp_path):
    model = _trained(ViTForImageClassification, ViTConfig(**VIT), "rope_mixed", {})
    plain = ViTForImageClassification(ViTConfig(**VIT))
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="no 'visionpe' entry"):
        vpe.from_pretrained(ViTForImageClassification, tmp_path / "plain")
    model.save_pretrained(tmp_path / "pe")
    with pytest.raises(ValueError, match="cls='ResNetModel' is not a transformers model class visionpe patches"):
        vpe.from_pretrained(ResNetModel, tmp_path / "pe")
    with pytest.raises(TypeError, match="cls must be a transformers model class"):
        vpe.from_pretrained("ViTForImageClassification", tmp_path / "pe")
    unsaveable = vpe.apply(ViTForImageClassification(ViTConfig(**VIT)), "rope_mixed",
                           generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="pe keyword generator=.*cannot be written to config.json"):
        unsaveable.save_pretrained(tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "backbones.md"
SECTION = GUIDE.read_text().split("## Hugging Face transformers")[1].split("\n## ")[0]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, re.S)


def _said(block: str) -> list[str]:
    """What each ``print`` of a block says it prints: its own comment, or the comment line under it."""
    lines = [line.strip() for line in block.splitlines()]
    return [line.split("  # ", 1)[1] if "  # " in line else lines[i + 1].removeprefix("# ")
            for i, line in enumerate(lines) if line.startswith("print(")]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_the_guides_blocks_run_and_print_what_they_say(block, capsys):
    """docs/backbones.md's Hugging Face blocks run as they are and print what their comments say."""
    if "DINOv3ViTModel" in block:
        pytest.importorskip("transformers.models.dinov3_vit", reason="transformers >= 4.56 has DINOv3")
    exec(compile(block, str(GUIDE), "exec"), {})
    assert capsys.readouterr().out.splitlines() == _said(block)


def test_a_missing_folder_is_named_as_one(tmp_path):
    """A path that can only be a folder and is none is "not found", not transformers' "Repo id must be in the
    form" (issue 43); a file is not a folder."""
    (tmp_path / "file.json").write_text("{}")
    for path in (tmp_path / "missing", str(tmp_path / "missing"), "./missing-run", str(tmp_path / "file.json")):
        with pytest.raises(ValueError, match=r"pretrained_model_name_or_path .*: folder (not found|is a file)"):
            vpe.from_pretrained(ViTForImageClassification, path)


@pytest.mark.parametrize("cls,config", [(Dinov2Model, Dinov2Config(**DINO)),
                                        (SwinModel, SwinConfig(**SWIN, use_absolute_embeddings=False))],
                         ids=["Dinov2Model", "SwinModel"])
def test_an_encoding_missing_from_the_checkpoint_gets_its_initialisation_not_uninitialised_memory(cls, config,
                                                                                                  tmp_path):
    """A stock checkpoint loaded into a patched class (its config carrying the encoding): transformers 5 builds the
    model on the meta device and initialises what the checkpoint lacks module by module, a sub-model (Dinov2Encoder,
    SwinEncoder: ``PreTrainedModel``s of their own) by its own ``_init_weights``, which knows no encoding; the
    encoding's parameters are its own initialisation: RoPE-Mixed's frequency of each pair, the norm of its vector
    over the axes, the same in every head (a closed form of its initialisation), as in a model built by __init__."""
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path)  # the stock weights, no encoding
    patched_config = vpe.apply(cls(config), "rope_mixed").config
    loaded = vpe.from_pretrained(cls, tmp_path, config=patched_config)
    built = type(loaded)(patched_config)
    pairs = [(name, p, dict(built.named_parameters())[name]) for name, p in loaded.named_parameters()
             if name.endswith("rotary.freqs")]
    assert pairs
    for name, ours, fresh in pairs:  # (axes, heads, pairs)
        assert torch.isfinite(ours).all(), name
        torch.testing.assert_close(ours.norm(dim=0), fresh.norm(dim=0), msg=name)


def test_a_patched_class_initialises_the_stock_weights_as_the_stock_class_does():
    """Built from its config with the same seed, a patched SigLIP 2 classifier holds the stock class's initial
    weights (xavier projections and MLPs: transformers 5 would skip those branches of ``_init_weights`` for a class
    it takes for custom code), the embeddings aside (initialised again without the table the encoding replaced)."""
    cls, config = _siglip2_classifier_config()
    applied = vpe.apply(cls(config), "rope_mixed")
    torch.manual_seed(0)
    stock = cls(copy.deepcopy(config)).state_dict()
    torch.manual_seed(0)
    patched = type(applied)(applied.config).state_dict()
    shared = [k for k in stock if k in patched and ".embeddings." not in k]
    assert len(shared) > 20 and any("self_attn.q_proj" in k for k in shared) and any("mlp.fc1" in k for k in shared)
    assert [k for k in shared if not torch.equal(stock[k], patched[k])] == []
