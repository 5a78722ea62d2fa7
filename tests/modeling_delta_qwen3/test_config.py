"""The configuration's validation: a bad routing value is refused naming its field; one block and one layer per
block are valid."""

import copy

import pytest
import torch
from helpers.models import random_model, token_ids
from helpers.spec_reference import reference_forward

from modeling_delta_qwen3 import DeltaQwen3Config

pytestmark = pytest.mark.both_ends


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"routing_mode": "residual"}, "routing_mode"),
        ({"routing_num_blocks": 0}, "routing_num_blocks"),
        ({"routing_num_blocks": 6}, "routing_num_blocks"),
        ({"routing_mode": "attnres_full", "routing_gate": True}, "routing_gate"),
        ({"routing_mode": "attnres_block", "routing_gate": True}, "routing_gate"),
    ],
)
def test_bad_config_values_name_the_field(overrides, field):
    fields = {"num_hidden_layers": 5, "routing_num_blocks": 2, **overrides}
    with pytest.raises(ValueError, match=field) as error:
        DeltaQwen3Config(**fields)
    assert str(overrides.get(field, "")) in str(error.value)


def test_num_blocks_equal_to_depth_and_one_block_are_valid():
    assert DeltaQwen3Config(num_hidden_layers=5, routing_num_blocks=5).layers_per_block == 1
    assert DeltaQwen3Config(num_hidden_layers=5, routing_num_blocks=1).layers_per_block == 5
    model = copy.deepcopy(random_model("delta_block"))
    model.config.routing_num_blocks = 5
    ids = token_ids()
    torch.testing.assert_close(model.double()(ids).logits, reference_forward(model, ids)[0], atol=1e-5, rtol=0)
