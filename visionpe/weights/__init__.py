"""Weights in and out: :mod:`.io` (atomic writes, safetensors, state dicts from any checkpoint file) and
:mod:`.convert` (timm, Eva and Swin checkpoints, visionpe tables of another grid, image weights into video models)."""
from .convert import LoadReport, inflate_patch_weight, is_classifier, is_positional, load_timm_checkpoint
from .io import atomic_write, load_weights, read_state_dict, save_weights, weights_metadata, write_text

__all__ = ["LoadReport", "atomic_write", "inflate_patch_weight", "is_classifier", "is_positional",
           "load_timm_checkpoint", "load_weights", "read_state_dict", "save_weights", "weights_metadata",
           "write_text"]
