"""transformers' common model tests (``ModelTesterMixin``, from ``tests/test_modeling_common.py`` of the installed
release's sdist) on every Hugging Face family visionpe adapts: the stock classes and the patched ones through the same
test functions. Not collected by visionpe's suite (no ``test_`` prefix): ``test_hf_contract.py`` runs it in a pytest
subprocess, one family a run, and compares the outcomes (junit XML).

The sdist holds the harness but none of transformers' per-model test files (``tests/models/``), nor the
``tests/exporters`` and ``tests/generation`` packages the harness imports its two other mixins from; so the testers
here are visionpe's own (tiny configs and inputs, the classes' flags as transformers' own model tests set them), and
``ExportTesterMixin`` and ``GenerationTesterMixin`` are empty stand-ins (their export and generate tests are not run).
The harness is imported as ``hf_peer_tests.test_modeling_common`` (transformers' ``tests`` would clash with ours).

A patched class is built as transformers builds any model: from a config, here one carrying a ``visionpe`` entry
(what ``save_pretrained`` writes), so ``ViTModelPE(config)`` builds the stock model and :func:`visionpe.apply`s the
encoding to it, and ``from_pretrained`` of what it saved rebuilds it. The harness picks a class's inputs and labels by
its name in transformers' auto mappings (``get_values``); a patched class is looked up as the class it patches.

Environment: ``VISIONPE_PEER_SDIST`` the unpacked sdist (``tests/peers.py``).
"""
from __future__ import annotations

import importlib
import os
import random
import sys
import types
import unittest
from pathlib import Path

import numpy as np
import pytest
import torch

import visionpe as vpe  # noqa: F401  (registers the adapters with transformers imported)
from visionpe.backbones.adapter import ADAPTERS


def load_harness(sdist: Path) -> types.ModuleType:
    """The sdist's ``tests/test_modeling_common.py`` as ``hf_peer_tests.test_modeling_common``, with empty stand-ins
    for the two mixins whose packages the sdist does not ship."""
    package = types.ModuleType("hf_peer_tests")
    package.__path__ = [str(sdist / "tests")]
    sys.modules["hf_peer_tests"] = package
    for name, mixin in (("exporters.test_export", "ExportTesterMixin"), ("generation.test_utils",
                                                                         "GenerationTesterMixin")):
        parent, _ = name.split(".")
        sys.modules.setdefault(f"hf_peer_tests.{parent}", types.ModuleType(f"hf_peer_tests.{parent}"))
        stub = types.ModuleType(f"hf_peer_tests.{name}")
        setattr(stub, mixin, type(mixin, (), {}))
        sys.modules[f"hf_peer_tests.{name}"] = stub
    return importlib.import_module("hf_peer_tests.test_modeling_common")


common = load_harness(Path(os.environ["VISIONPE_PEER_SDIST"]))
PATCHED_NAMES = {a.base.__name__: a.patched.__name__ for a in ADAPTERS.values() if a.library == "transformers"}
_get_values = common.get_values


def get_values(mapping):
    """The harness's class-name lookup, with each patched class named beside the class it patches."""
    values = _get_values(mapping)
    return values + [PATCHED_NAMES[v] for v in values if v in PATCHED_NAMES]


common.get_values = get_values


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


