"""Hugging Face round trips of a patched transformers model: ``save_pretrained`` records the encoding in
``config.json``, :func:`from_pretrained` rebuilds the model with it, weights and all.

What a folder holds: what transformers writes (``config.json`` and ``model.safetensors``, ready for ``push_to_hub``),
with ``"architectures"`` naming the original class (``ViTForImageClassification``, not visionpe's patched subclass)
and one more entry, ``"visionpe": {"pe", "pe_kwargs", "version", "note"}``: the encoding and its keywords as
:func:`~visionpe.apply` was given them (``pe="native"`` resolved to what it stands for), the visionpe release that
wrote it, and a sentence saying how to load it.

How a folder is loaded, in one call: :func:`from_pretrained` (``vpe.from_pretrained(ViTForImageClassification,
path)``) reads the entry and hands the folder to the patched class's own ``from_pretrained``; its ``__init__``
applies the recorded encoding to the freshly built model (:class:`PretrainedPositionalModel`), so transformers
loads the checkpoint into a model whose keys are the checkpoint's: no key is reported missing or unexpected, and the
trained encoding parameters (frequencies, tables, bias MLPs) are loaded, not initialised. Why so, and not a config
class or ``trust_remote_code``: the folder stays loadable by plain transformers (``ViTForImageClassification
.from_pretrained(path)`` or ``AutoModel``), which builds the original architecture and reports what it drops (the
encoding's weights as unexpected, a position table the encoding replaced as newly initialised); no code of
visionpe's travels with the folder or runs from the Hub.

Keys are transformers' own: with transformers 5, whose ``save_pretrained`` writes checkpoints in transformers 4's
key layout, the patched classes get the same conversions as the classes they patch (and the renames of the
encodings' own keys between the two layouts), so a folder written under either release loads under the other.
"""
from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping

import torch
from torch import nn

from ..encoding import Encoding
from .adapter import ADAPTERS, UNAVAILABLE, Adapter, PositionalModel

ENTRY = "visionpe"  # the key of the encoding's record in config.json
HUB_KEYWORDS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token",
                "trust_remote_code")  # what from_pretrained's config read takes from the caller's keywords


def encoding_entry(pe: str, pe_kwargs: Mapping, architecture: str) -> dict:
    """The ``config.json`` record of an encoding: ``pe``, its keywords as JSON (tuples become lists), the visionpe
    version and a note; a ``ValueError`` naming a keyword JSON cannot hold (a tensor, a dtype, a function)."""
    from .. import __version__  # noqa: PLC0415  (visionpe imports its backbones lazily, never the other way)
    for key, value in pe_kwargs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(f"pe keyword {key}={value!r} cannot be written to config.json (JSON holds numbers, "
                             f"strings, booleans, None, lists and dicts); apply the encoding with a JSON value to save "
                             f"the model with save_pretrained, or save its weights with vpe.save_weights") from None
    note = (f"written by visionpe {__version__}: visionpe.from_pretrained({architecture}, path) rebuilds the model "
            f"with its encoding pe={pe!r}; transformers alone loads {architecture} without it (it reports the "
            f"encoding's weights as unexpected and initialises anew the position weights the encoding replaced)")
    return {"pe": pe, "pe_kwargs": json.loads(json.dumps(dict(pe_kwargs))), "version": __version__, "note": note}


def as_keywords(value):
    """JSON's lists back to the tuples visionpe's keywords take (shapes, per-axis values), recursively."""
    if isinstance(value, list):
        return tuple(as_keywords(v) for v in value)
    if isinstance(value, dict):
        return {k: as_keywords(v) for k, v in value.items()}
    return value


def own_config(model: nn.Module) -> None:
    """``model`` and its modules get a copy of the config (and sub-configs) they share with the caller, so what
    :func:`~visionpe.apply` records is the model's alone: a model built later from the caller's config is a plain one.
    Every module that held the config (or one of its sub-configs) holds the copy's counterpart."""
    memo: dict = {}
    copy.deepcopy(model.config, memo)
    for module in model.modules():
        held = vars(module).get("config")
        if held is not None and id(held) in memo:
            module.config = memo[id(held)]


