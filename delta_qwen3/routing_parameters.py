"""Random routing parameters for checks of the routing's maths: the GPU check's small models (`benchmarks/`) and
the tests' (`tests/helpers`). It lives here, in the installed package, so that neither imports the other."""

import torch


def randomize_routing(model, seed: int = 0, scale: float = 0.3) -> None:
    """Give every routing parameter a non-trivial value, so that no part of the maths hides behind its init."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "_route." not in name:
                continue
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * noise)
            elif name.endswith("gate"):
                param.copy_(0.5 * noise)
            else:
                param.copy_(scale * noise)