# -- the families: a config and inputs for the common tests ----------------------------------------------------------
class Family:
    """A transformers family under test: its classes, a tiny config, inputs of a batch, the harness flags."""

    classes: tuple = ()
    pes: tuple = ("rope_mixed", "learned+rel_bias")
    flags: dict = {}
    batch_size = 3
    image_size, patch_size, num_channels = 16, 4, 3
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    prefix = 1  # class token (and distillation / register tokens)

    @property
    def seq_length(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + self.prefix

    def config(self):
        raise NotImplementedError

    def inputs(self, config) -> dict:
        return {"pixel_values": common.floats_tensor([self.batch_size, self.num_channels, self.image_size,
                                                      self.image_size])}

    def common_kwargs(self) -> dict:
        return dict(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                    num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                    initializer_range=0.02)


class ViT(Family):
    def __init__(self):
        from transformers import ViTConfig, ViTForImageClassification, ViTModel
        self.classes, self.config_class = (ViTModel, ViTForImageClassification), ViTConfig
        self.flags = dict(test_resize_embeddings=False)

    def config(self):
        return self.config_class(image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=10,
                                 encoder_stride=2, **self.common_kwargs())


class DeiT(ViT):
    prefix = 2

    def __init__(self):
        from transformers import (DeiTConfig, DeiTForImageClassification, DeiTForImageClassificationWithTeacher,
                                  DeiTModel)
        self.classes = (DeiTModel, DeiTForImageClassification, DeiTForImageClassificationWithTeacher)
        self.config_class = DeiTConfig
        self.flags = dict(test_resize_embeddings=False)


class Dinov2(ViT):
    def __init__(self):
        from transformers import Dinov2Config, Dinov2ForImageClassification, Dinov2Model
        self.classes, self.config_class = (Dinov2Model, Dinov2ForImageClassification), Dinov2Config
        self.flags = dict(test_resize_embeddings=False)

    def config(self):
        return self.config_class(image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=10,
                                 **self.common_kwargs())


class DINOv3(Family):
    pes = ("rope_mixed", "native")
    prefix = 1 + 2  # class token, two registers

    def __init__(self):
        from transformers import DINOv3ViTConfig, DINOv3ViTModel
        self.classes, self.config_class = (DINOv3ViTModel,), DINOv3ViTConfig
        self.flags = dict(test_resize_embeddings=False)

    def config(self):
        return self.config_class(image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                                 num_register_tokens=2, **self.common_kwargs())


class Swin(Family):
    pes = ("swin_bias", "cpb")
    image_size, patch_size, window = 16, 2, 2
    depths, heads = (1, 2), (2, 2)

    def __init__(self):
        from transformers import SwinConfig, SwinForImageClassification, SwinModel
        self.classes, self.config_class = (SwinModel, SwinForImageClassification), SwinConfig
        self.flags = dict(test_resize_embeddings=False)
        self.num_hidden_layers = len(self.depths)

    @property
    def seq_length(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def config(self):
        return self.config_class(image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                                 embed_dim=16, depths=list(self.depths), num_heads=list(self.heads),
                                 window_size=self.window, mlp_ratio=2.0, qkv_bias=True, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, drop_path_rate=0.1, use_absolute_embeddings=False,
                                 patch_norm=True, initializer_range=0.02, num_labels=10, encoder_stride=8,
                                 out_features=["stage1", "stage2"])


class Siglip2(Family):
    image_size, patch_size = 16, 4
    num_patches = 16  # a 4 x 4 table
    prefix = 0

    def __init__(self):
        from transformers import Siglip2VisionConfig, Siglip2VisionModel
        self.classes, self.config_class = (Siglip2VisionModel,), Siglip2VisionConfig
        self.flags = dict(test_resize_embeddings=False)

    def config(self):
        return self.config_class(patch_size=self.patch_size, num_channels=self.num_channels,
                                 num_patches=self.num_patches, **self.common_kwargs())

    def inputs(self, config) -> dict:
        width = self.num_channels * self.patch_size ** 2
        pixels = common.floats_tensor([self.batch_size, self.num_patches, width])
        shapes = torch.tensor([[4, 4]] * self.batch_size)
        return {"pixel_values": pixels, "pixel_attention_mask": torch.ones(self.batch_size, self.num_patches,
                                                                            dtype=torch.long),
                "spatial_shapes": shapes}


class Siglip2Classifier(Siglip2):
    """SigLIP 2's classifier: a tower in a ``Siglip2Config`` (with a text config it does not use)."""

    def __init__(self):
        from transformers import Siglip2Config, Siglip2ForImageClassification
        self.classes, self.config_class = (Siglip2ForImageClassification,), Siglip2Config
        self.flags = dict(test_resize_embeddings=False)

    def config(self):
        vision = dict(patch_size=self.patch_size, num_channels=self.num_channels, num_patches=self.num_patches,
                      **self.common_kwargs())
        text = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
        return self.config_class(text_config=text, vision_config=vision, num_labels=10)


class Qwen3VL(Family):
    pes = ("rope_mixed", "native")
    patch_size, temporal_patch_size, merge = 4, 2, 2

    def __init__(self):
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
        self.classes, self.config_class = (Qwen3VLVisionModel,), Qwen3VLVisionConfig
        self.flags = dict(test_resize_embeddings=False, has_attentions=False)

    @property
    def seq_length(self) -> int:  # the packed patches of the batch: 4 x 4 patches an image
        return self.batch_size * 16

    def config(self):
        return self.config_class(depth=self.num_hidden_layers, hidden_size=self.hidden_size, hidden_act="gelu",
                                 intermediate_size=self.intermediate_size, num_heads=self.num_attention_heads,
                                 in_channels=self.num_channels, patch_size=self.patch_size,
                                 spatial_merge_size=self.merge, temporal_patch_size=self.temporal_patch_size,
                                 out_hidden_size=self.hidden_size, num_position_embeddings=16,
                                 deepstack_visual_indexes=[0], initializer_range=0.02)

    def inputs(self, config) -> dict:
        width = self.num_channels * self.temporal_patch_size * self.patch_size ** 2
        return {"hidden_states": common.floats_tensor([self.seq_length, width]),
                "grid_thw": torch.tensor([[1, 4, 4]] * self.batch_size)}


FAMILIES = {"vit": ViT, "deit": DeiT, "dinov2": Dinov2, "dinov3": DINOv3, "swin": Swin, "siglip2": Siglip2,
            "siglip2_classifier": Siglip2Classifier, "qwen3_vl": Qwen3VL}


class Tester:
    """The harness's ``model_tester``: a family's config (with the ``visionpe`` entry ``pe``, or none: stock) and
    inputs."""

    def __init__(self, parent, family: Family, pe: str | None):
        self.parent, self.family, self.pe = parent, family, pe
        for name in ("batch_size", "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "seq_length"):
            setattr(self, name, getattr(family, name))
        self.is_training = True
        num_patches = (family.image_size // family.patch_size) ** 2
        self.mask_length, self.num_masks = num_patches, num_patches // 2  # bool_masked_pos: (batch, patches)

    def get_config(self):
        config = self.family.config()
        if self.pe is not None:
            config.visionpe = {"pe": self.pe, "pe_kwargs": {}}
        return config

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        return config, self.family.inputs(config)


def contract_case(key: str, pe: str | None) -> type:
    """The ``unittest`` case of family ``key`` with encoding ``pe`` (None: the stock classes)."""
    family = FAMILIES[key]()
    patched = {a.base: a.patched for a in ADAPTERS.values() if a.library == "transformers"}
    classes = family.classes if pe is None else tuple(patched[c] for c in family.classes)

    def setUp(self):
        self.model_tester = Tester(self, family, pe)

    label = "stock" if pe is None else pe.replace("+", "_")
    return type(f"Test_{key}__{label}", (common.ModelTesterMixin, unittest.TestCase),
                {"all_model_classes": classes, "setUp": setUp, **family.flags})


for _key, _family in FAMILIES.items():
    for _pe in (None, *_family.pes):
        _case = contract_case(_key, _pe)
        globals()[_case.__name__] = _case
