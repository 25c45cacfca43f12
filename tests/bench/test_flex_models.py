"""The opt-in flex-models part: visionpe's attention="flex" vs "sdpa" in a ViT per bias encoding. Under --quick on
CPU: every eval cell is a time, every flex training cell the clear error of CPU FlexAttention, every ratio the quotient
of the cells it names."""
import pytest
import torch
from conftest import requires
from test_bench_speed import parse_tables

from visionpe.bench.speed import cli, flex_models

pytestmark = requires("torch", "2.5", "torch.nn.attention.flex_attention")


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_quick_flex_models_part(one_thread):
    assert "flex-models" in cli.OPT_IN and "flex-models" not in cli.PARTS
    tables = parse_tables(cli.main(["--quick", "--threads", "1", "--parts", "flex-models"]))
    assert [t.split(":")[1].split(",")[0].strip() for t in tables] == ["quick ViT (32 px / 8)", "quick ViT (64 px / 8)"]
    for title, rows in tables.items():
        assert title.endswith("float32") and ("17 tokens" in title or "65 tokens" in title)
        names = [f"{pe}, {a}" for pe in flex_models.ENCODINGS for a in flex_models.ATTENTIONS]
        assert [row["model"] for row in rows] == ["none", "none (control)", *names]
        by_name = {row["model"]: row for row in rows}
        for row in rows:
            assert float(row["eval forward ms"]) > 0
            if row["model"].endswith("flex"):
                assert row["training step ms"].startswith("error: ValueError: attention='flex' cannot train on CPU")
                sdpa = by_name[row["model"].replace("flex", "sdpa")]
                quotient = float(row["eval forward ms"]) / float(sdpa["eval forward ms"])
                assert float(row["eval forward flex/sdpa"].rstrip("x")) == pytest.approx(quotient, rel=0.06, abs=2e-3)
            else:
                assert float(row["training step ms"]) > 0 and row["eval forward flex/sdpa"] == "-"
        assert "step peak MB" not in rows[0]  # CUDA only
