"""Offline analysis: replaying the detectors over a recorded run, the verdict, and the report (text, JSON, Markdown)."""
