"""Source readers: each turns one kind of note source into `NoteRecord`s (and LlamaIndex Documents)."""
