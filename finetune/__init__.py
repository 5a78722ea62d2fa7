"""Fine-tuning and pre-training with accelerate: `accelerate launch -m finetune ...` or `python -m finetune ...`.

The modules follow the run: `config` (options), `data` (load, tokenise, pack, split), `presets` and `model`
(what to train), `optim` (parameter groups, AdamW, schedule), `loop` and `evaluation` (training, validation,
logging), `outputs` (checkpoints, final model, Hub), `run` (all of it in order).
"""

from .run import main

__all__ = ["main"]
