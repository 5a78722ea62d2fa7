"""`python -m benchmarks.gpu_check`: the driver's command line (`driver.py`)."""

import sys

from benchmarks.gpu_check.driver import main

sys.exit(main())
