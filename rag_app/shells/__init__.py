"""Shells over the engine: the `brain` CLI, its warm engine, the chat page and the agent Skill."""
