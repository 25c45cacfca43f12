"""The catalogue: one :class:`~visionpe.presets.Preset` per foundation model, each equal to the model's own code
(tests/presets/ check every one against it at random weights). Conventions only; sizes come from the model a preset
is built for (``native``: the published model's, for :func:`~visionpe.presets.preset`)."""
from __future__ import annotations

from .orders import merge_windows, prefix_last
from .preset import Preset, add_preset

# Qwen's vision towers: 2D RoPE over head_dim / 2 rotary channels, h pairs then w pairs, each with
# 10000^(-i / (head_dim / 4)), rotate-half layout, integer positions (no interpolation)
QWEN_ROPE = dict(ndim=2, theta=10000.0, pairs="half", axis_order="ij", scaling="none")

add_preset(Preset(
    name="siglip2",
    model="SigLIP 2 (NaFlex)",
    summary="a learned 16x16 table resized to each image's grid, bilinear with antialias",
    encodings={"tokens": ("learned", dict(ndim=2, grid_shape=(16, 16), interpolation="bilinear", antialias=True,
                                          align_corners=False))},
    native=dict(grid_shape=(16, 16), dim=1152, num_heads=16),
    reference="transformers.models.siglip2.modeling_siglip2.Siglip2VisionEmbeddings.resize_positional_embeddings",
    patch_size=(16, 16),
    notes=("The table is 16x16 whatever grid the backbone trains on (a backbone's own position table is taken over "
           "only when it is 16x16); every other grid reads it resized (bilinear, align_corners=False, antialias: "
           "visionpe's default is bicubic).",
           "NaFlex pads each image's tokens to max_num_patches and fills the padding with the image's first "
           "position vector; visionpe never gives padding a position (MixedLayout masks padded keys), so no real "
           "token sees a padded one in either."),
))

add_preset(Preset(
    name="qwen2_5_vl",
    model="Qwen2.5-VL vision tower",
    summary="2D RoPE on 14-px patches, tokens in 2x2 merge windows",
    encodings={"rotary": ("rope_axial", QWEN_ROPE)},
    native=dict(grid_shape=(16, 16), dim=1280, num_heads=16),
    reference="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLVisionRotaryEmbedding with "
              "transformers.vision_utils.get_vision_position_ids and apply_rotary_pos_emb_vision",
    patch_size=(14, 14),
    notes=("Tokens come in 2x2 merge windows (token_order: orders.merge_windows); inside the blocks they are "
           "regrouped by attention window (orders.attention_windows). Positions travel with the tokens, so in a "
           "visionpe backbone (row-major tokens, global attention) the order changes nothing.",
           "Integer positions from 0, no interpolation (scaling='none'; visionpe's default in a model is 'pi').",
           "Video frames (temporal patch 2) share the spatial positions: the vision tower has no time rotation."),
    architecture="window attention (112-px windows, 8x8 patches) in every block but 7, 15, 23 and 31, and the 2x2 "
                 "patch merger: architecture, not position; not implemented",
    token_order=merge_windows,
))

add_preset(Preset(
    name="qwen3_vl",
    model="Qwen3-VL vision tower",
    summary="a learned 48x48 table resized bilinearly with align_corners=True, plus 2D RoPE",
    encodings={"tokens": ("learned", dict(ndim=2, grid_shape=(48, 48), interpolation="bilinear", antialias=False,
                                          align_corners=True)),
               "rotary": ("rope_axial", QWEN_ROPE)},
    native=dict(grid_shape=(48, 48), dim=1152, num_heads=16),
    reference="transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionModel (pos_embed read through "
              "transformers.vision_utils.get_vision_interpolation_indices_and_weights) and "
              "Qwen3VLVisionRotaryEmbedding",
    patch_size=(16, 16),
    notes=("The table is resized with align_corners=True (the end patches on the end patches), no antialias; "
           "visionpe's default is bicubic, align_corners=False, antialias.",
           "Tokens come in 2x2 merge windows (token_order: orders.merge_windows); positions travel with them.",
           "Integer RoPE positions from 0, no interpolation (scaling='none')."),
    architecture="the 2x2 patch merger and DeepStack mergers (blocks 8, 16, 24); the language model's interleaved "
                 "M-RoPE (text and vision tokens on one (t, h, w) index) is out of scope: this is the vision tower",
    token_order=merge_windows,
))

