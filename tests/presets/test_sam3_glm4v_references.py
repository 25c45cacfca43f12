"""SAM 3's and GLM-4.1V/4.5V's presets equal the models' own positional code in transformers (their modules and
functions, imported here) at random weights: the tables added to the tokens and the rotated q, at the native size and
at other sizes, non-square ones included where the model defines them."""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the presets' oracles are transformers' own modules: "
                                                          "pip install visionpe[dev] (absent at the dependency floor)")

import visionpe as vpe  # noqa: E402
from visionpe import Grid  # noqa: E402
from visionpe.presets import merge_windows  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


# -- SAM 3 ---------------------------------------------------------------------------------------------------------
def sam3_config(image_side: int, window: int = 4, table_side: int = 4):
    """A tiny SAM 3 ViT (32 wide, 2 heads of 16, 2-px patches): ``image_side`` patches a side, ``window``-patch
    windows, a ``table_side``-patch pretraining table."""
    from transformers.models.sam3.configuration_sam3 import Sam3ViTConfig
    return Sam3ViTConfig(hidden_size=32, num_attention_heads=2, intermediate_size=16, num_hidden_layers=1,
                         patch_size=2, image_size=2 * image_side, pretrain_image_size=2 * table_side,
                         window_size=window)


@pytest.mark.parametrize("shape", [(4, 4), (3, 2), (9, 6), (5, 11)])  # the table, inside it, tiled on both axes
def test_sam3_table_is_tiled(shape):
    from transformers.models.sam3.modeling_sam3 import Sam3ViTEmbeddings
    embeddings = Sam3ViTEmbeddings(sam3_config(4)).eval()
    with torch.no_grad():  # the forward with the patch projection zeroed adds the position vectors to zeros
        embeddings.patch_embeddings.projection.weight.zero_()
        expected = embeddings(torch.randn(1, 3, 2 * shape[0], 2 * shape[1]))[0]
    scheme = vpe.preset("sam3", dim=32, num_heads=2, grid_shape=(4, 4))
    scheme.tokens.table.data.copy_(embeddings.position_embeddings.detach().reshape(4, 4, 32))
    torch.testing.assert_close(scheme.tokens.position_vectors(Grid(shape)), expected, **TOL)


def sam3_rotated(layer, q: torch.Tensor) -> torch.Tensor:
    """q ``(windows, heads, N, d)`` rotated by a SAM 3 layer's own RoPE (its precomputed positions)."""
    from transformers.models.sam3.modeling_sam3 import apply_rotary_pos_emb_2d
    cos, sin = layer.rotary_emb(q, layer.position_ids)
    return apply_rotary_pos_emb_2d(q, q, cos, sin)[0]


@pytest.mark.parametrize("side", [4, 12, 6])  # the window itself, 3x it (SAM 3's 72 / 24), a fractional 2/3
def test_sam3_rope_global_layers_scale_to_the_window(side):
    from transformers.models.sam3.modeling_sam3 import Sam3ViTLayer
    layer = Sam3ViTLayer(sam3_config(side), window_size=0)  # a global layer: the whole grid
    q = torch.randn(1, 2, side * side, 16)
    pe = vpe.preset("sam3", dim=32, num_heads=2, ref_shape=(4, 4)).rotary
    torch.testing.assert_close(pe.rotate(q, Grid((side, side))), sam3_rotated(layer, q), **TOL)


@pytest.mark.parametrize("window", [4, 3])
def test_sam3_rope_windowed_layers_rotate_on_the_window(window):
    """A windowed layer rotates each window's tokens (windows stacked on the batch axis, the last ones padded) by
    the window's own integer positions: the preset's rotary on ``Grid((window, window))``."""
    from transformers.models.sam3.modeling_sam3 import Sam3ViTLayer
    layer = Sam3ViTLayer(sam3_config(10, window=window), window_size=window)
    q = torch.randn(3, 2, window * window, 16)
    pe = vpe.preset("sam3", dim=32, num_heads=2, ref_shape=(window, window)).rotary
    torch.testing.assert_close(pe.rotate(q, Grid((window, window))), sam3_rotated(layer, q), **TOL)
    integer = vpe.build("rope_axial", head_dim=16, theta=10000.0, axis_order="xy")  # scaling="none": 0..window-1
    torch.testing.assert_close(integer.rotate(q, Grid((window, window))), sam3_rotated(layer, q), **TOL)



