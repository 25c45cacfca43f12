"""The training loop's collectives (visionpe.train.distributed) in a real one-process gloo group."""
import ast
import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from visionpe.train import distributed

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = {"all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter", "reduce_scatter",
               "all_to_all", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_object",
               "broadcast_object_list"}


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def handed_to_gloo(monkeypatch):
    """Weak references to every tensor the module hands to a collective."""
    refs = []

    def spy(name):
        real = getattr(dist, name)

        def call(*args, **kwargs):
            for arg in args:
                refs.extend(weakref.ref(t) for t in (arg if isinstance(arg, list) else [arg])
                            if isinstance(t, torch.Tensor))
            return real(*args, **kwargs)
        return call
    for name in ("all_reduce", "all_gather", "broadcast"):
        monkeypatch.setattr(distributed.dist, name, spy(name))
    return refs


def test_collectives_give_the_one_process_values_and_leave_the_group(group):
    assert distributed.active()
    assert distributed.all_sum([1.5, 2.0, 3.0], "cpu") == [1.5, 2.0, 3.0]
    assert distributed.all_gather([4.0, 5.0], "cpu") == [[4.0, 5.0]]
    assert distributed.rank0_flag(True, "cpu") is True and distributed.rank0_flag(False, "cpu") is False
    t = torch.tensor([2.0, -1.0])
    summed = distributed.sum_over_processes(t)
    assert torch.equal(summed, t) and summed is not t
    summed.add_(1)
    assert torch.equal(t, torch.tensor([2.0, -1.0]))  # the input is not the returned tensor's storage
    distributed.leave()
    assert not distributed.active()
    distributed.leave()  # nothing to leave: no error


def test_without_a_group_the_values_come_back_unchanged():
    assert not distributed.active()
    t = torch.tensor([1.0])
    assert distributed.sum_over_processes(t) is t
    assert distributed.all_sum([1.0, 2.0], "cpu") == [1.0, 2.0]
    assert distributed.all_gather([3.0], "cpu") == [[3.0]]
    assert distributed.rank0_flag(True, "cpu") is True


def test_every_tensor_handed_to_a_collective_outlives_the_call(group, handed_to_gloo):
    """The torch 2.1 exit hang: a gloo worker that dropped the last reference to a tensor took the GIL while the
    main thread, holding it, joined that worker in the group's destructor. Kept buffers make Python's reference
    the last one."""
    for _ in range(3):  # the same buffers reused, not one more per call
        distributed.all_sum([1.0, 2.0], "cpu")
        distributed.all_gather([1.0], "cpu")
        distributed.rank0_flag(True, "cpu")
        distributed.sum_over_processes(torch.ones(1))
    gc.collect()
    assert len(handed_to_gloo) == 3 * 5
    assert all(ref() is not None for ref in handed_to_gloo)
    assert len({id(ref()) for ref in handed_to_gloo}) == 5
    distributed.leave()
    assert all(ref() is not None for ref in handed_to_gloo)  # kept for the life of the process, a few scalars


def test_the_workbench_runs_its_collectives_through_the_kept_buffers():
    """No other module hands a tensor to torch.distributed (barrier, init and destroy take none)."""
    offenders = []
    files = [ROOT / "train_vit.py", *(ROOT / "visionpe").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]
    for path in files:
        if path.name == "distributed.py" and path.parent.name == "train":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in COLLECTIVES and \
                    isinstance(node.value, ast.Name) and node.value.id == "dist":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} dist.{node.attr}")
    assert not offenders, offenders
