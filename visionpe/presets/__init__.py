"""Foundation models' positional schemes as visionpe encodings with their exact conventions.

``vpe.presets()`` lists them (name -> model: what it is); ``vpe.preset(name, **overrides)`` builds one for the
published model's sizes (a :class:`PresetScheme` holding its ``tokens`` / ``rotary`` / ``bias`` encodings);
``pe="preset:NAME"`` puts one into any backbone visionpe patches (``vpe.create_model``, ``vpe.apply``,
``train_vit.py --pe preset:NAME``). Each is a composition of registered encodings (never a second implementation),
tested against the model's own code (tests/presets/); docs/presets.md states every convention and difference.
"""
from . import catalog  # noqa: F401  (fills the catalogue)
from .orders import attention_windows, merge_windows, prefix_last
from .preset import (PRESET_PREFIX, PRESETS, Preset, PresetNames, PresetScheme, conventions_of, get_preset, preset,
                     preset_names, presets)

__all__ = ["PRESETS", "PRESET_PREFIX", "Preset", "PresetNames", "PresetScheme", "attention_windows",
           "conventions_of", "get_preset", "merge_windows", "prefix_last", "preset", "preset_names", "presets"]
