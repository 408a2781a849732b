"""Hearthside core: probe, models, engine, server and history. Never imports Qt."""
