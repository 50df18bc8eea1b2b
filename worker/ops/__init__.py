"""Operator tools: the drain report and the remedies."""
