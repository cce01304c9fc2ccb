"""Helpers shared by the course notebooks: plotting and visible-test checks.

Notebooks import from here; they never paste these helpers in again.
"""
