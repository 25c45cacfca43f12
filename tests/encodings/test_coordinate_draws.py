"""Coordinate augmentation is drawn once per model forward and shared by every block (timm's Eva: one
``self.rope.get_embed()`` per forward, passed to every block); ``draw_coords="block"`` draws in each block. Oracles:
timm's Eva in training mode with ``rope_*_coords`` (same RNG state, same logits) and the draws the blocks receive."""
import copy
import inspect

import pytest
import timm
import torch
from conftest import requires, requires_that

import visionpe as vpe
from visionpe.coords import CoordinateSystem, coordinate_draws

AUG = dict(shift_coords=0.7, jitter_coords=1.3, rescale_coords=1.6)
VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=3, num_heads=2, num_classes=3)


def recorded_draws(monkeypatch) -> list:
    """Every transform an encoding receives from :meth:`CoordinateSystem.draw` (in call order)."""
    seen, draw = [], CoordinateSystem.draw

    def spy(self, training, ndim, device=None):
        transform = draw(self, training, ndim, device)
        if transform is not None:
            seen.append(transform)
        return transform
    monkeypatch.setattr(CoordinateSystem, "draw", spy)
    return seen


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("shift", "jitter", "rescale"))


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed", "alibi", "cpb", "rope_mixed+sincos"])
def test_every_block_sees_the_same_draw_in_one_forward(monkeypatch, pe):
    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, pe_kwargs=AUG, **VIT).train()
    seen = recorded_draws(monkeypatch)
    x = torch.randn(2, 3, 16, 16)
    model(x)
    calls = VIT["depth"] + ("+" in pe)  # every block, and the tokens encoding once
    assert len(seen) == calls and all(same(seen[0], t) for t in seen)
    first = seen[0]
    seen.clear()
    model(x)  # the next forward: a new draw, again shared
    assert len(seen) == calls and all(same(seen[0], t) for t in seen) and not same(first, seen[0])


def test_draw_coords_block_draws_in_every_block(monkeypatch):
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", pe_kwargs={**AUG, "draw_coords": "block"},
                             **VIT).train()
    assert "draw_coords='block'" in repr(model.blocks[0].attn.rotary)
    seen = recorded_draws(monkeypatch)
    model(torch.randn(2, 3, 16, 16))
    assert len(seen) == VIT["depth"] and not same(seen[0], seen[1]) and not same(seen[1], seen[2])


def test_one_draw_per_forward_in_every_entry_point(monkeypatch):
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", pe_kwargs=AUG, **VIT).train()
    seen = recorded_draws(monkeypatch)
    x = torch.randn(2, 3, 16, 16)
    depth = VIT["depth"]
    for run, calls in ((lambda: model.forward_features(x), depth), (lambda: model.forward_intermediates(x), depth),
                       (lambda: model.forward_masked(x, 0.5), depth),
                       (lambda: model.forward_batch([x[0], x[1, :, :12]]), 2 * depth)):  # two grids a block
        seen.clear()
        run()
        assert len(seen) == calls and all(same(seen[0], t) for t in seen)


def test_outside_a_model_each_call_draws_and_eval_draws_nothing(monkeypatch):
    pe = vpe.build("rope_axial", head_dim=8, num_heads=2, **AUG)
    seen = recorded_draws(monkeypatch)
    q = torch.randn(1, 2, 12, 8)
    pe(q, q, vpe.Grid((3, 4)))
    pe(q, q, vpe.Grid((3, 4)))
    assert len(seen) == 2 and not same(seen[0], seen[1])
    with coordinate_draws():  # inside one scope: one draw for both calls
        pe(q, q, vpe.Grid((3, 4)))
        pe(q, q, vpe.Grid((3, 4)))
    assert len(seen) == 4 and same(seen[2], seen[3])
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", pe_kwargs=AUG, **VIT).eval()
    model(torch.randn(1, 3, 16, 16))
    assert len(seen) == 4


@requires_that("rope_shift_coords" in inspect.signature(timm.models.eva.Eva).parameters,
               "timm's Eva with RoPE coordinate augmentation (rope_shift_coords; not in timm 1.0.19)")