add_preset(Preset(
    name="perception_encoder",
    model="Perception Encoder (PE-Core)",
    summary="a learned absolute table resized bilinearly, plus 2D RoPE counted from 1",
    encodings={"tokens": ("learned", dict(ndim=2, interpolation="bilinear", antialias=False)),
               "rotary": ("rope_axial", dict(ndim=2, theta=10000.0, axis_order="xy", scaling="none",
                                             grid_offset=1.0))},
    native=dict(grid_shape=(24, 24), dim=1024, num_heads=16, num_prefix_tokens=1),
    reference="facebookresearch/perception_models@3e352cc core/vision_encoder/pe.py "
              "(VisionTransformer._sample_abs_posemb) and core/vision_encoder/rope.py (Rope2D)",
    patch_size=(14, 14),
    notes=("Patches sit at 1, 2, ... (grid_offset=1), the class token at 0 (unrotated): PE-Core's use_cls_token; "
           "PE-Lang and PE-Spatial have no class token and count from 0: preset('perception_encoder', "
           "grid_offset=0).",
           "The table is resized bilinear, align_corners=False, without antialias; RoPE positions are integers, "
           "never interpolated. timm's port (eva.py vit_pe_*) resizes the table bicubic with antialias and "
           "interpolates RoPE positions to ref_feat_shape: equal at the native grid only (tested)."),
))

add_preset(Preset(
    name="aimv2",
    model="AIMv2 (fixed resolution)",
    summary="a learned absolute table at the training grid",
    encodings={"tokens": ("learned", dict(ndim=2))},
    native=dict(grid_shape=(16, 16), dim=1024, num_heads=8),
    reference="transformers.models.aimv2.modeling_aimv2.Aimv2VisionEmbeddings (is_native=False)",
    patch_size=(14, 14),
    notes=("AIMv2 never resizes its table (its code runs at the training size only); on another grid visionpe "
           "resizes it by its own default (bicubic, antialias): a choice the model does not make.",),
))

add_preset(Preset(
    name="aimv2_native",
    model="AIMv2 (native resolution)",
    summary="2D sin-cos position vectors built on the fly for each grid",
    encodings={"tokens": ("sincos", dict(ndim=2, layout="mae", temperature=10000.0))},
    native=dict(grid_shape=(16, 16), dim=1024, num_heads=8),
    reference="transformers.models.aimv2.modeling_aimv2.Aimv2VisionEmbeddings (is_native=True)",
    patch_size=(14, 14),
    notes=("Channels [sin w | cos w | sin h | cos h] (MAE's layout, layout='mae'), integer positions from 0, "
           "10000^(-i / (dim / 4)).",),
))

add_preset(Preset(
    name="dinov3",
    model="DINOv3",
    summary="2D RoPE on normalised patch centres in [-1, 1], rescale augmentation in training",
    encodings={"rotary": ("rope_axial", dict(ndim=2, theta=100.0, coords="normalized",
                                             normalize_coords="separate", axis_order="ij", pairs="half",
                                             rescale_coords=2.0))},
    native=dict(grid_shape=(14, 14), dim=1024, num_heads=16, num_prefix_tokens=5),
    reference="transformers.models.dinov3_vit.modeling_dinov3_vit.DINOv3ViTRopePositionEmbedding and "
              "apply_rotary_pos_emb",
    patch_size=(16, 16),
    notes=("Periods 100^(i / (head_dim / 4)) in normalised units (w_i = 2 pi / period), y pairs then x pairs, "
           "rotate-half layout; the class token and 4 registers are not rotated.",
           "Training draws a log-uniform rescale in [1/2, 2] per forward (DINOv3ViTConfig's pos_embed_rescale; "
           "shift and jitter off), in the same order and from the same generator: the same seed gives the same "
           "draw."),
))

add_preset(Preset(
    name="vjepa2",
    model="V-JEPA 2",
    summary="3D RoPE, head_dim // 3 channels per axis, the rest unrotated, frequencies repeated across each pair",
    encodings={"rotary": ("rope_axial", dict(ndim=3, theta=10000.0, axis_order="ij", sections="rest_unrotated",
                                             channel_frequencies="repeated", scaling="none"))},
    native=dict(grid_shape=(8, 16, 16), dim=1024, num_heads=16),
    reference="transformers.models.vjepa2.modeling_vjepa2.VJEPA2RopeAttention (get_position_ids, "
              "apply_rotary_embeddings, rotate_queries_or_keys)",
    patch_size=(2, 16, 16),
    notes=("Each axis (t, h, w) gets 2 * (head_dim // 6) channels; its frequencies 10000^(-j / (head_dim // 6)) are "
           "laid out twice over them (.repeat) where RoPE has each once per pair (.repeat_interleave), so the two "
           "channels of a pair turn by different angles: not a rotation (norms change, scores are not relative). "
           "Kept for the checkpoints (channel_frequencies='repeated').",
           "The reference derives (t, h, w) from the token index with its square training grid, so a grid of "
           "another height or width has positions only through its position masks (tested so); visionpe reads "
           "them from the grid."),
))

