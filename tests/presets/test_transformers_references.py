"""Each transformers-defined preset equals the model's own positional code (transformers' modules and functions,
imported here) at random weights: tables, rotated q and k, at the native size and at other sizes, non-square ones
included where the model defines them."""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the presets' oracles are transformers' own modules: "
                                                          "pip install visionpe[dev] (absent at the dependency floor)")

import visionpe as vpe  # noqa: E402
from visionpe import Grid  # noqa: E402
from visionpe.presets import attention_windows, merge_windows, prefix_last  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """``(N, heads, d)`` -> ``(1, heads, N, d)``, visionpe's attention layout."""
    return x.transpose(0, 1)[None]


# -- SigLIP 2 ------------------------------------------------------------------------------------------------------
def test_siglip2_table_is_naflex_resize():
    from transformers import Siglip2VisionConfig
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings
    reference = Siglip2VisionEmbeddings(Siglip2VisionConfig(hidden_size=24, num_patches=256, patch_size=16))
    table = reference.position_embedding.weight.detach().reshape(16, 16, 24)
    scheme = vpe.preset("siglip2", dim=24)
    scheme.tokens.table.data.copy_(table)
    for shape in [(16, 16), (12, 20), (24, 9), (5, 40)]:  # native, down/up per axis, non-square
        n, padding = math.prod(shape), 3
        expected = reference.resize_positional_embeddings(table, torch.tensor([shape]), max_length=n + padding)[0]
        torch.testing.assert_close(scheme.tokens.position_vectors(Grid(shape)), expected[:n], **TOL)
        # NaFlex's padding slots repeat the first vector (visionpe masks padding instead: stated in the preset)
        torch.testing.assert_close(expected[n:], expected[:1].expand(padding, -1))


