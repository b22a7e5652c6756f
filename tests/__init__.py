"""Helpers of test_all.py (pytest collects test_all.py only): the programs the sandbox tests run, and the
harnesses torchrun runs test_all.py as."""
