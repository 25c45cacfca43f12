"""Token subsets and mixed-size batches on ``--device``, for every family in the ViT and the video ViT, with SDPA
and FlexAttention: MAE's masked encoder (a :class:`~visionpe.grid.Layout` per sample) equals the full grid with the
dropped keys masked in every block, and each image of a padded batch (a :class:`~visionpe.grid.MixedLayout`) gets
what it gets alone. float32 without TF32; agreement to ``atol=2e-5, rtol=1e-5``."""
import pytest
import torch
from devicecases import CASES, CPU_FLEX, FLEX_CASES, exact_float32, params

VIT_CASES = [c for c in CASES if c.backbone in ("vit", "video") and c.pe != "peg"]  # PEG needs the full grid
RUNS = params([(c, "auto") for c in VIT_CASES])
RUNS += params([(c, "flex") for c in FLEX_CASES if c.backbone in ("vit", "video")], cpu=CPU_FLEX)
TOLERANCE = dict(atol=2e-5, rtol=1e-5)


def random_keep(batch: int, num_patches: int, num_keep: int, device) -> torch.Tensor:
    """A different, unsorted keep set per sample."""
    g = torch.Generator().manual_seed(2)
    return torch.stack([torch.randperm(num_patches, generator=g)[:num_keep] for _ in range(batch)]).to(device)


@pytest.mark.parametrize("case,attention", RUNS)
def test_masked_encoder_equals_the_full_grid_with_dropped_keys_masked(device, case, attention):
    model = case.build(attention).to(device)
    x = case.input().to(device)
    _, layout = model.embed(x)
    grid, prefix = layout.grid, layout.grid.prefix
    keep = random_keep(x.shape[0], grid.num_patches, grid.num_patches // 3, device)
    visible = torch.zeros(x.shape[0], grid.num_tokens, dtype=torch.bool, device=device)
    visible[:, :prefix] = True
    visible.scatter_(1, keep + prefix, True)
    with torch.no_grad(), exact_float32():
        tokens, kept = model.forward_masked(x, keep=keep)
        full = model.forward_features(x, attn_mask=visible[:, None, None, :])
    rows = torch.cat([torch.arange(prefix, device=device).expand(x.shape[0], -1), kept + prefix], dim=1)
    expected = full.gather(1, rows[..., None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(tokens, expected, **TOLERANCE)


@pytest.mark.parametrize("case,attention", RUNS)
def test_each_image_of_a_mixed_batch_gets_its_own_positions(device, case, attention):
    model = case.build(attention).to(device)
    images = [case.input(1, seed, shape)[0].to(device)
              for seed, shape in enumerate([case.shape, *case.other_shapes(), case.shape])]
    with torch.no_grad(), exact_float32():
        together = model.forward_batch(images)
        alone = torch.cat([model(image[None]) for image in images])
    torch.testing.assert_close(together, alone, **TOLERANCE)
