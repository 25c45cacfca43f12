"""STRING, ComRoPE and LieRE against their papers' equations (float64 matrix exponentials written here), against the
official code's conventions on small cases, and their properties: relative (STRING, ComRoPE) or not (LieRE),
orthogonal, tables built once per forward and cached in evaluation."""
from __future__ import annotations

import math

import pytest
import torch
from einops import rearrange

import visionpe as vpe
from visionpe import Grid, Layout

SHAPES = {1: (5,), 2: (3, 4), 3: (2, 3, 2)}
HEADS, HEAD_DIM = 2, 12
LEARNED = [("string", {}), ("string", {"variant": "circulant"}), ("comrope", {}), ("comrope", {"variant": "ap"}),
           ("liere", {}), ("liere", {"block_size": 4})]
IDS = [f"{n}-{'-'.join(map(str, kw.values())) or 'default'}" for n, kw in LEARNED]


def randomised(pe: torch.nn.Module, std: float = 0.7, seed: int = 0) -> torch.nn.Module:
    """Fresh parameters are structured (STRING's S = 0): random ones make every generator entry count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in pe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return pe


def patch_coords(shape, coords: str, offset=None) -> torch.Tensor:
    """``(N, ndim)`` float64 coordinates in grid order, row-major, written from the coordinate definitions."""
    offset = offset or (0.0,) * len(shape)
    axes = []
    for n, o in zip(shape, offset):
        i = torch.arange(n, dtype=torch.float64) + o
        axes.append(i if coords == "index" else 2 * (i + 0.5) / n - 1)
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))


def skew_of_upper(upper: torch.Tensor, size: int) -> torch.Tensor:
    """``(..., size (size - 1) / 2)`` row-major upper-triangle entries -> skew-symmetric ``(..., size, size)``."""
    rows, cols = torch.triu_indices(size, size, 1)
    out = torch.zeros(*upper.shape[:-1], size, size, dtype=upper.dtype)
    out[..., rows, cols] = upper
    return out - out.transpose(-1, -2)


def block_diag(blocks: torch.Tensor) -> torch.Tensor:
    """``(..., m, b, b)`` -> dense block-diagonal ``(..., m b, m b)``."""
    *lead, m, b, _ = blocks.shape
    out = torch.zeros(*lead, m * b, m * b, dtype=blocks.dtype)
    for j in range(m):
        out[..., j * b:(j + 1) * b, j * b:(j + 1) * b] = blocks[..., j, :, :]
    return out


def dense_rotations(generators: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """The paper's ``R(c) = matrix_exp(sum_a c_a L_a)`` per patch: ``generators (ndim, heads, d, d)``, ``coords
    (N, ndim)`` -> ``(heads, N, d, d)`` float64."""
    return torch.linalg.matrix_exp(torch.einsum("na,ahij->hnij", coords.double(), generators.double()).contiguous())


def rotate_reference(x: torch.Tensor, rotations: torch.Tensor, prefix: int) -> torch.Tensor:
    """``x (B, heads, P + N, d)``: patches ``R_n x_n``, prefix tokens unchanged; float64."""
    x = x.double()
    patches = torch.einsum("hnij,bhnj->bhni", rotations, x[:, :, prefix:])
    return torch.cat([x[:, :, :prefix], patches], dim=2)


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q.double() @ k.double().transpose(-1, -2)


def string_generators(pe) -> torch.Tensor:
    """STRING's ``L_k`` (grid axis order): Cayley ``P^T D_k P`` with ``P = (I - S)(I + S)^-1`` (Eq. 10) and ``D_k``
    RoPE's 2x2 blocks of the learned frequencies (Theorem 3.3 / 3.4); circulant ``C_k - C_k^T`` with ``C_ij =
    c_(i-j) mod d`` (Eq. 11). Frequencies and circulants are stored in xy order (x, the last grid axis, first)."""
    d = pe.head_dim
    if pe.variant == "cayley":
        s = skew_of_upper(pe.skew.detach().double(), d)
        eye = torch.eye(d, dtype=torch.float64)
        p = (eye - s) @ torch.linalg.inv(eye + s)
        turn = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
        rope = block_diag(pe.freqs.detach().double()[..., None, None] * turn)  # (ndim, heads, d, d)
        generators = p.transpose(-1, -2) @ rope @ p
    else:
        c = pe.circulant.detach().double()  # (ndim, heads, d)
        index = (torch.arange(d)[:, None] - torch.arange(d)[None]) % d
        circulant = c[..., index]
        generators = circulant - circulant.transpose(-1, -2)
    return generators.flip(0)  # grid order


# -- the papers' equations --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("variant", ["cayley", "circulant"])
def test_string_scores_are_those_of_the_papers_rotation(variant, ndim):
    """Eq. 6 with the paper's generators: scores q'_i . k'_j = (R(c_i) q_i) . (R(c_j) k_j), R = matrix_exp(sum c_k L_k);
    the outputs are R(c) q up to one orthogonal matrix per head (the change of basis P, which cancels in q . k)."""
    shape, grid = SHAPES[ndim], Grid(SHAPES[ndim], prefix=1)
    pe = randomised(vpe.build("string", head_dim=HEAD_DIM, num_heads=HEADS, ndim=ndim, variant=variant))
    generators = string_generators(pe)
    torch.testing.assert_close(generators @ generators.flip(0), generators.flip(0) @ generators)  # commuting
    rotations = dense_rotations(generators, patch_coords(shape, "index"))
    q, k = torch.randn(2, 3, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    with torch.no_grad():
        rq, rk = pe(q, k, grid)
    ref_q, ref_k = rotate_reference(q, rotations, 1), rotate_reference(k, rotations, 1)
    torch.testing.assert_close(scores(rq, rk), scores(ref_q, ref_k), atol=2e-5, rtol=1e-5)
    # every inner product among all outputs (both samples, q and k) is the reference's: the outputs are R(c) q up to
    # one orthogonal map per head
    everything = lambda a, b: rearrange(torch.cat([a, b], dim=2).double(), "b h t d -> h (b t) d")  # noqa: E731
    torch.testing.assert_close(scores(*[everything(rq, rk)] * 2), scores(*[everything(ref_q, ref_k)] * 2), atol=2e-5,
                               rtol=1e-5)


def test_cayley_string_starts_as_rope_mixed():
    """S = 0 at initialisation, so P = I and Cayley-STRING is RoPE-Mixed with the same initial frequencies."""
    string = vpe.build("string", head_dim=HEAD_DIM, num_heads=HEADS, generator=torch.Generator().manual_seed(3))
    mixed = vpe.build("rope_mixed", head_dim=HEAD_DIM, num_heads=HEADS, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(string.freqs, mixed.freqs)
    grid = Grid((3, 4), prefix=1)
    q, k = torch.randn(2, 2, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    with torch.no_grad():
        for a, b in zip(string(q, k, grid), mixed(q, k, grid)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_circulant_string_starts_at_rope_mixed_frequencies():
    """The initial first columns give the Fourier planes RoPE-Mixed's initial frequencies (its last band dropped: the
    constant and alternating channels of a circulant generator never turn)."""
    string = vpe.build("string", head_dim=HEAD_DIM, num_heads=HEADS, variant="circulant",
                       generator=torch.Generator().manual_seed(3))
    mixed = vpe.build("rope_mixed", head_dim=HEAD_DIM, num_heads=HEADS, generator=torch.Generator().manual_seed(3))
    freqs = string.frequency_vectors()
    torch.testing.assert_close(freqs[..., :-1], mixed.freqs.detach()[..., :-1], atol=1e-6, rtol=1e-5)
    assert freqs[..., -1].abs().max() == 0
    # and the eigenvalues of the generators L_k = C_k - C_k^T are +-i * those frequencies
    generators = string_generators(string).flip(0)  # xy order
    eig = torch.linalg.eigvals(generators).imag.abs().sort(-1).values
    expected = torch.cat([freqs.double().abs()] * 2, -1).sort(-1).values
    torch.testing.assert_close(eig, expected, atol=1e-6, rtol=1e-6)


def comrope_generators(pe) -> torch.Tensor:
    """ComRoPE's angle matrices (grid order) from docs/encodings.md's definitions: A_i = diag(B_i1, ..., B_im); AP: B_ij =
    P_j - P_j^T if j = i (mod N), else 0; LD: B_ij = theta_ij (P_j - P_j^T)."""
    bases = pe.bases.detach().double()
    skews = bases - bases.transpose(-1, -2)  # (heads, m, b, b)
    ndim, m = pe.ndim, skews.shape[1]
    if pe.variant == "ap":
        weights = torch.tensor([[1.0 if j % ndim == i else 0.0 for j in range(m)] for i in range(ndim)],
                               dtype=torch.float64)
    else:
        weights = pe.scales.detach().double()
    return block_diag(weights[:, None, :, None, None] * skews[None])  # (ndim, heads, d, d)


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("variant", ["ap", "ld"])
@pytest.mark.parametrize("coords", ["normalized", "index"])
def test_comrope_rotates_by_the_matrix_exponential_of_its_angle_matrices(variant, ndim, coords):
    shape, grid = SHAPES[ndim], Grid(SHAPES[ndim], prefix=1)
    pe = randomised(vpe.build("comrope", head_dim=HEAD_DIM, num_heads=HEADS, ndim=ndim, variant=variant,
                              coords=coords), std=0.4)
    rotations = dense_rotations(comrope_generators(pe), patch_coords(shape, coords))
    q, k = torch.randn(2, 3, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    with torch.no_grad():
        rq, rk = pe(q, k, grid)
    torch.testing.assert_close(rq.double(), rotate_reference(q, rotations, 1), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(rk.double(), rotate_reference(k, rotations, 1), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("block_size", [None, 4])
def test_liere_rotates_by_the_matrix_exponential_of_its_generators(block_size, ndim):
    shape, grid = SHAPES[ndim], Grid(SHAPES[ndim], prefix=1)
    pe = randomised(vpe.build("liere", head_dim=HEAD_DIM, num_heads=HEADS, ndim=ndim, block_size=block_size), std=0.3)
    b = block_size or HEAD_DIM
    generators = block_diag(skew_of_upper(pe.generators.detach().double(), b))  # (ndim, heads, d, d)
    rotations = dense_rotations(generators, patch_coords(shape, "normalized"))
    q, k = torch.randn(2, 3, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    with torch.no_grad():
        rq, rk = pe(q, k, grid)
    torch.testing.assert_close(rq.double(), rotate_reference(q, rotations, 1), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(rk.double(), rotate_reference(k, rotations, 1), atol=2e-5, rtol=1e-5)


# -- the official code's conventions -----------------------------------------------------------------------------------
def comrope_official_scores(q, k, freqs, multiplier, variant, n, block_size):
    """Longin-Yu/ComRoPE ``model.py`` (read at commit 7aeef08), written out for a square 2D grid of n x n patches:
    ``CustomVITConfig.get_positions``: ``meshgrid(arange(n), arange(n), indexing="ij")``, ``(p + 0.5) / n``
    (``axis_scale=True``), the class token first at ``cls_position=0.5``. ``RoPESelfAttentionBase``: ``A`` of shape
    ``(heads, axes, blocks, b, b)``; ``ComRoPELDAttention``: ``A = (freqs - freqs^T) * multiplier``, ``freqs (heads, 1,
    blocks, b, b)``, ``multiplier (1, axes, blocks, 1, 1)``; ``ComRoPEAPAttention``: ``A = (freqs - freqs^T) * mask``,
    ``mask[i, i::axes] = 1``; ``lnR = sum_axes A * position``; ``R = matrix_exp(lnR)`` placed block-diagonally
    (``block_diag_selector = kron(eye(head_dim / b), ones(b, b))``, contiguous channel blocks); ``Q = R @ q`` and
    ``K = R @ k`` as column vectors, logits ``Q K^T``."""
    i = torch.arange(n, dtype=torch.float64)
    positions = (torch.stack(torch.meshgrid(i, i, indexing="ij"), -1).reshape(-1, 2) + 0.5) / n
    positions = torch.cat([torch.full((1, 2), 0.5, dtype=torch.float64), positions])  # (T, axes)
    skews = freqs - freqs.transpose(-1, -2)
    if variant == "ld":
        exponent = skews * multiplier
    else:
        mask = torch.zeros(2, skews.shape[2], dtype=torch.float64)
        for axis in range(2):
            mask[axis, axis::2] = 1.0
        exponent = skews.expand(-1, 2, -1, -1, -1) * mask.view(1, 2, -1, 1, 1)
    log_r = (exponent[None] * positions[:, None, :, None, None, None]).sum(2)  # (T, heads, blocks, b, b)
    rotation = block_diag(torch.linalg.matrix_exp(log_r)).transpose(0, 1)  # (heads, T, d, d)
    rq = (rotation @ q.double()[..., None]).squeeze(-1)
    rk = (rotation @ k.double()[..., None]).squeeze(-1)
    return scores(rq, rk)


@pytest.mark.parametrize("variant", ["ap", "ld"])
def test_comrope_matches_the_official_convention(variant):
    """Our normalised coordinates are 2 p - 1 of the official p: angle matrices half the official ones give the official
    scores exactly, the class token included (official: rotated at the centre p = 0.5; here: not rotated)."""
    n, b = 3, 4
    g = torch.Generator().manual_seed(1)
    freqs = torch.randn(HEADS, 1, HEAD_DIM // b, b, b, generator=g, dtype=torch.float64)
    multiplier = torch.randn(1, 2, HEAD_DIM // b, 1, 1, generator=g, dtype=torch.float64)
    pe = vpe.build("comrope", head_dim=HEAD_DIM, num_heads=HEADS, variant=variant, block_size=b)
    with torch.no_grad():
        pe.bases.copy_(freqs[:, 0] / 2)
        if variant == "ld":
            pe.scales.copy_(multiplier[0, :, :, 0, 0])
    grid = Grid((n, n), prefix=1)
    q, k = torch.randn(2, 2, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    with torch.no_grad():
        rq, rk = pe(q, k, grid)
    expected = comrope_official_scores(q, k, freqs, multiplier, variant, n, b)
    torch.testing.assert_close(scores(rq, rk), expected, atol=2e-5, rtol=1e-5)


def liere_official_rotate(x, raw, shape):
    """StanfordMIMI/LieRE ``models/rope_vit.py`` (read at commit b27b41b), ``LierePositionEncoder.forward`` with
    ``phase_type="learned"``, per-head rotations, one layer, at the training image size:
    ``PositionEncoderBase.forward``: ``cartesian_prod(linspace(0, 1, n_a) per axis)`` (max value steps/expected = 1);
    ``upper = triu(raw, diagonal=1) - 0.5``, ``bases = upper - upper^T``; ``generator_pos = sum over axes of
    positions * bases``; a zero generator (identity) for the class token first; ``matrix_exp``.
    ``FlexibleAttention.apply_transforms``: the transforms viewed ``(1, tokens, heads, rotators, g, g)`` (generator
    ``h * rotators + j`` belongs to head h, block j), channels reshaped ``(rotators, g, 1)`` (contiguous blocks), rotated
    as column vectors ``R @ x``."""
    ndim, _, num_generators, g, _ = raw.shape
    axes = [torch.linspace(0, 1, n, dtype=torch.float64) for n in shape]
    positions = torch.cartesian_prod(*axes).reshape(-1, ndim)  # (N, ndim), first axis slowest
    upper = torch.triu(raw, diagonal=1) - 0.5
    bases = upper - upper.transpose(-1, -2)  # (ndim, 1, generators, g, g)
    generator_pos = (positions.reshape(-1, ndim, 1, 1, 1, 1) * bases[None]).sum(1)  # (N, 1, generators, g, g)
    generator_pos = torch.cat([torch.zeros_like(generator_pos[:1]), generator_pos])
    transforms = torch.linalg.matrix_exp(generator_pos)[:, 0]  # (T, generators, g, g)
    batch, heads, tokens, head_dim = x.shape
    transforms = transforms.view(tokens, heads, num_generators // heads, g, g).transpose(0, 1)  # (heads, T, j, g, g)
    blocks = x.double().reshape(batch, heads, tokens, num_generators // heads, g, 1)
    return (transforms @ blocks).flatten(-3)


@pytest.mark.parametrize("block_size", [HEAD_DIM, 4])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 3)])
def test_liere_matches_the_official_convention(shape, block_size):
    """The official positions i / (n_a - 1) on the training grid are our index coordinates over (n_a - 1): generators
    divided by (n_a - 1) (only the entries above the diagonal count) give the official rotations exactly."""
    ndim = len(shape)
    g = torch.Generator().manual_seed(2)
    blocks = HEAD_DIM // block_size
    raw = torch.rand(ndim, 1, HEADS * blocks, block_size, block_size, generator=g, dtype=torch.float64) * 2 * math.pi
    pe = vpe.build("liere", head_dim=HEAD_DIM, num_heads=HEADS, ndim=ndim, block_size=block_size, coords="index")
    rows, cols = torch.triu_indices(block_size, block_size, 1)
    per_unit = raw[:, 0, :, rows, cols].reshape(ndim, HEADS, blocks, -1)
    with torch.no_grad():
        pe.generators.copy_(per_unit / (torch.tensor(shape, dtype=torch.float64) - 1)[:, None, None, None])
    grid = Grid(shape, prefix=1)
    q = torch.randn(2, HEADS, grid.num_tokens, HEAD_DIM)
    with torch.no_grad():
        torch.testing.assert_close(pe.rotate(q, grid).double(), liere_official_rotate(q, raw, shape), atol=5e-5,
                                   rtol=1e-5)


# -- properties ------------------------------------------------------------------------------------------------------
RELATIVE = [("string", {}), ("string", {"variant": "circulant"}), ("comrope", {}), ("comrope", {"variant": "ap"}),
            ("comrope", {"coords": "index"})]


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("name,kw", RELATIVE, ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}"
                                                   for n, kw in RELATIVE])
def test_commuting_generators_give_scores_of_coordinate_differences_only(name, kw, ndim):
    """Translating every patch (a grid offset) leaves each patch-patch q_i . k_j unchanged (prefix tokens are not
    rotated: they sit at the origin, so their scores with patches are absolute by design)."""
    shape = SHAPES[ndim]
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, ndim=ndim, **kw), std=0.5)
    q, k = torch.randn(2, 2, HEADS, math.prod(shape) + 1, HEAD_DIM).unbind(0)
    with torch.no_grad():
        base = scores(*pe(q, k, Grid(shape, prefix=1)))[..., 1:, 1:]
        shifted = scores(*pe(q, k, Grid(shape, prefix=1, offset=(1.5, -2.0, 3.25)[:ndim])))[..., 1:, 1:]
    assert (base - scores(q, k)[..., 1:, 1:]).abs().max() > 0.1  # the positions matter
    torch.testing.assert_close(shifted, base, atol=5e-5, rtol=1e-5)


def test_liere_scores_are_not_relative_in_2d_but_are_in_1d():
    """LieRE's generators do not commute, so a translation changes the scores (the paper: not exactly relative); one
    axis has one generator, which commutes with itself: then LieRE is relative."""
    pe = randomised(vpe.build("liere", head_dim=HEAD_DIM, num_heads=HEADS, ndim=2), std=0.5)
    generators = skew_of_upper(pe.generators.detach().double(), HEAD_DIM)
    assert (generators[0] @ generators[1] - generators[1] @ generators[0]).norm() > 1.0
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    with torch.no_grad():
        base = scores(*pe(q, k, Grid((3, 4), prefix=1)))[..., 1:, 1:]
        shifted = scores(*pe(q, k, Grid((3, 4), prefix=1, offset=(1.5, -2.0))))[..., 1:, 1:]
    assert (shifted - base).abs().max() > 0.1 * base.abs().max()
    line = randomised(vpe.build("liere", head_dim=HEAD_DIM, num_heads=HEADS, ndim=1), std=0.5)
    q, k = torch.randn(2, 2, HEADS, 6, HEAD_DIM).unbind(0)
    with torch.no_grad():
        torch.testing.assert_close(scores(*line(q, k, Grid((5,), prefix=1, offset=(2.5,))))[..., 1:, 1:],
                                   scores(*line(q, k, Grid((5,), prefix=1)))[..., 1:, 1:], atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_rotations_are_orthogonal(name, kw):
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, ndim=2, **kw))
    blocks = pe.rotation_blocks((3, 4)).double()
    eye = torch.eye(blocks.shape[-1], dtype=torch.float64).expand_as(blocks)
    torch.testing.assert_close(blocks.transpose(-1, -2) @ blocks, eye, atol=1e-5, rtol=0)
    x = torch.randn(4, HEADS, 13, HEAD_DIM)
    with torch.no_grad():
        torch.testing.assert_close(pe.rotate(x, Grid((3, 4), prefix=1)).norm(dim=-1), x.norm(dim=-1), atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_kernel_is_the_expected_score_of_rotated_isotropic_vectors(name, kw):
    """pair_map: K[i, j] = tr(R_i^T R_j) / d, with R from the module's own rotate() of the basis vectors."""
    shape = (3, 4)
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw), std=0.5)
    n = math.prod(shape)
    basis = torch.eye(HEAD_DIM)[:, None, None, :].expand(HEAD_DIM, HEADS, n, HEAD_DIM).contiguous()
    with torch.no_grad():
        rotated = pe.rotate(basis, Grid(shape))  # (d, heads, N, d): R_n e_b, up to STRING's basis P
    expected = torch.einsum("bhid,bhjd->hij", rotated.double(), rotated.double()).float() / HEAD_DIM
    torch.testing.assert_close(pe.pair_map(shape), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_kernel_of_2x2_pairs_is_todays_rope_kernel(name):
    """The block kernel tr(R_i^T R_j)/d equals the RoPE kernel of the pairs' cis (YaRN's magnitude included)."""
    for kw in ({}, {"scaling": "yarn", "ref_shape": (2, 3)}):
        pe = vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw)
        cis = pe.cis(Grid((4, 5)))
        torch.testing.assert_close(pe.pair_map((4, 5)), vpe.rotary.rope_kernel(cis).float(), atol=1e-6, rtol=0)


