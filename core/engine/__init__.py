"""The inference engine (llama.cpp through llama-cpp-python) and the one thread that drives it."""
