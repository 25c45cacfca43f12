"""visionpe.bench (visionpe bench-speed): a ``--quick`` run writes every part's table with finite ratios (to a temporary file,
never docs/reports/PERFORMANCE.md), the opt-in flex part included; the CPU memory tracker and the table census count what
they claim."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch
from conftest import requires

from visionpe.bench.speed import cli, flex, memory, plan, profile, timing
from visionpe.cli import UserError
from visionpe.cli.report import keep_hand_written

# part -> (tables it writes under --quick, start of their titles)
TITLES = {"rope": (2, "RoPE apply"), "forward": (2, "Eval forward"), "train": (2, "Training step (forward"),
          "memory": (2, "Training step peak memory"), "timm": (1, "visionpe vs timm native"),
          "cache": (1, "Alternating resolutions"), "scale": (2, "Large grid"), "compile": (1, "Compiled eval forward")}
PER_ENCODING = ("Eval forward", "Training step", "Large grid", "Compiled eval forward")
# torch.compile(fullgraph=True) through a Grid needs torch >= 2.4 (README): before it the compiled rows are errors
TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
FULLGRAPH = TORCH >= (2, 4)
# torch 2.1's profiler now and then loses an operator's event (one step profiled twelve times in a row counted 133
# aten::empty once and 134 the other times), so there the control row is not always exactly none's; the releases
# after it are taken to count exactly (2.1.2 and the pinned release checked, not the ones between)
EXACT_PROFILE = TORCH >= (2, 2)


@pytest.fixture
def one_thread():
    """One thread: on a busy two-core machine two OpenMP threads wait on each other; restored afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def parse_tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """``{title: [row as {column: cell}]}`` of the report's ``**title**`` + markdown table blocks."""
    tables, title, header = {}, None, None
    for line in markdown.splitlines():
        if line.startswith("**") and line.endswith("**"):
            title, header = line.strip("*"), None
            tables[title] = []
        elif line.startswith("|") and title is not None:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|-"):
                tables[title].append(dict(zip(header, cells)))
    return tables


def ratio(cell: str) -> float:
    assert cell.endswith("x"), cell
    return float(cell[:-1])


def check_part(tables: dict, part: str) -> list:
    count, start = TITLES[part]
    found = {title: rows for title, rows in tables.items() if title.startswith(start)}
    assert len(found) == count, (part, list(tables))
    for title, rows in found.items():
        assert rows, title
        for row in rows:
            for column, cell in row.items():
                if column.startswith("vs ") or column in ("ours / timm", "ratio"):
                    if cell == "-" and not FULLGRAPH and "compiled" in next(iter(row.values())):
                        continue  # the row's error: torch.compile(fullgraph=True) of it needs torch >= 2.4
                    assert math.isfinite(ratio(cell)) and ratio(cell) > 0, (title, row)
        if title.startswith(PER_ENCODING):
            assert [row["pe"] for row in rows] == ["none", "none (control)", *cli.PES], title
            assert all(row["target"] for row in rows if "target" in row)
    return list(found.items())


