"""Defences of test-patch grading against patches written to fool it.

See docs/reward-integrity.md.
"""
