"""The test suite: CPU only. Run with `python -m pytest test_all.py`."""
