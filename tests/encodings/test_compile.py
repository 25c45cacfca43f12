"""torch.compile(fullgraph=True): every encoding in a patched ViT and Swin traces as one graph (no graph breaks),
in evaluation and training, and gives the eager outputs."""
import pytest
import torch

import visionpe as vpe

VIT = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=3)
SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(2, 2), num_classes=3)
VIT_PES = ["none", "sincos", "learned", "peg", "rope_axial", "rope_mixed", "rel_bias", "cpb", "alibi", "bucket_bias",
           "rope_mixed+learned"]
SWIN_PES = {"swin_tiny_patch4_window7_224": ["swin_bias", "cpb", "bucket_bias", "rope_axial", "rope_mixed"],
            "swinv2_tiny_window8_256": ["cpb", "alibi"]}
CASES = [("vit_tiny_patch16_224", pe, VIT, (16, 20)) for pe in VIT_PES]
CASES += [(name, pe, SWIN, (32, 48)) for name, pes in SWIN_PES.items() for pe in pes]


@pytest.mark.parametrize("name,pe,kw,size", CASES, ids=[f"{c[0].split('_')[0]}-{c[1]}" for c in CASES])
def test_fullgraph_compile_matches_eager(name, pe, kw, size):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = vpe.create_model(name, pe=pe, **kw).eval()
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # dynamo's tracing: any graph break raises
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("name,pe,kw,size", [CASES[VIT_PES.index("rope_mixed+learned")], CASES[len(VIT_PES) + 1]],
                         ids=["vit-rope_mixed+learned", "swin-cpb"])
def test_fullgraph_compile_trains(name, pe, kw, size):
    """Training: tables are rebuilt inside the graph, so gradients reach learned position parameters. (Swin v1:
    Swin-V2 initialises its res-post-norms to zero, so no gradient reaches its attention at initialisation.)"""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = vpe.create_model(name, pe=pe, **kw).train()
    torch.compile(model, fullgraph=True, backend="eager")(torch.randn(2, 3, *size)).sum().backward()
    for enc in sum(vpe.encodings_of(model).values(), []):
        for p in enc.parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
@pytest.mark.parametrize("train", [False, True])
def test_compiled_rope_graph_holds_no_complex_tensor(pe, train):
    """Inductor generates no code for complex operators (it falls back to eager kernels between its own): under
    compile RoPE builds and applies real (cos, sin) rotations."""
    torch._dynamo.reset()
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    model = vpe.create_model("vit_tiny_patch16_224", pe=pe, **VIT).train(train)
    with torch.set_grad_enabled(train):
        torch.compile(model, fullgraph=True, backend=record)(torch.randn(2, 3, 16, 16))
    values = [node.meta.get("example_value") for graph in graphs for node in graph.graph.nodes]
    dtypes = {value.dtype for value in values if isinstance(value, torch.Tensor)}
    assert torch.float32 in dtypes and not any(dtype.is_complex for dtype in dtypes), dtypes
