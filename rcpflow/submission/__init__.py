"""A submission of N runs: the official checkers as structured verdicts, the RCP checker's numbers,
packaging.
"""
