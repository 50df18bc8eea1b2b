"""Fixtures of the integration suite: the shared plays' state (see ``support.plays``)."""

from support.plays import remedy_plays, report_plays

__all__ = ["remedy_plays", "report_plays"]
