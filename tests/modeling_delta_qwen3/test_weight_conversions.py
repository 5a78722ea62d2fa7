"""The weight conversions a model is loaded with, checked as Transformers' common model tests check its own models'
(`ModelTesterMixin.test_reverse_loading_mapping`, with `check_keys_were_modified=False` as for conversions that
change a tensor but not its name): each conversion's source patterns match weights of the checkpoint the model
saves, and saving then loading gives the same weights and outputs. In every mode, gated or not, for every class."""

import re

import pytest
import torch
from helpers.models import VARIANTS, delta_config, token_ids
from helpers.spec_reference import randomize_routing
from safetensors.torch import load_file
from transformers.conversion_mapping import get_model_conversion_mapping

from modeling_delta_qwen3 import AUTO_CLASSES
from modeling_delta_qwen3.modeling_delta_qwen3 import gate_conversions

pytestmark = pytest.mark.both_ends

MODEL_CLASSES = list(AUTO_CLASSES.values())


def saved_weights(path) -> dict[str, torch.Tensor]:
    return {name: t for file in sorted(path.glob("*.safetensors")) for name, t in load_file(file).items()}


def outputs(model) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model(token_ids(), use_cache=False).to_tuple())


def assert_same_tensors(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("mode, gated", VARIANTS, ids=[f"{m}{'-gated' if g else ''}" for m, g in VARIANTS])
@pytest.mark.parametrize("model_class", MODEL_CLASSES, ids=[c.__name__ for c in MODEL_CLASSES])
def test_each_conversion_matches_saved_weights_and_loading_reverses_saving(tmp_path, model_class, mode, gated):
    torch.manual_seed(0)
    model = model_class(delta_config(mode, gated)).eval()
    randomize_routing(model)  # the gates too non-zero, so that the outputs show what loading did to them
    # What Transformers' test reads (the conversions registered for the model), and what the model adds itself.
    conversions = [*get_model_conversion_mapping(model, add_legacy=False), *gate_conversions(model.config)]
    model.save_pretrained(tmp_path / "saved")
    saved = saved_weights(tmp_path / "saved")
    for conversion in conversions:
        for pattern in conversion.source_patterns:
            assert any(re.search(pattern, name) for name in saved), (
                f"`{pattern}` of {type(conversion).__name__} matches no weight that {model_class.__name__} "
                f"({mode}, gated={gated}) saves"
            )
    assert bool(conversions) == gated  # the gates' shape, where there are gates: none else

    loaded = model_class.from_pretrained(tmp_path / "saved").eval()
    assert_same_tensors(loaded.state_dict(), model.state_dict())
    for got, expected in zip(outputs(loaded), outputs(model), strict=True):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    loaded.save_pretrained(tmp_path / "resaved")
    assert_same_tensors(saved_weights(tmp_path / "resaved"), saved)
