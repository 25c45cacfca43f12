"""transformers' Qwen3-VL vision tower (``Qwen3VLVisionModel``) with visionpe encodings: transformers' own model is
the oracle (tiny configs built here; nothing is downloaded)."""
import copy
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
qwen3_vl = pytest.importorskip("transformers.models.qwen3_vl", reason="transformers >= 4.57 has Qwen3-VL")
if not hasattr(qwen3_vl.modeling_qwen3_vl, "BaseModelOutputWithDeepstackFeatures"):
    pytest.skip("the adapter takes transformers 5's Qwen3-VL tower (4.57's returns a tuple)", allow_module_level=True)

import visionpe as vpe  # noqa: E402
from visionpe import Grid, Layout  # noqa: E402
from visionpe.backbones.hf_qwen3_vl import PackedFrames, Qwen3VLVisionModelPE  # noqa: E402
from visionpe.presets import merge_windows  # noqa: E402
from conftest import perturbed, saved_and_loaded  # noqa: E402

# a 4x4 table (16 positions), patch 4, DeepStack after block 0
QWEN3 = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4, temporal_patch_size=2,
             out_hidden_size=24, num_position_embeddings=16, deepstack_visual_indexes=[0])
# the table's size, non-square, larger than the table (8 > 4 per side), a clip of 2 frames with an image, and three
# images where two share a grid
CALLS = {"table": [[1, 4, 4]], "wide": [[1, 6, 10]], "tall-large": [[1, 12, 8]],
         "clip+image": [[2, 4, 6], [1, 8, 8]], "three": [[1, 2, 2], [1, 10, 4], [1, 2, 2]]}


def _build(**config):
    torch.manual_seed(0)
    model = qwen3_vl.Qwen3VLVisionModel(qwen3_vl.Qwen3VLVisionConfig(**{**QWEN3, **config}))
    perturbed(model)
    return model.eval()


def _inputs(model, thw):
    """Packed patches ``(sum t * h * w, C * T * p * p)`` and their ``grid_thw``."""
    grid_thw = torch.tensor(thw)
    embed = model.patch_embed
    width = embed.in_channels * embed.temporal_patch_size * embed.patch_size ** 2
    return torch.randn(int(grid_thw.prod(dim=1).sum()), width), grid_thw


def _gap(ours, theirs) -> float:
    gaps = [(ours[k] - theirs[k]).abs().max() for k in ("last_hidden_state", "pooler_output")]
    gaps += [(a - b).abs().max() for a, b in zip(ours.deepstack_features, theirs.deepstack_features, strict=True)]
    return float(max(gaps))


