"""`python -m finetune` and `accelerate launch -m finetune`."""

import sys

from finetune.run import main

if __name__ == "__main__":
    sys.exit(main())