# -- cost: exponentials once per forward per table, cached in evaluation --------------------------------------------
class Counter:
    """Counts the matrices ``torch.linalg.matrix_exp`` and ``torch.linalg.solve`` receive."""

    def __init__(self, monkeypatch):
        self.exps, self.solves = [], []
        exp, solve = torch.linalg.matrix_exp, torch.linalg.solve
        monkeypatch.setattr(torch.linalg, "matrix_exp", lambda a: (self.exps.append(a.shape), exp(a))[1])
        monkeypatch.setattr(torch.linalg, "solve", lambda a, b: (self.solves.append(a.shape), solve(a, b))[1])

    def matrices(self, shapes) -> int:
        return sum(math.prod(s[:-2]) for s in shapes)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_exponentials_once_per_forward_and_cached_in_eval(monkeypatch, name, kw):
    shape = (3, 4)
    pe = vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw)
    counter = Counter(monkeypatch)
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    grid = Grid(shape, prefix=1)
    pe.train()(q, k, grid)  # training: one table for q and k
    blocks = HEAD_DIM // getattr(pe, "block_size", 2)
    expected = {"string": 0, "comrope": sum(shape) * HEADS * blocks, "liere": math.prod(shape) * HEADS * blocks}[name]
    assert counter.matrices(counter.exps) == expected  # ComRoPE: one per axis coordinate; LieRE: one per position
    assert len(counter.solves) == (1 if kw == {} and name == "string" else 0)  # Cayley: one solve for all heads
    pe.train()(q, k, grid)
    assert counter.matrices(counter.exps) == 2 * expected  # rebuilt: gradients must reach the generators
    with torch.no_grad():
        pe.eval()
        first = pe(q, k, grid)
        built = (len(counter.exps), len(counter.solves))
        second = pe(q, k, grid)
    assert (len(counter.exps), len(counter.solves)) == built  # cached
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_eval_cache_follows_an_optimizer_step(name, kw):
    """An update of the generators (in place, as an optimizer step or load_state_dict) invalidates the cached table."""
    pe = vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw).eval()
    grid = Grid((3, 4), prefix=1)
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    with torch.no_grad():
        pe(q, k, grid)
        for p in pe.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        fresh = type(pe)(**{**constructor_args(pe), **kw})
        fresh.load_state_dict(pe.state_dict())
        for a, b in zip(pe(q, k, grid), fresh.eval()(q, k, grid)):
            torch.testing.assert_close(a, b)


