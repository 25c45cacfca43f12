"""Speed and memory benchmarks of visionpe encodings, as ratios measured side by side in one run
(docs/reports/PERFORMANCE.md holds the results and, under "Reading these numbers", how to read them).

    visionpe bench-speed [--device cpu|cuda] [--parts rope forward ...] [--pes rope_mixed ...]
                                  [--repeats 5] [--slow-repeats 5] [--min-run-time 0.25] [--scale-repeats 1]
                                  [--threads N] [--compile-pairs learned swin_bias ...] [--quick] [--out PATH]
                                  [--record JSON]
    visionpe bench-speed --report-only RECORD.json [RECORD.json ...] [--out PATH]

Every time ratio compares timings taken in the same process, interleaved round-robin: each round times every
function in turn for a block of calls lasting at least ``--min-run-time`` seconds, and the median of the rounds'
per-call times is reported. The tables of the ViT-S/16 and Swin models at ``--batch`` 8 (ViT-S/16 eval forward and
training step, timm, cache), whose calls take 0.5 to 2.5 s on CPU (a round is one call, 2-10x ``--min-run-time``),
use ``--slow-repeats`` rounds. Rows named ``... (control)`` repeat the baseline with a second, identical model or
op: their gap to the baseline is the noise of the run. Parts (``--parts``, default all but the opt-in
``compile-train``, ``flex``, ``flex-models``, ``profile``, ``data``, ``video`` and ``onnx``, in this order):

- ``rope``: RoPE apply on q and k of ViT-S/16 shape sliced from a fused qkv at batch 8 and 64, eager and compiled,
  vs a copy of q and k (the memory floor) and timm's ``apply_rot_embed_cat``.
- ``forward``: eval forward of each encoding vs the same model without position, at ViT-S/16 224 px and at the
  small training config (``bench_vit_tiny``).
- ``train``: a training step (forward, backward, AdamW step; train mode, same batch, fixed seed), same models.
- ``memory``: peak memory of that training step per encoding vs none (CUDA: ``max_memory_allocated``; CPU: the
  peak of live tensor storages allocated in the step, tracked per operator by :class:`LiveTensorBytes`).
- ``compile``: ``torch.compile(model, fullgraph=True)`` eval forward per encoding vs compiled none (small config);
  and compiled visionpe vs compiled timm, same weights (``--compile-pairs``, each pair 1-1.5 min of compilation on
  2 cores with an empty inductor cache: by default learned ViT-S/16 and ``swin_bias`` Swin-T; ``control``,
  ``rope_axial``, ``rope_mixed`` on request; none when given no names).
- ``compile-train`` (opt-in: compiling eleven training steps takes 3-4 minutes on 2 cores, which would take the
  default run past 10): the training step of ``torch.compile(model, fullgraph=True)`` per encoding vs compiled none
  (small config).
- ``timm``: visionpe vs timm native, eager, same weights: learned ViT vs timm ViT (dynamic size), axial and mixed
  RoPE ViT vs timm's rope-vit ports (``Eva``), swin_bias Swin-T, cpb SwinV2-T.
- ``cache``: alternating resolutions (224/256) vs fixed ones: the table caches at work.
- ``scale``: large grids, batch 1 (ViT-S/16 at 1024 px, a 16-frame video): forward time and the position tables
  each encoding uses per forward.
- ``flex`` (opt-in, not in the default list: ``--parts flex``): compiled FlexAttention with a ``score_mod`` vs SDPA
  with the same bias materialised, for biases computed from token coordinates (ALiBi-2D, a Swin table), at ViT-S/16
  shape and at 4096 tokens; and whether training through FlexAttention works on the device.
- ``flex-models`` (opt-in): visionpe's ``attention="flex"`` vs ``"sdpa"`` in a ViT-S/16 with ``rel_bias`` and
  ``alibi``: eval forward, training step and (CUDA) its peak memory at 197 and 4097 tokens (CPU, 2 of the 12 blocks,
  float32) or 4097 and 16385 tokens (CUDA, bf16 autocast), and (CUDA) the compiled eval forward.
- ``profile`` (opt-in): the training step of each encoding under ``torch.profiler`` at ViT-S/16 and the small config:
  the operators where its time over ``none`` goes (the evidence behind "Not met, and why" in docs/reports/PERFORMANCE.md).

- ``data`` (opt-in: it writes a folder of JPEGs and decodes it many times): visionpe's training loader (timm's
  transforms, seeded per sample) vs timm's ``create_loader`` on the same JPEG folder at 224 px, same transforms and
  workers, square and native aspect (``create_naflex_loader``); and the share of a training step spent waiting for
  data.
- ``video`` (opt-in): eval forward and training step of each encoding of ``--pes`` that is defined on 3D grids, and
  of the video-only ``videorope`` and ``riflex``, vs the same tubelet video ViT without position: the video
  benchmark's recipe (``bench_video_tiny``) and ViT-S/16 on 8 frames of 224 px (tubelets 2x16x16, batch 2).
- ``onnx`` (opt-in; needs ``pip install 'visionpe[export]'``): onnxruntime CPU latency of exported visionpe models
  against timm's exported twins holding the same weights (learned ViT vs timm's ViT with ``dynamic_img_size``, the
  native axial-RoPE Eva vs timm's rope-vit port), each exported with a free height and width and checked against
  eager first, at 224 and 448 px, batch 1, and a control (timm's file in a second session).

``--quick`` swaps every model for a tiny one and times one short round: a smoke test of the script, not a
measurement. ``--out`` rewrites the file's tables and keeps its hand-written "Reading these numbers" section.
``--record`` (default with ``--out``: ``data/<its name>/speed/<UTC time>.json`` beside it) writes the results as
data after each part: the command, the settings and their hash, the machine and versions, every table, the wall
time. The report is made from that record alone, so ``--report-only RECORD`` rebuilds it byte for byte on any
machine; several records (a CPU's and a GPU's, or one a part), or one with a hand-written reading (``NAME.md``
beside ``NAME.json``), make one report with a section a record, each naming its machine (docs/reports/PERFORMANCE.md
is made so, and :mod:`visionpe.bench.rebuild` checks it against its records).
Targets (printed with each ratio): time and memory of an encoding <= 1.05x none (``peg`` <= 1.10x).

Modules: :mod:`.plan` (which model, which batch), :mod:`.timing` (interleaved rounds), :mod:`.tables` (ratio
tables), one module per part (:mod:`.rope`, :mod:`.steps`, :mod:`.memory`, :mod:`.versus_timm`, :mod:`.scale`,
:mod:`.flex`, :mod:`.flex_models`, :mod:`.profile`, :mod:`.loader`, :mod:`.video`, :mod:`.onnx_latency`) and :mod:`.cli` (``visionpe bench-speed``). A new part is a function
``part(run) -> list[Table]`` in its own module and one entry in :data:`visionpe.bench.speed.cli.RUNNERS`.
"""
