"""The tests of everything but the recipe (test_all.py): tests/test_<module>.py, each runnable alone; beside
them tests/helpers.py (the fixtures and helpers several files share), tests/harness.py (the processes the
tests start: layouts under torchrun, faults, a vLLM engine) and the tables the tests read (attacks.py,
judge_cases.py, math_cases.py)."""