def constructor_args(pe) -> dict:
    return dict(head_dim=pe.head_dim, num_heads=pe.num_heads, ndim=pe.ndim)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_training_gradients_reach_every_generator(name, kw):
    pe = vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw).train()
    grid = Grid((3, 4), prefix=1)
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    rq, rk = pe(q, k, grid)
    (scores(rq, rk) * torch.randn(2, HEADS, 13, 13, dtype=torch.float64)).sum().backward()
    for pname, p in pe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_tables_in_float32_and_half_inputs_keep_their_dtype(name, kw):
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw), std=0.3).eval()
    grid = Grid((3, 4), prefix=1)
    assert pe.rotations(grid).dtype == torch.float32
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    with torch.no_grad():
        full = pe(q, k, grid)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = pe(q.bfloat16(), k.bfloat16(), grid)
    for a, b in zip(full, half):
        assert b.dtype == torch.bfloat16 and torch.isfinite(b.float()).all()
        torch.testing.assert_close(b.float(), a, atol=0.05, rtol=0.02)


# -- coordinates and a resolution change ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_position_interpolation_maps_a_larger_grid_onto_the_training_range(name, kw):
    """scaling='pi' against ref_shape (3, 4): on the (6, 8) grid, patch (2i, 2j) gets the rotation of (i, j)."""
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, coords="index", scaling="pi",
                              ref_shape=(3, 4), **kw), std=0.5)
    small = pe.rotation_blocks((3, 4)).reshape(HEADS, 3, 4, *pe.rotation_blocks((3, 4)).shape[2:])
    large = pe.rotation_blocks((6, 8)).reshape(HEADS, 6, 8, *small.shape[3:])
    torch.testing.assert_close(large[:, ::2, ::2], small, atol=1e-5, rtol=1e-5)
    plain = pe.with_scaling("none")
    assert not torch.allclose(plain.rotation_blocks((6, 8)), pe.rotation_blocks((6, 8)), atol=1e-3)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_normalized_coordinates_span_every_grid(name, kw):
    """coords='normalized': the centre patch of an odd grid sits at 0 on every grid size, where every rotation is the
    identity; normalised coordinates take no resolution scaling."""
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, coords="normalized", **kw), std=0.5)
    blocks = pe.rotation_blocks((3, 3))
    eye = torch.eye(blocks.shape[-1]).expand_as(blocks[:, 4])
    torch.testing.assert_close(blocks[:, 4], eye, atol=1e-6, rtol=0)  # the centre patch of a 3x3 grid
    torch.testing.assert_close(pe.rotation_blocks((7, 5))[:, 17], eye, atol=1e-6, rtol=0)  # and of a 7x5 grid
    with pytest.raises(ValueError, match="coords='normalized'"):
        vpe.build(name, head_dim=HEAD_DIM, coords="normalized", scaling="pi", ref_shape=(3, 4), **kw)


