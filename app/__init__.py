"""Hearthside's user-facing layer: the CLI now, the Qt window later.

The only layer that may import Qt.
"""