def test_sam3_in_a_backbone_keeps_the_window_and_the_table():
    """In a ViT of another grid the window (24x24) stays the RoPE reference and the table stays 24x24, tiled: the
    backbone's grid replaces neither (every layer there is global, so it rotates as SAM 3's global layers)."""
    model = vpe.create_model("vit_tiny_patch16_224", pe="preset:sam3", img_size=32, patch_size=8, embed_dim=32,
                             num_heads=2, depth=1, num_classes=3)
    found = vpe.encodings_of(model)
    rotary, tokens = found["rotary"][0], found["tokens"][0]
    assert (rotary.scaling, rotary.ref_shape) == ("pi", (24, 24))
    assert (tokens.grid_shape, tokens.fit) == ((24, 24), "tile")

# -- GLM-4.1V / GLM-4.5V -------------------------------------------------------------------------------------------
GLM_TOWERS = ["glm4v", "glm4v_moe"]  # GLM-4.1V, GLM-4.5V: the same positional code in two modules


def glm_modules(tower: str):
    """(embeddings, rotary, apply_rotary_pos_emb_vision) of a tiny GLM vision tower (32 wide, 2 heads of 16) with
    the published 24x24 table (336-px images, 14-px patches)."""
    import importlib
    prefix = "Glm4v" if tower == "glm4v" else "Glm4vMoe"
    configs = importlib.import_module(f"transformers.models.{tower}.configuration_{tower}")
    models = importlib.import_module(f"transformers.models.{tower}.modeling_{tower}")
    config = getattr(configs, f"{prefix}VisionConfig")(hidden_size=32, num_heads=2, image_size=336, patch_size=14)
    return (getattr(models, f"{prefix}VisionEmbeddings")(config), getattr(models, f"{prefix}VisionRotaryEmbedding")(
        config), models.apply_rotary_pos_emb_vision)


@pytest.mark.parametrize("tower", GLM_TOWERS)
@pytest.mark.parametrize("shape", [(24, 24), (8, 12), (40, 30), (2, 36)])  # native, down, up, stretched
def test_glm4v_table_is_bicubic_grid_sample(tower, shape):
    from transformers.vision_utils import get_vision_position_ids
    embeddings, _, _ = glm_modules(tower)
    n = math.prod(shape)
    grid_thw = torch.tensor([[1, *shape]])
    position_ids = get_vision_position_ids(grid_thw, 2)  # the tower's (h, w) per token, merge-window order
    with torch.no_grad():
        expected = embeddings(torch.zeros(n, 32), [n], grid_thw, position_ids[:, 0], position_ids[:, 1])
    scheme = vpe.preset("glm4v", dim=32, num_heads=2)
    scheme.tokens.table.data.copy_(embeddings.position_embedding.weight.detach().reshape(24, 24, 32))
    grid = Grid(shape)
    torch.testing.assert_close(scheme.tokens.position_vectors(grid)[merge_windows(grid)], expected, **TOL)


@pytest.mark.parametrize("tower", GLM_TOWERS)
@pytest.mark.parametrize("shape", [(24, 24), (10, 14), (6, 30)])
def test_glm4v_rope_in_merge_window_order(tower, shape):
    from transformers.vision_utils import get_vision_position_ids
    _, rotary, apply = glm_modules(tower)
    q = torch.randn(math.prod(shape), 2, 16)  # the tower's layout: tokens, heads, head_dim
    cos, sin = rotary(q, get_vision_position_ids(torch.tensor([[1, *shape]]), 2))
    expected = apply(q, q, cos, sin)[0]
    scheme = vpe.preset("glm4v", dim=32, num_heads=2)
    grid = Grid(shape)
    ours = scheme.rotary.rotate(q.transpose(0, 1)[None], scheme.layout(grid))[0].transpose(0, 1)
    torch.testing.assert_close(ours, expected, **TOL)
