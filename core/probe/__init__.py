"""Hardware discovery: what this machine has and what Hearthside can use of it."""