def no_split_patched_layers(model: nn.Module) -> None:
    """Each transformers model in ``model`` with ``_no_split_modules`` (accelerate's device maps, by class name) names
    the patched subclass of every module class it names (``GridViTLayer`` beside ``ViTLayer``)."""
    patched = {type(m).__name__: {c.__name__ for c in type(m).__mro__} for m in model.modules()}
    for module in model.modules():
        names = vars(module).get("_no_split_modules", getattr(type(module), "_no_split_modules", None))
        if not names:
            continue
        names = set(names)
        module._no_split_modules = names | {name for name, bases in patched.items() if bases & names}


def replaced_table(module: nn.Module) -> str | None:
    """The name of the position table an encoding replaced in ``module`` (set to None: a ViT's
    ``position_embeddings`` parameter, SigLIP 2's ``position_embedding`` module), or None."""
    if getattr(module, "_parameters", {}).get("position_embeddings", False) is None:
        return "position_embeddings"
    if getattr(module, "_modules", {}).get("position_embedding", False) is None:
        return "position_embedding"
    return None


class PretrainedPositionalModel(PositionalModel):
    """Mixin of the patched transformers models: their ``save_pretrained`` and ``from_pretrained`` keep the encoding.

    Built from a config that carries a ``visionpe`` entry (``from_pretrained`` of a saved folder, or ``cls(config)``),
    the model applies that encoding at the end of its construction (:meth:`post_init`), before any weight is loaded
    into it.
    """

    def post_init(self) -> None:
        """transformers' ``post_init`` (the last step of every model's ``__init__``), then the config's ``visionpe``
        entry applied, once. The patched classes define no ``__init__``: they take the stock class's arguments, under
        its signature (``use_mask_token``, ``add_pooling_layer``, ...). The encodings, and the embeddings whose
        position table the encoding replaced, are then initialised again as transformers initialises a module
        (``init_weights``; nothing on the meta device), so that a model built by ``__init__`` and one that
        ``from_pretrained`` materialises from the meta device get their values by the same route (transformers'
        ``test_can_init_all_missing_weights``)."""
        super().post_init()
        entry = getattr(self.config, ENTRY, None)
        if entry is not None and "pe" not in vars(self):
            from .api import apply  # noqa: PLC0415  (api imports the adapters' registry, which imports this module)
            apply(self, entry["pe"], **as_keywords(entry.get("pe_kwargs") or {}))
            for module in self.modules():  # initialised again: what the encoding put in, what lost its position table
                if isinstance(module, Encoding) or replaced_table(module):
                    module._is_hf_initialized = False
            self.init_weights()

    def applied(self, pe: str, pe_kwargs: dict) -> None:
        """Record the encoding in the model's own copy of its config (what ``save_pretrained`` writes; the caller's
        config object is never written to); a keyword JSON cannot hold is kept as the reason the model cannot be
        saved that way (raised by ``save_pretrained``, not by ``apply``). The patched layers join
        ``_no_split_modules`` beside the stock ones they replace."""
        super().applied(pe, pe_kwargs)
        own_config(self)
        no_split_patched_layers(self)
        try:
            setattr(self.config, ENTRY, encoding_entry(pe, pe_kwargs, self.pe_adapter.base.__name__))
            self.__dict__.pop("unsaved_encoding", None)
        except ValueError as err:
            setattr(self.config, ENTRY, None)
            self.__dict__["unsaved_encoding"] = str(err)

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' initialisation of one module; an embeddings' position table the encoding replaced (None: a
        ViT's ``position_embeddings`` parameter, SigLIP 2's ``position_embedding`` module) stands in empty for the
        call, as transformers initialises it without looking (e.g. when loading a checkpoint into a ``ViTModel``,
        whose embeddings transformers 4 always initialises first). An encoding is initialised as its constructor does
        (``reset_parameters``), so a model built on the meta device (``from_pretrained`` of a checkpoint without the
        encoding's weights) holds no uninitialised memory."""
        if isinstance(module, Encoding):  # what transformers does not know: the encoding's own initialisation, unless
            if not any(getattr(p, "_is_hf_initialized", False) for p in module.parameters()):  # loaded already
                with torch.no_grad():
                    module.reset_parameters()
            return
        if hasattr(module, "as_stock"):  # a patched attention (hf.GridAttention): initialised as the stock one it replaced
            return super()._init_weights(module.as_stock())
        name = replaced_table(module)
        if name is None:
            return super()._init_weights(module)
        stand_in = nn.Parameter(torch.empty(1, 0, 1)) if name == "position_embeddings" else nn.Embedding(0, 1)
        setattr(module, name, stand_in)
        try:
            super()._init_weights(module)
        finally:
            setattr(module, name, None)

    def _initialize_weights(self, module: nn.Module, is_custom_code: bool = False) -> None:
        """transformers' initialisation of one module, as for the stock class. A patched class is defined in
        visionpe, which transformers 5 takes for custom code, and then skips the stock ``_init_weights``' branches for
        modules without parameters of their own (SigLIP 2's attention and MLP, whose projections it initialises with
        xavier): the patched model would start otherwise than the stock one."""
        super()._initialize_weights(module)

    def initialize_weights(self) -> None:
        """transformers 5's initialisation of every module not initialised yet, then each encoding's own by
        :meth:`_init_weights` (unless its weights were loaded): a sub-model of the stock classes (transformers 5's
        ``Dinov2Encoder``, ``SwinEncoder``, ...) is a ``PreTrainedModel`` that initialises the modules under it with its
        own ``_init_weights``, which knows no encoding and would leave its parameters as the meta device's
        materialisation left them (uninitialised memory)."""
        super().initialize_weights()
        for module in self.modules():
            if isinstance(module, Encoding):
                module._is_hf_initialized = False
                self._initialize_weights(module)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained`` of the patched class (the folder's encoding applied by ``__init__``),
        with the encodings' derived buffers recomputed: transformers builds the model on the meta device and
        materialises the buffers no checkpoint holds empty."""
        out = super().from_pretrained(*args, **kwargs)
        model = out[0] if isinstance(out, tuple) else out  # (model, loading info) with output_loading_info=True
        for module in model.modules():
            if isinstance(module, Encoding):
                module.reset_buffers()
        return out

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """transformers' ``save_pretrained`` with the encoding in ``config.json`` and the original class in its
        ``"architectures"``; ``push_to_hub=True`` uploads the folder so written (``push_to_hub``'s keywords:
        ``repo_id``, default the folder's name, ``commit_message``, ``private``, ``token``, ``create_pr``)."""
        if "unsaved_encoding" in self.__dict__:
            raise ValueError(self.__dict__["unsaved_encoding"])
        hub = {k: kwargs.pop(k) for k in ("commit_message", "private", "create_pr") if k in kwargs}
        repo_id = kwargs.pop("repo_id", os.path.basename(os.path.normpath(os.fspath(save_directory))))
        out = super().save_pretrained(save_directory, *args, **kwargs)
        self.config.architectures = [self.pe_adapter.base.__name__]  # transformers wrote the patched class's name
        if kwargs.get("is_main_process", True):
            self.config.save_pretrained(save_directory)
        if push_to_hub:
            self.push_to_hub(repo_id, token=kwargs.get("token"), **hub)
        return out


def register_conversions(patched: type, base: type, encodings_4: str | None = None, replaced: tuple = ()) -> None:
    """Give ``patched`` the checkpoint conversions transformers 5 has for ``base`` (by class name, else by model
    type): they turn transformers 4's keys into 5's on loading and back on saving, and transformers applies them to a
    class of another module only when registered under its name. ``encodings_4``: where transformers 4's layout puts
    the encodings of a block (``"attention.attention"``: inside the self-attention), renamed to 5's ``attention.``
    both ways. ``replaced``: names of modules the patched class no longer has (Swin's ``relative_position_bias``, taken
    over by the bias encoding), whose renames are left out (transformers checks each rename applies to some key).
    Nothing to do with transformers 4 (it has no conversions; its keys are the saved ones)."""
    try:
        from transformers.conversion_mapping import (get_checkpoint_conversion_mapping,  # noqa: PLC0415
                                                     register_checkpoint_conversion_mapping)
        from transformers.core_model_loading import WeightRenaming  # noqa: PLC0415
    except ImportError:
        return
    conversions = get_checkpoint_conversion_mapping(base.__name__) or \
        get_checkpoint_conversion_mapping(base.config_class.model_type)
    if conversions is None:
        return
    conversions = [c for c in conversions if not any(name in target for name in replaced for target in
                                                     getattr(c, "target_patterns", ()))]
    if encodings_4 is not None:  # one pattern for both slots: transformers checks each pattern renames some key
        conversions.append(WeightRenaming(re.escape(f"{encodings_4}.") + r"(rotary|bias)\.", r"attention.\1."))
    register_checkpoint_conversion_mapping(patched.__name__, conversions, overwrite=True)


def patched_class(cls: type, config) -> tuple[type, Adapter]:
    """The patched class (and adapter) of a transformers model class: the class itself when patched, the adapter's
    ``patched`` for the class it takes, the model an ``AutoModel*`` class maps ``config`` to."""
    mapping = getattr(cls, "_model_mapping", None)
    if mapping is not None:  # transformers' AutoModel, AutoModelForImageClassification, ...
        try:
            cls = mapping[type(config)]
        except KeyError:
            raise ValueError(f"{cls.__name__} has no model for {type(config).__name__} (model_type="
                             f"{config.model_type!r})") from None
    for adapter in ADAPTERS.values():
        if cls in (adapter.base, adapter.patched) and adapter.library == "transformers":
            return adapter.patched, adapter
    supported = ", ".join(a.base.__name__ for a in ADAPTERS.values() if a.library == "transformers")
    raise ValueError(f"cls={getattr(cls, '__name__', cls)!r} is not a transformers model class visionpe patches; "
                     f"supported: {supported} (or an AutoModel class mapping the folder's config to one)")


def check_local_folder(path) -> None:
    """``path`` that can only be a local folder (a ``PathLike``, absolute, starting with ``.`` or ``~``, or with more
    than one ``/``: no Hub id, ``name`` or ``owner/name``, looks so) is one: a ValueError saying it is not found,
    where transformers would say "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if text is None or os.path.isdir(text):
        return
    local = isinstance(path, os.PathLike) or os.path.isabs(text) or text.startswith((".", "~")) \
        or text.count("/") > 1 or os.path.exists(text)
    if local:
        what = "is a file, not a folder" if os.path.isfile(text) else "not found"
        raise ValueError(f"pretrained_model_name_or_path {text!r}: folder {what} (a folder written by "
                         f"save_pretrained, or a Hub id 'name' or 'owner/name')")


def from_pretrained(cls: type, pretrained_model_name_or_path, *model_args, **kwargs) -> nn.Module:
    """A transformers model saved by ``save_pretrained`` after :func:`~visionpe.apply`, rebuilt with its encoding.

    >>> model = vpe.from_pretrained(ViTForImageClassification, "my-vit-rope-mixed")  # a folder or a Hub id

    Args:
        cls: the transformers class to build (``ViTForImageClassification``, ``SwinModel``, ...), its visionpe
            subclass, or an ``AutoModel*`` class.
        pretrained_model_name_or_path: a folder written by the patched model's ``save_pretrained`` (or a Hub id of
            one).
        model_args, kwargs: transformers' ``from_pretrained`` arguments (``dtype``, ``device_map``, ``revision``,
            ...).
    Returns:
        The patched model (evaluation mode, as transformers returns it) with the saved encoding and every saved
        weight, the encoding's trained parameters included. A folder without a ``visionpe`` entry is a
        ``ValueError``: load it with ``cls.from_pretrained`` and :func:`~visionpe.apply` an encoding.
    """
    from transformers import AutoConfig  # noqa: PLC0415  (importing it registers the adapters: backbones/__init__.py)
    if "transformers" in UNAVAILABLE:
        raise ImportError(UNAVAILABLE["transformers"])
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a transformers model class (e.g. ViTForImageClassification), got "
                        f"{type(cls).__name__}")
    check_local_folder(pretrained_model_name_or_path)
    config = kwargs.pop("config", None)
    if config is None:
        config = AutoConfig.from_pretrained(pretrained_model_name_or_path,
                                            **{k: kwargs[k] for k in HUB_KEYWORDS if k in kwargs})
    if not isinstance(getattr(config, ENTRY, None), Mapping) or "pe" not in getattr(config, ENTRY):
        raise ValueError(f"{pretrained_model_name_or_path} has no {ENTRY!r} entry in its config.json: it was not "
                         f"saved from a model with visionpe encodings; load it with {cls.__name__}.from_pretrained "
                         f"and give it an encoding with visionpe.apply(model, pe)")
    patched, _ = patched_class(cls, config)
    return patched.from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)