@pytest.mark.parametrize("config", [{}, {"patch_size": 8, "temporal_patch_size": 1, "deepstack_visual_indexes": [0, 1],
                                         "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}}],
                         ids=["patch4", "patch8-theta100"])
def test_native_gives_transformers_outputs_at_every_size(config):
    """``pe="native"`` is the qwen3_vl preset built for the model (its table side, its rope_theta): the last hidden
    state, the merger's output and the DeepStack features equal transformers' for every call, frames of different
    grids in one call included (each frame attends to itself, as transformers' cu_seqlens)."""
    ref = _build(**config)
    model = vpe.apply(copy.deepcopy(ref), "native")
    assert type(model) is Qwen3VLVisionModelPE and model.pe == "preset:qwen3_vl"
    assert model.pos_embed is None and model.rotary_pos_emb is None
    tokens, rotary = vpe.encodings_of(model)["tokens"][0], vpe.encodings_of(model)["rotary"][0]
    assert torch.equal(tokens.table.reshape(16, -1), ref.pos_embed.weight)  # taken over, row-major
    assert rotary.theta == ref.config.rope_parameters["rope_theta"]
    for name, thw in CALLS.items():
        x, grid_thw = _inputs(ref, thw)
        with torch.no_grad():
            assert _gap(model(x, grid_thw), ref(x, grid_thw)) < 1e-5, name


def test_hidden_states_as_transformers_and_attention_weights_per_frame_grid():
    ref = _build()
    model = vpe.apply(copy.deepcopy(ref), "native")
    x, grid_thw = _inputs(ref, CALLS["clip+image"])
    with torch.no_grad():
        ours, theirs = model(x, grid_thw, output_hidden_states=True), ref(x, grid_thw, output_hidden_states=True)
        assert len(ours.hidden_states) == len(theirs.hidden_states) == 3  # the embeddings, then each block's output
        assert max(float((a - b).abs().max()) for a, b in zip(ours.hidden_states, theirs.hidden_states)) < 1e-5
        assert [s is None for s in model(x, grid_thw, output_hidden_states=[-1]).hidden_states] == [True, True, False]
        assert isinstance(model(x, grid_thw, return_dict=False), tuple)
        attentions = model(x, grid_thw, output_attentions=True).attentions  # per block, per frame grid
        grids = [(int(h), int(w)) for t, h, w in grid_thw.tolist() for _ in range(t)]
        first = list(dict.fromkeys(grids))
        assert len(attentions) == 2 and [tuple(a.shape) for a in attentions[0]] == [
            (grids.count(g), model.blocks[0].attn.num_attention_heads, g[0] * g[1], g[0] * g[1]) for g in first]
        assert all(torch.allclose(a.sum(-1), torch.ones(())) for block in attentions for a in block)


def test_frames_take_their_positions_in_merge_window_order():
    """The row-major frames the encodings see are the model's merge-window tokens: a block's attention (RoPE-Mixed
    and LookHere) equals the same attention on the model's order with the preset's Layout (every patch kept in
    merge-window order), and the tokens encoding adds each patch's own vector of its frame's grid."""
    model = vpe.apply(_build(), "rope_mixed+lookhere+learned")
    grid_thw = torch.tensor([[1, 6, 4], [2, 4, 8]])
    frames = PackedFrames.of(grid_thw, 2)
    x = torch.randn(int(grid_thw.prod(dim=1).sum()), 32)
    attention = model.blocks[1].attn
    with torch.no_grad():
        packed, added = frames.attend(attention, x), model.add_tokens(torch.zeros_like(x), frames)
        start = 0
        for shape in [(6, 4), (4, 8), (4, 8)]:  # frame by frame, in transformers' order
            grid, n = Grid(shape), shape[0] * shape[1]
            order = merge_windows(grid)
            alone, _ = attention(x[None, start:start + n], Layout(grid, order[None]))
            assert float((packed[start:start + n] - alone[0]).abs().max()) < 1e-5, shape
            assert torch.allclose(added[start:start + n], model.pe_tokens.position_vectors(grid)[order])
            start += n


def test_each_frame_attends_to_itself_only():
    """With a swapped-in encoding an image's outputs in a packed call are those of the image alone: another image's
    pixels change nothing of it."""
    model = vpe.apply(_build(), "rope_mixed+alibi+learned")
    x, grid_thw = _inputs(model, [[1, 6, 4], [1, 4, 8]])
    with torch.no_grad():
        both = model(x, grid_thw).last_hidden_state
        alone = model(x[:24], grid_thw[:1]).last_hidden_state
        changed = model(torch.cat([x[:24], torch.randn(32, x.shape[1])]), grid_thw).last_hidden_state
    assert float((both[:24] - alone).abs().max()) < 1e-5 and torch.equal(both[:24], changed[:24])
    assert float((both[24:] - changed[24:]).abs().max()) > 1e-3


IMAGE_ENCODINGS = [pe for pe in vpe.available() if 2 in vpe.registry.ENCODINGS[pe].ndims and pe != "swin_bias"]


@pytest.mark.parametrize("pe", [*IMAGE_ENCODINGS, "rope_mixed+learned", "lookhere+rope_axial", "preset:qwen3_vl"])
def test_any_encoding_swaps_in_and_every_other_weight_is_kept(pe):
    """Every registered image encoding (and combinations) runs on a packed call of frames of different grids with
    every weight of the tower but its position table, unchanged and under its name."""
    ref = _build()
    model = vpe.apply(copy.deepcopy(ref), pe)
    state = model.state_dict()
    kept = {k: v for k, v in ref.state_dict().items() if k != "pos_embed.weight"}
    assert all(torch.equal(state[k], v) for k, v in kept.items())
    x, grid_thw = _inputs(ref, CALLS["clip+image"])
    with torch.no_grad():
        out = model(x, grid_thw)
    assert out.last_hidden_state.shape == (112, 32) and out.pooler_output.shape == (28, 24)
    assert torch.isfinite(out.pooler_output).all() and len(out.deepstack_features) == 1


def test_training_gradients_reach_the_encodings_and_checkpointing_keeps_them():
    """A training step's gradients reach the swapped-in encodings; transformers' activation checkpointing of the
    patched blocks gives the same gradients."""
    grads = []
    for checkpointing in (False, True):
        model = vpe.apply(_build(), "rope_mixed+learned").train()
        if checkpointing:
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
            assert all(block.gradient_checkpointing for block in model.blocks)
        torch.manual_seed(1)
        x, grid_thw = _inputs(model, CALLS["three"])
        model(x, grid_thw).pooler_output.square().sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    encodings = [n for n in grads[0] if ".rotary." in n or n.startswith("pe_tokens.")]
    assert len(encodings) == 3 and all(grads[0][n].abs().sum() > 0 for n in encodings)  # 2 blocks' freqs, the table
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


def test_bad_input_and_swin_bias_are_refused():
    model = vpe.apply(_build(), "native")
    x, grid_thw = _inputs(model, [[1, 4, 6]])
    with pytest.raises(ValueError, match="multiples of spatial_merge_size=2"):
        model(torch.randn(15, x.shape[1]), torch.tensor([[1, 3, 5]]))
    with pytest.raises(ValueError, match=r"total_patches=24"):
        model(x[:20], grid_thw)
    with pytest.raises(ValueError, match="grid_thw must be a"):
        model(x, grid_thw[0])
    with pytest.raises(ValueError, match="swin_bias needs window attention"):
        vpe.apply(_build(), "swin_bias")


def test_save_pretrained_round_trip(tmp_path):
    model = vpe.apply(_build(), "rope_mixed")
    loaded = saved_and_loaded(model, qwen3_vl.Qwen3VLVisionModel, tmp_path)
    x, grid_thw = _inputs(model, CALLS["clip+image"])
    with torch.no_grad():
        assert torch.equal(loaded(x, grid_thw).last_hidden_state, model(x, grid_thw).last_hidden_state)


def test_the_tower_patched_inside_qwen3_vl_model():
    """``vpe.apply(model.visual, ...)`` patches the tower of a whole ``Qwen3VLModel`` in place: its image features
    (per-image merger outputs and DeepStack features) are transformers' with ``pe="native"``."""
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                intermediate_size=64, vocab_size=64)
    torch.manual_seed(0)
    ref = qwen3_vl.Qwen3VLModel(qwen3_vl.Qwen3VLConfig(vision_config={**QWEN3, "out_hidden_size": 32},
                                                       text_config=text)).eval()
    model = copy.deepcopy(ref)
    vpe.apply(model.visual, "native")
    x, grid_thw = _inputs(ref.visual, CALLS["clip+image"])
    with torch.no_grad():
        ours, theirs = model.get_image_features(x, grid_thw), ref.get_image_features(x, grid_thw)
    assert type(model.visual) is Qwen3VLVisionModelPE
    pairs = [*zip(ours.pooler_output, theirs.pooler_output), *zip(*ours.deepstack_features, *theirs.deepstack_features)]
    assert len(pairs) == 4 and max(float((a - b).abs().max()) for a, b in pairs) < 1e-5