def test_quick_run_writes_every_part(tmp_path, one_thread):
    parts = [s for s in cli.PARTS if s != "compile"]  # compiling ten encodings: the test below, one encoding
    out, record = tmp_path / "PERFORMANCE.md", tmp_path / "speed.json"
    report = cli.main(["--quick", "--threads", "1", "--parts", *parts, "--out", str(out), "--record",
                       str(record)])
    assert out.read_text() == report
    assert report.startswith("# Performance\n\nMade by `visionpe bench-speed --quick")
    # the same results as data: settings and their hash, the machine, every part's tables and wall time
    data = json.loads(record.read_text())
    assert cli.read_speed_record(record) == data
    assert data["format"] == cli.RECORD_FORMAT and data["command"].startswith("visionpe bench-speed --quick")
    assert data["settings"]["parts"] == parts and "out" not in data["settings"]
    assert len(data["settings_sha256"]) == 64 and data["made_by"]["torch"] and data["made_by"]["device"] == "cpu"
    assert [s["name"] for s in data["parts"]] == parts and all(s["seconds"] > 0 for s in data["parts"])
    assert all(f"**{t['title']}**" in report for s in data["parts"] for t in s["tables"])
    assert data["wall_s"] >= sum(s["seconds"] for s in data["parts"])
    # the report is made from the record alone: --report-only rebuilds it byte for byte, measuring nothing
    rebuilt = tmp_path / "REBUILT.md"
    assert cli.main(["--report-only", str(record), "--out", str(rebuilt)]) == report == rebuilt.read_text()
    tables = parse_tables(report)
    for part in parts:
        check_part(tables, part)
    # the census: ALiBi is one module shared by both blocks: one table, built in the first forward only
    for _, rows in check_part(tables, "scale"):
        alibi = next(row for row in rows if row["pe"] == "alibi")
        assert (alibi["encoding calls"], alibi["tables (1st / next forward)"], alibi["built (1st / next)"]) == \
               ("2", "1 / 1", "1 / 0")
        assert all(row["built once"] == "met" for row in rows)
    # memory is deterministic: the control model's peak equals none's
    memory = check_part(tables, "memory")
    for _, rows in memory:
        assert rows[1]["vs none"] == "1.000x"
    # ... and the same whether its steps follow the train part's (shared) or are its own (after a warm-up step)
    alone = cli.main(["--quick", "--threads", "1", "--parts", "memory"])
    assert check_part(parse_tables(alone), "memory") == memory


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_quick_compile_part(tmp_path, one_thread):
    out = tmp_path / "compiled.md"
    report = cli.main(["--quick", "--threads", "1", "--parts", "compile", "--pes", "alibi", "--compile-pairs",
                         "control", "--out", str(out)])
    tables = parse_tables(report)
    [(title, rows)] = [(t, r) for t, r in tables.items() if t.startswith("Compiled eval forward")]
    assert [row["pe"] for row in rows] == ["none", "none (control)", "alibi"]
    assert all(math.isfinite(ratio(row["vs none"])) for row in rows), rows
    assert not any(row["ms"].startswith("error") for row in rows), rows
    # --compile-pairs chooses the compiled visionpe-vs-timm pairs: here only the control (two identical timm ViTs)
    [pairs] = [r for t, r in tables.items() if t.startswith("visionpe vs timm native, compiled")]
    assert [row["pair"] for row in pairs] == ["control: timm ViT vs an identical timm ViT"]
    assert math.isfinite(ratio(pairs[0]["ours / timm"])), pairs
    assert cli.parse_args([]).compile_pairs == ["learned", "swin_bias"]
    assert not cli.main(["--quick", "--parts", "compile", "--pes", "alibi", "--compile-pairs"]).count(
        "visionpe vs timm native, compiled")


def test_live_tensor_bytes_tracks_the_peak_of_live_storages():
    with memory.LiveTensorBytes() as tracker:
        a = torch.zeros(1000)  # 4000 bytes
        b = a.view(10, 100).add_(1)  # a view and an in-place result: the same storage, not counted again
        del a, b  # freed: 0 live
        c = torch.zeros(500)
        d = c + 1  # 2000 + 2000 live
    assert (tracker.peak, tracker.live) == (4000, 4000)
    del c, d
    assert tracker.live == 0