@pytest.mark.parametrize("eva_name,pe", [("vit_small_patch16_rope_224", "rope_axial"),
                                         ("vit_small_patch16_rope_mixed_224", "rope_mixed")])
def test_training_logits_equal_timm_eva_with_rope_augmentation(eva_name, pe):
    """timm's Eva draws its RoPE augmentation once per forward for all blocks: from the same RNG state, the visionpe
    model (Eva's weights) gives Eva's training-mode logits; a draw per block does not."""
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=2, num_classes=5)
    eva = timm.create_model(eva_name, dynamic_img_size=True, rope_shift_coords=AUG["shift_coords"],
                            rope_jitter_coords=AUG["jitter_coords"], rope_rescale_coords=AUG["rescale_coords"],
                            **kw).train()
    with torch.no_grad():  # random non-trivial weights (timm initialises the head and layer scales near zero)
        for p in eva.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    models = {}
    for draw in ("forward", "block"):
        models[draw] = vpe.create_model("vit_small_patch16_224", pe=pe, qkv_bias=True, init_values=1e-5,
                                        global_pool="token", pe_kwargs={"scaling": "none", "draw_coords": draw, **AUG},
                                        **kw).train()
        report = vpe.load_timm_checkpoint(models[draw], eva.state_dict())
        assert report.new == [] and report.dropped == []
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = {}
        for name, model in [("eva", eva), *models.items()]:
            torch.manual_seed(5)
            out[name] = model(x)
        torch.manual_seed(5)
        eval_logits = copy.deepcopy(eva).eval()(x)
    assert (out["eva"] - eval_logits).abs().max() > 1e-3  # the augmentation moved Eva's positions
    assert (out["forward"] - out["eva"]).abs().max() < 1e-5
    assert (out["block"] - out["eva"]).abs().max() > 1e-4


@pytest.mark.parametrize("name,pe", [("vit_tiny_patch16_224", "rope_mixed+learned"),
                                     ("swin_tiny_patch4_window7_224", "cpb"),
                                     ("swinv2_tiny_window8_256", "rope_axial")])
def test_shared_draws_survive_activation_checkpointing(name, pe):
    """Checkpointing recomputes a block in the backward pass, outside the forward: it gets the forward's shared
    draw (gradients equal those without checkpointing)."""
    kw = VIT if name.startswith("vit") else dict(img_size=32, patch_size=4, window_size=4, embed_dim=16,
                                                  depths=(2, 2), num_heads=(2, 2), num_classes=3)
    torch.manual_seed(0)
    model = vpe.create_model(name, pe=pe, pe_kwargs=AUG, **kw).train()
    for p in model.parameters():  # Swin-V2's zero-initialised post-norms would stop gradients at the attention
        p.data.add_(0.05 * torch.randn_like(p))
    other = copy.deepcopy(model)
    other.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32 if "swin" in name else 16, 32 if "swin" in name else 16)
    for m in (model, other):
        torch.manual_seed(21)
        m(x).square().sum().backward()
    for (key, p), q in zip(model.named_parameters(), other.parameters()):
        assert p.grad is not None, key
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=key)


def test_swin_blocks_share_one_draw(monkeypatch):
    model = vpe.create_model("swin_tiny_patch4_window7_224", pe="cpb", pe_kwargs=AUG, img_size=32, patch_size=4,
                             window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 2), num_classes=3).train()
    seen = recorded_draws(monkeypatch)
    model(torch.randn(1, 3, 32, 32))
    assert len(seen) == 4 and all(same(seen[0], t) for t in seen)


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_compiled_training_shares_the_draw():
    """torch.compile cannot set the forward's context variable; the traced forward keeps its draws in the graph:
    the compiled training forward (fullgraph, no graph break) equals eager from the same RNG state."""
    torch._dynamo.reset()
    model = vpe.create_model("vit_tiny_patch16_224", pe="rope_axial", pe_kwargs=AUG, **VIT).train()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.manual_seed(3)
    got = compiled(x)
    torch.manual_seed(3)
    expected = model(x)
    torch.testing.assert_close(got, expected)


def test_bad_draw_coords_is_named():
    with pytest.raises(ValueError, match=r"draw_coords.*'forward'.*'block'"):
        vpe.build("rope_axial", head_dim=8, draw_coords="layer")
