"""The local OpenAI-compatible API: app factory, security middleware, controller."""