@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_coordinate_augmentation_in_training_only(name, kw):
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, shift_coords=0.5, jitter_coords=1.2,
                              rescale_coords=1.3, **kw), std=0.5)
    grid = Grid((3, 4), prefix=1)
    q, k = torch.randn(2, 2, HEADS, 13, HEAD_DIM).unbind(0)
    with torch.no_grad():
        plain = pe.eval()(q, k, grid)
        assert all(torch.equal(a, b) for a, b in zip(plain, pe(q, k, grid)))
        pe.train()
        torch.manual_seed(5)
        first = pe(q, k, grid)
        torch.manual_seed(5)
        again = pe(q, k, grid)
        other = pe(q, k, grid)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # one draw from the seed
    assert not torch.allclose(first[0], plain[0], atol=1e-4) and not torch.allclose(first[0], other[0], atol=1e-4)
    torch.testing.assert_close(first[0][:, :, 0], plain[0][:, :, 0])  # the class token has no position to augment


# -- token subsets ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw", LEARNED, ids=IDS)
def test_kept_tokens_are_rotated_by_their_own_positions(name, kw):
    pe = randomised(vpe.build(name, head_dim=HEAD_DIM, num_heads=HEADS, **kw), std=0.5).eval()
    grid = Grid((3, 4), prefix=1)
    g = torch.Generator().manual_seed(0)
    keep = torch.stack([torch.randperm(12, generator=g)[:5] for _ in range(3)])
    layout = Layout(grid, keep)
    q, k = torch.randn(2, 3, HEADS, grid.num_tokens, HEAD_DIM).unbind(0)
    index = layout.token_index()[:, None, :, None].expand(-1, HEADS, -1, HEAD_DIM)
    with torch.no_grad():
        full = pe(q, k, grid)
        kept = pe(q.gather(2, index), k.gather(2, index), layout)
    for a, b in zip(kept, full):
        torch.testing.assert_close(a, b.gather(2, index), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("size,count", [(2, 6), (3, 4), (4, 3), (4, 16), (8, 8), (12, 1)])
def test_packed_blocks_are_the_same_rotation(size, count):
    """Small blocks are applied as larger block-diagonal ones: the same product, and unpacking gives them back."""
    from visionpe.rotary.blocks import apply_blocks, pack_blocks, packing, unpack_blocks

    blocks = torch.randn(2, 5, count, size, size)
    packed = pack_blocks(blocks)
    g = packing(count, size)
    assert packed.shape == (2, 5, count // g, g * size, g * size) and (g == 1 or g * size <= 8)
    torch.testing.assert_close(unpack_blocks(packed, size), blocks)
    dense = block_diag(blocks.double())
    torch.testing.assert_close(block_diag(packed.double()), dense)
    x = torch.randn(3, 5, 2, count * size).transpose(1, 2)  # token-major, as q sliced from a fused qkv
    out = apply_blocks(x, packed)
    torch.testing.assert_close(out.double(), torch.einsum("htij,bhtj->bhti", dense, x.double()), atol=1e-5, rtol=1e-5)
    assert out.is_contiguous()  # unit-stride channels: SDPA's fused CPU kernel takes them


@pytest.mark.parametrize("heads", [1, HEADS])
def test_block_product_gradients_equal_autograd_of_the_plain_product(heads):
    """The shared-table product's own backward (columns recovered as R^T (R x)) gives the plain product's gradients."""
    from visionpe.rotary.blocks import apply_blocks

    blocks = torch.linalg.matrix_exp(skew_of_upper(torch.randn(heads, 7, 3, 6, dtype=torch.float64), 4)).float()
    blocks.requires_grad_()
    x = torch.randn(5, HEADS, 7, 12, requires_grad=True)
    weights = torch.randn(5, HEADS, 7, 12)
    (apply_blocks(x, blocks) * weights).sum().backward()
    plain_blocks, plain_x = blocks.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    plain = (plain_blocks[None].expand(5, HEADS, -1, -1, -1, -1) @ plain_x.unflatten(-1, (3, 4))[..., None])
    (plain.squeeze(-1).flatten(-2) * weights).sum().backward()
    torch.testing.assert_close(x.grad, plain_x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(blocks.grad, plain_blocks.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("norm", [0.01, 1.0, 100.0, 2.0 ** 15])
def test_exported_matrix_exp_is_the_exponential_to_float32_rounding(norm, monkeypatch):
    """The matrix exponential an exported graph computes (scaling and squaring in float64: ONNX has none) equals
    float64 ``matrix_exp`` of the same float32 skew-symmetric input to float32 rounding, up to ``||a|| = 2^15``."""
    from visionpe.rotary import blocks
    a = torch.randn(32, 4, 4, dtype=torch.float64)
    a = a - a.transpose(-1, -2)
    a = (a / torch.linalg.matrix_norm(a, ord=2)[:, None, None] * norm).float()
    monkeypatch.setattr(blocks, "is_exporting", lambda: True)
    got = blocks.matrix_exp(a)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.linalg.matrix_exp(a.double()), rtol=0, atol=1e-7)