def test_old_speed_record_is_read_with_parts(tmp_path):
    """A record written before ``sections`` was renamed ``parts`` (at the top and in its settings) reads as one
    written now; a record giving both names, or another format, is an error naming the file."""
    part = {"name": "rope", "seconds": 1.5, "tables": []}
    old = {"format": cli.RECORD_FORMAT, "settings": {"sections": ["rope"], "batch": 8}, "sections": [part]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    record = cli.read_speed_record(path)
    assert record["parts"] == [part] and record["settings"] == {"parts": ["rope"], "batch": 8}
    assert "sections" not in record
    path.write_text(json.dumps({**old, "parts": [part]}))
    with pytest.raises(UserError, match="'sections' is the old name of 'parts'; give one of them"):
        cli.read_speed_record(path)
    path.write_text(json.dumps({**old, "format": "something else"}))
    with pytest.raises(UserError, match=f"{path}.*not a visionpe.bench.speed.record/1 record"):
        cli.read_speed_record(path)


def test_records_of_two_machines_rebuild_one_report_each_naming_its_machine(tmp_path, capsys):
    """Speed records made on a CPU and on a GPU (a hand-made record: made_by says cuda) rebuild one report, each
    under its own header naming its device and versions; a record of a run cut short names the parts it missed."""
    table = {"title": "eval forward", "header": ["pe", "ms", "vs none"], "rows": [["none", "1.0", "1.000x"]],
             "note": None}
    made = {"cpu": "Some CPU", "cpu_count": 2, "gpu": None, "platform": "Linux-x", "python": "3.11.7",
            "torch": "2.14.1", "cuda": "13.0", "timm": "1.0.31", "torchvision": "0.29.1", "visionpe": "git aaaa",
            "device": "cpu"}
    settings = {"parts": ["forward", "train"], "repeats": 5, "slow_repeats": 3, "min_run_time": 0.25}
    cpu = {"format": cli.RECORD_FORMAT, "command": "visionpe bench-speed --parts forward train", "settings": settings,
           "settings_sha256": "0" * 64, "made_by": made, "threads": 2, "vit_batch": 8,
           "parts": [{"name": "forward", "seconds": 1.0, "tables": [table]},
                     {"name": "train", "seconds": 1.0, "tables": [{**table, "title": "training step"}]}],
           "wall_s": 2.0, "recorded": "2026-12-07T00:00:00Z"}
    gpu = {**cpu, "command": "visionpe bench-speed --device cuda --parts forward train",
           "made_by": {**made, "gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "visionpe": "git bbbb"},
           "parts": cpu["parts"][:1]}
    paths = [tmp_path / "cpu.json", tmp_path / "gpu.json"]
    for path, record in zip(paths, (cpu, gpu)):
        path.write_text(json.dumps(record))
    report = cli.main(["--report-only", *map(str, paths)])
    assert capsys.readouterr().out == report + "\n"
    assert report.count("# Performance") == 1 and "[cpu](" in report and "[gpu](" in report
    first, second = report.split("\n## ")[1:]  # one section a record, under its name (neither has a reading)
    assert first.startswith("cpu\n") and second.startswith("gpu\n")
    assert "Device: Some CPU, 2 threads; Linux-x; python 3.11.7, torch 2.14.1, timm 1.0.31, visionpe git aaaa;" in first
    assert "medians over 5 interleaved rounds (3 for the ViT-S/16 and Swin tables at batch 8" in first
    assert "**eval forward**" in first and "**training step**" in first and "stopped" not in first
    assert "Made by `visionpe bench-speed --device cuda --parts forward train` in 2 s." in second
    assert "Device: NVIDIA H100 80GB HBM3; Linux-x; python 3.11.7, torch 2.14.1 (CUDA 13.0)" in second
    assert "visionpe git bbbb" in second and "**training step**" not in second
    assert "The run stopped before the parts train: the tables below are those it finished." in second


def speed_records(folder, names) -> list:
    """Two-table speed records named ``names`` in ``folder`` (as :func:`cli.speed_record` lays them out)."""
    table = {"title": "eval forward", "header": ["pe", "ms", "vs none"], "rows": [["none", "1.0", "1.000x"]],
             "note": None}
    made = {"cpu": "Some CPU", "cpu_count": 2, "gpu": None, "platform": "Linux-x", "python": "3.11.7",
            "torch": "2.14.1", "cuda": None, "timm": "1.0.31", "torchvision": "0.29.1", "visionpe": "git aaaa",
            "device": "cpu"}
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names):
        record = {"format": cli.RECORD_FORMAT, "command": f"visionpe bench-speed --parts forward --repeats {i + 1}",
                  "settings": {"parts": ["forward"], "repeats": i + 1, "slow_repeats": 3, "min_run_time": 0.25},
                  "settings_sha256": "0" * 64, "made_by": made, "threads": 1, "vit_batch": 8,
                  "parts": [{"name": "forward", "seconds": 1.0, "tables": [{**table, "title": f"{name} forward"}]}],
                  "wall_s": 1.0, "recorded": "2026-12-07T00:00:00Z"}
        paths.append(folder / f"{name}.json")
        paths[-1].write_text(json.dumps(record))
    return paths


def test_a_report_of_records_with_readings_is_rebuilt_from_them_alone(tmp_path):
    """Records with their hand-written readings (NAME.md beside NAME.json) make one report: one section a record,
    under its reading's heading, the reading before the tables; the links are relative to the doc, and the folder's
    invocation.json keeps the command, so that visionpe.bench.rebuild checks the doc against the records (a changed
    reading or record is a drift) and rebuilds it in place."""
    from visionpe.bench import rebuild
    folder = tmp_path / "docs" / "data" / "performance" / "speed"
    paths = speed_records(folder, ["base", "wave"])
    (folder / "base.md").write_text("## The default run\n\nRead it so.\n")
    doc = tmp_path / "docs" / "PERFORMANCE.md"
    doc.write_text(f"# Performance\n\nold\n\n{cli.READING}\n\nBy hand.\n")
    report = cli.main(["--report-only", *map(str, paths), "--out", str(doc)])
    assert doc.read_text() == report.rstrip("\n") + f"\n\n{cli.READING}\n\nBy hand.\n"
    assert "[base](data/performance/speed/base.json), [wave](data/performance/speed/wave.json)" in report
    base, wave = report.split("\n## ")[1:]
    assert base.startswith("The default run\n\nRead it so.\n\nMade by `visionpe bench-speed --parts forward "
                           "--repeats 1` in 1 s.") and "**base forward**" in base and "**wave forward**" not in base
    assert wave.startswith("wave\n\nMade by `visionpe bench-speed --parts forward --repeats 2` in 1 s.")
    invocation = folder / rebuild.INVOCATION
    assert json.loads(invocation.read_text())["command"] == \
        f"visionpe bench-speed --report-only {paths[0]} {paths[1]} --out {doc}"
    assert rebuild.doc_of(invocation) == doc
    committed, rebuilt = rebuild.check(invocation, tmp_path / "check")
    assert rebuilt == committed == doc.read_text()
    (folder / "base.md").write_text("## The default run\n\nRead it otherwise.\n")  # the reading changed
    assert rebuild.check(invocation, tmp_path / "again")[1] != doc.read_text()
    rebuild.main([str(tmp_path / "docs"), "--write"])
    assert "Read it otherwise." in doc.read_text() and doc.read_text().endswith("By hand.\n")
    (folder / "base.md").write_text("The default run, no heading\n")
    with pytest.raises(UserError, match="base.md of speed record .*base.json must begin with a '## ' heading"):
        cli.main(["--report-only", *map(str, paths)])
    with pytest.raises(UserError, match="names no speed record after --report-only"):
        rebuild.report_only_argv("visionpe bench-speed --report-only --out d.md", doc, folder, tmp_path)


def test_report_keeps_the_hand_written_reading_section(tmp_path):
    path = tmp_path / "PERFORMANCE.md"
    path.write_text("# Performance\n\nold tables\n\n## Reading these numbers\n\nBy hand.\n")
    keep_hand_written(path, "# Performance\n\nnew tables\n", cli.READING)
    assert path.read_text() == "# Performance\n\nnew tables\n\n## Reading these numbers\n\nBy hand.\n"


@requires("torch", "2.5", "torch.nn.attention.flex_attention")
def test_quick_flex_part(one_thread):
    assert "flex" not in cli.PARTS and cli.parse_args([]).parts == cli.PARTS  # opt-in
    report = cli.main(["--quick", "--threads", "1", "--parts", "flex"])
    tables = parse_tables(report)
    [(title, rows)] = [(t, r) for t, r in tables.items() if t.startswith("FlexAttention vs SDPA")]
    assert "16 tokens (4x4 grid)" in title
    kinds = ["SDPA + bias precomputed", "SDPA + bias built per call", "flex_attention + score_mod, compiled"]
    assert [row["attention"] for row in rows] == ["SDPA, no mask", "SDPA, no mask (control)",
                                                  *(f"{case}: {kind}" for case in flex.FLEX_BIASES for kind in kinds)]
    assert not any(row["ms"].startswith("error") for row in rows), rows
    assert all(math.isfinite(ratio(row["vs SDPA, no mask"])) and ratio(row["vs SDPA, no mask"]) > 0 for row in rows)
    diffs = re.findall(r"compiled in [0-9.]+ s, max abs difference to SDPA \+ bias ([0-9.]+e[+-][0-9]+)", report)
    assert len(diffs) == 2 and all(float(d) < 1e-4 for d in diffs), diffs
    # training through flex: works, or the error's type and first line (CPU: no FlexAttention backward in torch 2.x)
    [(title, rows)] = [(t, r) for t, r in tables.items() if t.startswith("Training through FlexAttention on cpu")]
    assert [row["bias"] for row in rows] == list(flex.FLEX_BIASES)
    for row in rows:
        cell = row["forward + backward"]
        assert cell.startswith("works: max abs difference") or re.match(r"error: \w+: \S", cell), cell


def test_dense_biases_match_their_definitions():
    """The SDPA masks of the flex part: ALiBi-2D is -slope x grid distance, the Swin bias a gather by offset."""
    side, heads = 3, 2
    alibi = flex.dense_bias(flex.alibi_2d_bias(heads, side, "cpu"), heads, side * side, "cpu")
    assert alibi.shape == (1, heads, 9, 9)
    # token 0 is (0, 0), token 8 is (2, 2): distance 2 sqrt(2); slopes 2 ** (-8 (h + 1) / heads)
    assert torch.allclose(alibi[0, :, 0, 8], -torch.tensor([2 ** -4, 2 ** -8]) * 2 * math.sqrt(2))
    assert torch.equal(alibi[0, :, 4, 4], torch.zeros(heads))
    swin = flex.dense_bias(flex.swin_table_bias(heads, side, "cpu"), heads, side * side, "cpu")
    # equal offsets, equal bias: (0, 0) -> (1, 1) and (1, 1) -> (2, 2); the opposite offset differs
    assert torch.equal(swin[0, :, 0, 4], swin[0, :, 4, 8]) and not torch.equal(swin[0, :, 0, 4], swin[0, :, 4, 0])


def test_quick_profile_part(one_thread):
    assert "profile" not in cli.PARTS  # opt-in
    report = cli.main(["--quick", "--threads", "1", "--parts", "profile", "--pes", "rope_mixed", "rel_bias"])
    tables = {t: r for t, r in parse_tables(report).items() if t.startswith("Where the training step's time goes")}
    assert len(tables) == 2, list(parse_tables(report))
    for title, rows in tables.items():
        assert [row["pe"] for row in rows] == ["none (control)", "rope_mixed", "rel_bias"], title
        changed = f"operators it adds or removes, {profile.PROFILE_OPS} largest (ms, calls per step)"
        for row in rows:
            assert float(row["profiled ms / step"]) > 0 and math.isfinite(float(row["vs none ms"]))
            assert math.isfinite(float(row["operators with none's calls, net ms"]))
        if EXACT_PROFILE:
            assert rows[0][changed] == "-"  # the control model calls exactly none's operators
        for row in rows[1:]:
            ops = row[changed].split("; ")
            assert len(ops) == profile.PROFILE_OPS, row
            parsed = [re.fullmatch(r"`[^`]+` [+-]\d+\.\d ms \(([+-][\d.e+-]+) calls\)", op) for op in ops]
            assert all(parsed) and all(float(match[1]) != 0 for match in parsed), ops


@requires("torch", "2.3", "PyTorch's fused CPU attention kernel with a bias")
def test_profiled_learned_bias_trains_through_the_fused_bias_attention(one_thread):
    """What the profile of a learned bias shows is the fused bias attention's backward, not SDPA's own (counted by
    calls: which operators rank among the largest by time depends on the machine's load)."""
    run = timing.Run(torch.device("cpu"), 1, 0.01, plan.make_plan(True, 2), ["rel_bias"])
    steps = run.train_steps(run.plan.tiny)
    steps["rel_bias"]()  # warm-up, as the part does
    _, counts = profile.operator_times(run, steps["rel_bias"])
    _, none_counts = profile.operator_times(run, steps["none"])
    assert counts["_FusedBiasAttentionBackward"] == run.plan.tiny.kwargs["depth"] and not none_counts[
        "_FusedBiasAttentionBackward"], {k: v for k, v in counts.items() if "Backward" in k}


def test_operator_times_counts_calls_and_self_time():
    run = timing.Run(torch.device("cpu"), 1, 0.01, plan.make_plan(True, 2), [])
    a = torch.randn(64, 64)

    def step():
        for _ in range(3):
            a @ a

    times, counts = profile.operator_times(run, step)
    assert counts["aten::mm"] == 3 and times["aten::mm"] > 0
    assert counts["aten::bmm"] == 0 and times["aten::bmm"] == 0


@requires("torch", "2.4", "torch.compile(fullgraph=True) through a Grid")
def test_quick_compiled_training_part(one_thread):
    assert "compile-train" not in cli.PARTS  # opt-in
    report = cli.main(["--quick", "--threads", "1", "--parts", "compile-train", "--pes", "rope_mixed"])
    [(title, rows)] = [(t, r) for t, r in parse_tables(report).items() if t.startswith("Compiled training step")]
    assert [row["pe"] for row in rows] == ["none", "none (control)", "rope_mixed"]
    assert all(math.isfinite(ratio(row["vs none"])) for row in rows), rows
    assert not any(row["ms"].startswith("error") for row in rows), rows


def test_quick_video_part(one_thread):
    assert "video" not in cli.PARTS  # opt-in
    report = cli.main(["--quick", "--threads", "1", "--parts", "video", "--pes", "learned", "lookhere",
                       "rope_mixed", "fire"])
    tables = {t: r for t, r in parse_tables(report).items() if t.startswith("Video ")}
    assert [t.split(":")[0] for t in tables] == ["Video eval forward", "Video training step (forward + backward + AdamW)"]
    for title, rows in tables.items():
        # lookhere is defined on 2D grids only: not a video row; videorope and riflex (3D only) always are
        assert [row["pe"] for row in rows] == ["none", "none (control)", "learned", "rope_mixed", "fire", "videorope",
                                               "riflex"]
        assert all(math.isfinite(ratio(row["vs none"])) and not row["ms"].startswith("error") for row in rows), rows


def test_quick_forward_rows_of_the_2026_wave_and_presets(one_thread):
    """The late-2025 / 2026 encodings and the SAM 3 and GLM-4.1V presets are rows of ``--pes`` (a preset as
    ``preset:NAME``), each timed beside none."""
    wave = ["fourier", "v2pe", "circle_rope", "hope", "dype", "spherical_rope", "geope", "mhrope",
            "decomposed_rel_pos", "preset:sam3", "preset:glm4v"]
    assert set(wave) <= set(cli.FRONTIER)
    report = cli.main(["--quick", "--threads", "1", "--parts", "forward", "--pes", "mhrope", "preset:sam3",
                       "preset:glm4v"])
    for title, rows in parse_tables(report).items():
        assert [row["pe"] for row in rows] == ["none", "none (control)", "mhrope", "preset:sam3", "preset:glm4v"]
        assert all(math.isfinite(ratio(row["vs none"])) and not row["ms"].startswith("error") for row in rows), title


def test_video_setups_are_the_video_benchmark_recipe_and_cover_every_3d_encoding():
    import yaml
    recipe = yaml.safe_load(plan.VIDEO_RECIPE.read_text())
    small, large = plan.make_plan(quick=False, batch=8).video
    assert small.size == (recipe["num_frames"], recipe["img_size"], recipe["img_size"])
    assert small.batch == recipe["batch_size"] and small.kwargs["embed_dim"] == recipe["model_kwargs"]["embed_dim"]
    assert small.video["tubelet_size"] == (1, recipe["patch_size"], recipe["patch_size"]) and not small.slow
    assert large.slow and large.size == (8, 224, 224)
    from visionpe.bench.speed.video import video_encodings
    every = video_encodings(cli.PES + cli.FRONTIER)
    assert "lookhere" not in every and every[-2:] == ["videorope", "riflex"]
    two_d_only = {"lookhere", "spiral_rope", "circle_rope", "spherical_rope", "preset:sam3", "preset:glm4v"}  # 2D
    # by definition (LookHere's directions, Spiral RoPE's turns, Circle-RoPE's ring, Spherical RoPE's two Euler
    # angles) or by the image model a preset reproduces
    assert set(every) == (set(cli.PES + cli.FRONTIER) - two_d_only) | {"videorope", "riflex"}


@pytest.mark.skipif(bool(__import__("visionpe.export").export.missing_onnx_packages()) or
                    not __import__("visionpe.export").export.torch_supports_export(),
                    reason="needs the export extra (onnx, onnxscript, onnxruntime) and torch >= 2.6")
def test_quick_onnx_part(one_thread):
    """The exported visionpe models against timm's exported twins in onnxruntime, at the training size and twice it;
    a visionpe export that refuses a size is timed as static exports, and says so."""
    assert "onnx" not in cli.PARTS  # opt-in
    report = cli.main(["--quick", "--threads", "1", "--parts", "onnx"])
    (title, rows), = parse_tables(report).items()
    assert title.startswith("Exported models in onnxruntime")
    assert [(row["pair"].split(" ")[0], row["size"]) for row in rows] == [
        ("learned", "32 px"), ("learned", "64 px"), ("control:", "32 px"), ("control:", "64 px"),
        ("native", "32 px"), ("native", "64 px")]
    assert all(row["export"] in ("dynamic", "static") and math.isfinite(ratio(row["ours / timm"])) for row in rows)
    assert all(row["export"] == "dynamic" for row in rows if row["pair"].startswith("native")), rows
