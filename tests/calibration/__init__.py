"""Helpers for testing calibration/ without torch or a GPU (a stand-in for torch and Triton)."""
