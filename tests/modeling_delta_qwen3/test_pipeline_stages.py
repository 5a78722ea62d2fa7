"""DeltaQwen3 refuses to run split into pipeline stages, which vLLM's and other engines' pipeline parallelism do by
replacing the layers of other stages with placeholders: the routing sources would have to cross stages."""

import pytest
import torch
from helpers.models import tiny_qwen3_config
from torch import nn

from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM


@pytest.mark.parametrize("missing", [0, 3])
def test_a_placeholder_layer_is_refused_with_the_reason(missing):
    fields = tiny_qwen3_config().to_dict()
    fields.pop("model_type")
    model = DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields, routing_mode="delta_block", routing_num_blocks=2))
    ids = torch.tensor([[5, 17, 99]])
    model(ids)
    model.model.layers[missing] = nn.Identity()
    with pytest.raises(ValueError, match="cannot be split into pipeline stages: some decoder layers are placeholders"):
        model(ids)