add_preset(Preset(
    name="pixtral",
    model="Pixtral vision encoder",
    summary="2D RoPE at native resolution, h and w on alternate frequencies of one spectrum",
    encodings={"rotary": ("rope_axial", dict(ndim=2, theta=10000.0, spectrum="mrope_interleaved",
                                             pair_order="by_axis", axis_order="ij", pairs="half", scaling="none"))},
    native=dict(grid_shape=(64, 64), dim=1024, num_heads=16),
    reference="transformers.models.pixtral.modeling_pixtral.PixtralVisionRotaryEmbedding and apply_rotary_pos_emb",
    patch_size=(16, 16),
    notes=("One spectrum 10000^(-2p / head_dim) over the head_dim / 2 pairs: h takes the even frequencies, w the odd "
           "(axial RoPE restarts the spectrum per axis), h block then w block, rotate-half layout; integer positions "
           "from 0.",),
    architecture="images of a batch packed into one sequence with a block-diagonal attention mask (a visionpe "
                 "MixedLayout masks padding instead)",
))

add_preset(Preset(
    name="llama4",
    model="Llama 4 vision encoder",
    summary="a learned absolute table plus 2D RoPE counted from 1, the class token last",
    encodings={"tokens": ("learned", dict(ndim=2)),
               "rotary": ("rope_axial", dict(ndim=2, theta=10000.0, axis_order="xy", scaling="none",
                                             grid_offset=1.0))},
    native=dict(grid_shape=(32, 32), dim=1408, num_heads=16, num_prefix_tokens=1),
    reference="transformers.models.llama4.modeling_llama4.Llama4VisionRotaryEmbedding, vision_apply_rotary_emb and "
              "Llama4VisionModel.positional_embedding_vlm",
    patch_size=(14, 14),
    notes=("The class token is the last token (token_order: orders.prefix_last), not rotated; patches sit at 1, "
           "2, ... (grid_offset=1), x pairs then y pairs, interleaved.",
           "Llama 4 runs fixed 448-px tiles and never resizes its table or recomputes its rotations; on another grid "
           "visionpe resizes the table by its default (bicubic, antialias) and rotates by the grid's positions."),
    token_order=prefix_last,
))

add_preset(Preset(
    name="wan",
    model="Wan 2.1 video DiT",
    summary="3D RoPE split [P - 2 (P // 3), P // 3, P // 3] pairs over (t, h, w)",
    encodings={"rotary": ("rope_axial", dict(ndim=3, theta=10000.0, sections="rest_first", axis_order="ij",
                                             scaling="none"))},
    native=dict(grid_shape=(21, 30, 52), dim=1536, num_heads=12),
    reference="diffusers.models.transformers.transformer_wan.WanRotaryPosEmbed and WanAttnProcessor's "
              "apply_rotary_emb",
    patch_size=(1, 2, 2),
    notes=("Time takes the pairs left over by the floor split (sections='rest_first'; visionpe's video default "
           "gives them to h and w), each axis its own spectrum 10000^(-i / n_axis), interleaved pairs, integer "
           "positions from 0.",
           "diffusers precomputes max_seq_len = 1024 positions per axis; visionpe has no limit."),
))

add_preset(Preset(
    name="cosmos",
    model="Cosmos 1.0 diffusion transformer",
    summary="3D RoPE with a per-axis NTK factor and fps-scaled time, plus learned per-axis absolute tables",
    encodings={"tokens": ("learned", dict(ndim=3, factorized=True, grid_shape=(128, 120, 120), fit="window",
                                          rms_norm=True)),
               "rotary": ("rope_axial", dict(ndim=3, theta=10000.0, sections="rest_first", axis_order="ij",
                                             pairs="half", ntk_factor=(2.0, 1.0, 1.0), scaling="none"))},
    native=dict(grid_shape=(16, 44, 80), dim=4096, num_heads=32),
    reference="diffusers.models.transformers.transformer_cosmos.CosmosRotaryPosEmbed, "
              "CosmosLearnablePositionalEmbed and diffusers.models.embeddings.apply_rotary_emb",
    patch_size=(1, 2, 2),
    notes=("Time positions are t * base_fps / fps for a clip at fps frames per second (base_fps 24): "
           "Grid(shape, spacing=(24 / fps, 1, 1)); images (no fps) use t itself.",
           "NTK factors (2, 1, 1) over (t, h, w) (rope_scale): theta_a = 10000 * s_a^(n_a / (n_a - 1)); the "
           "rotate-half layout, time taking the pairs left over.",
           "The per-axis tables (max_size / patch = 128 x 120 x 120) are cut to the clip, never resized "
           "(fit='window'), summed and divided by their RMS per patch (rms_norm=True).",
           "Cosmos adds the learned vectors before every block; a visionpe tokens encoding is added once, before "
           "the first (block_index=0)."),
))

