"""The index: what ingest writes and search reads (Chroma, the docstore, the manifest, BM25, the embedding models)."""
