"""What the tests share besides fixtures (those are in `tests/conftest.py`): paths, tiny models, running the
project's code, files on disk, fine-tuning runs, and SPEC section 2 written out (`spec_reference`).

The tests import it as `helpers` (pytest puts `tests/` on `sys.path` for `tests/conftest.py`); code outside the
tests as `tests.helpers`. Its modules import one another relatively, so that both work."""