# -- Qwen2.5-VL and Qwen3-VL ---------------------------------------------------------------------------------------
def qwen_rotated(rotary_module, grid_shape, q: torch.Tensor):
    """q ``(N, heads, d)`` in the model's merge-window order rotated by the model's own vision RoPE."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
    from transformers.vision_utils import get_vision_position_ids
    position_ids = get_vision_position_ids(torch.tensor([[1, *grid_shape]]), 2)
    cos, sin = rotary_module(q, position_ids)
    return apply_rotary_pos_emb_vision(q, q, cos, sin)[0], (cos, sin), position_ids


@pytest.mark.parametrize("shape", [(16, 16), (8, 12), (20, 6)])
def test_qwen2_5_vl_rope_in_merge_window_order(shape):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding
    config = Qwen2_5_VLVisionConfig(hidden_size=64, num_heads=2)  # head_dim 32
    n = math.prod(shape)
    q = torch.randn(n, 2, 32)
    expected, _, position_ids = qwen_rotated(Qwen2_5_VLVisionRotaryEmbedding(config), shape, q)
    scheme = vpe.preset("qwen2_5_vl", dim=64, num_heads=2)
    grid = Grid(shape)
    assert torch.equal(grid.coords()[merge_windows(grid)].long(), position_ids)  # the order is the processor's
    torch.testing.assert_close(scheme.rotary.rotate(heads_first(q), scheme.layout(grid))[0], heads_first(expected)[0],
                               **TOL)


@pytest.mark.parametrize("shape", [(16, 16), (12, 20)])
def test_qwen2_5_vl_attention_window_order(shape):
    """Inside the blocks Qwen2.5-VL regroups the merge windows by 112-px attention window (get_vision_window_index);
    orders.attention_windows is that order, and RoPE rows follow the tokens there too."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding
    from transformers.vision_utils import get_vision_window_index
    config = Qwen2_5_VLVisionConfig(hidden_size=64, num_heads=2)
    window_index, _ = get_vision_window_index(torch.tensor([[1, *shape]]), config.spatial_merge_size,
                                              config.window_size, config.patch_size)
    grid = Grid(shape)
    merged = merge_windows(grid).reshape(-1, 4)
    assert torch.equal(attention_windows(grid, 2, config.window_size // config.patch_size),
                       merged[window_index].flatten())
    n = math.prod(shape)
    q = torch.randn(n, 2, 32)
    _, (cos, sin), _ = qwen_rotated(Qwen2_5_VLVisionRotaryEmbedding(config), shape, q)
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
    units = lambda t: t.reshape(n // 4, 4, -1)[window_index].reshape(n, -1)  # the model's own permutation  # noqa
    expected = apply_rotary_pos_emb_vision(q, q, units(cos), units(sin))[0]
    order = attention_windows(grid, 2, 8)
    pe = vpe.preset("qwen2_5_vl", dim=64, num_heads=2).rotary
    torch.testing.assert_close(pe.rotate(heads_first(q), vpe.Layout(grid, order[None])), heads_first(expected), **TOL)


def qwen3_tower(hidden: int = 32, heads: int = 2):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
    config = Qwen3VLVisionConfig(depth=1, hidden_size=hidden, num_heads=heads, intermediate_size=2 * hidden,
                                 out_hidden_size=hidden, deepstack_visual_indexes=[])
    return Qwen3VLVisionModel(config).eval()


@pytest.mark.parametrize("shape", [(48, 48), (16, 24), (64, 40)])
def test_qwen3_vl_table_is_align_corners_bilinear(shape):
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights
    tower = qwen3_tower()
    assert (tower.interpolation_mode, tower.interpolation_align_corners, tower.num_grid_per_side) == \
        ("bilinear", True, 48)
    index, weights = get_vision_interpolation_indices_and_weights(
        torch.tensor([[1, *shape]]), tower.num_grid_per_side, mode=tower.interpolation_mode,
        align_corners=tower.interpolation_align_corners, spatial_merge_size=2)
    with torch.no_grad():
        expected = (tower.pos_embed(index) * weights[:, :, None]).sum(1)  # the tower's own sum, merge-window order
    scheme = vpe.preset("qwen3_vl", dim=32, num_heads=2)
    scheme.tokens.table.data.copy_(tower.pos_embed.weight.detach().reshape(48, 48, 32))
    grid = Grid(shape)
    torch.testing.assert_close(scheme.tokens.position_vectors(grid)[merge_windows(grid)], expected, **TOL)


@pytest.mark.parametrize("shape", [(48, 48), (10, 14)])
def test_qwen3_vl_rope(shape):
    tower = qwen3_tower(hidden=48, heads=2)  # head_dim 24
    q = torch.randn(math.prod(shape), 2, 24)
    expected, _, _ = qwen_rotated(tower.rotary_pos_emb, shape, q)
    scheme = vpe.preset("qwen3_vl", dim=48, num_heads=2)
    grid = Grid(shape)
    torch.testing.assert_close(scheme.rotary.rotate(heads_first(q), scheme.layout(grid)), heads_first(expected),
                               **TOL)


# -- AIMv2 ---------------------------------------------------------------------------------------------------------
def aimv2_positions(config, height: int, width: int) -> torch.Tensor:
    """The position vectors Aimv2VisionEmbeddings adds: its forward with the patch projection zeroed (so the
    patch tokens, RMS-normed, are 0)."""
    from transformers.models.aimv2.modeling_aimv2 import Aimv2VisionEmbeddings
    embeddings = Aimv2VisionEmbeddings(config)
    with torch.no_grad():
        embeddings.patch_embed.weight.zero_()
        embeddings.patch_embed.bias.zero_()
        return embeddings, embeddings(torch.randn(1, 3, height, width))[0]


@pytest.mark.parametrize("shape", [(16, 16), (6, 10), (12, 5)])
def test_aimv2_native_sincos(shape):
    from transformers import Aimv2VisionConfig
    config = Aimv2VisionConfig(hidden_size=32, num_attention_heads=2, patch_size=14, is_native=True)
    _, expected = aimv2_positions(config, shape[0] * 14, shape[1] * 14)
    scheme = vpe.preset("aimv2_native", dim=32, num_heads=2)
    torch.testing.assert_close(scheme.tokens.position_vectors(Grid(shape)), expected, **TOL)


@pytest.mark.parametrize("image_size", [224, 112])
def test_aimv2_learned_table(image_size):
    """AIMv2's table has one size, its config's (square): the preset holds it as is."""
    from transformers import Aimv2VisionConfig
    config = Aimv2VisionConfig(hidden_size=32, num_attention_heads=2, patch_size=14, image_size=image_size)
    side = image_size // 14
    embeddings, expected = aimv2_positions(config, image_size, image_size)
    scheme = vpe.preset("aimv2", dim=32, num_heads=2, grid_shape=(side, side))
    scheme.tokens.table.data.copy_(embeddings.position_embedding.weight.detach().reshape(side, side, 32))
    torch.testing.assert_close(scheme.tokens.position_vectors(Grid((side, side))), expected, **TOL)


# -- DINOv3 --------------------------------------------------------------------------------------------------------
def dinov3(shape, registers: int = 4, training: bool = False, seed: int = 0):
    """(our rotated q, DINOv3's rotated q) on a grid of ``shape`` with a class token and registers."""
    from transformers import DINOv3ViTConfig
    from transformers.models.dinov3_vit.modeling_dinov3_vit import (DINOv3ViTRopePositionEmbedding,
                                                                    apply_rotary_pos_emb)
    config = DINOv3ViTConfig(hidden_size=64, num_attention_heads=2, patch_size=16, num_register_tokens=registers)
    reference = DINOv3ViTRopePositionEmbedding(config).train(training)
    prefix = 1 + registers
    q = torch.randn(2, 2, prefix + math.prod(shape), 32)
    torch.manual_seed(seed)
    cos, sin = reference(torch.zeros(1, 3, shape[0] * 16, shape[1] * 16))
    expected = apply_rotary_pos_emb(q, q, cos, sin)[0]
    pe = vpe.preset("dinov3", dim=64, num_heads=2, num_prefix_tokens=prefix).rotary.train(training)
    torch.manual_seed(seed)
    ours = pe(q, q, Grid(shape, prefix=prefix))[0]
    return ours, expected


@pytest.mark.parametrize("shape", [(14, 14), (10, 18), (20, 12)])
def test_dinov3_rope(shape):
    ours, expected = dinov3(shape)
    torch.testing.assert_close(ours, expected, **TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_dinov3_rescale_augmentation_draws_as_dinov3(seed):
    ours, expected = dinov3((6, 9), training=True, seed=seed)
    torch.testing.assert_close(ours, expected, **TOL)
    still, _ = dinov3((6, 9), training=False)
    assert not torch.allclose(ours, still, atol=1e-3)  # the draw moved the positions


# -- V-JEPA 2 ------------------------------------------------------------------------------------------------------
def vjepa2_attention(head_dim: int, side: int):
    from transformers import VJEPA2Config
    from transformers.models.vjepa2.modeling_vjepa2 import VJEPA2RopeAttention
    config = VJEPA2Config(crop_size=side * 16, patch_size=16, frames_per_clip=4, tubelet_size=2,
                          hidden_size=2 * head_dim, num_attention_heads=2)
    return VJEPA2RopeAttention(config, hidden_size=2 * head_dim, num_attention_heads=2)


@pytest.mark.parametrize("head_dim", [64, 24])  # 64: 2 x 10 pairs per axis and 2 unrotated pairs; 24: none left
@pytest.mark.parametrize("shape", [(2, 4, 4), (3, 4, 4), (2, 6, 6)])  # native, more frames, another square grid
def test_vjepa2_rope(head_dim, shape):
    attention = vjepa2_attention(head_dim, shape[1])
    n = math.prod(shape)
    q = torch.randn(2, 2, n, head_dim)
    expected = attention.apply_rotary_embeddings(q, attention.get_position_ids(torch.zeros(2, n, 2 * head_dim)))
    pe = vpe.preset("vjepa2", dim=2 * head_dim, num_heads=2).rotary
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), expected, **TOL)


@pytest.mark.parametrize("head_dim", [64, 24])
def test_vjepa2_rope_on_kept_tokens_and_a_non_square_grid(head_dim):
    """V-JEPA 2 reads (t, h, w) off token indices into its square training grid (position masks); a non-square grid
    is the subset of that grid's tokens it covers, and masked tokens keep their positions (a Layout)."""
    attention = vjepa2_attention(head_dim, 4)
    t, h, w = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4), indexing="ij")
    inside = (t * 16 + h * 4 + w).flatten()  # the (2, 3, 4) grid's tokens in the (2, 4, 4) one
    kept = torch.randperm(32)[:11]
    pe = vpe.preset("vjepa2", dim=2 * head_dim, num_heads=2).rotary
    for masks, layout in [(inside, Grid((2, 3, 4))), (kept, vpe.Layout(Grid((2, 4, 4)), kept[None]))]:
        q = torch.randn(1, 2, len(masks), head_dim)
        ids = attention.get_position_ids(torch.zeros(1, len(masks), 2 * head_dim), masks=masks[None])
        torch.testing.assert_close(pe.rotate(q, layout), attention.apply_rotary_embeddings(q, ids), **TOL)