add_preset(Preset(
    name="moonvit",
    model="MoonViT (Kimi-VL)",
    summary="a learned 64x64 table resized bicubically, plus 2D RoPE with x and y pairs alternating",
    encodings={"tokens": ("learned", dict(ndim=2, grid_shape=(64, 64), interpolation="bicubic", antialias=False)),
               "rotary": ("rope_axial", dict(ndim=2, theta=10000.0, axis_order="xy", pair_order="alternate",
                                             scaling="none"))},
    native=dict(grid_shape=(64, 64), dim=1152, num_heads=16),
    reference="moonshotai/Kimi-VL-A3B-Instruct modeling_kimi_vl.py, read as vllm-project/vllm@055e47c "
              "vllm/model_executor/models/moonvit.py (Learnable2DInterpPosEmb, Rope2DPosEmb, apply_rope)",
    patch_size=(14, 14),
    notes=("The table is resized bicubic, align_corners=False, without antialias (F.interpolate's defaults).",
           "RoPE pairs alternate x, y, x, y (pair_order='alternate'), each axis 10000^(-i / (head_dim / 4)), "
           "interleaved, integer positions from 0; the reference precomputes 512 x 512 positions, visionpe has no "
           "limit."),
    architecture="the 2x2 patch merger after the encoder",
))

add_preset(Preset(
    name="sam3",
    model="SAM 3 perception encoder",
    summary="a learned 24x24 table tiled to the input, plus 2D RoPE on the 24x24 window's positions",
    encodings={"tokens": ("learned", dict(ndim=2, grid_shape=(24, 24), fit="tile")),
               "rotary": ("rope_axial", dict(ndim=2, theta=10000.0, axis_order="xy", scaling="pi",
                                             ref_shape=(24, 24)))},
    native=dict(grid_shape=(72, 72), dim=1024, num_heads=16),
    reference="transformers.models.sam3.modeling_sam3.Sam3ViTEmbeddings._tile_position_embeddings, "
              "Sam3ViTLayer.precompute_positions, Sam3ViTRotaryEmbedding and apply_rotary_pos_emb_2d",
    patch_size=(14, 14),
    notes=("The table is the 336-px pretraining grid's (24x24), repeated along each axis as far as the input goes "
           "and cut there (fit='tile'), never resized; a smaller grid reads its first rows.",
           "RoPE positions live on the 24x24 window: a windowed layer rotates each window's tokens at 0..23 "
           "(rotary on Grid((24, 24))), a global layer scales the 72x72 grid's positions by 24/72 "
           "(scaling='pi', ref_shape=(24, 24)); x pairs then y pairs, interleaved, 10000^(-i / (head_dim / 4)).",
           "SAM 3 precomputes the global layers' positions for its one input size (1008 px, square, one factor "
           "window / width for both axes); on another grid visionpe scales each axis by its own size."),
    architecture="window attention (24x24 patches, the grid padded to whole windows) in every block but 7, 15, 23 "
                 "and 31: architecture, not position (the windows' RoPE grid is stated above); the FPN neck and "
                 "the DETR-style detector's sine positions are out of scope: this is the ViT backbone",
))

add_preset(Preset(
    name="glm4v",
    model="GLM-4.1V / GLM-4.5V vision tower",
    summary="AIMv2's learned 24x24 table resampled bicubically to each grid, plus 2D RoPE",
    encodings={"tokens": ("learned", dict(ndim=2, grid_shape=(24, 24), interpolation="bicubic", antialias=False,
                                          align_corners=False)),
               "rotary": ("rope_axial", QWEN_ROPE)},
    native=dict(grid_shape=(24, 24), dim=1536, num_heads=12),
    reference="transformers.models.glm4v.modeling_glm4v.Glm4vVisionEmbeddings and Glm4vVisionRotaryEmbedding "
              "with apply_rotary_pos_emb_vision (GLM-4.5V: the same code in glm4v_moe)",
    patch_size=(14, 14),
    notes=("The 24x24 table (336-px images) is read at each grid's patch centres by F.grid_sample, bicubic, "
           "align_corners=False, border padding: the same numbers as a bicubic resize without antialias "
           "(visionpe's default has antialias).",
           "RoPE as Qwen's vision towers: h pairs then w pairs, rotate-half layout, integer positions from 0 "
           "(scaling='none').",
           "Tokens come in 2x2 merge windows (token_order: orders.merge_windows); positions travel with them."),
    architecture="the 2x2 downsampling convolution and patch merger; video frames in temporal patches of 2 share "
                 "the spatial positions; the language model's 3D M-RoPE is out of scope: this is the vision tower",
    token_order=merge_windows,
))
