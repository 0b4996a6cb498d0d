"""Ingest: sources into the index (sync, the IngestionPipeline, watch, capture, fresh reads, doctor)."""
