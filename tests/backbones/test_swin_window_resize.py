"""timm's ``set_input_size(window_size=...)`` on a patched Swin does what it does on timm's own model: Swin v1
tables resized geometrically (timm ``resize_rel_pos_bias_table``), Swin-V2 CPB normalised by the new window
unless it has a pretrained one. Oracles: timm's ``SwinTransformer`` / ``SwinTransformerV2`` after the same call."""
import copy
import math

import pytest
import timm
import torch
from conftest import requires_that
from timm.layers import resize_rel_pos_bias_table

import visionpe as vpe
from visionpe import Grid
from visionpe.resample import geometric_ratio, resample_grid, resample_offsets_geometric

KW = dict(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 2), num_classes=3)


def timm_window_change_works() -> bool:
    """timm's own ``set_input_size(window_size=...)`` on Swin and Swin-V2 (the oracles) runs in this timm (1.0.19's
    raises UnboundLocalError for its grid size)."""
    try:
        for name in ("swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"):
            timm.create_model(name, **KW).set_input_size(window_size=(8, 8))
    except Exception:  # noqa: BLE001 (any failure of the oracle itself means it cannot serve here)
        return False
    return True


pytestmark = requires_that(timm_window_change_works(), "a timm whose Swin set_input_size(window_size=...) runs "
                           "(the oracle; timm 1.0.19's raises UnboundLocalError)")


def perturbed(name: str, **kw):
    torch.manual_seed(0)
    model = timm.create_model(name, **{**KW, **kw}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def timm_blocks(model):
    return [block for stage in model.layers for block in stage.blocks]


@pytest.mark.parametrize("new", [(8, 8), (6, 5), (3, 3)])
def test_swin_bias_table_after_set_input_size_equals_timm(new):
    timm_model = perturbed("swin_tiny_patch4_window7_224")
    ours = vpe.apply(copy.deepcopy(timm_model), "swin_bias").eval()
    timm_model.set_input_size(window_size=new)
    ours.set_input_size(window_size=new)
    for theirs, mine in zip(timm_blocks(timm_model), timm_blocks(ours)):
        expected = theirs.attn.relative_position_bias_table
        got = mine.attn.bias.relative_position_bias_table
        assert got.shape == expected.shape and mine.attn.window_size == theirs.attn.window_size
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), timm_model(x), atol=1e-4, rtol=1e-4)


def test_geometric_resize_is_not_bicubic():
    """The two resizes differ on a random table (so the comparison above can fail), and the geometric one equals
    timm's function on a non-square window, on a shrink and on the same window (unchanged). Tolerance 1e-4: timm
    stops its search of the ratio at 1e-6, visionpe solves it to float64 precision."""
    torch.manual_seed(1)
    table = torch.randn(7, 9, 3)  # window (4, 5)
    for new in [(15, 11), (5, 5), (9, 9), (7, 9)]:
        expected = resize_rel_pos_bias_table(table.reshape(-1, 3), ((new[0] + 1) // 2, (new[1] + 1) // 2),
                                             (new[0] * new[1], 3), old_window_size=(4, 5))
        got = resample_offsets_geometric(table, new).reshape(-1, 3)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    bicubic = resample_grid(table, (15, 11), "bicubic").reshape(-1, 3)
    assert (bicubic - resample_offsets_geometric(table, (15, 11)).reshape(-1, 3)).abs().max() > 0.1


@pytest.mark.parametrize("n", [2, 5, 13, 31])
def test_geometric_ratio_reaches_the_target_or_its_interval_end(n):
    """BEiT's ratio ``r`` puts the outermost of ``n`` offsets at the target: ``sum_{i<n} r^i`` (summed term by term
    here) equals it to 1e-12 where the root lies in ``[1.01, 1.5]``, else the interval's near end."""
    low_reach, high_reach = (sum(r ** i for i in range(n)) for r in (1.01, 1.5))
    for target in [1, n, math.ceil(low_reach), (low_reach + high_reach) / 2, math.floor(high_reach), 10 * high_reach]:
        ratio = geometric_ratio(n, torch.tensor(float(target), dtype=torch.float64)).item()
        if target <= low_reach:
            assert ratio == pytest.approx(1.01, abs=1e-15), target
        elif target >= high_reach:
            assert ratio == pytest.approx(1.5, abs=1e-15), target
        else:
            assert sum(ratio ** i for i in range(n)) == pytest.approx(target, rel=1e-12), target


def timm_cpb_bias(attn) -> torch.Tensor:
    """timm Swin-V2 window attention's bias ``(heads, N, N)`` from its own buffers."""
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    n = attn.window_size[0] * attn.window_size[1]
    bias = table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
    return 16 * torch.sigmoid(bias)


@pytest.mark.parametrize("pretrained", [(0, 0), (4, 4)])
def test_cpb_after_set_input_size_equals_timm_swinv2(pretrained):
    timm_model = perturbed("swinv2_tiny_window8_256", pretrained_window_sizes=pretrained)
    ours = vpe.apply(copy.deepcopy(timm_model), "cpb").eval()
    x = torch.randn(2, 3, 64, 64)
    before = ours(x).detach()
    timm_model.set_input_size(window_size=(8, 8))
    ours.set_input_size(window_size=(8, 8))
    with torch.no_grad():
        for theirs, mine in zip(timm_blocks(timm_model), timm_blocks(ours)):
            assert mine.attn.window_size == tuple(theirs.attn.window_size) == (8, 8)
            torch.testing.assert_close(mine.attn.bias(Grid((8, 8))), timm_cpb_bias(theirs.attn), atol=1e-5,
                                       rtol=1e-5)
        torch.testing.assert_close(ours(x), timm_model(x), atol=1e-4, rtol=1e-4)
        assert (ours(x) - before).abs().max() > 1e-3  # the new window changed the model


def test_cpb_window_is_part_of_the_cached_table():
    pe = vpe.build("cpb", num_heads=2, window_size=(4, 4), hidden_dim=16).eval()
    with torch.no_grad():
        small = pe(Grid((4, 4)))
        pe.set_window_size((8, 8))
        assert not torch.allclose(pe(Grid((4, 4))), small)  # offsets of the same grid now normalised by 7, not 3
