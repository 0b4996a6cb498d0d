"""cflow-brain engine: sync notes into Chroma and answer from them. Shells call `rag_app.engine` only."""