def test_vjepa2_is_not_a_rotation():
    """The repeated frequencies are kept as V-JEPA 2 has them: the map does not keep norms (a rotation would)."""
    pe = vpe.preset("vjepa2", dim=128, num_heads=2).rotary
    q = torch.randn(1, 2, 32, 64)
    norms = pe.rotate(q, Grid((2, 4, 4))).norm(dim=-1)
    assert (norms - q.norm(dim=-1)).abs().max() > 1e-2


# -- Pixtral -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(64, 64), (7, 11), (20, 3)])
def test_pixtral_rope(shape):
    from transformers import PixtralVisionConfig
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding, apply_rotary_pos_emb
    config = PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32)
    rows, cols = torch.meshgrid(torch.arange(shape[0]), torch.arange(shape[1]), indexing="ij")  # PixtralVisionModel's
    position_ids = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    q = torch.randn(1, 2, math.prod(shape), 32)
    cos, sin = PixtralVisionRotaryEmbedding(config)(q, position_ids)
    expected = apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=0)[0]
    pe = vpe.preset("pixtral", dim=64, num_heads=2).rotary
    torch.testing.assert_close(pe.rotate(q, Grid(shape)), expected, **TOL)


# -- Llama 4 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("image_size", [448, 84, 112])  # 32x32 (native), 6x6, 8x8 tiles: Llama 4's are square
def test_llama4_rope_and_table(image_size):
    from transformers import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import (Llama4VisionRotaryEmbedding, vision_apply_rotary_emb)
    config = Llama4VisionConfig(hidden_size=80, num_attention_heads=2, image_size=image_size, patch_size=14)
    side = image_size // 14
    grid = Grid((side, side), prefix=1)
    order = prefix_last(grid)
    q = torch.randn(1, grid.num_tokens, 2, 40)  # the model's order and layout: patches then class, heads inside
    expected = vision_apply_rotary_emb(q, q, Llama4VisionRotaryEmbedding(config).freqs_ci)[0]
    scheme = vpe.preset("llama4", dim=80, num_heads=2, grid_shape=(side, side))
    ours = scheme.rotary.rotate(q.transpose(1, 2)[:, :, order.argsort()], grid)[:, :, order].transpose(1, 2)
    torch.testing.assert_close(ours, expected, **TOL)
    # the learned table: positional_embedding_vlm holds the patches' rows, then the class token's
    table = torch.randn(grid.num_tokens, 80)
    scheme.tokens.table.data.copy_(table[:-1].reshape(side, side, 80))
    scheme.tokens.prefix.data.copy_(table[-1:])
    x = torch.randn(1, grid.num_tokens, 80)
    torch.testing.assert_close(scheme.tokens(x, grid)[:, order], x[:, order] + table, **TOL)
