"""Data files shipped with Hearthside: licence notices, catalogs, recipes."""
