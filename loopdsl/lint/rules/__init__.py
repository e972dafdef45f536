"""Semantic lint rules, one topic per module."""
