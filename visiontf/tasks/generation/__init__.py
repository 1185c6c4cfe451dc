"""visiontf.tasks.generation."""
