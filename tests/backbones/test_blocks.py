"""backbones.repeated_blocks: the transformer blocks of every backbone kind (the units FSDP shards, checkpointing
recomputes and compile compiles), each holding one attention module, together holding all of them."""
import pytest
import torch
from tinymodels import BUILDS

from visionpe.backbones import adapter_for, repeated_blocks


@pytest.mark.parametrize("name", list(BUILDS))
def test_blocks_hold_one_attention_each_and_all_of_them(name):
    model = BUILDS[name]()
    attention = adapter_for(model).attention
    blocks = repeated_blocks(model)
    held = [m for b in blocks for m in b.modules() if isinstance(m, attention)]
    assert all(sum(isinstance(m, attention) for m in b.modules()) == 1 for b in blocks)
    assert len(held) == len({id(m) for m in held}) == sum(isinstance(m, attention) for m in model.modules())
    assert len(blocks) >= 2


def test_a_model_without_an_adapter_is_a_clear_error():
    with pytest.raises(ValueError, match="is not supported"):
        repeated_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))
