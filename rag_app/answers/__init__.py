"""Answers: search results into cited answers and conversations (LLM or extractive, LlamaIndex engines)."""
