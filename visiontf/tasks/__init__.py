"""LightningModules, one per task. Import a task module directly (e.g. visiontf.tasks.detection.detection_task)."""
